# syntax=docker/dockerfile:1
# A model as an OCI image, for the workers' image volume (deploy/k8s/components/model-image;
# docs/operations.md, "Model source"): the GGUF file alone at the image's root, nothing to run.
# From the repository root, with the file under models/:
#   docker build -f deploy/docker/model.Dockerfile --build-arg MODEL=SmolLM2-135M-Instruct.Q4_1.gguf \
#     -t REGISTRY/switchyard/model-smollm2-135m-instruct-q4_1:0.1.2 .
# The worker then reads /models/MODEL (the image volume is mounted at /models). Check the file's
# SHA-256 before you build: the image digest then stands for that file.
FROM scratch
ARG MODEL=SmolLM2-135M-Instruct.Q4_1.gguf
COPY models/${MODEL} /${MODEL}

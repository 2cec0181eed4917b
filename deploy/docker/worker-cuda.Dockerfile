# syntax=docker/dockerfile:1
# switchyard-worker with the CUDA backend (docs/operations.md, "Images"). From the repository root:
#   docker build -f deploy/docker/worker-cuda.Dockerfile -t switchyard/worker-cuda:0.1.0 .
# The CUDA runtime comes from NVIDIA's own CUDA repository for Debian 12, as the packages NVIDIA's
# `runtime` images install (cuda-cudart, libcublas), on Debian 12 slim. NVIDIA publishes its
# CUDA images on Ubuntu, UBI/Rocky and a few others but not on Debian, and the binary, built on
# Debian 12, loads Debian 12's CAF, ZeroMQ and PCRE2: putting it on an Ubuntu-based nvidia/cuda
# image would swap those for other builds under other package names. The GPU driver
# (libcuda.so.1) is not in the image: the NVIDIA container toolkit mounts the node's.
# tests/deploy/test_images.py reads the runtime stage's package list from this file (ARG defaults
# substituted) and checks it against `ldd` of a CUDA build: keep one package per line.
#   CUDA_VERSION / CUDA_PKG   the toolkit the worker is built with and runs on: CUDA 12.4 (its
#                             latest update, 12.4.1: NVIDIA's *-12-4 packages), which node drivers
#                             >= 550 run; e.g. 13.0 / 13-0 for drivers >= 580
#   CUDA_ARCHITECTURES        the GPUs the kernels are compiled for (CMAKE_CUDA_ARCHITECTURES,
#                             each as machine code and PTX): sm_80 (A100, A30), sm_86 (A10, A40),
#                             sm_89 (L4, L40S), sm_90 (H100, H200). sm_80 code also runs on sm_86
#                             and sm_89, but compiled for them it is scheduled for them; newer GPUs
#                             compile the PTX at load. CMakeLists.txt builds only 80 and 90 by
#                             default, to bound the tests' compile time
ARG CUDA_VERSION=12.4
ARG CUDA_PKG=12-4
ARG CUDA_ARCHITECTURES="80;86;89;90"
ARG CUDA_KEYRING=https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb

FROM debian:12 AS build
ARG CUDA_VERSION
ARG CUDA_PKG
ARG CUDA_KEYRING
ARG CUDA_ARCHITECTURES
WORKDIR /src
COPY deploy/setup.sh deploy/setup.sh
RUN bash deploy/setup.sh --build-deps
ADD ${CUDA_KEYRING} /tmp/cuda-keyring.deb
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ca-certificates \
 && dpkg -i /tmp/cuda-keyring.deb \
 && apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      cuda-nvcc-${CUDA_PKG} \
      cuda-cudart-dev-${CUDA_PKG} \
      cuda-cccl-${CUDA_PKG} \
      libcublas-dev-${CUDA_PKG}
COPY . .
RUN cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DSY_CUDA=ON \
      -DCMAKE_CUDA_COMPILER=/usr/local/cuda-${CUDA_VERSION}/bin/nvcc -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES}" \
 && cmake --build /build --target switchyard-worker switchyard-cuda

FROM debian:12-slim AS runtime
ARG CUDA_VERSION
ARG CUDA_PKG
ARG CUDA_KEYRING
ADD ${CUDA_KEYRING} /tmp/cuda-keyring.deb
# NVIDIA's repository first (its packages: the CUDA runtime and cuBLAS/cuBLASLt the binary links),
# then the Debian libraries the binary links; apt brings their own dependencies.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ca-certificates \
 && dpkg -i /tmp/cuda-keyring.deb && rm /tmp/cuda-keyring.deb \
 && apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      cuda-cudart-${CUDA_PKG} \
      libcublas-${CUDA_PKG} \
      libcaf-core0.17 \
      libzmq5 \
      libpcre2-8-0 \
      libstdc++6 \
 && rm -rf /var/lib/apt/lists/*
RUN groupadd --system --gid 10001 switchyard \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin switchyard
# What NVIDIA's images set: the container toolkit exposes the GPUs and driver capabilities these
# name (the Kubernetes device plugin narrows NVIDIA_VISIBLE_DEVICES to the pod's GPU) and refuses
# to start the container on a driver too old for the toolkit; the driver's libraries appear
# under /usr/local/nvidia on some managed clusters.
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    NVIDIA_REQUIRE_CUDA="cuda>=${CUDA_VERSION}" \
    LD_LIBRARY_PATH=/usr/local/cuda-${CUDA_VERSION}/targets/x86_64-linux/lib:/usr/local/nvidia/lib:/usr/local/nvidia/lib64
COPY --from=build /build/worker/switchyard-worker /usr/local/bin/switchyard-worker
# The CUDA backend is a module the worker loads for --device cuda (docs/cuda-backend.md, "The CUDA
# module"); it looks next to the binary, then in ../lib/switchyard/.
COPY --from=build /build/worker/libswitchyard-cuda.so /usr/local/lib/switchyard/libswitchyard-cuda.so
USER 10001:10001
EXPOSE 5555 9100
ENTRYPOINT ["/usr/local/bin/switchyard-worker"]
CMD ["serve", "--device", "cuda:0", "--model", "/models/model.gguf", "--listen", "tcp://0.0.0.0:5555", "--metrics-host", "0.0.0.0", "--metrics-port", "9100"]

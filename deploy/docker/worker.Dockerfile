# syntax=docker/dockerfile:1
# switchyard-worker for CPUs (docs/operations.md, "Images"). From the repository root:
#   docker build -f deploy/docker/worker.Dockerfile -t switchyard/worker:0.1.0 .
# `build` compiles on Debian 12 with the project's own scripts (deploy/setup.sh --build-deps, then
# CMake, without CUDA); `runtime` is Debian 12 slim with only the libraries the binary loads, run as
# an unprivileged user. No model is baked in: mount one at /models (the Kubernetes manifests mount
# a read-only volume there; docs/operations.md, "Model source"). The binaries target x86-64-v3 (AVX2,
# FMA, F16C), so nodes need a CPU from the last decade. tests/deploy/test_images.py reads the
# runtime stage's package list from this file and checks it against `ldd` of the built binary:
# keep one package per line.

FROM debian:12 AS build
WORKDIR /src
COPY deploy/setup.sh deploy/setup.sh
RUN bash deploy/setup.sh --build-deps
COPY . .
RUN cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DSY_CUDA=OFF \
 && cmake --build /build --target switchyard-worker

FROM debian:12-slim AS runtime
# The libraries the binary links; apt brings their own dependencies.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libcaf-core0.17 \
      libzmq5 \
      libpcre2-8-0 \
      libstdc++6 \
 && rm -rf /var/lib/apt/lists/*
RUN groupadd --system --gid 10001 switchyard \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin switchyard
COPY --from=build /build/worker/switchyard-worker /usr/local/bin/switchyard-worker
USER 10001:10001
EXPOSE 5555 9100
# SIGTERM drains: /ready turns 503, new submits are refused (routers re-queue them), running
# requests finish within --drain-timeout-s. PID 1 waits for signals with sigwait: no init shim.
ENTRYPOINT ["/usr/local/bin/switchyard-worker"]
CMD ["serve", "--model", "/models/model.gguf", "--listen", "tcp://0.0.0.0:5555", "--metrics-host", "0.0.0.0", "--metrics-port", "9100"]

# syntax=docker/dockerfile:1
# switchyard-router (docs/operations.md, "Images"). From the repository root:
#   docker build -f deploy/docker/router.Dockerfile -t switchyard/router:0.1.0 .
# `build` compiles on Debian 12 with the project's own scripts (deploy/setup.sh --build-deps, then
# CMake); `runtime` is Debian 12 slim with only what the binary loads or reads, run as an
# unprivileged user. tests/deploy/test_images.py reads the runtime stage's package list from this
# file and checks it against `ldd` of the built binary: keep one package per line.

FROM debian:12 AS build
WORKDIR /src
COPY deploy/setup.sh deploy/setup.sh
RUN bash deploy/setup.sh --build-deps
COPY . .
RUN cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DSY_CUDA=OFF \
 && cmake --build /build --target switchyard-router

FROM debian:12-slim AS runtime
# The libraries the binary links (apt brings their own dependencies), and libjs-chart.js: the
# cache dashboard serves /usr/share/javascript/chart.js/chart.min.js from it.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libcaf-core0.17 \
      libzmq5 \
      libhiredis0.14 \
      libpcre2-8-0 \
      libssl3 \
      libstdc++6 \
      libjs-chart.js \
 && rm -rf /var/lib/apt/lists/*
RUN groupadd --system --gid 10001 switchyard \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin switchyard
COPY --from=build /build/router/switchyard-router /usr/local/bin/switchyard-router
USER 10001:10001
EXPOSE 8000
# SIGTERM: stop being ready, keep admitting for --shutdown-delay-s, then drain for at most
# --drain-timeout-s (docs/operations.md, "Graceful shutdown"). The process is PID 1 and waits for
# signals with sigwait, so no init shim is needed.
ENTRYPOINT ["/usr/local/bin/switchyard-router"]
CMD ["--host", "0.0.0.0", "--port", "8000", "--workers-dns", "switchyard-worker:5555"]

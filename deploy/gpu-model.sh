#!/usr/bin/env bash
# Gets the model file (98 MB) onto the GPU machine, whose working-tree transfer is capped at
# 64 MiB a call: two calls, one half each, joined there (docs/cuda-backend.md, "On a device").
#   here:            deploy/gpu-model.sh split   -> gpu-carry/part1, gpu-carry/part2, gpu-carry/sha256
#                    deploy/gpu-carry.sh         -> gpu-carry/include, gpu-carry/lib (PCRE2)
#   device call 1:   carry gpu-carry/part1 gpu-carry/sha256 gpu-carry/include gpu-carry/lib;
#                    deploy/gpu-model.sh stash && deploy/gpu-check.sh build
#   device call 2:   carry gpu-carry/part2 gpu-carry/include gpu-carry/lib gpu-carry/test-models
#                    (within the machine's idle window);  deploy/gpu-model.sh join && deploy/gpu-check.sh
# `stash` keeps part 1 in build-gpu/ (ignored build outputs stay on a warm machine between calls);
# `join` writes models/SmolLM2-135M-Instruct.Q4_1.gguf and checks its SHA-256.
#   here:            deploy/gpu-model.sh families -> gpu-carry/test-models (~10.6 MiB): six of the
#                    generated family files (tests/tools/test_models.sh BUILD makes them under
#                    BUILD/test-models; FAMILIES_FROM picks another folder), carried with call 2;
#                    gpu-check.sh points SY_TEST_MODELS_DIR at them (tests/gpu/test_cuda_forward.cpp).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
name=SmolLM2-135M-Instruct.Q4_1.gguf
half=$((50 * 1024 * 1024))
# The generated files test_cuda_forward runs (its k_family_files), relative to the models folder.
family_files="llama3/llama3-q4_k_m.gguf qwen2/qwen2-q5_k_m.gguf mistral/mistral-q6_k.gguf
  mistral/mistral-q4_k_m.gguf llama3/llama3-q5_0.gguf llama3/llama3-f16.gguf"
case "${1:-}" in
  split)
    [ -s "models/$name" ] || { echo "gpu-model: models/$name is missing (run deploy/setup.sh)" >&2; exit 1; }
    mkdir -p gpu-carry
    head -c "$half" "models/$name" >gpu-carry/part1
    tail -c +$((half + 1)) "models/$name" >gpu-carry/part2
    (cd models && sha256sum "$name") >gpu-carry/sha256
    ls -l gpu-carry
    ;;
  stash)
    mkdir -p build-gpu
    mv gpu-carry/part1 build-gpu/model.part1
    cp gpu-carry/sha256 build-gpu/model.sha256
    echo "gpu-model: part 1 kept in build-gpu/ ($(stat -c %s build-gpu/model.part1) bytes)"
    ;;
  families)
    from=${FAMILIES_FROM:-build/test-models}
    for f in $family_files; do
      [ -s "$from/$f" ] || {
        echo "gpu-model: $from/$f is missing (bash tests/tools/test_models.sh build makes the family files)" >&2
        exit 1
      }
    done
    rm -rf gpu-carry/test-models
    for f in $family_files; do
      mkdir -p "gpu-carry/test-models/$(dirname "$f")"
      cp "$from/$f" "gpu-carry/test-models/$f"
    done
    du -b -s gpu-carry/test-models
    ;;
  join)
    mkdir -p models
    cat build-gpu/model.part1 gpu-carry/part2 >"models/$name"
    (cd models && sha256sum -c ../build-gpu/model.sha256)
    ;;
  *)
    echo "usage: deploy/gpu-model.sh split|stash|join|families" >&2
    exit 2
    ;;
esac

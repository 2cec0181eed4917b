#!/usr/bin/env bash
# Builds llama.cpp for the side-by-side benchmarks into build/llama.cpp-bench (from the source
# vendored in the llama-cpp-python sdist, tests/tools/build_llamacpp.sh): libllama for the
# Python-driven benchmarks, llama-bench, llama-batched-bench and llama-server, for the ISA this CPU
# has (named explicitly: GGML_NATIVE builds die with SIGILL on some of these machines; AMX off),
# with llama.cpp's default OpenMP threading. Prints a python command that has llama_cpp
# (build/llama.cpp-bench/bin/python, a wrapper around .venv/bin/python) for the scripts' --python.
# ~8 minutes on 2 cores the first time. Not needed to build, run or test Switchyard.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out="$root/build/llama.cpp-bench"
flags="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
cpu=$(grep -m1 '^flags' /proc/cpuinfo)
if [[ $cpu == *" avx512f "* && $cpu == *" avx512bw "* && $cpu == *" avx512vl "* ]]; then
  flags+=" -DGGML_AVX512=ON"
  [[ $cpu == *" avx512_vnni "* ]] && flags+=" -DGGML_AVX512_VNNI=ON"
  [[ $cpu == *" avx512_bf16 "* ]] && flags+=" -DGGML_AVX512_BF16=ON"
fi
flags+=" -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
LLAMACPP_CMAKE_FLAGS="$flags" bash "$root/tests/tools/build_llamacpp.sh" "$out" \
  --tools llama-bench,llama-batched-bench,llama-server >/dev/null
cat >"$out/bin/python" <<PY
#!/usr/bin/env bash
PYTHONPATH="$out/python\${PYTHONPATH:+:\$PYTHONPATH}" LLAMA_CPP_LIB_PATH="$out/lib" exec "$root/.venv/bin/python" "\$@"
PY
chmod +x "$out/bin/python"
echo "$out/bin/python"

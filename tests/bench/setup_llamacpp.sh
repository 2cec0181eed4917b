#!/usr/bin/env bash
# Builds llama.cpp for the side-by-side benchmarks into build/llama.cpp-bench (from the source
# vendored in the llama-cpp-python sdist, tests/tools/build_llamacpp.sh): libllama for the
# Python-driven benchmarks, llama-bench, llama-batched-bench and llama-server, for the ISA this CPU
# has (named explicitly: GGML_NATIVE builds die with SIGILL on some of these machines; AMX off),
# with llama.cpp's default OpenMP threading. Prints a python command that has llama_cpp
# (build/llama.cpp-bench/bin/python, a wrapper around .venv/bin/python) for the scripts' --python.
# ~8 minutes on 2 cores the first time. Not needed to build, run or test Switchyard.
#
#   setup_llamacpp.sh [--amx | --avx2]
#
# --amx: a second build into build/llama.cpp-bench-amx with llama.cpp's AMX kernels on as well
# (GGML_AMX_TILE/INT8/BF16, where the CPU lists amx_tile and amx_int8), the peer on AMX machines
# where it starts (an earlier VM of this kind killed it with SIGILL: try `llama-bench` once).
# --avx2: a build into build/llama.cpp-bench-avx2 with AVX2/FMA only, whatever the CPU has: the
# peer for Switchyard's AVX2 kernels forced on (SY_CPU_ISA=avx2), which is how an AVX-512 machine
# stands in for the AVX2-only CPU class (AMD EPYC before Zen 4, older Xeons).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
amx=0 avx2=0
[[ ${1:-} == --amx ]] && amx=1
[[ ${1:-} == --avx2 ]] && avx2=1
out="$root/build/llama.cpp-bench"
(( amx )) && out="$root/build/llama.cpp-bench-amx"
(( avx2 )) && out="$root/build/llama.cpp-bench-avx2"
flags="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
cpu=$(grep -m1 '^flags' /proc/cpuinfo)
if (( avx2 )); then
  flags+=" -DGGML_AVX512=OFF"
elif [[ $cpu == *" avx512f "* && $cpu == *" avx512bw "* && $cpu == *" avx512vl "* ]]; then
  flags+=" -DGGML_AVX512=ON"
  [[ $cpu == *" avx512_vnni "* ]] && flags+=" -DGGML_AVX512_VNNI=ON"
  [[ $cpu == *" avx512_bf16 "* ]] && flags+=" -DGGML_AVX512_BF16=ON"
  [[ $cpu == *" avx512vbmi "* ]] && flags+=" -DGGML_AVX512_VBMI=ON"
fi
if (( amx )); then
  [[ $cpu == *" amx_tile "* && $cpu == *" amx_int8 "* ]] || { echo "setup_llamacpp: this CPU has no AMX" >&2; exit 77; }
  flags+=" -DGGML_AMX_TILE=ON -DGGML_AMX_INT8=ON"
  [[ $cpu == *" amx_bf16 "* ]] && flags+=" -DGGML_AMX_BF16=ON"
else
  flags+=" -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
fi
LLAMACPP_CMAKE_FLAGS="$flags" bash "$root/tests/tools/build_llamacpp.sh" "$out" \
  --tools llama-bench,llama-batched-bench,llama-server >/dev/null
cat >"$out/bin/python" <<PY
#!/usr/bin/env bash
PYTHONPATH="$out/python\${PYTHONPATH:+:\$PYTHONPATH}" LLAMA_CPP_LIB_PATH="$out/lib" exec "$root/.venv/bin/python" "\$@"
PY
chmod +x "$out/bin/python"
echo "$out/bin/python"

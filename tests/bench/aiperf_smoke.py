#!/usr/bin/env python3
"""aiperf, unmodified, against a test cluster, CI-sized (docs/benchmarking.md, "aiperf"): the
field's benchmark client runs with nothing but the served model name and `--tokenizer DIR` from
`switchyard-worker export-tokenizer` — no Hugging Face hub, no workaround.

A real worker (--served-model-name HuggingFaceTB/SmolLM2-135M-Instruct) behind a real router;
aiperf 0.13.0 from a bench-only venv in the build folder (tests/bench/bench_venv.py: pinned,
installed once, no torch). Two short runs: streaming chat with ignore_eos, then the same with
--per-chunk-usage (stream_options.continuous_usage_stats). Checks: no errors, the report's
request counts are the ones asked for, every request produced exactly the output tokens asked
for (the server's usage), aiperf's client-side counts of the streamed text (the exported
tokenizer) agree within 2 tokens and exactly for most requests, and the router served that many
requests (its /metrics).

usage: SY_BUILD_DIR=build .venv/bin/python tests/bench/aiperf_smoke.py
Exit 77 with the reason when the model or PyPI is missing (a failure when CI is set).
"""
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, HERE)
import bench_venv  # noqa: E402
from cluster import Router  # noqa: E402
from support import skip_script as skip  # noqa: E402
from worker_client import BUILD, MODEL, WORKER, Worker  # noqa: E402

SERVED = "HuggingFaceTB/SmolLM2-135M-Instruct"
ISL, OSL = 64, 16


def aiperf(bin_dir, url, tokenizer, out, count, *extra):
    """Runs `aiperf profile` (bounded in time) and returns its JSON report."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [os.path.join(bin_dir, "aiperf"), "profile", "--model", SERVED, "--url", url, "--endpoint-type", "chat",
           "--streaming", "--tokenizer", tokenizer, "--request-count", str(count), "--concurrency", "2",
           "--synthetic-input-tokens-mean", str(ISL), "--synthetic-input-tokens-stddev", "0",
           "--output-tokens-mean", str(OSL), "--output-tokens-stddev", "0", "--extra-inputs", "ignore_eos:true",
           "--extra-inputs", "temperature:0",
           "--random-seed", "7", "--artifact-dir", out, "--ui-type", "none", *extra]
    # No HF_HUB_OFFLINE: aiperf 0.13 then looks a local folder up as a hub repo id and fails. The
    # folder path alone keeps it offline (a path is never resolved on the hub).
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    if r.returncode != 0:
        print(r.stdout[-4000:], r.stderr[-4000:])
        raise AssertionError(f"aiperf exited {r.returncode}")
    return json.load(open(os.path.join(out, "profile_export_aiperf.json")))


def check(report, count, out):
    assert report["error_summary"] == [], report["error_summary"]
    assert report["request_count"]["avg"] == count, report["request_count"]
    assert report["completed_request_count"]["avg"] == count
    assert report["request_error_rate"]["avg"] == 0
    exact = 0
    for line in open(os.path.join(out, "profile_export.jsonl")):
        m = json.loads(line)["metrics"]
        assert m["usage_completion_tokens"]["value"] == OSL  # the server: ignore_eos, exactly OSL
        # aiperf re-tokenizes the streamed text with the exported tokenizer. That may differ by a
        # token or two even with the right tokenizer: an end-of-turn token the model emits under
        # ignore_eos has no text, and decoded text can re-encode into fewer tokens.
        assert abs(m["output_token_count"]["value"] - OSL) <= 2, m["output_token_count"]
        exact += m["output_token_count"]["value"] == OSL
        assert m["time_to_first_token"]["value"] > 0
    assert exact * 2 >= count, f"only {exact} of {count} requests counted {OSL} output tokens client-side"


def main():
    if not os.path.exists(MODEL):
        skip(f"{MODEL} is missing (deploy/setup.sh)")
    if not os.path.exists(WORKER):
        skip(f"{WORKER} is not built")
    try:
        bin_dir = bench_venv.ensure(BUILD, "bench-venv", bench_venv.AIPERF)
    except bench_venv.Unreachable as e:
        skip(str(e))
    work = os.path.join(BUILD, "aiperf-smoke")
    tokenizer = os.path.join(work, "tokenizer")
    subprocess.run([WORKER, "export-tokenizer", "--model", MODEL, "--out", tokenizer], check=True,
                   capture_output=True, timeout=120)
    worker = Worker("--kv-blocks", "256", "--max-running", "4", "--served-model-name", SERVED)
    router = None
    try:
        router = Router([worker.endpoint])
        check(aiperf(bin_dir, router.url, tokenizer, os.path.join(work, "plain"), 8), 8, os.path.join(work, "plain"))
        per_chunk = os.path.join(work, "per-chunk")
        report = aiperf(bin_dir, router.url, tokenizer, per_chunk, 4, "--per-chunk-usage", "--use-server-token-count")
        check(report, 4, per_chunk)
        served = router.metrics().get('switchyard_router_requests_total{status="200"}', 0)
        assert served == 12, f"the router served {served} requests, aiperf reported 12"
        print(f"OK: aiperf ran 8 + 4 streaming chat requests against {SERVED} with --tokenizer {tokenizer}; "
              f"TTFT p50 {report['time_to_first_token']['p50']:.0f} ms, "
              f"output {report['output_token_throughput']['avg']:.1f} tok/s (2 shared cores)")
    finally:
        if router:
            router.stop()
        worker.stop()


if __name__ == "__main__":
    main()

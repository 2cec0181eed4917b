"""Router replicas keep cache affinity (docs/kv-events.md), on real processes: two workers send
their KV block events to two routers; a shared-prefix workload alternated across the routers gets
the same prefix-cache hit rate as the same load through one router, because both routers hold the
exact view of every worker's cache. Prints TTFT figures (not asserted: timing)."""
import json
import time
import urllib.request

import kv_workload
from cluster import MODEL_ID, Router
from support import needs_model, wait_for
from worker_client import Worker

pytestmark = needs_model

N_PREFIXES, N_ROUNDS, N_WORDS = 8, 4, 160  # ~190-token shared prefixes


def completion(router, prompt):
    """A streamed completion: (TTFT in s, prompt tokens, cached prompt tokens)."""
    body = json.dumps({"model": MODEL_ID, "prompt": prompt, "max_tokens": 2, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(router.url + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    ttft, usage, lines = None, None, []
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.status == 200
        for raw in r:
            line = raw.decode().strip()
            lines.append(line)
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if ttft is None and chunk.get("choices"):
                ttft = time.monotonic() - t0
            if chunk.get("usage"):
                usage = chunk["usage"]
    assert ttft is not None and usage is not None, lines
    return ttft, usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]


def views(router, workers):
    m = router.metrics()
    return [(m.get(f'switchyard_router_kv_view_blocks{{worker="{w.endpoint}"}}'),
             m.get(f'switchyard_router_kv_view_exact{{worker="{w.endpoint}"}}')) for w in workers]


def test_two_routers_keep_the_prefix_hit_rate_of_one():
    workers = [Worker("--kv-blocks", "1024", "--max-running", "8") for _ in range(2)]
    endpoints = [w.endpoint for w in workers]
    routers = []
    try:
        # A long heartbeat timeout: on a small shared machine a worker busy with long prefills can be
        # starved of CPU for seconds, and a worker declared dead would spoil the comparison.
        routers = [Router(endpoints, "--heartbeat-timeout-ms", "20000") for _ in range(2)]
        for r in routers:
            wait_for("both workers ready",
                     lambda r=r: r.metrics().get('switchyard_router_workers{state="ready"}') == 2)
        # Warm-up (not measured): a request through each router (its code paths, the workers' threads).
        for r in routers:
            completion(r, "Hello there.")

        # The same load, through one router, then alternated across two (fresh prefixes each time,
        # so both start from cold caches).
        one = kv_workload.run(routers[:1], completion, seed=1, n_prefixes=N_PREFIXES, n_rounds=N_ROUNDS, n_words=N_WORDS)
        two = kv_workload.run(routers, completion, seed=2, n_prefixes=N_PREFIXES, n_rounds=N_ROUNDS, n_words=N_WORDS)
        hit_one, p50_one, hit_two, p50_two = one["hit_rate"], one["ttft_p50"], two["hit_rate"], two["ttft_p50"]
        # For comparison: two routers that route on their own dispatch history only (no events).
        blind = [Router(endpoints, "--heartbeat-timeout-ms", "20000", "--no-kv-events") for _ in range(2)]
        routers += blind
        for r in blind:
            wait_for("both workers ready", lambda r=r: r.metrics().get('switchyard_router_workers{state="ready"}') == 2)
        old = kv_workload.run(blind, completion, seed=3, n_prefixes=N_PREFIXES, n_rounds=N_ROUNDS, n_words=N_WORDS)
        print(f"\nprefix hit rate: one router {hit_one:.3f}, two routers {hit_two:.3f} "
              f"(two routers without KV events: {old['hit_rate']:.3f})")
        print(f"TTFT p50: one router {p50_one * 1000:.1f} ms, two routers {p50_two * 1000:.1f} ms "
              f"(without KV events: {old['ttft_p50'] * 1000:.1f} ms)")

        # Some affinity at all: every request after the first of its prefix could hit.
        ideal = (N_ROUNDS - 1) / N_ROUNDS
        assert hit_one > 0.6 * ideal, hit_one
        assert abs(hit_two - hit_one) <= 0.10 * hit_one, (hit_one, hit_two)

        # Both routers hold the same exact view of each worker, built from the workers' events
        # (router 2 dispatched none of the first load's requests, yet sees their blocks).
        for r in blind:  # they do not ask for events: no view
            assert r.metrics().get('switchyard_router_kv_events_total{kind="snapshot"}') == 0
        same = wait_for("identical exact views",
                        lambda: (lambda a, b: a if a == b and all(e == 1 for _, e in a) else None)(
                            views(routers[0], workers), views(routers[1], workers)))
        assert sum(n for n, _ in same) > 0
        for r in routers[:2]:
            m = r.metrics()
            assert m['switchyard_router_kv_events_total{kind="stored"}'] > 0
            assert m['switchyard_router_kv_events_total{kind="snapshot"}'] >= 2  # one per worker at least
            assert m.get("switchyard_router_kv_event_gaps_total", 0) == 0
    finally:
        for r in routers:
            r.stop()
        for w in workers:
            w.stop()


def test_tenants_do_not_share_prefix_cache_blocks(tmp_path):
    """A tenant cannot learn that another sent a prompt: each tenant's prompts hash into its own
    prefix-cache namespace (common/kv_hash.hpp kv_cache_root), so the same text sent by another
    tenant reports cached_tokens 0 (and pays its prefill); a tenant's own repeat and tenants of
    one cache_group still share."""
    path = tmp_path / "tenants.json"
    path.write_text(json.dumps({"tenants": [
        {"name": "webapp", "keys": ["sk-webapp"]},
        {"name": "batch-jobs", "keys": ["sk-batch"]},
        {"name": "team-a", "keys": ["sk-team-a"], "cache_group": "shared"},
        {"name": "team-b", "keys": ["sk-team-b"], "cache_group": "shared"},
    ]}))
    worker = Worker("--kv-blocks", "256", "--max-running", "4")
    r = Router([worker.endpoint], "--tenants", str(path))
    memo = "Confidential merger memo: Acme Corp will acquire Globex on the first of March. " * 3

    def cached(key, text=memo):
        status, _, body = r.post("/v1/completions", {"model": MODEL_ID, "prompt": text, "max_tokens": 1,
                                                     "temperature": 0},
                                 headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        assert status == 200, body
        usage = json.loads(body)["usage"]
        assert usage["prompt_tokens"] >= 48
        return usage["prompt_tokens_details"]["cached_tokens"]

    try:
        assert cached("sk-webapp") == 0
        assert cached("sk-webapp") > 0  # its own repeat is a hit
        assert cached("sk-batch") == 0  # the same text from another tenant: nothing cached
        assert cached("sk-batch") > 0  # now its own
        assert cached("sk-team-a") == 0
        assert cached("sk-team-b") > 0  # one cache_group: shared on purpose
    finally:
        r.stop()
        worker.stop()

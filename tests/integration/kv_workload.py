"""The shared-prefix workload of the cache-affinity checks (tests/integration/test_kv_affinity.py,
tests/k8s scenario 9): groups of requests sharing a long prefix, round by round, alternated across
routers. Transport-agnostic: the caller passes `send(router, prompt)` that returns
(TTFT s, prompt tokens, cached prompt tokens)."""
import random
import statistics
import threading

WORDS = ("river stone harbor lantern copper meadow signal orbit candle velvet quarry timber falcon "
         "glacier saddle marble thunder pepper violet anchor basket cedar dune ember fiddle garnet "
         "hollow island jasmine kettle ladder mosaic nectar onyx prairie quartz ripple summit tundra").split()


def prefixes(seed, n, n_words):
    """n long shared prefixes (~1.1 tokens per word), different for each seed."""
    rng = random.Random(seed)
    return [f"Document {seed}-{p}: " + " ".join(rng.choice(WORDS) for _ in range(n_words)) for p in range(n)]


def run(routers, send, seed, n_prefixes=8, n_rounds=4, n_words=260, concurrency=4, timeout_s=300):
    """n_rounds requests per prefix, round by round; request (prefix p, round r) goes to router
    (p + r) % len(routers), so successive requests sharing a prefix alternate between routers.
    `concurrency` clients at a time. Returns {hit_rate, ttft_p50, ttfts, n}; a failed request fails."""
    work = [(p, r) for r in range(n_rounds) for p in range(n_prefixes)]
    texts = prefixes(seed, n_prefixes, n_words)
    results, errors, lock = [], [], threading.Lock()

    def client():
        while True:
            with lock:
                if not work or errors:
                    return
                p, r = work.pop(0)
            try:
                res = send(routers[(p + r) % len(routers)], f"{texts[p]}\nQuestion {r}: which word comes first?")
            except Exception as e:  # reported below
                with lock:
                    errors.append(f"prefix {p} round {r}: {e!r}")
                return
            with lock:
                results.append(res)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    assert not any(t.is_alive() for t in threads), f"requests still unanswered after {timeout_s} s"
    assert not errors, errors
    assert len(results) == n_prefixes * n_rounds
    ttfts = [r[0] for r in results]
    return {"hit_rate": sum(r[2] for r in results) / sum(r[1] for r in results),
            "ttft_p50": statistics.median(ttfts), "ttfts": ttfts, "n": len(results)}

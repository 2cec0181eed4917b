"""The rendered CPU overlay run as Kubernetes would run it (k8s_manifest.py): its router, worker
and Redis pods with exactly their command lines (tenants, CURVE link keys, Redis, the metrics
port), probes, preStop, grace periods, minReadySeconds, rollout strategy, replicas and
PodDisruptionBudgets, in network namespaces, under the suite's kubelet.

Every request must succeed: rollouts and drains done as the manifests say lose nothing."""
import copy
import shutil
import time

import pytest

import deploy_common
from k8s_kubelet import http_get
from k8s_load import ROUTER_PORT, assert_no_failures, completion, story, summary
from k8s_manifest import NOT_EMULATED, Overlay, load, unapplied


def prerequisite(what, fn):
    """fn(), or a skip naming `what` where deploy_common finds a tool missing (a failure under CI)."""
    try:
        return fn()
    except SystemExit as e:
        if e.code == 77:
            pytest.skip(f"{what} is missing (deploy/setup.sh installs it)")
        pytest.fail(f"{what} is missing and CI is set")


@pytest.fixture
def overlay():
    for tool in ("redis-server", "redis-cli"):  # the overlay's Redis pod and its readiness probe
        if shutil.which(tool) is None:
            prerequisite(f"{tool} (Debian package redis-server)",
                         lambda: deploy_common.skip(f"{tool} is not installed"))
    return prerequisite("kubectl (to render the overlay)", load)


def burst(c, routers, n, max_tokens=24, tag="b", key=True):
    """n concurrent streamed completions, round robin over `routers`, with the tenant key."""
    import threading
    out = [None] * n

    def one(i):
        out[i] = completion(routers[i % len(routers)].ip, dict(story(i, max_tokens, tag), model=c.model), i,
                            key=c.api_key if key else None)

    ts = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not any(t.is_alive() for t in ts), "requests still unanswered after 120 s"
    return out


def rollout(c, pods, template):
    """A Deployment's RollingUpdate of `pods` with the template's maxSurge / maxUnavailable and
    minReadySeconds: a new pod while the count of non-terminating pods allows the surge; an old
    one deleted (its preStop, its grace period) once the new one has been available for
    minReadySeconds; terminating pods do not count, as for the ReplicaSet. Returns (new pods,
    deletions)."""
    assert template.max_unavailable == 0 and template.max_surge >= 1, \
        f"the emulated rollout needs maxUnavailable 0 and a surge: {template}"
    old, new, deletions = list(pods), [], []
    while old:
        fresh = []
        while len(old) + len(new) + len(fresh) < len(pods) + template.max_surge:
            fresh.append(c.worker() if pods[0].kind == "worker" else c.router())
        c.kubelet.wait_available(fresh, template.min_ready_s, timeout=template.min_ready_s + 120)
        new += fresh
        for _ in fresh:
            if old:
                deletions.append(c.delete(old.pop(0)))
    return new, deletions


def settle(c, deletions, template):
    for d in deletions:
        code = d.wait(template.grace_s + 15)
        assert code == 0 and not d.pod.sigkilled, f"{d.pod.name} exited with {code}:\n{d.pod.log_tail()}"


# ---- the overlay's settings ----------------------------------------------------------------------


@pytest.mark.budget(60)
def test_overlay_settings_are_all_applied(overlay):
    """Every field of the rendered router, worker and Redis pods is applied by the emulation or
    named in NOT_EMULATED with its reason: a new probe kind or setting, hook or timing in the
    overlay fails here until the kubelet emulation applies it."""
    missing = unapplied(overlay)
    assert not missing, f"fields of the rendered overlay the netns kubelet does not apply: {missing}"
    for t in (overlay.router, overlay.worker, overlay.redis):
        for p in t.probes.values():
            assert (p.http_path is not None) + p.tcp + (p.exec_argv is not None) == 1, p
            assert p.port is None or isinstance(p.port, int), f"{t.name}: unresolved probe port {p}"
        print(t)
    print("not emulated: " + "; ".join(f"{k}: {v}" for k, v in NOT_EMULATED.items()))
    # The check itself: settings the kubelet does not implement, added to a copy, are named.
    docs = copy.deepcopy(overlay.docs)
    w = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == overlay.worker.name)
    cont = w["spec"]["template"]["spec"]["containers"][0]
    cont["lifecycle"]["preStop"] = {"exec": {"command": ["sleep", "12"]}}
    cont["readinessProbe"]["terminationGracePeriodSeconds"] = 5
    w["spec"]["progressDeadlineSeconds"] = 60
    found = unapplied(Overlay(docs))
    assert sorted(found) == sorted(f"{overlay.worker.name}: {p}" for p in (
        "container.lifecycle.preStop.exec.command", "container.readinessProbe.terminationGracePeriodSeconds",
        "spec.progressDeadlineSeconds")), found


# ---- pods as rendered ----------------------------------------------------------------------------


@pytest.mark.budget(150)
def test_overlay_pods_serve_with_tenants_link_and_redis(k8s, overlay):
    """The overlay's replicas (2 routers, 2 workers) and Redis: routers find the workers through
    the headless Service's name in their namespace, the workers admit them over CURVE, Redis is
    reached by its short Service name (search list, ndots:5); a request without a key is refused
    by name, with the tenant's key it streams; /metrics needs no key on the metrics port only; a
    repeated deterministic request is answered from Redis."""
    c = k8s(overlay=overlay)
    ws, rs = c.start(timeout=90)
    assert (len(ws), len(rs)) == (overlay.worker.replicas, overlay.router.replicas)
    c.wait_routers_see(rs, len(ws), timeout=c.dns_interval_s * 2 + 20)
    o = completion(rs[0].ip, dict(story(0), model=c.model))
    assert o.kind == "error" and o.status == 401 and o.code == "missing_api_key", o
    assert http_get(rs[0].ip, ROUTER_PORT, "/metrics", timeout=2)[0] == 401
    assert http_get(rs[0].ip, c.router_metrics_port, "/metrics", timeout=2)[0] == 200
    out = burst(c, rs, 16, tag="serve")
    assert_no_failures(out, at_least=16)
    for w in ws:
        assert c.worker_requests(w) > 0, f"{w.name} got no request"
    # The same deterministic request again, once stored: Redis answers it (no worker runs it).

    def cache(key):
        return sum(v for r in rs for k, v in c.metrics(r).items() if k.startswith(key))
    # Every answer's store attempted. On a busy small machine a store may still fail (past its
    # --cache-store-timeout-ms): the cache is best effort, and a request served live is stored again.
    def stores_attempted():
        return cache("switchyard_router_cache_stores_total") + cache("switchyard_router_cache_store_failures_total")
    c.wait_until("every answer's store attempted", lambda: stores_attempted() >= 16, 30)
    # A lookup has 5 ms too: one may miss, and the request is then served live (and stored); a few tries.
    hit = 'switchyard_router_cache_lookups_total{status="hit"}'
    for _ in range(3):
        before, hits = sum(c.worker_requests(w) for w in ws), cache(hit)
        again = completion(rs[3 % len(rs)].ip, dict(story(3, 24, "serve"), model=c.model), key=c.api_key)
        assert again.kind == "ok" and again.text == out[3].text, again
        if cache(hit) > hits:
            assert sum(c.worker_requests(w) for w in ws) == before, "a cache hit also ran on a worker"
            break
    else:
        stats = {k: v for r in rs for k, v in c.metrics(r).items() if k.startswith("switchyard_router_cache_")}
        pytest.fail(f"no cache hit in 3 tries: {stats}")


# ---- rollouts and drains with the overlay's timings ----------------------------------------------


@pytest.mark.parametrize("replicas", ["overlay", 1])
@pytest.mark.budget(300)
def test_overlay_worker_rollout_under_load(k8s, overlay, replicas):
    """The worker Deployment rolled (maxSurge 1, maxUnavailable 0, minReadySeconds, preStop sleep,
    SIGTERM drain, grace period: all the overlay's) under 8 streaming clients through the router
    Service: zero failed requests, every old worker exits 0 within its grace period. With the
    overlay's replicas, and scaled to one worker (the surge pod is the only other)."""
    t = overlay.worker
    c = k8s(overlay=overlay)
    ws, rs = c.start(workers=None if replicas == "overlay" else replicas, timeout=90)
    c.wait_routers_see(rs, len(ws), timeout=c.dns_interval_s * 2 + 20)
    load = c.load(8, max_tokens=48, tag="roll")
    time.sleep(3)
    new, deletions = rollout(c, ws, t)
    settle(c, deletions, t)
    time.sleep(2)
    outcomes = load.stop()
    print(f"worker rollout ({t}): {summary(outcomes)}; events: {c.kubelet.events}")
    assert_no_failures(outcomes, at_least=20)
    assert sum(c.worker_requests(n) for n in new) > 0, "the new workers got no request"


@pytest.mark.budget(240)
def test_overlay_router_rollout_behind_the_service(k8s, overlay):
    """The router Deployment rolled (maxSurge 1, no preStop, --shutdown-delay-s, grace period: the
    overlay's) while 8 clients send through the Service (kube-proxy lag 0.5 s): zero failed
    requests."""
    t = overlay.router
    c = k8s(overlay=overlay)
    ws, rs = c.start(timeout=90)
    c.wait_routers_see(rs, len(ws), timeout=c.dns_interval_s * 2 + 20)
    load = c.load(8, tag="rroll")
    time.sleep(2)
    new, deletions = rollout(c, rs, t)
    settle(c, deletions, t)
    outcomes = load.stop()
    print(f"router rollout ({t}): {summary(outcomes)}")
    assert_no_failures(outcomes, at_least=20)


def evict(c, pod, template):
    """The Eviction API: refused (False) while it would leave fewer ready pods of the kind than
    the PodDisruptionBudget's minAvailable (an unready pod may always go); else the pod is
    deleted gracefully (a Deletion)."""
    ready = [p for p in c.kubelet.live(pod.kind) if p.ready and not p.terminating]
    if pod in ready and len(ready) - 1 < (template.pdb_min_available or 0):
        return None
    return c.delete(pod)


@pytest.mark.budget(240)
def test_overlay_drain_of_the_only_worker_waits_for_a_replacement(k8s, overlay):
    """Workers scaled to 1, its node drained under load: the PodDisruptionBudget refuses to evict
    the only worker; once a replacement (on another node) is available, the eviction goes
    through, the worker drains (preStop, SIGTERM), and no request fails. The routers' budget lets
    one of two go at once, not both."""
    c = k8s(overlay=overlay)
    ws, rs = c.start(workers=1, timeout=90)
    c.wait_routers_see(rs, 1, timeout=c.dns_interval_s * 2 + 20)
    load = c.load(4, max_tokens=32, tag="drain")
    time.sleep(2)
    only = ws[0]
    refused = 0
    for _ in range(5):  # kubectl drain retries the eviction every few seconds
        assert evict(c, only, overlay.worker) is None, "the only ready worker was evicted"
        refused += 1
        time.sleep(0.5)
    gone = evict(c, rs[0], overlay.router)
    assert gone is not None and evict(c, rs[1], overlay.router) is None, \
        "the router budget let both routers go at once (or neither)"
    spare = c.worker()
    c.kubelet.wait_available(spare, overlay.worker.min_ready_s, timeout=overlay.worker.min_ready_s + 90)
    d = evict(c, only, overlay.worker)
    assert d is not None, "the eviction was still refused with a replacement available"
    settle(c, [d], overlay.worker)
    settle(c, [gone], overlay.router)
    time.sleep(2)
    outcomes = load.stop()
    print(f"drain: eviction refused {refused} times, then done; {summary(outcomes)}")
    assert_no_failures(outcomes, at_least=10)
    assert c.worker_requests(spare) > 0


# ---- the KEDA query's guard while scale-up workers are Pending ------------------------------------


def overloaded_and_autoscaled(k8s, overlay):
    """The overlay's cluster at its minReplicaCount of workers, more streams than its routers
    dispatch at once, and KEDA + HPA (k8s_autoscaler) polling; new workers stay Pending."""
    from k8s_autoscaler import KedaAutoscaler, load_scaled_object
    promtool = prerequisite("promtool", lambda: deploy_common.tool("promtool"))
    so = prerequisite("kubectl (to render the ScaledObject)", load_scaled_object)
    max_running = int(deploy_common.flag_value(overlay.worker.argv("w", "", ""), "--max-running"))
    c = k8s(overlay=overlay)
    ws, rs = c.start(workers=so.min, timeout=90)
    c.wait_routers_see(rs, len(ws), timeout=c.dns_interval_s * 2 + 20)
    # Each router dispatches up to --max-running + --local-queue (its default: 2) to each worker on
    # its own; beyond, requests wait in its cluster queue.
    local_queue = int(deploy_common.flag_value(overlay.router.argv("r", "", ""), "--local-queue") or 2)
    clients = len(rs) * len(ws) * (max_running + local_queue) + 24
    # Overloaded on purpose: a request may wait a minute for its first token (an OpenAI client
    # waits 10 minutes by default).
    load = c.load(clients, max_tokens=64, tag="keda", timeouts=(300.0, 150.0))
    scaler = KedaAutoscaler(c, so, rs, promtool, pending_s=20 * so.polling_s)
    return c, so, rs, load, clients, scaler


@pytest.mark.budget(240)
def test_keda_guard_discounts_pending_workers(k8s, overlay):
    """More streams than the overlay's 2 workers run at once (--max-running): requests queue, the
    oldest queued wait passes 2 s, and the rendered ScaledObject's query, evaluated by promtool
    on the routers' scraped series and kube-state-metrics' view of the Deployment, orders more
    workers. They stay Pending (unscheduled) for the rest of the test: while they count in
    spec.replicas but not in available replicas, the queue-wait guard's extra is weighed by
    available / spec, so the demand stays below what the same query gives without
    kube-state-metrics (the guard at full strength), and equals docs/operations.md's formula on
    the same samples. Every request still completes."""
    c, so, rs, load, clients, scaler = overloaded_and_autoscaled(k8s, overlay)
    try:
        c.wait_until("three polls of the ScaledObject", lambda: len(scaler.history) >= 3 or scaler.errors,
                     4 * so.polling_s + 30, 0.5)
    finally:
        scaler.stop()
        outcomes = load.stop()
    assert not scaler.errors, scaler.errors
    for h in scaler.history:
        print({k: (round(v, 2) if isinstance(v, float) else v) for k, v in h.items() if k != "t"})
    print(f"keda: {summary(outcomes)}")
    assert_no_failures(outcomes, at_least=clients)
    first = scaler.history[0]
    assert first["replicas"] > so.min, f"the queue did not order more workers: {scaler.history}"
    pending = [h for h in scaler.history[1:] if h["available"] < h["spec"]]
    assert pending, "no poll saw the new workers still Pending"
    s = scaler.series
    for h in pending:
        at = h["sample"]
        active = sum(v[at] or 0 for k, v in s.items() if k.startswith("switchyard_router_active_requests{"))
        wait = max(max((x for x in v[max(0, at - 60):at + 1] if x is not None), default=0)
                   for k, v in s.items() if k.startswith("switchyard_router_queue_oldest_wait_seconds{"))
        guard = min(2.0, max(1.0, wait / 2))
        share = min(1.0, h["available"] / max(1, h["spec"]))
        assert h["demand"] == pytest.approx(active * (1 + (guard - 1) * share), rel=1e-6), (h, active, wait)
        assert h["demand_without_ksm"] == pytest.approx(active * guard, rel=1e-6), (h, active, wait)
    waits = [round(max(v[h["sample"]] or 0 for k, v in s.items() if "oldest_wait" in k), 2) for h in scaler.history]
    assert any(h["demand"] < h["demand_without_ksm"] for h in pending), \
        f"the guard never acted while workers were Pending (oldest queued waits {waits} s): {scaler.history}"


# ---- failures with the overlay's settings ----------------------------------------------------------


@pytest.mark.budget(180)
def test_overlay_worker_sigkill_mid_load(k8s, overlay):
    """A worker SIGKILLed with streams running on it (the router's default heartbeat timeout, the
    overlay's readiness probe): the pod leaves DNS at once, started streams resume on the
    survivor, unstarted requests re-run, every request completes."""
    c = k8s(overlay=overlay)
    ws, rs = c.start(timeout=90)
    c.wait_routers_see(rs, len(ws), timeout=c.dns_interval_s * 2 + 20)
    victim = ws[0]
    import threading
    out = [None] * 24

    def one(i):
        out[i] = completion(rs[i % len(rs)].ip, dict(story(i, 64, "kill"), model=c.model), i, key=c.api_key)

    ts = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(out))]
    for t in ts:
        t.start()
    c.wait_until(f"{victim.name} streaming", lambda: c.metrics(victim)["switchyard_worker_requests_running"] >= 2
                 and c.metrics(victim)["switchyard_worker_generation_tokens_total"] >= 8, 30, 0.05)
    c.kubelet.crash(victim)
    c.wait_until("the killed pod out of DNS", lambda: victim.ip not in c.kubelet.dns_history[-1][1], 5, 0.05)
    for t in ts:
        t.join(120)
    assert not any(t.is_alive() for t in ts), "requests still unanswered after 120 s"
    assert_no_failures(out, at_least=len(out))
    ms = [c.metrics(r) for r in rs]
    resumed = sum(m["switchyard_router_streams_resumed_total"] for m in ms)
    print(f"worker SIGKILL (overlay): {summary(out)}; resumed {resumed:.0f}, re-dispatched "
          f"{sum(m['switchyard_router_redispatched_total'] for m in ms):.0f}")
    assert resumed >= 1, "no started stream was resumed"


@pytest.mark.budget(180)
def test_overlay_lossy_link_every_stream_completes(k8s, overlay):
    """The worker pods' links lose 5 % of their packets both ways and are slow (netem 30 +- 10 ms;
    or nftables drops and a token bucket), with the overlay's CURVE link and the router's default
    heartbeat timeout: 8 streams of 128 tokens complete with the text they had over the clean
    link, no worker is declared dead."""
    from k8s_net import link_impairment
    how, why = link_impairment()
    if how is None:
        prerequisite(why, lambda: deploy_common.skip(why))
    c = k8s(overlay=overlay)
    ws, rs = c.start(timeout=90)
    c.wait_routers_see(rs, len(ws), timeout=c.dns_interval_s * 2 + 20)
    body = [dict(story(i, 128, "lossy"), model=c.model, cache=False) for i in range(8)]
    clean = burst_bodies(c, rs, body)
    assert_no_failures(clean, at_least=8)
    for w in ws:
        how = w.host.impair(loss_percent=5, delay_ms=30)
    try:
        lossy = burst_bodies(c, rs, body)
        dropped = sum(w.host.dropped_packets() for w in ws)
    finally:
        for w in ws:
            w.host.repair()
    print(f"lossy link ({how}, overlay): {summary(lossy)}, {dropped} packets dropped")
    if how == "nft+tbf":
        assert dropped >= 5, f"the impairment dropped {dropped} packets: too few to prove anything"
    assert_no_failures(lossy, at_least=8)
    assert [o.text for o in lossy] == [o.text for o in clean]
    for r in rs:
        assert c.router_workers(r).get("dead", 0) == 0, c.router_workers(r)


def burst_bodies(c, routers, bodies):
    import threading
    out = [None] * len(bodies)

    def one(i):
        out[i] = completion(routers[i % len(routers)].ip, bodies[i], i, timeout=150, key=c.api_key)

    ts = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(bodies))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(160)
    return out


# ---- kube-proxy and keep-alive clients -------------------------------------------------------------


@pytest.mark.budget(240)
def test_overlay_router_rollout_with_keep_alive_sdk_clients(k8s, overlay):
    """The router Deployment rolled while 8 OpenAI SDK clients, each with its pool of keep-alive
    connections, stream through the Service's ClusterIP (kube-proxy: a new connection goes to a
    ready router; an established one stays on its router while that router terminates). A
    terminating router keeps answering on its open connections for --shutdown-delay-s, says
    `Connection: close` and closes idle ones; the SDK opens new connections (and retries a
    request whose connection closed before the response, as it does by default): zero failed
    requests."""
    prerequisite("the openai Python package (in .venv)", lambda: __import__("openai"))
    from k8s_load import SdkLoad
    from k8s_proxy import proxy_available
    if not proxy_available():
        prerequisite("nft (Debian package nftables), for the ClusterIP", lambda: deploy_common.skip("no nft"))
    t = overlay.router
    c = k8s(overlay=overlay)
    ws, rs = c.start(timeout=90)
    c.wait_routers_see(rs, len(ws), timeout=c.dns_interval_s * 2 + 20)
    vip = c.cluster_ip()
    load = SdkLoad(f"http://{vip}:{ROUTER_PORT}/v1", c.api_key, c.model, 8, max_tokens=24)
    try:
        time.sleep(3)
        new, deletions = rollout(c, rs, t)
        settle(c, deletions, t)
        time.sleep(1)
    finally:
        outcomes = load.stop()
    print(f"router rollout, SDK keep-alive clients via ClusterIP {vip}: {summary(outcomes)}; "
          f"endpoints applied: {c.proxy.history}")
    assert_no_failures(outcomes, at_least=20)
    assert len(c.proxy.history) >= 3, f"the ClusterIP never followed the rollout: {c.proxy.history}"


@pytest.mark.budget(300)
def test_keda_prometheus_outage_never_scales_down(k8s, overlay):
    """After the queue ordered more workers, the load stops and Prometheus becomes unreachable:
    while fewer than fallback.failureThreshold polls have failed the HPA keeps its replicas; from
    then on KEDA reports the fallback, which with `behavior: currentReplicasIfHigher` is the
    running replicas (more than fallback.replicas), so the blind autoscaler never scales down, where
    the query, had it answered, would have asked for fewer. Prometheus back: the query again."""
    c, so, rs, load, clients, scaler = overloaded_and_autoscaled(k8s, overlay)
    threshold = so.fallback["failureThreshold"]
    try:
        c.wait_until("the first poll", lambda: scaler.history or scaler.errors, 2 * so.polling_s + 30, 0.2)
        load.set_concurrency(0)  # clients finish what they have in flight, then idle
        scaler.prometheus_up = False
        c.wait_until(f"{threshold + 1} polls without Prometheus",
                     lambda: len(scaler.history) >= threshold + 2 or scaler.errors, (threshold + 2) * so.polling_s + 30,
                     0.5)
        scaler.prometheus_up = True
        c.wait_until("a poll with Prometheus back", lambda: len(scaler.history) >= threshold + 3 or scaler.errors,
                     2 * so.polling_s + 30, 0.5)
    finally:
        scaler.stop()
        outcomes = load.stop(timeout=240)
    assert not scaler.errors, scaler.errors
    for h in scaler.history:
        print({k: (round(v, 2) if isinstance(v, float) else v) for k, v in h.items() if k != "t"})
    assert_no_failures(outcomes, at_least=clients)
    first, outage, back = scaler.history[0], scaler.history[1:threshold + 2], scaler.history[threshold + 2]
    scaled = first["replicas"]
    assert scaled > so.min, f"the queue did not order more workers: {scaler.history}"
    assert all(not h["prometheus_up"] for h in outage) and back["prometheus_up"], scaler.history
    for h in outage[:threshold - 1]:
        assert "fallback" not in h and h["replicas"] == scaled, h  # the HPA cannot compute: unchanged
    for h in outage[threshold - 1:]:
        assert h["fallback"] == max(so.fallback["replicas"], scaled) and h["replicas"] == scaled, h
    asked = max(so.min, min(so.max, -(-(outage[-1]["demand"] or 0) // so.threshold)))
    assert asked < scaled, f"the load had not dropped: the query still asked for {asked} workers"
    assert back["replicas"] == scaled, back  # the scale-down stabilization window holds them

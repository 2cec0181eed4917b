"""The autoscaling signal (docs/operations.md, "Autoscaling"), with promtool:
  * the recording rules (deploy/prometheus/switchyard-rules.yml) load (`promtool check rules`) and
    the Prometheus operator's copy (deploy/k8s/components/monitoring/prometheusrule.yaml) holds the
    same groups;
  * `promtool test rules tests/deploy/autoscaling_rules_test.yml`: the rules on synthetic series
    (the queue-wait guard weighed by the share of requested workers available, from
    kube-state-metrics, among them);
  * each KEDA ScaledObject as rendered (deploy/k8s/examples/*) has a self-contained query (no
    recorded series) that, evaluated by promtool on the same series, gives exactly what the
    recording rule gives for its namespace and model, and desired workers = ceil(that / threshold);
    a query without series is an error (ignoreNullValues "false") and the fallback never scales down;
  * the alerts (the switchyard-alerts group) fire in the unit tests as docs/operations.md says;
  * the query selects the workers' namespace and model, the model copied from the worker's label,
    which the worker Deployment carries too (the recording rules read it from kube-state-metrics).

    .venv/bin/python tests/deploy/test_autoscaling.py      (ctest: deploy/autoscaling-rules)"""
import math
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from deploy_common import KUSTOMIZATIONS, ROOT, Report, k8s_tree, need_modules, parse_args, render, tool  # noqa: E402

RULES = os.path.join(ROOT, "deploy", "prometheus", "switchyard-rules.yml")
OPERATOR_RULES = os.path.join(ROOT, "deploy", "k8s", "components", "monitoring", "prometheusrule.yaml")
UNIT_TESTS = os.path.join(os.path.dirname(__file__), "autoscaling_rules_test.yml")
DEMAND = "namespace_model:switchyard_worker_demand:requests"


def parse_labels(text):
    """{k: v} of a promtool label string like name{a="x",b="y"}."""
    import re
    return dict(re.findall(r'(\w+)="([^"]*)"', text))


def main():
    parse_args()
    need_modules("yaml")
    import yaml
    promtool = tool("promtool")
    r = Report()

    out = subprocess.run([promtool, "check", "rules", RULES], capture_output=True, text=True)
    r.check(out.returncode == 0, "promtool check rules deploy/prometheus/switchyard-rules.yml",
            (out.stdout + out.stderr).strip())
    with open(RULES) as f:
        plain = yaml.safe_load(f)
    with open(OPERATOR_RULES) as f:
        operator = yaml.safe_load(f)
    r.check(operator["spec"]["groups"] == plain["groups"],
            "the PrometheusRule holds exactly the groups of deploy/prometheus/switchyard-rules.yml")
    recorded = {rule["record"] for g in plain["groups"] for rule in g["rules"] if "record" in rule}

    out = subprocess.run([promtool, "test", "rules", UNIT_TESTS], capture_output=True, text=True)
    r.check(out.returncode == 0, "promtool test rules tests/deploy/autoscaling_rules_test.yml",
            (out.stdout + out.stderr).strip())

    with open(UNIT_TESTS) as f:
        unit = yaml.safe_load(f)
    seen = set()
    for k in KUSTOMIZATIONS:
        for so in (d for d in render(k) if d["kind"] == "ScaledObject"):
            ns = so["metadata"].get("namespace", "default")
            for t in so["spec"]["triggers"]:
                if t["type"] != "prometheus":
                    continue
                q, threshold = t["metadata"]["query"].strip(), float(t["metadata"]["threshold"])
                if (q, threshold) in seen:
                    continue
                seen.add((q, threshold))
                name = f"{k}: ScaledObject {so['metadata']['name']} trigger {t.get('name', t['type'])}"
                r.check(not any(rec in q for rec in recorded), f"{name}: query needs no recording rule")
                # No series must be an error (fallback and alert), never a silent 0.
                r.check(str(t["metadata"].get("ignoreNullValues", "true")).lower() == "false",
                        f"{name}: ignoreNullValues is \"false\"")
                fb = so["spec"].get("fallback", {})
                r.check(fb.get("behavior") == "currentReplicasIfHigher",
                        f"{name}: a failing query never scales the workers down (fallback.behavior)", str(fb))
                model = parse_labels(q).get("model")
                tests = []
                for g in unit["tests"]:
                    for e in g.get("promql_expr_test", []):
                        if e["expr"] != DEMAND:
                            continue
                        want = [s["value"] for s in e["exp_samples"]
                                if parse_labels(s["labels"]) == {"namespace": ns, "model": model}]
                        if not want:
                            continue
                        tests.append({"name": f"{name} | {g['name']}", "interval": g["interval"],
                                      "input_series": g["input_series"], "promql_expr_test": [
                                          {"expr": q, "eval_time": e["eval_time"],
                                           "exp_samples": [{"labels": "{}", "value": want[0]}]},
                                          {"expr": f"ceil(({q}) / {threshold:g})", "eval_time": e["eval_time"],
                                           "exp_samples": [{"labels": "{}", "value": math.ceil(want[0] / threshold)}]}]})
                r.check(bool(tests), f"{name}: the unit tests have expectations for namespace {ns}, model {model}")
                if not tests:
                    continue
                with tempfile.TemporaryDirectory() as tmp:
                    path = os.path.join(tmp, "scaledobject_test.yml")
                    with open(path, "w") as f:
                        yaml.safe_dump({"rule_files": [RULES], "evaluation_interval": unit["evaluation_interval"],
                                        "tests": tests}, f, sort_keys=False)
                    out = subprocess.run([promtool, "test", "rules", path], capture_output=True, text=True)
                r.check(out.returncode == 0,
                        f"{name}: its query equals the recording rule on {len(tests)} scenarios "
                        f"(and ceil(query / {threshold:g}) the workers wanted)", (out.stdout + out.stderr).strip())
    r.check(bool(seen), "the rendered kustomizations hold a KEDA ScaledObject with a prometheus trigger")
    check_query_follows_the_worker(r, yaml)
    r.close()


def query_labels(docs):
    """(the ScaledObject's query's label matchers as a set of (namespace, model) pairs, the worker
    Deployment's (namespace, switchyard.dev/model label)) of one rendered kustomization."""
    import re
    so = next(d for d in docs if d["kind"] == "ScaledObject")
    q = so["spec"]["triggers"][0]["metadata"]["query"]
    pairs = set(re.findall(r'namespace="([^"]*)", model="([^"]*)"', q))
    w = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "switchyard-worker")
    model = w["spec"]["template"]["metadata"]["labels"]["switchyard.dev/model"]
    # The Deployment's own label (kube-state-metrics' kube_deployment_labels): how the recording
    # rules tell which model a worker Deployment's replicas serve.
    if w["metadata"].get("labels", {}).get("switchyard.dev/model") != model:
        model = f"{model} (but the Deployment's own label is {w['metadata'].get('labels', {}).get('switchyard.dev/model')})"
    return pairs, (w["metadata"].get("namespace"), model)


def check_query_follows_the_worker(r, yaml):
    """The query selects the namespace and model the workers run in (a mismatch is a query with no
    series: the fallback and the absent-signal alert), and the model is copied from the worker's
    label (the KEDA component's replacements): an overlay serving another model changes one place."""
    import shutil
    import tempfile
    for k in KUSTOMIZATIONS:
        docs = render(k)
        if not any(d["kind"] == "ScaledObject" for d in docs):
            continue
        pairs, worker = query_labels(docs)
        r.check(pairs == {worker}, f"{k}: the query's namespace and model are the workers' {worker} "
                "(their pods' label, and the worker Deployment's own)", str(pairs))
    with tempfile.TemporaryDirectory() as tmp:
        tree = os.path.join(tmp, "k8s")
        shutil.copytree(k8s_tree(), tree)
        path = os.path.join(tree, "base", "worker.yaml")
        with open(path) as f:
            text = f.read()
        with open(path, "w") as f:
            f.write(text.replace("switchyard.dev/model: SmolLM2-135M-Instruct.Q4_1",
                                 "switchyard.dev/model: Llama-3.2-1B-Instruct-Q4_K_M"))
        pairs, worker = query_labels(render("examples/cpu-autoscaled", tree))
        r.check(worker[1] == "Llama-3.2-1B-Instruct-Q4_K_M" and pairs == {worker},
                "another model in the worker's label is the model the rendered query selects", str(pairs))


if __name__ == "__main__":
    main()

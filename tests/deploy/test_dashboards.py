"""The Grafana dashboards (deploy/grafana-dashboard.json, deploy/grafana-operations-dashboard.json)
query what exists: every switchyard_* metric they name is one the router, worker or cache sources
emit (histograms with their _bucket/_sum/_count series), or a series recorded by
deploy/prometheus/switchyard-rules.yml; every query parses as PromQL (`promtool check rules` on
the queries, Grafana's variables replaced by sample values); panels have unique ids and do not
overlap on the 24-column grid.

    .venv/bin/python tests/deploy/test_dashboards.py      (ctest: deploy/dashboards)"""
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from deploy_common import ROOT, Report, need_modules, parse_args, tool  # noqa: E402

DASHBOARDS = ["deploy/grafana-dashboard.json", "deploy/grafana-operations-dashboard.json"]
SOURCES = ["router", "worker", "cache", "common"]
RULES = os.path.join(ROOT, "deploy", "prometheus", "switchyard-rules.yml")
# Grafana's variables → sample values, so that the query is plain PromQL.
VARIABLES = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h", "${DS_PROMETHEUS}": "x"}


def emitted_metrics():
    names = set()
    for d in SOURCES:
        for path in glob.glob(os.path.join(ROOT, d, "**", "*.[ch]pp"), recursive=True):
            with open(path, errors="replace") as f:
                names |= set(re.findall(r'"(switchyard_[a-z0-9_]+)', f.read()))
    return names


def panels_of(dash):
    for p in dash.get("panels", []):
        yield p
        yield from p.get("panels", [])


def main():
    parse_args()
    need_modules("yaml")
    import yaml
    promtool = tool("promtool")
    r = Report()
    emitted = emitted_metrics()
    with open(RULES) as f:
        recorded = {rule["record"] for g in yaml.safe_load(f)["groups"] for rule in g["rules"] if "record" in rule}
    r.check(len(emitted) > 20, f"{len(emitted)} switchyard_* metric names found in the sources")
    for rel in DASHBOARDS:
        with open(os.path.join(ROOT, rel)) as f:
            dash = json.load(f)
        panels = list(panels_of(dash))
        ids = [p["id"] for p in panels]
        r.check(len(ids) == len(set(ids)), f"{rel}: panel ids are unique")
        boxes = []
        for p in panels:
            g = p["gridPos"]
            r.check(g["x"] >= 0 and g["x"] + g["w"] <= 24, f"{rel}: panel '{p['title']}' fits the 24-column grid")
            for q in boxes:
                if g["x"] < q["x"] + q["w"] and q["x"] < g["x"] + g["w"] and g["y"] < q["y"] + q["h"] and q["y"] < g["y"] + g["h"]:
                    r.check(False, f"{rel}: panel '{p['title']}' overlaps another panel")
            boxes.append(g)
        variables = dict(VARIABLES)
        for v in dash.get("templating", {}).get("list", []):
            variables["$" + v["name"]] = "24" if v.get("type") == "textbox" else "x"
            variables["${" + v["name"] + "}"] = variables["$" + v["name"]]
        exprs = [(p["title"], t["expr"]) for p in panels for t in p.get("targets", []) if t.get("expr")]
        unknown = set()
        for title, e in exprs:
            for name in re.findall(r"\b((?:switchyard|namespace|namespace_model)[a-z0-9_:]*)\b(?=\s*[{\[(),/*+\-<>=)]|\s*$)", e):
                if ":" not in name and not name.startswith("switchyard_"):
                    continue
                base = re.sub(r"_(bucket|sum|count)$", "", name)
                if name not in emitted and base not in emitted and name not in recorded:
                    unknown.add(f"{name} ('{title}')")
        r.check(not unknown, f"{rel}: every metric its {len(exprs)} queries name is emitted or recorded",
                ", ".join(sorted(unknown)))
        rules = {"groups": [{"name": "dashboard", "rules": []}]}
        for i, (title, e) in enumerate(exprs):
            for k in sorted(variables, key=len, reverse=True):
                e = e.replace(k, variables[k])
            rules["groups"][0]["rules"].append({"record": f"dashboard:query:{i}", "expr": e})
        with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
            yaml.safe_dump(rules, f)
            path = f.name
        out = subprocess.run([promtool, "check", "rules", path], capture_output=True, text=True)
        os.unlink(path)
        r.check(out.returncode == 0, f"{rel}: its {len(exprs)} queries parse as PromQL (promtool)",
                (out.stdout + out.stderr).strip())
    r.close()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""PNG plots of tests/bench/report.py's report.json (run in the bench venv, which has matplotlib):

  throughput.png     output tok/s vs concurrency, per server
  latency.png        TTFT and ITL p50 / p99 vs concurrency, per server; Switchyard's mean TTFT / ITL
                     as aiperf and as the router measured them (the gap is the load generator's delay)
  shared_prefix.png  TTFT p50 / p99, unique prompts vs a shared prefix, per server
  cache_hit.png      first request vs an exact repeat (TTFT and E2E p50), per server

usage: report_plots.py REPORT.json OUT_DIR
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"switchyard": "#1f77b4", "llama_server": "#d62728"}
LABELS = {"switchyard": "Switchyard", "llama_server": "llama-server"}
DPI = 90


def subtitle(rep):
    m = rep["machine"]
    s = rep["settings"]
    loads = [r["loadavg_1m"] for rows in rep["sweep"].values() for r in rows if "loadavg_1m" in r]
    load = f", load avg {min(loads):.0f}-{max(loads):.0f}" if loads else ""
    return (f"{rep['model']}, {s['isl']} in / {s['osl']} out (ignore_eos), {m['cores']} vCPU {m['cpu']}{load}, "
            f"aiperf on the same cores")


def concurrency_axis(ax, rows):
    levels = sorted({r["concurrency"] for rs in rows for r in rs})
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels)
    ax.set_xticklabels([str(c) for c in levels])
    ax.set_xlabel("concurrent requests")


def save(fig, out, name):
    fig.tight_layout()
    fig.savefig(os.path.join(out, name), dpi=DPI)
    plt.close(fig)


def throughput(rep, out):
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for name, rows in rep["sweep"].items():
        c = [r["concurrency"] for r in rows]
        ax.plot(c, [r["output_throughput"] for r in rows], "o-", color=COLORS[name], label=LABELS[name])
    concurrency_axis(ax, rep["sweep"].values())
    ax.set_ylabel("output tokens/s")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("Output throughput vs concurrency", fontsize=10)
    fig.text(0.5, 0.005, subtitle(rep), ha="center", fontsize=6.5, color="#555")
    save(fig, out, "throughput.png")


def latency(rep, out):
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, key, title in ((axes[0], "ttft", "TTFT"), (axes[1], "itl", "ITL")):
        for name, rows in rep["sweep"].items():
            c = [r["concurrency"] for r in rows]
            col = COLORS[name]
            ax.plot(c, [r[f"p50_{key}_ms"] for r in rows], "o-", color=col, label=f"{LABELS[name]} p50")
            ax.plot(c, [r[f"p99_{key}_ms"] for r in rows], "o--", color=col, alpha=0.6, label=f"{LABELS[name]} p99")
            if name == "switchyard" and rows and rows[0].get(f"router_avg_{key}_ms") is not None:
                # Means, both exact: the gap is the load generator's own delay.
                ax.plot(c, [r[f"avg_{key}_ms"] for r in rows], "^-.", color=col, label="Switchyard mean (aiperf)")
                ax.plot(c, [r[f"router_avg_{key}_ms"] for r in rows], "s:", color="#2ca02c",
                        label="Switchyard mean, router-measured")
        concurrency_axis(ax, rep["sweep"].values())
        ax.set_yscale("log")
        ax.set_ylabel("ms")
        ax.set_title(f"{title} percentiles vs concurrency", fontsize=10)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.text(0.5, 0.005, subtitle(rep), ha="center", fontsize=6.5, color="#555")
    save(fig, out, "latency.png")


def bars(ax, groups, series, ylabel, title):
    """groups: x labels; series: [(label, color, [values per group])]."""
    width = 0.8 / max(1, len(series))
    for i, (label, color, values) in enumerate(series):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, values, width, label=label, color=color)
        for x, v in zip(xs, values):
            ax.text(x, v, f"{v:.0f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")


def shared_prefix(rep, out):
    if not rep.get("prefix"):
        return
    s = rep["settings"]
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    groups = [LABELS[n] for n in rep["prefix"]]
    series = []
    for kind, label, alpha in (("unique", "unique prompts", 0.55), ("shared_prefix", "shared prefix", 1.0)):
        for stat in ("p50", "p99"):
            vals = [rep["prefix"][n][kind][f"{stat}_ttft_ms"] for n in rep["prefix"]]
            color = "#1f77b4" if kind == "shared_prefix" else "#7f7f7f"
            series.append((f"{label} {stat}", color if stat == "p50" else color + "99", vals))
    bars(ax, groups, series, "TTFT ms",
         f"TTFT: {s['prefixes']} shared {s['prefix_len']}-token prefixes + {s['isl']} vs unique "
         f"{s['prefix_len'] + s['isl']} (c={s['prefix_concurrency']})")
    fig.text(0.5, 0.005, subtitle(rep), ha="center", fontsize=6.5, color="#555")
    save(fig, out, "shared_prefix.png")


def cache_hit(rep, out):
    if not rep.get("cache"):
        return
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    names = list(rep["cache"])
    series = [("first TTFT", "#7f7f7f", [rep["cache"][n]["first_ttft_p50_ms"] for n in names]),
              ("repeat TTFT", "#2ca02c", [rep["cache"][n]["repeat_ttft_p50_ms"] for n in names]),
              ("first E2E", "#bcbcbc", [rep["cache"][n]["first_e2e_p50_ms"] for n in names]),
              ("repeat E2E", "#98df8a", [rep["cache"][n]["repeat_e2e_p50_ms"] for n in names])]
    ax.set_yscale("log")
    bars(ax, [LABELS[n] for n in names], series, "ms (p50, log scale)",
         "Exact repeats: Switchyard's response cache vs recomputing")
    fig.text(0.5, 0.005, subtitle(rep), ha="center", fontsize=6.5, color="#555")
    save(fig, out, "cache_hit.png")


def main():
    rep = json.load(open(sys.argv[1]))
    out = sys.argv[2]
    throughput(rep, out)
    latency(rep, out)
    shared_prefix(rep, out)
    cache_hit(rep, out)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""PNG charts of a crosstrain report (`crosstrain bench --report DIR` / `--merge OUT ...` run it
when python3 has matplotlib; it can also be run by hand):

    python3 scripts/report_charts.py DIR/report.json [OUT_DIR]

writes, where the report has the figures:
    tokens_per_s.png  training tokens/s per device and precision (and the peers: PyTorch, llm.c),
                      one panel per model
    gemm.png          GEMM GFLOP/s per shape and device (% of the dense peak where it is known)
    memory.png        peak device memory per technique and device
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def grouped_bars(ax, groups, series, values, ylabel, annotate=None):
    """Bars: one cluster per group, one bar per series; values[(group, series)] (missing: none)."""
    width = 0.8 / max(len(series), 1)
    for i, s in enumerate(series):
        xs, ys, notes = [], [], []
        for g_i, g in enumerate(groups):
            if (g, s) in values:
                xs.append(g_i + i * width)
                ys.append(values[(g, s)])
                notes.append(annotate.get((g, s), "") if annotate else "")
        bars = ax.bar(xs, ys, width, label=s)
        for b, n in zip(bars, notes):
            if n:
                ax.annotate(n, (b.get_x() + b.get_width() / 2, b.get_height()), ha="center",
                            va="bottom", fontsize=7)
    ax.set_xticks([g_i + 0.4 - width / 2 for g_i in range(len(groups))])
    ax.set_xticklabels(groups, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7)


def title(report):
    b = report.get("build", {})
    merged = report.get("merged_from")
    where = f"merged from {len(merged)} reports" if merged else report.get("host", {}).get("name", "")
    return f"crosstrain {b.get('commit', '?')}, {report.get('date', '')}, {where}"


def tokens_chart(report, out):
    models = []
    values = {}
    for d in report["devices"]:
        for t in d.get("train", []):
            if "tokens_per_s" not in t:
                continue
            if t["model"] not in models:
                models.append(t["model"])
            values[(t["model"], d["label"], t["precision"])] = t["tokens_per_s"]
    merged = "merged_from" in report
    for p in report.get("peers", []):  # beside the devices, labelled as report.md's columns
        if "tokens_per_s" not in p:
            continue
        label = p.get("label")  # a merge names each peer's column (hosts of one name apart)
        if not label:
            label = f"{p['peer']} {str(p.get('device', '')).split(':')[0]}".strip()
            if merged:
                label += "@" + p.get("origin", {}).get("host", {}).get("name", "")
        if p["model"] not in models:
            models.append(p["model"])
        values[(p["model"], label, p["precision"])] = p["tokens_per_s"]
    if not values:
        return False
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.5), squeeze=False)
    for ax, m in zip(axes[0], models):
        devices = [lab for (mm, lab, _) in values if mm == m]
        devices = list(dict.fromkeys(devices))
        order = ["fp32", "tf32", "bf16", "fp16"]
        precs = sorted(set(p for (mm, _, p) in values if mm == m),
                       key=lambda p: order.index(p) if p in order else len(order))
        mine = {(lab, p): v for (mm, lab, p), v in values.items() if mm == m}
        grouped_bars(ax, devices, precs, mine, "tokens/s")
        if max(mine.values()) > 100 * min(mine.values()):  # a CPU beside a GPU: both visible
            ax.set_yscale("log")
        ax.set_title(f"{m}: training tokens/s", fontsize=10)
    fig.suptitle(title(report), fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "tokens_per_s.png"), dpi=110)
    plt.close(fig)
    return True


def gemm_chart(report, out):
    rows = []
    for d in report["devices"]:
        for g in d.get("gemm", []):
            if "gflops" in g:
                rows.append((d["label"], g))
    if not rows:
        return False
    dtypes = list(dict.fromkeys(g["dtype"] for _, g in rows))
    fig, axes = plt.subplots(len(dtypes), 1, figsize=(11, 3.8 * len(dtypes)), squeeze=False)
    for ax, dt in zip(axes[:, 0], dtypes):
        values, notes = {}, {}
        for label, g in rows:
            if g["dtype"] != dt:
                continue
            shape = f"{g['model']} {g['shape']} {g['layout']}"
            series = label + (" own" if g.get("variant") else "")
            values[(shape, series)] = g["gflops"]
            if "efficiency" in g:
                notes[(shape, series)] = f"{100 * g['efficiency']:.0f}%"
        shapes = list(dict.fromkeys(s for s, _ in values))
        series = list(dict.fromkeys(s for _, s in values))
        grouped_bars(ax, shapes, series, values, "GFLOP/s", notes)
        ax.set_title(f"GEMM {dt} (labels: % of the dense peak where known)", fontsize=10)
    fig.suptitle(title(report), fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "gemm.png"), dpi=110)
    plt.close(fig)
    return True


def memory_chart(report, out):
    values = {}
    for d in report["devices"]:
        for m in d.get("memory", []):
            values[(f"{m['model']} {m['technique']}", d["label"])] = m["bytes"] / 2**20
    if not values:
        return False
    groups = list(dict.fromkeys(g for g, _ in values))
    series = list(dict.fromkeys(s for _, s in values))
    fig, ax = plt.subplots(figsize=(max(6, 1.5 * len(groups)), 4.5))
    grouped_bars(ax, groups, series, values, "MiB (device accounting, peak)")
    ax.set_title("memory per technique", fontsize=10)
    fig.suptitle(title(report), fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "memory.png"), dpi=110)
    plt.close(fig)
    return True


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    path = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) == 3 else os.path.dirname(os.path.abspath(path))
    with open(path) as f:
        report = json.load(f)
    if report.get("format") != "crosstrain-report":
        sys.exit(f"{path}: not a crosstrain report")
    drawn = [name for name, fn in (("tokens_per_s.png", tokens_chart), ("gemm.png", gemm_chart),
                                   ("memory.png", memory_chart)) if fn(report, out)]
    print("wrote " + (", ".join(drawn) if drawn else "no chart (the report has no figures)"))


if __name__ == "__main__":
    main()

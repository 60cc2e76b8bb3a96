#!/usr/bin/env python3
"""Chart of one bench/run.sh results directory: latency distribution (fnrun vs
the unshare floor vs runc) and throughput against concurrency.

    python3 bench/chart.py bench/results/<stamp> docs/benchmarks.png
"""
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from summarize import load  # noqa: E402  (bench/, next to this script)


def main():
    d, out = sys.argv[1], sys.argv[2]
    series = []
    for label, f, color in (("floor: unshare -Urmnpfiu true", "floor.json", "tab:gray"),
                            ("floor: unshare … cat", "floor-cat.json", "tab:olive"),
                            ("runc run (rootless spec)", "runc.json", "tab:red")):
        doc = load(d, f)
        if doc:
            series.append((label, sorted(t * 1e3 for t in doc["results"][0]["times"]), color))
    warm = load(d, "fnrun-warm.json")
    if warm:
        series.append(("fnrun warm RunFunction (gRPC)", sorted(warm["levels"][0]["latencies_ms"]), "tab:blue"))

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    for label, ms, color in series:
        n = len(ms)
        ys = [(i + 1) / n for i in range(n)]
        ax1.step(ms, ys, where="post", label=f"{label} (n={n}, p50 {ms[n // 2]:.1f} ms)", color=color)
    ax1.set_xscale("log")
    ax1.set_xlabel("latency per run (ms, log scale)")
    ax1.set_ylabel("fraction of runs ≤ latency")
    ax1.set_title("Latency distribution, one run at a time")
    for q in (0.5, 0.9, 0.99):
        ax1.axhline(q, color="k", lw=0.4, ls=":")
    ax1.grid(True, which="both", lw=0.3)
    ax1.legend(fontsize=8, loc="lower right")

    ft, fl = load(d, "fnrun-throughput.json"), load(d, "floor-throughput.json")
    if ft:
        xs = [lvl["concurrency"] for lvl in ft["levels"]]
        ax2.plot(xs, [lvl["throughput_per_s"] for lvl in ft["levels"]], "o-", color="tab:blue",
                 label="fnrun RunFunction (cat)")
    if fl:
        xs = [lvl["concurrency"] for lvl in fl["levels"]]
        ys = [lvl["throughput_per_s"] for lvl in fl["levels"]]
        ax2.plot(xs, ys, "s-", color="tab:gray", label="floor: xargs -P of unshare … true")
        ax2.plot(xs, [0.6 * y if x == 8 else None for x, y in zip(xs, ys)], "v", color="tab:green",
                 label="target at 8: 60% of floor")
    ax2.set_xscale("log", base=2)
    ax2.set_xticks([1, 2, 4, 8])
    ax2.set_xticklabels(["1", "2", "4", "8"])
    ax2.set_xlabel("concurrency")
    ax2.set_ylabel("runs per second")
    ax2.set_title("Throughput against concurrency")
    ax2.set_ylim(bottom=0)
    ax2.grid(True, lw=0.3)
    ax2.legend(fontsize=8)
    m = load(d, "machine.json") or {}
    fig.suptitle(f"fnrun benchmarks — {m.get('nproc')} cores, kernel {m.get('kernel')}, "
                 f"cgroup {m.get('cgroup')}, {m.get('date', '')[:10]}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Summarise one bench/run.sh results directory: prints the comparison table and
the issue's targets as ratios, and writes summary.json next to the raw files.
Standard library only."""
import json
import math
import os
import sys


def load(d, name):
    p = os.path.join(d, name)
    if not os.path.exists(p):
        return None
    with open(p) as f:
        return json.load(f)


def pct(sorted_ms, p):
    if not sorted_ms:
        return float("nan")
    rank = math.ceil(p / 100.0 * len(sorted_ms))
    return sorted_ms[min(max(rank, 1), len(sorted_ms)) - 1]


def dist(ms):
    ms = sorted(ms)
    return {
        "n": len(ms),
        "p50_ms": pct(ms, 50), "p90_ms": pct(ms, 90), "p99_ms": pct(ms, 99),
        "max_ms": ms[-1] if ms else float("nan"),
        "mean_ms": sum(ms) / len(ms) if ms else float("nan"),
    }


def hyperfine_ms(doc, name=None):
    if doc is None:
        return None
    for r in doc["results"]:
        if name is None or r["command"] == name:
            return [t * 1e3 for t in r["times"]]
    return None


def main():
    d = sys.argv[1]
    s = {"machine": load(d, "machine.json"), "loadavg_end": load(d, "loadavg-end.json")}
    lat = {}
    raw = {}
    for label, f in (("floor", "floor.json"), ("floor-cat", "floor-cat.json"), ("runc", "runc.json")):
        ms = hyperfine_ms(load(d, f))
        if ms:
            lat[label] = dist(ms)
            raw[label] = ms
    warm = load(d, "fnrun-warm.json")
    if warm:
        lvl = warm["levels"][0]
        lat["fnrun"] = dist(lvl["latencies_ms"])
        lat["fnrun"]["errors"] = lvl["errors"]
        raw["fnrun"] = lvl["latencies_ms"]
    s["latency"] = lat
    # Warm calls on each kind of listener (bench/listeners.sh).
    listeners = {}
    for kind in ("unix", "abstract", "tcp", "tls"):
        doc = load(d, f"listener-{kind}.json")
        if doc:
            lvl = doc["levels"][0]
            listeners[kind] = dist(lvl["latencies_ms"])
            listeners[kind]["errors"] = lvl["errors"]
    s["listeners"] = listeners
    tput = {"fnrun": {}, "floor": {}}
    ft = load(d, "fnrun-throughput.json")
    if ft:
        for lvl in ft["levels"]:
            tput["fnrun"][str(lvl["concurrency"])] = {
                "runs_per_s": lvl["throughput_per_s"], "errors": lvl["errors"],
                "p50_ms": lvl["p50_ms"], "p99_ms": lvl["p99_ms"]}
    fl = load(d, "floor-throughput.json")
    if fl:
        for lvl in fl["levels"]:
            tput["floor"][str(lvl["concurrency"])] = {
                "runs_per_s": lvl["throughput_per_s"], "errors": 0 if lvl["xargs_status"] == 0 else -1}
    s["throughput"] = tput
    # The grpc-go client's load (bench/run.sh's step d2).
    grpcgo = {}
    for key, f in (("seq", "grpcgo-seq.json"), ("c8", "grpcgo-c8.json")):
        doc = load(d, f)
        if doc:
            grpcgo[key] = doc
    if grpcgo:
        s["grpc_go"] = grpcgo
    cold = load(d, "cold.json")
    if cold:
        s["cold"] = {r["command"]: {"mean_s": r["mean"], "min_s": r["min"], "max_s": r["max"],
                                    "runs": len(r["times"])} for r in cold["results"]}
        s["cold"]["image"] = load(d, "cold-image.json")
    snaps = []
    p = os.path.join(d, "daemon-snapshots.jsonl")
    if os.path.exists(p):
        with open(p) as f:
            snaps = [json.loads(line) for line in f if line.strip()]
    s["daemon"] = snaps
    soak = load(d, "fnrun-soak.json")
    if soak:
        lvl = soak["levels"][0]
        s["soak"] = {k: lvl[k] for k in ("calls", "errors", "throughput_per_s", "p50_ms", "p99_ms", "max_ms")}
    first = load(d, "fnrun-first.json")
    if first:
        s["first_run_ms"] = first["levels"][0]["p50_ms"]
    p = os.path.join(d, "run-cgroups-after-exit.txt")
    if os.path.exists(p):
        s["run_cgroups_after_exit"] = int(open(p).read().strip() or 0)

    # ------------------------------------------------------------ targets
    t = []
    f, r, w = lat.get("floor"), lat.get("runc"), lat.get("fnrun")
    if f and w:
        t.append(("warm p50 <= 2x floor p50", w["p50_ms"] / f["p50_ms"], 2.0, "<="))
        t.append(("warm p99 <= 4x floor p50", w["p99_ms"] / f["p50_ms"], 4.0, "<="))
    if r and w:
        t.append(("runc p50 / fnrun p50 >= 8", r["p50_ms"] / w["p50_ms"], 8.0, ">="))
    f8, w8 = tput["floor"].get("8"), tput["fnrun"].get("8")
    if f8 and w8:
        t.append(("throughput@8 >= 60% of floor@8", w8["runs_per_s"] / f8["runs_per_s"], 0.6, ">="))
        t.append(("errors@8 == 0", w8["errors"], 0, "=="))
    # Issue 23's targets (sandboxes made ahead), for each client.
    if f and w:
        t.append(("#23 warm p50 <= 0.7x floor p50", w["p50_ms"] / f["p50_ms"], 0.7, "<="))
        t.append(("#23 warm p99 <= 1.5x floor p99", w["p99_ms"] / f["p99_ms"], 1.5, "<="))
    if f8 and w8:
        t.append(("#23 throughput@8 >= floor@8", w8["runs_per_s"] / f8["runs_per_s"], 1.0, ">="))
    g = s.get("grpc_go", {})
    if f and "seq" in g:
        t.append(("#23 grpc-go: warm p50 <= 0.7x floor p50", g["seq"]["p50_ms"] / f["p50_ms"], 0.7, "<="))
        t.append(("#23 grpc-go: warm p99 <= 1.5x floor p99", g["seq"]["p99_ms"] / f["p99_ms"], 1.5, "<="))
    if f8 and "c8" in g:
        t.append(("#23 grpc-go: throughput@8 >= floor@8", g["c8"]["runs_per_s"] / f8["runs_per_s"], 1.0, ">="))
        t.append(("grpc-go: errors == 0", g["c8"]["errors"] + g.get("seq", {}).get("errors", 0), 0, "=="))
    if cold and "fnrun-pull" in s["cold"]:
        t.append(("cold <= 1/2 of skopeo+umoci",
                  s["cold"]["fnrun-pull"]["mean_s"] / s["cold"]["skopeo+umoci"]["mean_s"], 0.5, "<="))
    if snaps:
        idle = next((x for x in snaps if x["at"] == "idle-cached"), snaps[0])
        t.append(("idle RSS (+ spawner's own) <= 20 MiB",
                  (idle["vmrss_kib"] + idle.get("spawner_private_kib", 0)) / 1024.0, 20.0, "<="))
        last = snaps[-1]
        if last["at"] in ("after-soak", "idle-after-soak"):
            ref = next((x for x in snaps if x["at"] == "after-throughput"), idle)
            t.append(("RSS growth after-throughput->after-soak (MiB)",
                      (last["vmrss_kib"] - ref["vmrss_kib"]) / 1024.0, 2.0, "<="))
            for k in ("fds", "threads", "busy_cgroups", "run_scratch_dirs"):
                if k in last:
                    t.append((f"{k} growth idle->after-soak", last[k] - idle[k], 0, "<="))
            # v1 keeps the cgroups of finished runs for reuse: as many as the
            # most runs at once, which the throughput phase already reached.
            t.append(("run_cgroups growth after-throughput->after-soak",
                      last["run_cgroups"] - ref["run_cgroups"], 0, "<="))
    u = listeners.get("unix")
    for kind in ("tcp", "tls"):
        k = listeners.get(kind)
        if u and k:
            t.append((f"{kind} p50 - unix p50 <= 2 ms", k["p50_ms"] - u["p50_ms"], 2.0, "<="))
    if "run_cgroups_after_exit" in s:
        t.append(("run cgroups left after the daemon exits", s["run_cgroups_after_exit"], 0, "=="))
    ops = {"<=": lambda a, b: a <= b, ">=": lambda a, b: a >= b, "==": lambda a, b: a == b}
    s["targets"] = [{"target": n, "value": v, "bound": b, "op": o, "met": bool(ops[o](v, b))}
                    for n, v, b, o in t]
    with open(os.path.join(d, "summary.json"), "w") as out:
        json.dump(s, out, indent=2)
        out.write("\n")

    # ------------------------------------------------------------ print
    m = s["machine"] or {}
    print(f"machine: {m.get('nproc')} cores, kernel {m.get('kernel')}, cgroup {m.get('cgroup')}, "
          f"load {m.get('loadavg_start')} -> {s.get('loadavg_end')}")
    print()
    print(f"{'latency (ms)':<26}{'n':>6}{'p50':>9}{'p90':>9}{'p99':>9}{'max':>9}")
    names = {"floor": "floor: unshare true", "floor-cat": "floor: unshare cat",
             "runc": "runc run (userns)", "fnrun": "fnrun warm RunFunction"}
    for k in ("floor", "floor-cat", "runc", "fnrun"):
        if k in lat:
            x = lat[k]
            print(f"{names[k]:<26}{x['n']:>6}{x['p50_ms']:>9.2f}{x['p90_ms']:>9.2f}{x['p99_ms']:>9.2f}{x['max_ms']:>9.2f}")
    for k, x in s["listeners"].items():
        print(f"{'  on ' + k:<26}{x['n']:>6}{x['p50_ms']:>9.2f}{x['p90_ms']:>9.2f}{x['p99_ms']:>9.2f}{x['max_ms']:>9.2f}")
    for k, x in s.get("grpc_go", {}).items():
        print(f"{'grpc-go client, ' + k:<26}{x['calls']:>6}{x['p50_ms']:>9.2f}{'-':>9}{x['p99_ms']:>9.2f}{'-':>9}"
              f"  {x['runs_per_s']:.1f} runs/s, {x['errors']} errors")
    print()
    levels = sorted({int(c) for v in tput.values() for c in v})
    if levels:
        print(f"{'throughput (runs/s)':<26}" + "".join(f"{'c=' + str(c):>9}" for c in levels) + f"{'errors':>9}")
        for k in ("floor", "fnrun"):
            row = tput[k]
            errs = sum(max(v.get("errors", 0), 0) for v in row.values())
            print(f"{k:<26}" + "".join(f"{row[str(c)]['runs_per_s']:>9.1f}" if str(c) in row else f"{'-':>9}"
                                      for c in levels) + f"{errs:>9}")
        print()
    if cold:
        img = (s["cold"].get("image") or {}).get("registry_bytes", 0) / 2**20
        print(f"cold start, {img:.0f} MiB in registry: mean (min..max) s")
        for k in ("fnrun-pull", "skopeo+umoci"):
            c = s["cold"][k]
            print(f"  {k:<24}{c['mean_s']:>8.2f} ({c['min_s']:.2f}..{c['max_s']:.2f}), {c['runs']} runs")
        print()
    if snaps:
        print(f"{'daemon':<20}{'RSS MiB':>9}{'HWM MiB':>9}{'spawner':>9}{'threads':>9}{'fds':>6}"
              f"{'cgroups':>9}{'busy':>6}{'scratch':>9}")
        for x in snaps:
            spawner = x.get("spawner_private_kib")
            spawner = "-" if spawner is None else f"{spawner / 1024:.1f}"
            print(f"{x['at']:<20}{x['vmrss_kib']/1024:>9.1f}{x['vmhwm_kib']/1024:>9.1f}{spawner:>9}"
                  f"{x['threads']:>9}{x['fds']:>6}{x['run_cgroups']:>9}{x.get('busy_cgroups', '-'):>6}"
                  f"{x['run_scratch_dirs']:>9}")
        if "soak" in s:
            k = s["soak"]
            print(f"soak: {k['calls']} calls at c=8, {k['errors']} errors, {k['throughput_per_s']:.1f} runs/s, "
                  f"p50 {k['p50_ms']:.1f} ms, p99 {k['p99_ms']:.1f} ms")
        print()
    print(f"{'target':<48}{'value':>10}{'bound':>8}  met")
    for x in s["targets"]:
        print(f"{x['target']:<48}{x['value']:>10.2f}{x['op']:>4}{x['bound']:>4}  {'yes' if x['met'] else 'NO'}")


if __name__ == "__main__":
    main()

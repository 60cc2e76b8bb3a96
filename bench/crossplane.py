#!/usr/bin/env python3
"""Crossplane v1 functions through fnrun's function host, side by side with
the same function server run directly on the host (see bench/crossplane.sh,
which builds what this needs, and docs/benchmarks.md).

Measures, in one run:
  warm    per-call latency on one connection, one call at a time, through
          fnrun (mTLS and h2c) and directly (the server's own mTLS, and h2c),
          in interleaved rounds; and calls/s at concurrency 8
  cold    the first call after a scale to zero (image cached, new client
          connection), once in the spare sandbox made when the server
          stopped and once without spares (--sandbox-pool 0), against
          starting the same binary on the host, waiting for its port, and
          making the first call
  memory  fnrun hosting N functions (warm, scaled to zero with their spares,
          then without) against N function processes left running (RSS and
          PSS of every process)

Everything runs on 127.0.0.1 with bounded counts and timeouts.
"""

import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ENV = os.environ
FNRUN = ENV["FNRUN"]
FN = ENV["FN_BIN"]
CLIENT = ENV["CLIENT_BIN"]
LAYOUT = ENV["LAYOUT"]
WORK = Path(ENV["WORK"])
OUT = Path(ENV["OUT"])
REQUEST = ENV["REQUEST"]
CERTS = WORK / "certs"
CALLS = int(ENV.get("CALLS", "2000"))
ROUNDS = int(ENV.get("ROUNDS", "3"))
COLD_RUNS = int(ENV.get("COLD_RUNS", "20"))
MEM_FUNCTIONS = int(ENV.get("MEM_FUNCTIONS", "20"))
NS = "crossplane-system"
IMAGE = f"oci:{LAYOUT}:v1"
FN_ARGS = ["--variant=label", "--serve=v1,v1beta1"]

children = []


def log(msg):
    print(f"== {msg} ({time.strftime('%H:%M:%S')})", file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accepting(port):
    with socket.socket() as s:
        s.settimeout(0.05)
        try:
            s.connect(("127.0.0.1", port))
            return True
        except OSError:
            return False


def wait_port(port, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not accepting(port):
        if time.monotonic() > deadline:
            raise SystemExit(f"nothing accepted on port {port} within {timeout}s")
        time.sleep(0.005)


def spawn(cmd, log_path):
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=open(log_path, "ab"),
                         stderr=subprocess.STDOUT)
    children.append(p)
    return p


def stop(p):
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def client(addr, name=None, tls=False, calls=1, concurrency=1, timeout="30s"):
    """One crossplaneclient run (calls like Crossplane: v1, mTLS with SNI and
    :authority NAME.NS); its JSON outcome or summary."""
    cmd = [CLIENT, f"-address={addr}", f"-request={REQUEST}", f"-timeout={timeout}",
           f"-calls={calls}", f"-concurrency={concurrency}", "-api=v1"]
    if name:
        cmd.append(f"-authority={name}.{NS}:9443")
    if tls:
        cmd += [f"-ca={CERTS}/ca.crt", f"-cert={CERTS}/client.crt", f"-key={CERTS}/client.key"]
        if name:
            cmd.append(f"-server-name={name}.{NS}")
    else:
        cmd.append("-insecure")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"{cmd}: {out.stderr}")
    result = json.loads(out.stdout)
    ok = result.get("ok", 1 if result.get("code") == "OK" else 0)
    if ok != calls:
        raise SystemExit(f"{cmd}: not every call succeeded: {out.stdout[:2000]}")
    return result


def start_direct(port, tls):
    cmd = [FN, *FN_ARGS, f"--address=127.0.0.1:{port}"]
    cmd += [f"--tls-certs-dir={CERTS}/server"] if tls else ["--insecure"]
    p = spawn(cmd, WORK / f"direct-{port}.log")
    wait_port(port)
    return p


def functions_file(path, entries):
    lines = ["functions:"]
    for name, idle in entries:
        lines.append(f"- name: {name}\n  image: {IMAGE}\n  idleTimeout: {idle}")
    path.write_text("\n".join(lines) + "\n")


class Daemon:
    def __init__(self, label, entries, tls, extra=()):
        self.port = free_port()
        self.log = WORK / f"daemon-{label}.log"
        file = WORK / f"functions-{label}.yaml"
        functions_file(file, entries)
        cmd = [FNRUN, "serve", "--log-format=json", "--listen", f"unix:{WORK}/{label}.sock",
               "--cache-dir", str(WORK / "cache"), "--functions", str(file),
               "--functions-listen", f"127.0.0.1:{self.port}"]
        if tls:
            cmd += [f"--functions-ca-cert={CERTS}/ca.crt", f"--functions-ca-key={CERTS}/ca.key",
                    f"--functions-client-ca={CERTS}/ca.crt"]
        else:
            cmd.append("--functions-insecure")
        cmd += list(extra)
        self.proc = spawn(cmd, self.log)
        wait_port(self.port)
        self.addr = f"127.0.0.1:{self.port}"

    def events(self, message, function=None):
        found = []
        for line in self.log.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            fields = event.get("fields", {})
            if fields.get("message") != message:
                continue
            if function is not None and fields.get("function") != function:
                continue
            found.append(fields)
        return found

    def wait_events(self, message, function, count, timeout=30.0):
        deadline = time.monotonic() + timeout
        while len(self.events(message, function)) < count:
            if time.monotonic() > deadline:
                raise SystemExit(f"{count}x {message} {function} not logged: {self.log}")
            time.sleep(0.02)


def tree(pid):
    """pid and every process descended from it."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += parents.get(p, [])
    return out


def memory(pids):
    rss = pss = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss += int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss += int(line.split()[1])
        except OSError:
            pass
    return {"processes": len(pids), "rss_kib": rss, "pss_kib": pss}


def warm(results):
    log(f"warm: {ROUNDS} interleaved rounds of {CALLS} calls, one at a time")
    direct_h2c_port, direct_tls_port = free_port(), free_port()
    direct_h2c = start_direct(direct_h2c_port, tls=False)
    direct_tls = start_direct(direct_tls_port, tls=True)
    fn_tls = Daemon("warm-tls", [("function-label", "0")], tls=True)
    fn_h2c = Daemon("warm-h2c", [("function-label", "0")], tls=False)
    targets = {
        "direct-h2c": dict(addr=f"127.0.0.1:{direct_h2c_port}", tls=False),
        "fnrun-h2c": dict(addr=fn_h2c.addr, name="function-label", tls=False),
        "direct-mtls": dict(addr=f"127.0.0.1:{direct_tls_port}", name="function-label", tls=True),
        "fnrun-mtls": dict(addr=fn_tls.addr, name="function-label", tls=True),
    }
    for target in targets.values():
        client(calls=300, **target)  # starts fnrun's instances; warms caches
    rounds = {k: [] for k in targets}
    for _ in range(ROUNDS):
        for key, target in targets.items():
            rounds[key].append(client(calls=CALLS, **target)["latency_ms"])
    warm_out = {}
    for key, rs in rounds.items():
        warm_out[key] = {q: statistics.median(r[q] for r in rs) for q in ("p50", "p90", "p99", "mean")}
        warm_out[key]["rounds"] = rs
    log("throughput at concurrency 8")
    for key, target in targets.items():
        s = client(calls=CALLS * 2, concurrency=8, **target)
        warm_out[key]["c8_calls_per_second"] = s["calls_per_second"]
        warm_out[key]["c8_p50"] = s["latency_ms"]["p50"]
    # fnrun's own time per call (arrival to answer, upstream included).
    results["warm"] = warm_out
    for d in (fn_tls, fn_h2c):
        stop(d.proc)
    stop(direct_h2c)
    stop(direct_tls)


def direct_cold():
    """Starts the function on the host, waits for its port, makes the first
    call on a new connection, stops it: (port_ms, call_ms)."""
    port = free_port()
    t0 = time.perf_counter()
    p = spawn([FN, *FN_ARGS, f"--address=127.0.0.1:{port}", f"--tls-certs-dir={CERTS}/server"],
              WORK / "direct-cold.log")
    while not accepting(port):
        if p.poll() is not None:
            raise SystemExit("the direct function exited")
        time.sleep(0.0002)
    port_ms = (time.perf_counter() - t0) * 1000
    call_ms = client(f"127.0.0.1:{port}", name="function-label", tls=True)["elapsed_ms"]
    stop(p)
    return port_ms, call_ms


SPARE_MADE = "function server's sandbox made ahead"
SPARE_ENDED = "function server's sandbox ended unused"


def cold(results):
    log(f"cold: {COLD_RUNS} first calls after a scale to zero, interleaved with direct starts")
    # Two daemons called in turn: the default one, which makes a spare
    # sandbox for the next server when one stops, and one without a sandbox
    # pool (--sandbox-pool 0), which makes none.
    d = Daemon("cold", [("function-cold", "1s")], tls=True)
    n = Daemon("cold-no-spare", [("function-cold", "1s")], tls=True,
               extra=["--sandbox-pool", "0"])
    # The image into the cache (pulled from its layout, unpacked) first.
    for x in (d, n):
        client(x.addr, name="function-cold", tls=True)
        x.wait_events("function server stopped", "function-cold", 1)
    d.wait_events(SPARE_MADE, "function-cold", 1)
    first_ready = len(d.events("function server ready", "function-cold"))
    fnrun_calls, no_spare_calls, port_ms, call_ms = [], [], [], []
    for i in range(COLD_RUNS):
        out = client(d.addr, name="function-cold", tls=True)
        fnrun_calls.append(out["elapsed_ms"])
        d.wait_events("function server ready", "function-cold", first_ready + i + 1)
        out = client(n.addr, name="function-cold", tls=True)
        no_spare_calls.append(out["elapsed_ms"])
        n.wait_events("function server ready", "function-cold", first_ready + i + 1)
        a, b = direct_cold()
        port_ms.append(a)
        call_ms.append(b)
        d.wait_events("function server stopped", "function-cold", i + 2)
        d.wait_events(SPARE_MADE, "function-cold", i + 2)
        n.wait_events("function server stopped", "function-cold", i + 2)
    events = d.events("function server ready", "function-cold")[first_ready:]
    ready = [e["ready_ms"] for e in events]
    from_spare = sum(1 for e in events if e.get("from_spare") is True)
    no_spare_ready = [e["ready_ms"] for e in
                      n.events("function server ready", "function-cold")[first_ready:]]
    stop(d.proc)
    stop(n.proc)
    # A warm call on a new connection: what a cold call costs besides the start.
    w = Daemon("cold-warm", [("function-cold", "0")], tls=True)
    client(w.addr, name="function-cold", tls=True)
    new_conn = [client(w.addr, name="function-cold", tls=True)["elapsed_ms"] for _ in range(COLD_RUNS)]
    stop(w.proc)
    med = statistics.median
    totals = [a + b for a, b in zip(port_ms, call_ms)]
    results["cold"] = {
        "fnrun_first_call_ms": fnrun_calls,
        "fnrun_ready_ms": ready,
        "fnrun_from_spare": from_spare,
        "fnrun_no_spare_first_call_ms": no_spare_calls,
        "fnrun_no_spare_ready_ms": no_spare_ready,
        "fnrun_warm_new_connection_ms": new_conn,
        "direct_port_ms": port_ms,
        "direct_first_call_ms": call_ms,
        "median": {
            "fnrun_first_call_ms": med(fnrun_calls),
            "fnrun_ready_ms": med(ready),
            "fnrun_no_spare_first_call_ms": med(no_spare_calls),
            "fnrun_no_spare_ready_ms": med(no_spare_ready),
            "fnrun_warm_new_connection_ms": med(new_conn),
            "direct_port_ms": med(port_ms),
            "direct_first_call_ms": med(call_ms),
            "direct_total_ms": med(totals),
        },
        "ratio_of_medians": med(fnrun_calls) / med(totals),
        "paired_ratio_median": med(f / t for f, t in zip(fnrun_calls, totals)),
        "no_spare_ratio_of_medians": med(no_spare_calls) / med(totals),
        "no_spare_paired_ratio_median": med(f / t for f, t in zip(no_spare_calls, totals)),
    }


def mem(results):
    n = MEM_FUNCTIONS
    log(f"memory: {n} functions through fnrun, and {n} processes")
    names = [f"function-{i:02}" for i in range(n)]
    d = Daemon("memory", [(name, "8s") for name in names], tls=False)
    time.sleep(1)
    idle_start = memory(tree(d.proc.pid))
    for name in names:
        client(d.addr, name=name, tls=False)
    time.sleep(1)
    warm_all = memory(tree(d.proc.pid))
    d.wait_events("function server stopped", None, n, timeout=60)
    time.sleep(1)
    scaled = memory(tree(d.proc.pid))
    # The spares made as the servers stopped (at most --sandbox-pool, 8)
    # end unused after 10 s.
    spares = len(d.events(SPARE_MADE))
    d.wait_events(SPARE_ENDED, None, spares, timeout=60)
    time.sleep(1)
    spares_ended = memory(tree(d.proc.pid))
    stop(d.proc)
    procs, ports = [], []
    for _ in names:
        port = free_port()
        procs.append(start_direct(port, tls=False))
        ports.append(port)
    for port in ports:
        client(f"127.0.0.1:{port}", tls=False)
    time.sleep(1)
    direct = memory([p.pid for p in procs])
    for p in procs:
        stop(p)
    results["memory"] = {
        "functions": n,
        "fnrun_before_any_call": idle_start,
        "fnrun_all_warm": warm_all,
        "fnrun_scaled_to_zero": scaled,
        "spares": spares,
        "fnrun_spares_ended": spares_ended,
        "direct_processes_running": direct,
    }


def main():
    results = {"calls": CALLS, "rounds": ROUNDS, "cold_runs": COLD_RUNS}
    try:
        warm(results)
        cold(results)
        mem(results)
    finally:
        for p in children:
            stop(p)
    (OUT / "crossplane.json").write_text(json.dumps(results, indent=1))
    w, c, m = results["warm"], results["cold"]["median"], results["memory"]
    print("\nwarm, one call at a time (ms, median of rounds)")
    print(f"{'':14}{'p50':>8}{'p90':>8}{'p99':>8}{'c8 calls/s':>12}")
    for key, v in w.items():
        print(f"{key:14}{v['p50']:8.3f}{v['p90']:8.3f}{v['p99']:8.3f}{v['c8_calls_per_second']:12.0f}")
    print(f"p50 overhead, mTLS: {w['fnrun-mtls']['p50'] - w['direct-mtls']['p50']:.3f} ms; "
          f"h2c: {w['fnrun-h2c']['p50'] - w['direct-h2c']['p50']:.3f} ms (target <= 0.5)")
    print("\ncold start (ms, median)")
    for key, v in c.items():
        print(f"  {key:32}{v:8.1f}")
    cold_all = results["cold"]
    print(f"ratio fnrun first call / (direct start + first call): "
          f"{cold_all['ratio_of_medians']:.2f} of medians, "
          f"{cold_all['paired_ratio_median']:.2f} median of paired runs (target <= 1.1); "
          f"{cold_all['fnrun_from_spare']} of {COLD_RUNS} from a spare")
    print(f"without spares (--sandbox-pool 0): "
          f"{cold_all['no_spare_ratio_of_medians']:.2f} of medians, "
          f"{cold_all['no_spare_paired_ratio_median']:.2f} median of paired runs")
    print(f"\nmemory, {m['functions']} functions (KiB)")
    print(f"  (scaled to zero with {m['spares']} spares; then the spares ended)")
    for key in ("fnrun_before_any_call", "fnrun_all_warm", "fnrun_scaled_to_zero",
                "fnrun_spares_ended", "direct_processes_running"):
        v = m[key]
        print(f"  {key:28}{v['processes']:5} procs  RSS {v['rss_kib']:8}  PSS {v['pss_kib']:8}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The cost of attaching a process to cgroup v1 hierarchies, as fnrun does per run.

Forks a sleeping child, writes its pid to cgroup.procs of a fresh cgroup in each
hierarchy (cpu, cpuacct, memory, freezer, pids), kills and reaps it; N times, with
GAP seconds between attaches. Prints p50/p90/p99 of the attach.

    bench/cgroup_attach.py [--gap 0.02] [-n 100]
    bench/cgroup_attach.py --favordynmods    # also measure with favordynmods

Attaching takes the kernel's cgroup_threadgroup_rwsem for writing, whose writer
waits for an RCU grace period unless another writer ran just before: short gaps
are cheap, long gaps pay a grace period. --favordynmods remounts the cgroup v2
hierarchy (/sys/fs/cgroup/unified on a hybrid host) with that option for the
second measurement and removes it afterwards; the option is global to the kernel
while set. Root only; creates and removes /sys/fs/cgroup/<hierarchy>/fnrun-bench-attach.
"""

import argparse
import ctypes
import os
import statistics
import sys
import time

HIERARCHIES = ["cpu", "cpuacct", "memory", "freezer", "pids"]
NAME = "fnrun-bench-attach"
MS_REMOUNT = 32


def measure(root, gap, n):
    dirs = [os.path.join(root, h, NAME) for h in HIERARCHIES if os.path.isdir(os.path.join(root, h))]
    for d in dirs:
        os.makedirs(d, exist_ok=True)
    times = []
    try:
        for _ in range(n):
            pid = os.fork()
            if pid == 0:
                time.sleep(60)
                os._exit(0)
            time.sleep(gap)
            start = time.perf_counter()
            for d in dirs:
                with open(os.path.join(d, "cgroup.procs"), "w") as f:
                    f.write(str(pid))
            times.append((time.perf_counter() - start) * 1e3)
            os.kill(pid, 9)
            os.waitpid(pid, 0)
    finally:
        for d in dirs:
            for _ in range(100):
                try:
                    os.rmdir(d)
                    break
                except OSError:
                    time.sleep(0.01)
    times.sort()
    pick = lambda q: times[min(len(times) - 1, int(q * len(times)))]
    return len(dirs), statistics.median(times), pick(0.9), pick(0.99)


def super_options(path):
    """The cgroup2 mount's own options at `path` (without rw/ro), from mountinfo."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            if left.split()[4] == path and right.split()[0] == "cgroup2":
                opts = right.split()[2].split(",")
                return [o for o in opts if o not in ("rw", "ro", "favordynmods")]
    raise SystemExit(f"no cgroup2 mount at {path}")


def remount(path, options):
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"none", path.encode(), b"cgroup2", MS_REMOUNT, options.encode()) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"remount {path} with {options!r}: {os.strerror(err)}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default="/sys/fs/cgroup")
    p.add_argument("--gap", type=float, default=0.02, help="seconds between attaches")
    p.add_argument("-n", type=int, default=100)
    p.add_argument("--favordynmods", action="store_true")
    args = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("cgroup_attach.py: run as root")
    k, p50, p90, p99 = measure(args.root, args.gap, args.n)
    print(f"attach to {k} v1 hierarchies, {args.gap * 1e3:.0f} ms apart, n={args.n}: "
          f"p50 {p50:.3f} ms  p90 {p90:.3f} ms  p99 {p99:.3f} ms")
    if args.favordynmods:
        unified = os.path.join(args.root, "unified")
        keep = super_options(unified)
        remount(unified, ",".join(keep + ["favordynmods"]))
        try:
            k, p50, p90, p99 = measure(args.root, args.gap, args.n)
        finally:
            remount(unified, ",".join(keep))
        print(f"  with favordynmods on {unified}:        "
              f"p50 {p50:.3f} ms  p90 {p90:.3f} ms  p99 {p99:.3f} ms")


if __name__ == "__main__":
    main()

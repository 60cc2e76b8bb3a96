#!/usr/bin/env python3
"""The cost of attaching a process to cgroup v1 hierarchies, as fnrun did per run.

Forks a sleeping child, writes its pid to cgroup.procs of a fresh cgroup in each
hierarchy (cpu, cpuacct, memory, freezer, pids), kills and reaps it; N times, with
GAP seconds between attaches. Prints p50/p90/p99 of the attach. Then measures what
fnrun's pooled v1 cgroups do instead: a thread writes "0" to the tasks file of
the same cgroups (moving only itself, without the rwsem) and back to its own.

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
import threading
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
    return (len(dirs),) + quantiles(times)


def quantiles(times):
    times = sorted(times)
    pick = lambda q: times[min(len(times) - 1, int(q * len(times)))]
    return statistics.median(times), pick(0.9), pick(0.99)


def measure_thread(root, gap, n):
    """A thread moves itself into the cgroups and back, n times."""
    hs = [h for h in HIERARCHIES if os.path.isdir(os.path.join(root, h))]
    own = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            for c in ctrls.split(","):
                own[c] = path
    dirs = [os.path.join(root, h, NAME) for h in hs]
    homes = [os.path.join(root, h, own.get(h, "/").lstrip("/")) for h in hs]
    for d in dirs:
        os.makedirs(d, exist_ok=True)
    times = []

    def work():
        for _ in range(n):
            time.sleep(gap)
            start = time.perf_counter()
            # open(2), write(2), close(2) per file, as fnrun does.
            for d in dirs + homes:
                fd = os.open(os.path.join(d, "tasks"), os.O_WRONLY)
                os.write(fd, b"0")
                os.close(fd)
            times.append((time.perf_counter() - start) * 1e3)

    try:
        t = threading.Thread(target=work)
        t.start()
        t.join()
    finally:
        for d in dirs:
            os.rmdir(d)
    return (len(dirs),) + quantiles(times)


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
    k, p50, p90, p99 = measure_thread(args.root, args.gap, args.n)
    print(f"a thread into {k} hierarchies and back (\"0\" to tasks): "
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

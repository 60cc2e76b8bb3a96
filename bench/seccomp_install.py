#!/usr/bin/env python3
"""What installing a seccomp filter costs, linear program against binary search.

Builds two classic BPF programs with the same allow-list of 300 system call
numbers (every number not 2 mod 3 below 450): the linear form seccompiler emits
(compare with each number in turn, 4 instructions per number) and the search form
fnrun's compiler emits (seccomp/src/compact.rs). Installs each 200 times, each in
a fresh forked child (with no_new_privs), and prints the median install time.

    bench/seccomp_install.py [-n 200]
"""

import argparse
import ctypes
import os
import statistics
import struct
import time

LD_W_ABS, JEQ, JGE, JA, RET = 0x20, 0x15, 0x35, 0x05, 0x06
ALLOW, EPERM, KILL = 0x7FFF0000, 0x00050001, 0x80000000
AUDIT_ARCH_X86_64 = 0xC000003E
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
ALLOWED = set([n for n in range(450) if n % 3 != 2][:300])


class SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte),
                ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]


def prologue():
    return [(LD_W_ABS, 0, 0, 4), (JEQ, 1, 0, AUDIT_ARCH_X86_64), (RET, 0, 0, KILL),
            (LD_W_ABS, 0, 0, 0)]


def linear():
    prog = prologue()
    for n in sorted(ALLOWED):
        prog += [(JEQ, 0, 1, n), (JA, 0, 0, 1), (JA, 0, 0, 1), (RET, 0, 0, ALLOW)]
    return prog + [(RET, 0, 0, EPERM)]


def search():
    intervals = []
    for n in range(460):
        action = ALLOW if n in ALLOWED else EPERM
        if not intervals or intervals[-1][1] != action:
            intervals.append((n, action))

    def emit(iv):
        if len(iv) == 1:
            return [(RET, 0, 0, iv[0][1])]
        mid = len(iv) // 2
        left, right = emit(iv[:mid]), emit(iv[mid:])
        if len(left) <= 255:
            return [(JGE, len(left), 0, iv[mid][0])] + left + right
        return [(JGE, 0, 1, iv[mid][0]), (JA, 0, 0, len(left))] + left + right

    return prologue() + emit(intervals)


def install_ms(prog, n):
    libc = ctypes.CDLL(None, use_errno=True)
    arr = (SockFilter * len(prog))(*[SockFilter(*i) for i in prog])
    fprog = SockFprog(len(prog), arr)
    times = []
    for _ in range(n):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
            t = time.perf_counter()
            rc = libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0)
            os.write(w, struct.pack("dd", time.perf_counter() - t, rc))
            os._exit(0)
        os.close(w)
        dt, rc = struct.unpack("dd", os.read(r, 16))
        os.close(r)
        os.waitpid(pid, 0)
        if rc != 0:
            raise SystemExit("the kernel refused the program")
        times.append(dt * 1e3)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", type=int, default=200)
    args = p.parse_args()
    if os.uname().machine != "x86_64":
        raise SystemExit("seccomp_install.py: x86_64 only")
    for name, prog in [("linear (seccompiler's form)", linear()), ("search (fnrun's form)", search())]:
        print(f"{name:30} {len(prog):5} instructions, install p50 {install_ms(prog, args.n):.3f} ms")


if __name__ == "__main__":
    main()

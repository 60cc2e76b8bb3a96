#!/usr/bin/env bash
# Kubernetes mode (`fnrun serve --functions-kubernetes`, issue 22) with the
# real Crossplane core on the tests' Kubernetes control plane (etcd and
# kube-apiserver), fnrun run as deploy/crossplane/deployment.yaml runs it, and
# a registry, all on loopback; every Function a package of the released
# function-patch-and-transform. Measures, in one run:
#   install  kubectl apply of a Function to the Function Healthy, one at a time
#   compose  an XR's creation to Ready, through fnrun, one at a time
#   memory   50 Functions installed, none called, fnrun scaled to zero
#            (--functions-idle-timeout=2s): RSS and PSS of its process tree,
#            against 50 copies of the function binary run directly
# The measurements are the ignored test tests/tests/bench_controller.rs (its
# doc says what each number holds), run with the harness the tests use. Root;
# loopback only; bounded in count and time (about ten minutes).
#
#   bench/controller.sh
#
# fnrun is a release build ($CARGO_TARGET_DIR/release/fnrun, given to the
# harness as FNRUN_BIN), as bench/crossplane.sh measures; the test binary
# itself is a debug build, as cargo test makes it.
#
# Knobs (environment): BENCH_INSTALLS (8), BENCH_XRS (10),
# BENCH_IDLE_FUNCTIONS (50), CARGO_TARGET_DIR (this checkout's target/),
# SKIP_BUILD=1 (use the release fnrun already built), OUT.
# Results: bench/results/controller-<stamp>/controller.json (the test's JSON),
# machine.json, summary.txt (the table and the load average at the end); the
# test's stderr (progress, the daemons' logs) in
# ${TMPDIR:-/tmp}/fnrun-bench-controller-<stamp>.log, not kept with the
# results. docs/benchmarks.md records them.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT=${OUT:-$ROOT/bench/results/controller-$STAMP}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
[ "$(id -u)" = 0 ] || { echo "bench/controller.sh: run as root" >&2; exit 2; }

log() { printf '\n== %s (%s)\n' "$*" "$(date -u +%T)" >&2; }

log "building fnrun (release, $CARGO_TARGET_DIR)"
[ "${SKIP_BUILD:-0}" = 1 ] || cargo build --release -q -p fnrun
export FNRUN_BIN=$CARGO_TARGET_DIR/release/fnrun
[ -x "$FNRUN_BIN" ] || { echo "bench/controller.sh: $FNRUN_BIN is missing" >&2; exit 1; }

mkdir -p "$OUT"
# shellcheck source=bench/common.sh
. "$ROOT/bench/common.sh"
machine_json "$OUT/machine.json" "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
  fnrun_build release

log "building and running the benchmark (cargo test -p fnrun-tests --test bench_controller)"
STDERR=${TMPDIR:-/tmp}/fnrun-bench-controller-$STAMP.log
export BENCH_OUT=$OUT/controller.json
if ! cargo test -q -p fnrun-tests --test bench_controller -- --ignored --nocapture --test-threads=1 \
    2>"$STDERR" | tee "$OUT/summary.txt"; then
  tail -n 100 "$STDERR" >&2
  echo "bench/controller.sh: the benchmark failed; its stderr: $STDERR" >&2
  exit 1
fi
[ -s "$BENCH_OUT" ] || { echo "bench/controller.sh: no $BENCH_OUT (not run as root?)" >&2; exit 1; }
echo "loadavg at the end: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/summary.txt"
echo "results: $OUT" >&2

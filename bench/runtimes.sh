#!/usr/bin/env bash
# fnrun's Kubernetes mode side by side with Crossplane's own Deployment
# runtime (issue 39, item 4), on the tests' real Kubernetes node: the same
# Crossplane (as a pod), the same real Function packages
# (function-patch-and-transform and function-auto-ready, built from their
# releases' modules; more Functions are the same packages under more names),
# the same Composition and XRs; once with --package-runtime=Function=Deployment
# (a Deployment and a pod per Function), once with Function=External and fnrun
# as deploy/crossplane/ has it (its image from scripts/build-image, a release
# build). At 1, 10 and 30 Functions it measures: memory of the runtime's pods
# and their containerd shims (cgroups, RSS/PSS), CPU over idle minutes,
# Function install -> Healthy, a new XR -> composed and Ready, a Function
# upgrade -> the new version serving, and reconcile throughput with 100 XRs.
# The measurements are the ignored test tests/tests/bench_runtimes.rs (its doc
# says what each number holds). Root; one node at a time on the machine (its
# lock: another node test makes this wait); all traffic on the node's bridge.
#
#   bench/runtimes.sh             # the full comparison: 1, 10, 30 Functions,
#                                 # 10 idle minutes per size and runtime
#                                 # (about an hour and a half)
#   QUICK=1 bench/runtimes.sh     # 1 and 10 Functions, 1 idle minute (~20 min),
#                                 # 3 XRs one at a time, 30 at once
#   IDLE_MINUTES=3 BENCH_SIZES=1,10 bench/runtimes.sh
#
# fnrun is the static release build scripts/build-image makes, built here
# first ($CARGO_TARGET_DIR/image/HOST/release/fnrun) and given to it as
# FNRUN_BINARY, outside the node's lock.
#
# Knobs (environment): IDLE_MINUTES (10; fractions allowed), BENCH_SIZES
# (1,10,30; growing), BENCH_RUNTIMES (Deployment,External), BENCH_COMPOSE_XRS
# (5), BENCH_THROUGHPUT_XRS (100), QUICK=1 (the defaults above become 1,10 /
# 1 minute / 3 / 30), CARGO_TARGET_DIR (this checkout's target/), SKIP_BUILD=1
# (use the static fnrun already built), OUT.
# Results: bench/results/runtimes-<stamp>/runtimes.json (the test's JSON),
# table.md (its markdown table), machine.json, summary.txt (the table, the
# load average and the busiest processes at the start and the end); the
# test's stderr (progress, failures' logs) in
# ${TMPDIR:-/tmp}/fnrun-bench-runtimes-<stamp>.log. docs/benchmarks.md records
# them.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT=${OUT:-$ROOT/bench/results/runtimes-$STAMP}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
[ "$(id -u)" = 0 ] || { echo "bench/runtimes.sh: run as root" >&2; exit 2; }

if [ "${QUICK:-0}" = 1 ]; then
  : "${IDLE_MINUTES:=1}" "${BENCH_SIZES:=1,10}" "${BENCH_COMPOSE_XRS:=3}" "${BENCH_THROUGHPUT_XRS:=30}"
fi
IDLE_MINUTES=${IDLE_MINUTES:-10}
case $IDLE_MINUTES in
  ''|*[!0-9.]*|*.*.*) echo "bench/runtimes.sh: IDLE_MINUTES=$IDLE_MINUTES is not a number of minutes" >&2; exit 2 ;;
esac
BENCH_IDLE_SECONDS=$(awk -v m="$IDLE_MINUTES" 'BEGIN { printf "%d", m * 60 + 0.5 }')
[ "$BENCH_IDLE_SECONDS" -ge 1 ] || { echo "bench/runtimes.sh: IDLE_MINUTES must be above 0" >&2; exit 2; }
export BENCH_IDLE_SECONDS
for knob in BENCH_SIZES BENCH_RUNTIMES BENCH_COMPOSE_XRS BENCH_THROUGHPUT_XRS; do
  [ -n "${!knob:-}" ] && export "${knob?}"
done

log() { printf '\n== %s (%s)\n' "$*" "$(date -u +%T)" >&2; }
load() {
  echo "$1: loadavg $(cut -d' ' -f1-3 /proc/loadavg); busiest processes (%CPU since their start):"
  ps -eo pcpu=,comm= --sort=-pcpu | head -n 5 | sed 's/^/    /'
}

HOST=$(rustc -vV | sed -n 's/host: //p')
export FNRUN_BINARY=$CARGO_TARGET_DIR/image/$HOST/release/fnrun
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  log "building fnrun (release, static, as scripts/build-image builds it)"
  RUSTFLAGS="-C target-feature=+crt-static" CARGO_TARGET_DIR=$CARGO_TARGET_DIR/image \
    cargo build -q --profile release -p fnrun --target "$HOST"
fi
[ -x "$FNRUN_BINARY" ] || { echo "bench/runtimes.sh: $FNRUN_BINARY is missing" >&2; exit 1; }

mkdir -p "$OUT"
# shellcheck source=bench/common.sh
. "$ROOT/bench/common.sh"
machine_json "$OUT/machine.json" "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
  fnrun_build "release (scripts/build-image)" idle_seconds "$BENCH_IDLE_SECONDS" \
  sizes "${BENCH_SIZES:-1,10,30}" runtimes "${BENCH_RUNTIMES:-Deployment,External}"
load "start" | tee "$OUT/summary.txt"

log "building and running the benchmark (cargo test -p fnrun-tests --test bench_runtimes)"
STDERR=${TMPDIR:-/tmp}/fnrun-bench-runtimes-$STAMP.log
export BENCH_OUT=$OUT/runtimes.json BENCH_TABLE=$OUT/table.md
if ! cargo test -q -p fnrun-tests --test bench_runtimes -- --ignored --nocapture --test-threads=1 \
    deployment_runtime_against_fnrun_on_a_node 2>"$STDERR" | tee -a "$OUT/summary.txt"; then
  tail -n 100 "$STDERR" >&2
  echo "bench/runtimes.sh: the benchmark failed; its stderr: $STDERR" >&2
  exit 1
fi
[ -s "$BENCH_OUT" ] || { echo "bench/runtimes.sh: no $BENCH_OUT (not run as root?)" >&2; exit 1; }
load "end" | tee -a "$OUT/summary.txt"
echo "results: $OUT" >&2

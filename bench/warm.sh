# Sourced by bench/ab.sh, bench/builds.sh and bench/listeners.sh: what a warm-path comparison of
# fnrun builds needs. Builds the load client, makes $WORK with the `cat`
# image (bench/cat_image.sh), removes it on exit, and defines
#   start_daemon FNRUN            a fresh daemon of that build ($DAEMON_PID)
#   stop_daemon
#   load LABEL CONC N WARMUP      the load client's summary line
#   cpu_ticks PID                 a process's user and system time so far,
#                                 its threads' included (clock ticks)
# LOAD_ARGS adds options of the load client to every load (e.g.
# LOAD_ARGS="--deadline 30": each call carries a grpc-timeout), and
# DAEMON_ARGS options of `fnrun serve` (e.g. DAEMON_ARGS="--sandbox-pool 0").
# $ROOT must be the checkout.
# LOADGEN, if set, is the load client to use instead of building one.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/work/target-bench}
if [ -z "${LOADGEN:-}" ]; then
  cargo build --release -q --manifest-path "$ROOT/Cargo.toml" -p fnrun-bench
  LOADGEN=$CARGO_TARGET_DIR/release/fnrun-loadgen
fi
command -v umoci >/dev/null || { echo "$0: needs umoci (bench/run.sh installs it)" >&2; exit 1; }

# shellcheck source=bench/common.sh
. "$ROOT/bench/common.sh"
work_dir fnrun-warm

# shellcheck source=bench/cat_image.sh
. "$ROOT/bench/cat_image.sh"
cat_image "$WORK"
LAYOUT=$WORK/cat-layout

start_daemon() {
  rm -rf "$WORK/cache" "$WORK/sock"
  # shellcheck disable=SC2086 # DAEMON_ARGS is split into options
  "$1" serve --listen "unix:$WORK/sock" --cache-dir "$WORK/cache" ${DAEMON_ARGS:-} > "$WORK/daemon.log" 2>&1 &
  DAEMON_PID=$!
  for _ in $(seq 100); do [ -S "$WORK/sock" ] && break; sleep 0.1; done
}

stop_daemon() {
  kill "$DAEMON_PID"; wait "$DAEMON_PID" 2>/dev/null || true; DAEMON_PID=""
}

read -ra LOAD_EXTRA <<< "${LOAD_ARGS:-}"
load() {
  "$LOADGEN" --socket "$WORK/sock" --image "oci:$LAYOUT:latest" --input "$WORK/input.yaml" \
    -c "$2" -n "$3" --warmup "$4" --label "$1" "${LOAD_EXTRA[@]}" --json /dev/null 2>&1 | awk -v l="$1" '$1 == l'
}

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

#!/usr/bin/env bash
# fnrun benchmarks: the kernel floor (unshare), runc, skopeo+umoci and fnrun,
# measured side by side in one run. Bounded in count and time; loopback only.
#
#   bench/run.sh                 # everything (about 10-15 minutes on 2 cores)
#   QUICK=1 bench/run.sh         # skip cold start and the 10,000-run soak
#
# Knobs (environment): N_WARM (500) sequential warm calls, N_LISTENER (300)
# warm calls on each kind of listener (unix, abstract, TCP, TLS), N_TPUT (400) calls
# per concurrency level, N_SOAK (10000) runs for the memory check, FLOOR_RUNS
# (300), RUNC_RUNS (60), COLD_MIB (200), COLD_LAYERS (4), COLD_RUNS (3),
# PROFILE (1), GRPC_GO (1: the grpc-go client's step, built by the tests'
# toolchain), CARGO_TARGET_DIR (/work/target-bench), OUT (results dir),
# SRC (the fnrun source tree to build; default: this checkout), PNG (chart),
# SKIP_BUILD=1 (use the binaries already in CARGO_TARGET_DIR).
# Results: bench/results/<stamp>/ (raw) and bench/results/latest.json.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT=${OUT:-$ROOT/bench/results/$STAMP}
N_WARM=${N_WARM:-500}
N_LISTENER=${N_LISTENER:-300}
N_TPUT=${N_TPUT:-400}
N_SOAK=${N_SOAK:-10000}
FLOOR_RUNS=${FLOOR_RUNS:-300}
RUNC_RUNS=${RUNC_RUNS:-60}
COLD_MIB=${COLD_MIB:-200}
COLD_LAYERS=${COLD_LAYERS:-4}
COLD_RUNS=${COLD_RUNS:-3}
QUICK=${QUICK:-0}
PROFILE=${PROFILE:-1}
CONCURRENCY=${CONCURRENCY:-1,2,4,8}
SRC=${SRC:-$ROOT}
PNG=${PNG:-$ROOT/docs/benchmarks.png}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/work/target-bench}

log() { printf '\n== %s (%s)\n' "$*" "$(date -u +%T)" >&2; }

# ---------------------------------------------------------------- tools
need_pkgs=()
for pair in hyperfine:hyperfine runc:runc umoci:umoci skopeo:skopeo \
            docker-registry:docker-registry jq:jq strace:strace unshare:util-linux \
            protoc:protobuf-compiler; do  # protoc: the grpc-go client of step (d2)
  command -v "${pair%%:*}" >/dev/null || need_pkgs+=("${pair#*:}")
done
# protoc's well-known types (google/protobuf/duration.proto), which fnrun's
# protos import; Debian's protobuf-compiler ships protoc without them.
[ -f /usr/include/google/protobuf/duration.proto ] || need_pkgs+=(libprotobuf-dev)
[ -x /bin/busybox ] && file -L /bin/busybox 2>/dev/null | grep -q 'statically linked' \
  || need_pkgs+=(busybox-static)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  log "installing ${need_pkgs[*]}"
  sudo_=""; [ "$(id -u)" = 0 ] || sudo_=sudo
  $sudo_ apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -q "${need_pkgs[@]}"
fi
PY=""
for p in python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null && "$p" -c 'import matplotlib' 2>/dev/null; then PY=$p; break; fi
done
if [ -z "$PY" ]; then
  log "installing matplotlib"
  sudo_=""; [ "$(id -u)" = 0 ] || sudo_=sudo
  if DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -q python3-matplotlib \
       && /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
    PY=/usr/bin/python3
  else
    python3 -m pip install --user -q matplotlib && PY=python3
  fi
fi

# ---------------------------------------------------------------- build
log "building fnrun and the load client (release, $CARGO_TARGET_DIR)"
[ "${SKIP_BUILD:-0}" = 1 ] || cargo build --release -q --manifest-path "$SRC/Cargo.toml" -p fnrun -p fnrun-bench
FNRUN=$CARGO_TARGET_DIR/release/fnrun
LOADGEN=$CARGO_TARGET_DIR/release/fnrun-loadgen

mkdir -p "$OUT"
# shellcheck source=bench/common.sh
. "$ROOT/bench/common.sh"
work_dir fnrun-bench

# ---------------------------------------------------------------- machine
machine_json "$OUT/machine.json" \
  "${FNRUN_COMMIT:-$(git -C "$SRC" rev-parse --short HEAD 2>/dev/null || echo unknown)}" \
  runc "$(runc --version | head -1)" hyperfine "$(hyperfine --version)"

# ---------------------------------------------------------------- image
log "building the cat function image (busybox-static, umoci)"
# shellcheck source=bench/cat_image.sh
. "$ROOT/bench/cat_image.sh"
cat_image "$WORK"
INPUT=$WORK/input.yaml
LAYOUT=$WORK/cat-layout
IMAGE="oci:$LAYOUT:latest"

log "making the runc bundle of the same image (runc spec --rootless)"
BUNDLE=$WORK/runc-bundle
umoci unpack --image "$LAYOUT:latest" "$BUNDLE" >/dev/null
( cd "$BUNDLE" && rm -f config.json && runc spec --rootless )
# The same namespaces as the floor: user, mount, pid, ipc, uts and network.
jq '.process.terminal = false | .process.args = ["/bin/cat"] | .process.env = ["PATH=/bin"]
    | .linux.namespaces = ([.linux.namespaces[] | select(.type != "network")] + [{"type":"network"}])' \
  "$BUNDLE/config.json" > "$BUNDLE/config.json.new"
mv "$BUNDLE/config.json.new" "$BUNDLE/config.json"
RUNC_ROOT=$WORK/runc-state
mkdir -p "$RUNC_ROOT"
runc --root "$RUNC_ROOT" run --bundle "$BUNDLE" fnb-check < "$INPUT" | cmp - "$INPUT"
unshare -Urmnpfiu --mount-proc cat < "$INPUT" | cmp - "$INPUT"

# ---------------------------------------------------------------- daemon
log "starting fnrun serve"
CACHE=$WORK/cache
SOCK=$WORK/fnrun.sock
"$FNRUN" serve --listen "unix:$SOCK" --cache-dir "$CACHE" >"$OUT/daemon.log" 2>&1 &
DAEMON_PID=$!
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done
[ -S "$SOCK" ] || { cat "$OUT/daemon.log" >&2; exit 1; }
sleep 1
snapshot() { # label -> one JSON object about the daemon
  local pid=$DAEMON_PID
  local rss hwm thr fds cg busy runs d
  rss=$(awk '/^VmRSS/{print $2}' /proc/$pid/status)
  hwm=$(awk '/^VmHWM/{print $2}' /proc/$pid/status)
  thr=$(awk '/^Threads/{print $2}' /proc/$pid/status)
  fds=$(ls /proc/$pid/fd | wc -l)
  # Run cgroups: all of them (on v1 the daemon keeps idle ones for reuse),
  # and those that hold a process (none once the runs are over).
  cg=0; busy=0
  while read -r d; do
    cg=$((cg + 1))
    [ -n "$(head -c1 "$d/cgroup.procs" 2>/dev/null)" ] && busy=$((busy + 1))
  done < <(find /sys/fs/cgroup -mindepth 2 -path '*/fnrun/*' -type d 2>/dev/null)
  runs=$(find "$CACHE" -mindepth 2 -maxdepth 2 -path '*/runs/*' 2>/dev/null | wc -l)
  # The spawner (the daemon's child that clones each init) shares most of its
  # pages with the daemon: what it adds is its own (private) memory.
  local sp spawner=0
  for sp in $(pgrep -P "$pid" 2>/dev/null); do
    [ "$(cat /proc/$sp/comm 2>/dev/null)" = fnrun-spawner ] || continue
    spawner=$(awk '/^Private_(Clean|Dirty)/{s+=$2} END{print s+0}' /proc/$sp/smaps_rollup 2>/dev/null || echo 0)
  done
  printf '{"at":"%s","vmrss_kib":%s,"vmhwm_kib":%s,"spawner_private_kib":%s,"threads":%s,"fds":%s,"run_cgroups":%s,"busy_cgroups":%s,"run_scratch_dirs":%s}\n' \
    "$1" "$rss" "$hwm" "$spawner" "$thr" "$fds" "$cg" "$busy" "$runs"
}
snapshot idle-start > "$OUT/daemon-snapshots.jsonl"
# First call: pulls (copies) and unpacks the image into the cache.
"$LOADGEN" --socket "$SOCK" --image "$IMAGE" --input "$INPUT" -n 1 -c 1 --warmup 0 \
  --require-zero-errors --label first --json "$OUT/fnrun-first.json"
sleep 1
snapshot idle-cached >> "$OUT/daemon-snapshots.jsonl"

# ---------------------------------------------------------------- latency
log "(a) floor: unshare -Urmnpfiu --mount-proc (hyperfine, $FLOOR_RUNS runs)"
hyperfine -N --warmup 20 --runs "$FLOOR_RUNS" --style basic \
  --export-json "$OUT/floor.json" \
  -n floor-true 'unshare -Urmnpfiu --mount-proc true' >&2
hyperfine --warmup 20 --runs "$FLOOR_RUNS" --style basic \
  --export-json "$OUT/floor-cat.json" \
  -n floor-cat "unshare -Urmnpfiu --mount-proc cat < $INPUT > /dev/null" >&2

log "(b) runc run, rootless spec (hyperfine, $RUNC_RUNS runs)"
hyperfine --warmup 3 --runs "$RUNC_RUNS" --style basic \
  --export-json "$OUT/runc.json" \
  -n runc "runc --root $RUNC_ROOT run --bundle $BUNDLE fnb-\$\$ < $INPUT > /dev/null" >&2

log "(c) fnrun warm RunFunction, one at a time ($N_WARM calls)"
"$LOADGEN" --socket "$SOCK" --image "$IMAGE" --input "$INPUT" -n "$N_WARM" -c 1 \
  --warmup 20 --raw --require-zero-errors --label fnrun --json "$OUT/fnrun-warm.json"

log "(c2) fnrun warm RunFunction on each kind of listener ($N_LISTENER calls each)"
# shellcheck source=bench/listeners.sh
. "$ROOT/bench/listeners.sh"
listeners_start "$FNRUN" "$WORK/listeners"
listeners_measure "$OUT" listener "$N_LISTENER" --image "$IMAGE" --input "$INPUT"
listeners_stop

# ---------------------------------------------------------------- throughput
log "(d) throughput at concurrency $CONCURRENCY ($N_TPUT calls each)"
"$LOADGEN" --socket "$SOCK" --image "$IMAGE" --input "$INPUT" -n "$N_TPUT" -c "$CONCURRENCY" \
  --warmup 5 --label fnrun --json "$OUT/fnrun-throughput.json"
echo '{"levels":[' > "$OUT/floor-throughput.json"
first=1
for c in ${CONCURRENCY//,/ }; do
  t0=$(date +%s.%N)
  errs=0
  seq "$N_TPUT" | xargs -P "$c" -I{} unshare -Urmnpfiu --mount-proc true || errs=$?
  t1=$(date +%s.%N)
  wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.6f", b - a}')
  rps=$(awk -v n="$N_TPUT" -v w="$wall" 'BEGIN{printf "%.3f", n / w}')
  printf 'floor      %4s %6s calls  %9.1f runs/s  (xargs status %s)\n' "$c" "$N_TPUT" "$rps" "$errs" >&2
  [ $first = 1 ] || echo ',' >> "$OUT/floor-throughput.json"
  first=0
  printf '{"label":"floor","concurrency":%s,"calls":%s,"xargs_status":%s,"wall_s":%s,"throughput_per_s":%s}\n' \
    "$c" "$N_TPUT" "$errs" "$wall" "$rps" >> "$OUT/floor-throughput.json"
done
echo ']}' >> "$OUT/floor-throughput.json"
snapshot after-throughput >> "$OUT/daemon-snapshots.jsonl"

# ---------------------------------------------------------------- grpc-go
# The same calls from an independent client: grpc-go, Crossplane's library
# (the tests' runfunction client in its load mode, one connection as
# Crossplane shares its ClientConn). Built by the tests' toolchain, cached.
if [ "${GRPC_GO:-1}" = 1 ]; then
  log "(d2) grpc-go client: $N_WARM calls one at a time, $N_TPUT at concurrency 8"
  # The harness test that builds it needs no fnrun binary; it builds in the
  # checkout's own (debug) target, not the bench's release one.
  if env -u CARGO_TARGET_DIR cargo test -q --manifest-path "$ROOT/Cargo.toml" -p fnrun-tests \
       --test harness grpc_go_client_is_built_once_and_calls_a_tonic_server \
       >"$WORK/grpcgo-build.log" 2>&1; then
    GO_TOOLS=${FNRUN_TEST_CACHE:-/var/cache/fnrun-tests}/go
    GO_CLIENT=$(find "$GO_TOOLS" -maxdepth 2 -type f -path '*/runfunction-*/runfunction' -printf '%T@ %p\n' \
      | sort -n | tail -1 | cut -d' ' -f2)
    "$GO_CLIENT" -target "unix:$SOCK" -image "$IMAGE" -input "$INPUT" \
      -calls "$N_WARM" -concurrency 1 -warmup 20 > "$OUT/grpcgo-seq.json"
    "$GO_CLIENT" -target "unix:$SOCK" -image "$IMAGE" -input "$INPUT" \
      -calls "$N_TPUT" -concurrency 8 -warmup 5 > "$OUT/grpcgo-c8.json"
    cat "$OUT/grpcgo-seq.json" "$OUT/grpcgo-c8.json" >&2
  else
    echo "cannot build the grpc-go client (GRPC_GO=0 skips it): $WORK/grpcgo-build.log" >&2
    tail -20 "$WORK/grpcgo-build.log" >&2
  fi
fi

# ---------------------------------------------------------------- profile
if [ "$PROFILE" = 1 ]; then
  log "profile: strace of the daemon over warm runs"
  # Syscall counts and time over 200 runs (strace slows every syscall: the
  # shares matter, not the absolute numbers).
  timeout 300 strace -f -c -o "$OUT/strace-c.txt" -p "$DAEMON_PID" &
  ST=$!; sleep 1
  "$LOADGEN" --socket "$SOCK" --image "$IMAGE" --input "$INPUT" -n 200 -c 1 --warmup 0 \
    --label strace-c --json "$OUT/fnrun-strace-c.json" 2>/dev/null || true
  kill -INT "$ST"; wait "$ST" || true
  # One run with timestamps: the clone -> exec -> exit timeline.
  timeout 120 strace -f -tt -T -o "$OUT/strace-one.txt" -p "$DAEMON_PID" &
  ST=$!; sleep 1
  "$LOADGEN" --socket "$SOCK" --image "$IMAGE" --input "$INPUT" -n 3 -c 1 --warmup 0 \
    --label strace-one --json "$OUT/fnrun-strace-one.json" 2>/dev/null || true
  kill -INT "$ST"; wait "$ST" || true
  if perf stat -e cpu-clock true >/dev/null 2>&1; then
    log "profile: perf record (cpu-clock, system-wide) over $N_TPUT warm runs"
    timeout 300 perf record -q -F 2000 -e cpu-clock -a -g -o "$WORK/perf.data" -- \
      "$LOADGEN" --socket "$SOCK" --image "$IMAGE" --input "$INPUT" -n "$N_TPUT" -c 1 --warmup 0 \
      --label perf --json "$OUT/fnrun-perf.json" 2>/dev/null || true
    perf report -i "$WORK/perf.data" --no-children --sort comm,dso --stdio 2>/dev/null \
      | grep -v '^#' | grep -v '^$' | head -40 > "$OUT/perf-comm-dso.txt" || true
    perf report -i "$WORK/perf.data" --no-children --sort sym --stdio -g none 2>/dev/null \
      | grep -v '^#' | grep -v '^$' | head -60 > "$OUT/perf-sym.txt" || true
  fi
  sleep 1
  snapshot after-profile >> "$OUT/daemon-snapshots.jsonl"
fi

# ---------------------------------------------------------------- soak
if [ "$QUICK" != 1 ]; then
  log "(f) $N_SOAK warm runs at concurrency 8, then daemon RSS/fds/threads/cgroups"
  "$LOADGEN" --socket "$SOCK" --image "$IMAGE" --input "$INPUT" -n "$N_SOAK" -c 8 \
    --warmup 0 --max-seconds 900 --label soak --json "$OUT/fnrun-soak.json"
  sleep 2
  snapshot after-soak >> "$OUT/daemon-snapshots.jsonl"
  # tokio's blocking-pool threads exit after 10 s idle: idle again, then count.
  sleep 12
  snapshot idle-after-soak >> "$OUT/daemon-snapshots.jsonl"
fi
kill "$DAEMON_PID"; wait "$DAEMON_PID" 2>/dev/null || true; DAEMON_PID=""
find /sys/fs/cgroup -mindepth 2 -path '*/fnrun/*' -type d 2>/dev/null | wc -l > "$OUT/run-cgroups-after-exit.txt"

# ---------------------------------------------------------------- cold start
if [ "$QUICK" != 1 ]; then
  log "(e) cold start: ${COLD_MIB} MiB image in $COLD_LAYERS random layers"
  PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  REG=127.0.0.1:$PORT
  mkdir -p "$WORK/registry"
  cat > "$WORK/registry/config.yml" <<YAML
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $WORK/registry/storage
http:
  addr: $REG
YAML
  docker-registry serve "$WORK/registry/config.yml" >"$WORK/registry/log" 2>&1 &
  REGISTRY_PID=$!
  for _ in $(seq 100); do curl -sf "http://$REG/v2/" >/dev/null && break; sleep 0.1; done
  BIG=$WORK/big-layout
  umoci init --layout "$BIG"
  umoci new --image "$BIG:latest"
  umoci unpack --image "$BIG:latest" "$WORK/big-stage" >/dev/null
  per=$((COLD_MIB / COLD_LAYERS))
  for i in $(seq "$COLD_LAYERS"); do
    mkdir -p "$WORK/big-stage/rootfs/data$i"
    for j in 1 2 3 4; do   # four files per layer
      head -c $((per * 1024 * 256)) /dev/urandom > "$WORK/big-stage/rootfs/data$i/blob$j"
    done
    umoci repack --refresh-bundle --image "$BIG:latest" "$WORK/big-stage"
  done
  umoci config --image "$BIG:latest" --config.entrypoint=/bin/true
  umoci gc --layout "$BIG"
  rm -rf "$WORK/big-stage"
  skopeo --insecure-policy copy --quiet --dest-tls-verify=false "oci:$BIG:latest" "docker://$REG/big:latest"
  du -sb "$WORK/registry/storage" | awk '{printf "{\"registry_bytes\":%s}\n",$1}' > "$OUT/cold-image.json"
  rm -rf "$BIG"
  hyperfine --runs "$COLD_RUNS" --style basic --export-json "$OUT/cold.json" \
    --prepare "rm -rf $WORK/cold-fnrun $WORK/cold-sk $WORK/cold-sk-rootfs; sync" \
    -n fnrun-pull "$FNRUN pull --cache-dir $WORK/cold-fnrun --insecure-registry $REG $REG/big:latest" \
    -n skopeo+umoci "skopeo --insecure-policy copy --quiet --src-tls-verify=false docker://$REG/big:latest oci:$WORK/cold-sk:latest && umoci raw unpack --image $WORK/cold-sk:latest $WORK/cold-sk-rootfs" >&2
  rm -rf "$WORK/cold-fnrun" "$WORK/cold-sk" "$WORK/cold-sk-rootfs"
fi

echo "\"$(cut -d' ' -f1-3 /proc/loadavg)\"" > "$OUT/loadavg-end.json"
# ---------------------------------------------------------------- report
log "summary"
"${PY:-python3}" "$ROOT/bench/summarize.py" "$OUT" | tee "$OUT/summary.txt"
cp "$OUT/summary.json" "$ROOT/bench/results/latest.json"
if [ -n "$PY" ]; then
  "$PY" "$ROOT/bench/chart.py" "$OUT" "$PNG"
fi
echo "results: $OUT" >&2

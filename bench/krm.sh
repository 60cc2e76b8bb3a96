#!/usr/bin/env bash
# KRM functions: fnrun against the container path kpt would take on this
# machine, one warm call at a time, on the same image and ResourceList.
#
#   (a) runc run of the image with kpt's `docker run` settings: --network none
#       (a new network namespace with only lo), --user nobody,
#       --security-opt=no-new-privileges, a read-only bind mount (kpt's
#       `--mount type=bind,src=...,dst=/source`), a writable root as docker
#       gives. runc alone is the floor of that path: docker adds its CLI,
#       dockerd and containerd-shim on top.
#   (b) fnrun run --krm, the CLI, warm cache, with the same read-only mount
#       (kpt's exec runtime runs it so: one process per function call);
#   (c) fnrun run --krm without the mount;
#   (d) Porch's EvaluateFunction on `fnrun serve`, warm, sequential; and
#       (d2) the same on each kind of listener: unix, abstract, TCP, TLS
#       (bench/listeners.sh).
#
#   bench/krm.sh                       # about two minutes on 2 cores
#
# Knobs (environment): RUNS (60) hyperfine runs of (a)-(c), N_EVAL (300)
# calls of (d) and of (d2) on each listener, CARGO_TARGET_DIR (this checkout's target/), OUT (results
# dir), SKIP_BUILD=1 (use the release binaries already built).
# Results: bench/results/krm-<stamp>/ (raw) and bench/results/krm-latest.json.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT=${OUT:-$ROOT/bench/results/krm-$STAMP}
RUNS=${RUNS:-60}
N_EVAL=${N_EVAL:-300}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}

log() { printf '\n== %s (%s)\n' "$*" "$(date -u +%T)" >&2; }

[ "$(id -u)" = 0 ] || { echo "bench/krm.sh runs runc as root, as docker does: run it as root" >&2; exit 1; }
need_pkgs=()
for pair in hyperfine:hyperfine runc:runc umoci:umoci jq:jq; do
  command -v "${pair%%:*}" >/dev/null || need_pkgs+=("${pair#*:}")
done
[ -x /bin/busybox ] && file -L /bin/busybox 2>/dev/null | grep -q 'statically linked' \
  || need_pkgs+=(busybox-static)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  log "installing ${need_pkgs[*]}"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need_pkgs[@]}"
fi

log "building fnrun and the load client (release, $CARGO_TARGET_DIR)"
[ "${SKIP_BUILD:-0}" = 1 ] || cargo build --release -q -p fnrun -p fnrun-bench
FNRUN=$CARGO_TARGET_DIR/release/fnrun
LOADGEN=$CARGO_TARGET_DIR/release/fnrun-loadgen

mkdir -p "$OUT"
# shellcheck source=bench/common.sh
. "$ROOT/bench/common.sh"
work_dir fnrun-krm-bench

machine_json "$OUT/machine.json" "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
  runc "$(runc --version | head -1)" hyperfine "$(hyperfine --version)"

log "the function: busybox cat (umoci), a ResourceList, a source directory"
# shellcheck source=bench/cat_image.sh
. "$ROOT/bench/cat_image.sh"
cat_image "$WORK"
LAYOUT=$WORK/cat-layout
IMAGE="oci:$LAYOUT:latest"
RL=$WORK/resources.yaml
cat > "$RL" <<'YAML'
apiVersion: config.kubernetes.io/v1
kind: ResourceList
items:
- apiVersion: apps/v1
  kind: Deployment
  metadata:
    name: web
    annotations:
      config.kubernetes.io/index: '0'
      internal.config.kubernetes.io/path: deployment.yaml
  spec:
    replicas: 3
- apiVersion: v1
  kind: ConfigMap
  metadata:
    name: settings
  data:
    color: blue
functionConfig:
  apiVersion: v1
  kind: ConfigMap
  metadata:
    name: function-input
  data:
    key: app
YAML
SOURCE=$WORK/source
mkdir -p "$SOURCE"
cp "$RL" "$SOURCE/"
chmod -R a+rX "$SOURCE"

log "(a) the runc bundle: kpt's docker run settings"
BUNDLE=$WORK/runc-bundle
umoci unpack --image "$LAYOUT:latest" "$BUNDLE" >/dev/null
( cd "$BUNDLE" && rm -f config.json && runc spec )
jq --arg src "$SOURCE" '
    .process.terminal = false
  | .process.args = ["/bin/cat"]
  | .process.env = ["PATH=/bin", "HOME=/"]
  | .process.user = {"uid": 65534, "gid": 65534}
  | .process.noNewPrivileges = true
  | .root.readonly = false
  | .mounts += [{"destination": "/source", "type": "bind", "source": $src,
                 "options": ["rbind", "ro", "nosuid", "nodev"]}]
  | .linux.namespaces = ([.linux.namespaces[] | select(.type != "network")] + [{"type": "network"}])' \
  "$BUNDLE/config.json" > "$BUNDLE/config.json.new"
mv "$BUNDLE/config.json.new" "$BUNDLE/config.json"
RUNC_ROOT=$WORK/runc-state
mkdir -p "$RUNC_ROOT"
runc --root "$RUNC_ROOT" run --bundle "$BUNDLE" kpt-check < "$RL" | cmp - "$RL"

log "(b, c) fnrun run --krm: the first run fills the cache"
CACHE=$WORK/cache
MOUNT="type=bind,src=$SOURCE,dst=/source"
"$FNRUN" run --krm -q --cache-dir "$CACHE" --mount "$MOUNT" "$IMAGE" "$RL" | cmp - "$RL"
"$FNRUN" run --krm -q --cache-dir "$CACHE" "$IMAGE" "$RL" | cmp - "$RL"

log "(a-c) hyperfine, $RUNS runs each"
hyperfine --warmup 5 --runs "$RUNS" --style basic --export-json "$OUT/cli.json" \
  -n runc-kpt "runc --root $RUNC_ROOT run --bundle $BUNDLE kpt-\$\$ < $RL > /dev/null" \
  -n fnrun-run-krm-mount "$FNRUN run --krm -q --cache-dir $CACHE --mount $MOUNT $IMAGE $RL > /dev/null" \
  -n fnrun-run-krm "$FNRUN run --krm -q --cache-dir $CACHE $IMAGE $RL > /dev/null" >&2

log "(d) EvaluateFunction on fnrun serve, warm, sequential ($N_EVAL calls)"
SOCK=$WORK/fnrun.sock
"$FNRUN" serve --listen "unix:$SOCK" --cache-dir "$CACHE" >"$OUT/daemon.log" 2>&1 &
DAEMON_PID=$!
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done
[ -S "$SOCK" ] || { cat "$OUT/daemon.log" >&2; exit 1; }
"$LOADGEN" --api evaluate --socket "$SOCK" --image "$IMAGE" --input "$RL" -n "$N_EVAL" -c 1 \
  --warmup 20 --raw --require-zero-errors --label evaluate --json "$OUT/evaluate.json"
kill "$DAEMON_PID"; wait "$DAEMON_PID" 2>/dev/null || true; DAEMON_PID=""

log "(d2) EvaluateFunction on each kind of listener ($N_EVAL calls each)"
# shellcheck source=bench/listeners.sh
. "$ROOT/bench/listeners.sh"
listeners_start "$FNRUN" "$WORK/listeners"
listeners_measure "$OUT" evaluate "$N_EVAL" --api evaluate --image "$IMAGE" --input "$RL"
listeners_stop

log "summary"
jq -n --slurpfile cli "$OUT/cli.json" --slurpfile ev "$OUT/evaluate.json" \
   --slurpfile machine "$OUT/machine.json" '
  def ms: . * 1000 | . * 100 | round / 100;
  ($cli[0].results | map({(.command): {mean_ms: (.mean | ms), median_ms: (.median | ms),
                                       stddev_ms: (.stddev | ms), runs: (.times | length)}}) | add) as $c
  | ($ev[0].levels[0]) as $e
  | {
      machine: $machine[0],
      runc_kpt: $c["runc-kpt"],
      fnrun_run_krm_mount: $c["fnrun-run-krm-mount"],
      fnrun_run_krm: $c["fnrun-run-krm"],
      evaluate: {mean_ms: ($e.mean_ms * 100 | round / 100), p50_ms: ($e.p50_ms * 100 | round / 100),
                 p99_ms: ($e.p99_ms * 100 | round / 100), calls: $e.calls, errors: $e.errors},
      ratio_runc_over_evaluate: ($c["runc-kpt"].mean_ms / $e.mean_ms * 10 | round / 10),
      ratio_runc_over_run_krm_mount: ($c["runc-kpt"].mean_ms / $c["fnrun-run-krm-mount"].mean_ms * 10 | round / 10),
      ratio_runc_over_run_krm: ($c["runc-kpt"].mean_ms / $c["fnrun-run-krm"].mean_ms * 10 | round / 10)
    }' | tee "$OUT/summary.json"
cp "$OUT/summary.json" "$ROOT/bench/results/krm-latest.json"
echo "results: $OUT" >&2

#!/usr/bin/env bash
# Warm calls on each kind of listener of `fnrun serve`: a unix socket path, an
# abstract socket, TCP (h2c) and TCP with TLS, so that no transport is a blind
# spot (a TCP listener without TCP_NODELAY once added ~40 ms to every call).
#
# Sourced by bench/run.sh (RunFunction) and bench/krm.sh (EvaluateFunction),
# which define
#   listeners_start FNRUN DIR   two daemons of that build, caches in DIR: one on
#                               unix:DIR/fnrun.sock, unix-abstract:fnrun-bench-PID
#                               and 127.0.0.1:PORT, one on 127.0.0.1:PORT with TLS
#                               (a CA and a server certificate made with openssl)
#   listeners_measure OUT LABEL N LOADGEN-ARGS...
#                               N sequential warm calls on each listener:
#                               OUT/LABEL-{unix,abstract,tcp,tls}.json, a line each
#   listeners_stop
# (LOADGEN must be set). Run on its own, it compares builds:
#
#   bench/listeners.sh FNRUN...      # N_LISTENER (300) RunFunction calls each
set -euo pipefail

listeners_start() {
  local fnrun=$1 dir=$2
  mkdir -p "$dir"
  LISTENERS_DIR=$dir
  LISTENERS_ABSTRACT=fnrun-bench-$$-$RANDOM
  LISTENERS_TCP=127.0.0.1:$(free_port)
  LISTENERS_TLS=127.0.0.1:$(free_port)
  # A CA and a server certificate for localhost it signs.
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
    -subj /CN=fnrun-bench-ca -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=localhost \
    -keyout "$dir/server.key" -out "$dir/server.csr" 2>/dev/null
  openssl x509 -req -in "$dir/server.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
    -CAcreateserial -days 1 -extfile <(printf 'subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\n') \
    -out "$dir/server.crt" 2>/dev/null
  "$fnrun" serve --shutdown-delay=0s --cache-dir "$dir/cache" --listen "unix:$dir/fnrun.sock" \
    --listen "unix-abstract:$LISTENERS_ABSTRACT" --listen "$LISTENERS_TCP" \
    > "$dir/daemon.log" 2>&1 &
  LISTENERS_PIDS=($!)
  "$fnrun" serve --shutdown-delay=0s --cache-dir "$dir/cache-tls" --listen "$LISTENERS_TLS" \
    --tls-cert "$dir/server.crt" --tls-key "$dir/server.key" > "$dir/daemon-tls.log" 2>&1 &
  LISTENERS_PIDS+=($!)
  wait_tcp "$LISTENERS_TCP" "$dir/daemon.log"
  wait_tcp "$LISTENERS_TLS" "$dir/daemon-tls.log"
}

listeners_measure() {
  local out=$1 label=$2 n=$3 kind
  shift 3
  for kind in unix abstract tcp tls; do
    local target=()
    case $kind in
      unix) target=(--target "unix:$LISTENERS_DIR/fnrun.sock") ;;
      abstract) target=(--target "unix-abstract:$LISTENERS_ABSTRACT") ;;
      tcp) target=(--target "$LISTENERS_TCP") ;;
      tls) target=(--target "$LISTENERS_TLS" --ca "$LISTENERS_DIR/ca.crt") ;;
    esac
    "$LOADGEN" "${target[@]}" "$@" -n "$n" -c 1 --warmup 20 --raw --require-zero-errors \
      --label "$label-$kind" --json "$out/$label-$kind.json" 2>&1 | awk -v l="$label-$kind" '$1 == l' >&2
  done
}

listeners_stop() {
  local pid
  for pid in "${LISTENERS_PIDS[@]}"; do
    kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  done
  LISTENERS_PIDS=()
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

wait_tcp() { # HOST:PORT LOG
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/${1%:*}/${1##*:}") 2>/dev/null && return 0
    sleep 0.1
  done
  cat "$2" >&2
  return 1
}

# On its own: RunFunction on each listener of each build given.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  ROOT=$(cd "$(dirname "$0")/.." && pwd)
  [ $# -ge 1 ] || { echo "usage: $0 FNRUN..." >&2; exit 2; }
  N_LISTENER=${N_LISTENER:-300}
  # shellcheck source=bench/warm.sh
  . "$ROOT/bench/warm.sh"
  OUT=${OUT:-$WORK/out}
  mkdir -p "$OUT"
  i=0
  for fnrun in "$@"; do
    i=$((i + 1))
    echo "== build $i: $fnrun" >&2
    listeners_start "$fnrun" "$WORK/listeners-$i"
    listeners_measure "$OUT" "build$i" "$N_LISTENER" --image "oci:$LAYOUT:latest" --input "$WORK/input.yaml"
    listeners_stop
  done
  [ -z "${KEEP:-}" ] || cp -r "$OUT" "$KEEP"
fi

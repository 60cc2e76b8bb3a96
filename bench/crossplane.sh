#!/usr/bin/env bash
# Crossplane v1 functions through fnrun, side by side with the same function
# server run directly on the host: warm call latency (mTLS and h2c), cold
# start after a scale to zero, and memory of N hosted functions against N
# processes. The function and the client are the test fixtures' grpc-go
# programs (tests/go/crossplanefn, tests/go/crossplaneclient). Root; loopback
# only; bounded in count and time (a few minutes).
#
#   bench/crossplane.sh
#
# Knobs (environment): CALLS (2000) calls per warm round, ROUNDS (3),
# COLD_RUNS (20), MEM_FUNCTIONS (20), CARGO_TARGET_DIR (this checkout's
# target/), SKIP_BUILD=1 (use the release fnrun already built), OUT.
# Results: bench/results/crossplane-<stamp>/crossplane.json and a table on
# stdout; docs/benchmarks.md records them.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT=${OUT:-$ROOT/bench/results/crossplane-$STAMP}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
[ "$(id -u)" = 0 ] || { echo "bench/crossplane.sh: run as root" >&2; exit 2; }

log() { printf '\n== %s (%s)\n' "$*" "$(date -u +%T)" >&2; }

for tool in umoci openssl python3; do
  command -v "$tool" >/dev/null || { echo "bench/crossplane.sh: $tool is missing" >&2; exit 2; }
done

log "building fnrun (release, $CARGO_TARGET_DIR)"
[ "${SKIP_BUILD:-0}" = 1 ] || cargo build --release -q -p fnrun
FNRUN=$CARGO_TARGET_DIR/release/fnrun

log "building the Go function and client (the test fixtures' build, cached)"
cargo test -q -p fnrun-tests --test harness_crossplane go_programs_are_static_and_built_once \
  >/dev/null 2>&1 || { echo "cannot build the Go programs: cargo test -p fnrun-tests --test harness_crossplane" >&2; exit 1; }
TOOLS=${FNRUN_TEST_CACHE:-/var/cache/fnrun-tests}/go
newest() { find "$TOOLS" -maxdepth 2 -type f -path "*/$1-*/$1" -printf '%T@ %p\n' | sort -n | tail -1 | cut -d' ' -f2; }
FN_BIN=$(newest crossplanefn)
CLIENT_BIN=$(newest crossplaneclient)
[ -x "$FN_BIN" ] && [ -x "$CLIENT_BIN" ] || { echo "Go programs not found under $TOOLS" >&2; exit 1; }

mkdir -p "$OUT"
# shellcheck source=bench/common.sh
. "$ROOT/bench/common.sh"
work_dir fnrun-bench-xp

log "the function image (the Go function, as its tests package it) and certificates"
LAYOUT=$WORK/layout
umoci init --layout "$LAYOUT"
umoci new --image "$LAYOUT:v1"
umoci unpack --image "$LAYOUT:v1" "$WORK/stage" >/dev/null
R=$WORK/stage/rootfs
mkdir -p "$R/etc" "$R/tmp" "$R/home/nonroot"
chmod 1777 "$R/tmp"
install -m 0755 "$FN_BIN" "$R/function"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > "$R/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' > "$R/etc/group"
umoci repack --image "$LAYOUT:v1" "$WORK/stage"
umoci config --image "$LAYOUT:v1" --clear=config.entrypoint --clear=config.cmd \
  --config.user=65532:65532 \
  --config.entrypoint=/function --config.entrypoint=--variant=label --config.entrypoint=--serve=v1,v1beta1
umoci gc --layout "$LAYOUT"
rm -rf "$WORK/stage"

# A CA with a PKCS#1 RSA key, as Crossplane's crossplane-root-ca; a client
# certificate (Crossplane's) and a server certificate for the direct runs.
C=$WORK/certs
mkdir -p "$C/server"
openssl genrsa -traditional -out "$C/ca.key" 2048 2>/dev/null
openssl req -x509 -new -key "$C/ca.key" -days 2 -subj "/CN=bench CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign" -out "$C/ca.crt" 2>/dev/null
leaf() { # name eku sans
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$C/$1.key" \
    -subj "/CN=$1" -out "$C/$1.csr" 2>/dev/null
  printf 'extendedKeyUsage=%s\nsubjectAltName=%s\n' "$2" "$3" > "$C/$1.ext"
  openssl x509 -req -in "$C/$1.csr" -CA "$C/ca.crt" -CAkey "$C/ca.key" -CAcreateserial \
    -days 2 -extfile "$C/$1.ext" -out "$C/$1.crt" 2>/dev/null
}
leaf client clientAuth "DNS:crossplane"
leaf server serverAuth "DNS:function-label,DNS:function-label.crossplane-system,IP:127.0.0.1"
cp "$C/server.crt" "$C/server/tls.crt"; cp "$C/server.key" "$C/server/tls.key"; cp "$C/ca.crt" "$C/server/ca.crt"

machine_json "$OUT/machine.json" "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"

FNRUN=$FNRUN FN_BIN=$FN_BIN CLIENT_BIN=$CLIENT_BIN LAYOUT=$LAYOUT WORK=$WORK OUT=$OUT \
  REQUEST=$ROOT/tests/data/crossplane/run_function_request.yaml \
  python3 "$ROOT/bench/crossplane.py" | tee "$OUT/summary.txt"
cp "$WORK"/daemon-*.log "$OUT/" 2>/dev/null || true
echo "loadavg at the end: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/summary.txt"

# Sourced by the benchmarks.
#
#   work_dir NAME
#
# makes $WORK (/tmp/NAME.XXXXXX), searchable by the sandbox's mapped ids
# (caches and mounts live below it), and on exit stops $DAEMON_PID,
# $REGISTRY_PID and the daemons of bench/listeners.sh if set, then removes
# $WORK.
work_dir() {
  WORK=$(mktemp -d "/tmp/$1.XXXXXX")
  chmod 0755 "$WORK"
  DAEMON_PID=""
  REGISTRY_PID=""
  LISTENERS_PIDS=()
  trap bench_cleanup EXIT
}

bench_cleanup() {
  local pid
  for pid in "$DAEMON_PID" "$REGISTRY_PID" "${LISTENERS_PIDS[@]}"; do
    if [ -n "$pid" ] && kill "$pid" 2>/dev/null; then wait "$pid" 2>/dev/null || true; fi
  done
  chmod -R u+rwX "$WORK" 2>/dev/null || true
  rm -rf "$WORK"
}

# The facts of the machine a run was made on:
#
#   machine_json FILE COMMIT [KEY VALUE]...
#
# writes them to FILE as one JSON object (and to stderr): date, cores,
# memory, kernel, CPU, cgroup version, load average at the start and the
# fnrun commit, then each KEY VALUE as one more string field.
machine_json() {
  local file=$1 commit=$2
  shift 2
  {
    echo "{"
    echo "  \"date\": \"$(date -u +%FT%TZ)\","
    echo "  \"nproc\": $(nproc),"
    echo "  \"mem_total_kib\": $(awk '/MemTotal/{print $2}' /proc/meminfo),"
    echo "  \"kernel\": \"$(uname -r)\","
    echo "  \"cpu\": \"$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')\","
    echo "  \"cgroup\": \"$( [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ] && echo v2 || echo v1)\","
    echo "  \"loadavg_start\": \"$(cut -d' ' -f1-3 /proc/loadavg)\","
    printf '  "fnrun_commit": "%s"' "$commit"
    while [ $# -ge 2 ]; do
      printf ',\n  "%s": "%s"' "$1" "$2"
      shift 2
    done
    printf '\n}\n'
  } > "$file"
  cat "$file" >&2
}

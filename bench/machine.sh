# Sourced by the benchmarks: the facts of the machine a run was made on.
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

#!/usr/bin/env bash
# Creates or updates, idempotently, a Python venv of the end-to-end tests from
# a pinned requirements file, from PyPI.
#
#   tests/python/venv.sh DIR [REQUIREMENTS [MODULE...]]
#
# REQUIREMENTS defaults to requirements.txt next to this script (the gRPC
# clients' grpcio, grpcio-tools and grpcio-reflection) and MODULEs to the
# modules those must make importable. Does nothing when DIR holds a working
# venv made from the same requirements and interpreter. Concurrent runs wait
# for each other (flock on DIR.lock). $PYTHON picks the interpreter (default
# python3, which needs Debian's python3-venv).
set -euo pipefail

venv=${1:?usage: venv.sh DIR [REQUIREMENTS [MODULE...]]}
here=$(cd "$(dirname "$0")" && pwd)
requirements=${2:-$here/requirements.txt}
if (($# > 2)); then
    modules=("${@:3}")
else
    modules=(grpc grpc_tools grpc_reflection)
fi
python=${PYTHON:-python3}
stamp=$venv/.fnrun-requirements
want=$(sha256sum <"$requirements" | cut -d' ' -f1)
# Which interpreter a venv runs on: its version and resolved base executable.
identify='import os, sys; print(sys.version, os.path.realpath(sys._base_executable))'
want_python=$("$python" -c "$identify")

current() {
    local imports
    imports=$(printf 'import %s\n' "${modules[@]}")
    [[ -f $stamp && $(<"$stamp") == "$want" ]] &&
        [[ $("$venv/bin/python" -c "$identify" 2>/dev/null) == "$want_python" ]] &&
        "$venv/bin/python" -c "$imports" 2>/dev/null
}

mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
if current; then
    echo "python venv up to date: $venv"
    exit 0
fi
echo "python venv: creating $venv with $python"
rm -rf "$venv"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
    -r "$requirements"
echo "$want" >"$stamp"
current

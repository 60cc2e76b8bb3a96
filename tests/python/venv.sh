#!/usr/bin/env bash
# Creates or updates, idempotently, the Python venv that the end-to-end tests
# run their gRPC clients in: requirements.txt, next to this script, from PyPI.
#
#   tests/python/venv.sh DIR
#
# Does nothing when DIR holds a working venv made from the same requirements.
# Concurrent runs wait for each other (flock on DIR.lock). $PYTHON picks the
# interpreter (default python3, which needs Debian's python3-venv).
set -euo pipefail

venv=${1:?usage: venv.sh DIR}
here=$(cd "$(dirname "$0")" && pwd)
requirements=$here/requirements.txt
stamp=$venv/.fnrun-requirements
want=$(sha256sum <"$requirements" | cut -d' ' -f1)

current() {
    [[ -f $stamp && $(<"$stamp") == "$want" ]] &&
        "$venv/bin/python" -c 'import grpc, grpc_tools, grpc_reflection' 2>/dev/null
}

mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
if current; then
    echo "python venv up to date: $venv"
    exit 0
fi
echo "python venv: creating $venv"
rm -rf "$venv"
"${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
    -r "$requirements"
echo "$want" >"$stamp"
current

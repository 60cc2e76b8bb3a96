#!/usr/bin/env bash
# Creates or updates, idempotently, the venv the Python SDK function's image
# is built from: requirements.txt next to this script, on a Python of 3.11 or
# later (the SDK needs it), which this script picks:
#
#   $FNRUN_SDK_PYTHON if set, else /usr/bin/python3 if it is 3.11 or later
#   (Debian 12 and later, with python3-venv), else the newest pyenv 3.11+.
#
#   tests/python/sdk-function/venv.sh DIR
#
# The image carries this interpreter, its stdlib and shared libraries, and the
# venv's packages (tests/src/crossplane/python_sdk.rs).
set -euo pipefail

venv=${1:?usage: venv.sh DIR}
here=$(cd "$(dirname "$0")" && pwd)

usable() {
    [[ -x $1 ]] && "$1" -c \
        'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 11))' 2>/dev/null
}

pick() {
    if [[ -n ${FNRUN_SDK_PYTHON:-} ]]; then
        usable "$FNRUN_SDK_PYTHON" || {
            echo "error: FNRUN_SDK_PYTHON=$FNRUN_SDK_PYTHON is not a Python 3.11+ with venv and ensurepip" >&2
            return 1
        }
        echo "$FNRUN_SDK_PYTHON"
        return
    fi
    local candidate
    local pyenv=${PYENV_ROOT:-$HOME/.pyenv}
    for candidate in /usr/bin/python3 $(ls -d "$pyenv"/versions/3.* 2>/dev/null | sort -rV); do
        [[ -d $candidate ]] && candidate=$candidate/bin/python3
        if usable "$candidate"; then
            echo "$candidate"
            return
        fi
    done
    echo "error: no Python 3.11 or later with venv (install Debian's python3-venv, or set FNRUN_SDK_PYTHON)" >&2
    return 1
}

PYTHON=$(pick)
export PYTHON
exec "$here/../venv.sh" "$venv" "$here/requirements.txt" crossplane.function.runtime

#!/usr/bin/env bash
# Builds (or reuses) the project's virtual environment in .venv with Python 3.10,
# the newest CPython that nnabla 1.39 publishes wheels for.
#
# Usage: source tools/env.sh   (sets VENV_PY to the environment's python)
# Set NNABLA_MPT_PYTHON to a Python 3.10 interpreter to skip the search.
set -euo pipefail

_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

_is_py310() {
    "$1" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 10) else 1)' >/dev/null 2>&1
}

_find_py310() {
    local c
    if [ -n "${NNABLA_MPT_PYTHON:-}" ]; then
        if _is_py310 "$NNABLA_MPT_PYTHON"; then echo "$NNABLA_MPT_PYTHON"; return 0; fi
        echo "error: NNABLA_MPT_PYTHON=$NNABLA_MPT_PYTHON is not a working Python 3.10 interpreter" >&2
        return 1
    fi
    for c in python3.10 \
             "$HOME"/.pyenv/versions/3.10.*/bin/python3.10 \
             /usr/local/bin/python3.10 /usr/bin/python3.10 \
             /opt/python/3.10*/bin/python3.10; do
        if [ -x "$c" ] || command -v "$c" >/dev/null 2>&1; then
            if _is_py310 "$c"; then command -v "$c" 2>/dev/null || echo "$c"; return 0; fi
        fi
    done
    # A pyenv shim answers only when PYENV_VERSION names an installed 3.10.
    if command -v pyenv >/dev/null 2>&1; then
        local v
        v="$(pyenv versions --bare 2>/dev/null | grep -E '^3\.10(\.|$)' | tail -n 1 || true)"
        if [ -n "$v" ]; then
            c="$(PYENV_VERSION="$v" pyenv which python3.10 2>/dev/null || true)"
            if [ -n "$c" ] && _is_py310 "$c"; then echo "$c"; return 0; fi
        fi
    fi
    return 1
}

if ! PY310="$(_find_py310)"; then
    [ -n "${NNABLA_MPT_PYTHON:-}" ] && exit 1
    cat >&2 <<MSG
error: Python 3.10 was not found.
nnabla 1.39.0 publishes wheels for CPython 3.8-3.10 only; this project uses 3.10.
Install it, for example one of:
  pyenv install 3.10            (then nothing else is needed)
  apt-get install python3.10 python3.10-venv
or point NNABLA_MPT_PYTHON at a Python 3.10 interpreter.
MSG
    exit 1
fi

_nnabla_version=1.39.0  # the newest nnabla setup.py accepts: the one CI tests
VENV="${NNABLA_MPT_VENV:-$_root/.venv}"
VENV_PY="$VENV/bin/python"
_stamp="$VENV/.nnabla_mpt-installed"
_want="$(cat "$_root/setup.py" "$_root/tools/env.sh" | cksum | cut -d' ' -f1)"

if [ ! -x "$VENV_PY" ] || ! _is_py310 "$VENV_PY"; then
    echo "[env] creating $VENV with $PY310" >&2
    rm -rf "$VENV"
    "$PY310" -m venv "$VENV"
fi
if [ ! -f "$_stamp" ] || [ "$(cat "$_stamp")" != "$_want" ]; then
    echo "[env] installing nnabla_mpt and its dependencies into $VENV" >&2
    "$VENV_PY" -m pip install --quiet --disable-pip-version-check --upgrade pip
    "$VENV_PY" -m pip install --quiet --disable-pip-version-check -e "$_root[mpi,demo,test,docs,tensorboard]" \
        "nnabla==$_nnabla_version"
    echo "$_want" > "$_stamp"
fi
export VENV_PY
export PATH="$VENV/bin:$PATH"

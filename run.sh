#!/usr/bin/env bash
# The project's two entry points; each builds its own environment first.
#   ./run.sh demo [demo options]   fp16 training demo on the digits data set
#   ./run.sh test [pytest options] the whole test suite, then the docs build
set -euo pipefail
cd "$(dirname "$0")"
cmd="${1:-}"
[ $# -gt 0 ] && shift
case "$cmd" in
    demo)
        source tools/env.sh
        exec "$VENV_PY" examples/digits_demo.py "$@"
        ;;
    test)
        source tools/env.sh
        export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
        "$VENV_PY" -m pytest "$@"
        "$VENV_PY" -m sphinx -W --keep-going -q -b html docs docs/_build/html
        echo "docs: built docs/_build/html without warnings"
        ;;
    *)
        echo "usage: ./run.sh demo [options] | ./run.sh test [pytest options]" >&2
        exit 2
        ;;
esac

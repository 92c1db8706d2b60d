#!/usr/bin/env bash
# Mutation testing of the modules that make the step's decisions (the policy, the
# decision and the overflow check, unscaling with clipping and weight decay, a
# micro-batch's pass with the backward seed, measured growth), with mutmut 3: each mutant
# (a changed comparison, number, operator, argument...) is run against the fast tests that
# reach its function; a mutant no test fails on survives. The modules and the tests are
# set in pyproject.toml, [tool.mutmut].
#
# Usage: tools/mutation.sh [--fresh] [MODULE ...]
#   MODULE   e.g. scale/policy step/unscale (default: every module of only_mutate)
#   --fresh  forget earlier results (mutmut keeps them in mutants/ and runs only new or
#            changed mutants otherwise, and the survivors again)
# Prints a line per module: mutants, killed, survived, timeouts, share killed (a timeout
# or a crash of the tests kills a mutant too). One test process at a time. The survivors:
# .venv/bin/mutmut results; one of them: .venv/bin/mutmut show NAME.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source tools/env.sh
export OMP_NUM_THREADS=1
"$VENV_PY" -c 'import mutmut' 2>/dev/null || "$VENV_PY" -m pip install --quiet "mutmut==3.8.1"

fresh=false
if [ "${1:-}" = "--fresh" ]; then rm -rf mutants; fresh=true; shift; fi
patterns=()
for module in "$@"; do
    module="${module%.py}"; patterns+=("nnabla_mpt.${module//\//.}.*")
done

start=$(date +%s)
# mutmut redraws its progress line with \r: keep its last state only
"$VENV_PY" -m mutmut run --max-children 1 "${patterns[@]}" 2>&1 | tr '\r' '\n' \
    | grep -vE '^(⠋|⠙|⠹|⠸|⠼|⠴|⠦|⠧|⠇|⠏)' | grep -vE '^\s*$' | tail -n 3 || true
# the survivors of earlier runs are tried again: a test added since may kill them
survivors=()
$fresh || mapfile -t survivors < <("$VENV_PY" tools/mutation_summary.py --survivors "$@")
if [ "${#survivors[@]}" -gt 0 ]; then
    echo "trying the ${#survivors[@]} survivors again"
    "$VENV_PY" -m mutmut run --max-children 1 "${survivors[@]}" 2>&1 | tr '\r' '\n' \
        | grep -vE '^(⠋|⠙|⠹|⠸|⠼|⠴|⠦|⠧|⠇|⠏)' | grep -vE '^\s*$' | tail -n 3 || true
fi
# a survivor listed as killed by a test under mpiexec (mutmut's runner cannot reach those
# processes) is run here under that test: it must fail there
missed=0
while read -r name test; do
    if (cd mutants && MUTANT_UNDER_TEST="$name" PYTHONPATH="$PWD" "$VENV_PY" -m pytest -q \
            -p no:cacheprovider -p no:randomly "$test" > /dev/null 2>&1); then
        echo "NOT killed under mpiexec by $test: $name"; missed=1
    else
        echo "killed under mpiexec by $test: $name"
    fi
done < <("$VENV_PY" tools/mutation_summary.py --mpi "$@")
echo "wall time of the mutation run: $(( $(date +%s) - start )) s"
"$VENV_PY" tools/mutation_summary.py "$@"
exit "$missed"

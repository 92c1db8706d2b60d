"""A larger sweep of the option matrix against the reference step than the test suite's.

The suite (tests/test_reference_matrix.py) runs 120 seeds in one process and 12 under
``mpiexec -n 2``; this script runs the seeds asked for, keeps going after a failure, and
prints one line per failing case (its options and the first difference) and a summary:
cases run, steps by kind (updated, skipped, bad batch), failures. Usage::

    .venv/bin/python benchmarks/reference_sweep.py [--seeds 0:1000] [--mpi 1000:1100]

``--mpi`` runs those seeds under ``.venv/bin/mpiexec -n 2`` with an ``MPICommunicator``
(tests/mpi_workers/reference_matrix.py, one job per seed so that a failure ends only its
own case). Exit status 1 when some case failed.
"""
import argparse
import collections
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import nnabla as nn  # noqa: E402

from mpi_helpers import run_mpi  # noqa: E402
from reference_cases import run_case, sample_case  # noqa: E402


def seeds(text: str) -> range:
    start, stop = (int(x) for x in text.split(":"))
    return range(start, stop)


def sweep(chosen: range, kinds: collections.Counter) -> list:
    failures = []
    for seed in chosen:
        nn.clear_parameters()
        try:
            kinds.update(run_case(sample_case(seed), scope=f"sweep{seed}"))
        except AssertionError as error:
            failures.append((seed, str(error).splitlines()[0]))
    return failures


def sweep_mpi(chosen: range) -> list:
    failures = []
    for seed in chosen:
        proc = run_mpi(2, "reference_matrix.py", None, seed)
        if proc.returncode != 0:
            lines = [x for x in (proc.stdout + proc.stderr).splitlines()
                     if x.startswith("AssertionError")]
            failures.append((seed, lines[0] if lines else proc.stderr[-300:]))
    return failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=seeds, default=seeds("0:1000"))
    parser.add_argument("--mpi", type=seeds, default=seeds("1000:1000"))
    args = parser.parse_args()
    kinds = collections.Counter()
    failures = sweep(args.seeds, kinds)
    mpi_failures = sweep_mpi(args.mpi)
    for seed, message in failures + mpi_failures:
        sys.stdout.write(f"FAILED seed {seed}: {message}\n")
    sys.stdout.write(f"one process: {len(args.seeds)} cases, steps {dict(kinds)}, "
                     f"{len(failures)} failed\n")
    sys.stdout.write(f"mpiexec -n 2: {len(args.mpi)} cases, {len(mpi_failures)} failed\n")
    sys.exit(1 if failures or mpi_failures else 0)


if __name__ == "__main__":
    main()

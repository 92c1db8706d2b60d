"""How long a 3-rank job takes to end when one rank fails, and what it prints.

Runs ``tests/mpi_workers/leave.py`` (MPICommunicator with ``timeout=2``) under
``.venv/bin/mpiexec -n 3`` once per fault, through the tests' ``run_mpi`` (which also
removes the shared-memory segments an aborted job leaves), and prints for each the exit
status, the seconds from launch to the end of the job and how it ended: "timed out" (a waiting
rank's collective timeout), "aborted" (the exception hook of a rank that raised),
"killed" (the launcher saw a rank die). Usage::

    .venv/bin/python benchmarks/fault_times.py
"""
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from mpi_helpers import run_mpi  # noqa: E402  (launches, bounds and cleans up a job)

MODES = ["raise", "caught", "exit3", "exit0", "end", "stall", "kill9", "sigterm", "model",
         "evaluate"]


def how(result) -> str:
    text = result.stdout + result.stderr
    if "waited more than" in text:
        return "timed out"
    if "aborting the MPI job" in text:
        return "aborted"
    if "BAD TERMINATION" in text:
        return "killed"
    return "ended normally" if result.returncode == 0 else "?"


def main() -> None:
    print("| fault on rank 1 of 3 | exit status | seconds | how |")
    print("|---|---:|---:|---|")
    for mode in MODES:
        with tempfile.TemporaryDirectory() as out:
            start = time.monotonic()
            result = run_mpi(3, "leave.py", out, mode, timeout=300)
            seconds = time.monotonic() - start
        print(f"| {mode} | {result.returncode} | {seconds:.1f} | {how(result)} |", flush=True)


if __name__ == "__main__":
    main()

"""Runs a benchmark command and keeps its output as a results file that says when, where,
under what load and by what command it was measured.

Usage (from the repository root)::

    .venv/bin/python benchmarks/record.py benchmarks/results/NAME.txt -- COMMAND [ARGS...]

The file starts with one ``# key: value`` line for each of ``HEADER`` (the date, the
machine, the load average before the run, the command as typed with ``OMP_NUM_THREADS``
and ``NNABLA_MPT_ROOT`` where set, the package's revision), then holds what the command
printed (its standard output and error as one stream: nnabla logs to standard error),
and ends with ``# load after: ...`` and ``# wall time: ...``. The file is written only
when the command succeeds, and whole (a temporary file renamed), so a failed or
interrupted run leaves the previous results as they were.

The documentation quotes figures from these files; ``tests/figures/`` reads them
with :func:`read` and checks every quoted figure against them.
"""
import datetime
import importlib.metadata
import os
import platform
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _machine import cpu_model  # noqa: E402

#: The header lines every results file starts with, in order.
HEADER = ("date", "machine", "load before", "command", "revision")
#: The lines a finished run ends with.
FOOTER = ("load after", "wall time")


def load_text() -> str:
    """The 1, 5 and 15 minute load averages, as ``uptime`` prints them."""
    return ", ".join(f"{v:.2f}" for v in os.getloadavg())


def revision() -> str:
    """The repository's commit, with ``+`` when the code a benchmark runs (the package,
    the examples, the benchmark scripts) has changes not committed."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=HERE, capture_output=True, text=True,
                              check=True).stdout.strip()
    try:
        changed = git("status", "--porcelain", "--untracked-files=no", "--",
                      "nnabla_mpt", "examples", "benchmarks/*.py")
        return git("rev-parse", "--short", "HEAD") + ("+" if changed else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"


def machine() -> str:
    """The CPU, its count, the platform and the versions the figures depend on."""
    try:
        nnabla = importlib.metadata.version("nnabla")
    except importlib.metadata.PackageNotFoundError:
        nnabla = "not installed"
    return (f"{os.cpu_count()} CPUs ({cpu_model()}), {platform.platform()}, "
            f"Python {platform.python_version()}, nnabla {nnabla}")


def facts(command) -> dict:
    """The facts of ``HEADER`` for a run of ``command`` (a list of arguments) starting now:
    what a benchmark that writes its own JSON keeps under ``"facts"``."""
    typed = [f"{name}={os.environ[name]}" for name in ("OMP_NUM_THREADS", "NNABLA_MPT_ROOT")
             if name in os.environ] + list(command)
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "load before": load_text(),
        "command": shlex.join(typed),
        "revision": revision(),
    }


def header(command) -> str:
    """The header lines of a run of ``command`` starting now."""
    values = facts(command)
    return "".join(f"# {key}: {values[key]}\n" for key in HEADER)


def read(path) -> "tuple[dict, str]":
    """``(fields, body)`` of a results file: its ``# key: value`` header and footer lines
    as a dict, and the command's output between them. Raises ``ValueError`` naming the
    file and the missing key when the header or the footer is incomplete."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    fields = {}
    for line in lines[:len(HEADER)] + lines[-len(FOOTER):]:
        key, sep, value = line[2:].partition(": ")
        if line.startswith("# ") and sep:
            fields[key] = value
    missing = [key for key in HEADER + FOOTER if key not in fields]
    if missing:
        raise ValueError(f"{path}: no {missing[0]!r} line; results files are written by "
                         f"benchmarks/record.py")
    return fields, "\n".join(lines[len(HEADER):-len(FOOTER)])


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 3 or argv[1] != "--":
        print("\n\n".join(__doc__.split("\n\n")[1:3]), file=sys.stderr)
        return 2
    out, command = argv[0], argv[2:]
    head = header(command)
    started = time.perf_counter()
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    sys.stdout.write(done.stdout)
    if done.returncode != 0:
        print(f"record.py: {shlex.join(command)} exited with {done.returncode}; "
              f"{out} left as it was", file=sys.stderr)
        return done.returncode
    body = done.stdout if done.stdout.endswith("\n") else done.stdout + "\n"
    tail = (f"# load after: {load_text()}\n"
            f"# wall time: {time.perf_counter() - started:.1f} s\n")
    partial = out + ".partial"
    with open(partial, "w", encoding="utf-8") as f:
        f.write(head + body + tail)
    os.replace(partial, out)
    print(f"record.py: wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

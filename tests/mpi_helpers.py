"""Run worker scripts under a real ``mpiexec`` (the one installed next to the test's Python)."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

WORKERS = Path(__file__).resolve().parent / "mpi_workers"
MPIEXEC = Path(sys.executable).parent / "mpiexec"
TIMEOUT = 120  # seconds; every launch is bounded so a hang fails the test instead of CI
RANKS = [2, 3]  # the rank counts every MPI test runs with


SHM = Path("/dev/shm")


def _mpich_segments():
    return set(SHM.glob("mpich_shm_*")) if SHM.is_dir() else set()


def worker_env(environ):
    """``environ`` for a worker: this checkout's package and the workers' helpers first on
    the path, one OpenMP thread unless it says otherwise."""
    env = dict(environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(WORKERS), str(WORKERS.parent.parent)] + [environ.get("PYTHONPATH", "")])
    return env


def run_mpi(n, worker, outdir, *args, timeout=TIMEOUT, env=None):
    """Launch ``mpiexec -n n python mpi_workers/<worker> <outdir> <args...>``.

    ``worker`` may also be an absolute path; ``outdir=None`` passes no output directory.

    Returns the CompletedProcess; raises ``subprocess.TimeoutExpired`` on a hang (after
    killing the launcher and its ranks).
    """
    if not MPIEXEC.exists():
        raise RuntimeError(f"mpiexec not found next to {sys.executable}: {MPIEXEC}")
    full_env = worker_env(os.environ)
    if env:
        full_env.update(env)
    script = WORKERS / worker  # an absolute path stays as it is
    cmd = [str(MPIEXEC), "-n", str(n), sys.executable, str(script),
           *([] if outdir is None else [str(outdir)]), *map(str, args)]
    before = _mpich_segments()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=full_env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        _remove_leftovers(before)
        raise
    if proc.returncode != 0:
        _remove_leftovers(before)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _held_in_shm():
    """The files in ``/dev/shm`` that a live process holds open or mapped (as its
    ``/proc`` entries show; the processes this user cannot read are passed over)."""
    held = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fds = list((proc / "fd").iterdir())
            with open(proc / "maps") as maps:
                held.update(line.split(None, 5)[5].strip() for line in maps
                            if f" {SHM}/" in line)
        except OSError:         # gone, or not this user's
            continue
        for fd in fds:
            try:
                held.add(os.readlink(fd))
            except OSError:     # closed meanwhile (the listing's own among them)
                pass
    return {Path(name) for name in held if name.startswith(f"{SHM}/")}


def _remove_leftovers(before, settle=1.0):
    """An aborted MPICH job leaves its shared-memory segments behind. A segment that
    appeared while it ran and that no live process holds is one of them, and is removed;
    one that a process still holds after ``settle`` seconds (a rank may outlive mpiexec by
    a moment, and an exiting process lets go of its files last) belongs to another job
    running beside it (another test run on a shared machine), whose ranks may still have
    to attach to it, and is kept."""
    deadline = time.monotonic() + settle
    while True:
        appeared, held = _mpich_segments() - before, _held_in_shm()
        for path in appeared - held:
            try:
                path.unlink()
            except FileNotFoundError:
                pass
        if not appeared & held or time.monotonic() > deadline:
            return
        time.sleep(0.02)


def check_ok(result):
    """Fail with the ranks' output if the job did not exit cleanly."""
    if result.returncode != 0:
        raise AssertionError(f"mpiexec exited with {result.returncode}\n--- stdout\n"
                             f"{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-4000:]}")


def run_ranks(n, worker, outdir, *args, **kwargs):
    """Run ``mpi_workers/<worker> <outdir> <args...>`` under ``n`` ranks (:func:`run_mpi`),
    fail if the job does not exit cleanly, and return the per-rank results
    (:func:`load_ranks`)."""
    check_ok(run_mpi(n, worker, outdir, *args, **kwargs))
    return load_ranks(outdir, n)


def ranks_fixture(worker, *args, ranks=RANKS):
    """A module-scoped fixture running ``mpi_workers/<worker> <outdir> <args...>`` once for
    each rank count of ``ranks`` into a fresh folder, for the tests that share the run; its
    value is ``(n, per-rank results)`` (see :func:`load_ranks`)."""
    @pytest.fixture(scope="module", params=ranks, ids=lambda n: f"np{n}")
    def run(request, tmp_path_factory):
        n = request.param
        outdir = tmp_path_factory.mktemp(f"{worker.rsplit('.', 1)[0]}_np{n}")
        return n, run_ranks(n, worker, outdir, *args)
    return run


def bits(x):
    """The array's bit patterns (unsigned integers), for bit-for-bit comparisons."""
    x = np.ascontiguousarray(x)
    return x.view(np.dtype(f"u{x.dtype.itemsize}"))


def load_meta(outdir, n, stem="rank"):
    """Per-rank JSON results written by the workers: list of dicts."""
    return [json.loads((Path(outdir) / f"{stem}{r}.json").read_text()) for r in range(n)]


def load_ranks(outdir, n, stem="rank"):
    """Per-rank results written by the workers: list of (npz dict, json dict)."""
    return [(dict(np.load(Path(outdir) / f"{stem}{r}.npz")), meta)
            for r, meta in enumerate(load_meta(outdir, n, stem))]

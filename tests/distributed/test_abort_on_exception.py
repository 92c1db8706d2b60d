"""A rank that raises ends the job also under a communicator other than MPICommunicator.

nnabla's ``MultiProcessDataParallelCommunicator`` needs CUDA, so the MPI tests use
``NcclLikeCommunicator`` (tests/mpi_workers/standins.py): no MPICommunicator, it
reproduces only documented behaviours of nnabla's communicator, among them
``all_reduce`` (over real MPI processes) and ``abort()`` (``MPI_Abort`` on the world
communicator, as nnabla's C++ communicator calls it). Without the updater's exception hook
the other ranks would wait in the step's all-reduce forever; the launch is bounded by
``run_mpi``'s timeout, so that hang fails the test instead of the suite.
"""
import subprocess
import sys
import time

import pytest

from mpi_helpers import TIMEOUT, check_ok, load_meta, run_mpi
from support import Net, raises_naming


@pytest.mark.parametrize("n, raising", [(2, 1), (3, 0)], ids=["np2-rank1", "np3-rank0"])
def test_a_rank_that_raises_ends_the_job_through_the_communicators_abort(tmp_path, n,
                                                                          raising):
    start = time.monotonic()
    try:
        result = run_mpi(n, "stand_in_comm.py", tmp_path, "raise", raising, 3,
                         timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"mpiexec -n {n} hung after rank {raising} raised in its data feeder")
    elapsed = time.monotonic() - start
    assert result.returncode != 0
    assert elapsed < 30, f"the job took {elapsed:.1f} s to end"
    assert f"RuntimeError: data loader failed on rank {raising} at step 3" in result.stderr
    assert (f"rank {raising} of {n} raised RuntimeError; aborting the MPI job "
            f"(NcclLikeCommunicator.abort())") in result.stderr
    # every rank completed steps 0-2, none got past the failed step
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f"rank{r}_step{i}" for r in range(n) for i in range(3))


@pytest.mark.parametrize("flag", [True, False])
def test_the_hook_is_installed_unless_abort_on_exception_is_false(tmp_path, flag):
    # nothing raises here: both runs end normally whatever the hook
    check_ok(run_mpi(2, "stand_in_comm.py", tmp_path, "hook", flag))
    for r, meta in enumerate(load_meta(tmp_path, 2)):
        assert meta == {"hook_changed": flag, "steps": 2}, f"rank {r}"


@pytest.fixture
def process_hook(monkeypatch):
    """Whatever an MPICommunicator made here installs is undone after the test."""
    from nnabla_mpt.distributed import abort
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    monkeypatch.setattr(abort, "_hook", abort._hook)


def test_false_contradicting_an_aborting_mpi_communicator_is_refused(process_hook):
    from nnabla_mpt import (DynamicLossScalingUpdater, FixedLossScalingUpdater,
                            GradientReduction, MPICommunicator)

    net = Net()
    comm = MPICommunicator()       # abort_on_exception=True: its hook is in place
    assert comm.abort_on_exception
    for cls in (DynamicLossScalingUpdater, FixedLossScalingUpdater):
        with raises_naming(ValueError, "abort_on_exception=False", "cannot be honoured",
                           "MPICommunicator", "abort_on_exception=True",
                           "exception hook is installed",
                           "pass MPICommunicator(abort_on_exception=False)"):
            cls(net.solver(), net.loss, None, comm=comm,
                reduction=GradientReduction(abort_on_exception=False))
        cls(net.solver(), net.loss, None, comm=comm)        # True: the communicator's hook


def test_an_mpi_communicator_made_not_to_abort_accepts_either_value(process_hook):
    from nnabla_mpt import DynamicLossScalingUpdater, GradientReduction, MPICommunicator

    net = Net()
    comm = MPICommunicator(abort_on_exception=False)
    assert not comm.abort_on_exception
    hook = sys.excepthook
    for flag in (True, False):
        DynamicLossScalingUpdater(net.solver(), net.loss, None, comm=comm,
                                  reduction=GradientReduction(abort_on_exception=flag))
    assert sys.excepthook is hook


def test_abort_on_exception_must_be_a_bool():
    from nnabla_mpt import GradientReduction

    with raises_naming(TypeError, "GradientReduction.abort_on_exception", "True", "False", "1",
                       "int"):
        GradientReduction(abort_on_exception=1)

"""The updaters with nnabla's NCCL communicator, through a stand-in on the CPU
(``mpi_workers/standins.py``: ``NcclLikeCommunicator`` casts every array it reduces to
its dtype, sums in that dtype, and runs one MPI check per array and one NCCL call per
array in place), and averaging over ranks with MPICommunicator, under real ``mpiexec``.
"""
import logging

import numpy as np
import pytest

from mpi_helpers import run_ranks
from mpi_workers.standins import NcclCallbackLikeCommunicator, NcclLikeCommunicator
from nnabla_mpt import DynamicLossScalingUpdater, FixedLossScalingUpdater, GradientReduction
from support import Net, assert_names, make_updater, raises_naming


def _run(n, case, tmp_path):
    return run_ranks(n, "nccl_like.py", tmp_path, case)


def test_a_float16_reduction_reports_the_ranks_mean_loss(tmp_path):
    ranks = _run(2, "loss", tmp_path)
    own = np.array([meta["own"] for _, meta in ranks])
    assert np.isfinite(own).all() and (own > 3e4).all()
    assert (own.sum(axis=0) > 65504).all()           # their float16 sum: inf
    for _, meta in ranks:
        np.testing.assert_allclose(meta["reported"], own.mean(axis=0), rtol=1e-6)


def test_different_models_are_refused_on_every_rank_through_a_float16_reduction(tmp_path):
    ranks = _run(2, "model", tmp_path)
    for _, meta in ranks:
        assert meta["error"] is not None
        assert_names(meta["error"], "rank(s) 1", "differ")


@pytest.mark.parametrize("n", [2, 3])
def test_a_packed_step_trains_as_mpi_communicator_does(n, tmp_path):
    ranks = _run(n, "packed", tmp_path)
    for arrays, meta in ranks:
        assert meta["nccl"] == meta["mpi"]
        assert any(skipped for _, skipped in meta["mpi"])     # the scale moved both ways
        for key, value in arrays.items():
            if key.startswith("nccl/"):
                mpi = arrays["mpi/" + key.split("/", 1)[1]]
                assert value.tobytes() == mpi.tobytes(), key
    first = ranks[0][0]
    for arrays, _ in ranks[1:]:
        for key in first:
            assert arrays[key].tobytes() == first[key].tobytes(), key


def test_averaged_ranks_on_identical_batches_decide_as_one_process(tmp_path):
    """Two ranks whose gradients are identical average to those gradients: the sum must
    not overflow float16 where one process's gradients do not."""
    ranks = _run(2, "average", tmp_path)
    for arrays, meta in ranks:
        assert meta["ranks"] == meta["alone"]
        assert any(skipped for _, skipped in meta["alone"])    # the scale reached its edge
        for key, value in arrays.items():
            if key.startswith("ranks/"):
                assert value.tobytes() == arrays["alone/" + key.split("/", 1)[1]].tobytes()


def _counted(comm, steps, skip_at=(), **options):
    net = Net("half", hidden=4)
    net.bad = set(skip_at)           # an inf in the batch: the step is skipped
    updater = FixedLossScalingUpdater(net.solver(), net.loss, net.feeder, scale=8.0,
                                      comm=comm, **options)
    counts = []
    for _ in range(steps):
        before = (comm.n_calls, comm.n_checks, comm.n_nccl)
        r = updater.update()
        counts.append((r.skipped,) + tuple(a - b for a, b in zip(
            (comm.n_calls, comm.n_checks, comm.n_nccl), before)))
    return counts


def test_a_step_is_one_collective_call_on_nnabla_s_communicator():
    """nnabla's communicator runs an MPI check per array it is given: a step hands it one
    array (the gradients and the flags packed), a skipped step one more (the votes)."""
    counts = _counted(NcclLikeCommunicator("float16"), 4, skip_at={2})
    assert counts == [(False, 1, 1, 1), (False, 1, 1, 1), (True, 2, 2, 2),
                      (False, 1, 1, 1)]


def test_the_collectives_of_a_step_with_nnabla_s_callback():
    """With all_reduce_callback=: nnabla's callback checks each of the 4 gradient arrays
    with MPI and runs an NCCL call per pack (29 values in packs of 8: 4), then the flags
    take one call; a skipped step one more (the votes)."""
    counts = _counted(NcclCallbackLikeCommunicator("float32"), 3, skip_at={1},
                      reduction=GradientReduction(backward_pack_size=8))
    assert counts == [(False, 1, 5, 5), (True, 2, 6, 6), (False, 1, 5, 5)]


def test_shared_grads_true_is_refused_where_the_step_is_packed():
    net = Net("float")
    with raises_naming(ValueError, "shared_grads=True", "cannot be honoured",
                       "NcclLikeCommunicator", "share_grads"):
        DynamicLossScalingUpdater(net.solver(), net.loss, net.feeder,
                                  comm=NcclLikeCommunicator("float32"),
                                  reduction=GradientReduction(shared_grads=True))


def test_shared_grads_true_is_refused_where_nnabla_s_callback_reduces():
    """Reduced inside the backward pass by nnabla's callback, the gradients stay where
    nnabla put them: shared_grads=True cannot be honoured and is refused, not ignored."""
    net = Net("float")
    with raises_naming(ValueError, "shared_grads=True", "cannot be honoured",
                       "NcclCallbackLikeCommunicator", "share_grads"):
        DynamicLossScalingUpdater(net.solver(), net.loss, net.feeder,
                                  comm=NcclCallbackLikeCommunicator("float32"),
                                  reduction=GradientReduction(backward_pack_size=8,
                                                              shared_grads=True))


def test_a_float32_sum_over_ranks_is_not_bounded_as_float16(tmp_path):
    """Two ranks on identical batches, summed (not averaged) by a float32 communicator,
    learning rate 0: each rank's own float16 gradients bound the scale as one process's
    do, and their float32 sum, twice as large, must not lower it."""
    ranks = _run(2, "bounds", tmp_path)
    for _, meta in ranks:
        assert meta["ranks"] == meta["alone"]
        assert len({scale for scale, _ in meta["alone"]}) > 1     # it grew


def _float16_warnings(caplog):
    return [r.getMessage() for r in caplog.records if "reduces in float16" in r.getMessage()]


@pytest.mark.parametrize("type_config", ["float", "half"])
def test_a_float16_reduction_of_float32_gradients_warns_once(caplog, type_config):
    caplog.set_level(logging.WARNING, logger="nnabla")
    net = Net(type_config)
    DynamicLossScalingUpdater(net.solver(), net.loss, net.feeder,
                              comm=NcclLikeCommunicator("float16"))
    DynamicLossScalingUpdater(net.solver(), net.loss, net.feeder,
                              comm=NcclLikeCommunicator("float32"))
    warned = _float16_warnings(caplog)
    if type_config == "half":
        assert warned == []
    else:
        assert len(warned) == 1, warned
        assert_names(warned[0], "nnabla_mpt", "float16", "float32 graph", "65504",
                     "build the communicator from a float context")


def test_a_float16_reduction_warns_of_a_precision_schedule_s_float32_phase(caplog):
    caplog.set_level(logging.WARNING, logger="nnabla")
    make_updater(comm=NcclLikeCommunicator("float16"))
    warned = _float16_warnings(caplog)
    assert len(warned) == 1, warned
    assert_names(warned[0], "nnabla_mpt", "float16", "float32 gradients",
                 "full-precision phase", "65504", "build the communicator from a float context")


def _sum_warnings(caplog):
    return [r.getMessage() for r in caplog.records
            if "sums the float16 gradients over the ranks" in r.getMessage()]


@pytest.mark.parametrize("dtype, average, warns", [
    ("float16", False, True), ("float16", True, True), ("float32", False, False),
    ("float32", True, False)])
def test_float16_sums_of_float16_gradients_warn_once(caplog, dtype, average, warns):
    """nnabla's communicator made from a cudnn half context (the stand-in's float16
    reduction) summing the gradients of a float16 graph: the sum over the ranks overflows
    where each rank's gradients do not; averaging divides that sum after it is taken (in
    nnabla-ext-cuda's sources: a sum, then a division kernel), so it warns too."""
    caplog.set_level(logging.WARNING, logger="nnabla")
    net = Net("half")
    DynamicLossScalingUpdater(net.solver(), net.loss, net.feeder,
                              comm=NcclLikeCommunicator(dtype),
                              reduction=GradientReduction(average_ranks=average))
    warned = _sum_warnings(caplog)
    assert len(warned) == (1 if warns else 0)
    if warns:
        assert_names(warned[0], "nnabla_mpt", "sums the float16 gradients", "the ranks",
                     "loss scale falls", "rank count",
                     "build the communicator from a float context")
        assert ("averaging over the ranks divides that sum afterwards" in warned[0]) == average


@pytest.mark.parametrize("extension, device_id, local_rank, warns", [
    ("cudnn", "0", 1, True), ("cuda", "2", 0, True), ("cudnn", "1", 1, False),
    ("cpu", "0", 1, False), ("cudnn", "0", None, False)])
def test_a_loss_on_another_device_than_the_communicator_is_named(extension, device_id,
                                                                 local_rank, warns):
    from nnabla_mpt.distributed.agreement import device_mismatch
    why = device_mismatch(extension, device_id, local_rank)
    if not warns:
        assert why is None
        return
    assert why == (f"nnabla_mpt: the loss is computed on device {device_id!r} ({extension}) "
                   f"while the communicator lives on device {local_rank!r} (its local_rank: "
                   f"nnabla's comm.init() moves it there), so every collective copies across "
                   f"devices; set ctx.device_id = str(comm.local_rank) before creating the "
                   f"parameters and the solver")


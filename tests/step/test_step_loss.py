"""StepResult.loss: the step's loss, the mean over its micro-batches, before scaling."""
import copy
import dataclasses
import math
import pickle

import numpy as np
import pytest

import nnabla as nn
import nnabla.functions as F

from nnabla_mpt import DynamicLossScalingUpdater, FixedLossScalingUpdater
from nnabla_mpt.step.micro_batch import StepLosses
from support import Net


@pytest.mark.parametrize("accum_grad", [1, 3])
@pytest.mark.parametrize("type_config", ["float", "half"])
def test_the_step_loss_is_the_mean_of_its_micro_batches(accum_grad, type_config):
    net, twin = Net(type_config, hidden=4, scope="net"), Net(type_config, hidden=4,
                                                              scope="twin")
    updater = FixedLossScalingUpdater(net.solver("Sgd", lr=0.0), net.loss, net.feeder,
                                      scale=64.0, accum_grad=accum_grad)
    for step in range(4):
        result = updater.update()
        expected = []
        for micro in range(accum_grad):           # lr=0: the twin has the same parameters
            twin.feed(step * accum_grad + micro)
            twin.loss.forward()
            expected.append(float(twin.loss.d))
        assert result.loss == pytest.approx(np.mean(expected), rel=1e-6), step
    # loss.d holds only the last micro-batch's loss, the result all of them
    assert accum_grad == 1 or float(net.loss.d) != pytest.approx(result.loss)


def test_a_non_finite_loss_is_the_step_loss():
    net = Net("float")
    net.bad = {1}
    updater = DynamicLossScalingUpdater(net.solver(), net.loss, net.feeder, scale=8.0)
    first, second = updater.update(), updater.update()
    assert math.isfinite(first.loss) and not math.isfinite(second.loss)
    assert second.skipped


def _twin_losses(twin, steps, accum_grad):
    """Each micro-batch's loss of the first ``steps`` steps, by step, as ``twin`` (the same
    model, unchanged by training at lr=0) computes them on the same batches."""
    losses = []
    for step in range(steps):
        losses.append([])
        for micro in range(accum_grad):
            twin.feed(step * accum_grad + micro)
            twin.loss.forward()
            losses[-1].append(float(twin.loss.d))
    return losses


@pytest.mark.parametrize("accum_grad", [1, 2])
def test_each_result_keeps_its_own_loss_after_later_steps(accum_grad):
    """Results are read after later steps ran: each keeps its own step's losses."""
    net, twin = Net("float", scope="net"), Net("float", scope="twin")
    updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.0), net.loss, net.feeder,
                                        scale=8.0, accum_grad=accum_grad)
    results = [updater.update() for _ in range(4)]
    losses = _twin_losses(twin, 4, accum_grad)
    expected = [np.mean(step) for step in losses]
    assert len(set(expected)) == 4                  # the batches give different losses
    assert [r.loss for r in results] == pytest.approx(expected, rel=1e-6)
    # loss.d still shows the last micro-batch's loss, as nnabla users read it
    assert float(net.loss.d) == pytest.approx(losses[-1][-1], rel=1e-6)


def test_a_skipped_step_reads_its_loss_before_anything_runs_the_graph_again():
    """After a skip the diagnosis may run forward passes of the loss (and so may the
    user): a skipped step's result has read its loss already."""
    net = Net("half")
    net.large = {0}                    # finite loss, gradients overflow at this scale
    updater = FixedLossScalingUpdater(net.solver("Sgd", lr=0.0), net.loss, net.feeder,
                                      scale=4096.0)
    result = updater.update()
    assert result.skipped and not result.bad_batch
    net.feed(1)
    net.loss.forward()                 # another batch, into the step's loss array
    other, seen = float(net.loss.d), result.loss
    net.feed(0)
    net.loss.forward()                 # the step's own batch again
    assert other != pytest.approx(float(net.loss.d))
    assert seen == pytest.approx(float(net.loss.d), rel=1e-3)


def test_a_result_built_by_hand_has_no_loss():
    from nnabla_mpt import StepResult
    assert math.isnan(StepResult(step=0, skipped=False, scale=1.0, next_scale=1.0).loss)


@pytest.mark.parametrize("accum_grad", [1, 2])
def test_a_loss_computed_in_place_is_read_after_each_forward_pass(accum_grad):
    """F.reshape of the loss writes into its input's array: a new array for the loss
    would never be written, so such a loss is read at once."""
    net, twin = Net("float", scope="net"), Net("float", scope="twin")
    with nn.context_scope(net.ctx):
        loss = F.reshape(net.loss, (1,))             # in place by default
    updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.0), loss, net.feeder,
                                        scale=8.0, accum_grad=accum_grad)
    results = [updater.update() for _ in range(3)]
    losses = _twin_losses(twin, 3, accum_grad)
    assert [r.loss for r in results] == pytest.approx([np.mean(v) for v in losses], rel=1e-6)
    assert float(loss.d[0]) == pytest.approx(losses[-1][-1], rel=1e-6)    # loss.d as before


def test_reading_the_loss_leaves_its_array_in_its_dtype():
    net = Net("half")
    updater = FixedLossScalingUpdater(net.solver(), net.loss, net.feeder, scale=8.0)
    result = updater.update()
    assert math.isfinite(result.loss)
    assert net.loss.data.dtype == np.float16


def test_losses_of_both_signs_of_infinity_sum_to_nan():
    arrays = [nn.NdArray((1,)), nn.NdArray((1,))]
    for array, value in zip(arrays, (np.inf, -np.inf)):
        array.data = np.array([value], dtype=np.float32)
    losses = StepLosses(arrays)
    assert math.isnan(losses.total()) and math.isnan(losses.mean())


def test_a_result_copies_and_pickles_with_its_loss():
    net = Net("float")
    updater = DynamicLossScalingUpdater(net.solver(), net.loss, net.feeder, scale=8.0)
    result = updater.update()
    for copied in (copy.deepcopy(result), pickle.loads(pickle.dumps(result))):
        assert copied.loss == result.loss and copied.step == result.step
    assert dataclasses.asdict(result)["step"] == result.step


def test_arrays_of_results_nobody_holds_are_written_again_and_kept_ones_are_not():
    net, twin = Net("float", scope="net"), Net("float", scope="twin")
    updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.0), net.loss, net.feeder,
                                        scale=8.0, accum_grad=2)
    ring = updater._passes[id(net.loss)][0]._ring
    # ids: holding the objects would keep them from reuse
    first = [id(losses) for losses in ring]
    first_arrays = [id(a) for losses in ring for a in losses.values]
    expected = [np.mean(v) for v in _twin_losses(twin, 6, 2)]
    kept = None
    for step in range(6):
        result = updater.update()
        # read at once: a step writing the ring's losses again forgets the last read
        assert result.loss == pytest.approx(expected[step], rel=1e-6), f"step {step}"
        if step == 2:
            kept = result
    del result
    # two steps' losses, written again step after step; the ones the kept result holds
    # (step 2's) were replaced in the ring, and step 4 wrote new ones
    assert len(ring) == 2
    assert [id(losses) == i for losses, i in zip(ring, first)] == [True, False]
    assert [id(a) for a in ring[0].values] == first_arrays[:2]
    assert kept._losses not in ring and id(kept._losses) == first[1]
    assert not any(a is k for losses in ring for a in losses.values
                   for k in kept._losses.values)
    kept._losses.forget()                   # read its arrays again
    assert kept.loss == pytest.approx(expected[2], rel=1e-6)


def test_a_mean_set_is_the_steps_loss_over_its_own_values():
    """The ranks' mean replaces the one this rank's values give (``set_mean``)."""
    losses = StepLosses([1.0, 3.0])
    losses.set_mean(5.0)
    assert (losses.mean(), losses.total()) == (5.0, 4.0)

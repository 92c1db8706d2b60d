"""The backward pass seeded with an array of the scale (seed.py) gives what
``loss.backward(scale)`` gives, bit for bit, and the array stays as it was filled."""
import numpy as np
import pytest

import nnabla.functions as F

from nnabla_mpt import DynamicLossScale, DynamicLossScalingUpdater, FixedLossScalingUpdater
from nnabla_mpt.core.dtypes import held_scale
from nnabla_mpt.step.micro_batch import BackwardSeed
from support import Net, assert_bitwise_equal


def _grads(net):
    return {name: np.array(v.g, copy=True) for name, v in net.params.items()}


@pytest.mark.parametrize("clear_buffer", [False, True])
@pytest.mark.parametrize("scale", [1.0, 8.0, 3.0e4, 2.0 ** 17])
@pytest.mark.parametrize("type_config", ["float", "half"])
def test_a_seeded_pass_gives_the_gradients_of_a_number(type_config, scale, clear_buffer):
    net, twin = (Net(type_config, hidden=4, scope=s) for s in ("net", "twin"))
    seed = BackwardSeed(net.loss)
    for batch in range(3):                  # the same array serves pass after pass
        for n in (net, twin):
            n.feed(batch)
            for v in n.params.values():
                v.grad.zero()
            n.loss.forward(clear_no_need_grad=clear_buffer)
        net.loss.backward(seed.at(scale), clear_buffer=clear_buffer)
        twin.loss.backward(scale, clear_buffer=clear_buffer)
        assert_bitwise_equal(_grads(net), _grads(twin))
    # 2**17 overflows a float16 seed: inf gradients, as the number gives them
    overflowed = not all(np.isfinite(g).all() for g in _grads(net).values())
    assert overflowed == (type_config == "half" and scale > 65504)
    # the array holds the scale as the pass read it, in the loss's dtype, still
    dtype = np.float16 if type_config == "half" else np.float32
    with np.errstate(over="ignore"):
        assert np.asarray(seed.at(scale).data).tobytes() == dtype(scale).tobytes()


def test_the_seed_is_one_array_while_the_scale_stays():
    seed = BackwardSeed(Net("float").loss)
    first = seed.at(8.0)
    assert seed.at(8.0) is first
    second = seed.at(16.0)
    assert second is not first and float(second.data) == 16.0
    assert float(first.data) == 8.0          # an array handed out is never refilled


def test_updater_steps_match_passes_seeded_with_numbers_while_the_scale_moves():
    """A float16 run whose scale grows and backs off (an overflowing batch every few
    steps), with clear_buffer and a loss computed in place: each step's parameters are
    those of the same steps run by hand with ``loss.backward(scale)``."""
    net, twin = (Net("half", scope=s) for s in ("net", "twin"))
    for n in (net, twin):
        n.large = {3, 4, 9}
        n.loss = F.reshape(n.loss, ())           # computed in place (shares its input)
    updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.05), net.loss, net.feeder,
                                        scale=1024.0, N=2,
                                        clear_buffer=True)
    solver = twin.solver("Sgd", lr=0.05)
    scales, skipped = set(), 0
    for step in range(12):
        result = updater.update()
        scales.add(result.scale)
        skipped += result.skipped
        solver.zero_grad()
        twin.feeder()
        twin.loss.forward(clear_no_need_grad=True)
        twin.loss.backward(result.scale, clear_buffer=True)
        assert solver.check_inf_or_nan_grad() == result.skipped, step
        if not result.skipped:
            solver.scale_grad(1.0 / result.scale)
            solver.update()
        assert_bitwise_equal(net.snapshot(), twin.snapshot())
    assert len(scales) >= 3 and skipped >= 2


# Scales the loss's dtype cannot hold: float16 holds 3000.7 as 3000.0 and 17496 as 17504
# (0.02% and 0.05% off), float32 holds 3000.7 as 3000.69995...; 614.4 is 2048 * 0.3.
NOT_HELD = [("half", 3000.7), ("half", 17496.0), ("half", 614.4), ("float", 3000.7)]
NUMPY_TYPE = {"half": np.float16, "float": np.float32}


@pytest.mark.parametrize("type_config, scale", NOT_HELD)
def test_held_is_the_value_the_seed_holds(type_config, scale):
    net = Net(type_config, hidden=4)
    seed = BackwardSeed(net.loss)
    net.feed(0)
    net.loss.forward()
    net.loss.backward(seed.at(scale))
    held = float(np.asarray(seed.at(scale).data).ravel()[0])
    assert seed.held == held == float(NUMPY_TYPE[type_config](scale)) != scale
    assert held_scale(scale, np.dtype(NUMPY_TYPE[type_config]).name) == held


@pytest.mark.parametrize("type_config, scale", NOT_HELD)
@pytest.mark.parametrize("updater_type", [DynamicLossScalingUpdater, FixedLossScalingUpdater])
def test_the_gradients_are_divided_by_the_scale_the_seed_held(type_config, scale,
                                                              updater_type):
    """Each step's parameters are those of a hand loop that seeds ``backward(scale)`` and
    divides the gradients by the scale rounded to the loss's dtype, bit for bit."""
    net, twin = (Net(type_config, hidden=4, scope=s) for s in ("net", "twin"))
    updater = updater_type(net.solver("Sgd", lr=0.05), net.loss, net.feeder, scale=scale)
    solver = twin.solver("Sgd", lr=0.05)
    held = float(NUMPY_TYPE[type_config](scale))
    for step in range(3):
        result = updater.update()
        assert (result.updated, result.scale) == (True, scale), step
        solver.zero_grad()
        twin.feeder()
        twin.loss.forward()
        twin.loss.backward(scale)
        solver.scale_grad(1.0 / held)
        solver.update()
        assert_bitwise_equal(net.snapshot(), twin.snapshot())


def test_a_scale_reached_by_backoff_and_growth_is_divided_out_as_held():
    """Backing off by 0.3 and growing by 1.5 from 1024 reaches scales float16 cannot hold
    (307.2, 460.8, ...): every step matches a hand loop dividing by the held value."""
    net, twin = (Net("half", scope=s) for s in ("net", "twin"))
    for n in (net, twin):
        n.large = {2, 7}                # overflows at 1024, not at 307.2
    updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.05), net.loss, net.feeder,
                                        policy=DynamicLossScale(
                                            init_scale=1024.0, growth_factor=1.5,
                                            backoff_factor=0.3, growth_interval=2))
    solver = twin.solver("Sgd", lr=0.05)
    scales = []
    for step in range(10):
        result = updater.update()
        scales.append(result.scale)
        solver.zero_grad()
        twin.feeder()
        twin.loss.forward()
        twin.loss.backward(result.scale)
        assert solver.check_inf_or_nan_grad() == result.skipped, step
        if not result.skipped:
            solver.scale_grad(1.0 / float(np.float16(result.scale)))
            solver.update()
        assert_bitwise_equal(net.snapshot(), twin.snapshot())
    assert sum(float(np.float16(s)) != s for s in scales) >= 3, scales

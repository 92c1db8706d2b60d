"""Real float16 overflow in the half-precision CPU context."""
import math
import sys

import numpy as np
import pytest

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla.solvers as S

from nnabla_mpt import (DynamicLossScale, DynamicLossScalingUpdater, FixedLossScalingUpdater,
                        OverflowDetector, OverflowHandling)
from nnabla_mpt.core.dtypes import FLOATS
from support import (Net, assert_bitwise_equal, assert_states_bitwise_equal, context,
                     raises_naming, solver_states)

FP16_MAX = 65504.0


def _half_net(scope="net", **kwargs):
    return Net("half", hidden=4, scope=scope, **kwargs)


def _half_linear_net(scope="net"):
    """Linear: a batch in ``net.large`` (x * 20) keeps a finite float16 loss but its
    gradients overflow at ``LARGE_OVERFLOWS`` and above, where ordinary batches do not
    (largest gradient per unit of scale: 28 to 152 for large batches, below 2 otherwise)."""
    return Net("half", scope=scope)


LARGE_OVERFLOWS = 4096.0


def _assert_equals_one_clean_step(net, solver, batch):
    """``net`` and its Adam ``solver`` hold exactly what one clean step on ``batch`` from
    the initial parameters gives (checked against a fresh copy of the net)."""
    clean = _half_linear_net(scope="clean")
    clean_solver = clean.solver("Adam", alpha=1e-2)
    clean.calls = batch
    FixedLossScalingUpdater(clean_solver, clean.loss, clean.feeder,
                            scale=LARGE_OVERFLOWS).update()
    assert_bitwise_equal(net.snapshot(), clean.snapshot())
    assert_states_bitwise_equal(solver_states(solver), solver_states(clean_solver))


def _all_finite(params):
    return all(np.isfinite(v.d).all() for v in params.values())


@pytest.mark.parametrize("kind, hp", [("Adam", dict(alpha=1e-2)),
                                      ("Momentum", dict(lr=0.05, momentum=0.9))])
def test_overflowing_steps_are_skipped_bitwise_and_the_scale_recovers(kind, hp):
    net = _half_linear_net()
    solver = net.solver(kind, **hp)
    # floor_policy="ignore": no diagnosis replay, which would overwrite the gradients that
    # are inspected below.
    updater = DynamicLossScalingUpdater(solver, net.loss, net.feeder, scale=256.0, N=1000,
                                        overflow=OverflowHandling(floor_policy="ignore"))
    for _ in range(2):                          # non-trivial solver states first
        assert updater.update().updated
    params, states = net.snapshot(), solver_states(solver)
    updater.scale = 2.0 ** 15                   # the largest float16 scale
    net.large = set(range(2, 100))              # batches whose gradients overflow there

    skipped = []
    while True:
        r = updater.update()
        if not r.skipped:
            break
        skipped.append(r)
        assert r.next_scale == r.scale * 0.5
        # The gradients really overflowed in float16 ...
        assert OverflowDetector().nonfinite_params(net.params)
        # ... and nothing was touched.
        assert_bitwise_equal(net.snapshot(), params)
        assert_states_bitwise_equal(solver_states(solver), states)
        assert len(skipped) < 20
    assert [s.scale for s in skipped] == [2.0 ** (15 - i) for i in range(len(skipped))]
    assert len(skipped) >= 4                    # 2**15 .. LARGE_OVERFLOWS certainly overflow
    assert r.scale == 2.0 ** (15 - len(skipped)) and r.step == 2 + len(skipped)
    # Recovery: the step updated, with finite values.
    after = net.snapshot()
    assert any(not np.array_equal(after[k], params[k]) for k in params)
    assert _all_finite(net.params)
    assert all(t == 3 for t, _ in solver_states(solver).values())
    assert (updater.steps, updater.updates, updater.skipped_steps) == (
        3 + len(skipped), 3, len(skipped))
    assert updater.overflow_streak == 0
    assert updater.longest_overflow_streak == len(skipped)


def test_the_same_scale_does_not_overflow_in_float():
    """Control for the test above: the overflow comes from float16, not from the model."""
    net = Net("float", hidden=4)
    updater = DynamicLossScalingUpdater(net.solver("Adam", alpha=1e-2), net.loss, net.feeder,
                                        scale=2.0 ** 24, N=1000)
    r = updater.update()
    assert not r.skipped and r.next_scale == 2.0 ** 24


def test_fixed_updater_with_check_skips_and_keeps_the_scale():
    net = _half_linear_net()
    net.large = set(range(3))
    solver = net.solver("Adam", alpha=1e-2)
    updater = FixedLossScalingUpdater(solver, net.loss, net.feeder, scale=LARGE_OVERFLOWS)
    params, states = net.snapshot(), solver_states(solver)
    for i in range(3):
        r = updater.update()
        assert (r.step, r.skipped, r.scale, r.next_scale, r.attempts) == (
            i, True, LARGE_OVERFLOWS, LARGE_OVERFLOWS, 1)
    assert updater.scale == LARGE_OVERFLOWS
    assert_bitwise_equal(net.snapshot(), params)
    assert_states_bitwise_equal(solver_states(solver), states)
    assert (updater.steps, updater.updates, updater.skipped_steps, updater.overflow_streak,
            updater.longest_overflow_streak) == (3, 0, 3, 3, 3)


def test_fixed_updater_without_check_updates_anyway():
    net = _half_linear_net()
    net.large = {0}
    solver = net.solver("Sgd", lr=0.1)
    updater = FixedLossScalingUpdater(solver, net.loss, net.feeder, scale=LARGE_OVERFLOWS,
                                      enable_overflow_check=False)
    params = net.snapshot()
    r = updater.update()
    assert r.skipped is False and r.updated
    assert (updater.updates, updater.skipped_steps) == (1, 0)
    # The overflowed gradients went into the parameters.
    assert not _all_finite(net.params)
    assert any(not np.array_equal(v.d, params[k], equal_nan=True)
               for k, v in net.params.items())


@pytest.mark.parametrize("mode, skipped", [("inf_nan", False), ("saturation", True)])
def test_saturation_mode_counts_large_finite_gradients_as_overflow(mode, skipped):
    # float context: gradients of ~1e5 stay finite but are beyond float16's maximum.
    net = Net("float")
    updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.1), net.loss, net.feeder,
                                        scale=2.0 ** 20, N=1000,
                                        overflow=OverflowHandling(mode=mode))
    params = net.snapshot()
    r = updater.update()
    grads = np.concatenate([v.g.ravel() for v in net.params.values()])
    if not skipped:
        grads = grads * r.scale                 # an update unscales the gradients in place
    assert np.isfinite(grads).all() and np.abs(grads).max() >= FP16_MAX
    assert r.skipped is skipped
    if skipped:
        assert r.next_scale == 2.0 ** 19
        assert_bitwise_equal(net.snapshot(), params)
        assert OverflowDetector(mode).nonfinite_params(net.params)
    else:
        assert r.next_scale == 2.0 ** 20
        assert not np.array_equal(net.params["out/affine/W"].d, params["out/affine/W"])
        assert OverflowDetector(mode).nonfinite_params(net.params) == []


def test_detector_threshold_boundaries_on_solver_gradients():
    net = Net("float")
    solver = net.solver("Sgd", lr=0.1)
    W, b = net.params["out/affine/W"], net.params["out/affine/b"]
    sat, inf_nan = OverflowDetector("saturation"), OverflowDetector("inf_nan")

    def set_grads(w_value, b_value=0.0):
        W.g = np.full(W.shape, 0.5, dtype=np.float32)
        W.g[0, 0] = w_value
        b.g = np.full(b.shape, b_value, dtype=np.float32)

    set_grads(65000.0)
    assert not sat.check(solver) and not inf_nan.check(solver)
    set_grads(-FP16_MAX)
    assert sat.check(solver) and not inf_nan.check(solver)
    assert sat.nonfinite_params(net.params) == ["out/affine/W"]
    assert inf_nan.nonfinite_params(net.params) == []
    set_grads(np.inf)
    assert sat.check(solver) and inf_nan.check(solver)
    set_grads(0.0, np.nan)
    assert sat.check(solver) and inf_nan.check(solver)
    assert sat.nonfinite_params(net.params) == inf_nan.nonfinite_params(net.params) == [
        "out/affine/b"]
    # An explicit list of gradients is checked instead of the solver's.
    set_grads(np.inf)
    assert not inf_nan.check(solver, grads=[b.grad])
    assert inf_nan.check(solver, grads=[b.grad, W.grad])
    assert OverflowDetector("saturation", threshold=0.25).check(solver, grads=[b.grad]) is False
    set_grads(0.0, 0.3)
    assert OverflowDetector("saturation", threshold=0.25).check(solver, grads=[b.grad])


def test_nonfinite_params_names_exactly_the_overflowing_parameters():
    """Two branches; in float16 only the weight of the second overflows."""
    ctx = context("half")
    with nn.context_scope(ctx):
        x1, x2 = nn.Variable((4, 3)), nn.Variable((4, 3))
        ya = PF.affine(x1, 2, name="a")
        yb = PF.affine(x2, 2, name="b")
        loss = F.mean(ya ** 2) + F.mean(yb ** 2)
        solver = S.Sgd(0.01)
    params = nn.get_parameters()
    solver.set_parameters(params)
    rng = np.random.RandomState(0)
    x1.d = rng.randn(4, 3)
    x2.d = np.full((4, 3), 30.0)
    params["a/affine/W"].d = rng.uniform(-0.5, 0.5, (3, 2))
    params["a/affine/b"].d = 0.0
    params["b/affine/W"].d = 0.5
    params["b/affine/b"].d = 0.0
    # yb = 45 everywhere; at scale 64: d yb = 2 * 45 / 8 * 64 = 720, d b = 2880 (finite),
    # d W = 30 * 2880 = 86400 > 65504 -> inf in float16.
    updater = FixedLossScalingUpdater(solver, loss, scale=64.0)
    before = {k: np.array(v.d) for k, v in params.items()}
    r = updater.update()
    assert r.skipped
    assert OverflowDetector().nonfinite_params(params) == ["b/affine/W"]
    assert np.isfinite(params["b/affine/b"].g).all()
    assert np.abs(params["b/affine/b"].g).max() == 2880.0
    assert OverflowDetector("saturation", threshold=2000.0).nonfinite_params(params) == [
        "b/affine/W", "b/affine/b"]
    assert_bitwise_equal({k: np.array(v.d) for k, v in params.items()}, before)
    # At scale 32 the same network does not overflow: d W = 43200.
    updater.scale = 32.0
    assert updater.update().updated
    assert OverflowDetector().nonfinite_params(params) == []


# -- retry mode -------------------------------------------------------------------------------

def test_retry_returns_the_first_updated_step():
    net = _half_linear_net()
    net.large = {0, 1, 2}
    solver = net.solver("Adam", alpha=1e-2)
    updater = FixedLossScalingUpdater(solver, net.loss, net.feeder, scale=LARGE_OVERFLOWS,
                                      overflow=OverflowHandling(max_retries=5))
    r = updater.update()
    assert (r.skipped, r.attempts, r.step, r.scale) == (False, 4, 3, LARGE_OVERFLOWS)
    assert net.calls == 4
    assert (updater.steps, updater.updates, updater.skipped_steps, updater.overflow_streak,
            updater.longest_overflow_streak) == (4, 1, 3, 0, 3)
    # The result equals one clean step on batch 3: nothing of the skipped attempts remains.
    _assert_equals_one_clean_step(net, solver, batch=3)


def test_retry_counts_attempts_with_accumulation_and_a_dynamic_scale():
    net = _half_linear_net()
    net.large = {1, 2}                          # attempts 1 (batches 0, 1) and 2 (2, 3)
    updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.1), net.loss, net.feeder,
                                        scale=2 * LARGE_OVERFLOWS, N=1000, accum_grad=2,
                                        overflow=OverflowHandling(max_retries=3))
    r = updater.update()
    assert (r.skipped, r.attempts, r.step, r.scale, r.next_scale) == (
        False, 3, 2, LARGE_OVERFLOWS / 2, LARGE_OVERFLOWS / 2)
    assert net.calls == 6
    r = updater.update()
    assert (r.skipped, r.attempts, r.step) == (False, 1, 3)
    assert net.calls == 8


@pytest.mark.parametrize("max_retries", [0, 1, 3])
def test_retry_gives_up_after_exactly_max_retries_plus_one_attempts(max_retries):
    net = _half_linear_net()
    net.large = set(range(100))
    solver = net.solver("Momentum", lr=0.1, momentum=0.9)
    # From the largest float16 scale, backing off by 3/4 keeps the scale above
    # LARGE_OVERFLOWS for 8 steps: every attempt overflows.
    updater = DynamicLossScalingUpdater(solver, net.loss, net.feeder,
                                        policy=DynamicLossScale(
                                            init_scale=2.0 ** 15, backoff_factor=0.75,
                                            growth_interval=1000),
                                        overflow=OverflowHandling(max_retries=max_retries))
    scales = [2.0 ** 15]
    for _ in range(8):
        scales.append(scales[-1] * 0.75)
    assert scales[7] > LARGE_OVERFLOWS
    params, states = net.snapshot(), solver_states(solver)
    k = max_retries + 1
    r = updater.update()
    assert (r.skipped, r.attempts, r.step) == (True, k, k - 1)
    assert (r.scale, r.next_scale) == (scales[k - 1], scales[k])
    assert net.calls == k
    r = updater.update()
    assert (r.skipped, r.attempts, r.step) == (True, k, 2 * k - 1)
    assert net.calls == 2 * k
    assert updater.scale == scales[2 * k]
    assert (updater.steps, updater.updates, updater.skipped_steps, updater.overflow_streak,
            updater.longest_overflow_streak) == (2 * k, 0, 2 * k, 2 * k, 2 * k)
    assert_bitwise_equal(net.snapshot(), params)
    assert_states_bitwise_equal(solver_states(solver), states)


def test_retry_is_iterative_not_recursive():
    net = Net("float")                          # float keeps this many steps fast
    net.bad = set(range(5000))
    retries = sys.getrecursionlimit() + 100
    updater = FixedLossScalingUpdater(net.solver("Sgd", lr=0.1), net.loss, net.feeder,
                                      scale=1.0,
                                      overflow=OverflowHandling(
                                          max_retries=retries, floor_policy="ignore"))
    r = updater.update()
    assert (r.skipped, r.attempts) == (True, retries + 1)
    assert net.calls == retries + 1


def test_stale_overflow_does_not_leak_into_the_next_step():
    net = _half_linear_net()
    net.large = {0}
    solver = net.solver("Adam", alpha=1e-2)
    updater = FixedLossScalingUpdater(solver, net.loss, net.feeder, scale=LARGE_OVERFLOWS)
    assert updater.update().skipped
    assert np.isfinite(net.loss.d).all()                     # the gradients overflowed
    assert OverflowDetector().nonfinite_params(net.params)     # inf left in the gradients
    assert updater.update().updated
    assert _all_finite(net.params)
    _assert_equals_one_clean_step(net, solver, batch=1)


def test_a_step_whose_loss_and_gradients_overflow_is_skipped_keeping_the_scale():
    net = _half_linear_net()
    net.huge = {1}          # x * 1e3: the float16 loss itself is inf, and the gradients
    solver = net.solver("Adam", alpha=1e-2)
    updater = DynamicLossScalingUpdater(solver, net.loss, net.feeder, scale=64.0, N=1000)
    assert updater.update().updated
    params, states = net.snapshot(), solver_states(solver)
    r = updater.update()
    assert not np.isfinite(net.loss.d).all()
    assert (r.skipped, r.scale, r.next_scale) == (True, 64.0, 64.0)
    assert_bitwise_equal(net.snapshot(), params)
    assert_states_bitwise_equal(solver_states(solver), states)
    assert updater.update().updated


def test_a_scale_the_float16_loss_cannot_seed_is_never_used():
    # backward(scale) seeds the pass in the loss's dtype: 2**16 is inf in float16 whatever
    # the data. The dynamic updater starts at 2**15 instead (one info line) and never grows
    # beyond it; the fixed one refuses such a scale.
    net = _half_linear_net()
    updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.01), net.loss, net.feeder,
                                        scale=2.0 ** 20, N=1)
    assert updater.policy.max_scale == 2.0 ** 15
    results = [updater.update() for _ in range(4)]
    assert [(r.scale, r.skipped) for r in results] == [(2.0 ** 15, False)] * 4
    with raises_naming(ValueError, "scale=65536.0", "above 32768", "largest power of two",
                       "the loss's dtype", "backward(scale)", "scale <= 32768"):
        FixedLossScalingUpdater(net.solver(), net.loss, scale=2.0 ** 16)
    assert FixedLossScalingUpdater(net.solver(), net.loss, scale=2.0 ** 15).scale == 2.0 ** 15
    with raises_naming(ValueError, "min_scale=65536.0", "above 32768", "largest power of two"):
        DynamicLossScalingUpdater(net.solver(), net.loss,
                                  policy=DynamicLossScale(
                                      init_scale=2.0 ** 17, min_scale=2.0 ** 16,
                                      max_scale=2.0 ** 18))


def test_the_ceiling_of_a_float32_loss_is_two_to_the_127():
    net = Net("float")
    updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.0), net.loss, net.feeder,
                                        policy=DynamicLossScale(
                                            init_scale=2.0 ** 126, growth_interval=1,
                                            max_scale=1e300))
    assert updater.policy.max_scale == 2.0 ** 127
    scales = [updater.update().next_scale for _ in range(3)]
    assert scales == [2.0 ** 127] * 3


@pytest.mark.parametrize("kwargs, name, value", [
    (dict(init_scale=2.0 ** -30, min_scale=2.0 ** -30), "scale", "9.313225746154785e-10"),
    (dict(init_scale=1.0, min_scale=1e-300), "min_scale", "1e-300"),
    (dict(init_scale=1.0, min_scale=2.0 ** -25), "min_scale", "2.9802322387695312e-08"),
])
def test_a_scale_that_is_zero_in_float16_is_refused_naming_it(kwargs, name, value):
    # backward(scale) seeds the pass in float16, where these scales are 0: every gradient
    # would be 0 and every step an update that changes nothing
    net = _half_linear_net()
    with raises_naming(ValueError, f"{name}={value}", "below 5.96046e-08",
                       "smallest positive float16", "the loss's dtype",
                       "every gradient would be 0", f"{name} >= 5.96046e-08"):
        DynamicLossScalingUpdater(net.solver(), net.loss, net.feeder,
                                  policy=DynamicLossScale(**kwargs))
    smallest = DynamicLossScalingUpdater(net.solver(), net.loss, net.feeder,
                                         policy=DynamicLossScale(
                                             init_scale=2.0 ** -24, min_scale=2.0 ** -24))
    assert smallest.policy.min_scale == 2.0 ** -24


def test_a_float32_loss_takes_the_small_scales_float32_holds():
    net = Net("float")
    before = net.snapshot()
    updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.1), net.loss, net.feeder,
                                        policy=DynamicLossScale(
                                            init_scale=2.0 ** -30, min_scale=2.0 ** -30))
    assert updater.update().updated
    assert all((net.snapshot()[name] != before[name]).any() for name in before)
    DynamicLossScalingUpdater(net.solver(), net.loss,
                              policy=DynamicLossScale(
                                  init_scale=2.0 ** -149, min_scale=2.0 ** -149))
    with raises_naming(ValueError, "min_scale=1e-300", "below 1.4013e-45",
                       "smallest positive float32", "min_scale >= 1.4013e-45"):
        DynamicLossScalingUpdater(net.solver(), net.loss,
                                  policy=DynamicLossScale(init_scale=1.0, min_scale=1e-300))


@pytest.mark.parametrize("name", ["float16", "float32", "float64"])
def test_the_smallest_positive_value_of_each_dtype(name):
    assert FLOATS[name].smallest == float(np.finfo(name).smallest_subnormal)
    assert float(np.array(FLOATS[name].smallest / 2, dtype=name)) == 0.0


def _summed_half_net(scope):
    """``loss = sum(x W + b)`` in float16 over 128 rows of x in [0.5, 1) and W of 600 and
    more: every row is finite, their sum (over 76800) is not, and the gradients (the
    column sums of x, 128 for b, times the scale) are."""
    with nn.context_scope(context("half")), nn.parameter_scope(scope):
        x = nn.Variable((128, 2))
        y = PF.affine(x, 1, name="fc")
        loss = F.sum(y)
        params = nn.get_parameters(grad_only=False)
    params["fc/affine/W"].d = np.array([[600.0], [700.0]], dtype=np.float32)
    params["fc/affine/b"].d = np.zeros(1, dtype=np.float32)
    rng = np.random.RandomState(3)

    def feed():
        x.d = rng.uniform(0.5, 1.0, x.shape).astype(np.float32)

    with nn.context_scope(context("half")):
        solver = S.Sgd(lr=1e-4)
    solver.set_parameters(params)
    return loss, params, solver, feed


def test_an_inf_loss_with_finite_gradients_updates_and_counts_as_a_good_step():
    """The gradients decide, as in nnabla's own updater: a loss that overflows in the
    forward pass alone does not make the gradients wrong."""
    loss, params, solver, feed = _summed_half_net("net")
    twin, twin_params, twin_solver, twin_feed = _summed_half_net("twin")
    start = {k: np.array(v.d, copy=True) for k, v in params.items()}
    updater = DynamicLossScalingUpdater(solver, loss, feed, scale=8.0, N=2)
    for step in range(3):
        good_steps = updater.policy.good_steps
        r = updater.update()
        assert (r.updated, r.skipped, r.bad_batch) == (True, False, False), step
        assert r.loss == math.inf and math.isinf(float(loss.d)), step
        assert updater.policy.good_steps == (good_steps + 1) % 2, step
        twin_solver.zero_grad()
        twin_feed()
        twin.forward()
        twin.backward(r.scale)
        assert not twin_solver.check_inf_or_nan_grad(), step       # finite gradients
        twin_solver.scale_grad(1.0 / r.scale)                       # powers of two
        twin_solver.update()
        assert_bitwise_equal({k: v.d for k, v in params.items()},
                             {k: v.d for k, v in twin_params.items()})
    assert [updater.steps, updater.updates, updater.skipped_steps] == [3, 3, 0]
    assert r.next_scale == updater.scale == 16.0            # grown after N=2 good steps
    assert not np.array_equal(params["fc/affine/W"].d, start["fc/affine/W"])

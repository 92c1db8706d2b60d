"""Global-norm clipping where the squared norm of the scaled gradients overflows, or even
that of the unscaled ones (finite gradients are clipped, never skipped: the norm is scaled
by the largest magnitude), and the saturation check, on real graphs (float16 on the CPU
for the half ones).

The reference of a clipped step reads the scaled gradients the graph produces for the
step's batch (the same forward and backward pass the updater runs), then in float64:
unscale, the global L2 norm, the clip factor ``min(1, clip / norm)``, and SGD's update
``w - lr * g * factor``.
"""
import numpy as np
import pytest

import nnabla as nn
import nnabla.functions as F
import nnabla.solvers as S

from nnabla_mpt import (DynamicLossScalingUpdater, FixedLossScalingUpdater, OverflowDetector,
                        OverflowHandling)
from support import (Net, assert_bitwise_equal, assert_states_bitwise_equal, context,
                     solver_states)

LR = 0.5


def scaled_grads(net, solver, scale):
    """The gradients the graph produces for the batch in place, seeded with ``scale``,
    as float64 (the forward and backward pass the updater runs)."""
    solver.zero_grad()
    net.loss.forward()
    net.loss.backward(scale)
    return {name: v.g.astype(np.float64) for name, v in net.params.items()}


def reference_step(params, grads, scale, clip):
    """SGD's step on the unscaled gradients clipped to the global norm ``clip``, in
    float64; returns the new parameters and the clip factor."""
    unscaled = {name: g / scale for name, g in grads.items()}
    norm = np.sqrt(sum(np.sum(g * g) for g in unscaled.values()))
    factor = min(1.0, clip / norm)
    return {name: params[name].astype(np.float64) - LR * g * factor
            for name, g in unscaled.items()}, factor


# half: a 512x512 layer, whose scaled float16 gradients square to more than 65504; a bound
# of 1e6 is never reached (factor 1), one of 0.1 always is.
# float: gradients of 1e12 to 5e12 at scale 2**24, which, scaled, square to more than 3.4e38;
# the bound (1 or 0.1) is always reached.
CASES = [("half", 512, 1.0, 2.0 ** 10, 1e6), ("half", 512, 1.0, 2.0 ** 10, 0.1),
         ("float", 3, 3e6, 2.0 ** 24, 1.0), ("float", 3, 3e6, 2.0 ** 24, 0.1)]


@pytest.mark.parametrize("precision, size, x_scale, scale, clip", CASES)
def test_a_clipped_step_matches_the_float64_reference_where_the_scaled_norm_overflows(
        precision, size, x_scale, scale, clip):
    net = Net(precision, batch=4, d_in=size, d_out=size)
    solver = net.solver("Sgd", lr=LR)
    updater = FixedLossScalingUpdater(solver, net.loss, scale=scale,
                                      clip_grad_norm=clip)
    factors = []
    for step in range(3):
        x, t = net.batch(step)
        net.x.d, net.t.d = x * np.float32(x_scale), t
        before = net.snapshot()
        grads = scaled_grads(net, solver, scale)
        assert all(np.isfinite(g).all() for g in grads.values())
        dtype = np.float16 if precision == "half" else np.float32
        assert sum(np.sum(g * g) for g in grads.values()) > np.finfo(dtype).max
        expected, factor = reference_step(before, grads, scale, clip)
        factors.append(factor)
        result = updater.update()
        assert result.updated
        after = net.snapshot()
        # no silent no-op (the bias's clipped step may round away in float32)
        assert not np.array_equal(after["out/affine/W"], before["out/affine/W"]), step
        for name in after:
            # float32 parameters (|w| < 1): half an ulp is at most 6e-8; the step itself
            # (at most LR times the norm it is clipped to) is right to float32 rounding
            np.testing.assert_allclose(after[name], expected[name], rtol=1e-6, atol=1e-7,
                                       err_msg=f"step {step}, {name}")
    # clip=1e6 never clips (the unscaled norms are far below), clip=0.1 always does
    assert all(f == 1.0 for f in factors) if clip == 1e6 else all(f < 1.0 for f in factors)


def product_net(precision, x_values, w=1e-3):
    """``loss = sum(x * w)`` for a parameter ``w``: the gradient of ``w`` is
    ``scale * x``, whatever values ``x`` holds. Returns (solver, loss, x, w)."""
    with nn.context_scope(context(precision)):
        x = nn.Variable.from_numpy_array(np.asarray(x_values, dtype=np.float32))
        w_var = nn.parameter.get_parameter_or_create("w", x.shape, need_grad=True)
        w_var.d = w
        loss = F.sum(x * w_var)
        solver = S.Momentum(0.1, 0.9)
    solver.set_parameters({"w": w_var})
    return solver, loss, x, w_var


# A float32 graph at the scale 14563 and a batch with one spike: the scaled gradients stay
# finite (up to about 2.3e38), the unscaled norm is about 1.6e34, whose square (2.6e68)
# is far beyond float32's range (a norm beyond about 1.8e19 squares to more than 3.4e38).
# 3x2: the norm's graph; 512x256: NumPy's dot for the weight (131,072 elements on the CPU).
SPIKES = [(3, 2, 5.4e17), (512, 256, 1.35e18)]


@pytest.mark.parametrize("d_in, d_out, spike", SPIKES)
def test_a_finite_spike_whose_norm_squared_passes_float32_is_clipped_not_skipped(
        d_in, d_out, spike):
    net = Net("float", batch=4, d_in=d_in, d_out=d_out)
    solver = net.solver("Sgd", lr=LR)
    scale = 14563.0
    updater = DynamicLossScalingUpdater(solver, net.loss, scale=scale, clip_grad_norm=1.0)
    x, t = net.batch(0)
    x[0, 0] = spike
    net.x.d, net.t.d = x, t
    before = net.snapshot()
    grads = scaled_grads(net, solver, scale)
    assert all(np.isfinite(g).all() for g in grads.values())
    norm = np.sqrt(sum(np.sum((g / scale) ** 2) for g in grads.values()))
    assert 1e34 < norm < 2e34 and norm ** 2 > np.finfo(np.float32).max
    expected, factor = reference_step(before, grads, scale, 1.0)
    result = updater.update()
    # applied, the scale kept (a float32 sum of squares made the norm inf: the step was
    # skipped as an overflow and the scale backed off to 7281.5)
    assert result.updated and (result.scale, result.next_scale) == (scale, scale)
    assert (updater.skipped_steps, updater.updates, updater.overflow_streak) == (0, 1, 0)
    # the gradients the solver applied: the unscaled ones clipped to norm 1
    applied = np.sqrt(sum(np.sum(v.g.astype(np.float64) ** 2) for v in net.params.values()))
    assert applied == pytest.approx(1.0, rel=1e-6)
    after = net.snapshot()
    assert not np.array_equal(after["out/affine/W"], before["out/affine/W"])
    for name in after:
        np.testing.assert_allclose(after[name], expected[name], rtol=1e-6, atol=1e-7,
                                   err_msg=name)


# float16 layers whose scaled gradients (at most about 4e4) square to far more than 65504:
# 256x500 (128,000 elements) goes through the norm's graph in float32, 512x512 through
# NumPy on the CPU; a bound of 0.1 is always reached.
@pytest.mark.parametrize("d_in, d_out", [(256, 500), (512, 512)])
def test_a_large_float16_layer_clips_like_the_float64_reference(d_in, d_out):
    net = Net("half", batch=4, d_in=d_in, d_out=d_out)
    solver = net.solver("Sgd", lr=LR)
    scale = 2.0 ** 10
    updater = FixedLossScalingUpdater(solver, net.loss, scale=scale, clip_grad_norm=0.1)
    for step in range(2):
        x, t = net.batch(step)
        net.x.d, net.t.d = x * np.float32(20.0), t
        before = net.snapshot()
        grads = scaled_grads(net, solver, scale)
        peak = max(np.abs(g).max() for g in grads.values())
        assert np.isfinite(peak) and 1e4 < peak < 65504
        expected, factor = reference_step(before, grads, scale, 0.1)
        assert factor < 1e-2
        assert updater.update().updated
        applied = np.sqrt(sum(np.sum(v.g.astype(np.float64) ** 2)
                              for v in net.params.values()))
        assert applied == pytest.approx(0.1, rel=1e-3)       # float16 gradients
        after = net.snapshot()
        for name in after:
            np.testing.assert_allclose(after[name], expected[name], rtol=1e-6, atol=1e-7,
                                       err_msg=f"step {step}, {name}")


@pytest.mark.parametrize("clip", [1.0, 1e-3])       # 1e-3: a factor below float32's normals
@pytest.mark.parametrize("size", [4, 1 << 17])      # the graph; NumPy on the CPU
def test_finite_gradients_near_float32_s_largest_are_clipped_and_applied(size, clip):
    # At scale 4 the gradients are 8e37, finite in float32, and so are the unscaled ones,
    # 2e37: their norm (about 2.8e37) is finite, its square (8e74) is not even in float32.
    # The clip factor, clip / norm, is about 3.5e-38 or 3.5e-41 (a float32 subnormal).
    solver, loss, x, w = product_net("float", np.ones(size))
    updater = DynamicLossScalingUpdater(solver, loss, scale=4.0, clip_grad_norm=clip)
    assert updater.update().updated     # a first good step, so that Momentum holds a state
    params = w.d.copy()
    huge = np.ones(size, dtype=np.float32)
    huge[:2] = 2e37
    x.d = huge
    result = updater.update()
    assert result.updated and (result.scale, result.next_scale) == (4.0, 4.0)
    assert (updater.skipped_steps, updater.updates, updater.overflow_streak) == (0, 2, 0)
    unscaled = huge.astype(np.float64)      # the gradient of w, unscaled
    expected = unscaled * (clip / np.sqrt(np.sum(unscaled ** 2)))
    # the ones of 1 become subnormals with clip 1e-3 (rounded to multiples of 1.4e-45)
    np.testing.assert_allclose(w.g, expected, rtol=1e-6, atol=1.5e-45)
    assert np.isfinite(w.d).all() and not np.array_equal(w.d, params)


@pytest.mark.parametrize("bad", [np.inf, np.nan])
@pytest.mark.parametrize("size", [4, 1 << 17])      # the graph; NumPy on the CPU
def test_without_the_overflow_check_a_norm_not_finite_still_skips_the_step(size, bad):
    # Gradients holding inf (1e38 at scale 4 overflows float32) or NaN have no finite norm
    # and no clip factor: the step is skipped even where no overflow check runs (a fixed
    # scale stays). Finite gradients as large, 2e37 at scale 4, are clipped and applied.
    solver, loss, x, w = product_net("float", np.ones(size))
    updater = FixedLossScalingUpdater(solver, loss, scale=4.0, clip_grad_norm=1.0,
                                      enable_overflow_check=False)
    values = np.ones(size, dtype=np.float32)
    values[:2] = 1e38 if bad == np.inf else bad
    x.d = values
    before = w.d.copy()
    result = updater.update()
    assert not np.isfinite(w.g).all()
    assert result.skipped and (result.scale, result.next_scale) == (4.0, 4.0)
    assert w.d.tobytes() == before.tobytes()
    values[:2] = 2e37
    x.d = values
    assert updater.update().updated and np.isfinite(w.d).all()
    assert not np.array_equal(w.d, before)


@pytest.mark.parametrize("precision", ["half", "float"])
def test_the_saturation_check_decides_at_the_threshold_as_the_numpy_check(precision):
    # The gradient of w is x itself (scale 1): |g| >= 65504 or NaN saturates, the largest
    # value below 65504 (65472 in float16, 65503.996 in float32) does not.
    from nnabla_mpt.core._gradsum import SaturationCheck

    below = np.nextafter(np.float32(65504), np.float32(0))
    if precision == "half":
        below = 65472.0
    values = [65504.0, -65504.0, below, -below, 1.0, np.nan, 70000.0]
    solver, loss, x, w = product_net(precision, np.ones(4))
    updater = FixedLossScalingUpdater(solver, loss, scale=1.0,
                                      overflow=OverflowHandling(mode="saturation"))
    numpy_check = OverflowDetector("saturation")
    # the check as the updater makes it (the graph, for small arrays), and as it makes it
    # for large ones on the CPU (NumPy)
    checks = [SaturationCheck([w], 65504.0, context("float"), size) for size in (None, 1)]
    decisions = []
    for value in values:
        x.d = np.array([1.0, value, 1.0, 1.0], dtype=np.float32)
        skipped = updater.update().skipped
        assert skipped == numpy_check.check(solver), value
        assert [check() for check in checks] == [skipped, skipped], value
        decisions.append(skipped)
    assert decisions == [True, True, False, False, False, True, True]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_the_norm_s_graph_matches_float64_however_it_packs_the_arrays(dtype):
    # As on a GPU, every array in the graph (no NumPy path): arrays larger than GROUP_SIZE
    # (a matrix of their own: a view, or a copy padded with zeros), sizes that 4 does not
    # divide (padded), arrays packed together into several matrices.
    from nnabla_mpt.core._gradsum import GROUP_SIZE, SquaredNorm

    sizes = [GROUP_SIZE + 8, 3, 5, GROUP_SIZE // 2, GROUP_SIZE // 2 + 1, 7, GROUP_SIZE + 2]
    variables = [nn.Variable((n,), need_grad=True) for n in sizes]
    norm = SquaredNorm(variables, context("float"))
    assert norm._graph is not None and not norm._large
    rng = np.random.RandomState(3)
    largest = float(np.finfo(dtype).max)
    normal = [rng.randn(n) for n in sizes]
    spike = [g.copy() for g in normal]
    spike[4][-1] = largest                  # one value at the dtype's largest
    cases = {"normal": normal, "spike": spike,
             "all large": [g * (largest / 8) for g in normal],   # squares beyond float32
             "tiny": [g * 1e-30 if dtype == np.float32 else g * 1e-6 for g in normal],
             "zeros": [np.zeros(n) for n in sizes]}
    for name, values in cases.items():
        values = [np.clip(g, -largest, largest).astype(dtype) for g in values]
        for v, g in zip(variables, values):
            v.g = g
        expected = sum(float(np.sum(g.astype(np.float64) ** 2)) for g in values)
        assert norm.value() == pytest.approx(expected, rel=1e-5, abs=0.0), name
        # the factor the device scales by is a normal float32, also for gradients near
        # float32's largest: a GPU that flushes subnormals to zero computes the same
        factor = float(norm._graph._total.d.ravel()[0])
        assert factor >= np.finfo(np.float32).tiny, (name, factor)
    for bad in (np.inf, np.nan):
        values[3][10] = bad
        variables[3].g = values[3]
        assert not np.isfinite(norm.value()), bad


@pytest.mark.parametrize("cpu", [True, False])     # top_k_data; F.max (off the CPU)
def test_the_norm_s_graph_finds_the_largest_magnitude_either_way(cpu):
    from nnabla_mpt.core._gradsum import _largest

    values = np.random.RandomState(4).randn(1, 1000, 4).astype(np.float32)
    values[0, 517, 2] = -3e38
    with nn.context_scope(context("float")), nn.auto_forward(True):
        largest = _largest(nn.Variable.from_numpy_array(values), cpu)
    assert largest.shape == (1, 1) and largest.d[0, 0] == np.float32(3e38)


@pytest.mark.parametrize("ratio", [0.51, 0.75, 0.99, 1.01, 1.5])
def test_a_norm_just_above_the_bound_is_clipped_and_one_below_it_is_not(ratio):
    # The bound set at ``ratio`` times the step's own unscaled norm: from just above half
    # the norm to just below it the step is clipped by exactly bound / norm; above the
    # norm it is not clipped at all.
    net = Net("float", batch=4, d_in=3, d_out=2)
    solver = net.solver("Sgd", lr=LR)
    x, t = net.batch(0)
    net.x.d, net.t.d = x, t
    before = net.snapshot()
    grads = scaled_grads(net, solver, 8.0)
    norm = np.sqrt(sum(np.sum((g / 8.0) ** 2) for g in grads.values()))
    expected, factor = reference_step(before, grads, 8.0, ratio * norm)
    assert factor == pytest.approx(min(1.0, ratio))
    updater = FixedLossScalingUpdater(solver, net.loss, scale=8.0, clip_grad_norm=ratio * norm)
    assert updater.update().updated
    after = net.snapshot()
    for name in after:
        np.testing.assert_allclose(after[name], expected[name], rtol=1e-6, atol=1e-7,
                                   err_msg=f"bound {ratio} x the norm, {name}")


def test_a_bound_so_small_that_the_clip_factor_is_zero_zeroes_the_step():
    # clip / norm underflows to 0 in float64: the gradients are scaled by 0 at once
    net = Net("float", batch=4, d_in=3, d_out=2)
    x, t = net.batch(0)
    net.x.d, net.t.d = x * np.float32(100.0), t      # a norm far above 2: 5e-324 / norm is 0
    grads = scaled_grads(net, net.solver("Sgd", lr=LR), 1.0)
    assert np.sqrt(sum(np.sum(g * g) for g in grads.values())) > 2.0
    before = net.snapshot()
    updater = FixedLossScalingUpdater(net.solver("Sgd", lr=LR), net.loss, scale=8.0,
                                      clip_grad_norm=5e-324)
    assert updater.update().updated
    assert_bitwise_equal(net.snapshot(), before)

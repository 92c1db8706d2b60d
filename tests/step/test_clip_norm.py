"""Global-norm clipping where the squared norm of the scaled gradients overflows, and the
saturation check, on real graphs (float16 on the CPU for the half ones).

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


@pytest.mark.parametrize("size", [4, 1 << 17])      # the graph; NumPy on the CPU
def test_a_norm_still_not_finite_unscaled_skips_the_step_as_an_overflow(size):
    # At scale 4 the gradients are 8e37, finite in float32, and so are the unscaled ones,
    # 2e37; but their squares, 4e74, are not: no clip factor brings them to the bound.
    solver, loss, x, w = product_net("float", np.ones(size))
    updater = DynamicLossScalingUpdater(solver, loss, scale=4.0, clip_grad_norm=1.0)
    assert updater.update().updated     # a first good step, so that Momentum holds a state
    params, states = {"w": w.d.copy()}, solver_states(solver)
    huge = np.ones(size, dtype=np.float32)
    huge[:2] = 2e37
    x.d = huge
    result = updater.update()
    assert np.isfinite(w.g).all()               # no gradient overflowed: the norm did
    assert result.skipped and not result.bad_batch
    assert (result.scale, result.next_scale, updater.scale) == (4.0, 2.0, 2.0)
    assert (updater.skipped_steps, updater.updates) == (1, 1)
    assert updater.overflow_streak == 1
    assert_bitwise_equal({"w": w.d}, params)
    assert_states_bitwise_equal(solver_states(solver), states)


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


def test_without_the_overflow_check_a_norm_not_finite_still_skips_the_step():
    # No clip factor exists for such gradients: the step is skipped even where no
    # overflow check runs (a fixed scale stays).
    solver, loss, x, w = product_net("float", np.ones(4))
    updater = FixedLossScalingUpdater(solver, loss, scale=4.0, clip_grad_norm=1.0,
                                      enable_overflow_check=False)
    x.d = np.array([2e37, 2e37, 1.0, 1.0], dtype=np.float32)
    before = w.d.copy()
    result = updater.update()
    assert result.skipped and (result.scale, result.next_scale) == (4.0, 4.0)
    assert w.d.tobytes() == before.tobytes()
    x.d = np.ones(4, dtype=np.float32)
    assert updater.update().updated and not np.array_equal(w.d, before)

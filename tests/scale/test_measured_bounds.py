"""The bounds the measured scale keeps, run through the updater on small graphs: the
gradients the seed bounds (no margin), the parameters' gradients bounded by the dtype
they are computed in (float16 under a float32 loss), a float16 cap under a float32 loss,
and the calibrated start's edge cases (gradients that vanish at the smallest scale, a
room exactly at the lower bound, a probe that had to look higher)."""
import numpy as np

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla.solvers as S

from nnabla_mpt import DynamicLossScale, DynamicLossScalingUpdater
from nnabla_mpt.scale.measured import MARGIN
from support import Net, assert_names, context

HALF, FLOAT = context("half"), context("float")
FLOAT16_MAX = 65504.0


def start_line(caplog):
    [line] = [r.getMessage() for r in caplog.records
              if r.name == "nnabla" and "scale='auto' starts" in r.getMessage()]
    return line


def test_gradients_the_seed_bounds_keep_no_margin_at_the_start_and_in_growth():
    # sum(tanh(1e-4 * y)): the sum's and the tanh's input gradients are at most the scale
    # whatever the data, so they only have to fit in float16; every other gradient is
    # 10**4 times smaller. The start is the ceiling, and measured growth reaches it. Had
    # they the margin too, the scale itself would keep every scale below 65504 / 8.
    net = Net("half", scope="bounded_head")
    with nn.context_scope(net.ctx):
        loss = F.sum(F.tanh(F.mul_scalar(net.y, 1e-4)))
    auto = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.0), loss, net.feeder,
                                     scale="auto")
    assert auto.update().scale == 2.0 ** 15
    grown = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.0), loss, net.feeder,
                                      scale=8.0, N=1, growth_mode="measured")
    scales = [grown.update().scale for _ in range(3)]
    assert scales[-1] == 2.0 ** 15 > FLOAT16_MAX / MARGIN


def float_loss_over_half(scope, head, batch, x):
    """A float16 affine layer ``y = x W + b`` (3 -> 2, ``W`` 0.5, ``b`` 0, inputs all
    ``x``, batch ``batch``) under a float32 loss, ``sum(head(identity(...)))`` of
    ``head(y)``, a function of float16 (``head``'s first) then float32 variables (its
    second): the loss and the parameters."""
    with nn.context_scope(HALF), nn.parameter_scope(scope):
        inputs = nn.Variable((batch, 3))
        y = PF.affine(inputs, 2, name="fc")
    low, high = head
    with nn.context_scope(HALF):
        low = low(y)
    with nn.context_scope(FLOAT), nn.parameter_scope(scope):
        loss = F.sum(high(F.identity(low)))
    params = {name: v for name, v in nn.get_parameters(grad_only=False).items()
              if name.startswith(scope + "/")}
    params[f"{scope}/fc/affine/W"].d = np.full((3, 2), 0.5)
    params[f"{scope}/fc/affine/b"].d = np.zeros(2)
    inputs.d = np.full((batch, 3), x)
    with nn.context_scope(FLOAT):
        solver = S.Sgd(lr=0.0)
    solver.set_parameters(params)
    return loss, solver


def test_under_a_float32_loss_the_float16_parameters_gradients_hold_the_start():
    # sum(identity(y) * w), w a float32 parameter (1): the gradient flowing into the
    # float16 layer is the scale, and the weight's, the scale times the batch's 64 inputs
    # of 100, is float16 too: the start keeps it MARGIN below 65504 (a float32 bound
    # would leave the activations' gradient to hold it, 6400 times higher).
    def times_w(v):
        w = nn.parameter.get_parameter_or_create("w", (1, 2))
        w.d = np.ones((1, 2))
        return F.mul2(v, F.broadcast(w, (64, 2)))

    loss, solver = float_loss_over_half("float16_params", (F.identity, times_w), 64, 100.0)
    updater = DynamicLossScalingUpdater(solver, loss, None, scale="auto",
                                        policy=DynamicLossScale(min_scale=2.0 ** -10))
    start = updater.update().scale
    assert start == 2.0 ** np.floor(np.log2(FLOAT16_MAX / (MARGIN * 64 * 100.0)))


def test_under_a_float32_loss_the_float16_gradients_the_seed_bounds_cap_the_start():
    # sum(identity(tanh(1e-4 * y))), a batch of one: every gradient without a bound is
    # small, so what holds the start is tanh's input gradient, the scale itself at most
    # and float16: the cap 65504 (no margin), far below float32's ceiling and the
    # max_scale asked for.
    def tanh_of_small(v):
        return F.tanh(F.mul_scalar(v, 1e-4))

    loss, solver = float_loss_over_half("float16_cap", (tanh_of_small, F.identity), 1, 1.0)
    updater = DynamicLossScalingUpdater(solver, loss, None, scale="auto",
                                        policy=DynamicLossScale(max_scale=2.0 ** 40))
    assert updater.update().scale == 2.0 ** 15


def test_gradients_that_overflow_at_the_probe_and_vanish_at_the_smallest_scale(info_log):
    # 1e-4 * sum(w2 * (w1 * x)) in float16 with w1 = 0: at scale 1 the first weight's
    # gradient, 1e-4 * 65504 * 60000, overflows; at float16's smallest normal value the
    # seed times 1e-4 rounds to 0 and every gradient is zero, which is finite. The batch
    # is not one that no scale can measure: an overflow, and the start is min_scale,
    # where the step fits.
    with nn.context_scope(HALF), nn.parameter_scope("vanishing"):
        x = nn.Variable((1, 1))
        w1, w2 = (nn.parameter.get_parameter_or_create(n, (1, 1)) for n in "ab")
        loss = F.mul_scalar(F.sum(F.mul2(w2, F.mul2(w1, x))), 1e-4)
    x.d, w1.d, w2.d = [[60000.0]], [[0.0]], [[FLOAT16_MAX]]
    with nn.context_scope(HALF):
        solver = S.Sgd(lr=0.0)
    solver.set_parameters({"a": w1, "b": w2})
    policy = DynamicLossScale(min_scale=2.0 ** -4)
    result = DynamicLossScalingUpdater(solver, loss, None, scale="auto",
                                       policy=policy).update()
    assert (result.scale, result.skipped) == (2.0 ** -4, False)
    assert_names(start_line(info_log), "starts at 0.0625", "inf", "at scale 1",
                 "lower bound")


def test_a_room_exactly_at_the_lower_bound_is_a_start_that_keeps_the_margin(info_log):
    # loss = sum(w * x), x = 65504 / 2**7: the weight's gradient at scale s is s * x, so
    # s * 65504 / (MARGIN * s * x) = 2**4 exactly; with min_scale 2**4 that room is the
    # lower bound itself, and the start keeps the margin there.
    with nn.context_scope(HALF), nn.parameter_scope("exact"):
        x = nn.Variable((1, 1))
        w = nn.parameter.get_parameter_or_create("w", (1, 1))
        loss = F.sum(F.mul2(w, x))
    x.d, w.d = [[FLOAT16_MAX / 2 ** 7]], [[1.0]]
    with nn.context_scope(HALF):
        solver = S.Sgd(lr=0.0)
    solver.set_parameters({"w": w})
    policy = DynamicLossScale(min_scale=16.0)
    result = DynamicLossScalingUpdater(solver, loss, None, scale="auto",
                                       policy=policy).update()
    assert (result.scale, result.skipped) == (16.0, False)
    line = start_line(info_log)
    assert_names(line, "starts at 16", "largest power of two", "keeps every gradient")
    assert "lower bound" not in line

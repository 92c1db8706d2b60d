"""The update arithmetic, step by step, against a NumPy reference (float context).

The model is linear with a mean-squared-error loss, so its gradients are known in closed
form. The reference receives the same batches, scales the gradients by the loss scale, and
then follows the documented order: unscale (and average if asked), clip the global norm,
weight decay ``g += wd * w``, then the solver rule written from nnabla's documented formulas
(:class:`reference_step.NumpySolver`).
"""
import math

import numpy as np
import pytest

from nnabla_mpt import (DynamicLossScale, DynamicLossScalingUpdater, FixedLossScalingUpdater,
                        GradientReduction, OverflowHandling)
from reference_step import SOLVERS, NumpySolver
from support import Net, linear_mse_grads

W, B = "out/affine/W", "out/affine/b"

class ReferenceTraining:
    """The whole updater step in float64 NumPy, dynamic scale included."""

    def __init__(self, params, kind, *, scale, N=10 ** 9, accum=1, wd=None, average=False,
                 clip=None, growth=2.0, backoff=0.5, min_scale=1.0, max_scale=2.0 ** 24,
                 fixed=False, saturation=False):
        self.w = {k: np.array(v, dtype=np.float64) for k, v in params.items()}
        self.solver = NumpySolver(kind, **SOLVERS[kind])
        self.scale, self.N, self.accum, self.wd = scale, N, accum, wd
        self.average, self.clip, self.fixed = average, clip, fixed
        self.saturation = saturation
        self.growth, self.backoff = growth, backoff
        self.min_scale, self.max_scale = min_scale, max_scale
        self.good = 0
        self.clipped_steps = 0

    def step(self, batches):
        s = self.scale
        gW = np.zeros_like(self.w[W])
        gb = np.zeros_like(self.w[B])
        loss_finite = True
        with np.errstate(all="ignore"):
            for x, t in batches:
                dW, db = linear_mse_grads(self.w[W], self.w[B], x, t)
                gW += s * dW
                gb += s * db
                y = x.astype(np.float64) @ self.w[W] + self.w[B]
                loss_finite &= bool(np.isfinite(np.mean((y - t) ** 2)))
        overflow = not (np.isfinite(gW).all() and np.isfinite(gb).all())
        if self.saturation:
            overflow = overflow or max(np.abs(gW).max(), np.abs(gb).max()) >= 65504.0
        if overflow:
            # A skipped step whose loss is non-finite keeps the scale: a smaller scale
            # cannot make the loss finite.
            if not self.fixed and loss_finite:
                self.good = 0
                self.scale = max(self.min_scale, s * self.backoff)
            return s, True
        factor = 1.0 / (s * self.accum if self.average else s)
        grads = {W: gW * factor, B: gb * factor}
        if self.clip is not None:
            norm = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
            if norm > self.clip:
                self.clipped_steps += 1
                grads = {k: g * (self.clip / norm) for k, g in grads.items()}
        if self.wd is not None:
            grads = {k: g + self.wd * self.w[k] for k, g in grads.items()}
        for k in (W, B):
            self.w[k], _ = self.solver.update(k, self.w[k], grads[k], np.abs(grads[k]))
        if not self.fixed:
            self.good += 1
            if self.good >= self.N:
                self.scale = min(self.max_scale, s * self.growth)
                self.good = 0
        return s, False


def _run_and_compare(net, updater, ref, steps, *, rtol=2e-5, atol=1e-6):
    results = []
    for i in range(steps):
        batches = [net.batch(i * ref.accum + j) for j in range(ref.accum)]
        r = updater.update()
        scale, skipped = ref.step(batches)
        assert (r.step, r.scale, r.skipped) == (i, scale, skipped), f"step {i}"
        assert r.next_scale == ref.scale == updater.scale, f"step {i}"
        for name, v in net.params.items():
            np.testing.assert_allclose(v.d, ref.w[name], rtol=rtol, atol=atol,
                                       err_msg=f"{name} after step {i}")
        results.append(r)
    return results


@pytest.mark.parametrize("kind", sorted(SOLVERS))
@pytest.mark.parametrize("accum", [1, 3])
@pytest.mark.parametrize("wd", [None, 1e-2])
def test_dynamic_updater_matches_numpy_reference(kind, accum, wd):
    net = Net()
    start = net.snapshot()
    # A scale that is not a power of two and grows during the run (N=2): the unscale factor
    # must be the one of the step's own scale.
    updater = DynamicLossScalingUpdater(net.solver(kind, **SOLVERS[kind]), net.loss,
                                        net.feeder, scale=1000.0, N=2, accum_grad=accum,
                                        weight_decay=wd)
    ref = ReferenceTraining(start, kind, scale=1000.0, N=2, accum=accum, wd=wd)
    results = _run_and_compare(net, updater, ref, steps=6)
    assert [r.scale for r in results] == [1000.0, 1000.0, 2000.0, 2000.0, 4000.0, 4000.0]
    assert net.calls == 6 * accum
    assert (updater.steps, updater.updates, updater.skipped_steps) == (6, 6, 0)
    assert not np.allclose(net.params[W].d, start[W])


@pytest.mark.parametrize("kind", ["Sgd", "Adam"])
def test_average_accum_divides_by_accum_grad(kind):
    net = Net()
    start = net.snapshot()
    updater = DynamicLossScalingUpdater(net.solver(kind, **SOLVERS[kind]), net.loss,
                                        net.feeder, scale=64.0, accum_grad=3,
                                        weight_decay=1e-2,
                                        average_accum=True)
    ref = ReferenceTraining(start, kind, scale=64.0, accum=3, wd=1e-2, average=True)
    _run_and_compare(net, updater, ref, steps=5)


def test_average_accum_differs_from_the_default_sum():
    finals = []
    for average in (False, True):
        net = Net(scope=f"avg{average}")
        updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.1), net.loss, net.feeder,
                                            accum_grad=3,
                                            average_accum=average)
        updater.update()
        finals.append(net.snapshot())
    assert not np.allclose(finals[0][W], finals[1][W])


@pytest.mark.parametrize("kind", ["Sgd", "Momentum", "Adam"])
@pytest.mark.parametrize("wd", [None, 1e-2])
def test_clip_grad_norm_on_unscaled_grads_matches_reference(kind, wd):
    net = Net()
    start = net.snapshot()
    updater = DynamicLossScalingUpdater(net.solver(kind, **SOLVERS[kind]), net.loss,
                                        net.feeder, scale=1000.0, N=3, accum_grad=2,
                                        weight_decay=wd, clip_grad_norm=0.3)
    ref = ReferenceTraining(start, kind, scale=1000.0, N=3, accum=2, wd=wd, clip=0.3)
    _run_and_compare(net, updater, ref, steps=6)
    assert ref.clipped_steps >= 3          # the clip took effect


@pytest.mark.parametrize("kind", ["Sgd", "Adam"])
def test_clip_result_does_not_depend_on_the_scale(kind):
    runs = {}
    for scale in (1.0, 2.0 ** 6, 2.0 ** 13):
        net = Net(scope=f"s{int(scale)}")
        updater = DynamicLossScalingUpdater(net.solver(kind, **SOLVERS[kind]), net.loss,
                                            net.feeder, scale=scale, N=1000,
                                            clip_grad_norm=0.3)
        for _ in range(4):
            updater.update()
        runs[scale] = net.snapshot()
    # Powers of two scale and unscale exactly in float32, so the runs agree bit for bit.
    for scale in (2.0 ** 6, 2.0 ** 13):
        for name in runs[1.0]:
            assert runs[scale][name].tobytes() == runs[1.0][name].tobytes(), (scale, name)
    unclipped = Net(scope="unclipped")
    updater = DynamicLossScalingUpdater(unclipped.solver(kind, **SOLVERS[kind]),
                                        unclipped.loss, unclipped.feeder, scale=2.0 ** 6)
    for _ in range(4):
        updater.update()
    assert not np.allclose(unclipped.params[W].d, runs[1.0][W])


def test_dynamic_scale_trajectory_with_overflowing_batches():
    net = Net()
    # x * 1e3 at steps 2, 3, 7: the loss stays finite, the scaled gradients exceed 65504,
    # an overflow in saturation mode. An inf in x at step 5: the loss itself is not finite.
    net.huge = {2, 3, 7}
    net.bad = {5}
    start = net.snapshot()
    updater = DynamicLossScalingUpdater(net.solver("Momentum", **SOLVERS["Momentum"]),
                                        net.loss, net.feeder, scale=64.0, N=2,
                                        weight_decay=1e-2,
                                        overflow=OverflowHandling(mode="saturation"))
    ref = ReferenceTraining(start, "Momentum", scale=64.0, N=2, wd=1e-2, saturation=True)
    results = _run_and_compare(net, updater, ref, steps=10)
    assert [r.scale for r in results] == [64, 64, 128, 64, 32, 32, 32, 64, 32, 32]
    assert [r.skipped for r in results] == [False, False, True, True, False, True, False,
                                            True, False, False]
    # Step 5 (non-finite loss) keeps the scale and the good-step count: step 6 grows.
    assert [r.next_scale for r in results] == [64, 128, 64, 32, 32, 32, 64, 32, 32, 64]
    assert (updater.steps, updater.updates, updater.skipped_steps) == (10, 6, 4)
    assert (updater.overflow_streak, updater.longest_overflow_streak) == (0, 2)


@pytest.mark.parametrize("micro", [0, 1])
def test_non_finite_loss_in_any_micro_batch_keeps_the_scale(micro):
    net = Net()
    net.bad = {micro}                           # an inf in x of one of the two micro-batches
    updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.1), net.loss, net.feeder,
                                        scale=64.0, N=100, accum_grad=2)
    r = updater.update()
    assert (r.skipped, r.scale, r.next_scale) == (True, 64.0, 64.0)


def test_dynamic_scale_trajectory_with_hysteresis_and_bounds():
    net = Net()
    net.huge = {0, 1, 2, 3, 6, 7}
    start = net.snapshot()
    # floor_policy="ignore": overflows at min_scale are the point here, not the diagnosis.
    updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.1), net.loss, net.feeder,
                                        policy=DynamicLossScale(
                                            init_scale=3.0, backoff_factor=0.25,
                                            growth_interval=2, hysteresis=2, min_scale=2.0,
                                            max_scale=3.0),
                                        overflow=OverflowHandling(
                                            mode="saturation", floor_policy="ignore"))
    # The reference has no hysteresis: it is given the updater's scale at every step and
    # checks the parameters; the scale sequence is spelled out below.
    ref = ReferenceTraining(start, "Sgd", scale=3.0, saturation=True)
    steps = []
    for i in range(10):
        ref.scale = updater.scale
        r = updater.update()
        ref.step([net.batch(i)])
        steps.append((r.scale, r.skipped, r.next_scale))
        for name, v in net.params.items():
            np.testing.assert_allclose(v.d, ref.w[name], rtol=2e-5, atol=1e-6)
    assert steps == [
        (3.0, True, 3.0),     # hysteresis budget 2 -> 1, no back-off
        (3.0, True, 2.0),     # exhausted: 3 * 0.25 clamped to min_scale
        (2.0, True, 2.0),     # stays exhausted, stays at the floor
        (2.0, True, 2.0),
        (2.0, False, 2.0),
        (2.0, False, 3.0),    # growth after N=2 good steps: 4 clamped to max_scale
        (3.0, True, 3.0),     # the growth refilled the budget
        (3.0, True, 2.0),
        (2.0, False, 2.0),
        (2.0, False, 3.0),
    ]
    assert updater.policy.at_min_scale is False
    assert updater.longest_overflow_streak == 4


def test_fixed_updater_matches_reference_and_keeps_the_scale():
    net = Net()
    net.bad = {3}                       # second micro-batch of step 1
    start = net.snapshot()
    updater = FixedLossScalingUpdater(net.solver("Adam", **SOLVERS["Adam"]), net.loss,
                                      net.feeder, scale=100.0, accum_grad=2,
                                      weight_decay=1e-2)
    ref = ReferenceTraining(start, "Adam", scale=100.0, accum=2, wd=1e-2, fixed=True)
    results = _run_and_compare(net, updater, ref, steps=4)
    assert [(r.scale, r.skipped, r.next_scale) for r in results] == [
        (100.0, False, 100.0), (100.0, True, 100.0), (100.0, False, 100.0),
        (100.0, False, 100.0)]

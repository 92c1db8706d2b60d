"""The updaters diagnose a collapsing loss scale and act by floor_policy (float16 graphs)."""
import logging

import numpy as np
import pytest

import nnabla as nn
import nnabla.functions as F
import nnabla.initializer as I
import nnabla.parametric_functions as PF
import nnabla.solvers as S
from nnabla.ext_utils import get_extension_context

from nnabla_mpt import (DynamicLossScale, DynamicLossScalingUpdater, FixedLossScalingUpdater,
                        OverflowHandling)
from nnabla_mpt.diagnosis import diagnosis
from nnabla_mpt.diagnosis.diagnosis import LossScaleCollapseError
from support import Net, assert_names, linear_mse_grads, raises_naming

HALF = get_extension_context("cpu", type_config="half")
PARAMS = ["fc1/affine/W", "fc1/affine/b", "fc2/affine/W", "fc2/affine/b"]
FP16_MAX = 65504.0
# For the linear float16 ``Net("half")``, a batch in ``net.large`` (x * 20) keeps a finite
# loss but its gradients overflow at this scale and above (in float16 it is the weight
# gradient of the Affine that overflows first); ordinary batches do not.
LARGE_OVERFLOWS = 4096.0


def _affine(h, n, name, seed):
    with nn.parameter_scope(name):
        return PF.affine(h, n, w_init=I.NormalInitializer(0.5, rng=np.random.RandomState(seed)))


class MaskedLogLikelihood:
    """-mean(log(sigmoid(logits) * mask)): a zero in the mask feeds Log a 0 (-inf, NaN grads).

    ``bad_steps`` batches with a zero in the mask come first, then good batches.
    """

    def __init__(self, bad_steps):
        self.x, self.mask = nn.Variable((4, 5)), nn.Variable((4, 3))
        with nn.context_scope(HALF):
            h = F.relu(_affine(self.x, 8, "fc1", 1))
            p = F.sigmoid(_affine(h, 3, "fc2", 2)) * self.mask
            self.loss = -F.mean(F.log(p))
        self.bad_steps = bad_steps
        self.fed = 0
        self.rng = np.random.RandomState(0)
        self.solver = S.Sgd(0.1)
        self.solver.set_parameters(nn.get_parameters())

    def __call__(self):
        self.x.d = self.rng.randn(4, 5)
        m = np.ones((4, 3))
        if self.fed < self.bad_steps:
            m[self.fed % 4, self.fed % 3] = 0.0
        self.mask.d = m
        self.fed += 1


def healthy_regression():
    x, t = nn.Variable((8, 5)), nn.Variable((8, 1))
    with nn.context_scope(HALF):
        y = _affine(F.relu(_affine(x, 8, "fc1", 1)), 1, "fc2", 2)
        loss = F.mean(F.squared_error(y, t))
    rng = np.random.RandomState(0)
    w = rng.randn(5, 1)

    def feed():
        xb = rng.randn(8, 5)
        x.d, t.d = xb, xb @ w
    solver = S.Adam(1e-2)
    solver.set_parameters(nn.get_parameters())
    return solver, loss, feed


def flat(obj):
    """The text with line wrapping undone."""
    return " ".join(str(obj).split())


def snapshot():
    return {k: v.d.copy() for k, v in nn.get_parameters().items()}


@pytest.fixture
def count_diagnose(monkeypatch):
    """Counts calls of diagnosis.diagnose (our own function, wrapped, still run for real)."""
    calls = []
    real = diagnosis.diagnose

    def counted(*args, **kwargs):
        calls.append(args[1])
        return real(*args, **kwargs)
    monkeypatch.setattr(diagnosis, "diagnose", counted)
    return calls


@pytest.fixture
def nnabla_log(caplog):
    caplog.set_level(logging.DEBUG, logger="nnabla")
    return caplog


def records(caplog, level):
    return [r for r in caplog.records if r.name == "nnabla" and r.levelno == level
            and r.getMessage().startswith("nnabla_mpt")]


# -- raise ---------------------------------------------------------------------------------

def test_log_of_zeros_raises_within_the_streak_naming_log_forward(count_diagnose):
    net = MaskedLogLikelihood(bad_steps=100)
    before = snapshot()
    u = DynamicLossScalingUpdater(net.solver, net.loss, net, scale=2.0 ** 10,
                                  overflow=OverflowHandling(diagnose_after=3))
    assert u.update().skipped and u.update().skipped
    with pytest.raises(LossScaleCollapseError) as info:
        u.update()
    err = info.value
    # the first line: what happened, how often, where and in which pass
    assert_names(str(err).splitlines()[0], "non-finite loss", "3 consecutive steps",
                 "loss itself is non-finite", "Log (#5)", "forward")
    assert err.loss_at_fault and "collapse" not in str(err).splitlines()[0]
    report = err.report
    assert (report.kind, report.phase, report.function) == ("model", "forward", "Log")
    assert sorted(report.nonfinite_params) == PARAMS
    assert not report.loss_finite
    assert_names(flat(err), "non-finite gradients at scale 2**10 (1024)", "step 2",
                 "skipped it without lowering the loss scale")
    assert u.last_report is report
    assert count_diagnose == [2.0 ** 10]
    # three skipped steps, counted; the scale was kept: a non-finite loss is no overflow
    assert (u.steps, u.skipped_steps, u.updates, u.overflow_streak) == (3, 3, 0, 3)
    assert u.scale == 2.0 ** 10
    assert u.last_result.step == 2 and u.last_result.skipped
    after = snapshot()
    assert all(np.array_equal(before[k], after[k]) for k in before)


def test_fixed_updater_raises_on_a_streak_of_pure_overflow():
    # A fixed scale at which every batch overflows never backs off: the streak is a
    # collapse, even though each batch is finite at a smaller scale.
    net = Net("half")
    net.large = set(range(100))
    u = FixedLossScalingUpdater(net.solver("Sgd", lr=0.01), net.loss, net.feeder,
                                scale=LARGE_OVERFLOWS, overflow=OverflowHandling(diagnose_after=2))
    assert u.update().skipped
    with pytest.raises(LossScaleCollapseError) as info:
        u.update()
    assert (u.steps, u.skipped_steps, u.overflow_streak, u.scale) == (2, 2, 2, LARGE_OVERFLOWS)
    report = info.value.report
    assert (report.kind, report.phase, report.function) == ("overflow", "backward", "Affine")
    assert report.finite_at_scale_one and report.loss_finite
    assert report.nonfinite_params == ["out/affine/W"]
    # The replayed batch (1) at scale 1, computed in float64: the largest safe scale is the
    # power of two that keeps its largest gradient within float16.
    W, b = (net.params[f"out/affine/{k}"].d for k in "Wb")
    grads = linear_mse_grads(W, b, *net.batch(1))
    largest = max(float(np.abs(g).max()) for g in grads)
    assert report.max_grad_at_scale_one == pytest.approx(largest, rel=1e-2)
    assert report.max_safe_scale == 2.0 ** np.floor(np.log2(FP16_MAX / largest))
    assert report.max_safe_scale < LARGE_OVERFLOWS
    safe = f"{report.max_safe_scale:g}"
    assert_names(flat(report), f"a scale of at most {safe}", f"max_scale={safe}",
                 f"scale={safe}")
    # The scale itself is representable: the overflow is the data's, not the seed's.
    assert "larger than the largest float16 value" not in flat(report)
    assert_names(str(info.value).splitlines()[0], "Affine (#0)", "out/affine", "overflowed",
                 "backward", "2**12 (4096)", "finite at scale 1")


def test_overflow_at_the_minimum_scale_triggers_at_once():
    net = MaskedLogLikelihood(bad_steps=100)
    u = DynamicLossScalingUpdater(net.solver, net.loss, net,
                                  policy=DynamicLossScale(init_scale=1.0, min_scale=1.0),
                                  overflow=OverflowHandling(diagnose_after=50))
    with raises_naming(LossScaleCollapseError, "loss scale collapse", "overflow",
                       "minimum loss scale 1", "Log"):
        u.update()
    assert u.steps == 1 and u.last_report.function == "Log"


# -- warn and ignore -----------------------------------------------------------------------

def test_warn_logs_the_report_once_and_training_goes_on(nnabla_log, count_diagnose):
    net = MaskedLogLikelihood(bad_steps=6)
    u = DynamicLossScalingUpdater(net.solver, net.loss, net, scale=2.0 ** 10,
                                  overflow=OverflowHandling(floor_policy="warn", diagnose_after=3))
    before = snapshot()
    results = [u.update() for _ in range(10)]
    assert [r.skipped for r in results] == [True] * 6 + [False] * 4
    assert u.scale == 2.0 ** 10                      # never lowered for a NaN loss
    warnings = records(nnabla_log, logging.WARNING)
    assert len(warnings) == 1
    text = flat(warnings[0].getMessage())
    # The loss itself is non-finite and the scale stays: no "collapse" of the scale.
    head, report = text.split("Loss-scale diagnosis")
    assert_names(head, "nnabla_mpt", "the loss is non-finite", "3 consecutive steps",
                 "before any loss scaling", "a smaller scale cannot help", "stays at 1024",
                 "training goes on", "floor_policy='warn'")
    assert "collapse" not in head
    assert_names(report, "Log (#5)", "fc2/affine", "inf/NaN", "forward",
                 "F.log(F.maximum_scalar(x, eps))")
    assert count_diagnose == [2.0 ** 10]
    assert u.last_report.function == "Log" and u.last_report.kind == "model"
    after = snapshot()
    assert all(not np.array_equal(before[k], after[k]) for k in ("fc1/affine/W",
                                                                  "fc2/affine/W"))
    assert all(np.isfinite(v).all() for v in after.values())


def test_each_overflow_is_logged_at_debug_level(nnabla_log):
    net = MaskedLogLikelihood(bad_steps=2)
    u = DynamicLossScalingUpdater(net.solver, net.loss, net, scale=2.0 ** 10,
                                  overflow=OverflowHandling(floor_policy="warn", diagnose_after=3))
    for _ in range(3):
        u.update()
    debug = [r.getMessage() for r in records(nnabla_log, logging.DEBUG)]
    assert len(debug) == 2, debug
    for step, line in enumerate(debug):
        assert_names(line, "nnabla_mpt", f"step {step}", "skipped", "4 of 4",
                     "gradients non-finite", "1024 -> 1024", "kept",
                     "the loss itself is non-finite")


def test_ignore_stays_silent_and_runs_no_diagnosis(nnabla_log, count_diagnose):
    net = MaskedLogLikelihood(bad_steps=100)
    u = DynamicLossScalingUpdater(net.solver, net.loss, net, scale=2.0 ** 10,
                                  overflow=OverflowHandling(
                                      floor_policy="ignore", diagnose_after=1))
    results = [u.update() for _ in range(5)]
    assert all(r.skipped for r in results) and u.skipped_steps == 5
    assert records(nnabla_log, logging.WARNING) == []
    assert count_diagnose == [] and u.last_report is None


# -- healthy runs --------------------------------------------------------------------------

def test_a_healthy_run_never_diagnoses(count_diagnose, nnabla_log):
    solver, loss, feed = healthy_regression()
    u = DynamicLossScalingUpdater(solver, loss, feed, scale=2.0 ** 10, N=5)
    losses = []
    for _ in range(30):
        u.update()
        losses.append(float(loss.d))
    assert count_diagnose == [] and u.last_report is None
    # the scale grows every 5 steps until it overflows: those overflows are only skipped
    assert u.skipped_steps >= 1 and u.updates >= 25
    assert u.longest_overflow_streak < u.diagnose_after
    assert np.mean(losses[-5:]) < np.mean(losses[:5])
    assert records(nnabla_log, logging.WARNING) == []


def test_backing_off_from_a_too_high_scale_is_not_a_collapse(count_diagnose, nnabla_log):
    # The first eight batches are large. Backing off by 3/4 from 2**15 keeps the scale above
    # LARGE_OVERFLOWS for eight steps, so all of them overflow. The streak reaches
    # diagnose_after, the replay says "overflow" and the scale still has room: no error.
    net = Net("half")
    net.large = set(range(8))
    u = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.01), net.loss, net.feeder,
                                  policy=DynamicLossScale(
                                      init_scale=2.0 ** 15, backoff_factor=0.75,
                                      growth_interval=1000),
                                  overflow=OverflowHandling(diagnose_after=3))
    scales = [2.0 ** 15 * 0.75 ** k for k in range(9)]
    assert scales[7] > LARGE_OVERFLOWS
    results = [u.update() for _ in range(12)]
    assert [r.skipped for r in results] == [True] * 8 + [False] * 4
    assert [r.scale for r in results] == scales + [scales[8]] * 3
    assert u.longest_overflow_streak == 8
    assert count_diagnose == [scales[2]]             # once, at the third overflow
    assert u.last_report.kind == "overflow" and u.last_report.phase == "backward"
    info = [r.getMessage() for r in records(nnabla_log, logging.INFO)]
    assert len(info) == 1, info
    assert_names(info[0], "3 consecutive overflowing steps", "only because of the scale",
                 "Affine", "backward", "keeps backing off", f"now {scales[3]:g}")
    assert records(nnabla_log, logging.WARNING) == []


# -- options -------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, exc, facts", [
    (dict(floor_policy="stop"), ValueError,
     ("OverflowHandling.floor_policy", "'raise'", "'warn'", "'ignore'", "'stop'")),
    (dict(diagnose_after=0), ValueError, ("OverflowHandling.diagnose_after", ">= 1", "0")),
    (dict(diagnose_after=2.5), TypeError,
     ("OverflowHandling.diagnose_after", "integer", "2.5", "float")),
])
def test_options_are_checked(kwargs, exc, facts):
    with raises_naming(exc, *facts):
        OverflowHandling(**kwargs)


def test_options_are_keyword_only_with_defaults():
    solver, loss, feed = healthy_regression()
    u = DynamicLossScalingUpdater(solver, loss, feed)
    assert (u.floor_policy, u.diagnose_after, u.last_report) == ("raise", 8, None)
    f = FixedLossScalingUpdater(solver, loss, feed,
                                overflow=OverflowHandling(floor_policy="warn", diagnose_after=2))
    assert (f.floor_policy, f.diagnose_after) == ("warn", 2)


# -- the model after a diagnosis -----------------------------------------------------------

def _batch_normalized_run(diagnose_after):
    """One step of a float16 graph with BatchNormalization whose gradients overflow at the
    start scale 2**15 (a finite loss; targets of 50 make gradients of 4e5 there), floor
    policy "warn". Returns the updater, the step and the running statistics after it."""
    nn.clear_parameters()
    rng = np.random.RandomState(3)
    x = nn.Variable.from_numpy_array(rng.randn(8, 3).astype(np.float32))
    t = nn.Variable.from_numpy_array(np.full((8, 1), 50.0, dtype=np.float32))
    with nn.context_scope(HALF):
        h = PF.batch_normalization(_affine(x, 4, "fc1", 0), name="bn")
        loss = F.mean(F.squared_error(_affine(F.relu(h), 1, "fc2", 1), t))
    solver = S.Sgd(0.1)
    solver.set_parameters(nn.get_parameters())
    updater = DynamicLossScalingUpdater(solver, loss, scale=2.0 ** 15, N=1000,
                                        overflow=OverflowHandling(
                                            diagnose_after=diagnose_after, floor_policy="warn"))
    step = updater.update()
    state = {k: np.array(v.d, copy=True)
             for k, v in nn.get_parameters(grad_only=False).items() if not v.need_grad}
    return updater, step, state


def test_a_diagnosed_step_leaves_the_running_statistics_as_one_forward_pass_left_them(
        count_diagnose):
    diagnosed, step, after = _batch_normalized_run(diagnose_after=1)
    assert step.skipped and np.isfinite(step.loss) and count_diagnose == [2.0 ** 15]
    assert diagnosed.last_report is not None
    assert sorted(after) == ["bn/bn/mean", "bn/bn/var"]
    undiagnosed, same_step, expected = _batch_normalized_run(diagnose_after=1000)
    assert same_step.skipped and undiagnosed.last_report is None
    assert count_diagnose == [2.0 ** 15]
    for name in expected:
        assert after[name].dtype == expected[name].dtype
        assert after[name].tobytes() == expected[name].tobytes(), name
        assert np.abs(expected[name] - (0.0 if name.endswith("mean") else 1.0)).max() > 0
    assert step.loss == same_step.loss

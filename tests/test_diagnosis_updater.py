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

from nnabla_mpt import DynamicLossScalingUpdater, FixedLossScalingUpdater
from nnabla_mpt import diagnosis
from nnabla_mpt.diagnosis import LossScaleCollapseError

HALF = get_extension_context("cpu", type_config="half")
PARAMS = ["fc1/affine/W", "fc1/affine/b", "fc2/affine/W", "fc2/affine/b"]


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
                                  diagnose_after=3)
    assert u.update().skipped and u.update().skipped
    with pytest.raises(LossScaleCollapseError) as info:
        u.update()
    err = info.value
    assert str(err).splitlines()[0].startswith(
        "loss scale collapse (3 consecutive overflowing steps): Log (#5)")
    assert "in forward" in flat(err).splitlines()[0]
    report = err.report
    assert (report.kind, report.phase, report.function) == ("model", "forward", "Log")
    assert sorted(report.nonfinite_params) == PARAMS
    assert not report.loss_finite
    assert "Parameters with non-finite gradients at scale 2**10 (1024): " in flat(err)
    assert "the updater skipped it without lowering the loss scale" in flat(err)
    assert u.last_report is report
    assert count_diagnose == [2.0 ** 10]
    # three skipped steps, counted; the scale was kept: a non-finite loss is no overflow
    assert (u.steps, u.skipped_steps, u.updates, u.overflow_streak) == (3, 3, 0, 3)
    assert u.scale == 2.0 ** 10
    assert u.last_result.step == 2 and u.last_result.skipped
    after = snapshot()
    assert all(np.array_equal(before[k], after[k]) for k in before)


def test_fixed_updater_raises_on_a_streak_of_pure_overflow():
    # A fixed scale above the float16 range never backs off: the streak is a collapse.
    solver, loss, feed = healthy_regression()
    u = FixedLossScalingUpdater(solver, loss, feed, scale=2.0 ** 20, diagnose_after=2)
    u.update()
    with pytest.raises(LossScaleCollapseError) as info:
        u.update()
    report = info.value.report
    assert (report.kind, report.phase, report.function) == ("overflow", "backward", "Mean")
    assert "scale=" in flat(report) and "larger than the largest float16 value" in flat(report)
    assert "overflowed in backward" in str(info.value).splitlines()[0]


def test_overflow_at_the_minimum_scale_triggers_at_once():
    net = MaskedLogLikelihood(bad_steps=100)
    u = DynamicLossScalingUpdater(net.solver, net.loss, net, scale=1.0, min_scale=1.0,
                                  diagnose_after=50)
    with pytest.raises(LossScaleCollapseError, match=r"overflow at the minimum loss scale 1\)"):
        u.update()
    assert u.steps == 1 and u.last_report.function == "Log"


# -- warn and ignore -----------------------------------------------------------------------

def test_warn_logs_the_report_once_and_training_goes_on(nnabla_log, count_diagnose):
    net = MaskedLogLikelihood(bad_steps=6)
    u = DynamicLossScalingUpdater(net.solver, net.loss, net, scale=2.0 ** 10,
                                  floor_policy="warn", diagnose_after=3)
    before = snapshot()
    results = [u.update() for _ in range(10)]
    assert [r.skipped for r in results] == [True] * 6 + [False] * 4
    assert u.scale == 2.0 ** 10                      # never lowered for a NaN loss
    warnings = records(nnabla_log, logging.WARNING)
    assert len(warnings) == 1
    text = flat(warnings[0].getMessage())
    assert "loss scale collapse (3 consecutive overflowing steps)" in text
    assert "floor_policy='warn'" in text
    assert "Log (#5) after fc2/affine produced inf/NaN from finite inputs in forward" in text
    assert "F.log(F.maximum_scalar(x, eps))" in text
    assert count_diagnose == [2.0 ** 10]
    assert u.last_report.function == "Log" and u.last_report.kind == "model"
    after = snapshot()
    assert all(not np.array_equal(before[k], after[k]) for k in ("fc1/affine/W",
                                                                  "fc2/affine/W"))
    assert all(np.isfinite(v).all() for v in after.values())


def test_each_overflow_is_logged_at_debug_level(nnabla_log):
    net = MaskedLogLikelihood(bad_steps=2)
    u = DynamicLossScalingUpdater(net.solver, net.loss, net, scale=2.0 ** 10,
                                  floor_policy="warn", diagnose_after=3)
    for _ in range(3):
        u.update()
    debug = [r.getMessage() for r in records(nnabla_log, logging.DEBUG)]
    assert debug == [
        "nnabla_mpt: step 0 skipped: 4 of 4 parameter gradients non-finite; loss scale "
        "1024 -> 1024 (kept: the loss itself is non-finite)",
        "nnabla_mpt: step 1 skipped: 4 of 4 parameter gradients non-finite; loss scale "
        "1024 -> 1024 (kept: the loss itself is non-finite)"]


def test_ignore_stays_silent_and_runs_no_diagnosis(nnabla_log, count_diagnose):
    net = MaskedLogLikelihood(bad_steps=100)
    u = DynamicLossScalingUpdater(net.solver, net.loss, net, scale=2.0 ** 10,
                                  floor_policy="ignore", diagnose_after=1)
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
    # 2**20 overflows float16 at the seed: seven back-offs are needed. The streak reaches
    # diagnose_after, the replay says "overflow" and the scale still has room: no error.
    solver, loss, feed = healthy_regression()
    u = DynamicLossScalingUpdater(solver, loss, feed, scale=2.0 ** 20, N=1000,
                                  diagnose_after=3)
    results = [u.update() for _ in range(12)]
    skipped = [r.skipped for r in results]
    first_update = skipped.index(False)
    assert skipped[first_update:] == [False] * (12 - first_update)
    assert first_update >= 5
    assert count_diagnose == [2.0 ** 18]             # once, at the third overflow
    assert u.last_report.kind == "overflow" and u.last_report.phase == "backward"
    info = [r.getMessage() for r in records(nnabla_log, logging.INFO)]
    assert len(info) == 1 and "3 consecutive overflowing steps" in info[0]
    assert "keeps backing off, now 131072" in info[0]
    assert records(nnabla_log, logging.WARNING) == []


# -- options -------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, exc, message", [
    (dict(floor_policy="stop"), ValueError,
     "floor_policy must be one of 'raise', 'warn', 'ignore', got 'stop'"),
    (dict(diagnose_after=0), ValueError, "diagnose_after must be >= 1, got 0"),
    (dict(diagnose_after=2.5), TypeError, "diagnose_after must be an integer, got 2.5"),
])
@pytest.mark.parametrize("cls", [DynamicLossScalingUpdater, FixedLossScalingUpdater])
def test_options_are_checked(cls, kwargs, exc, message):
    solver, loss, feed = healthy_regression()
    with pytest.raises(exc, match=message):
        cls(solver, loss, feed, **kwargs)


def test_options_are_keyword_only_with_defaults():
    solver, loss, feed = healthy_regression()
    u = DynamicLossScalingUpdater(solver, loss, feed)
    assert (u.floor_policy, u.diagnose_after, u.last_report) == ("raise", 8, None)
    f = FixedLossScalingUpdater(solver, loss, feed, floor_policy="warn", diagnose_after=2)
    assert (f.floor_policy, f.diagnose_after) == ("warn", 2)

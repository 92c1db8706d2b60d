"""``lr_scheduler=``: nnabla's learning-rate schedules keyed on applied updates, so that a
skipped step does not advance them; retried steps and resumed runs go on from
``updater.updates``."""
import math

import numpy as np
import pytest

from nnabla.utils.learning_rate_scheduler import CosineScheduler, LinearWarmupScheduler

from nnabla_mpt import DynamicLossScalingUpdater, FixedLossScalingUpdater, OverflowHandling
from support import (Net, assert_bitwise_equal, assert_states_bitwise_equal, raises_naming,
                     solver_states)

SCALE = 2048.0
LARGE = {1, 2, 5, 9}        # these batches overflow the float16 gradients at SCALE


def schedule():
    return LinearWarmupScheduler(CosineScheduler(0.1, 20), 3)


def as_float32(x: float) -> float:
    return float(np.float32(x))


def half_net(scope: str) -> Net:
    net = Net("half", scope=scope)
    net.large = set(LARGE)
    return net


def hand_loop(net: Net, solver, steps: int):
    """The step written out, the schedule keyed on the updates applied so far."""
    updates, rates = 0, []
    for _ in range(steps):
        solver.zero_grad()
        net.feeder()
        net.loss.forward(clear_no_need_grad=True)
        net.loss.backward(SCALE, clear_buffer=True)
        if solver.check_inf_or_nan_grad():
            continue
        solver.scale_grad(1.0 / SCALE)
        solver.set_learning_rate(schedule().get_learning_rate(updates))
        solver.update()
        rates.append(solver.learning_rate())
        updates += 1
    return rates


@pytest.mark.parametrize("max_retries", [0, 2])
def test_skipped_steps_do_not_advance_the_schedule(max_retries):
    net, ref = half_net("net"), half_net("ref")
    solver, ref_solver = net.solver("Momentum", lr=1.0, momentum=0.9), ref.solver(
        "Momentum", lr=1.0, momentum=0.9)
    updater = FixedLossScalingUpdater(solver, net.loss, net.feeder, scale=SCALE,
                                      overflow=OverflowHandling(
                                          max_retries=max_retries), lr_scheduler=schedule())
    rates, skipped = [], 0
    while net.calls < 14:
        before = net.snapshot()
        result = updater.update()
        skipped += result.attempts - 1 + result.skipped
        if result.skipped:
            assert_bitwise_equal(net.snapshot(), before)
        else:
            rates.append(solver.learning_rate())
    assert skipped == len(LARGE) and updater.updates == 14 - len(LARGE)
    # the rates the solver used: the schedule at 0, 1, 2, ... applied updates
    assert rates == [as_float32(schedule().get_learning_rate(k)) for k in range(len(rates))]
    # keyed on the loop counter it would have been shifted by the skips
    assert rates != [as_float32(schedule().get_learning_rate(k))
                     for k in range(net.calls) if k not in LARGE]
    assert hand_loop(ref, ref_solver, 14) == rates
    assert_bitwise_equal(net.snapshot(), ref.snapshot())
    assert_states_bitwise_equal(solver_states(solver), solver_states(ref_solver))


def test_a_resumed_run_continues_the_schedule(tmp_path):
    def make(scope):
        net = half_net(scope)
        solver = net.solver("Momentum", lr=1.0, momentum=0.9)
        updater = None

        def feeder():                   # batches by step: a resumed run sees the same
            net.feed(updater.steps)

        updater = DynamicLossScalingUpdater(solver, net.loss, feeder, scale=SCALE, N=1000,
                                            lr_scheduler=schedule())
        return net, solver, updater

    def run(updater, solver, steps):
        rates = []
        for _ in range(steps):
            if not updater.update().skipped:
                rates.append(solver.learning_rate())
        return rates

    net, solver, updater = make("whole")
    whole = run(updater, solver, 12)
    first_net, first_solver, first = make("first")
    before = run(first, first_solver, 6)
    first.save_checkpoint(str(tmp_path / "ckpt.nnmpt"))
    second_net, second_solver, second = make("second")
    second.load_checkpoint(str(tmp_path / "ckpt.nnmpt"))
    after = run(second, second_solver, 6)
    assert before + after == whole
    assert whole == [as_float32(schedule().get_learning_rate(k)) for k in range(len(whole))]
    assert second.updates == updater.updates == len(whole) and updater.skipped_steps > 0
    assert_bitwise_equal(second_net.snapshot(), net.snapshot())


def test_a_schedule_is_checked():
    net = Net()
    with raises_naming(TypeError, "lr_scheduler", "None", "get_learning_rate(iter)",
                       "nnabla.utils.learning_rate_scheduler", "0.1", "float"):
        FixedLossScalingUpdater(net.solver(), net.loss, lr_scheduler=0.1)


class _Broken:
    def get_learning_rate(self, iter):
        return 0.1 if iter < 2 else math.nan


def test_a_non_finite_rate_is_refused_before_the_step_changes_anything():
    net = Net()
    updater = FixedLossScalingUpdater(net.solver(), net.loss, net.feeder, scale=1.0,
                                      lr_scheduler=_Broken())
    updater.update(), updater.update()
    before = net.snapshot()
    with raises_naming(ValueError, "lr_scheduler.get_learning_rate(2)", "nan", "finite",
                       ">= 0", "the step is not taken"):
        updater.update()
    assert_bitwise_equal(net.snapshot(), before)
    # the step was not taken: the counters agree, the state saves and loads
    assert (updater.steps, updater.updates, updater.skipped_steps) == (2, 2, 0)
    updater.load_state_dict(updater.state_dict())


class _Given:
    """A schedule of one rate, whatever the update."""

    def __init__(self, rate):
        self.rate = rate

    def get_learning_rate(self, iter):
        return self.rate


@pytest.mark.parametrize("rate, facts", [
    (-0.1, ("lr_scheduler.get_learning_rate(0)", "-0.1", ">= 0")),
    (math.inf, ("lr_scheduler.get_learning_rate(0)", "inf", "finite")),
    ("abc", ("lr_scheduler.get_learning_rate(0)", "'abc'", "str", "not a number"))])
def test_a_rate_that_is_negative_infinite_or_no_number_is_refused(rate, facts):
    net = Net()
    updater = FixedLossScalingUpdater(net.solver(), net.loss, net.feeder, scale=1.0,
                                      lr_scheduler=_Given(rate))
    before = net.snapshot()
    with raises_naming(ValueError, *facts):
        updater.update()
    assert_bitwise_equal(net.snapshot(), before)


def test_a_rate_of_zero_is_taken_and_leaves_the_parameters():
    # a warm-up that starts from 0: the step is taken, with no change to the parameters
    net = Net()
    updater = FixedLossScalingUpdater(net.solver("Sgd", lr=0.5), net.loss, net.feeder,
                                      scale=1.0, lr_scheduler=_Given(0.0))
    before = net.snapshot()
    assert updater.update().updated and updater.updates == 1
    assert_bitwise_equal(net.snapshot(), before)


def test_the_migration_page_s_warm_up_is_the_script_s_update_by_update():
    """nnabla-examples' cifar10 sets the rate after its update ``i`` (``if i <=
    warmup_iter: lr = base_lr + warmup_slope * i``), so each update runs at the rate the
    previous one set; the page's schedule, keyed on applied updates, must give each update
    that same rate."""
    import re
    from doc_pages import ROOT
    page = (ROOT / "docs" / "migration.rst").read_text(encoding="utf-8")
    source = re.search(r"\n(    class Warmup:\n(?:        .*\n|\n)+)", page).group(1)
    namespace = {"base_lr": 1e-3, "n_devices": 4, "warmup_iter": 10}
    exec(compile("\n".join(line[4:] for line in source.splitlines()), "migration.rst",
                 "exec"), namespace)
    warmup = namespace["Warmup"]()
    base_lr, slope = 1e-3, 1e-3 * 3 / 10
    lr, script = base_lr, []                  # the solver starts at base_lr
    for i in range(30):
        script.append(lr)                     # the rate update i runs at
        if i <= 10:
            lr = base_lr + slope * i          # set after update i, for the next one
    assert [warmup.get_learning_rate(i) for i in range(30)] == script

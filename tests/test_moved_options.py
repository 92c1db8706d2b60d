"""The keywords that moved into the objects they configure: each still works for a release,
warns once naming its new spelling, and trains exactly as its new spelling does."""
import warnings

import numpy as np
import pytest

import nnabla as nn
from nnabla_mpt import (DynamicLossScale, DynamicLossScalingUpdater, FixedLossScalingUpdater,
                        GradientReduction, OverflowHandling, PrecisionSchedule)
from nnabla_mpt.options import MOVED
from support import Net, assert_bitwise_equal, batch_for, build

START, N = 2.0 ** 12, 2
# old keyword: (its value in the run, the new spelling the warning names, the new object)
POLICY_CASES = {
    "backoff_factor": (0.25, "policy=DynamicLossScale(backoff_factor=...)"),
    "hysteresis": (2, "policy=DynamicLossScale(hysteresis=...)"),
    "min_scale": (2.0 ** 10, "policy=DynamicLossScale(min_scale=...)"),
    "max_scale": (2.0 ** 13, "policy=DynamicLossScale(max_scale=...)"),
}
OBJECT_CASES = {
    "overflow_mode": ("saturation", "overflow=OverflowHandling(mode=...)",
                      dict(overflow=OverflowHandling(mode="saturation"))),
    "max_retries": (2, "overflow=OverflowHandling(max_retries=...)",
                    dict(overflow=OverflowHandling(max_retries=2))),
    "floor_policy": ("ignore", "overflow=OverflowHandling(floor_policy=...)",
                     dict(overflow=OverflowHandling(floor_policy="ignore"))),
    "diagnose_after": (2, "overflow=OverflowHandling(diagnose_after=...)",
                       dict(overflow=OverflowHandling(diagnose_after=2, floor_policy="warn"))),
    "average_accum": (True, "reduction=GradientReduction(average_accum=...)",
                      dict(reduction=GradientReduction(average_accum=True))),
    "average_ranks": (True, "reduction=GradientReduction(average_ranks=...)",
                      dict(reduction=GradientReduction(average_ranks=True))),
    "all_reduce_callback": (1024, "reduction=GradientReduction(all_reduce_callback=...)",
                            dict(reduction=GradientReduction(all_reduce_callback=1024))),
    "shared_grads": (False, "reduction=GradientReduction(shared_grads=...)",
                     dict(reduction=GradientReduction(shared_grads=False))),
    "abort_on_exception": (False, "reduction=GradientReduction(abort_on_exception=...)",
                           dict(reduction=GradientReduction(abort_on_exception=False))),
}
SCHEDULE_SPELLINGS = {
    "accelerate_train_mode": "schedule=PrecisionSchedule(mode=...)",
    "total_steps": "schedule=PrecisionSchedule(total_steps=...)",
    "final_loss": "schedule=PrecisionSchedule(final_loss=...)",
    "high_precision_loss": "schedule=PrecisionSchedule(high_precision_loss=...)",
}


def test_every_moved_keyword_is_covered_here():
    assert sorted(MOVED) == sorted(list(POLICY_CASES) + list(OBJECT_CASES)
                                   + list(SCHEDULE_SPELLINGS))


def _deprecations(make):
    """``(updater, messages of the DeprecationWarnings and the files they point at)``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        updater = make()
    said = [(str(w.message), w.filename) for w in caught if "deprecated" in str(w.message)]
    assert all(issubclass(w.category, DeprecationWarning) for w in caught
               if "deprecated" in str(w.message))
    return updater, said


def _run(make, steps=8):
    """Trains a float16 net whose batches 2, 3 and 5 overflow at the start scale; returns
    the updater, its step results and the parameters after each step."""
    net = Net("half", scope=f"moved{id(make)}")
    net.large = {2, 3, 5}
    with nn.parameter_scope(f"moved{id(make)}"):
        updater, said = _deprecations(lambda: make(net))
    trajectory = []
    for _ in range(steps):
        r = updater.update()
        trajectory.append(((r.step, r.skipped, r.scale, r.next_scale, r.attempts),
                           net.snapshot()))
    return updater, said, trajectory


def _same_runs(old, new):
    for (step_old, params_old), (step_new, params_new) in zip(old, new):
        assert step_old == step_new
        assert_bitwise_equal(params_old, params_new)


@pytest.mark.parametrize("keyword", sorted(POLICY_CASES))
def test_a_policy_keyword_warns_once_and_trains_as_its_policy(keyword):
    value, spelling = POLICY_CASES[keyword]
    old = lambda net: DynamicLossScalingUpdater(  # noqa: E731
        net.solver("Sgd", lr=0.01), net.loss, net.feeder, scale=START, N=N, **{keyword: value})
    new = lambda net: DynamicLossScalingUpdater(  # noqa: E731
        net.solver("Sgd", lr=0.01), net.loss, net.feeder,
        policy=DynamicLossScale(init_scale=START, growth_interval=N, **{keyword: value}))
    updater, said, trajectory = _run(old)
    assert said == [(f"DynamicLossScalingUpdater({keyword}=...) is deprecated and will be "
                     f"removed in 0.2.0: pass {spelling} with the scale's other settings in "
                     f"it (init_scale, growth_factor, growth_interval, growth_mode: its "
                     f"defaults are not the updater's) instead", __file__)]
    reference, said_new, expected = _run(new)
    assert said_new == []
    _same_runs(trajectory, expected)
    assert getattr(updater, keyword) == getattr(updater.policy, keyword) == value


@pytest.mark.parametrize("keyword", sorted(OBJECT_CASES))
@pytest.mark.parametrize("cls", [DynamicLossScalingUpdater, FixedLossScalingUpdater])
def test_an_object_keyword_warns_once_and_trains_as_its_object(cls, keyword):
    value, spelling, new_kwargs = OBJECT_CASES[keyword]
    comm = None
    if keyword in ("average_ranks", "all_reduce_callback"):
        from nnabla_mpt import MPICommunicator
        comm = MPICommunicator(abort_on_exception=False)
    extra = dict(accum_grad=2) if keyword == "average_accum" else {}
    # A streak raises with a fixed scale: the old spelling warns instead, as the new does.
    warn = dict(floor_policy="warn") if keyword == "diagnose_after" else {}
    old = lambda net: cls(net.solver("Sgd", lr=0.01), net.loss, net.feeder,  # noqa: E731
                          scale=START, comm=comm, **extra, **warn, **{keyword: value})
    new = lambda net: cls(net.solver("Sgd", lr=0.01), net.loss, net.feeder,  # noqa: E731
                          scale=START, comm=comm, **extra, **new_kwargs)
    updater, said, trajectory = _run(old)
    assert said[-1] == (f"{cls.__name__}({keyword}=...) is deprecated and will be removed in "
                        f"0.2.0: pass {spelling} instead", __file__)
    assert len(said) == 1 + len(warn)
    reference, said_new, expected = _run(new)
    assert said_new == []
    _same_runs(trajectory, expected)
    group, field = MOVED[keyword]
    assert getattr(getattr(updater, group), field) == value
    assert getattr(updater, group) == getattr(reference, group)


@pytest.mark.parametrize("mode, trigger", [("fast|step|0.5", {"total_steps": 8}),
                                           ("fast|loss|1.2", {"final_loss": 1e3})])
def test_the_schedule_keywords_warn_once_each_and_train_as_the_schedule(mode, trigger):
    def run(spell):
        x, t, loss_half, loss_float, solver = build()
        updater, said = _deprecations(lambda: DynamicLossScalingUpdater(
            solver, loss_half, None, scale=START, N=N, **spell(loss_float)))
        results = []
        for step in range(8):
            x.d, t.d = batch_for(step)
            r = updater.update()
            results.append((r.step, r.skipped, r.scale, r.precision, float(r.loss)))
        params = {k: v.d.copy() for k, v in nn.get_parameters().items()}
        nn.clear_parameters()
        return updater, said, results, params

    old = lambda high: dict(accelerate_train_mode=mode, high_precision_loss=high,  # noqa
                            **trigger)
    new = lambda high: dict(schedule=PrecisionSchedule(  # noqa: E731
        mode, high_precision_loss=high, **trigger))
    updater, said, results, params = run(old)
    names = ["accelerate_train_mode", "high_precision_loss"] + list(trigger)
    assert sorted(said) == sorted(
        (f"DynamicLossScalingUpdater({name}=...) is deprecated and will be removed in 0.2.0: "
         f"pass {SCHEDULE_SPELLINGS[name]} instead", __file__) for name in names)
    reference, said_new, expected, expected_params = run(new)
    assert said_new == [] and results == expected
    assert "float" in [r[3] for r in results]           # the schedule switched
    assert_bitwise_equal(params, expected_params)
    assert updater.schedule.mode.text == reference.schedule.mode.text == mode


def test_a_moved_keyword_given_with_its_new_place_is_refused():
    net = Net()
    with pytest.raises(TypeError, match=r"^DynamicLossScalingUpdater\(\) got floor_policy= "
                                        r"and overflow=: floor_policy is a field of overflow "
                                        r"now; pass it there \(overflow=OverflowHandling\("
                                        r"floor_policy=\.\.\.\)\)$"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            DynamicLossScalingUpdater(net.solver(), net.loss, floor_policy="warn",
                                      overflow=OverflowHandling(max_retries=1))


@pytest.mark.parametrize("given", [dict(scale=1024.0), dict(N=5), dict(scaling_factor=4.0),
                                   dict(growth_mode="measured")])
def test_the_policy_refuses_the_settings_it_holds(given):
    net = Net()
    name = next(iter(given))
    with pytest.raises(TypeError, match=rf"got policy= and {name}=: the policy holds them"):
        DynamicLossScalingUpdater(net.solver(), net.loss, policy=DynamicLossScale(), **given)


def test_the_policy_goes_with_a_measured_start():
    net = Net("half")
    updater = DynamicLossScalingUpdater(net.solver(), net.loss, net.feeder, scale="auto",
                                        policy=DynamicLossScale(min_scale=4.0, max_scale=2.0 ** 12,
                                                                growth_mode="measured"))
    first = updater.update()
    assert 4.0 <= first.scale <= 2.0 ** 12 and updater.policy.growth_mode == "measured"
    assert updater.policy is not None and updater.policy.max_scale == 2.0 ** 12


def test_a_schedule_keyword_without_the_mode_is_refused():
    net = Net()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match=r"^total_steps=10 needs accelerate_train_mode"):
            DynamicLossScalingUpdater(net.solver(), net.loss, total_steps=10)


def test_the_updater_keeps_a_schedule_of_its_own():
    x, t, loss_half, loss_float, solver = build()
    given = PrecisionSchedule("fast|loss|1.2", final_loss=1e3, high_precision_loss=loss_float)
    updater = DynamicLossScalingUpdater(solver, loss_half, None, schedule=given)
    x.d, t.d = batch_for(0)
    assert updater.update().precision == "half" and updater.schedule.switch_step == 1
    assert given.switch_step is None and updater.schedule is not given
    np.testing.assert_equal(updater.high_precision_loss is loss_float, True)

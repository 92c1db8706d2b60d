"""Settings a script changes between steps (nnabla's updater reads its attributes at every
``update()``): each takes effect from the next ``update()``, checked as the constructor
checks it, or its assignment is refused naming it; never ignored, never a late failure.

The parameters are compared with the float64 reference of tests/test_updater_reference.py,
whose setting changes at the same step.
"""
import numpy as np
import pytest

from nnabla_mpt import (DynamicLossScale, DynamicLossScalingUpdater, FixedLossScalingUpdater,
                        GradientReduction, OverflowHandling)
from reference_step import SOLVERS
from support import Net, assert_names, raises_naming
from test_updater_reference import ReferenceTraining

CHANGE_AT = 3
# setting: (constructor value, new value, the reference's attribute and its new value)
CHANGES = {
    "weight_decay": (None, 0.5, {"wd": 0.5}),
    "clip_grad_norm": (None, 0.05, {"clip": 0.05}),
    "accum_grad": (1, 3, {"accum": 3}),
    "average_accum": (False, True, {"average": True}),
    "N": (100, 1, {"N": 1}),
    "scaling_factor": (2.0, 4.0, {"growth": 4.0, "backoff": 0.25}),
}


def _run(setting, kind="Momentum", steps=7):
    before, after, ref_change = CHANGES[setting]
    net = Net()
    start = net.snapshot()
    kwargs = {"accum_grad": 2} if setting == "average_accum" else {}
    kwargs[setting] = before
    kwargs.setdefault("N", 2)
    updater = DynamicLossScalingUpdater(net.solver(kind, **SOLVERS[kind]), net.loss,
                                        net.feeder, scale=64.0, **kwargs)
    ref = ReferenceTraining(start, kind, scale=64.0, N=kwargs["N"],
                            accum=kwargs.get("accum_grad", 1),
                            average=kwargs.get("average_accum", False),
                            wd=kwargs.get("weight_decay"), clip=kwargs.get("clip_grad_norm"))
    batch = 0
    for i in range(steps):
        if i == CHANGE_AT:
            setattr(updater, setting, after)
            for name, value in ref_change.items():
                setattr(ref, name, value)
        r = updater.update()
        scale, skipped = ref.step([net.batch(batch + j) for j in range(ref.accum)])
        batch += ref.accum
        assert (r.scale, r.skipped, r.next_scale) == (scale, skipped, ref.scale), (setting, i)
        for name, v in net.params.items():
            np.testing.assert_allclose(v.d, ref.w[name], rtol=2e-5, atol=1e-6,
                                       err_msg=f"{setting}: {name} after step {i}")
    assert getattr(updater, setting) == after
    assert net.calls == batch
    return updater, ref


@pytest.mark.parametrize("setting", sorted(CHANGES))
def test_a_setting_takes_effect_from_the_next_update(setting):
    _run(setting)


def test_the_changes_are_seen():
    # Each change moves the trajectory: the run differs from one without the change.
    updater, ref = _run("N")
    assert [updater.scale, ref.scale] == [64.0 * 2 ** 4, 64.0 * 2 ** 4]
    _, ref = _run("clip_grad_norm")
    assert ref.clipped_steps >= 2


def test_clear_buffer_and_max_retries_are_read_at_each_update():
    net = Net()
    net.huge = {1}                   # an overflow in saturation mode
    updater = DynamicLossScalingUpdater(net.solver(), net.loss, net.feeder, scale=64.0,
                                        overflow=OverflowHandling(mode="saturation"))
    updater.clear_buffer = False
    assert net.y.d is not None and updater.update().updated
    updater.max_retries = 1
    r = updater.update()             # batch 1 overflows, the retry runs batch 2
    assert (r.attempts, r.updated, net.calls) == (2, True, 3)


@pytest.mark.parametrize("setting, value, error", [
    ("weight_decay", -1.0, ValueError), ("accum_grad", 0, ValueError),
    ("clip_grad_norm", "big", TypeError), ("N", 0, ValueError),
    ("scaling_factor", 1.0, ValueError), ("max_retries", -1, ValueError),
    ("clear_buffer", "yes", TypeError), ("average_accum", 1, TypeError)])
def test_a_wrong_value_is_refused_naming_the_setting(setting, value, error):
    net = Net()
    updater = DynamicLossScalingUpdater(net.solver(), net.loss, net.feeder)
    old = getattr(updater, setting)
    with raises_naming(error, setting, repr(value)):
        setattr(updater, setting, value)
    assert getattr(updater, setting) == old
    assert updater.update().updated


def test_retries_without_the_check_are_refused_as_at_construction():
    net = Net()
    updater = FixedLossScalingUpdater(net.solver(), net.loss, net.feeder,
                                      enable_overflow_check=False)
    with raises_naming(ValueError, "max_retries=2", "enable_overflow_check=True"):
        updater.max_retries = 2
    assert updater.max_retries == 0


@pytest.mark.parametrize("setting", ["comm", "grads", "solver", "loss", "shared_gradients",
                                     "monitor", "enable_overflow_check", "policy",
                                     "schedule"])
def test_a_setting_the_step_was_built_around_refuses_assignment(setting):
    net = Net()
    updater = DynamicLossScalingUpdater(net.solver(), net.loss, net.feeder)
    old = getattr(updater, setting)
    new = None if old is not None else 1
    with raises_naming(AttributeError, f"DynamicLossScalingUpdater.{setting}",
                       "after construction", f"{setting} = {new!r}", "refused",
                       "build a new updater", "save_checkpoint", "load_checkpoint"):
        setattr(updater, setting, new)
    assert getattr(updater, setting) is old


def test_scaling_factor_keeps_a_given_backoff():
    net = Net()
    updater = DynamicLossScalingUpdater(net.solver(), net.loss, net.feeder,
                                        policy=DynamicLossScale(init_scale=8.0,
                                                                backoff_factor=0.25))
    updater.scaling_factor = 3.0
    assert (updater.policy.growth_factor, updater.policy.backoff_factor) == (3.0, 0.25)
    default = DynamicLossScalingUpdater(net.solver(), net.loss, net.feeder)
    default.scaling_factor = 4.0
    assert default.policy.backoff_factor == 0.25


@pytest.mark.parametrize("setting, spelling", [
    ("reduction", "reduction="), ("lr_scheduler", "lr_scheduler="),
    ("gradient_stats_every", "gradient_stats_every="), ("outputs", "outputs=")])
def test_any_other_option_is_read_only_and_says_where_to_pass_it(setting, spelling):
    net = Net()
    updater = DynamicLossScalingUpdater(net.solver(), net.loss, net.feeder, policy=
                                        DynamicLossScale(init_scale=8.0, min_scale=2.0,
                                                         hysteresis=2))
    old = getattr(updater, setting)
    with raises_naming(AttributeError, f"DynamicLossScalingUpdater.{setting}",
                       "after construction", f"{setting} = 7", "refused", f"pass {spelling}",
                       "constructor"):
        setattr(updater, setting, 7)
    assert getattr(updater, setting) == old
    assert (updater.policy.min_scale, updater.policy.hysteresis) == (2.0, 2)


def test_the_objects_read_as_the_settings_are_now():
    net = Net()
    updater = DynamicLossScalingUpdater(
        net.solver(), net.loss, net.feeder, accum_grad=2,
        overflow=OverflowHandling(mode="saturation", diagnose_after=3), average_accum=True)
    updater.floor_policy, updater.diagnose_after, updater.max_retries = "warn", 5, 2
    updater.average_accum = False
    assert updater.overflow == OverflowHandling(mode="saturation", max_retries=2,
                                                floor_policy="warn", diagnose_after=5)
    assert updater.average_accum is False and updater.reduction == GradientReduction()
    for name, value in [("overflow", OverflowHandling()), ("reduction", GradientReduction()),
                        ("policy", None), ("schedule", None)]:
        with raises_naming(AttributeError, f"DynamicLossScalingUpdater.{name}",
                           "after construction"):
            setattr(updater, name, value)


@pytest.mark.parametrize("setting, value", [
    ("floor_policy", "warn"), ("clip_grad_norm", 1.0), ("scale", 4.0), ("diagnose_after", 3),
    ("data_feeder", None)])
def test_every_setting_is_refused_alike_during_update(setting, value):
    net = Net()
    errors = []

    def monitor(result):
        try:
            setattr(updater, setting, value)
        except RuntimeError as error:
            errors.append(str(error))

    updater = DynamicLossScalingUpdater(net.solver(), net.loss, net.feeder, monitor=monitor)
    before = getattr(updater, setting)
    updater.update()
    assert len(errors) == 1, errors
    assert_names(errors[0], f"DynamicLossScalingUpdater.{setting} = {value!r}", "refused",
                 "during update()", "data_feeder", "monitor", "between update() calls",
                 "takes effect from the next one")
    assert getattr(updater, setting) == before


def test_diagnose_after_takes_effect_from_the_next_update():
    net = Net()
    net.huge = set(range(100))                    # saturation: every step overflows
    updater = DynamicLossScalingUpdater(net.solver(), net.loss, net.feeder, scale=64.0,
                                        overflow=OverflowHandling(mode="saturation",
                                                                  floor_policy="warn"))
    updater.diagnose_after = 2
    updater.update()
    assert updater.last_report is None
    updater.update()
    assert updater.last_report is not None and updater.overflow_streak == 2


def test_n_below_the_good_steps_counted_grows_at_the_next_step_and_saves():
    net = Net()
    updater = DynamicLossScalingUpdater(net.solver(), net.loss, net.feeder, scale=8.0, N=10)
    for _ in range(6):
        updater.update()
    updater.N = 3
    updater.load_state_dict(updater.state_dict())     # a consistent state: it loads
    assert updater.update().next_scale == 16.0        # the count was at the new N


def test_a_setting_assigned_during_update_is_refused():
    # The step running would mix the old and the new value (the passes ran with the old
    # accumulation, the unscale would divide by the new one).
    net = Net()
    errors = []

    def feeder():
        net.feeder()
        try:
            updater.accum_grad = 2
        except RuntimeError as error:
            errors.append(str(error))

    updater = DynamicLossScalingUpdater(net.solver(), net.loss, feeder,
                                        average_accum=True)
    assert updater.update().updated
    assert updater.accum_grad == 1 and len(errors) == 1
    assert_names(errors[0], "DynamicLossScalingUpdater.accum_grad = 2", "refused",
                 "during update()", "between update() calls")
    updater.accum_grad = 2                    # between steps: taken
    assert updater.accum_grad == 2


def test_n_assigned_during_update_is_refused_like_every_setting():
    net = Net()
    errors = []

    def feeder():
        net.feeder()
        try:
            updater.N = 1
        except RuntimeError as error:
            errors.append(str(error))

    updater = DynamicLossScalingUpdater(net.solver(), net.loss, feeder, N=5)
    updater.update()
    assert updater.N == 5 and len(errors) == 1
    assert_names(errors[0], "DynamicLossScalingUpdater.N = 1", "refused", "during update()",
                 "between update() calls")


def test_a_setting_that_never_changes_is_refused_alike_inside_and_outside_update():
    net = Net()
    errors = []

    def monitor(result):
        try:
            updater.comm = None
        except AttributeError as error:
            errors.append(str(error))

    updater = DynamicLossScalingUpdater(net.solver(), net.loss, net.feeder, monitor=monitor)
    updater.update()
    with pytest.raises(AttributeError) as outside:
        updater.comm = None
    assert errors == [str(outside.value)]
    assert_names(errors[0], "DynamicLossScalingUpdater.comm", "after construction")


def test_a_setting_assigned_from_another_thread_during_update_is_refused():
    import threading
    net = Net()
    entered, release, errors = threading.Event(), threading.Event(), []

    def feeder():
        net.feeder()
        if not entered.is_set():
            entered.set()
            assert release.wait(60)

    updater = DynamicLossScalingUpdater(net.solver(), net.loss, feeder, accum_grad=2)
    state = updater.state_dict()
    worker = threading.Thread(target=updater.update)
    worker.start()
    try:
        assert entered.wait(60)
        for name, value in [("data_feeder", net.feeder), ("weight_decay", 0.5)]:
            with pytest.raises(RuntimeError) as refused:
                setattr(updater, name, value)
            errors.append(str(refused.value))
        with raises_naming(RuntimeError, "DynamicLossScalingUpdater.load_state_dict()",
                           "refused", "another thread", "between update() calls"):
            updater.load_state_dict(state)

    finally:
        release.set()
        worker.join(60)
    assert_names(errors[1], "DynamicLossScalingUpdater.weight_decay = 0.5", "refused",
                 "another thread", "between update() calls", "takes effect from the next one",
                 "the thread that calls update()")
    assert updater.data_feeder is feeder and updater.weight_decay is None
    assert net.calls == 2                       # both micro-batches from the one feeder



LIVE = {"data_feeder", "scale", "scaling_factor", "N", "clear_buffer", "accum_grad",
        "average_accum", "weight_decay", "clip_grad_norm"}


@pytest.mark.parametrize("cls", [DynamicLossScalingUpdater, FixedLossScalingUpdater])
def test_every_parameter_of_the_constructor_is_a_setting(cls):
    # Each parameter reads back as a property of the class; assigning its own value either
    # keeps it (a live setting) or is refused, saying it cannot change after construction.
    import inspect
    net = Net()
    updater = cls(net.solver(), net.loss, net.feeder)
    for name in inspect.signature(cls).parameters:
        assert isinstance(inspect.getattr_static(cls, name), property), name
        value = getattr(updater, name)
        if name in LIVE:
            setattr(updater, name, value)
            assert getattr(updater, name) == value
        else:
            with raises_naming(AttributeError, f"{cls.__name__}.{name}",
                               "after construction"):
                setattr(updater, name, value)


def test_a_scale_assigned_before_auto_measured_it_is_the_one_used():
    net = Net("half")
    updater = DynamicLossScalingUpdater(net.solver(), net.loss, net.feeder, scale="auto")
    updater.scale = 64.0
    first = updater.update()
    assert first.scale == 64.0 and updater.state_dict()["calibration_pending"] is False


def test_a_fixed_scale_assigned_is_bounded_as_the_constructor_bounds_it():
    net = Net("half")
    updater = FixedLossScalingUpdater(net.solver(), net.loss, net.feeder, scale=1024.0)
    with raises_naming(ValueError, "scale=65536.0", "above 32768", "largest power of two",
                       "the loss's dtype", "scale <= 32768"):
        updater.scale = 2.0 ** 16
    with pytest.raises(ValueError):
        FixedLossScalingUpdater(net.solver(), net.loss, net.feeder, scale=2.0 ** 16)
    assert updater.scale == 1024.0 and updater.update().scale == 1024.0


@pytest.mark.parametrize("name", ["steps", "updates", "skipped_steps"])
def test_counters_are_refused_with_what_to_do_instead(name):
    # set alone, a counter would break steps == updates + skipped_steps, and the state
    # saved after it would not load
    net = Net()
    updater = DynamicLossScalingUpdater(net.solver(), net.loss, net.feeder)
    updater.update()
    with raises_naming(AttributeError, f"DynamicLossScalingUpdater.{name} = 7", "refused",
                       "counters", "steps = updates + skipped_steps", "update()",
                       "load_state_dict()", "load_checkpoint()", "a variable of the script"):
        setattr(updater, name, 7)
    assert (updater.steps, updater.updates, updater.skipped_steps) == (1, 1, 0)
    other = DynamicLossScalingUpdater(net.solver(), net.loss, net.feeder)
    other.load_state_dict(updater.state_dict())
    assert (other.steps, other.updates, other.skipped_steps) == (1, 1, 0)

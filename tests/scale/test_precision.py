"""Precision schedule (accelerate_train_mode): reduced precision first, full precision last."""
import logging

import numpy as np
import pytest

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
from nnabla.ext_utils import get_extension_context

from nnabla_mpt import DynamicLossScalingUpdater, FixedLossScalingUpdater
from nnabla_mpt.scale.precision import AccelerateTrainMode, PrecisionSchedule
from support import BATCH, assert_names, batch_for, build, make_updater, raises_naming

FLOAT = get_extension_context("cpu", type_config="float")


# -- parsing --------------------------------------------------------------------------------
@pytest.mark.parametrize("text, trigger, value", [
    ("fast|step|0.8", "step", 0.8), ("fast|step", "step", 0.9), ("fast|loss", "loss", 1.05),
    ("fast|loss|1.5", "loss", 1.5), ("fast|step|0.2", "step", 0.2),
    ("fast1|loss|1.01", "loss", 1.01),
])
def test_parse_valid_and_defaults(text, trigger, value):
    mode = AccelerateTrainMode.parse(text)
    assert (mode.trigger, mode.value) == (trigger, value)
    assert mode.text.split("|")[:2] == text.split("|")[:2]


# (the mode, the facts the refusal carries besides the mode as written)
@pytest.mark.parametrize("text, facts", [
    ("slow|step|0.9", ("TYPE", "'fast'", "'fast1'", "'slow'")),
    ("fast||0.9", ("TRIGGER", "'step'", "'loss'", "''")),
    ("fast|step|abc", ("VALUE", "number", "[0.2, 0.9]", "'step'", "'abc'")),
    ("fast|step|0.95", ("VALUE", "'step'", "[0.2, 0.9]", "0.95")),
    ("fast|step|0.1", ("VALUE", "'step'", "[0.2, 0.9]", "0.1")),
    ("fast|loss|2", ("VALUE", "'loss'", "[1.01, 1.5]", "2")),
    ("fast|loss|1.0", ("VALUE", "'loss'", "[1.01, 1.5]", "1.0")),
    ("fast|epoch|0.5", ("TRIGGER", "'step'", "'loss'", "'epoch'")),
    ("", ("malformed", "'TYPE|TRIGGER|VALUE'", "'fast|step|0.9'")),
    ("fast", ("malformed", "'TYPE|TRIGGER|VALUE'")),
    ("fast|step|0.5|x", ("malformed", "'TYPE|TRIGGER|VALUE'")),
    ("fast|step|", ("VALUE", "empty", "default 0.9", "[0.2, 0.9]")),
])
def test_parse_rejects_malformed(text, facts):
    with raises_naming(ValueError, f"mode={text!r}", *facts):
        AccelerateTrainMode.parse(text)


@pytest.mark.parametrize("text", ["fast|step|0.90", "fast|step|.9", "fast|step|9e-1",
                                  "fast|step|0.900000"])
def test_one_value_written_differently_is_the_same_schedule(text):
    mode = AccelerateTrainMode.parse(text)
    assert mode == AccelerateTrainMode.parse("fast|step|0.9")
    assert mode.text == "fast|step|0.9"


@pytest.mark.parametrize("text, value", [
    ("fast|step|\uff10.\uff19", "'\uff10.\uff19'"),         # fullwidth digits
    ("fast|loss|\u0661.\u0660\u0665", "'\u0661.\u0660\u0665'"),   # Arabic-Indic digits
])
def test_parse_rejects_non_ascii_digits(text, value):
    with raises_naming(ValueError, f"mode={text!r}", "VALUE", "ASCII digits 0-9", value):
        AccelerateTrainMode.parse(text)


def test_parse_rejects_non_string():
    with raises_naming(TypeError, "mode", "string", "'fast|step|0.9'", "0.9", "float"):
        AccelerateTrainMode.parse(0.9)


@pytest.mark.parametrize("value, total, first_float", [
    ("0.8", 50, 40), ("0.9", 10, 9), ("0.3", 7, 3), ("0.7", 10, 7), ("0.2", 1, 1)])
def test_step_switch_is_ceil_of_fraction(value, total, first_float):
    schedule = PrecisionSchedule(f"fast|step|{value}", total_steps=total)
    assert schedule.switch_step == first_float
    assert [schedule.reduced(k) for k in range(total)] == \
        [k < first_float for k in range(total)]


def test_schedule_arguments_checked():
    with raises_naming(ValueError, "mode='fast|step|0.5'", "'step' trigger", "pass total_steps"):
        PrecisionSchedule("fast|step|0.5")
    with raises_naming(ValueError, "mode='fast|loss'", "'loss' trigger", "pass final_loss"):
        PrecisionSchedule("fast|loss")
    with raises_naming(ValueError, "final_loss", "> 0", "-1.0"):
        PrecisionSchedule("fast|loss", final_loss=-1.0)
    with raises_naming(ValueError, "total_steps", ">= 1", "0"):
        PrecisionSchedule("fast|step", total_steps=0)
    with raises_naming(ValueError, "final_loss=0.5", "'loss' trigger", "mode='fast|step'",
                       "'step'"):
        PrecisionSchedule("fast|step", total_steps=3, final_loss=0.5)


# -- training -------------------------------------------------------------------------------
def params():
    return {k: v.d.copy() for k, v in nn.get_parameters().items()}


def test_step_trigger_50_at_0_8(caplog):
    u, (x, t, loss_half, loss_float, solver) = make_updater()
    initial = params()
    xs, ts = batch_for(10 ** 6)
    x.d, t.d = xs, ts
    loss_float.forward()
    initial_loss = float(loss_float.d)

    caplog.set_level(logging.INFO, logger="nnabla")
    results, before_switch = [], None
    for k in range(50):
        if k == 40:
            before_switch = params()
        results.append(u.update())
    assert [r.precision for r in results] == ["half"] * 40 + ["float"] * 10
    assert [r.step for r in results] == list(range(50))
    assert all(r.scale == 1.0 for r in results[40:])
    assert all(r.scale >= 1.0 for r in results[:40])
    # Parameters continue across the switch: the float steps start from where the half
    # steps ended, and the solver's step counter keeps counting.
    after = params()
    assert any(not np.array_equal(after[k], before_switch[k]) for k in after)
    assert all(st.t == u.updates for st in solver.get_states().values())
    assert u.updates == 50 - u.skipped_steps
    x.d, t.d = xs, ts
    loss_float.forward()
    assert float(loss_float.d) < 0.5 * initial_loss
    assert not any(np.array_equal(initial[k], after[k]) for k in after)
    switch_logs = [r for r in caplog.records if "full precision" in r.getMessage()]
    assert len(switch_logs) == 1
    assert_names(switch_logs[0].getMessage(), "full precision", "step 40 of 50")
    assert u.precision == "float" and u.scale == 1.0


def test_float_phase_matches_plain_float_training():
    """After the switch the updater is exactly a float training loop on the shared params."""
    u, (x, t, loss_half, loss_float, solver) = make_updater(total=10, mode="fast|step|0.5")
    for _ in range(5):
        u.update()
    start = params()
    states = {k: ({n: v.d.copy() for n, v in st.pstate.items()}, st.t)
              for k, st in solver.get_states().items()}
    for _ in range(5):
        assert u.update().precision == "float"
    ours = params()

    # Reference: restore, then plain float steps with the same batches.
    for k, v in nn.get_parameters().items():
        v.d = start[k]
    sts = solver.get_states()
    for k, st in sts.items():
        for n, v in st.pstate.items():
            v.d = states[k][0][n]
        st.t = states[k][1]
    solver.set_states(sts)
    for step in range(5, 10):
        x.d, t.d = batch_for(step)
        solver.zero_grad()
        loss_float.forward()
        loss_float.backward()
        solver.update()
    ref = params()
    for k in ours:
        np.testing.assert_array_equal(ours[k], ref[k])


def test_loss_trigger_switches_after_first_step_below_threshold(caplog):
    # Find the loss trajectory of a pure half run first, then choose the target.
    u, (x, t, loss_half, _, _) = make_updater(mode="fast|loss|1.2", final_loss=1e-9)
    probe = []
    for _ in range(40):
        r = u.update()
        probe.append(float(loss_half.d))
    assert all(r.precision == "half" for r in [r])
    target_step = 20
    final_loss = probe[target_step] / 1.2
    expected = next(k for k, v in enumerate(probe) if v <= 1.2 * final_loss)

    u, (x, t, loss_half, _, _) = make_updater(mode="fast|loss|1.2", final_loss=final_loss)
    caplog.set_level(logging.INFO, logger="nnabla")
    seen, precisions = [], []
    for _ in range(40):
        r = u.update()
        precisions.append(r.precision)
        if r.precision == "half":
            seen.append(float(loss_half.d))
    assert seen == probe[:expected + 1]
    assert precisions == ["half"] * (expected + 1) + ["float"] * (39 - expected)
    assert u.schedule.switch_step == expected + 1
    switch_logs = [r.getMessage() for r in caplog.records if "full precision" in r.getMessage()]
    assert len(switch_logs) == 1
    assert_names(switch_logs[0], "full precision", f"step {expected}", "1.2 x final_loss")


def test_loss_trigger_default_value():
    u, _ = make_updater(mode="fast|loss", final_loss=1.0)
    assert u.schedule.mode.value == 1.05
    assert u.schedule.loss_threshold == pytest.approx(1.05)


@pytest.mark.parametrize("mode, k", [("fast|step|0.8", 30), ("fast|step|0.8", 45),
                                     ("fast|loss|1.5", None)])
def test_resume_across_switch_bitwise(tmp_path, mode, k):
    total = 50
    final_loss = None
    if "loss" in mode:
        u, (_, _, loss_half, _, _) = make_updater(mode=mode, final_loss=1e-9)
        probe = []
        for _ in range(30):
            u.update()
            probe.append(float(loss_half.d))
        final_loss = probe[15] / 1.5
        total = 30
    u, _ = make_updater(mode=mode, total=total, final_loss=final_loss)
    full = [u.update() for _ in range(total)]
    full_params, full_state = params(), u.state_dict()
    if k is None:
        k = u.schedule.switch_step + 3
        assert 0 < k < total

    u, _ = make_updater(mode=mode, total=total, final_loss=final_loss)
    first = [u.update() for _ in range(k)]
    path = str(tmp_path / "ckpt.npz")
    u.save_checkpoint(path)
    del u

    u, _ = make_updater(mode=mode, total=total, final_loss=final_loss)
    u.load_checkpoint(path)
    assert u.precision == full[k].precision
    rest = [u.update() for _ in range(total - k)]
    assert first + rest == full
    assert u.state_dict() == full_state
    resumed = params()
    for name in full_params:
        np.testing.assert_array_equal(resumed[name], full_params[name])


def test_checkpoint_with_other_schedule_is_refused(tmp_path):
    u, _ = make_updater(mode="fast|step|0.8", total=50)
    u.update()
    path = str(tmp_path / "c.npz")
    u.save_checkpoint(path)
    u2, _ = make_updater(mode="fast|step|0.5", total=50)
    with raises_naming(ValueError, repr(path), "precision schedule", "checkpoint's",
                       "('fast|step|0.8', 50, None)", "this updater's",
                       "('fast|step|0.5', 50, None)"):
        u2.load_checkpoint(path)


def test_a_checkpoint_of_the_same_schedule_written_differently_loads(tmp_path):
    u, _ = make_updater(mode="fast|step|0.9", total=20)
    u.update()
    path = str(tmp_path / "c.npz")
    u.save_checkpoint(path)
    state = u.state_dict()
    other, _ = make_updater(mode="fast|step|0.90", total=20)
    other.load_checkpoint(path)
    assert other.state_dict() == state
    # a state written with the value as given (e.g. by an earlier version) loads too
    state["precision"]["mode"] = "fast|step|0.900"
    other.load_state_dict(state)
    assert other.steps == 1 and other.schedule.switch_step == 18


def test_the_scale_cannot_be_set_after_the_switch_to_full_precision():
    u, _ = make_updater(mode="fast|step|0.5", total=4)
    u.update()
    u.scale = 256.0                      # before the switch: the next step's scale
    assert u.scale == 256.0 and u.update().scale == 256.0
    assert u.precision == "float" and u.scale == 1.0
    with raises_naming(RuntimeError, "updater.scale = 8.0", "refused", "'fast|step|0.5'",
                       "full precision", "step 2", "scale 1", "no loss scale to set"):
        u.scale = 8.0
    assert u.scale == 1.0 and u.update().scale == 1.0


def test_fast1_needs_bfloat16_backend():
    x, t, loss_half, loss_float, solver = build()
    with raises_naming(ValueError, "'fast1|step|0.9'", "bfloat16", "'cpu'", "no bfloat16",
                       "use 'fast'"):
        DynamicLossScalingUpdater(solver, loss_half, schedule=PrecisionSchedule(
            "fast1|step|0.9", total_steps=10, high_precision_loss=loss_float))


def test_schedule_arguments_validated_by_updater():
    x, t, loss_half, loss_float, solver = build()
    with raises_naming(ValueError, "'fast|step|0.9'", "high_precision_loss",
                       "full-precision context", "high_precision_loss=..."):
        DynamicLossScalingUpdater(solver, loss_half,
                                  schedule=PrecisionSchedule("fast|step", total_steps=10))
    with raises_naming(TypeError, "schedule", "None", "nnabla_mpt.PrecisionSchedule",
                       "'fast|step'", "str"):
        DynamicLossScalingUpdater(solver, loss_half, schedule="fast|step")
    with raises_naming(ValueError, "high_precision_loss", "float context", "type_config='float'",
                       "half"):
        DynamicLossScalingUpdater(solver, loss_half, schedule=PrecisionSchedule(
            "fast|step", total_steps=10, high_precision_loss=loss_half))
    with raises_naming(ValueError, "'fast|step|0.9'", "loss", "half context",
                       "type_config='half'", "float"):
        DynamicLossScalingUpdater(solver, loss_float, schedule=PrecisionSchedule(
            "fast|step", total_steps=10, high_precision_loss=loss_float))
    with nn.context_scope(FLOAT), nn.parameter_scope("other"):
        xo = nn.Variable((BATCH, 4))
        stranger = F.mean(PF.affine(xo, 1, name="fc") ** 2)
    with raises_naming(ValueError, "high_precision_loss", "the solver's parameters",
                       "['net/fc1/affine/W', 'net/fc1/affine/b', 'net/fc2/affine/W', "
                       "'net/fc2/affine/b']", "same parameter scope"):
        DynamicLossScalingUpdater(solver, loss_half, schedule=PrecisionSchedule(
            "fast|step", total_steps=10, high_precision_loss=stranger))


def test_fixed_updater_accepts_schedule():
    x, t, loss_half, loss_float, solver = build()
    state = {"n": 0}

    def feed():
        x.d, t.d = batch_for(state["n"])
        state["n"] += 1

    u = FixedLossScalingUpdater(solver, loss_half, feed, scale=64.0,
                                schedule=PrecisionSchedule("fast|step|0.5", total_steps=4,
                                                           high_precision_loss=loss_float))
    results = [u.update() for _ in range(4)]
    assert [(r.precision, r.scale) for r in results] == \
        [("half", 64.0), ("half", 64.0), ("float", 1.0), ("float", 1.0)]

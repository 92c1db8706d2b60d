"""Updater state and atomic checkpoints; resume in a new process reproduces the run bitwise."""
import errno
import gc
import json
import logging
import os
import resource
import signal
import subprocess
import sys

import numpy as np
import pytest

from doc_pages import ROOT
from nnabla_mpt import (DynamicLossScale, DynamicLossScalingUpdater, FixedLossScalingUpdater,
                        OverflowHandling, PrecisionSchedule)
from support import (Net, assert_bitwise_equal, assert_names, assert_states_bitwise_equal,
                     raises_naming, resume_setup, run_steps, solver_states)

WORKER = str(ROOT / "tests" / "workers" / "resume_worker.py")


def _busy_dynamic(scope="net"):
    """8 steps, overflows at 2, 3, 4, 5 and 7: every counter has a distinct value.

    The overflows are batches whose scaled gradients exceed 65504 (saturation mode) while
    the loss stays finite.
    """
    net = Net(scope=scope)
    net.huge = {2, 3, 4, 5, 7}
    updater = DynamicLossScalingUpdater(net.solver("Adam", alpha=1e-2), net.loss, net.feeder,
                                        policy=DynamicLossScale(
                                            init_scale=64.0, growth_interval=3, hysteresis=2),
                                        overflow=OverflowHandling(
                                            mode="saturation", floor_policy="ignore"))
    for _ in range(8):
        updater.update()
    return net, updater


EXPECTED_STATE = {
    "version": 1, "updater": "DynamicLossScalingUpdater",
    "policy": {"version": 1, "kind": "dynamic", "scale": 4.0, "good_steps": 0,
               "hysteresis_left": 0, "growth_factor": 2.0, "backoff_factor": 0.5,
               "growth_interval": 3, "hysteresis": 2, "min_scale": 1.0,
               "max_scale": 2.0 ** 24, "growth_mode": "probe"},
    "precision": None,
    "steps": 8, "updates": 3, "skipped_steps": 5, "overflow_streak": 1,
    "longest_overflow_streak": 4, "bad_batches": 0, "calibration_pending": False,
    "scale_history": [],
}


def test_state_dict_covers_every_field():
    _, updater = _busy_dynamic()
    state = updater.state_dict()
    assert state == EXPECTED_STATE
    assert json.loads(json.dumps(state)) == state


def test_state_dict_round_trip_restores_state_and_behaviour():
    net, updater = _busy_dynamic()
    other_net = Net(scope="other")
    other = DynamicLossScalingUpdater(other_net.solver("Adam", alpha=1e-2), other_net.loss,
                                      other_net.feeder, scale=8.0, N=2000,
                                      overflow=OverflowHandling(
                                          mode="saturation", floor_policy="ignore"))
    other.load_state_dict(json.loads(json.dumps(updater.state_dict())))
    assert other.state_dict() == updater.state_dict()
    assert (other.scale, other.N, other.scaling_factor) == (4.0, 3, 2.0)
    # Same overflow pattern from here on: the two agree step by step.
    other_net.calls = net.calls
    other_net.huge = net.huge = {9, 10, 11, 15}
    for _ in range(10):
        a, b = updater.update(), other.update()
        assert (a.step, a.skipped, a.scale, a.next_scale) == (
            b.step, b.skipped, b.scale, b.next_scale)
        assert other.state_dict() == updater.state_dict()


def test_fixed_updater_state_round_trip():
    net = Net()
    net.bad = {1, 2}
    updater = FixedLossScalingUpdater(net.solver("Sgd", lr=0.1), net.loss, net.feeder,
                                      scale=32.0)
    for _ in range(4):
        updater.update()
    state = updater.state_dict()
    # the inf batches are bad batches: skipped and counted, no overflow streak
    assert state == {"version": 1, "updater": "FixedLossScalingUpdater",
                     "policy": {"version": 1, "kind": "fixed", "scale": 32.0},
                     "precision": None, "steps": 4, "updates": 2, "skipped_steps": 2,
                     "overflow_streak": 0, "longest_overflow_streak": 0, "bad_batches": 2,
                     "calibration_pending": False, "scale_history": []}
    other_net = Net(scope="other")
    other = FixedLossScalingUpdater(other_net.solver("Sgd", lr=0.1), other_net.loss,
                                    scale=2.0)
    other.load_state_dict(state)
    assert other.state_dict() == state and other.scale == 32.0


def _mutated(mutate):
    state = json.loads(json.dumps(EXPECTED_STATE))
    mutate(state)
    return state


# (how the state is changed, the exception, the facts the refusal carries)
@pytest.mark.parametrize("mutate, exc, facts", [
    (lambda s: s.pop("updates"), ValueError, ("state", "missing keys", "['updates']")),
    (lambda s: s.update(extra=3), ValueError, ("state", "unknown keys", "['extra']")),
    (lambda s: (s.pop("steps"), s.update(step=1)), ValueError,
     ("state", "missing keys", "['steps']", "unknown keys", "['step']")),
    (lambda s: s.update(version=7), ValueError, ("state", "version 7", "version 1")),
    (lambda s: s.update(updater="FixedLossScalingUpdater"), ValueError,
     ("saved by FixedLossScalingUpdater", "DynamicLossScalingUpdater")),
    (lambda s: s.update(steps=-1), ValueError, ("state['steps']", ">= 0", "-1")),
    (lambda s: s.update(bad_batches=-2), ValueError, ("state['bad_batches']", ">= 0", "-2")),
    (lambda s: s.update(version=2), ValueError, ("state", "version 2", "version 1")),
    (lambda s: s.update(scale_history=[1.0, float("inf")]), ValueError,
     ("state['scale_history'][1]", "finite", "inf")),
    (lambda s: s.update(scale_history=[0.0]), ValueError,
     ("state['scale_history'][0]", "> 0", "0.0")),
    (lambda s: s.update(scale_history=[1.0] * 9), ValueError,
     ("state['scale_history']", "9 reaches", "at most 8")),
    (lambda s: s.update(scale_history=4.0), TypeError,
     ("state['scale_history']", "list of reaches", "4.0")),
    (lambda s: s.update(calibration_pending=1), TypeError,
     ("state['calibration_pending']", "True", "False", "1", "int")),
    (lambda s: s.update(version=True), ValueError, ("state", "version True", "version 1")),
    (lambda s: s.update(version=1.0), ValueError, ("state", "version 1.0", "version 1")),
    (lambda s: s.update(updates=1.5), TypeError,
     ("state['updates']", "integer", "1.5", "float")),
    (lambda s: s["policy"].pop("scale"), ValueError,
     ("state['policy']", "missing keys", "['scale']")),
    (lambda s: s["policy"].update(kind="fixed"), ValueError,
     ("state['policy']", "'fixed'", "'dynamic'")),
    (lambda s: s["policy"].update(scale=float("nan")), ValueError,
     ("state['policy']['scale']", "finite", "nan")),
    (lambda s: s["policy"].update(scale="8"), TypeError,
     ("state['policy']['scale']", "real number", "'8'", "str")),
    (lambda s: s["policy"].update(max_scale=-1.0), ValueError,
     ("state['policy']['max_scale']", "> 0", "-1.0")),
    (lambda s: s["policy"].update(min_scale=1e-50), ValueError,
     ("state['policy']['min_scale']=1e-50", "float32", "seed", "1.401298464324817e-45",
      "1.7014118346046923e+38")),
    (lambda s: s["policy"].update(growth_interval=0), ValueError,
     ("state['policy']['growth_interval']", ">= 1", "0")),
    (lambda s: s.pop("precision"), ValueError, ("state", "missing keys", "['precision']")),
    (lambda s: s.update(precision={"mode": "fast|step|0.9"}), ValueError,
     ("state", "precision schedule", "'fast|step|0.9'", "this updater", "None")),
])
def test_load_state_dict_errors_change_nothing(mutate, exc, facts):
    net = Net()
    updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.1), net.loss, net.feeder,
                                        scale=16.0, N=5)
    updater.update()
    before = updater.state_dict()
    with raises_naming(exc, *facts):
        updater.load_state_dict(_mutated(mutate))
    assert updater.state_dict() == before


# Each broken rule is written as the counters' values in it.
@pytest.mark.parametrize("counters, rule", [
    ({"steps": 9}, "updates=3 + skipped_steps=5 != steps=9"),
    ({"updates": 4, "steps": 9, "overflow_streak": 5},
     "overflow_streak=5 > longest_overflow_streak=4"),
    ({"overflow_streak": 6, "longest_overflow_streak": 6}, "overflow_streak=6 > skipped_steps=5"),
    ({"longest_overflow_streak": 6}, "longest_overflow_streak=6 > skipped_steps=5"),
    ({"bad_batches": 6}, "bad_batches=6 > skipped_steps=5"),
], ids=["steps", "streak above longest", "streak above skipped", "longest above skipped",
        "bad batches above skipped"])
def test_load_state_dict_refuses_inconsistent_counters(counters, rule):
    net = Net()
    updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.1), net.loss, net.feeder,
                                        policy=DynamicLossScale(
                                            init_scale=16.0, growth_interval=3, hysteresis=2))
    updater.update()
    before = updater.state_dict()
    with raises_naming(ValueError, "counters", "inconsistent", rule):
        updater.load_state_dict(_mutated(lambda s: s.update(counters)))
    assert updater.state_dict() == before


def _nnabla_warnings(caplog):
    return [r.getMessage() for r in caplog.records
            if r.name == "nnabla" and r.levelno == logging.WARNING]


def _assert_warned(caplog, *warnings):
    """One nnabla warning for each tuple of facts, in this order, each holding its facts."""
    said = _nnabla_warnings(caplog)
    assert len(said) == len(warnings), said
    for text, facts in zip(said, warnings):
        assert_names(text, "nnabla_mpt", *facts)


def test_load_state_dict_warns_once_about_the_settings_it_replaces(caplog):
    caplog.set_level(logging.INFO, logger="nnabla")
    net = Net()
    same = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.1), net.loss,
                                     policy=DynamicLossScale(
                                         init_scale=8.0, growth_interval=3, hysteresis=2))
    same.load_state_dict(EXPECTED_STATE)
    assert _nnabla_warnings(caplog) == []

    other = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.1), net.loss,
                                      policy=DynamicLossScale(
                                          init_scale=8.0, growth_factor=4.0,
                                          backoff_factor=1 / 4.0, growth_interval=2000,
                                          min_scale=2.0))
    other.load_state_dict(EXPECTED_STATE)
    # each setting the state replaces: the constructor's value, then the state's
    _assert_warned(caplog, ("the loaded state", "constructor", "scaling_factor=4", "2",
                            "backoff_factor=0.25", "0.5", "N=2000", "3", "hysteresis=1", "2",
                            "min_scale=2", "1"))
    assert (other.N, other.scaling_factor, other.policy.min_scale) == (3, 2.0, 1.0)


def test_load_checkpoint_warns_about_the_settings_it_replaces(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="nnabla")
    first = Net("half", scope="first")
    saved = DynamicLossScalingUpdater(first.solver("Sgd", lr=0.1), first.loss,
                                      policy=DynamicLossScale(
                                          init_scale=1024.0, backoff_factor=0.25,
                                          max_scale=16384.0, growth_mode="measured"))
    path = tmp_path / "ckpt.npz"
    saved.save_checkpoint(path)
    second = Net("half", scope="first")
    resumed = DynamicLossScalingUpdater(second.solver("Sgd", lr=0.1), second.loss)
    resumed.load_checkpoint(path)
    _assert_warned(caplog, ("the loaded state", "constructor", "backoff_factor=0.5", "0.25",
                            "max_scale=32768", "16384", "growth_mode='probe'", "'measured'"))
    assert resumed.state_dict() == saved.state_dict()


def _float32_state(scale=2.0 ** 20, **policy):
    net = Net(scope="first")
    updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.1), net.loss, net.feeder,
                                        policy=DynamicLossScale(
                                            init_scale=scale, max_scale=max(scale, 2.0 ** 24)))
    updater.update()
    state = updater.state_dict()
    state["policy"].update(policy)
    return updater, state


# what a warning about a state's scale above float16's ceiling carries besides the values
LOWERED = ("loaded", "above 32768", "largest power of two", "float16",
           "backward(scale)", "overflows every step", "lowered to 32768")


def test_a_float32_state_loaded_into_a_float16_updater_keeps_to_its_ceiling(caplog):
    caplog.set_level(logging.INFO, logger="nnabla")
    _, state = _float32_state()
    assert (state["policy"]["scale"], state["policy"]["max_scale"]) == (2.0 ** 20, 2.0 ** 24)
    net = Net("half", scope="first")
    updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.01), net.loss, net.feeder,
                                        N=1000)
    updater.load_state_dict(state)
    _assert_warned(caplog, ("state['policy']['scale']=1048576",
                            "state['policy']['max_scale']=16777216") + LOWERED,
                   ("the loaded state", "constructor", "N=1000", "2000"))
    assert (updater.scale, updater.policy.max_scale) == (2.0 ** 15, 2.0 ** 15)
    assert [updater.update().skipped for _ in range(6)] == [False] * 6
    # the counters and the settings the dtype does not bound are the state's
    assert (updater.steps, updater.N) == (7, 2000)


def test_a_crafted_checkpoint_loaded_into_a_float16_updater_keeps_to_its_ceiling(
        tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="nnabla")
    saved, state = _float32_state(scale=2.0 ** 30, max_scale=1e308, growth_interval=1,
                                  good_steps=0)
    saved.load_state_dict(state)          # a float32 graph lowers them to 2**127
    assert (saved.scale, saved.policy.max_scale) == (2.0 ** 30, 2.0 ** 127)
    # compact numbers, not 309 digits
    assert_names(_nnabla_warnings(caplog)[0], "nnabla_mpt", "loaded",
                 "state['policy']['max_scale']=1e+308", "1.7014118346046923e+38",
                 "largest power of two", "float32", "backward(scale)",
                 "lowered to 1.7014118346046923e+38")
    with raises_naming(ValueError, "DynamicLossScale.max_scale", "1e+308", "refused",
                       "max_scale=1e+308", "1.70141e+38", "largest power of two"):
        saved.policy.max_scale = 1e308    # the policy refuses it; a crafted file has it:
    saved.policy.__dict__["max_scale"] = 1e308
    path = tmp_path / "crafted.npz"
    saved.save_checkpoint(path)
    caplog.clear()
    net = Net("half", scope="first")
    updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.01), net.loss, net.feeder, N=1)
    updater.load_checkpoint(path)
    _assert_warned(caplog, ("state['policy']['scale']=1073741824",
                            "state['policy']['max_scale']=1e+308") + LOWERED)
    results = [updater.update() for _ in range(12)]
    assert [r.skipped for r in results] == [False] * 12
    assert {r.scale for r in results} == {2.0 ** 15}


def test_a_fixed_float32_state_loaded_into_a_float16_updater_keeps_to_its_ceiling(caplog):
    caplog.set_level(logging.INFO, logger="nnabla")
    first = Net(scope="first")
    state = FixedLossScalingUpdater(first.solver(), first.loss, scale=2.0 ** 20).state_dict()
    net = Net("half", scope="first")
    updater = FixedLossScalingUpdater(net.solver("Sgd", lr=0.01), net.loss, net.feeder)
    updater.load_state_dict(state)
    _assert_warned(caplog, ("state['policy']['scale']=1048576",) + LOWERED)
    assert updater.scale == 2.0 ** 15 and not updater.update().skipped


def test_a_state_whose_min_scale_float16_cannot_seed_is_refused():
    net = Net("half", scope="first")
    updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.01), net.loss, net.feeder)
    before = updater.state_dict()
    for low, written in ((2.0 ** -30, "9.313225746154785e-10"), (2.0 ** 16, "65536")):
        _, state = _float32_state(scale=2.0 ** 17, min_scale=low, max_scale=2.0 ** 18)
        with raises_naming(ValueError, f"state['policy']['min_scale']={written}", "float16",
                           "seed", "5.960464477539063e-08", "32768"):
            updater.load_state_dict(state)
        assert updater.state_dict() == before


def test_a_state_with_the_calibration_due_makes_a_numeric_scale_measure_with_a_warning(
        caplog):
    net = Net("half", scope="auto")
    auto = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.1), net.loss, net.feeder,
                                     scale="auto")
    state = auto.state_dict()
    other = Net("half", scope="number")
    number = DynamicLossScalingUpdater(other.solver("Sgd", lr=0.1), other.loss, other.feeder,
                                       scale=8.0)
    caplog.set_level(logging.WARNING, logger="nnabla")
    number.load_state_dict(state)
    _assert_warned(caplog, ("the loaded state", "constructor", "scale=8", "'auto'"))
    assert number.state_dict() == state
    caplog.set_level(logging.INFO, logger="nnabla")
    number.update()
    assert any("scale='auto' starts at" in r.getMessage() for r in caplog.records)
    assert number.state_dict()["calibration_pending"] is False


def test_a_state_with_the_calibration_due_loads_silently_into_an_auto_updater(caplog):
    net = Net("half", scope="auto_from")
    state = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.1), net.loss, net.feeder,
                                      scale="auto").state_dict()
    other = Net("half", scope="auto_to")
    auto = DynamicLossScalingUpdater(other.solver("Sgd", lr=0.1), other.loss, other.feeder,
                                     scale="auto")
    caplog.set_level(logging.WARNING, logger="nnabla")
    auto.load_state_dict(state)
    assert not [r for r in caplog.records if "the loaded state" in r.getMessage()]
    assert auto.state_dict() == state


def test_a_fixed_updater_refuses_a_state_with_the_calibration_due():
    net = Net()
    updater = FixedLossScalingUpdater(net.solver("Sgd", lr=0.1), net.loss, net.feeder,
                                      scale=32.0)
    state = {**updater.state_dict(), "calibration_pending": True}
    with raises_naming(ValueError, "state['calibration_pending']", "True",
                       "FixedLossScalingUpdater", "no scale='auto'"):
        updater.load_state_dict(state)
    assert updater.state_dict()["calibration_pending"] is False


def test_load_state_dict_with_a_precision_schedule_is_all_or_nothing():
    import nnabla as nn
    import nnabla.functions as F
    import nnabla.parametric_functions as PF
    import nnabla.solvers as S
    from support import context

    x, t = nn.Variable((4, 3)), nn.Variable((4, 1))
    losses = {}
    for kind in ("half", "float"):
        with nn.context_scope(context(kind)), nn.parameter_scope("net"):
            losses[kind] = F.mean(F.squared_error(PF.affine(x, 1, name="fc"), t))
    with nn.context_scope(context("half")):
        solver = S.Adam(0.01)
    solver.set_parameters(nn.get_parameters())
    updater = DynamicLossScalingUpdater(solver, losses["half"], scale=64.0, N=3,
                                        schedule=PrecisionSchedule(
                                            "fast|step|0.5", total_steps=10,
                                            high_precision_loss=losses["float"]))
    before = updater.state_dict()
    state = json.loads(json.dumps(before))
    state["policy"]["scale"] = 8.0
    state["steps"] = state["updates"] = 3
    state["precision"]["total_steps"] = 20          # not this updater's schedule
    with raises_naming(ValueError, "checkpoint's", "precision schedule", "total_steps",
                       "('fast|step|0.5', 20, None)", "this updater's",
                       "('fast|step|0.5', 10, None)"):
        updater.load_state_dict(state)
    assert updater.state_dict() == before           # the policy was not loaded either


def test_fixed_state_cannot_be_loaded_into_dynamic_updater():
    net = Net()
    fixed = FixedLossScalingUpdater(net.solver("Sgd", lr=0.1), net.loss)
    dynamic = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.1), net.loss)
    with raises_naming(ValueError, "saved by FixedLossScalingUpdater",
                       "DynamicLossScalingUpdater"):
        dynamic.load_state_dict(fixed.state_dict())
    with raises_naming(ValueError, "saved by DynamicLossScalingUpdater",
                       "FixedLossScalingUpdater"):
        fixed.load_state_dict(dynamic.state_dict())


# -- checkpoints ------------------------------------------------------------------------------

def _adam_run(scope="net", bad=()):
    net = Net(scope=scope, hidden=3)
    net.bad = set(bad)
    solver = net.solver("Adam", alpha=1e-2)
    updater = DynamicLossScalingUpdater(solver, net.loss, net.feeder, scale=32.0, N=2)
    return net, solver, updater


def test_checkpoint_round_trip_in_process(tmp_path):
    net, solver, updater = _adam_run(bad={1, 5})
    run_steps(updater, 3)
    path = tmp_path / "ckpt.npz"
    updater.save_checkpoint(path)
    calls = net.calls
    expected_results = run_steps(updater, 4)
    expected = (net.snapshot(), solver_states(solver), updater.state_dict())

    updater.load_checkpoint(path)
    assert updater.steps == 3
    net.calls = calls
    assert run_steps(updater, 4) == expected_results
    assert_bitwise_equal(net.snapshot(), expected[0])
    assert_states_bitwise_equal(solver_states(solver), expected[1])
    assert updater.state_dict() == expected[2]


def test_save_checkpoint_replaces_the_file_and_leaves_no_temporary(tmp_path):
    net, solver, updater = _adam_run()
    path = tmp_path / "ckpt.npz"
    updater.save_checkpoint(path)
    first = path.read_bytes()
    run_steps(updater, 2)
    updater.save_checkpoint(str(path))
    assert sorted(os.listdir(tmp_path)) == ["ckpt.npz"]
    assert path.read_bytes() != first
    params, states = net.snapshot(), solver_states(solver)
    run_steps(updater, 2)
    updater.load_checkpoint(path)
    assert updater.steps == 2
    assert_bitwise_equal(net.snapshot(), params)
    assert_states_bitwise_equal(solver_states(solver), states)


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_failed_write_keeps_the_previous_checkpoint(tmp_path):
    net, solver, updater = _adam_run()
    path = tmp_path / "ckpt.npz"
    updater.save_checkpoint(path)
    previous = path.read_bytes()
    run_steps(updater, 2)
    # A real write failure: the file-size limit makes the write fail with EFBIG.
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (256, hard))
    try:
        with pytest.raises(OSError) as info:
            updater.save_checkpoint(path)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)
    assert info.value.errno == errno.EFBIG
    # Nothing half-open is left behind to fail again when it is collected.
    del info
    gc.collect()
    assert path.read_bytes() == previous
    assert sorted(os.listdir(tmp_path)) == ["ckpt.npz"]
    updater.load_checkpoint(path)                    # still a valid checkpoint
    assert updater.steps == 0


def test_failed_rename_leaves_no_temporary(tmp_path):
    _, _, updater = _adam_run()
    target = tmp_path / "ckpt.npz"
    target.mkdir()
    (target / "keep").write_text("x")
    with pytest.raises(OSError):
        updater.save_checkpoint(target)
    assert sorted(os.listdir(tmp_path)) == ["ckpt.npz"]
    assert os.listdir(target) == ["keep"]


def test_save_into_a_missing_directory_fails_cleanly(tmp_path):
    _, _, updater = _adam_run()
    with pytest.raises(FileNotFoundError):
        updater.save_checkpoint(tmp_path / "missing" / "ckpt.npz")
    assert os.listdir(tmp_path) == []


def test_load_checkpoint_rejects_other_parameters_and_lists_them(tmp_path):
    _, _, updater = _adam_run(scope="a")
    path = tmp_path / "ckpt.npz"
    updater.save_checkpoint(path)
    other = Net(scope="b", hidden=None)              # no hidden layer
    other_updater = DynamicLossScalingUpdater(other.solver("Adam", alpha=1e-2), other.loss)
    before = other.snapshot()
    with raises_naming(ValueError, "parameters", repr(str(path)), "unknown keys",
                       "['hidden/affine/W', 'hidden/affine/b']"):
        other_updater.load_checkpoint(path)
    assert_bitwise_equal(other.snapshot(), before)

    wide = Net(scope="c", hidden=3, d_out=3)
    wide_updater = DynamicLossScalingUpdater(wide.solver("Adam", alpha=1e-2), wide.loss)
    before = wide.snapshot()
    # each array that differs, with its shape in the file, and the shape here
    with raises_naming(ValueError, "the solver's shapes", repr(str(path)), "in the file",
                       "param/out/affine/W: (3, 2)", "(3, 3)", "param/out/affine/b: (2,)",
                       "(3,)", "solver/out/affine/W/mean: (3, 2)", "(3, 3)") as info:
        wide_updater.load_checkpoint(path)
    message = str(info.value)
    assert "hidden" not in message
    assert "PosixPath" not in message
    assert_bitwise_equal(wide.snapshot(), before)


def test_load_checkpoint_with_another_solver_changes_nothing(tmp_path):
    net, _, updater = _adam_run(scope="a")
    run_steps(updater, 2)
    path = tmp_path / "ckpt.npz"
    updater.save_checkpoint(path)
    other = Net(scope="b", hidden=3, seed=5)
    solver = other.solver("Momentum", lr=0.1, momentum=0.9)
    other_updater = DynamicLossScalingUpdater(solver, other.loss, other.feeder, scale=2.0)
    other_updater.update()
    before = (other.snapshot(), solver_states(solver), other_updater.state_dict())
    with raises_naming(ValueError, "solver state", "'out/affine/b'", repr(str(path)),
                       "missing keys", "['m']", "unknown keys", "['mean', 'var']"):
        other_updater.load_checkpoint(path)
    assert_bitwise_equal(other.snapshot(), before[0])
    assert_states_bitwise_equal(solver_states(solver), before[1])
    assert other_updater.state_dict() == before[2]


def test_load_checkpoint_into_another_updater_type_changes_nothing(tmp_path):
    net, _, updater = _adam_run(scope="a")
    run_steps(updater, 2)
    path = tmp_path / "ckpt.npz"
    updater.save_checkpoint(path)
    other = Net(scope="b", hidden=3, seed=5)
    solver = other.solver("Adam", alpha=1e-2)
    fixed = FixedLossScalingUpdater(solver, other.loss, other.feeder)
    before = (other.snapshot(), solver_states(solver), fixed.state_dict())
    with pytest.raises(ValueError):
        fixed.load_checkpoint(path)
    assert_bitwise_equal(other.snapshot(), before[0])
    assert_states_bitwise_equal(solver_states(solver), before[1])
    assert fixed.state_dict() == before[2]


def test_load_checkpoint_rejects_a_foreign_file(tmp_path):
    path = tmp_path / "other.npz"
    np.savez(path, w=np.zeros(3))
    _, _, updater = _adam_run()
    with raises_naming(ValueError, repr(str(path)), "not an nnabla_mpt checkpoint"):
        updater.load_checkpoint(path)


# -- resume in a new process --------------------------------------------------------------------

def _read_worker_output(path):
    with np.load(path) as archive:
        meta = json.loads(archive["meta"].tobytes().decode("utf-8"))
        arrays = {k: archive[k] for k in archive.files if k != "meta"}
    params = {k[len("param/"):]: v for k, v in arrays.items() if k.startswith("param/")}
    states = {}
    for name, t in meta["t"].items():
        prefix = f"solver/{name}/"
        states[name] = (t, {k[len(prefix):]: v for k, v in arrays.items()
                            if k.startswith(prefix)})
    results = [tuple(r) for r in meta["results"]]
    return params, states, meta["state"], results


def test_resume_in_a_new_process_reproduces_the_run_bitwise(tmp_path):
    k = 8
    # The uninterrupted run: 2k steps.
    net, solver, updater = resume_setup(scope="full")
    full_results = run_steps(updater, 2 * k)
    full = (net.snapshot(), solver_states(solver), updater.state_dict())
    # The trajectory is worth the test: overflows on both sides of the checkpoint.
    assert any(r[1] for r in full_results[:k]) and any(r[1] for r in full_results[k:])
    assert any(not r[1] for r in full_results[k:])

    # k steps, checkpoint, then k more steps in a new process.
    first, first_solver, first_updater = resume_setup(scope="first")
    assert run_steps(first_updater, k) == full_results[:k]
    checkpoint = tmp_path / "ckpt.npz"
    first_updater.save_checkpoint(checkpoint)
    output = tmp_path / "resumed.npz"
    proc = subprocess.run([sys.executable, WORKER, str(checkpoint), str(k), str(output)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    params, states, state, results = _read_worker_output(output)

    assert results == full_results[k:]
    assert state == full[2]
    assert_bitwise_equal(params, full[0])
    assert_states_bitwise_equal(states, full[1])
    assert all(t == full[2]["updates"] for t, _ in states.values())

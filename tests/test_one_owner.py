"""The updater owns its state: saves are of one step, assignments are checked wherever
they are made, only the loop and the settings change the policy, and an updater is
neither copied nor pickled."""
import copy
import pathlib
import pickle
import re
import threading

import numpy as np
import pytest

import nnabla_mpt
from nnabla_mpt import DynamicLossScale, DynamicLossScalingUpdater, FixedLossScalingUpdater
from support import Net, assert_bitwise_equal, raises_naming


def test_saves_from_a_second_thread_during_update_are_each_of_one_step(tmp_path):
    # A second thread saves as fast as it can while the first trains: every file it wrote
    # holds the parameters and the state the updater had after one and the same step.
    net = Net("half", scope="saved")
    net.large = {3, 4, 11}
    updater = DynamicLossScalingUpdater(net.solver("Momentum", lr=0.01, momentum=0.9),
                                        net.loss, net.feeder, scale=2.0 ** 12, N=3,
                                        accum_grad=2)
    after = [(updater.state_dict(), net.snapshot())]     # after each step, from step 0
    done, saved, refused = threading.Event(), [], []

    def save_while_training():
        k = 0
        while not done.is_set():
            path = tmp_path / f"ckpt{k}.npz"
            try:
                updater.save_checkpoint(str(path))
                saved.append(path)
            except RuntimeError as error:            # allowed, with a message
                refused.append(str(error))
            k += 1

    saver = threading.Thread(target=save_while_training)
    saver.start()
    try:
        for _ in range(24):
            updater.update()
            after.append((updater.state_dict(), net.snapshot()))
    finally:
        done.set()
        saver.join(120)
    assert len(saved) >= 10 and refused == []
    states = [state for state, _ in after]
    for path in saved:
        updater.load_checkpoint(str(path))
        state = updater.state_dict()
        assert state in states, path
        assert_bitwise_equal(net.snapshot(), after[states.index(state)][1])


def test_a_save_from_the_step_s_own_monitor_is_refused_with_a_message(tmp_path):
    net = Net(scope="own_monitor")
    calls = []

    def monitor(result):
        with raises_naming(RuntimeError, "save_checkpoint()", "refused", "during update()",
                           "data_feeder", "monitor", "between update() calls"):
            updater.save_checkpoint(str(tmp_path / "x.npz"))
        calls.append(result.step)

    updater = DynamicLossScalingUpdater(net.solver(), net.loss, net.feeder, monitor=monitor)
    updater.update()
    assert calls == [0] and not (tmp_path / "x.npz").exists()
    updater.save_checkpoint(str(tmp_path / "x.npz"))        # between steps it saves
    assert (tmp_path / "x.npz").exists()


# (the setting, the value assigned, the facts the refusal carries)
@pytest.mark.parametrize("name, value, facts", [
    ("growth_factor", float("nan"),
     ("DynamicLossScale.growth_factor", "refused", "growth_factor", "finite", "nan")),
    ("growth_factor", -3, ("DynamicLossScale.growth_factor", "refused", "> 1", "-3")),
    ("backoff_factor", 7, ("DynamicLossScale.backoff_factor", "refused", "> 0", "< 1", "7")),
    ("growth_interval", 0, ("DynamicLossScale.growth_interval", "refused", ">= 1", "0")),
    ("min_scale", 2.0 ** 20, ("DynamicLossScale.min_scale", "refused", "<=",
                              "min_scale=1048576.0", "max_scale=32768.0")),
    ("max_scale", 2.0 ** 20, ("DynamicLossScale.max_scale", "refused", "max_scale=1.04858e+06",
                              "above 32768", "largest power of two", "the loss's dtype")),
    ("min_scale", 2.0 ** -30, ("DynamicLossScale.min_scale", "refused", "min_scale=9.31323e-10",
                               "below 5.96046e-08", "smallest positive", "the loss's dtype")),
    ("growth_mode", "guess", ("DynamicLossScale.growth_mode", "refused", "'probe'", "'measured'",
                              "'guess'")),
    ("growth_factr", 3.0, ("DynamicLossScale", "no setting", "'growth_factr'", "3.0", "refused",
                           "growth_factor", "backoff_factor", "growth_mode")),
])
def test_an_assignment_to_the_updater_s_policy_is_checked_and_changes_nothing(name, value,
                                                                             facts):
    net = Net("half", scope="policy_fields")
    updater = DynamicLossScalingUpdater(net.solver(), net.loss, net.feeder, scale=1024.0, N=2)
    before = updater.policy.state_dict()
    with raises_naming((TypeError, ValueError, AttributeError), *facts):
        setattr(updater.policy, name, value)
    assert updater.policy.state_dict() == before
    results = [updater.update() for _ in range(4)]
    assert [r.scale for r in results] == [1024.0, 1024.0, 2048.0, 2048.0]


def test_the_bounds_the_loss_can_seed_are_themselves_allowed():
    # float16's smallest positive value is a scale its seed holds: min_scale may be it
    net = Net("half", scope="policy_edges")
    updater = DynamicLossScalingUpdater(net.solver(), net.loss, net.feeder, scale=1024.0)
    updater.policy.min_scale = 2.0 ** -24
    updater.policy.max_scale = 2.0 ** 15
    assert (updater.policy.min_scale, updater.policy.max_scale) == (2.0 ** -24, 2.0 ** 15)


def test_a_standalone_policy_checks_every_assignment():
    policy = DynamicLossScale(init_scale=64.0, growth_interval=3, hysteresis=2)
    with raises_naming(ValueError, "DynamicLossScale.growth_factor", "-3", "refused",
                       "growth_factor", "> 1", "-3"):
        policy.growth_factor = -3
    with raises_naming(ValueError, "DynamicLossScale.backoff_factor", "7", "refused"):
        policy.backoff_factor = 7
    policy.update(True)
    policy.update(True)
    assert policy.loss_scale == 32.0                     # never -192
    policy.growth_interval = 1                           # a count at it grows next
    policy.hysteresis = 1
    assert (policy.growth_interval, policy.hysteresis_left) == (1, 0)
    policy.update(False)
    assert policy.loss_scale == 64.0


@pytest.mark.parametrize("name, closest", [("weight_decy", "weight_decay"),
                                           ("scael", "scale"), ("clip_norm", "clip_grad_norm")])
def test_an_attribute_the_updater_does_not_have_is_refused_naming_the_closest(name, closest):
    net = Net(scope="misspelt")
    updater = DynamicLossScalingUpdater(net.solver(), net.loss, net.feeder)
    with raises_naming(AttributeError, "DynamicLossScalingUpdater", "no setting", f"'{name}'",
                       f"{name} = 0.5", "refused", f"'{closest}'"):
        setattr(updater, name, 0.5)
    assert not hasattr(updater, name) and updater.weight_decay is None


@pytest.mark.parametrize("cls", [DynamicLossScalingUpdater, FixedLossScalingUpdater])
@pytest.mark.parametrize("duplicate", [copy.copy, copy.deepcopy, pickle.dumps])
def test_an_updater_is_neither_copied_nor_pickled(cls, duplicate):
    net = Net(scope="copied")
    updater = cls(net.solver(), net.loss, net.feeder)
    with raises_naming(TypeError, cls.__name__, "copied", "pickled", "state_dict()",
                       "save_checkpoint(path)", "load_state_dict()", "load_checkpoint(path)"):
        duplicate(updater)
    assert np.isfinite(updater.scale)


#: The modules that change an updater's policy: the construction bounds it, the step loop
#: tells it of each step and gives it the start scale="auto" measured, the settings and the
#: loaded state set it. The meter, the collapse watch and the deciders only read it.
POLICY_CHANGERS = {"scale/bounded_policy.py", "step_loop.py", "settings.py", "updater.py",
                   "updater_state.py"}
CHANGES = re.compile(r"policy\.(?:set_\w+|update|load_state_dict)\(|policy\.\w+ = ")


def test_only_the_loop_and_the_settings_change_the_policy():
    package = pathlib.Path(nnabla_mpt.__file__).parent
    changing = {path.relative_to(package).as_posix() for path in package.rglob("*.py")
                if any(CHANGES.search(line) and not line.lstrip().startswith(">>>")
                       for line in path.read_text(encoding="utf-8").splitlines())}
    assert changing == POLICY_CHANGERS

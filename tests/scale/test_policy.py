"""The pure loss-scale policies: no nnabla involved."""
import math
import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nnabla_mpt.scale.policy import DynamicLossScale, FixedLossScale
from support import raises_naming


def test_policy_import_does_not_load_nnabla_or_mpi():
    code = ("import sys\n"
            "import nnabla_mpt.scale.policy\n"
            "import nnabla_mpt\n"
            "from nnabla_mpt import DynamicLossScale, FixedLossScale\n"
            "loaded = sorted(m for m in sys.modules\n"
            "                if m.split('.')[0] in ('nnabla', 'mpi4py'))\n"
            "print(','.join(loaded))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "", f"modules loaded by the import: {out.stdout.strip()}"


# -- growth ---------------------------------------------------------------------------------

@pytest.mark.parametrize("interval", [1, 2, 3, 7])
def test_growth_after_exactly_growth_interval_good_steps_and_again(interval):
    p = DynamicLossScale(init_scale=4.0, growth_interval=interval, max_scale=2.0 ** 30)
    expected = 4.0
    for cycle in range(3):
        for i in range(interval - 1):
            assert p.update(False) is False
            assert p.loss_scale == expected, (cycle, i)
            assert p.good_steps == i + 1
        p.update(False)
        expected *= 2.0
        assert p.loss_scale == expected, f"no growth after {interval} good steps"
        assert p.good_steps == 0


def test_growth_uses_growth_factor():
    p = DynamicLossScale(init_scale=10.0, growth_factor=3.0, growth_interval=2, max_scale=1e6)
    scales = []
    for _ in range(6):
        p.update(False)
        scales.append(p.loss_scale)
    assert scales == [10.0, 30.0, 30.0, 90.0, 90.0, 270.0]


def test_overflow_resets_the_good_step_count():
    p = DynamicLossScale(init_scale=64.0, growth_interval=3)
    p.update(False)
    p.update(False)
    assert p.good_steps == 2
    p.update(True)                      # backs off to 32 and restarts the count
    assert (p.loss_scale, p.good_steps) == (32.0, 0)
    p.update(False)
    p.update(False)
    assert p.loss_scale == 32.0         # only two good steps since the overflow
    p.update(False)
    assert p.loss_scale == 64.0


def test_update_returns_its_argument_as_bool():
    p = DynamicLossScale(init_scale=8.0)
    assert p.update(True) is True
    assert p.update(False) is False
    assert p.update(np.bool_(True)) is True
    assert p.update(0) is False
    f = FixedLossScale(8.0)
    assert f.update(True) is True
    assert f.update(np.bool_(False)) is False


# -- hysteresis -----------------------------------------------------------------------------

def test_hysteresis_budget_spent_by_overflows_then_back_off():
    p = DynamicLossScale(init_scale=1024.0, hysteresis=3, growth_interval=4)
    assert p.hysteresis_left == 3
    p.update(True)
    assert (p.loss_scale, p.hysteresis_left) == (1024.0, 2)
    p.update(True)
    assert (p.loss_scale, p.hysteresis_left) == (1024.0, 1)
    p.update(True)                      # budget exhausted: back off
    assert (p.loss_scale, p.hysteresis_left) == (512.0, 0)
    p.update(True)                      # stays exhausted: every overflow backs off at once
    assert (p.loss_scale, p.hysteresis_left) == (256.0, 0)
    # Good steps short of a growth do not refill the budget.
    for _ in range(3):
        p.update(False)
    assert p.hysteresis_left == 0
    p.update(True)
    assert (p.loss_scale, p.hysteresis_left) == (128.0, 0)
    # A growth refills it.
    for _ in range(4):
        p.update(False)
    assert (p.loss_scale, p.hysteresis_left) == (256.0, 3)
    p.update(True)
    p.update(True)
    assert p.loss_scale == 256.0
    p.update(True)
    assert p.loss_scale == 128.0


def test_hysteresis_one_backs_off_on_every_overflow():
    p = DynamicLossScale(init_scale=1024.0, hysteresis=1)
    for expected in (512.0, 256.0, 128.0):
        p.update(True)
        assert p.loss_scale == expected


def test_interleaved_good_steps_do_not_refill_hysteresis():
    p = DynamicLossScale(init_scale=1024.0, hysteresis=2, growth_interval=10)
    p.update(True)
    p.update(False)
    p.update(True)
    assert p.loss_scale == 512.0


# -- bounds ---------------------------------------------------------------------------------

def test_back_off_clamps_at_min_scale_and_reports_it():
    p = DynamicLossScale(init_scale=3.0, min_scale=2.0)
    assert not p.at_min_scale
    p.update(True)
    assert p.loss_scale == 2.0          # not 1.5
    assert p.at_min_scale
    p.update(True)
    assert p.loss_scale == 2.0


def test_growth_clamps_at_max_scale():
    p = DynamicLossScale(init_scale=3.0, growth_interval=1, max_scale=5.0)
    p.update(False)
    assert p.loss_scale == 5.0          # not 6
    p.update(False)
    assert p.loss_scale == 5.0


def test_set_loss_scale_checks_bounds_and_restarts_growth_count():
    p = DynamicLossScale(init_scale=8.0, growth_interval=3, min_scale=2.0, max_scale=64.0)
    p.update(False)
    p.update(False)
    p.set_loss_scale(16.0)
    assert (p.loss_scale, p.good_steps) == (16.0, 0)
    with raises_naming(ValueError, "scale", "min_scale", "max_scale", "2", "64", "128.0"):
        p.set_loss_scale(128.0)
    with raises_naming(ValueError, "scale", "min_scale", "max_scale", "2", "64", "1.0"):
        p.set_loss_scale(1.0)
    assert p.loss_scale == 16.0


# -- invariants (hypothesis) ----------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(s0=st.floats(2.0, 2.0 ** 24), k=st.integers(0, 60),
       backoff=st.sampled_from([0.5, 0.25, 0.125]),
       min_scale=st.sampled_from([1.0, 2.0, 0.5]))
def test_k_overflows_from_s0_exact_for_power_of_two_backoff(s0, k, backoff, min_scale):
    p = DynamicLossScale(init_scale=s0, backoff_factor=backoff, min_scale=min_scale,
                         max_scale=2.0 ** 24)
    for _ in range(k):
        p.update(True)
    assert p.loss_scale == max(min_scale, s0 * backoff ** k)


@settings(max_examples=200, deadline=None)
@given(s0=st.floats(1.0, 2.0 ** 24), k=st.integers(0, 60),
       backoff=st.floats(0.05, 0.95), min_scale=st.floats(1e-3, 1.0))
def test_k_overflows_from_s0_any_backoff(s0, k, backoff, min_scale):
    p = DynamicLossScale(init_scale=s0, backoff_factor=backoff, min_scale=min_scale,
                         max_scale=2.0 ** 24)
    for _ in range(k):
        p.update(True)
    assert p.loss_scale == pytest.approx(max(min_scale, s0 * backoff ** k), rel=1e-12)
    assert p.loss_scale >= min_scale


class ReferencePolicy:
    """An independent statement of the documented rules.

    It counts overflows since the last growth (instead of a remaining budget) and steps since
    the last event (instead of a good-step counter).
    """

    def __init__(self, scale, growth, backoff, interval, hysteresis, lo, hi):
        self.scale, self.growth, self.backoff = scale, growth, backoff
        self.interval, self.hysteresis, self.lo, self.hi = interval, hysteresis, lo, hi
        self.overflows_since_growth = 0
        self.good_since_event = 0

    def step(self, overflow):
        if overflow:
            self.good_since_event = 0
            self.overflows_since_growth += 1
            if self.overflows_since_growth >= self.hysteresis:
                self.scale = max(self.lo, self.scale * self.backoff)
        else:
            self.good_since_event += 1
            if self.good_since_event == self.interval:
                self.scale = min(self.hi, self.scale * self.growth)
                self.good_since_event = 0
                self.overflows_since_growth = 0

    @property
    def hysteresis_left(self):
        return max(0, self.hysteresis - self.overflows_since_growth)


@settings(max_examples=300, deadline=None)
@given(flags=st.lists(st.booleans(), max_size=120),
       interval=st.integers(1, 6), hysteresis=st.integers(1, 4),
       growth=st.sampled_from([2.0, 3.0, 1.5]), backoff=st.sampled_from([0.5, 0.3, 0.75]),
       s0_exp=st.integers(0, 10))
def test_random_overflow_sequences_match_reference(flags, interval, hysteresis, growth,
                                                   backoff, s0_exp):
    lo, hi = 1.0, 2.0 ** 12
    s0 = 2.0 ** s0_exp
    p = DynamicLossScale(init_scale=s0, growth_factor=growth, backoff_factor=backoff,
                         growth_interval=interval, hysteresis=hysteresis,
                         min_scale=lo, max_scale=hi)
    ref = ReferencePolicy(s0, growth, backoff, interval, hysteresis, lo, hi)
    for i, flag in enumerate(flags):
        assert p.update(flag) is flag
        ref.step(flag)
        assert p.loss_scale == ref.scale, f"step {i}"
        assert p.good_steps == ref.good_since_event, f"step {i}"
        assert p.hysteresis_left == ref.hysteresis_left, f"step {i}"
        assert lo <= p.loss_scale <= hi


# -- state ----------------------------------------------------------------------------------

DYNAMIC_KEYS = {"version", "kind", "scale", "good_steps", "hysteresis_left", "growth_factor",
                "backoff_factor", "growth_interval", "hysteresis", "min_scale", "max_scale",
                "growth_mode"}


def _busy_policy():
    p = DynamicLossScale(init_scale=96.0, growth_factor=3.0, backoff_factor=0.25,
                         growth_interval=5, hysteresis=3, min_scale=1.5, max_scale=5000.0)
    for flag in (True, False, False):
        p.update(flag)
    return p


def test_dynamic_state_dict_has_every_field_as_plain_values():
    p = _busy_policy()
    state = p.state_dict()
    assert set(state) == DYNAMIC_KEYS
    assert state == {"version": 1, "kind": "dynamic", "scale": 96.0, "good_steps": 2,
                     "hysteresis_left": 2, "growth_factor": 3.0, "backoff_factor": 0.25,
                     "growth_interval": 5, "hysteresis": 3, "min_scale": 1.5,
                     "max_scale": 5000.0, "growth_mode": "probe"}
    # Every attribute of the object, and of its record of the steps, is saved (none
    # silently dropped on rebuild); the seed's bounds are the updater's.
    attributes = ({name.lstrip("_") for name in vars(p)} - {"seed_bounds", "now"}
                  | set(type(p._now).__slots__))
    assert attributes <= set(state), f"not in state_dict: {attributes - set(state)}"
    assert json.loads(json.dumps(state)) == state
    assert all(type(v) in (int, float, str) for v in state.values())


def test_dynamic_state_round_trip_restores_state_and_behaviour():
    p = _busy_policy()
    q = DynamicLossScale()                      # every field different before loading
    q.load_state_dict(json.loads(json.dumps(p.state_dict())))
    assert q.state_dict() == p.state_dict()
    assert repr(q) == repr(p)
    rng = np.random.RandomState(0)
    for flag in rng.rand(200) < 0.3:
        assert p.update(flag) == q.update(flag)
        assert q.state_dict() == p.state_dict()


def test_dynamic_state_round_trip_is_not_tied_to_the_same_object():
    p = _busy_policy()
    state = p.state_dict()
    p.update(True)
    assert state["scale"] == 96.0               # a snapshot, not a view


# (how the state is changed, the facts the refusal carries)
@pytest.mark.parametrize("mutate, facts", [
    (lambda s: s.pop("good_steps"), ("state", "missing keys", "['good_steps']")),
    (lambda s: s.pop("min_scale") and s.pop("max_scale"),
     ("state", "missing keys", "['max_scale', 'min_scale']")),
    (lambda s: s.update(extra=1), ("state", "unknown keys", "['extra']")),
    (lambda s: (s.pop("hysteresis"), s.update(bogus=0)),
     ("state", "missing keys", "['hysteresis']", "unknown keys", "['bogus']")),
    (lambda s: s.update(version=2), ("state", "version 2", "version 1")),
    (lambda s: s.update(growth_mode="guess"),
     ("state['growth_mode']", "'probe'", "'measured'", "'guess'")),
    (lambda s: s.update(kind="fixed"), ("state", "'fixed' policy", "'dynamic'")),
    (lambda s: s.update(good_steps=5),
     ("state", "inconsistent", "good_steps=5", "< growth_interval=5")),
    (lambda s: s.update(hysteresis_left=4),
     ("state", "inconsistent", "hysteresis_left=4 <= hysteresis=3")),
    (lambda s: s.update(good_steps=-1), ("state['good_steps']", ">= 0", "-1")),
    (lambda s: s.update(growth_factor=0.5), ("state['growth_factor']", "> 1", "0.5")),
    (lambda s: s.update(scale=1e9),
     ("state['scale']", "min_scale", "max_scale", "1.5", "5000", "1000000000.0")),
    (lambda s: s.update(scale=float("nan")), ("state['scale']", "finite", "nan")),
])
def test_dynamic_load_state_dict_errors_leave_the_policy_unchanged(mutate, facts):
    target = DynamicLossScale(init_scale=16.0, growth_interval=7)
    before = target.state_dict()
    state = _busy_policy().state_dict()
    mutate(state)
    with raises_naming(ValueError, *facts):
        target.load_state_dict(state)
    assert target.state_dict() == before


def test_dynamic_load_state_dict_rejects_a_non_mapping():
    with raises_naming(TypeError, "state", "mapping", "state_dict()", "list"):
        DynamicLossScale().load_state_dict([("scale", 1.0)])


def test_fixed_policy_never_changes_and_round_trips():
    f = FixedLossScale(256.0)
    for flag in (True, True, False, True):
        assert f.update(flag) is flag
        assert f.loss_scale == 256.0
    assert not f.at_min_scale
    state = f.state_dict()
    assert state == {"version": 1, "kind": "fixed", "scale": 256.0}
    attributes = {name.lstrip("_") for name in vars(f)}
    assert attributes <= set(state)
    g = FixedLossScale(2.0)
    g.load_state_dict(json.loads(json.dumps(state)))
    assert g.state_dict() == state and g.loss_scale == 256.0
    g.set_loss_scale(4.0)
    assert g.loss_scale == 4.0


@pytest.mark.parametrize("mutate, exc, facts", [
    (lambda s: s.pop("scale"), ValueError, ("state", "missing keys", "['scale']")),
    (lambda s: s.update(good_steps=0), ValueError, ("state", "unknown keys", "['good_steps']")),
    (lambda s: s.update(version=0), ValueError, ("state", "version 0", "version 1")),
    (lambda s: s.update(kind="dynamic"), ValueError, ("state", "'dynamic' policy", "'fixed'")),
    (lambda s: s.update(scale=0.5), ValueError, ("state['scale']", ">= 1", "0.5")),
    (lambda s: s.update(scale="8"), TypeError, ("state['scale']", "real number", "'8'", "str")),
])
def test_fixed_load_state_dict_errors(mutate, exc, facts):
    f = FixedLossScale(8.0)
    state = FixedLossScale(32.0).state_dict()
    mutate(state)
    with raises_naming(exc, *facts):
        f.load_state_dict(state)
    assert f.state_dict() == {"version": 1, "kind": "fixed", "scale": 8.0}


def test_dynamic_state_cannot_be_loaded_into_fixed_and_back():
    with raises_naming(ValueError, "state", "'dynamic' policy", "'fixed'"):
        FixedLossScale().load_state_dict(DynamicLossScale().state_dict())
    with raises_naming(ValueError, "state", "'fixed' policy", "'dynamic'"):
        DynamicLossScale().load_state_dict(FixedLossScale().state_dict())


# -- the largest scale, measured growth ------------------------------------------------------

def test_the_scale_stays_a_finite_float32_whatever_max_scale_says():
    p = DynamicLossScale(init_scale=2.0 ** 126, growth_interval=1, max_scale=1e300)
    for _ in range(4):
        p.update(False)
        assert np.isfinite(np.float32(p.loss_scale)), p.loss_scale
    assert p.loss_scale == float(np.finfo(np.float32).max)
    with raises_naming(ValueError, "init_scale", "finite float32", "3.402823e+38", "1e+39"):
        DynamicLossScale(init_scale=1e39, max_scale=1e300)
    with raises_naming(ValueError, "scale", "finite float32", "3.402823e+38", "1e+39"):
        FixedLossScale(1e39)


@pytest.mark.parametrize("room, expected", [
    (None, 2048.0),              # not measured: one factor, as probe growth
    (0.5, 1024.0),               # no room: hold
    (1.0, 1024.0),
    (1.99, 1024.0),
    (2.0, 2048.0),
    (7.9, 4096.0),               # the largest k with 2**k <= room
    (8.0, 8192.0),
    (1e9, 2.0 ** 14),            # up to max_scale
    (math.inf, 2.0 ** 14),
])
def test_measured_growth_takes_as_many_factors_as_the_room_allows(room, expected):
    p = DynamicLossScale(init_scale=1024.0, growth_interval=3, max_scale=2.0 ** 14,
                         growth_mode="measured")
    p.update(False)
    assert not p.growth_due
    p.update(False)
    assert p.growth_due
    p.update(False, room=room)
    assert p.loss_scale == expected
    assert (p.good_steps, p.growth_due) == (0, False)     # the count restarts either way


def test_probe_growth_ignores_the_room():
    p = DynamicLossScale(init_scale=1024.0, growth_interval=1)
    p.update(False, room=1e9)
    assert p.loss_scale == 2048.0
    p.update(False, room=0.0)
    assert p.loss_scale == 4096.0


def test_measured_growth_between_powers_of_the_factor_clamps_to_max_scale():
    p = DynamicLossScale(init_scale=1000.0, growth_interval=1, max_scale=3000.0,
                         growth_mode="measured")
    p.update(False, room=16.0)
    assert p.loss_scale == 3000.0            # 1000 * 2**4 clamped, as probe growth clamps


# -- the edges: defaults, bounds met exactly, growth counted to a cap --------------------

def test_the_defaults_are_the_documented_ones():
    policy = DynamicLossScale()
    assert (policy.loss_scale, policy.growth_factor, policy.backoff_factor,
            policy.growth_interval, policy.hysteresis, policy.min_scale,
            policy.max_scale, policy.growth_mode) == (2.0 ** 15, 2.0, 0.5, 2000, 1, 1.0,
                                                      2.0 ** 24, "probe")
    assert FixedLossScale().loss_scale == 128.0


def test_growth_is_counted_no_further_than_the_cap():
    from nnabla_mpt.scale.policy import growth_factors
    # 1, 2, 4, 8: a fourth factor would start from 16, the cap
    assert growth_factors(1e9, 2.0, 1.0, 16.0) == 4
    # 1, 1.5, 2.25: a third factor starts from 3.375 > 2.5
    assert growth_factors(1e6, 1.5, 1.0, 2.5) == 3
    assert growth_factors(1e6, 1.5) == 34 and growth_factors(7.9, 2.0) == 2


def test_a_measured_growth_with_a_factor_below_two_stops_at_max_scale():
    policy = DynamicLossScale(init_scale=1.0, growth_factor=1.5, growth_interval=1,
                              max_scale=2.5, growth_mode="measured")
    policy.update(False, room=1e6)
    assert policy.loss_scale == 2.5


def test_a_measured_growth_with_unbounded_room_grows_to_max_scale():
    # every gradient zero: nothing bounds the room, the scale goes to its upper bound
    policy = DynamicLossScale(init_scale=8.0, growth_interval=1, max_scale=1024.0,
                              growth_mode="measured")
    policy.update(False, room=math.inf)
    assert policy.loss_scale == 1024.0


def test_bounds_met_exactly_are_accepted():
    from nnabla_mpt.scale.policy import SCALE_LIMIT
    assert DynamicLossScale(init_scale=8.0, min_scale=8.0, max_scale=8.0).loss_scale == 8.0
    assert FixedLossScale(SCALE_LIMIT).loss_scale == SCALE_LIMIT
    with raises_naming(ValueError, "scale", "finite float32"):
        FixedLossScale(SCALE_LIMIT * 2)


def test_a_fixed_scale_set_is_checked_like_the_constructor_s():
    policy = FixedLossScale(8.0)
    policy.set_loss_scale(1.0)
    assert policy.loss_scale == 1.0
    with raises_naming(ValueError, "scale", ">= 1", "0.5"):
        policy.set_loss_scale(0.5)
    assert policy.loss_scale == 1.0


def test_a_state_with_a_negative_hysteresis_left_is_refused_naming_it():
    policy = DynamicLossScale(hysteresis=2)
    state = {**policy.state_dict(), "hysteresis_left": -1}
    with raises_naming(ValueError, "state['policy']['hysteresis_left']", ">= 0", "-1"):
        policy.load_state_dict(state, name="state['policy']")
    assert policy.hysteresis_left == 2


def test_a_state_without_its_kind_is_refused_naming_the_missing_key():
    for policy in (DynamicLossScale(), FixedLossScale()):
        state = policy.state_dict()
        del state["kind"]
        with raises_naming(ValueError, "state['policy']", "'kind'"):
            policy.load_state_dict(state, name="state['policy']")


def test_a_state_of_the_other_kind_is_refused_naming_the_state_as_given():
    for policy, other in ((DynamicLossScale(), FixedLossScale()),
                          (FixedLossScale(), DynamicLossScale())):
        with raises_naming(ValueError, "state['policy']", repr(other.kind), repr(policy.kind)):
            policy.load_state_dict(other.state_dict(), name="state['policy']")


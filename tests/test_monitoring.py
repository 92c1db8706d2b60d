"""Step hooks: LossScaleCallback, LossScaleMonitor (real nnabla.monitor files), monitor=."""
import numpy as np
import pytest

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla.solvers as S
from nnabla.ext_utils import get_extension_context
from nnabla.monitor import Monitor

from nnabla_mpt import (DynamicLossScalingUpdater, FixedLossScalingUpdater, LossScaleCallback,
                        LossScaleMonitor, LossScaleStats, StepResult)

# A tiny float16 network whose only overflow source is the loss scale itself: the scale is
# the seed of the backward pass, so any scale above 65504 (the largest float16) is inf, and
# 2**15 and below never overflow (inputs and weights are small).
# With scale=2**24 and N=4 the steps run with
#   0..8: 2**24 .. 2**16 (skipped), 9..12: 2**15, 13: 2**16 (skipped), 14..17: 2**15,
#   18: 2**16 (skipped), 19: 2**15, ...
# that is, after the warm-up every fifth step overflows.
WARMUP_SCALES = [2.0 ** e for e in range(24, 15, -1)]   # steps 0..8


def expected_fp16_steps(n):
    """(scale, skipped) of each of the first n steps, from the rule above."""
    out = [(s, True) for s in WARMUP_SCALES]
    while len(out) < n:
        out += [(2.0 ** 15, False)] * 4 + [(2.0 ** 16, True)]
    return out[:n]


def fp16_net():
    nn.set_default_context(get_extension_context("cpu", type_config="half"))
    x = nn.Variable.from_numpy_array(np.full((4, 3), 0.5, dtype=np.float32))
    h = PF.affine(x, 2, name="fc", w_init=np.full((3, 2), 0.1, dtype=np.float32))
    loss = F.mean(h ** 2)
    solver = S.Sgd(0.01)
    solver.set_parameters(nn.get_parameters())
    return solver, loss


def float_net():
    x = nn.Variable.from_numpy_array(np.full((4, 3), 0.5, dtype=np.float32))
    h = PF.affine(x, 2, name="fc", w_init=np.full((3, 2), 0.1, dtype=np.float32))
    loss = F.mean(h ** 2)
    solver = S.Sgd(0.01)
    solver.set_parameters(nn.get_parameters())
    return solver, loss, x


def read_series(path):
    rows = []
    for line in path.read_text().splitlines():
        index, value = line.split()
        rows.append((int(index), float(value)))
    return rows


def test_expected_trajectory_matches_the_fp16_net():
    # The premise of the file-content tests: the real fp16 run follows the rule.
    solver, loss = fp16_net()
    updater = DynamicLossScalingUpdater(solver, loss, scale=2.0 ** 24, N=4)
    got = [(r.scale, r.skipped) for r in (updater.update() for _ in range(20))]
    assert got == expected_fp16_steps(20)


def test_monitor_series_files_hold_expected_values(tmp_path):
    solver, loss = fp16_net()
    hook = LossScaleMonitor(Monitor(str(tmp_path)), interval=5, prefix="amp")
    updater = DynamicLossScalingUpdater(solver, loss, scale=2.0 ** 24, N=4, monitor=hook)
    for _ in range(20):
        updater.update()

    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "amp-overflow-rate.series.txt", "amp-scale.series.txt",
        "amp-skipped-steps.series.txt"]
    # windows [0-4] [5-9] [10-14] [15-19]; scale of each window's last step
    assert read_series(tmp_path / "amp-scale.series.txt") == [
        (4, float(f"{2.0 ** 20:g}")), (9, 32768.0), (14, 32768.0), (19, 32768.0)]
    # cumulative skipped: 5 (steps 0-4), +4 (5-8), +1 (13), +1 (18)
    assert read_series(tmp_path / "amp-skipped-steps.series.txt") == [
        (4, 5.0), (9, 9.0), (14, 10.0), (19, 11.0)]
    assert read_series(tmp_path / "amp-overflow-rate.series.txt") == [
        (4, 1.0), (9, 0.8), (14, 0.2), (19, 0.2)]
    assert updater.skipped_steps == 11


def test_monitor_interval_one_writes_every_step_scale(tmp_path):
    solver, loss = fp16_net()
    hook = LossScaleMonitor(Monitor(str(tmp_path)), interval=1)
    updater = DynamicLossScalingUpdater(solver, loss, scale=2.0 ** 24, N=4, monitor=hook)
    for _ in range(15):
        updater.update()
    expected = expected_fp16_steps(15)
    assert read_series(tmp_path / "loss-scale-scale.series.txt") == [
        (i, float(f"{s:g}")) for i, (s, _) in enumerate(expected)]
    assert read_series(tmp_path / "loss-scale-overflow-rate.series.txt") == [
        (i, 1.0 if skipped else 0.0) for i, (_, skipped) in enumerate(expected)]
    cumulative = np.cumsum([skipped for _, skipped in expected]).tolist()
    assert read_series(tmp_path / "loss-scale-skipped-steps.series.txt") == [
        (i, float(c)) for i, c in enumerate(cumulative)]


def test_callback_receives_window_stats_with_scale_range():
    solver, loss = fp16_net()
    seen = []
    updater = DynamicLossScalingUpdater(solver, loss, scale=2.0 ** 24, N=4,
                                        monitor=LossScaleCallback(seen.append, interval=10))
    for _ in range(20):
        updater.update()
    assert [type(s) for s in seen] == [LossScaleStats, LossScaleStats]
    first, second = seen
    assert (first.step, first.steps, first.skipped, first.total_steps,
            first.total_skipped) == (9, 10, 9, 10, 9)
    assert (first.min_scale, first.max_scale) == (2.0 ** 15, 2.0 ** 24)
    assert (first.scale, first.next_scale) == (2.0 ** 15, 2.0 ** 15)
    assert first.overflow_rate == pytest.approx(0.9)
    assert (second.step, second.steps, second.skipped, second.total_steps,
            second.total_skipped) == (19, 10, 2, 20, 11)
    assert (second.min_scale, second.max_scale) == (2.0 ** 15, 2.0 ** 16)
    assert second.overflow_rate == pytest.approx(0.2)


def test_hook_called_once_per_step_including_retries():
    solver, loss = fp16_net()
    results = []
    updater = DynamicLossScalingUpdater(solver, loss, scale=2.0 ** 24, N=4, max_retries=20,
                                        monitor=results.append)
    first = updater.update()          # nine skipped attempts, then the update at 2**15
    assert first.attempts == 10 and not first.skipped
    assert [r.step for r in results] == list(range(10))
    assert [r.skipped for r in results] == [True] * 9 + [False]
    assert results[-1] is first
    assert updater.monitor == results.append


def test_hook_runs_after_the_step_is_complete():
    solver, loss, _ = float_net()
    observed = []

    def hook(result):
        observed.append((result.step, updater.steps, updater.last_result is result,
                         updater.updates))

    updater = DynamicLossScalingUpdater(solver, loss, scale=8.0, monitor=hook)
    updater.update()
    updater.update()
    assert observed == [(0, 1, True, 1), (1, 2, True, 2)]


def test_hook_error_propagates_after_the_step_counted():
    solver, loss, _ = float_net()

    def hook(result):
        raise RuntimeError(f"hook saw step {result.step}")

    updater = FixedLossScalingUpdater(solver, loss, scale=8.0, monitor=hook)
    with pytest.raises(RuntimeError, match="hook saw step 0"):
        updater.update()
    assert (updater.steps, updater.updates) == (1, 1)


def test_saturation_overflows_at_known_steps_fixed_updater():
    # Float network, saturation mode: a batch of large inputs gives gradients above 65504
    # (an overflow for saturating hardware); every third step feeds one.
    solver, loss, x = float_net()
    step = [0]

    def feed():
        x.d = np.full((4, 3), 1000.0 if step[0] % 3 == 0 else 0.5, dtype=np.float32)
        step[0] += 1

    seen = []
    updater = FixedLossScalingUpdater(solver, loss, feed, scale=128.0,
                                      overflow_mode="saturation",
                                      monitor=LossScaleCallback(seen.append, interval=4))
    skipped = [updater.update().skipped for _ in range(12)]
    assert skipped == [i % 3 == 0 for i in range(12)]
    # windows [0-3] [4-7] [8-11] hold skipped steps {0, 3}, {6}, {9}
    assert [(s.step, s.skipped, s.total_skipped) for s in seen] == [
        (3, 2, 2), (7, 1, 3), (11, 1, 4)]
    assert [s.overflow_rate for s in seen] == [0.5, 0.25, 0.25]
    assert all(s.scale == s.next_scale == 128.0 for s in seen)


def test_flush_summarises_an_unfinished_window():
    solver, loss, _ = float_net()
    seen = []
    hook = LossScaleCallback(seen.append, interval=5)
    updater = DynamicLossScalingUpdater(solver, loss, scale=8.0, monitor=hook)
    for _ in range(7):
        updater.update()
    assert [(s.step, s.steps) for s in seen] == [(4, 5)]
    stats = hook.flush()
    assert (stats.step, stats.steps, stats.skipped, stats.total_steps) == (6, 2, 0, 7)
    assert seen[-1] is stats
    assert hook.flush() is None
    assert len(seen) == 2


def test_windows_follow_the_step_index_after_resume():
    solver, loss, _ = float_net()
    updater = DynamicLossScalingUpdater(solver, loss, scale=8.0)
    for _ in range(7):
        updater.update()
    state = updater.state_dict()

    seen = []
    resumed = DynamicLossScalingUpdater(solver, loss, scale=8.0,
                                        monitor=LossScaleCallback(seen.append, interval=5))
    resumed.load_state_dict(state)
    for _ in range(8):
        resumed.update()             # steps 7..14
    assert [(s.step, s.steps, s.total_steps) for s in seen] == [(9, 3, 3), (14, 5, 8)]


def test_rewind_restarts_the_window_and_keeps_writing(tmp_path):
    solver, loss, _ = float_net()
    hook = LossScaleMonitor(Monitor(str(tmp_path)), interval=2)
    updater = DynamicLossScalingUpdater(solver, loss, scale=8.0, monitor=hook)
    for _ in range(3):
        updater.update()             # steps 0, 1, 2: one window written at step 1
    state = updater.state_dict()
    updater.update()                 # step 3: second window at step 3
    updater.load_state_dict(state)   # back to step 3
    updater.update()                 # step 3 again: a new window of one step
    rows = read_series(tmp_path / "loss-scale-skipped-steps.series.txt")
    assert [i for i, _ in rows] == [1, 3, 3]


def test_monitor_argument_validation():
    solver, loss, _ = float_net()
    with pytest.raises(TypeError, match=r"monitor must be None or a callable.*got 3"):
        DynamicLossScalingUpdater(solver, loss, monitor=3)


def test_passing_a_bare_nnabla_monitor_points_to_the_wrapper(tmp_path):
    solver, loss, _ = float_net()
    with pytest.raises(TypeError, match=r"Monitor.*wrap .*LossScaleMonitor"):
        FixedLossScalingUpdater(solver, loss, monitor=Monitor(str(tmp_path)))


def test_default_is_no_monitor():
    solver, loss, _ = float_net()
    assert DynamicLossScalingUpdater(solver, loss).monitor is None


@pytest.mark.parametrize("kwargs, error, message", [
    ({"callback": None}, TypeError, r"callback must be callable .*got None"),
    ({"interval": 0}, ValueError, r"interval must be >= 1, got 0"),
    ({"interval": 2.5}, TypeError, r"interval must be an integer, got 2.5"),
])
def test_callback_validation(kwargs, error, message):
    args = {"callback": print, "interval": 10}
    args.update(kwargs)
    with pytest.raises(error, match=message):
        LossScaleCallback(**args)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"monitor": "logs"}, TypeError, r"monitor must be an nnabla.monitor.Monitor, got 'logs'"),
    ({"prefix": "a/b"}, ValueError, r"prefix must be a non-empty file name .*got 'a/b'"),
    ({"prefix": " "}, ValueError, r"prefix must be a non-empty file name .*got ' '"),
    ({"prefix": 7}, TypeError, r"prefix must be a str, got 7"),
    ({"interval": -1}, ValueError, r"interval must be >= 1, got -1"),
    ({"verbose": "yes"}, TypeError, r"verbose must be True or False, got 'yes'"),
])
def test_monitor_validation(tmp_path, kwargs, error, message):
    args = {"monitor": Monitor(str(tmp_path)), "interval": 10}
    args.update(kwargs)
    with pytest.raises(error, match=message):
        LossScaleMonitor(**args)


def test_stats_overflow_rate_and_pure_callback():
    seen = []
    hook = LossScaleCallback(seen.append, interval=3)
    for i, skipped in enumerate([True, False, True, False]):
        hook(StepResult(step=i, skipped=skipped, scale=4.0, next_scale=4.0))
    assert len(seen) == 1
    assert (seen[0].skipped, seen[0].steps) == (2, 3)
    assert seen[0].overflow_rate == pytest.approx(2 / 3)
    assert hook.flush().overflow_rate == 0.0


def test_hook_sees_the_step_that_raises_the_collapse_error():
    from nnabla_mpt import LossScaleCollapseError

    solver, loss = fp16_net()
    results = []
    updater = DynamicLossScalingUpdater(solver, loss, scale=2.0 ** 17, min_scale=2.0 ** 16,
                                        monitor=results.append)
    updater.update()                          # 2**17 overflows: back off to the floor
    with pytest.raises(LossScaleCollapseError):
        updater.update()                      # 2**16 overflows at min_scale
    assert [(r.step, r.skipped, r.scale) for r in results] == [
        (0, True, 2.0 ** 17), (1, True, 2.0 ** 16)]

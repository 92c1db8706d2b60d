"""Step hooks: LossScaleCallback, LossScaleMonitor (real nnabla.monitor files), monitor=."""
import numpy as np
import pytest

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla.solvers as S
from nnabla.monitor import Monitor

from nnabla_mpt import (DynamicLossScale, DynamicLossScalingUpdater, FixedLossScalingUpdater,
                        LossScaleCallback, LossScaleMonitor, LossScaleStats, OverflowHandling,
                        StepResult)
from support import Net, raises_naming

# The float16 network of the trajectory tests is the linear ``Net("half")``: the batches in
# ``net.large`` (x * 20) keep a finite loss but their gradients overflow at scales of
# LARGE_OVERFLOWS and above; ordinary batches are far from overflowing at 2**11 (largest
# gradient per unit of scale about 2). The overflows come from the data: every scale used
# here is one float16 can seed the backward pass with.
LARGE_OVERFLOWS = 4096.0
# The large batches are those of steps 0..3 (the four scales 2**15 .. 2**12 all overflow
# on them) and then of every fifth step from step 8. With scale=2**15 and N=4 the steps
# run with
#   0..3: 2**15 .. 2**12 (large: skipped), 4..7: 2**11, 8: 2**12 (large: skipped),
#   9..12: 2**11, 13: 2**12 (large: skipped), 14..17: 2**11, 18: 2**12 (skipped), ...
# that is, after the warm-up every fifth step is a growth to 2**12 on a large batch.
LARGE_STEPS = set(range(4)) | set(range(8, 1000, 5))
WARMUP_SCALES = [2.0 ** e for e in range(15, 11, -1)]   # steps 0..3


def expected_fp16_steps(n):
    """(scale, skipped) of each of the first n steps, from the rule above."""
    out = [(s, True) for s in WARMUP_SCALES]
    while len(out) < n:
        out += [(2.0 ** 11, False)] * 4 + [(2.0 ** 12, True)]
    return out[:n]


def fp16_net(large=LARGE_STEPS):
    """The linear float16 net with large batches at the steps ``large``, and its solver."""
    net = Net("half")
    net.large = set(large)
    return net, net.solver("Sgd", lr=0.01)


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
    net, solver = fp16_net()
    updater = DynamicLossScalingUpdater(solver, net.loss, net.feeder, scale=2.0 ** 15, N=4)
    got = [(r.scale, r.skipped) for r in (updater.update() for _ in range(20))]
    assert got == expected_fp16_steps(20)
    # Exactly the large batches overflow, each at a scale of LARGE_OVERFLOWS or above.
    assert {i for i, (_, skipped) in enumerate(got) if skipped} == LARGE_STEPS & set(range(20))
    assert all(scale >= LARGE_OVERFLOWS for scale, skipped in got if skipped)


def test_monitor_series_files_hold_expected_values(tmp_path):
    net, solver = fp16_net()
    hook = LossScaleMonitor(Monitor(str(tmp_path)), interval=4, prefix="amp")
    updater = DynamicLossScalingUpdater(solver, net.loss, net.feeder, scale=2.0 ** 15, N=4,
                                        monitor=hook)
    results = [updater.update() for _ in range(20)]

    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "amp-float32-steps.series.txt", "amp-overflow-rate.series.txt",
        "amp-scale-first.series.txt", "amp-scale-max.series.txt", "amp-scale-min.series.txt",
        "amp-scale.series.txt", "amp-skipped-steps.series.txt"]
    # the first, smallest and largest scale of each window, as its steps ran them
    ends = range(3, 20, 4)
    windows = [[r.scale for r in results[i - 3:i + 1]] for i in ends]
    for key, of in (("first", lambda w: w[0]), ("min", min), ("max", max)):
        assert read_series(tmp_path / f"amp-scale-{key}.series.txt") == [
            (i, of(w)) for i, w in zip(ends, windows)], key
    assert windows[0] == [2.0 ** 15, 2.0 ** 14, 2.0 ** 13, 2.0 ** 12]   # steps 0-3 skipped
    assert read_series(tmp_path / "amp-float32-steps.series.txt") == [(i, 0.0) for i in ends]
    # windows [0-3] [4-7] [8-11] [12-15] [16-19]; scale of each window's last step
    assert read_series(tmp_path / "amp-scale.series.txt") == [
        (3, 4096.0), (7, 2048.0), (11, 2048.0), (15, 2048.0), (19, 2048.0)]
    # cumulative skipped: 4 (steps 0-3), +0 (4-7), +1 (8), +1 (13), +1 (18)
    assert read_series(tmp_path / "amp-skipped-steps.series.txt") == [
        (3, 4.0), (7, 4.0), (11, 5.0), (15, 6.0), (19, 7.0)]
    assert read_series(tmp_path / "amp-overflow-rate.series.txt") == [
        (3, 1.0), (7, 0.0), (11, 0.25), (15, 0.25), (19, 0.25)]
    assert updater.skipped_steps == 7


def test_monitor_interval_one_writes_every_step_scale(tmp_path):
    net, solver = fp16_net()
    hook = LossScaleMonitor(Monitor(str(tmp_path)), interval=1)
    updater = DynamicLossScalingUpdater(solver, net.loss, net.feeder, scale=2.0 ** 15, N=4,
                                        monitor=hook)
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
    net, solver = fp16_net()
    seen = []
    updater = DynamicLossScalingUpdater(solver, net.loss, net.feeder, scale=2.0 ** 15, N=4,
                                        monitor=LossScaleCallback(seen.append, interval=10))
    for _ in range(20):
        updater.update()
    assert [type(s) for s in seen] == [LossScaleStats, LossScaleStats]
    first, second = seen
    # steps 0-9 skip 0, 1, 2, 3 and 8; steps 10-19 skip 13 and 18
    assert (first.step, first.steps, first.skipped, first.total_steps,
            first.total_skipped) == (9, 10, 5, 10, 5)
    assert (first.min_scale, first.max_scale) == (2.0 ** 11, 2.0 ** 15)
    assert (first.scale, first.next_scale) == (2.0 ** 11, 2.0 ** 11)
    assert first.overflow_rate == pytest.approx(0.5)
    assert (second.step, second.steps, second.skipped, second.total_steps,
            second.total_skipped) == (19, 10, 2, 20, 7)
    assert (second.min_scale, second.max_scale) == (2.0 ** 11, 2.0 ** 12)
    assert second.overflow_rate == pytest.approx(0.2)


def test_hook_called_once_per_step_including_retries():
    net, solver = fp16_net()
    results = []
    updater = DynamicLossScalingUpdater(solver, net.loss, net.feeder, scale=2.0 ** 15, N=4,
                                        overflow=OverflowHandling(
                                            max_retries=20), monitor=results.append)
    first = updater.update()          # four skipped attempts, then the update at 2**11
    assert first.attempts == 5 and not first.skipped and first.scale == 2.0 ** 11
    assert net.calls == 5
    assert [r.step for r in results] == list(range(5))
    assert [r.skipped for r in results] == [True] * 4 + [False]
    assert [r.scale for r in results] == [s for s, _ in expected_fp16_steps(5)]
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
    with raises_naming(RuntimeError, "hook saw step 0"):
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
                                      overflow=OverflowHandling(mode="saturation"),
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
    with raises_naming(TypeError, "monitor", "None", "callable", "StepResult", "3", "int"):
        DynamicLossScalingUpdater(solver, loss, monitor=3)


def test_passing_a_bare_nnabla_monitor_points_to_the_wrapper(tmp_path):
    solver, loss, _ = float_net()
    with raises_naming(TypeError, "monitor", "of type Monitor", "nnabla_mpt.LossScaleMonitor",
                       "monitor=LossScaleMonitor(Monitor(path), interval=100)"):
        FixedLossScalingUpdater(solver, loss, monitor=Monitor(str(tmp_path)))


def test_default_is_no_monitor():
    solver, loss, _ = float_net()
    assert DynamicLossScalingUpdater(solver, loss).monitor is None


@pytest.mark.parametrize("kwargs, error, facts", [
    ({"callback": None}, TypeError, ("callback", "callable", "LossScaleStats", "None")),
    ({"interval": 0}, ValueError, ("interval", ">= 1", "0")),
    ({"interval": 2.5}, TypeError, ("interval", "integer", "2.5", "float")),
])
def test_callback_validation(kwargs, error, facts):
    args = {"callback": print, "interval": 10}
    args.update(kwargs)
    with raises_naming(error, *facts):
        LossScaleCallback(**args)


@pytest.mark.parametrize("kwargs, error, facts", [
    ({"monitor": "logs"}, TypeError, ("monitor", "nnabla.monitor.Monitor", "'logs'", "str")),
    ({"prefix": "a/b"}, ValueError, ("prefix", "non-empty file name", "path separators",
                                     "'a/b'")),
    ({"prefix": " "}, ValueError, ("prefix", "non-empty file name", "path separators", "' '")),
    ({"prefix": 7}, TypeError, ("prefix", "str", "7", "int")),
    ({"interval": -1}, ValueError, ("interval", ">= 1", "-1")),
    ({"verbose": "yes"}, TypeError, ("verbose", "True", "False", "'yes'", "str")),
    ({"append": 1}, TypeError, ("append", "True", "False", "1", "int")),
])
def test_monitor_validation(tmp_path, kwargs, error, facts):
    args = {"monitor": Monitor(str(tmp_path)), "interval": 10}
    args.update(kwargs)
    with raises_naming(error, *facts):
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


def test_growth_points_held_by_the_ceiling_are_counted_and_written(tmp_path):
    from nnabla.monitor import Monitor
    seen = []
    hook = LossScaleCallback(seen.append, interval=2)
    monitor = LossScaleMonitor(Monitor(str(tmp_path)), interval=2)
    held = [None, "ceiling", "gradients", None, "ceiling", "ceiling"]
    for i, by in enumerate(held):
        result = StepResult(step=i, skipped=False, scale=4.0, next_scale=4.0, held_by=by)
        hook(result)
        monitor(result)
    assert [s.held_by_ceiling for s in seen] == [1, 0, 2]
    lines = (tmp_path / "loss-scale-growth-held-by-ceiling.series.txt").read_text().split()
    assert lines == ["1", "1", "3", "0", "5", "2"]


def test_hook_sees_the_step_that_raises_the_collapse_error():
    from nnabla_mpt import LossScaleCollapseError

    net, solver = fp16_net(large={0, 1})
    results = []
    updater = DynamicLossScalingUpdater(solver, net.loss, net.feeder,
                                        policy=DynamicLossScale(
                                            init_scale=2.0 ** 15, min_scale=2.0 ** 14),
                                            monitor=results.append)
    updater.update()                          # 2**15 overflows: back off to the floor
    with pytest.raises(LossScaleCollapseError):
        updater.update()                      # 2**14 overflows at min_scale
    assert [(r.step, r.skipped, r.scale) for r in results] == [
        (0, True, 2.0 ** 15), (1, True, 2.0 ** 14)]


def test_dropping_a_partial_line_of_a_file_that_cannot_exist_does_nothing(tmp_path):
    """No file at the path, nor a folder for it (a file stands where its folder would):
    nothing to cut, and nothing raised."""
    from nnabla_mpt.monitoring import drop_partial_line
    (tmp_path / "plain").write_text("not a folder")
    drop_partial_line(str(tmp_path / "missing.series.txt"))
    drop_partial_line(str(tmp_path / "plain" / "x.series.txt"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain"]

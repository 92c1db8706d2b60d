"""The report of a run, read back from the series a LossScaleMonitor wrote during real
float16 training (fresh, in progress, resumed): its figures against the series and the
steps, and its figure."""
import struct

import numpy as np

import pytest
from nnabla.monitor import Monitor

from nnabla_mpt import LossScaleMonitor, LossScaleReport, read_report
from nnabla_mpt.report.summary import streak_bounds
from report_runs import (LARGE, ceiling_run, fp16_run, fp16_updater, longest_streak, series,
                         skipped_steps, windows)
from support import Net

PNG = b"\x89PNG\r\n\x1a\n"


def text_of(report):
    return " ".join(report.text().split())


def legend(ax):
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_the_summary_of_a_run_is_what_its_series_and_steps_say(tmp_path):
    results = fp16_run(tmp_path, 60, 5, gradient_stats_every=5)
    report = read_report(tmp_path)
    s = report.summary
    skipped, scale, rate = (series(tmp_path, k) for k in ("skipped-steps", "scale",
                                                          "overflow-rate"))
    assert (s.first_step, s.last_step, s.steps, s.windows, s.interval) == (0, 59, 60, 12, 5)
    # the total: the last cumulative count, and the steps that were skipped
    assert s.skipped == skipped[59] == len(skipped_steps(results)) == 15
    assert s.per_thousand == pytest.approx(1000 * skipped[59] / 60)
    # where they fell: each window's count, from its overflow rate and from the steps
    from_rates = [(i - 4, i, round(rate[i] * 5)) for i in sorted(rate) if rate[i]]
    assert s.skipped_in == from_rates == [w for w in windows(results, 5) if w[2]]
    # the longest streak is 4 (steps 0-3); windows of 5 allow 2 to 5
    assert longest_streak(results) == 4 and s.streak == (2, 5)
    # the scale: the run's first, last, smallest and largest, as the steps ran them (the
    # windows' last steps all ran at 2048); the steps at each
    used = [r.scale for r in results]
    assert (s.scale_first, s.scale_last) == (used[0], used[-1]) == (2.0 ** 15, 2048.0)
    assert (s.scale_min, s.scale_max) == (min(used), max(used)) == (2048.0, 2.0 ** 15)
    assert set(scale.values()) == {2048.0}
    assert s.scale_steps == [(2048.0, 60)] and s.last_change is None
    assert all(r.scale == 2048.0 for r in results if r.step % 5 == 4)
    # the last gradient statistics are the series' last values
    assert s.gradients == (59,) + tuple(series(tmp_path, f"gradient-{k}")[59] for k in
                                        ("zero-fraction", "subnormal-fraction", "headroom"))
    assert (s.held_by_ceiling, s.rewritten, s.partial) == (0, 0, [])
    text = text_of(report)
    assert text.startswith(f"loss-scale series of {tmp_path}: steps 0-59, 12 windows of 5 "
                           f"steps")
    assert ("skipped steps: 15 of 60, 250.0 per thousand; in steps 0-4 (4), 5-59 (1 in each "
            "of its 11 windows)") in text
    assert "longest overflow streak: between 2 and 5 steps in a row" in text
    assert "it sat at 2048 for 100% of the steps" in text
    assert "what held it: the gradients: 11 overflows after the first window (in steps 5-59)" \
        in text
    assert f"gradient statistics, last at step 59: 0.00% zero, 0.00% subnormal, headroom " \
           f"{s.gradients[3]:g} powers of two" in text


def test_with_windows_of_one_step_the_report_knows_every_step(tmp_path):
    results = fp16_run(tmp_path, 30, 1)
    s = read_report(tmp_path).summary
    assert s.streak == (4, 4) and longest_streak(results) == 4
    assert s.skipped_in == [(i, i, 1) for i in skipped_steps(results)]
    assert skipped_steps(results) == sorted(LARGE & set(range(30)))
    text = text_of(read_report(tmp_path))
    assert "in steps 0-3 (4), 8 (1), 13 (1), 18 (1), 23 (1), 28 (1)" in text
    assert "longest overflow streak: 4 steps in a row" in text
    # the scale of every step: 2**15 .. 2**12 (skipped), then 2**11 and a probe to 2**12
    assert s.scale_steps[0] == (2048.0, sum(r.scale == 2048.0 for r in results))
    assert s.scale_max == 2.0 ** 15 and s.last_change == (29, 29)


def test_the_figure_has_the_panels_the_series_hold(tmp_path):
    fp16_run(tmp_path / "stats", 40, 5, gradient_stats_every=5)
    fp16_run(tmp_path / "plain", 40, 5)
    with_stats = read_report(tmp_path / "stats").figure()
    scale, rate, grads, headroom = with_stats.axes
    assert scale.get_ylabel() == "loss scale" and rate.get_ylabel() == "overflow rate (%)"
    assert grads.get_ylabel() == "gradient values (%)"       # the dtype is not recorded
    assert legend(scale)[:3] == ["loss scale: range of each window",
                                 "loss scale at each window's last step",
                                 "window with skipped steps"]
    [stairs] = rate.patches
    values, edges, _ = stairs.get_data()
    assert [round(v) for v in values] == [80] + [20] * 7
    assert list(edges) == list(range(0, 41, 5))
    assert list(headroom.lines[0].get_xdata()) == list(range(4, 40, 5))
    plain = read_report(tmp_path / "plain").figure()
    assert [ax.get_ylabel() for ax in plain.axes] == ["loss scale", "overflow rate (%)"]
    path = tmp_path / "report.png"
    assert read_report(tmp_path / "plain").save(str(path)) == str(path)
    data = path.read_bytes()
    assert data[:8] == PNG and struct.unpack(">II", data[16:24])[0] == 900


def test_growth_held_by_the_ceiling_is_counted_from_its_series(tmp_path):
    results = ceiling_run(tmp_path, 30, 5)
    held = [r.step for r in results if r.held_by == "ceiling"]
    # auto starts at 2**14; the first growth point grows to 2**15 and is cut short there
    assert held == list(range(4, 30, 5)) and results[4].next_scale == 2.0 ** 15
    assert all(r.scale == 2.0 ** 15 for r in results[5:])
    report = read_report(tmp_path)
    s = report.summary
    written = series(tmp_path, "growth-held-by-ceiling")
    assert s.held_by_ceiling == sum(written.values()) == len(held)
    assert s.ceiling_scale == 2.0 ** 15
    assert s.ceiling_windows == [(i - 4, i) for i in sorted(written) if written[i]]
    assert (f"what held it: the loss dtype's ceiling, 32768, at {len(held)} growth points "
            f"(in steps {s.ceiling_windows[0][0]}-{s.ceiling_windows[-1][1]}), not the "
            f"gradients") in text_of(report)
    scale = report.figure().axes[0]
    assert "window with growth held by the loss dtype's ceiling" in legend(scale)


@pytest.mark.parametrize("how", ["same hook", "new hook, append=True"])
def test_a_run_resumed_from_a_checkpoint_continues_its_series(tmp_path, how):
    """Train to step 19, save a checkpoint, go on to step 31 (lines at 24 and 29 written;
    every step skipped), then resume from the checkpoint in a new updater into the same
    files and train to step 44: the resumed run writes 24 and 29 again, and the report
    reads what the run that went on did."""
    monitor = tmp_path / "monitor"
    net = Net("half")
    net.large = set(LARGE)
    hook = LossScaleMonitor(Monitor(str(monitor)), interval=5)
    first = fp16_updater(net, hook, gradient_stats_every=5)
    history = [first.update() for _ in range(20)]
    first.save_checkpoint(str(tmp_path / "checkpoint.npz"))
    net.bad = set(range(20, 32))            # steps the resumed run replaces: inf in the batch
    lost = [first.update() for _ in range(12)]
    net.bad = set()
    assert all(r.skipped for r in lost)
    if how != "same hook":
        hook = LossScaleMonitor(Monitor(str(monitor)), interval=5, append=True)
    resumed = fp16_updater(net, hook, gradient_stats_every=5)
    resumed.load_checkpoint(str(tmp_path / "checkpoint.npz"))
    history += [resumed.update() for _ in range(25)]
    assert [r.step for r in history] == list(range(45)) and lost[0].step == 20

    report = read_report(monitor)
    s = report.summary
    lines = {p.name: p.read_text().splitlines() for p in monitor.iterdir()}
    assert s.rewritten == sum(len(v) - len({line.split()[0] for line in v})
                              for v in lines.values()) == 10 * 2     # 24 and 29, 10 series
    assert (s.first_step, s.last_step, s.windows) == (0, 44, 9)
    assert s.skipped == len(skipped_steps(history))
    assert s.skipped_in == [w for w in windows(history, 5) if w[2]]
    scale = series(monitor, "scale")
    assert sorted(scale) == list(range(4, 45, 5))
    assert s.scale_last == scale[44] == history[44].scale
    assert s.gradients[0] == 44
    # The cumulative series is the updater's count, which the checkpoint restores: the
    # lost steps are not counted, by the same hook or a new one.
    counted = series(monitor, "skipped-steps")
    assert counted[44] == s.skipped == resumed.skipped_steps
    assert counted[19] == len(skipped_steps(history[:20])) and len(skipped_steps(lost)) == 12
    assert ("note: 20 lines wrote an index again (a run rewound, or resumed from a checkpoint "
            "into the same files): the value written last is used") in text_of(report)
    assert len(report.figure().axes) == 4


def test_a_run_in_progress_is_read_as_far_as_it_is_written(tmp_path):
    fp16_run(tmp_path, 20, 5)
    rate = tmp_path / "loss-scale-overflow-rate.series.txt"
    with open(rate, "a") as f:
        f.write("24 0.2")                               # being written: no newline yet
    with open(tmp_path / "loss-scale-scale.series.txt", "a") as f:
        f.write("24 2048\n")                            # written; the others not yet
    report = read_report(tmp_path)
    assert report.summary.last_step == 19 and report.summary.windows == 4
    assert report.summary.partial == [str(rate)]
    assert ("note: a last line still being written (a run in progress) left out of "
            "loss-scale-overflow-rate.series.txt") in text_of(report)
    # a monitor appending to these files drops the half-written line first
    hook = LossScaleMonitor(Monitor(str(tmp_path)), interval=5, append=True)
    assert rate.read_text().endswith("19 0.2\n") and "append=True" in repr(hook)


def test_a_report_reads_without_nnabla(tmp_path):
    import subprocess
    import sys
    from doc_pages import ROOT
    fp16_run(tmp_path, 10, 5)
    code = ("import sys; from nnabla_mpt import read_report; "
            f"print(read_report({str(tmp_path)!r}).summary.skipped); "
            "print('nnabla' in sys.modules, 'matplotlib' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.stdout.split() == ["5", "False", "False"], proc.stderr


@pytest.mark.parametrize("steps, skipped, expected", [
    ([5, 5, 5], [0, 0, 0], (0, 0)),
    ([1] * 6, [1, 1, 0, 1, 1, 1], (3, 3)),              # windows of one step: exact
    ([5, 5, 5], [4, 0, 0], (2, 4)),                     # 4 of 5 force 2 in a row
    ([5, 5, 5], [2, 5, 1], (5, 8)),                     # 2 at the end, 5, 1 at the start
    ([5, 5, 5, 5], [5, 5, 0, 3], (10, 10)),
    ([10, 10], [1, 1], (1, 2)),
])
def test_streak_bounds(steps, skipped, expected):
    import numpy as np
    assert streak_bounds(np.array(steps), np.array(skipped)) == expected


def test_the_report_is_a_public_name():
    import nnabla_mpt
    assert {"read_report", "LossScaleReport", "LossScaleTensorBoard"} <= set(nnabla_mpt.__all__)
    assert nnabla_mpt.LossScaleReport is LossScaleReport


def test_a_precision_switch_is_reported_as_float32_never_as_a_scale_of_1(tmp_path):
    """fp16 for the first 38 of 50 steps, then float32 (run at scale 1, no loss scale):
    windows of 10, the switch inside the window of steps 30-39 (step 38)."""
    from support import make_updater
    hook = LossScaleMonitor(Monitor(str(tmp_path)), interval=10)
    updater, _ = make_updater("fast|step|0.75", total=50, scale=2.0 ** 15, monitor=hook)
    results = [updater.update() for _ in range(50)]
    switch = next(r.step for r in results if r.precision == "float")
    assert switch == 38 and all(r.scale == 1.0 for r in results[switch:])
    used = [r.scale for r in results[:switch]]
    report = read_report(tmp_path)
    s = report.summary
    assert s.switch == switch
    assert (s.scale_first, s.scale_min, s.scale_max) == (used[0], min(used), max(used))
    assert s.scale_last == used[-1] != 1.0
    assert 1.0 not in dict(s.scale_steps) and sum(n for _, n in s.scale_steps) == switch
    text = text_of(report)
    assert f"float32 from step {switch}: no loss scale (24% of the steps" in text
    assert "note: these files record neither" not in text
    # the figure: no scale drawn after the switch, the switch marked
    scale = report.figure().axes[0]
    line = next(l for l in scale.lines if l.get_label().startswith("loss scale at each"))
    y = np.asarray(line.get_ydata(), dtype=float)
    assert np.isnan(y[-1]) and 1.0 not in y and np.isfinite(y[:-2]).all()
    assert f"switch to float32 (step {switch})" in legend(scale)
    low, high = scale.get_ylim()
    assert low > 1.0 / 16                   # the axis is not stretched down towards 1


def test_with_windows_of_10_the_first_and_largest_scales_are_the_runs_own(tmp_path):
    """From 2**15 four overflows back off to 2**11 inside the first window: a window's last
    step alone would give 2048 for the first scale and the largest."""
    results = fp16_run(tmp_path, 60, 10)
    s = read_report(tmp_path).summary
    used = [r.scale for r in results]
    assert s.scale_first == used[0] == 2.0 ** 15
    assert s.scale_max == max(used) == 2.0 ** 15
    assert s.scale_min == min(used) and s.scale_last == used[-1]
    assert max(series(tmp_path, "scale").values()) < 2.0 ** 15


def test_files_of_an_earlier_monitor_still_read_and_say_what_they_lack(tmp_path):
    """Only the scale, skipped-steps and overflow-rate series: the scales are the windows'
    last, said once."""
    for key, lines in {"scale": "4 1024\n9 512\n", "skipped-steps": "4 0\n9 1\n",
                       "overflow-rate": "4 0\n9 0.2\n"}.items():
        (tmp_path / f"loss-scale-{key}.series.txt").write_text(lines)
    report = read_report(tmp_path)
    s = report.summary
    assert (s.scale_first, s.scale_max, s.ranged, s.precision_recorded) == (1024, 1024,
                                                                           False, False)
    text = text_of(report)
    assert "loss scale (at each window's last step): first 1024" in text
    assert text.count("a scale of 1 may be a switch to float32") == 1


def test_a_long_run_is_drawn_in_bins_that_keep_its_extremes_and_counts():
    from nnabla_mpt.report.run_report import binned
    from nnabla_mpt.report.summary import Windows
    n = 5003
    last = np.arange(n, dtype=np.int64) * 10 + 9
    rng = np.random.RandomState(0)
    skipped = rng.randint(0, 3, n)
    scale = 2.0 ** rng.randint(5, 15, n)
    low, high = scale / 4, scale * 2
    float32 = np.where(np.arange(n) >= 4000, 10, 0)
    float32[3999] = 3                       # the switch at step 39997
    w = Windows(first=last - 9, last=last, skipped=skipped, scale=scale, interval=10,
                scale_first=scale, low=low, high=high, held=np.zeros(n), float32=float32,
                ranged=True)
    assert w.switch == 39997
    b = binned(w, 2000)
    assert b.windows == 3 and len(b.last) == 1668
    assert b.skipped.sum() == skipped.sum() and b.last[-1] == last[-1] and b.first[0] == 0
    for k in (0, 700, 1333, 1667):          # bins before, at and after the switch
        part = slice(3 * k, min(3 * k + 3, n))
        on = w.scaled[part]
        assert b.scaled[k] == on.any()
        if on.any():
            assert b.low[k] == low[part][on].min() and b.high[k] == high[part][on].max()
            assert b.scale[k] == w.used_scale[part][on][-1]
        else:
            assert np.isnan(b.scale[k])
    assert binned(w, n).windows == 1


def test_a_series_read_in_small_blocks_is_the_series_read_whole(tmp_path, monkeypatch):
    """Blocks that end inside a line, an index written again across blocks, a partial
    last line: the same steps, values and counts as one block."""
    from nnabla_mpt.report import series as series_module
    path = tmp_path / "loss-scale-scale.series.txt"
    path.write_text("".join(f"{i} {2.0 ** (i % 7):g}\n" for i in range(0, 300, 3)) +
                    "150 0.125\n297 8\n300 1")
    whole = series_module.read_series(str(path))
    monkeypatch.setattr(series_module, "_CHUNK", 7)
    blocks = series_module.read_series(str(path))
    assert (whole.rewritten, whole.partial) == (blocks.rewritten, blocks.partial) == (2, True)
    np.testing.assert_array_equal(whole.steps, blocks.steps)
    np.testing.assert_array_equal(whole.values, blocks.values)
    assert whole.steps.tolist() == list(range(0, 300, 3))
    assert whole.values[50] == 0.125 and whole.values[-1] == 8.0


def test_the_legend_names_only_what_is_drawn_and_the_ceiling_shows_over_the_scale(tmp_path):
    """A run without skipped steps whose scale sits at 2**15, the float16 seed's ceiling."""
    for key, value in {"scale": 32768, "skipped-steps": 0, "overflow-rate": 0}.items():
        (tmp_path / f"loss-scale-{key}.series.txt").write_text(
            "".join(f"{i} {value}\n" for i in range(9, 100, 10)))
    scale = read_report(tmp_path).figure().axes[0]
    labels = legend(scale)
    assert not any("skipped" in label for label in labels), labels
    ceiling = next(l for l in scale.lines if l.get_label().startswith("largest scale an fp16"))
    used = next(l for l in scale.lines if l.get_label().startswith("loss scale at each"))
    assert set(used.get_ydata()) == {32768.0} and ceiling.get_zorder() > used.get_zorder()

"""The digits demo runs end to end: real fp16 training, report, plot and summary.json."""
import importlib.util
import json
import pathlib
import struct
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEMO = ROOT / "examples" / "digits_demo.py"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def run_demo(out, *args):
    cmd = [sys.executable, str(DEMO), "--out", str(out), "--no-progress", *map(str, args)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"demo failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    with open(out / "summary.json", encoding="utf-8") as f:
        return json.load(f), proc.stdout


def replay_scale(initial, changes, steps):
    """The scale each step ran with, rebuilt from the (step, new scale) change points."""
    used, scale, pending = [], initial, dict((int(i), s) for i, s in changes)
    for i in range(steps):
        used.append(scale)
        scale = pending.get(i, scale)
    return used, scale


def load_demo_module():
    spec = importlib.util.spec_from_file_location("digits_demo", DEMO)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("digits")
    summary, stdout = run_demo(out, "--steps", 120, "--interval", 20, "--scale", 2.0 ** 15,
                               "--seed", 0)
    return out, summary, stdout


def test_short_run_learns_in_fp16_like_float(short_run):
    _, summary, _ = short_run
    acc = summary["accuracy"]
    assert summary["steps"] == 120
    assert acc["fp16"] > 0.7, acc
    assert acc["float"] > 0.7, acc
    assert abs(acc["fp16"] - acc["float"]) < 0.1, acc
    assert acc["fp16_inference"] > 0.7, acc
    assert np.isfinite(summary["final_loss"]["fp16"])
    assert summary["final_loss"]["fp16"] < 1.0, summary["final_loss"]
    assert set(summary["seconds"]) == {"fp16", "float", "total"}


def test_scale_starts_high_and_backs_off(short_run):
    _, summary, _ = short_run
    sc = summary["loss_scale"]
    assert sc["initial"] == 2.0 ** 15
    # The large initial scale overflows in fp16 on the very first step and is halved.
    assert sc["changes"][0] == [0, 2.0 ** 14]
    assert sc["min"] < sc["initial"]
    assert sc["min"] <= sc["final"] <= sc["max"]
    assert sc["max"] >= sc["initial"]
    # Every scale is a power of two times the initial one (factor 2 up and down).
    for _, s in sc["changes"]:
        assert np.log2(s / sc["initial"]) == int(np.log2(s / sc["initial"]))


def test_skipped_steps_match_the_trajectory(short_run):
    _, summary, _ = short_run
    sc, sk, steps = summary["loss_scale"], summary["skipped_steps"], summary["steps"]
    assert sk["total"] > 0
    assert sk["warmup"] >= 1 and sk["first_update_step"] == sk["warmup"]
    assert sk["warmup"] + sk["after_warmup"] == sk["total"] == len(sk["steps"])
    # Each skipped step halves the scale at that step; each halving is a skipped step.
    used, final = replay_scale(sc["initial"], sc["changes"], steps)
    assert final == sc["final"]
    decreases = {i: s for i, s in sc["changes"] if s < used[i]}
    assert sorted(decreases) == sk["steps"]
    for i, s in decreases.items():
        assert s == used[i] / 2
    # Growth (measured, the default) multiplies the scale by a power of two, and only
    # after 20 clean steps in a row; the growth points where it held are no changes.
    growth = summary["growth"]
    assert growth["mode"] == "measured"
    increases = sorted(i for i, s in sc["changes"] if s > used[i])
    assert increases == growth["grew_at"]
    assert not set(growth["held_at"]) & {i for i, _ in sc["changes"]}
    assert growth["points"] == growth["grew"] + growth["held"] == (
        len(growth["grew_at"]) + len(growth["held_at"]))
    for i in growth["grew_at"] + growth["held_at"]:
        window = range(i - 19, i + 1)
        assert not any(j in decreases for j in window), (i, sc["changes"])
    for i, s in sc["changes"]:
        if s > used[i]:
            k = np.log2(s / used[i])
            assert k == int(k) and k >= 1, (i, s, used[i])


def read_series(path):
    rows = [line.split() for line in path.read_text().splitlines() if line.strip()]
    return {int(step): float(value) for step, value in rows}


def test_monitor_series_match_the_trajectory(short_run):
    """The demo feeds nnabla.monitor every 50 steps; the records agree with the run."""
    out, summary, stdout = short_run
    monitor = out / "monitor"
    assert f"wrote {monitor}/" in stdout
    sc, sk, steps = summary["loss_scale"], summary["skipped_steps"], summary["steps"]
    used, _ = replay_scale(sc["initial"], sc["changes"], steps)
    record_steps = [49, 99, steps - 1]          # two full windows of 50, then the flush
    scale = read_series(monitor / "loss-scale-scale.series.txt")
    skipped = read_series(monitor / "loss-scale-skipped-steps.series.txt")
    rate = read_series(monitor / "loss-scale-overflow-rate.series.txt")
    assert sorted(scale) == sorted(skipped) == sorted(rate) == record_steps
    for step in record_steps:
        assert scale[step] == pytest.approx(used[step], rel=1e-5)
        assert skipped[step] == sum(1 for i in sk["steps"] if i <= step)
    windows = [(0, 49), (50, 99), (100, steps - 1)]
    for first, last in windows:
        n = sum(1 for i in sk["steps"] if first <= i <= last)
        assert rate[last] == pytest.approx(n / (last - first + 1), rel=1e-5)
    assert (monitor / "training-loss.series.txt").stat().st_size > 0


def test_the_monitoring_page_names_the_series_the_demo_writes(short_run):
    import re
    page = (ROOT / "docs" / "monitoring.rst").read_text(encoding="utf-8")
    section = page[page.index("\nIn the demo\n"):]      # the page's last section
    named = set(re.findall(r"``([\w-]+\.series\.txt)``", section))
    written = {path.name for path in (short_run[0] / "monitor").iterdir()}
    assert written <= named
    # the ceiling's series comes only with a float16 loss (tested above with one)
    assert named - written == {"loss-scale-growth-held-by-ceiling.series.txt"}


def test_gradient_statistics_in_summary_and_monitor(short_run):
    """Statistics every 50 steps (--stats-every): steps 49 and 99 of 120; the monitor's
    gradient series hold the same numbers (the window flushed at 119 has none)."""
    out, summary, _ = short_run
    gs = summary["gradient_stats"]
    assert summary["stats_every"] == gs["every"] == 50
    assert [r["step"] for r in gs["series"]] == [49, 99] and gs["records"] == 2
    last = gs["last"]
    assert last["step"] == 99 and set(last["parameters"]) == {
        "fc{}/affine/{}".format(i, p) for i in range(4) for p in "Wb"}
    for r in gs["series"] + list(last["parameters"].values()):
        assert 0 <= r["zero_fraction"] <= 1 and 0 <= r["subnormal_fraction"] <= 1
        assert r["nonfinite_fraction"] == 0 and r["headroom"] == int(r["headroom"]) >= 0
    assert last["headroom"] == min(p["headroom"] for p in last["parameters"].values())
    monitor = out / "monitor"
    names = {"zero_fraction": "zero-fraction", "subnormal_fraction": "subnormal-fraction",
             "headroom": "headroom"}
    for key, name in names.items():
        series = read_series(monitor / "loss-scale-gradient-{}.series.txt".format(name))
        assert sorted(series) == [49, 99]
        for r in gs["series"]:
            assert series[r["step"]] == pytest.approx(r[key], rel=1e-5)
    assert summary["files"]["monitor_series"] == sorted(
        p.name for p in monitor.iterdir() if p.name.endswith(".series.txt"))
    assert "loss-scale-gradient-headroom.series.txt" in summary["files"]["monitor_series"]


def test_report_and_plot(short_run):
    out, summary, stdout = short_run
    acc = summary["accuracy"]
    assert "{:.2f}%".format(100 * acc["fp16"]) in stdout
    assert "{:.2f}%".format(100 * acc["float"]) in stdout
    assert "skipped steps: {} of 120".format(summary["skipped_steps"]["total"]) in stdout
    assert "initial 32768 (--scale 32768)" in stdout
    growth = summary["growth"]
    assert ("growth (measured, due after 20 good steps in a row): {} growth points, {} grew, "
            "{} held".format(growth["points"], growth["grew"], growth["held"])) in stdout
    last = summary["gradient_stats"]["last"]
    assert ("fp16 gradient statistics (every 50 steps), last at step 99: {:.2f}% zero, {:.2f}% "
            "subnormal".format(100 * last["zero_fraction"],
                               100 * last["subnormal_fraction"])) in " ".join(stdout.split())
    assert "headroom {:g} power".format(last["headroom"]) in stdout
    png = out / "digits_fp16.png"
    assert summary["files"]["plot"] == str(png)
    data = png.read_bytes()
    assert len(data) > 1000
    assert data[:8] == PNG_SIGNATURE
    width, height = struct.unpack(">II", data[16:24])  # IHDR
    # three panels: loss, loss scale, gradient statistics (9 x 9.5 inches at 100 dpi)
    assert data[12:16] == b"IHDR" and width >= 600 and height >= 900


def test_mean_loss_never_tries_a_scale_fp16_cannot_seed(tmp_path):
    # With the mean loss the gradients stay far below 65504; what bounds the scale is
    # fp16 itself: backward(scale) seeds the pass in fp16, where 2**16 is inf. --scale
    # 65536 is lowered to 2**15, and probe growth stops there: nothing overflows.
    summary, stdout = run_demo(tmp_path, "--steps", 30, "--interval", 10,
                               "--scale", 2.0 ** 16, "--reduction", "mean",
                               "--growth-mode", "probe", "--loss-dtype", "float16")
    assert summary["loss_scale"] == {"initial": 2.0 ** 15, "min": 2.0 ** 15,
                                     "max": 2.0 ** 15, "final": 2.0 ** 15, "changes": [],
                                     "requested": 2.0 ** 16}
    assert summary["skipped_steps"] == {"total": 0, "warmup": 0, "after_warmup": 0,
                                        "first_update_step": 0, "steps": []}
    assert summary["growth"] == {"mode": "probe", "points": 3, "grew": 0, "held": 3,
                                 "grew_at": [], "held_at": [9, 19, 29],
                                 "held_by_ceiling": []}
    assert "initial 32768 (--scale 65536 lowered to 32768: fp16 cannot seed" in stdout


def test_auto_scale_and_measured_growth_are_the_defaults(tmp_path):
    summary, stdout = run_demo(tmp_path, "--steps", 40, "--interval", 10,
                               "--stats-every", 20)
    sc = summary["loss_scale"]
    assert sc["requested"] == "auto" and summary["growth_mode"] == "measured"
    assert 1 <= sc["initial"] <= 2.0 ** 15 and np.log2(sc["initial"]) % 1 == 0
    assert "initial {} (chosen by --scale auto from the first batch's gradients)".format(
        int(sc["initial"])) in stdout
    assert summary["growth"]["points"] >= 1
    assert [r["step"] for r in summary["gradient_stats"]["series"]] == [19, 39]


@pytest.mark.parametrize("args, message", [
    (["--steps", "0"], "--steps must be >= 1, got 0"),
    (["--stats-every", "0"], "--stats-every must be >= 1, got 0"),
    (["--growth-mode", "x"], "argument --growth-mode: invalid choice: 'x'"),
    (["--scale", "fast"], "argument --scale: must be 'auto' or a number > 0, got 'fast'"),
    (["--scale", "0"], "argument --scale: must be 'auto' or a number > 0, got '0'"),
])
def test_bad_option_is_reported(tmp_path, args, message):
    proc = subprocess.run([sys.executable, str(DEMO), "--out", str(tmp_path), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert message in proc.stderr


def test_batches_are_reproducible_and_cover_each_epoch():
    demo = load_demo_module()
    x = np.arange(10, dtype=np.float32).reshape(10, 1)
    y = np.arange(10, dtype=np.int32).reshape(10, 1)
    a, b = demo.BatchStream(x, y, 4, seed=3), demo.BatchStream(x, y, 4, seed=3)
    first = [a.next() for _ in range(5)]
    for (xa, ya), (xb, yb) in zip(first, [b.next() for _ in range(5)]):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
    seen = np.concatenate([xb[:, 0] for xb, _ in first])[:10]
    assert sorted(seen.tolist()) == list(range(10))
    other = demo.BatchStream(x, y, 4, seed=4)
    assert any(not np.array_equal(other.next()[0], xa) for xa, _ in first)


def test_summaries_of_a_history():
    demo = load_demo_module()
    history = {"scale": [8.0, 4.0, 4.0, 4.0, 8.0],
               "next_scale": [4.0, 4.0, 4.0, 8.0, 4.0],
               "skipped": [True, False, False, False, True]}
    assert demo.scale_trajectory(history) == {
        "initial": 8.0, "min": 4.0, "max": 8.0, "final": 4.0,
        "changes": [[0, 4.0], [3, 8.0], [4, 4.0]]}
    assert demo.skipped_summary(history) == {
        "total": 2, "warmup": 1, "after_warmup": 1, "first_update_step": 1, "steps": [0, 4]}


def test_the_report_says_when_the_fp16_ceiling_not_the_gradients_holds_the_scale(tmp_path):
    # A mean loss leaves the gradients room for several powers of two at 2**15, the
    # largest scale an fp16 loss can seed: measured growth is held by that ceiling.
    summary, stdout = run_demo(tmp_path, "--steps", 30, "--interval", 10,
                               "--reduction", "mean", "--growth-mode", "measured",
                               "--loss-dtype", "float16")
    growth = summary["growth"]
    assert summary["loss_dtype"] == "float16"
    assert growth["held_by_ceiling"] and set(growth["held_by_ceiling"]) <= set(
        growth["held_at"])
    assert ("{} of them held by the largest scale an fp16 loss can seed (2**15), not by the "
            "gradients: a loss in float32 (--loss-dtype float32, the default) lifts "
            "it".format(len(growth["held_by_ceiling"])) in " ".join(stdout.split()))
    series = (tmp_path / "monitor" / "loss-scale-growth-held-by-ceiling.series.txt")
    assert series.exists()


def test_by_default_the_loss_is_float32_and_the_ceiling_warning_never_fires(tmp_path):
    # The run above, with the default loss dtype: the loss alone in float32 over the fp16
    # network seeds in float32, so 65536 is taken as asked, the scale grows past 2**15,
    # no growth point is held by a ceiling and the updater does not warn.
    cmd = [sys.executable, str(DEMO), "--out", str(tmp_path), "--no-progress",
           "--steps", "30", "--interval", "10", "--reduction", "mean",
           "--scale", str(2.0 ** 16)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text(encoding="utf-8"))
    assert summary["loss_dtype"] == "float32"
    assert summary["loss_scale"]["initial"] == 2.0 ** 16
    assert summary["loss_scale"]["max"] > 2.0 ** 16
    assert summary["growth"]["held_by_ceiling"] == []
    assert "Warning" not in proc.stderr and "held at" not in proc.stderr
    assert "sum loss in float32" not in proc.stdout
    assert "mean loss in float32, seed 0" in proc.stdout


def test_growth_points_of_a_history():
    demo = load_demo_module()
    # due at steps 1, 2 and 4: 1 grew, 2 held, 4 overflowed (no growth point), and
    # step 5 ran in float after a precision switch (the policy is not asked there)
    history = {"scale": [4.0, 4.0, 16.0, 16.0, 16.0, 1.0],
               "next_scale": [4.0, 16.0, 16.0, 16.0, 8.0, 1.0],
               "skipped": [False, False, False, False, True, False],
               "precision": ["half"] * 5 + ["float"],
               "growth_due": [False, True, True, False, True, True]}
    assert demo.growth_summary(history) == {"points": 2, "grew": 1, "held": 1,
                                            "grew_at": [1], "held_at": [2],
                                            "held_by_ceiling": []}
    history["held_by"] = [None, None, "ceiling", None, None, None]
    assert demo.growth_summary(history)["held_by_ceiling"] == [2]


def gradient_record(step, headroom, skipped=False, nonfinite=0.0):
    stats = {"size": 10, "dtype": "float16", "zero_fraction": 0.5,
             "subnormal_fraction": 0.1, "nonfinite_fraction": nonfinite,
             "max_abs": float("inf") if nonfinite else 2.0, "headroom": headroom}
    return {"step": step, "skipped": skipped, "overall": stats, "parameters": {"w": stats}}


def test_gradient_summary_is_valid_json():
    demo = load_demo_module()
    history = {"gradient_stats": [gradient_record(9, 3.0),
                                  gradient_record(19, float("-inf"), True, 0.2)]}
    summary = demo.gradient_summary(history, 10)
    json.dumps(summary, allow_nan=False)      # inf headroom and max_abs became None
    assert summary["records"] == 2 and summary["every"] == 10
    assert summary["series"][0] == {"step": 9, "skipped": False, "precision": "half",
                                    "zero_fraction": 0.5,
                                    "subnormal_fraction": 0.1, "nonfinite_fraction": 0.0,
                                    "max_abs": 2.0, "headroom": 3.0}
    assert summary["last"]["headroom"] is None and summary["last"]["max_abs"] is None
    assert "headroom -inf: a gradient holds inf/NaN" in demo.describe_gradients(summary)
    assert "at step 19 (skipped)" in demo.describe_gradients(summary)
    one = demo.gradient_summary({"gradient_stats": [gradient_record(9, 1.0)]}, 10)
    assert "headroom 1 power of two (in w)" in demo.describe_gradients(one)
    assert demo.gradient_summary({"gradient_stats": []}, 10)["last"] is None


def test_plot_has_a_gradient_statistics_panel(tmp_path):
    demo = load_demo_module()
    steps = 40
    fp16 = {"loss": list(np.linspace(2.0, 0.1, steps)), "scale": [8.0] * steps,
            "next_scale": [8.0] * steps, "skipped": [False] * steps,
            "precision": ["half"] * steps, "growth_due": [False] * steps,
            "gradient_stats": [gradient_record(19, 3.0), gradient_record(39, 2.0)]}
    fig = demo.plot(str(tmp_path / "p.png"), fp16, {"loss": fp16["loss"]}, "title")
    loss, scale, grads, headroom = fig.axes          # the headroom on a twin axis
    assert grads.get_ylabel() == "fp16 gradient values (%)"
    assert headroom.get_ylabel() == "headroom (powers of 2)"
    assert [t.get_text() for t in grads.get_legend().get_texts()] == [
        "zero (%)", "subnormal (%)", "headroom: smallest over the parameters"]
    assert list(headroom.lines[0].get_ydata()) == [3.0, 2.0]
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_precision_schedule_flag(tmp_path):
    summary, stdout = run_demo(tmp_path, "--steps", 40, "--interval", 10, "--stats-every", 10,
                               "--accelerate-train-mode", "fast|step|0.75")
    assert summary["precision"] == {"accelerate_train_mode": "fast|step|0.75",
                                    "half_steps": 30, "float_steps": 10, "switch_step": 30}
    assert "precision schedule 'fast|step|0.75': 30 steps in fp16, 10 in float" in stdout
    # No scale is used after the switch: the trajectory ends at the last fp16 step.
    sc = summary["loss_scale"]
    assert sc["final"] is None and sc["unused_from"] == 30
    assert sc["min"] >= 1024 and all(i < 30 for i, _ in sc["changes"])
    assert sc["last_used"] == replay_scale(sc["initial"], sc["changes"], 30)[0][-1]
    text = " ".join(stdout.split())
    assert "final 1" not in text and "final" not in text.split("loss scale:")[1][:200]
    assert ("last used {} by step 29; from step 30 on, after the precision schedule's switch "
            "to float32, no loss scale is used".format(int(sc["last_used"]))) in text
    # The float32 statistics are told apart from the fp16 ones.
    gs = summary["gradient_stats"]
    assert [r["precision"] for r in gs["series"]] == ["half"] * 3 + ["float"]
    assert gs["last_fp16"]["step"] == 29 and gs["last"]["step"] == 39
    assert gs["last"]["headroom"] > 100 > gs["last_fp16"]["headroom"]   # float32's range
    assert "fp16 gradient statistics (every 10 steps), last at step 29" in text
    assert ("after the switch, float32 gradient statistics (every 10 steps), last at step 39"
            in text)
    assert "counted to float32's largest value as no loss scale is used" in text
    # The float steps keep training the shared parameters: the loss keeps falling.
    assert summary["accuracy"]["fp16"] > 0.5


def test_plot_marks_the_precision_switch_and_the_seed_ceiling(tmp_path):
    demo = load_demo_module()
    steps, switch = 40, 30
    fp16 = {"loss": list(np.linspace(2.0, 0.1, steps)),
            "scale": [8.0] * switch + [1.0] * (steps - switch),
            "next_scale": [8.0] * (switch - 1) + [1.0] * (steps - switch + 1),
            "skipped": [False] * steps,
            "precision": ["half"] * switch + ["float"] * (steps - switch),
            "growth_due": [False] * steps,
            "gradient_stats": [gradient_record(19, 3.0), gradient_record(29, 2.0),
                               dict(gradient_record(39, 131.0), precision="float")]}
    fig = demo.plot(str(tmp_path / "p.png"), fp16, {"loss": fp16["loss"]}, "title")
    loss, scale, grads, headroom = fig.axes
    for ax in (loss, scale, grads):          # a vertical line at the switch in every panel
        assert any(list(line.get_xdata()) == [switch, switch] for line in ax.lines)
    labels = [t.get_text() for t in scale.get_legend().get_texts()]
    assert "switch to float32 (step 30)" in labels
    assert "switch to float32 (step 30)" in [t.get_text() for t in
                                             loss.get_legend().get_texts()]
    assert "largest fp16 number (65504)" in labels
    assert "largest scale an fp16 loss can seed (2**15 = 32768)" in labels
    assert any(list(line.get_ydata()) == [2.0 ** 15] * 2 for line in scale.lines)
    # the scale ends at the switch: the 1 reported after it is no scale
    [used] = [line for line in scale.lines if line.get_label() == "loss scale used"]
    ydata = np.asarray(used.get_ydata(), dtype=np.float64)
    assert (ydata[:switch] == 8.0).all() and np.isnan(ydata[switch:]).all()
    assert any("no loss scale used" in t.get_text() for t in scale.texts)
    # float32 statistics drawn apart, their headroom (131) not on the fp16 axis
    assert grads.get_ylabel() == "gradient values (%)"
    # the note on the float32 headroom is a legend entry: no line runs through it
    assert [t.get_text() for t in grads.get_legend().get_texts()] == [
        "zero (%), fp16", "subnormal (%), fp16", "zero (%), float32 after the switch",
        "subnormal (%), float32 after the switch", "float32 headroom not drawn (last 131)",
        "headroom: smallest over the parameters, fp16"]
    assert list(headroom.lines[0].get_ydata()) == [3.0, 2.0]
    assert not grads.texts
    # markers at 0 (no subnormal after the switch) are drawn whole, not clipped
    assert all(not line.get_clip_on() for line in grads.lines if line.get_label()
               and "%" in line.get_label())
    # the scale panel's legend stands left of the float32 band, in one column
    legend = scale.get_legend()
    assert legend._loc == 3 and legend._ncols == 1


@pytest.mark.parametrize("args, message", [
    (["--accelerate-train-mode", "fast|step|0.95"],
     "VALUE for the 'step' trigger must lie in [0.2, 0.9], got 0.95"),
    (["--accelerate-train-mode", "fast|loss"], "uses the 'loss' trigger: give --final-loss"),
    (["--final-loss", "0.1"], "--final-loss goes with --accelerate-train-mode"),
])
def test_precision_schedule_flag_is_checked(tmp_path, args, message):
    proc = subprocess.run([sys.executable, str(DEMO), "--out", str(tmp_path), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert message in proc.stderr


def test_the_report_says_fp16_on_the_cpu_is_emulated(short_run):
    _, _, stdout = short_run
    text = " ".join(stdout.split())
    assert "fp16 on the CPU is emulated by nnabla" in text
    assert "the speed of fp16 is a GPU matter" in text


def test_no_progress_bars_when_stderr_is_not_a_terminal(tmp_path):
    # Without --no-progress, and stderr redirected (a pipe here): no bar updates.
    cmd = [sys.executable, str(DEMO), "--out", str(tmp_path), "--steps", "20",
           "--interval", "10", "--stats-every", "10"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "it/s" not in proc.stderr and "\r" not in proc.stderr
    assert len(proc.stderr) < 2000, proc.stderr
    # ... but progress lines on stdout (here the run is shorter than an epoch: the last step)
    lines = proc.stdout.splitlines()
    assert [line.split(",")[0] for line in lines if line.startswith(("fp16 :", "float:"))] == [
        "fp16 : step 20/20 (epoch 0.9)", "float: step 20/20 (epoch 0.9)"]


def test_progress_lines_come_at_epoch_ends_at_most_every_interval(capsys):
    demo = load_demo_module()
    lines = demo.ProgressLines("fp16 ", 100, 22, every=0.0)
    for done in range(1, 101):
        lines.step(done, "loss 1")
    printed = capsys.readouterr().out.splitlines()
    assert [line.split(" (")[0] for line in printed] == [
        "fp16 : step {}/100".format(n) for n in (22, 44, 66, 88, 100)]
    lines = demo.ProgressLines("fp16 ", 100, 22, every=3600.0)
    for done in range(1, 101):
        lines.step(done, "loss 1")
    printed = capsys.readouterr().out.splitlines()
    assert [line.split(" (")[0] for line in printed] == ["fp16 : step 22/100",
                                                          "fp16 : step 100/100"]


def test_on_a_terminal_log_lines_are_written_through_the_bar(tmp_path):
    # stderr is a terminal (a pseudo-terminal here): the bar is drawn, and each log line
    # the run writes while it is on screen starts a line of its own.
    import os
    import pty
    import re
    import fcntl
    import termios
    master, slave = pty.openpty()
    # a terminal of 24 x 120 characters (a new pseudo-terminal has no size: no bar fits)
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    cmd = [sys.executable, str(DEMO), "--out", str(tmp_path), "--steps", "12",
           "--interval", "5", "--stats-every", "5"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=600) == 0
    os.close(master)
    out = b"".join(chunks).decode("utf-8", "replace")
    assert "it/s" in out or "s/it" in out                       # the bar was drawn
    logged = [m.start() for m in re.finditer(r"\d{4}-\d\d-\d\d [\d:,]+ \[nnabla\]", out)]
    during = [i for i in logged if out.rfind("%|", 0, i) > 0]  # after the bar appeared
    assert during, out[-3000:]
    for i in during:
        start = max(out.rfind("\n", 0, i), out.rfind("\r", 0, i)) + 1
        assert out[start:i].strip() == "", repr(out[max(0, i - 200):i + 80])


def test_progress_after_a_precision_switch_says_float32(tmp_path):
    """Progress lines (stdout to a pipe): the last one, after the switch, says float32 and
    no loss scale, not a scale."""
    cmd = [sys.executable, str(DEMO), "--out", str(tmp_path), "--steps", "40", "--interval",
           "10", "--stats-every", "10", "--accelerate-train-mode", "fast|step|0.75"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("fp16 : step")]
    assert lines and lines[-1].startswith("fp16 : step 40/40")
    assert ", float32, no loss scale, skipped " in lines[-1] and "scale none" not in lines[-1]
    assert all(", scale " in line for line in lines[:-1]), lines

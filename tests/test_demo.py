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
    # Growth doubles the scale and only after 20 clean steps in a row.
    for i, s in sc["changes"]:
        if s > used[i]:
            assert s == used[i] * 2
            window = range(i - 19, i + 1)
            assert not any(j in decreases for j in window), (i, sc["changes"])


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


def test_report_and_plot(short_run):
    out, summary, stdout = short_run
    acc = summary["accuracy"]
    assert "{:.2f}%".format(100 * acc["fp16"]) in stdout
    assert "{:.2f}%".format(100 * acc["float"]) in stdout
    assert "skipped steps: {} of 120".format(summary["skipped_steps"]["total"]) in stdout
    assert "initial 32768" in stdout
    png = out / "digits_fp16.png"
    assert summary["files"]["plot"] == str(png)
    data = png.read_bytes()
    assert len(data) > 1000
    assert data[:8] == PNG_SIGNATURE
    width, height = struct.unpack(">II", data[16:24])  # IHDR
    assert data[12:16] == b"IHDR" and width >= 600 and height >= 400


def test_mean_loss_overflows_only_when_the_scale_itself_is_not_fp16(tmp_path):
    # With the mean loss the gradients stay far below 65504: 2**16 (inf in fp16) overflows
    # every time it is tried, 2**15 never does.
    summary, _ = run_demo(tmp_path, "--steps", 30, "--interval", 10, "--scale", 2.0 ** 16,
                          "--reduction", "mean")
    assert summary["loss_scale"]["changes"] == [
        [0, 2.0 ** 15], [10, 2.0 ** 16], [11, 2.0 ** 15], [21, 2.0 ** 16], [22, 2.0 ** 15]]
    assert summary["skipped_steps"]["steps"] == [0, 11, 22]
    assert summary["skipped_steps"]["warmup"] == 1


def test_bad_option_is_reported(tmp_path):
    proc = subprocess.run([sys.executable, str(DEMO), "--steps", "0", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "--steps must be >= 1, got 0" in proc.stderr


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


def test_precision_schedule_flag(tmp_path):
    summary, stdout = run_demo(tmp_path, "--steps", 40, "--interval", 10,
                               "--accelerate-train-mode", "fast|step|0.75")
    assert summary["precision"] == {"accelerate_train_mode": "fast|step|0.75",
                                    "half_steps": 30, "float_steps": 10, "switch_step": 30}
    assert "precision schedule 'fast|step|0.75': 30 steps in fp16, 10 in float" in stdout
    # The float steps keep training the shared parameters: the loss keeps falling.
    assert summary["accuracy"]["fp16"] > 0.5


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

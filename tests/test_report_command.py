"""``python -m nnabla_mpt.report``: the summary and the figure of a real run's series, a
clear error for each bad directory, and the summary alone without matplotlib."""
import os
import subprocess
import sys

import pytest

from doc_pages import ROOT
from nnabla_mpt import read_report
from report_runs import fp16_run

PNG = b"\x89PNG\r\n\x1a\n"


def command(*args, env=None):
    return subprocess.run([sys.executable, "-m", "nnabla_mpt.report", *map(str, args)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("monitor")
    fp16_run(directory, 30, 5, gradient_stats_every=10)
    return directory


def test_the_command_prints_the_summary_and_draws_the_figure(run_dir, tmp_path):
    proc = command(run_dir, "--out", tmp_path / "run.png")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == read_report(run_dir).text() + f"\n  wrote {tmp_path / 'run.png'}\n"
    assert (tmp_path / "run.png").read_bytes()[:8] == PNG
    # by default the figure goes next to the series
    proc = command(run_dir)
    assert proc.returncode == 0 and (run_dir / "loss-scale-report.png").exists()
    assert proc.stdout.endswith(f"wrote {run_dir / 'loss-scale-report.png'}\n")


def test_another_prefix(tmp_path):
    from nnabla.monitor import Monitor
    from nnabla_mpt import LossScaleMonitor, StepResult
    hook = LossScaleMonitor(Monitor(str(tmp_path)), interval=2, prefix="amp")
    for i in range(4):
        hook(StepResult(step=i, skipped=i == 0, scale=8.0, next_scale=8.0))
    proc = command(tmp_path, "--prefix", "amp", "--out", tmp_path / "amp.png")
    assert proc.returncode == 0, proc.stderr
    assert "amp series of" in proc.stdout and "skipped steps: 1 of 4" in proc.stdout
    proc = command(tmp_path)                                  # the default prefix
    assert proc.returncode == 2
    assert "it holds the loss-scale series of prefix 'amp'" in proc.stderr


def bad_directories(root):
    """name -> (path, what the message says)."""
    (root / "empty").mkdir()
    (root / "a_file.txt").write_text("1 2\n")
    (root / "not_series").mkdir()
    for key in ("scale", "skipped-steps", "overflow-rate"):
        (root / "not_series" / f"loss-scale-{key}.series.txt").write_text(
            "step,scale\n0,1024\n")
    (root / "binary").mkdir()
    for key in ("scale", "skipped-steps", "overflow-rate"):
        (root / "binary" / f"loss-scale-{key}.series.txt").write_bytes(bytes(range(256)))
    (root / "other_series").mkdir()
    (root / "other_series" / "training-loss.series.txt").write_text("0 2.3\n")
    (root / "half").mkdir()
    (root / "half" / "loss-scale-scale.series.txt").write_text("4 1024\n")
    (root / "no_window").mkdir()
    for key in ("scale", "skipped-steps", "overflow-rate"):
        (root / "no_window" / f"loss-scale-{key}.series.txt").write_text("")
    not_series = root / "not_series"
    return {
        "missing": (root / "missing", "no such directory"),
        "empty": (root / "empty", "no loss-scale-*.series.txt files"),
        "a file": (root / "a_file.txt", "a file, not a directory"),
        "not MonitorSeries": (not_series, f"{not_series / 'loss-scale-'}"),
        "binary": (root / "binary", "is not '<index> <value>' as nnabla's MonitorSeries"),
        "other series": (root / "other_series", "it holds other series: training-loss"),
        "one series": (root / "half", "loss-scale-skipped-steps.series.txt, "
                                      "loss-scale-overflow-rate.series.txt missing"),
        "no window yet": (root / "no_window", "hold no window yet"),
    }


@pytest.mark.parametrize("name", ["missing", "empty", "a file", "not MonitorSeries", "binary",
                                  "other series", "one series", "no window yet"])
def test_a_bad_directory_is_an_error_naming_it(tmp_path, name):
    path, says = bad_directories(tmp_path)[name]
    with pytest.raises((OSError, ValueError)) as raised:
        read_report(path)
    assert str(path) in str(raised.value) and says in str(raised.value)
    if name == "not MonitorSeries":
        assert "line 1: 'step,scale' is not '<index> <value>'" in str(raised.value)
    proc = command(path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == f"python -m nnabla_mpt.report: error: {raised.value}\n"


def test_without_matplotlib_the_summary_is_printed_and_the_install_named(run_dir, tmp_path):
    blocker = tmp_path / "no_matplotlib" / "matplotlib"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('No module named matplotlib')\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(blocker.parent), str(ROOT),
                                         env.get("PYTHONPATH", "")])
    proc = command(run_dir, "--out", tmp_path / "none.png", env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == read_report(run_dir).text() + "\n"
    assert "drawing the figure needs matplotlib" in proc.stderr
    assert 'pip install ".[plot]"' in proc.stderr
    assert not (tmp_path / "none.png").exists()


def test_the_help_names_the_options():
    proc = command("--help")
    assert proc.returncode == 0
    for option in ("MONITOR_DIR", "--out FILE.png", "--prefix PREFIX"):
        assert option in proc.stdout

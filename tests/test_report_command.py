"""``python -m nnabla_mpt.report``: the summary and the figure of a real run's series, a
clear error for each bad directory, and the summary alone without matplotlib."""
import os
import subprocess
import sys

import pytest

from doc_pages import ROOT
from nnabla_mpt import read_report
from report_runs import fp16_run
from support import raises_naming

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
    # each bad directory, with the facts its error carries besides the path
    return {
        "missing": (root / "missing", ("no such directory", "LossScaleMonitor", "save_path")),
        "empty": (root / "empty", ("no loss-scale-*.series.txt files",
                                   "LossScaleMonitor(prefix='loss-scale')")),
        "a file": (root / "a_file.txt", ("a file", "not a directory",
                                         "loss-scale-*.series.txt")),
        "not MonitorSeries": (root / "not_series", ("/loss-scale-", "line 1", "'step,scale'",
                                                    "'<index> <value>'", "MonitorSeries")),
        "binary": (root / "binary", ("/loss-scale-", "line 1", "'<index> <value>'",
                                     "MonitorSeries")),
        "other series": (root / "other_series", ("no loss-scale-*.series.txt files",
                                                 "other series", "training-loss")),
        # the two missing, then the three a monitor writes together
        "one series": (root / "half", ("loss-scale-skipped-steps.series.txt",
                                       "loss-scale-overflow-rate.series.txt", "missing",
                                       "loss-scale-scale.series.txt",
                                       "loss-scale-skipped-steps.series.txt",
                                       "loss-scale-overflow-rate.series.txt")),
        "no window yet": (root / "no_window", ("no window yet", "interval")),
    }


@pytest.mark.parametrize("name", ["missing", "empty", "a file", "not MonitorSeries", "binary",
                                  "other series", "one series", "no window yet"])
def test_a_bad_directory_is_an_error_naming_it(tmp_path, name):
    path, facts = bad_directories(tmp_path)[name]
    with raises_naming((OSError, ValueError), str(path), *facts) as raised:
        read_report(path)
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


def write_run(directory, **lines):
    """Series files of the three series every window has (a fine run of two windows of
    10), with ``lines`` replacing the text of some: ``{key with _ for -: text}``."""
    directory.mkdir(exist_ok=True)
    texts = {"scale": "9 1024\n19 1024\n", "skipped-steps": "9 1\n19 2\n",
             "overflow-rate": "9 0.1\n19 0.1\n"}
    texts.update({key.replace("_", "-"): text for key, text in lines.items()})
    for key, text in texts.items():
        (directory / f"loss-scale-{key}.series.txt").write_text(text)
    return directory


@pytest.mark.parametrize("series, text, says", [
    ("overflow-rate", "9 0.1\n19 7\n", "line 2: overflow-rate 7 at step 19 is not a fraction "
                                       "from 0 to 1"),
    ("scale", "9 nan\n19 1024\n", "line 1: scale nan at step 9 is not a loss scale above 0"),
    ("scale", "9 1024\n19 inf\n", "line 2: scale inf at step 19 is not a loss scale above 0"),
    ("scale", "9 -4096\n19 1024\n", "line 1: scale -4096 at step 9 is not a loss scale"),
    ("scale", "9 1e+300\n19 1024\n", "at most float32's largest value"),
    ("scale", "9 1024\n99999999999999999999 1024\n",
     "line 2: '99999999999999999999 1024' is not '<index> <value>'"),
    ("scale", "-13 1024\n19 1024\n", "line 1: '-13 1024' is not '<index> <value>'"),
    ("scale", "9 1024\n1_9 1024\n", "line 2: '1_9 1024' is not '<index> <value>'"),
    ("scale", "9 1024\n\u0661\u0669 1024\n", "line 2: '\u0661\u0669 1024' is not"),
    ("skipped-steps", "9 3\n19 2\n", "line 2: skipped-steps falls from 3 at step 9 to 2 at "
                                     "step 19: the count of skipped steps never falls"),
    ("skipped-steps", "9 1.5\n19 2\n", "skipped-steps 1.5 at step 9 is not a whole number"),
])
def test_values_that_make_no_sense_end_the_report_naming_file_and_line(tmp_path, series, text,
                                                                        says):
    run = write_run(tmp_path / "run", **{series.replace("-", "_"): text})
    path = run / f"loss-scale-{series}.series.txt"
    proc = command(run, "--out", tmp_path / "x.png")
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert proc.stderr.startswith(f"python -m nnabla_mpt.report: error: {path}")
    assert says in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "x.png").exists()


def test_the_same_run_with_sensible_values_reads(tmp_path):
    """The files of the test above before their edits: the report is made."""
    proc = command(write_run(tmp_path / "run"), "--out", tmp_path / "x.png")
    assert proc.returncode == 0, proc.stderr
    assert "skipped steps: 2 of 20" in proc.stdout


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    run = write_run(tmp_path / "run")
    fifo = run / "loss-scale-overflow-rate.series.txt"
    fifo.unlink()
    os.mkfifo(fifo)
    proc = command(run, "--out", tmp_path / "x.png")     # the command's timeout: 300 s
    assert proc.returncode == 2 and proc.stdout == ""
    assert f"cannot read the series {fifo}: it is a FIFO (named pipe), not a regular " \
           f"file" in proc.stderr


def test_a_symlink_loop_is_named_as_one(tmp_path):
    loop = tmp_path / "loop"
    os.symlink(loop, loop)
    proc = command(loop)
    assert proc.returncode == 2 and f"{loop}: Too many levels of symbolic links" in proc.stderr


@pytest.mark.parametrize("out, says", [
    ("missing/x.png", "no folder {tmp}/missing to write the figure in"),
    ("/proc/x.png", "the folder /proc cannot be written to"),
    ("x.txt", "matplotlib writes .eps, .jpeg, .jpg, .pdf, .pgf, .png"),
    ("x", "not a file without a suffix"),
    ("a_folder", "{tmp}/a_folder: a folder; give the figure's file name, such as "
                 "{tmp}/a_folder/loss-scale-report.png"),
])
def test_an_out_that_cannot_be_written_is_refused_before_any_work(tmp_path, out, says):
    (tmp_path / "a_folder").mkdir()
    run = write_run(tmp_path / "run")
    path = out if out.startswith("/") else str(tmp_path / out)
    proc = command(run, "--out", path)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout   # nothing read first
    assert proc.stderr.startswith(f"python -m nnabla_mpt.report: error: --out {path}: ")
    assert says.format(tmp=tmp_path) in proc.stderr


@pytest.mark.parametrize("suffix", ["png", "svg", "pdf", "jpg"])
def test_the_figure_is_written_in_the_format_its_suffix_names(run_dir, tmp_path, suffix):
    out = tmp_path / f"run.{suffix}"
    proc = command(run_dir, "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.endswith(f"  wrote {out}\n") and out.stat().st_size > 1000
    head = out.read_bytes()[:8]
    assert {"png": head == PNG, "svg": b"<?xml" in head, "pdf": head.startswith(b"%PDF"),
            "jpg": head[:2] == b"\xff\xd8"}[suffix]


def test_series_that_end_at_different_steps_are_reported_up_to_the_last_they_all_hold(
        tmp_path):
    """A skipped-steps file cut short at step 69 of a run of 200 steps: the report covers
    0-69, the gradient statistics included, and says why."""
    rows = range(9, 200, 10)
    run = write_run(tmp_path / "run",
                    scale="".join(f"{i} 1024\n" for i in rows),
                    skipped_steps="".join(f"{i} 0\n" for i in rows if i <= 69),
                    overflow_rate="".join(f"{i} 0\n" for i in rows),
                    gradient_headroom="".join(f"{i} 3\n" for i in rows))
    for key in ("zero-fraction", "subnormal-fraction"):
        (run / f"loss-scale-gradient-{key}.series.txt").write_text(
            "".join(f"{i} 0.01\n" for i in rows))
    s = read_report(run).summary
    assert (s.first_step, s.last_step, s.gradients[0]) == (0, 69, 69)
    assert s.beyond == {"scale": 199, "overflow-rate": 199}
    text = " ".join(read_report(run).text().split())
    assert ("note: the series end at different steps (overflow-rate at 199, scale at 199; "
            "the others at 69): the report covers the steps up to 69") in text
    assert "199" not in text.replace("at 199", "")

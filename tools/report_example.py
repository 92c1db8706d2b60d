#!/usr/bin/env python
"""Makes the committed example of the monitoring page: the series the demo's
``LossScaleMonitor`` writes, and their report.

Run it from the checkout (a minute or two on the CPU)::

    python tools/report_example.py

It runs ``examples/digits_demo.py`` with the options of ``DEMO_OPTIONS`` into a temporary
directory, copies the ``loss-scale-*.series.txt`` files of its monitor directory to
``docs/_static/report_example/`` with ``run.txt`` (the date, the machine, its load and the
commands), and draws ``docs/_static/report_example.png`` with ``python -m
nnabla_mpt.report``, whose output it prints: the page quotes it.
"""
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join("docs", "_static", "report_example")
FIGURE = os.path.join("docs", "_static", "report_example.png")
#: The demo's start at 2**15 overflows at first; the series every 10 steps.
DEMO_OPTIONS = ["--scale", "32768", "--monitor-interval", "10", "--stats-every", "10",
                "--no-progress"]


def machine() -> str:
    import nnabla
    import numpy
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f
                       if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    return (f"nnabla_mpt at {commit}{'+' if dirty else ''}; nnabla {nnabla.__version__}, "
            f"NumPy {numpy.__version__}, Python {platform.python_version()}, "
            f"{os.cpu_count()} CPUs ({cpu}), "
            f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}")


def main() -> None:
    os.chdir(ROOT)
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    load = "{:.2f}, {:.2f}, {:.2f}".format(*os.getloadavg())
    with tempfile.TemporaryDirectory() as out:
        demo = [sys.executable, os.path.join("examples", "digits_demo.py"), "--out", out]
        subprocess.run(demo + DEMO_OPTIONS, check=True, stdout=subprocess.DEVNULL)
        shutil.rmtree(EXAMPLE, ignore_errors=True)
        os.makedirs(EXAMPLE)
        for name in sorted(os.listdir(os.path.join(out, "monitor"))):
            if name.startswith("loss-scale-") and name.endswith(".series.txt"):
                shutil.copy(os.path.join(out, "monitor", name), EXAMPLE)
    report = [sys.executable, "-m", "nnabla_mpt.report", EXAMPLE, "--out", FIGURE]
    with open(os.path.join(EXAMPLE, "run.txt"), "w", encoding="utf-8") as f:
        f.write(f"# the loss-scale series of examples/digits_demo.py's monitor directory\n"
                f"# {started}; {machine()}; load average before {load}, after "
                "{:.2f}, {:.2f}, {:.2f}\n".format(*os.getloadavg())
                + f"# OMP_NUM_THREADS=1 python examples/digits_demo.py --out OUT "
                  f"{' '.join(DEMO_OPTIONS)}\n"
                  f"# (OUT/monitor/loss-scale-*.series.txt copied here)\n"
                  f"# python -m nnabla_mpt.report {EXAMPLE} --out {FIGURE}\n")
    subprocess.run(report, check=True)


if __name__ == "__main__":
    main()

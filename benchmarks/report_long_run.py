"""How long ``python -m nnabla_mpt.report`` takes, and how much memory, on long runs.

Usage (from the repository root)::

    .venv/bin/python benchmarks/record.py benchmarks/results/report_long_run.txt -- \
        .venv/bin/python benchmarks/report_long_run.py

For each size it writes the series a ``LossScaleMonitor`` with ``interval=1`` writes in a
run of that many steps (the seven series of every window and the three gradient series,
every 100th step; the scale probes, backs off and grows as a dynamic scale does, a few
steps skipped) into a temporary folder, then runs, each in a fresh process so that its
peak memory is its own: the reading alone (``read_run``), the reading and the summary,
and the whole command (reading, summary, figure into a PNG), the imports of the report
and matplotlib left out of the times. It prints a row per size and
stage with the folder's size, the seconds and the peak resident memory (``ru_maxrss``),
and the reading speed in MB/s. Last, a scale file of about 245 MB alone is read.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

#: What each stage runs (after importing the report and matplotlib, which is not timed).
STAGES = {
    "read": "read_run(D)",
    "read+summary": "read_report(D).text()",
    "command": "main([D, '--out', OUT])",
}
IMPORTS = ("from nnabla_mpt.report.series import read_run\n"
           "from nnabla_mpt.report.run_report import read_report\n"
           "from nnabla_mpt.report.__main__ import main\n"
           "import matplotlib.figure, matplotlib.backends.backend_agg\n")


def write_run(folder: str, steps: int, seed: int = 0) -> int:
    """The series of a run of ``steps`` steps at ``interval=1``; their bytes."""
    rng = np.random.RandomState(seed)
    index = np.arange(steps)
    skipped = rng.rand(steps) < 0.002
    scale = 2.0 ** np.clip(15 - np.cumsum(skipped) + index // 2000, 0, 24)
    series = {"scale": scale, "scale-first": scale, "scale-min": scale, "scale-max": scale,
              "skipped-steps": np.cumsum(skipped), "overflow-rate": skipped.astype(float),
              "float32-steps": np.zeros(steps)}
    every = index[99::100]
    series_every = {"gradient-zero-fraction": rng.rand(len(every)) * 0.2,
                    "gradient-subnormal-fraction": rng.rand(len(every)) * 0.02,
                    "gradient-headroom": rng.randint(0, 8, len(every)).astype(float)}
    size = 0
    for key, values in list(series.items()) + list(series_every.items()):
        at = index if key in series else every
        path = os.path.join(folder, f"loss-scale-{key}.series.txt")
        with open(path, "w") as f:
            f.write("".join(f"{i} {v:g}\n" for i, v in zip(at.tolist(), values.tolist())))
        size += os.path.getsize(path)
    return size


def measure(stage: str, folder: str) -> tuple:
    """Seconds and peak resident MB of ``stage`` on ``folder``, in a fresh process."""
    code = (f"import resource, sys, time\nD, OUT = {folder!r}, {os.path.join(folder, 'r.png')!r}\n"
            f"{IMPORTS}t = time.perf_counter()\nsys.stdout = open('/dev/null', 'w')\n{STAGES[stage]}\n"
            f"sys.stdout = sys.__stdout__\n"
            f"print(time.perf_counter() - t, "
            f"resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    return float(out[0]), float(out[1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, nargs="+", default=[100_000, 1_600_000])
    p.add_argument("--big-scale-mb", type=float, default=245.0)
    args = p.parse_args()
    print(f"{'windows':>9}  {'MB':>6}  {'stage':<13} {'seconds':>8}  {'peak MB':>8}  "
          f"{'MB/s':>6}")
    for steps in args.steps:
        with tempfile.TemporaryDirectory() as folder:
            size = write_run(folder, steps) / 1e6
            for stage in STAGES:
                seconds, peak = measure(stage, folder)
                speed = f"{size / seconds:6.1f}" if stage == "read" else ""
                print(f"{steps:>9}  {size:6.1f}  {stage:<13} {seconds:8.2f}  {peak:8.0f}  "
                      f"{speed:>6}", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "loss-scale-scale.series.txt")
        line = "123456 1.04858e+06\n"
        lines = int(args.big_scale_mb * 1e6 / len(line))
        with open(path, "w") as f:
            for start in range(0, lines, 1_000_000):
                f.write("".join(f"{i} 1.04858e+06\n"
                                for i in range(start, min(start + 1_000_000, lines))))
        size = os.path.getsize(path) / 1e6
        code = ("import resource, time\nfrom nnabla_mpt.report.series import read_series\n"
                f"t = time.perf_counter(); read_series({path!r})\n"
                "print(time.perf_counter() - t, "
                "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True).stdout.split()
        seconds, peak = float(out[0]), float(out[1])
        print(f"{'one file':>9}  {size:6.1f}  {'read scale':<13} {seconds:8.2f}  {peak:8.0f}  "
              f"{size / seconds:6.1f}", flush=True)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main()

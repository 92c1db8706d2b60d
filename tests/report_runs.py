"""Real float16 training runs that write loss-scale series, for the report's tests, and the
series read back independently of nnabla_mpt.report."""
import pathlib

import numpy as np
from nnabla.monitor import Monitor

from nnabla_mpt import DynamicLossScalingUpdater, LossScaleMonitor
from support import Net

# The linear float16 Net of test_monitoring.py: the batches of these steps overflow at 4096
# and above, ordinary ones not at 2048. Starting at 2**15 with probe growth (N=4) the steps
# 0-3 are skipped (2**15 .. 2**12), and from step 8 every fifth step tries 4096 and is skipped.
LARGE = set(range(4)) | set(range(8, 1000, 5))


def fp16_updater(net, hook, **options):
    """An updater of ``net`` (a new solver) whose feeder loads the batch of the step index,
    so that a run resumed from a checkpoint sees the batches the first one saw."""
    updater = None

    def feeder():
        net.feed(updater.steps)

    options = {"scale": 2.0 ** 15, "N": 4, **options}
    updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.01), net.loss, feeder,
                                        monitor=hook, **options)
    return updater


def fp16_run(directory, steps, interval, **options):
    """``steps`` steps of the linear float16 Net with a LossScaleMonitor writing to
    ``directory``; the StepResults."""
    net = Net("half")
    net.large = set(LARGE)
    hook = LossScaleMonitor(Monitor(str(directory)), interval=interval)
    updater = fp16_updater(net, hook, **options)
    return [updater.update() for _ in range(steps)]


def ceiling_run(directory, steps, interval):
    """A float16 run whose gradients are small (batches times 0.01): measured growth
    reaches 2**15, the largest scale a float16 loss can seed, at its first growth point, and
    that ceiling holds it at every growth point (every 5 good steps)."""
    net = Net("half")
    hook = LossScaleMonitor(Monitor(str(directory)), interval=interval)
    updater = None

    def feeder():
        x, t = net.batch(updater.steps)
        net.x.d, net.t.d = x * 0.01, t * 0.01

    updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.01), net.loss, feeder,
                                        scale="auto", growth_mode="measured", N=5,
                                        gradient_stats_every=interval, monitor=hook)
    return [updater.update() for _ in range(steps)]


def series(directory, key, prefix="loss-scale"):
    """``{index: value}`` of a series file, the last value written for each index."""
    path = pathlib.Path(directory) / f"{prefix}-{key}.series.txt"
    values = {}
    for line in path.read_text().splitlines():
        index, value = line.split()
        values[int(index)] = float(value)
    return values


def windows(results, interval):
    """``(first, last, skipped)`` of each window of ``interval`` steps of ``results``."""
    out = []
    for first in range(0, len(results), interval):
        part = results[first:first + interval]
        out.append((first, first + len(part) - 1, sum(r.skipped for r in part)))
    return out


def longest_streak(results):
    """The most skipped steps in a row."""
    best = run = 0
    for r in results:
        run = run + 1 if r.skipped else 0
        best = max(best, run)
    return best


def skipped_steps(results):
    return [r.step for r in results if r.skipped]


def float32(values):
    return np.float32(values).item()

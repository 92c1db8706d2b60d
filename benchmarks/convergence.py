"""Does fp16 with dynamic loss scaling learn as well as float, and does a measured scale
skip fewer steps than a probing one? Digits, same seed, same batches.

Three runs of the same 64-64-64-10 MLP on scikit-learn's digits (8x8 images, 10 classes):

* ``float``:    float32 graph, plain loop (zero_grad, forward, backward, update), no scaling.
* ``probe``:    float16 graph (``type_config='half'``: activations and gradients are real
  fp16 and overflow to inf), ``nnabla_mpt.DynamicLossScalingUpdater(scale=2**15, N=200,
  growth_mode="probe")``: the scale starts at a guess and grows by one factor after every
  N good steps, the next steps finding out whether that went too far.
* ``measured``: the same float16 graph with ``scale="auto"`` (the first step measures the
  largest gradient on its own batch and picks the start) and ``growth_mode="measured"``
  (on the step where growth is due the backward pass is watched and the scale grows by as
  many factors as the gradients leave room for, possibly none: the room comes from a
  history of the watched steps, which also include every ``WATCH_EVERY``-th step and the
  first ``MIN_SAMPLES``).

All three start from the same initial parameters and see the same batches in the same
order. The loss is the batch *sum* of the cross-entropies (learning rate divided by the
batch size), so the network's own gradients, not just the seed of the backward pass, bound
the scale. All are evaluated on the held-out split with a float32 graph.

The two fp16 runs are independent models, so they run interleaved, step i of one then
step i of the other, the order alternating every step: each ``update()`` call is timed
with the process's CPU clock, and both see the same machine load. The step time of the
measured run is split into the steps where the watch ran (the growth steps and every
``WATCH_EVERY``-th step) and the others.

Prints, for each fp16 run: the final test accuracy and its difference to float, the
skipped steps during the warm-up (the steps before the first applied update) and after it,
the mean step time, the growth points (grew or held), the loss-scale trajectory as
collected by an ``nnabla_mpt.LossScaleCallback`` attached with ``monitor=``; then the cost
of the watch and a verdict per target.

With ``--spike`` a second pair of fp16 runs (probe and measured, from the same initial
parameters and batches) counts the loss of ``--spike-length`` consecutive batches
``--spike-factor`` times from step ``--spike-at`` on (a (1, 1) weight variable multiplies
every example's loss; it is 1 otherwise): every gradient grows by that factor and
overflows at each scale the steps back off to, while the loss stays finite. (Multiplying
the inputs instead does not do it reliably: the ReLU network's logits grow with them, the
softmax saturates on the examples it classifies right, and their gradients vanish.) It
prints the scale right before the spike and the scale after the first growth point past
it.

Usage:
    .venv/bin/python benchmarks/convergence.py [--steps 1500] [--seed 0] [--spike]
"""
import argparse
import math
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import nnabla as nn  # noqa: E402
import nnabla.functions as F  # noqa: E402
import nnabla.parametric_functions as PF  # noqa: E402
import nnabla.solvers as S  # noqa: E402
from nnabla.ext_utils import get_extension_context  # noqa: E402
from nnabla.logger import logger  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from nnabla_mpt import DynamicLossScalingUpdater, LossScaleCallback  # noqa: E402
from nnabla_mpt.scale.measured import MARGIN  # noqa: E402
try:
    from nnabla_mpt.scale.scale_history import MIN_SAMPLES, WATCH_EVERY  # noqa: E402
except ImportError:                             # a checkout from before the folders
    from nnabla_mpt.scale_history import MIN_SAMPLES, WATCH_EVERY  # noqa: E402

HIDDEN = (64, 64)
FLOAT = get_extension_context("cpu", type_config="float")
HALF = get_extension_context("cpu", type_config="half")

# The targets.
ACCURACY_POINTS = 0.5      # measured within this many points of float
SKIP_RATIO = 5.0           # at least this many times fewer skips after warm-up than probe
WATCH_COST = 2.0           # percent of the run's step time


def digits(seed):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.int32)[:, None]
    return train_test_split(x, y, test_size=0.25, random_state=seed, stratify=data.target)


def network(ctx, scope, batch, seed=None, weight=None):
    """Inputs, logits and summed loss in ``scope``; a graph built again reuses the params.
    ``weight``: None, or a (1, 1) Variable that multiplies every example's loss."""
    with nn.context_scope(ctx), nn.parameter_scope(scope):
        x = nn.Variable((batch, 64))
        t = nn.Variable((batch, 1))
        h = x
        for i, width in enumerate(HIDDEN + (10,)):
            rng = None if seed is None else np.random.RandomState(seed + i)
            h = PF.affine(h, width, name=f"fc{i}", rng=rng)
            if i < len(HIDDEN):
                h = F.relu(h)
        loss = F.softmax_cross_entropy(h, t)
        loss = F.sum(loss if weight is None else loss * weight)
    return x, t, h, loss


def set_parameters(scope, values):
    """Copies ``values`` (name -> array) into the parameters of ``scope``."""
    with nn.parameter_scope(scope):
        for k, v in nn.get_parameters().items():
            v.d = values[k]


def batch_order(n, batch, steps, seed):
    rng = np.random.RandomState(seed)
    epochs = math.ceil(steps * batch / n) + 1
    order = np.concatenate([rng.permutation(n) for _ in range(epochs)])
    return [order[i * batch:(i + 1) * batch] for i in range(steps)]


def solver_for(ctx, scope, lr):
    with nn.context_scope(ctx), nn.parameter_scope(scope):
        solver = S.Momentum(lr, 0.9)
        solver.set_parameters(nn.get_parameters())
    return solver


def accuracy(scope, x_test, y_test):
    x, t, logits, _ = network(FLOAT, scope, len(x_test))
    x.d = x_test
    logits.forward(clear_buffer=True)
    return float(np.mean(logits.d.argmax(axis=1) == y_test[:, 0]))


def train_float(x_train, y_train, batches, lr, args):
    """The float32 run in scope ``float``: (ms per step, mean loss of the last batch)."""
    xf, tf, _, loss_f = network(FLOAT, "float", args.batch)
    solver_f = solver_for(FLOAT, "float", lr)
    start = time.perf_counter()
    for idx in batches:
        xf.d, tf.d = x_train[idx], y_train[idx]
        solver_f.zero_grad()
        loss_f.forward(clear_no_need_grad=True)
        loss_f.backward(clear_buffer=True)
        solver_f.update()
    return 1e3 * (time.perf_counter() - start) / len(batches), float(loss_f.d) / args.batch


class Contender:
    """One fp16 run in its own scope: its updater, and what each of its steps did and cost.

    ``init``: the initial parameters (name -> array); ``spike``: None, or ``(first step,
    steps, factor)``: the loss of those batches is multiplied by ``factor``.
    """

    def __init__(self, name, init, data, batches, lr, args, spike=None, **options):
        self.name, self.batch = name, args.batch
        weight = None if spike is None else nn.Variable((1, 1))
        x, t, _, self.loss = network(HALF, name, args.batch, weight=weight)
        set_parameters(name, init)
        self.results, self.windows, self.times, self.due, self.losses = [], [], [], [], []
        self.short = []         # per step: the history held fewer than MIN_SAMPLES reaches
        self.summary = LossScaleCallback(self.windows.append,
                                         interval=max(1, args.steps // 10))
        self.updater = DynamicLossScalingUpdater(
            solver_for(HALF, name, lr), self.loss,
            self._feeder(x, t, weight, data, batches, spike),
            N=args.interval, monitor=self._record, **options)

    @staticmethod
    def _feeder(x, t, weight, data, batches, spike):
        x_train, y_train = data
        first, length, factor = spike or (0, 0, 1.0)
        steps = iter(range(len(batches)))

        def feed():
            i = next(steps)
            x.d, t.d = x_train[batches[i]], y_train[batches[i]]
            if weight is not None:
                weight.d = factor if first <= i < first + length else 1.0
        return feed

    def _record(self, result):
        self.results.append(result)
        self.summary(result)

    def step(self):
        """One ``update()``, timed; notes whether growth was due and whether the history
        was short (the watched steps in ``"measured"`` mode, with every 25th)."""
        self.due.append(self.updater.policy.growth_due)
        self.short.append(len(self.updater.state_dict().get("scale_history", ()))
                          < MIN_SAMPLES)
        start = time.process_time()
        self.updater.update()
        self.times.append(time.process_time() - start)
        self.losses.append(float(self.loss.d) / self.batch)

    @property
    def watched(self):
        """Per step: whether the backward pass was watched, for a measured growth or for
        the history (every ``WATCH_EVERY``-th step, and every step while it is short)."""
        measured = self.updater.policy.growth_mode == "measured"
        return [measured and (due or (i + 1) % WATCH_EVERY == 0 or short)
                for i, (due, short) in enumerate(zip(self.due, self.short))]

    def growth_points(self):
        """``(step, scale, next scale)`` of every good step that ended a growth interval."""
        return [(r.step, r.scale, r.next_scale)
                for r, due in zip(self.results, self.due) if due and not r.skipped]

    def skips(self):
        """``(first update, skipped in the warm-up, skipped after, steps after)``."""
        first = next((r.step for r in self.results if not r.skipped), len(self.results))
        after = [r for r in self.results if r.step >= first]
        return first, sum(r.skipped for r in self.results[:first]), \
            sum(r.skipped for r in after), len(after)


def interleaved(contenders, steps, until=None):
    """Step ``i`` of each contender in turn, the order reversing every step; stops early
    once ``until()`` is true."""
    for i in range(steps):
        for c in (contenders if i % 2 == 0 else contenders[::-1]):
            c.step()
        if until is not None and until():
            break
    for c in contenders:
        c.summary.flush()


def fp16_runs(init, data, batches, lr, args, prefix="", spike=None, until=None):
    """The probe and measured runs from the same initial parameters, interleaved over
    ``batches`` (``until``: as :func:`interleaved` takes it, given the runs); their scopes
    are ``prefix + "probe"`` and ``prefix + "measured"``."""
    options = {"probe": dict(scale=args.scale, growth_mode="probe"),
               "measured": dict(scale="auto", growth_mode="measured")}
    runs = [Contender(prefix + name, init, data, batches, lr, args, spike, **kwargs)
            for name, kwargs in options.items()]
    interleaved(runs, len(batches), None if until is None else lambda: until(runs))
    return runs


def power(scale):
    """A scale as a power of two: ``2^10``."""
    return f"2^{math.log2(scale):g}"


def growth_summary(run):
    """One line: the growth points, and how many grew (by how many factors) or held."""
    points = run.growth_points()
    factor = run.updater.policy.growth_factor
    moves = [round(math.log(new / old, factor)) for _, old, new in points]
    grew = [k for k in moves if k > 0]
    text = ", ".join(f"{step}: {power(old)}->{power(new)}" for step, old, new in points)
    return (f"{run.name}: {len(points)} growth points, grew at {len(grew)} "
            f"({sum(grew)} factors in all), held at {moves.count(0)}"
            + (f" [{text}]" if points else ""))


def watch_cost(run, other):
    """The watch's cost in ``run`` (step 0, with the calibration of ``scale="auto"``, left
    out): ``(watched steps, ms per watched step, ms per other step, percent of the run's
    step time, the same from the steps' differences to ``other``'s same steps)``."""
    times, peer = run.times, other.times
    watched = [i for i in range(1, len(times)) if run.watched[i]]
    others = [i for i in range(1, len(times)) if not run.watched[i]]
    if not watched:
        return 0, math.nan, 1e3 * statistics.fmean(times[1:]), 0.0, 0.0
    t_w = statistics.fmean(times[i] for i in watched)
    t_o = statistics.fmean(times[i] for i in others)
    percent = 100 * len(watched) * (t_w - t_o) / (len(times) * t_o)
    # paired with the other run's step of the same index, which ran next to it
    extra = (statistics.fmean(times[i] - peer[i] for i in watched)
             - statistics.fmean(times[i] - peer[i] for i in others))
    paired = 100 * len(watched) * extra / (len(times) * t_o)
    return len(watched), 1e3 * t_w, 1e3 * t_o, percent, paired


def print_table(float_run, runs, accuracies):
    """The table: accuracy, difference to float, skips, ms per step."""
    acc_f, float_ms, float_loss = float_run
    print(f"{'run':<9} {'test acc':>8} {'vs float':>9} {'final loss':>10} "
          f"{'warm-up skips':>13} {'skips after warm-up':>21} {'ms/step':>8}")
    print(f"{'float':<9} {acc_f:>8.4f} {'-':>9} {float_loss:>10.4f} {'-':>13} {'-':>21} "
          f"{float_ms:>8.2f}")
    for run, acc in zip(runs, accuracies):
        first, warm, after, n_after = run.skips()
        loss = float(run.loss.d) / run.batch
        after_text = f"{after} of {n_after} ({100 * after / max(1, n_after):.2f}%)"
        print(f"{run.name:<9} {acc:>8.4f} {100 * (acc - acc_f):>+9.2f} {loss:>10.4f} "
              f"{warm:>13} {after_text:>21} {1e3 * statistics.fmean(run.times):>8.2f}")


def print_verdicts(runs, accuracies, acc_f, cost, interval):
    """One line per target of the issue: met or not, with the numbers."""
    probe, measured = runs
    _, probe_warm, probe_after, _ = probe.skips()
    _, warm, after, _ = measured.skips()
    points = 100 * (accuracies[1] - acc_f)

    def verdict(ok):
        return "met" if ok else "NOT met"

    print(f"verdicts (N={interval}, the script's default; nnabla's default N is 2000):")
    print(f"  no warm-up skip with scale='auto': {verdict(warm == 0)} "
          f"({warm} skipped before the first update; probe: {probe_warm})")
    ratio = probe_after / after if after else math.inf
    ratio_text = f"{ratio:.1f}x fewer" if after else "none skipped by measured"
    print(f"  >= {SKIP_RATIO:g}x fewer skips after warm-up, measured vs probe: "
          f"{verdict(ratio >= SKIP_RATIO and probe_after > 0)} (probe {probe_after}, "
          f"measured {after}: {ratio_text})")
    print(f"  accuracy within {ACCURACY_POINTS:g} points of float: "
          f"{verdict(abs(points) <= ACCURACY_POINTS)} (measured {points:+.2f} points; "
          f"probe {100 * (accuracies[0] - acc_f):+.2f})")
    print(f"  watch cost <= {WATCH_COST:g}% of the step time: "
          f"{verdict(cost[3] <= WATCH_COST)} ({cost[3]:+.2f}%; paired with probe "
          f"{cost[4]:+.2f}%)")


def print_trajectories(runs):
    """The LossScaleCallback windows of both runs side by side, then every scale change
    and every skipped step."""
    head = "".join(f" | {r.name + ' scale':>14} {'min':>7} {'max':>7} {'skip':>4}"
                   for r in runs)
    print(f"loss-scale windows (LossScaleCallback):\n  {'last step':>9}{head}")
    for windows in zip(*(r.windows for r in runs)):
        row = "".join(f" | {w.scale:>14g} {w.min_scale:>7g} {w.max_scale:>7g} "
                      f"{w.skipped:>4}" for w in windows)
        print(f"  {windows[0].step:>9}{row}")
    for run in runs:
        changes = [(r.step, r.next_scale) for r in run.results if r.next_scale != r.scale]
        print(f"{run.name} scale changes (step: new scale): " + (", ".join(
            f"{i}: {power(s)}" for i, s in changes) or "none"))
        print(f"{run.name} skipped steps: {[r.step for r in run.results if r.skipped]}")


def first_growth_after(run, step):
    """``(step, scale, next scale)`` of the first growth point at or after ``step``."""
    return next((p for p in run.growth_points() if p[0] >= step), None)


def spike_demo(init, data, lr, args):
    """Probe and measured through a spike of overflowing batches: the scale before it, the
    steps of the spike, and the scale after the first growth point past it."""
    first, length, factor = args.spike_at, args.spike_length, args.spike_factor
    end = first + length
    batches = batch_order(len(data[0]), args.batch, end + 2 * args.interval, args.seed)
    runs = fp16_runs(init, data, batches, lr, args, "spike_", (first, length, factor),
                     until=lambda runs: all(first_growth_after(r, end) for r in runs))
    growth = runs[0].updater.policy.growth_factor
    print(f"\n# spike: the loss of steps {first}..{end - 1} multiplied by {factor:g} (so are "
          f"all its gradients), same initial parameters and batches, N={args.interval}")
    for run in runs:
        res = run.results
        before = res[first].scale
        during = ", ".join(f"{power(r.scale)}{' skipped' if r.skipped else ''} "
                           f"(loss {run.losses[r.step]:.3g})" for r in res[first:end])
        print(f"{run.name}: scale before the spike {power(before)}; spike steps: {during}; "
              f"after: {power(res[end - 1].next_scale)}")
        point = first_growth_after(run, end)
        if point is None:
            print(f"  no growth point within {len(res) - end} steps after the spike")
            continue
        step, old, new = point
        back = new * growth >= before
        print(f"  first growth point after the spike, step {step}: {power(old)} -> "
              f"{power(new)}: {'within' if back else 'NOT within'} one factor "
              f"({growth:g}) of the scale before the spike")


def print_watch(runs, cost):
    """The chosen start of ``scale="auto"``, the growth points, the cost of the watch."""
    probe, measured = runs
    print(f"scale='auto' started at {power(measured.results[0].scale)} (MARGIN {MARGIN:g}: "
          f"the gradients the scale does not bound {MARGIN:g}x below the fp16 maximum); probe "
          f"started at {power(probe.results[0].scale)}")
    for run in runs:
        print(growth_summary(run))
    n, t_w, t_o, percent, paired = cost
    print(f"step 0 (measured: calibration and step): {1e3 * measured.times[0]:.2f} ms; "
          f"probe: {1e3 * probe.times[0]:.2f} ms")
    print(f"watch (measured, step 0 left out): {n} watched steps at {t_w:.2f} ms against "
          f"{t_o:.2f} ms for the other {len(measured.times) - 1 - n} "
          f"({100 * (t_w / t_o - 1):+.1f}% per watched step): {percent:+.2f}% of the run's "
          f"step time; from the differences to probe's steps of the same index: "
          f"{paired:+.2f}%")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05, help="per-example learning rate")
    parser.add_argument("--scale", type=float, default=2.0 ** 15,
                        help="initial loss scale of the probe run")
    parser.add_argument("--interval", type=int, default=200,
                        help="N: good steps before the scale grows")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--spike", action="store_true",
                        help="also run probe and measured through a spike of overflows")
    parser.add_argument("--spike-at", type=int, default=300, help="first step of the spike")
    parser.add_argument("--spike-length", type=int, default=4, help="steps of the spike")
    parser.add_argument("--spike-factor", type=float, default=2.0 ** 10,
                        help="factor applied to the loss during the spike")
    args = parser.parse_args(argv)
    logger.setLevel("WARNING")

    x_train, x_test, y_train, y_test = digits(args.seed)
    data = (x_train, y_train)
    batches = batch_order(len(x_train), args.batch, args.steps, args.seed)
    lr = args.lr / args.batch

    nn.clear_parameters()
    network(FLOAT, "float", args.batch, seed=args.seed)
    with nn.parameter_scope("float"):
        init = {k: v.d.copy() for k, v in nn.get_parameters().items()}
    float_ms, float_loss = train_float(x_train, y_train, batches, lr, args)
    runs = fp16_runs(init, data, batches, lr, args)
    acc_f = accuracy("float", x_test, y_test)
    accuracies = [accuracy(run.name, x_test, y_test) for run in runs]
    cost = watch_cost(runs[1], runs[0])

    print(f"# digits ({len(x_train)} train / {len(x_test)} test), MLP 64-"
          f"{'-'.join(map(str, HIDDEN))}-10, batch {args.batch}, summed loss, Momentum 0.9, "
          f"lr {args.lr:g}/batch, {args.steps} steps, seed {args.seed}")
    print(f"# probe: DynamicLossScalingUpdater(scale={args.scale:g}, N={args.interval}, "
          f"growth_mode='probe'); measured: (scale='auto', N={args.interval}, "
          f"growth_mode='measured'); fp16 steps interleaved, CPU time per update()")
    print(f"# nnabla {nn.__version__}, {os.cpu_count()} CPUs, OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS')}")
    print_table((acc_f, float_ms, float_loss), runs, accuracies)
    print_watch(runs, cost)
    print_verdicts(runs, accuracies, acc_f, cost, args.interval)
    print_trajectories(runs)
    if args.spike:
        spike_demo(init, data, lr, args)


if __name__ == "__main__":
    main()

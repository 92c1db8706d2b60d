"""How close to the edge does each growth mode hold the scale, and how does it come back
after a spike? A float16 MLP with a summed loss (built as benchmarks/convergence.py builds
it), ``N=5``, 200 steps, every run from the same initial parameters and batches.

Two models (``--model``):

* ``teacher`` (the default): 64-256-256-10 on 2048 Gaussian 64-d inputs, labelled by a
  fixed random ReLU network (so the labels can be learned). Its gradients vary from batch
  to batch more than the digits', and one batch with a margin of 8 held the scale two
  factors below what probing holds.
* ``digits``: 64-64-64-10 on scikit-learn's digits, as in convergence.py.

Two scenarios, each with a spike of four steps from ``--spike-at`` on, in which a quarter
of the batch (its first 16 examples) is multiplied: the teacher's inputs; the digits'
losses, by a per-example weight (multiplying the digits' inputs lets the softmax saturate,
and the gradients vanish):

* ``skipped``: by 300. Every spike step overflows at each scale the steps back off to
  and is skipped: the model is untouched, so the scale should come back where it was.
* ``trained``: by 30. The first spike steps overflow, the later ones run at the lower
  scale and train on the spike: the model is disturbed.

Runs, interleaved step by step (step ``i`` of each run in turn, the order alternating):
``probe`` and ``measured`` (``scale="auto"`` for both, ``gradient_stats_every=1``) of the
nnabla_mpt found first on the path (this checkout, or ``NNABLA_MPT_ROOT``). Each run's
steps go to a JSON file (``--out``): scale, skipped, next scale, the zero and subnormal
fractions of all the parameters' float16 gradients as the backward pass left them.

``--report A.json B.json ...`` reads such files of one model (one may come from another
version of the package, run with ``NNABLA_MPT_ROOT`` pointing at its checkout and its runs
labelled with ``--label``), prints per scenario and run: the highest scale probe holds
without losing a step, the scale over the run, the skipped steps, the recovery after the
spike and the gradient statistics; and with ``--figure PATH`` draws the scale per step of
every run (skipped steps marked) to PATH.

Usage:
    .venv/bin/python benchmarks/measured_edge.py    # results/measured_edge_teacher.json
    NNABLA_MPT_ROOT=../old .venv/bin/python benchmarks/measured_edge.py --modes measured \\
        --label "measured (margin 8)" --out /tmp/edge_old.json
    .venv/bin/python benchmarks/measured_edge.py \\
        --report benchmarks/results/measured_edge_teacher.json /tmp/edge_old.json \\
        --figure /tmp/edge.png

``ms/step`` compares runs of one invocation only (their steps interleaved).
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.environ.get("NNABLA_MPT_ROOT", os.path.join(HERE, "..")))
import nnabla_mpt  # noqa: E402  (first: convergence.py puts this checkout on the path)

sys.path.insert(0, HERE)
import convergence as C  # noqa: E402
import record  # noqa: E402

import numpy as np  # noqa: E402

import nnabla as nn  # noqa: E402
from nnabla.logger import logger  # noqa: E402

from nnabla_mpt import DynamicLossScalingUpdater  # noqa: E402
try:
    from nnabla_mpt.core.graph import float_context  # noqa: E402
except ImportError:                             # a checkout from before the folders
    from nnabla_mpt.graph import float_context  # noqa: E402
from nnabla_mpt.scale.gradient_stats import gradient_stats, overall  # noqa: E402

SCENARIOS = {"skipped": 300.0, "trained": 30.0}
QUARTER = 4           # the spike multiplies 1 / QUARTER of the batch


def teacher(seed, n=2048, dim=64):
    """``n`` Gaussian inputs of ``dim`` values, each labelled with the largest of the 10
    outputs of a fixed random ReLU network (64 hidden units)."""
    rng = np.random.RandomState(seed + 1000)
    x = rng.randn(n, dim).astype(np.float32)
    hidden, out = rng.randn(dim, 64), rng.randn(64, 10)
    y = np.argmax(np.maximum(x @ hidden, 0) @ out, axis=1).astype(np.int32)[:, None]
    return x, y


def digits(seed):
    x_train, _, y_train, _ = C.digits(seed)
    return x_train, y_train


#: Per model: its data (inputs, labels), its hidden widths, and what the spike multiplies.
MODELS = {"teacher": dict(data=teacher, hidden=(256, 256), spike="inputs"),
          "digits": dict(data=digits, hidden=(64, 64), spike="losses")}
#: The scales at which the probe run's gradients are also counted, every CURVE_EVERY steps.
CURVE_SCALES = [2.0 ** k for k in range(7, 16)]
CURVE_EVERY = 5


class Run:
    """One float16 run of a scenario in its own scope, and what each step did."""

    def __init__(self, label, mode, scenario, init, data, batches, lr, args):
        self.label, self.scenario = label, scenario
        scope = f"{scenario}_{label}".replace(" ", "_")
        weight = nn.Variable((args.batch, 1))
        x, t, _, loss = C.network(C.HALF, scope, args.batch, weight=weight)
        C.set_parameters(scope, init)
        x_train, y_train = data
        factor, first = SCENARIOS[scenario], args.spike_at
        spike, quarter = MODELS[args.model]["spike"], args.batch // QUARTER
        steps = iter(range(len(batches)))

        def feed():
            i = next(steps)
            inputs = x_train[batches[i]].copy()
            weights = np.ones((args.batch, 1), dtype=np.float32)
            if first <= i < first + 4:
                (inputs if spike == "inputs" else weights)[:quarter] *= factor
            x.d, t.d, weight.d = inputs, y_train[batches[i]], weights

        self.steps, self.times, self.curve = [], [], {}
        self.loss, self.weight = loss, weight
        with nn.parameter_scope(scope):
            self.params = nn.get_parameters()
        self.updater = DynamicLossScalingUpdater(
            C.solver_for(C.HALF, scope, lr), loss, feed, scale="auto", N=args.interval,
            growth_mode=mode, gradient_stats_every=1)

    def step(self):
        due = self.updater.policy.growth_due
        start = time.process_time()
        r = self.updater.update()
        self.times.append(time.process_time() - start)
        stats = overall(r.gradient_stats) if r.gradient_stats else None
        self.steps.append({"step": r.step, "scale": r.scale, "next_scale": r.next_scale,
                           "skipped": bool(r.skipped), "due": due,
                           "zero": None if stats is None else stats.zero_fraction,
                           "subnormal": None if stats is None else stats.subnormal_fraction})

    def count_at_scales(self):
        """The zero and subnormal fractions (and the non-finite one) of the parameters'
        float16 gradients of this step's model and batch, at each of CURVE_SCALES: the
        same gradients at every scale. Changes gradients and buffers only, which the next
        step sets anew."""
        ctx, counts = float_context(self.loss), []
        for scale in CURVE_SCALES:
            for v in self.params.values():
                v.grad.zero()
            self.loss.forward(clear_no_need_grad=True)
            self.loss.backward(scale, clear_buffer=True)
            stats = overall(gradient_stats(self.params, ctx))
            counts.append((stats.zero_fraction, stats.subnormal_fraction,
                           stats.nonfinite_fraction))
        self.curve[len(self.steps) - 1] = counts


def package_revision():
    """The git revision of the nnabla_mpt checkout in use (``+`` if it has changes), or
    its folder where git cannot tell."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(nnabla_mpt.__file__)))
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "nnabla_mpt"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return root
    return head + ("+" if dirty else "")


def run_all(args):
    logger.setLevel("WARNING")
    model = MODELS[args.model]
    C.HIDDEN = model["hidden"]
    x_train, y_train = model["data"](args.seed)
    batches = C.batch_order(len(x_train), args.batch, args.steps, args.seed)
    nn.clear_parameters()
    C.network(C.FLOAT, "init", args.batch, seed=args.seed)
    with nn.parameter_scope("init"):
        init = {k: v.d.copy() for k, v in nn.get_parameters().items()}
    out = {"facts": record.facts([os.path.relpath(sys.executable)] + sys.argv),
           "package": package_revision(), "model": args.model, "steps": args.steps,
           "interval": args.interval, "spike_at": args.spike_at, "batch": args.batch,
           "runs": []}
    for scenario in SCENARIOS:
        runs = [Run(args.label if mode == "measured" and args.label else mode, mode,
                    scenario, init, (x_train, y_train), batches, args.lr / args.batch, args)
                for mode in args.modes]
        for i in range(args.steps):
            for run in (runs if i % 2 == 0 else runs[::-1]):
                run.step()
            if (i % CURVE_EVERY == CURVE_EVERY - 1 and runs[0].label == "probe"
                    and not args.spike_at <= i < args.spike_at + 4):
                runs[0].count_at_scales()       # after the timed steps
        out["runs"] += [{"label": r.label, "scenario": scenario, "steps": r.steps,
                         "ms_per_step": 1e3 * statistics.fmean(r.times),
                         "curve": r.curve} for r in runs]
    out["curve_scales"] = CURVE_SCALES
    with open(args.out, "w") as f:
        json.dump(out, f)
    print(f"wrote {args.out} ({out['package']})")


def held_by_probe(steps, spike):
    """The highest scale probe ran at without losing a step at it (spike steps aside)."""
    ran = {s["scale"] for s in steps if s["step"] not in spike}
    lost = {s["scale"] for s in steps if s["skipped"] and s["step"] not in spike}
    return max(ran - {s for s in ran if any(s >= x for x in lost)}, default=math.nan)


def recovery(steps, spike_at):
    """``(scale before the spike, scale after the first growth point past it, steps from
    the spike's end until a step runs within one factor of 2 of the scale before)``."""
    before, end = steps[spike_at]["scale"], spike_at + 4
    first = next((s for s in steps[end:] if s["due"] and not s["skipped"]), None)
    back = next((s["step"] - end for s in steps[end:] if s["scale"] * 2 >= before), None)
    return before, None if first is None else first["next_scale"], back


def power(scale):
    return f"2^{math.log2(scale):g}"


def report(paths, figure):
    files = [json.load(open(p)) for p in paths]
    meta = files[0]
    model = meta.get("model", "digits")
    spike_at, hidden = meta["spike_at"], MODELS[model]["hidden"]
    spike = set(range(spike_at, spike_at + 4))
    runs = [r for f in files for r in f["runs"]]
    print(f"# {model} MLP 64-{'-'.join(map(str, hidden))}-10 float16, summed loss, batch "
          f"{meta['batch']}, N={meta['interval']}, {meta['steps']} steps, scale='auto'; "
          f"spike: steps {spike_at}..{spike_at + 3}, the {MODELS[model]['spike']} of a "
          f"quarter of the batch multiplied by 300 (skipped) or 30 (trained)")
    for f, path in zip(files, paths):
        print(f"# {os.path.basename(path)}: "
              f"{[r['label'] for r in f['runs'] if r['scenario'] == 'skipped']} "
              f"by nnabla_mpt at {f['package']}")
    for scenario in SCENARIOS:
        print_scenario(scenario, [r for r in runs if r["scenario"] == scenario], spike_at)
    print("\nmedian, min: scale over the run (min: outside the spike and its recovery); "
          "<held/2: such steps more than one factor below probe's highest held scale; "
          "<probe/2: such steps more than one factor below both that and probe's scale at "
          "the same step; before: the scale at the spike's first step; 1st growth: the "
          "scale after the first growth point past the spike; back in: steps from the "
          "spike's end until the scale is within one factor of 'before'; zeros, subnorm: "
          "fractions of the parameters' float16 gradient values (good steps, mean)")
    if figure:
        draw(runs, spike, figure)


def print_scenario(scenario, runs, spike_at):
    """The table of one scenario's runs (see :func:`report`), then the gradient counts."""
    spike = set(range(spike_at, spike_at + 4))
    probe = next(r for r in runs if r["label"] == "probe")
    held = held_by_probe(probe["steps"], spike)
    print(f"\n## {scenario} spike (x{SCENARIOS[scenario]:g}); highest scale probe holds "
          f"without losing a step: {power(held)}")
    print(f"{'run':<22} {'median':>7} {'min':>5} {'<held/2':>7} {'<probe/2':>8} "
          f"{'skipped steps':<34} {'before':>6} {'1st growth':>10} {'back in':>7} "
          f"{'zeros':>7} {'subnorm':>7} {'ms/step':>7}")
    for r in runs:
        steps = r["steps"]
        outside = [s for s in steps if s["step"] not in spike and s["step"] > 0]
        before, first, back = recovery(steps, spike_at)
        settled = [s for s in outside if s["step"] < spike_at or back is not None
                   and s["step"] >= spike_at + 4 + back]
        below = sum(s["scale"] * 2 < held for s in settled)
        below_probe = sum(s["scale"] * 2 < min(held, probe["steps"][s["step"]]["scale"])
                          for s in settled)
        good = [s for s in steps if not s["skipped"] and s["zero"] is not None]
        skipped = [s["step"] for s in steps if s["skipped"]]
        print(f"{r['label']:<22} "
              f"{power(statistics.median(s['scale'] for s in outside)):>7} "
              f"{power(min(s['scale'] for s in settled)):>5} {below:>7} {below_probe:>8} "
              f"{str(skipped):<34} {power(before):>6} "
              f"{'-' if first is None else power(first):>10} "
              f"{'-' if back is None else back:>7} "
              f"{statistics.fmean(s['zero'] for s in good):>7.4f} "
              f"{statistics.fmean(s['subnormal'] for s in good):>7.4f} "
              f"{r['ms_per_step']:>7.1f}")
    print_curve(probe, runs)


def print_curve(probe, runs):
    """The zeros and subnormals of the same gradients (the probe run's model and batch
    every CURVE_EVERY steps) at each scale, and at the scale each run had at those steps."""
    curve = {int(k): v for k, v in probe.get("curve", {}).items()}
    if not curve:
        return
    scales = CURVE_SCALES
    print(f"the same gradients (probe's model and batch at {len(curve)} steps) at each "
          f"scale: zeros / subnormals / non-finite, fractions of all values")
    for j, scale in enumerate(scales):
        zeros, subs, bad = (statistics.fmean(c[j][k] for c in curve.values())
                            for k in range(3))
        print(f"  {power(scale):>5}: {zeros:.6f} / {subs:.6f} / {bad:.6f}")
    print("  at each run's own scale at those steps:")
    for r in runs:
        picked = [curve[i][scales.index(r["steps"][i]["scale"])] for i in curve
                  if r["steps"][i]["scale"] in scales]
        zeros, subs = (statistics.fmean(p[k] for p in picked) for k in range(2))
        print(f"  {r['label']:<22} zeros {zeros:.6f}  subnormals {subs:.6f}  "
              f"together {zeros + subs:.6f}  ({len(picked)} steps)")


def draw(runs, spike, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(SCENARIOS), figsize=(11, 3.6), sharey=True)
    colors = ["tab:gray", "tab:orange", "tab:blue", "tab:green"]
    for ax, scenario in zip(axes, SCENARIOS):
        mine = [r for r in runs if r["scenario"] == scenario]
        ax.axvspan(min(spike) - 0.5, max(spike) + 0.5, color="tab:red", alpha=0.12,
                   label="spike")
        for i, r in enumerate(mine):
            color, line = colors[i % len(colors)], "--" if i > 1 else "-"
            steps = [s["step"] for s in r["steps"]]
            scales = [math.log2(s["scale"]) for s in r["steps"]]
            ax.step(steps, scales, where="post", color=color, linestyle=line,
                    label=r["label"], linewidth=1.4)
            lost = [(s["step"], math.log2(s["scale"])) for s in r["steps"] if s["skipped"]]
            if lost:
                ax.plot(*zip(*lost), "x", color=color, markersize=6)
        ax.set_title(f"{scenario} spike: a quarter of the batch x{SCENARIOS[scenario]:g}")
        ax.set_xlabel("step (x: skipped)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("log2 loss scale")
    axes[0].legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"figure: {path}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05, help="per-example learning rate")
    parser.add_argument("--interval", type=int, default=5, help="N")
    parser.add_argument("--spike-at", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", choices=sorted(MODELS), default="teacher")
    parser.add_argument("--modes", default="probe,measured")
    parser.add_argument("--label", default="", help="the label of the measured runs")
    parser.add_argument("--out", help="default: results/measured_edge_<model>.json")
    parser.add_argument("--report", nargs="+", help="JSON files to report on")
    parser.add_argument("--figure", help="with --report: where to draw the scales")
    args = parser.parse_args(argv)
    if args.report:
        report(args.report, args.figure)
        return
    args.modes = args.modes.split(",")
    args.out = args.out or os.path.join(HERE, "results", f"measured_edge_{args.model}.json")
    np.seterr(all="ignore")
    run_all(args)


if __name__ == "__main__":
    main()

"""Does a loss built in float32 lift the float16 seed ceiling, and what does it change?
The digits MLP of ``examples/digits_demo.py``, four runs from the same start on the same
batches.

``loss.backward(scale)`` seeds the backward pass in the loss's dtype: in a graph whose
loss is float16 no scale above ``2**15`` can be seeded, and with a mean loss the
gradients leave several powers of two of room there, so that ceiling, not the gradients,
holds the scale (``StepResult.held_by == "ceiling"``, said once in a warning). nnabla lets
a graph mix dtypes: the network built in half and only the loss in float32
(``F.identity(logits)``, then the cross-entropy and its reduction, under a float context)
seeds in float32, while the parameters' gradients stay float16 (``updater.precision`` is
``"half"``) and the updater bounds them by float16.

The runs: the network (64-64-64-64-10, ReLU, ``mlp`` of the demo) in float16 in all four,
the loss in float16 or in float32, times the per-example cross-entropies reduced by
``mean`` or by ``sum`` (the learning rate divided by the batch size for ``sum``, as the
demo does, so that all four make the same updates up to rounding). The demo's data split,
batches (``BatchStream``) and solver (Momentum 0.9, here ``--lr`` 0.1 per example);
``DynamicLossScalingUpdater(scale="auto", growth_mode="measured", N=50,
gradient_stats_every=100)``. The runs are interleaved, step ``i`` of each in turn, the
order alternating every step, so that all see the same machine load; each ``update()``
call is timed with the wall clock.

Per run: the scales the steps ran with (and the next scale after the last step), the
fraction of subnormal values among all the parameters' float16 gradients as the backward
pass left them (scaled; ``overall(result.gradient_stats).subnormal_fraction``) on the
steps that carry statistics (the 100th, 200th, ... step: indices 99, 199, ...), the
skipped steps, the growth points and what held each (``held_by``), the warnings the
updater logged, and the test accuracy of the float16 parameters evaluated by a float32
graph as the demo evaluates them (``accuracy`` of the demo; the accuracy of a float16
graph on them is recorded too).

Writes ``OUT.txt`` (the table, as printed) and ``OUT.json`` (the date, the machine, the
load average before and after, the command line, the package's revision, and every run's
figures).

Usage:
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/float32_loss.py \\
        --out benchmarks/results/float32_loss [--steps 400] [--seed 0]
"""
import argparse
import datetime
import json
import logging
import math
import os
import platform
import shlex
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

import nnabla as nn  # noqa: E402
import nnabla.functions as F  # noqa: E402
from nnabla.ext_utils import get_extension_context  # noqa: E402
from nnabla.logger import logger  # noqa: E402

from nnabla_mpt import DynamicLossScalingUpdater  # noqa: E402
from nnabla_mpt.core.graph import loss_dtype  # noqa: E402
from nnabla_mpt.scale.gradient_stats import overall  # noqa: E402

from _machine import cpu_model  # noqa: E402
from digits_demo import BatchStream, accuracy, load_digits_split, make_solver, mlp  # noqa: E402
from measured_edge import package_revision  # noqa: E402

HALF = get_extension_context("cpu", type_config="half")
FLOAT = get_extension_context("cpu", type_config="float")
#: The runs, in the order of the table: (loss dtype, reduction).
RUNS = [("float16", "mean"), ("float32", "mean"), ("float16", "sum"), ("float32", "sum")]


def label(loss_in, reduction):
    return f"{loss_in} loss, {reduction}"


class Run:
    """One run: the float16 network in its own scope, the loss built in ``loss_in``'s
    dtype, its updater, and what each step did."""

    def __init__(self, loss_in, reduction, data, args):
        self.label = label(loss_in, reduction)
        self.loss_in, self.reduction = loss_in, reduction
        self.scope = f"{loss_in}_{reduction}"
        batch = args.batch
        with nn.context_scope(HALF), nn.parameter_scope(self.scope):
            x, t = nn.Variable((batch, 64)), nn.Variable((batch, 1))
            logits = mlp(x, args.hidden, 10, args.seed)     # same seed: same start
        with nn.context_scope(FLOAT if loss_in == "float32" else HALF):
            top = F.identity(logits) if loss_in == "float32" else logits
            per_example = F.softmax_cross_entropy(top, t)
            self.loss = F.mean(per_example) if reduction == "mean" else F.sum(per_example)
        per = batch if reduction == "sum" else 1
        solver = make_solver(HALF, self.scope, args.lr / per)
        stream = BatchStream(data[0], data[1], batch, args.seed)   # same batches

        def feed():
            x.d, t.d = stream.next()

        self.updater = DynamicLossScalingUpdater(
            solver, self.loss, feed, scale="auto", growth_mode="measured",
            N=args.interval, gradient_stats_every=args.stats_every)
        self.results, self.due, self.seconds, self.warnings = [], [], 0.0, []

    def step(self):
        self.due.append(self.updater.policy.growth_due)
        start = time.perf_counter()
        result = self.updater.update()
        self.seconds += time.perf_counter() - start
        self.results.append(result)

    def summary(self, x_test, y_test, args):
        rs = self.results
        used = [r.scale for r in rs]
        growth = [{"step": r.step, "scale": r.scale, "next_scale": r.next_scale,
                   "held_by": r.held_by}
                  for r, due in zip(rs, self.due) if due and not r.skipped]
        stats = []
        for r in rs:
            if r.gradient_stats:
                o = overall(r.gradient_stats)
                stats.append({"step": r.step, "skipped": bool(r.skipped),
                              "scale": r.scale, "dtype": o.dtype,
                              "subnormal_fraction": o.subnormal_fraction,
                              "zero_fraction": o.zero_fraction,
                              "headroom": (o.headroom if math.isfinite(o.headroom)
                                           else str(o.headroom))})
        return {
            "label": self.label, "loss_dtype": loss_dtype(self.loss),
            "reduction": self.reduction, "precision": self.updater.precision,
            "lr": args.lr / (args.batch if self.reduction == "sum" else 1),
            "scale": {"min": min(used), "max": max(used),
                      "distinct": sorted(set(used)), "final_next": rs[-1].next_scale},
            "scale_changes": [[r.step, r.next_scale] for r in rs if r.next_scale != r.scale],
            "gradient_stats": stats,
            "skipped": {"count": sum(bool(r.skipped) for r in rs),
                        "steps": [r.step for r in rs if r.skipped]},
            "growth_points": growth,
            "held_by_ceiling": [g["step"] for g in growth if g["held_by"] == "ceiling"],
            "warnings": self.warnings,
            "accuracy": {
                "float_inference": accuracy(FLOAT, self.scope, x_test, y_test,
                                            args.hidden, args.seed),
                "half_inference": accuracy(HALF, self.scope, x_test, y_test,
                                           args.hidden, args.seed)},
            "final_loss": float(self.loss.d) / (args.batch if self.reduction == "sum" else 1),
            "seconds": self.seconds,
        }


class Warnings(logging.Handler):
    """Hands each warning nnabla's logger emits to the run that is stepping."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.run = None

    def emit(self, record):
        if self.run is not None:
            self.run.warnings.append({"step": len(self.run.results),
                                      "message": record.getMessage()})


# ------------------------------------------------------------------------- the table
# The page docs/measured.rst quotes these strings; tests/test_float32_loss_page.py
# formats the JSON's values the same way.

def power(scale):
    k = math.log2(scale)
    return f"2**{k:g}" if k == int(k) else f"{scale:g}"


def fmt_scales(run):
    return ", ".join(power(s) for s in run["scale"]["distinct"])


def fmt_subnormal(entry):
    return f"{100 * entry['subnormal_fraction']:.3f}" + (" (skipped)" if entry["skipped"]
                                                        else "")


def fmt_steps(count, steps):
    return f"{count}" + (f" ({', '.join(map(str, steps))})" if steps else "")


def fmt_ceiling(run):
    return (f"{len(run['held_by_ceiling'])} of {len(run['growth_points'])}"
            + (f" ({', '.join(map(str, run['held_by_ceiling']))})"
               if run["held_by_ceiling"] else ""))


def fmt_accuracy(value):
    return f"{100 * value:.2f}"


def rows(out):
    """The table's rows: a dict of column -> printed string per run."""
    table = []
    for run in out["runs"]:
        row = {"run": run["label"], "scales": fmt_scales(run)}
        for entry in run["gradient_stats"]:
            row[f"subnormal % @{entry['step'] + 1}"] = fmt_subnormal(entry)
        row["skipped"] = fmt_steps(run["skipped"]["count"], run["skipped"]["steps"])
        row["held by ceiling"] = fmt_ceiling(run)
        row["accuracy %"] = fmt_accuracy(run["accuracy"]["float_inference"])
        row["acc. fp16 %"] = fmt_accuracy(run["accuracy"]["half_inference"])
        row["s"] = f"{run['seconds']:.1f}"
        table.append(row)
    return table


def table_text(out):
    table = rows(out)
    columns = list(table[0])
    width = {c: max(len(c), *(len(r.get(c, "")) for r in table)) for c in columns}
    lines = ["  ".join(c.ljust(width[c]) for c in columns),
             "  ".join("-" * width[c] for c in columns)]
    lines += ["  ".join(r.get(c, "").ljust(width[c]) for c in columns) for r in table]
    return [line.rstrip() for line in lines]


def report(out):
    m, a = out["machine"], out["args"]
    load = ", ".join(f"{v:.2f}" for v in out["load_before"])
    lines = [
        f"# digits MLP 64-{'-'.join(map(str, a['hidden']))}-10 in float16, batch "
        f"{a['batch']}, Momentum(lr {a['lr']:g} per example, 0.9), {a['steps']} steps, "
        f"seed {a['seed']}; DynamicLossScalingUpdater(scale='auto', growth_mode='measured', "
        f"N={a['interval']}, gradient_stats_every={a['stats_every']}); the loss alone in "
        f"float16 or float32 (F.identity(logits) under a float context), mean or sum of "
        f"the cross-entropies",
        f"# {out['date']}; nnabla_mpt at {out['package']}; nnabla {m['nnabla']}, NumPy "
        f"{m['numpy']}, Python {m['python']}, {m['cpus']} CPUs ({m['cpu']}), "
        f"OMP_NUM_THREADS={m['omp_num_threads']}; load average before {load}",
        f"# {out['command']}",
        "",
    ] + table_text(out) + [
        "",
        "scales: the distinct scales the steps ran with; subnormal % @K: subnormal values "
        "among all the parameters' float16 gradients at step K (index K-1), scaled, as "
        "the backward pass left them; skipped: count (steps); held by ceiling: growth "
        "points held by the loss dtype's largest power of two of all growth points "
        "(steps); accuracy %: the float16 parameters on the test split evaluated by a "
        "float32 graph (acc. fp16 %: by a float16 graph); s: wall time of the run's "
        "update() calls (interleaved runs)",
    ]
    for run in out["runs"]:
        for w in run["warnings"]:
            lines.append(f"warning, {run['label']}, step {w['step']}: {w['message']}")
        lines.append(f"{run['label']}: precision {run['precision']}, loss "
                     f"{run['loss_dtype']}, gradients "
                     f"{sorted({s['dtype'] for s in run['gradient_stats']})}, next scale "
                     f"after the last step {power(run['scale']['final_next'])}, growth "
                     f"points {[(g['step'], g['held_by']) for g in run['growth_points']]}")
    lines.append(f"load average after {', '.join(f'{v:.2f}' for v in out['load_after'])}; "
                 f"total {out['seconds']:.1f} s")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.1,
                        help="Momentum's learning rate per example (divided by the batch "
                             "size for the summed loss)")
    parser.add_argument("--interval", type=int, default=50, help="N")
    parser.add_argument("--stats-every", type=int, default=100)
    parser.add_argument("--hidden", type=int, nargs="+", default=[64, 64, 64])
    parser.add_argument("--out", default=os.path.join(HERE, "results", "float32_loss"),
                        help="writes OUT.txt and OUT.json")
    args = parser.parse_args(argv)

    load_before = os.getloadavg()
    date = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    started = time.perf_counter()
    logger.setLevel("WARNING")
    x_train, y_train, x_test, y_test = load_digits_split(args.seed)
    nn.clear_parameters()
    runs = [Run(loss_in, reduction, (x_train, y_train), args) for loss_in, reduction in RUNS]
    catcher = Warnings()
    logger.addHandler(catcher)
    try:
        for i in range(args.steps):
            for run in (runs if i % 2 == 0 else runs[::-1]):
                catcher.run = run
                run.step()
    finally:
        logger.removeHandler(catcher)
    out = {
        "date": date,
        "machine": {"cpu": cpu_model(), "cpus": os.cpu_count(),
                    "platform": platform.platform(), "python": platform.python_version(),
                    "nnabla": nn.__version__, "numpy": np.__version__,
                    "omp_num_threads": os.environ.get("OMP_NUM_THREADS")},
        "load_before": list(load_before),
        "command": shlex.join([f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}",
                               os.path.relpath(sys.executable)] + sys.argv),
        "package": package_revision(),
        "args": {"steps": args.steps, "seed": args.seed, "batch": args.batch,
                 "lr": args.lr, "interval": args.interval,
                 "stats_every": args.stats_every, "hidden": args.hidden,
                 "train": len(x_train), "test": len(x_test)},
        "runs": [run.summary(x_test, y_test, args) for run in runs],
    }
    out["load_after"] = list(os.getloadavg())
    out["seconds"] = time.perf_counter() - started
    out["table"] = rows(out)
    text = report(out)
    print(text)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out + ".txt", "w", encoding="utf-8") as f:
        f.write(text + "\n")
    with open(args.out + ".json", "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, allow_nan=False)
    print(f"wrote {args.out}.txt and {args.out}.json")
    return out


if __name__ == "__main__":
    main()

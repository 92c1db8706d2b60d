#!/usr/bin/env python
"""Mixed-precision (fp16) training with dynamic loss scaling on the digits data set.

This program trains the same small multi-layer perceptron twice on scikit-learn's
bundled 8x8 handwritten digits (1797 images, no download needed):

* in half precision (``type_config='half'``: activations and gradients are real
  fp16 numbers that overflow to ``inf`` above 65504), driven by
  :class:`nnabla_mpt.DynamicLossScalingUpdater`;
* in single precision with a plain training loop, as the reference.

Both runs start from the same initial weights and see the same batches in the
same order, so the only difference is the arithmetic precision (and the loss
scaling that makes fp16 training work).

How the loss scale moves: the updater multiplies the loss by the scale before
the fp16 backward pass, so small gradients do not vanish below fp16's smallest
numbers. When any gradient overflows (``inf``/``nan``), the step is *skipped*
(parameters and solver state untouched) and the scale is halved. By default the
scale is measured rather than guessed:

* ``--scale auto``: the first step's backward pass is watched on its own batch, and
  the scale starts at the largest power of two that keeps every gradient 8 times
  below fp16's largest number (65504); a number starts there instead;
* ``--growth-mode measured``: after ``--interval`` clean steps in a row the backward
  pass is watched again, and the scale grows by as many doublings as the gradients
  leave room for (below 65504 by a margin the history of watched steps sets, between
  1.4 and 8 times), possibly none: the scale *holds*, and no
  step is lost to a growth that would overflow. ``--growth-mode probe`` doubles it
  every time and lets the next steps find out; with ``--scale 32768`` that is the
  classic scheme: start high, back off on the first overflows, probe upwards.

The network runs in fp16 and, as the docs recommend, only the loss in float32
(``--loss-dtype float32``, the default): ``F.identity(logits)`` under a float context
casts the logits, the cross-entropy and its sum run in float32, and
``loss.backward(scale)`` seeds the pass in float32, so the scale may pass 2**15 while
every gradient below the logits stays fp16 and bounded by 65504. The ceiling case is
one flag away: with ``--loss-dtype float16`` the loss is built in the fp16 graph, the
seed is fp16, where 2**16 is already ``inf``, and no scale above 2**15 is used (a
larger ``--scale`` is lowered to 2**15; the updater warns when that ceiling, not the
gradients, holds the scale).

The loss here is the *sum* of the per-example cross-entropies over the batch
(the learning rate is divided by the batch size, so the updates equal those of
the mean loss). That makes the gradients ``batch size`` times larger, so it is
the network's own gradients that decide how large the scale can be, as in
larger models: the default run's scale reaches 131072 (2**17) at step 890. With
``--loss-dtype float16`` each per-example loss's gradient is the scale itself, which
measured growth lets reach the seed's ceiling, 32768 at step 640. With ``--reduction
mean`` and a float16 loss the gradients stay far below the fp16 limit and what bounds
the scale is that ceiling alone.

Every ``--stats-every`` steps the updater also reports statistics of the fp16
gradients as the backward pass produced them (scaled): the fraction of values
that are zero, the fraction that are subnormal (below 2**-14, losing precision
on the way to zero) and the headroom, how many doublings the scale could take
before the largest parameter gradient overflows. On this network about a quarter
of the gradient values are exactly zero in float too (ReLUs that are off, pixels
blank in the whole batch); the subnormal fraction is the one that shows small
gradients being lost.

While it trains it shows a progress bar per run on a terminal (log lines are
written through it) and, when its output goes to a file or a pipe, a progress line
on stdout at the end of the first epoch, then at the end of the first epoch at least
10 s after the last line
(``--no-progress`` shows neither). At the end the program prints

* the test accuracy of the fp16 run next to the float run,
* the loss-scale trajectory (initial, and how it was chosen, min, max, final and
  every change) and the growth points (how many grew, how many held),
* how many steps were skipped during warm-up (before the first applied update)
  and afterwards,
* the last gradient statistics (zero %, subnormal %, headroom),

and writes ``digits_fp16.png`` (loss, loss scale and the gradient statistics over
the steps, skipped steps marked) and ``summary.json`` (the same numbers,
machine-readable; an infinite headroom is ``null`` there) to ``--out`` (default
``runs/digits``), with ``nnabla.monitor`` series in ``OUT/monitor``.

Run it with ``python examples/digits_demo.py`` (``--help`` lists the options).
"""
import argparse
import dataclasses
import json
import os
import sys
import textwrap
import time

import numpy as np

import nnabla as nn
import nnabla.functions as F
import nnabla.initializer as I
import nnabla.parametric_functions as PF
import nnabla.solvers as S
from nnabla.ext_utils import get_extension_context
from nnabla.logger import logger

from nnabla_mpt import DynamicLossScalingUpdater, PrecisionSchedule
from nnabla_mpt.report.figure import Curve, GradientPoints, RunPicture, draw
from nnabla_mpt.report.summary import format_scale, wrap
from nnabla_mpt.scale.gradient_stats import overall


# --------------------------------------------------------------------------- data

def load_digits_split(seed, test_fraction=0.2):
    """Loads the digits data set and splits it into train and test parts.

    Pixels (0..16) are scaled to [0, 1]. The split is stratified and fixed by
    ``seed``.

    Returns:
        (x_train, y_train, x_test, y_test); x is float32 of shape (n, 64),
        y is int32 of shape (n, 1) as ``F.softmax_cross_entropy`` expects.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int32).reshape(-1, 1)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=test_fraction, random_state=seed, stratify=digits.target)
    return x_train, y_train, x_test, y_test


class BatchStream:
    """Endless mini-batches: a new shuffle every epoch, fully determined by the seed.

    Two streams built with the same arguments yield identical batches, which is
    how both runs get exactly the same data.
    """

    def __init__(self, x, y, batch_size, seed):
        self.x, self.y, self.batch_size = x, y, batch_size
        self.rng = np.random.RandomState(seed)
        self.order = np.empty(0, dtype=np.int64)

    def next(self):
        if len(self.order) < self.batch_size:
            self.order = np.concatenate([self.order, self.rng.permutation(len(self.x))])
        idx, self.order = self.order[:self.batch_size], self.order[self.batch_size:]
        return self.x[idx], self.y[idx]


# -------------------------------------------------------------------------- model

def mlp(x, hidden, n_classes, seed):
    """The network: affine + ReLU per hidden width, then an affine to the logits.

    Parameters are created in the current parameter scope (``fc0``, ``fc1``, ...);
    ``seed`` fixes their initial values, so two scopes built with the same seed
    start identical. When the parameters already exist (a second graph in the
    same scope) they are reused and ``seed`` has no effect.
    """
    rng = np.random.RandomState(seed)
    h = x
    widths = list(hidden) + [n_classes]
    for i, width in enumerate(widths):
        fan_in = h.shape[1]
        w_init = I.UniformInitializer(I.calc_uniform_lim_glorot(fan_in, width), rng=rng)
        h = PF.affine(h, width, w_init=w_init, b_init=I.ConstantInitializer(0.0),
                      name="fc{}".format(i))
        if i < len(widths) - 1:
            h = F.relu(h)
    return h


def build_graph(ctx, scope, batch_size, hidden, seed, reduction="sum", n_inputs=64,
                n_classes=10, loss_ctx=None):
    """Builds inputs and logits under ``ctx``, and the cross-entropy loss under
    ``loss_ctx`` (``ctx`` when None).

    ``reduction`` is how the per-example losses are combined: ``"sum"`` or
    ``"mean"``. With a float ``loss_ctx`` over a half ``ctx`` only the loss is float32:
    ``F.identity(logits)`` casts the logits, the cross-entropy and its reduction run in
    float32, and ``loss.backward(scale)`` seeds the pass in float32, so the seed sets no
    ceiling of its own (the network and its gradients stay fp16). Graphs built in the
    same ``scope`` share parameters, whatever their context: this is how the fp16 model
    is evaluated in float below.

    Returns:
        dict with Variables ``x``, ``t``, ``logits``, ``loss``.
    """
    with nn.context_scope(ctx), nn.parameter_scope(scope):
        x = nn.Variable((batch_size, n_inputs))
        t = nn.Variable((batch_size, 1))
        logits = mlp(x, hidden, n_classes, seed)
    with nn.context_scope(ctx if loss_ctx is None else loss_ctx):
        top = logits if loss_ctx is None else F.identity(logits)
        per_example = F.softmax_cross_entropy(top, t)
        loss = F.sum(per_example) if reduction == "sum" else F.mean(per_example)
    return {"x": x, "t": t, "logits": logits, "loss": loss}


def make_solver(ctx, scope, lr):
    """Momentum SGD over the parameters of ``scope``, created under ``ctx``."""
    with nn.context_scope(ctx), nn.parameter_scope(scope):
        solver = S.Momentum(lr=lr, momentum=0.9)
        solver.set_parameters(nn.get_parameters())
    return solver


# ----------------------------------------------------------------------- training

def updater_options(schedule, steps, monitor_dir, monitor_interval):
    """The updater's keywords for the precision schedule and the monitor.

    Returns:
        (options, hook, loss_series): the keywords, the :class:`LossScaleMonitor`
        (or None) and the ``training-loss`` series next to it (or None).
    """
    options, hook, loss_series = {}, None, None
    if schedule is not None:
        trigger = schedule["mode"].split("|")[1].strip()
        options["schedule"] = PrecisionSchedule(
            schedule["mode"], total_steps=steps if trigger == "step" else None,
            final_loss=schedule["final_loss"],
            high_precision_loss=schedule["graph"]["loss"])
    if monitor_dir is not None:
        from nnabla.monitor import Monitor, MonitorSeries
        from nnabla_mpt import LossScaleMonitor
        monitor = Monitor(monitor_dir)
        hook = LossScaleMonitor(monitor, interval=monitor_interval)
        loss_series = MonitorSeries("training-loss", monitor, interval=monitor_interval,
                                    verbose=False)
        options["monitor"] = hook
    return options, hook, loss_series


def record_step(history, result, growth_due, loss):
    """Appends one step's :class:`StepResult` (and its loss per example) to ``history``.

    ``growth_due`` is whether the policy was at the end of a growth interval before the
    step (``policy.growth_due``): a good fp16 step there is a growth point, where the
    scale grew or held. Gradient statistics, on the steps that carry them, are kept per
    parameter and over all parameters (``nnabla_mpt.scale.gradient_stats.overall``).
    """
    history["loss"].append(loss)
    history["scale"].append(float(result.scale))
    history["next_scale"].append(float(result.next_scale))
    history["skipped"].append(bool(result.skipped))
    history["precision"].append(result.precision)
    history["growth_due"].append(bool(growth_due))
    history["held_by"].append(result.held_by)
    if result.gradient_stats:
        history["gradient_stats"].append({
            "step": result.step, "skipped": bool(result.skipped),
            "precision": result.precision,
            "overall": dataclasses.asdict(overall(result.gradient_stats)),
            "parameters": {name: dataclasses.asdict(s)
                           for name, s in result.gradient_stats.items()}})


class ProgressLines:
    """Progress as lines, for output that is no terminal (a file, a pipe), where a bar
    would show nothing until the end: a line at the end of the first epoch, then at the end
    of each epoch that ends at least ``every`` seconds after the last line, and at the last
    step; flushed at once."""

    def __init__(self, name, steps, steps_per_epoch, every=10.0):
        self.name, self.steps, self.every = name, steps, every
        self.steps_per_epoch = steps_per_epoch
        self.started = self.last = time.perf_counter()
        self.lines = 0

    def step(self, done, text):
        """After ``done`` steps (``text``: what the line adds, e.g. the loss)."""
        now = time.perf_counter()
        epoch_end = done % self.steps_per_epoch == 0
        due = epoch_end and (self.lines == 0 or now - self.last >= self.every)
        if due or done == self.steps:
            print("{}: step {}/{} (epoch {:.1f}), {}, {:.0f} s".format(
                self.name, done, self.steps, done / self.steps_per_epoch, text,
                now - self.started), flush=True)
            self.last, self.lines = now, self.lines + 1


def progress_of(progress, name, steps, stream):
    """``(bar, lines)``: the tqdm bar over the steps for ``progress="bar"`` (disabled
    otherwise) and the :class:`ProgressLines` for ``progress="lines"`` (or None)."""
    from tqdm import tqdm

    bar = tqdm(range(steps), desc=name, disable=progress != "bar", dynamic_ncols=True)
    per_epoch = max(1, len(stream.x) // stream.batch_size)
    return bar, ProgressLines(name, steps, per_epoch) if progress == "lines" else None


def bar_logging(progress):
    """A context in which log lines are written through the progress bar (above it, the
    bar redrawn below) when there is a bar, so that they do not break it."""
    import contextlib
    if progress != "bar":
        return contextlib.nullcontext()
    import logging
    from tqdm.contrib.logging import logging_redirect_tqdm
    return logging_redirect_tqdm(loggers=[logging.getLogger()])   # nnabla logs through the root


def train_fp16(graph, solver, stream, steps, scaling, loss_divisor=1, progress="bar",
               schedule=None, monitor_dir=None, monitor_interval=50):
    """Trains with :class:`DynamicLossScalingUpdater`; returns the per-step history.

    ``scaling`` holds the updater's keywords ``scale`` (a number or ``"auto"``), ``N``,
    ``growth_mode`` and ``gradient_stats_every``. The history holds, per step, the loss
    divided by ``loss_divisor`` (the batch size for a summed loss: the loss per
    example), the scale the step ran with, the scale of the next step, whether the step
    was skipped, the precision it ran in and whether growth was due; and the gradient
    statistics of the steps that carry them (see :func:`record_step`).

    With ``monitor_dir``, the loss scale, the skipped steps, the overflow rate and the
    gradient statistics are written every ``monitor_interval`` steps as
    ``nnabla.monitor`` series there (``loss-scale-scale.series.txt`` and siblings), next
    to the training loss.

    ``schedule`` optionally switches to full precision for the end of training: a dict
    with ``mode`` (the :class:`~nnabla_mpt.PrecisionSchedule`'s mode, as
    ``--accelerate-train-mode`` gives it), ``graph`` (the same network built under the
    float context, sharing the parameters) and ``final_loss`` (the target of a ``loss``
    trigger, or None); the updater gets them as ``schedule=PrecisionSchedule(...)``.

    ``progress``: ``"bar"`` (a tqdm bar, log lines written through it), ``"lines"``
    (:class:`ProgressLines` on stdout) or None.
    """
    def feed():
        x, t = stream.next()
        graph["x"].d, graph["t"].d = x, t
        if schedule is not None:
            schedule["graph"]["x"].d, schedule["graph"]["t"].d = x, t

    options, hook, loss_series = updater_options(schedule, steps, monitor_dir,
                                                 monitor_interval)
    updater = DynamicLossScalingUpdater(solver, graph["loss"], feed, **scaling, **options)
    history = {"loss": [], "scale": [], "next_scale": [], "skipped": [], "precision": [],
               "growth_due": [], "held_by": [], "gradient_stats": []}
    bar, lines = progress_of(progress, "fp16 ", steps, stream)
    with bar_logging(progress):
        for _ in bar:
            growth_due = updater.policy.growth_due
            result = updater.update()
            ran = graph if result.precision == "half" else schedule["graph"]
            record_step(history, result, growth_due, float(ran["loss"].d) / loss_divisor)
            if loss_series is not None:
                loss_series.add(result.step, history["loss"][-1])
            scale = ("scale " + format_scale(result.next_scale) if updater.precision == "half"
                     else "float32, no loss scale")
            bar.set_postfix_str("loss {:.3f}, {}, skipped {}".format(
                history["loss"][-1], scale, updater.skipped_steps), refresh=False)
            if lines is not None:
                lines.step(result.step + 1, "loss {:.3f}, {}, skipped {}".format(
                    history["loss"][-1], scale, updater.skipped_steps))
    if hook is not None:
        hook.flush()        # summarise the last, unfinished window too
    return history


def train_float(graph, solver, stream, steps, loss_divisor=1, progress="bar"):
    """The reference: a plain float training loop, no loss scaling."""
    history = {"loss": []}
    bar, lines = progress_of(progress, "float", steps, stream)
    for done, _ in enumerate(bar, 1):
        graph["x"].d, graph["t"].d = stream.next()
        solver.zero_grad()
        graph["loss"].forward(clear_no_need_grad=True)
        graph["loss"].backward(clear_buffer=True)
        solver.update()
        history["loss"].append(float(graph["loss"].d) / loss_divisor)
        if lines is not None:
            lines.step(done, "loss {:.3f}".format(history["loss"][-1]))
    return history


# --------------------------------------------------------------------- evaluation

def accuracy(ctx, scope, x, y, hidden, seed):
    """Test accuracy of the parameters in ``scope``, computed under ``ctx``.

    A new graph (batch = the whole test set) is built in the existing scope, so it
    uses the trained parameters, whichever context trained them.
    """
    graph = build_graph(ctx, scope, len(x), hidden, seed)
    graph["x"].d, graph["t"].d = x, y
    graph["logits"].forward(clear_buffer=True)
    return float(np.mean(np.argmax(graph["logits"].d, axis=1) == y[:, 0]))


# ------------------------------------------------------------------------ summary

def switch_step(history):
    """The first step a precision schedule ran in float32, or None."""
    precision = history.get("precision", [])
    return precision.index("float") if "float" in precision else None


def scale_trajectory(history):
    """Initial, min, max, final scale and the (step, new scale) points where it changed.

    After a precision schedule's switch to float32 (``unused_from``, the first float32
    step) no loss scale is used: the trajectory ends with the last fp16 step, ``final`` is
    None and ``last_used`` the scale that step ran with (the updater reports a scale of 1
    from the switch on, which is no scale at all)."""
    switch = switch_step(history)
    end = len(history["scale"]) if switch is None else switch
    scale, following = history["scale"][:end], list(history["next_scale"][:end])
    if switch is not None and end:
        following[-1] = scale[-1]           # the 1 reported at the switch is no change
    changes = [[i, new] for i, (old, new) in enumerate(zip(scale, following)) if new != old]
    values = scale[:1] + following
    trajectory = {"initial": values[0], "min": min(values), "max": max(values),
                  "final": values[-1] if switch is None else None, "changes": changes}
    if switch is not None:
        trajectory.update(last_used=scale[-1] if end else None, unused_from=switch)
    return trajectory


def skipped_summary(history):
    """Skipped steps, split at the first applied update (the end of the warm-up)."""
    skipped = [i for i, s in enumerate(history["skipped"]) if s]
    first_update = next((i for i, s in enumerate(history["skipped"]) if not s),
                        len(history["skipped"]))
    warmup = sum(1 for i in skipped if i < first_update)
    return {"total": len(skipped), "warmup": warmup, "after_warmup": len(skipped) - warmup,
            "first_update_step": first_update, "steps": skipped}


def growth_summary(history):
    """The growth points and what the scale did at each: grew, or held.

    A growth point is a good fp16 step that ended a growth interval (``--interval``
    good steps in a row). In ``measured`` mode the scale holds there when the
    gradients leave no room for a doubling, or when the largest scale the loss's dtype
    can seed (2**15 for an fp16 loss) holds it while they leave room
    (``StepResult.held_by == "ceiling"``: ``held_by_ceiling``); in ``probe`` mode it
    holds only at its upper bound.
    """
    grew, held = [], []
    for i, due in enumerate(history["growth_due"]):
        if due and not history["skipped"][i] and history["precision"][i] == "half":
            (grew if history["next_scale"][i] > history["scale"][i] else held).append(i)
    held_by = history.get("held_by") or [None] * len(history["growth_due"])
    return {"points": len(grew) + len(held), "grew": len(grew), "held": len(held),
            "grew_at": grew, "held_at": held,
            "held_by_ceiling": [i for i in held if held_by[i] == "ceiling"]}


def json_number(value):
    """A float for summary.json: inf and NaN (which JSON lacks) become None."""
    return float(value) if np.isfinite(value) else None


def gradient_summary(history, every):
    """The gradient statistics over the run, for summary.json.

    ``series`` has, per record, the statistics over all gradients and the precision the
    step ran in (``"float"`` after a precision schedule's switch: float32 gradients, whose
    headroom counts up to float32's largest value); ``last`` is the last record with each
    parameter's own, ``last_fp16`` the last of an fp16 step. A headroom of None is an all-zero gradient set
    (infinite headroom) or, on a skipped step, one holding inf/NaN (``nonfinite_fraction``
    > 0 tells which).
    """
    keys = ("zero_fraction", "subnormal_fraction", "nonfinite_fraction", "max_abs",
            "headroom")

    def numbers(stats):
        return {k: json_number(stats[k]) for k in keys}

    def entry(record):
        return dict(step=record["step"], skipped=record["skipped"],
                    precision=record.get("precision", "half"), **numbers(record["overall"]))

    def with_parameters(record):
        return dict(entry(record), parameters={name: numbers(s) for name, s
                                               in record["parameters"].items()})

    records = history["gradient_stats"]
    half = [r for r in records if r.get("precision", "half") == "half"]
    return {"every": every, "records": len(records), "series": [entry(r) for r in records],
            "last": with_parameters(records[-1]) if records else None,
            "last_fp16": with_parameters(half[-1]) if half else None}


def gradient_points(records):
    """The overall gradient statistics of ``records`` (see :func:`record_step`) as the
    figure's ``GradientPoints``, or None when there are none."""
    if not records:
        return None
    column = lambda key: np.array([r["overall"][key] for r in records], dtype=np.float64)
    return GradientPoints(steps=np.array([r["step"] for r in records]),
                          zero_fraction=column("zero_fraction"),
                          subnormal_fraction=column("subnormal_fraction"),
                          headroom=column("headroom"))


def picture(fp16, ref, title):
    """What the figure shows of the run, a point per step: the loss of both runs, the
    scale (none after a precision schedule's switch: it ends there), the skipped steps,
    the growth points that held (by the gradients, or by the fp16 seed's ceiling) and the
    gradient statistics (those of float32 steps after a switch apart)."""
    steps = np.arange(len(fp16["loss"]))
    switch = switch_step(fp16)
    scale = np.asarray(fp16["scale"], dtype=np.float64).copy()
    if switch is not None:
        scale[switch:] = np.nan            # float32 steps: no loss scale (reported as 1)
    growth = growth_summary(fp16)
    records = fp16["gradient_stats"]
    half = [r for r in records if r.get("precision", "half") == "half"]
    after = [r for r in records if r.get("precision", "half") == "float"]
    return RunPicture(
        title=title, steps=steps, scale=scale, switch=switch, dtype="fp16",
        skipped=steps[np.array(fp16["skipped"], dtype=bool)],
        held=np.array(sorted(set(growth["held_at"]) - set(growth["held_by_ceiling"])),
                      dtype=np.int64),
        held_by_ceiling=np.array(growth["held_by_ceiling"], dtype=np.int64),
        losses=(Curve("fp16 + dynamic loss scaling", steps, np.asarray(fp16["loss"]),
                      "tab:blue"),
                Curve("float", steps, np.asarray(ref["loss"]), "tab:orange")),
        gradients=gradient_points(half) or GradientPoints(*(np.zeros(0),) * 4),
        float32_gradients=gradient_points(after))


def plot(path, fp16, ref, title):
    """Three panels over the steps, drawn by nnabla_mpt's report (``nnabla_mpt.report``,
    the figure of ``python -m nnabla_mpt.report``): the loss (fp16 and float), the loss
    scale (log y) and the fp16 gradient statistics. Returns the figure."""
    return draw(picture(fp16, ref, title), path)


def format_changes(changes, limit=40, width=88):
    """``step:scale`` pairs wrapped in lines; the middle is elided past ``limit``."""
    items = ["{}:{}".format(i, format_scale(s)) for i, s in changes]
    if len(items) > limit:
        head, tail = items[:limit - 10], items[-10:]
        items = head + ["... {} more ...".format(len(items) - limit)] + tail
    return textwrap.fill("  ".join(items) or "none", width=width,
                         initial_indent="    ", subsequent_indent="    ")


def describe_start(requested, initial):
    """Where the first scale came from, for the report."""
    if requested == "auto":
        return "chosen by --scale auto from the first batch's gradients"
    if requested != initial:
        return "--scale {} lowered to {}: fp16 cannot seed a larger scale".format(
            format_scale(requested), format_scale(initial))
    return "--scale {}".format(format_scale(requested))


def describe_gradients(gs):
    """The last gradient statistics of the fp16 steps, and of the float32 ones after a
    precision schedule's switch (apart: their headroom is to float32's largest value), or
    why there are none."""
    if gs["last"] is None:
        return "gradient statistics: none (every {} steps, the run is shorter)".format(
            gs["every"])
    text = []
    if gs.get("last_fp16") is not None:
        text.append(describe_record(gs["last_fp16"], gs["every"], "fp16 gradient"))
    if gs["last"].get("precision", "half") == "float":
        text.append(describe_record(gs["last"], gs["every"],
                                    "after the switch, float32 gradient") +
                    ", counted to float32's largest value as no loss scale is used")
    return "; ".join(text)


def describe_record(last, every, what):
    """One record of gradient statistics, for the report."""
    if last["headroom"] is None:
        room = ("-inf: a gradient holds inf/NaN" if last["nonfinite_fraction"]
                else "inf: every gradient is zero")
    else:
        params = last["parameters"]
        lowest = [name for name, s in sorted(params.items())
                  if s["headroom"] == last["headroom"]]
        room = "{:g} {} of two (in {})".format(
            last["headroom"], "power" if last["headroom"] == 1 else "powers",
            lowest[0] if len(lowest) == 1 else
            "{} of the {} parameters".format(len(lowest), len(params)))
    return ("{} statistics (every {} steps), last at step {}{}: {:.2f}% zero, "
            "{:.2f}% subnormal, headroom {}".format(
                what, every, last["step"], " (skipped)" if last["skipped"] else "",
                100 * last["zero_fraction"], 100 * last["subnormal_fraction"], room))


def report_scaling(summary):
    """The report's lines on the loss scale: start, trajectory, growth, skips, gradients."""
    sc, sk, gr = summary["loss_scale"], summary["skipped_steps"], summary["growth"]
    if sc["final"] is not None:
        end = "final {}".format(format_scale(sc["final"]))
    else:
        end = ("last used {} by step {}; from step {} on, after the precision schedule's "
               "switch to float32, no loss scale is used".format(
                   format_scale(sc["last_used"]), sc["unused_from"] - 1, sc["unused_from"]))
    return [
        wrap("loss scale: initial {} ({}); min {}, max {}, {}".format(
            format_scale(sc["initial"]), describe_start(sc["requested"], sc["initial"]),
            *(format_scale(sc[k]) for k in ("min", "max")), end)),
        "  changes (step:new scale):",
        format_changes(sc["changes"]),
        wrap("growth ({}, due after {} good steps in a row): {} growth points, {} grew, "
             "{} held".format(gr["mode"], summary["interval"], gr["points"], gr["grew"],
                              gr["held"]) + held_by_ceiling(gr)),
        wrap("skipped steps: {} of {} ({} in warm-up, before the first update at step {};"
             " {} later)".format(sk["total"], summary["steps"], sk["warmup"],
                                 sk["first_update_step"], sk["after_warmup"])),
        wrap(describe_gradients(summary["gradient_stats"])),
    ]


def held_by_ceiling(growth):
    """What the summary adds where the fp16 seed's ceiling, not the gradients, held the
    scale at growth points: that it did, and what lifts it."""
    n = len(growth.get("held_by_ceiling", []))
    if not n:
        return ""
    return ("; {} of them held by the largest scale an fp16 loss can seed (2**15), not by "
            "the gradients: a loss in float32 (--loss-dtype float32, the default) "
            "lifts it".format(n))


def report(summary):
    """The text printed at the end of a run."""
    acc, sec = summary["accuracy"], summary["seconds"]
    row = "  {:<34}{:>14}{:>10}"
    lines = [
        "",
        "digits, MLP 64 -> {} -> 10, {} steps of batch {}, {} loss in {}, seed {}".format(
            "-".join(str(h) for h in summary["hidden"]), summary["steps"],
            summary["batch_size"], summary["reduction"], summary["loss_dtype"],
            summary["seed"]),
        "",
        row.format("", "fp16+scaling", "float"),
        row.format("test accuracy (float inference)", "{:.2f}%".format(100 * acc["fp16"]),
                   "{:.2f}%".format(100 * acc["float"])),
        row.format("test accuracy (fp16 inference)",
                   "{:.2f}%".format(100 * acc["fp16_inference"]), ""),
        row.format("loss/example, last {} steps".format(summary["final_loss"]["last_steps"]),
                   "{:.4f}".format(summary["final_loss"]["fp16"]),
                   "{:.4f}".format(summary["final_loss"]["float"])),
        row.format("training time", "{:.1f} s".format(sec["fp16"]),
                   "{:.1f} s".format(sec["float"])),
        "  (fp16 on the CPU is emulated by nnabla, here {:.0f} times slower than float:"
        .format(sec["fp16"] / max(sec["float"], 1e-9)),
        "   the speed of fp16 is a GPU matter; on the CPU the demo shows its numerics)",
        "",
    ] + report_scaling(summary)
    pr = summary.get("precision") or {}
    if pr.get("accelerate_train_mode"):
        lines.append("  precision schedule {!r}: {} steps in fp16, {} in float{}".format(
            pr["accelerate_train_mode"], pr["half_steps"], pr["float_steps"],
            "" if pr["switch_step"] is None else
            " (switched at step {})".format(pr["switch_step"])))
    files = summary["files"]
    lines += [
        "  total time {:.1f} s (training, evaluation, plot)".format(sec["total"]),
        "",
        "  wrote {}".format(files["plot"]),
        "  wrote {}".format(files["summary"]),
        wrap("wrote {}/ (nnabla.monitor series: {})".format(
            files["monitor"], ", ".join(name[:-len(".series.txt")]
                                        for name in files["monitor_series"]))),
    ]
    return "\n".join(lines)


# --------------------------------------------------------------------------- main

def scale_option(text):
    """``--scale``: ``auto`` or a finite number > 0."""
    if text == "auto":
        return text
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(
            "must be 'auto' or a number > 0, got {!r}".format(text))
    return value


def build_parser():
    p = argparse.ArgumentParser(
        description="fp16 training with dynamic loss scaling on the digits data set, "
                    "compared with float training.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--steps", type=int, default=1000, help="training steps (both runs)")
    p.add_argument("--batch-size", type=int, default=64, help="examples per step")
    p.add_argument("--seed", type=int, default=0,
                   help="fixes the data split, the initial weights and the batch order")
    p.add_argument("--out", default=os.path.join("runs", "digits"),
                   help="directory for digits_fp16.png and summary.json")
    p.add_argument("--scale", type=scale_option, default="auto",
                   help="initial loss scale: 'auto' (measured on the first batch) or a "
                        "number (with --loss-dtype float16, above 32768 it is lowered to "
                        "32768, the largest fp16 can seed)")
    p.add_argument("--growth-mode", choices=["probe", "measured"], default="measured",
                   help="how the scale grows after --interval clean steps: 'measured' by "
                        "as many doublings as the gradients leave room for (possibly "
                        "none), 'probe' by one doubling, tried")
    p.add_argument("--interval", type=int, default=50,
                   help="clean steps before the updater grows the scale (N)")
    p.add_argument("--stats-every", type=int, default=50,
                   help="steps between gradient statistics (zeros, subnormals, headroom)")
    p.add_argument("--hidden", type=int, nargs="+", default=[64, 64, 64],
                   help="hidden layer widths")
    p.add_argument("--lr", type=float, default=0.05,
                   help="momentum SGD learning rate for the mean loss (divided by the "
                        "batch size when the loss is a sum)")
    p.add_argument("--reduction", choices=["sum", "mean"], default="sum",
                   help="how the per-example losses are combined (see the module docstring)")
    p.add_argument("--loss-dtype", choices=["float32", "float16"], default="float32",
                   help="the dtype of the fp16 run's loss: 'float32' builds only the loss "
                        "under a float context over the fp16 network (the recommended way: "
                        "the seed sets no ceiling); 'float16' builds it in the fp16 graph, "
                        "where the largest scale the seed holds is 2**15 (the ceiling case)")
    p.add_argument("--accelerate-train-mode", default=None, metavar="TYPE|TRIGGER|VALUE",
                   help="precision schedule, e.g. 'fast|step|0.9': fp16 for the first 90%% "
                        "of the steps, float for the rest; or 'fast|loss|1.05' with "
                        "--final-loss")
    p.add_argument("--final-loss", type=float, default=None,
                   help="target loss per example, for a 'loss' trigger")
    p.add_argument("--monitor-interval", type=int, default=50,
                   help="steps between the nnabla.monitor records written to OUT/monitor")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress output: neither the bars (shown when stderr is a "
                        "terminal) nor the progress lines (printed otherwise, one at an "
                        "epoch's end once 10 s have passed since the last)")
    return p


def show_progress(args):
    """``"bar"`` on a terminal; ``"lines"`` when stderr is not one (redirected, a bar is
    noise and shows nothing until the end); None with ``--no-progress``."""
    if args.no_progress:
        return None
    return "bar" if sys.stderr.isatty() else "lines"


def parse_args(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    for name in ("steps", "batch_size", "interval", "stats_every", "monitor_interval"):
        if getattr(args, name) < 1:
            p.error("--{} must be >= 1, got {}".format(name.replace("_", "-"),
                                                       getattr(args, name)))
    if args.accelerate_train_mode is not None:
        from nnabla_mpt.scale.precision import AccelerateTrainMode
        try:
            mode = AccelerateTrainMode.parse(args.accelerate_train_mode)
        except ValueError as err:
            p.error(str(err))
        if mode.trigger == "loss" and args.final_loss is None:
            p.error("--accelerate-train-mode {!r} uses the 'loss' trigger: give "
                    "--final-loss".format(args.accelerate_train_mode))
    if args.final_loss is not None and (args.accelerate_train_mode is None
                                        or "|loss" not in args.accelerate_train_mode):
        p.error("--final-loss goes with --accelerate-train-mode 'fast|loss|VALUE'")
    return args


def run_fp16(args, data, half, single, per_example, monitor_dir):
    """The fp16 run: graph and solver under the half context, parameters in scope
    ``fp16``; with ``--accelerate-train-mode`` the same network under the float context,
    in the same scope (sharing the parameters), takes over for the last part."""
    x_train, y_train = data
    graph = build_graph(half, "fp16", args.batch_size, args.hidden, args.seed, args.reduction,
                        loss_ctx=single if args.loss_dtype == "float32" else None)
    solver = make_solver(half, "fp16", args.lr / per_example)
    schedule = None
    if args.accelerate_train_mode is not None:
        schedule = {"mode": args.accelerate_train_mode,
                    "graph": build_graph(single, "fp16", args.batch_size, args.hidden,
                                         args.seed, args.reduction),
                    "final_loss": (None if args.final_loss is None
                                   else args.final_loss * per_example)}
    scaling = {"scale": args.scale, "N": args.interval, "growth_mode": args.growth_mode,
               "gradient_stats_every": args.stats_every}
    return train_fp16(graph, solver, BatchStream(x_train, y_train, args.batch_size, args.seed),
                      args.steps, scaling, per_example, progress=show_progress(args),
                      schedule=schedule, monitor_dir=monitor_dir,
                      monitor_interval=args.monitor_interval)


def build_summary(args, fp16, ref, acc, seconds, files):
    """The run's numbers for summary.json and the report."""
    tail = min(50, args.steps)
    loss_scale = scale_trajectory(fp16)
    loss_scale["requested"] = args.scale
    return {
        "steps": args.steps, "batch_size": args.batch_size, "seed": args.seed,
        "hidden": list(args.hidden), "lr": args.lr, "reduction": args.reduction,
        "loss_dtype": args.loss_dtype,
        "interval": args.interval, "growth_mode": args.growth_mode,
        "stats_every": args.stats_every,
        "accuracy": acc,
        "final_loss": {"fp16": float(np.mean(fp16["loss"][-tail:])),
                       "float": float(np.mean(ref["loss"][-tail:])),
                       "last_steps": tail},
        "loss_scale": loss_scale,
        "growth": dict(mode=args.growth_mode, **growth_summary(fp16)),
        "skipped_steps": skipped_summary(fp16),
        "gradient_stats": gradient_summary(fp16, args.stats_every),
        "precision": {"accelerate_train_mode": args.accelerate_train_mode,
                      "half_steps": fp16["precision"].count("half"),
                      "float_steps": fp16["precision"].count("float"),
                      "switch_step": (fp16["precision"].index("float")
                                      if "float" in fp16["precision"] else None)},
        "seconds": seconds,
        "files": files,
    }


def main(argv=None):
    args = parse_args(argv)
    started = time.perf_counter()
    os.makedirs(args.out, exist_ok=True)
    x_train, y_train, x_test, y_test = load_digits_split(args.seed)
    logger.info("digits: {} training and {} test images".format(len(x_train), len(x_test)))
    half = get_extension_context("cpu", type_config="half")
    single = get_extension_context("cpu", type_config="float")
    monitor_dir = os.path.join(args.out, "monitor")

    # A summed loss has batch-size-times larger gradients; scale the learning rate
    # (and the reported loss) so that both reductions train and read the same.
    per_example = args.batch_size if args.reduction == "sum" else 1
    t0 = time.perf_counter()
    fp16 = run_fp16(args, (x_train, y_train), half, single, per_example, monitor_dir)
    t_fp16 = time.perf_counter() - t0

    # float run: same initial weights (same seed), same batches, own scope "float".
    graph = build_graph(single, "float", args.batch_size, args.hidden, args.seed, args.reduction)
    solver = make_solver(single, "float", args.lr / per_example)
    t0 = time.perf_counter()
    ref = train_float(graph, solver, BatchStream(x_train, y_train, args.batch_size, args.seed),
                      args.steps, per_example, progress=show_progress(args))
    t_float = time.perf_counter() - t0

    # Both models are evaluated by the same float graph, so the comparison measures
    # the weights each training run produced and nothing else (loss scaling only
    # exists in training). The fp16 weights are also evaluated by an fp16 graph, to
    # show they serve as well when inference runs in half precision.
    acc = {"fp16": accuracy(single, "fp16", x_test, y_test, args.hidden, args.seed),
           "float": accuracy(single, "float", x_test, y_test, args.hidden, args.seed),
           "fp16_inference": accuracy(half, "fp16", x_test, y_test, args.hidden, args.seed)}

    files = {"plot": os.path.join(args.out, "digits_fp16.png"),
             "summary": os.path.join(args.out, "summary.json"), "monitor": monitor_dir,
             "monitor_series": sorted(name for name in os.listdir(monitor_dir)
                                      if name.endswith(".series.txt"))}
    plot(files["plot"], fp16, ref,
         "digits MLP, fp16 with dynamic loss scaling vs float (seed {})".format(args.seed))
    summary = build_summary(args, fp16, ref, acc, {"fp16": t_fp16, "float": t_float}, files)
    summary["seconds"]["total"] = time.perf_counter() - started
    with open(files["summary"], "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=2, allow_nan=False)
    print(report(summary))
    return summary


if __name__ == "__main__":
    main()

"""Step time of DynamicLossScalingUpdater.update() against a hand-written loop and nnabla's
experimental updater, in float (no overflow ever happens: this measures the bookkeeping).

Contenders, each on its own copy of the same model with the same initial parameters and
the same batch:

* ``hand``   zero_grad, forward, backward(scale), scale_grad(1/scale), update; no check.
* ``check``  the same hand-written loop with the overflow check users write themselves:
  ``solver.check_inf_or_nan_grad()`` after the backward pass, the update only when it
  finds nothing (the check nnabla's updater and ours make).
* ``ours``   nnabla_mpt.DynamicLossScalingUpdater(...).update()
* ``nnabla`` nnabla.experimental.mixed_precision_training.DynamicLossScalingUpdater

They run interleaved in one process: hand, check, ours, nnabla, then nnabla, ours, check,
hand, ... (the
order reverses every round, so that no contender always runs after the same one). Each turn
times a block of steps; after the warm-up rounds the table reports the median step time of
each contender and the median over rounds of the per-round ratios.

With ``--with-clip`` a fourth contender, ours with ``clip_grad_norm`` (the global gradient
norm computed every step), joins the rotation and the table adds its ratio to ours. The
bound is ``--clip-bound`` (default 1e30, never reached; a small one clips every step).
With ``--saturation`` every nnabla_mpt contender checks with
``overflow=OverflowHandling(mode="saturation")`` (a ``--before`` revision from before that
option, with the keyword it had then, ``overflow_mode="saturation"``).

With ``--before REV`` another contender, ``before``, is nnabla_mpt as it was at the git
revision ``REV`` (extracted into a temporary folder and imported as ``nnabla_mpt_before``):
a change to the step loop is measured against the code before it in the same run, and the
table adds the ratios ours/before and before/nnabla. With ``--with-clip`` too, a contender
``before+clip`` (the code at ``REV`` with ``clip_grad_norm``) runs as well, and the table
adds the ratio ours+clip/before+clip.

With ``--control`` another contender, ``again``, is a second copy of ours (the same code on
its own copy of the model), run second from the end: where ours runs when the order is
reversed. The ratio ours/again, which would be exactly 1 if only the code decided the
step time, shows the resolution of the run itself (where a model's memory lies, which
contender runs after which): a ratio ours/before is told from 1 only where it lies
further from 1 than ours/again does over the same runs.

With ``--layouts K`` the models are built K times, the first in the run order and the
others in orders shuffled by their number, and the rounds are split among the K builds:
the medians then hold for several placements in memory, not for one.

Usage:
    .venv/bin/python benchmarks/updater_overhead.py [--rounds 60] [--with-clip]
        [--clip-bound C] [--saturation] [--before REV] [--control] [--layouts K]
"""
import argparse
import importlib
import io
import os
import platform
import random
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import nnabla as nn  # noqa: E402
import nnabla.functions as F  # noqa: E402
import nnabla.parametric_functions as PF  # noqa: E402
import nnabla.solvers as S  # noqa: E402
from nnabla.experimental.mixed_precision_training import (  # noqa: E402
    DynamicLossScalingUpdater as NnablaUpdater)
from nnabla.logger import logger  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
from _machine import cpu_model  # noqa: E402
from nnabla_mpt import DynamicLossScalingUpdater  # noqa: E402

BeforeUpdater = None  # DynamicLossScalingUpdater of --before REV, when asked for
CLIP_BOUND = 1e30     # clip_grad_norm of the clipping contenders (--clip-bound)
SATURATION = False    # every nnabla_mpt contender checks in saturation mode (--saturation)

BATCH = 64
SCALE = 8.0

# name -> (input width, hidden widths, classes)
MODELS = {
    "mlp-1e4": (64, [64, 64], 10),           # 8,970 parameters in 6 arrays
    "mlp-1e5": (128, [256, 256], 10),        # 101,386 parameters in 6 arrays
    "mlp-1e6": (512, [768, 768], 10),        # 992,266 parameters in 6 arrays
    "deep-narrow": (16, [16] * 99, 10),      # 27,114 parameters in 200 arrays
}


def build(scope, spec, seed):
    """Builds one copy of the model under ``scope``; returns (loss, params, x, t)."""
    width, hidden, classes = spec
    rng = np.random.RandomState(seed)
    x = nn.Variable.from_numpy_array(rng.randn(BATCH, width).astype(np.float32))
    t = nn.Variable.from_numpy_array(rng.randint(0, classes, (BATCH, 1)).astype(np.int32))
    with nn.parameter_scope(scope):
        h = x
        for i, w in enumerate(hidden):
            h = F.relu(PF.affine(h, w, name=f"fc{i}",
                                 rng=np.random.RandomState(seed + i)))
        y = PF.affine(h, classes, name="out", rng=np.random.RandomState(seed + 1000))
        params = nn.get_parameters()
    loss = F.mean(F.softmax_cross_entropy(y, t))
    return loss, params


def make_solver(params):
    solver = S.Momentum(1e-3, 0.9)
    solver.set_parameters(params)
    return solver


def feed():
    """The same no-op data feeder for every contender (the batch stays in place)."""


def import_before(rev):
    """The DynamicLossScalingUpdater of nnabla_mpt at git revision ``rev``, imported from a
    temporary folder as the package ``nnabla_mpt_before``."""
    folder = tempfile.mkdtemp(prefix="nnabla_mpt_before-")
    archive = subprocess.run(["git", "-C", ROOT, "archive", rev, "nnabla_mpt"],
                             check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder)
    os.rename(os.path.join(folder, "nnabla_mpt"), os.path.join(folder, "nnabla_mpt_before"))
    sys.path.insert(0, folder)
    from nnabla_mpt_before import DynamicLossScalingUpdater as before
    return before


def _hand(spec, seed, check=False):
    """The hand-written loop; ``check``: with the overflow check a careful user writes
    (``solver.check_inf_or_nan_grad()``, skipping the step when it finds inf/NaN)."""
    loss, params = build("check" if check else "hand", spec, seed)
    solver = make_solver(params)

    def hand():
        solver.zero_grad()
        feed()
        loss.forward(clear_no_need_grad=True)
        loss.backward(SCALE, clear_buffer=True)
        if check and solver.check_inf_or_nan_grad():
            return                                  # skip the step
        solver.scale_grad(1.0 / SCALE)
        solver.update()
    return hand, params


def _saturation(cls):
    """The option of ``cls`` (ours, or the updater of ``--before``) that asks for the check
    in saturation mode, in the spelling of its package: ``overflow=OverflowHandling(...)``
    of that package, or ``overflow_mode=`` in a revision from before OverflowHandling."""
    package = importlib.import_module(cls.__module__.partition(".")[0])
    handling = getattr(package, "OverflowHandling", None)
    if handling is None:
        return {"overflow_mode": "saturation"}
    return {"overflow": handling(mode="saturation")}


def _updater(cls, scope, **options):
    if cls is not NnablaUpdater and SATURATION:
        options.update(_saturation(cls))

    def make(spec, seed):
        loss, params = build(scope, spec, seed)
        return cls(make_solver(params), loss, feed, scale=SCALE, N=2000, **options).update, \
            params
    return make


def contender_makers(with_clip=False, control=False):
    """(name, builder) of each contender, in the order they run. The control runs where
    ours runs in the reversed order (second from the end), so that the two take the same
    places over two rounds."""
    found = [("hand", _hand), ("check", lambda spec, seed: _hand(spec, seed, check=True)),
             ("ours", _updater(DynamicLossScalingUpdater, "ours"))]
    if BeforeUpdater is not None:
        found.append(("before", _updater(BeforeUpdater, "before")))
    found.append(("nnabla", _updater(NnablaUpdater, "nnabla")))
    if with_clip:
        # The norm is computed every step; the default bound is never reached.
        found.append(("ours+clip", _updater(DynamicLossScalingUpdater, "clip",
                                            clip_grad_norm=CLIP_BOUND)))
        if BeforeUpdater is not None:
            found.append(("before+clip", _updater(BeforeUpdater, "bclip",
                                                  clip_grad_norm=CLIP_BOUND)))
    if control:
        found.insert(len(found) - 1, ("again", _updater(DynamicLossScalingUpdater, "again")))
    return found


def contenders(spec, seed, with_clip=False, control=False, layout=0, reverse_build=False):
    """The contenders' step functions, in the order they run (:func:`contender_makers`).
    A model built earlier can run at a different speed for where its memory lies, so the
    build order is a parameter: layout 0 builds in the run order (the reverse one with
    ``reverse_build``), any other layout in an order shuffled by its number."""
    makers = contender_makers(with_clip, control)
    order = makers[::-1] if reverse_build else list(makers)
    if layout:
        random.Random(layout).shuffle(order)
    built = {}
    for name, make in order:
        built[name] = make(spec, seed)
    params = built["hand"][1]
    runs = {name: built[name][0] for name, _ in makers}
    return runs, sum(v.size for v in params.values()), len(params)


CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
clock = CLOCKS["cpu"]


def time_block(fn, n):
    start = clock()
    for _ in range(n):
        fn()
    return (clock() - start) / n


def interleaved(runs, n, rounds, warmup):
    """Times ``runs`` (name -> step function) in turns of ``n`` steps each: in their order,
    then in the reverse order in the next round, so that no contender always follows the
    same one; ``warmup`` untimed rounds first. Returns name -> [seconds per step, one per
    timed round] (by ``clock``)."""
    names = list(runs)
    times = {k: [] for k in names}
    for r in range(warmup + rounds):
        for k in (names if r % 2 == 0 else names[::-1]):
            t = time_block(runs[k], n)
            if r >= warmup:
                times[k].append(t)
    return times


def measure(spec, rounds, warmup, block_ms, seed=0, with_clip=False, reverse_build=False,
            control=False, layouts=1):
    """Times the contenders on ``spec``: ``rounds`` split evenly over ``layouts`` builds
    of the models (see :func:`contenders`), each with ``warmup`` untimed rounds first."""
    times, n = {}, None
    for layout in range(layouts):
        runs = None      # the previous build's models go before the next are built
        nn.clear_parameters()
        runs, n_params, n_arrays = contenders(spec, seed, with_clip, control, layout,
                                              reverse_build)
        if n is None:   # steps per block: about block_ms of work, from a short probe
            probe = min(time_block(runs["hand"], 3) for _ in range(3))
            n = max(1, int(block_ms / 1e3 / probe))
        part = interleaved(runs, n, rounds // layouts, warmup)
        for name, seconds in part.items():
            times.setdefault(name, []).extend(seconds)
    ratio_hand = statistics.median(o / h for o, h in zip(times["ours"], times["hand"]))
    ratio_check = statistics.median(o / c for o, c in zip(times["ours"], times["check"]))
    ratio_nnabla = statistics.median(o / c for o, c in zip(times["ours"], times["nnabla"]))
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio_clip = (statistics.median(c / o for c, o in zip(times["ours+clip"], times["ours"]))
                  if with_clip else None)
    ratio_before = None
    if "before" in times:
        ratio_before = (statistics.median(o / b for o, b in zip(times["ours"], times["before"])),
                        statistics.median(b / c for b, c in zip(times["before"],
                                                                times["nnabla"])))
    ratio_again = (statistics.median(o / a for o, a in zip(times["ours"], times["again"]))
                   if control else None)
    if "before+clip" in times:      # ours+clip / before+clip, beside clip/ours
        ratio_clip = (ratio_clip, statistics.median(
            c / b for c, b in zip(times["ours+clip"], times["before+clip"])))
    return (n_params, n_arrays, n, med, (ratio_hand, ratio_check), ratio_nnabla, ratio_clip,
            ratio_before, ratio_again)


def _arguments(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=60, help="timed rounds (default 60)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed rounds (default 5)")
    parser.add_argument("--block-ms", type=float, default=40.0,
                        help="approximate length of one timed block (default 40 ms)")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--with-clip", action="store_true",
                        help="add a fourth contender: ours with clip_grad_norm (the global "
                             "norm computed every step)")
    parser.add_argument("--clip-bound", type=float, default=1e30,
                        help="clip_grad_norm of the clipping contenders (default 1e30: "
                             "never reached)")
    parser.add_argument("--saturation", action="store_true",
                        help="every nnabla_mpt contender (ours, before, again, the clipping "
                             "ones) checks with "
                             "overflow=OverflowHandling(mode='saturation')")
    parser.add_argument("--clock", choices=list(CLOCKS), default="cpu",
                        help="cpu: CPU time of this process (default; robust when other "
                             "programs share the machine), wall: elapsed time")
    parser.add_argument("--before", metavar="REV",
                        help="add a contender: nnabla_mpt at git revision REV")
    parser.add_argument("--reverse-build", action="store_true",
                        help="build the contenders' models in the reverse order (the run "
                             "order stays): shows the bias of the order they are built in")
    parser.add_argument("--layouts", type=int, default=1,
                        help="build the models this many times, in shuffled orders after "
                             "the first, and split the rounds among the builds (default 1)")
    parser.add_argument("--control", action="store_true",
                        help="add a contender: a second copy of ours; the ratio ours/again "
                             "shows the resolution of the run")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.layouts < 1 or args.rounds % args.layouts:
        parser.error(f"--layouts must be at least 1 and divide --rounds {args.rounds} "
                     f"evenly, got {args.layouts}")
    return args


def _print_header(args):
    """Prints the run's settings, the machine and the table's header."""
    layouts = f" over {args.layouts} builds" if args.layouts > 1 else ""
    order = "/".join(name for name, _ in contender_makers(args.with_clip, args.control))
    mode = ", overflow=OverflowHandling(mode='saturation')" if args.saturation else ""
    print(f"# updater step time, float{mode}, batch {BATCH}, Momentum; {args.rounds} rounds"
          f"{layouts} "
          f"(+{args.warmup} warm-up each) of interleaved blocks {order}, {args.clock} clock")
    print(f"# nnabla {nn.__version__}, Python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs ({cpu_model()}), OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS')}")
    header = (f"{'model':<12} {'params':>9} {'arrays':>6} {'steps/blk':>9} {'hand ms':>8} "
              f"{'check ms':>8} {'ours ms':>8} {'nnabla ms':>9} {'ours/hand':>9} "
              f"{'ours/check':>10} {'ours/nnabla':>11}"
              + (f" {'clip ms':>8} {'clip/ours':>9}" if args.with_clip else "")
              + (f" {'clip/bclip':>10}" if args.with_clip and args.before else "")
              + (f" {'before ms':>9} {'ours/before':>11} {'before/nnabla':>13}"
                 if args.before else "")
              + (f" {'ours/again':>10}" if args.control else ""))
    print(header)
    print("-" * len(header))


def _clip_columns(med, ratio_clip):
    """The columns of the clipping contenders: ours+clip's time, clip/ours and, with
    ``--before``, ours+clip/before+clip."""
    if isinstance(ratio_clip, tuple):
        return f" {med['ours+clip'] * 1e3:>8.3f} {ratio_clip[0]:>9.3f} {ratio_clip[1]:>10.3f}"
    return f" {med['ours+clip'] * 1e3:>8.3f} {ratio_clip:>9.3f}"


def main(argv=None):
    args = _arguments(argv)
    global clock, BeforeUpdater, CLIP_BOUND, SATURATION
    clock = CLOCKS[args.clock]
    CLIP_BOUND = args.clip_bound
    SATURATION = args.saturation
    if args.before:
        BeforeUpdater = import_before(args.before)
    logger.setLevel("WARNING")
    _print_header(args)
    for name in args.models:
        n_params, n_arrays, n, med, rh, rn, rc, rb, ra = measure(
            MODELS[name], args.rounds, args.warmup, args.block_ms, with_clip=args.with_clip,
            reverse_build=args.reverse_build, control=args.control, layouts=args.layouts)
        print(f"{name:<12} {n_params:>9,} {n_arrays:>6} {n:>9} {med['hand'] * 1e3:>8.3f} "
              f"{med['check'] * 1e3:>8.3f} {med['ours'] * 1e3:>8.3f} "
              f"{med['nnabla'] * 1e3:>9.3f} {rh[0]:>9.3f} {rh[1]:>10.3f} {rn:>11.3f}"
              + (_clip_columns(med, rc) if args.with_clip else "")
              + (f" {med['before'] * 1e3:>9.3f} {rb[0]:>11.3f} {rb[1]:>13.3f}"
                 if rb else "")
              + (f" {ra:>10.3f}" if ra is not None else ""),
              flush=True)


if __name__ == "__main__":
    main()

"""MPI worker: measured loss scaling on a float16 network, a different batch on each rank.

Usage: mpiexec -n N python measured.py OUTDIR

Every rank trains the same float16 MLP (parameters broadcast from rank 0) with
``scale="auto"``, ``growth_mode="measured"``, ``N=3`` and ``gradient_stats_every=4`` on its
own batches; the last rank's inputs are 4 times larger (its gradients decide the scale),
and at steps 6 and 7 they are 10 times larger again: its float16 gradients overflow, the scale
backs off twice, and the next growth point measures its way back; every rank keeps the
same history of measured growth (``scale_history``). Each rank also runs,
in a separate scope and without the communicator, the calibration alone on its own first
batch (``local_start``). A third run, in its own scope, feeds rank 0 a first batch
holding ``1e5`` (beyond float16: its loss is inf) and every other rank an ordinary one:
no rank sets a scale from step 0, and step 1 measures on every rank (``huge``). The
communicator's ``all_reduce`` calls of each step of the measured run are counted
(``all_reduces``), and the info lines of ``scale="auto"`` each run logs are kept
(``huge_lines``, ``lines``).
Results go to OUTDIR/rank{r}.npz and OUTDIR/rank{r}.json.
"""
import logging
import sys
from pathlib import Path

import numpy as np

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla.solvers as S
from nnabla.ext_utils import get_extension_context

from nnabla.logger import logger

from nnabla_mpt import DynamicLossScalingUpdater, GradientReduction, MPICommunicator
from worker_common import save

STEPS, SPIKE = 14, {6, 7}
outdir = Path(sys.argv[1])
comm = MPICommunicator()
rank, size = comm.rank, comm.size
nn.set_default_context(get_extension_context("cpu", type_config="half"))


class AutoLines(logging.Handler):
    """Keeps the messages of ``scale="auto"``."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        if "scale='auto'" in record.getMessage():
            self.lines.append(record.getMessage())


auto_lines = AutoLines()
logger.addHandler(auto_lines)
logger.setLevel(logging.INFO)


def batch(step):
    data = np.random.RandomState(1000 * rank + step)
    factor = 4.0 if rank == size - 1 else 1.0
    if rank == size - 1 and step in SPIKE:
        factor *= 10.0
    return data.randn(4, 6) * factor, data.randn(4, 3)


def build(scope):
    x, t = nn.Variable((4, 6)), nn.Variable((4, 3))
    with nn.parameter_scope(scope):
        h = F.relu(PF.affine(x, 8, name="fc1"))
        loss = F.mean(F.squared_error(PF.affine(h, 3, name="fc2"), t))
        params = nn.get_parameters()
    rng = np.random.RandomState(0)
    for v in params.values():
        v.d = rng.randn(*v.shape) * 0.5
    solver = S.Sgd(lr=0.01)
    solver.set_parameters(params)
    return x, t, loss, params, solver


# The calibration alone, on this rank's first batch.
lx, lt, lloss, _, lsolver = build("alone")
lx.d, lt.d = batch(0)
local = DynamicLossScalingUpdater(lsolver, lloss, None, scale="auto")
local_start = local.update().scale
auto_lines.lines = []

# A first batch that cannot be measured on rank 0 only.
hx, ht, hloss, hparams, hsolver = build("huge")
comm.broadcast_parameters(hparams)


def huge_feed():
    xs, ts = batch(huge.steps)
    if rank == 0 and huge.steps == 0:
        xs[0, 0] = 1e5
    hx.d, ht.d = xs, ts


huge = DynamicLossScalingUpdater(hsolver, hloss, huge_feed, scale="auto", N=1000,
                                 comm=comm, reduction=GradientReduction(average_ranks=True))
huge_steps = [huge.update() for _ in range(2)]
huge_meta = [(bool(r.skipped), r.scale, r.next_scale) for r in huge_steps]
huge_pending = huge.state_dict()["calibration_pending"]
huge_lines, auto_lines.lines = auto_lines.lines, []

x, t, loss, params, solver = build("net")
comm.broadcast_parameters(params)
calls = []
real_all_reduce = comm.all_reduce


def counted_all_reduce(*args, **kwargs):
    calls.append(1)
    return real_all_reduce(*args, **kwargs)


comm.all_reduce = counted_all_reduce


def feed():
    x.d, t.d = batch(updater.steps)


updater = DynamicLossScalingUpdater(solver, loss, feed, scale="auto", N=3,
                                    growth_mode="measured", gradient_stats_every=4,
                                    comm=comm, reduction=GradientReduction(average_ranks=True))
meta = {"rank": rank, "size": size, "local_start": local_start, "skipped": [], "scale": [],
        "next_scale": [], "stats_steps": [], "stats_max_abs": [], "loss": [],
        "local_loss": [], "huge": huge_meta, "huge_pending": huge_pending, "huge_lines": huge_lines,
        "all_reduces": []}
for _ in range(STEPS):
    before = len(calls)
    r = updater.update()
    meta["all_reduces"].append(len(calls) - before)
    meta["skipped"].append(bool(r.skipped))
    meta["scale"].append(r.scale)
    meta["next_scale"].append(r.next_scale)
    meta["loss"].append(r.loss)
    meta["local_loss"].append(float(loss.d))      # this rank's batch (one micro-batch)
    if r.gradient_stats is not None:
        meta["stats_steps"].append(r.step)
        meta["stats_max_abs"].append(max(s.max_abs for s in r.gradient_stats.values()))
meta["scale_history"] = updater.state_dict()["scale_history"]
meta["lines"] = auto_lines.lines
save(outdir, rank, {f"param/{k}": v.d.copy() for k, v in params.items()}, meta)

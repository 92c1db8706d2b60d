"""MPI worker: saturation mode over a reduction that cannot saturate. Every rank trains on
the same batch at learning rate 0, summing over the ranks (no average): each rank's own
gradients are those of one process, so the ranks must take one process's steps and scales.

Usage: mpiexec -n N python saturation.py OUTDIR COMM PRECISION STEPS

COMM "standin": ``standins.NcclLikeCommunicator("float32")``, nnabla's communicator made
    from a float context (it reduces in float32, casting the arrays it is given);
    "mpi": an ``MPICommunicator``; "none": no communicator (one process).
PRECISION "half" or "float": the graph's. Every rank writes OUTDIR/rank{r}.json with the
    scale each step ran with and the steps skipped.
"""
import json
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla.solvers as S
from nnabla.ext_utils import get_extension_context

from nnabla_mpt import DynamicLossScalingUpdater, MPICommunicator, OverflowHandling
from standins import NcclLikeCommunicator

outdir, kind, precision, steps = Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
comm = {"standin": lambda: NcclLikeCommunicator("float32", MPI.COMM_WORLD),
        "mpi": lambda: MPICommunicator(abort_on_exception=False),
        "none": lambda: None}[kind]()
with nn.context_scope(get_extension_context("cpu", type_config=precision)):
    x, t = nn.Variable((4, 6)), nn.Variable((4, 3))
    loss = F.mean(F.squared_error(PF.affine(x, 3, name="fc", rng=np.random.RandomState(0)),
                                  t))
    solver = S.Sgd(lr=0.0)
solver.set_parameters(nn.get_parameters())
data = np.random.RandomState(7)                # the same batch on every rank, every step
batch = data.randn(4, 6) * 3.0, data.randn(4, 3)


def feed():
    x.d, t.d = batch


updater = DynamicLossScalingUpdater(solver, loss, feed, scale=256.0, N=1, comm=comm,
                                    overflow=OverflowHandling(mode="saturation",
                                                              floor_policy="ignore"))
results = [updater.update() for _ in range(steps)]
rank = 0 if comm is None else comm.rank
(outdir / f"rank{rank}.json").write_text(json.dumps({
    "scales": [r.scale for r in results], "skipped": [r.step for r in results if r.skipped]}))

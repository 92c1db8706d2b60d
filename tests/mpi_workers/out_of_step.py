"""MPI worker: one rank resumes from a stale state, so its steps are paired with the
others' steps of another index.

Usage: mpiexec -n N python out_of_step.py OUTDIR COMM

COMM "mpi" (MPICommunicator) or "float16" (standins.NcclLikeCommunicator reducing in
float16). Every rank trains three steps and keeps its state, then two more; the last
rank then loads the state of step 3 (a stale checkpoint), and every rank takes one more
step. Each rank writes OUTDIR/rank{r}.json with the error that step raised (or None) and
its parameters' sum.
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

from nnabla_mpt import DynamicLossScalingUpdater, MPICommunicator
from standins import NcclLikeCommunicator

outdir, kind = Path(sys.argv[1]), sys.argv[2]
comm = MPICommunicator() if kind == "mpi" else NcclLikeCommunicator("float16", MPI.COMM_WORLD)
rank, size = comm.rank, comm.size
nn.random.seed(0)
x, t = nn.Variable((4, 6)), nn.Variable((4, 3))
loss = F.mean(F.squared_error(PF.affine(F.relu(PF.affine(x, 8, name="fc1")), 3, name="fc2"),
                              t))
solver = S.Sgd(lr=0.1)
solver.set_parameters(nn.get_parameters())


def feed():
    data = np.random.RandomState(100 * rank + updater.steps)
    x.d, t.d = data.randn(4, 6), data.randn(4, 3)


updater = DynamicLossScalingUpdater(solver, loss, feed, scale=8.0, comm=comm)
for _ in range(3):
    updater.update()
stale = updater.state_dict()
for _ in range(2):
    updater.update()
if rank == size - 1:
    updater.load_state_dict(stale)
error = None
try:
    updater.update()
except RuntimeError as e:
    error = str(e)
(outdir / f"rank{rank}.json").write_text(json.dumps(
    {"error": error, "steps": updater.steps,
     "params": float(sum(np.abs(v.d).sum() for v in nn.get_parameters().values()))}))

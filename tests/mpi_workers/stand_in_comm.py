"""MPI worker: the updater with a communicator that is not an MPICommunicator, the stand-in
for nnabla's ``MultiProcessDataParallelCommunicator`` (CUDA only, so not available here):
``standins.NcclLikeCommunicator``, whose ``abort()`` is ``MPI_Abort``.

Usage: mpiexec -n N python stand_in_comm.py OUTDIR MODE [ARGS]

MODE "raise" RANK STEP: float network trained with the default options; the data feeder
    of rank RANK raises at step STEP. Every rank writes OUTDIR/rank{r}_step{i} after each
    step it completes and OUTDIR/finished{r} at the end (none must get that far).
MODE "hook" FLAG: builds the updater with abort_on_exception=FLAG ("True" or "False"),
    takes two steps, and writes OUTDIR/rank{r}.json telling whether sys.excepthook changed.
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

from nnabla_mpt import DynamicLossScalingUpdater, GradientReduction
from standins import NcclLikeCommunicator


outdir, mode, args = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
comm = NcclLikeCommunicator("float32", MPI.COMM_WORLD)
rank = comm.rank
nn.random.seed(0)        # the same initial parameters on every rank
x, t = nn.Variable((4, 6)), nn.Variable((4, 3))
loss = F.mean(F.squared_error(PF.affine(F.relu(PF.affine(x, 8, name="fc1")), 3, name="fc2"),
                          t))
solver = S.Sgd(lr=0.1)
solver.set_parameters(nn.get_parameters())
fail_rank, fail_step = (int(args[0]), int(args[1])) if mode == "raise" else (-1, -1)


def feed():
    if rank == fail_rank and updater.steps == fail_step:
        raise RuntimeError(f"data loader failed on rank {rank} at step {fail_step}")
    data = np.random.RandomState(1000 * rank + updater.steps)
    x.d, t.d = data.randn(4, 6), data.randn(4, 3)


if mode == "raise":
    updater = DynamicLossScalingUpdater(solver, loss, feed, comm=comm)
    for i in range(10):
        updater.update()
        (outdir / f"rank{rank}_step{i}").write_text("")
    (outdir / f"finished{rank}").write_text("")
elif mode == "hook":
    before = sys.excepthook
    updater = DynamicLossScalingUpdater(solver, loss, feed, comm=comm,
                                        reduction=GradientReduction(
                                            abort_on_exception={"True": True,
                                                            "False": False}[args[0]]))
    for _ in range(2):
        updater.update()
    (outdir / f"rank{rank}.json").write_text(json.dumps({
        "hook_changed": sys.excepthook is not before, "steps": updater.steps}))
else:
    raise SystemExit(f"unknown mode {mode!r}")

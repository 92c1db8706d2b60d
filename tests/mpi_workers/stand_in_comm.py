"""MPI worker: the updater with a communicator that is not an MPICommunicator, standing in
for nnabla's ``MultiProcessDataParallelCommunicator`` (CUDA only, so not available here).

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

from nnabla_mpt import DynamicLossScalingUpdater


class StandInCommunicator:
    """Reproduces two documented behaviours of nnabla's MultiProcessDataParallelCommunicator
    and nothing more: ``all_reduce(data, division, inplace)`` sums the arrays over the
    ranks in place (divided by the number of ranks with ``division``), and ``abort()``
    calls ``MPI_Abort`` on the world communicator. It is no MPICommunicator, so it brings
    no exception hook of its own."""

    name = "StandInCommunicator"

    def __init__(self):
        self._world = MPI.COMM_WORLD
        self.rank = self.local_rank = self._world.Get_rank()
        self.size = self._world.Get_size()

    def all_reduce(self, data, division=False, inplace=False, group="world"):
        for array in (data if isinstance(data, (list, tuple)) else [data]):
            mine = np.ascontiguousarray(array.data)
            total = np.empty_like(mine)
            self._world.Allreduce(mine, total, op=MPI.SUM)
            array.data = total / self.size if division else total

    def barrier(self):
        self._world.Barrier()

    def abort(self):
        self._world.Abort(1)


outdir, mode, args = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
comm = StandInCommunicator()
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
                                        abort_on_exception={"True": True,
                                                            "False": False}[args[0]])
    for _ in range(2):
        updater.update()
    (outdir / f"rank{rank}.json").write_text(json.dumps({
        "hook_changed": sys.excepthook is not before, "steps": updater.steps}))
else:
    raise SystemExit(f"unknown mode {mode!r}")

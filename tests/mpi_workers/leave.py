"""MPI worker: a rank leaves or stalls while the others step, under
``MPICommunicator(timeout=2)``.

Usage: mpiexec -n N python leave.py OUTDIR MODE

MODE, for rank 1 at step 3 (of 8): "exit3" sys.exit(3); "exit0" sys.exit(0);
"end" its own loop ends; "stall" it sleeps 60 s; "raise" its data feeder raises;
"caught" its data feeder raises once and the script goes on (one update() fewer);
"kill9" it is killed (SIGKILL); "sigterm" it is terminated (SIGTERM); "model" (at
construction) it builds another model. "evaluate": every rank takes all steps, then
rank 0 evaluates (sleeps) for three times the timeout with no collective pending, and
the job must end normally. Every rank writes OUTDIR/rank{r}_step{i} after
each step and OUTDIR/done{r} at its end.
"""
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla.solvers as S

from nnabla_mpt import DynamicLossScalingUpdater, MPICommunicator

TIMEOUT, STEPS, FAULT_STEP = 2.0, 8, 3
outdir, mode = Path(sys.argv[1]), sys.argv[2]
comm = MPICommunicator(timeout=TIMEOUT)
rank = comm.rank
nn.random.seed(0)
x, t = nn.Variable((4, 6)), nn.Variable((4, 3))
hidden = 9 if mode == "model" and rank == 1 else 8
loss = F.mean(F.squared_error(PF.affine(F.relu(PF.affine(x, hidden, name="fc1")), 3,
                                        name="fc2"), t))
solver = S.Sgd(lr=0.1)
solver.set_parameters(nn.get_parameters())


failed = []


def feed():
    if rank == 1 and updater.steps == FAULT_STEP and mode in ("raise", "caught") \
            and not failed:
        failed.append(True)
        raise RuntimeError(f"rank {rank}: the data loader failed at step {FAULT_STEP}")
    data = np.random.RandomState(100 * rank + updater.steps)
    x.d, t.d = data.randn(4, 6), data.randn(4, 3)


updater = DynamicLossScalingUpdater(solver, loss, feed, comm=comm)
for i in range(STEPS):
    if rank == 1 and i == FAULT_STEP:
        if mode == "exit3":
            sys.exit(3)
        if mode == "exit0":
            sys.exit(0)
        if mode == "end":
            break
        if mode == "stall":
            time.sleep(60)
        if mode in ("kill9", "sigterm"):
            os.kill(os.getpid(), signal.SIGKILL if mode == "kill9" else signal.SIGTERM)
    if mode == "caught" and rank == 1 and i == FAULT_STEP:
        try:
            updater.update()
        except RuntimeError:
            pass           # the script goes on with the next batch: one update() fewer
        continue
    updater.update()
    (outdir / f"rank{rank}_step{i}").write_text("")
if mode == "evaluate" and rank == 0:
    time.sleep(3 * TIMEOUT)
(outdir / f"done{rank}").write_text("")

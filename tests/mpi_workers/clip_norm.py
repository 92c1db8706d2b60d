"""MPI worker: global-norm clipping where the norm of the reduced gradients is not finite.

Usage: mpiexec -n N python clip_norm.py OUTDIR MODE

The network is ``loss = sum(x * w)``, so the gradient of ``w`` is the loss scale times
``x``. MODE "clip" trains with ``clip_grad_norm=1``; at step 2 the last rank's batch holds
two values of 1e38, whose scaled gradients (4e38 at scale 4) overflow float32: the
reduced gradients hold inf, so does their norm, and every rank must skip step 2 as an
overflow. (Finite gradients, however large, have a finite norm: they are clipped and
applied, see tests/step/test_clip_norm.py.) MODE "saturation" adds
``overflow=OverflowHandling(mode="saturation")`` (each rank's own gradients are checked
before the reduce too) and two values of 2e37, finite even scaled: the last rank's values
saturate, so every rank skips.
Results go to OUTDIR/rank{r}.npz and OUTDIR/rank{r}.json.
"""
import sys
from pathlib import Path

import numpy as np

import nnabla as nn
import nnabla.functions as F
import nnabla.solvers as S

from nnabla_mpt import DynamicLossScalingUpdater, MPICommunicator, OverflowHandling
from worker_common import save

outdir, mode = Path(sys.argv[1]), sys.argv[2]
comm = MPICommunicator()
rank, size = comm.rank, comm.size

x = nn.Variable((8,))
w = nn.parameter.get_parameter_or_create("w", (8,), need_grad=True)
w.d = 1e-3
loss = F.sum(x * w)
solver = S.Momentum(0.1, 0.9)
solver.set_parameters({"w": w})
updater = None


def feed():
    data = np.random.RandomState(10 * rank + updater.steps).rand(8).astype(np.float32)
    if updater.steps == 2 and rank == size - 1:
        data[:2] = 1e38 if mode == "clip" else 2e37
    x.d = data


extra = {"overflow": OverflowHandling(mode="saturation")} if mode == "saturation" else {}
updater = DynamicLossScalingUpdater(solver, loss, feed, scale=4.0, clip_grad_norm=1.0,
                                    comm=comm, **extra)
results, before_skip = [], None
for step in range(4):
    if step == 2:
        before_skip = w.d.copy()
    r = updater.update()
    results.append([r.skipped, r.scale, r.next_scale])
    if step == 2:
        after_skip = w.d.copy()
save(outdir, rank, {"w": w.d, "before_skip": before_skip, "after_skip": after_skip},
     {"results": results, "overflow_streak": updater.longest_overflow_streak})

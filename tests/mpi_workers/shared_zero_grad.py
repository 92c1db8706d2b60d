"""MPI worker: the updater with gradients in shared memory, and ``solver.zero_grad()``
(or ``.grad.zero()`` of each parameter) called by the script between its steps.

Usage: mpiexec -n N python shared_zero_grad.py OUTDIR

Trains one float MLP four times from the same start, each rank on its own batches: with
the gradients shared or not, and with the script dropping the gradients' memory between
steps or not. Writes OUTDIR/rank{r}.npz (the parameters of each run) and .json (the
shared gradients' ``n_replaced`` of the runs that share).
"""
import sys

import numpy as np

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla.solvers as S

from nnabla_mpt import DynamicLossScalingUpdater, GradientReduction, MPICommunicator
from worker_common import save

outdir = sys.argv[1]
comm = MPICommunicator()
out, meta = {}, {}
for shared in (False, True):
    for meddle in ("none", "zero_grad", "grad.zero"):
        tag = f"{'shared' if shared else 'copied'}_{meddle}"
        nn.clear_parameters()
        x, t = nn.Variable((4, 3)), nn.Variable((4, 2))
        with nn.parameter_scope(tag):
            loss = F.mean(F.squared_error(PF.affine(F.tanh(PF.affine(x, 6, name="h")), 2,
                                                    name="o"), t))
            params = nn.get_parameters()
        rng = np.random.RandomState(0)
        for v in params.values():
            v.d = rng.uniform(-1, 1, v.shape)
        solver = S.Momentum(0.1, 0.9)
        solver.set_parameters(params)
        data = np.random.RandomState(100 + comm.rank)

        def feed():
            x.d, t.d = data.randn(4, 3), data.randn(4, 2)

        updater = DynamicLossScalingUpdater(solver, loss, feed, scale=8.0, comm=comm,
                                            reduction=GradientReduction(shared_grads=shared))
        for step in range(4):
            updater.update()
            if meddle == "zero_grad":
                solver.zero_grad()
            elif meddle == "grad.zero":
                for v in params.values():
                    v.grad.zero()
        for name, v in params.items():
            out[f"{tag}/{name}"] = v.d.copy()
        if shared:
            meta[tag] = updater.shared_gradients.n_replaced
save(outdir, comm.rank, out, meta)

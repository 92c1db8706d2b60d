"""MPI worker: ranks that would exchange different gradients must be told, alike.

Usage: mpiexec -n N python mismatch.py OUTDIR MODE
MODE "order": the last rank passes grads in another order (arrays of the same sizes);
MODE "names": one of the last rank's parameters has another name (same shapes);
MODE "same": every rank alike (the control: no error).
Each rank records the ValueError of the updater's construction (or None) in rank{r}.json.
"""
import sys

import numpy as np

import nnabla as nn
import nnabla.parametric_functions as PF
import nnabla.functions as F
import nnabla.solvers as S

from nnabla_mpt import DynamicLossScalingUpdater, MPICommunicator
from worker_common import save

outdir, mode = sys.argv[1], sys.argv[2]
comm = MPICommunicator()
last = comm.rank == comm.size - 1
x = nn.Variable.from_numpy_array(np.ones((2, 4), np.float32))
first = "c" if (mode == "names" and last) else "a"
with nn.parameter_scope("net"):
    # two layers with weights of the same size (4x4): swapped, they still sum "fine"
    loss = F.mean(PF.affine(F.relu(PF.affine(x, 4, name=first)), 4, name="b"))
    params = nn.get_parameters()
solver = S.Sgd(0.1)
solver.set_parameters(params)
grads = [v.grad for v in params.values()]
if mode == "order" and last:
    grads = grads[::-1]
try:
    DynamicLossScalingUpdater(solver, loss, None, scale=8.0, comm=comm, grads=grads)
    error = None
except ValueError as e:
    error = str(e)
save(outdir, comm.rank, {}, {"rank": comm.rank, "error": error})

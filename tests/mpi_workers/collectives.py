"""MPI worker: exercises MPICommunicator's collectives and saves inputs and outputs.

Usage: mpiexec -n N python collectives.py OUTDIR
Writes OUTDIR/rank{r}.npz (arrays) and OUTDIR/rank{r}.json (metadata) on every rank.
"""
import sys

import numpy as np

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla.solvers as S
from nnabla.ext_utils import get_extension_context

from nnabla_mpt import MPICommunicator
from worker_common import ndarray, save

outdir = sys.argv[1]
comm = MPICommunicator()
r, n = comm.rank, comm.size
out = {}
meta = {"rank": r, "size": n, "local_rank": comm.local_rank, "local_size": comm.local_size,
        "name": comm.name}

# -- float32 sum and average of several arrays of different shapes, one call each
shapes = [(3,), (4, 5), (2, 3, 4), (1,), (7, 1)]
for tag, division in (("sum32", False), ("avg32", True)):
    rng = np.random.RandomState(100 + r)
    xs = [rng.randn(*s).astype(np.float32) for s in shapes]
    nds = [ndarray(x) for x in xs]
    c0, a0 = comm.n_collectives, comm.n_all_reduce_calls
    comm.all_reduce(nds, division=division)
    meta[f"{tag}_collectives"] = comm.n_collectives - c0
    meta[f"{tag}_calls"] = comm.n_all_reduce_calls - a0
    meta[f"{tag}_dtypes"] = [str(a.dtype) for a in nds]
    for i, (x, a) in enumerate(zip(xs, nds)):
        out[f"{tag}_in{i}"] = x
        out[f"{tag}_out{i}"] = a.data.copy()

# -- float16 values whose sum overflows float16 but whose average does not
x16 = np.array([60000, 48000 + 1024 * r, -60000, 1.5 + r, 0.25 * r], np.float16)
for tag, division in (("avg16", True), ("sum16", False)):
    a = ndarray(x16, np.float16)
    comm.all_reduce([a], division=division)
    out[f"{tag}_in"] = x16
    out[f"{tag}_out"] = a.get_data("r").copy()
    meta[f"{tag}_dtype"] = str(a.dtype)

# -- mixed dtypes plus a one-element flag, like a loss-scaling updater sends them
rng = np.random.RandomState(200 + r)
mixed_in = [rng.randn(6).astype(np.float16), rng.randn(2, 2).astype(np.float32),
            rng.randn(3).astype(np.float16), np.array([float(r == n - 1)], np.float32)]
mixed = [ndarray(x, x.dtype) for x in mixed_in]
comm.all_reduce(mixed, division=False, inplace=True)
meta["mixed_dtypes"] = [str(a.dtype) for a in mixed]
for i, (x, a) in enumerate(zip(mixed_in, mixed)):
    out[f"mixed_in{i}"] = x
    out[f"mixed_out{i}"] = a.get_data("r").copy()

# -- a single NdArray (not in a list), and inplace=True/False: a numpy view taken before
#    the call sees the result in both cases, as with nnabla's communicators
for tag, inplace in (("inplace_true", True), ("inplace_false", False)):
    a = ndarray(np.full(4, r + 1.0, np.float32))
    view = a.data
    comm.all_reduce(a, division=False, inplace=inplace)
    out[f"{tag}_view"] = view.copy()
    out[f"{tag}_out"] = a.data.copy()

# -- fused: 50 arrays in one call cost one all_reduce call and one collective sequence
many = [ndarray(np.full(k + 1, float(r), np.float32)) for k in range(50)]
c0, a0 = comm.n_collectives, comm.n_all_reduce_calls
comm.all_reduce(many)
meta["fused50_collectives"] = comm.n_collectives - c0
meta["fused50_calls"] = comm.n_all_reduce_calls - a0
out["fused50_out"] = np.concatenate([a.data for a in many])

# -- bitwise agreement: wide dynamic range so that summation order matters
for alg in ("reduce_scatter", "reduce_bcast"):
    c = MPICommunicator(algorithm=alg)
    rng = np.random.RandomState(300 + r)
    x = (rng.randn(20011) * 10.0 ** rng.uniform(-6, 6, 20011)).astype(np.float32)
    parts = np.split(x, [5, 1000, 1001, 9000])
    nds = [ndarray(p) for p in parts]
    c.all_reduce(nds)
    out[f"bits_{alg}_in"] = x
    out[f"bits_{alg}_out"] = np.concatenate([a.data for a in nds])
    # ranks that pass different data, or the same sizes in another order: the same
    # ValueError on every rank (not an MPI error on some), and the communicator works on
    for tag, data in (("sizes", [np.ones(5 + r, np.float32)]),
                      ("order", [np.ones(2, np.float32), np.ones(4, np.float32)][::1 - 2 * (r > 0)])):
        try:
            c.all_reduce([ndarray(x) for x in data])
            meta[f"mismatch_{alg}_{tag}"] = None
        except ValueError as e:
            meta[f"mismatch_{alg}_{tag}"] = str(e)
    after = ndarray(np.full(3, r + 1.0, np.float32))
    c.all_reduce(after)
    out[f"after_mismatch_{alg}"] = after.data.copy()
    # what the ranks do not compare: an array's own dtype (float16 here, float32 there,
    # both summed in float32) and two arrays of equal size swapped; summed as given
    mixed = ndarray(np.full(4, r + 1.0, np.float16 if r == 0 else np.float32),
                    np.float16 if r == 0 else np.float32)
    c.all_reduce([mixed])
    out[f"uncompared_{alg}_dtype"] = mixed.get_data("r").astype(np.float32)
    pair = [np.full(3, 1.0, np.float32), np.full(3, 10.0, np.float32)]
    swapped = [ndarray(x) for x in (pair if r == 0 else pair[::-1])]
    c.all_reduce(swapped)
    out[f"uncompared_{alg}_swap"] = np.concatenate([a.data for a in swapped])

# -- bcast from the last rank: float32 and float16; a receiver whose array is float32
#    where the sender's is float16 takes the sender's dtype
src = n - 1
rng = np.random.RandomState(400 + r)
b_in = [rng.randn(3, 3).astype(np.float32), rng.randn(5).astype(np.float16),
        rng.randn(4).astype(np.float16 if r == src else np.float32)]
b = [ndarray(x, x.dtype) for x in b_in]
calls0 = comm.n_bcast_calls
comm.bcast(b, src=src)
meta["bcast_calls"] = comm.n_bcast_calls - calls0
meta["bcast_dtypes"] = [str(a.dtype) for a in b]
for i, (x, a) in enumerate(zip(b_in, b)):
    out[f"bcast_in{i}"] = x
    out[f"bcast_out{i}"] = a.get_data("r").copy()

# -- bcast with shapes that differ between ranks: the same ValueError on every rank
try:
    comm.bcast([ndarray(np.zeros(3 + (r == 1), np.float32))], src=0)
    meta["bcast_mismatch_error"] = None
except ValueError as e:
    meta["bcast_mismatch_error"] = str(e)

# -- broadcast_parameters: every rank initialises differently, then takes rank 0's values
x = nn.Variable((2, 6))
with nn.parameter_scope("bp"):
    h = F.relu(PF.affine(x, 5, name="l1"))
    y = PF.affine(h, 3, name="l2")
params = nn.get_parameters()
rng = np.random.RandomState(500 + r)
for k, v in params.items():
    v.d = rng.randn(*v.shape)
    out[f"bp_before/{k}"] = v.d.copy()
comm.broadcast_parameters(params)
for k, v in params.items():
    out[f"bp_after/{k}"] = v.d.copy()
nn.clear_parameters()

# -- float16 gradients of a half-precision graph: reduce, then an SGD step reads them
nn.set_default_context(get_extension_context("cpu", type_config="half"))
x = nn.Variable((4, 6))
x.d = np.random.RandomState(700 + r).randn(4, 6)
with nn.parameter_scope("half"):
    loss = F.mean(F.squared_error(PF.affine(x, 3, name="fc"), F.constant(0.5, (4, 3))))
rng = np.random.RandomState(600)  # same initial parameters on every rank
for v in nn.get_parameters().values():
    v.d = rng.randn(*v.shape)
solver = S.Sgd(lr=0.5)
solver.set_parameters(nn.get_parameters())
solver.zero_grad()
loss.forward()
loss.backward(8.0)
grads = solver.get_parameters()
for k, v in grads.items():
    out[f"half_param0/{k}"] = v.d.copy()
    out[f"half_gin/{k}"] = v.grad.get_data("r").copy()
comm.all_reduce([v.grad for v in grads.values()], division=True)
meta["half_grad_dtypes"] = {k: str(v.grad.dtype) for k, v in grads.items()}
for k, v in grads.items():
    out[f"half_gout/{k}"] = v.grad.get_data("r").copy()
solver.update()
for k, v in grads.items():
    out[f"half_param1/{k}"] = v.d.copy()

meta["n_all_reduce_calls"] = comm.n_all_reduce_calls
save(outdir, r, out, meta)

"""MPI worker: gradients placed in shared memory by MPICommunicator.share_grads.

Usage: mpiexec -n N python shared_grads.py OUTDIR
Writes OUTDIR/rank{r}.npz and OUTDIR/rank{r}.json on every rank.
"""
import sys

import numpy as np

import nnabla as nn
from nnabla.ext_utils import get_extension_context

from nnabla_mpt import MPICommunicator
from worker_common import collected_warnings, save

outdir = sys.argv[1]
comm = MPICommunicator()
r, n = comm.rank, comm.size
ctx = get_extension_context("cpu")
out, meta = {}, {}

warnings = collected_warnings()

# Five parameters; the largest spans more than one 2 MiB chunk of the copying scheme, so
# that copying would cost more than two barriers. Values over a wide range: the
# summation order shows in the bits.
shapes = [(600, 1000), (7,), (3, 5, 2), (1,), (1000, 100)]
params = [nn.Variable(s) for s in shapes]
rng = np.random.RandomState(30 + r)


def fill(tag):
    values = []
    for i, v in enumerate(params):
        x = (rng.randn(*v.shape) * 10.0 ** rng.uniform(-3, 3, v.shape)).astype(np.float32)
        v.g = x
        values.append(x)
        out[f"{tag}_in{i}"] = x
    return values


def grads_of(tag):
    for i, v in enumerate(params):
        out[f"{tag}_out{i}"] = v.g.copy()


def ptrs():
    return [v.grad.data_ptr(np.float32, ctx, False) for v in params]


def counters():
    return comm.n_collectives, comm._shm.in_place_calls


# -- values present before share_grads are kept; every .grad is now a shared array
before = fill("kept")
shared = comm.share_grads(params)
meta["kept"] = all(np.array_equal(v.g, x) for v, x in zip(params, before))
meta["grads_are_arrays"] = all(v.grad == a for v, a in zip(params, shared.arrays))
gap = [b - a for a, b in zip(ptrs()[:-1], ptrs()[1:])]
meta["pointer_gaps"] = gap

# -- one call on all of them: reduced in place, two barriers, no copy anywhere


def call(tag, arrays, division=False):
    c0, i0 = counters()
    p0 = ptrs()
    comm.all_reduce(arrays, division=division)
    c1, i1 = counters()
    meta[f"{tag}_collectives"] = c1 - c0
    meta[f"{tag}_in_place"] = i1 - i0
    meta[f"{tag}_same_pointers"] = ptrs() == p0


fill("all")
call("all", shared.arrays, division=True)
grads_of("all")

# -- a run of consecutive arrays, and a single array: in place too, the others untouched
fill("run")
call("run", shared.arrays[1:4])
grads_of("run")
fill("one")
call("one", [shared.arrays[4]])
grads_of("one")

# -- arrays that are not consecutive: reduced by copying, same result
fill("gap")
call("gap", [shared.arrays[0], shared.arrays[2]])
grads_of("gap")

# -- rank 0's second gradient leaves the shared memory (nnabla's zero() drops the memory):
#    the ranks disagree about the place, so every rank copies, and the sums are the same
fill("moved")
if r == 0:
    keep = params[1].g.copy()
    params[1].grad.zero()
    params[1].g = keep
meta["moved_pointer_differs"] = ptrs()[1] != shared._region.ptrs[1]
call("moved", [v.grad for v in params])
grads_of("moved")

# -- zero() puts it back (on rank 0 only) and zeroes everything in place
shared.zero()
meta["zeroed"] = all(not np.any(v.g) for v in params)
meta["replaced_after_move"] = shared.n_replaced
meta["back_in_place"] = ptrs() == shared._region.ptrs
meta["arrays_renewed"] = all(v.grad == a for v, a in zip(params, shared.arrays))
fill("again")
call("again", shared.arrays)
grads_of("again")

# -- solver.zero_grad()-like drops at three zero() calls in a row: one warning
for _ in range(4):
    params[0].grad.zero()
    shared.zero()
meta["replaced_total"] = shared.n_replaced
meta["warnings"] = list(warnings)

# -- errors
errors = {}
for tag, fn in (
        ("not_variable", lambda: comm.share_grads([params[0].grad])),
        ("twice", lambda: comm.share_grads({"a": params[0], "b": params[0]})),
        ("empty", lambda: comm.share_grads([])),
        ("wrong_type", lambda: comm.share_grads(params[0])),
        ("algorithm", lambda: MPICommunicator(algorithm="reduce_scatter").share_grads(params))):
    try:
        fn()
        errors[tag] = None
    except (TypeError, ValueError) as e:
        errors[tag] = f"{type(e).__name__}: {e}"
meta["errors"] = errors

save(outdir, r, out, meta)

"""MPI worker: MPICommunicator's shared-memory reduction, beyond the basic collectives.

Usage: mpiexec -n N python shared_memory.py OUTDIR
Writes OUTDIR/rank{r}.npz and OUTDIR/rank{r}.json on every rank.
"""
import sys

import numpy as np

from nnabla_mpt import MPICommunicator
from worker_common import ndarray, save

outdir = sys.argv[1]
comm = MPICommunicator()
r, n = comm.rank, comm.size
out = {}
meta = {"algorithm": comm.algorithm,
        "explicit": [MPICommunicator(algorithm=a).algorithm
                     for a in ("shared_memory", "reduce_scatter", "reduce_bcast")]}


def run(tag, inputs, division=False):
    """all_reduce of ``inputs`` (numpy arrays); saves inputs, outputs, dtypes, collectives."""
    nds = [ndarray(x, x.dtype) for x in inputs]
    c0 = comm.n_collectives
    comm.all_reduce(nds, division=division)
    meta[f"{tag}_collectives"] = comm.n_collectives - c0
    meta[f"{tag}_dtypes"] = [str(a.dtype) for a in nds]
    for i, (x, a) in enumerate(zip(inputs, nds)):
        out[f"{tag}_in{i}"] = x
        out[f"{tag}_out{i}"] = a.get_data("r").copy() if a.size else np.zeros(0, x.dtype)


# -- several chunks of the window: a float16 array straddles a chunk boundary (at
#    1,048,576 elements for 2 or 4 MiB areas), and so do the float32 ones; an empty array
#    and a one-element flag; values over a wide range so that the summation order matters
rng = np.random.RandomState(10 + r)
wide = (rng.randn(1_000_000) * 10.0 ** rng.uniform(-3, 3, 1_000_000)).astype(np.float32)
half = (rng.randn(100_000) * 300).astype(np.float16)
rest = (rng.randn(1_500_000) * 10.0 ** rng.uniform(-3, 3, 1_500_000)).astype(np.float32)
run("big", [wide, half, rest, np.zeros(0, np.float32),
            np.array([float(r == n - 1)], np.float32)], division=True)

# -- a float64 array makes the buffer float64 (several chunks)
rng = np.random.RandomState(20 + r)
run("f64", [rng.randn(600_000), rng.randn(10).astype(np.float32)])

# -- inf and NaN travel like any value
x = np.ones(8, np.float32)
x[r] = np.inf if r % 2 == 0 else -np.inf
x[7] = np.nan if r == 0 else 1.0
run("nonfinite", [x])

# -- only empty arrays: nothing to sum, the call still completes on every rank
run("empty", [np.zeros(0, np.float32), np.zeros((0, 3), np.float16)])

# -- successive calls of different sizes reuse the window
for k in range(5):
    run(f"seq{k}", [np.full(3 + 1000 * k, float(r + k), np.float32)])

# -- ranks that pass different data: the same ValueError on every rank, then the
#    communicator still works
for tag, data in (("sizes", [np.ones(5 + r, np.float32)]),
                  ("count", [np.ones(6, np.float32)] if r == 0 else
                            [np.ones(3, np.float32), np.ones(3, np.float32)]),
                  ("order", [np.ones(2, np.float32), np.ones(4, np.float32)][::1 - 2 * (r > 0)])):
    try:
        comm.all_reduce([ndarray(x) for x in data])
        meta[f"mismatch_{tag}"] = None
    except ValueError as e:
        meta[f"mismatch_{tag}"] = str(e)
run("after_mismatch", [np.full(4, r + 1.0, np.float32)])

save(outdir, r, out, meta)

"""MPI worker: one rank fails while the others wait in a collective.

Usage: mpiexec -n N python fail_midway.py OUTDIR MODE
MODE "raise": the last rank raises an exception; the communicator's exception hook must
abort the job. MODE "abort": rank 0 calls comm.abort(3) while the others wait in a barrier.
Every rank writes OUTDIR/started{r} after the first all-reduce and OUTDIR/finished{r} if it
ever gets past the second collective (it must not).
"""
import sys
from pathlib import Path

import numpy as np

from nnabla_mpt import MPICommunicator
from worker_common import ndarray

outdir, mode = Path(sys.argv[1]), sys.argv[2]
comm = MPICommunicator()
a = ndarray(np.ones(8, np.float32))
comm.all_reduce([a])
(outdir / f"started{comm.rank}").write_text(str(a.data[0]))
if mode == "raise":
    if comm.rank == comm.size - 1:
        raise RuntimeError(f"deliberate failure on rank {comm.rank}")
    comm.all_reduce([a])
elif mode == "abort":
    if comm.rank == 0:
        comm.abort(3)
    comm.barrier()
else:
    raise SystemExit(f"unknown mode {mode!r}")
(outdir / f"finished{comm.rank}").write_text("")

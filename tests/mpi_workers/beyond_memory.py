"""MPI worker: shared memory that would not fit is refused before anything is allocated.

Usage: mpiexec -n N python beyond_memory.py OUTDIR
Writes OUTDIR/rank{r}.npz and OUTDIR/rank{r}.json on every rank.

The worker first limits its own address space to ``LIMIT``: should a guard let a request
through, the allocation fails and so does this job, instead of the machine running out of
memory. It asks, with this machine's own figures, for gradients larger than its memory and
``/dev/shm`` together; then, with figures supplied through ``memory_room.read``, for
gradients that fit in ``/dev/shm`` but not in the memory the processes can get, and for an
all-reduce window that does not fit.
"""
import os
import resource
import sys

LIMIT = 4 << 30  # bytes of address space; nnabla and MPI take less than 0.5 GiB here
resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))

import nnabla as nn  # noqa: E402
import nnabla.functions as F  # noqa: E402
import nnabla.solvers as S  # noqa: E402

from nnabla_mpt import DynamicLossScalingUpdater, GradientReduction, MPICommunicator  # noqa: E402
from nnabla_mpt.distributed import memory_room  # noqa: E402
from nnabla_mpt.distributed.shared_arrays import SharedArrays  # noqa: E402
from worker_common import collected_warnings, save  # noqa: E402

outdir = sys.argv[1]
comm = MPICommunicator()
r, n = comm.rank, comm.size
meta, errors = {}, {}
warnings = collected_warnings()


def error_of(fn):
    try:
        fn()
    except ValueError as e:
        return str(e)
    return None


def machine_bytes():
    """This machine's memory and /dev/shm's size together."""
    with open("/proc/meminfo") as f:
        total = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))
    st = os.statvfs("/dev/shm")
    return total + st.f_blocks * st.f_frsize


def updater_with(param):
    small = nn.Variable((3,), need_grad=True)
    small.d = 1.0
    solver = S.Sgd(0.1)
    solver.set_parameters({"small": small, "big": param})
    return solver, F.sum(small ** 2)


# -- this machine's own figures: four times its memory and /dev/shm, spread over the ranks
huge = nn.Variable((4 * machine_bytes() // 4 // n,), need_grad=True)
small = nn.Variable((3,), need_grad=True)
meta["huge_size"] = huge.size
meta["huge_shortfall"] = comm.shared_memory_shortfall([huge])
meta["small_shortfall"] = comm.shared_memory_shortfall([small])
errors["share_grads"] = error_of(lambda: comm.share_grads([huge]))
solver, loss = updater_with(huge)
errors["updater"] = error_of(lambda: DynamicLossScalingUpdater(
    solver, loss, comm=comm, reduction=GradientReduction(shared_grads=True)))
if n > 1:  # the automatic choice: not shared, one warning
    before = len(warnings)
    meta["auto_shared"] = DynamicLossScalingUpdater(solver, loss, comm=comm).shared_gradients \
        is not None
    meta["auto_warnings"] = warnings[before:]

# -- supplied figures: /dev/shm has 1 GiB free, the processes can get 64 MiB
mid = nn.Variable(((48 << 20) // 4 // n,), need_grad=True)  # 48 MiB on this machine
memory_room.read = lambda: memory_room.MemoryRoom(1 << 30, 64 << 20)
errors["memory"] = error_of(lambda: comm.share_grads([mid]))
memory_room.read = lambda: memory_room.MemoryRoom(1 << 30, 64 << 20,
                                                  "the cgroup's memory limit")
errors["cgroup"] = error_of(lambda: comm.share_grads([mid]))
memory_room.read = lambda: memory_room.MemoryRoom(1 << 30, 128 << 20)
meta["half_of_memory_shortfall"] = comm.shared_memory_shortfall([mid])  # 48 <= 64: fits
# only rank 0 is short of memory: every rank refuses, the others saying so
memory_room.read = lambda: memory_room.MemoryRoom(1 << 30, (64 if r == 0 else 1024) << 20)
errors["rank0_short"] = error_of(lambda: comm.share_grads([mid]))
# the all-reduce's window (2 MiB areas, one a rank and one more) in 4 MiB of memory
memory_room.read = lambda: memory_room.MemoryRoom(1 << 30, 4 << 20)
errors["window"] = error_of(lambda: MPICommunicator(algorithm="auto"))

meta["errors"] = errors
meta["windows_allocated"] = len(SharedArrays._windows)
save(outdir, r, {}, meta)

"""How much shared memory the ranks of one machine may still take (:func:`read`,
:class:`MemoryRoom`).

A shared-memory window that does not fit ends the job without an error: where
``/dev/shm`` is full, by ``SIGBUS`` at the first write; where the memory is, by the
kernel's out-of-memory killer, which may take any process of the machine with it. Both
happen on one machine: ``/dev/shm`` is often a tmpfs as large as the machine's memory, so
its free space is memory that the processes need too, and a container's memory limit
(a cgroup's) may lie far below either. So a window is allowed only where it fits in
``/dev/shm``'s free space *and* in half of the memory the processes can still get; the
other half is left for the training itself (the parameters, their solver states and the
activations, which are at least as large as the gradients the window holds).
"""
import os
from typing import NamedTuple, Optional

__all__ = ["MemoryRoom", "read", "shortfall"]

SHM_DIR = "/dev/shm"
# The share of the memory the processes can still get that shared memory may take.
SHARED_SHARE = 0.5
# A cgroup limit at or above this is no limit (cgroup v1 writes 2**63 rounded to pages).
_NO_LIMIT = 2 ** 62


class MemoryRoom(NamedTuple):
    """The two figures that bound a shared-memory window on this machine, in bytes
    (``None`` where the machine does not tell).

    Attributes:
        shm_free: The free space of ``/dev/shm``.
        memory: The memory the processes can still get: the kernel's ``MemAvailable``,
            or what a cgroup's memory limit leaves, whichever is smaller.
        memory_source: Which of the two gave :attr:`memory`.
    """
    shm_free: Optional[int]
    memory: Optional[int]
    memory_source: str = "MemAvailable"

    def allowed(self) -> Optional[int]:
        """The largest window allowed, in bytes: the smaller of :attr:`shm_free` and
        :data:`SHARED_SHARE` of :attr:`memory` (``None`` if neither is known)."""
        return min([b for b in (self.shm_free,
                                None if self.memory is None else int(self.memory * SHARED_SHARE))
                    if b is not None], default=None)

    def fits(self, nbytes: int) -> bool:
        """Whether a window of ``nbytes`` is allowed."""
        allowed = self.allowed()
        return allowed is None or nbytes <= allowed

    def describe(self) -> str:
        """Both figures in words, for a message that refuses a window."""
        shm = "cannot be read" if self.shm_free is None else f"has {mib(self.shm_free)} free"
        if self.memory is None:
            memory = "the memory the processes can get cannot be read"
        else:
            memory = (f"the processes can get {mib(self.memory)} more memory "
                      f"({self.memory_source}), of which at most half may be shared, the "
                      f"rest left for the training")
        return f"{SHM_DIR} {shm} and {memory}"


def shortfall(what: str, needed: int, local_size: int, mpi_comm) -> str:
    """Why ``what``, ``needed`` bytes of shared memory for the ``local_size`` ranks of this
    machine, would not fit (see the module's text), or ``""`` if it fits (or neither figure
    can be read). The ranks of ``mpi_comm`` agree on the answer (one collective), so that
    they all decide alike."""
    room = read()
    fits = room.fits(needed)
    if all(mpi_comm.allgather(fits)):
        return ""
    if fits:
        return (f"{mib(needed)} of shared memory for {what} do not fit on another rank "
                f"of this machine, by its figures")
    return (f"{mib(needed)} of shared memory for {what} on the {local_size} rank(s) of "
            f"this machine do not fit: {room.describe()}")


def mib(n: int) -> str:
    """``n`` bytes in MiB, for messages."""
    return f"{n / 2 ** 20:,.1f} MiB"


def read(shm_dir: str = SHM_DIR, proc: str = "/proc",
         cgroup_root: str = "/sys/fs/cgroup") -> MemoryRoom:
    """The :class:`MemoryRoom` of this process now: ``shm_dir``'s free space, and the
    smaller of ``MemAvailable`` (``proc``/meminfo) and what the memory limits of this
    process's cgroup and its ancestors leave (cgroup v2 or v1, under ``cgroup_root``)."""
    try:
        st = os.statvfs(shm_dir)
        shm_free: Optional[int] = st.f_bavail * st.f_frsize
    except OSError:
        shm_free = None
    memory, source = _number(os.path.join(proc, "meminfo"), "MemAvailable:"), "MemAvailable"
    if memory is not None:
        memory *= 1024      # /proc/meminfo counts in KiB
    left = _cgroup_left(proc, cgroup_root)
    if left is not None and (memory is None or left < memory):
        memory, source = left, "the cgroup's memory limit"
    return MemoryRoom(shm_free, memory, source)


def _number(path: str, key: str) -> Optional[int]:
    """The number after ``key`` on its line of the file ``path`` (``/proc/meminfo``, a
    cgroup's ``memory.stat``), or None."""
    try:
        with open(path) as f:
            for line in f:
                fields = line.split()
                if fields[:1] == [key]:
                    return int(fields[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_left(proc: str, root: str) -> Optional[int]:
    """The least memory that the limits of this process's cgroup and its ancestors leave
    (limit minus usage, the usage without inactive file cache, which the kernel reclaims
    first), or None where no limit applies or none can be read."""
    try:
        with open(os.path.join(proc, "self", "cgroup")) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "" and os.path.exists(os.path.join(root, "cgroup.controllers")):
            base, files = root, ("memory.max", "memory.current", "inactive_file")
        elif "memory" in controllers.split(","):
            base = os.path.join(root, "memory")
            files = ("memory.limit_in_bytes", "memory.usage_in_bytes",
                     "total_inactive_file")
        else:
            continue
        parts = [p for p in path.split("/") if p]    # the path's folder, then its ancestors'
        lefts = [_left(os.path.join(base, *parts[:k]), *files)
                 for k in range(len(parts), -1, -1)]
        return min([x for x in lefts if x is not None], default=None)
    return None


def _left(folder: str, limit_file: str, usage_file: str, inactive_key: str) -> Optional[int]:
    """What one cgroup's memory limit leaves, or None (no limit, or not readable)."""
    try:
        with open(os.path.join(folder, limit_file)) as f:
            text = f.read().strip()
        if text == "max" or int(text) >= _NO_LIMIT:
            return None
        limit = int(text)
        with open(os.path.join(folder, usage_file)) as f:
            usage = int(f.read().strip())
    except (OSError, ValueError):
        return None
    inactive = _number(os.path.join(folder, "memory.stat"), inactive_key) or 0
    return max(0, limit - max(0, usage - inactive))

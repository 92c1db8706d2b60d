"""No collective of :class:`~nnabla_mpt.MPICommunicator` waits forever.

MPI's collectives wait for every rank, and a rank that left (``sys.exit``, the end of its
own loop while the others still step) or stalls never comes: the others would wait in
their all-reduce for good, and the leaving rank in MPI's finalize. So each collective
method of the communicator runs under a deadline (:func:`timed`); a daemon thread
(:class:`CollectiveTimeout`) wakes now and then, and when a collective has waited longer
than the timeout it logs which collective of which rank timed out, and after how long,
and ends the job (``MPI_Abort``, as a rank that raises does: :mod:`nnabla_mpt.distributed.abort`).

Only collectives are timed, but one rank's wait is another's work: while rank 0 evaluates
or saves between two steps, the others wait for it in the next all-reduce, so the timeout
must exceed the longest such pause. A job whose ranks end at different times, with no
collective pending, ends normally. Arming and disarming the deadline is two attribute writes per call.
"""
import functools
import threading
import time
from typing import Any, Callable, List, Optional

from nnabla.logger import logger

from .abort import hard_abort

#: Seconds a collective of MPICommunicator waits by default before it ends the job (as
#: long as PyTorch's NCCL default).
DEFAULT_TIMEOUT = 600.0


class CollectiveTimeout:
    """The deadline of the collective a communicator is in, watched by a daemon thread.

    Args:
        timeout: Seconds a collective may wait, or None: nothing is watched.
        rank, size: This rank and the number of ranks (with one rank nothing is watched).
        abort: ``abort(errorcode)`` that ends the job (``Comm.Abort``).

    Attributes:
        absent: ``what -> ranks``: the ranks that have not arrived at the collective
            ``what`` this rank waits in, or None where that cannot be known (set by the
            communicator: its shared-memory reduction knows).
    """

    def __init__(self, timeout: Optional[float], rank: int, size: int,
                 abort: Callable[[int], Any]) -> None:
        self.timeout = timeout
        self._rank, self._size, self._abort = rank, size, abort
        self._deadline: Optional[float] = None
        self._what = ""
        self._depth = 0
        self.absent: Callable[[str], Optional[List[int]]] = lambda what: None
        self.watching = timeout is not None and size > 1
        if self.watching:
            threading.Thread(target=self._watch, name="nnabla_mpt collective timeout",
                             daemon=True).start()

    def arm(self, what: str) -> None:
        """A collective named ``what`` starts (nested calls keep the outer deadline)."""
        self._depth += 1
        if self._depth == 1 and self.watching:
            self._what = what
            self._deadline = time.monotonic() + self.timeout

    def disarm(self) -> None:
        """The collective armed last has ended."""
        self._depth -= 1
        if self._depth == 0:
            self._deadline = None

    def _watch(self) -> None:
        poll = min(1.0, self.timeout / 4.0)
        while True:
            time.sleep(poll)
            deadline = self._deadline
            if deadline is not None and time.monotonic() > deadline:
                logger.error(
                    "rank %d of %d: %s waited more than %g s for the other ranks (timeout=%g "
                    "of MPICommunicator): %s; aborting the MPI job (error code 1)",
                    self._rank, self._size, self._what, self.timeout, self.timeout,
                    _who(self.absent(self._what)))
                hard_abort(self._abort, 1)


def _who(absent: Optional[List[int]]) -> str:
    """What a timed-out rank knows of the others."""
    if absent is None:
        return "a rank left, stalled or is out of step (MPI does not tell which)"
    if not absent:
        return "every rank had arrived: one stopped inside the collective"
    return (f"rank(s) {', '.join(map(str, absent))} did not arrive: they left, stalled or "
            f"are out of step")


def timed(name: str) -> Callable:
    """Decorator of a collective method of a communicator holding a
    :class:`CollectiveTimeout` as ``self._timeout``: the call runs under its deadline."""
    def decorate(method: Callable) -> Callable:
        @functools.wraps(method)
        def run(self, *args, **kwargs):
            guard = self._timeout
            guard.arm(name)
            try:
                return method(self, *args, **kwargs)
            finally:
                guard.disarm()
        return run
    return decorate

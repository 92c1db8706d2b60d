"""Ending the whole MPI job when one rank fails, so that the other ranks are not left
waiting in a collective forever.

:func:`install_excepthook` sets, once per process, a :data:`sys.excepthook` that prints
the traceback as usual and then aborts the job through the communicator it was given;
:func:`abort_job` aborts it on request. Both end in :func:`hard_abort`, which calls
``MPI_Abort`` and makes sure the calling rank never runs on.
:class:`nnabla_mpt.MPICommunicator` uses them for ``abort_on_exception=`` and ``abort()``.
"""
import os
import sys
import time
from typing import Any

import numpy as np

from nnabla.logger import logger

_GRACE_SECONDS = 0.2

# The communicator that the process-wide exception hook aborts; set by the first
# install_excepthook() call.
_hook_comm = None


def install_excepthook(comm: Any) -> None:
    """Make an uncaught exception abort the job of ``comm`` (an ``MPICommunicator``).

    Only the first call has an effect: the hook aborts through the first communicator
    given, and the exception hook in place before it still prints the traceback.
    """
    global _hook_comm
    if _hook_comm is not None:
        return
    _hook_comm = comm
    if sys.excepthook is not _abort_excepthook:
        _abort_excepthook.previous = sys.excepthook
        sys.excepthook = _abort_excepthook


def _abort_excepthook(exc_type, exc, tb):
    """``sys.excepthook`` that reports the exception, then aborts the whole MPI job."""
    previous = getattr(_abort_excepthook, "previous", sys.__excepthook__)
    try:
        previous(exc_type, exc, tb)
    finally:
        comm = _hook_comm
        if comm is None or comm.size == 1:  # nobody else can be left waiting
            return
        logger.error("rank %d of %d raised %s; aborting the MPI job (error code 1)",
                     comm.rank, comm.size, exc_type.__name__)
        hard_abort(comm.comm, 1)


def abort_job(comm: Any, errorcode: Any) -> None:
    """End every process of the job of ``comm`` (an ``MPICommunicator``) with ``errorcode``,
    logging that this rank asked for it; never returns."""
    if not isinstance(errorcode, (int, np.integer)) or isinstance(errorcode, bool):
        raise TypeError(f"errorcode must be an int, got {type(errorcode).__name__}: "
                        f"{errorcode!r}")
    logger.error("rank %d of %d aborts the MPI job (error code %d)", comm.rank, comm.size,
                 int(errorcode))
    hard_abort(comm.comm, int(errorcode))


def hard_abort(mpi_comm: Any, errorcode: int) -> None:
    """``MPI_Abort`` and never return.

    Some MPI implementations (MPICH among them) return from ``MPI_Abort`` after asking the
    launcher to kill the job; the calling rank must not run on meanwhile (for example into
    a collective its peers never reach, or into writing a checkpoint), so it exits at once.
    """
    _flush_std_streams()
    # Give the launcher a moment to forward what this rank just wrote (the traceback):
    # the abort kills the processes that relay the output.
    time.sleep(_GRACE_SECONDS)
    try:
        mpi_comm.Abort(errorcode)
    finally:
        os._exit(errorcode)


def _flush_std_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed or replaced stream must not stop the abort
            pass

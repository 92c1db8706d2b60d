"""Ending the whole MPI job when one rank fails, so that the other ranks are not left
waiting in a collective forever.

:func:`install_excepthook` sets, once per process, a :data:`sys.excepthook` that prints
the traceback as usual and then aborts the job through the callable it was given;
:func:`abort_job` aborts it on request. Both end in :func:`hard_abort`, which calls that
callable (``MPI_Abort``) and makes sure the calling rank never runs on.
:class:`nnabla_mpt.MPICommunicator` uses them for ``abort_on_exception=`` and ``abort()``
(through mpi4py's ``Comm.Abort``); :func:`updater_comm` does what the updaters'
``abort_on_exception`` option does with another communicator, such as nnabla's, that
offers ``abort()``.
"""
import os
import sys
import time
from typing import Any, Callable

from nnabla.logger import logger

from ..core import _validate as check

_GRACE_SECONDS = 0.2

# (communicator, abort, how) of the process-wide exception hook; set by the first
# install_excepthook() call.
_hook = None


def install_excepthook(comm: Any, abort: Callable[[int], Any], how: str) -> None:
    """Make an uncaught exception end the job of ``comm`` (which has ``rank`` and
    ``size``): the hook calls ``abort(1)`` through :func:`hard_abort`, after logging
    which rank raised and ``how`` the job is aborted.

    Only the first call has an effect: the hook aborts through the first communicator
    given, and the exception hook in place before it still prints the traceback.
    """
    global _hook
    if _hook is not None:
        return
    _hook = (comm, abort, how)
    if sys.excepthook is not _abort_excepthook:
        _abort_excepthook.previous = sys.excepthook
        sys.excepthook = _abort_excepthook


def _abort_excepthook(exc_type, exc, tb):
    """``sys.excepthook`` that reports the exception, then aborts the whole MPI job."""
    previous = getattr(_abort_excepthook, "previous", sys.__excepthook__)
    try:
        previous(exc_type, exc, tb)
    finally:
        if _hook is not None:
            comm, abort, how = _hook
            if comm.size > 1:    # with one rank nobody else can be left waiting
                logger.error("rank %d of %d raised %s; aborting the MPI job (%s)",
                             comm.rank, comm.size, exc_type.__name__, how)
                hard_abort(abort, 1)


def updater_comm(comm: Any, abort_on_exception: bool) -> Any:
    """An updater's ``comm``, once its ``abort_on_exception`` option has done what it asks.

    A communicator with an ``abort_on_exception`` attribute of its own (an
    :class:`~nnabla_mpt.MPICommunicator`, known by it: its module imports this one)
    installed the hook itself, or not, as that attribute says; the updater's ``False``
    contradicting its ``True`` is refused. Another communicator (nnabla's) with a callable
    ``abort()`` and more than one rank gets the hook, aborting through ``comm.abort()``,
    unless the option is False.

    Raises:
        ValueError: ``abort_on_exception=False`` with an MPICommunicator that aborts on an
            exception.
    """
    if comm is None:
        return None
    if hasattr(comm, "abort_on_exception"):   # an MPICommunicator
        if comm.abort_on_exception and not abort_on_exception:
            raise ValueError(
                "abort_on_exception=False cannot be honoured with an MPICommunicator "
                "made with abort_on_exception=True: its exception hook is installed "
                "already; pass MPICommunicator(abort_on_exception=False) instead")
        return comm
    abort = getattr(comm, "abort", None)
    if abort_on_exception and callable(abort) and comm.size > 1:
        install_excepthook(comm, lambda errorcode: abort(),
                           f"{type(comm).__name__}.abort()")
    return comm


def abort_job(comm: Any, errorcode: Any) -> None:
    """End every process of the job of ``comm`` (an ``MPICommunicator``) with ``errorcode``,
    logging that this rank asked for it; never returns."""
    errorcode = check.integer("errorcode", errorcode)
    logger.error("rank %d of %d aborts the MPI job (error code %d)", comm.rank, comm.size,
                 errorcode)
    hard_abort(comm.comm.Abort, errorcode)


def hard_abort(abort: Callable[[int], Any], errorcode: int) -> None:
    """``abort(errorcode)`` (``MPI_Abort``: mpi4py's ``Comm.Abort``, or the ``abort()`` of
    nnabla's communicator) and never return.

    Some MPI implementations (MPICH among them) return from ``MPI_Abort`` after asking the
    launcher to kill the job; the calling rank must not run on meanwhile (for example into
    a collective its peers never reach, or into writing a checkpoint), so it exits at once,
    also if ``abort`` raised.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed or replaced stream must not stop the abort
            pass
    # Give the launcher a moment to forward what this rank just wrote (the traceback):
    # the abort kills the processes that relay the output.
    time.sleep(_GRACE_SECONDS)
    try:
        abort(errorcode)
    finally:
        os._exit(errorcode)

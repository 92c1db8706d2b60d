"""How this process was started, and the communicator nnabla's own scripts use.

A launcher (``mpiexec``, ``srun``) tells every process it starts how many it started, in
an environment variable of its own. :func:`launched_ranks` reads them, and
:func:`warn_training_alone` says, once per process, that an updater built without a
communicator in a job of several processes trains every rank alone.
:func:`set_current_communicator` makes a communicator the one that nnabla's
``nnabla.utils.communicator_util.current_communicator()`` returns, which nnabla's CLI and
scripts written for it read (nnabla's ``create_communicator()`` recognises Open MPI only
and builds its CUDA communicator).
"""
import os
from typing import Any, Mapping, Optional, Tuple

from nnabla.logger import logger

from .communicator import MPICommunicator

#: (variable holding the number of processes started, who sets it), in the order read.
LAUNCH_VARIABLES = (
    ("OMPI_COMM_WORLD_SIZE", "Open MPI's mpiexec"),
    ("PMI_SIZE", "a PMI launcher (MPICH's or Intel MPI's mpiexec, srun --mpi=pmi2)"),
    ("MV2_COMM_WORLD_SIZE", "MVAPICH2's mpirun_rsh"),
    ("SLURM_STEP_NUM_TASKS", "Slurm's srun (also with --mpi=pmix, which sets PMIX_RANK)"),
)

_warned = False


def launched_ranks(environ: Optional[Mapping[str, str]] = None
                   ) -> Optional[Tuple[str, int, str]]:
    """``(variable, number of processes, launcher)`` of the first of
    :data:`LAUNCH_VARIABLES` set to an integer in ``environ`` (default ``os.environ``),
    or None for a process no launcher started."""
    environ = os.environ if environ is None else environ
    for variable, launcher in LAUNCH_VARIABLES:
        value = environ.get(variable, "").strip()
        if value.isdigit():
            return variable, int(value), launcher
    return None


def warn_training_alone() -> None:
    """For an updater built without a communicator: warn, once per process, when a
    launcher started this process as one of several, each of which then trains alone."""
    global _warned
    launched = launched_ranks()
    if _warned or launched is None or launched[1] < 2:
        return
    _warned = True
    variable, size, launcher = launched
    logger.warning(f"nnabla_mpt: {variable}={size}: this process is one of {size} started "
                   f"by {launcher}, but the updater has no communicator (comm=None): "
                   f"every rank trains alone on its own batches and the ranks' parameters "
                   f"drift apart. Pass comm=MPICommunicator() (or nnabla's communicator) "
                   f"to train them together; a process that trains alone on purpose (one a "
                   f"rank started, which inherits {variable}) can ignore this")


def set_current_communicator(comm: Any) -> Any:
    """Make ``comm`` the communicator that nnabla's
    ``nnabla.utils.communicator_util.current_communicator()`` returns, so that nnabla's
    CLI and scripts that ask nnabla for the job's communicator use it; None makes it
    return None again. A later call of nnabla's ``create_communicator()`` replaces it.

    Args:
        comm: An :class:`~nnabla_mpt.MPICommunicator`, or None.

    Returns:
        ``comm``, so that the line that made nnabla's communicator,
        ``comm = create_communicator()``, becomes
        ``comm = set_current_communicator(MPICommunicator())``.

    Raises:
        TypeError: ``comm`` is neither an MPICommunicator nor None.

    Example:
        Run with ``mpiexec -n 2 python train.py``::

            from nnabla.utils.communicator_util import current_communicator
            from nnabla_mpt import MPICommunicator, set_current_communicator

            comm = set_current_communicator(MPICommunicator())
            current_communicator() is comm   # True, under any launcher
    """
    if comm is not None and not isinstance(comm, MPICommunicator):
        raise TypeError(f"comm must be an MPICommunicator or None, got "
                        f"{type(comm).__name__}: {comm!r}")
    from nnabla.utils import communicator_util
    communicator_util._current_communicator = comm  # nnabla offers no setter
    return comm

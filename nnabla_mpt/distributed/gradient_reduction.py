"""How an updater sums the gradients, over micro-batches and over the ranks, as one value;
and the checks of that value against the communicator and the gradients it reduces."""
from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Sequence

import nnabla as nn
from nnabla.logger import logger

from ..core import _validate as check
from ..core import graph
from .communicator import MPICommunicator


@dataclass(frozen=True)
class GradientReduction:
    """How the updaters sum the gradients of a step over the ranks.

    Args:
        average_ranks: Divide the gradients reduced over the ranks by their number
            (default: sum, as nnabla's updater does).
        backward_pack_size: Reduce the gradients inside the last micro-batch's backward
            pass, in packs of this many values (nnabla-examples use ``2 << 20``), with the
            communicator's ``all_reduce_callback``: with nnabla's communicators (NCCL) the
            reduction overlaps the pass. None (default): one all-reduce after the pass.
            With an :class:`~nnabla_mpt.MPICommunicator` the gradients are reduced after
            the pass either way (a CPU all-reduce cannot run inside nnabla's backward; an
            info line says so), with the same result. Needs ``comm``; with nnabla's
            communicators, not with ``OverflowHandling(mode="saturation")`` (it checks
            each rank's own gradients before the reduction) nor with a parameter used by
            several functions (nnabla's callback would reduce its gradient more than once).
        shared_grads: Put the gradients of the solver's parameters in the communicator's
            shared memory (:meth:`MPICommunicator.share_grads`), so that the step's
            all-reduce copies nothing, and zero them there instead of with
            ``solver.zero_grad()``. None (default): do so when ``comm`` offers it with more
            than one rank and the shared-memory scheme, ``grads`` is None and the graph runs
            in float only, and the gradients fit in the machine's shared memory (a warning
            says when they do not); True: require it (``ValueError`` naming the reason
            where it cannot be done); False: never.
        abort_on_exception: With a communicator other than an
            :class:`~nnabla_mpt.MPICommunicator` that has a callable ``abort()`` (nnabla's
            ``MultiProcessDataParallelCommunicator``) and more than one rank: install a
            :data:`sys.excepthook` that prints the traceback, logs which rank raised and
            calls ``comm.abort()`` (``MPI_Abort``), so that a rank that raises ends the job
            instead of leaving the others waiting in a collective; the rank exits even if
            ``abort()`` returns. The hook is process-wide and only the first one installed
            (by an updater or an MPICommunicator) takes effect; False keeps this updater
            from installing it. With an MPICommunicator the communicator's own
            ``abort_on_exception`` rules: True has no effect of its own, and False is
            refused (``ValueError``) when the communicator was made with True. See
            :doc:`gpu`.

    Raises:
        TypeError, ValueError: a field out of range; the message names it.

    Example:
        >>> from nnabla_mpt import GradientReduction
        >>> GradientReduction(average_ranks=True).average_ranks
        True
    """
    average_ranks: bool = False
    backward_pack_size: Optional[int] = None
    shared_grads: Optional[bool] = None
    abort_on_exception: bool = True

    def __post_init__(self) -> None:
        name = f"{type(self).__name__}."
        pack, shared = self.backward_pack_size, self.shared_grads
        checked = {
            "average_ranks": check.boolean(name + "average_ranks", self.average_ranks),
            "backward_pack_size": None if pack is None else check.integer(
                name + "backward_pack_size", pack, ge=1),
            "shared_grads": None if shared is None else check.boolean(name + "shared_grads",
                                                                      shared),
            "abort_on_exception": check.boolean(name + "abort_on_exception",
                                                self.abort_on_exception)}
        self.__dict__.update(checked)     # frozen: the checked values replace the given


def backward_reduction(reduction: GradientReduction, comm: Any, saturation: bool,
                       losses: Sequence["nn.Variable"],
                       params: Mapping[str, "nn.Variable"]) -> Optional[int]:
    """The pack size of the all-reduce inside the backward pass that
    ``reduction.backward_pack_size`` asks for, or None where the gradients are reduced
    after the pass: none asked for, or an :class:`MPICommunicator` (logged), whose
    reduction cannot run inside nnabla's backward pass. ``saturation``: the overflow
    check's mode is ``"saturation"``; ``losses``: the graphs the step runs."""
    pack = reduction.backward_pack_size
    if pack is None:
        return None
    if comm is None:
        raise ValueError(f"backward_pack_size={pack!r} needs a communicator (comm=...): it "
                         f"reduces the gradients over the ranks inside the backward pass")
    if isinstance(comm, MPICommunicator):
        logger.info(f"nnabla_mpt: backward_pack_size={pack!r}: MPICommunicator reduces the "
                    f"gradients after the backward pass (a CPU all-reduce cannot run inside "
                    f"nnabla's backward), with the same result")
        return None
    from nnabla.communicators import Communicator
    if not isinstance(comm, Communicator):
        raise ValueError(f"backward_pack_size={pack!r} needs nnabla's communicator (whose "
                         f"callbacks run inside nnabla's backward pass) or an "
                         f"MPICommunicator, got comm of type {type(comm).__name__}")
    if saturation:
        raise ValueError(f"backward_pack_size={pack!r} cannot be combined with "
                         f"overflow mode 'saturation': that mode checks each rank's own "
                         f"gradients before the reduction, which would run inside the "
                         f"backward pass; use OverflowHandling(mode='inf_nan') or "
                         f"backward_pack_size=None")
    shared = sorted({name for loss in losses for name in graph.shared_parameters(loss, params)})
    if shared:
        raise ValueError(f"backward_pack_size={pack!r} cannot train parameters that several "
                         f"functions read ({', '.join(shared[:5])}"
                         f"{', ...' if len(shared) > 5 else ''}): nnabla's callback reduces a "
                         f"gradient when a function reading it has run its backward, so "
                         f"once per reader; use backward_pack_size=None")
    return pack


def exchanged_grads(grads: Optional[List["nn.NdArray"]], comm: Any,
                    reduction: GradientReduction,
                    params: Mapping[str, "nn.Variable"]) -> Optional[List["nn.NdArray"]]:
    """``grads`` with ``comm``: None stands for all of the solver's gradients; given with
    a communicator, they must be the gradients of every one of the solver's parameters
    (a parameter left out would train on this rank's gradients alone, and the ranks'
    parameters would drift apart). Without a communicator a non-empty ``grads`` is
    accepted (as nnabla's updater accepts it) with a warning that it is ignored, and
    ``[]`` silently."""
    if reduction.shared_grads and comm is None:
        raise ValueError("shared_grads=True needs a communicator (comm=...): the "
                         "gradients are placed in the communicator's shared memory")
    if grads is not None and len(grads) == 0:
        if comm is None:
            return None     # nnabla's default, spelled out: nothing to exchange
        raise ValueError("grads must not be empty when a communicator is given: grads=[] "
                         "would exchange nothing; pass grads=None to exchange the gradients "
                         "of all the solver's parameters")
    if grads is not None and comm is None:
        logger.warning(f"nnabla_mpt: grads (a list of {len(grads)} arrays) is ignored "
                       f"without a communicator: grads names the gradients to all-reduce "
                       f"over the ranks, and there are none; every gradient of the solver "
                       f"is used as it is. Pass comm=... to exchange them, or leave grads "
                       f"out")
    if grads is not None and comm is not None:
        missing = [name for name, v in params.items() if not any(v.grad == g for g in grads)]
        if missing:
            raise ValueError(f"grads must hold the gradients of all the solver's parameters "
                             f"when a communicator is given; missing {missing[:5]}"
                             + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
                             + ": their values would drift apart on the ranks; pass "
                             "grads=None to exchange all of them")
    return grads


def communicator(name: str, comm: Any) -> Any:
    """``comm`` checked to offer the surface the step uses (None passes)."""
    if comm is None:
        return None
    for attr in ("all_reduce", "size", "rank"):
        if not hasattr(comm, attr):
            raise TypeError(f"{name} must be a communicator with all_reduce, size and rank "
                            f"(missing {attr!r}), got {type(comm).__name__}")
    return comm


def ndarrays(name: str, grads: Any) -> Optional[List["nn.NdArray"]]:
    """``grads`` checked to be None or a list of NdArrays."""
    if grads is None:
        return None
    if not isinstance(grads, (list, tuple)) or not all(isinstance(g, nn.NdArray) for g in grads):
        raise TypeError(f"{name} must be None or a list of nnabla.NdArray, got {grads!r}")
    return list(grads)

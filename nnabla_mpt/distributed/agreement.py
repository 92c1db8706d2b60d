"""The step's decision, "skip or update", made alike on every rank.

One process decides from its own gradients
(:class:`~nnabla_mpt.step.decision.LocalDecision`, which the updater makes itself). With a
communicator,
:class:`StepAgreement` makes the decision from the reduced gradients, which every rank
holds bit for bit alike, so every rank takes the same branch:

1. the flags travel at the end of the gradients' all-reduce (this rank's own overflow
   where it checks before the reduce, its loss; exactly, whatever dtype the communicator
   reduces in: :mod:`nnabla_mpt.distributed.exchange`): one collective a step (:func:`_transport`);
2. the reduced gradients are checked (each rank checks the same values);
3. on a skipped step only, one more small all-reduce carries two votes: whether some
   rank's loss was non-finite, and whether some rank's batch held inf/NaN (a bad batch);
   either keeps the scale. When a collapse is diagnosed, one more combines the ranks'
   diagnoses (:meth:`StepAgreement.agree_on_diagnosis`).

Why the votes follow the reduce instead of riding in it: a rank learns that the step is
skipped only from the reduced gradients, and reading the batch or the loss on every step
to fill a flag in advance would cost every good step (a host read per input). Every rank
knows the step was skipped alike, so every rank joins the vote alike: no collective is
added to a good step, and a skipped step takes exactly one more.

The reduced gradients hold inf/NaN whenever one rank's gradients do (inf and NaN survive
a sum), so on a good step the gradients are read once, after the reduce (``grads``, when
given, must cover every parameter: the updater refuses them otherwise). One case also needs
each rank's own check before the reduce, carried in the flags: the saturation mode (a
saturated value can sum back below the threshold).
"""
import hashlib
import math
from typing import Any, Callable, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import numpy as np

import nnabla as nn
from nnabla.logger import logger

from ..core import graph
from ..step.decision import Outcome, skipped_for
from ..step.detector import BatchCheck
from ..step.micro_batch import StepLosses
from . import exchange
from .communicator import MPICommunicator
from .packed import PackedArrays


class StepAgreement:
    """The decision of every rank alike, from the reduced gradients.

    Args:
        exchanged: What the ranks reduce and how (:class:`StepExchange`): its ``comm``
            (``all_reduce``, ``size``), its gradients and ``division`` (the step's
            all-reduce averages over the ranks, ``average_ranks``). The ranks first
            compare what they exchange and learn what the all-reduce does to dtypes
            (:func:`same_model`; kept as ``reduction``); the step's all-reduce then
            carries the gradients with the flags (:func:`_transport`; ``transport``, and
            ``shared``, the :class:`SharedGradients` holding them, or None).
        checks: ``(check, inf_nan_check)``, the overflow check of ``mode`` and the
            inf/NaN one (None when checking is off); ``check`` is kept as the attribute.
            In the saturation ``mode`` each rank's own gradients are checked before the
            reduce too, and the reduced ones compared with the threshold again only where
            the reduction sums in float16; a float32 reduction cannot saturate, so its
            sums get the inf/NaN check (finite sums are no saturated values, and sums
            written back into float16 arrays overflow to inf from 65520 on).
        mode: The overflow check's mode.
        batch: The check of a skipped step's batch
            (:class:`~nnabla_mpt.step.detector.BatchCheck`).
        pack: With a size (``options.backward_reduction``), nnabla's callback reduces
            the gradients inside the last backward pass, in packs of that many values
            (``in_backward``, ``() -> callback``), and the step's all-reduce carries the
            flags only; else None.
    """

    def __init__(self, exchanged: "StepExchange",
                 checks: Tuple[Optional[Callable[[], bool]], ...], mode: str,
                 batch: BatchCheck, pack: Optional[int] = None) -> None:
        check, inf_nan_check = checks
        comm = exchanged.comm
        self._comm = comm
        self._division = exchanged.division
        self.reduction = same_model(comm, exchanged.params, exchanged.grads)
        self.transport, self.shared, self._flags = _transport(exchanged, self.reduction,
                                                              pack is None)
        self.in_backward = None
        if pack is not None:
            gradients = exchanged.arrays()
            self.in_backward = lambda: comm.all_reduce_callback(  # noqa: E731
                gradients, pack, division=exchanged.division)
        saturating = mode != "inf_nan"
        self.check = check
        self.check_before = check is not None and saturating
        self.check_after = inf_nan_check if saturating and not self.reduction.float16 else None
        self._batch = batch

    def decide(self, loss: "nn.Variable", losses: StepLosses, step: int) -> Outcome:
        """Reduces the gradients with the flags (one collective) and checks the result.

        The flags are this rank's overflow, its mean loss and its ``step`` index; the mean
        over the ranks becomes the step's loss (``losses.set_mean``). Ranks whose steps
        differ raise the same ``RuntimeError`` (:func:`check_in_step`). On a skipped step,
        one more small all-reduce tells whether some rank's loss was non-finite and whether
        some rank's batch held inf/NaN.
        """
        local = self.check_before and self.check()
        flags = self._flags.encode(local, losses.mean(), step)
        reduced = self.transport.reduce(self._comm, flags, self._division)
        flagged, mean, steps = self._flags.decode(reduced)
        check_in_step(steps)
        losses.set_mean(mean)
        overflow = self.check is not None and (flagged or (self.check_after or self.check)())
        if not overflow:
            return Outcome.UPDATED
        bad_losses, bad_batches = self._sum([not math.isfinite(losses.total()),
                                             bool(self._batch.nonfinite(loss))])
        return skipped_for(bad_losses > 0.0, bad_batches > 0.0)

    def agree_on_diagnosis(self, report) -> bool:
        """Whether the collapse is a pure overflow, decided alike on every rank.

        Each rank replays only its own batch, so the reports differ when one rank's data
        caused the overflow; acting on them separately would make some ranks raise while
        the others wait in the next all-reduce. One extra all-reduce (on this rare path
        only) combines them: pure overflow when some rank reproduced an overflow that a
        smaller scale fixes and no rank found a data or model problem.
        """
        overflow_votes, problem_votes = self._sum(
            [report.kind == "overflow", report.kind in ("data", "model")])
        if report.kind == "not_reproduced" and (overflow_votes > 0 or problem_votes > 0):
            report.notes.append(
                f"{int(overflow_votes + problem_votes)} other rank(s) reproduced the "
                "non-finite gradients on their own batches; their reports name the function.")
        return overflow_votes > 0 and problem_votes == 0

    def gather(self, *values: float) -> List[List[float]]:
        """Each of ``values`` of every rank, in rank order, exactly: one list per value
        (one small all-reduce of their bytes,
        :class:`~nnabla_mpt.distributed.exchange.RankSlots`)."""
        slots = exchange.RankSlots(self._comm.rank, self._comm.size, np.float64,
                                   len(values))
        every = slots.decode(self._sum(slots.encode(values)))
        return [[float(v) for v in column] for column in every.T]

    def _sum(self, values: Sequence[float]) -> List[float]:
        """``values`` (float32 numbers, or votes: how many ranks answered yes to each
        question, exact in float16 up to 2048 ranks) summed over the ranks (one small
        all-reduce)."""
        array = nn.NdArray.from_numpy_array(np.asarray(values, np.float32))
        self._comm.all_reduce([array], division=False, inplace=True)
        return [float(v) for v in array.data]


def check_in_step(steps) -> None:
    """Raises ``RuntimeError`` naming the ranks and their step indices unless every rank
    is at the same step (``steps``: every rank's, in rank order): the step's all-reduce
    then summed gradients of different steps. Every rank holds the same ``steps`` and
    raises alike."""
    if (steps == steps[0]).all():
        return
    ranks = ", ".join(f"rank {r} at step {int(s)}" for r, s in enumerate(steps))
    raise RuntimeError(
        f"the ranks are out of step: the step's all-reduce paired {ranks}, so it summed "
        f"gradients of different steps; every rank must be at the same step (a rank that "
        f"loaded another checkpoint or state than the others, or set its step count, is "
        f"behind or ahead)")


class ListTransport:
    """What the step's all-reduce carries for a communicator that fuses the arrays of a
    call itself (:class:`~nnabla_mpt.MPICommunicator`), or the flags alone where the
    gradients are reduced inside the backward pass: the arrays, the flags' array last.

    Args:
        arrays: The arrays to reduce (the gradients, or none), the array of the step's
            flags last (its length that of the flags' codec). The list itself is kept,
            not copied: :meth:`SharedGradients.zero` renews its entries in place when a
            gradient had left the shared memory (``solver.zero_grad()`` between steps).
    """

    def __init__(self, arrays: List["nn.NdArray"]) -> None:
        self.arrays = arrays

    def reduce(self, comm, flags: np.ndarray, division: bool) -> np.ndarray:
        """Reduces the arrays with ``flags`` (one call of ``comm``); the reduced flags."""
        carrier = self.arrays[-1]
        carrier.data = flags
        comm.all_reduce(self.arrays, division=division, inplace=True)
        return carrier.data


def model_digest(params: Mapping[str, "nn.Variable"],
                 grads: Optional[Sequence["nn.NdArray"]]) -> bytes:
    """Six bytes naming the parameters a rank exchanges: names, shapes and order (the
    order ``grads`` gives them, when given)."""
    order = list(params.items())
    if grads is not None:
        order = [next((name, v) for name, v in order if v.grad == g) for g in grads]
    text = repr([(name, tuple(v.shape)) for name, v in order]).encode("utf-8")
    return hashlib.blake2b(text, digest_size=6).digest()


def same_model(comm, params: Mapping[str, "nn.Variable"],
               grads: Optional[Sequence["nn.NdArray"]]) -> exchange.Reduction:
    """Raises the same ``ValueError`` on every rank unless every rank exchanges the
    gradients of parameters of the same names and shapes, in the same order (one small
    all-reduce, exact in any dtype: :func:`nnabla_mpt.distributed.exchange.handshake`);
    arrays of the same sizes in another order would be summed with each other's, silently.
    Returns what the all-reduce does to dtypes."""
    seen, reduction = exchange.handshake(comm, model_digest(params, grads))
    differ = [r for r, f in enumerate(seen) if f != seen[0]]
    if differ:
        raise ValueError(
            f"the ranks exchange different gradients: the parameters (names, shapes, "
            f"order{', as grads gives them' if grads is not None else ''}) of rank(s) "
            f"{', '.join(map(str, differ))} differ from rank 0's; build the same model on "
            f"every rank and pass grads in the same order (or grads=None)")
    return reduction


class StepExchange(NamedTuple):
    """What the ranks reduce at each step, and how.

    Attributes:
        comm: The communicator.
        loss: The step's loss (its float context holds a packed buffer).
        params: The solver's parameters.
        grads: The arrays to reduce, or None for the gradients of all of ``params``.
        shared_grads: The option as the updaters take it (see :func:`use_shared_grads`).
        float_only: The graph runs in float only (no float16 gradients).
        division: The all-reduces average over the ranks (``average_ranks``).
    """
    comm: Any
    loss: "nn.Variable"
    params: Mapping[str, "nn.Variable"]
    grads: Optional[Sequence["nn.NdArray"]]
    shared_grads: Optional[bool]
    float_only: bool
    division: bool

    def arrays(self) -> List["nn.NdArray"]:
        """The arrays a step reduces: ``grads``, or the gradients of all of ``params``."""
        grads = self.grads
        return list(grads if grads is not None else (v.grad for v in self.params.values()))


def _transport(exchanged: StepExchange, reduction: exchange.Reduction, with_gradients: bool):
    """``(transport, shared gradients, flags' codec)`` of the step's all-reduce: a list
    (:class:`ListTransport`, the flags' carrier last) for :class:`~nnabla_mpt.MPICommunicator`,
    which fuses the arrays of a call, and the flags alone where the gradients are reduced
    in the backward pass (not ``with_gradients``); else the gradients and the flags in one
    buffer (:mod:`nnabla_mpt.distributed.packed` says why)."""
    comm = exchanged.comm
    flags = exchange.StepFlags(comm.rank, comm.size, exchanged.division, reduction.float16)
    ours = isinstance(comm, MPICommunicator)
    if exchanged.shared_grads and not ours:
        use_shared_grads(exchanged, ())   # raises, naming why
    if not with_gradients:
        return ListTransport([nn.NdArray((flags.length,))]), None, flags
    if not ours:
        packed = PackedArrays(exchanged.arrays(), flags.length,
                              graph.float_context(exchanged.loss))
        return packed, None, flags
    carrier = nn.Variable((flags.length,))     # its gradient carries the flags
    placed = list(exchanged.params.values()) + [carrier]
    if use_shared_grads(exchanged, placed):
        shared = comm.share_grads(placed)
        return ListTransport(shared.arrays), shared, flags   # kept current by shared.zero()
    return ListTransport(exchanged.arrays() + [carrier.grad]), None, flags


def warn_float16_reduction(reduction: Optional[exchange.Reduction], precision: str,
                           schedule: bool, average: bool) -> None:
    """Warns where a communicator that reduces in float16 silently costs: float32
    gradients to reduce (those of a graph of ``precision`` ``"float"``, or of the
    full-precision phase of a precision ``schedule``) lose precision and overflow in its
    sums; float16 gradients summed over the ranks overflow where each rank's do not (with
    ``average`` too: nnabla-ext-cuda divides the float16 sum after it is taken), and the
    scale falls by up to a factor of the rank count."""
    if reduction is None or not reduction.float16:
        return
    if precision == "float" or schedule:
        what = ("the gradients of this float32 graph" if precision == "float" else
                "the float32 gradients of the precision schedule's full-precision phase")
        logger.warning(f"nnabla_mpt: the communicator reduces in float16 (nnabla's "
                       f"communicator made from a cudnn half or mixed_half context): {what} "
                       f"lose precision and overflow beyond 65504 in its sums; build the "
                       f"communicator from a float context")
    if precision == "half":
        divided = (" (averaging over the ranks divides that sum afterwards, so it does not "
                   "help)" if average else "")
        logger.warning(f"nnabla_mpt: the communicator sums the float16 gradients over the "
                       f"ranks in float16 (nnabla's communicator made from a cudnn half or "
                       f"mixed_half context): a sum overflows where each rank's gradients "
                       f"do not{divided}, so the loss scale falls by up to a factor of the "
                       f"rank count; build the communicator from a float context")


def device_mismatch(extension: str, device_id: str, local_rank: Any) -> Optional[str]:
    """Why a loss computed with ``extension`` on the device ``device_id`` costs with a
    communicator on ``local_rank``'s device (nnabla's ``comm.init()`` puts it there), or
    None: on the CPU, or without a ``local_rank``, there is no device to copy between."""
    if extension == "cpu" or local_rank is None or device_id == str(local_rank):
        return None
    return (f"nnabla_mpt: the loss is computed on device {device_id!r} ({extension}) while "
            f"the communicator lives on device {local_rank!r} (its local_rank: nnabla's "
            f"comm.init() moves it there), so every collective copies across devices; set "
            f"ctx.device_id = str(comm.local_rank) before creating the parameters and the "
            f"solver")


def warn_device_mismatch(comm, loss: "nn.Variable") -> None:
    """Warns once per updater where the loss and ``comm`` live on different devices
    (:func:`device_mismatch`)."""
    parent = loss.parent
    if parent is None or isinstance(comm, MPICommunicator):     # a CPU one: no device
        return
    why = device_mismatch(graph.extension_of(loss), parent.context.device_id,
                          getattr(comm, "local_rank", None))
    if why is not None:
        logger.warning(why)


def check_not_armed(comm) -> None:
    """Raises ``RuntimeError`` if ``comm`` has an all-reduce armed by a script's
    ``all_reduce_callback()``: it would reduce the step's gradients a second time."""
    if getattr(comm, "all_reduce_callback_armed", False):
        raise RuntimeError(
            "comm has an all-reduce armed by all_reduce_callback() (or "
            "get_all_reduce_callback()): it would reduce the gradients a second time, at the "
            "solver's first operation; the updater reduces them itself. Call "
            "comm.clear_all_reduce_callback() before using the updater")


def use_shared_grads(exchanged: StepExchange, placed: Sequence["nn.Variable"]) -> bool:
    """Whether the updater puts the gradients in the communicator's shared memory.

    ``exchanged.shared_grads`` None (auto): when the communicator offers it
    (``share_grads``, with more than one rank and the shared-memory scheme), ``grads`` is
    not given and the graph runs in float only (float16 gradients would leave the shared
    memory at every backward pass). ``True`` asks for it and raises, naming the reason,
    where it cannot be done. If the gradients do not fit in the machine's shared memory,
    auto logs a warning and does not share them.
    """
    shared_grads, comm = exchanged.shared_grads, exchanged.comm
    if shared_grads is False:
        return False
    reasons = []
    if not hasattr(comm, "share_grads"):
        reasons.append(f"the communicator ({type(comm).__name__}) has no share_grads")
    elif getattr(comm, "algorithm", None) != "shared_memory":
        reasons.append(f"the communicator uses algorithm={getattr(comm, 'algorithm', None)!r}, "
                       f"not 'shared_memory'")
    if exchanged.grads is not None:
        reasons.append("grads is given (the updater can only place the gradients of the "
                       "solver's parameters)")
    if not exchanged.float_only:
        reasons.append("the graph runs in float16 (nnabla writes float16 gradients into "
                       "memory of its own)")
    if shared_grads is None and (reasons or comm.size == 1):
        return False
    if not reasons:
        # collective, like share_grads itself: every rank gets here alike
        shortfall = comm.shared_memory_shortfall(list(placed))
        if shortfall and shared_grads is None:
            logger.warning(f"nnabla_mpt: the gradients are not shared: {shortfall}")
            return False
        if shortfall:
            reasons.append(shortfall)
    if reasons:
        raise ValueError("shared_grads=True cannot be honoured: " + "; ".join(reasons))
    return True

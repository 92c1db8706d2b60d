"""The step's decision, "skip or update", made alike on every rank.

One process decides from its own gradients (:class:`LocalDecision`). With a
communicator, :class:`StepAgreement` makes the decision from the reduced gradients, which
every rank holds bit for bit alike, so every rank takes the same branch:

1. two flags travel at the end of the gradients' all-reduce (this rank's own overflow
   where it checks before the reduce, its loss): one collective a step;
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
from typing import Any, Callable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

import nnabla as nn
from nnabla.logger import logger

from .detector import BatchCheck
from .step_loss import StepLosses


#: What the check of one step found, ``(overflow, loss_nonfinite, bad_batch)``: skip the
#: step (the reduced gradients overflowed); on a skipped step, whether some micro-batch's
#: loss (on some rank) was itself non-finite, and whether some rank's batch held inf/NaN
#: (:class:`~nnabla_mpt.detector.BatchCheck`): either way a smaller scale cannot help and
#: the scale is kept.
Decision = Tuple[bool, bool, bool]


class LocalDecision:
    """The decision of a single process: its own gradients' check.

    Args:
        check: The overflow check of the solver's gradients, or None when checking is
            off (the step always updates); kept as the attribute ``check``.
        batch: The check of a skipped step's batch (:class:`~nnabla_mpt.detector.BatchCheck`).
    """

    #: No reduction runs inside the backward pass (see :class:`StepAgreement`).
    in_backward = None

    def __init__(self, check: Optional[Callable[[], bool]], batch: BatchCheck) -> None:
        self.check = check
        self._batch = batch

    def decide(self, loss: "nn.Variable", losses: StepLosses) -> Decision:
        """Checks the step's gradients; on overflow only, reads the step's ``losses``."""
        if self.check is None or not self.check():
            return False, False, False
        return True, not math.isfinite(losses.total()), bool(self._batch.nonfinite(loss))

    def agree_on_diagnosis(self, report) -> bool:
        """Whether a collapse is a pure overflow: the report says so."""
        return report.kind == "overflow"

    def gather(self, value: float) -> List[float]:
        """``value`` of every rank: this one's."""
        return [value]


class StepAgreement:
    """The decision of every rank alike, from the reduced gradients.

    Args:
        comm: The communicator (``all_reduce``, ``size``).
        reduce_list: The arrays the step reduces: the gradients, then ``flags`` last.
        check: The overflow check of the solver's gradients, or None when checking is off;
            kept as the attribute ``check``.
        check_before: Check each rank's own gradients before the reduce too (see the
            module's docstring).
        batch: The check of a skipped step's batch (:class:`~nnabla_mpt.detector.BatchCheck`).
        in_backward: ``() -> callback`` for the last backward pass of a step, where the
            gradients are reduced inside it (nnabla's communicators, ``all_reduce_callback``;
            ``reduce_list`` then holds the flags only), or None; kept as the attribute.
    """

    def __init__(self, comm, reduce_list: List["nn.NdArray"],
                 check: Optional[Callable[[], bool]], check_before: bool,
                 batch: BatchCheck, in_backward: Optional[Callable[[], Any]] = None) -> None:
        self._comm = comm
        self.reduce_list = reduce_list
        self.check = check
        self.check_before = check is not None and check_before
        self._batch = batch
        self.in_backward = in_backward

    def decide(self, loss: "nn.Variable", losses: StepLosses) -> Decision:
        """Reduces the gradients with the flags (one collective) and checks the result.

        The flags are ``[this rank's overflow, its mean loss]``; the mean over the ranks
        becomes the step's loss (``losses.set_mean``). On a skipped step, one more small
        all-reduce tells whether some rank's loss was non-finite and whether some rank's
        batch held inf/NaN.
        """
        local = self.check_before and self.check()
        flags = self.reduce_list[-1]
        flags.data = np.array([local, losses.mean()], dtype=np.float32)
        self._comm.all_reduce(self.reduce_list, division=False, inplace=True)
        flag, loss_total = (float(x) for x in flags.data)
        losses.set_mean(loss_total / self._comm.size)
        overflow = self.check is not None and (flag > 0.0 or self.check())
        if not overflow:
            return False, False, False
        bad_losses, bad_batches = self._count([not math.isfinite(losses.total()),
                                               bool(self._batch.nonfinite(loss))])
        return True, bad_losses > 0.0, bad_batches > 0.0

    def agree_on_diagnosis(self, report) -> bool:
        """Whether the collapse is a pure overflow, decided alike on every rank.

        Each rank replays only its own batch, so the reports differ when one rank's data
        caused the overflow; acting on them separately would make some ranks raise while
        the others wait in the next all-reduce. One extra all-reduce (on this rare path
        only) combines them: pure overflow when some rank reproduced an overflow that a
        smaller scale fixes and no rank found a data or model problem.
        """
        overflow_votes, problem_votes = self._count(
            [report.kind == "overflow", report.kind in ("data", "model")])
        if report.kind == "not_reproduced" and (overflow_votes > 0 or problem_votes > 0):
            report.notes.append(
                f"{int(overflow_votes + problem_votes)} other rank(s) reproduced the "
                "non-finite gradients on their own batches; their reports name the function.")
        return overflow_votes > 0 and problem_votes == 0

    def check_same_model(self, params: Mapping[str, "nn.Variable"],
                         grads: Optional[Sequence["nn.NdArray"]]) -> None:
        """Raises the same ``ValueError`` on every rank unless every rank exchanges the
        gradients of parameters of the same names and shapes, in the same order (one small
        all-reduce of a fingerprint, at construction). Arrays of the same sizes in another
        order would be summed with each other's, silently."""
        order = list(params.items())
        if grads is not None:                 # the order grads gives them
            order = [next((name, v) for name, v in order if v.grad == g) for g in grads]
        text = repr([(name, tuple(v.shape)) for name, v in order]).encode("utf-8")
        digest = int.from_bytes(hashlib.blake2b(text, digest_size=6).digest(), "little")
        halves = [digest & 0xFFFFFF, digest >> 24]      # exact in float32
        slots = np.zeros(2 * self._comm.size, dtype=np.float32)
        slots[2 * self._comm.rank:2 * self._comm.rank + 2] = halves
        seen = self._sum(slots)
        fingerprints = [tuple(seen[2 * r:2 * r + 2]) for r in range(self._comm.size)]
        differ = [r for r, f in enumerate(fingerprints) if f != fingerprints[0]]
        if differ:
            raise ValueError(
                f"the ranks exchange different gradients: the parameters (names, shapes, "
                f"order{', as grads gives them' if grads is not None else ''}) of rank(s) "
                f"{', '.join(map(str, differ))} differ from rank 0's; build the same model on "
                f"every rank and pass grads in the same order (or grads=None)")

    def gather(self, value: float) -> List[float]:
        """``value`` of every rank, in rank order (one small all-reduce: each rank
        contributes its value in its own slot, as float32)."""
        slots = np.zeros(self._comm.size, dtype=np.float32)
        slots[self._comm.rank] = value
        return self._sum(slots)

    def _count(self, votes: List[bool]) -> List[float]:
        """For each question, how many ranks answered yes (one small all-reduce)."""
        return self._sum(np.array(votes, dtype=np.float32))

    def _sum(self, values: np.ndarray) -> List[float]:
        """``values`` summed over the ranks (one small all-reduce)."""
        array = nn.NdArray(values.shape)
        array.data = values
        self._comm.all_reduce([array], division=False, inplace=True)
        return [float(v) for v in array.data]


def decider(comm, params: Mapping[str, "nn.Variable"],
            grads: Optional[Sequence["nn.NdArray"]], shared_grads: Optional[bool],
            float_only: bool, check: Optional[Callable[[], bool]], mode: str,
            batch: BatchCheck, pack: Optional[int] = None):
    """``(decider, shared gradients)`` for an updater: a :class:`LocalDecision` without a
    communicator; else a :class:`StepAgreement` over the arrays of :func:`reduce_list`,
    checking each rank's own gradients before the reduce too in the saturation ``mode``;
    the ranks compare what they exchange first (:meth:`StepAgreement.check_same_model`).
    With ``pack`` (``options.backward_reduction``) nnabla's callback reduces the gradients
    inside the last backward pass, in packs of that many values, and the step's all-reduce
    carries the flags only."""
    if comm is None:
        return LocalDecision(check, batch), None
    arrays, shared = reduce_list(comm, params, grads, shared_grads, float_only)
    in_backward = None
    if pack is not None:
        gradients, arrays = arrays[:-1], arrays[-1:]
        in_backward = lambda: comm.all_reduce_callback(gradients, pack)  # noqa: E731
    check_before = mode != "inf_nan"
    agreement = StepAgreement(comm, arrays, check, check_before, batch, in_backward)
    agreement.check_same_model(params, grads)
    return agreement, shared


def check_not_armed(comm) -> None:
    """Raises ``RuntimeError`` if ``comm`` has an all-reduce armed by a script's
    ``all_reduce_callback()``: it would reduce the step's gradients a second time."""
    if getattr(comm, "all_reduce_callback_armed", False):
        raise RuntimeError(
            "comm has an all-reduce armed by all_reduce_callback() (or "
            "get_all_reduce_callback()): it would reduce the gradients a second time, at the "
            "solver's first operation; the updater reduces them itself. Call "
            "comm.clear_all_reduce_callback() before using the updater")


def reduce_list(comm, params: Mapping[str, "nn.Variable"],
                grads: Optional[Sequence["nn.NdArray"]], shared_grads: Optional[bool],
                float_only: bool) -> Tuple[List["nn.NdArray"], object]:
    """The arrays a step reduces, the flags last, and the :class:`SharedGradients` holding
    them in the communicator's shared memory (or None).

    ``shared_grads`` as the updaters take it (see :func:`use_shared_grads`);
    ``float_only``: the graph runs in float only (no float16 gradients).
    """
    flags = nn.Variable((2,))
    placed = list(params.values()) + [flags]
    if use_shared_grads(shared_grads, comm, grads, float_only, placed):
        shared = comm.share_grads(placed)
        return shared.arrays, shared   # kept current by shared.zero()
    arrays = list(grads if grads is not None else (v.grad for v in params.values()))
    return arrays + [flags.grad], None


def use_shared_grads(shared_grads: Optional[bool], comm, grads, float_only: bool,
                     placed: Sequence["nn.Variable"]) -> bool:
    """Whether the updater puts the gradients in the communicator's shared memory.

    ``None`` (auto): when the communicator offers it (``share_grads``, with more than one
    rank and the shared-memory scheme), ``grads`` is not given and the graph runs in float
    only (float16 gradients would leave the shared memory at every backward pass).
    ``True`` asks for it and raises, naming the reason, where it cannot be done. If the
    gradients do not fit in the machine's shared memory, auto logs a warning and does not
    share them.
    """
    if shared_grads is False:
        return False
    reasons = []
    if not hasattr(comm, "share_grads"):
        reasons.append(f"the communicator ({type(comm).__name__}) has no share_grads")
    elif getattr(comm, "algorithm", None) != "shared_memory":
        reasons.append(f"the communicator uses algorithm={getattr(comm, 'algorithm', None)!r}, "
                       f"not 'shared_memory'")
    if grads is not None:
        reasons.append("grads is given (the updater can only place the gradients of the "
                       "solver's parameters)")
    if not float_only:
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

"""Our own values sent through a communicator's all-reduce exactly, whatever dtype it
reduces in, and what the reduction does to dtypes.

nnabla's NCCL communicator made from a cudnn half or mixed_half context (or a cuda
half one; cuda's mixed_half gives a float32 one) casts every array it
reduces to float16 in place, ours included: a loss of 40000 on each of two ranks sums to
inf, any value keeps 3 digits, a measured room of 2047.9 rounds up to 2048. So values that
must come through exactly travel as their bytes, one byte (0 to 255) per element, each
rank in a slot of its own (:class:`RankSlots`): every integer up to 2048 is exact in
float16, the other ranks' slots hold zeros, so the sum is exact in any floating dtype;
after a division by the number of ranks, multiplying back and rounding restores it.

What the reduction does to dtypes is learned once, when an updater is built
(:func:`handshake`, which also exchanges the model fingerprints): an all-reduce of a
float32 and a float16 array, whose dtypes are read after (:class:`Reduction`).

The step's flags (some rank's overflow, each rank's loss, each rank's step index) ride in
the step's all-reduce (:mod:`nnabla_mpt.distributed.agreement`): overflow and loss as two summed
float32 values where the reduction keeps float32 (the cheapest), the loss in byte slots
where it is float16 (:class:`StepFlags`); the step indices in byte slots either way, so that ranks whose steps were paired out of order are named.
"""
from dataclasses import dataclass
from typing import Dict, List, Tuple

import numpy as np

import nnabla as nn


class RankSlots:
    """``count`` values of ``dtype`` per rank, as bytes, each rank in its own slot.

    Args:
        rank, size: This rank and the number of ranks.
        dtype: The values' NumPy dtype.
        count: Values per rank.
    """

    def __init__(self, rank: int, size: int, dtype, count: int = 1) -> None:
        self._rank = rank
        self._size = size
        self._dtype = np.dtype(dtype)
        self._count = count
        self.length = size * count * self._dtype.itemsize   # elements of the array sent

    def encode(self, values) -> np.ndarray:
        """The float32 array to sum over the ranks: this rank's bytes in its slot."""
        raw = np.ascontiguousarray(values, dtype=self._dtype).view(np.uint8)
        slots = np.zeros((self._size, raw.size), dtype=np.float32)
        slots[self._rank] = raw
        return slots.ravel()

    def decode(self, summed, divided: bool = False) -> np.ndarray:
        """Every rank's values, ``(size, count)``, from the sum of the ranks' arrays (or
        their mean, ``divided``)."""
        summed = np.asarray(summed, dtype=np.float64)
        if divided:
            summed = summed * self._size
        raw = np.rint(summed).astype(np.uint8)
        return raw.view(self._dtype).reshape(self._size, self._count)


@dataclass(frozen=True)
class Reduction:
    """What a communicator's all-reduce does to dtypes.

    Attributes:
        after: The dtype an array of each floating dtype (``"float16"``, ``"float32"``)
            holds after the all-reduce: its own for :class:`~nnabla_mpt.MPICommunicator`
            (it sums in float32 and writes back), the communicator's for nnabla's (it casts
            in place).
    """
    after: Dict[str, str]

    @property
    def float16(self) -> bool:
        """Whether it reduces float32 arrays in float16 (nnabla's half communicator)."""
        return self.after["float32"] == "float16"

    def dtype_after(self, dtype: str) -> str:
        """The dtype an array of ``dtype`` holds after the all-reduce."""
        return self.after.get(dtype, dtype)


def handshake(comm, fingerprint: bytes) -> Tuple[List[bytes], Reduction]:
    """Every rank's ``fingerprint`` (bytes of the same length on every rank), in rank
    order, and what the all-reduce of ``comm`` does to dtypes: one all-reduce of a float32
    array (the fingerprints) and a one-element float16 array."""
    slots = RankSlots(comm.rank, comm.size, np.uint8, len(fingerprint))
    carrier = nn.NdArray.from_numpy_array(slots.encode(np.frombuffer(fingerprint, np.uint8)))
    probe = nn.NdArray.from_numpy_array(np.zeros(1, np.float16))
    comm.all_reduce([carrier, probe], division=False, inplace=True)
    reduction = Reduction({"float32": str(carrier.dtype), "float16": str(probe.dtype)})
    return [row.tobytes() for row in slots.decode(carrier.data)], reduction


class StepFlags:
    """The step's flags: the number of ranks that found an overflow, the loss, then each
    rank's step index in its slot (:class:`RankSlots`). The loss travels as one float32
    value summed over the ranks where the reduction keeps float32 (the cheapest), as each
    rank's float32 bytes in its slots where it reduces in float16 (``slotted``; the mean
    is then taken here, in float64); the overflow count is exact up to 2048 ranks.

    Args:
        rank, size: This rank and the number of ranks.
        divided: The all-reduce divides by the number of ranks (averages).
        slotted: The reduction is in float16 (:attr:`Reduction.float16`).
    """

    def __init__(self, rank: int, size: int, divided: bool, slotted: bool) -> None:
        self._size = size
        self._divided = divided
        self._losses = RankSlots(rank, size, np.float32) if slotted else None
        self._steps = RankSlots(rank, size, np.uint32)
        self._middle = 1 + (self._losses.length if slotted else 1)
        self.length = self._middle + self._steps.length

    def encode(self, overflow: bool, loss: float, step: int) -> np.ndarray:
        """This rank's flags at its step ``step``."""
        if self._losses is None:
            loss_part = np.array([loss], np.float32)
        else:
            loss_part = self._losses.encode(loss)
        return np.concatenate([np.array([overflow], np.float32), loss_part,
                               self._steps.encode(step)])

    def decode(self, reduced) -> Tuple[bool, float, np.ndarray]:
        """``(some rank overflowed, the mean loss over the ranks, every rank's step)``."""
        reduced = np.asarray(reduced, dtype=np.float64)
        steps = self._steps.decode(reduced[self._middle:], self._divided).ravel()
        if self._losses is None:
            mean = reduced[1] if self._divided else reduced[1] / self._size
        else:
            losses = self._losses.decode(reduced[1:self._middle], self._divided)
            mean = losses.astype(np.float64).mean()
        return bool(reduced[0] > 0.0), float(mean), steps

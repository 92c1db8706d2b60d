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
float32 values where the reduction keeps float32 (:class:`SummedFlags`, the cheapest), in
byte slots where it is float16 (:class:`SlottedFlags`); the step indices in byte slots
either way, so that ranks whose steps were paired out of order are named.
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
    carrier = _ndarray(slots.encode(np.frombuffer(fingerprint, dtype=np.uint8)), np.float32)
    probe = _ndarray(np.zeros(1), np.float16)
    comm.all_reduce([carrier, probe], division=False, inplace=True)
    reduction = Reduction({"float32": str(carrier.dtype), "float16": str(probe.dtype)})
    seen = slots.decode(carrier.data)
    return [row.tobytes() for row in seen], reduction


def _ndarray(values: np.ndarray, dtype) -> "nn.NdArray":
    array = nn.NdArray(values.shape)
    array.cast(dtype)[...] = values
    return array


class SummedFlags:
    """The step's flags as two float32 values summed over the ranks, the number of ranks
    that found an overflow and the sum of their losses, then each rank's step index in
    its slot (:class:`RankSlots`). For reductions that keep float32.

    Args:
        rank, size: This rank and the number of ranks.
        divided: The all-reduce divides by the number of ranks (averages).
    """

    def __init__(self, rank: int, size: int, divided: bool) -> None:
        self._size = size
        self._divided = divided
        self._steps = RankSlots(rank, size, np.uint32)
        self.length = 2 + self._steps.length

    def encode(self, overflow: bool, loss: float, step: int) -> np.ndarray:
        """This rank's flags at its step ``step``."""
        return np.concatenate([np.array([overflow, loss], dtype=np.float32),
                               self._steps.encode(step)])

    def decode(self, reduced) -> Tuple[bool, float, np.ndarray]:
        """``(some rank overflowed, the mean loss over the ranks, every rank's step)``."""
        flag, loss = float(reduced[0]), float(reduced[1])
        steps = self._steps.decode(reduced[2:], self._divided).ravel()
        return flag > 0.0, loss if self._divided else loss / self._size, steps


class SlottedFlags:
    """The step's flags for a reduction in float16: the number of ranks that found an
    overflow (exact up to 2048 ranks), then each rank's loss as float32 bytes and its step
    index in its slots (:class:`RankSlots`); the mean is taken here, in float64.

    Args:
        rank, size: This rank and the number of ranks.
        divided: The all-reduce divides by the number of ranks (averages).
    """

    def __init__(self, rank: int, size: int, divided: bool) -> None:
        self._losses = RankSlots(rank, size, np.float32)
        self._steps = RankSlots(rank, size, np.uint32)
        self._divided = divided
        self.length = 1 + self._losses.length + self._steps.length

    def encode(self, overflow: bool, loss: float, step: int) -> np.ndarray:
        """This rank's flags at its step ``step``."""
        return np.concatenate([np.array([overflow], np.float32), self._losses.encode(loss),
                               self._steps.encode(step)])

    def decode(self, reduced) -> Tuple[bool, float, np.ndarray]:
        """``(some rank overflowed, the mean loss over the ranks, every rank's step)``."""
        reduced = np.asarray(reduced, dtype=np.float64)
        middle = 1 + self._losses.length
        losses = self._losses.decode(reduced[1:middle], self._divided).astype(np.float64)
        steps = self._steps.decode(reduced[middle:], self._divided).ravel()
        return bool(reduced[0] > 0.0), float(losses.mean()), steps


def step_flags(comm, reduction: Reduction, divided: bool):
    """The flags' codec of a step whose flags travel in a float32 array through ``comm``:
    in byte slots where ``comm`` reduces in float16."""
    if reduction.float16:
        return SlottedFlags(comm.rank, comm.size, divided)
    return SummedFlags(comm.rank, comm.size, divided)

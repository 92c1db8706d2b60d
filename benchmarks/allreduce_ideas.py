"""Alternatives to the fused all-reduce that were measured and not adopted.

Run (2 ranks)::

    OMP_NUM_THREADS=1 .venv/bin/mpiexec -n 2 .venv/bin/python benchmarks/allreduce_ideas.py

Same layouts and timing as ``allreduce_bench.py`` (interleaved repetitions, median of
the slowest rank), float32 gradients. Compared with the default
``MPICommunicator().all_reduce(grads)`` (shared memory on one machine):

* ``mpi copies``: ``algorithm="reduce_scatter"``: copy into one buffer,
  ``Reduce_scatter_block`` + ``Allgather``, copy back;
* ``zero-copy datatypes``: no copy at all on the sending side: for every rank's block
  of the fused index space an ``MPI_Type_create_hindexed`` datatype over the arrays'
  own memory (absolute addresses, ``MPI_BOTTOM``); one ``Alltoallw`` sends each block
  to its owner, the owner sums the received contributions with NumPy into the arrays,
  and a second ``Alltoallw`` sends the sums back into every rank's arrays. (A single
  ``MPI_Allreduce`` on such a datatype is not possible: the predefined ``MPI_SUM`` is
  only defined on predefined datatypes; the script shows MPICH's error.)
* ``pipelined``: copy into one buffer in 4 chunks, starting an ``Iallreduce`` on each
  chunk as soon as it is copied, so that copying and reducing could overlap; then copy
  back.

Pointers are read with ``NdArray.data_ptr`` inside the timed region in every variant.
"""
import argparse
import ctypes

import numpy as np
from mpi4py import MPI
from nnabla.ext_utils import get_extension_context

from allreduce_bench import layouts, make_grads, time_variants
from nnabla_mpt import MPICommunicator

F32 = np.dtype(np.float32)


class ZeroCopyTwoPhase:
    """Reduce-scatter and allgather by Alltoallw on hindexed datatypes over the arrays."""

    def __init__(self, comm):
        self.comm = comm
        self.size, self.rank = comm.Get_size(), comm.Get_rank()
        self.key, self.types = None, None

    def _build(self, ptrs, sizes):
        """One datatype per rank's block: the pieces of the arrays that fall into it."""
        total = sum(sizes)
        base, extra = divmod(total, self.size)
        counts = [base + (j < extra) for j in range(self.size)]
        starts = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
        types, lo, pieces = [], 0, []
        for j, c in enumerate(counts):
            hi = lo + c
            lens, disps, mine = [], [], []
            for i, (p, s0, s1) in enumerate(zip(ptrs, starts[:-1], starts[1:])):
                a, b = max(lo, s0), min(hi, s1)
                if b > a:
                    lens.append(int(b - a))
                    disps.append(int(p + 4 * (a - s0)))
                    mine.append((int(p + 4 * (a - s0)), int(a - lo), int(b - a)))
            types.append(MPI.FLOAT.Create_hindexed(lens, disps).Commit())
            pieces.append(mine)
            lo = hi
        return counts, types, pieces[self.rank]

    def __call__(self, ptrs, sizes):
        key = (tuple(ptrs), tuple(sizes))
        if key != self.key:  # rebuilt whenever nnabla moved an array
            if self.types:
                for t in self.types[1]:
                    t.Free()
            self.types, self.key = self._build(ptrs, sizes), key
        counts, types, mine = self.types
        P, r = self.size, self.rank
        c = counts[r]
        recv = np.empty(P * c, F32)
        ones = [1] * P
        zeros = [0] * P
        # phase 1: block j of my arrays to rank j; my block from every rank, contiguous
        self.comm.Alltoallw([MPI.BOTTOM, (ones, zeros), types],
                            [recv, ([c] * P, [4 * c * j for j in range(P)]), [MPI.FLOAT] * P])
        acc = recv[:c]
        for j in range(1, P):
            acc += recv[j * c:(j + 1) * c]
        # phase 2: my summed block to every rank, into block r of its arrays
        self.comm.Alltoallw([acc, ([c] * P, zeros), [MPI.FLOAT] * P],
                            [MPI.BOTTOM, (ones, zeros), types])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    args = parser.parse_args()

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    ctx = get_extension_context("cpu")
    default = MPICommunicator()
    mpi_copies = MPICommunicator(algorithm="reduce_scatter")
    zero_copy = ZeroCopyTwoPhase(world)
    memmove = ctypes.memmove

    # a single MPI_Allreduce over an hindexed datatype: refused by the MPI library
    probe = np.ones(4, F32)
    t = MPI.FLOAT.Create_hindexed([2, 2], [probe.ctypes.data, probe.ctypes.data + 8]).Commit()
    try:
        world.Allreduce(MPI.IN_PLACE, [MPI.BOTTOM, 1, t], op=MPI.SUM)
        allreduce_on_datatype = "accepted"
    except MPI.Exception as e:
        allreduce_on_datatype = e.Get_error_string().splitlines()[-1].strip()
    t.Free()

    results = {}
    for name in ("cnn-50", "resnet-200"):
        shapes = layouts()[name]
        grads = make_grads(shapes, rank)
        views = [g.get_data("rw") for g in grads]
        sizes = [g.size for g in grads]
        total = sum(sizes)
        buf = np.empty(total, F32)
        bufp = buf.ctypes.data
        bounds = np.linspace(0, total, 5).astype(int)

        def zc(grads):
            zero_copy([g.data_ptr(F32, ctx, False) for g in grads], sizes)

        def pipelined(grads):
            ptrs = [g.data_ptr(F32, ctx, False) for g in grads]
            reqs, off, k = [], 0, 1
            for p, n in zip(ptrs, sizes):
                memmove(bufp + 4 * off, p, 4 * n)
                off += n
                while k < len(bounds) and off >= bounds[k]:
                    reqs.append(world.Iallreduce(MPI.IN_PLACE, buf[bounds[k - 1]:bounds[k]],
                                                 op=MPI.SUM))
                    MPI.Request.Testall(reqs)
                    k += 1
            MPI.Request.Waitall(reqs)
            off = 0
            for p, n in zip(ptrs, sizes):
                memmove(p, bufp + 4 * off, 4 * n)
                off += n

        variants = {"default": default.all_reduce, "mpi copies": mpi_copies.all_reduce,
                    "zero-copy datatypes": zc, "pipelined": pipelined}
        # every variant gives the default's result
        for v, fn in variants.items():
            for x in views:
                x[...] = np.arange(x.size).reshape(x.shape) % 7 + rank
            fn(grads)
            for x in views:
                np.testing.assert_array_equal(
                    x, (np.arange(x.size).reshape(x.shape) % 7) * size + size * (size - 1) / 2,
                    err_msg=v)
        results[name] = time_variants(world, variants, grads, views, args.warmup, args.reps)

    if rank == 0:
        print(f"# {size} ranks, {args.reps} repetitions, median of the slowest rank, float32; "
              f"default scheme: {default.algorithm}")
        print(f"# MPI_Allreduce(MPI_SUM) on an hindexed datatype: {allreduce_on_datatype}")
        print()
        print("| layout | default (ms) | mpi copies (ms) | zero-copy datatypes (ms) "
              "| pipelined (ms) |")
        print("|---|---:|---:|---:|---:|")
        for name, t in results.items():
            print(f"| {name} | {t['default'] * 1e3:.2f} | {t['mpi copies'] * 1e3:.2f} "
                  f"| {t['zero-copy datatypes'] * 1e3:.2f} | {t['pipelined'] * 1e3:.2f} |")


if __name__ == "__main__":
    main()

"""Fused gradient all-reduce versus one all-reduce per parameter array.

Run (2 ranks)::

    .venv/bin/mpiexec -n 2 .venv/bin/python benchmarks/allreduce_bench.py

Three gradient layouts with realistic shapes (float32):

* ``mlp-10``: an MLP 784-512-256-128-64-10, weights and biases (10 arrays).
* ``cnn-50``: 16 3x3 convolutions (32 to 128 channels) each with batch-norm scale and
  shift, and a classifier (50 arrays).
* ``resnet-200``: 66 3x3 convolutions (16 to 64 channels, CIFAR-ResNet widths) each with
  batch-norm scale and shift, and a classifier (200 arrays).

For each layout it times, interleaved repetition by repetition:

* ``fused``: ``MPICommunicator().all_reduce(shared.arrays)`` on gradients placed in shared
  memory by ``comm.share_grads(params)``, as the updaters do on float32 graphs: the sums
  are made where the gradients are, nothing is copied;
* ``fused, own memory``: the same call on ordinary nnabla gradient arrays (the default
  scheme, on one machine through shared memory: copies into and out of it included);
* ``per-array comm``: the same communicator's ``all_reduce([g])`` once per ordinary array,
  i.e. the same reduction (float32, bit-exact) without fusion;
* ``per-array raw MPI``: ``MPI_Allreduce`` in place on every ordinary array's own memory,
  one call per array: no copies, no widening of float16, no bit-exactness guarantee;
* ``per-array, shared``: ``all_reduce([g])`` once per array of the shared gradients (each
  call sums its one array in place): what fusion alone gains once nothing is copied.

The ratios are per-array time / fused time (above 1: fusion is faster).

A second table compares the fused schemes: shared memory (the default on one machine),
reduce-scatter + allgather (the default across machines), reduce + bcast, and a plain
in-place ``MPI_Allreduce`` of the copied buffer, for reference (the same on every rank
with two ranks, where each element is one commutative addition, up to NaN payloads; not
guaranteed with more). Each time is the slowest rank's, the tables show medians.
"""
import argparse
import time

import numpy as np

import nnabla as nn
from mpi4py import MPI
from nnabla.ext_utils import get_extension_context

from _machine import cpu_model
from nnabla_mpt import MPICommunicator
from nnabla_mpt.core._hostarray import host_view
from nnabla_mpt.distributed.message_reduction import MessageReduction


def layouts():
    """name -> list of array shapes."""
    mlp = []
    widths = [784, 512, 256, 128, 64, 10]
    for a, b in zip(widths[:-1], widths[1:]):
        mlp += [(a, b), (b,)]

    def conv_bn(channels):
        shapes, cin = [], 3
        for c in channels:
            shapes += [(c, cin, 3, 3), (1, c, 1, 1), (1, c, 1, 1)]
            cin = c
        return shapes + [(cin, 10), (10,)]

    cnn = conv_bn([32] * 5 + [64] * 6 + [128] * 5)
    resnet = conv_bn([16] * 22 + [32] * 22 + [64] * 22)
    out = {"mlp-10": mlp, "cnn-50": cnn, "resnet-200": resnet}
    for name, shapes in out.items():
        assert len(shapes) == int(name.split("-")[1]), (name, len(shapes))
    return out


class PlainAllreduce(MessageReduction):
    """The copying fused all-reduce with a plain in-place MPI_Allreduce (for comparison only)."""

    def reduce(self, buf):
        self.comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)


def plain_allreduce_communicator():
    """A communicator whose fused all-reduce copies as reduce-scatter does, then sums the
    buffer with one plain MPI_Allreduce."""
    comm = MPICommunicator(algorithm="reduce_scatter")
    comm._messages = PlainAllreduce(MPI, comm.comm, "reduce_scatter")
    return comm


def shared_grads(comm, grads):
    """Parameters with these gradients' values, their gradients placed by ``share_grads``."""
    params = []
    for g in grads:
        v = nn.Variable(g.shape)
        v.g = g.get_data("r")
        params.append(v)
    return comm.share_grads(params)


def make_grads(shapes, rank):
    rng = np.random.RandomState(rank)
    grads = []
    for s in shapes:
        a = nn.NdArray(s)
        a.cast(np.float32)[...] = rng.randn(*s)
        grads.append(a)
    return grads


def time_variants(world, variants, grads, views, warmup, reps):
    """Median seconds of each variant, taking the slowest rank of every repetition.

    The variants run interleaved (A B C A B C ...), each after a barrier. Before each run the
    arrays are divided by the number of ranks, so repeated sums keep their magnitude.
    """
    size = world.Get_size()
    times = {v: [] for v in variants}
    for rep in range(warmup + reps):
        for v, fn in variants.items():
            for view in views:
                view *= 1.0 / size
            world.Barrier()
            t0 = time.perf_counter()
            fn(grads)
            dt = time.perf_counter() - t0
            if rep >= warmup:
                times[v].append(dt)
    slowest = {v: np.max(world.allgather(np.array(t)), axis=0) for v, t in times.items()}
    return {v: float(np.median(t)) for v, t in slowest.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=60, help="timed repetitions per variant")
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()

    world = MPI.COMM_WORLD
    comm = MPICommunicator()
    untimed = MPICommunicator(timeout=None)     # the same, without a collective timeout
    reduce_scatter = MPICommunicator(algorithm="reduce_scatter")
    reduce_bcast = MPICommunicator(algorithm="reduce_bcast")
    plain = plain_allreduce_communicator()
    rank, size = comm.rank, comm.size

    results = {}
    for name, shapes in layouts().items():
        grads = make_grads(shapes, rank)
        # numpy views of the arrays' memory, taken once (outside the timings) so that the
        # unfused baseline pays for nothing but MPI
        views = [g.get_data("rw") for g in grads]
        shared = shared_grads(comm, grads)
        # views of the shared gradients' memory, taken once, outside the timings
        cpu = get_extension_context("cpu")
        views += [host_view(a, np.dtype(np.float32), cpu) for a in shared.arrays]

        def per_array_mpi(grads):
            for v in views[:len(grads)]:
                world.Allreduce(MPI.IN_PLACE, v, op=MPI.SUM)

        def per_array_comm(grads):
            for g in grads:
                comm.all_reduce([g])

        def fused_shared(grads):
            comm.all_reduce(shared.arrays)

        def per_array_shared(grads):
            for g in shared.arrays:
                comm.all_reduce([g])

        def per_array_untimed(grads):
            for g in grads:
                untimed.all_reduce([g])

        variants = {
            "fused shared": fused_shared,
            "per-array shared": per_array_shared,
            "fused": comm.all_reduce,
            "per-array MPI": per_array_mpi,
            "per-array comm": per_array_comm,
            "fused reduce-scatter": reduce_scatter.all_reduce,
            "fused reduce+bcast": reduce_bcast.all_reduce,
            "fused plain Allreduce": plain.all_reduce,
            "fused untimed": untimed.all_reduce,
            "per-array comm untimed": per_array_untimed,
        }
        n_elems = int(sum(np.prod(s) for s in shapes))
        in_place = comm._shm.in_place_calls if comm._shm is not None else 0
        results[name] = (len(shapes), n_elems,
                         time_variants(world, variants, grads, views, args.warmup, args.reps))
        calls = (args.warmup + args.reps) * (1 + len(shapes))
        if comm._shm is not None and comm._shm.in_place_calls - in_place != calls:
            raise RuntimeError(f"{name}: {comm._shm.in_place_calls - in_place} of {calls} calls "
                               f"on the shared gradients were reduced in place")

    if rank != 0:
        return
    cpu = cpu_model()
    import os
    print(f"# {size} ranks, {os.cpu_count()} CPUs ({cpu}), {args.reps} repetitions, "
          f"median of the slowest rank, float32 gradients; default scheme: {comm.algorithm}")
    print()
    print("| layout | arrays | elements | fused (ms) | per-array comm (ms) | ratio "
          "| per-array raw MPI (ms) | ratio | per-array, shared (ms) | ratio "
          "| fused, own memory (ms) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, (k, n, t) in results.items():
        f, c, m = t["fused shared"], t["per-array comm"], t["per-array MPI"]
        ps, fo = t["per-array shared"], t["fused"]
        print(f"| {name} | {k} | {n:,} | {f * 1e3:.2f} | {c * 1e3:.2f} | {c / f:.1f}x "
              f"| {m * 1e3:.2f} | {m / f:.1f}x | {ps * 1e3:.2f} | {ps / f:.1f}x "
              f"| {fo * 1e3:.2f} |")
    print()
    print("Fused call on gradients in their own memory, by scheme:")
    print()
    print(f"| layout | {comm.algorithm} (ms) | reduce-scatter+allgather (ms) | reduce+bcast (ms) "
          "| plain Allreduce (ms) |")
    print("|---|---:|---:|---:|---:|")
    for name, (k, n, t) in results.items():
        print(f"| {name} | {t['fused'] * 1e3:.2f} | {t['fused reduce-scatter'] * 1e3:.2f} "
              f"| {t['fused reduce+bcast'] * 1e3:.2f} | {t['fused plain Allreduce'] * 1e3:.2f} |")
    print()
    print("The collective timeout (default 600 s) against timeout=None, same scheme:")
    print()
    print("| layout | fused (ms) | untimed (ms) | ratio | per-array comm (ms) | untimed (ms) "
          "| ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, (k, n, t) in results.items():
        f, fu = t["fused"], t["fused untimed"]
        c, cu = t["per-array comm"], t["per-array comm untimed"]
        print(f"| {name} | {f * 1e3:.3f} | {fu * 1e3:.3f} | {f / fu:.3f} | {c * 1e3:.3f} "
              f"| {cu * 1e3:.3f} | {c / cu:.3f} |")


if __name__ == "__main__":
    main()

"""Data-parallel training throughput: 2 MPI ranks versus 1 process.

Run::

    .venv/bin/python benchmarks/dataparallel_bench.py

The script launches itself under ``mpiexec -n 1`` and ``mpiexec -n 2`` (the mpiexec next to
the running Python), alternating the two configurations for ``--reps`` rounds, with
``OMP_NUM_THREADS=1`` in every rank so that each rank uses one core. Each run trains a
compute-bound float MLP (784-1024-1024-10, 1.86 M parameters) with
``DynamicLossScalingUpdater`` and Momentum SGD; with 2 ranks the updater averages the
gradients through ``MPICommunicator`` (one fused all-reduce per step). Every rank processes
``--batch`` samples per step (weak scaling), so the ideal speed-up is 2x. The table shows the
median samples/s over the rounds, and the time per step spent in the all-reduce (rank 0,
which includes waiting for the slower rank).
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from _machine import cpu_model


def worker(args):
    import nnabla as nn
    import nnabla.functions as F
    import nnabla.parametric_functions as PF
    import nnabla.solvers as S
    from nnabla.ext_utils import get_extension_context

    from nnabla_mpt import DynamicLossScalingUpdater, GradientReduction, MPICommunicator

    comm = MPICommunicator()
    reduce_time = [0.0]
    fused_all_reduce = comm.all_reduce

    def timed_all_reduce(*a, **k):  # measures the communication share of a step
        t0 = time.perf_counter()
        fused_all_reduce(*a, **k)
        reduce_time[0] += time.perf_counter() - t0

    comm.all_reduce = timed_all_reduce
    nn.set_default_context(get_extension_context("cpu", type_config="float"))
    b = args.batch
    x, t = nn.Variable((b, 784)), nn.Variable((b, 1))
    h = F.relu(PF.affine(x, 1024, name="fc1"))
    h = F.relu(PF.affine(h, 1024, name="fc2"))
    loss = F.mean(F.softmax_cross_entropy(PF.affine(h, 10, name="fc3"), t))
    solver = S.Momentum(0.01, 0.9)
    solver.set_parameters(nn.get_parameters())
    comm.broadcast_parameters(nn.get_parameters())
    rng = np.random.RandomState(comm.rank)
    xs = rng.rand(16, b, 784).astype(np.float32)
    ts = rng.randint(0, 10, (16, b, 1))

    def feed():
        i = updater.steps % 16
        x.d, t.d = xs[i], ts[i]

    updater = DynamicLossScalingUpdater(solver, loss, feed, scale=8.0,
                                        comm=comm if comm.size > 1 else None,
                                        reduction=GradientReduction(average_ranks=True))
    for _ in range(args.warmup):
        updater.update()
    comm.barrier()
    reduce_time[0] = 0.0
    start = time.perf_counter()
    for _ in range(args.steps):
        updater.update()
    comm.barrier()
    elapsed = time.perf_counter() - start
    if comm.rank == 0:
        print(json.dumps({"ranks": comm.size, "samples_per_s": args.steps * b * comm.size / elapsed,
                          "step_ms": 1e3 * elapsed / args.steps,
                          "all_reduce_ms": 1e3 * reduce_time[0] / args.steps}), flush=True)


def driver(args):
    mpiexec = Path(sys.executable).parent / "mpiexec"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    results = {1: [], 2: []}
    for rep in range(args.reps):
        for n in (1, 2):
            cmd = [str(mpiexec), "-n", str(n), sys.executable, __file__, "--worker",
                   "--batch", str(args.batch), "--steps", str(args.steps),
                   "--warmup", str(args.warmup)]
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
            if proc.returncode != 0:
                raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
            line = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1]
            results[n].append(json.loads(line))
    cpu = cpu_model()
    print(f"# {os.cpu_count()} CPUs ({cpu}), OMP_NUM_THREADS=1 per rank, float MLP "
          f"784-1024-1024-10, batch {args.batch} per rank, {args.steps} timed steps, "
          f"median of {args.reps} alternating runs")
    print()
    print("| ranks | samples/s | step (ms) | all-reduce in step (ms) | speed-up |")
    print("|---:|---:|---:|---:|---:|")
    base = np.median([r["samples_per_s"] for r in results[1]])
    for n in (1, 2):
        sps = np.median([r["samples_per_s"] for r in results[n]])
        ms = np.median([r["step_ms"] for r in results[n]])
        red = np.median([r["all_reduce_ms"] for r in results[n]])
        print(f"| {n} | {sps:.0f} | {ms:.1f} | {red:.1f} | {sps / base:.2f}x |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=128, help="samples per rank and step")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    (worker if args.worker else driver)(args)


if __name__ == "__main__":
    main()

"""MPI worker: data-parallel training with the loss-scaling updaters and MPICommunicator.

Usage: mpiexec -n N python train.py OUTDIR MODE [ARGS]

MODE "overflow" BAD_RANK FACTOR STEPS...: float16 network; at the listed steps the batch
    of rank BAD_RANK only is multiplied by FACTOR: 50 makes its float16 gradients overflow
    in backward (the loss stays finite), 1e4 makes its loss itself non-finite.
MODE "streak" BAD_RANK FACTOR STEPS...: like "overflow" with diagnose_after 3; the listed
    steps form a streak of overflows that only BAD_RANK's batch causes (each rank
    diagnoses its own batch; the ranks must still act alike).
MODE "badbatch" BAD_RANK ACCUM_GRAD STEPS...: like "overflow" with ACCUM_GRAD
    micro-batches a step; at the listed steps the batch of rank BAD_RANK is all NaN (through
    the ReLU its loss stays finite while its gradients are NaN): a bad batch.
MODE "overflow32" BAD_RANK FACTOR STEPS...: like "overflow" with a float32 network and a
    loss scale of 2**60: a FACTOR of 1e12 makes rank BAD_RANK's scaled float32 gradients
    overflow while its loss stays finite (the gradients live in shared memory).
MODE "parity" ACCUM_GRAD [SHARED]: float network trained averaging over the ranks; rank 0
    also trains a single-process copy on the concatenated batches for comparison. SHARED
    "off" keeps the gradients out of shared memory (default: the updater's automatic
    choice).
MODE "raise" STEP: float network; the data feeder of the last rank raises at STEP.
Results go to OUTDIR/rank{r}.npz and OUTDIR/rank{r}.json.
"""
import sys
from pathlib import Path

import numpy as np

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla.solvers as S
from nnabla.ext_utils import get_extension_context

from nnabla_mpt import (DynamicLossScale, DynamicLossScalingUpdater, GradientReduction,
                        MPICommunicator, OverflowHandling)
from worker_common import save

outdir, mode, args = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
comm = MPICommunicator()
rank, size = comm.rank, comm.size


def mlp(x, hidden, out):
    return PF.affine(F.relu(PF.affine(x, hidden, name="fc1")), out, name="fc2")


def snapshot(params):
    return {k: v.d.copy() for k, v in params.items()}


def states_snapshot(solver):
    return {f"{k}/{s}": v.d.copy() for k, st in solver.get_states().items()
            for s, v in st.pstate.items()}


def same(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


out, meta = {}, {"rank": rank, "size": size}

if mode in ("overflow", "streak", "overflow32", "badbatch"):
    bad_rank, factor, bad_steps = int(args[0]), float(args[1]), {int(s) for s in args[2:]}
    accum = 1
    if mode == "badbatch":
        accum, factor = int(args[1]), float("nan")
    precision = "float" if mode == "overflow32" else "half"
    nn.set_default_context(get_extension_context("cpu", type_config=precision))
    x, t = nn.Variable((4, 6)), nn.Variable((4, 3))
    with nn.parameter_scope("net"):
        loss = F.mean(F.squared_error(mlp(x, 8, 3), t))
        params = nn.get_parameters()
    rng = np.random.RandomState(rank)  # different on every rank until broadcast
    for v in params.values():
        v.d = rng.randn(*v.shape) * 0.5
    comm.broadcast_parameters(params)
    solver = S.Momentum(lr=0.05, momentum=0.9)
    solver.set_parameters(params)

    def feed():
        step = updater.steps
        data = np.random.RandomState(1000 * rank + step)
        x.d = data.randn(4, 6) * (factor if (rank == bad_rank and step in bad_steps) else 1.0)
        t.d = data.randn(4, 3)

    extra = ({"overflow": OverflowHandling(diagnose_after=3)} if mode == "streak"
             else {"accum_grad": accum})
    scale, max_scale = (2.0 ** 60, 2.0 ** 62) if precision == "float" else (1024.0, 4096.0)
    updater = DynamicLossScalingUpdater(
        solver, loss, feed, comm=comm,
        policy=DynamicLossScale(init_scale=scale, growth_interval=3, max_scale=max_scale),
        reduction=GradientReduction(average_ranks=True), **extra)
    meta["shared_grads"] = updater.shared_gradients is not None
    calls0, in_place0 = comm.n_all_reduce_calls, comm._shm.in_place_calls
    meta.update(skipped=[], bad_batch=[], scale=[], next_scale=[], params_unchanged=[],
                states_unchanged=[])
    for i in range(10):
        p0, s0 = snapshot(params), states_snapshot(solver)
        r = updater.update()
        meta["skipped"].append(bool(r.skipped))
        meta["bad_batch"].append(bool(r.bad_batch))
        meta["scale"].append(r.scale)
        meta["next_scale"].append(r.next_scale)
        meta["params_unchanged"].append(same(p0, snapshot(params)))
        meta["states_unchanged"].append(same(s0, states_snapshot(solver)))
    meta["all_reduce_calls"] = comm.n_all_reduce_calls - calls0
    meta["in_place_calls"] = comm._shm.in_place_calls - in_place0
    meta["skipped_steps"] = updater.skipped_steps
    meta["bad_batches"] = updater.bad_batches
    meta["updates"] = updater.updates
    report = getattr(updater, "last_report", None)
    meta["report_kind"] = None if report is None else report.kind
    out.update({f"param/{k}": v for k, v in snapshot(params).items()})

elif mode == "parity":
    accum = int(args[0])
    shared_grads = False if args[1:] == ["off"] else None
    full, steps = 12, 6
    local = full // size
    nn.set_default_context(get_extension_context("cpu", type_config="float"))

    def batch(step, micro):
        data = np.random.RandomState(100 * step + micro)
        return data.randn(full, 10), data.randn(full, 4)

    x, t = nn.Variable((local, 10)), nn.Variable((local, 4))
    with nn.parameter_scope("dist"):
        loss = F.mean(F.squared_error(mlp(x, 16, 4), t))
        params = nn.get_parameters()
    rng = np.random.RandomState(50 + rank)
    for v in params.values():
        v.d = rng.randn(*v.shape) * 0.5
    comm.broadcast_parameters(params)
    init = snapshot(params)
    solver = S.Momentum(lr=0.05, momentum=0.9)
    solver.set_parameters(params)
    micro = [0]

    def feed():
        xs, ts = batch(updater.steps, micro[0] % accum)
        micro[0] += 1
        x.d = xs[rank * local:(rank + 1) * local]
        t.d = ts[rank * local:(rank + 1) * local]

    updater = DynamicLossScalingUpdater(solver, loss, feed, 8.0, 2.0, 1000, True, accum,
                                        comm=comm, average_accum=True,
                                        reduction=GradientReduction(
                                            average_ranks=True, shared_grads=shared_grads))
    meta["shared_grads"] = updater.shared_gradients is not None
    meta["grads_are_shared"] = (updater.shared_gradients is not None and all(
        v.grad == a for v, a in zip(solver.get_parameters().values(), updater.shared_gradients.arrays)))
    calls0, coll0 = comm.n_all_reduce_calls, comm.n_collectives
    in_place0 = comm._shm.in_place_calls
    meta["skipped"] = [updater.update().skipped for i in range(steps)]
    meta["all_reduce_calls"] = comm.n_all_reduce_calls - calls0
    meta["collectives"] = comm.n_collectives - coll0
    meta["in_place_calls"] = comm._shm.in_place_calls - in_place0
    meta["steps"] = steps
    out.update({f"param/{k}": v for k, v in snapshot(params).items()})

    if rank == 0:  # the same training in one process, on the whole batches
        xr, tr = nn.Variable((full, 10)), nn.Variable((full, 4))
        with nn.parameter_scope("ref"):
            ref_loss = F.mean(F.squared_error(mlp(xr, 16, 4), tr))
            ref_params = nn.get_parameters()
        for k, v in ref_params.items():
            v.d = init[k]
        ref_solver = S.Momentum(lr=0.05, momentum=0.9)
        ref_solver.set_parameters(ref_params)
        ref_micro = [0]

        def ref_feed():
            xr.d, tr.d = batch(ref.steps, ref_micro[0] % accum)
            ref_micro[0] += 1

        ref = DynamicLossScalingUpdater(ref_solver, ref_loss, ref_feed, 8.0, 2.0, 1000, True,
                                        accum, average_accum=True)
        for i in range(steps):
            ref.update()
        out.update({f"ref/{k}": v for k, v in snapshot(ref_params).items()})
        out.update({f"init/{k}": v for k, v in init.items()})

elif mode == "raise":
    fail_step = int(args[0])
    x, t = nn.Variable((4, 6)), nn.Variable((4, 3))
    loss = F.mean(F.squared_error(mlp(x, 8, 3), t))
    solver = S.Sgd(lr=0.1)
    solver.set_parameters(nn.get_parameters())
    comm.broadcast_parameters(nn.get_parameters())

    def feed():
        if rank == size - 1 and updater.steps == fail_step:
            raise RuntimeError(f"data loader failed on rank {rank} at step {fail_step}")
        data = np.random.RandomState(1000 * rank + updater.steps)
        x.d, t.d = data.randn(4, 6), data.randn(4, 3)

    updater = DynamicLossScalingUpdater(solver, loss, feed, comm=comm)
    for i in range(10):
        updater.update()
        (outdir / f"rank{rank}_step{i}").write_text("")
    (outdir / f"finished{rank}").write_text("")
else:
    raise SystemExit(f"unknown mode {mode!r}")

if mode != "raise":
    save(outdir, rank, out, meta)

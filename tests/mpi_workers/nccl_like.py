"""MPI worker: the updaters with a stand-in for nnabla's NCCL communicator
(``standins.NcclLikeCommunicator``), or averaging over ranks with MPICommunicator.

Usage: mpiexec -n N python nccl_like.py OUTDIR CASE

CASE:
  loss      a float16 communicator, a float graph whose loss is near 40000 on every rank:
            each rank's own loss and the reported loss of three steps
  model     a float16 communicator; the last rank builds another model: the error each
            rank raises at construction
  packed    a float graph trained with a float32 stand-in (its step packed in one array)
            and with MPICommunicator: both sets of parameters and trajectories
  average   identical batches on every rank, average_ranks=True, MPICommunicator, a half
            graph whose dynamic scale climbs to its edge; and the same run alone
            (no communicator) in another scope
  bounds    identical batches on every rank, summed by a float32 stand-in, a half graph
            with measured growth and learning rate 0; and the same run alone
Results go to OUTDIR/rank{r}.npz and OUTDIR/rank{r}.json.
"""
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla.solvers as S
from nnabla.ext_utils import get_extension_context

from nnabla_mpt import DynamicLossScalingUpdater, GradientReduction, MPICommunicator
from standins import NcclLikeCommunicator
from worker_common import save

outdir, case = Path(sys.argv[1]), sys.argv[2]
world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()


def build(scope, type_config, hidden=8, d_in=6):
    ctx = get_extension_context("cpu", type_config=type_config)
    x, t = nn.Variable((4, d_in)), nn.Variable((4, 3))
    with nn.context_scope(ctx), nn.parameter_scope(scope):
        h = F.relu(PF.affine(x, hidden, name="fc1"))
        loss = F.mean(F.squared_error(PF.affine(h, 3, name="fc2"), t))
        params = nn.get_parameters()
        solver = S.Sgd(lr=1e-3)
    rng = np.random.RandomState(0)
    for v in params.values():
        v.d = rng.randn(*v.shape) * 0.5
    solver.set_parameters(params)
    return x, t, loss, params, solver


def feeder(x, t, seed, factor=1.0, shift=0.0):
    calls = [0]

    def feed():
        data = np.random.RandomState(seed + calls[0])
        calls[0] += 1
        x.d = data.randn(*x.shape) * factor
        t.d = data.randn(*t.shape) * factor + shift
    return feed


def run(updater, steps):
    results = [updater.update() for _ in range(steps)]
    return [[r.scale, bool(r.skipped)] for r in results], results


def snapshot(params, prefix):
    return {f"{prefix}/{name}": np.array(v.d) for name, v in params.items()}


def loss_case():
    x, t, loss, params, solver = build("net", "float")
    comm = NcclLikeCommunicator("float16", world)
    # targets near 200: a squared error near 40000 on every rank, different on each (a
    # float graph: a float16 mean of twelve such values would be inf already)
    updater = DynamicLossScalingUpdater(solver, loss, feeder(x, t, 100 * rank, shift=200.0),
                                        scale=1.0, comm=comm)
    own, reported = [], []
    for _ in range(3):
        r = updater.update()
        own.append(float(loss.d))           # this rank's loss (one micro-batch)
        reported.append(r.loss)
    return {}, {"own": own, "reported": reported}


def model_case():
    hidden = 9 if rank == size - 1 else 8
    x, t, loss, params, solver = build("net", "half", hidden=hidden)
    try:
        DynamicLossScalingUpdater(solver, loss, comm=NcclLikeCommunicator("float16", world))
    except ValueError as e:
        return {}, {"error": str(e)}
    return {}, {"error": None}


def packed_case():
    arrays, meta = {}, {}
    for name, comm in (("nccl", NcclLikeCommunicator("float32", world)),
                       ("mpi", MPICommunicator())):
        x, t, loss, params, solver = build(name, "float")
        updater = DynamicLossScalingUpdater(solver, loss, feeder(x, t, 100 * rank, 30.0),
                                            scale=2.0 ** 20, N=2, comm=comm)
        meta[name], _ = run(updater, 8)
        arrays.update(snapshot(params, name))
    return arrays, meta


def average_case():
    arrays, meta = {}, {}
    for name, comm in (("ranks", MPICommunicator()), ("alone", None)):
        x, t, loss, params, solver = build(name, "half")
        updater = DynamicLossScalingUpdater(solver, loss, feeder(x, t, 7, 30.0),
                                            scale=2.0 ** 8, N=2, comm=comm,
                                            reduction=GradientReduction(average_ranks=True))
        meta[name], _ = run(updater, 16)
        arrays.update(snapshot(params, name))
    return arrays, meta


def bounds_case():
    meta = {}
    for name, comm in (("ranks", NcclLikeCommunicator("float32", world)), ("alone", None)):
        x, t, loss, params, solver = build(name, "half")
        solver.set_learning_rate(0.0)
        updater = DynamicLossScalingUpdater(solver, loss, feeder(x, t, 7, 30.0),
                                            scale="auto", growth_mode="measured", N=3,
                                            comm=comm)
        meta[name], _ = run(updater, 24)
    return {}, meta


arrays, meta = {"bounds": bounds_case, "loss": loss_case, "model": model_case,
"packed": packed_case,
                "average": average_case}[case]()
save(outdir, rank, arrays, meta)

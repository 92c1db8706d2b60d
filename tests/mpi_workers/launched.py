"""MPI worker: what a script started by ``mpiexec`` sees of the launcher and of nnabla's
process-wide communicator.

Usage: mpiexec -n N python launched.py OUTDIR MODE   (or plain python, for one process)

MODE "alone": builds two updaters without a communicator (as a script that forgot comm=
    does), takes three steps with each, and writes OUTDIR/rank{r}.json with the warnings
    nnabla's logger carried (r: the launcher's rank variable, 0 without one) and the
    parameters after the steps in rank{r}.npz.
MODE "nnabla": makes an MPICommunicator the one nnabla's current_communicator() returns,
    then uses it as nnabla's CLI does (all_reduce, all_gather, barrier, init, rank, size,
    local_rank, name), and writes what came back.
"""
import logging
import os
import sys

import numpy as np

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla.solvers as S
from nnabla.logger import logger

from worker_common import ndarray, save

outdir, mode = sys.argv[1], sys.argv[2]


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def alone():
    from nnabla_mpt import DynamicLossScalingUpdater, FixedLossScalingUpdater
    rank = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
    records = Records()
    logger.addHandler(records)
    nn.random.seed(0)
    x, t = nn.Variable((4, 6)), nn.Variable((4, 3))
    loss = F.mean(F.squared_error(PF.affine(x, 3, name="fc"), t))
    solver = S.Sgd(lr=0.1)
    solver.set_parameters(nn.get_parameters())
    data = np.random.RandomState(rank)

    def feed():
        x.d, t.d = data.randn(4, 6), data.randn(4, 3)

    for make in (DynamicLossScalingUpdater, FixedLossScalingUpdater):
        updater = make(solver, loss, feed)
        for _ in range(3):
            updater.update()
    params = {k: v.d.copy() for k, v in nn.get_parameters().items()}
    save(outdir, rank, params, {"warnings": records.messages})


def nnabla_current():
    from nnabla.utils import communicator_util
    from nnabla_mpt import MPICommunicator, set_current_communicator
    comm = MPICommunicator()
    before = communicator_util.current_communicator()
    returned = set_current_communicator(comm)
    current = communicator_util.current_communicator()
    r, n = current.rank, current.size
    meta = {"before_is_none": before is None, "returned_is_comm": returned is comm,
            "current_is_comm": current is comm, "rank": r, "size": n,
            "local_rank": current.local_rank, "name": current.name,
            "single_or_rankzero": communicator_util.single_or_rankzero()}
    current.init()
    # as nnabla's CLI sums the cost of an iteration over the ranks
    cost = ndarray(np.array([1.5 + r], np.float32))
    current.all_reduce([cost], division=False, inplace=True)
    # as nnabla's CLI gathers each rank's load
    mine = ndarray(np.array([r, 10.0 * r, -1.0], np.float32))
    gathered = [ndarray(np.zeros(3, np.float32)) for _ in range(n)]
    current.all_gather(mine, gathered)
    half = ndarray(np.array([r + 0.5, 65504.0], np.float16), np.float16)
    gathered16 = [nn.NdArray((2,)) for _ in range(n)]
    current.all_gather(half, gathered16)
    current.barrier()
    try:
        current.all_gather(ndarray(np.zeros(2 + r, np.float32)),
                           [nn.NdArray((2,)) for _ in range(n)])
        meta["mismatch"] = None
    except ValueError as e:
        meta["mismatch"] = str(e)
    meta["cleared_returns_none"] = set_current_communicator(None) is None
    meta["after_clear_is_none"] = communicator_util.current_communicator() is None
    meta["gathered16_dtypes"] = [str(a.dtype) for a in gathered16]
    arrays = {"cost": cost.data.copy(), "gathered": np.stack([a.data for a in gathered]),
              "gathered16": np.stack([a.get_data("r") for a in gathered16])}
    save(outdir, r, arrays, meta)


{"alone": alone, "nnabla": nnabla_current}[mode]()

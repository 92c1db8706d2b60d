"""Measured growth bounds each gradient by the dtype it can overflow in, not by the dtype
its array holds when read.

On a GPU the gradients of a half backward pass are float16, and they may be float32 when
the growth is measured: nnabla-ext-cuda's solvers cast them (``CastingSolver`` stands in),
a float communicator casts them while reducing (``NcclLikeCommunicator("float32")`` stands
in). Either way the next backward pass computes in float16 again, so the scales must be
those of the run without the cast.
"""
import numpy as np
import pytest

from mpi_workers.standins import CastingSolver, NcclLikeCommunicator
from nnabla_mpt import DynamicLossScalingUpdater
from support import Net

STEPS = 200


def _scales(wrap_solver=False, comm=None, scope="net"):
    net = Net("half", hidden=8, d_in=6, d_out=3, scope=scope, batch=8)
    solver = net.solver("Sgd", lr=1e-3)
    if wrap_solver:
        solver = CastingSolver(solver)
    def feeder():          # inputs and targets of tens: gradients of thousands
        net.feeder()
        net.x.d, net.t.d = net.x.d * 30.0, net.t.d * 30.0

    updater = DynamicLossScalingUpdater(solver, net.loss, feeder, scale="auto",
                                        growth_mode="measured", N=4, comm=comm)
    results = [updater.update() for _ in range(STEPS)]
    return [(r.scale, r.skipped) for r in results], net


@pytest.mark.parametrize("cast", ["solver", "float communicator"])
def test_float32_copies_of_float16_gradients_grow_the_scale_no_faster(cast):
    want, plain = _scales(scope="plain")
    if cast == "solver":
        got, net = _scales(wrap_solver=True, scope="cast")
    else:
        got, net = _scales(comm=NcclLikeCommunicator("float32"), scope="cast")
    assert got == want
    assert max(s for s, _ in want) < 2.0 ** 15       # the gradients, not the ceiling, decide
    assert len({s for s, _ in want}) > 1             # and the scale moved
    for name, v in plain.params.items():
        np.testing.assert_array_equal(net.params[name.replace("plain/", "cast/", 1)].d, v.d)

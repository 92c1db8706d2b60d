"""Checkpoints saved by an earlier version load as the run they were saved from.

``data/checkpoint_ffacf80.npz`` was saved by the package at ffacf80, before its modules
moved into folders, by :func:`train` (``python tests/files/test_saved_checkpoints.py
PATH`` with that version's folder, then ``tests``, first on ``PYTHONPATH``).
"""
import pathlib
import sys

import numpy as np

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla.solvers as S
from nnabla.ext_utils import get_extension_context

from nnabla_mpt import DynamicLossScalingUpdater
from support import assert_bitwise_equal, assert_states_bitwise_equal, solver_states

SAVED = pathlib.Path(__file__).parent / "data" / "checkpoint_ffacf80.npz"
STEPS = 6


def train(steps):
    """A float16 MLP with ``scale="auto"`` and growth every 2 steps, ``steps`` steps on
    batches that are the same in every call; its updater and solver."""
    nn.clear_parameters()
    with nn.context_scope(get_extension_context("cpu", type_config="half")):
        x, t = nn.Variable((4, 3)), nn.Variable((4, 2))
        h = F.relu(PF.affine(x, 5, name="fc1", rng=np.random.RandomState(0)))
        y = PF.affine(h, 2, name="fc2", rng=np.random.RandomState(1))
        loss = F.mean(F.squared_error(y, t))
        solver = S.Adam(1e-2)
        solver.set_parameters(nn.get_parameters())
    rng = np.random.RandomState(2)

    def feed():
        x.d, t.d = rng.randn(4, 3), rng.randn(4, 2)

    updater = DynamicLossScalingUpdater(solver, loss, feed, scale="auto", N=2)
    for _ in range(steps):
        updater.update()
    return updater, solver


def test_a_checkpoint_saved_before_the_folders_loads_as_the_same_run():
    updater, solver = train(STEPS)
    params = {k: v.d.copy() for k, v in nn.get_parameters().items()}
    states, state = solver_states(solver), updater.state_dict()
    assert state["steps"] == STEPS

    fresh, fresh_solver = train(0)
    fresh.load_checkpoint(str(SAVED))
    assert fresh.state_dict() == state
    assert_bitwise_equal({k: v.d for k, v in nn.get_parameters().items()}, params)
    assert_states_bitwise_equal(solver_states(fresh_solver), states)


if __name__ == "__main__":
    train(STEPS)[0].save_checkpoint(sys.argv[1])

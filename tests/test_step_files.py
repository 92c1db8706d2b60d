"""How many of the package's files one ``update()`` runs lines in, counted with
``sys.settrace``: a plain step runs in six at most, the full configuration in twelve."""
import os
import sys

import numpy as np

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla.solvers as S
from nnabla.ext_utils import get_extension_context

import nnabla_mpt
from nnabla_mpt import DynamicLossScalingUpdater

PACKAGE = os.path.dirname(os.path.abspath(nnabla_mpt.__file__))


def files_run(call):
    """The package's files (relative paths) in which ``call()`` runs a line."""
    seen = set()

    def tracer(frame, event, arg):
        name = frame.f_code.co_filename
        if name.startswith(PACKAGE):
            seen.add(os.path.relpath(name, PACKAGE))
        return tracer

    sys.settrace(tracer)
    try:
        call()
    finally:
        sys.settrace(None)
    return seen


def mlp(type_config, scope):
    """A small ReLU MLP under ``type_config``, its solver and a feeder of random batches."""
    with nn.context_scope(get_extension_context("cpu", type_config=type_config)), \
            nn.parameter_scope(scope):
        x, t = nn.Variable((8, 4)), nn.Variable((8, 1))
        h = F.relu(PF.affine(x, 6, name="a", rng=np.random.RandomState(0)))
        loss = F.mean(F.squared_error(PF.affine(h, 1, name="b", rng=np.random.RandomState(1)),
                                      t))
        solver = S.Momentum(0.01, 0.9)
        solver.set_parameters(nn.get_parameters())
    rng = np.random.RandomState(2)

    def feed():
        x.d = rng.randn(*x.shape)
        t.d = rng.randn(*t.shape)

    return solver, loss, feed


def test_a_plain_update_runs_lines_in_at_most_six_files():
    solver, loss, feed = mlp("float", "plain_path")
    updater = DynamicLossScalingUpdater(solver, loss, feed, scale=8.0)
    updater.update()
    seen = files_run(updater.update)
    assert "step_loop.py" in seen and len(seen) <= 6, sorted(seen)
    assert not {"settings.py", "scale/measured.py", "scale/precision_graphs.py"} & seen


def test_the_full_configuration_runs_lines_in_at_most_twelve_files():
    # a float16 graph, scale="auto", measured growth, clipping, weight decay, accum_grad=2
    # and statistics, over steps that calibrate, watch, grow and record statistics
    solver, loss, feed = mlp("half", "full_path")
    updater = DynamicLossScalingUpdater(solver, loss, feed, scale="auto", N=2,
                                        growth_mode="measured", clip_grad_norm=1.0,
                                        weight_decay=1e-4, accum_grad=2,
                                        gradient_stats_every=1)
    seen = set()
    for _ in range(6):
        seen |= files_run(updater.update)
    assert {"scale/measured.py", "scale/gradient_stats.py"} <= seen
    # across the first steps: the calibration (whose scale the policy checks,
    # core/_validate.py) and the feeder's first-call check run only there
    assert len(seen) <= 12, sorted(seen)

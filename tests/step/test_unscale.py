"""Unscaling by the value the seed held, whatever the scale: below 1 too."""
import numpy as np

from nnabla_mpt import DynamicLossScale, DynamicLossScalingUpdater
from support import Net

LR = 0.5


def test_a_step_at_a_scale_below_one_is_unscaled_like_any_other():
    # at scale 0.5 the gradients are halved by the seed: the unscale doubles them back
    net = Net("float", batch=4, d_in=3, d_out=2)
    solver = net.solver("Sgd", lr=LR)
    x, t = net.batch(0)
    net.x.d, net.t.d = x, t
    before = net.snapshot()
    solver.zero_grad()
    net.loss.forward()
    net.loss.backward(1.0)
    grads = {name: v.g.astype(np.float64) for name, v in net.params.items()}
    policy = DynamicLossScale(init_scale=0.5, min_scale=0.25)
    updater = DynamicLossScalingUpdater(solver, net.loss, policy=policy)
    step = updater.update()
    assert step.updated and step.scale == 0.5
    after = net.snapshot()
    for name in after:
        np.testing.assert_allclose(after[name], before[name] - LR * grads[name],
                                   rtol=1e-6, atol=1e-7, err_msg=name)

"""StepResult.loss: the step's loss, the mean over its micro-batches, before scaling."""
import math

import numpy as np
import pytest

from nnabla_mpt import DynamicLossScalingUpdater, FixedLossScalingUpdater
from support import Net


@pytest.mark.parametrize("accum_grad", [1, 3])
@pytest.mark.parametrize("type_config", ["float", "half"])
def test_the_step_loss_is_the_mean_of_its_micro_batches(accum_grad, type_config):
    net, twin = Net(type_config, hidden=4, scope="net"), Net(type_config, hidden=4,
                                                              scope="twin")
    updater = FixedLossScalingUpdater(net.solver("Sgd", lr=0.0), net.loss, net.feeder,
                                      scale=64.0, accum_grad=accum_grad)
    for step in range(4):
        result = updater.update()
        expected = []
        for micro in range(accum_grad):           # lr=0: the twin has the same parameters
            twin.feed(step * accum_grad + micro)
            twin.loss.forward()
            expected.append(float(twin.loss.d))
        assert result.loss == pytest.approx(np.mean(expected), rel=1e-6), step
    # loss.d holds only the last micro-batch's loss, the result all of them
    assert accum_grad == 1 or float(net.loss.d) != pytest.approx(result.loss)


def test_a_non_finite_loss_is_the_step_loss():
    net = Net("float")
    net.bad = {1}
    updater = DynamicLossScalingUpdater(net.solver(), net.loss, net.feeder, scale=8.0)
    first, second = updater.update(), updater.update()
    assert math.isfinite(first.loss) and not math.isfinite(second.loss)
    assert second.skipped

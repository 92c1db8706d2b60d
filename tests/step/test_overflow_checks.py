"""The checks an updater runs on its gradients, chosen by mode and by whether the ranks
reduce them: in saturation mode with ranks, a second check, for inf and NaN only, of the
reduced gradients."""
import numpy as np
import pytest

from nnabla_mpt.core import graph
from nnabla_mpt.core.dtypes import FP16_MAX
from nnabla_mpt.step.detector import overflow_checks
from support import Net


def _checks(net, mode, ranks):
    solver = net.solver()
    return overflow_checks(mode, solver, net.params, True, graph.float_context(net.loss),
                           ranks)


@pytest.mark.parametrize("grad, saturated, nonfinite", [
    (1.0, False, False), (FP16_MAX, True, False), (np.inf, True, True),
    (np.nan, True, True)])
def test_with_ranks_saturation_mode_checks_saturation_then_inf_and_nan(grad, saturated,
                                                                      nonfinite):
    net = Net()
    check, inf_nan = _checks(net, "saturation", ranks=True)
    for v in net.params.values():
        v.g = np.zeros(v.shape)
    next(iter(net.params.values())).g.flat[0] = grad
    assert (check(), inf_nan()) == (saturated, nonfinite)


def test_one_process_in_saturation_mode_has_no_second_check_and_inf_nan_one_check():
    net = Net()
    check, second = _checks(net, "saturation", ranks=False)
    assert callable(check) and second is None
    check, second = _checks(net, "inf_nan", ranks=True)
    assert second is check

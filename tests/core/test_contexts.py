"""The graph's type configuration and device, read as nnabla runs them.

Stand-ins for GPU contexts, on the CPU:

* nnabla registers nothing under ``*:mixed_half``: cudnn's ``mixed_half`` context
  (``cudnn:mixed_half, cudnn:half, ...``) runs in float16 and cuda's (``cuda:mixed_half,
  cuda:float, ...``) in float32. A CPU context ``["cpu:mixed_half", "cpu:half",
  "cpu:float"]`` reproduces the first, ``["cpu:mixed_half", "cpu:float"]`` the second.
* Every rank of a node with 8 GPUs has its own ``device_id``; a CPU context with
  ``device_id="3"`` stands for one, and every context the updater enters must name it.
"""
import sys

import nnabla as nn
import pytest

from mpi_workers.standins import NcclLikeCommunicator
from nnabla_mpt import DynamicLossScalingUpdater, OverflowHandling
from nnabla_mpt.core import graph
from support import Net, assert_bitwise_equal, context, raises_naming

MIXED_HALF_AS = [(["cpu:mixed_half", "cpu:half", "cpu:float"], "half"),
                 (["cpu:mixed_half", "cpu:float"], "float")]


def _trajectory(net, steps=14, **options):
    updater = DynamicLossScalingUpdater(net.solver("Adam", alpha=1e-2), net.loss, net.feeder,
                                        **options)
    out = [(r.skipped, r.scale, r.precision) for r in (updater.update() for _ in range(steps))]
    return out, updater


@pytest.mark.parametrize("backends, runs_as", MIXED_HALF_AS)
def test_the_type_configuration_is_the_first_backend_nnabla_runs(backends, runs_as):
    net = Net(ctx=nn.Context(backends, "CpuCachedArray", ""), hidden=4)
    assert graph.type_config_of(net.loss) == runs_as
    ceiling = graph.float_type_of(net.loss).max_power_of_two
    assert ceiling == (2.0 ** 15 if runs_as == "half" else 2.0 ** 127)
    net.feed(0)
    net.loss.forward()
    assert str(net.loss.data.dtype) == ("float16" if runs_as == "half" else "float32")


def test_no_registered_backend_is_refused_with_the_list():
    with nn.context_scope(nn.Context(["cpu:mixed_half"], "CpuCachedArray", "")), \
            nn.auto_forward(False):
        with pytest.raises(Exception):
            Net(ctx=nn.get_current_context())
    with raises_naming(ValueError, "['cpu:mixed_half']", "registered", "extension installed"):
        graph.runnable_backend(("cpu:mixed_half",), "CpuCachedArray", "")


@pytest.mark.parametrize("options", [
    dict(scale="auto", growth_mode="measured", N=3),
    dict(scale=2.0 ** 10, N=2),
], ids=["measured", "probe"])
@pytest.mark.parametrize("backends, runs_as", MIXED_HALF_AS)
def test_a_mixed_half_context_trains_as_what_nnabla_runs(backends, runs_as, options):
    """Scales, skips and parameters bitwise those of the same run under ``runs_as``."""
    mixed = Net(ctx=nn.Context(backends, "CpuCachedArray", ""), hidden=4, scope="mixed")
    plain = Net(runs_as, hidden=4, scope="plain")
    got, _ = _trajectory(mixed, **options)
    want, _ = _trajectory(plain, **options)
    assert got == want
    assert_bitwise_equal({k.split("/", 1)[1]: v for k, v in mixed.snapshot().items()},
                         {k.split("/", 1)[1]: v for k, v in plain.snapshot().items()})


class _ContextsEntered:
    """Every context nnabla hands out while it runs (``nn.get_current_context()``, which
    each function created, in a graph or on NdArrays, is created under), observed with
    ``sys.setprofile``."""

    def __init__(self):
        self.seen = []
        self._code = nn.get_current_context.__code__

    def _profile(self, frame, event, arg):
        if event == "return" and frame.f_code is self._code:
            self.seen.append(arg)

    def __enter__(self):
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc):
        sys.setprofile(None)


@pytest.mark.parametrize("mode", ["inf_nan", "saturation"])
@pytest.mark.parametrize("comm", [None, "float32", "float16"])
@pytest.mark.parametrize("type_config", ["half", "float"])
def test_every_context_the_updater_enters_keeps_the_loss_device(type_config, comm, mode):
    """Also where the step is packed for nnabla's communicator (its stand-in), the norm
    of clip_grad_norm is taken, and the saturation check runs."""
    base = context(type_config)
    net = Net(ctx=nn.Context(list(base.backend), base.array_class, "3"), hidden=4)
    with _ContextsEntered() as entered:
        updater = DynamicLossScalingUpdater(
            net.solver("Adam", alpha=1e-2), net.loss, net.feeder, scale="auto",
            growth_mode="measured", N=2, gradient_stats_every=2, clip_grad_norm=10.0,
            overflow=OverflowHandling(
                mode=mode), comm=None if comm is None else NcclLikeCommunicator(comm))
        results = [updater.update() for _ in range(6)]
    assert any(r.gradient_stats for r in results)
    assert len(entered.seen) > 10        # the reductions of the watch and the statistics
    devices = {(tuple(c.backend), c.device_id) for c in entered.seen}
    assert {d for _, d in devices} == {"3"}, devices

"""The data_feeder: refused at construction when it needs an argument, warned about at its
first call when it returns the batch instead of writing the graph's inputs."""
import logging

import numpy as np
import pytest

from nnabla_mpt import DynamicLossScalingUpdater, FixedLossScalingUpdater
from support import Net, assert_names, raises_naming


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records
            if r.name == "nnabla" and r.levelno == logging.WARNING]


@pytest.mark.parametrize("cls", [DynamicLossScalingUpdater, FixedLossScalingUpdater])
def test_a_feeder_that_needs_an_argument_is_refused_naming_it(cls):
    net = Net()

    def feed_batch(batch):
        net.x.d, net.t.d = batch

    def facts(feeder, argument):
        # the feeder as given, the argument it needs, and how to write one the updater calls
        return ("data_feeder", repr(feeder), "needs an argument", repr(argument),
                "x.d = ...", "without arguments")

    with raises_naming(TypeError, *facts(feed_batch, "batch")):
        cls(net.solver(), net.loss, feed_batch)
    feed_i = lambda i: net.feed(i)              # a lambda, as a user writes one
    with raises_naming(TypeError, *facts(feed_i, "i")):
        cls(net.solver(), net.loss, data_feeder=feed_i)
    updater = cls(net.solver(), net.loss, net.feeder)
    with raises_naming(TypeError, *facts(feed_batch, "batch")):
        updater.data_feeder = feed_batch
    assert updater.data_feeder == net.feeder          # the old one stays
    # callables without a readable signature, and feeders with defaults, are accepted
    assert cls(net.solver(), net.loss, print).data_feeder is print
    cls(net.solver(), net.loss, lambda i=0, *rest, **options: net.feed(i))


@pytest.mark.parametrize("scale", [8.0, "auto"])
def test_a_feeder_that_returns_the_batch_is_warned_about_once(caplog, scale):
    caplog.set_level(logging.INFO, logger="nnabla")
    net = Net()
    calls = []

    def returns_batch():                       # as a PyTorch loop would write it
        calls.append(1)
        return net.batch(len(calls))

    updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.1), net.loss, returns_batch,
                                        scale=scale)
    assert _warnings(caplog) == []
    for _ in range(3):
        updater.update()
    assert len(calls) == 3
    warned = _warnings(caplog)
    assert len(warned) == 1, warned
    assert_names(warned[0], "nnabla_mpt", "data_feeder", repr(returns_batch), "tuple",
                 "not None", "ignores", "data_feeder", "x.d = ...", "not return it")
    assert updater.data_feeder is returns_batch


def test_a_feeder_assigned_later_is_called_and_checked(caplog):
    caplog.set_level(logging.INFO, logger="nnabla")
    net = Net()
    updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.1), net.loss, net.feeder,
                                        accum_grad=2)
    updater.update()
    assert net.calls == 2 and _warnings(caplog) == []
    later = []

    def feed_later():
        later.append(1)
        net.feed(100 + len(later))
        return "done"

    updater.data_feeder = feed_later
    updater.update()
    updater.update()
    assert (net.calls, len(later)) == (2, 4)
    assert len(_warnings(caplog)) == 1
    assert_names(_warnings(caplog)[0], repr(feed_later), "str", "x.d = ...")
    np.testing.assert_array_equal(net.x.d, net.batch(104)[0])   # the new feeder's batch
    updater.data_feeder = None
    updater.update()
    assert (net.calls, len(later)) == (2, 4) and updater.data_feeder is None


def _stale_warnings(caplog):
    return [r.getMessage() for r in caplog.records if "same batch" in r.getMessage()]


@pytest.mark.parametrize("cls", [DynamicLossScalingUpdater, FixedLossScalingUpdater])
def test_inputs_nobody_writes_are_named_once(caplog, cls):
    # no data_feeder (data_feeder=feed() passes None too) and a script that never writes
    # the inputs: every step trains on the batch that was there at the start
    caplog.set_level(logging.WARNING, logger="nnabla")
    net = Net()
    net.feed(0)
    updater = cls(net.solver(), net.loss, None, scale=8.0)
    results = [updater.update() for _ in range(5)]
    assert not any(r.skipped for r in results)
    warned = _stale_warnings(caplog)
    assert len(warned) == 1, warned
    assert_names(warned[0], "nnabla_mpt", "no data_feeder", "(#0 of shape (4, 3), #1 of shape (4, 2))",
                 "same values", "first two update() calls", "same batch",
                 "data_feeder=...", "no arguments", "x.d = ...",
                 "write the inputs before each update()")


@pytest.mark.parametrize("writer", ["feeder", "script", "one_input"])
def test_inputs_written_each_step_are_not_warned_about(caplog, writer):
    caplog.set_level(logging.WARNING, logger="nnabla")
    net = Net()
    updater = DynamicLossScalingUpdater(net.solver(), net.loss,
                                        net.feeder if writer == "feeder" else None)
    for i in range(4):
        if writer == "script":
            net.feed(i)
        elif writer == "one_input":               # the labels stay, the images change
            net.x.d = net.batch(i)[0]
        updater.update()
    assert _stale_warnings(caplog) == []


def _summed_warnings(caplog):
    return [r.getMessage() for r in caplog.records if "sums one batch" in r.getMessage()]


@pytest.mark.parametrize("later", [False, True])
def test_accumulation_without_a_feeder_is_warned_about_once(caplog, later):
    # accum_grad > 1 and no feeder: the passes of a step all read the same inputs
    caplog.set_level(logging.WARNING, logger="nnabla")
    net = Net()
    updater = DynamicLossScalingUpdater(net.solver(), net.loss, None, scale=8.0,
                                        accum_grad=1 if later else 3)
    for i in range(4):
        if later and i == 2:
            updater.accum_grad = 3
        net.feed(i)                               # the script writes a batch a step
        updater.update()
    summed = _summed_warnings(caplog)
    assert len(summed) == 1, summed
    assert_names(summed[0], "nnabla_mpt", "accum_grad=3", "data_feeder", "3 forward",
                 "same inputs", "#0 of shape (4, 3)", "#1 of shape (4, 2)",
                 "sums one batch 3 times", "data_feeder=...", "micro-batch (x.d = ...)",
                 "constants of the model")
    assert _stale_warnings(caplog) == []


@pytest.mark.parametrize("feeder", [True, False])
def test_accumulation_with_a_feeder_or_one_pass_is_not_warned_about(caplog, feeder):
    caplog.set_level(logging.WARNING, logger="nnabla")
    net = Net()
    updater = DynamicLossScalingUpdater(net.solver(), net.loss,
                                        net.feeder if feeder else None,
                                        accum_grad=3 if feeder else 1)
    for i in range(3):
        if not feeder:
            net.feed(i)
        updater.update()
    assert _summed_warnings(caplog) == []


def test_a_graph_that_reads_no_input_needs_no_feeder(caplog):
    # its randomness comes from F.randn: every pass draws anew, nothing to feed
    import nnabla as nn
    import nnabla.functions as F
    import nnabla.parametric_functions as PF
    import nnabla.solvers as S

    caplog.set_level(logging.WARNING, logger="nnabla")
    nn.clear_parameters()
    with nn.parameter_scope("noise_only"):
        loss = F.mean(PF.affine(F.randn(shape=(4, 3)), 2) ** 2)
    solver = S.Sgd(1e-3)
    solver.set_parameters(nn.get_parameters())
    updater = DynamicLossScalingUpdater(solver, loss, None, scale=8.0, accum_grad=2)
    losses = [updater.update().loss for _ in range(3)]
    assert len(set(losses)) == 3                    # each step saw other noise
    assert _summed_warnings(caplog) == [] and _stale_warnings(caplog) == []


def test_named_inputs_nobody_writes_are_named_by_their_names(caplog):
    caplog.set_level(logging.WARNING, logger="nnabla")
    net = Net()
    net.x.name, net.t.name = "images", "labels"
    net.feed(0)
    updater = DynamicLossScalingUpdater(net.solver(), net.loss, None, scale=8.0)
    updater.update(), updater.update()
    [warned] = _stale_warnings(caplog)
    assert_names(warned, "('images', 'labels')")


def test_inputs_that_hold_the_same_nan_are_the_same_batch(caplog):
    # NaN equals NaN here: a batch that holds NaN at both calls is the same batch
    caplog.set_level(logging.WARNING, logger="nnabla")
    net = Net()
    net.feed(0)
    x = net.x.d.copy()
    x[0, 0] = np.nan
    net.x.d = x
    updater = DynamicLossScalingUpdater(net.solver(), net.loss, None, scale=8.0)
    assert updater.update().bad_batch and updater.update().bad_batch
    assert len(_stale_warnings(caplog)) == 1


def test_two_passes_without_a_feeder_are_warned_about_too(caplog):
    caplog.set_level(logging.WARNING, logger="nnabla")
    net = Net()
    net.feed(0)
    DynamicLossScalingUpdater(net.solver(), net.loss, None, scale=8.0,
                              accum_grad=2).update()
    [summed] = _summed_warnings(caplog)
    assert_names(summed, "accum_grad=2", "sums one batch 2 times")


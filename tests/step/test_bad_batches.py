"""A batch holding inf/NaN is a bad batch, not an overflow: the step is skipped and counted,
the loss scale is kept and the collapse streak is left as it is.

Through a ReLU a NaN input gives a finite loss (ReLU maps NaN to 0) and NaN gradients:
the case a non-finite loss does not catch.
"""
import logging

import numpy as np
import pytest

from nnabla_mpt import (DynamicLossScalingUpdater, FixedLossScalingUpdater, OverflowHandling,
                        PrecisionSchedule)
from support import Net, assert_bitwise_equal, assert_names


def relu_net():
    return Net("half", hidden=8, activation="relu")


def test_bad_batches_keep_the_scale_and_are_counted():
    net = relu_net()
    net.nan = set(range(1, 40, 4))             # 10 NaN batches: finite loss, NaN gradients
    net.bad = set(range(3, 40, 4))             # 10 inf batches
    updater = DynamicLossScalingUpdater(net.solver("Adam", alpha=1e-3), net.loss,
                                        net.feeder, scale=1024.0, N=1000)
    for i in range(40):
        before = net.snapshot()
        r = updater.update()
        bad = i in net.nan or i in net.bad
        assert (r.skipped, r.bad_batch) == (bad, bad), f"step {i}"
        assert r.scale == r.next_scale == updater.scale == 1024.0, f"step {i}"
        if i in net.nan:
            assert np.isfinite(net.loss.d).all(), f"step {i}"
        if bad:
            assert_bitwise_equal(net.snapshot(), before)
    assert (updater.bad_batches, updater.skipped_steps, updater.updates) == (20, 20, 20)
    assert updater.longest_overflow_streak == 0 and updater.last_report is None
    assert updater.state_dict()["bad_batches"] == 20


def test_a_run_of_bad_batches_is_no_collapse_and_is_not_silent(caplog):
    net = relu_net()
    net.nan = set(range(12))
    updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.1), net.loss, net.feeder,
                                        scale=1024.0, overflow=OverflowHandling(diagnose_after=4))
    caplog.set_level(logging.DEBUG, logger="nnabla")
    results = [updater.update() for _ in range(12)]      # floor_policy="raise": no error
    assert all(r.skipped and r.bad_batch and r.next_scale == 1024.0 for r in results)
    assert (updater.bad_batches, updater.overflow_streak, updater.last_report) == (12, 0, None)
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG
             and "bad batch" in r.getMessage()]
    assert len(debug) == 12
    assert_names(debug[0], "nnabla_mpt", "step 0", "skipped", "bad batch",
                 "input #0 of shape (4, 3)", "inf/NaN", "loss scale 1024", "kept")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2                                   # the 1st and the 10th
    assert_names(warnings[0], "nnabla_mpt", "1 bad batch", "step 0", "inf/NaN",
                 "input #0 of shape (4, 3)", "without lowering the loss scale",
                 "updater.bad_batches", "numpy.isfinite")
    assert_names(warnings[1], "nnabla_mpt", "10 bad batches", "step 9")
    assert updater.update().updated                             # batch 12 is clean


def test_a_bad_batch_leaves_the_overflow_streak_as_it_is():
    # Linear float16 network at a fixed scale of 4096: the large batches overflow in
    # backward, the NaN one (no ReLU here: its loss is NaN too) is a bad batch.
    net = Net("half")
    net.large, net.nan = {0, 2}, {1}
    updater = FixedLossScalingUpdater(net.solver("Sgd", lr=0.1), net.loss, net.feeder,
                                      scale=4096.0)
    results = [updater.update() for _ in range(4)]
    assert [(r.skipped, r.bad_batch) for r in results] == [
        (True, False), (True, True), (True, False), (False, False)]
    assert (updater.longest_overflow_streak, updater.overflow_streak) == (2, 0)
    assert (updater.skipped_steps, updater.bad_batches) == (3, 1)


def test_a_bad_batch_after_the_precision_switch_reads_the_full_precision_graph():
    import nnabla as nn
    import nnabla.functions as F
    import nnabla.parametric_functions as PF
    import nnabla.solvers as S
    from support import context

    x, t = nn.Variable((4, 3)), nn.Variable((4, 1))
    losses = {}
    for kind in ("half", "float"):
        with nn.context_scope(context(kind)), nn.parameter_scope("net"):
            h = F.relu(PF.affine(x, 8, name="h"))
            losses[kind] = F.mean(F.squared_error(PF.affine(h, 1, name="o"), t))
    solver = S.Sgd(0.01)
    solver.set_parameters(nn.get_parameters())
    rng = np.random.RandomState(0)

    def feed():
        batch = rng.randn(4, 3)
        if updater.steps in (1, 3):
            batch[0, 0] = np.nan
        x.d, t.d = batch, rng.randn(4, 1)

    updater = DynamicLossScalingUpdater(solver, losses["half"], feed, scale=64.0, N=1000,
                                        schedule=PrecisionSchedule(
                                            "fast|step|0.5", total_steps=4,
                                            high_precision_loss=losses["float"]))
    results = [updater.update() for _ in range(4)]
    assert [(r.precision, r.skipped, r.bad_batch) for r in results] == [
        ("half", False, False), ("half", True, True), ("float", False, False),
        ("float", True, True)]
    assert updater.bad_batches == 2 and updater.policy.loss_scale == 64.0


@pytest.mark.parametrize("accum", [1, 2])
def test_with_accumulation_the_last_micro_batch_is_checked(accum):
    net = relu_net()
    net.nan = {accum - 1}               # the last micro-batch of the first step
    updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.1), net.loss, net.feeder,
                                        scale=1024.0, N=1000, accum_grad=accum)
    r = updater.update()
    assert (r.skipped, r.bad_batch, r.next_scale) == (True, True, 1024.0)
    assert updater.bad_batches == 1


def test_running_statistics_are_no_input():
    # The NaN batch leaves BatchNormalization's running mean NaN: that is state, not data,
    # so a later real overflow (targets x 30 at scale 2**11, finite loss) stays an overflow.
    import nnabla as nn
    import nnabla.functions as F
    import nnabla.parametric_functions as PF
    import nnabla.solvers as S
    from support import context

    x, t = nn.Variable((8, 3)), nn.Variable((8, 2))
    with nn.context_scope(context("half")), nn.parameter_scope("bn"):
        h = PF.affine(x, 8, name="h", rng=np.random.RandomState(1))
        h = F.relu(PF.batch_normalization(h, name="bn"))
        y = PF.affine(h, 2, name="o", rng=np.random.RandomState(2))
        loss = F.mean(F.squared_error(y, t))
    solver = S.Sgd(0.01)
    solver.set_parameters(nn.get_parameters())
    rng = np.random.RandomState(0)

    def feed():
        xs, ts = rng.randn(8, 3), rng.randn(8, 2)
        if updater.steps == 1:
            xs[0, 0] = np.nan
        if updater.steps == 3:
            ts = ts * 30
        x.d, t.d = xs, ts

    losses = []
    updater = FixedLossScalingUpdater(solver, loss, feed, scale=2.0 ** 11,
                                      monitor=lambda r: losses.append(float(loss.d)))
    results = [updater.update() for _ in range(5)]
    running_mean = nn.get_parameters(grad_only=False)["bn/bn/bn/mean"]
    assert not np.isfinite(running_mean.d).all()
    assert np.isfinite(losses).all()
    assert [(r.skipped, r.bad_batch) for r in results] == [
        (False, False), (True, True), (False, False), (True, False), (False, False)]
    assert (updater.bad_batches, updater.longest_overflow_streak) == (1, 1)


@pytest.mark.parametrize("size", ["small_bn", "small"])
def test_running_statistics_a_bad_batch_made_non_finite_are_named_once(size, caplog):
    import nnabla as nn
    import nnabla.solvers as S
    from reference_step import Model

    nn.clear_parameters()
    model = Model(size, "half", "state", {1: "nan", 3: "inf", 4: "nan"}, seed=1)
    solver = S.Sgd(0.01)
    solver.set_parameters(model.trained)
    updater = DynamicLossScalingUpdater(solver, model.loss, model.feeder, scale=64.0)
    caplog.set_level(logging.WARNING, logger="nnabla")
    results = [updater.update() for _ in range(6)]
    assert [r.bad_batch for r in results] == [False, True, False, True, True, False]
    named = [r.getMessage() for r in caplog.records if "left " in r.getMessage()]
    if size == "small":
        assert named == []          # no running statistics: nothing to name
        return
    assert len(named) == 1, named   # the later bad batches find them non-finite already
    assert_names(named[0], "bad batch", "step 1", "state/bn/bn/mean", "state/bn/bn/var",
                 "inf/NaN", "running statistics", "load_checkpoint", "numpy.isfinite")
    assert not np.isfinite(model.params["bn/bn/mean"].d).all()


def test_the_inputs_of_a_bad_batch_are_named_by_name_or_by_place():
    from nnabla_mpt.step.detector import BatchCheck
    net = Net()
    net.feed(0)
    x = net.x.d.copy()
    x[1, 2] = np.inf
    net.x.d = x
    check = BatchCheck([net.loss], net.params)
    assert check.nonfinite(net.loss) == ["input #0 of shape (4, 3)"]
    net.x.name = "images"
    assert check.nonfinite(net.loss) == ["input 'images'"]

"""Measured loss scaling on real float16 graphs: the calibrated start (scale="auto"),
measured growth, the gradient statistics, and their state across a checkpoint."""
import math

import numpy as np
import pytest

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla.solvers as S

from nnabla_mpt import (DynamicLossScale, DynamicLossScalingUpdater, FixedLossScalingUpdater,
                        LossScaleCollapseError, OverflowHandling, PrecisionSchedule)
from nnabla_mpt.core.dtypes import FLOATS
from nnabla_mpt.scale.measured import MARGIN
from nnabla_mpt.diagnosis.watch import NON_EXPANDING
from support import (Net, assert_bitwise_equal, assert_names, assert_states_bitwise_equal,
                     context, solver_states)


def reach_by_numpy(loss, params, scale):
    """``(cap, reach)`` computed independently, by the rule of nnabla_mpt.scale.measured: a
    backward pass at ``scale`` read with NumPy. A gradient handed down from the seed
    through functions that cannot enlarge it is bounded (in units of the scale) and only
    has to fit: ``cap``, the largest scale they all fit. ``reach``: the scale at which the
    largest of every other one, and of the parameters', reaches its dtype's largest
    value."""
    caps, reaches, bound = [math.inf], [math.inf], {hash(loss): 1.0}

    def watch(g, b):
        top = np.abs(np.asarray(g, dtype=np.float64)).max()
        limit = FLOATS[str(g.dtype)].max
        if math.isfinite(b):
            caps.append(limit / b)
        elif top > 0:
            reaches.append(scale * limit / top)

    def pre(f):
        outs = [bound.get(hash(v), math.inf) for v in f.outputs]
        for v, b in zip(f.outputs, outs):
            if hash(v) != hash(loss):
                watch(v.g, b)
        passed = max(outs) if f.info.type_name in NON_EXPANDING else math.inf
        for v in f.inputs:
            if v.need_grad:
                bound[hash(v)] = bound.get(hash(v), 0.0) + passed

    for v in params.values():
        v.grad.zero()
    loss.forward(clear_no_need_grad=False)
    loss.backward(scale, clear_buffer=False, function_pre_hook=pre)
    for v in params.values():
        watch(v.g, math.inf)
    for v in params.values():
        v.grad.zero()
    return min(caps), min(reaches)


def room_by_numpy(loss, params, scale):
    """``R`` of one batch: the gradients without a bound keep the margin of one batch."""
    cap, reach = reach_by_numpy(loss, params, scale)
    return min(cap, reach / MARGIN) / scale


def room_by_history(reaches, cap, scale):
    """``R`` of measured growth after the watched passes' ``reaches``, by the rule of
    nnabla_mpt.scale.scale_history in NumPy: with fewer than 4 passes, the last one with the
    margin of one batch; else the worst of the last 8 over 2 ** (3 standard deviations of
    log2 of their reaches less the mean's distance to the worst), within [2 ** 0.5, 8];
    never below the worst of the last 2 over 8."""
    if len(reaches) < 4:
        return min(cap, reaches[-1] / MARGIN) / scale
    last = np.log2(reaches[-8:])
    spread = 3 * np.std(last, ddof=1) - (last.mean() - last.min())
    supported = max(2.0 ** last.min() / 2.0 ** np.clip(spread, 0.5, 3.0),
                    min(reaches[-2:]) / MARGIN)
    return min(cap, supported) / scale


def expected_start(room, probe=1.0, lower=1.0, upper=2.0 ** 15):
    return min(max(2.0 ** math.floor(math.log2(probe * room)), lower), upper)


def messages(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "nnabla"
            and r.getMessage().startswith("nnabla_mpt")]


# -- scale="auto" ---------------------------------------------------------------------------

@pytest.mark.parametrize("accum_grad", [1, 2])
def test_auto_starts_at_the_measured_scale_and_steps_like_a_fixed_scale(accum_grad, info_log):
    # The first batch is 20 times larger than the others: parameter gradients of 20 to 240
    # per unit of scale, which the margin keeps 8 times below 65504.
    net = Net("half", hidden=8, scope="auto")
    ref = Net("half", hidden=8, scope="ref")
    net.large = ref.large = {0}
    ref.feed(0)
    start = expected_start(room_by_numpy(ref.loss, ref.params, 1.0))
    assert 1.0 < start < 2.0 ** 15                      # a real choice, not a bound

    solver = net.solver("Adam", alpha=1e-2)
    updater = DynamicLossScalingUpdater(solver, net.loss, net.feeder, scale="auto", N=1000,
                                        accum_grad=accum_grad)
    result = updater.update()
    assert (result.skipped, result.scale, result.next_scale) == (False, start, start)
    assert net.calls == accum_grad                      # the calibration reused the batch
    assert (updater.steps, updater.updates, updater.skipped_steps) == (1, 1, 0)
    [line] = [m for m in messages(info_log) if "scale='auto'" in m]
    # One pass: the scale, what was measured, the margin, the bounds.
    assert_names(line, "nnabla_mpt", "scale='auto'", f"starts at {start:g}", "this step's batch",
                 "largest gradient", "at scale 1", f"{start:g}", "largest power of two",
                 "[1, 32768]", "8 times below")
    assert "smallest start over" not in line            # one process: no other rank

    # Exactly what a fixed-scale step at that scale does on the same batches.
    ref_solver = ref.solver("Adam", alpha=1e-2)
    ref.calls = 0
    FixedLossScalingUpdater(ref_solver, ref.loss, ref.feeder, scale=start,
                            accum_grad=accum_grad).update()
    # (parameter names are relative to each net's scope, so the two nets' names agree)
    assert_bitwise_equal(net.snapshot(), ref.snapshot())
    assert_states_bitwise_equal(solver_states(solver), solver_states(ref_solver))


def test_auto_looks_higher_while_every_gradient_is_zero(info_log):
    # A loss multiplied by 0: every gradient below it is zero at any scale. The probe goes
    # up by 2**8 at a time (1, 256, then the bound 2**15) and, finding nothing there
    # either, starts at the bound.
    net = Net("half")
    with nn.context_scope(net.ctx):
        dead_loss = F.mul_scalar(net.loss, 0.0)
    updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.1), dead_loss, net.feeder,
                                        scale="auto")
    result = updater.update()
    assert (result.skipped, result.scale) == (False, 2.0 ** 15)
    [line] = [m for m in messages(info_log) if "scale='auto'" in m]
    assert_names(line, "scale='auto'", "largest gradient", "0", "at scale 32768")


def test_auto_with_a_parameter_non_finite_at_any_scale_waits_and_then_collapses(info_log):
    # A corrupted parameter: the loss is not finite, and no scale can make it finite. The
    # calibration measures nothing and sets no scale (the floor would be a collapse the
    # scale did not cause); every step skips, the streak grows, and its diagnosis names
    # the parameter.
    net = Net("half")
    bias = net.params["out/affine/b"]
    bias.d = np.array([np.inf, 0.0])
    updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.1), net.loss, net.feeder,
                                        scale="auto", policy=DynamicLossScale(min_scale=2.0),
                                        overflow=OverflowHandling(diagnose_after=3))
    updater.update(), updater.update()
    with pytest.raises(LossScaleCollapseError) as info:
        updater.update()
    assert info.value.report.kind == "data"
    assert info.value.report.bad_leaves == ["out/affine/b"]
    assert updater.last_result.scale == 2.0 ** 15 and updater.last_result.skipped
    assert updater.state_dict()["calibration_pending"] is True
    assert updater.last_report is info.value.report
    lines = [m for m in messages(info_log) if "scale='auto'" in m]
    assert len(lines) == 3, lines
    for line in lines:
        assert_names(line, "scale='auto'", "measures nothing", "loss is not finite")


def test_auto_with_gradients_finite_at_a_smaller_scale_starts_at_the_floor(info_log):
    # Gradients beyond float16 at scale 1 that a smaller scale would fix (the loss is
    # finite): an overflow, not a batch to skip. min_scale=1 forbids the fix: the start is
    # the floor, where the step overflows, a collapse.
    net = Net("half", batch=64)
    with nn.context_scope(net.ctx):
        steep = F.sum(F.sin(F.mul_scalar(net.y, 2.0 ** 13)))
    updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.1), steep, net.feeder,
                                        scale="auto")
    with pytest.raises(LossScaleCollapseError):
        updater.update()
    assert math.isfinite(updater.last_result.loss)
    assert updater.last_result.scale == 1.0 and updater.last_result.skipped
    [line] = [m for m in messages(info_log) if "scale='auto'" in m]
    assert_names(line, "scale='auto'", "starts at 1", "largest gradient", "inf", "at scale 1",
                 "lower bound")


@pytest.mark.parametrize("floor_policy", ["raise", "warn", "ignore"])
def test_auto_measures_again_after_a_first_loss_not_finite(floor_policy, info_log):
    # Finite inputs, one of them (1e5) beyond float16: the first batch's loss is inf. No
    # scale fixes that; the calibration keeps the scale and measures the next batch, which
    # gives the start a run beginning with that batch gets. No collapse at the floor.
    def with_a_huge_input(net):
        batch = net.batch

        def huge_first(index):
            x, t = batch(index)
            if index == 0:
                x[0, 0] = 1e5
            return x, t
        net.batch = huge_first
        return net

    net = with_a_huge_input(Net("half", scope="huge"))
    updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.1), net.loss, net.feeder,
                                        scale="auto", N=1000,
                                        overflow=OverflowHandling(floor_policy=floor_policy))
    first = updater.update()
    assert (first.skipped, first.bad_batch, first.scale, first.next_scale) == (
        True, False, 2.0 ** 15, 2.0 ** 15)
    assert math.isinf(first.loss) and updater.state_dict()["calibration_pending"] is True
    second = updater.update()

    ref = Net("half", scope="ref")
    ref.calls = 1                           # its first batch is the other run's second
    start = DynamicLossScalingUpdater(ref.solver("Sgd", lr=0.1), ref.loss, ref.feeder,
                                      scale="auto", N=1000).update().scale
    assert 1.0 < start < 2.0 ** 15
    assert (second.skipped, second.scale, updater.scale) == (False, start, start)
    assert updater.state_dict()["calibration_pending"] is False
    assert updater.last_report is None
    lines = [m for m in messages(info_log) if "scale='auto'" in m]
    assert_names(lines[0], "scale='auto'", "measures nothing", "loss is not finite", "(inf)",
                 "stays 32768", "the next step")
    assert_names(lines[1], "scale='auto'", f"starts at {start:g}")


def test_auto_measures_again_after_a_nan_through_a_relu(info_log):
    # A NaN input through a ReLU: the loss is finite, the gradients are NaN at every scale.
    # The step is a bad batch; the calibration sets no scale and the next step measures.
    net = Net("half", hidden=8, activation="relu")
    net.nan = {0}
    updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.1), net.loss, net.feeder,
                                        scale="auto",
                                        policy=DynamicLossScale(
                                            growth_interval=1000, min_scale=2.0))
    first, second = updater.update(), updater.update()
    assert math.isfinite(first.loss)
    assert (first.skipped, first.bad_batch, first.scale) == (True, True, 2.0 ** 15)
    ref = Net("half", hidden=8, activation="relu", scope="ref")
    ref.feed(1)
    start = expected_start(room_by_numpy(ref.loss, ref.params, 1.0), lower=2.0)
    assert 2.0 < start and (second.updated, second.scale, updater.scale) == (True, start, start)
    lines = [m for m in messages(info_log) if "scale='auto'" in m]
    assert_names(lines[0], "scale='auto'", "measures nothing", "gradients are not finite",
                 "at scale 1", "6.10352e-05", "stays 32768")
    assert_names(lines[1], "scale='auto'", f"starts at {start:g}")


def test_auto_measures_again_after_a_bad_first_batch(info_log):
    # An inf in the first batch: the step is a bad batch, and what the calibration measured
    # on it says nothing about the data. The next step measures its own batch.
    net = Net("half", hidden=8)
    net.bad = {0}
    updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.1), net.loss, net.feeder,
                                        scale="auto",
                                        policy=DynamicLossScale(
                                            growth_interval=1000, min_scale=2.0))
    first, second = updater.update(), updater.update()
    assert (first.skipped, first.bad_batch, second.updated) == (True, True, True)
    ref = Net("half", hidden=8, scope="ref")
    ref.feed(1)
    start = expected_start(room_by_numpy(ref.loss, ref.params, 1.0), lower=2.0)
    assert 2.0 < start and second.scale == start and updater.scale == start
    lines = [m for m in messages(info_log) if "scale='auto'" in m]
    assert len(lines) == 2, lines
    assert_names(lines[1], "scale='auto'", f"starts at {start:g}")


def _two_layer_loss(x, t, scope, kind):
    """A two-layer model's loss, its graph in ``kind`` ("half" or "float"); graphs of one
    ``scope`` share the parameters."""
    with nn.context_scope(context(kind)), nn.parameter_scope(scope):
        h = F.relu(PF.affine(x, 8, name="h"))
        return F.mean(F.squared_error(PF.affine(h, 1, name="o"), t))


def test_a_calibration_still_due_at_the_precision_switch_is_dropped(info_log):
    # scale="auto" whose first batch is bad (the calibration stays due) and a schedule that
    # switches to full precision at step 1: step 1 has no loss scale to measure. It runs
    # the float32 graph on its own batch (forward and backward) at scale 1, as a hand step.
    x, t = nn.Variable((4, 3)), nn.Variable((4, 1))
    losses = {kind: _two_layer_loss(x, t, "net", kind) for kind in ("half", "float")}
    twin = _two_layer_loss(x, t, "twin", "float")
    with nn.parameter_scope("net"):
        params = nn.get_parameters()
    with nn.parameter_scope("twin"):
        twin_params = nn.get_parameters()
    for name, v in twin_params.items():
        v.d = params[name].d
    rng = np.random.RandomState(0)
    batches = [(rng.randn(4, 3), rng.randn(4, 1)) for _ in range(2)]
    batches[0][0][0, 0] = np.nan

    def feed():
        x.d, t.d = batches[updater.steps]

    solver = S.Sgd(0.1)
    solver.set_parameters(params)
    updater = DynamicLossScalingUpdater(solver, losses["half"], feed, scale="auto", N=1000,
                                        schedule=PrecisionSchedule(
                                            "fast|step|0.2", total_steps=5,
                                            high_precision_loss=losses["float"]))
    first, second = updater.update(), updater.update()
    assert (first.skipped, first.bad_batch, first.precision) == (True, True, "half")
    assert (second.updated, second.precision, second.scale) == (True, "float", 1.0)

    twin_solver = S.Sgd(0.1)
    twin_solver.set_parameters(twin_params)
    x.d, t.d = batches[1]
    twin_solver.zero_grad()
    twin.forward()
    twin.backward(1.0)
    twin_solver.update()
    assert second.loss == float(twin.d)
    assert_bitwise_equal({k: v.d.copy() for k, v in params.items()},
                         {k: v.d.copy() for k, v in twin_params.items()})
    # step 0 measured nothing (its bad batch, NaN at any scale); step 1 did not measure
    [line] = [m for m in messages(info_log) if "scale='auto'" in m]
    assert_names(line, "scale='auto'", "measures nothing")


def _resumed(path, steps, bad=(), **options):
    """A twin run (``Net("half", hidden=8)``, Adam, ``options``; ``bad``: its bad batches)
    saves a checkpoint at ``path`` after ``steps`` steps; a new updater on a new net of the
    same scope, as a new process would build them, loads it. Returns the new updater, its
    net and solver, and the state the twin saved."""
    first = Net("half", hidden=8, scope="first")
    first.bad = set(bad)
    a = DynamicLossScalingUpdater(first.solver("Adam", alpha=1e-2), first.loss, first.feeder,
                                  **options)
    for _ in range(steps):
        a.update()
    saved = a.state_dict()
    a.save_checkpoint(path)

    nn.clear_parameters()                                # as a new process would
    second = Net("half", hidden=8, scope="first")
    second.calls = steps
    solver = second.solver("Adam", alpha=1e-2)
    b = DynamicLossScalingUpdater(solver, second.loss, second.feeder, **options)
    b.load_checkpoint(path)
    return b, second, solver, saved


def test_a_resumed_run_does_not_calibrate_again(tmp_path, info_log):
    net = Net("half", hidden=8)
    solver = net.solver("Adam", alpha=1e-2)
    updater = DynamicLossScalingUpdater(solver, net.loss, net.feeder, scale="auto", N=2,
                                        growth_mode="measured")
    uninterrupted = [updater.update() for _ in range(6)]
    params, states = net.snapshot(), solver_states(solver)

    b, second, second_solver, _ = _resumed(str(tmp_path / "ckpt.npz"), 3, scale="auto",
                                           N=2, growth_mode="measured")
    info_log.clear()
    resumed = [b.update() for _ in range(3)]
    assert not [m for m in messages(info_log) if "scale='auto'" in m]
    assert second.calls == 6
    assert [(r.step, r.skipped, r.scale, r.next_scale) for r in resumed] == [
        (r.step, r.skipped, r.scale, r.next_scale) for r in uninterrupted[3:]]
    assert_bitwise_equal(second.snapshot(), params)
    assert_states_bitwise_equal(solver_states(second_solver), states)


def test_a_run_resumed_after_a_bad_first_batch_calibrates_as_the_uninterrupted_one(
        tmp_path, info_log):
    # The first batch is bad: the calibration is still due at step 1, in the run that goes
    # on and in the one resumed from a checkpoint saved after step 0.
    net = Net("half", hidden=8)
    net.bad = {0}
    solver = net.solver("Adam", alpha=1e-2)
    updater = DynamicLossScalingUpdater(solver, net.loss, net.feeder, scale="auto", N=1000)
    uninterrupted = [updater.update() for _ in range(3)]
    params, states = net.snapshot(), solver_states(solver)

    b, second, second_solver, saved = _resumed(str(tmp_path / "ckpt.npz"), 1, bad={0},
                                               scale="auto", N=1000)
    assert saved["calibration_pending"] is True
    info_log.clear()
    resumed = [b.update() for _ in range(2)]
    assert len([m for m in messages(info_log) if "scale='auto' starts" in m]) == 1
    assert [(r.step, r.skipped, r.scale, r.next_scale) for r in resumed] == [
        (r.step, r.skipped, r.scale, r.next_scale) for r in uninterrupted[1:]]
    assert_bitwise_equal(second.snapshot(), params)
    assert_states_bitwise_equal(solver_states(second_solver), states)
    assert b.state_dict()["calibration_pending"] is False


# -- measured growth ------------------------------------------------------------------------

def test_measured_growth_grows_by_exactly_what_the_gradients_allow():
    # lr=0 keeps the parameters, so a twin net measures each batch's reach independently
    # (with NumPy) at the scale the step runs with; N=1 makes every step a growth point.
    net, twin = Net("half", scope="net"), Net("half", scope="twin")
    updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.0), net.loss, net.feeder,
                                        scale=4.0, N=1, growth_mode="measured")
    scale, moves, reaches = 4.0, [], []
    for i in range(12):
        twin.feed(i)
        cap, reach = reach_by_numpy(twin.loss, twin.params, scale)
        reaches.append(reach)
        room = room_by_history(reaches, cap, scale)
        k = math.floor(math.log2(room)) if room >= 1 else 0
        expected = min(scale * 2.0 ** k, 2.0 ** 15)
        result = updater.update()
        assert (result.skipped, result.scale, result.next_scale) == (False, scale, expected), i
        moves.append(expected / scale)
        scale = expected
    # both branches of the rule were taken, and a growth of several factors in one move
    assert 1.0 in moves and max(moves) >= 2.0 ** 5


def test_measured_growth_never_tries_a_growth_that_overflows_where_probe_does():
    # Ordinary batches of the linear float16 net have gradients up to about 2 per unit of
    # scale: 2**15 overflows some of them. Probe growth walks into it; measured growth
    # stops where the gradients keep a margin of 8.
    skipped = {}
    for mode in ("probe", "measured"):
        net = Net("half", scope=mode)
        updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.01), net.loss, net.feeder,
                                            scale=1024.0, N=2, growth_mode=mode)
        skipped[mode] = [updater.update().skipped for _ in range(40)].count(True)
        if mode == "measured":
            assert updater.scale < 2.0 ** 15
    assert skipped["probe"] >= 1 and skipped["measured"] == 0


SPIKE = {10, 11, 12}          # steps whose batches are 60 times larger
SPIKE_FACTOR = 60.0           # float16 gradients overflow above a scale of about 430


def _spike_run(mode):
    net = Net("half", scope=mode)

    def feeder():
        x, t = net.batch(net.calls)
        net.x.d, net.t.d = (x * SPIKE_FACTOR if net.calls in SPIKE else x), t
        net.calls += 1

    updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.01), net.loss, feeder,
                                        policy=DynamicLossScale(
                                            init_scale=2048.0, growth_interval=5,
                                            max_scale=2048.0, growth_mode=mode))
    return [updater.update() for _ in range(20)]


def test_after_a_spike_measured_growth_comes_back_in_one_move():
    for mode in ("probe", "measured"):
        results = _spike_run(mode)
        assert [r.step for r in results if r.skipped] == sorted(SPIKE), mode
        assert [results[s].scale for s in sorted(SPIKE)] == [2048.0, 1024.0, 512.0], mode
        assert results[13].scale == 256.0
        # step 17 is the fifth good step after the spike: the first growth point
        assert [r.next_scale for r in results[13:17]] == [256.0] * 4, mode
        after = results[17].next_scale
        if mode == "measured":
            assert after >= 2048.0 / 2.0       # within one factor of the pre-spike scale
        else:
            assert after == 512.0              # one factor per growth point


# -- gradient statistics --------------------------------------------------------------------

def numpy_stats(net, batch, scale):
    """Per parameter: (zero, subnormal, non-finite fractions, max |g|, headroom) of the
    gradients a backward at ``scale`` on ``batch`` gives, read with NumPy."""
    net.feed(batch)
    for v in net.params.values():
        v.grad.zero()
    net.loss.forward()
    net.loss.backward(scale)
    out = {}
    for name, v in net.params.items():
        g = np.asarray(v.g)
        kind = FLOATS[str(g.dtype)]
        a = np.abs(g.astype(np.float64))
        top = a.max()
        headroom = math.inf if top == 0 else float(math.floor(math.log2(kind.max / top)))
        out[name] = (np.mean(a == 0), np.mean((a > 0) & (a < kind.tiny)),
                                      np.mean(~np.isfinite(g)), top, headroom)
    return out


def test_gradient_stats_every_k_steps_are_those_of_the_backward_pass():
    # A scale of 2**-19 pushes float16 gradients to subnormals and zeros; lr=0 keeps
    # the parameters, so a twin net reproduces each step's gradients with NumPy.
    net, twin = Net("half", hidden=8, scope="net"), Net("half", hidden=8, scope="twin")
    updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.0), net.loss, net.feeder,
                                        policy=DynamicLossScale(
                                            init_scale=2.0 ** -19, growth_interval=1000,
                                            min_scale=2.0 ** -20),
                                        gradient_stats_every=3)
    seen = 0
    for i in range(7):
        result = updater.update()
        if i % 3 != 2:
            assert result.gradient_stats is None, i
            continue
        seen += 1
        expected = numpy_stats(twin, i, 2.0 ** -19)
        got = result.gradient_stats      # names relative to the scope, as the solver's
        assert sorted(got) == sorted(expected)
        for name, (zeros, subnormals, nonfinite, top, headroom) in expected.items():
            s = got[name]
            assert (s.zero_fraction, s.subnormal_fraction, s.nonfinite_fraction,
                    s.max_abs, s.headroom, s.dtype) == pytest.approx(
                        (zeros, subnormals, nonfinite, top, headroom, "float16")), name
    assert seen == 2
    assert any(s.subnormal_fraction > 0 for s in got.values())
    assert any(s.zero_fraction > 0 for s in got.values())


def test_gradient_stats_count_nan_and_inf_as_non_finite_not_as_zeros(tmp_path):
    # A NaN in the batch of the linear float16 net: every element of both gradients is NaN
    # (each sums over the batch rows, the NaN row among them). No zero, no subnormal.
    from nnabla.monitor import Monitor

    from nnabla_mpt import LossScaleMonitor

    net = Net("half")
    net.nan = {0}
    monitor = LossScaleMonitor(Monitor(str(tmp_path)), interval=1)
    updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.1), net.loss, net.feeder,
                                        scale=8.0, gradient_stats_every=1, monitor=monitor)
    result = updater.update()
    assert result.bad_batch and sorted(result.gradient_stats) == ["out/affine/W",
                                                                  "out/affine/b"]
    for name, st in result.gradient_stats.items():
        assert np.isnan(net.params[name].g).all(), name
        assert (st.zero_fraction, st.subnormal_fraction, st.nonfinite_fraction,
                st.max_abs, st.headroom) == (0.0, 0.0, 1.0, math.inf, -math.inf), name
    series = (tmp_path / "loss-scale-gradient-zero-fraction.series.txt").read_text()
    assert [float(x) for x in series.split()] == [0.0, 0.0]


def test_gradient_stats_of_a_mixed_gradient_are_exact():
    # d/dp sum(p * c) = c at scale 1: the gradient of p is the float16 image of c, with
    # three zeros, a NaN, two infinities, a subnormal and three normal values.
    c = np.array([0.0, -0.0, 0.0, np.nan, np.inf, -np.inf, 1e-6, 1.0, -2.0, 0.5],
                 dtype=np.float32)
    x = nn.Variable.from_numpy_array(c)
    with nn.context_scope(context("half")), nn.parameter_scope("mixed"):
        p = nn.parameter.get_parameter_or_create("p", c.shape, np.ones_like(c))
        loss = F.sum(F.mul2(p, x))
        params = nn.get_parameters()
    solver = S.Sgd(0.1)
    solver.set_parameters(params)
    result = FixedLossScalingUpdater(solver, loss, scale=1.0,
                                     gradient_stats_every=1).update()
    g = np.asarray(params["p"].g)
    assert g.dtype == np.float16 and np.array_equal(g, c.astype(np.float16), equal_nan=True)
    st = result.gradient_stats["p"]
    assert (st.size, st.dtype, st.zero_fraction, st.subnormal_fraction,
            st.nonfinite_fraction, st.max_abs, st.headroom) == (
                10, "float16", 0.3, 0.1, 0.3, math.inf, -math.inf)


def test_loss_scale_monitor_writes_the_gradient_series(tmp_path):
    from nnabla.monitor import Monitor

    from nnabla_mpt import LossScaleMonitor
    from nnabla_mpt.scale.gradient_stats import overall

    net = Net("half", hidden=8)
    seen = []
    monitor = LossScaleMonitor(Monitor(str(tmp_path)), interval=4)
    updater = DynamicLossScalingUpdater(
        net.solver("Sgd", lr=0.01), net.loss, net.feeder,
        policy=DynamicLossScale(
            init_scale=2.0 ** -8, growth_interval=1000, min_scale=2.0 ** -10),
            gradient_stats_every=2,
        monitor=lambda r: (seen.append(r), monitor(r)))
    for _ in range(8):
        updater.update()
    written = {}
    for key in ("zero-fraction", "subnormal-fraction", "headroom"):
        lines = (tmp_path / f"loss-scale-gradient-{key}.series.txt").read_text().split("\n")
        written[key] = [tuple(float(x) for x in line.split()) for line in lines if line]
    for key, field in (("zero-fraction", "zero_fraction"),
                       ("subnormal-fraction", "subnormal_fraction"),
                       ("headroom", "headroom")):
        # windows end at steps 3 and 7; their last statistics are those of steps 3 and 7
        expected = [(step, getattr(overall(seen[step].gradient_stats), field))
                    for step in (3, 7)]
        assert [s for s, _ in written[key]] == [3.0, 7.0]
        assert [v for _, v in written[key]] == pytest.approx(
            [v for _, v in expected], rel=1e-5), key


def test_gradients_bounded_by_the_seed_only_have_to_fit():
    # A summed cross-entropy: the per-example losses' gradients are the scale itself and
    # the logits' are (p - y) times it. Bounded by the scale whatever the data, they need
    # no margin; the parameters' gradients and the hidden activations' do.
    from nnabla_mpt.core import graph
    from nnabla_mpt.scale.measured import room
    from nnabla_mpt.diagnosis.watch import RangeWatch

    net = Net("half", hidden=8, d_out=3)
    with nn.context_scope(net.ctx):
        labels = nn.Variable((4, 1))
        loss = F.sum(F.softmax_cross_entropy(net.y, labels))
    net.feed(0)
    labels.d = np.array([[0], [2], [1], [0]])
    scale = 4096.0
    loss.forward(clear_no_need_grad=False)
    watch = RangeWatch(loss, graph.float_context(loss)).run(loss, scale)
    watch.add([v.grad for v in net.params.values()], 65504.0)
    maxima, limits, bounds = watch.read()
    assert sorted(bounds[np.isfinite(bounds)]) == [1.0, 1.0]     # the CE's output, logits
    assert maxima[np.isfinite(bounds)].max() == scale            # the summed losses' inputs
    expected = room_by_numpy(loss, net.params, scale)
    assert room(watch, scale)[0] == pytest.approx(expected, rel=1e-6)
    # with the margin on those two as well, the scale could not even double
    assert 65504.0 / (scale * MARGIN) < 2.0 <= expected


# -- the history of measured growth ---------------------------------------------------------

def _history_run(factors, steps, scale=2048.0, nan=(), feed=None, N=1, **options):
    """A linear float16 net with lr=0 (its gradients depend on the batch alone) trained
    with measured growth and ``N`` (1: every good step a growth point) for ``steps`` steps.
    Step ``i`` reads batch ``feed(i)`` (``i``) with its inputs multiplied by
    ``factors.get(i, 1)``; the batches in ``nan`` hold a NaN. Returns the updater, its
    results and a twin net that reproduces step ``i``'s batch (``twin.feed(i)``)."""
    net, twin = Net("half", scope="net"), Net("half", scope="twin")
    net.nan = set(nan)
    which = feed or (lambda i: i)

    def batch(i):
        x, t = Net.batch(net, which(i))
        return x * np.float32(factors.get(i, 1.0)), t

    def feeder():
        net.x.d, net.t.d = batch(net.calls)
        net.calls += 1

    twin.batch = batch
    updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.0), net.loss, feeder,
                                        scale=scale, N=N, growth_mode="measured", **options)
    return updater, [updater.update() for _ in range(steps)], twin


def test_a_state_without_a_history_is_watched_until_it_holds_four(tmp_path):
    # N=5, resumed after 10 steps from a state whose history is dropped (as a state saved
    # before the history existed loads): steps 10 to 13 are watched for it, then only the
    # growth point 14 among the next five steps.
    options = dict(scale="auto", N=5, growth_mode="measured")
    b, _, _, saved = _resumed(str(tmp_path / "ckpt.npz"), 10, **options)
    assert len(saved["scale_history"]) == 6                   # steps 0 to 3, 4 and 9
    b.load_state_dict({**b.state_dict(), "scale_history": []})
    lengths = []
    for _ in range(9):
        assert not b.update().skipped
        lengths.append(len(b.state_dict()["scale_history"]))
    assert lengths == [1, 2, 3, 4, 5, 5, 5, 5, 5]


def test_the_first_steps_fill_the_history_for_the_first_growth_point():
    # N=5: every step is watched until the history holds 4 reaches (steps 0 to 3), so the
    # first growth point (step 4) decides from five passes by the history's rule; then
    # only the growth points are (step 9; the 25th step is beyond the run).
    updater, results, twin = _history_run({}, 10, scale=64.0, N=5, feed=lambda i: i % 3)
    assert not any(r.skipped for r in results)
    reaches, caps = [], []
    for step in (0, 1, 2, 3, 4, 9):
        twin.feed(step)
        cap, reach = reach_by_numpy(twin.loss, twin.params, results[step].scale)
        reaches.append(reach)
        caps.append(cap)
    assert updater.state_dict()["scale_history"] == pytest.approx(reaches, rel=1e-6)
    room = room_by_history(reaches[:5], caps[4], 64.0)
    assert results[3].next_scale == 64.0
    assert results[4].next_scale == min(64.0 * 2.0 ** math.floor(math.log2(room)), 2.0 ** 15)
    assert results[4].next_scale > 64.0 * 2.0 ** math.floor(math.log2(
        min(caps[4], reaches[4] / MARGIN) / 64.0))         # more than one batch allows


def test_after_a_skipped_spike_the_first_growth_point_moves_back_to_the_history():
    # Batches 3 and 11 are three times larger (gradients about 9 times): the history has
    # seen one such batch before the spike (8, 9, 10), so when the first growth point after
    # the spike measures the second one, the history still supports the scale of before
    # the spike. One batch alone, with its margin of 8, allows 8 times less.
    factors = {3: 3.0, 11: 3.0, 8: 60.0, 9: 60.0, 10: 60.0}
    updater, results, twin = _history_run(factors, 12)
    assert [r.step for r in results if r.skipped] == [8, 9, 10]
    before, low = results[8].scale, results[10].next_scale
    assert low == before / 8                    # three back-offs
    twin.feed(11)
    cap, reach = reach_by_numpy(twin.loss, twin.params, low)
    assert min(cap, reach / MARGIN) < before / 2      # what one batch would allow
    assert results[11].scale == low and results[11].next_scale == before    # one move


def test_skipped_steps_and_bad_batches_record_nothing():
    # Every step is a growth point. An overflowing batch (5) and a batch with a NaN (7) are
    # skipped; the history holds the reaches of the good steps only, each measured at the
    # scale its step ran with, and the scale comes back at once after the overflow.
    updater, results, twin = _history_run({5: 60.0}, 10, scale=256.0, nan={7})
    assert [(r.step, r.bad_batch) for r in results if r.skipped] == [(5, False), (7, True)]
    expected = []
    for r in results:
        if not r.skipped:
            twin.feed(r.step)
            expected.append(reach_by_numpy(twin.loss, twin.params, r.scale)[1])
    assert updater.state_dict()["scale_history"] == pytest.approx(expected[-8:], rel=1e-6)
    assert results[6].next_scale >= results[5].scale       # back where it was, at once
    assert results[8].next_scale == results[7].scale       # a bad batch keeps the scale


def test_the_margin_follows_the_spread_the_history_has_seen():
    # A steady stream (the same batch at every step) keeps the smallest margin, 2**0.5, and
    # grows to it; a noisy one (inputs up to 3 times larger) a larger one, as the NumPy
    # rule says, and stays 8 times lower.
    steady, _, twin = _history_run({i: 16.0 for i in range(8)}, 8, scale=1.0,
                                   feed=lambda i: 0)
    twin.feed(0)
    cap, reach = reach_by_numpy(twin.loss, twin.params, 1.0)
    assert reach / 2 ** 0.5 < cap
    assert steady.scale == 2.0 ** math.floor(math.log2(reach / 2 ** 0.5))
    assert steady.scale >= 4 * 2.0 ** math.floor(math.log2(reach / MARGIN))

    factors = {i: 16.0 * (1.0 + (i % 3)) for i in range(8)}
    noisy, results, twin = _history_run(factors, 8, scale=1.0, feed=lambda i: 0)
    del results
    history = noisy.state_dict()["scale_history"]
    assert len(history) == 8 and min(history) < max(history) / 4
    logs = np.log2(history)
    margin = 2.0 ** np.clip(3 * np.std(logs, ddof=1) - (logs.mean() - logs.min()), 0.5, 3.0)
    assert margin > 2.0
    # (the scale never falls at a growth point: it holds what the first passes allowed)
    assert noisy.scale <= max(2.0 ** math.floor(math.log2(min(history) / margin)),
                              steady.scale / 8)


def test_a_resumed_run_keeps_the_history_and_its_trajectory(tmp_path):
    # Every step is a growth point; the history at step 6 decides the scales after it. The
    # resumed run repeats the uninterrupted one bitwise; without the history it would not.
    options = dict(scale=64.0, N=1, growth_mode="measured")
    net = Net("half", hidden=8)
    solver = net.solver("Adam", alpha=1e-2)
    updater = DynamicLossScalingUpdater(solver, net.loss, net.feeder, **options)
    uninterrupted = [updater.update() for _ in range(10)]
    params, states = net.snapshot(), solver_states(solver)

    b, second, second_solver, saved = _resumed(str(tmp_path / "ckpt.npz"), 6, **options)
    assert len(saved["scale_history"]) == 6 and b.state_dict() == saved
    resumed = [b.update() for _ in range(4)]
    assert [(r.step, r.skipped, r.scale, r.next_scale) for r in resumed] == [
        (r.step, r.skipped, r.scale, r.next_scale) for r in uninterrupted[6:]]
    assert_bitwise_equal(second.snapshot(), params)
    assert_states_bitwise_equal(solver_states(second_solver), states)

    c, third, _, _ = _resumed(str(tmp_path / "ckpt2.npz"), 6, **options)
    c.load_state_dict({**c.state_dict(), "scale_history": []})
    forgetful = [c.update().next_scale for _ in range(4)]
    assert forgetful != [r.next_scale for r in uninterrupted[6:]]


def test_the_calibrated_start_is_the_power_of_two_below_the_room_within_the_bounds():
    from nnabla_mpt.scale.measured import calibrated_scale
    assert calibrated_scale(0.75, 2.0 ** -10, 1024.0) == 0.5     # below 1 too
    assert calibrated_scale(12.0, 1.0, 1024.0) == 8.0
    assert calibrated_scale(0.0, 2.0 ** -10, 1024.0) == 2.0 ** -10
    assert calibrated_scale(math.inf, 1.0, 1024.0) == 1024.0
    assert calibrated_scale(1e9, 1.0, 1024.0) == 1024.0
    assert calibrated_scale(0.1, 1.0, 1024.0) == 1.0


def test_auto_measures_at_the_first_probe_where_a_gradient_is_small_but_not_zero(info_log):
    # gradients far below 1 at scale 1 are still a measurement: the probe stays at 1
    net = Net("half", scope="small_grads")
    with nn.context_scope(net.ctx):
        small_loss = F.mul_scalar(net.loss, 1e-3)
    updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.1), small_loss, net.feeder,
                                        scale="auto")
    updater.update()
    [line] = [m for m in messages(info_log) if "scale='auto'" in m]
    largest = float(line.split("the largest gradient is ")[1].split()[0])
    assert 0.0 < largest < 1.0
    assert_names(line, "at scale 1;")



# -- what a watched pass measured, unit by unit ----------------------------------------------

def _watch_of(net, *arrays, limit=65504.0):
    """A RangeWatch of ``net``'s loss holding ``arrays`` (host values) with no bound."""
    from nnabla_mpt.diagnosis.watch import RangeWatch
    from nnabla_mpt.core import graph
    watch = RangeWatch(net.loss, graph.float_context(net.loss))
    held = []
    for values in arrays:
        a = nn.NdArray(np.shape(values))
        a.data = np.asarray(values, dtype=np.float32)
        held.append(a)
    return watch.add(held, limit)


def test_the_reaches_of_gradients_without_a_bound():
    import warnings
    from nnabla_mpt.scale.measured import reaches
    net = Net("half", scope="reaches")
    # the largest gradient 8 at scale 4: it would reach 65504 at 4 * 65504 / 8
    assert reaches(_watch_of(net, [2.0, -1.0], [0.5, -8.0]), 4.0) == (
        math.inf, 4.0 * 65504.0 / 8.0, 8.0)
    # an inf or NaN: the pass overflowed, nothing to grow on
    assert reaches(_watch_of(net, [1.0], [2.0, np.inf]), 4.0) == (0.0, 0.0, math.inf)
    # every gradient zero: unbounded reach, and no division warning on the way
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert reaches(_watch_of(net, [0.0], [0.0, 0.0]), 4.0) == (math.inf, math.inf, 0.0)


def test_a_step_s_measurement_settles_into_the_room_the_policy_gets():
    net = Net("half", scope="settled")
    updater = DynamicLossScalingUpdater(net.solver(), net.loss, net.feeder, scale=4.0,
                                        growth_mode="measured")
    meter = updater._meter
    assert meter.settled(None, False) == (None, None)
    assert meter.settled((64.0, 4096.0, 4.0), True) == (None, None)    # skipped: nothing
    assert len(meter.history) == 0
    assert meter.settled((64.0, 0.0, 4.0), False) == (0.0, 0.0)         # overflowed: hold
    # one reach in a short history: supported with the margin of one batch, over the scale
    assert meter.settled((64.0, 1.0, 4.0), False) == (1.0 / MARGIN / 4.0, 1.0 / MARGIN / 4.0)
    assert meter.settled((2.0, 4096.0, 4.0), False) == (2.0 / 4.0, 4096.0 / MARGIN / 4.0)
    assert len(meter.history) == 2


def test_once_the_history_is_long_enough_every_25th_step_is_watched():
    from nnabla_mpt.scale.scale_history import MIN_SAMPLES, WATCH_EVERY
    net = Net("half", scope="watch_every")
    updater = DynamicLossScalingUpdater(net.solver(), net.loss, net.feeder, scale=4.0,
                                        N=1000, growth_mode="measured")
    meter = updater._meter
    assert meter.growth_watch(3) is not None           # a short history: every step
    for _ in range(MIN_SAMPLES):
        meter.history.record(4096.0)
    watched = [i for i in range(3 * WATCH_EVERY) if meter.growth_watch(i) is not None]
    assert watched == [WATCH_EVERY - 1, 2 * WATCH_EVERY - 1, 3 * WATCH_EVERY - 1]


def test_measured_growth_keeps_the_reduced_gradients_within_the_reduction_s_dtype():
    # A stand-in for nnabla's NCCL communicator made from a half context, which sums even
    # float32 gradients in float16 (mpi_workers/standins.py: NcclLikeCommunicator, one
    # process): measured growth is held by what a float16 sum holds, and no step
    # overflows; the same communicator summing in float32 lets the scale grow to its bound.
    from mpi_workers.standins import NcclLikeCommunicator
    runs = {}
    for dtype in ("float16", "float32"):
        net = Net("float", scope=f"reduced_in_{dtype}")
        updater = DynamicLossScalingUpdater(net.solver(), net.loss, net.feeder, scale=8.0,
                                            N=1, growth_mode="measured",
                                            comm=NcclLikeCommunicator(dtype))
        runs[dtype] = [updater.update() for _ in range(6)]
    assert not any(r.skipped for results in runs.values() for r in results)
    assert max(r.scale for r in runs["float16"]) <= 2.0 ** 15
    assert "gradients" in {r.held_by for r in runs["float16"]}
    assert runs["float32"][-1].scale == 2.0 ** 24


def test_the_seed_itself_is_not_watched_so_small_gradients_reach_the_ceiling():
    # The loss's own gradient is the scale: were it watched, it would hold every float16
    # scale below 65504 / 8. Gradients 10**4 times smaller than usual leave room for the
    # ceiling itself, at the start of scale="auto" and in measured growth.
    net = Net("half", scope="tiny_grads")
    with nn.context_scope(net.ctx):
        tiny = F.mul_scalar(net.loss, 1e-4)
    auto = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.0), tiny, net.feeder,
                                     scale="auto")
    assert auto.update().scale == 2.0 ** 15
    grown = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.0), tiny, net.feeder,
                                      scale=8.0, N=1, growth_mode="measured")
    assert [grown.update().scale for _ in range(3)][-1] == 2.0 ** 15


def test_a_max_scale_asked_for_at_the_ceiling_is_what_holds_the_growth():
    # with max_scale=2**15 asked for, the bound holds the scale, not the float16 ceiling
    held = {}
    for max_scale in (2.0 ** 15, 2.0 ** 24):
        net = Net("half", scope=f"held_{int(max_scale)}")
        with nn.context_scope(net.ctx):
            tiny = F.mul_scalar(net.loss, 1e-4)
        policy = DynamicLossScale(init_scale=2.0 ** 14, growth_interval=1,
                                  max_scale=max_scale, growth_mode="measured")
        updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.0), tiny, net.feeder,
                                            policy=policy)
        held[max_scale] = {updater.update().held_by for _ in range(4)} - {None}
    assert held == {2.0 ** 15: {"max_scale"}, 2.0 ** 24: {"ceiling"}}

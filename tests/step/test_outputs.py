"""``outputs=``: extra Variables (an error rate) computed by the step's own forward pass,
as nnabla-examples' cifar10 computes them with ``F.sink(loss, error)``: the values, the
parameters and the batch-normalization statistics are those of the hand-written sink loop,
bitwise, on a graph with random augmentation and batch normalization."""
import numpy as np
import pytest

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla.solvers as S

from nnabla_mpt import DynamicLossScalingUpdater, FixedLossScalingUpdater, PrecisionSchedule
from support import Net, assert_bitwise_equal, context, raises_naming


class AugmentedNet:
    """``x -> random flip -> image augmentation -> conv -> batch norm -> relu -> affine``,
    softmax cross-entropy loss and top-1 error, as cifar10's training graph has them.
    The random functions have their own seeds, so two nets built alike draw alike."""

    def __init__(self, scope: str) -> None:
        self.scope = scope
        with nn.context_scope(context("float")), nn.parameter_scope(scope):
            self.x = nn.Variable((4, 3, 8, 8))
            self.t = nn.Variable((4, 1))
            h = F.random_flip(self.x, axes=[3], seed=11)
            h = F.image_augmentation(h, shape=(3, 8, 8), angle=0.3, contrast=1.2,
                                     brightness=0.1, seed=12)
            h = F.relu(PF.batch_normalization(PF.convolution(h, 4, (3, 3), name="conv"),
                                              name="bn"))
            self.pred = PF.affine(h, 5, name="fc")
            self.loss = F.mean(F.softmax_cross_entropy(self.pred, self.t))
            self.error = F.mean(F.top_n_error(self.pred, self.t))
            self.params = nn.get_parameters()                   # trained
            self.all_params = nn.get_parameters(grad_only=False)  # with the running stats
        rng = np.random.RandomState(0)
        for v in self.all_params.values():
            v.d = rng.uniform(-0.5, 0.5, v.shape).astype(np.float32)
        self.calls = 0

    def feeder(self) -> None:
        rng = np.random.RandomState(100 + self.calls)
        self.x.d = rng.randn(*self.x.shape)
        self.t.d = rng.randint(0, 5, self.t.shape)
        self.calls += 1

    def solver(self):
        solver = S.Momentum(0.05, 0.9)
        solver.set_parameters(self.params)
        return solver

    def snapshot(self):
        n = len(self.scope) + 1
        return {name[n:] if name.startswith(self.scope + "/") else name: v.d.copy()
                for name, v in self.all_params.items()}


@pytest.mark.parametrize("accum_grad", [1, 2])
@pytest.mark.parametrize("cls", [FixedLossScalingUpdater, DynamicLossScalingUpdater])
def test_outputs_equal_the_sink_loops_values_parameters_and_statistics(cls, accum_grad):
    ours, ref = AugmentedNet("ours"), AugmentedNet("ref")
    # the reference: nnabla-examples' cifar10 loop, its outputs persistent as there
    for v in (ref.pred, ref.loss, ref.error):
        v.persistent = True
    sink = F.sink(ref.loss, ref.error)
    ref_solver = ref.solver()
    seen = []                                  # what our outputs hold at each feed

    def feeder():
        seen.append((float(ours.error.d), ours.pred.d.copy()))
        ours.feeder()

    updater = cls(ours.solver(), ours.loss, feeder, scale=1.0, accum_grad=accum_grad,
                  outputs=[ours.error, ours.pred])
    assert_bitwise_equal(ours.snapshot(), ref.snapshot())
    expected = []
    for step in range(5):
        result = updater.update()
        ref_solver.zero_grad()
        losses = []
        for _ in range(accum_grad):
            ref.feeder()
            sink.forward(clear_no_need_grad=True)
            sink.backward(clear_buffer=True)
            expected.append((float(ref.error.d), ref.pred.d.copy()))
            losses.append(float(ref.loss.d))
        ref_solver.update()
        assert not result.skipped and result.loss == pytest.approx(np.mean(losses), rel=0)
        # after update(): the last micro-batch's values
        assert float(ours.error.d) == expected[-1][0], step
        assert ours.pred.d.tobytes() == expected[-1][1].tobytes(), step
        assert_bitwise_equal(ours.snapshot(), ref.snapshot())   # parameters, BN statistics
    # a data_feeder finds the previous micro-batch's values: every micro-batch's, in order
    got = seen[1:] + [(float(ours.error.d), ours.pred.d.copy())]
    assert len(got) == len(expected) == 5 * accum_grad
    for (error, pred), (ref_error, ref_pred) in zip(got, expected):
        assert error == ref_error and pred.tobytes() == ref_pred.tobytes()
    assert len({e for e, _ in expected}) > 1       # the error changes: a real comparison


def test_forwarding_the_error_again_after_update_is_not_the_steps_error():
    """What the step replaces: a second forward pass draws the augmentation again and
    moves the batch-norm statistics a second time."""
    ours, ref = AugmentedNet("ours"), AugmentedNet("ref")
    ref.error.persistent = True
    sink = F.sink(ref.loss, ref.error)
    ref_solver = ref.solver()
    updater = FixedLossScalingUpdater(ours.solver(), ours.loss, ours.feeder, scale=1.0)
    updater.update()
    ours.error.forward()
    ref_solver.zero_grad()
    ref.feeder()
    sink.forward(clear_no_need_grad=True)
    sink.backward(clear_buffer=True)
    ref_solver.update()
    assert (ours.snapshot()["bn/bn/mean"].tobytes() != ref.snapshot()["bn/bn/mean"].tobytes())


@pytest.mark.parametrize("outputs, exc, facts", [
    ("error", TypeError, ("outputs", "None", "list of nnabla.Variable", "str")),
    ([3], TypeError, ("outputs[0]", "nnabla.Variable", "int")),
    ([nn.Variable((2,))], ValueError,
     ("outputs[0]", "leaf Variable", "shape (2,)", "no function computes it")),
])
def test_outputs_are_checked(outputs, exc, facts):
    net = AugmentedNet("net")
    with raises_naming(exc, *facts):
        FixedLossScalingUpdater(net.solver(), net.loss, outputs=outputs)


def test_an_output_given_twice_or_the_loss_itself_is_refused():
    net = AugmentedNet("net")
    with raises_naming(ValueError, "outputs[1]", "twice", "outputs[0]"):
        FixedLossScalingUpdater(net.solver(), net.loss, outputs=[net.error, net.error])
    with raises_naming(ValueError, "outputs[1]", "the loss itself", "StepResult.loss",
                       "pass the other outputs only"):
        FixedLossScalingUpdater(net.solver(), net.loss, outputs=[net.error, net.loss])


def test_outputs_with_a_precision_schedule_are_refused():
    half, full = Net("half", scope="half"), Net("float", scope="full")
    with nn.context_scope(half.ctx):
        error = F.mean(F.abs(half.y - half.t))
    with raises_naming(ValueError, "outputs", "1 Variables", "precision schedule",
                       "'fast|step|0.9'", "high_precision_loss"):
        DynamicLossScalingUpdater(half.solver(), half.loss,
                                  schedule=PrecisionSchedule("fast|step", total_steps=10,
                                                             high_precision_loss=full.loss),
                                  outputs=[error])


@pytest.mark.parametrize("in_place", [False, True])
def test_outputs_change_nothing_of_a_half_run_with_skips(in_place):
    """With a float16 graph, a dynamic scale and overflowing batches, a run with outputs
    trains exactly as one without: the sink is only run forward, and the scale still
    reaches the gradients. A loss computed in place (F.reshape) is read after the sink's
    pass. The error is the step's: that of the last micro-batch on the parameters the
    step started from."""
    runs = []
    for outputs in (False, True):
        net = Net("half", scope=f"run{int(outputs)}")
        net.large = {1, 2, 6}
        with nn.context_scope(net.ctx):
            loss = F.reshape(net.loss, (1,)) if in_place else net.loss
            error = F.mean(F.abs(net.y - net.t))
        updater = DynamicLossScalingUpdater(net.solver("Adam", alpha=1e-2), loss, net.feeder,
                                            scale=2048.0, N=2, accum_grad=2,
                                            outputs=[error] if outputs else None)
        results = []
        for _ in range(8):
            start = net.snapshot()
            r = updater.update()
            results.append((r.skipped, r.scale, r.loss))
        runs.append((results, net.snapshot(), start, error.d.copy()))
    (results, params, _, _), (results_out, params_out, start, last_error) = runs
    assert results_out == results and any(s for s, _, _ in results)
    assert len({scale for _, scale, _ in results}) > 1       # backed off and grew
    assert_bitwise_equal(params_out, params)
    check = Net("half", scope="check")
    for name, v in check.params.items():
        v.d = start[name]
    check.feed(8 * 2 - 1)
    with nn.context_scope(check.ctx):
        check_error = F.mean(F.abs(check.y - check.t))
    check_error.forward()
    assert last_error.tobytes() == check_error.d.tobytes()

"""MPICommunicator.all_reduce_callback / get_all_reduce_callback, as training scripts pass
them to ``loss.backward(communicator_callbacks=...)``, and the updaters' keyword."""
import numpy as np
import pytest

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF

from mpi_helpers import bits, ranks_fixture, run_mpi
from nnabla_mpt import DynamicLossScalingUpdater, FixedLossScalingUpdater, GradientReduction
from nnabla_mpt.core import graph
from support import Net, assert_names, raises_naming

run = ranks_fixture("reduce_callback.py")


def _loop(npz, name):
    return {k.split("/", 1)[1]: v for k, v in npz.items() if k.split("/", 1)[0] == name}


def _assert_same_bits(a, b, what):
    assert a.keys() == b.keys() and a
    for k in a:
        np.testing.assert_array_equal(bits(a[k]), bits(b[k]), err_msg=f"{what}: {k}")


@pytest.mark.parametrize("loop, reference", [
    ("inline", "explicit"), ("persistent", "explicit"), ("examples", "explicit"),
    ("inline_scaled", "explicit_scaled"), ("inline_half", "explicit_half"),
    ("updater_callback", "updater")])
def test_the_callback_gives_the_parameters_of_the_all_reduce_after_backward(
        run, loop, reference):
    n, res = run
    for r, (npz, _) in enumerate(res):
        _assert_same_bits(_loop(npz, loop), _loop(npz, reference), f"rank {r} {loop}")


def test_the_ranks_agree_only_where_the_gradients_were_reduced(run):
    n, res = run
    for loop in ("explicit", "inline", "persistent", "examples", "inline_half"):
        for r in range(1, n):
            _assert_same_bits(_loop(res[r][0], loop), _loop(res[0][0], loop), loop)
    # without a reduction the ranks' own batches move them apart
    drift = _loop(res[0][0], "none"), _loop(res[1][0], "none")
    assert any(not np.array_equal(drift[0][k], drift[1][k]) for k in drift[0])


def test_one_reduction_per_step_whatever_the_solver_operations(run):
    """Weight decay, clipping and the update each reach nnabla's solver hook; the armed
    reduction runs once per backward pass."""
    n, res = run
    for _, meta in res:
        assert meta["reductions"] == {
            "explicit": 5, "none": 0, "inline": 5, "persistent": 5, "examples": 5,
            "explicit_scaled": 5, "inline_scaled": 5, "explicit_half": 5, "inline_half": 5,
            "updater": 6, "updater_callback": 6}      # the updaters: + the fingerprint
        armed = {k for k, v in meta["armed_after"].items() if v}
        assert armed == {"inline", "persistent", "examples", "inline_scaled", "inline_half"}


def test_the_updater_says_it_reduces_after_the_pass_and_refuses_an_armed_comm(run):
    n, res = run
    for _, meta in res:
        assert len(meta["updater_log"]) == 1
        assert_names(meta["updater_log"][0], "MPICommunicator", "reduces the gradients",
                     "after the backward pass")
        assert_names(meta["armed_error"], "all_reduce_callback()",
                     "comm.clear_all_reduce_callback()")
        assert meta["updated_after_clear"] is True


# -- one process ---------------------------------------------------------------------------

def test_both_return_none_and_one_rank_arms_nothing_for_the_examples_wrapper(solo):
    net = Net("float", scope="solo_wrapper")
    with nn.parameter_scope("solo_wrapper"):
        assert solo.get_all_reduce_callback() is None
    assert not solo.all_reduce_callback_armed
    assert solo.all_reduce_callback([v.grad for v in net.params.values()], 1024) is None
    assert solo.all_reduce_callback_armed
    solo.clear_all_reduce_callback()
    assert not solo.all_reduce_callback_armed
    solo.clear_all_reduce_callback()                 # nothing armed: nothing happens


def test_scale_grad_applies_before_the_first_solver_operation(solo):
    net = Net("float", scope="solo_scale")
    solver = net.solver("Sgd", lr=1.0)
    net.feed(0)
    net.loss.forward()
    net.loss.backward(communicator_callbacks=solo.all_reduce_callback(
        [v.grad for v in net.params.values()], 1024, scale_grad=0.25))
    grads = {k: v.g.copy() for k, v in net.params.items()}
    before = {k: v.d.copy() for k, v in net.params.items()}
    solver.update()                                  # SGD, lr 1: w -= 0.25 * g
    solo.clear_all_reduce_callback()
    for k, v in net.params.items():
        np.testing.assert_allclose(v.d, before[k] - 0.25 * grads[k], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kwargs, exc, facts", [
    (dict(data=[1.0], pack_size=8), TypeError, ("data[0]", "nnabla.NdArray", "float")),
    (dict(pack_size=0), ValueError, ("pack_size", ">= 1", "0")),
    (dict(pack_size=8, division="yes"), TypeError, ("division", "True", "False", "'yes'", "str")),
    (dict(pack_size=8, group="node"), ValueError, ("group", "'world'", "'node'")),
    (dict(pack_size=8, scale_grad=float("inf")), ValueError, ("scale_grad", "finite", "inf")),
    (dict(pack_size=8, keep_dtype=1), TypeError, ("keep_dtype", "True", "False", "1", "int")),
])
def test_arguments_are_checked_before_anything_is_armed(solo, kwargs, exc, facts):
    kwargs.setdefault("data", [nn.NdArray((3,))])
    with raises_naming(exc, *facts):
        solo.all_reduce_callback(**kwargs)
    assert not solo.all_reduce_callback_armed
    with raises_naming(ValueError, "packing_size", ">= 1", "0"):
        solo.get_all_reduce_callback(packing_size=0)


def test_the_updater_keyword_needs_a_communicator_that_can_honour_it():
    net = Net("float", scope="solo_keyword")
    with raises_naming(ValueError, "backward_pack_size=1024", "communicator", "comm=..."):
        DynamicLossScalingUpdater(net.solver(), net.loss,
                                  reduction=GradientReduction(backward_pack_size=1024))

    class ListComm:                      # a communicator of one's own, in Python
        rank, size = 0, 1

        def all_reduce(self, data, division=False, inplace=True):
            pass

    with raises_naming(ValueError, "backward_pack_size=1024", "nnabla's communicator",
                       "MPICommunicator", "ListComm"):
        FixedLossScalingUpdater(net.solver(), net.loss, comm=ListComm(),
                                reduction=GradientReduction(backward_pack_size=1024))
    with raises_naming(ValueError, "GradientReduction.backward_pack_size", ">= 1", "0"):
        DynamicLossScalingUpdater(net.solver(), net.loss,
                                  reduction=GradientReduction(backward_pack_size=0))


def test_a_reduction_that_fails_in_the_solver_hook_ends_the_job_before_the_update(tmp_path):
    proc = run_mpi(2, "reduce_callback_fails.py", tmp_path)
    assert proc.returncode != 0
    assert "failed inside nnabla's solver hook" in proc.stderr
    assert "ValueError" in proc.stderr            # the reduction's own error, in the log
    assert not list(tmp_path.glob("updated*"))


def test_the_armed_communicator_is_refused_before_a_batch_is_fed(solo):
    net = Net("float", scope="solo_armed")
    updater = DynamicLossScalingUpdater(net.solver(), net.loss, net.feeder, comm=solo)
    solo.all_reduce_callback([v.grad for v in net.params.values()], 1024)
    with raises_naming(RuntimeError, "comm", "all_reduce_callback()",
                       "a second time", "comm.clear_all_reduce_callback()"):
        updater.update()
    assert net.calls == 0 and updater.steps == 0
    solo.clear_all_reduce_callback()
    assert updater.update().updated and net.calls == 1


def test_parameters_read_by_several_functions_are_found():
    x = nn.Variable((2, 3))
    with nn.parameter_scope("tied"):
        h = PF.affine(x, 3, name="shared")
        y = PF.affine(h, 3, name="shared")          # the same W and b again
        loss = F.mean(PF.affine(y, 1, name="head"))
        params = nn.get_parameters()
    assert graph.shared_parameters(loss, params) == ["shared/affine/W", "shared/affine/b"]
    net = Net("float", scope="untied")
    assert graph.shared_parameters(net.loss, net.params) == []

"""diagnose() on real float16 graphs: where do inf/NaN first appear, and why."""
import math
import pickle

import numpy as np
import pytest

import nnabla as nn
import nnabla.functions as F
import nnabla.initializer as I
import nnabla.parametric_functions as PF
from nnabla.ext_utils import get_extension_context

from nnabla_mpt.diagnosis.diagnosis import LossScaleCollapseError, OverflowReport, diagnose
from support import assert_names, raises_naming

HALF = get_extension_context("cpu", type_config="half")
PARAMS = ["fc1/affine/W", "fc1/affine/b", "fc2/affine/W", "fc2/affine/b"]


def _affine(h, n, name, seed):
    with nn.parameter_scope(name):
        return PF.affine(h, n, w_init=I.NormalInitializer(0.5, rng=np.random.RandomState(seed)))


def masked_log_likelihood(batch=4, features=5, classes=3):
    """p = sigmoid(logits) * mask; loss = -mean(log p). A zero in the mask feeds Log a 0."""
    x, mask = nn.Variable((batch, features)), nn.Variable((batch, classes))
    x.name, mask.name = "x", "mask"
    with nn.context_scope(HALF):
        h = F.relu(_affine(x, 8, "fc1", 1))
        p = F.sigmoid(_affine(h, classes, "fc2", 2)) * mask
        loss = -F.mean(F.log(p))
    x.d = np.random.RandomState(0).randn(batch, features)
    mask.d = np.ones((batch, classes))
    return loss, x, mask


def regression(loss_reduction=F.mean):
    """A healthy two-layer regression net in float16."""
    x, t = nn.Variable((4, 5)), nn.Variable((4, 1))
    x.name = "x"
    with nn.context_scope(HALF):
        y = _affine(F.relu(_affine(x, 8, "fc1", 1)), 1, "fc2", 2)
        loss = loss_reduction(F.squared_error(y, t))
    rng = np.random.RandomState(0)
    x.d, t.d = rng.randn(4, 5), rng.randn(4, 1)
    return loss, x, t


def flat(obj):
    """The text with line wrapping undone."""
    return " ".join(str(obj).split())


def grads_all_zero():
    return all(not np.any(v.g) for v in nn.get_parameters().values())


# -- forward: the model itself produces inf ------------------------------------------------

def test_log_of_zero_is_a_model_problem_in_forward():
    loss, x, mask = masked_log_likelihood()
    m = np.ones(mask.shape)
    m[1, 2] = 0.0
    mask.d = m
    report = diagnose(loss, 2.0 ** 15)

    assert isinstance(report, OverflowReport)
    assert (report.kind, report.phase, report.function) == ("model", "forward", "Log")
    assert report.found and not report.scale_helps
    # position in the forward order: Affine, ReLU, Affine, Sigmoid, Mul2, Log, Mean, MulScalar
    assert report.index == report.forward_index == 5
    assert report.num_functions == 8
    assert report.path == ("Affine#0[fc1/affine] -> ReLU#1 -> Affine#2[fc2/affine] -> "
                           "Sigmoid#3 -> Mul2#4 -> Log#5")
    assert report.scope == "fc2/affine" and report.scope_is_upstream
    assert report.input_names == ["Mul2#4"]
    assert report.input_shapes == [(4, 3)] and report.output_shapes == [(4, 3)]
    assert report.output_dtypes == ["float16"]
    assert report.input_nonfinite == [0]
    assert report.input_min_abs == [0.0]
    assert 0.0 < report.input_max_abs[0] <= 1.0
    assert report.nonfinite_params == PARAMS
    assert report.loss_value == math.inf and not report.loss_finite

    assert_names(flat(report), "Loss-scale diagnosis", "model (forward)", "Log (#5)",
                 "fc2/affine", "inf/NaN from finite inputs", "Sigmoid#3 -> Mul2#4 -> Log#5",
                 "min |x| 0", "lowering the loss scale will not fix this",
                 "F.log(F.maximum_scalar(x, eps))", "not an overflow",
                 "fc1/affine/W, fc1/affine/b, fc2/affine/W, fc2/affine/b")


def test_the_fix_leaves_only_a_masked_overflow_that_never_reaches_a_parameter():
    x, mask = nn.Variable((4, 5)), nn.Variable((4, 3))
    with nn.context_scope(HALF):
        h = F.relu(_affine(x, 8, "fc1", 1))
        p = F.sigmoid(_affine(h, 3, "fc2", 2)) * mask
        loss = -F.mean(F.log(F.maximum_scalar(p, 1e-4)))
    x.d = np.random.RandomState(0).randn(4, 5)
    m = np.ones((4, 3))
    m[1, 2] = 0.0
    mask.d = m
    # d log(u)/du = 1/u = 1e4 at the clamp: at a large scale the gradient of Log overflows,
    # but MaximumScalar passes no gradient below eps, so no parameter sees the inf.
    report = diagnose(loss, 2.0 ** 10)
    assert (report.kind, report.phase, report.function) == ("overflow", "backward", "Log")
    assert report.loss_finite
    assert report.nonfinite_params == []
    assert report.input_min_abs[0] == pytest.approx(1e-4, rel=1e-3)
    assert report.harmless
    assert_names(flat(report), "harmless for training", "masked", "nothing needs fixing")
    # At the suggested scale even the masked gradient stays finite.
    assert diagnose(loss, report.max_safe_scale).kind == "not_reproduced"


@pytest.mark.parametrize("scale", [1.0, 2.0 ** 24])
def test_a_forward_overflow_masked_by_where_still_poisons_the_backward(scale):
    # h * 1e5 overflows float16; Where picks h, so the loss is finite. But the backward of
    # MulScalar multiplies the zero gradient by 1e5 (inf in float16): 0 * inf = NaN. At
    # 2**24 the seed overflows first, yet at scale 1 the NaN remains: MulScalar is blamed.
    x, c = nn.Variable((4, 5)), nn.Variable((4, 3))
    with nn.context_scope(HALF):
        h = _affine(x, 3, "fc1", 1)
        loss = F.mean(F.where(c, h, F.mul_scalar(h, 1e5)))
    x.d = np.random.RandomState(0).randn(4, 5)
    c.d = np.ones((4, 3))
    report = diagnose(loss, scale)
    assert (report.kind, report.phase, report.function) == ("model", "forward", "MulScalar")
    assert report.loss_finite and not report.harmless
    assert report.nonfinite_params == ["fc1/affine/W", "fc1/affine/b"]
    assert_names(flat(report), "MulScalar", "masked before the loss", "backward",
                 "NaN gradients (0 * inf)")


# -- backward: only the scaled gradients overflow ------------------------------------------

def test_scale_beyond_float16_overflows_in_backward_only():
    loss, x, t = regression()
    report = diagnose(loss, 2.0 ** 24)

    assert (report.kind, report.phase) == ("overflow", "backward")
    assert report.scale_helps and not report.harmless
    # the backward pass starts at the loss: Mean receives 2**24, which float16 cannot hold
    assert report.function == "Mean"
    assert report.index == 0 and report.forward_index == report.num_functions - 1 == 4
    assert report.output_grad_max_abs == [2.0 ** 24]
    assert report.input_grad_dtypes == ["float16"]
    assert report.finite_at_scale_one is True
    assert report.loss_finite
    assert report.nonfinite_params == PARAMS
    assert 0 < report.max_grad_at_scale_one < 65504
    assert report.max_safe_scale * report.max_grad_at_scale_one <= 65504
    assert_names(flat(report), "Loss-scale diagnosis", "overflow (backward)", "Mean (#4)",
                 "overflowed", "2**24 (16777216)", "2**24 (16777216)",
                 "larger than the largest float16 value", "65504", "a scaling problem",
                 "enable_overflow_check=False")


def test_overflow_below_the_float16_maximum_names_the_function_and_a_safe_scale():
    # A sum over the batch and large targets: at scale 2**15 the gradient of the squared
    # error (2 * (y - t) * scale) leaves the float16 range; at scale 1 everything is finite.
    loss, x, t = regression(loss_reduction=F.sum)
    t.d = np.full(t.shape, 30.0)
    report = diagnose(loss, 2.0 ** 15)

    assert (report.kind, report.phase, report.function) == ("overflow", "backward",
                                                            "SquaredError")
    assert report.forward_index == 3 and report.index == 1
    assert report.output_grad_max_abs == [2.0 ** 15]
    assert report.input_names == ["Affine#2", "input #0"]
    assert report.path == ("Affine#0[fc1/affine] -> ReLU#1 -> Affine#2[fc2/affine] -> "
                           "SquaredError#3")
    assert report.scope == "fc2/affine" and report.scope_is_upstream
    assert report.nonfinite_params == PARAMS
    assert report.max_safe_scale < 2.0 ** 15
    assert_names(flat(report), "SquaredError (#3)", "fc2/affine", "overflowed",
                 "in backward", f"a scale of at most {report.max_safe_scale:g}")
    # the suggested scale really is safe for this batch
    again = diagnose(loss, report.max_safe_scale)
    assert again.kind == "not_reproduced" and again.nonfinite_params == []


def test_an_infinite_derivative_is_a_model_problem_in_backward():
    # (q*q) ** 0.5 with q == 0 is finite (0) in forward, but its derivative 0.5 / sqrt(u)
    # is inf at u = 0, at any loss scale.
    x, mask = nn.Variable((4, 5)), nn.Variable((4, 3))
    with nn.context_scope(HALF):
        q = _affine(x, 3, "fc1", 1) * mask
        loss = F.mean(F.pow_scalar(q * q, 0.5))
    x.d = np.random.RandomState(0).randn(4, 5)
    m = np.ones((4, 3))
    m[0, 0] = 0.0
    mask.d = m
    report = diagnose(loss, 2.0 ** 8)
    assert (report.kind, report.phase, report.function) == ("model", "backward", "PowScalar")
    assert report.finite_at_scale_one is False
    assert report.loss_finite
    assert report.nonfinite_params == ["fc1/affine/W", "fc1/affine/b"]
    assert_names(flat(report), "PowScalar (#3)", "fc1/affine", "non-finite gradients",
                 "in backward", "even at scale 1", "F.pow_scalar(x + eps, p)")


# -- data: inf/NaN before any function -----------------------------------------------------

def test_nan_in_the_data_is_a_data_problem():
    loss, x, t = regression()
    bad = np.random.RandomState(1).randn(4, 5)
    bad[2, 3] = np.nan
    x.d = bad
    report = diagnose(loss, 1.0)

    assert (report.kind, report.phase) == ("data", "forward")
    assert report.bad_leaves == ["input 'x'"]
    assert report.function == "Affine" and report.index == 0
    assert report.input_names == ["input 'x'", "fc1/affine/W", "fc1/affine/b"]
    assert report.input_nonfinite == [1, 0, 0]
    assert report.input_dtypes[0] == "float64"
    # ReLU turns the NaN row into zeros, so the loss stays finite, but the weight gradient
    # x^T dy of the first layer multiplies the NaN in
    assert report.loss_finite
    assert report.nonfinite_params == ["fc1/affine/W"]
    assert_names(flat(report), "Loss-scale diagnosis", "data (forward)", "inputs",
                 "inf/NaN (input 'x')", "1 inf/NaN", "numpy.isfinite",
                 "no loss scale can fix them")


def test_a_corrupted_parameter_is_reported_as_data():
    loss, x, t = regression()
    params = nn.get_parameters()
    w = params["fc2/affine/W"].d.copy()
    w[0, 0] = np.inf
    params["fc2/affine/W"].d = w
    report = diagnose(loss, 4.0, params=params)
    assert report.kind == "data"
    assert report.bad_leaves == ["fc2/affine/W"]
    assert report.function == "Affine" and report.forward_index == 2
    assert_names(flat(report), "fc2/affine/W", "a parameter already holds inf/NaN",
                 "reload a good checkpoint")


# -- nothing to find -----------------------------------------------------------------------

def test_a_healthy_batch_is_not_reproduced_and_leaves_gradients_zero():
    loss, x, t = regression()
    params = nn.get_parameters()
    for v in params.values():
        v.g = 1.0  # the caller's stale (skipped) gradients
    report = diagnose(loss, 2.0 ** 10, params=params)

    assert report.kind == "not_reproduced" and not report.found
    assert report.phase is None and report.function is None
    assert report.nonfinite_params == []
    assert report.loss_finite and report.num_functions == 5
    assert grads_all_zero()
    assert_names(flat(report), "Loss-scale diagnosis", "not_reproduced",
                 "no function reproduced", "2**10 (1024)", "micro-batch", "accum_grad=1",
                 "diagnose()")


@pytest.mark.parametrize("forward_first", [False, True])
def test_diagnose_leaves_the_running_statistics_and_the_loss_bitwise(forward_first):
    # BatchNormalization in training mode moves its running mean and variance at every
    # forward pass; the replay's forward pass must not leave them moved, neither on fresh
    # parameters (float32 arrays) nor after a forward pass (float16 arrays now).
    rng = np.random.RandomState(0)
    x = nn.Variable.from_numpy_array(rng.randn(8, 3).astype(np.float32))
    with nn.context_scope(HALF):
        h = PF.batch_normalization(_affine(x, 4, "fc", 0), name="bn")
        loss = F.mean(F.log(F.relu(h)))          # -inf: a model problem in forward
    if forward_first:
        loss.forward()
    state = {k: v.data for k, v in nn.get_parameters(grad_only=False).items()
             if not v.need_grad}
    assert sorted(state) == ["bn/bn/mean", "bn/bn/var"]
    before = {k: (a.dtype, np.array(a.data, copy=True)) for k, a in state.items()}
    loss_before = np.array(loss.d, copy=True)
    report = diagnose(loss, 1024.0)
    assert (report.kind, report.function) == ("model", "Log")
    for name, (dtype, values) in before.items():
        assert state[name].dtype == dtype == (np.float16 if forward_first else np.float32)
        assert np.array(state[name].data).tobytes() == values.tobytes(), name
    assert np.array(loss.d).tobytes() == loss_before.tobytes()


def test_gradients_are_zero_after_a_diagnosis_that_found_nan():
    loss, x, mask = masked_log_likelihood()
    mask.d = np.zeros(mask.shape)
    assert diagnose(loss, 8.0).kind == "model"
    assert grads_all_zero()


# -- the error and the arguments -----------------------------------------------------------

def test_collapse_error_names_function_and_phase_and_keeps_the_report():
    loss, x, mask = masked_log_likelihood()
    mask.d = np.zeros(mask.shape)
    report = diagnose(loss, 1.0)
    err = LossScaleCollapseError(report, "8 consecutive overflowing steps")
    assert isinstance(err, FloatingPointError)
    assert err.report is report
    # the first line says what happened, where and in which pass; the report follows
    assert_names(str(err).splitlines()[0], "loss scale collapse",
                 "8 consecutive overflowing steps", "Log", "forward")
    assert str(report) in str(err)
    again = pickle.loads(pickle.dumps(err))
    assert again.report.function == "Log" and str(again) == str(err)


@pytest.mark.parametrize("kwargs, exc, facts", [
    (dict(loss=3.0, scale=1.0), TypeError, ("loss", "nnabla.Variable", "3.0", "float")),
    (dict(scale=0.0), ValueError, ("scale", "> 0", "0.0")),
    (dict(scale=float("inf")), ValueError, ("scale", "finite", "inf")),
    (dict(scale="8"), TypeError, ("scale", "real number", "'8'", "str")),
    (dict(scale=1.0, params=[1]), TypeError,
     ("params", "None", "mapping", "nnabla.Variable", "solver.get_parameters()", "list")),
    (dict(scale=1.0, chain_length=0), ValueError, ("chain_length", ">= 1", "0")),
])
def test_arguments_are_checked(kwargs, exc, facts):
    loss, x, t = regression()
    kwargs.setdefault("loss", loss)
    with raises_naming(exc, *facts):
        diagnose(**kwargs)

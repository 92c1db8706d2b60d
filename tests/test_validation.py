"""Every bad input raises TypeError/ValueError naming the argument and the value received."""
import ast
import logging
import pathlib

import numpy as np
import pytest

import nnabla as nn
import nnabla.solvers as S

import nnabla_mpt
from nnabla_mpt import (DynamicLossScale, DynamicLossScalingUpdater, FixedLossScale,
                        FixedLossScalingUpdater, GradientReduction, OverflowDetector,
                        OverflowHandling, PrecisionSchedule)
from support import Net

PACKAGE_DIR = pathlib.Path(nnabla_mpt.__file__).parent


@pytest.fixture
def net():
    return Net()


# (keyword arguments, exception, regex naming the argument and the value)
DYNAMIC_CASES = [
    (dict(scale=0), ValueError, r"^scale must be > 0, got 0$"),
    (dict(scale=-1.5), ValueError, r"^scale must be > 0, got -1\.5$"),
    (dict(scale=float("nan")), ValueError, r"^scale must be finite, got nan$"),
    (dict(scale=float("inf")), ValueError, r"^scale must be finite, got inf$"),
    (dict(scale=True), TypeError, r"^scale must be a real number, got True of type bool$"),
    (dict(scale="8"), ValueError, r"^scale must be a positive number or 'auto', got '8'$"),
    (dict(scale="fast"), ValueError, r"^scale must be a positive number or 'auto', got 'fast'$"),
    (dict(growth_mode="x"), ValueError,
     r"^growth_mode must be one of 'probe', 'measured', got 'x'$"),
    (dict(gradient_stats_every=0), ValueError, r"^gradient_stats_every must be >= 1, got 0$"),
    (dict(gradient_stats_every=-3), ValueError, r"^gradient_stats_every must be >= 1, got -3$"),
    (dict(gradient_stats_every=2.0), TypeError,
     r"^gradient_stats_every must be an integer, got 2\.0 of type float$"),
    (dict(scale=0.5), ValueError,
     r"^scale must lie in \[min_scale, max_scale\] = \[1, 1\.67772e\+07\], got scale=0\.5$"),
    (dict(scale=2 ** 25), ValueError, r"scale must lie in .*got scale=33554432$"),
    (dict(scaling_factor=1.0), ValueError, r"^scaling_factor must be > 1, got 1\.0$"),
    (dict(scaling_factor=0.5), ValueError, r"^scaling_factor must be > 1, got 0\.5$"),
    (dict(scaling_factor=False), TypeError, r"^scaling_factor must be a real number, got False"),
    (dict(N=0), ValueError, r"^N must be >= 1, got 0$"),
    (dict(N=-3), ValueError, r"^N must be >= 1, got -3$"),
    (dict(N=2.5), TypeError, r"^N must be an integer, got 2\.5 of type float$"),
    (dict(N=2000.0), TypeError, r"^N must be an integer, got 2000\.0 of type float$"),
    (dict(N=True), TypeError, r"^N must be an integer, got True of type bool$"),
    (dict(accum_grad=0), ValueError, r"^accum_grad must be >= 1, got 0$"),
    (dict(accum_grad=1.0), TypeError, r"^accum_grad must be an integer, got 1\.0 of type float$"),
    (dict(accum_grad="2"), TypeError, r"^accum_grad must be an integer, got '2' of type str$"),
    (dict(weight_decay=-1e-4), ValueError, r"^weight_decay must be >= 0, got -0\.0001$"),
    (dict(weight_decay=True), TypeError, r"^weight_decay must be a real number, got True"),
    (dict(clip_grad_norm=0), ValueError, r"^clip_grad_norm must be > 0, got 0$"),
    (dict(clip_grad_norm=-1.0), ValueError, r"^clip_grad_norm must be > 0, got -1\.0$"),
    (dict(clear_buffer="yes"), TypeError, r"^clear_buffer must be True or False, got 'yes'"),
    (dict(data_feeder=3), TypeError, r"^data_feeder must be callable or None, got 3$"),
    (dict(data_feeder="feed"), TypeError, r"^data_feeder must be callable or None, got 'feed'$"),
    (dict(grads=[np.zeros(2)]), TypeError,
     r"^grads must be None or a list of nnabla\.NdArray, got \[array\(\[0\., 0\.\]\)\]$"),
    (dict(grads="abc"), TypeError, r"^grads must be None or a list of nnabla\.NdArray, got 'abc'"),
    (dict(comm=object()), TypeError,
     r"^comm must be a communicator with all_reduce, size and rank \(missing 'all_reduce'\), "
     r"got object$"),
    (dict(policy={"min_scale": 4.0}), TypeError,
     r"^policy must be None or a nnabla_mpt\.DynamicLossScale, got \{'min_scale': 4\.0\} "
     r"of type dict$"),
    (dict(overflow="saturation"), TypeError,
     r"^overflow must be None or a nnabla_mpt\.OverflowHandling, got 'saturation' of type str$"),
    (dict(reduction=True), TypeError,
     r"^reduction must be None or a nnabla_mpt\.GradientReduction, got True of type bool$"),
    (dict(schedule="fast|step|0.9"), TypeError,
     r"^schedule must be None or a nnabla_mpt\.PrecisionSchedule, got 'fast\|step\|0\.9'"),
    (dict(scaling_factor=3.0, policy=DynamicLossScale()), TypeError,
     r"^got policy= and scaling_factor=: the policy holds them"),
    (dict(scale=16.0, N=10, policy=DynamicLossScale()), TypeError,
     r"^got policy= and scale=, N=: the policy holds them"),
    (dict(growth_mode="measured", policy=DynamicLossScale()), TypeError,
     r"^got policy= and growth_mode=: the policy holds them"),
]


# The keywords an earlier version took besides their objects are no parameters: Python's
# own TypeError names each one.
@pytest.mark.parametrize("cls", [DynamicLossScalingUpdater, FixedLossScalingUpdater])
@pytest.mark.parametrize("keyword, value", [
    ("min_scale", 2.0), ("max_scale", 2.0 ** 10), ("backoff_factor", 0.25), ("hysteresis", 2),
    ("overflow_mode", "saturation"), ("max_retries", 2), ("floor_policy", "warn"),
    ("diagnose_after", 2), ("average_ranks", True),
    ("all_reduce_callback", 1024), ("shared_grads", False), ("abort_on_exception", False),
    ("accelerate_train_mode", "fast|step|0.9"), ("total_steps", 10), ("final_loss", 0.1),
    ("high_precision_loss", None)])
def test_a_former_keyword_is_a_type_error(net, cls, keyword, value):
    with pytest.raises(TypeError, match=rf"^{cls.__name__}\.__init__\(\) got an unexpected "
                                        rf"keyword argument '{keyword}'$"):
        cls(net.solver("Sgd", lr=0.1), net.loss, **{keyword: value})


def test_a_policy_given_may_go_with_scale_auto_and_is_the_one_the_updater_runs(net):
    policy = DynamicLossScale(growth_interval=3, growth_mode="measured")
    updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.1), net.loss, scale="auto",
                                        policy=policy)
    assert updater.policy is policy
    assert (updater.N, updater.growth_mode) == (3, "measured")


@pytest.mark.parametrize("kwargs, exc, message", DYNAMIC_CASES,
                         ids=[next(iter(c[0])) + "=" + repr(next(iter(c[0].values())))[:20]
                              for c in DYNAMIC_CASES])
def test_dynamic_updater_arguments(net, kwargs, exc, message):
    with pytest.raises(exc, match=message):
        DynamicLossScalingUpdater(net.solver("Sgd", lr=0.1), net.loss, **kwargs)


def test_grads_of_variables_instead_of_ndarrays(net):
    params = list(net.params.values())
    with pytest.raises(TypeError, match=r"^grads must be None or a list of nnabla\.NdArray, "
                                        r"got \[<Variable"):
        DynamicLossScalingUpdater(net.solver(), net.loss, grads=params)
    # A correct list is accepted.
    DynamicLossScalingUpdater(net.solver(), net.loss, grads=[v.grad for v in params])


class _NoAllReduce:
    size, rank = 1, 0


def test_comm_without_all_reduce(net):
    with pytest.raises(TypeError, match=r"^comm must be a communicator .*missing "
                                        r"'all_reduce'\), got _NoAllReduce$"):
        DynamicLossScalingUpdater(net.solver(), net.loss, comm=_NoAllReduce())


FIXED_CASES = [
    (dict(scale=0.5), ValueError, r"^scale must be >= 1, got 0\.5$"),
    (dict(scale=0), ValueError, r"^scale must be >= 1, got 0$"),
    (dict(scale=-128), ValueError, r"^scale must be >= 1, got -128$"),
    (dict(scale=None), TypeError, r"^scale must be a real number, got None"),
    (dict(enable_overflow_check="no"), TypeError,
     r"^enable_overflow_check must be True or False, got 'no'"),
    (dict(overflow=OverflowHandling(max_retries=2), enable_overflow_check=False), ValueError,
     r"^max_retries=2 needs enable_overflow_check=True"),
    (dict(weight_decay=-1), ValueError, r"^weight_decay must be >= 0, got -1$"),
    (dict(accum_grad=0), ValueError, r"^accum_grad must be >= 1, got 0$"),
    (dict(clip_grad_norm=0.0), ValueError, r"^clip_grad_norm must be > 0, got 0\.0$"),
    (dict(data_feeder=[1]), TypeError, r"^data_feeder must be callable or None, got \[1\]$"),
]


@pytest.mark.parametrize("kwargs, exc, message", FIXED_CASES,
                         ids=[",".join(f"{k}={v!r}" for k, v in c[0].items())
                              for c in FIXED_CASES])
def test_fixed_updater_arguments(net, kwargs, exc, message):
    with pytest.raises(exc, match=message):
        FixedLossScalingUpdater(net.solver("Sgd", lr=0.1), net.loss, **kwargs)


def test_fixed_updater_without_check_updates_every_step_even_an_overflowing_one():
    # float16 linear net: batch 1 (x * 20) overflows the gradients at scale 2048. With the
    # check off (and max_retries=0, the only value allowed then) nothing is skipped: the
    # overflowing step is applied and its inf/NaN reach the parameters.
    net = Net("half")
    net.large = {1}
    u = FixedLossScalingUpdater(net.solver("Sgd", lr=0.01), net.loss, net.feeder,
                                scale=2048.0, enable_overflow_check=False,
                                overflow=OverflowHandling(max_retries=0))
    assert u.enable_overflow_check is False
    first = u.update()
    assert first.skipped is False and all(np.isfinite(v).all() for v in net.snapshot().values())
    second = u.update()
    assert second.skipped is False and second.scale == 2048.0
    assert not all(np.isfinite(v).all() for v in net.snapshot().values())
    assert (u.steps, u.updates, u.skipped_steps) == (2, 2, 0)


@pytest.mark.parametrize("cls", [DynamicLossScalingUpdater, FixedLossScalingUpdater])
def test_loss_must_be_a_scalar_variable(net, cls):
    with pytest.raises(TypeError, match=r"^loss must be an nnabla\.Variable, got float32$"):
        cls(net.solver(), np.float32(1.0))
    with pytest.raises(TypeError, match=r"^loss must be an nnabla\.Variable, got NdArray$"):
        cls(net.solver(), nn.NdArray((1,)))
    with pytest.raises(ValueError, match=r"^loss must be a scalar Variable \(one element\), "
                                         r"got shape \(4, 2\)$"):
        cls(net.solver(), net.y)


@pytest.mark.parametrize("cls", [DynamicLossScalingUpdater, FixedLossScalingUpdater])
def test_solver_must_be_a_solver_with_parameters(net, cls):
    with pytest.raises(TypeError, match=r"^solver must be an nnabla solver \(missing method "
                                        r"'zero_grad'\), got str$"):
        cls("sgd", net.loss)
    with pytest.raises(TypeError, match=r"^solver must be an nnabla solver .*got NoneType$"):
        cls(None, net.loss)
    with pytest.raises(ValueError, match=r"^solver has no parameters: call "
                                         r"solver\.set_parameters"):
        cls(S.Sgd(0.1), net.loss)


def _sink_of_loss_and_error(net):
    """What nnabla-examples' cifar10 trains on: ``F.sink(loss, error)``."""
    import nnabla.functions as F
    with nn.context_scope(net.ctx):
        error = F.mean(F.abs(net.y - net.t))
        return F.sink(net.loss, error)


@pytest.mark.parametrize("cls", [DynamicLossScalingUpdater, FixedLossScalingUpdater])
def test_a_loss_through_sink_is_refused(net, cls):
    # Sink's backward sets its inputs' gradients to 1 whatever the scale: the scale would
    # be dropped while the updater still divides by it.
    sink = _sink_of_loss_and_error(net)
    with pytest.raises(ValueError, match=r"^loss is the output of F\.sink \(2 inputs, made by "
                                         r"Mean, Mean\): .*gradients to 1 whatever the loss "
                                         r"scale.*pass the loss variable itself"
                                         r".*outputs=\[error\]"):
        cls(net.solver(), sink, net.feeder)


def test_a_high_precision_loss_through_sink_is_refused():
    half, full = Net("half"), Net("float")
    with pytest.raises(ValueError, match=r"^high_precision_loss is the output of F\.sink"):
        DynamicLossScalingUpdater(half.solver(), half.loss, schedule=PrecisionSchedule(
            "fast|step", total_steps=10, high_precision_loss=_sink_of_loss_and_error(full)))


@pytest.mark.parametrize("cls", [DynamicLossScalingUpdater, FixedLossScalingUpdater])
def test_a_leaf_loss_is_refused(net, cls):
    leaf = nn.Variable.from_numpy_array(np.float32(0.5))
    with pytest.raises(ValueError, match=r"^loss is a leaf Variable \(no function computes "
                                         r"it, shape \(\)\): .*pass the Variable the "
                                         r"network's loss function returns"):
        cls(net.solver(), leaf, net.feeder)


@pytest.mark.parametrize("cls", [DynamicLossScalingUpdater, FixedLossScalingUpdater])
def test_a_loss_without_any_of_the_solvers_parameters_is_refused(net, cls):
    other = Net(scope="other")
    with pytest.raises(ValueError, match=r"^loss does not depend on any of the solver's 2 "
                                         r"parameters \('out/affine/[Wb]', 'out/affine/[Wb]'\).*"
                                         r"build the loss from them.*same parameter scope"):
        cls(net.solver(), other.loss, other.feeder)
    # a loss that reads only some of them trains those: it is accepted
    import nnabla.functions as F
    with nn.context_scope(net.ctx):
        partial = F.mean(F.squared_error(F.affine(net.x, net.params["out/affine/W"]),
                                         net.t))
    cls(net.solver(), partial, net.feeder).update()


def test_dynamic_scale_setter_is_checked_and_keeps_the_old_value(net):
    u = DynamicLossScalingUpdater(net.solver(), net.loss,
                                  policy=DynamicLossScale(init_scale=8.0, max_scale=1024.0))
    with pytest.raises(ValueError, match=r"^scale must lie in \[min_scale, max_scale\] = "
                                         r"\[1, 1024\], got 1e\+30$"):
        u.scale = 1e30
    with pytest.raises(ValueError, match=r"^scale must lie in .*got 0\.5$"):
        u.scale = 0.5
    with pytest.raises(ValueError, match=r"^scale must be > 0, got 0$"):
        u.scale = 0
    with pytest.raises(TypeError, match=r"^scale must be a real number, got True"):
        u.scale = True
    with pytest.raises(ValueError, match=r"^scale must be finite, got nan$"):
        u.scale = float("nan")
    assert u.scale == 8.0
    u.scale = 1024
    assert u.scale == 1024.0


def test_fixed_scale_setter_is_checked(net):
    u = FixedLossScalingUpdater(net.solver(), net.loss, scale=8.0)
    with pytest.raises(ValueError, match=r"^scale must be >= 1, got 0\.5$"):
        u.scale = 0.5
    with pytest.raises(TypeError, match=r"^scale must be a real number, got '2'"):
        u.scale = "2"
    assert u.scale == 8.0


@pytest.mark.parametrize("kwargs, exc, message", [
    (dict(init_scale=0.5), ValueError, r"^init_scale must lie in .*got 0\.5$"),
    (dict(init_scale=-1), ValueError, r"^init_scale must be > 0, got -1$"),
    (dict(backoff_factor=0), ValueError, r"^backoff_factor must be > 0 and < 1, got 0$"),
    (dict(backoff_factor=-0.5), ValueError, r"^backoff_factor must be > 0 and < 1, got -0\.5$"),
    (dict(hysteresis=1.5), TypeError, r"^hysteresis must be an integer, got 1\.5"),
    (dict(max_scale=-1), ValueError, r"^max_scale must be > 0, got -1$"),
    (dict(growth_factor=1), ValueError, r"^growth_factor must be > 1, got 1$"),
    (dict(backoff_factor=1), ValueError, r"^backoff_factor must be > 0 and < 1, got 1$"),
    (dict(growth_interval=0), ValueError, r"^growth_interval must be >= 1, got 0$"),
    (dict(growth_interval=10.0), TypeError, r"^growth_interval must be an integer, got 10\.0"),
    (dict(hysteresis=0), ValueError, r"^hysteresis must be >= 1, got 0$"),
    (dict(min_scale=8, max_scale=4, init_scale=4), ValueError,
     r"^min_scale must be <= max_scale, got min_scale=8 and max_scale=4$"),
    (dict(min_scale=-1), ValueError, r"^min_scale must be > 0, got -1$"),
])
def test_dynamic_policy_arguments(kwargs, exc, message):
    with pytest.raises(exc, match=message):
        DynamicLossScale(**kwargs)


@pytest.mark.parametrize("make, exc, message", [
    (lambda: OverflowHandling(mode="saturate"), ValueError,
     r"^OverflowHandling\.mode must be one of 'inf_nan', 'saturation', got 'saturate'$"),
    (lambda: OverflowHandling(mode=None), ValueError,
     r"^OverflowHandling\.mode must be one of .*got None$"),
    (lambda: OverflowHandling(max_retries=-1), ValueError,
     r"^OverflowHandling\.max_retries must be >= 0, got -1$"),
    (lambda: OverflowHandling(max_retries=1.5), TypeError,
     r"^OverflowHandling\.max_retries must be an integer, got 1\.5"),
    (lambda: GradientReduction(average_ranks=None), TypeError,
     r"^GradientReduction\.average_ranks must be True or False, got None"),
])
def test_option_objects_check_their_fields_where_they_are_made(make, exc, message):
    with pytest.raises(exc, match=message):
        make()


def test_fixed_policy_and_detector_arguments():
    with pytest.raises(ValueError, match=r"^scale must be >= 1, got 0\.25$"):
        FixedLossScale(0.25)
    with pytest.raises(ValueError, match=r"^overflow_mode must be one of 'inf_nan', "
                                         r"'saturation', got 'nan'$"):
        OverflowDetector("nan")
    with pytest.raises(ValueError, match=r"^threshold must be > 0, got 0$"):
        OverflowDetector("saturation", threshold=0)
    with pytest.raises(TypeError, match=r"^threshold must be a real number, got '1'"):
        OverflowDetector("saturation", threshold="1")


# -- the package source ---------------------------------------------------------------------

def _package_trees():
    files = sorted(PACKAGE_DIR.rglob("*.py"))
    assert files, PACKAGE_DIR
    return [(path, ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
            for path in files]


def test_package_has_no_assert_statements():
    found = [f"{path.name}:{node.lineno}" for path, tree in _package_trees()
             for node in ast.walk(tree) if isinstance(node, ast.Assert)]
    assert found == []


def test_package_has_no_print_calls():
    found = [f"{path.name}:{node.lineno}" for path, tree in _package_trees()
             for node in ast.walk(tree)
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
             and node.func.id == "print"]
    assert found == []
    # And no print( hidden from the parser (e.g. built with exec or eval).
    for path in PACKAGE_DIR.rglob("*.py"):
        source = path.read_text(encoding="utf-8")
        code_lines = [line for line in source.splitlines()
                      if "print(" in line and not line.strip().startswith((">>>", "..."))]
        assert code_lines == [], path.name


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records
            if r.name == "nnabla" and r.levelno == logging.WARNING]


@pytest.mark.parametrize("cls", [DynamicLossScalingUpdater, FixedLossScalingUpdater])
def test_grads_without_comm_is_accepted_with_a_warning_naming_it(net, cls, caplog):
    caplog.set_level(logging.INFO, logger="nnabla")
    grads = [v.grad for v in net.params.values()]
    positional = {DynamicLossScalingUpdater: (net.feeder, 8.0, 2.0, 2000, True, 1, None),
                  FixedLossScalingUpdater: (net.feeder, 8.0, True, True, 1, None)}[cls]
    updater = cls(net.solver(), net.loss, *positional, None, grads)   # nnabla's order
    assert _warnings(caplog) == [
        f"nnabla_mpt: grads (a list of {len(grads)} arrays) is ignored without a "
        f"communicator: grads names the gradients to all-reduce over the ranks, and there are "
        f"none; every gradient of the solver is used as it is. Pass comm=... to exchange "
        f"them, or leave grads out"]
    assert updater.update().updated
    caplog.clear()
    cls(net.solver(), net.loss, *positional, None, [])      # nnabla's default: silent
    cls(net.solver(), net.loss, grads=None)
    assert _warnings(caplog) == []

"""The step loop's hot path: the summed inf/NaN check on float32 CPU graphs, StepResult."""
import numpy as np
import pytest

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla.solvers as S
from nnabla.ext_utils import get_extension_context

from nnabla_mpt import (DynamicLossScale, DynamicLossScalingUpdater, FixedLossScalingUpdater,
                        OverflowHandling)
from nnabla_mpt.step.detector import (SUM_CHECK_MIN_SIZE, OverflowDetector, SummedInfNanCheck,
                                 overflow_check)


def net(width=128, batch=4):
    """Two layers: W of 128x128 = 16384 elements (summed), 128x10 and biases (element-wise)."""
    x = nn.Variable.from_numpy_array(
        np.random.RandomState(0).randn(batch, width).astype(np.float32))
    h = F.relu(PF.affine(x, width, name="fc1", rng=np.random.RandomState(1)))
    loss = F.mean(PF.affine(h, 10, name="fc2", rng=np.random.RandomState(2)) ** 2)
    solver = S.Sgd(0.01)
    solver.set_parameters(nn.get_parameters())
    return solver, loss, x


def test_parameter_sizes_cover_both_paths():
    solver, _, _ = net()
    sizes = {k: v.size for k, v in solver.get_parameters().items()}
    assert sizes["fc1/affine/W"] >= SUM_CHECK_MIN_SIZE
    assert all(s < SUM_CHECK_MIN_SIZE for k, s in sizes.items() if k != "fc1/affine/W")


CASES = {
    "clean": [],
    "inf in large": [("fc1/affine/W", (3, 7), np.inf)],
    "-inf in large": [("fc1/affine/W", (127, 127), -np.inf)],
    "nan in large": [("fc1/affine/W", (0, 0), np.nan)],
    "inf and -inf in large": [("fc1/affine/W", (1, 1), np.inf),
                              ("fc1/affine/W", (2, 2), -np.inf)],
    "inf in small": [("fc2/affine/W", (5, 3), np.inf)],
    "nan in small bias": [("fc1/affine/b", (9,), np.nan)],
}


@pytest.mark.parametrize("case", list(CASES))
def test_summed_check_agrees_with_the_solver(case):
    solver, loss, _ = net()
    params = solver.get_parameters()
    check = SummedInfNanCheck(params, get_extension_context("cpu", type_config="float"))
    for step in range(3):            # the same graph, re-run over fresh gradients
        solver.zero_grad()
        loss.forward()
        loss.backward(8.0)
        for name, index, value in CASES[case]:
            g = params[name].g
            g[index] = value
            params[name].g = g
        expected = bool(CASES[case])
        assert bool(solver.check_inf_or_nan_grad()) is expected
        assert check() is expected


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("case", list(CASES))
def test_summing_every_array_agrees_with_the_solver(case, dtype):
    """Off the CPU every array is summed (``min_size=0``: one host read for all, where
    nnabla-ext-cuda's solver test reads one per parameter); float16 gradients are read as
    float32 by the sum."""
    solver, _, _ = net()
    params = solver.get_parameters()
    check = SummedInfNanCheck(params, get_extension_context("cpu", type_config="float"),
                              min_size=0)
    rng = np.random.RandomState(3)
    for step in range(2):
        for v in params.values():
            v.grad.cast(dtype)[...] = rng.randn(*v.shape)
        for name, index, value in CASES[case]:
            params[name].grad.cast(dtype)[index] = value
        expected = bool(CASES[case])
        assert bool(solver.check_inf_or_nan_grad()) is expected
        assert check() is expected


def test_finite_gradients_whose_float32_sum_overflows_are_no_overflow():
    # Their sum is inf; the element-wise check, run on that path only, finds them finite.
    solver, _, _ = net()
    params = solver.get_parameters()
    check = SummedInfNanCheck(params, get_extension_context("cpu", type_config="float"))
    for v in params.values():
        v.g = np.zeros(v.shape, dtype=np.float32)
    params["fc1/affine/W"].g = np.full((128, 128), 3e38, dtype=np.float32)
    assert not solver.check_inf_or_nan_grad()
    assert check() is False
    # a real inf among them is still found
    g = params["fc1/affine/W"].g
    g[17, 4] = np.inf
    params["fc1/affine/W"].g = g
    assert solver.check_inf_or_nan_grad()
    assert check() is True


def test_an_updater_steps_on_finite_gradients_whose_sum_overflows():
    # sum(x W) with x = 1: every element of W's gradient is 4 * scale, about 5e36 at
    # 2**120, finite; their float32 sum (16384 of them) is not.
    x = nn.Variable.from_numpy_array(np.ones((4, 128), dtype=np.float32))
    loss = F.sum(PF.affine(x, 128, name="fc", rng=np.random.RandomState(1)))
    solver = S.Sgd(1e-3)
    solver.set_parameters(nn.get_parameters())
    updater = FixedLossScalingUpdater(solver, loss, scale=2.0 ** 120)
    assert isinstance(updater._decider.check, SummedInfNanCheck)
    W = solver.get_parameters()["fc/affine/W"]
    before = W.d.copy()
    r = updater.update()
    assert r.updated and updater.skipped_steps == 0
    np.testing.assert_allclose(W.d, before - 1e-3 * 4.0, rtol=1e-6)


def test_replaced_gradient_array_is_followed():
    solver, _, _ = net()
    params = solver.get_parameters()
    check = SummedInfNanCheck(params, get_extension_context("cpu", type_config="float"))
    for v in params.values():
        v.g = np.zeros(v.shape, dtype=np.float32)
    assert check() is False
    bad = np.zeros((128, 128), dtype=np.float32)
    bad[4, 4] = np.nan
    params["fc1/affine/W"].grad = nn.NdArray.from_numpy_array(bad)
    assert check() is True


def test_float_updater_uses_it_and_skips_the_bad_step():
    # A float32 overflow with a finite loss: scale 2**100, and at step 5 a batch 1e9 times
    # larger, whose gradients (about 1e47 before unscaling) overflow to inf.
    solver, loss, x = net()
    batches = np.random.RandomState(3).randn(8, 4, 128).astype(np.float32)
    batches[5] *= 1e9
    fed = iter(batches)

    def feed():
        x.d = next(fed)

    updater = DynamicLossScalingUpdater(solver, loss, feed,
                                        policy=DynamicLossScale(
                                            init_scale=2.0 ** 100, growth_interval=100,
                                            max_scale=2.0 ** 110))
    params = solver.get_parameters()
    before = None
    skipped = []
    for step in range(8):
        if step == 5:
            before = {k: v.d.copy() for k, v in params.items()}
        skipped.append(updater.update().skipped)
        if step == 5:
            for k, v in params.items():
                np.testing.assert_array_equal(v.d, before[k])
    assert skipped == [False] * 5 + [True] + [False] * 2
    assert updater.scale == 2.0 ** 99


def test_the_summed_check_is_chosen_for_large_float32_cpu_gradients_in_inf_nan_mode():
    from nnabla_mpt.core._gradsum import SaturationCheck

    solver, _, _ = net()
    params = solver.get_parameters()
    ctx = get_extension_context("cpu", type_config="float")
    assert isinstance(overflow_check(OverflowDetector(), solver, params, True, ctx),
                      SummedInfNanCheck)
    # not float32 on the CPU, or saturation mode (a graph in the loss's float32 context),
    # or only small arrays: another check
    assert overflow_check(OverflowDetector(), solver, params, False, ctx) \
        == solver.check_inf_or_nan_grad
    assert isinstance(overflow_check(OverflowDetector("saturation"), solver, params, True,
                                     ctx), SaturationCheck)
    nn.clear_parameters()
    small_solver, _, _ = net(width=16)
    assert overflow_check(OverflowDetector(), small_solver, small_solver.get_parameters(),
                          True, ctx) == small_solver.check_inf_or_nan_grad


@pytest.mark.parametrize("kind", ["half", "saturation", "small"])
def test_other_graphs_skip_with_the_detector_check(kind):
    # half: float16 gradients overflow to inf; saturation: float32 gradients beyond 65504
    # stay finite (the summed check would let them through); small: an inf in a small
    # array. Each updater skips exactly the bad step and leaves the parameters untouched.
    if kind == "half":
        nn.set_default_context(get_extension_context("cpu", type_config="half"))
    solver, loss, x = net(width=16 if kind == "small" else 128)
    batches = np.random.RandomState(3).randn(4, *x.shape).astype(np.float32)
    batches[2] *= {"half": 1e4, "saturation": 1e6, "small": 1.0}[kind]
    if kind == "small":
        batches[2, 0, 0] = np.inf
    fed = iter(batches)

    def feed():
        x.d = next(fed)

    mode = "saturation" if kind == "saturation" else "inf_nan"
    updater = FixedLossScalingUpdater(solver, loss, feed, scale=8.0,
                                      overflow=OverflowHandling(mode=mode))
    params = solver.get_parameters()
    skipped = []
    for step in range(4):
        before = {k: v.d.copy() for k, v in params.items()}
        skipped.append(updater.update().skipped)
        changed = [not np.array_equal(v.d, before[k]) for k, v in params.items()]
        assert any(changed) != skipped[-1], (step, skipped)
    assert skipped == [False, False, True, False]


def test_step_result_is_frozen_and_says_whether_it_updated():
    import dataclasses

    from nnabla_mpt import StepResult

    result = StepResult(step=3, skipped=True, scale=1024.0, next_scale=512.0, attempts=2,
                        precision="half")
    assert result.updated is False
    assert StepResult(step=0, skipped=False, scale=1.0, next_scale=1.0).updated is True
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.skipped = False
    # a dataclass still: its constructor's defaults, replace, asdict, equality
    assert (result.gradient_stats, result.bad_batch) == (None, False)
    replaced = dataclasses.replace(result, skipped=False)
    assert replaced.updated and replaced.attempts == 2 and replaced != result
    assert dataclasses.replace(replaced, skipped=True) == result
    assert dataclasses.asdict(result)["precision"] == "half"


@pytest.mark.parametrize("numpy_min_size", [1, 1 << 10, None])
def test_squared_norm_matches_numpy_over_steps(numpy_min_size):
    # Graph path (small arrays), NumPy path (large ones) or a mix, over steps whose
    # gradients are zeroed lazily and rewritten by backward.
    from nnabla_mpt.core._gradsum import SquaredNorm

    solver, loss, x = net()
    params = solver.get_parameters()
    norm = SquaredNorm(list(params.values()), get_extension_context("cpu", type_config="float"),
                       numpy_min_size=numpy_min_size)
    rng = np.random.RandomState(5)
    for step in range(3):
        x.d = rng.randn(*x.shape)
        solver.zero_grad()
        loss.forward()
        loss.backward(2.0 ** step)
        expected = sum(float(np.sum(v.g.astype(np.float64) ** 2)) for v in params.values())
        assert norm.value() == pytest.approx(expected, rel=1e-5)
    replaced = np.full((128, 10), 2.0, dtype=np.float32)
    params["fc2/affine/W"].grad = nn.NdArray.from_numpy_array(replaced)
    expected = sum(float(np.sum(v.g.astype(np.float64) ** 2)) for v in params.values())
    assert norm.value() == pytest.approx(expected, rel=1e-5)


def test_squared_norm_reads_float16_gradients():
    from nnabla_mpt.core._gradsum import SquaredNorm

    nn.set_default_context(get_extension_context("cpu", type_config="half"))
    solver, loss, _ = net(width=32)
    params = solver.get_parameters()
    solver.zero_grad()
    loss.forward()
    loss.backward(64.0)
    expected = sum(float(np.sum(v.g.astype(np.float64) ** 2)) for v in params.values())
    assert expected > 0
    for numpy_min_size in (None, 1):      # the graph, NumPy
        norm = SquaredNorm(list(params.values()),
                           get_extension_context("cpu", type_config="float"), numpy_min_size)
        assert norm.value() == pytest.approx(expected, rel=1e-5)


SUMMED_CHECK_WORKER = r'''
import json
import sys
import numpy as np
import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla.solvers as S
from nnabla_mpt import (DynamicLossScale, DynamicLossScalingUpdater, GradientReduction,
                        MPICommunicator)
from nnabla_mpt.step.detector import SummedInfNanCheck

comm = MPICommunicator()
x = nn.Variable((4, 128))
h = F.relu(PF.affine(x, 128, name="fc1", rng=np.random.RandomState(1)))
loss = F.mean(PF.affine(h, 10, name="fc2", rng=np.random.RandomState(2)) ** 2)
solver = S.Sgd(0.01)
solver.set_parameters(nn.get_parameters())


def feed():
    data = np.random.RandomState(100 * comm.rank + updater.steps).randn(4, 128)
    # Rank 1's batch of step 3 overflows float32 in backward; its loss stays finite.
    x.d = data * (1e9 if (comm.rank == 1 and updater.steps == 3) else 1.0)


updater = DynamicLossScalingUpdater(
    solver, loss, feed, comm=comm, reduction=GradientReduction(average_ranks=True),
    policy=DynamicLossScale(init_scale=2.0 ** 100, growth_interval=100, max_scale=2.0 ** 110))
summed = isinstance(updater._decider.check, SummedInfNanCheck)
checks = []
check = updater._decider.check


def counted():
    checks.append(updater.steps)
    return check()


updater._decider.check = counted
skipped = [updater.update().skipped for _ in range(6)]
digest = float(sum(np.abs(v.d).sum() for v in nn.get_parameters().values()))
with open(f"{sys.argv[1]}/rank{comm.rank}.json", "w") as f:
    json.dump({"rank": comm.rank, "summed": summed, "skipped": skipped, "checks": checks,
               "scale": updater.scale, "digest": digest}, f)
'''


def test_summed_check_decides_alike_on_every_rank(tmp_path):
    import json

    from mpi_helpers import check_ok, run_mpi

    worker = tmp_path / "summed_check_worker.py"
    worker.write_text(SUMMED_CHECK_WORKER)
    check_ok(run_mpi(2, worker, tmp_path))
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        assert r["summed"] is True
        assert r["skipped"] == [False, False, False, True, False, False]
        # the gradients are checked once a step, after the all-reduce (inf/NaN survive the
        # sum), not also before it
        assert r["checks"] == [0, 1, 2, 3, 4, 5]
        assert r["scale"] == 2.0 ** 99
    assert ranks[0]["digest"] == ranks[1]["digest"]


def _with_an_empty_parameter():
    x = nn.Variable.from_numpy_array(np.random.RandomState(0).randn(4, 3).astype(np.float32))
    with nn.parameter_scope("net"):
        loss = F.mean(PF.affine(x, 2, rng=np.random.RandomState(1)))
        nn.parameter.get_parameter_or_create("empty", (0,), need_grad=True)
    solver = S.Sgd(0.1)
    solver.set_parameters(nn.get_parameters())
    return solver, loss


@pytest.mark.parametrize("options", [dict(clip_grad_norm=1e-3),
                                     dict(overflow=OverflowHandling(mode="saturation"))],
                         ids=["clip", "saturation"])
def test_an_empty_parameter_is_no_reduction(options):
    """nnabla's reductions cannot take an empty array (on the CPU the process dies of
    SIGFPE): the graphs of the norm and of the saturation check leave it out."""
    solver, loss = _with_an_empty_parameter()
    W = solver.get_parameters()["net/affine/W"]
    before = W.d.copy()
    updater = FixedLossScalingUpdater(solver, loss, scale=8.0, **options)
    assert all(updater.update().updated for _ in range(2))
    assert not np.array_equal(W.d, before)


def test_an_empty_parameter_is_left_out_of_the_sum_of_every_array():
    solver, loss = _with_an_empty_parameter()
    params = solver.get_parameters()
    check = SummedInfNanCheck(params, get_extension_context("cpu", type_config="float"),
                              min_size=0)
    loss.forward()
    solver.zero_grad()
    loss.backward(8.0)
    assert check() is False
    g = params["net/affine/W"].g
    g[0, 0] = np.inf
    params["net/affine/W"].g = g
    assert check() is True

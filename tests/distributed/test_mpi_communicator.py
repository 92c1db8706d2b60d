"""MPICommunicator under real ``mpiexec`` runs with 2 and 3 ranks.

Each MPI job runs a worker script from tests/mpi_workers/ that saves what every rank
saw; the tests here assert on those values.
"""
import subprocess
import sys

import numpy as np
import pytest

from mpi_helpers import RANKS, TIMEOUT, bits, ranks_fixture, run_mpi, run_ranks

collectives = ranks_fixture("collectives.py")


def _assert_same_bits_on_all_ranks(res, key):
    ref = res[0][0][key]
    for r, (npz, _) in enumerate(res[1:], start=1):
        assert npz[key].dtype == ref.dtype, (key, r)
        np.testing.assert_array_equal(bits(npz[key]), bits(ref),
                                      err_msg=f"{key}: rank {r} differs from rank 0")


def test_rank_size_local_rank(collectives):
    n, res = collectives
    assert sorted(meta["rank"] for _, meta in res) == list(range(n))
    for r, (_, meta) in enumerate(res):
        assert meta["size"] == n
        # all ranks of the test run on this one node
        assert meta["local_rank"] == r
        assert meta["local_size"] == n
        assert meta["name"] == "MPICommunicator"


@pytest.mark.parametrize("tag,division", [("sum32", False), ("avg32", True)])
def test_all_reduce_float32(collectives, tag, division):
    n, res = collectives
    for i in range(5):
        expected = sum(npz[f"{tag}_in{i}"].astype(np.float64) for npz, _ in res)
        if division:
            expected = expected / n
        for r, (npz, meta) in enumerate(res):
            got = npz[f"{tag}_out{i}"]
            assert got.dtype == np.float32
            assert got.shape == npz[f"{tag}_in{i}"].shape
            np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6,
                                       err_msg=f"{tag} array {i} on rank {r}")
        _assert_same_bits_on_all_ranks(res, f"{tag}_out{i}")
    for _, meta in res:
        assert meta[f"{tag}_dtypes"] == ["float32"] * 5


def test_all_reduce_float16_average_does_not_overflow(collectives):
    n, res = collectives
    ins = [npz["avg16_in"] for npz, _ in res]
    # the case is meaningful: summing in float16 itself overflows
    with np.errstate(over="ignore"):
        naive = ins[0].copy()
        for x in ins[1:]:
            naive = naive + x
    assert np.isinf(naive[0]) and np.isinf(naive[2])
    expected = (sum(x.astype(np.float32) for x in ins) / n).astype(np.float16)
    for r, (npz, meta) in enumerate(res):
        assert meta["avg16_dtype"] == "float16"
        got = npz["avg16_out"]
        assert got.dtype == np.float16
        assert np.all(np.isfinite(got)), f"rank {r}: {got}"
        np.testing.assert_array_equal(got, expected)
    _assert_same_bits_on_all_ranks(res, "avg16_out")


def test_all_reduce_float16_sum_beyond_range_is_inf(collectives):
    n, res = collectives
    expected = sum(npz["sum16_in"].astype(np.float32) for npz, _ in res)
    for npz, meta in res:
        got = npz["sum16_out"]
        assert meta["sum16_dtype"] == "float16"
        assert got[0] == np.inf and got[2] == -np.inf
        np.testing.assert_array_equal(got[3:], expected[3:].astype(np.float16))


def test_all_reduce_mixed_dtypes_with_flag(collectives):
    n, res = collectives
    for npz, meta in res:
        assert meta["mixed_dtypes"] == ["float16", "float32", "float16", "float32"]
    for i in range(4):
        ins = [npz[f"mixed_in{i}"] for npz, _ in res]
        expected = sum(x.astype(np.float32) for x in ins).astype(ins[0].dtype)
        for npz, _ in res:
            got = npz[f"mixed_out{i}"]
            assert got.dtype == ins[0].dtype
            np.testing.assert_allclose(got, expected, rtol=2e-3 if i in (0, 2) else 1e-6)
        _assert_same_bits_on_all_ranks(res, f"mixed_out{i}")
    # the flag raised by the last rank only reaches every rank
    for npz, _ in res:
        assert npz["mixed_out3"][0] == 1.0


@pytest.mark.parametrize("tag", ["inplace_true", "inplace_false"])
def test_all_reduce_result_lands_in_the_given_arrays(collectives, tag):
    n, res = collectives
    expected = np.full(4, n * (n + 1) / 2, np.float32)
    for npz, _ in res:
        np.testing.assert_array_equal(npz[f"{tag}_out"], expected)
        # a numpy view obtained before the call sees the result
        np.testing.assert_array_equal(npz[f"{tag}_view"], expected)


def test_fused_reduction_is_one_call_and_one_collective_sequence(collectives):
    n, res = collectives
    expected = np.full(sum(range(1, 51)), n * (n - 1) / 2, np.float32)
    for npz, meta in res:
        np.testing.assert_array_equal(npz["fused50_out"], expected)
        assert meta["fused50_calls"] == 1
        assert meta["fused50_collectives"] == 2  # reduce-scatter + allgather, for 50 arrays
        assert meta["sum32_calls"] == 1 and meta["sum32_collectives"] == 2
        # every all_reduce made by the worker is counted
        assert meta["n_all_reduce_calls"] == 9


@pytest.mark.parametrize("alg", ["reduce_scatter", "reduce_bcast"])
def test_all_reduce_is_bitwise_identical_on_all_ranks(collectives, alg):
    n, res = collectives
    key = f"bits_{alg}_out"
    expected = sum(npz[f"bits_{alg}_in"].astype(np.float64) for npz, _ in res)
    np.testing.assert_allclose(res[0][0][key], expected, rtol=1e-5, atol=1e-3)
    _assert_same_bits_on_all_ranks(res, key)


@pytest.mark.parametrize("alg", ["reduce_scatter", "reduce_bcast"])
def test_different_data_raises_the_same_error_on_every_rank(collectives, alg):
    n, res = collectives
    head, tail = "all_reduce: the ranks passed different data (", (
        "); every rank must pass arrays of the same sizes and dtypes in the same order")
    sizes = "; ".join(f"rank {r}: 1 array of {5 + r} elements in total, summed in float32"
                      for r in range(n))
    order = ("2 arrays of 6 elements in total on every rank, but the arrays' sizes differ "
             "in order on rank(s) " + ", ".join(str(r) for r in range(1, n)))
    for npz, meta in res:
        assert meta[f"mismatch_{alg}_sizes"] == head + sizes + tail
        assert meta[f"mismatch_{alg}_order"] == head + order + tail
        np.testing.assert_array_equal(npz[f"after_mismatch_{alg}"],
                                      np.full(3, n * (n + 1) / 2, np.float32))


@pytest.mark.parametrize("alg", ["reduce_scatter", "reduce_bcast"])
def test_the_ranks_compare_neither_dtypes_nor_arrays_of_equal_size(collectives, alg):
    # As docs/troubleshooting.rst says: a float16/float32 pair, or two arrays of equal
    # size swapped on some rank, pass and are summed as given.
    n, res = collectives
    for npz, _ in res:
        np.testing.assert_array_equal(npz[f"uncompared_{alg}_dtype"],
                                      np.full(4, n * (n + 1) / 2, np.float32))
        np.testing.assert_array_equal(npz[f"uncompared_{alg}_swap"],
                                      [1.0 + 10.0 * (n - 1)] * 3 + [10.0 + (n - 1)] * 3)


def test_bcast_copies_bits_and_dtype_from_src(collectives):
    n, res = collectives
    src = n - 1
    for i in range(3):
        sent = res[src][0][f"bcast_in{i}"]
        for r, (npz, meta) in enumerate(res):
            got = npz[f"bcast_out{i}"]
            assert got.dtype == sent.dtype, (i, r)
            np.testing.assert_array_equal(bits(got), bits(sent))
    for _, meta in res:
        assert meta["bcast_dtypes"] == ["float32", "float16", "float16"]
        assert meta["bcast_calls"] == 1


def test_bcast_shape_mismatch_raises_on_every_rank(collectives):
    n, res = collectives
    for _, meta in res:
        assert meta["bcast_mismatch_error"] == (
            "cannot broadcast from rank 0: rank 1 has shape (4,) for array 0, the sender (3,)")


def test_broadcast_parameters_from_rank0(collectives):
    n, res = collectives
    keys = [k[len("bp_before/"):] for k in res[0][0] if k.startswith("bp_before/")]
    assert len(keys) == 4
    for k in keys:
        # ranks really started from different values
        assert not np.array_equal(res[0][0][f"bp_before/{k}"], res[1][0][f"bp_before/{k}"])
        for npz, _ in res:
            np.testing.assert_array_equal(bits(npz[f"bp_after/{k}"]),
                                          bits(res[0][0][f"bp_before/{k}"]))


def test_half_precision_gradients_are_reduced_and_used_by_the_solver(collectives):
    n, res = collectives
    keys = [k[len("half_gin/"):] for k in res[0][0] if k.startswith("half_gin/")]
    assert sorted(keys) == ["half/fc/affine/W", "half/fc/affine/b"]
    for k in keys:
        gin = [npz[f"half_gin/{k}"] for npz, _ in res]
        assert gin[0].dtype == np.float16
        assert not np.array_equal(gin[0], gin[1])
        expected = (sum(g.astype(np.float32) for g in gin) / n).astype(np.float16)
        for npz, meta in res:
            assert meta["half_grad_dtypes"][k] == "float16"
            got = npz[f"half_gout/{k}"]
            assert got.dtype == np.float16
            np.testing.assert_array_equal(got, expected)
            # SGD (lr 0.5) read the reduced float16 gradient
            p0, p1 = npz[f"half_param0/{k}"], npz[f"half_param1/{k}"]
            np.testing.assert_allclose(p1, p0 - 0.5 * expected.astype(np.float32),
                                       rtol=1e-6, atol=1e-6)
        _assert_same_bits_on_all_ranks(res, f"half_param1/{k}")


@pytest.mark.parametrize("n", RANKS)
def test_rank_that_raises_aborts_the_job(tmp_path, n):
    from support import assert_names
    try:
        result = run_mpi(n, "fail_midway.py", tmp_path, "raise", timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"mpiexec -n {n} hung after a rank raised")
    assert result.returncode != 0
    assert f"RuntimeError: deliberate failure on rank {n - 1}" in result.stderr
    assert_names(result.stderr, f"rank {n - 1} of {n}", "raised RuntimeError",
                 "aborting the MPI job")
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"started{r}" for r in range(n)]


def test_abort_ends_every_rank_with_the_error_code(tmp_path):
    from support import assert_names
    try:
        result = run_mpi(3, "fail_midway.py", tmp_path, "abort", timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail("mpiexec -n 3 hung after comm.abort(3)")
    assert result.returncode == 3
    assert_names(result.stderr, "rank 0 of 3", "aborts the MPI job", "error code 3")
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"started{r}" for r in range(3)]


# ---------------------------------------------------------------- single process
# MPI initialises as a singleton (size 1) inside the test process for these checks.

def test_import_does_not_start_mpi():
    code = ("import sys, nnabla_mpt; from nnabla_mpt import MPICommunicator; "
            "import nnabla_mpt.distributed.communicator; "
            "sys.exit(1 if 'mpi4py.MPI' in sys.modules or 'mpi4py' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], timeout=TIMEOUT).returncode == 0


def test_single_process_reduce_and_bcast(solo):
    import nnabla as nn
    assert (solo.rank, solo.size, solo.local_rank) == (0, 1, 0)
    a = nn.NdArray((3,))
    a.cast(np.float16)[...] = [1, 2, 60000]
    solo.all_reduce(a, division=True)
    np.testing.assert_array_equal(a.get_data("r"), np.array([1, 2, 60000], np.float16))
    assert a.dtype == np.float16
    solo.bcast([a], src=0)
    solo.barrier()


@pytest.mark.parametrize("call,exc,facts", [
    (lambda c, a: c.all_reduce([a, 3]), TypeError, ("data[1]", "nnabla.NdArray", "int")),
    (lambda c, a: c.all_reduce("grads"), TypeError,
     ("data", "nnabla.NdArray", "list of them", "str", "'grads'")),
    (lambda c, a: c.all_reduce([]), ValueError,
     ("data", "at least one nnabla.NdArray", "empty list")),
    (lambda c, a: c.all_reduce(a, division=1), TypeError,
     ("division", "True", "False", "1", "int")),
    (lambda c, a: c.all_reduce(a, inplace="yes"), TypeError,
     ("inplace", "True", "False", "'yes'", "str")),
    (lambda c, a: c.all_reduce(a, group="node0"), ValueError, ("group", "'world'", "'node0'")),
    (lambda c, a: c.bcast([a], src=1), ValueError, ("src", "rank", "[0, 0]", "1")),
    (lambda c, a: c.bcast([a], src=-1), ValueError, ("src", "rank", "[0, 0]", "-1")),
    (lambda c, a: c.bcast([a], src=0.0), TypeError, ("src", "integer", "float", "0.0")),
    (lambda c, a: c.broadcast_parameters({"w": 1.0}), TypeError,
     ("params['w']", "nnabla.Variable", "nnabla.NdArray", "float")),
    (lambda c, a: c.broadcast_parameters({}), ValueError,
     ("params", "at least one parameter", "empty dict")),
    (lambda c, a: c.broadcast_parameters(a), TypeError,
     ("params", "dict", "nnabla.Variable", "NdArray", "<NdArray((2,))")),
    (lambda c, a: c.abort("1"), TypeError, ("errorcode", "integer", "str", "'1'")),
])
def test_validation_messages(solo, call, exc, facts):
    import nnabla as nn
    from support import raises_naming
    a = nn.NdArray.from_numpy_array(np.ones(2, np.float32))
    with raises_naming(exc, *facts):
        call(solo, a)


def test_variable_instead_of_ndarray_is_explained(solo):
    import nnabla as nn
    from support import raises_naming
    v = nn.Variable((2, 3))
    with raises_naming(TypeError, "data", "nnabla.NdArray", "nnabla.Variable", "(2, 3)",
                       ".grad", ".data"):
        solo.all_reduce(v)


def test_constructor_validation():
    from nnabla_mpt import MPICommunicator
    from support import raises_naming
    with raises_naming(ValueError, "algorithm", "'auto'", "'shared_memory'", "'reduce_scatter'",
                       "'reduce_bcast'", "'ring'"):
        MPICommunicator(algorithm="ring", abort_on_exception=False)
    with raises_naming(TypeError, "comm", "mpi4py.MPI.Comm", "None", "int", "7"):
        MPICommunicator(7, abort_on_exception=False)
    with raises_naming(TypeError, "abort_on_exception", "True", "False", "'no'", "str"):
        MPICommunicator(abort_on_exception="no")


def _small_training(type_config="float", seed=0):
    import nnabla as nn
    import nnabla.functions as F
    import nnabla.parametric_functions as PF
    import nnabla.solvers as S
    from nnabla.ext_utils import get_extension_context

    nn.clear_parameters()
    nn.set_default_context(get_extension_context("cpu", type_config=type_config))
    try:
        x, t = nn.Variable((4, 5)), nn.Variable((4, 2))
        loss = F.mean(F.squared_error(PF.affine(F.relu(PF.affine(x, 6, name="a")), 2,
                                                name="b"), t))
    finally:
        nn.set_default_context(get_extension_context("cpu"))
    rng = np.random.RandomState(seed)
    for v in nn.get_parameters().values():
        v.d = rng.randn(*v.shape)
    solver = S.Momentum(0.05)
    solver.set_parameters(nn.get_parameters())

    def feed():
        x.d, t.d = rng.randn(4, 5), rng.randn(4, 2)
    return solver, loss, feed


beyond_memory = ranks_fixture("beyond_memory.py")


def _check_refusals(n, res):
    """What ``mpi_workers/beyond_memory.py`` saw on each of its ``n`` ranks: every request
    that would not fit refused, naming both figures, and no window allocated."""
    from nnabla_mpt.distributed.memory_room import mib
    from nnabla_mpt.distributed.shared_arrays import padded
    from support import assert_names

    for r, (_, meta) in enumerate(res):
        per_rank = 4 * padded(meta["huge_size"])  # beyond the machine's memory and /dev/shm
        huge, errors = meta["huge_shortfall"], meta["errors"]
        size = (f"{mib(per_rank * n)} of shared memory for the gradients ({mib(per_rank)} a "
                f"rank) on the {n} rank(s) of this machine")
        for text in (huge, errors["share_grads"]):   # each read the figures of its moment
            assert_names(text, size, "/dev/shm has ", " free", "(MemAvailable)",
                         "do not share the gradients")
        assert meta["small_shortfall"] == ""
        assert_names(errors["share_grads"], "share_grads")
        # the updater's parameters are the huge one and a small one; the memory moves
        facts = (f"on the {n} rank(s) of this machine do not fit: /dev/shm has ",
                 "(MemAvailable)", "do not share the gradients")
        assert_names(errors["updater"], "shared_grads=True", "cannot be honoured", *facts)
        if n > 1:
            assert meta["auto_shared"] is False
            assert len(meta["auto_warnings"]) == 1
            warning = meta["auto_warnings"][0]
            assert_names(warning, "nnabla_mpt", "gradients are not shared", *facts)
        # supplied figures: fits /dev/shm (1 GiB), not half of the memory (64 MiB)
        for tag, source in (("memory", "MemAvailable"), ("cgroup", "the cgroup's memory limit")):
            assert_names(errors[tag], "48.0 MiB of shared memory for the gradients",
                         "/dev/shm has 1,024.0 MiB free", f"64.0 MiB more memory ({source})",
                         "at most half")
        assert meta["half_of_memory_shortfall"] == ""
        short = errors["rank0_short"]
        assert ("64.0 MiB more memory" in short) == (r == 0), (r, short)
        assert (r == 0) != (f"48.0 MiB of shared memory for the gradients "
                            f"({mib((48 << 20) // n)} a rank) do not fit on another rank"
                            in short), (r, short)
        window = errors["window"]
        if n == 1:
            assert window is None  # one rank: no all-reduce window
        else:
            assert_names(window, "algorithm='shared_memory'", "algorithm='auto'",
                         "of shared memory for the all-reduce's window", "4.0 MiB more memory",
                         "algorithm='reduce_scatter'")
        assert meta["windows_allocated"] == 0


def test_gradients_beyond_free_shared_memory_are_refused_before_allocating(tmp_path):
    """In one process (the updater's and share_grads' own check, MPI as a singleton), under
    an address-space limit in its own process, so that a defect fails the test instead of
    the machine."""
    _check_refusals(1, run_ranks(1, "beyond_memory.py", tmp_path))


def test_shared_memory_beyond_what_the_ranks_can_get_is_refused_by_every_rank(beyond_memory):
    _check_refusals(*beyond_memory)


def test_shared_grads_in_one_process_trains_like_no_communicator(solo):
    import nnabla as nn
    from nnabla_mpt import DynamicLossScalingUpdater, GradientReduction

    finals = {}
    for use in ("comm", "none"):
        solver, loss, feed = _small_training()
        kw = (dict(comm=solo, reduction=GradientReduction(shared_grads=True)) if use == "comm"
              else {})
        updater = DynamicLossScalingUpdater(solver, loss, feed, scale=4.0, N=3, **kw)
        for _ in range(5):
            updater.update()
        if use == "comm":
            shared = updater.shared_gradients
            assert shared is not None and shared.n_replaced == 0
            assert all(v.grad == a for v, a in zip(solver.get_parameters().values(),
                                                   shared.arrays))
        finals[use] = {k: v.d.copy() for k, v in nn.get_parameters().items()}
    for k in finals["none"]:
        np.testing.assert_array_equal(finals["comm"][k], finals["none"][k], err_msg=k)
    # one rank: the automatic choice does not place the gradients (nothing to exchange)
    solver, loss, feed = _small_training()
    assert DynamicLossScalingUpdater(solver, loss, feed, comm=solo).shared_gradients is None


def test_shared_grads_true_names_what_prevents_it(solo):
    import nnabla as nn
    from nnabla_mpt import (DynamicLossScalingUpdater, FixedLossScalingUpdater,
                            GradientReduction, MPICommunicator)
    from support import raises_naming

    solver, loss, feed = _small_training()
    rs = MPICommunicator(algorithm="reduce_scatter", abort_on_exception=False)
    with raises_naming(ValueError, "shared_grads=True", "cannot be honoured",
                       "algorithm='reduce_scatter'", "'shared_memory'"):
        DynamicLossScalingUpdater(solver, loss, feed, comm=rs,
                                  reduction=GradientReduction(shared_grads=True))
    grads = [v.grad for v in solver.get_parameters().values()]
    with raises_naming(ValueError, "shared_grads=True", "cannot be honoured", "grads",
                       "the solver's parameters"):
        FixedLossScalingUpdater(solver, loss, feed, comm=solo, grads=grads,
                                reduction=GradientReduction(shared_grads=True))
    with raises_naming(TypeError, "GradientReduction.shared_grads", "True", "False", "'yes'",
                       "str"):
        DynamicLossScalingUpdater(solver, loss, feed, comm=solo,
                                  reduction=GradientReduction(shared_grads="yes"))
    solver, loss, feed = _small_training("half")
    with raises_naming(ValueError, "shared_grads=True", "cannot be honoured", "float16"):
        DynamicLossScalingUpdater(solver, loss, feed, comm=solo,
                                  reduction=GradientReduction(shared_grads=True))
    # shared_grads=False, or no communicator: the gradients stay where nnabla put them
    for kw in (dict(comm=solo, reduction=GradientReduction(shared_grads=False)),
               dict(reduction=GradientReduction(shared_grads=True))):
        solver, loss, feed = _small_training()
        before = [v.grad for v in solver.get_parameters().values()]
        if "comm" not in kw:
            with raises_naming(ValueError, "shared_grads=True", "communicator", "comm=..."):
                DynamicLossScalingUpdater(solver, loss, feed, **kw)
            continue
        updater = DynamicLossScalingUpdater(solver, loss, feed, **kw)
        assert updater.shared_gradients is None
        assert all(v.grad == b for v, b in zip(solver.get_parameters().values(), before))



"""MPICommunicator's shared-memory reduction (the default on one machine) under mpiexec.

The scheme sums every element once, on one rank, in rank order, in float32 (float64 when
an array needs it): the tests compute that exact sum with NumPy and compare bit for bit.
"""
import numpy as np

from mpi_helpers import bits, ranks_fixture
from nnabla_mpt.distributed.shared_memory_reduction import shm_area_bytes

shm = ranks_fixture("shared_memory.py")


def _rank_order_sum(xs, dtype):
    acc = xs[0].astype(dtype)
    for x in xs[1:]:
        acc = acc + x.astype(dtype)
    return acc


def _check_exact(res, tag, n_arrays, dtype, division=False):
    n = len(res)
    for i in range(n_arrays):
        ins = [npz[f"{tag}_in{i}"] for npz, _ in res]
        with np.errstate(over="ignore", invalid="ignore"):
            expected = _rank_order_sum(ins, dtype)
            if division:
                expected = expected / dtype.type(n)
            expected = expected.astype(ins[0].dtype)
        for r, (npz, _) in enumerate(res):
            got = npz[f"{tag}_out{i}"]
            assert got.dtype == ins[0].dtype, (tag, i, r)
            np.testing.assert_array_equal(bits(got), bits(expected),
                                          err_msg=f"{tag} array {i} on rank {r}")


def test_default_is_shared_memory_on_one_machine(shm):
    n, res = shm
    for _, meta in res:
        assert meta["algorithm"] == "shared_memory"
        assert meta["explicit"] == ["shared_memory", "reduce_scatter", "reduce_bcast"]


def test_several_chunks_with_float16_across_a_boundary(shm):
    n, res = shm
    _check_exact(res, "big", 5, np.dtype(np.float32), division=True)
    total = 1_000_000 + 100_000 + 1_500_000 + 0 + 1
    chunk = shm_area_bytes(n) // 4
    # a chunk boundary falls inside the float16 array, another inside the last large one
    assert any(1_000_000 < k * chunk < 1_100_000 for k in range(1, 10))
    assert any(1_100_000 < k * chunk < 2_600_000 for k in range(1, 10))
    for npz, meta in res:
        assert meta["big_dtypes"] == ["float32", "float16", "float32", "float32", "float32"]
        assert meta["big_collectives"] == 2 * -(-total // chunk)  # two barriers per chunk
        assert npz["big_out4"][0] == np.float32(1) / np.float32(n)  # the flag, averaged
    if n >= 3:  # the summation order matters for these inputs: another gives other bits
        ins = [npz["big_in0"] for npz, _ in res]
        reverse = _rank_order_sum(ins[::-1], np.float32) / np.float32(n)
        assert not np.array_equal(reverse, res[0][0]["big_out0"])


def test_float64_buffer(shm):
    n, res = shm
    _check_exact(res, "f64", 2, np.dtype(np.float64))
    chunk = shm_area_bytes(n) // 8
    for _, meta in res:
        assert meta["f64_dtypes"] == ["float64", "float32"]
        assert meta["f64_collectives"] == 2 * -(-600_010 // chunk)


def test_inf_and_nan_are_summed_like_other_values(shm):
    n, res = shm
    _check_exact(res, "nonfinite", 1, np.dtype(np.float32))
    got = res[0][0]["nonfinite_out0"]
    for j in range(n):
        assert got[j] == (np.inf if j % 2 == 0 else -np.inf)
    np.testing.assert_array_equal(got[n:7], np.full(7 - n, n, np.float32))
    assert np.isnan(got[7])


def test_only_empty_arrays(shm):
    n, res = shm
    for npz, meta in res:
        assert meta["empty_collectives"] == 2
        assert npz["empty_out0"].size == 0 and npz["empty_out1"].size == 0
        assert meta["empty_dtypes"] == ["float32", "float16"]


def test_successive_calls_of_different_sizes(shm):
    n, res = shm
    for k in range(5):
        expected = np.full(3 + 1000 * k, sum(r + k for r in range(n)), np.float32)
        for npz, meta in res:
            np.testing.assert_array_equal(npz[f"seq{k}_out0"], expected)
            assert meta[f"seq{k}_collectives"] == 2


def test_different_data_on_the_ranks_raises_the_same_error_everywhere(shm):
    n, res = shm
    sizes = "; ".join(f"rank {r}: 1 array of {5 + r} elements in total, summed in float32"
                      for r in range(n))
    count = "; ".join(
        f"rank {r}: {'1 array' if r == 0 else '2 arrays'} of 6 elements in total, "
        f"summed in float32" for r in range(n))
    tail = "; every rank must pass arrays of the same sizes and dtypes in the same order"
    for npz, meta in res:
        assert meta["mismatch_sizes"] == f"all_reduce: the ranks passed different data ({sizes}){tail}"
        assert meta["mismatch_count"] == f"all_reduce: the ranks passed different data ({count}){tail}"
        # the same sizes in another order were summed as if they matched before
        order = ("2 arrays of 6 elements in total on every rank, but the arrays' sizes "
                 "differ in order on rank(s) " + ", ".join(str(r) for r in range(1, n)))
        assert meta["mismatch_order"] == f"all_reduce: the ranks passed different data ({order}){tail}"
        # and the communicator keeps working afterwards
        np.testing.assert_array_equal(npz["after_mismatch_out0"],
                                      np.full(4, n * (n + 1) / 2, np.float32))

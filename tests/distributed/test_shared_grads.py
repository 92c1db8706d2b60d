"""Gradients in shared memory (MPICommunicator.share_grads) under mpiexec, and the
NdArray over external memory they rest on.

The in-place reduction must give the bits of the copying one: every element summed once,
on one rank, in rank order (x0 + x1 + ...), in float32.
"""
import numpy as np

from mpi_helpers import bits, ranks_fixture, run_ranks
from nnabla_mpt.distributed.shared_memory_reduction import shm_area_bytes

SHAPES = [(600, 1000), (7,), (3, 5, 2), (1,), (1000, 100)]

run = ranks_fixture("shared_grads.py")


def _expected(res, tag, i, division=False):
    ins = [npz[f"{tag}_in{i}"] for npz, _ in res]
    with np.errstate(over="ignore", invalid="ignore"):
        acc = ins[0].copy()
        for x in ins[1:]:
            acc = acc + x
        if division:
            acc = acc / np.float32(len(res))
    return acc.astype(np.float32)


def _check(res, tag, reduced, division=False):
    """Arrays in ``reduced`` hold the rank-order sum, bit for bit; the others their input."""
    for i in range(len(SHAPES)):
        for r, (npz, _) in enumerate(res):
            got = npz[f"{tag}_out{i}"]
            want = _expected(res, tag, i, division) if i in reduced else npz[f"{tag}_in{i}"]
            np.testing.assert_array_equal(bits(got), bits(want),
                                          err_msg=f"{tag}: array {i} on rank {r}")


def test_placing_keeps_the_values_and_lays_the_arrays_out_end_to_end(run):
    n, res = run
    for _, meta in res:
        assert meta["kept"] and meta["grads_are_arrays"]
        # every array starts on a 64-byte boundary right after the previous one
        sizes = [int(np.prod(s)) for s in SHAPES[:-1]]
        assert meta["pointer_gaps"] == [4 * (-(-k // 16) * 16) for k in sizes]


def test_all_arrays_are_reduced_in_place_with_two_barriers(run):
    n, res = run
    _check(res, "all", reduced=range(5), division=True)
    total = sum(int(np.prod(s)) for s in SHAPES)
    assert total > shm_area_bytes(n) // 4  # copying would take two chunks, four barriers
    for _, meta in res:
        assert meta["all_in_place"] == 1
        assert meta["all_collectives"] == 2
        assert meta["all_same_pointers"]


def test_a_run_of_arrays_and_a_single_array_are_reduced_in_place(run):
    n, res = run
    _check(res, "run", reduced={1, 2, 3})
    _check(res, "one", reduced={4})
    for _, meta in res:
        for tag in ("run", "one"):
            assert meta[f"{tag}_in_place"] == 1 and meta[f"{tag}_collectives"] == 2
            assert meta[f"{tag}_same_pointers"]


def test_arrays_that_are_not_consecutive_are_reduced_by_copying(run):
    n, res = run
    _check(res, "gap", reduced={0, 2})
    for _, meta in res:
        assert meta["gap_in_place"] == 0
        assert meta["gap_collectives"] == 2 * -(-600_030 // (shm_area_bytes(n) // 4))


def test_a_gradient_moved_on_one_rank_makes_every_rank_copy(run):
    n, res = run
    _check(res, "moved", reduced=range(5))
    chunks = -(-sum(int(np.prod(s)) for s in SHAPES) // (shm_area_bytes(n) // 4))
    for r, (_, meta) in enumerate(res):
        assert meta["moved_pointer_differs"] == (r == 0)
        assert meta["moved_in_place"] == 0
        # the first barrier tells the ranks apart; one more before the sums
        assert meta["moved_collectives"] == 2 * chunks + 1


def test_zero_puts_moved_gradients_back_and_zeroes_in_place(run):
    n, res = run
    _check(res, "again", reduced=range(5))
    for r, (_, meta) in enumerate(res):
        assert meta["zeroed"] and meta["back_in_place"] and meta["arrays_renewed"]
        assert meta["replaced_after_move"] == (1 if r == 0 else 0)
        assert meta["again_in_place"] == 1


def test_gradients_that_keep_leaving_are_reported_once(run):
    from support import assert_names
    n, res = run
    for r, (_, meta) in enumerate(res):
        assert meta["replaced_total"] == (5 if r == 0 else 4)
        assert len(meta["warnings"]) == 1, meta["warnings"]
        assert_names(meta["warnings"][0], "found elsewhere", "3 zero() calls in a row")


def test_share_grads_errors_name_the_argument(run):
    from support import assert_names
    n, res = run
    errors = res[0][1]["errors"]
    # each error as "<type>: <message>"
    assert_names(errors["not_variable"], "TypeError", "params[0]", "nnabla.Variable", "NdArray")
    assert_names(errors["twice"], "ValueError", "params['b']", "same Variable", "params['a']")
    assert_names(errors["empty"], "ValueError", "params", "at least one parameter",
                 "empty list")
    assert_names(errors["wrong_type"], "TypeError", "params", "dict", "nnabla.Variable",
                 "list of Variables", "Variable")
    assert_names(errors["algorithm"], "ValueError", "share_grads", "algorithm='shared_memory'",
                 "one machine", "'reduce_scatter'")
    for _, meta in res:  # the same on every rank (up to the Variable's repr)
        assert {k: e for k, e in meta["errors"].items() if k != "wrong_type"} == \
            {k: e for k, e in errors.items() if k != "wrong_type"}


# -- the NdArray over external memory, in one process -------------------------------------

def test_host_ndarray_shares_memory_both_ways():
    from nnabla.ext_utils import get_extension_context
    from nnabla_mpt.core._hostarray import host_ndarray

    ctx = get_extension_context("cpu")
    buf = np.arange(24, dtype=np.float32)
    a = host_ndarray(buf.ctypes.data + 4 * 4, (2, 3, 2))
    assert a.shape == (2, 3, 2)
    np.testing.assert_array_equal(a.data, buf[4:16].reshape(2, 3, 2))
    buf[5] = -1.0
    assert a.data[0, 0, 1] == -1.0
    a.data = np.full((2, 3, 2), 7.0, np.float32)
    np.testing.assert_array_equal(buf[4:16], 7.0)
    np.testing.assert_array_equal(buf[:4], [0, 1, 2, 3])
    np.testing.assert_array_equal(buf[16:], np.arange(16, 24))
    assert a.data_ptr(np.float32, ctx, False) == buf.ctypes.data + 16
    # nnabla's zero() drops the borrowed memory: later writes go elsewhere
    a.zero()
    a.data = np.ones((2, 3, 2), np.float32)
    np.testing.assert_array_equal(buf[4:16], 7.0)
    del a  # frees the DLPack block, never the memory it pointed to
    np.testing.assert_array_equal(buf[4:16], 7.0)
    buf[:] = 3.0  # still ours to write


def test_host_ndarray_in_a_graph_and_its_errors():
    import nnabla as nn
    import nnabla.functions as F
    from nnabla_mpt.core._hostarray import host_ndarray
    from support import raises_naming

    buf = np.zeros(6, np.float32)
    x = nn.Variable((2, 3), need_grad=True)
    x.d = np.arange(6).reshape(2, 3)
    x.grad = host_ndarray(buf.ctypes.data, (2, 3))
    y = F.sum(x ** 2)
    y.forward()
    y.backward(clear_buffer=True)
    np.testing.assert_array_equal(buf, 2 * np.arange(6))  # backward wrote into buf
    y.backward(clear_buffer=True)  # and accumulates there
    np.testing.assert_array_equal(buf, 4 * np.arange(6))
    with raises_naming(TypeError, "host_ndarray", "dtype", "float or integer", "complex64"):
        host_ndarray(buf.ctypes.data, (2,), np.complex64)
    for _ in range(2000):  # blocks are freed with the arrays: no crash, no growth to speak of
        host_ndarray(buf.ctypes.data, (6,))



def test_updater_steps_stay_right_when_the_script_drops_the_gradients(tmp_path):
    """``solver.zero_grad()`` between steps moves the gradients out of the shared memory;
    the next step puts them back and reduces them, as without sharing (bit for bit)."""
    for rank, (arrays, replaced) in enumerate(run_ranks(2, "shared_zero_grad.py", tmp_path)):
        names = [k.split("/", 1)[1] for k in arrays if k.startswith("copied_none/")]
        assert names
        for run in ("copied_zero_grad", "copied_grad.zero", "shared_none",
                    "shared_zero_grad", "shared_grad.zero"):
            for name in names:
                np.testing.assert_array_equal(
                    bits(arrays[f"{run}/{name}"]), bits(arrays[f"copied_none/{name}"]),
                    err_msg=f"{run}: {name} on rank {rank}")
        assert replaced["shared_none"] == 0
        assert replaced["shared_zero_grad"] >= 3 and replaced["shared_grad.zero"] >= 3

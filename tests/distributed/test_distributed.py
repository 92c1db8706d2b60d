"""Data-parallel training with the loss-scaling updaters under real ``mpiexec`` runs.

The worker (tests/mpi_workers/train.py) trains with MPICommunicator on 2 or 3 ranks and
saves what every rank saw; the assertions are here.
"""
import re
import subprocess

import numpy as np
import pytest

from doc_pages import ROOT
from mpi_helpers import (RANKS, TIMEOUT, check_ok, load_meta, ranks_fixture, run_mpi,
                         run_ranks)

BAD_RANK = 1
BAD_STEPS = [2, 3, 7]
BACKWARD_OVERFLOW = 50.0  # batch factor: float16 gradients overflow, the loss stays finite
NONFINITE_LOSS = 1e4  # batch factor: the float16 loss itself overflows


def expected_scales(n_steps, bad_steps, init=1024.0, N=3, max_scale=4096.0,
                    ignored_steps=()):
    """Scale used at each step: halve on overflow, double after N good steps in a row.

    ``ignored_steps`` (skipped for a non-finite loss) neither back off nor count as good.
    """
    scales, scale, good = [], init, 0
    for step in range(n_steps):
        scales.append(scale)
        if step in ignored_steps:
            continue
        if step in bad_steps:
            scale, good = scale / 2, 0
        else:
            good += 1
            if good == N:
                scale, good = min(scale * 2, max_scale), 0
    return scales


overflow_run = ranks_fixture("train.py", "overflow", BAD_RANK, BACKWARD_OVERFLOW, *BAD_STEPS)


def test_overflow_on_one_rank_skips_that_step_on_every_rank(overflow_run):
    n, res = overflow_run
    expected_skips = [step in BAD_STEPS for step in range(10)]
    for r, (_, meta) in enumerate(res):
        assert meta["skipped"] == expected_skips, f"rank {r}"
        assert meta["skipped_steps"] == len(BAD_STEPS) and meta["updates"] == 10 - len(BAD_STEPS)
        assert meta["bad_batch"] == [False] * 10 and meta["bad_batches"] == 0, f"rank {r}"


def test_overflow_on_one_rank_keeps_scales_equal(overflow_run):
    n, res = overflow_run
    scales = expected_scales(10, BAD_STEPS)
    assert scales[:5] == [1024.0, 1024.0, 1024.0, 512.0, 256.0]
    for r, (_, meta) in enumerate(res):
        assert meta["scale"] == scales, f"rank {r}"
        assert meta["next_scale"] == scales[1:] + [meta["next_scale"][-1]], f"rank {r}"


def test_skipped_steps_leave_parameters_and_states_untouched(overflow_run):
    n, res = overflow_run
    for r, (_, meta) in enumerate(res):
        # unchanged exactly at the skipped steps, changed at every other one
        assert meta["params_unchanged"] == meta["skipped"], f"rank {r}"
        assert meta["states_unchanged"] == meta["skipped"], f"rank {r}"


def test_parameters_bitwise_equal_across_ranks(overflow_run):
    n, res = overflow_run
    keys = sorted(k for k in res[0][0] if k.startswith("param/"))
    assert len(keys) == 4
    for k in keys:
        ref = res[0][0][k]
        assert np.all(np.isfinite(ref))
        for r, (npz, _) in enumerate(res[1:], start=1):
            np.testing.assert_array_equal(npz[k].view(np.uint32), ref.view(np.uint32),
                                          err_msg=f"{k} on rank {r}")


def test_one_all_reduce_per_good_step_and_two_per_skipped_step(overflow_run):
    # One micro-batch: the losses are not read during the step, so a skipped step takes one
    # more small all-reduce asking whether some rank's loss was non-finite.
    n, res = overflow_run
    for _, meta in res:
        assert meta["all_reduce_calls"] == 10 + len(BAD_STEPS)
        # float16 gradients: the updater leaves them in nnabla's memory and copies
        assert not meta["shared_grads"] and meta["in_place_calls"] == 0


FLOAT32_OVERFLOW = 1e12  # batch factor: scaled (2**60) float32 gradients overflow


@pytest.mark.parametrize("n", RANKS, ids=lambda n: f"np{n}")
def test_float32_overflow_on_one_rank_with_gradients_in_shared_memory(tmp_path, n):
    res = run_ranks(n, "train.py", tmp_path, "overflow32", BAD_RANK, FLOAT32_OVERFLOW,
                     *BAD_STEPS)
    expected = expected_scales(10, BAD_STEPS, init=2.0 ** 60, max_scale=2.0 ** 62)
    for r, (npz, meta) in enumerate(res):
        assert meta["shared_grads"], f"rank {r}"
        # every step's gradients are reduced in place; the skipped steps' small loss vote
        # is the only copying all-reduce
        assert meta["in_place_calls"] == 10, f"rank {r}"
        assert meta["all_reduce_calls"] == 10 + len(BAD_STEPS), f"rank {r}"
        assert meta["skipped"] == [step in BAD_STEPS for step in range(10)], f"rank {r}"
        assert meta["params_unchanged"] == meta["skipped"]
        assert meta["states_unchanged"] == meta["skipped"]
        assert meta["scale"] == expected, f"rank {r}"
        for k in (k for k in npz if k.startswith("param/")):
            np.testing.assert_array_equal(npz[k], res[0][0][k], err_msg=f"{k} on rank {r}")


@pytest.mark.parametrize("n", RANKS, ids=lambda n: f"np{n}")
def test_nonfinite_loss_on_one_rank_skips_everywhere_and_keeps_the_scale(tmp_path, n):
    res = run_ranks(n, "train.py", tmp_path, "overflow", BAD_RANK, NONFINITE_LOSS, *BAD_STEPS)
    # a non-finite loss is no overflow: the scale neither backs off nor counts the step
    expected = expected_scales(10, [], ignored_steps=BAD_STEPS)
    assert expected == [1024.0] * 5 + [2048.0] * 4 + [4096.0]
    for r, (npz, meta) in enumerate(res):
        assert meta["skipped"] == [step in BAD_STEPS for step in range(10)], f"rank {r}"
        assert meta["params_unchanged"] == meta["skipped"]
        assert meta["scale"] == expected, f"rank {r}"
        assert meta["bad_batches"] == 0, f"rank {r}"      # the batch is finite, the loss not
        for k in (k for k in npz if k.startswith("param/")):
            np.testing.assert_array_equal(npz[k], res[0][0][k])


@pytest.mark.parametrize("accum", [1, 2], ids=lambda a: f"accum{a}")
def test_nan_batch_on_one_rank_is_a_bad_batch_on_every_rank(tmp_path, accum):
    # Rank 1's batch is all NaN at the bad steps: through the ReLU its loss stays finite,
    # its gradients are NaN. Every rank skips, keeps the scale and counts a bad batch; the
    # skipped step's vote (one small all-reduce) carries "some rank's input was non-finite"
    # whether the losses were read during the step (accum 2) or not (accum 1).
    res = run_ranks(2, "train.py", tmp_path, "badbatch", BAD_RANK, accum, *BAD_STEPS)
    expected = expected_scales(10, [], ignored_steps=BAD_STEPS)
    skips = [step in BAD_STEPS for step in range(10)]
    for r, (npz, meta) in enumerate(res):
        assert meta["skipped"] == meta["bad_batch"] == skips, f"rank {r}"
        assert meta["bad_batches"] == len(BAD_STEPS), f"rank {r}"
        assert meta["scale"] == expected, f"rank {r}"
        assert meta["params_unchanged"] == meta["states_unchanged"] == skips, f"rank {r}"
        assert meta["all_reduce_calls"] == 10 + len(BAD_STEPS), f"rank {r}"
        assert meta["report_kind"] is None, f"rank {r}"
        for k in (k for k in npz if k.startswith("param/")):
            assert np.isfinite(npz[k]).all()
            np.testing.assert_array_equal(npz[k], res[0][0][k], err_msg=f"{k} on rank {r}")


@pytest.mark.parametrize("accum", [1, 2], ids=lambda a: f"accum{a}")
@pytest.mark.parametrize("n", RANKS, ids=lambda n: f"np{n}")
def test_data_parallel_average_equals_single_process_on_whole_batch(tmp_path, n, accum):
    res = run_ranks(n, "train.py", tmp_path, "parity", accum)
    rank0 = res[0][0]
    keys = sorted(k[len("param/"):] for k in rank0 if k.startswith("param/"))
    assert len(keys) == 4
    for _, meta in res:
        assert meta["skipped"] == [False] * meta["steps"]
        # a float graph: the gradients live in shared memory and are reduced there
        assert meta["shared_grads"] and meta["grads_are_shared"]
        assert meta["in_place_calls"] == meta["steps"]
    for k in keys:
        moved = np.abs(rank0[f"param/{k}"] - rank0[f"init/{k}"]).max()
        assert moved > 0.05, f"{k} barely trained ({moved})"
        np.testing.assert_allclose(rank0[f"param/{k}"], rank0[f"ref/{k}"], rtol=1e-5, atol=1e-6,
                                   err_msg=f"{k}: {n} ranks vs one process")
        for r, (npz, _) in enumerate(res[1:], start=1):
            np.testing.assert_array_equal(npz[f"param/{k}"], rank0[f"param/{k}"],
                                          err_msg=f"{k} on rank {r}")


@pytest.mark.parametrize("n", RANKS, ids=lambda n: f"np{n}")
def test_shared_gradients_train_bit_for_bit_like_copied_ones(tmp_path, n):
    runs = {}
    for shared in ("auto", "off"):
        outdir = tmp_path / shared
        outdir.mkdir()
        runs[shared] = run_ranks(n, "train.py", outdir, "parity", 2, shared)
    for r in range(n):
        auto, off = runs["auto"][r], runs["off"][r]
        assert auto[1]["shared_grads"] and not off[1]["shared_grads"]
        assert auto[1]["in_place_calls"] == 6 and off[1]["in_place_calls"] == 0
        keys = [k for k in auto[0] if k.startswith("param/")]
        assert len(keys) == 4
        for k in keys:
            np.testing.assert_array_equal(auto[0][k], off[0][k], err_msg=f"{k} on rank {r}")


@pytest.mark.parametrize("n", RANKS, ids=lambda n: f"np{n}")
def test_gradient_accumulation_reduces_once_per_step(tmp_path, n):
    for _, meta in run_ranks(n, "train.py", tmp_path, "parity", 3):
        assert meta["steps"] == 6
        assert meta["all_reduce_calls"] == 6  # not 6 x 3 micro-batches
        assert meta["collectives"] == 12  # and each is two barriers around the sums


@pytest.mark.parametrize("n", RANKS, ids=lambda n: f"np{n}")
def test_rank_raising_mid_training_ends_the_job(tmp_path, n):
    try:
        result = run_mpi(n, "train.py", tmp_path, "raise", 3, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"mpiexec -n {n} hung after a rank raised during training")
    assert result.returncode != 0
    assert f"RuntimeError: data loader failed on rank {n - 1} at step 3" in result.stderr
    # every rank completed steps 0-2, none got past the failed step
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f"rank{r}_step{i}" for r in range(n) for i in range(3))


def test_digits_example_reports_the_same_accuracy_on_every_rank():
    example = ROOT / "examples" / "digits_distributed.py"
    result = run_mpi(2, example, None, "--precision", "float", "--steps", "120")
    check_ok(result)
    accuracies = re.findall(r"rank (\d)/2: final test accuracy (\d\.\d+)", result.stdout)
    assert [r for r, _ in accuracies] == ["0", "1"]
    assert accuracies[0][1] == accuracies[1][1]
    assert float(accuracies[0][1]) > 0.88  # 120 steps of batch 64 already learn the digits
    assert "accuracy identical on every rank: yes" in result.stdout


@pytest.mark.parametrize("n", RANKS, ids=lambda n: f"np{n}")
def test_overflow_streak_from_one_rank_is_diagnosed_alike_on_every_rank(tmp_path, n):
    # Rank 1's batches overflow in backward for 5 steps; with diagnose_after=3 every rank
    # diagnoses its own batch after the third. Only rank 1 reproduces the overflow, yet all
    # ranks must keep training (a smaller scale fixes it) instead of some raising while the
    # others wait in the next all-reduce.
    res = run_ranks(n, "train.py", tmp_path, "streak", BAD_RANK, BACKWARD_OVERFLOW,
                     0, 1, 2, 3, 4)
    for r, (_, meta) in enumerate(res):
        assert meta["skipped"] == [True] * 5 + [False] * 5, f"rank {r}"
        assert meta["scale"] == res[0][1]["scale"]
        assert meta["scale"][:5] == [1024.0, 512.0, 256.0, 128.0, 64.0]
        assert meta["report_kind"] == ("overflow" if r == BAD_RANK else "not_reproduced")
        # one a step, one loss vote per skipped step, and the diagnosis vote
        assert meta["all_reduce_calls"] == 10 + 5 + 1
    for k in (k for k in res[0][0] if k.startswith("param/")):
        for npz, _ in res[1:]:
            np.testing.assert_array_equal(npz[k], res[0][0][k])


@pytest.mark.parametrize("mode", ["order", "names", "same"])
def test_ranks_that_would_exchange_different_gradients_get_the_same_error(tmp_path, mode):
    from support import assert_names
    n = 2
    check_ok(run_mpi(n, "mismatch.py", tmp_path, mode))
    errors = [meta["error"] for meta in load_meta(tmp_path, n)]
    if mode == "same":
        assert errors == [None] * n
        return
    assert errors[0] == errors[1] and errors[0] is not None
    assert_names(errors[0], "the ranks exchange different gradients", "names", "shapes",
                 "order", "rank(s) 1", "rank 0's")


def test_grads_that_leave_out_a_parameter_are_refused_with_a_communicator():
    from nnabla_mpt import DynamicLossScalingUpdater, MPICommunicator
    from support import Net, raises_naming

    net = Net(hidden=4)
    solver = net.solver()
    comm = MPICommunicator(abort_on_exception=False)     # one rank suffices for the check
    some = [v.grad for name, v in net.params.items() if not name.endswith("/b")]
    with raises_naming(ValueError, "grads", "all the solver's parameters", "communicator",
                       "missing ['out/affine/b', 'hidden/affine/b']", "drift apart",
                       "pass grads=None"):
        DynamicLossScalingUpdater(solver, net.loss, None, comm=comm, grads=some)
    # all of them, in any order, are fine
    DynamicLossScalingUpdater(solver, net.loss, None, comm=comm,
                              grads=[v.grad for v in net.params.values()][::-1])


@pytest.mark.parametrize("mode", ["clip", "saturation"])
@pytest.mark.parametrize("n", RANKS, ids=lambda n: f"np{n}")
def test_one_rank_s_huge_gradients_skip_the_step_on_every_rank(tmp_path, n, mode):
    """Huge values on the last rank (1e38 with ``clip_grad_norm``: its scaled gradients
    overflow to inf, which the check of the reduced gradients finds on every rank alike;
    2e37 in the saturation mode, where that rank's own check before the reduce finds
    them first)."""
    ranks = run_ranks(n, "clip_norm.py", tmp_path, mode)
    for arrays, meta in ranks:
        assert meta["results"] == [[False, 4.0, 4.0], [False, 4.0, 4.0], [True, 4.0, 2.0],
                                   [False, 2.0, 2.0]]
        assert meta["overflow_streak"] == 1
        assert arrays["after_skip"].tobytes() == arrays["before_skip"].tobytes()
        assert arrays["w"].tobytes() == ranks[0][0]["w"].tobytes()

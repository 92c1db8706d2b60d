"""Measured loss scaling under real mpiexec runs: every rank starts at, and grows to, the
same scale, decided by the largest gradient over the ranks."""
import numpy as np

from mpi_helpers import bits, ranks_fixture
from support import assert_names

run = ranks_fixture("measured.py")


def test_every_rank_starts_at_the_smallest_start_over_the_ranks(run):
    n, res = run
    starts = [meta["local_start"] for _, meta in res]
    # the last rank's larger inputs make larger gradients: alone it would start lower
    assert starts[-1] < max(starts[:-1])
    for _, meta in res:
        assert meta["scale"][0] == min(starts)
        assert not meta["skipped"][0]
        [line] = meta["lines"]
        assert_names(line, f"starts at {min(starts):g}", f"the smallest start over {n} ranks")


def test_ranks_keep_identical_scales_and_parameters(run):
    n, res = run
    ref = res[0][1]
    for r, (npz, meta) in enumerate(res):
        assert (meta["skipped"], meta["scale"], meta["next_scale"]) == (
            ref["skipped"], ref["scale"], ref["next_scale"]), f"rank {r}"
        for k in (k for k in npz if k.startswith("param/")):
            np.testing.assert_array_equal(bits(npz[k]), bits(res[0][0][k]),
                                          err_msg=f"{k} on rank {r}")


def test_the_spike_backs_off_and_measured_growth_returns_in_one_move(run):
    n, res = run
    meta = res[0][1]
    assert [i for i, s in enumerate(meta["skipped"]) if s] == [6, 7]
    before, low = meta["scale"][6], meta["next_scale"][7]
    assert low == before / 4
    # three good steps after the spike (8, 9, 10): step 10 is the first growth point
    assert meta["next_scale"][8:10] == [low, low]
    assert meta["next_scale"][10] >= before / 2


def test_every_rank_keeps_the_same_history(run):
    # One reach per good step while the history holds fewer than 4 (steps 0 to 3) and per
    # good growth point after (steps 5, 10 and 13; the spike's 6 and 7 are skipped), the
    # smallest over the ranks, the same bits on every rank.
    n, res = run
    ref = res[0][1]["scale_history"]
    assert len(ref) == 7 and all(r > 0 for r in ref)
    for r, (_, meta) in enumerate(res):
        assert meta["scale_history"] == ref, f"rank {r}"


def test_a_watched_step_agrees_on_its_measurement_in_one_all_reduce(run):
    # Steps 1 to 3 (a short history) and the growth points 5, 10 and 13 are watched; the
    # other good steps are not (step 0 calibrates, 6 and 7 are skipped).
    n, res = run
    for _, meta in res:
        counts = meta["all_reduces"]
        plain = {counts[i] for i in (4, 9, 12)}
        assert len(plain) == 1, counts
        assert [counts[i] - min(plain) for i in (1, 2, 3, 5, 10, 13)] == [1] * 6, counts


def test_gradient_statistics_are_each_ranks_own(run):
    n, res = run
    for _, meta in res:
        assert meta["stats_steps"] == [3, 7, 11]
    # before the all-reduce the gradients differ: the last rank's are the largest
    largest = [meta["stats_max_abs"][0] for _, meta in res]
    assert largest[-1] > max(largest[:-1])


def test_the_step_loss_is_the_mean_over_the_ranks(run):
    n, res = run
    ref = res[0][1]["loss"]
    for _, meta in res:
        assert meta["loss"] == ref                          # the same on every rank
    mean = np.mean([meta["local_loss"] for _, meta in res], axis=0)
    finite = np.isfinite(mean)
    np.testing.assert_allclose(np.array(ref)[finite], mean[finite], rtol=1e-5)


def test_a_first_batch_no_scale_can_measure_on_one_rank_makes_every_rank_measure_again(run):
    n, res = run
    ref = res[0][1]["huge"]
    (skipped0, scale0, next0), (skipped1, scale1, next1) = ref
    assert (skipped0, scale0, next0) == (True, 2.0 ** 15, 2.0 ** 15)   # no scale set
    assert not skipped1 and 1.0 < scale1 < 2.0 ** 15                   # measured at step 1
    for r, (_, meta) in enumerate(res):
        assert [tuple(s) for s in meta["huge"]] == [tuple(s) for s in ref], f"rank {r}"
        assert meta["huge_pending"] is False
        nothing, start = meta["huge_lines"]
        why = "its loss is not finite" if r == 0 else "the batch of another rank"
        assert_names(nothing, "measures nothing", why)
        assert_names(start, f"starts at {scale1:g}", f"the smallest start over {n} ranks")

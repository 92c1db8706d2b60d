"""The step's one decision, a named outcome: what each outcome means for the step and for
the policy (the updaters' behaviour on each: test_fp16_overflow.py, test_bad_batches.py,
test_clip_norm.py)."""
import pytest

from nnabla_mpt.step.decision import Outcome, skipped_for


@pytest.mark.parametrize("outcome, skipped, scale_at_fault", [
    (Outcome.UPDATED, False, True),
    (Outcome.OVERFLOW, True, True),
    (Outcome.NONFINITE_NORM, True, True),
    (Outcome.NONFINITE_LOSS, True, False),
    (Outcome.BAD_BATCH, True, False),
])
def test_what_each_outcome_means(outcome, skipped, scale_at_fault):
    assert (outcome.skipped, outcome.scale_at_fault) == (skipped, scale_at_fault)


@pytest.mark.parametrize("loss_nonfinite, bad_batch, outcome", [
    (False, False, Outcome.OVERFLOW), (True, False, Outcome.NONFINITE_LOSS),
    (False, True, Outcome.BAD_BATCH), (True, True, Outcome.BAD_BATCH)])
def test_a_bad_batch_comes_first_then_a_non_finite_loss(loss_nonfinite, bad_batch, outcome):
    assert skipped_for(loss_nonfinite, bad_batch) is outcome

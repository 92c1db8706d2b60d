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


def test_a_result_keeps_what_it_is_given_and_defaults_to_one_float_attempt():
    from nnabla_mpt import StepResult
    made = StepResult(step=3, skipped=True, scale=8.0, next_scale=4.0)
    assert (made.attempts, made.precision, made.gradient_stats, made.bad_batch,
            made.held_by, made.skipped_steps) == (1, "float", None, False, None, None)
    given = StepResult(3, False, 8.0, 16.0, 2, "half", None, False, "ceiling", 5)
    assert (given.attempts, given.precision, given.held_by, given.skipped_steps) == (
        2, "half", "ceiling", 5)
    assert given.updated and not made.updated

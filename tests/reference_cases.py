"""The option matrix of the updaters, sampled, and one case run against the reference.

:func:`sample_case` draws one combination of options from a seeded generator (precision,
model size, solver, accumulation, averaging, weight decay, clipping, overflow mode, the
scale and its policy, growth mode, ``scale="auto"``, retries, statistics, the precision
schedule, the diagnosis, both updaters) and the batches that overflow, hold NaN or inf, or
make a half loss non-finite. :func:`run_case` trains the updater and checks every step
against :class:`reference_step.ReferenceStep`, and the invariants that need no reference.
"""
import math
from typing import Dict, List, Optional

import numpy as np

import nnabla as nn
import nnabla.solvers as S

from nnabla_mpt import (DynamicLossScale, DynamicLossScalingUpdater, FixedLossScalingUpdater,
                        GradientReduction, OverflowHandling, PrecisionSchedule)
from reference_step import FLOAT16_CEILING, SOLVERS, Model, ReferenceStep
from support import assert_bitwise_equal, assert_states_bitwise_equal, solver_states

#: Parameters after a step may differ from the float64 reference by this fraction of the
#: step's magnitude (the change computed from absolute values: where the solver's terms
#: cancel, their float32 rounding does not), plus two float32 units in the last place of
#: the parameter. The updater works in float32: one rounding each in the unscale, the clip
#: factor (a norm summed over up to 2.6e5 squares), the weight decay and the solver's
#: rule and states, about 1e-6 of the magnitude in these models; 1e-4 leaves a margin of
#: 100 and stays below the 2.3e-4 that a scale divided out unrounded makes (3000.7, which
#: float16 holds as 3000).
CHANGE_RTOL = 1e-4
#: The step's loss: the updater sums the micro-batches' losses in float32.
LOSS_RTOL = 1e-6

EVENTS = ("far", "huge", "big", "nan", "inf")


def sample_case(seed: int, steps: int = 10, ranks: int = 1) -> dict:
    """One combination of options and batches, drawn from ``seed``."""
    rng = np.random.RandomState(seed)
    pick = lambda *values: values[rng.randint(len(values))]   # noqa: E731
    fixed = rng.rand() < 0.2
    case = {"seed": seed, "steps": steps, "updater": "fixed" if fixed else "dynamic",
            "precision": pick("half", "half", "float"),
            "size": pick("small", "small", "small", "small", "small_bn", "small_bn", "wide"),
            "solver": pick(*sorted(SOLVERS)), "accum_grad": pick(1, 1, 2, 3),
            "average_accum": pick(False, True), "weight_decay": pick(None, 1e-2),
            "clip_grad_norm": pick(None, None, 0.05, 1e3),
            "overflow_mode": pick("inf_nan", "inf_nan", "saturation"),
            "max_retries": 0 if fixed else pick(0, 0, 2),
            "gradient_stats_every": pick(None, None, 1, 3),
            "clear_buffer": pick(True, False), "floor_policy": pick("warn", "ignore"),
            "diagnose_after": pick(1, 2, 8)}
    if ranks > 1:
        case["average_ranks"] = pick(False, True)
    if fixed:
        case.update(scale=pick(1.0, 64.0, 3000.7, 2.0 ** 15),
                    enable_overflow_check=pick(True, True, False))
    else:
        growth = pick(2.0, 2.0, 1.5)
        case.update(scale=pick(8.0, 1024.0, 3000.7, 17496.0, 2.0 ** 15, "auto"),
                    scaling_factor=growth, N=pick(1, 2, 3, 5),
                    backoff_factor=pick(None, None, 0.3), hysteresis=pick(1, 1, 2, 3),
                    min_scale=pick(1.0, 1.0, 4.0), max_scale=pick(2.0 ** 24, 2.0 ** 13),
                    growth_mode=pick("probe", "measured"))
        if case["scale"] != "auto":
            case["max_scale"] = max(case["max_scale"], case["scale"])
        if case["precision"] == "half" and rng.rand() < 0.25:
            case.update(accelerate_train_mode="fast|step|0.5", total_steps=steps)
    case["events"] = [{} for _ in range(ranks)]      # per rank: batch index -> event
    if case.get("enable_overflow_check", True):
        batches = steps * case["accum_grad"] * (1 + case["max_retries"])
        for events in case["events"]:
            for i in range(batches):
                if rng.rand() < 0.12 / ranks:
                    events[i] = pick(*EVENTS, "huge")
    return case


#: The case's keys that are updater arguments of the same name.
UPDATER_OPTIONS = ("scale", "scaling_factor", "N", "growth_mode", "accum_grad", "weight_decay",
                   "clip_grad_norm", "gradient_stats_every", "clear_buffer",
                   "enable_overflow_check")


def updater_options(case: dict, float_loss) -> dict:
    """The updater's keyword arguments of ``case``: the policy's settings as a
    ``DynamicLossScale`` (given with ``scale="auto"`` where the case measures its start),
    the overflow handling, the reduction and the precision schedule as their objects."""
    kwargs = {k: case[k] for k in UPDATER_OPTIONS if k in case}
    if case["updater"] == "dynamic":
        growth, auto = kwargs.pop("scaling_factor"), case["scale"] == "auto"
        kwargs["policy"] = DynamicLossScale(
            init_scale=case["max_scale"] if auto else kwargs.pop("scale"),
            growth_factor=growth, backoff_factor=case["backoff_factor"] or 1 / growth,
            growth_interval=kwargs.pop("N"), hysteresis=case["hysteresis"],
            min_scale=case["min_scale"], max_scale=case["max_scale"],
            growth_mode=kwargs.pop("growth_mode"))
    kwargs["overflow"] = OverflowHandling(case["overflow_mode"], case["max_retries"],
                                          case["floor_policy"], case["diagnose_after"])
    kwargs["average_accum"] = case["average_accum"]
    kwargs["reduction"] = GradientReduction(average_ranks=case.get("average_ranks", False))
    if "accelerate_train_mode" in case:
        kwargs["schedule"] = PrecisionSchedule(case["accelerate_train_mode"],
                                               total_steps=case["total_steps"],
                                               high_precision_loss=float_loss)
    return kwargs


def build(case: dict, scope: str, rank: int = 0, comm=None):
    """The model, its solver, the updater of ``case`` on ``rank`` and the list its monitor
    appends every step's result to."""
    model = Model(case["size"], case["precision"], scope, case["events"][rank],
                  twin="accelerate_train_mode" in case, seed=case["seed"],
                  data_seed=case["seed"] * 10 + rank)
    with nn.context_scope(model.loss.parent.context):
        solver = getattr(S, case["solver"])(**SOLVERS[case["solver"]])
    solver.set_parameters(model.trained)
    kwargs = updater_options(case, model.float_loss)
    recorded = []
    kwargs["monitor"] = recorded.append
    cls = FixedLossScalingUpdater if case["updater"] == "fixed" else DynamicLossScalingUpdater
    updater = cls(solver, model.loss, model.feeder, comm=comm, **kwargs)
    return model, solver, updater, recorded


def run_case(case: dict, scope: str = "ref", mpi=None, comm=None) -> List[str]:
    """Trains ``case`` and checks every step; returns the kind of every step (for the
    coverage of the sample). ``mpi``: the mpi4py communicator the reference sums with;
    ``comm``: the updater's communicator."""
    model, solver, updater, recorded = build(case, scope, 0 if mpi is None else mpi.rank, comm)
    ref = ReferenceStep(model, case, mpi)
    seen = []
    for call in range(case["steps"]):
        before, states, first = model.snapshot(), solver_states(solver), model.calls
        recorded.clear()
        result = updater.update()
        after = model.snapshot()
        where = f"case {case['seed']} update() #{call}"
        assert recorded[-1] is result, where
        model.restore(before)
        expected = ref.call(recorded, first)
        passes = model.snapshot()       # the running statistics after the reference's passes
        compare_results(case, recorded, expected, where)
        assert (updater.steps, updater.updates, updater.skipped_steps) == (
            ref.steps, ref.updates, ref.steps - ref.updates), where
        check_parameters(case, ref, (before, after, passes), (states, solver_states(solver)),
                         expected[-1], where)
        model.restore(after)
        seen += [kind_of(a) for a in expected]
    return seen


def kind_of(attempt) -> str:
    if not attempt.skipped:
        return "updated" if math.isfinite(attempt.loss) else "updated, loss not finite"
    return "bad batch" if attempt.bad_batch else "skipped"


def _same_loss(got: float, want: float) -> bool:
    if not math.isfinite(want):
        return not math.isfinite(got)
    return math.isfinite(got) and abs(got - want) <= LOSS_RTOL * abs(want) + 1e-12


def compare_results(case: dict, recorded, expected, where: str) -> None:
    """Each ``StepResult`` of the call against the reference's attempt."""
    assert len(recorded) == len(expected), (
        f"{where}: the updater ran {len(recorded)} step(s), the reference "
        f"{len(expected)}: {[kind_of(a) for a in expected]}")
    every = case.get("gradient_stats_every")
    for i, (got, want) in enumerate(zip(recorded, expected)):
        at = f"{where}, attempt {i + 1} (step {want.step})"
        assert (got.step, got.attempts, got.precision) == (want.step, i + 1,
                                                           want.precision), at
        assert (got.skipped, got.bad_batch) == (want.skipped, want.bad_batch), (
            f"{at}: skipped/bad_batch {got.skipped, got.bad_batch}, reference "
            f"{want.skipped, want.bad_batch}")
        assert (got.scale, got.next_scale) == (want.scale, want.next_scale), (
            f"{at}: scale -> next {got.scale} -> {got.next_scale}, reference "
            f"{want.scale} -> {want.next_scale}")
        assert _same_loss(got.loss, want.loss), f"{at}: loss {got.loss}, reference {want.loss}"
        due = every is not None and (want.step + 1) % every == 0
        if not due:
            assert got.gradient_stats is None, at
        else:
            compare_stats(got.gradient_stats, want.grads, at)
        check_scale_bounds(case, got, at)


def compare_stats(stats, grads: Dict[str, np.ndarray], where: str) -> None:
    """Gradient statistics as documented, from the gradients the backward produced."""
    assert sorted(stats) == sorted(grads), where
    for name, g in grads.items():
        s = stats[name]
        kind = np.finfo(np.float16 if s.dtype == "float16" else np.float32)
        finite = np.isfinite(g)
        a = np.abs(g[finite])
        want = dict(zero_fraction=float((g == 0).sum()) / g.size,
                    subnormal_fraction=float(((a > 0) & (a < kind.tiny)).sum()) / g.size,
                    nonfinite_fraction=float((~finite).sum()) / g.size)
        got = {k: getattr(s, k) for k in want}
        assert got == want, f"{where}: statistics of {name}: {got}, reference {want}"
        if finite.all():
            top = float(a.max()) if a.size else 0.0
            assert s.max_abs == top, f"{where}: max_abs of {name}: {s.max_abs} vs {top}"
            room = math.inf if top == 0 else math.floor(math.log2(float(kind.max) / top))
            assert s.headroom == room, f"{where}: headroom of {name}: {s.headroom} vs {room}"
        else:
            assert s.headroom == -math.inf, where


def check_scale_bounds(case: dict, result, where: str) -> None:
    """The scale stays within its bounds, at or below 2**15 on a half graph, and is 1
    in the full-precision phase of a precision schedule."""
    switch = math.ceil(0.5 * case["total_steps"]) if "total_steps" in case else math.inf
    for name, step in (("scale", result.step), ("next_scale", result.step + 1)):
        value = getattr(result, name)
        if step >= switch:
            assert value == 1.0, f"{where}: {name} {value} in the full-precision phase"
            continue
        low = case.get("min_scale", 1.0) if case["updater"] == "dynamic" else 1.0
        high = case.get("max_scale", 2.0 ** 24)
        if case["precision"] == "half":
            high = min(high, FLOAT16_CEILING)
        assert low <= value <= max(high, low), f"{where}: {name} {value} outside bounds"


def check_parameters(case: dict, ref: ReferenceStep, params, states, last, where) -> None:
    """A skipped call changes no trained parameter nor solver state; an updated one
    matches the reference's rule, and changes a parameter when its gradients are not all
    zero; nothing non-finite lands; running statistics are those the step's own forward
    passes leave (``params``: before the call, after it, after the reference's passes)."""
    (before, after, passes), (states_before, states_after) = params, states
    trained = sorted(ref.model.trained)
    for k in sorted(set(before) - set(trained)):
        assert after[k].tobytes() == passes[k].tobytes(), (
            f"{where}: running statistics {k} are not those of the step's forward passes: "
            f"{after[k]} vs {passes[k]}")
    before, after = ({k: d[k] for k in trained} for d in (before, after))
    if last.skipped:
        assert_bitwise_equal(before, after)
        assert_states_bitwise_equal(states_before, states_after)
        return
    want, magnitude = ref.apply(before, last.applied)
    for k in trained:
        ulp = np.spacing(np.abs(want[k]).astype(np.float32)).astype(np.float64)
        with np.errstate(invalid="ignore"):
            error = np.abs(after[k] - want[k])
        # where the unchecked gradients were not finite, so are the parameters (check off)
        error[(np.isnan(after[k]) & np.isnan(want[k])) | (after[k] == want[k])] = 0.0
        bound = np.nan_to_num(CHANGE_RTOL * magnitude[k] + 2 * ulp, nan=0.0)
        worst = np.unravel_index(np.argmax(error - bound), error.shape)
        assert (error <= bound).all(), (
            f"{where}: {k}{list(worst)} = {after[k][worst]!r}, reference {want[k][worst]!r} "
            f"(from {before[k][worst]!r})")
    if case.get("enable_overflow_check", True):
        assert all(np.isfinite(v).all() for v in after.values()), f"{where}: non-finite"
    if any(np.any(g != 0) for g in last.applied.values()) or case.get("weight_decay"):
        assert any((after[k] != before[k]).any() for k in trained), (
            f"{where}: reported as updated, gradients not zero, no parameter changed")

"""A reference of the documented training step, written plainly, for differential tests.

One ``update()`` call, as the docs describe it::

    zero the gradients
    accum_grad x: feed, forward, backward(scale)
    sum over the ranks: in a float32 buffer, divided there by the number of ranks where
               averaged, written back into the gradients' own dtype
    decide: overflow (inf/NaN, or |g| >= 65504 in saturation mode) skips the step
    good step: unscale (divide by the scale the backward seed held, and by accum_grad
               where averaged); clip to the global L2 norm
               of the unscaled gradients (a norm that is not finite skips as an overflow);
               weight decay g += wd * w; the solver's rule
    the scale policy: back off on an overflow (hysteresis, min_scale), grow after N good
               steps (max_scale, the dtype's ceiling); a skipped step whose batch holds
               inf/NaN or whose loss is not finite keeps the scale
    retries: a skipped step is followed by up to max_retries more on new batches

How it is compared: :func:`run_case` snapshots the parameters, lets the updater take its
step, then puts the parameters back and runs the reference on the same graph and batches.
The forward and backward passes are nnabla's (same parameters, same batch, same seed
value: the same gradients bit for bit); everything after the backward pass is NumPy in
float64, and the solver's rule is written from nnabla's documented formulas
(:class:`NumpySolver`). The parameters the reference computes start each step from the
updater's (so that one step's rounding is compared, not a drift), while the scale, the
counters and the solver's moments are the reference's own from the first step on.

What the reference cannot know it takes from the updater and checks: the scale
``scale="auto"`` measured on the first step (within the bounds), and a measured growth
(``growth_mode="measured"``: the scale times ``scaling_factor ** k``, ``k >= 0``, within the
bounds).
"""
import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla.solvers as S
from nnabla.ext_utils import get_extension_context

#: float16's largest value and largest power of two: the seed's ceiling in a half graph.
FLOAT16_MAX, FLOAT16_CEILING = 65504.0, 2.0 ** 15
DTYPES = {"half": np.float16, "float": np.float32}

SOLVERS = {
    "Sgd": dict(lr=0.1),
    "Momentum": dict(lr=0.1, momentum=0.9),
    "Nesterov": dict(lr=0.1, momentum=0.9),
    # eps comparable to the gradients, so that Adam is not blind to a wrong unscale factor.
    "Adam": dict(alpha=0.05, beta1=0.9, beta2=0.999, eps=1e-3),
}


class NumpySolver:
    """One solver rule per kind, as nnabla documents it, in float64.

    :meth:`update` also returns the step's magnitude: the same rule run on absolute
    values (``|g|``, and states built from them), which bounds the rounding error of a
    float32 solver where the terms of its rule cancel.
    """

    def __init__(self, kind, **hp):
        self.kind, self.hp, self.state = kind, hp, {}

    def update(self, name, w, g, size):
        """``(w after, magnitude)`` for gradient ``g``; ``size``: the gradient's
        magnitude (``|g|`` before weight decay, plus ``wd * |w|``)."""
        hp, st = self.hp, self.state.setdefault(name, {})
        if self.kind == "Sgd":
            return w - hp["lr"] * g, hp["lr"] * size
        if self.kind in ("Momentum", "Nesterov"):
            mom, sign = hp["momentum"], 1.0 if self.kind == "Momentum" else -1.0
            v_prev, V_prev = st.get("v", 0.0), st.get("V", 0.0)
            v = mom * v_prev + sign * hp["lr"] * g
            st.update(v=v, V=mom * V_prev + hp["lr"] * size)
            if self.kind == "Momentum":
                return w - v, st["V"]
            return w - mom * v_prev + (1.0 + mom) * v, mom * V_prev + (1.0 + mom) * st["V"]
        if self.kind == "Adam":
            t = st.get("t", 0) + 1
            m = hp["beta1"] * st.get("m", 0.0) + (1.0 - hp["beta1"]) * g
            M = hp["beta1"] * st.get("M", 0.0) + (1.0 - hp["beta1"]) * size
            v = hp["beta2"] * st.get("v", 0.0) + (1.0 - hp["beta2"]) * g * g
            st.update(t=t, m=m, M=M, v=v)
            alpha_t = (hp["alpha"] * math.sqrt(1.0 - hp["beta2"] ** t)
                       / (1.0 - hp["beta1"] ** t))
            denominator = np.sqrt(v) + hp["eps"]
            return w - alpha_t * m / denominator, alpha_t * M / denominator
        raise ValueError(self.kind)


class Model:
    """``x -> affine -> relu|tanh -> affine -> mean squared error`` in one precision, and
    with ``twin`` the same network in float sharing its parameters (for the precision
    schedule's ``high_precision_loss``).

    ``size="small"``: 3 -> 5 -> 2, batch 4; ``"small_bn"``: the same with batch
    normalization after the first layer (running statistics: parameters without
    gradients). ``size="wide"``: 512 -> 512 -> 2, batch 2 (a 512x512 weight). Parameters
    come from ``seed``, batch ``i`` from a generator seeded with ``data_seed`` and ``i``;
    ``events[i]`` makes it special: ``"far"`` (targets times 300: a half loss overflows
    while the gradients stay finite at small scales), ``"huge"`` (x times 1e3: large
    gradients), ``"big"``
    (one value 1e5: above float16's range, so a half graph's loss is not finite from finite
    data), ``"nan"`` and ``"inf"`` (a non-finite value in x: a bad batch).

    Attributes:
        params: Every parameter by name, running statistics included.
        trained: The parameters with gradients, which the solver updates.
    """

    SHAPES = {"small": (4, 3, 5, 2, "relu", False), "small_bn": (4, 3, 5, 2, "relu", True),
              "wide": (2, 512, 512, 2, "tanh", False)}

    def __init__(self, size: str, precision: str, scope: str, events: Dict[int, str],
                 twin: bool = False, seed: int = 0, data_seed: int = 0) -> None:
        batch, d_in, hidden, d_out, act, norm = self.SHAPES[size]
        self.shape_x, self.shape_t = (batch, d_in), (batch, d_out)
        self.events, self.data_seed, self.calls = events, data_seed, 0
        self.inputs = []
        layers = (hidden, d_out, act, norm)
        self.loss = self._build(precision, scope, *layers)
        with nn.parameter_scope(scope):
            self.params = nn.get_parameters(grad_only=False)
            self.trained = nn.get_parameters(grad_only=True)
        self.float_loss = self._build("float", scope, *layers) if twin else None
        rng = np.random.RandomState(seed)
        for name, v in self.trained.items():
            v.d = (rng.uniform(-1, 1, v.shape) / math.sqrt(v.shape[0])).astype(np.float32)

    def _build(self, precision, scope, hidden, d_out, act, norm):
        ctx = get_extension_context("cpu", type_config=precision)
        with nn.context_scope(ctx), nn.parameter_scope(scope):
            x, t = nn.Variable(self.shape_x), nn.Variable(self.shape_t)
            h = PF.affine(x, hidden, name="hidden")
            if norm:
                h = PF.batch_normalization(h, batch_stat=True, name="bn")
            h = getattr(F, act)(h)
            loss = F.mean(F.squared_error(PF.affine(h, d_out, name="out"), t))
        self.inputs.append((x, t))
        return loss

    def batch(self, index: int):
        rng = np.random.RandomState(self.data_seed * 7919 + index)
        x = rng.randn(*self.shape_x).astype(np.float32)
        t = rng.randn(*self.shape_t).astype(np.float32)
        event = self.events.get(index)
        if event == "far":
            t *= np.float32(300.0)
        elif event == "huge":
            x *= np.float32(1e3)
        elif event == "big":
            x[0, 0] = 1e5
        elif event in ("nan", "inf"):
            x[0, 0] = np.nan if event == "nan" else np.inf
        return x, t

    def feed(self, index: int) -> None:
        x, t = self.batch(index)
        for vx, vt in self.inputs:
            vx.d, vt.d = x, t

    def feeder(self) -> None:
        """The data feeder given to the updater: loads the next batch."""
        self.feed(self.calls)
        self.calls += 1

    def snapshot(self) -> Dict[str, np.ndarray]:
        return {k: np.array(v.d, copy=True) for k, v in self.params.items()}

    def restore(self, values: Dict[str, np.ndarray]) -> None:
        for k, v in self.params.items():
            v.d = values[k]


@dataclass
class Attempt:
    """What the reference expects of one step (one ``StepResult``)."""
    step: int
    scale: float
    precision: str
    skipped: bool = False
    bad_batch: bool = False
    loss: float = math.nan
    next_scale: float = math.nan
    grads: Dict[str, np.ndarray] = field(default_factory=dict)   # as the backward made them
    applied: Optional[Dict[str, np.ndarray]] = None   # the gradients the solver got


class ReferencePolicy:
    """The scale as the docs describe it: ``DynamicLossScale``'s rules, or a fixed scale."""

    def __init__(self, opts: dict, ceiling: float) -> None:
        self.fixed = opts["updater"] == "fixed"
        self.growth = opts.get("scaling_factor", 2.0)
        self.backoff = opts.get("backoff_factor") or 1.0 / self.growth
        self.N = opts.get("N", 2000)
        self.hysteresis = opts.get("hysteresis", 1)
        self.min_scale = opts.get("min_scale", 1.0)
        self.cap = min(opts.get("max_scale", 2.0 ** 24), ceiling)
        self.measured = opts.get("growth_mode") == "measured"
        scale = opts.get("scale", 128.0 if self.fixed else 8.0)
        self.scale = None if scale == "auto" else min(float(scale), self.cap)
        self.good, self.left = 0, self.hysteresis

    def growth_due(self) -> bool:
        return not self.fixed and self.good + 1 >= self.N

    def update(self, overflow: bool, measured_next: float) -> None:
        if self.fixed:
            return
        if overflow:
            self.good, self.left = 0, max(self.left - 1, 0)
            if self.left == 0:
                self.scale = max(self.scale * self.backoff, self.min_scale)
            return
        self.good += 1
        if self.good >= self.N:
            self.scale = (self._measured(measured_next) if self.measured
                          else min(self.scale * self.growth, self.cap))
            self.good, self.left = 0, self.hysteresis

    def _measured(self, grown: Optional[float]) -> float:
        """A measured growth, taken from the updater: checked to be ``scale * growth**k``;
        None where it is not seen (the scale is not used again)."""
        if grown is None:
            return self.scale
        k = 0
        while self.scale * self.growth ** k < grown and k < 64:
            k += 1
        allowed = min(self.scale * self.growth ** k, self.cap)
        assert grown == allowed, (
            f"a measured growth from {self.scale} must reach scale * {self.growth}**k "
            f"(capped at {self.cap}), got {grown}")
        return grown


class ReferenceStep:
    """The documented step of :mod:`nnabla_mpt`'s updaters over ``model``.

    Args:
        model: The :class:`Model` the updater trains.
        opts: The case's options (see :func:`updater_kwargs`).
        comm: An mpi4py communicator for the sum over ranks, or None.
    """

    def __init__(self, model: Model, opts: dict, comm=None) -> None:
        self.model, self.opts, self.comm = model, opts, comm
        self.dtype = DTYPES[opts["precision"]]
        ceiling = FLOAT16_CEILING if self.dtype == np.float16 else 2.0 ** 127
        self.policy = ReferencePolicy(opts, ceiling)
        self.solver = NumpySolver(opts["solver"], **SOLVERS[opts["solver"]])
        self.steps = self.updates = 0
        total = opts.get("total_steps")
        self.switch_step = None if total is None else math.ceil(0.5 * total)

    def _graph(self, step: int):
        if self.switch_step is not None and step >= self.switch_step:
            return self.model.float_loss, "float", False
        return self.model.loss, self.opts["precision"], True

    def passes(self, loss, scale: float, first_batch: int):
        """Zero grads, then ``accum_grad`` x (feed, forward, backward(scale)); returns the
        gradients (float64, as produced), the losses and whether the last batch is bad."""
        for v in self.model.trained.values():
            v.grad.zero()
        losses = []
        for j in range(self.opts.get("accum_grad", 1)):
            self.model.feed(first_batch + j)
            loss.forward(clear_no_need_grad=True)
            losses.append(float(loss.d))
            loss.backward(scale, clear_buffer=True)
        x, t = self.model.batch(first_batch + j)
        bad = not (np.isfinite(x).all() and np.isfinite(t).all())
        grads = {k: np.array(v.g, dtype=np.float64) for k, v in self.model.trained.items()}
        return grads, losses, bad

    def _sum(self, values):
        """Sum over the ranks (float64); a list of floats."""
        if self.comm is None:
            return values
        return [self.comm.allreduce(v) for v in values]

    def _reduced(self, own, dtype):
        """The gradients after the all-reduce, as documented: summed over the ranks in a
        float32 buffer, divided there where ``average_ranks`` asks, then written back
        into the gradients' own ``dtype``."""
        if self.comm is None:
            return own
        reduced = {}
        for k in sorted(own):
            total = self.comm.allreduce(own[k].astype(np.float32))
            if self.opts.get("average_ranks"):
                total = total / np.float32(self.comm.size)
            with np.errstate(over="ignore"):
                reduced[k] = total.astype(dtype).astype(np.float64)
        return reduced

    def attempt(self, scale: float, first_batch: int):
        """One step at ``scale`` (the policy's, or the measured one), parameters as now:
        the :class:`Attempt`, and whether the policy is told of it (a scaled step, unless
        it was skipped with a bad batch or a non-finite loss: no scale cures those)."""
        step = self.steps
        self.steps += 1
        loss, precision, scaled = self._graph(step)
        scale = scale if scaled else 1.0
        own, losses, bad = self.passes(loss, scale, first_batch)
        summed = self._reduced(own, DTYPES[precision])
        ranks = 1 if self.comm is None else self.comm.size
        loss_mean, bad_any, loss_bad_any = self._sum(
            [float(np.mean(losses)), float(bad), float(not math.isfinite(sum(losses)))])
        result = Attempt(step, scale, precision, grads=own, loss=loss_mean / ranks)
        result.skipped = self._overflow(own, summed)
        if not result.skipped:
            result.applied = self._unscaled(summed, scale, DTYPES[precision])
            result.skipped = result.applied is None
        if result.skipped:
            result.bad_batch = bad_any > 0
        return result, scaled and not (result.skipped and (bad_any > 0 or loss_bad_any > 0))

    def _overflow(self, own, summed) -> bool:
        """inf/NaN in the summed gradients; in saturation mode also ``|g| >= 65504`` in any
        rank's own gradients (each rank checks its own before the sum), and in the sums of
        a single process (which are its own): the communicator here (MPI) sums in float32,
        which cannot saturate, so its sums are checked for inf/NaN only."""
        if self.opts.get("enable_overflow_check", True) is False:
            return False
        saturation = self.opts.get("overflow_mode") == "saturation"

        def over(grads, saturated: bool) -> bool:
            return any(not np.isfinite(g).all()
                       or (saturated and np.abs(g).max() >= FLOAT16_MAX)
                       for g in grads.values() if g.size)

        if over(summed, saturation and self.comm is None):
            return True
        return saturation and self._sum([float(over(own, True))])[0] > 0

    def _unscaled(self, summed, scale: float, dtype):
        """Unscaled, averaged and clipped gradients; None when the clip's norm is not
        finite (an overflow)."""
        # the value the backward seed held: nnabla fills it from a C float
        divisor = float(dtype(np.float32(scale)))
        if self.opts.get("average_accum"):
            divisor *= self.opts.get("accum_grad", 1)
        with np.errstate(all="ignore"):
            grads = {k: g / divisor for k, g in summed.items()}
            clip = self.opts.get("clip_grad_norm")
            if clip is not None:
                norm = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
                if not math.isfinite(norm):
                    return None
                if norm > clip:
                    grads = {k: g * (clip / norm) for k, g in grads.items()}
        return grads

    def apply(self, before: Dict[str, np.ndarray], grads):
        """Weight decay and the solver's rule from the parameters ``before``: the
        parameters after, and each one's magnitude (:class:`NumpySolver`)."""
        wd = self.opts.get("weight_decay") or 0.0
        after, magnitude = {}, {}
        with np.errstate(all="ignore"):      # unchecked gradients may be inf/NaN
            for k in sorted(grads):
                w = before[k].astype(np.float64)
                after[k], magnitude[k] = self.solver.update(
                    k, w, grads[k] + wd * w, np.abs(grads[k]) + wd * np.abs(w))
        return after, magnitude

    def call(self, recorded, first_batch: int) -> List[Attempt]:
        """The steps of one ``update()`` call from batch ``first_batch`` on. ``recorded``:
        the updater's results of this call, read only for what the reference cannot know
        (the scale ``scale="auto"`` measured, a measured growth), which is checked."""
        attempts, batch = [], first_batch
        while True:
            seen = recorded[len(attempts)] if len(attempts) < len(recorded) else None
            scale = self.policy.scale
            if scale is None:               # scale="auto": measured on this step's batch
                assert seen is not None, "the updater ran fewer steps than the reference"
                scale = seen.scale
                assert self.policy.min_scale <= scale <= self.policy.cap, (
                    f"scale='auto' measured {scale} outside [{self.policy.min_scale}, "
                    f"{self.policy.cap}]")
            result, tell = self.attempt(scale, batch)
            batch += self.opts.get("accum_grad", 1)
            if tell:
                self.policy.scale = scale
                # a measured growth is seen in next_scale unless the next step is unscaled
                grown = (seen.next_scale if seen is not None and self._graph(self.steps)[2]
                         else None)
                self.policy.update(result.skipped, grown)
            self.updates += not result.skipped
            result.next_scale = (1.0 if not self._graph(self.steps)[2] else
                                 self.policy.scale if self.policy.scale is not None
                                 else self.policy.cap)    # "auto" before it measured
            attempts.append(result)
            if not result.skipped or len(attempts) > self.opts.get("max_retries", 0):
                return attempts

"""The loss-scaling updaters: one training step, one decision.

Both updaters run the same loop (:class:`_LossScalingUpdater`); they differ only in the
policy that sets the scale.
"""
import copy
import json
import logging
import math
import os
import tempfile
import zipfile
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Literal, Mapping, Optional, Sequence

import numpy as np

import nnabla as nn
from nnabla.logger import logger

from . import _validate as check
from . import diagnosis
from ._gradsum import SquaredNorm
from .detector import SUM_CHECK_MIN_SIZE, OverflowDetector, OverflowMode, _SummedInfNanCheck
from .policy import DynamicLossScale, FixedLossScale
from .precision import PrecisionSchedule

_UPDATER_STATE_VERSION = 1
_CHECKPOINT_FORMAT = "nnabla_mpt.checkpoint"
_CHECKPOINT_VERSION = 1

FloorPolicy = Literal["raise", "warn", "ignore"]


@dataclass(frozen=True)
class StepResult:
    """What one call of ``update()`` did.

    Attributes:
        step: Index of the (last) step this call ran, counted from 0 over the updater's life.
        skipped: True when the gradients overflowed and nothing was updated.
        scale: The loss scale the step ran with.
        next_scale: The loss scale of the next step.
        attempts: Steps this call ran: 1, or more in retry mode.
        precision: ``"half"`` or ``"float"``: the precision of the graph the step ran.
    """
    step: int
    skipped: bool
    scale: float
    next_scale: float
    attempts: int = 1
    precision: str = "float"

    @property
    def updated(self) -> bool:
        """True when the solver updated the parameters."""
        return not self.skipped


def _step_result(step: int, skipped: bool, scale: float, next_scale: float, attempts: int,
                 precision: str) -> StepResult:
    """``StepResult(...)`` for the step loop, without the frozen dataclass's per-field
    ``object.__setattr__`` calls (a third of the cost); equal to the normal construction."""
    result = _new_object(StepResult)
    fields = result.__dict__
    fields["step"] = step
    fields["skipped"] = skipped
    fields["scale"] = scale
    fields["next_scale"] = next_scale
    fields["attempts"] = attempts
    fields["precision"] = precision
    return result


_new_object = object.__new__


def _check_solver(solver) -> "Dict[str, nn.Variable]":
    for attr in ("zero_grad", "update", "scale_grad", "check_inf_or_nan_grad",
                 "get_parameters", "weight_decay", "get_states", "set_states"):
        if not callable(getattr(solver, attr, None)):
            raise TypeError(f"solver must be an nnabla solver (missing method {attr!r}), "
                            f"got {type(solver).__name__}")
    params = solver.get_parameters()
    if len(params) == 0:
        raise ValueError("solver has no parameters: call solver.set_parameters(...) "
                         "before creating the updater")
    return params


def _check_loss(loss) -> "nn.Variable":
    if not isinstance(loss, nn.Variable):
        raise TypeError(f"loss must be an nnabla.Variable, got {type(loss).__name__}")
    if loss.size != 1:
        raise ValueError(f"loss must be a scalar Variable (one element), got shape "
                         f"{tuple(loss.shape)}")
    return loss


def _backend_of(loss: "nn.Variable") -> List[str]:
    """The backends (``"cpu:half"``, ...) of the function producing ``loss``; empty when
    ``loss`` is a leaf."""
    parent = loss.parent
    return [] if parent is None else list(parent.context.backend)


def _precision_of(loss: "nn.Variable") -> str:
    """``"half"`` when the function producing ``loss`` runs on a half backend."""
    backend = _backend_of(loss)
    return "half" if backend and backend[0].endswith(":half") else "float"


def _extension_of(loss: "nn.Variable") -> str:
    """The extension (``"cpu"``, ``"cudnn"``, ...) ``loss`` is computed with."""
    backend = _backend_of(loss)
    return backend[0].split(":")[0] if backend else "cpu"


def _backend_has_bfloat16(loss: "nn.Variable") -> bool:
    from nnabla.ext_utils import get_extension_context
    extension = _extension_of(loss)
    try:
        get_extension_context(extension, type_config="bfloat16")
    except (ValueError, ImportError):
        return False
    return True


def _graph_inputs(loss: "nn.Variable") -> set:
    seen = set()

    def collect(f):
        seen.update(f.inputs)  # Variables hash and compare by the underlying variable

    loss.visit(collect)
    return seen


def _make_schedule(mode, total_steps, final_loss, loss, high_precision_loss, params):
    if mode is None:
        for name, value in (("total_steps", total_steps), ("final_loss", final_loss),
                            ("high_precision_loss", high_precision_loss)):
            if value is not None:
                raise ValueError(f"{name}={value!r} needs accelerate_train_mode "
                                 f"(e.g. 'fast|step|0.9'), which is None")
        return None, None
    schedule = PrecisionSchedule(mode, total_steps=total_steps, final_loss=final_loss)
    if schedule.mode.type == "fast1" and not _backend_has_bfloat16(loss):
        raise ValueError(f"accelerate_train_mode={mode!r} asks for bfloat16 ('fast1'), but "
                         f"the backend {_extension_of(loss)!r} of this nnabla has no "
                         f"bfloat16 type; use 'fast' (float16) instead")
    if _precision_of(loss) != "half":
        raise ValueError(f"accelerate_train_mode={mode!r} needs loss built under a half "
                         f"context (get_extension_context(..., type_config='half')); the "
                         f"given loss runs in float")
    if high_precision_loss is None:
        raise ValueError(f"accelerate_train_mode={mode!r} needs high_precision_loss: the same "
                         f"network's loss built under the full-precision context")
    high_precision_loss = _check_loss(high_precision_loss)
    if _precision_of(high_precision_loss) != "float":
        raise ValueError("high_precision_loss must be built under a float context "
                         "(type_config='float'); the given one runs in half")
    used = _graph_inputs(high_precision_loss)
    missing = sorted(name for name, v in params.items() if v not in used)
    if missing:
        raise ValueError(f"high_precision_loss does not use the solver's parameters "
                         f"{missing}: build it in the same parameter scope as loss so that "
                         f"both graphs share them")
    return schedule, high_precision_loss


def _check_comm(comm):
    if comm is None:
        return None
    for attr in ("all_reduce", "size", "rank"):
        if not hasattr(comm, attr):
            raise TypeError(f"comm must be a communicator with all_reduce, size and rank "
                            f"(missing {attr!r}), got {type(comm).__name__}")
    return comm


def _use_shared_grads(shared_grads, comm, grads, precision, schedule, params) -> bool:
    """Whether the updater puts the gradients in the communicator's shared memory.

    ``None`` (auto): when the communicator offers it (``share_grads``, with more than one
    rank and the shared-memory scheme), ``grads`` is not given and the graph runs in float
    only (float16 gradients would leave the shared memory at every backward pass).
    ``True`` asks for it and raises, naming the reason, where it cannot be done. If the
    gradients do not fit in the machine's shared memory, auto logs a warning and does not
    share them.
    """
    if shared_grads is False:
        return False
    reasons = []
    if not hasattr(comm, "share_grads"):
        reasons.append(f"the communicator ({type(comm).__name__}) has no share_grads")
    elif getattr(comm, "algorithm", None) != "shared_memory":
        reasons.append(f"the communicator uses algorithm={getattr(comm, 'algorithm', None)!r}, "
                       f"not 'shared_memory'")
    if grads is not None:
        reasons.append("grads is given (the updater can only place the gradients of the "
                       "solver's parameters)")
    if precision != "float" or schedule is not None:
        reasons.append("the graph runs in float16 (nnabla writes float16 gradients into "
                       "memory of its own)")
    if shared_grads is None and (reasons or comm.size == 1):
        return False
    if not reasons:
        # collective, like share_grads itself: every rank gets here alike
        shortfall = comm.shared_memory_shortfall(list(params))
        if shortfall and shared_grads is None:
            logger.warning(f"nnabla_mpt: the gradients are not shared: {shortfall}")
            return False
        if shortfall:
            reasons.append(shortfall)
    if reasons:
        raise ValueError("shared_grads=True cannot be honoured: " + "; ".join(reasons))
    return True


def _check_grads(grads, comm) -> Optional[List["nn.NdArray"]]:
    if grads is None:
        return None
    if not isinstance(grads, (list, tuple)) or not all(isinstance(g, nn.NdArray) for g in grads):
        raise TypeError(f"grads must be None or a list of nnabla.NdArray, got {grads!r}")
    if len(grads) == 0:
        if comm is None:
            return None     # nnabla's default, spelled out: nothing to exchange
        raise ValueError("grads must not be empty when a communicator is given: grads=[] "
                         "would exchange nothing; pass grads=None to exchange the gradients "
                         "of all the solver's parameters")
    return list(grads)


def _check_monitor(monitor):
    if monitor is None or callable(monitor):
        return monitor
    hint = ""
    if hasattr(monitor, "save_path"):
        hint = (" (wrap an nnabla.monitor.Monitor in nnabla_mpt.LossScaleMonitor: "
                "monitor=LossScaleMonitor(Monitor(path), interval=100))")
    raise TypeError(f"monitor must be None or a callable taking one StepResult, got "
                    f"{monitor!r} of type {type(monitor).__name__}{hint}")


def _finite_loss(loss: "nn.Variable") -> bool:
    return bool(np.isfinite(loss.d).all())


class _NumpySquaredNorm:
    """Sum of the squared gradients read through NumPy, in float64 (non-CPU backends)."""

    def __init__(self, params: "Dict[str, nn.Variable]") -> None:
        self._params = params

    def value(self) -> float:
        total = 0.0
        for v in self._params.values():
            g = v.g.ravel().astype(np.float64)
            total += float(np.dot(g, g))
        return total


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_npz(f, arrays: Mapping[str, np.ndarray]) -> None:
    """Writes ``arrays`` to the binary file ``f`` as an ``.npz`` archive (``np.load`` reads it).

    Unlike ``np.savez``, the archive is closed even when a write fails, so a failed save
    leaves nothing half-open behind to fail again when it is garbage-collected.
    """
    with zipfile.ZipFile(f, mode="w", compression=zipfile.ZIP_STORED,
                         allowZip64=True) as archive:
        for key, value in arrays.items():
            with archive.open(f"{key}.npy", mode="w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(value), allow_pickle=False)


class _LossScalingUpdater:
    """The training step shared by every updater; see the subclasses."""

    def __init__(self, solver, loss, data_feeder, policy, *, clear_buffer, accum_grad,
                 weight_decay, comm, grads, overflow_mode, enable_overflow_check,
                 clip_grad_norm, max_retries, average_accum, average_ranks,
                 accelerate_train_mode, total_steps, final_loss, high_precision_loss,
                 floor_policy, diagnose_after, monitor, shared_grads) -> None:
        self._params = _check_solver(solver)
        self.solver = solver
        self.loss = _check_loss(loss)
        self._precision = _precision_of(self.loss)
        self.schedule, self.high_precision_loss = _make_schedule(
            accelerate_train_mode, total_steps, final_loss, self.loss, high_precision_loss,
            self._params)
        if data_feeder is not None and not callable(data_feeder):
            raise TypeError(f"data_feeder must be callable or None, got {data_feeder!r}")
        self.data_feeder = data_feeder
        self.policy = policy
        self.clear_buffer = check.boolean("clear_buffer", clear_buffer)
        self.accum_grad = check.integer("accum_grad", accum_grad, ge=1)
        self.weight_decay = (None if weight_decay is None
                             else check.real("weight_decay", weight_decay, ge=0.0))
        self.comm = _check_comm(comm)
        self.grads = _check_grads(grads, self.comm)
        self.detector = OverflowDetector(overflow_mode)
        self.enable_overflow_check = check.boolean("enable_overflow_check",
                                                   enable_overflow_check)
        self.clip_grad_norm = (None if clip_grad_norm is None
                               else check.real("clip_grad_norm", clip_grad_norm, gt=0.0))
        self.max_retries = check.integer("max_retries", max_retries, ge=0)
        self.average_accum = check.boolean("average_accum", average_accum)
        self.average_ranks = check.boolean("average_ranks", average_ranks)
        self._monitor = _check_monitor(monitor)
        self._check_overflow = self._make_overflow_check()
        self._squared_norm = None          # built on first use by _grad_norm
        self.shared_grads = None
        if shared_grads is not None:
            check.boolean("shared_grads", shared_grads)
            if shared_grads and self.comm is None:
                raise ValueError("shared_grads=True needs a communicator (comm=...): the "
                                 "gradients are placed in the communicator's shared memory")
        if self.comm is not None:
            # [overflow flag, loss, non-finite loss flag] travel in the gradients' buffer:
            # one collective a step.
            flag = nn.Variable((3,))
            placed = list(self._params.values()) + [flag]
            if _use_shared_grads(shared_grads, self.comm, self.grads, self._precision,
                                 self.schedule, placed):
                self.shared_grads = self.comm.share_grads(placed)
                self._reduce_list = self.shared_grads.arrays   # kept current by its zero()
            else:
                self._reduce_list = list(self.grads if self.grads is not None
                                         else (v.grad for v in self._params.values()))
                self._reduce_list.append(flag.grad)
        self.steps = 0
        self.updates = 0
        self.skipped_steps = 0
        self.overflow_streak = 0
        self.longest_overflow_streak = 0
        self.last_result: Optional[StepResult] = None
        self.floor_policy = check.choice("floor_policy", floor_policy,
                                         ("raise", "warn", "ignore"))
        self.diagnose_after = check.integer("diagnose_after", diagnose_after, ge=1)
        self.last_report: Optional[diagnosis.OverflowReport] = None
        # A streak is diagnosed once by its length, and reported (raise/warn) at most once.
        self._streak_diagnosed = self._streak_reported = False

    # -- the scale ---------------------------------------------------------------------
    @property
    def scale(self) -> float:
        """The loss scale of the next step (1 once a precision schedule switched to full
        precision). Assigning it is checked by the policy."""
        if self.schedule is not None and not self.schedule.reduced(self.steps):
            return 1.0
        return self.policy.get_loss_scale()

    @scale.setter
    def scale(self, value: float) -> None:
        self.policy.set_loss_scale(value)

    @property
    def monitor(self) -> Optional[Callable[[StepResult], Any]]:
        """The step hook given as ``monitor=``, called with every step's result, or None."""
        return self._monitor

    @property
    def precision(self) -> str:
        """``"half"`` or ``"float"``: the precision the next step runs in."""
        if self.schedule is not None and not self.schedule.reduced(self.steps):
            return "float"
        return self._precision

    # -- the step ----------------------------------------------------------------------
    def update(self) -> StepResult:
        """Runs one training step, or skips it when the gradients overflowed.

        zero grads → ``accum_grad`` × (feed, forward, backward with the scale) → all-reduce
        (with a communicator) → overflow check → unscale, clip, weight decay,
        ``solver.update()``; or, on overflow, leave parameters and solver states untouched
        and adjust the scale. In retry mode (``max_retries > 0``) a skipped step is followed
        by up to ``max_retries`` more steps on new batches; the call returns at the first
        one that updates, or after the last one.

        Returns:
            StepResult: whether the step was skipped and the scale it ran with.
        """
        result = self._step(1)
        attempts = 1
        while result.skipped and attempts <= self.max_retries:
            attempts += 1
            result = self._step(attempts)
        return result

    def _step(self, attempts: int) -> StepResult:
        index = self.steps
        schedule = self.schedule
        if schedule is None or schedule.reduced(index):
            loss, scale, precision = self.loss, self.policy.get_loss_scale(), self._precision
        else:
            # Full precision after the switch: no scaling, the overflow check stays.
            loss, scale, precision = self.high_precision_loss, 1.0, "float"
            if index == schedule.switch_step:
                logger.info(f"nnabla_mpt: precision schedule {schedule.mode.text!r}: "
                            f"{schedule.describe_switch()}")
        watch_loss = schedule is not None and schedule.needs_loss
        # With accumulation, a non-finite loss in any micro-batch must be seen, so each
        # micro-batch's loss is read; with one micro-batch it is read on overflow only.
        read_losses = watch_loss or (self.accum_grad > 1 and self.enable_overflow_check)
        loss_sum = 0.0
        solver = self.solver
        if self.shared_grads is None:
            solver.zero_grad()
        else:
            self.shared_grads.zero()
        for _ in range(self.accum_grad):
            if self.data_feeder is not None:
                self.data_feeder()
            loss.forward(clear_no_need_grad=self.clear_buffer)
            if read_losses:
                loss_sum += float(loss.d)
            loss.backward(scale, clear_buffer=self.clear_buffer)

        overflow = False
        loss_value = loss_sum / self.accum_grad
        loss_nonfinite = False
        if self.comm is not None:
            local = self.enable_overflow_check and self._check_overflow()
            bad_loss = local and not self._losses_finite(loss, read_losses, loss_sum)
            flags = self._reduce_list[-1]
            flags.data = np.array([1.0 if local else 0.0, loss_value,
                                   1.0 if bad_loss else 0.0], dtype=np.float32)
            self.comm.all_reduce(self._reduce_list, division=False, inplace=True)
            flag, loss_total, bad_losses = (float(x) for x in flags.data)
            # Every rank decides on the same reduced values, so all take the same branch.
            overflow = self.enable_overflow_check and (flag > 0.0 or self._check_overflow())
            loss_nonfinite = overflow and bad_losses > 0.0
            loss_value = loss_total / self.comm.size
        elif self.enable_overflow_check:
            overflow = self._check_overflow()
            loss_nonfinite = overflow and not self._losses_finite(loss, read_losses, loss_sum)
        scaled = precision != "float" or schedule is None
        at_floor = overflow and scaled and self.policy.at_min_scale    # read on overflow only
        # A non-finite loss is no overflow: a smaller scale cannot fix it, so it keeps the scale.
        if scaled and not loss_nonfinite:
            self.policy.update(overflow)

        self.steps += 1
        if overflow:
            self.skipped_steps += 1
            self.overflow_streak += 1
            self.longest_overflow_streak = max(self.longest_overflow_streak,
                                               self.overflow_streak)
        else:
            self.overflow_streak = 0
            self._apply(scale)
            self.updates += 1
        if watch_loss and math.isfinite(loss_value):
            schedule.observe_loss(index, loss_value)
        result = _step_result(index, overflow, scale,
                              self.policy.get_loss_scale() if schedule is None else self.scale,
                              attempts, precision)
        self.last_result = result
        if self._monitor is not None:
            self._monitor(result)
        if overflow:
            self._on_overflow(index, scale, loss, at_floor, loss_nonfinite)
        return result

    @staticmethod
    def _losses_finite(loss: "nn.Variable", read: bool, loss_sum: float) -> bool:
        """Whether every micro-batch's loss was finite (called on overflow steps only)."""
        return math.isfinite(loss_sum) if read else _finite_loss(loss)

    def _make_overflow_check(self) -> Callable[[], bool]:
        """The overflow check of the solver's gradients (before and after the all-reduce).

        The detector's check; in inf/NaN mode that is the solver's own test, called
        directly. For a float32 CPU graph in inf/NaN mode with large gradient arrays, the same
        decision is made with a sum over those arrays, several times faster than the
        solver's element-wise test (see ``detector._SummedInfNanCheck``).
        """
        solver, detector = self.solver, self.detector
        if detector.mode != "inf_nan":
            return lambda: detector.check(solver)
        if (self.schedule is None and _backend_of(self.loss) == ["cpu:float"]
                and any(v.size >= SUM_CHECK_MIN_SIZE for v in self._params.values())):
            return _SummedInfNanCheck(self._params)
        return solver.check_inf_or_nan_grad

    def _unscale_factor(self, scale: float) -> float:
        divisor = scale
        if self.average_accum:
            divisor *= self.accum_grad
        if self.average_ranks and self.comm is not None:
            divisor *= self.comm.size
        return 1.0 / divisor

    def _grad_norm(self) -> float:
        """Global L2 norm of the (still scaled) gradients of all the solver's parameters."""
        if self._squared_norm is None:
            if _extension_of(self.loss) == "cpu":
                # One prebuilt graph instead of one NumPy read per parameter.
                self._squared_norm = SquaredNorm(list(self._params.values()))
            else:
                self._squared_norm = _NumpySquaredNorm(self._params)
        return math.sqrt(self._squared_norm.value())

    def _apply(self, scale: float) -> None:
        factor = self._unscale_factor(scale)
        if self.clip_grad_norm is not None:
            norm = self._grad_norm() * factor
            if norm > self.clip_grad_norm:
                factor *= self.clip_grad_norm / norm
        if factor != 1.0:
            self.solver.scale_grad(factor)
        if self.weight_decay is not None:
            self.solver.weight_decay(self.weight_decay)
        self.solver.update()

    def _on_overflow(self, index: int, scale: float, loss: "nn.Variable", at_floor: bool,
                     loss_nonfinite: bool) -> None:
        """After a skipped step: log it; on a collapse, diagnose and act by floor_policy."""
        if logger.isEnabledFor(logging.DEBUG):
            bad = len(self.detector.nonfinite_params(self._params))
            what = "non-finite" if self.detector.mode == "inf_nan" else "saturated"
            logger.debug(f"nnabla_mpt: step {index} skipped: {bad} of {len(self._params)} "
                         f"parameter gradients {what}; loss scale {scale:g} -> "
                         f"{self.scale:g}" + (" (kept: the loss itself is non-finite)"
                                              if loss_nonfinite else ""))
        if self.overflow_streak == 1:
            self._streak_diagnosed = self._streak_reported = False
        if self.floor_policy == "ignore" or self._streak_reported:
            return
        if at_floor:
            reason = f"overflow at the minimum loss scale {scale:g}"
        elif self.overflow_streak >= self.diagnose_after and not self._streak_diagnosed:
            reason = f"{self.overflow_streak} consecutive overflowing steps"
        else:
            return
        self._streak_diagnosed = True
        report = diagnosis.diagnose(loss, scale, self._params)
        if loss_nonfinite:
            report.notes.append(
                f"step {index} had a non-finite loss: the updater skipped it without "
                "lowering the loss scale.")
        self.last_report = report
        pure_overflow = report.kind == "overflow"
        if self.comm is not None:
            pure_overflow = self._agree_on_diagnosis(report)
        if (pure_overflow and isinstance(self.policy, DynamicLossScale)
                and not self.policy.at_min_scale):
            # Pure overflow while the scale can still back off: the policy is doing its
            # job (e.g. an initial scale far too high); the floor will call again if not.
            where = (f"{report.function} in backward" if report.kind == "overflow"
                     else "on another rank's batch")
            logger.info(f"nnabla_mpt: {reason}: the gradients overflow only because of the "
                        f"scale ({where}); it keeps backing off, now {self.scale:g}")
            return
        self._streak_reported = True
        if self.floor_policy == "raise":
            raise diagnosis.LossScaleCollapseError(report, reason)
        logger.warning(f"nnabla_mpt: loss scale collapse ({reason}); training goes on "
                       f"skipping these steps (floor_policy='warn').\n{report}")

    def _agree_on_diagnosis(self, report: "diagnosis.OverflowReport") -> bool:
        """Whether the collapse is a pure overflow, decided alike on every rank.

        Each rank replays only its own batch, so the reports differ when one rank's data
        caused the overflow; acting on them separately would make some ranks raise while
        the others wait in the next all-reduce. One extra all-reduce (on this rare path
        only) combines them: pure overflow when some rank reproduced an overflow that a
        smaller scale fixes and no rank found a data or model problem.
        """
        votes = nn.NdArray((2,))
        votes.data = np.array([report.kind == "overflow", report.kind in ("data", "model")],
                              dtype=np.float32)
        self.comm.all_reduce([votes], division=False, inplace=True)
        overflow_votes, problem_votes = (float(v) for v in votes.data)
        if report.kind == "not_reproduced" and (overflow_votes > 0 or problem_votes > 0):
            report.notes.append(
                f"{int(overflow_votes + problem_votes)} other rank(s) reproduced the "
                "non-finite gradients on their own batches; their reports name the function.")
        return overflow_votes > 0 and problem_votes == 0

    # -- state -------------------------------------------------------------------------
    _COUNTERS = ("steps", "updates", "skipped_steps", "overflow_streak",
                 "longest_overflow_streak")

    def state_dict(self) -> Dict[str, Any]:
        """The updater's whole state as plain Python values, versioned.

        Holds the policy's state (scale, counters, bounds) and the updater's counters.
        Parameters and solver states are not included: :meth:`save_checkpoint` writes all
        three together.
        """
        state = {"version": _UPDATER_STATE_VERSION, "updater": type(self).__name__,
                 "policy": self.policy.state_dict(),
                 "precision": None if self.schedule is None else self.schedule.state_dict()}
        state.update({name: getattr(self, name) for name in self._COUNTERS})
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores what :meth:`state_dict` returned; all or nothing.

        Raises:
            ValueError: keys are missing or unknown (the message lists them), the version
                or the updater type differs, or a value is out of range.
        """
        counters = self._check_state(state)
        self.policy.load_state_dict(state["policy"])
        if self.schedule is not None:
            self.schedule.load_state_dict(state["precision"])
        for name, value in counters.items():
            setattr(self, name, value)

    def _check_state(self, state: Mapping[str, Any]) -> Dict[str, int]:
        """Checks ``state`` completely, without changing anything; returns the counters."""
        check.exact_keys("state", state,
                         ("version", "updater", "policy", "precision") + self._COUNTERS)
        check.version("state", state, _UPDATER_STATE_VERSION)
        if state["updater"] != type(self).__name__:
            raise ValueError(f"state was saved by {state['updater']}, cannot load it into "
                             f"{type(self).__name__}")
        counters = {name: check.integer(f"state[{name!r}]", state[name], ge=0)
                    for name in self._COUNTERS}
        if (state["precision"] is None) != (self.schedule is None):
            mine = None if self.schedule is None else self.schedule.mode.text
            raise ValueError(f"state has precision schedule {state['precision']!r} but this "
                             f"updater has {mine!r}")
        copy.copy(self.policy).load_state_dict(state["policy"])
        if self.schedule is not None:
            copy.copy(self.schedule).load_state_dict(state["precision"])
        return counters

    def save_checkpoint(self, path: str) -> None:
        """Writes parameters, solver states and updater state to ``path`` atomically.

        The file is written next to ``path`` under a temporary name, flushed to disk and then
        renamed over ``path``: a crash leaves either the previous checkpoint or the new one,
        never a partial file. The format is a NumPy ``.npz`` archive.
        """
        arrays: Dict[str, np.ndarray] = {}
        for name, v in self._params.items():
            arrays[f"param/{name}"] = np.array(v.d, copy=True)
        solver_meta = {}
        for name, st in self.solver.get_states().items():
            solver_meta[name] = {"t": int(st.t), "keys": sorted(st.pstate)}
            for key, var in st.pstate.items():
                arrays[f"solver/{name}/{key}"] = np.array(var.d, copy=True)
        meta = {"format": _CHECKPOINT_FORMAT, "version": _CHECKPOINT_VERSION,
                "updater": self.state_dict(), "solver": solver_meta,
                "params": list(self._params)}
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)

        path = os.fspath(path)
        directory = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".npz", dir=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                _write_npz(f, arrays)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        _fsync_dir(directory)

    def load_checkpoint(self, path: str) -> None:
        """Restores what :meth:`save_checkpoint` wrote: parameters, solver states, state.

        Everything is read and checked before anything is changed.

        Raises:
            ValueError: the file is not a checkpoint of this format, or its parameters,
                solver states or updater state do not match this updater (the message lists
                the names). Nothing is changed then.
        """
        path = os.fspath(path)
        with np.load(path, allow_pickle=False) as archive:
            if "meta" not in archive.files:
                raise ValueError(f"{path!r} is not an nnabla_mpt checkpoint (no metadata)")
            meta = json.loads(archive["meta"].tobytes().decode("utf-8"))
            data = {k: archive[k] for k in archive.files if k != "meta"}
        if meta.get("format") != _CHECKPOINT_FORMAT or meta.get("version") != _CHECKPOINT_VERSION:
            raise ValueError(f"{path!r} is not an nnabla_mpt checkpoint of version "
                             f"{_CHECKPOINT_VERSION}: format={meta.get('format')!r}, "
                             f"version={meta.get('version')!r}")
        check.exact_keys(f"parameters in {path!r}", {k: None for k in meta["params"]},
                         self._params)
        shapes = [(f"param/{name}", v.shape) for name, v in self._params.items()]
        states = self.solver.get_states()
        check.exact_keys(f"solver states in {path!r}", meta["solver"], states)
        for name, st in states.items():
            check.exact_keys(f"solver state {name!r} in {path!r}",
                             {k: None for k in meta["solver"][name]["keys"]}, st.pstate)
            shapes += [(f"solver/{name}/{key}", var.shape) for key, var in st.pstate.items()]
        wrong = [f"{key}: {tuple(data[key].shape)} in the file, {tuple(shape)} here"
                 for key, shape in shapes if tuple(data[key].shape) != tuple(shape)]
        if wrong:
            raise ValueError(f"arrays in {path!r} do not match the solver's shapes: "
                             f"{'; '.join(wrong)}")
        self._check_state(meta["updater"])

        for name, v in self._params.items():
            v.d = data[f"param/{name}"]
        for name, st in states.items():
            for key, var in st.pstate.items():
                var.d = data[f"solver/{name}/{key}"]
            st.t = meta["solver"][name]["t"]
        self.solver.set_states(states)
        self.load_state_dict(meta["updater"])


def _compat_policy_args(scale, scaling_factor, N, backoff_factor, hysteresis, min_scale,
                        max_scale) -> DynamicLossScale:
    init_scale = check.real("scale", scale, gt=0.0)
    growth = check.real("scaling_factor", scaling_factor, gt=1.0)
    N = check.integer("N", N, ge=1)
    if backoff_factor is None:
        backoff_factor = 1.0 / growth
    lo = check.real("min_scale", min_scale, gt=0.0)
    hi = check.real("max_scale", max_scale, gt=0.0)
    if lo > hi:
        raise ValueError(f"min_scale must be <= max_scale, got min_scale={min_scale!r} and "
                         f"max_scale={max_scale!r}")
    if not lo <= init_scale <= hi:
        raise ValueError(f"scale must lie in [min_scale, max_scale] = [{lo:g}, {hi:g}], "
                         f"got scale={scale!r}")
    return DynamicLossScale(init_scale=init_scale, growth_factor=growth,
                            backoff_factor=backoff_factor, growth_interval=N,
                            hysteresis=hysteresis, min_scale=lo, max_scale=hi)


class DynamicLossScalingUpdater(_LossScalingUpdater):
    """Mixed-precision training step with a dynamic loss scale.

    A drop-in replacement for
    ``nnabla.experimental.mixed_precision_training.DynamicLossScalingUpdater``: the
    positional arguments are the same; every new option is keyword-only. Differences: an
    overflowing step is skipped and reported instead of retried recursively; the scale grows
    after exactly ``N`` consecutive good steps; it stays within ``[min_scale, max_scale]``;
    the state can be saved; ``grads`` defaults to all of the solver's gradients.

    Args:
        solver: An nnabla solver with its parameters set.
        loss: The scalar loss Variable.
        data_feeder: Called with no arguments before every forward to load the next batch
            into the input Variables; None when the inputs are already filled.
        scale: The initial loss scale.
        scaling_factor: Growth factor of the scale (> 1).
        N: Consecutive good steps before the scale grows by ``scaling_factor``.
        clear_buffer: Free intermediate buffers during forward and backward.
        accum_grad: Forward/backward passes whose gradients are summed per update.
        weight_decay: Weight decay applied to the unscaled gradients, or None.
        comm: A communicator (``MPICommunicator``, or nnabla's
            ``MultiProcessDataParallelCommunicator``) for data-parallel training, or None.
        grads: Gradients to all-reduce; None means those of all the solver's parameters.
        backoff_factor: Factor applied to the scale on overflow; default
            ``1 / scaling_factor``.
        hysteresis: Overflows tolerated before the scale backs off (see
            :class:`DynamicLossScale`).
        min_scale: Lower bound of the scale.
        max_scale: Upper bound of the scale.
        overflow_mode: ``"inf_nan"`` or ``"saturation"`` (see :class:`OverflowDetector`).
        clip_grad_norm: Clip the unscaled gradients to this global L2 norm, or None.
        max_retries: Retry mode: after a skipped step, run up to this many more steps on new
            batches within the same ``update()`` call. 0 (default) returns the skipped step.
        average_accum: Divide the accumulated gradients by ``accum_grad`` (default: sum, as
            nnabla's updater does).
        average_ranks: Divide the reduced gradients by the number of processes (default:
            sum, as nnabla's updater does).
        accelerate_train_mode: Precision schedule ``"TYPE|TRIGGER|VALUE"``, e.g.
            ``"fast|step|0.9"``: reduced precision (``loss``) first, then full precision
            (``high_precision_loss``, run with scale 1 and the overflow check kept). See
            :mod:`nnabla_mpt.precision`.
        total_steps: Total steps of the run, for the ``step`` trigger.
        final_loss: Target loss of the run, for the ``loss`` trigger.
        high_precision_loss: The same network's loss built under the float context, sharing
            the parameters of ``loss``.
        floor_policy: What to do when the loss scale collapses, i.e. when the overflow
            streak reaches ``diagnose_after`` or a step overflows at ``min_scale``: the
            updater replays the last batch with :func:`nnabla_mpt.diagnosis.diagnose` and
            ``"raise"`` (default) raises
            :class:`~nnabla_mpt.diagnosis.LossScaleCollapseError` carrying the report;
            ``"warn"`` logs the report once (``logger.warning``) and keeps skipping;
            ``"ignore"`` does neither (and runs no diagnosis). The report is kept in
            :attr:`last_report`. A streak is reported at most once. A streak whose report
            says ``kind="overflow"`` (the batch is finite at a smaller scale) while the
            scale can still back off is no collapse: it is logged at info level and
            training goes on; if the scale then reaches ``min_scale`` the floor triggers.
            A step whose loss itself is non-finite is skipped and counted without
            lowering the scale (the policy is not updated for it).
        diagnose_after: Consecutive overflowing steps that trigger the diagnosis (>= 1).
            A single overflow is only skipped and counted.
        monitor: A step hook: any callable, called once per step (after the step is
            complete) with its :class:`StepResult`, e.g. a :class:`LossScaleMonitor` or a
            :class:`LossScaleCallback`. None (default) costs one attribute test per step.
        shared_grads: Put the gradients of the solver's parameters in the communicator's
            shared memory (:meth:`MPICommunicator.share_grads`), so that the step's
            all-reduce copies nothing, and zero them there instead of with
            ``solver.zero_grad()``. ``None`` (default): do so when ``comm`` offers it with
            more than one rank and the shared-memory scheme, ``grads`` is None and the
            graph runs in float only, and the gradients fit in the machine's shared memory
            (a warning says when they do not); ``True``: require it (``ValueError``
            naming the reason where it cannot be done); ``False``: never.

    Attributes:
        shared_grads: The :class:`~nnabla_mpt.SharedGradients` in use, or None.
        last_report: The :class:`~nnabla_mpt.diagnosis.OverflowReport` of the last
            diagnosis, or None.

    Example:
        >>> import numpy as np, nnabla as nn, nnabla.functions as F
        >>> import nnabla.parametric_functions as PF, nnabla.solvers as S
        >>> from nnabla_mpt import DynamicLossScalingUpdater
        >>> nn.clear_parameters()
        >>> x = nn.Variable.from_numpy_array(np.ones((4, 3), dtype=np.float32))
        >>> loss = F.mean(PF.affine(x, 1, name="fc") ** 2)
        >>> solver = S.Sgd(0.1)
        >>> solver.set_parameters(nn.get_parameters())
        >>> updater = DynamicLossScalingUpdater(solver, loss, scale=8.0, N=2)
        >>> step = updater.update()
        >>> step.skipped, step.scale
        (False, 8.0)
    """

    def __init__(self, solver, loss, data_feeder: Optional[Callable[[], Any]] = None,
                 scale: float = 8.0, scaling_factor: float = 2.0, N: int = 2000,
                 clear_buffer: bool = True, accum_grad: int = 1,
                 weight_decay: Optional[float] = None, comm=None,
                 grads: Optional[Sequence["nn.NdArray"]] = None, *,
                 backoff_factor: Optional[float] = None, hysteresis: int = 1,
                 min_scale: float = 1.0, max_scale: float = 2.0 ** 24,
                 overflow_mode: OverflowMode = "inf_nan",
                 clip_grad_norm: Optional[float] = None, max_retries: int = 0,
                 average_accum: bool = False, average_ranks: bool = False,
                 accelerate_train_mode: Optional[str] = None,
                 total_steps: Optional[int] = None, final_loss: Optional[float] = None,
                 high_precision_loss: Optional["nn.Variable"] = None,
                 floor_policy: FloorPolicy = "raise", diagnose_after: int = 8,
                 monitor: Optional[Callable[[StepResult], Any]] = None,
                 shared_grads: Optional[bool] = None) -> None:
        policy = _compat_policy_args(scale, scaling_factor, N, backoff_factor, hysteresis,
                                     min_scale, max_scale)
        super().__init__(solver, loss, data_feeder, policy, clear_buffer=clear_buffer,
                         accum_grad=accum_grad, weight_decay=weight_decay, comm=comm,
                         grads=grads, overflow_mode=overflow_mode,
                         enable_overflow_check=True, clip_grad_norm=clip_grad_norm,
                         max_retries=max_retries, average_accum=average_accum,
                         average_ranks=average_ranks,
                         accelerate_train_mode=accelerate_train_mode, total_steps=total_steps,
                         final_loss=final_loss, high_precision_loss=high_precision_loss,
                         floor_policy=floor_policy, diagnose_after=diagnose_after,
                         monitor=monitor, shared_grads=shared_grads)

    @property
    def scaling_factor(self) -> float:
        """Growth factor of the scale."""
        return self.policy.growth_factor

    @property
    def N(self) -> int:
        """Consecutive good steps before the scale grows."""
        return self.policy.growth_interval


class FixedLossScalingUpdater(_LossScalingUpdater):
    """Mixed-precision training step with a constant loss scale.

    With ``enable_overflow_check=True`` (default) an overflowing step is skipped and the
    scale stays. With ``enable_overflow_check=False`` no check runs and the parameters are
    always updated, for networks whose overflow is harmless (clipped or masked later).

    Args:
        solver: An nnabla solver with its parameters set.
        loss: The scalar loss Variable.
        data_feeder: Called with no arguments before every forward, or None.
        scale: The loss scale; ``>= 1``.
        enable_overflow_check: Skip steps whose gradients overflowed.
        clear_buffer: As for :class:`DynamicLossScalingUpdater`.
        accum_grad: As for :class:`DynamicLossScalingUpdater`.
        weight_decay: As for :class:`DynamicLossScalingUpdater`.
        comm: As for :class:`DynamicLossScalingUpdater`.
        grads: As for :class:`DynamicLossScalingUpdater`.
        **options: The keyword-only options of :class:`DynamicLossScalingUpdater` that do not
            concern a dynamic scale: ``overflow_mode``, ``clip_grad_norm``, ``max_retries``,
            ``average_accum``, ``average_ranks``, ``accelerate_train_mode``, ``total_steps``,
            ``final_loss``, ``high_precision_loss``, ``monitor``, ``floor_policy``,
            ``diagnose_after`` (a fixed scale has no floor: only the overflow streak
            triggers the diagnosis), ``shared_grads``.
    """

    def __init__(self, solver, loss, data_feeder: Optional[Callable[[], Any]] = None,
                 scale: float = 128.0, enable_overflow_check: bool = True,
                 clear_buffer: bool = True, accum_grad: int = 1,
                 weight_decay: Optional[float] = None, comm=None,
                 grads: Optional[Sequence["nn.NdArray"]] = None, *,
                 overflow_mode: OverflowMode = "inf_nan",
                 clip_grad_norm: Optional[float] = None, max_retries: int = 0,
                 average_accum: bool = False, average_ranks: bool = False,
                 accelerate_train_mode: Optional[str] = None,
                 total_steps: Optional[int] = None, final_loss: Optional[float] = None,
                 high_precision_loss: Optional["nn.Variable"] = None,
                 floor_policy: FloorPolicy = "raise", diagnose_after: int = 8,
                 monitor: Optional[Callable[[StepResult], Any]] = None,
                 shared_grads: Optional[bool] = None) -> None:
        policy = FixedLossScale(scale)
        enable_overflow_check = check.boolean("enable_overflow_check", enable_overflow_check)
        if max_retries and not enable_overflow_check:
            raise ValueError(f"max_retries={max_retries!r} needs enable_overflow_check=True: "
                             f"without the check no step is ever skipped")
        super().__init__(solver, loss, data_feeder, policy, clear_buffer=clear_buffer,
                         accum_grad=accum_grad, weight_decay=weight_decay, comm=comm,
                         grads=grads, overflow_mode=overflow_mode,
                         enable_overflow_check=enable_overflow_check,
                         clip_grad_norm=clip_grad_norm, max_retries=max_retries,
                         average_accum=average_accum, average_ranks=average_ranks,
                         accelerate_train_mode=accelerate_train_mode, total_steps=total_steps,
                         final_loss=final_loss, high_precision_loss=high_precision_loss,
                         floor_policy=floor_policy, diagnose_after=diagnose_after,
                         monitor=monitor, shared_grads=shared_grads)

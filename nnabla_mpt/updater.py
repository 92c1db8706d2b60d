"""The loss-scaling updaters: one training step, one decision.

One call of ``update()`` runs the step (:meth:`_LossScalingUpdater.update`)::

    zero the gradients
    accum_grad times: feed a batch, forward (with outputs=), backward with
                  the loss scale                                           step/step_loss.py
    decide:       all-reduce (with a communicator), check for overflow distributed/agreement.py
                  unscale, clip; a gradient norm not finite is an overflow   step/unscale.py
    good step:    weight decay, the scheduled learning rate, solver.update() step/unscale.py
    skipped step: parameters and solver states stay as they are
    tell the policy: the scale backs off or grows (measured growth:
                  from the history of watched passes)     scale/policy.py, scale/measured.py
    after a skip: on a collapse, diagnose and act by floor_policy           step/collapse.py

Settings a script changes between steps take effect from the next step
(:mod:`nnabla_mpt.settings`).

Both updaters run this loop; they differ in the policy that sets the scale and in their
arguments (``options.DYNAMIC``, ``options.FIXED``). Checkpoint files are written and read
by :mod:`nnabla_mpt.files.checkpoint`; what a valid updater state is,
:mod:`nnabla_mpt.updater_state` says.
"""
import math
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Mapping, Optional

import nnabla as nn
from nnabla.logger import logger

from . import options, settings, updater_state
from .core import graph
from .core.dtypes import FloatType
from .diagnosis.watch import RangeWatch
from .distributed import abort, agreement
from .files import checkpoint
from .scale.gradient_stats import GradientStats
from .scale.measured import ScaleMeter
from .scale.seed import BackwardSeed
from .settings import DynamicSettings, UpdaterSettings
from .step.collapse import CollapseAttributes, CollapseWatch
from .step.detector import BatchCheck, OverflowDetector, overflow_check
from .step.feeder import DataFeeder
from .step.step_loss import LossRecorder, StepLosses
from .step.unscale import Unscaler


@dataclass(frozen=True, init=False)
class StepResult:
    """What one call of ``update()`` did.

    Attributes:
        step: Index of the (last) step this call ran, counted from 0 over the updater's life.
        skipped: True when nothing was updated: the gradients overflowed (or the batch
            held inf/NaN, see ``bad_batch``). The gradients decide: a loss that is inf/NaN
            while the gradients are finite does not skip the step.
        scale: The loss scale the step ran with, the policy's. The backward pass's seed
            holds it rounded to the loss's dtype (3000.7 is 3000.0 in float16,
            :func:`~nnabla_mpt.seed.held_scale`), and the gradients are divided by
            that held value.
        next_scale: The loss scale of the next step.
        attempts: Steps this call ran: 1, or more in retry mode.
        precision: ``"half"`` or ``"float"``: the precision of the graph the step ran.
        gradient_stats: On the steps ``gradient_stats_every`` asks for, each parameter's
            name mapped to its gradient's :class:`~nnabla_mpt.GradientStats` as the
            backward pass produced them (scaled, in the graph's dtype, before any
            all-reduce); None on other steps.
        bad_batch: True when the step was skipped because its batch (on some rank) held
            inf/NaN: no overflow, the scale is kept (see ``updater.bad_batches``).
    """
    step: int
    skipped: bool
    scale: float
    next_scale: float
    attempts: int
    precision: str
    gradient_stats: Optional[Dict[str, GradientStats]]
    bad_batch: bool
    _losses: Optional[StepLosses] = field(repr=False, compare=False)

    def __init__(self, step: int, skipped: bool, scale: float, next_scale: float,
                 attempts: int = 1, precision: str = "float",
                 gradient_stats: Optional[Dict[str, GradientStats]] = None,
                 bad_batch: bool = False, _losses: Optional[StepLosses] = None) -> None:
        # frozen: all set here, at once (a generated __init__ costs ~60 bytecodes a step)
        vars(self).update(step=step, skipped=skipped, scale=scale, next_scale=next_scale,
                          attempts=attempts, precision=precision,
                          gradient_stats=gradient_stats, bad_batch=bad_batch, _losses=_losses)

    @property
    def updated(self) -> bool:
        """True when the solver updated the parameters."""
        return not self.skipped

    @property
    def loss(self) -> float:
        """The step's loss, before scaling: the mean over its micro-batches (and over the
        ranks, with a communicator; summed in float32 there), where ``loss.d`` holds only
        the last micro-batch's; inf/NaN where a forward pass overflowed, also on a step
        that updated (its gradients were finite). Read when first asked for (a host read,
        which training does not pay for otherwise); until the next ``update()`` the last
        micro-batch's value is the loss Variable's own array, so read it before running a
        forward pass of that Variable yourself. NaN in a result built by hand."""
        return math.nan if self._losses is None else self._losses.mean()


class _LossScalingUpdater(CollapseAttributes, UpdaterSettings, updater_state.StepCounters):
    """The training step shared by every updater; see the subclasses. The attributes of
    the collapse handling (``floor_policy``, ``overflow_streak``, ``bad_batches``, ...)
    come from :class:`~nnabla_mpt.step.collapse.CollapseAttributes`.

    Args:
        solver, loss: As the updaters take them.
        make_policy: ``dtype -> policy``: the loss-scale policy, given the
            :class:`~nnabla_mpt.core.dtypes.FloatType` of the loss, whose values bound the
            scales ``loss.backward(scale)`` can seed.
        values: The checked values of the updater's options (``UpdaterSignature.bind``).
    """

    #: The feeder given as ``data_feeder=``; may be replaced (checked again).
    data_feeder = DataFeeder()

    def __init__(self, solver, loss, make_policy: Callable[[FloatType], Any],
                 values: Mapping[str, Any]) -> None:
        self._params = options.solver_parameters(solver)
        self._solver = solver
        self._loss = options.trained_loss(loss, self._params)
        self._precision = graph.precision_of(self.loss)
        self.schedule, self._high_precision_loss = options.precision_schedule(
            values, self.loss, self._params)
        graphs = [v for v in (self.loss, self.high_precision_loss) if v is not None]
        self._passes = {id(v): (LossRecorder(v, values["accum_grad"], values["outputs"]),
                                BackwardSeed(v)) for v in graphs}
        self._dtype = graph.float_type_of(self.loss)
        self.policy = policy = make_policy(self._dtype)
        self.data_feeder = values["data_feeder"]
        self._clear_buffer = values["clear_buffer"]
        self._accum_grad = values["accum_grad"]
        self._comm = abort.updater_comm(values["comm"], values["abort_on_exception"])
        self._grads = options.exchanged_grads(values, self._params)
        self.detector = OverflowDetector(values["overflow_mode"])
        self._enable_overflow_check = values.get("enable_overflow_check", True)
        self._max_retries = values["max_retries"]
        self._average_accum = values["average_accum"]
        self._average_ranks = values["average_ranks"]
        self._monitor, self._options = values["monitor"], values
        batch = BatchCheck([self.loss, self.high_precision_loss], self._params)
        self._decider, self._shared_grads = _decider(
            self, values["shared_grads"], batch,
            options.backward_reduction(values, graphs, self._params))
        self._in_backward = self._decider.in_backward
        self._zero_grads = (solver.zero_grad if self.shared_grads is None
                            else self.shared_grads.zero)
        self._unscaler = Unscaler(solver, self._params, graph.float_context(self.loss),
                                  self.accum_grad if self.average_accum else 1,
                                  values["clip_grad_norm"], values["weight_decay"],
                                  values["lr_scheduler"])
        self._collapse = CollapseWatch(values["floor_policy"], values["diagnose_after"],
                                       self._params, self.detector, policy,
                                       self._decider.agree_on_diagnosis, batch)
        self._meter = ScaleMeter(self.loss, self._params, policy, self._decider.gather,
                                 values["gradient_stats_every"], values["scale"] == "auto",
                                 _reduced_dtype(self._decider, self._dtype.name))
        self.steps = self.updates = self.skipped_steps = 0
        self.last_result: Optional[StepResult] = None
        # One update() at a time: a caller takes the token (list.pop() is atomic under the
        # GIL), and a second one finds none.
        self._idle = [True]

    # -- the scale and what the step runs -----------------------------------------------
    @property
    def scale(self) -> float:
        """The loss scale of the next step (1 once a precision schedule switched to full
        precision). Assigning it is checked by the policy; after the switch there is no
        loss scale to set, and assigning raises ``RuntimeError``."""
        return 1.0 if self._switched() else self.policy.get_loss_scale()

    @scale.setter
    def scale(self, value: float) -> None:
        if self._switched():
            raise RuntimeError(f"updater.scale = {value!r} is refused: the precision schedule "
                               f"{self.schedule.mode.text!r} switched to full precision at "
                               f"step {self.schedule.switch_step}; those steps run unscaled "
                               f"(scale 1), so there is no loss scale to set")
        self.policy.set_loss_scale(value)

    @property
    def precision(self) -> str:
        """``"half"`` or ``"float"``: the precision the next step runs in."""
        return "float" if self._switched() else self._precision

    def _switched(self) -> bool:
        """Whether the precision schedule runs the next step in full precision."""
        return self.schedule is not None and not self.schedule.reduced(self.steps)

    # -- the step -----------------------------------------------------------------------
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

        Raises:
            RuntimeError: ``update()`` is already running, in another thread or further up
                this one (a monitor hook or data feeder calling it): one step at a time. Or
                ``comm`` has an all-reduce armed by a script's ``all_reduce_callback()``.
        """
        try:
            self._idle.pop()
        except IndexError:
            raise _already_running(self) from None
        try:
            if self._comm is not None:
                agreement.check_not_armed(self._comm)
            result = self._step(1)
            attempts = 1
            while result.skipped and attempts <= self._max_retries:
                attempts += 1
                result = self._step(attempts)
            return result
        finally:
            self._idle.append(True)

    def _step(self, attempts: int) -> StepResult:
        index = self._steps
        loss, precision = self._graph_at(index)
        recorder, seed = self._passes[id(loss)]
        losses = recorder.start()
        scaled = precision != "float" or self.schedule is None
        fed = scaled and self._meter.calibration_pending   # scale="auto": measure first
        if fed:
            self._meter.calibrate(self._feed, lambda: recorder.forward(losses, 0, False),
                                  self._zero_grads)
        scale = self.policy.get_loss_scale() if scaled else 1.0
        watch = self._meter.growth_watch(index) if scaled else None
        watch_loss = self.schedule is not None and self.schedule.needs_loss
        self._forward_backward(recorder, seed.at(scale), scale, losses, watch, fed)
        if watch is not None and self._in_backward is None:
            self._meter.watch_own(watch)     # this rank's gradients, before the reduce
        stats = self._meter.statistics(index) if self._meter.stats_every else None
        skipped, loss_nonfinite, bad_batch = self._decider.decide(loss, losses, index)
        room = (None if watch is None or skipped    # the seed's value: what the grads carry
                else self._meter.growth_room(watch, seed.held))
        skipped = skipped or not self._unscaler.unscale(seed.held, self._updates)  # norm not finite
        at_floor = skipped and scaled and self.policy.at_min_scale    # read on overflow only
        # A skipped step's non-finite loss or batch is no overflow: a smaller scale cannot
        # fix it, so the scale is kept; scale="auto" measures again, on the next batch.
        if scaled and not (loss_nonfinite or bad_batch):
            self.policy.update(skipped, self._meter.settled(room, skipped))
        if fed and bad_batch:
            self._meter.calibration_pending = True
        self._steps += 1
        if skipped:
            self._skipped_steps += 1
            self._collapse.count_skip(bad_batch)
        else:
            self._unscaler.apply()
            self._updates += 1
            self._collapse.overflow_streak = 0
        if watch_loss and math.isfinite(losses.mean()):
            self.schedule.observe_loss(index, losses.mean())
        result = StepResult(index, skipped, scale, self.scale, attempts, precision, stats,
                            bad_batch, losses)
        self.last_result = result
        if self._monitor is not None:
            self._monitor(result)
        if skipped:
            self._collapse.after_skip(index, scale, self.scale, loss, at_floor,
                                      loss_nonfinite, bad_batch)
        return result

    def _graph_at(self, index: int):
        """``(loss, precision)`` of step ``index``: the reduced-precision graph, or after a
        precision switch the full-precision one (run at scale 1, checked for overflow)."""
        schedule = self.schedule
        if schedule is None or schedule.reduced(index):
            return self.loss, self._precision
        if index == schedule.switch_step:
            logger.info(f"nnabla_mpt: precision schedule {schedule.mode.text!r}: "
                        f"{schedule.describe_switch()}")
        return self.high_precision_loss, "float"

    def _forward_backward(self, recorder: LossRecorder, seed: "nn.NdArray", scale: float,
                          losses: StepLosses, watch: Optional[RangeWatch] = None,
                          fed: bool = False) -> None:
        """Zeroes the gradients, then ``accum_grad`` × (feed, forward of the recorder's loss
        kept in ``losses``, backward seeded with ``seed``, the array of ``scale``, watched by
        ``watch`` if given); ``fed``: the first micro-batch is fed and forwarded already. The
        last backward carries nnabla's all-reduce callback where it reduces the gradients."""
        loss = recorder.loss
        clear = self._clear_buffer
        reduce = None if self._in_backward is None else self._in_backward()
        last = self._accum_grad - 1
        self._zero_grads()
        for i in range(self._accum_grad):
            if i or not fed:
                feed = self._feed
                if feed is not None:
                    feed()
                recorder.forward(losses, i, clear)
            callbacks = reduce if i == last else None
            if watch is None:
                loss.backward(seed, clear_buffer=clear, communicator_callbacks=callbacks)
            else:
                watch.run(loss, scale, clear, callbacks)

    # -- state -------------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        """The updater's whole state as plain Python values, versioned: the policy's (scale,
        counters, bounds), the precision schedule's, the updater's counters, whether
        ``scale="auto"`` is still to measure (``calibration_pending``) and measured growth's
        history (``scale_history``). Parameters and solver states: :meth:`save_checkpoint`.
        """
        return {"version": updater_state.VERSION, "updater": type(self).__name__,
                "policy": self.policy.state_dict(),
                "precision": None if self.schedule is None else self.schedule.state_dict(),
                "steps": self.steps, "updates": self.updates,
                "skipped_steps": self.skipped_steps,
                "overflow_streak": self._collapse.overflow_streak,
                "longest_overflow_streak": self._collapse.longest_overflow_streak,
                "bad_batches": self._collapse.bad_batches,
                **self._meter.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores what :meth:`state_dict` returned; all or nothing. The policy's settings
        (``N``, ``max_scale``, ...) come from ``state``, and a calibration still due makes
        the next step measure (``scale="auto"``) where this updater was given a number: one
        warning names each setting replaced; a scale the loss's dtype cannot seed is
        lowered, with a warning (:func:`~nnabla_mpt.updater_state.within_dtype`).

        Raises:
            ValueError: keys are missing or unknown (the message lists them), the version
                or the updater type differs, a value is out of range (named by its key,
                ``state['policy']['scale']``), or the counters contradict each other.
            TypeError: a value has the wrong type (a counter that is no integer,
                ``calibration_pending`` that is no bool); the message names it.
        """
        checked = self._check_state(state)
        policy_state = checked["policy"]
        updater_state.warn_lowered(checked["lowered"], self._dtype)
        updater_state.warn_replaced_settings(self.policy, policy_state,
                                             checked["calibration_pending"],
                                             self._meter.auto_scale)
        self.policy.load_state_dict(policy_state, name=updater_state.POLICY)
        if self.schedule is not None:
            self.schedule.load_state_dict(state["precision"])
        self.steps, self.updates, self.skipped_steps = (
            checked["steps"], checked["updates"], checked["skipped_steps"])
        self._meter.load_state_dict(checked)
        self._collapse.overflow_streak = checked["overflow_streak"]
        self._collapse.longest_overflow_streak = checked["longest_overflow_streak"]
        self._collapse.bad_batches = checked["bad_batches"]

    def _check_state(self, state: Mapping[str, Any]) -> Dict[str, Any]:
        """:func:`~nnabla_mpt.updater_state.check_all` of ``state``; versions as
        :func:`~nnabla_mpt.updater_state.current` says."""
        return updater_state.check_all(state, type(self).__name__, self.policy, self.schedule,
                                       self._meter.auto_scale, self._dtype)

    def save_checkpoint(self, path: str) -> None:
        """Writes parameters, solver states and updater state to ``path`` atomically.

        Written beside ``path`` as ``.<name>.tmp`` (a killed save's is replaced), flushed
        and renamed over ``path``: a crash leaves the previous checkpoint or the new one.
        A new file gets the umask's permissions, an existing one keeps its own, a
        symlink's target is replaced. The format: :mod:`nnabla_mpt.files.checkpoint`.

        Raises:
            TypeError, ValueError: ``path`` is not a path (not a str or PathLike, '', NUL).
            OSError: no folder, or a folder, FIFO, device or socket at ``path`` (left as it
                is; checked first), or writing failed (the old file stays); names ``path``.
        """
        checkpoint.save(path, self._params, self.solver, self.state_dict())

    def load_checkpoint(self, path: str) -> None:
        """Restores what :meth:`save_checkpoint` wrote: parameters, solver states, state;
        all checked first, each array from its header before it is read (settings it
        changes are logged as by :meth:`load_state_dict`).

        Raises:
            OSError, TypeError: as :meth:`save_checkpoint` (no file: ``FileNotFoundError``).
            ValueError: the file is not an nnabla_mpt checkpoint, is corrupted, holds inf or
                NaN, or its parameters, solver states or updater state do not match this
                updater (the message names ``path`` and the arrays). Nothing is changed.
        """
        state = checkpoint.load(path, self._params, self.solver, self._check_state)
        self.load_state_dict(state)


def _decider(updater: _LossScalingUpdater, shared_grads: Optional[bool], batch: BatchCheck,
             pack: Optional[int]):
    """The step's decision of ``updater`` (local, or agreed by the ranks) and the shared
    gradients; ``pack``: the gradients are reduced inside the backward pass (nnabla's
    callback, :func:`options.backward_reduction`)."""
    check_grads = None
    if updater.enable_overflow_check:
        float32_cpu = (updater.schedule is None and graph.extension_of(updater.loss) == "cpu"
                       and updater._dtype.name == "float32")
        check_grads = overflow_check(updater.detector, updater.solver, updater._params,
                                     float32_cpu, graph.float_context(updater.loss))
    float_only = updater._precision == "float" and updater.schedule is None
    decider = agreement.decider(updater.comm, updater.loss, updater._params, updater.grads,
                                shared_grads, float_only, check_grads, updater.detector.mode,
                                batch, pack, updater.average_ranks)
    agreement.warn_float16_reduction(decider[0].reduction, updater._precision,
                                     updater.schedule is not None)
    return decider


def _reduced_dtype(decider, dtype: str) -> Optional[str]:
    """The dtype the step's all-reduce leaves gradients of ``dtype`` (the loss's) in; None
    without one."""
    if decider.reduction is None:
        return None
    return decider.reduction.dtype_after(dtype)


def _already_running(updater: _LossScalingUpdater) -> RuntimeError:
    """The error of an ``update()`` called while one runs: from inside it (found on this
    thread's stack, looked at on this path only) or from another thread."""
    name = f"{type(updater).__name__}.update()"
    frame = sys._getframe(2)
    while frame is not None:
        if (frame.f_code is _LossScalingUpdater.update.__code__
                and frame.f_locals.get("self") is updater):
            return RuntimeError(
                f"{name} is already running: it was called from inside update() (a monitor "
                f"hook or a data_feeder); one updater runs one step at a time, so take the "
                f"next step after update() has returned")
        frame = frame.f_back
    return RuntimeError(
        f"{name} is already running in another thread: one updater runs one step at a "
        f"time (nnabla's graphs and gradients are not safe to share between threads); call "
        f"update() from one thread, or give each thread an updater of its own graph")


@settings.guarded(options.DYNAMIC)
@options.DYNAMIC.describe
class DynamicLossScalingUpdater(DynamicSettings, _LossScalingUpdater):
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
        {options}

    Attributes:
        shared_grads: The :class:`~nnabla_mpt.SharedGradients` in use, or None.
        last_report: The :class:`~nnabla_mpt.OverflowReport` of the last
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

    def __init__(self, solver, loss, *args, **kwargs) -> None:
        values, given = options.DYNAMIC.bind(type(self).__name__, args, kwargs)
        super().__init__(solver, loss,
                         lambda dtype: options.dynamic_policy(values, given, dtype), values)


@settings.guarded(options.FIXED)
@options.FIXED.describe
class FixedLossScalingUpdater(_LossScalingUpdater):
    """Mixed-precision training step with a constant loss scale.

    With ``enable_overflow_check=True`` (default) an overflowing step is skipped and the
    scale stays. With ``enable_overflow_check=False`` no check runs and the parameters are
    always updated, for networks whose overflow is harmless (clipped or masked later).
    The options are those of :class:`DynamicLossScalingUpdater` that do not concern a
    dynamic scale.

    Args:
        solver: An nnabla solver with its parameters set.
        loss: The scalar loss Variable.
        {options}
    """

    def __init__(self, solver, loss, *args, **kwargs) -> None:
        values, _ = options.FIXED.bind(type(self).__name__, args, kwargs)
        super().__init__(solver, loss, lambda dtype: options.fixed_policy(values, dtype),
                         values)

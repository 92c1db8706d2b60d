"""The loss-scaling updaters: one training step, one decision.

One call of ``update()`` runs the step (:meth:`_LossScalingUpdater.update`)::

    zero the gradients
    before:       scale="auto" still to measure: calibrate on the first batch;
                  measured growth: watch the step's backward passes    scale/measured.py
    accum_grad times: feed a batch, forward (with outputs=), backward with
                  the loss scale                                           step/step_loss.py
    decide:       all-reduce (with a communicator), check for overflow distributed/agreement.py
                  unscale, clip; a gradient norm not finite is an overflow   step/unscale.py
    good step:    weight decay, the scheduled learning rate, solver.update() step/unscale.py
    skipped step: parameters and solver states stay as they are
    after:        tell the policy: the scale backs off or grows (measured growth:
                  from the history of watched passes)     scale/policy.py, scale/measured.py
    after a skip: on a collapse, diagnose and act by floor_policy           step/collapse.py

Settings a script changes between steps take effect from the next step; one table says
which (:mod:`nnabla_mpt.settings`).

Both updaters run this loop; they differ in the policy that sets the scale and in their
arguments (``options.DYNAMIC``, ``options.FIXED``). What a valid updater state is and how it
is saved, :mod:`nnabla_mpt.updater_state` says.
"""
import math
from dataclasses import replace
from typing import Any, Callable, Optional, Tuple

import nnabla as nn
from nnabla.logger import logger

from . import options, settings, updater_state
from .core import graph
from .core.dtypes import FloatType
from .core.loss_and_solver import solver_parameters, trained_loss
from .diagnosis.watch import RangeWatch
from .distributed import abort, agreement, launcher
from .distributed.gradient_reduction import (GradientReduction, backward_reduction,
                                             exchanged_grads)
from .options import UpdaterOptions
from .scale.bounded_policy import dynamic_policy, fixed_policy
from .scale.measured import ScaleMeter
from .scale.precision_graphs import updater_schedule
from .scale.seed import BackwardSeed
from .step.collapse import CollapseAttributes, CollapseWatch
from .step.decision import LocalDecision
from .step.detector import BatchCheck, OverflowDetector, overflow_checks
from .step.feeder import StaleInputs, install_feeder
from .step.overflow_handling import OverflowHandling, check_retries
from .step.result import StepResult
from .step.step_loss import LossRecorder, StepLosses
from .step.unscale import Unscaler


class _LossScalingUpdater(CollapseAttributes, updater_state.Resumable, settings.OneAtATime):
    """The training step shared by every updater; see the subclasses. The attributes of
    the collapse handling (``overflow_streak``, ``bad_batches``, ...) come from
    :class:`~nnabla_mpt.step.collapse.CollapseAttributes`, the counters and the state from
    :class:`~nnabla_mpt.updater_state.Resumable`, the settings from :mod:`nnabla_mpt.settings`.

    Args:
        solver, loss: As the updaters take them.
        make_policy: ``dtype -> policy``: the loss-scale policy, given the
            :class:`~nnabla_mpt.core.dtypes.FloatType` of the loss, whose values bound the
            scales ``loss.backward(scale)`` can seed.
        opts: The checked values of the updater's options (``UpdaterSignature.bind``).
    """

    def __init__(self, solver, loss, make_policy: Callable[[FloatType], Any],
                 opts: UpdaterOptions) -> None:
        settings.OneAtATime.__init__(self)
        self._options = opts
        self._params = solver_parameters(solver)
        self._solver = solver
        self._loss = trained_loss(loss, self._params)
        self._precision = graph.gradient_precision(self._loss, self._params)
        self._schedule = updater_schedule(opts.schedule, self._loss, self._params,
                                          opts.outputs)
        self._high_precision_loss = getattr(self._schedule, "high_precision_loss", None)
        graphs = [v for v in (self._loss, self._high_precision_loss) if v is not None]
        self._passes = {id(v): (LossRecorder(v, opts.accum_grad, opts.outputs),
                                BackwardSeed(v)) for v in graphs}
        self._dtype = graph.float_type_of(self._loss)
        check_retries(opts.overflow.max_retries, opts.enable_overflow_check)
        self._policy = make_policy(self._dtype)
        install_feeder(self, opts.data_feeder)
        self._stale = StaleInputs(graph.data_inputs(self._loss, self._params))
        self._clear_buffer, self._accum_grad = opts.clear_buffer, opts.accum_grad
        self._max_retries = opts.overflow.max_retries
        self._average_accum = opts.reduction.average_accum
        self._monitor = opts.monitor
        batch = BatchCheck([self._loss, self._high_precision_loss], self._params)
        self._set_up_reduction(opts, graphs, batch)
        self._unscaler = Unscaler(solver, self._params, graph.float_context(self._loss),
                                  opts.accum_grad, self._average_accum, opts.clip_grad_norm,
                                  opts.weight_decay, opts.lr_scheduler)
        self._collapse = CollapseWatch(opts.overflow.floor_policy, opts.overflow.diagnose_after,
                                       self._params, self._detector, self._policy,
                                       self._decider.agree_on_diagnosis, batch)
        reduction = self._decider.reduction
        self._meter = ScaleMeter(self._loss, self._params, self._policy, self._decider.gather,
                                 opts.gradient_stats_every, opts.scale == "auto",
                                 None if reduction is None else reduction.dtype_after,
                                 opts.policy_settings.get("max_scale"))
        self._steps = self._updates = self._skipped_steps = 0
        self.last_result: Optional[StepResult] = None

    def _set_up_reduction(self, opts: UpdaterOptions, graphs, batch: BatchCheck) -> None:
        """The communicator, the gradients it reduces, the overflow check and the step's
        decision (local, or agreed by the ranks), the shared gradients."""
        reduction = opts.reduction
        self._comm = abort.updater_comm(opts.comm, reduction.abort_on_exception)
        if self._comm is None:
            launcher.warn_training_alone()
        self._grads = exchanged_grads(opts.grads, self._comm, reduction, self._params)
        self._detector = OverflowDetector(opts.overflow.mode)
        pack = backward_reduction(reduction, self._comm, opts.overflow.mode == "saturation",
                                  graphs, self._params)
        float32_cpu = (self._schedule is None and self._dtype.name == "float32"
                       and graph.extension_of(self._loss) == "cpu")
        checks = overflow_checks(self._detector.mode, opts.enable_overflow_check, self._solver,
                                 self._params, float32_cpu, graph.float_context(self._loss),
                                 self._comm is not None)
        float_only = self._precision == "float" and self._schedule is None
        if self._comm is None:
            self._decider, self._shared_grads = LocalDecision(checks[0], batch), None
        else:
            self._decider, self._shared_grads = agreement.decider(
                self._comm, self._loss, self._params, self._grads, reduction.shared_grads,
                float_only, checks, self._detector.mode, batch, pack, reduction.average_ranks)
            agreement.warn_float16_reduction(self._decider.reduction, self._precision,
                                             self._schedule is not None,
                                             reduction.average_ranks)
            agreement.warn_device_mismatch(self._comm, self._loss)
        self._in_backward = self._decider.in_backward
        self._zero_grads = (self._solver.zero_grad if self._shared_grads is None
                            else self._shared_grads.zero)

    # -- what the step runs, as it is now ----------------------------------------------
    @property
    def precision(self) -> str:
        """``"half"`` or ``"float"``: the precision the next step runs in."""
        return "float" if self._switched() else self._precision

    @property
    def _next_scale(self) -> float:
        """The scale of the next step (the ``scale`` setting): 1 after a precision switch."""
        return 1.0 if self._switched() else self._policy.loss_scale

    @property
    def _overflow_handling(self) -> OverflowHandling:
        """The ``overflow`` setting: :class:`OverflowHandling` of the values in use."""
        return OverflowHandling(self._detector.mode, self._max_retries,
                                self._collapse.floor_policy, self._collapse.diagnose_after)

    @property
    def _gradient_reduction(self) -> GradientReduction:
        """The ``reduction`` setting: :class:`GradientReduction` of the values in use."""
        return replace(self._options.reduction, average_accum=self._average_accum)

    def _switched(self) -> bool:
        """Whether the precision schedule runs the next step in full precision."""
        return self._schedule is not None and not self._schedule.reduced(self._steps)

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
        self._enter("update()")
        try:
            if self._comm is not None:
                agreement.check_not_armed(self._comm)
            if self._feed is None:
                self._stale.look(self._accum_grad)    # the script writes the inputs?
            result = self._step(1)
            while result.skipped and result.attempts <= self._max_retries:
                result = self._step(result.attempts + 1)
            return result
        finally:
            self._leave()

    def _step(self, attempts: int) -> StepResult:
        index = self._steps
        loss, precision = self._graph_at(index)
        recorder, seed = self._passes[id(loss)]
        losses = recorder.start()
        meter = self._meter if precision != "float" or self._schedule is None else None
        fed, watch = False, None           # unscaled (meter None): no scale to measure
        if meter is not None:
            fed, watch = meter.before_passes(index, self._feed, self._zero_grads,
                                             lambda: recorder.forward(losses, 0, False))
        scale = 1.0 if meter is None else self._policy.loss_scale
        self._forward_backward(recorder, seed.at(scale), scale, losses, watch, fed)
        stats = self._meter.statistics(index) if self._meter.stats_every else None
        skipped, loss_nonfinite, bad_batch, room = self._decide(loss, losses, index, watch,
                                                                seed.held)
        at_floor = skipped and meter is not None and self._policy.at_min_scale
        held_by = (None if meter is None else
                   meter.after_step(fed, skipped, room, loss_nonfinite, bad_batch))
        self._steps += 1
        if skipped:
            self._skipped_steps += 1
            self._collapse.count_skip(bad_batch)
        else:
            self._unscaler.apply()
            self._updates += 1
            self._collapse.overflow_streak = 0
        schedule = self._schedule
        if schedule is not None and schedule.needs_loss and math.isfinite(losses.mean()):
            schedule.observe_loss(index, losses.mean())
        result = StepResult(index, skipped, scale, self._next_scale, attempts, precision,
                            stats, bad_batch, held_by, self._skipped_steps, losses)
        self.last_result = result
        if self._monitor is not None:
            self._monitor(result)
        if skipped:
            self._collapse.after_skip(index, scale, result.next_scale, loss, at_floor,
                                      loss_nonfinite, bad_batch)
        return result

    def _decide(self, loss: "nn.Variable", losses: StepLosses, index: int,
                watch: Optional[RangeWatch], held: float) -> Tuple[bool, bool, bool, Any]:
        """The step's one decision, skip or update, once its backward passes ran:
        ``(skipped, loss_nonfinite, bad_batch, room)``. The gradients are all-reduced (with
        a communicator) and checked, alike on every rank; a good step's gradients are then
        measured for growth (``room``, with ``watch``; None without) and unscaled by the
        seed's ``held`` scale, and a gradient norm that is not finite skips it after all."""
        if watch is not None and self._in_backward is None:
            self._meter.watch_own(watch)     # this rank's gradients, before the reduce
        skipped, loss_nonfinite, bad_batch = self._decider.decide(loss, losses, index)
        if skipped:
            return True, loss_nonfinite, bad_batch, None
        room = None if watch is None else self._meter.growth_room(watch, held)
        unscaled = self._unscaler.unscale(held, self._updates)
        return not unscaled, loss_nonfinite, bad_batch, room

    def _graph_at(self, index: int):
        """``(loss, precision)`` of step ``index``: the reduced-precision graph, or after a
        precision switch the full-precision one (run at scale 1, checked for overflow)."""
        schedule = self._schedule
        if schedule is None or schedule.reduced(index):
            return self._loss, self._precision
        if index == schedule.switch_step:
            logger.info(f"nnabla_mpt: precision schedule {schedule.mode.text!r}: "
                        f"{schedule.describe_switch()}")
        return self._high_precision_loss, "float"

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


@options.DYNAMIC.describe
class DynamicLossScalingUpdater(_LossScalingUpdater):
    """Mixed-precision training step with a dynamic loss scale.

    ``step = updater.update()`` runs one step: ``accum_grad`` × (feed, forward, backward
    with the loss scale), all-reduce (with ``comm``), overflow check, then unscale, clip,
    weight decay and ``solver.update()``; or, on overflow, skip the step and back the
    scale off. ``step.skipped``, ``step.scale`` and ``step.loss`` say what it did.
    Recommended: ``scale="auto", growth_mode="measured"`` (the start measured on the first
    batch, growth as far as the gradients leave room). Counters: ``updater.steps``,
    ``updater.updates`` and ``updater.skipped_steps``; ``save_checkpoint(path)`` and
    ``load_checkpoint(path)`` keep them with the parameters.

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
        opts = options.DYNAMIC.bind(type(self).__name__, args, kwargs)
        super().__init__(solver, loss, lambda dtype: dynamic_policy(
            opts.policy_settings, opts.shown, dtype), opts)


@options.FIXED.describe
class FixedLossScalingUpdater(_LossScalingUpdater):
    """Mixed-precision training step with a constant loss scale.

    ``step = updater.update()`` runs one step as :class:`DynamicLossScalingUpdater`'s does,
    with a scale that stays; ``step.skipped``, ``step.scale`` and ``step.loss`` say what it
    did. Counters: ``updater.steps``, ``updater.updates`` and ``updater.skipped_steps``;
    ``save_checkpoint(path)`` and ``load_checkpoint(path)`` keep them with the parameters.

    With ``enable_overflow_check=True`` (default) an overflowing step is skipped and the
    scale stays. With ``enable_overflow_check=False`` no check runs and the parameters are
    updated, for networks whose overflow is harmless (clipped or masked later), except on a
    step where ``clip_grad_norm=`` finds a gradient norm that is not finite: dividing by it
    would write NaN into every parameter, so that step is skipped all the same.
    The options are those of :class:`DynamicLossScalingUpdater` that do not concern a
    dynamic scale.

    Args:
        solver: An nnabla solver with its parameters set.
        loss: The scalar loss Variable.
        {options}
    """

    def __init__(self, solver, loss, *args, **kwargs) -> None:
        opts = options.FIXED.bind(type(self).__name__, args, kwargs)
        super().__init__(solver, loss, lambda dtype: fixed_policy(
            opts.scale, opts.shown["scale"], dtype), opts)


settings.install(_LossScalingUpdater, settings.BOTH)
settings.install(DynamicLossScalingUpdater, settings.DYNAMIC)

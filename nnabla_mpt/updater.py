"""The loss-scaling updaters: :class:`DynamicLossScalingUpdater` and
:class:`FixedLossScalingUpdater`, their constructors written out.

Both run the step loop of :mod:`nnabla_mpt.step_loop`; they differ in the policy that sets
the scale and in their arguments, checked where they are made: the options both take in
:class:`UpdaterOptions`, the scale's in
:class:`~nnabla_mpt.scale.bounded_policy.DynamicPolicyArguments`. The settings a script
may change between steps are checked by the same functions
(:func:`~nnabla_mpt.settings.checked_weight_decay`, ...).
"""
from dataclasses import dataclass
from typing import Any, Callable, Literal, Optional, Sequence, Union

import nnabla as nn

from .core import _validate as check
from .distributed import gradient_reduction as reduction_checks
from .distributed.gradient_reduction import GradientReduction
from .monitoring import checked_step_hook
from .scale.bounded_policy import DynamicPolicyArguments, FixedScale
from .scale.policy import DynamicLossScale, GrowthMode
from .scale.precision import PrecisionSchedule
from .settings import (checked_accum_grad, checked_clip_grad_norm, checked_weight_decay,
                       given, live)
from .step.decision import StepResult
from .step.micro_batch import checked_feeder, checked_outputs
from .step.overflow_handling import OverflowHandling
from .step.unscale import checked_lr_scheduler
from .step_loop import _LossScalingUpdater


@dataclass(frozen=True)
class UpdaterOptions:
    """The options both updaters take, checked when the object is made (``TypeError`` or
    ``ValueError`` naming the argument and the value); the updaters' docstrings say what
    each one does. ``overflow`` and ``reduction`` given as None are their defaults.
    """
    data_feeder: Optional[Callable[[], Any]] = None
    clear_buffer: bool = True
    accum_grad: int = 1
    average_accum: bool = False
    weight_decay: Optional[float] = None
    comm: Any = None
    grads: Optional[Sequence["nn.NdArray"]] = None
    enable_overflow_check: bool = True
    clip_grad_norm: Optional[float] = None
    monitor: Optional[Callable[[Any], Any]] = None
    outputs: Optional[Sequence["nn.Variable"]] = None
    lr_scheduler: Any = None
    gradient_stats_every: Optional[int] = None
    overflow: Optional[OverflowHandling] = None
    reduction: Optional[GradientReduction] = None
    schedule: Optional[PrecisionSchedule] = None

    def __post_init__(self) -> None:
        every = self.gradient_stats_every
        checked = {
            "data_feeder": checked_feeder("data_feeder", self.data_feeder),
            "clear_buffer": check.boolean("clear_buffer", self.clear_buffer),
            "accum_grad": checked_accum_grad(self.accum_grad),
            "average_accum": check.boolean("average_accum", self.average_accum),
            "weight_decay": checked_weight_decay(self.weight_decay),
            "comm": reduction_checks.communicator("comm", self.comm),
            "grads": reduction_checks.ndarrays("grads", self.grads),
            "enable_overflow_check": check.boolean("enable_overflow_check",
                                                   self.enable_overflow_check),
            "clip_grad_norm": checked_clip_grad_norm(self.clip_grad_norm),
            "monitor": checked_step_hook("monitor", self.monitor),
            "outputs": checked_outputs("outputs", self.outputs),
            "lr_scheduler": checked_lr_scheduler("lr_scheduler", self.lr_scheduler),
            "gradient_stats_every": (None if every is None else
                                     check.integer("gradient_stats_every", every, ge=1)),
            "overflow": (check.option("overflow", self.overflow, OverflowHandling)
                         or OverflowHandling()),
            "reduction": (check.option("reduction", self.reduction, GradientReduction)
                          or GradientReduction()),
            "schedule": check.option("schedule", self.schedule, PrecisionSchedule),
        }
        self.__dict__.update(checked)          # frozen: set past its __setattr__



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
        data_feeder: Called with no arguments before every forward to load the next batch
            into the input Variables (``x.d = ...``); what it returns is ignored. None when
            the inputs are already filled. One that needs an argument is refused
            (``TypeError``); one that returns something (the batch, instead of writing it)
            is warned about at its first call.
        scale: The initial loss scale, or ``"auto"``: measured on the first step's own
            batch (see :doc:`measured`; until then :attr:`scale` reads the upper bound); a
            batch whose loss, or whose gradients at any scale, are not finite is not
            measured, and the next step measures its own. A scale above the largest power
            of two the loss's dtype holds (``2**15`` for float16) is lowered to it, with an
            info line. A scale the loss's dtype holds only rounded (3000.7 is 3000 in
            float16) seeds the pass rounded, and the gradients are divided by that rounded
            value (:func:`~nnabla_mpt.core.dtypes.held_scale`).
        scaling_factor: Growth factor of the scale (> 1); the scale backs off by
            ``1 / scaling_factor``.
        N: Consecutive good steps before the scale grows by ``scaling_factor``.
        clear_buffer: Free intermediate buffers during forward and backward.
        accum_grad: Forward/backward passes whose gradients are summed per update.
        weight_decay: Weight decay applied to the unscaled gradients, or None.
        comm: A communicator (``MPICommunicator``, or nnabla's
            ``MultiProcessDataParallelCommunicator``) for data-parallel training, or None.
        grads: Gradients to all-reduce with ``comm``; None means those of all the solver's
            parameters. Without ``comm`` there is nothing to reduce: a non-empty list is
            ignored with a warning (accepted, as nnabla's updater accepts it), ``[]``
            (nnabla's default) silently.
        average_accum: Divide the gradients summed over the ``accum_grad`` micro-batches by
            ``accum_grad`` (default: sum them, as nnabla's updater does).
        growth_mode: ``"probe"`` (default): grow by ``scaling_factor`` after ``N`` good
            steps, as nnabla's updater does; ``"measured"``: on the step where growth is
            due, watch the backward pass and grow by as many factors as the gradients leave
            room for, possibly none (see :doc:`measured`).
        policy: The scale's settings as a :class:`~nnabla_mpt.DynamicLossScale`
            (``init_scale``, ``growth_factor``, ``backoff_factor``, ``growth_interval``,
            ``hysteresis``, ``min_scale``, ``max_scale``, ``growth_mode``): the policy the
            updater runs, this very object (``updater.policy is policy``), its
            ``max_scale`` lowered to what the loss's dtype can seed. Given with it,
            ``scale`` may only be ``"auto"``, and ``scaling_factor``, ``N`` and
            ``growth_mode`` keep their defaults: the policy holds them. None (default):
            a policy of ``scale``, ``scaling_factor``, ``N`` and ``growth_mode`` between
            ``min_scale=1`` and ``max_scale=2**24``.
        clip_grad_norm: Clip the unscaled gradients to this global L2 norm, or None. The
            norm is taken of the unscaled gradients in float32 on the device they live on,
            scaled by their largest magnitude as BLAS ``nrm2`` does: finite for all finite
            gradients, which are clipped and applied however large their norm (a step is
            never skipped for it). Only gradients holding inf or NaN have no norm: the
            overflow check skips them, and without it (``enable_overflow_check=False``)
            the norm does, as an overflow.
        monitor: A step hook: any callable, called once per step (after the step is
            complete) with its :class:`StepResult`, e.g. a :class:`LossScaleMonitor` or a
            :class:`LossScaleCallback`. None (default) costs one attribute test per step.
        outputs: Variables computed by the step's own forward passes together with the
            loss (an error rate, an accuracy: what ``F.sink(loss, error)`` computed), on
            the same batch, random draws and batch-normalization statistics; the backward
            pass still runs from the loss alone. After ``update()`` their ``.d`` holds the
            last micro-batch's values (a ``data_feeder`` finds the previous micro-batch's
            there when ``accum_grad > 1``), of the last attempt in retry mode, of this
            rank's batch with a communicator (they are not reduced). They are made
            persistent, so that no pass frees their values. Not with ``schedule``.
        lr_scheduler: A learning-rate schedule with ``get_learning_rate(iter)`` (nnabla's
            ``nnabla.utils.learning_rate_scheduler``), keyed on applied updates: before
            each ``solver.update()`` the solver's learning rate is set to
            ``get_learning_rate(updater.updates)``, so a skipped step does not advance the
            schedule; a resumed run goes on from the saved ``updates``. None (default): the
            learning rate is left to the solver.
        gradient_stats_every: Every this many steps (``(step + 1) % K == 0``),
            :attr:`StepResult.gradient_stats` holds each parameter's gradient statistics
            (zeros, subnormals, largest value, headroom; see
            :class:`~nnabla_mpt.GradientStats`); None (default): never.
        overflow: What counts as an overflow and what is done about one, an
            :class:`~nnabla_mpt.OverflowHandling`: the check's ``mode`` (``"inf_nan"`` or
            ``"saturation"``), ``max_retries`` within one ``update()``, and at a
            collapsing scale the ``floor_policy`` after ``diagnose_after`` overflowing
            steps. None (default): ``OverflowHandling()``.
        reduction: How the gradients are summed over the ranks, a
            :class:`~nnabla_mpt.GradientReduction`: averaged (``average_ranks``), reduced
            inside the backward pass (``backward_pack_size``), in shared memory
            (``shared_grads``), and whether a rank that raises aborts the job
            (``abort_on_exception``). None (default): ``GradientReduction()``.
        schedule: A precision schedule, a :class:`~nnabla_mpt.PrecisionSchedule`: reduced
            precision (``loss``) first, then full precision (its ``high_precision_loss``,
            run with scale 1 and the overflow check kept); the updater runs this very
            object. None (default): reduced precision throughout.

    Attributes:
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

    def __init__(self, solver: "nn.solver.Solver", loss: "nn.Variable",
                 data_feeder: Optional[Callable[[], Any]] = None,
                 scale: Union[float, Literal["auto"]] = 8.0, scaling_factor: float = 2.0,
                 N: int = 2000, clear_buffer: bool = True, accum_grad: int = 1,
                 weight_decay: Optional[float] = None, comm: Any = None,
                 grads: Optional[Sequence["nn.NdArray"]] = None, *,
                 average_accum: bool = False,
                 growth_mode: GrowthMode = "probe",
                 policy: Optional[DynamicLossScale] = None,
                 clip_grad_norm: Optional[float] = None,
                 monitor: Optional[Callable[[StepResult], Any]] = None,
                 outputs: Optional[Sequence["nn.Variable"]] = None, lr_scheduler: Any = None,
                 gradient_stats_every: Optional[int] = None,
                 overflow: Optional[OverflowHandling] = None,
                 reduction: Optional[GradientReduction] = None,
                 schedule: Optional[PrecisionSchedule] = None) -> None:
        opts = UpdaterOptions(
            data_feeder=data_feeder, clear_buffer=clear_buffer, accum_grad=accum_grad,
            average_accum=average_accum,
            weight_decay=weight_decay, comm=comm, grads=grads,
            clip_grad_norm=clip_grad_norm, monitor=monitor, outputs=outputs,
            lr_scheduler=lr_scheduler, gradient_stats_every=gradient_stats_every,
            overflow=overflow, reduction=reduction, schedule=schedule)
        scaling = DynamicPolicyArguments(scale=scale, scaling_factor=scaling_factor, N=N,
                                         growth_mode=growth_mode, policy=policy)
        super().__init__(solver, loss, scaling, opts)

    @live(lambda updater: updater._policy.growth_factor)
    def scaling_factor(self, value: float) -> None:
        """Growth factor of the scale (assignable; also the back-off where it is
        ``1 / scaling_factor``, the default)."""
        value = check.real("scaling_factor", value, gt=1.0)
        policy = self._policy
        if policy.backoff_factor == 1.0 / policy.growth_factor:   # the default: it follows
            policy.backoff_factor = 1.0 / value
        policy.growth_factor = value

    @live(lambda updater: updater._policy.growth_interval)
    def N(self, value: int) -> None:
        """Consecutive good steps before the scale grows (assignable; a count already at
        the new N grows at the next good step)."""
        self._policy.set_growth_interval(check.integer("N", value, ge=1))

    growth_mode = given("growth_mode", lambda updater: updater._policy.growth_mode)


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

    Args:
        solver: An nnabla solver with its parameters set.
        loss: The scalar loss Variable.
        data_feeder: As :class:`DynamicLossScalingUpdater` takes it.
        scale: The loss scale; ``>= 1``, at most the largest power of two the loss's dtype
            holds. A scale the loss's dtype holds only rounded seeds the pass rounded, and
            the gradients are divided by that rounded value.
        enable_overflow_check: Skip overflowing steps (the scale stays). False: no check,
            for harmless overflow; a step whose clipping norm is not finite
            (``clip_grad_norm=``) is skipped all the same.
        clear_buffer: As :class:`DynamicLossScalingUpdater` takes it.
        accum_grad: As :class:`DynamicLossScalingUpdater` takes it.
        weight_decay: As :class:`DynamicLossScalingUpdater` takes it.
        comm: As :class:`DynamicLossScalingUpdater` takes it.
        grads: As :class:`DynamicLossScalingUpdater` takes it.
        average_accum: As :class:`DynamicLossScalingUpdater` takes it.
        clip_grad_norm: As :class:`DynamicLossScalingUpdater` takes it.
        monitor: As :class:`DynamicLossScalingUpdater` takes it.
        outputs: As :class:`DynamicLossScalingUpdater` takes it.
        lr_scheduler: As :class:`DynamicLossScalingUpdater` takes it.
        gradient_stats_every: As :class:`DynamicLossScalingUpdater` takes it.
        overflow: As :class:`DynamicLossScalingUpdater` takes it.
        reduction: As :class:`DynamicLossScalingUpdater` takes it.
        schedule: As :class:`DynamicLossScalingUpdater` takes it.
    """

    def __init__(self, solver: "nn.solver.Solver", loss: "nn.Variable",
                 data_feeder: Optional[Callable[[], Any]] = None, scale: float = 128.0,
                 enable_overflow_check: bool = True, clear_buffer: bool = True,
                 accum_grad: int = 1, weight_decay: Optional[float] = None, comm: Any = None,
                 grads: Optional[Sequence["nn.NdArray"]] = None, *,
                 average_accum: bool = False,
                 clip_grad_norm: Optional[float] = None,
                 monitor: Optional[Callable[[StepResult], Any]] = None,
                 outputs: Optional[Sequence["nn.Variable"]] = None, lr_scheduler: Any = None,
                 gradient_stats_every: Optional[int] = None,
                 overflow: Optional[OverflowHandling] = None,
                 reduction: Optional[GradientReduction] = None,
                 schedule: Optional[PrecisionSchedule] = None) -> None:
        opts = UpdaterOptions(
            data_feeder=data_feeder, clear_buffer=clear_buffer, accum_grad=accum_grad,
            average_accum=average_accum,
            weight_decay=weight_decay, comm=comm, grads=grads,
            enable_overflow_check=enable_overflow_check, clip_grad_norm=clip_grad_norm,
            monitor=monitor, outputs=outputs, lr_scheduler=lr_scheduler,
            gradient_stats_every=gradient_stats_every, overflow=overflow,
            reduction=reduction, schedule=schedule)
        super().__init__(solver, loss, FixedScale(scale), opts)


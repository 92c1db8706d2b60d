"""The step loop of both updaters: one training step, one decision.

One call of ``update()`` runs the step (:meth:`_LossScalingUpdater.update`)::

    zero the gradients
    before:       scale="auto" still to measure: calibrate on the first batch;
                  measured growth: watch the step's backward passes    scale/measured.py
    accum_grad times: feed a batch, forward (with outputs=), backward with
                  the loss scale                                         step/micro_batch.py
    decide:       all-reduce (with a communicator), check for overflow: an Outcome
                  (updated, or skipped and why)  step/decision.py, distributed/agreement.py
                  unscale, clip; a clipping norm not finite skips it too    step/unscale.py
    good step:    weight decay, the scheduled learning rate, solver.update() step/unscale.py
    skipped step: parameters and solver states stay as they are
    after:        tell the policy, in one place (_tell_policy): the scale backs off or
                  grows (measured growth: from the history of watched passes)
                                                          scale/policy.py, scale/measured.py
    after a skip: on a collapse, diagnose and act by floor_policy           step/collapse.py

Settings a script changes between steps take effect from the next step; each is a
property of :mod:`nnabla_mpt.settings`, listed by name in the class.

Both updaters run this loop; they differ in the policy that sets the scale and in their
arguments, written out in their constructors and checked where they are made
(:mod:`nnabla_mpt.updater`). What a valid updater state is and how it is saved,
:mod:`nnabla_mpt.updater_state` says.
"""
import difflib
import math
import threading
from collections import deque
from contextlib import contextmanager
from typing import Any, Deque, Iterator, Optional, Tuple

import nnabla as nn

from . import settings, updater_state
from .core import graph
from .core.loss_and_solver import solver_parameters, trained_loss
from .diagnosis.watch import RangeWatch
from .distributed import abort, agreement, launcher
from .distributed.gradient_reduction import backward_reduction, exchanged_grads
from .scale.measured import ScaleMeter
from .scale.precision_graphs import graph_at, updater_schedule
from .step import collapse
from .step.collapse import CollapseWatch
from .step.decision import LocalDecision, Outcome, StepResult
from .step.detector import BatchCheck, OverflowDetector, overflow_checks
from .step.micro_batch import (BackwardSeed, LossRecorder, StaleInputs, StepLosses,
                               install_feeder)
from .step.overflow_handling import check_retries
from .step.unscale import Unscaler


class StepLock:
    """One step, setting change, state load or save of an updater at a time:
    :meth:`held` takes it. A save (``state_dict()``, ``save_checkpoint()``) never makes
    another thread fail: one that finds a step running in another thread waits for it,
    and whoever finds a save running waits for the save. Anything else that finds the
    lock taken is refused with a ``RuntimeError``, and so is a save from inside a step
    (its feeder or monitor), which would wait for itself."""

    def __init__(self) -> None:
        self._lock = threading.Lock()            # held by whoever runs
        self._turns = threading.Condition()      # the waiting threads' queue and wake-ups
        self._running: Optional[int] = None      # the thread holding the lock, if any
        self._saving = False                     # whether it holds it for a save
        self._waiting: Deque[int] = deque()      # the threads waiting, first come first

    def enter(self, owner: str, what: str, save: bool = False) -> None:
        """Takes the lock for ``what`` of the updater class ``owner`` (``"update()"``,
        ``"weight_decay = 0.5"``, named in the ``RuntimeError`` that refuses it), a
        save where ``save``; :meth:`leave` gives it back. Waiting threads take it in the
        order they came: a thread saving in a loop cannot keep the steps out."""
        me = threading.get_ident()
        if not self._waiting and self._lock.acquire(blocking=False):   # free: at once
            self._saving, self._running = save, me
            return
        with self._turns:
            self._waiting.append(me)
            try:
                while not (self._waiting[0] == me and self._lock.acquire(blocking=False)):
                    running = self._running
                    if running is not None and (running == me or not (save or self._saving)):
                        raise _refused(f"{owner}.{what}", running == me)
                    self._turns.wait(0.05)     # woken by leave(), or looks again
            finally:
                self._waiting.remove(me)
                self._turns.notify_all()
        self._saving, self._running = save, me

    def leave(self) -> None:
        """Gives back what :meth:`enter` took, and wakes the threads waiting for it."""
        self._running, self._saving = None, False
        self._lock.release()
        if self._waiting:
            with self._turns:
                self._turns.notify_all()

    @contextmanager
    def held(self, owner: str, what: str, save: bool = False) -> Iterator[None]:
        """Runs the body with the lock taken (:meth:`enter`)."""
        self.enter(owner, what, save)
        try:
            yield
        finally:
            self.leave()


def _refused(what: str, this_thread: bool) -> RuntimeError:
    """The error of ``what`` tried while the updater runs a step, in this thread (from a
    feeder or a monitor) or in another one."""
    if what.endswith(".update()"):
        where = ("it was called from inside update() (a monitor hook or a data_feeder); "
                 "one updater runs one step at a time, so take the next step after "
                 "update() has returned" if this_thread else
                 "in another thread: one updater runs one step at a time (nnabla's graphs "
                 "and gradients are not safe to share between threads); call update() from "
                 "one thread, or give each thread an updater of its own graph")
        return RuntimeError(f"{what} is already running{':' if this_thread else ''} {where}")
    then = ("assign it between update() calls; it takes effect from the next one"
            if " = " in what else "call it between update() calls")
    if this_thread:
        return RuntimeError(f"{what} refused during update() (from a data_feeder or a "
                            f"monitor): {then}")
    return RuntimeError(f"{what} refused: update() is running in another thread; {then}, "
                        f"from the thread that calls update()")


# -- no other name, no copy ------------------------------------------------------------

def _refuse_unknown(updater: Any, name: str, value: Any) -> None:
    """The updaters' ``__setattr__``: refuses an attribute the updater does not have (a
    misspelt setting), naming the closest; the private ones are the updater's own."""
    if name.startswith("_") or hasattr(type(updater), name):
        object.__setattr__(updater, name, value)
        return
    public = [n for n in dir(type(updater)) if not n.startswith("_")]
    close = difflib.get_close_matches(name, public, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise AttributeError(f"{type(updater).__name__} has no setting {name!r} ({name} = "
                         f"{value!r} refused){hint} The settings: {', '.join(public)}")


def _refuse_copies(updater: Any, protocol: Any) -> Any:
    """The updaters' ``__reduce_ex__``: refuses ``copy``, ``deepcopy`` and ``pickle``. An
    updater holds the graph, the solver, the communicator and buffers of them, which no
    copy can share or split."""
    raise TypeError(f"{type(updater).__name__} cannot be copied or pickled: it runs the "
                    f"graph, solver and communicator it was built on; save what it learned "
                    f"with state_dict() or save_checkpoint(path) and load it into an updater "
                    f"built on the new graph (load_state_dict(), load_checkpoint(path))")


class _Run:
    """What an updater has run so far: its counters and its last result, apart from the
    updater's own attributes, whose assignments are checked (:func:`_refuse_unknown`)."""
    __slots__ = ("steps", "updates", "skipped_steps", "last_result")

    def __init__(self) -> None:
        self.steps = self.updates = self.skipped_steps = 0
        self.last_result: Optional[StepResult] = None


class _LossScalingUpdater:
    """The training step shared by every updater; see the subclasses. Its public
    attributes are listed below by name: the settings (:mod:`nnabla_mpt.settings`), the
    counters and the state's methods (:mod:`nnabla_mpt.updater_state`), the collapse
    handling's counters (:mod:`nnabla_mpt.step.collapse`). Any other public attribute is
    refused (:meth:`__setattr__`), and so are copies and pickles (:meth:`__reduce_ex__`).

    Args:
        solver, loss: As the updaters take them.
        scaling: The scale's arguments: ``scaling.policy_for(dtype)`` makes the loss-scale
            policy, given the :class:`~nnabla_mpt.core.dtypes.FloatType` of the loss, whose
            values bound the scales ``loss.backward(scale)`` can seed
            (:class:`~nnabla_mpt.scale.bounded_policy.DynamicPolicyArguments`,
            :class:`~nnabla_mpt.scale.bounded_policy.FixedScale`).
        opts: The checked values of the updater's options (an
            :class:`~nnabla_mpt.updater.UpdaterOptions`).
    """

    def __init__(self, solver, loss, scaling: Any, opts: Any) -> None:
        self._lock = StepLock()
        self._options = opts
        self._params = solver_parameters(solver)
        self._solver = solver
        self._loss = trained_loss(loss, self._params)
        self._precision = graph.gradient_precision(self._loss, self._params)
        self._schedule = updater_schedule(opts.schedule, self._loss, self._params,
                                          opts.outputs)
        high_precision_loss = getattr(self._schedule, "high_precision_loss", None)
        graphs = [v for v in (self._loss, high_precision_loss) if v is not None]
        self._passes = {id(v): (LossRecorder(v, opts.accum_grad, opts.outputs),
                                BackwardSeed(v)) for v in graphs}
        self._dtype = graph.float_type_of(self._loss)
        check_retries(opts.overflow.max_retries, opts.enable_overflow_check)
        self._policy = scaling.policy_for(self._dtype)
        install_feeder(self, opts.data_feeder)
        self._stale = StaleInputs(graph.data_inputs(self._loss, self._params))
        self._clear_buffer, self._accum_grad = opts.clear_buffer, opts.accum_grad
        self._max_retries = opts.overflow.max_retries
        self._average_accum = opts.average_accum
        self._monitor = opts.monitor
        batch = BatchCheck(graphs, self._params)
        _set_up_reduction(self, opts, graphs, batch)
        self._unscaler = Unscaler(solver, self._params, graph.float_context(self._loss), opts)
        self._collapse = CollapseWatch(opts.overflow, self._params, self._detector,
                                       self._policy, self._decider.agree_on_diagnosis, batch)
        self._meter = ScaleMeter(self._loss, self._params, self._policy, self._decider,
                                 opts.gradient_stats_every, scaling)
        self._run = _Run()

    # -- what a script reads and sets, by name ----------------------------------------------
    scale, data_feeder, accum_grad = settings.scale, settings.data_feeder, settings.accum_grad
    average_accum, weight_decay = settings.average_accum, settings.weight_decay
    clip_grad_norm, clear_buffer = settings.clip_grad_norm, settings.clear_buffer
    max_retries, floor_policy = settings.max_retries, settings.floor_policy
    diagnose_after = settings.diagnose_after
    comm, grads, solver, loss = settings.comm, settings.grads, settings.solver, settings.loss
    shared_gradients, monitor = settings.shared_gradients, settings.monitor
    policy = settings.policy
    enable_overflow_check = settings.enable_overflow_check
    schedule, overflow, reduction = settings.schedule, settings.overflow, settings.reduction
    outputs, lr_scheduler = settings.outputs, settings.lr_scheduler
    gradient_stats_every = settings.gradient_stats_every
    steps, updates = updater_state.steps, updater_state.updates
    skipped_steps = updater_state.skipped_steps
    overflow_streak = collapse.overflow_streak
    longest_overflow_streak = collapse.longest_overflow_streak
    bad_batches, last_report = collapse.bad_batches, collapse.last_report
    state_dict, load_state_dict = updater_state.state_dict, updater_state.load_state_dict
    save_checkpoint = updater_state.save_checkpoint
    load_checkpoint = updater_state.load_checkpoint

    last_result = settings.last_result
    __setattr__ = _refuse_unknown
    __reduce_ex__ = _refuse_copies

    # -- what the step runs, as it is now ----------------------------------------------
    precision = settings.precision

    @property
    def _next_scale(self) -> float:
        """The scale of the next step (the ``scale`` setting): 1 after a precision switch."""
        return 1.0 if self._switched() else self._policy.loss_scale

    def _switched(self) -> bool:
        """Whether the precision schedule runs the next step in full precision."""
        return self._schedule is not None and not self._schedule.reduced(self._run.steps)

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
        self._lock.enter(type(self).__name__, "update()")
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
            self._lock.leave()

    def _step(self, attempts: int) -> StepResult:
        run = self._run
        index = run.steps
        loss, precision = (graph_at(self._schedule, index, self._loss, self._precision)
                           if self._schedule is not None else (self._loss, self._precision))
        recorder, seed = self._passes[id(loss)]
        losses = recorder.start()
        meter = self._meter if precision != "float" or self._schedule is None else None
        fed, watch = self._measure_first(meter, index, recorder, losses)
        scale = 1.0 if meter is None else self._policy.loss_scale
        self._forward_backward(recorder, seed.at(scale), scale, losses, watch, fed)
        stats = self._meter.statistics(index) if self._meter.stats_every else None
        outcome, measured = self._decide(loss, losses, index, watch, seed.held)
        skipped = outcome.skipped
        at_floor = skipped and meter is not None and self._policy.at_min_scale
        held_by = None
        if meter is not None and outcome.scale_at_fault:
            held_by = self._tell_policy(meter, outcome, measured)
        if fed and outcome is Outcome.BAD_BATCH:
            meter.calibration_pending = True           # the next step measures its own
        run.steps += 1
        if skipped:
            run.skipped_steps += 1
            self._collapse.count_skip(outcome)
        else:
            self._unscaler.apply()
            run.updates += 1
            self._collapse.overflow_streak = 0
        schedule = self._schedule
        if schedule is not None and schedule.needs_loss and math.isfinite(losses.mean()):
            schedule.observe_loss(index, losses.mean())
        result = StepResult(index, skipped, scale, self._next_scale, attempts, precision,
                            stats, outcome is Outcome.BAD_BATCH, held_by,
                            run.skipped_steps, losses)
        run.last_result = result
        if self._monitor is not None:
            self._monitor(result)
        if skipped:
            self._collapse.after_skip(index, scale, result.next_scale, loss, at_floor, outcome)
        return result

    def _decide(self, loss: "nn.Variable", losses: StepLosses, index: int,
                watch: Optional[RangeWatch], held: float) -> Tuple[Outcome, Any]:
        """The step's one decision once its backward passes ran: its :class:`Outcome`, and
        on an update what ``watch`` measured for growth (None without a watch). The
        gradients are all-reduced (with a communicator) and checked, alike on every rank;
        a good step's are then measured, unscaled by the seed's ``held`` scale and clipped,
        and a clipping norm that is not finite skips it after all."""
        if watch is not None and self._in_backward is None:
            self._meter.watch_own(watch)     # this rank's gradients, before the reduce
        outcome = self._decider.decide(loss, losses, index)
        if outcome.skipped:
            return outcome, None
        measured = None if watch is None else self._meter.growth_room(watch, held)
        norm = self._unscaler.unscale(held, self._run.updates)
        if norm is not None and not math.isfinite(norm):
            return Outcome.NONFINITE_NORM, measured
        return outcome, measured

    def _measure_first(self, meter: Optional[ScaleMeter], index: int, recorder: LossRecorder,
                       losses: StepLosses) -> Tuple[bool, Optional[RangeWatch]]:
        """``(fed, watch)`` before the step's passes: where ``scale="auto"`` is still to
        measure, the first micro-batch is fed and forwarded and the start measured on it
        (:meth:`ScaleMeter.calibrate`), given to the policy (``fed``: the first micro-batch
        is ready); ``watch`` watches the passes where measured growth looks
        (:meth:`ScaleMeter.growth_watch`), else None. ``(False, None)`` where the step is
        unscaled (``meter`` None: no scale to measure)."""
        if meter is None:
            return False, None
        fed = meter.calibration_pending
        start = meter.calibrate(self._feed, lambda: recorder.forward(losses, 0, False),
                                self._zero_grads) if fed else None
        measured = getattr(self._policy, "growth_mode", None) == "measured"
        watch = meter.growth_watch(index) if measured else None
        if start is not None:
            self._policy.set_loss_scale(start)     # the start scale="auto" measured
        return fed, watch

    def _tell_policy(self, meter: ScaleMeter, outcome: Outcome, measured: Any) -> Optional[str]:
        """Tells the policy how the step went, with the room the meter measured; returns
        what held a measured growth point short of that room
        (:meth:`~nnabla_mpt.scale.scale_history.GrowthLimit.held_by`), else None."""
        policy = self._policy
        due, before = outcome is Outcome.UPDATED and policy.growth_due, policy.loss_scale
        room, free = (None, None) if measured is None else meter.settled(measured,
                                                                          outcome.skipped)
        policy.update(outcome.skipped, room)      # the one place the policy hears of a step
        if not due or room is None:
            return None
        return meter.limit.held_by(before, policy.loss_scale, room, free,
                                   meter.history.margin())

    def _forward_backward(self, recorder: LossRecorder, seed: "nn.NdArray", scale: float,
                          losses: StepLosses, watch: Optional[RangeWatch], fed: bool) -> None:
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
                if self._feed is not None:
                    self._feed()
                recorder.forward(losses, i, clear)
            callbacks = reduce if i == last else None
            if watch is None:
                loss.backward(seed, clear_buffer=clear, communicator_callbacks=callbacks)
            else:
                watch.run(loss, scale, clear, callbacks)


def _set_up_reduction(updater: "_LossScalingUpdater", opts: Any, graphs,
                      batch: BatchCheck) -> None:
    """Gives ``updater`` (in its constructor) the communicator, the gradients it
    reduces, the overflow check and the step's decision (local, or agreed by the ranks),
    the shared gradients."""
    reduction = opts.reduction
    updater._comm = abort.updater_comm(opts.comm, reduction.abort_on_exception)
    if updater._comm is None:
        launcher.warn_training_alone()
    updater._grads = exchanged_grads(opts.grads, updater._comm, reduction, updater._params)
    updater._detector = OverflowDetector(opts.overflow.mode)
    pack = backward_reduction(reduction, updater._comm, opts.overflow.mode == "saturation",
                              graphs, updater._params)
    float32_cpu = (updater._schedule is None and updater._dtype.name == "float32"
                   and graph.extension_of(updater._loss) == "cpu")
    checks = (None, None)                        # enable_overflow_check=False: none
    if opts.enable_overflow_check:
        checks = overflow_checks(updater._detector.mode, updater._solver, updater._params,
                                 float32_cpu, graph.float_context(updater._loss),
                                 updater._comm is not None)
    float_only = updater._precision == "float" and updater._schedule is None
    if updater._comm is None:
        updater._decider, updater._shared_gradients = LocalDecision(checks[0], batch), None
    else:
        exchanged = agreement.StepExchange(updater._comm, updater._loss, updater._params,
                                           updater._grads, reduction.shared_grads,
                                           float_only, reduction.average_ranks)
        updater._decider = agreement.StepAgreement(exchanged, checks, updater._detector.mode,
                                                   batch, pack)
        updater._shared_gradients = updater._decider.shared
        agreement.warn_float16_reduction(updater._decider.reduction, updater._precision,
                                         updater._schedule is not None,
                                         reduction.average_ranks)
        agreement.warn_device_mismatch(updater._comm, updater._loss)
    updater._in_backward = updater._decider.in_backward
    updater._zero_grads = (updater._solver.zero_grad if updater._shared_gradients is None
                           else updater._shared_gradients.zero)

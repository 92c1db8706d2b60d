"""Precision schedule: reduced precision for most of training, full precision at the end.

The schedule is asked for with a string ``"TYPE|TRIGGER|VALUE"``:

* ``TYPE``: ``fast`` (float16) or ``fast1`` (bfloat16).
* ``TRIGGER`` ``step``: the first ``VALUE`` fraction of the total steps run in reduced
  precision, the rest in full precision. ``VALUE`` in [0.2, 0.9], default 0.9.
* ``TRIGGER`` ``loss``: reduced precision until the loss falls to ``VALUE`` × the target
  loss, then full precision. ``VALUE`` in [1.01, 1.5], default 1.05.

This module is pure Python: it parses, validates and decides; the updater runs the graphs.

Example:
    >>> from nnabla_mpt.scale.precision import AccelerateTrainMode
    >>> mode = AccelerateTrainMode.parse("fast|step|0.8")
    >>> mode.switch_step(total_steps=50)
    40
    >>> AccelerateTrainMode.parse("fast|loss").value
    1.05
"""
import math
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any, Dict, Mapping, Optional

from ..core import _validate as check

TYPES = {"fast": "half", "fast1": "bfloat16"}
TRIGGERS = {
    # trigger: (lowest, highest, default), as decimal strings so bounds are exact
    "step": ("0.2", "0.9", "0.9"),
    "loss": ("1.01", "1.5", "1.05"),
}
_SCHEDULE_STATE_VERSION = 1


#: What a mode string looks like, for the message refusing a malformed one.
_SYNTAX = ("expected 'TYPE|TRIGGER|VALUE' with TYPE in {fast, fast1}, TRIGGER in "
           "{step, loss}, VALUE optional (step: 0.2 to 0.9, default 0.9; loss: 1.01 to 1.5, "
           "default 1.05), e.g. 'fast|step|0.9'")


@dataclass(frozen=True)
class AccelerateTrainMode:
    """A parsed precision-schedule mode string (``PrecisionSchedule(mode)``).

    Attributes:
        type: ``"fast"`` or ``"fast1"``.
        trigger: ``"step"`` or ``"loss"``.
        value: The fraction of steps (step trigger) or the loss ratio (loss trigger).
        text: The canonical string, ``"TYPE|TRIGGER|VALUE"``, with VALUE in its shortest
            decimal form: one value written differently (``0.90``, ``.9``, ``9e-1``) is
            one schedule, and modes compare equal by their parsed fields.
    """
    type: str
    trigger: str
    value: float
    text: str

    @classmethod
    def parse(cls, mode: Any) -> "AccelerateTrainMode":
        """Parses and validates ``mode``.

        Raises:
            TypeError: ``mode`` is not a string.
            ValueError: a field is missing, unknown or out of range; the message names the
                field, the value received and what is allowed.
        """
        if not isinstance(mode, str):
            raise TypeError(f"mode must be a string such as 'fast|step|0.9', "
                            f"got {mode!r} of type {type(mode).__name__}")
        fields = mode.split("|")
        if mode.strip() == "" or not 2 <= len(fields) <= 3:
            raise ValueError(f"mode={mode!r} is malformed: {_SYNTAX}")
        kind, trigger = fields[0].strip(), fields[1].strip()
        if kind not in TYPES:
            raise ValueError(f"mode={mode!r}: TYPE must be 'fast' (float16) "
                             f"or 'fast1' (bfloat16), got {kind!r}")
        if trigger not in TRIGGERS:
            raise ValueError(f"mode={mode!r}: TRIGGER must be 'step' or "
                             f"'loss', got {trigger!r}")
        low, high, default = TRIGGERS[trigger]
        raw = fields[2].strip() if len(fields) == 3 else ""
        if len(fields) == 3 and raw == "":
            raise ValueError(f"mode={mode!r}: VALUE is empty; omit it with "
                             f"its '|' to take the default {default}, or give a number in "
                             f"[{low}, {high}]")
        raw = raw or default
        if not raw.isascii():     # float() and Fraction() would read any Unicode digit
            raise ValueError(f"mode={mode!r}: VALUE must be written with the "
                             f"ASCII digits 0-9, got {raw!r}")
        try:
            exact = Fraction(raw)
            number = float(raw)
        except (ValueError, ZeroDivisionError):
            raise ValueError(f"mode={mode!r}: VALUE must be a number in "
                             f"[{low}, {high}] for the {trigger!r} trigger, got {raw!r}") from None
        if not Fraction(low) <= exact <= Fraction(high):
            raise ValueError(f"mode={mode!r}: VALUE for the {trigger!r} "
                             f"trigger must lie in [{low}, {high}], got {raw}")
        return cls(type=kind, trigger=trigger, value=number,
                   text=f"{kind}|{trigger}|{_shortest(raw)}")

    def switch_step(self, total_steps: int) -> int:
        """Step trigger: index of the first full-precision step, ``ceil(VALUE × total)``."""
        if self.trigger != "step":
            raise ValueError(f"switch_step needs the 'step' trigger, this mode is {self.text!r}")
        total_steps = check.integer("total_steps", total_steps, ge=1)
        value = self.text.split("|")[2]
        return math.ceil(Fraction(value) * total_steps)


class PrecisionSchedule:
    """Decides, step by step, whether training runs in reduced or full precision.

    The switch happens once and is never undone.

    * Step trigger: step ``k`` runs in full precision when ``k >= ceil(VALUE × total_steps)``.
    * Loss trigger: the first step whose loss is ``<= VALUE × final_loss`` is the last one in
      reduced precision; every later step runs in full precision.

    Given to an updater as ``schedule=``, it runs ``loss`` (built under a half context) in
    reduced precision first, then ``high_precision_loss`` (the same network's loss built
    under the float context, sharing the parameters) run with scale 1 and the overflow
    check kept. The updater runs this very object (``updater.schedule is schedule``) and
    records its switch in it: give each run a schedule of its own.

    Args:
        mode: ``"TYPE|TRIGGER|VALUE"``, e.g. ``"fast|step|0.9"`` (see the module).
        total_steps: Total number of steps of the run (step trigger).
        final_loss: The target loss (loss trigger); ``> 0``.
        high_precision_loss: The loss of the full-precision steps (an updater needs it).

    Example:
        >>> from nnabla_mpt import PrecisionSchedule
        >>> PrecisionSchedule("fast|step|0.9", total_steps=1000).switch_step
        900
    """

    def __init__(self, mode: str, total_steps: Optional[int] = None,
                 final_loss: Optional[float] = None, high_precision_loss: Any = None) -> None:
        self.mode = AccelerateTrainMode.parse(mode)
        self.high_precision_loss = high_precision_loss
        self.total_steps = None
        self.final_loss = None
        self.switch_step: Optional[int] = None
        self.switch_loss: Optional[float] = None
        if self.mode.trigger == "step":
            if total_steps is None:
                raise ValueError(f"mode={mode!r} uses the 'step' trigger: "
                                 f"pass total_steps, the total number of training steps")
            if final_loss is not None:
                raise ValueError(f"final_loss={final_loss!r} is for the 'loss' trigger; "
                                 f"mode={mode!r} uses 'step'")
            self.total_steps = check.integer("total_steps", total_steps, ge=1)
            self.switch_step = self.mode.switch_step(self.total_steps)
        else:
            if final_loss is None:
                raise ValueError(f"mode={mode!r} uses the 'loss' trigger: "
                                 f"pass final_loss, the target loss of the run")
            if total_steps is not None:
                raise ValueError(f"total_steps={total_steps!r} is for the 'step' trigger; "
                                 f"mode={mode!r} uses 'loss'")
            self.final_loss = check.real("final_loss", final_loss, gt=0.0)

    @property
    def loss_threshold(self) -> Optional[float]:
        """Loss trigger: the loss at or below which the run switches."""
        return None if self.final_loss is None else self.mode.value * self.final_loss

    @property
    def needs_loss(self) -> bool:
        """True while the schedule waits for the loss to reach its threshold."""
        return self.mode.trigger == "loss" and self.switch_step is None

    def reduced(self, step: int) -> bool:
        """Whether step ``step`` runs in reduced precision."""
        return self.switch_step is None or step < self.switch_step

    def observe_loss(self, step: int, loss: float) -> None:
        """Loss trigger: records the loss of ``step``; the first at or below
        :attr:`loss_threshold` sets the switch (:attr:`switch_step` is ``step + 1``)."""
        if self.needs_loss and loss <= self.loss_threshold:
            self.switch_step = step + 1
            self.switch_loss = float(loss)

    def describe_switch(self) -> str:
        """One line for the log: when and why the run switched."""
        if self.mode.trigger == "step":
            return (f"step {self.switch_step} of {self.total_steps} and later run in full "
                    f"precision")
        return (f"the loss {self.switch_loss:g} of step {self.switch_step - 1} reached "
                f"{self.mode.value:g} x final_loss = {self.loss_threshold:g}; step "
                f"{self.switch_step} and later run in full precision")

    def state_dict(self) -> Dict[str, Any]:
        return {"version": _SCHEDULE_STATE_VERSION, "mode": self.mode.text,
                "total_steps": self.total_steps, "final_loss": self.final_loss,
                "switch_step": self.switch_step, "switch_loss": self.switch_loss}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        check.exact_keys("state['precision']", state, self.state_dict())
        check.version("state['precision']", state, _SCHEDULE_STATE_VERSION)
        saved = (state["mode"], state["total_steps"], state["final_loss"])
        mine = (self.mode.text, self.total_steps, self.final_loss)
        if (_parsed(state["mode"]), saved[1:]) != (self.mode, mine[1:]):
            raise ValueError(f"the checkpoint's precision schedule (mode, "
                             f"total_steps, final_loss) = {saved} differs from this "
                             f"updater's {mine}")
        switch = state["switch_step"]
        if self.mode.trigger == "step" and switch != self.switch_step:
            raise ValueError(f"state['precision']['switch_step']={switch!r} does not match "
                             f"the step trigger's {self.switch_step}")
        if switch is not None:
            switch = check.integer("state['precision']['switch_step']", switch, ge=0)
        loss = state["switch_loss"]
        if (loss is None) != (self.mode.trigger == "step" or switch is None):
            raise ValueError(f"state['precision']['switch_loss']={loss!r} does not fit "
                             f"switch_step={switch!r} of the {self.mode.trigger!r} trigger")
        self.switch_step = switch
        self.switch_loss = None if loss is None else float(loss)


def _shortest(number: str) -> str:
    """The decimal ``number`` written without exponent or trailing zeros, exactly
    (``"9e-1"``, ``".90"`` -> ``"0.9"``)."""
    plain = format(Decimal(number), "f")
    return plain.rstrip("0").rstrip(".") if "." in plain else plain


def _parsed(mode: Any) -> AccelerateTrainMode:
    """``state['precision']['mode']`` parsed, or a ValueError naming it."""
    try:
        return AccelerateTrainMode.parse(mode)
    except (TypeError, ValueError) as err:
        raise ValueError(f"state['precision']['mode']={mode!r} is not a precision schedule: "
                         f"{err}") from None

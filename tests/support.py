"""Small real nnabla networks and data for the tests.

Every network is tiny on purpose: float16 arithmetic on the CPU is slow. Parameters and
batches come from fixed seeds, so two networks built with the same arguments start from the
same parameters and see the same data.

An error or a warning is checked by the facts its message carries, not by its wording:
:func:`raises_naming` and :func:`assert_names`.
"""
import contextlib
from typing import Dict, Optional

import numpy as np
import pytest

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla.solvers as S
from nnabla.ext_utils import get_extension_context


def context(type_config: str = "float"):
    return get_extension_context("cpu", type_config=type_config)


class Net:
    """``x -> [activation(affine)] -> affine -> mean squared error against t``.

    Without ``hidden`` the model is linear, ``y = x W + b``, and its gradients are known in
    closed form (:func:`linear_mse_grads`).

    Args:
        type_config: ``"float"`` or ``"half"``; the graph and solvers use this context.
        ctx: A context to use instead (a backend list of one's own, another device_id).
        scope: Parameter scope; parameter names are given relative to it.
        activation: The hidden layer's function (``"tanh"``, ``"relu"``) with ``hidden``.

    Batches can be made special by their index (the feeder's call count):

    * ``net.bad``: an inf in ``x``, so the loss itself is not finite.
    * ``net.nan``: a NaN in ``x``. Through a ReLU (``activation="relu"``) the loss stays
      finite, since ReLU maps NaN to 0, while the first layer's weight gradient is NaN.
    * ``net.huge``: ``x * 1e3``. In float32 the loss stays finite while the scaled gradients
      exceed 65504 (an overflow in saturation mode); in float16 the loss overflows.
    * ``net.large``: ``x * 20``. For the linear float16 network the loss stays finite and
      the gradients overflow at a scale of 2048 (ordinary batches do not).
    """

    def __init__(self, type_config: str = "float", *, batch: int = 4, d_in: int = 3,
                 hidden: Optional[int] = None, d_out: int = 2, seed: int = 0,
                 scope: str = "net", data_seed: int = 1000,
                 activation: str = "tanh", ctx: Optional[nn.Context] = None) -> None:
        self.ctx = context(type_config) if ctx is None else ctx
        self.data_seed = data_seed
        with nn.context_scope(self.ctx), nn.parameter_scope(scope):
            self.x = nn.Variable((batch, d_in))
            self.t = nn.Variable((batch, d_out))
            h = self.x
            if hidden:
                h = getattr(F, activation)(PF.affine(h, hidden, name="hidden"))
            self.y = PF.affine(h, d_out, name="out")
            self.loss = F.mean(F.squared_error(self.y, self.t))
            self.params = nn.get_parameters(grad_only=False)
        rng = np.random.RandomState(seed)
        for v in self.params.values():
            v.d = rng.uniform(-0.5, 0.5, v.shape).astype(np.float32)
        self.calls = 0          # how many batches the feeder has loaded
        self.bad = set()
        self.nan = set()
        self.huge = set()
        self.large = set()

    def batch(self, index: int):
        """The batch number ``index`` as float32 arrays ``(x, t)``."""
        rng = np.random.RandomState(self.data_seed + index)
        x = rng.randn(*self.x.shape).astype(np.float32)
        t = rng.randn(*self.t.shape).astype(np.float32)
        if index in self.huge:
            x = x * np.float32(1e3)
        if index in self.large:
            x = x * np.float32(20.0)
        if index in self.bad:
            x[0, 0] = np.inf
        if index in self.nan:
            x[0, 0] = np.nan
        return x, t

    def feed(self, index: int) -> None:
        self.x.d, self.t.d = self.batch(index)

    def feeder(self) -> None:
        """A data feeder as the updaters call it: loads the next batch."""
        self.feed(self.calls)
        self.calls += 1

    def solver(self, kind: str = "Sgd", **kwargs):
        with nn.context_scope(self.ctx):
            solver = getattr(S, kind)(**kwargs)
        solver.set_parameters(self.params)
        return solver

    def snapshot(self) -> Dict[str, np.ndarray]:
        return {name: np.array(v.d, copy=True) for name, v in self.params.items()}


def solver_states(solver) -> Dict[str, tuple]:
    """``name -> (t, {key: array copy})`` of the solver's states."""
    return {name: (int(st.t), {key: np.array(var.d, copy=True)
                               for key, var in st.pstate.items()})
            for name, st in solver.get_states().items()}


def assert_bitwise_equal(a: Dict[str, np.ndarray], b: Dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        x, y = np.asarray(a[name]), np.asarray(b[name])
        assert x.dtype == y.dtype and x.shape == y.shape, name
        # Compare the bytes so that NaN payloads and -0.0 count too.
        assert x.tobytes() == y.tobytes(), f"{name} differs: {x} vs {y}"


def assert_states_bitwise_equal(a, b) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name][0] == b[name][0], f"t of {name}: {a[name][0]} vs {b[name][0]}"
        assert_bitwise_equal(a[name][1], b[name][1])


# -- messages: the facts an error or a warning carries, not its wording -------------------

def _wordy(c: str) -> bool:
    return c.isalnum() or c == "_"


def _stands_alone(text: str, at: int, fact: str) -> bool:
    """Whether ``fact`` found at ``text[at:]`` is not a piece of a longer name or number."""
    end = at + len(fact)
    before, after = text[max(at - 2, 0):at], text[end:end + 2]
    if _wordy(fact[0]) and before[-1:] and _wordy(before[-1]):
        return False
    if _wordy(fact[-1]) and after[:1] and _wordy(after[0]):
        return False
    # A number goes on past a decimal point: "0" is not found in "0.5", nor "5" in "0.5".
    if fact[0].isdigit() and len(before) == 2 and before[1] == "." and before[0].isdigit():
        return False
    if fact[-1].isdigit() and len(after) == 2 and after[0] == "." and after[1].isdigit():
        return False
    return True


def assert_names(text: str, *facts: str) -> None:
    """Asserts that the message ``text`` holds each of ``facts``: plain substrings, not
    patterns, such as the argument's name (``"GradientReduction.shared_grads"``), the value
    as the user wrote it (its repr, ``"'yes'"``), the path, the type, and the words of what
    to do (``"comm.clear_all_reduce_callback()"``).

    A fact is found only as a whole: not as a piece of a longer name or number (``"scale"``
    is not found in ``"min_scale"``, ``"N"`` not in ``"None"``, ``"0"`` not in ``"10"`` or
    ``"0.5"``). And each fact must appear on its own: where one fact is part of another
    (the value ``"1"`` and the bound ``">= 1"``), the message must hold it a second time,
    apart from the other; a fact listed twice must appear twice. The failure names the
    facts missing and shows the whole message.
    """
    if not facts:
        raise TypeError("assert_names needs at least one fact to look for")
    for fact in facts:
        if not isinstance(fact, str) or not fact:
            raise TypeError(f"a fact must be a non-empty str, got {fact!r}")
    taken = [False] * len(text)
    missing = []
    # The longest first, so that a short fact does not take the place of a longer one.
    for fact in sorted(facts, key=len, reverse=True):
        at = text.find(fact)
        while at >= 0 and (any(taken[at:at + len(fact)])
                           or not _stands_alone(text, at, fact)):
            at = text.find(fact, at + 1)
        if at < 0:
            missing.append(fact)
        else:
            taken[at:at + len(fact)] = [True] * len(fact)
    if missing:
        raise AssertionError(f"the message lacks {', '.join(map(repr, missing))} (each "
                             f"as a whole, apart from the other facts); the message:\n{text}")


@contextlib.contextmanager
def raises_naming(kind, *facts: str):
    """``pytest.raises(kind)``, then asserts that the message holds each of ``facts``, as
    :func:`assert_names` does. Yields pytest's ``ExceptionInfo``, for the error's
    attributes after the block.
    """
    with pytest.raises(kind) as info:
        yield info
    assert_names(str(info.value), *facts)


def linear_mse_grads(W: np.ndarray, b: np.ndarray, x: np.ndarray, t: np.ndarray):
    """Gradients of ``mean((x W + b - t) ** 2)`` with respect to ``W`` and ``b``."""
    x, t = x.astype(np.float64), t.astype(np.float64)
    y = x @ W + b
    dy = 2.0 * (y - t) / y.size
    return x.T @ dy, dy.sum(axis=0)


# -- the resume case, shared by test_state_checkpoint.py and workers/resume_worker.py -------

RESUME_ACCUM = 2


def resume_setup(scope: str = "net"):
    """A float16 run with Adam and a dynamic scale that overflows now and then.

    The feeder loads batches by step index (``updater.steps``), so a run resumed from a
    checkpoint in another process sees exactly the batches the uninterrupted run saw.
    Some batches (``net.large``) overflow at the largest float16 scale, 2**15, so the scale
    backs off and grows again on both sides of step 8.

    Returns:
        (net, solver, updater)
    """
    from nnabla_mpt import DynamicLossScale, DynamicLossScalingUpdater

    net = Net("half", hidden=4, scope=scope)
    net.large = {4, 6, 7, 12, 20, 22, 24, 26}
    solver = net.solver("Adam", alpha=1e-2)
    updater = None

    def feeder():
        micro = net.calls % RESUME_ACCUM
        net.feed(updater.steps * RESUME_ACCUM + micro)
        net.calls += 1

    updater = DynamicLossScalingUpdater(solver, net.loss, feeder,
                                        policy=DynamicLossScale(
                                            init_scale=2.0 ** 15, growth_interval=3, hysteresis=2),
                                        accum_grad=RESUME_ACCUM, weight_decay=1e-3)
    return net, solver, updater


def run_steps(updater, steps: int):
    """Runs ``steps`` updates; returns ``[(step, skipped, scale, next_scale), ...]``."""
    out = []
    for _ in range(steps):
        r = updater.update()
        out.append((r.step, r.skipped, r.scale, r.next_scale))
    return out


# -- the precision-schedule case, shared by test_precision.py and test_nccl_like.py -------
BATCH = 8


def batch_for(step):
    rng = np.random.RandomState(1000 + step)
    x = rng.randn(BATCH, 4).astype(np.float32)
    t = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], dtype=np.float32)).astype(np.float32)
    return x, t


def build(seed=0):
    """Two graphs of one network, half and float, sharing parameters by name."""
    nn.clear_parameters()
    nn.seed(seed)
    x = nn.Variable((BATCH, 4))
    t = nn.Variable((BATCH, 1))

    def net(ctx):
        with nn.context_scope(ctx), nn.parameter_scope("net"):
            h = F.tanh(PF.affine(x, 8, name="fc1"))
            y = PF.affine(h, 1, name="fc2")
            return F.mean(F.squared_error(y, t))

    loss_half = net(context("half"))
    loss_float = net(context("float"))
    with nn.context_scope(context("half")):
        solver = S.Adam(0.02)
    solver.set_parameters(nn.get_parameters())
    return x, t, loss_half, loss_float, solver


def make_updater(mode="fast|step|0.8", total=50, final_loss=None, scale=2.0 ** 14, **kw):
    from nnabla_mpt import DynamicLossScalingUpdater, PrecisionSchedule
    x, t, loss_half, loss_float, solver = build()
    holder = {}

    def feed():
        xs, ts = batch_for(holder["u"].steps)
        x.d, t.d = xs, ts

    u = DynamicLossScalingUpdater(solver, loss_half, feed, scale=scale, N=4,
                                  schedule=PrecisionSchedule(
                                      mode, total_steps=total if "step" in mode else None,
                                      final_loss=final_loss, high_precision_loss=loss_float),
                                  **kw)
    holder["u"] = u
    return u, (x, t, loss_half, loss_float, solver)

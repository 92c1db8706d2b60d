#!/usr/bin/env python
"""Checks on a GPU what the test suite checks on the CPU with stand-ins.

Run it from the checkout, on a machine with a CUDA device and the nnabla-ext-cuda that
matches the installed nnabla, as one process (no ``mpirun``)::

    python tools/gpu_check.py            # --device N to use another GPU than 0

It prints one line per check, ``PASS name: detail``, ``FAIL name: detail`` or
``SKIP name: why`` (lines starting with ``#`` describe the machine), and exits with status
1 if a check failed, 3 if nothing was checked (no CUDA: it says what it needs; or every
check skipped), else 0, so that a CI job never reads "nothing checked" as a pass. It is meant
to take a few minutes at most (not measured: no GPU was at hand). Send its whole output
with a bug report.

The checks (each one function, ``check_*``; each catches its own errors and reports them
as FAIL):

* ``dtype_<ext>_<type_config>``: the dtype of every function's output in a small graph
  (convolution, affine, ReLU, squared error, mean), of their gradients and of the
  parameters' gradients under cudnn ``half``/``mixed_half`` and cuda ``half``/
  ``mixed_half`` (float16, float16, float16, float32 as read in nnabla-ext-cuda's
  sources), and that ``nnabla_mpt.core.graph.loss_dtype`` reads the same.
* ``reduction_device``: every context nnabla hands out while an updater is built and
  steps (measured scaling, gradient statistics, clipping, both overflow modes) names the
  loss's device (the last GPU when there are several), and
  ``nnabla_mpt.core.graph.float_context(loss)`` keeps the loss's device and array class.
* ``clipping``: ``clip_grad_norm=`` on one float16 layer of 4 million weights whose scaled
  gradients' squares sum far beyond 65504, against a float64 reference computed on the
  host from the same float16 gradients.
* ``host_reads``: what one good step asks of the solver (through a proxy that counts its
  method calls): nnabla-ext-cuda's ``check_inf_or_nan_grad`` takes one host
  synchronisation per parameter and must not be called on a good step; and the step's
  time against forward + backward + update written by hand. Host reads themselves are
  not counted: nnabla has no counter for them.
* ``training``: an MLP trained 200 steps in float16 with ``scale="auto",
  growth_mode="measured"`` and in float32 from the same parameters on the same batches;
  the final losses over the whole data set must agree within ``LOSS_RTOL``/``LOSS_ATOL``.
* In a child process per communicator (MPI and NCCL start there, and a crash or hang
  there is reported as a FAIL): ``communicator_dtype_<ext>_<type_config>``, the dtype a
  float32 array has after an all-reduce by nnabla's communicator made from cudnn
  ``half``, cudnn ``mixed_half`` and cuda ``mixed_half`` (float16, float16, float32);
  with the float16 one, ``communicator_model_check`` (bytes through
  ``nnabla_mpt.distributed.exchange.handshake``, and an updater built with ``comm=``),
  ``communicator_loss`` (a float32 loss beyond float16's range reported exactly) and
  ``collectives`` (the communicator's calls at construction, on a good and on a skipped
  step, counted through a proxy passed as ``comm``). One process: size 1.

Written where no GPU exists, it has not been run on one; ``tests/test_gpu_check.py`` runs
it without CUDA and runs its checks on the CPU with the suite's stand-ins.
"""
import argparse
import collections
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))           # this checkout's nnabla_mpt first

#: (extension, type_config) -> the dtype a graph computes in, from nnabla-ext-cuda's sources.
COMPUTE_DTYPES = {("cudnn", "half"): "float16", ("cudnn", "mixed_half"): "float16",
                  ("cuda", "half"): "float16", ("cuda", "mixed_half"): "float32"}
#: "ext:type_config" of a communicator's context -> the dtype it reduces in.
COMMUNICATOR_DTYPES = {"cudnn:half": "float16", "cudnn:mixed_half": "float16",
                       "cuda:mixed_half": "float32"}
#: The sizes of the checks run by ``local_checks`` (the tests make them small).
SIZES = {"train_steps": 200, "clip_width": 2048, "reads_steps": 20,
         "reads_widths": (512, 512, 16)}
#: The float16 run's final loss may differ from the float run's by this much.
LOSS_RTOL, LOSS_ATOL = 0.05, 0.02
#: Relative error allowed between the clipped gradients and the float64 reference.
CLIP_RTOL = 1e-3
CHILD_TIMEOUT = 120.0           # seconds for each communicator's child process
STATUSES = ("PASS", "FAIL", "SKIP")


# -- results -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Result:
    """One check's outcome: ``status`` is PASS, FAIL or SKIP."""
    status: str
    name: str
    detail: str

    def line(self) -> str:
        return f"{self.status} {self.name}: {self.detail}"


class Skip(Exception):
    """Raised by a check that cannot run here; the message says why."""


def run_check(name: str, check: Callable[..., Tuple[bool, str]], *args: Any,
              **kwargs: Any) -> Result:
    """``check(*args, **kwargs)`` returns ``(ok, detail)``: PASS or FAIL with that detail;
    :class:`Skip` is a SKIP, and any other exception a FAIL naming it."""
    try:
        ok, detail = check(*args, **kwargs)
    except Skip as why:
        return Result("SKIP", name, str(why))
    except Exception as exc:  # noqa: BLE001 (a check must not end the script)
        return Result("FAIL", name, f"{type(exc).__name__}: {exc}".replace("\n", " "))
    return Result("PASS" if ok else "FAIL", name, detail)


def parse_line(line: str) -> Optional[Result]:
    """The :class:`Result` a line printed by :meth:`Result.line` stands for, else None."""
    status, _, rest = line.partition(" ")
    name, sep, detail = rest.partition(": ")
    if status not in STATUSES or not sep or not name:
        return None
    return Result(status, name, detail)


def report(result: Result) -> Result:
    print(result.line(), flush=True)
    return result


# -- the machine ---------------------------------------------------------------------------

def cuda_problem() -> Tuple[Optional[str], List[str]]:
    """``(what is missing, or None; lines describing the machine)``."""
    info = [f"Python {sys.version.split()[0]}"]
    try:
        import nnabla
    except Exception as exc:  # noqa: BLE001
        return f"nnabla cannot be imported ({type(exc).__name__}: {exc})", info
    info.append(f"nnabla {nnabla.__version__}")
    try:
        import nnabla_ext.cuda as cuda
        import nnabla_ext.cudnn as cudnn
    except Exception as exc:  # noqa: BLE001
        return (f"nnabla_ext.cuda (or .cudnn) cannot be imported "
                f"({type(exc).__name__}: {exc})"), info
    info.append(f"nnabla-ext-cuda {cuda.__version__} (CUDA {cuda.__cuda_version__}, "
                f"cuDNN {cuda.__cudnn_version__}; cudnn extension {cudnn.__version__})")
    if cuda.__version__ != nnabla.__version__:
        return (f"nnabla-ext-cuda {cuda.__version__} does not match nnabla "
                f"{nnabla.__version__}"), info
    try:
        count = int(cuda.get_device_count())
    except Exception as exc:  # noqa: BLE001
        return f"no CUDA device can be counted ({type(exc).__name__}: {exc})", info
    info.append(f"{count} CUDA device(s)")
    return (None if count else "no CUDA device"), info


def needs(problem: str, nnabla_version: str) -> List[str]:
    """What to print when CUDA is missing."""
    return [f"SKIP gpu_check: {problem}",
            f"# needs: nnabla-ext-cuda matching nnabla {nnabla_version} "
            f"(pip install nnabla-ext-cudaXXX=={nnabla_version}, XXX your CUDA version, "
            f"such as 120) and a CUDA device; for the communicator checks, an "
            f"nnabla-ext-cuda built with NCCL and MPI. Nothing was checked."]


def nnabla_version() -> str:
    try:
        import nnabla
        return nnabla.__version__
    except Exception:  # noqa: BLE001
        return "<the installed version>"


# -- building blocks -----------------------------------------------------------------------

def make_context(ext: str, type_config: str, device: str):
    """The context of ``ext`` (``"cudnn"``, ``"cuda"``, ``"cpu"``) with ``type_config``, on
    ``device``."""
    from nnabla.ext_utils import get_extension_context
    ctx = get_extension_context(ext, type_config=type_config)
    ctx.device_id = str(device)
    return ctx


def float_twin(ctx):
    """``ctx`` with every backend's type configuration made float (same device)."""
    import nnabla as nn
    backends = [f"{b.split(':', 1)[0]}:float" for b in ctx.backend]
    return nn.Context(list(dict.fromkeys(backends)), ctx.array_class, ctx.device_id)


class Proxy:
    """Passes everything to ``target`` and records each method call as
    ``(name, number of arrays in its first argument, keyword arguments)``."""

    def __init__(self, target: Any) -> None:
        self._target = target
        self.calls: List[Tuple[str, int, Dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if not callable(value):
            return value

        def recorded(*args: Any, **kwargs: Any) -> Any:
            first = args[0] if args else None
            count = len(first) if isinstance(first, (list, tuple)) else int(bool(args))
            self.calls.append((name, count, dict(kwargs)))
            return value(*args, **kwargs)
        return recorded

    def take(self) -> List[Tuple[str, int, Dict[str, Any]]]:
        """The calls recorded since the last ``take()``."""
        calls, self.calls = self.calls, []
        return calls


class ContextsEntered:
    """Every context ``nn.get_current_context()`` returns while in the ``with`` block
    (each nnabla function, in a graph or on NdArrays, is made under it)."""

    def __init__(self) -> None:
        import nnabla as nn
        self.seen: List[Any] = []
        self._code = nn.get_current_context.__code__

    def _profile(self, frame, event, arg) -> None:
        if event == "return" and frame.f_code is self._code:
            self.seen.append(arg)

    def __enter__(self) -> "ContextsEntered":
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc: Any) -> None:
        sys.setprofile(None)


class Model:
    """An MLP with ReLU, ``x -> widths... -> out``, built under ``ctx`` in ``scope``, with
    a loss (``"mse"``: the batch mean of the squared error summed over outputs;
    ``"xent"``: mean softmax cross-entropy) and a feeder that loads batch after batch of
    ``data`` (``(x, t)`` arrays)."""

    def __init__(self, ctx, scope: str, data, widths, batch: int, loss: str = "mse",
                 loss_ctx=None) -> None:
        import nnabla as nn
        import nnabla.functions as F
        import nnabla.parametric_functions as PF
        self.ctx, self.data, self.calls = ctx, data, 0
        x_all, t_all = data
        with nn.context_scope(ctx), nn.parameter_scope(scope):
            self.x = nn.Variable((batch,) + x_all.shape[1:])
            self.t = nn.Variable((batch,) + t_all.shape[1:])
            h = self.x
            for i, width in enumerate(widths[:-1]):
                h = F.relu(PF.affine(h, width, name=f"l{i}"))
            self.y = PF.affine(h, widths[-1], name="out")
            self.params = nn.get_parameters()
        with nn.context_scope(loss_ctx or ctx):
            y = F.identity(self.y) if loss_ctx is not None else self.y
            self.loss = (F.mean(F.softmax_cross_entropy(y, self.t)) if loss == "xent" else
                         F.mean(F.sum(F.squared_error(y, self.t), axis=1)))

    def feed(self, index: int) -> None:
        import numpy as np
        x_all, t_all = self.data
        batch = self.x.shape[0]
        rows = (index * batch + np.arange(batch)) % x_all.shape[0]
        self.x.d, self.t.d = x_all[rows], t_all[rows]

    def feeder(self) -> None:
        self.feed(self.calls)
        self.calls += 1

    def solver(self, kind: str = "Sgd", **kwargs):
        import nnabla as nn
        import nnabla.solvers as S
        with nn.context_scope(self.ctx):
            solver = getattr(S, kind)(**kwargs)
        solver.set_parameters(self.params)
        return solver


def regression_data(n: int, d_in: int, d_out: int, seed: int = 0, target: float = 0.0):
    import numpy as np
    rng = np.random.RandomState(seed)
    x = rng.randn(n, d_in).astype(np.float32)
    t = (rng.randn(n, d_out) + target).astype(np.float32)
    return x, t


def teacher_data(n: int = 512, d_in: int = 32, classes: int = 10, seed: int = 0):
    """Inputs and the classes a random linear teacher gives them (learnable)."""
    import numpy as np
    rng = np.random.RandomState(seed)
    x = rng.randn(n, d_in).astype(np.float32)
    labels = np.argmax(x @ rng.randn(d_in, classes), axis=1)
    return x, labels.reshape(n, 1).astype(np.int32)


# -- checks that run in this process ---------------------------------------------------------

def _dtype(array) -> Optional[str]:
    """The dtype ``array`` holds, or None when it holds nothing."""
    try:
        return str(array.dtype)
    except RuntimeError:
        return None


def graph_dtypes(loss, params) -> Dict[str, Dict[str, List[str]]]:
    """``kind -> dtype -> names``: the dtypes of every function's outputs and their
    gradients (named by the function) and of the parameters' gradients (by name)."""
    seen: Dict[str, Dict[str, List[str]]] = {"outputs": {}, "their gradients": {},
                                              "parameter gradients": {}}

    def add(kind: str, dtype: Optional[str], name: str) -> None:
        if dtype is None:
            return
        names = seen[kind].setdefault(dtype, [])
        if name not in names:
            names.append(name)

    def visit(f) -> None:
        for out in f.outputs:
            add("outputs", _dtype(out.data), f.info.type_name)
            add("their gradients", _dtype(out.grad), f.info.type_name)
    loss.visit(visit)
    for name, v in params.items():
        add("parameter gradients", _dtype(v.grad), name)
    return seen


def check_compute_dtype(ctx, expected: str) -> Tuple[bool, str]:
    """The dtypes of a small graph (a convolution, affine layers, ReLU, a squared error)
    under ``ctx`` after forward and backward, against ``expected`` and against what
    nnabla_mpt reads off the graph."""
    import numpy as np
    import nnabla as nn
    import nnabla.functions as F
    import nnabla.parametric_functions as PF
    from nnabla_mpt.core import graph
    nn.clear_parameters()
    with nn.context_scope(ctx), nn.parameter_scope("dtype_check"):
        x, t = nn.Variable((4, 2, 6, 6)), nn.Variable((4, 2))
        h = F.relu(PF.convolution(x, 4, (3, 3), name="conv"))
        h = F.relu(PF.affine(h, 16, name="hidden"))
        loss = F.mean(F.squared_error(PF.affine(h, 2, name="out"), t))
        params = nn.get_parameters()
    rng = np.random.RandomState(0)
    x.d, t.d = rng.randn(*x.shape), rng.randn(*t.shape)
    loss.forward(clear_no_need_grad=False)
    loss.backward(clear_buffer=False)
    seen = graph_dtypes(loss, params)
    package = graph.loss_dtype(loss)
    ok = all(set(by_dtype) == {expected} for by_dtype in seen.values()) and package == expected
    text = "; ".join(f"{kind} " + ", ".join(f"{dtype} ({' '.join(names)})"
                                           for dtype, names in by_dtype.items())
                     for kind, by_dtype in seen.items())
    return ok, (f"{text}; nnabla_mpt reads {package}; expected {expected} (backends "
                f"{', '.join(ctx.backend)})")


def check_reduction_device(ctx) -> Tuple[bool, str]:
    """Every context entered while updaters are built and step names ``ctx``'s device,
    and ``float_context(loss)`` keeps its device and array class."""
    import nnabla as nn
    from nnabla_mpt import DynamicLossScalingUpdater, OverflowHandling
    from nnabla_mpt.core import graph
    nn.clear_parameters()
    model = Model(ctx, "device_check", regression_data(32, 8, 2), (16, 2), batch=4)
    own = graph.float_context(model.loss)
    with ContextsEntered() as entered:
        for mode in ("inf_nan", "saturation"):
            updater = DynamicLossScalingUpdater(
                model.solver("Adam", alpha=1e-3), model.loss, model.feeder, scale="auto",
                growth_mode="measured", N=2, gradient_stats_every=2, clip_grad_norm=10.0,
                overflow=OverflowHandling(mode=mode))
            for _ in range(6):
                updater.update()
    devices = sorted({c.device_id for c in entered.seen})
    ok = (devices == [ctx.device_id] and own.device_id == ctx.device_id
          and own.array_class == ctx.array_class
          and all(b.endswith(":float") for b in own.backend))
    return ok, (f"{len(entered.seen)} contexts entered, on device(s) {devices}; "
                f"float_context(loss): {', '.join(own.backend)} on {own.device_id!r} "
                f"({own.array_class}); the loss is on {ctx.device_id!r}")


def clipped_reference(scaled_grads, scale: float, bound: Optional[float]):
    """``(gradients, norm)``: ``scaled_grads`` (the backward pass's, at ``scale``) unscaled
    in float64 and, if their global L2 norm exceeds ``bound``, scaled down to it; the
    norm is that of the unscaled gradients."""
    import numpy as np
    grads = [np.asarray(g, dtype=np.float64) / scale for g in scaled_grads]
    norm = math.sqrt(sum(float(np.sum(g * g)) for g in grads))
    factor = bound / norm if bound is not None and norm > bound else 1.0
    return [g * factor for g in grads], norm


def finite_backward(model, scale: float):
    """The scaled gradients (float64 host copies) of the model's first batch at the
    largest of ``scale``, ``scale / 2``, ... at which they are finite, and that scale."""
    import numpy as np
    for _ in range(16):
        model.feed(0)
        for v in model.params.values():
            v.grad.zero()
        model.loss.forward()
        model.loss.backward(scale)
        grads = [np.array(v.g, dtype=np.float64) for v in model.params.values()]
        if all(np.isfinite(g).all() for g in grads):
            return grads, scale
        scale /= 2.0
    raise RuntimeError("the gradients are not finite at any scale tried")


def check_clipping(ctx, width: int = 2048) -> Tuple[bool, str]:
    """``clip_grad_norm`` on one float16 layer of ``width**2`` weights against the float64
    reference of the same float16 gradients."""
    import numpy as np
    import nnabla as nn
    from nnabla_mpt import DynamicLossScalingUpdater
    nn.clear_parameters()
    model = Model(ctx, "clip_check", regression_data(64, width, width), (width,), batch=64)
    scaled, scale = finite_backward(model, 2.0 ** 12)
    _, norm = clipped_reference(scaled, scale, None)
    bound = norm / 4.0
    want, _ = clipped_reference(scaled, scale, bound)
    model.calls = 0                              # the updater's step sees batch 0 too
    updater = DynamicLossScalingUpdater(model.solver("Sgd", lr=0.0), model.loss,
                                        model.feeder, scale=scale, N=10 ** 6,
                                        clip_grad_norm=bound)
    result = updater.update()
    got = [np.array(v.g, dtype=np.float64) for v in model.params.values()]
    error = math.sqrt(sum(float(np.sum((g - w) ** 2)) for g, w in zip(got, want))) / bound
    squares = sum(float(np.sum(g * g)) for g in scaled)
    ok = not result.skipped and error <= CLIP_RTOL
    return ok, (f"{sum(g.size for g in got)} float16 gradients at scale {scale:g}, norm "
                f"{norm:.6g} clipped to {bound:.6g}: relative error {error:.2e} against "
                f"float64 (allowed {CLIP_RTOL:g}); their scaled squares sum to "
                f"{squares:.3g} (float16 holds 65504); step skipped: {result.skipped}")


def time_steps(step: Callable[[], Any], sync: Callable[[], None], count: int) -> List[float]:
    """Seconds of each of ``count`` calls of ``step``, the device synchronised around each."""
    times = []
    for _ in range(count):
        sync()
        start = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - start)
    return times


def check_host_reads(ctx, sync: Callable[[], None], on_device: bool, steps: int = 20,
                     widths=(512, 512, 16)) -> Tuple[bool, str]:
    """A good step's solver calls (counted through a proxy) and its time against a step
    written by hand; off the CPU the solver's per-parameter inf/NaN check must not run."""
    import nnabla as nn
    from nnabla_mpt import DynamicLossScalingUpdater
    nn.clear_parameters()
    model = Model(ctx, "reads_check", regression_data(256, 256, widths[-1]), widths,
                  batch=64)
    solver = Proxy(model.solver("Adam", alpha=1e-4))
    updater = DynamicLossScalingUpdater(solver, model.loss, model.feeder, scale=8.0,
                                        N=10 ** 6)
    results = [updater.update() for _ in range(3)]      # warm-up
    solver.take()
    times = time_steps(lambda: results.append(updater.update()), sync, steps)
    calls = collections.Counter(name for name, _, _ in solver.take())
    plain = model.solver("Adam", alpha=1e-4)
    hand = time_steps(lambda: _hand_step(model, plain), sync, steps)
    skipped = sum(r.skipped for r in results)
    checks = calls.pop("check_inf_or_nan_grad", 0)
    expected = 0 if on_device else steps
    ok = skipped == 0 and checks == expected and calls.get("update", 0) == steps
    step, by_hand = statistics.median(times), statistics.median(hand)
    per_step = ", ".join(f"{name} {n / steps:g}" for name, n in sorted(calls.items()))
    return ok, (f"per good step: solver check_inf_or_nan_grad {checks / steps:g} "
                f"(expected {expected / steps:g}), {per_step}; {skipped} skipped; step "
                f"{step * 1e3:.2f} ms (median of {steps}) vs {by_hand * 1e3:.2f} ms for "
                f"forward+backward+update by hand ({step / by_hand:.2f}x); host reads "
                f"themselves are not counted")


def _hand_step(model, solver) -> None:
    solver.zero_grad()
    model.feeder()
    model.loss.forward(clear_no_need_grad=True)
    model.loss.backward(clear_buffer=True)
    solver.update()


def trained_float(model, steps: int) -> None:
    solver = model.solver("Adam", alpha=1e-3)
    for _ in range(steps):
        _hand_step(model, solver)


def trained_half(model, steps: int) -> Tuple[int, float]:
    """Trains with the updater; ``(skipped steps, final scale)``."""
    from nnabla_mpt import DynamicLossScalingUpdater
    updater = DynamicLossScalingUpdater(model.solver("Adam", alpha=1e-3), model.loss,
                                        model.feeder, scale="auto", growth_mode="measured")
    skipped = sum(updater.update().skipped for _ in range(steps))
    return skipped, updater.scale


def full_loss(ctx, scope: str, data) -> float:
    """The mean cross-entropy over the whole of ``data`` with the parameters of ``scope``,
    computed in float under ``ctx``'s float twin."""
    model = Model(float_twin(ctx), scope, data, (64, 64, 10), batch=len(data[0]),
                  loss="xent")
    model.feed(0)
    model.loss.forward()
    return float(model.loss.d)


def check_training(ctx, steps: int = 200) -> Tuple[bool, str]:
    """An MLP trained ``steps`` steps in float16 by the updater and in float by hand, from
    the same parameters on the same batches: final losses within the tolerance."""
    import numpy as np
    import nnabla as nn
    nn.clear_parameters()
    data = teacher_data()
    reference = Model(float_twin(ctx), "float", data, (64, 64, 10), batch=64, loss="xent")
    half = Model(ctx, "half", data, (64, 64, 10), batch=64, loss="xent")
    for name, v in reference.params.items():
        half.params[name].d = np.array(v.d, copy=True)
    start = full_loss(ctx, "float", data)
    trained_float(reference, steps)
    skipped, scale = trained_half(half, steps)
    want, got = full_loss(ctx, "float", data), full_loss(ctx, "half", data)
    ok = abs(got - want) <= LOSS_RTOL * want + LOSS_ATOL and got < 0.8 * start
    return ok, (f"after {steps} steps the loss over the data set is {got:.4f} in float16 "
                f"vs {want:.4f} in float (from {start:.4f}; allowed |difference| <= "
                f"{LOSS_RTOL:g} x float + {LOSS_ATOL:g}); {skipped} steps skipped, final "
                f"scale {scale:g}")


# -- checks with a communicator ------------------------------------------------------------

def check_communicator_dtype(comm, expected: str) -> Tuple[bool, str]:
    """The dtype (and value) of a one-element float32 array after ``comm``'s all-reduce."""
    import numpy as np
    import nnabla as nn
    probe = nn.NdArray((1,))
    probe.cast(np.float32)[...] = 1.5
    comm.all_reduce([probe], division=False, inplace=True)
    after, value = str(probe.dtype), float(np.array(probe.data, dtype=np.float64)[0])
    ok = after == expected and value == 1.5 * comm.size
    return ok, (f"a float32 array holds {after} after all_reduce (expected {expected}), "
                f"value {value:g} over {comm.size} rank(s)")


def check_communicator_model(comm, ctx, expected: str) -> Tuple[bool, str]:
    """Bytes 0..255 through ``exchange.handshake`` exactly, what it learns of the
    reduction's dtypes, and an updater built with ``comm``."""
    import nnabla as nn
    from nnabla_mpt import DynamicLossScalingUpdater
    from nnabla_mpt.distributed import exchange
    fingerprint = bytes(range(256))
    seen, reduction = exchange.handshake(comm, fingerprint)
    nn.clear_parameters()
    model = Model(ctx, "model_check", regression_data(16, 8, 2), (16, 2), batch=4)
    DynamicLossScalingUpdater(model.solver(), model.loss, model.feeder, comm=comm)
    exact = seen == [fingerprint] * comm.size
    ok = exact and reduction.after["float32"] == expected
    return ok, (f"256 byte values {'came back exact' if exact else 'came back changed'} "
                f"through the reduction, which leaves float32 arrays "
                f"{reduction.after['float32']} and float16 ones "
                f"{reduction.after['float16']} (expected {expected}); an updater was "
                f"built with comm=")


def check_communicator_loss(comm, ctx) -> Tuple[bool, str]:
    """A float32 loss beyond float16's range (a float16 network, the loss built under the
    float context) reported exactly by an updater with ``comm``."""
    import numpy as np
    import nnabla as nn
    from nnabla_mpt import DynamicLossScalingUpdater
    nn.clear_parameters()
    model = Model(ctx, "loss_check", regression_data(16, 8, 4, target=300.0), (16, 4),
                  batch=8, loss_ctx=float_twin(ctx))
    updater = DynamicLossScalingUpdater(model.solver("Sgd", lr=0.0), model.loss,
                                        model.feeder, scale=1.0, N=10 ** 6, comm=comm)
    reported = updater.update().loss
    own = float(np.float32(model.loss.d))
    ok = reported == own and own > 65504.0
    return ok, (f"this rank's loss {own!r} (float16 holds 65504), reported {reported!r}; "
                f"{'exact' if reported == own else 'changed'} over {comm.size} rank(s)")


def describe(calls) -> str:
    """The calls a :class:`Proxy` recorded, as text: ``all_reduce(2 arrays, inplace=True)
    + ...``, or ``none``."""
    return " + ".join(f"{name}({count} array{'s' * (count != 1)}, "
                      f"inplace={kwargs.get('inplace')})"
                      for name, count, kwargs in calls) or "none"


def check_collectives(comm, ctx) -> Tuple[bool, str]:
    """The communicator's calls at construction, on good steps and on a skipped one (an
    inf in its batch), counted through a proxy passed as ``comm``."""
    import numpy as np
    import nnabla as nn
    from nnabla_mpt import DynamicLossScalingUpdater
    nn.clear_parameters()
    x, t = regression_data(32, 8, 2)
    x[3 * 4] = np.inf                           # batch 3 holds inf: a skipped step
    model = Model(ctx, "collectives_check", (x, t), (16, 2), batch=4)
    counted = Proxy(comm)
    updater = DynamicLossScalingUpdater(model.solver(), model.loss, model.feeder,
                                        scale=8.0, N=10 ** 6, comm=counted)
    built = describe(counted.take())
    steps = [(updater.update().skipped, describe(counted.take())) for _ in range(5)]
    good = sorted({calls for skipped, calls in steps if not skipped})
    bad = sorted({calls for skipped, calls in steps if skipped})
    one = "all_reduce(1 array, inplace=True)"
    ok = (built == "all_reduce(2 arrays, inplace=True)" and good == [one]
          and bad == [f"{one} + {one}"])
    return ok, (f"at construction {built}; each good step {' | '.join(good)}; each "
                f"skipped step {' | '.join(bad) or 'none seen'} (expected: 2 arrays once, "
                f"1 array per good step, one call more on a skipped step)")


# -- running -------------------------------------------------------------------------------

def on(ext: str, type_config: str, device: str, check: Callable[..., Tuple[bool, str]],
       *args: Any) -> Tuple[bool, str]:
    """``check(context, *args)`` with the context of ``ext``, ``type_config``, ``device``
    made inside the check (so that an error making it is the check's FAIL)."""
    return check(make_context(ext, type_config, device), *args)


def local_checks(device: str, count: int) -> Iterator[Result]:
    """The checks that need no communicator, on ``device`` (the device check on the last
    one)."""
    import nnabla_ext.cuda as cuda
    for (ext, type_config), expected in COMPUTE_DTYPES.items():
        yield run_check(f"dtype_{ext}_{type_config}", on, ext, type_config, device,
                        check_compute_dtype, expected)
    yield run_check("reduction_device", on, "cudnn", "half", str(count - 1),
                    check_reduction_device)
    yield run_check("clipping", on, "cudnn", "half", device, check_clipping,
                    SIZES["clip_width"])
    yield run_check("host_reads", on, "cudnn", "half", device, check_host_reads,
                    lambda: cuda.synchronize(device_id=str(device)), True,
                    SIZES["reads_steps"], SIZES["reads_widths"])
    yield run_check("training", on, "cudnn", "half", device, check_training,
                    SIZES["train_steps"])


def make_communicator(spec: str):
    """nnabla's communicator from the context ``spec`` (``"cudnn:half"``), initialised."""
    import nnabla.communicators as C
    ext, type_config = spec.split(":")
    comm = C.MultiProcessDataParallelCommunicator(make_context(ext, type_config, "0"))
    comm.init()
    return comm


def communicator_checks(spec: str) -> List[Result]:
    """In the child process: the checks of nnabla's communicator made from ``spec``."""
    tag = spec.replace(":", "_")
    names = [f"communicator_dtype_{tag}"]
    if spec == "cudnn:half":
        names += ["communicator_model_check", "communicator_loss", "collectives"]
    try:
        comm = make_communicator(spec)
    except Exception as exc:  # noqa: BLE001
        why = (f"nnabla's MultiProcessDataParallelCommunicator from a {spec} context could "
               f"not be made ({type(exc).__name__}: {exc}); it needs nnabla-ext-cuda built "
               f"with NCCL and MPI").replace("\n", " ")
        return [Result("SKIP", name, why) for name in names]
    expected = COMMUNICATOR_DTYPES[spec]
    results = [run_check(names[0], check_communicator_dtype, comm, expected)]
    if spec == "cudnn:half":
        ctx = make_context("cudnn", "half", str(comm.local_rank))
        results += [run_check(names[1], check_communicator_model, comm, ctx, expected),
                    run_check(names[2], check_communicator_loss, comm, ctx),
                    run_check(names[3], check_collectives, comm, ctx)]
    return results


def _text(output) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def run_child(spec: str) -> List[Result]:
    """:func:`communicator_checks` of ``spec`` in a child process: the results it printed,
    and a FAIL when it crashed, hung (MPI or NCCL starting or finalising) or printed
    none."""
    name = f"communicator_{spec.replace(':', '_')}"
    command = [sys.executable, str(Path(__file__).resolve()), "--communicator", spec]
    try:
        proc = subprocess.run(command, capture_output=True, text=True,
                              timeout=CHILD_TIMEOUT, cwd=str(ROOT))
        out, err, ended = proc.stdout, proc.stderr, proc.returncode in (0, 1)
        why = f"the child process ended with status {proc.returncode}"
    except subprocess.TimeoutExpired as exc:
        out, err, ended = _text(exc.stdout), _text(exc.stderr), False
        why = f"the child process did not end within {CHILD_TIMEOUT:g} s"
    results = [r for r in map(parse_line, out.splitlines()) if r is not None]
    if not ended or not results:
        results.append(Result("FAIL", name, f"{why}; its stderr ends: {err[-500:]!r}"))
    return results


#: The exit status when no check ran to a PASS or a FAIL.
NOTHING_CHECKED = 3


def run_all(device: str) -> int:
    problem, info = cuda_problem()
    for line in info:
        print(f"# {line}", flush=True)
    if problem:
        print("\n".join(needs(problem, nnabla_version())), flush=True)
        return NOTHING_CHECKED
    try:
        import nnabla_mpt
    except Exception as exc:  # noqa: BLE001
        report(Result("FAIL", "setup", f"nnabla_mpt cannot be imported "
                                       f"({type(exc).__name__}: {exc})"))
        return 1
    print(f"# nnabla_mpt from {Path(nnabla_mpt.__file__).parent}", flush=True)
    import nnabla_ext.cuda as cuda
    results = [report(r) for r in local_checks(device, int(cuda.get_device_count()))]
    for spec in COMMUNICATOR_DTYPES:
        results += [report(r) for r in run_child(spec)]
    counts = collections.Counter(r.status for r in results)
    print(f"# {counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped",
          flush=True)
    return exit_status(results)


def exit_status(results: List["Result"]) -> int:
    """1 if a check failed, :data:`NOTHING_CHECKED` if none passed either, else 0."""
    statuses = {r.status for r in results}
    return 1 if "FAIL" in statuses else 0 if "PASS" in statuses else NOTHING_CHECKED


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="0", help="GPU to use (default 0)")
    parser.add_argument("--communicator", help=argparse.SUPPRESS)   # the child's mode
    args = parser.parse_args(argv)
    if args.communicator:
        results = [report(r) for r in communicator_checks(args.communicator)]
        return 1 if any(r.status == "FAIL" for r in results) else 0   # read by the parent
    return run_all(str(args.device))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())

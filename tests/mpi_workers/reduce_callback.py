"""Training loops that all-reduce through ``all_reduce_callback`` (as nnabla-examples
scripts do) and through an explicit ``all_reduce`` after the backward pass, side by side:
each loop trains its own copy of the same model (same initial values, each rank its own
batches) and saves the parameters as ``<loop>/<name>``.

Loops (5 steps each; weight decay, clipping and update after every backward pass):
  explicit        backward, comm.all_reduce(grads)
  none            backward, no reduction (the ranks drift apart)
  inline          backward(communicator_callbacks=comm.all_reduce_callback(grads, 2 << 20))
  persistent      one comm.get_all_reduce_callback() before the loop, passed every step
  examples        comm.get_all_reduce_callback() for every backward pass
  explicit_scaled grads *= 0.5, all_reduce(division=True)
  inline_scaled   all_reduce_callback(grads, ..., division=True, scale_grad=0.5)
  explicit_half / inline_half: a float16 graph, backward(1024), scale_grad(1 / 1024)
  updater / updater_callback: DynamicLossScalingUpdater, without and with
                  reduction=GradientReduction(backward_pack_size=2 << 20)
The meta records the reductions each loop made and what the updater said when an
all-reduce was armed.
"""
import logging
import sys

import numpy as np

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla.solvers as S
from nnabla.ext_utils import get_extension_context
from nnabla.logger import logger

from nnabla_mpt import DynamicLossScalingUpdater, GradientReduction, MPICommunicator
from worker_common import save

STEPS = 5
PACK = 2 << 20
outdir = sys.argv[1]
comm = MPICommunicator()
rank = comm.rank


class Model:
    """One copy of the model under ``scope``; every copy starts from the same values."""

    def __init__(self, scope, type_config="float"):
        self.scope = scope
        self.x, self.t = nn.Variable((8, 16)), nn.Variable((8, 1))
        with nn.parameter_scope(scope), nn.context_scope(
                get_extension_context("cpu", type_config=type_config)):
            h = F.relu(PF.affine(self.x, 16, name="fc1", rng=np.random.RandomState(1)))
            y = PF.affine(h, 4, name="fc2", rng=np.random.RandomState(2))
            self.loss = F.mean(F.softmax_cross_entropy(y, self.t))
            self.params = nn.get_parameters()
        self.solver = S.Momentum(0.1, 0.9)
        self.solver.set_parameters(self.params)
        self.grads = [v.grad for v in self.params.values()]
        self.fed = 0

    def feed(self):
        rng = np.random.RandomState(1000 * rank + self.fed)
        self.x.d = rng.randn(8, 16) * (1 + rank)
        self.t.d = rng.randint(0, 4, (8, 1))
        self.fed += 1

    def forward(self):
        self.solver.zero_grad()
        self.feed()
        self.loss.forward()

    def finish(self, scale=1.0):
        if scale != 1.0:
            self.solver.scale_grad(1.0 / scale)
        self.solver.weight_decay(1e-4)
        self.solver.clip_grad_by_norm(0.5)
        self.solver.update()

    def arrays(self):
        return {f"{self.scope}/{k}": v.d.copy() for k, v in self.params.items()}


def explicit(m, scale=1.0, division=False, factor=1.0):
    for _ in range(STEPS):
        m.forward()
        m.loss.backward(scale, clear_buffer=True)
        if factor != 1.0:
            for g in m.grads:
                g *= factor
        comm.all_reduce(m.grads, division=division)
        m.finish(scale)


def none(m):
    for _ in range(STEPS):
        m.forward()
        m.loss.backward(clear_buffer=True)
        m.finish()


def inline(m, scale=1.0, **kwargs):
    for _ in range(STEPS):
        m.forward()
        m.loss.backward(scale, clear_buffer=True,
                        communicator_callbacks=comm.all_reduce_callback(m.grads, PACK,
                                                                        **kwargs))
        m.finish(scale)


def persistent(m):
    with nn.parameter_scope(m.scope):
        callback = comm.get_all_reduce_callback()
    for _ in range(STEPS):
        m.forward()
        m.loss.backward(clear_buffer=True, communicator_callbacks=callback)
        m.finish()


def examples(m):
    for _ in range(STEPS):
        m.forward()
        with nn.parameter_scope(m.scope):
            m.loss.backward(clear_buffer=True,
                            communicator_callbacks=comm.get_all_reduce_callback())
        m.finish()


def with_updater(m, **kwargs):
    updater = DynamicLossScalingUpdater(m.solver, m.loss, m.feed, scale=8.0, comm=comm,
                                        weight_decay=1e-4, clip_grad_norm=0.5, **kwargs)
    for _ in range(STEPS):
        updater.update()


LOOPS = {
    "explicit": explicit, "none": none, "inline": inline, "persistent": persistent,
    "examples": examples,
    "explicit_scaled": lambda m: explicit(m, division=True, factor=0.5),
    "inline_scaled": lambda m: inline(m, division=True, scale_grad=0.5),
    "explicit_half": lambda m: explicit(m, scale=1024.0),
    "inline_half": lambda m: inline(m, scale=1024.0),
    "updater": with_updater,
    "updater_callback": lambda m: with_updater(
        m, reduction=GradientReduction(backward_pack_size=PACK)),
}


class Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def armed_updater_refuses():
    """An armed all-reduce and the updater on the same communicator: refused, then fine
    once cleared."""
    m = Model("armed")
    updater = DynamicLossScalingUpdater(m.solver, m.loss, m.feed, comm=comm)
    comm.all_reduce_callback(m.grads, PACK)
    try:
        updater.update()
        error = None
    except RuntimeError as e:
        error = str(e)
    comm.clear_all_reduce_callback()
    return error, updater.update().updated


arrays, meta = {}, {"reductions": {}, "armed_after": {}}
lines = Lines()
logger.addHandler(lines)
for name, loop in LOOPS.items():
    model = Model(name, "half" if name.endswith("_half") else "float")
    comm.broadcast_parameters(model.params)
    before = comm.n_all_reduce_calls
    loop(model)
    meta["reductions"][name] = comm.n_all_reduce_calls - before
    meta["armed_after"][name] = comm.all_reduce_callback_armed
    comm.clear_all_reduce_callback()
    arrays.update(model.arrays())
meta["updater_log"] = [line for line in lines.lines if "backward_pack_size" in line]
meta["armed_error"], meta["updated_after_clear"] = armed_updater_refuses()
save(outdir, rank, arrays, meta)

"""Does ``all_reduce_callback`` pay on the CPU? A training step with the gradients reduced
through ``MPICommunicator.all_reduce_callback`` (passed to ``backward``, as nnabla-examples
scripts do) against the same step with ``all_reduce`` after the backward pass.

Run::

    .venv/bin/python benchmarks/all_reduce_callback.py

The script launches itself under ``mpiexec -n 2`` (the mpiexec next to the running Python)
with ``OMP_NUM_THREADS=1``. Every rank builds three copies of each model, one per route,
and times them in interleaved blocks (the order reverses every round): ``explicit``
(``all_reduce`` after the backward pass), ``callback`` (``all_reduce_callback`` for each
backward pass, as nnabla-examples do) and ``made_once`` (one ``all_reduce_callback`` passed
to every backward pass, which keeps nnabla's function hook). The table shows the median
step time of each route and the medians over rounds of the per-round ratios to explicit. A step: zero_grad, forward, backward, (all-reduce), weight decay,
Momentum update. Models: a wide MLP (784-1024-1024-10, 1.86 M parameters in 6 arrays) and
a deep narrow one (100 layers of 16, 203 functions a pass: the cost of nnabla's
process-wide function hook that the callback route installs).
"""
import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from _machine import cpu_model

MODELS = {"wide": (784, [1024, 1024], 10, 32), "deep-narrow": (16, [16] * 100, 10, 32)}
PACK = 2 << 20


def build(comm, scope, spec):
    import nnabla as nn
    import nnabla.functions as F
    import nnabla.parametric_functions as PF
    import nnabla.solvers as S

    width, hidden, classes, batch = spec
    rng = np.random.RandomState(comm.rank)
    x = nn.Variable.from_numpy_array(rng.rand(batch, width).astype(np.float32))
    t = nn.Variable.from_numpy_array(rng.randint(0, classes, (batch, 1)))
    with nn.parameter_scope(scope):
        h = x
        for i, w in enumerate(hidden):
            h = F.relu(PF.affine(h, w, name=f"fc{i}", rng=np.random.RandomState(i)))
        loss = F.mean(F.softmax_cross_entropy(PF.affine(h, classes, name="out"), t))
        params = nn.get_parameters()
    solver = S.Momentum(0.01, 0.9)
    solver.set_parameters(params)
    comm.broadcast_parameters(params)
    return loss, solver, [v.grad for v in params.values()]


def route(comm, scope, spec, reduce):
    """One step of a copy of the model, ``reduce(grads)`` called where the route
    reduces: after the backward pass, or for the ``communicator_callbacks`` argument."""
    loss, solver, grads = build(comm, scope, spec)

    def step():
        solver.zero_grad()
        loss.forward(clear_no_need_grad=True)
        if reduce.after_backward:
            loss.backward(clear_buffer=True)
            reduce(grads)
        else:
            loss.backward(clear_buffer=True, communicator_callbacks=reduce(grads))
        solver.weight_decay(1e-4)
        solver.update()
    return step


def routes(comm, name):
    def explicit(grads):
        comm.all_reduce(grads, division=True)

    def each_pass(grads):
        return comm.all_reduce_callback(grads, PACK, division=True)

    def made_once(grads):
        if not comm.all_reduce_callback_armed:       # once per timed block
            comm.all_reduce_callback(grads, PACK, division=True)

    explicit.after_backward = True
    each_pass.after_backward = made_once.after_backward = False
    return {k: route(comm, f"{name}/{k}", MODELS[name], reduce) for k, reduce in
            (("explicit", explicit), ("callback", each_pass), ("made_once", made_once))}


def block(step, seconds, comm):
    """Times steps for about ``seconds`` (the step count agreed by the ranks)."""
    t0 = time.perf_counter()
    step()
    one = np.array([time.perf_counter() - t0])
    comm.comm.Allreduce(one.copy(), one)
    n = max(1, int(seconds / (one[0] / comm.size)))
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    return (time.perf_counter() - t0) / n


def worker(args):
    from nnabla_mpt import MPICommunicator
    comm = MPICommunicator()
    rows = []
    for name in args.models:
        contenders = routes(comm, name)
        times = {k: [] for k in contenders}
        ratios = []
        for r in range(args.warmup + args.rounds):
            order = list(contenders) if r % 2 == 0 else list(reversed(list(contenders)))
            got = {}
            for k in order:
                got[k] = block(contenders[k], args.block_ms / 1000, comm)
                comm.clear_all_reduce_callback()      # the explicit route runs unarmed
            if r >= args.warmup:
                for k, v in got.items():
                    times[k].append(v)
                ratios.append([got["callback"] / got["explicit"],
                               got["made_once"] / got["explicit"]])
        rows.append((name, *(statistics.median(times[k]) * 1e3 for k in contenders),
                     *(statistics.median(r[i] for r in ratios) for i in range(2))))
    if comm.rank == 0:
        print(f"# all_reduce_callback vs all_reduce after backward, mpiexec -n {comm.size}, "
              f"float, {args.rounds} rounds (+{args.warmup} warm-up), cpu: {cpu_model()}")
        print(f"{'model':<12} {'explicit ms':>12} {'callback ms':>12} {'made once ms':>13} "
              f"{'callback/explicit':>18} {'made once/explicit':>19}")
        for name, e, c, o, ratio, once in rows:
            print(f"{name:<12} {e:>12.3f} {c:>12.3f} {o:>13.3f} {ratio:>18.3f} {once:>19.3f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--block-ms", type=float, default=100.0)
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    here = Path(__file__).resolve().parent
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(here), str(here.parent),
                                           os.environ.get("PYTHONPATH", "")]))
    mpiexec = Path(sys.executable).parent / "mpiexec"
    subprocess.run([str(mpiexec), "-n", "2", sys.executable, __file__, "--worker",
                    *sys.argv[1:]], check=True, env=env)


if __name__ == "__main__":
    main()

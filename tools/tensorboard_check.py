#!/usr/bin/env python
"""Checks that the documented way to view the TensorBoard scalars works, and leaves the
project's environment as it was.

Run it from the checkout with the project's environment (it builds
``.venv-tensorboard`` through ``tools/tensorboard.sh`` the first time, from PyPI)::

    .venv/bin/python tools/tensorboard_check.py

It trains the monitoring page's small float16 network for 20 steps with a
``LossScaleTensorBoard(interval=5)``, starts ``tools/tensorboard.sh --logdir DIR`` on
127.0.0.1, asks the server for its scalar tags and for the values of
``loss-scale/scale`` and ``loss-scale/skipped-steps`` (TensorBoard's HTTP API, as its
Scalars tab does), compares them with the steps' own results, stops the server, and
checks that this environment still imports nnabla with the protobuf it had. It prints a
line per check and exits with status 1 if one failed.
"""
import importlib.metadata
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = 180  # seconds for the server to answer (its first start installs nothing)


def train(logdir: str) -> list:
    """20 steps of the monitoring page's network with a LossScaleTensorBoard; the results."""
    import numpy as np
    import nnabla as nn
    import nnabla.functions as F
    import nnabla.parametric_functions as PF
    import nnabla.solvers as S
    from nnabla.ext_utils import get_extension_context
    from nnabla_mpt import DynamicLossScalingUpdater, LossScaleTensorBoard

    nn.set_default_context(get_extension_context("cpu", type_config="half"))
    x = nn.Variable.from_numpy_array(np.full((4, 3), 8.0, dtype=np.float32))
    h = PF.affine(x, 2, name="fc", w_init=np.full((3, 2), 0.5, dtype=np.float32))
    solver = S.Sgd(1e-4)
    solver.set_parameters(nn.get_parameters())
    board = LossScaleTensorBoard(logdir, interval=5)
    updater = DynamicLossScalingUpdater(solver, F.mean(h ** 2), scale=2.0 ** 15, N=4,
                                        monitor=board)
    results = [updater.update() for _ in range(20)]
    board.close()
    return results


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ask(port: int, path: str, **query: str):
    url = f"http://127.0.0.1:{port}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def served_scalars(logdir: str) -> dict:
    """``{tag: [(step, value), ...]}`` of the scale and skipped-steps scalars, as the
    server started by tools/tensorboard.sh serves them."""
    port = free_port()
    server = subprocess.Popen([os.path.join(ROOT, "tools", "tensorboard.sh"), "--logdir",
                               logdir, "--host", "127.0.0.1", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + TIMEOUT
        while True:
            try:
                tags = ask(port, "/data/plugin/scalars/tags")
                if tags:
                    break
            except OSError:
                pass
            ended = server.poll() is not None
            if ended or time.monotonic() > deadline:
                said = server.stderr.read()[-2000:] if ended else f"none within {TIMEOUT} s"
                raise RuntimeError(f"TensorBoard did not serve the scalars: {said}")
            time.sleep(1)
        run = next(iter(tags))
        print(f"# run {run!r}: tags {sorted(tags[run])}")
        return {tag: [(int(step), float(value)) for _, step, value in
                      ask(port, "/data/plugin/scalars/scalars", run=run, tag=tag)]
                for tag in ("loss-scale/scale", "loss-scale/skipped-steps")}
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> int:
    protobuf = importlib.metadata.version("protobuf")
    checks = []
    with tempfile.TemporaryDirectory() as logdir:
        results = train(logdir)
        served = served_scalars(logdir)
    ends = [r for r in results if (r.step + 1) % 5 == 0]
    want = {"loss-scale/scale": [(r.step, r.scale) for r in ends],
            "loss-scale/skipped-steps": [(r.step, float(r.skipped_steps)) for r in ends]}
    for tag, points in want.items():
        checks.append((served[tag] == points, f"{tag} served as the steps ran it: "
                                              f"{served[tag]}"))
    after = subprocess.run([sys.executable, "-c", "import importlib.metadata, nnabla; "
                            "print(importlib.metadata.version('protobuf'))"],
                           capture_output=True, text=True)
    checks.append((after.returncode == 0 and after.stdout.split()[-1:] == [protobuf],
                   f"this environment imports nnabla, protobuf {protobuf} as before "
                   f"({after.stdout.strip() or after.stderr[-300:]})"))
    for ok, what in checks:
        print(f"{'PASS' if ok else 'FAIL'} {what}")
    return 0 if all(ok for ok, _ in checks) else 1


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    sys.exit(main())

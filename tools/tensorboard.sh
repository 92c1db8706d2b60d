#!/usr/bin/env bash
# Views the scalars of LossScaleTensorBoard with TensorBoard, run from an environment of
# its own (.venv-tensorboard, made at the first call), so that the project's .venv keeps
# the protobuf nnabla declares (tensorboard installed there replaces it with one that
# nnabla does not take, and the TensorBoard that fits nnabla's does not import).
#
# Usage: tools/tensorboard.sh --logdir DIR [other tensorboard options]
# Set NNABLA_MPT_TENSORBOARD_VENV to put the environment elsewhere, NNABLA_MPT_TENSORBOARD_PYTHON
# to make it with another Python (any Python 3 that TensorBoard supports; python3 by default).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${NNABLA_MPT_TENSORBOARD_VENV:-$root/.venv-tensorboard}"
if [ ! -x "$venv/bin/tensorboard" ]; then
    echo "[tensorboard] installing TensorBoard into $venv (once)" >&2
    "${NNABLA_MPT_TENSORBOARD_PYTHON:-python3}" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check tensorboard >&2
fi
exec "$venv/bin/tensorboard" "$@"

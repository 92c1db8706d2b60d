"""Checkpoint files: parameters, solver states and updater state in one ``.npz`` archive.

Format (version 1): a NumPy ``.npz`` archive (no pickles) holding

* ``param/<name>``: each parameter's data;
* ``solver/<name>/<key>``: each solver state's arrays;
* ``meta``: UTF-8 JSON ``{"format": "nnabla_mpt.checkpoint", "version": 1, "updater":
  <updater state_dict()>, "solver": {<name>: {"t": int, "keys": [...]}}, "params": [...]}``.

:func:`save` writes the archive through :func:`nnabla_mpt.atomic_file.write`: under a
temporary name beside the target, flushed to disk and renamed over the target, so a crash
leaves the previous file or the new one, never a partial one. :func:`load` reads and checks
everything before it changes anything.
"""
import json
import os
import zipfile
from typing import Any, Callable, Dict, Mapping, Tuple

import numpy as np

from . import _validate as check
from . import atomic_file

FORMAT = "nnabla_mpt.checkpoint"
VERSION = 1


def save(path: str, params: Mapping[str, Any], solver, updater_state: Mapping) -> None:
    """Writes ``params``' data, ``solver``'s states and ``updater_state`` to ``path``,
    atomically (:func:`nnabla_mpt.atomic_file.write`: the folder is checked before the
    arrays are gathered)."""
    def fill(f) -> None:
        _write_npz(f, _gathered(params, solver, updater_state))

    atomic_file.write(os.fspath(path), fill, "the checkpoint")


def _gathered(params: Mapping[str, Any], solver,
              updater_state: Mapping) -> Dict[str, np.ndarray]:
    """The archive's arrays, ``meta`` included."""
    arrays: Dict[str, np.ndarray] = {}
    for name, v in params.items():
        arrays[f"param/{name}"] = np.array(v.d, copy=True)
    solver_meta = {}
    for name, st in solver.get_states().items():
        solver_meta[name] = {"t": int(st.t), "keys": sorted(st.pstate)}
        for key, var in st.pstate.items():
            arrays[f"solver/{name}/{key}"] = np.array(var.d, copy=True)
    meta = {"format": FORMAT, "version": VERSION, "updater": dict(updater_state),
            "solver": solver_meta, "params": list(params)}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
    return arrays


def load(path: str, params: Mapping[str, Any], solver,
         check_updater_state: Callable[[Mapping], Any]) -> Mapping:
    """Restores what :func:`save` wrote into ``params`` and ``solver``; returns the updater
    state for the caller to load.

    Everything is checked first, the updater state with ``check_updater_state`` (which
    raises if it does not fit); only then are the parameters and solver states written.

    Raises:
        ValueError: the file is not a checkpoint of this format, or its parameters,
            solver states or updater state do not match (the message lists the names).
    """
    path = os.fspath(path)
    meta, data = _read(path)
    states = solver.get_states()
    _check_arrays(path, meta, data, params, states)
    check_updater_state(meta["updater"])

    for name, v in params.items():
        v.d = data[f"param/{name}"]
    for name, st in states.items():
        for key, var in st.pstate.items():
            var.d = data[f"solver/{name}/{key}"]
        st.t = meta["solver"][name]["t"]
    solver.set_states(states)
    return meta["updater"]


def _read(path: str) -> Tuple[Dict[str, Any], Dict[str, np.ndarray]]:
    with np.load(path, allow_pickle=False) as archive:
        if "meta" not in archive.files:
            raise ValueError(f"{path!r} is not an nnabla_mpt checkpoint (no metadata)")
        meta = json.loads(archive["meta"].tobytes().decode("utf-8"))
        data = {k: archive[k] for k in archive.files if k != "meta"}
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise ValueError(f"{path!r} is not an nnabla_mpt checkpoint of version {VERSION}: "
                         f"format={meta.get('format')!r}, version={meta.get('version')!r}")
    return meta, data


def _check_arrays(path: str, meta: Mapping, data: Mapping[str, np.ndarray],
                  params: Mapping[str, Any], states: Mapping[str, Any]) -> None:
    """The file holds exactly the parameters and solver states given, in their shapes."""
    check.exact_keys(f"parameters in {path!r}", {k: None for k in meta["params"]}, params)
    shapes = [(f"param/{name}", v.shape) for name, v in params.items()]
    check.exact_keys(f"solver states in {path!r}", meta["solver"], states)
    for name, st in states.items():
        check.exact_keys(f"solver state {name!r} in {path!r}",
                         {k: None for k in meta["solver"][name]["keys"]}, st.pstate)
        shapes += [(f"solver/{name}/{key}", var.shape) for key, var in st.pstate.items()]
    wrong = [f"{key}: {tuple(data[key].shape)} in the file, {tuple(shape)} here"
             for key, shape in shapes if tuple(data[key].shape) != tuple(shape)]
    if wrong:
        raise ValueError(f"arrays in {path!r} do not match the solver's shapes: "
                         f"{'; '.join(wrong)}")


def _write_npz(f, arrays: Mapping[str, np.ndarray]) -> None:
    """Writes ``arrays`` to the binary file ``f`` as an ``.npz`` archive (``np.load`` reads it).

    Unlike ``np.savez``, the archive is closed even when a write fails, so a failed save
    leaves nothing half-open behind to fail again when it is garbage-collected.
    """
    with zipfile.ZipFile(f, mode="w", compression=zipfile.ZIP_STORED,
                         allowZip64=True) as archive:
        for key, value in arrays.items():
            with archive.open(f"{key}.npy", mode="w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(value), allow_pickle=False)

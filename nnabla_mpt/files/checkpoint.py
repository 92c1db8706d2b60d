"""Checkpoint files: parameters, solver states and updater state in one ``.npz`` archive.

Format (version 1): a NumPy ``.npz`` archive (no pickles) holding

* ``param/<name>``: each parameter's data;
* ``solver/<name>/<key>``: each solver state's arrays;
* ``meta``: UTF-8 JSON ``{"format": "nnabla_mpt.checkpoint", "version": 1, "updater":
  <updater state_dict()>, "solver": {<name>: {"t": int, "keys": [...]}}, "params": [...]}``.

:func:`save` writes the archive through :func:`nnabla_mpt.files.atomic_file.write`: under a
temporary name beside the target, flushed to disk and renamed over the target, so a crash
leaves the previous file or the new one, never a partial one; what is at the path must be
a regular file or nothing (:mod:`nnabla_mpt.files.regular_file`). :func:`load` reads and checks
everything before it changes anything: a file that is not a checkpoint, or a damaged one,
is refused by its path with a ``ValueError``. It reads what the model holds and no more
(:mod:`nnabla_mpt.files.checkpoint_archive`): every member's name, dtype and shape are checked
from its ``.npy`` header against the model before any array is read, the metadata may hold
at most :func:`_meta_limit` bytes, and values that are not finite are refused.
"""
import contextlib
import json
import zipfile
from typing import Any, Callable, Dict, Iterator, Mapping, Tuple

import numpy as np

from ..core import _validate as check
from . import atomic_file, regular_file
from .checkpoint_archive import DAMAGED, Header, array, headers

#: The tag every checkpoint's ``meta`` carries: a name of the file format, not a module
#: path (files saved by every version carry it, so it stays as it is).
FORMAT = "nnabla_mpt.checkpoint"
VERSION = 1
_META_KEYS = ("format", "version", "updater", "solver", "params")
_ZIP_MAGIC = b"PK\x03\x04"
#: The metadata's bound: this many bytes, and :data:`_META_PER_CHAR` for each character
#: of the names of the arrays the model holds (each name is in the metadata twice, and
#: JSON may spell a character in 12 bytes).
_META_BYTES = 1 << 20
_META_PER_CHAR = 32


def save(path: str, params: Mapping[str, Any], solver, updater_state: Mapping) -> None:
    """Writes ``params``' data, ``solver``'s states and ``updater_state`` to ``path``,
    atomically (:func:`nnabla_mpt.files.atomic_file.write`: the folder is checked before the
    arrays are gathered)."""
    def fill(f) -> None:
        # np.savez would leave the archive half-open after a failed write, to fail again
        # when it is garbage-collected: this one is closed whatever happens
        with zipfile.ZipFile(f, mode="w", compression=zipfile.ZIP_STORED,
                             allowZip64=True) as archive:
            for key, value in _gathered(params, solver, updater_state).items():
                with archive.open(f"{key}.npy", mode="w", force_zip64=True) as member:
                    np.lib.format.write_array(member, value, allow_pickle=False)

    atomic_file.write(check.path("path", path), fill, "the checkpoint")


def _gathered(params: Mapping[str, Any], solver,
              updater_state: Mapping) -> Dict[str, np.ndarray]:
    """The archive's arrays, ``meta`` included."""
    states = solver.get_states()
    arrays: Dict[str, np.ndarray] = {key: _copied(v) for key, v in _members(params, states)}
    solver_meta = {name: {"t": int(st.t), "keys": sorted(st.pstate)}
                   for name, st in states.items()}
    meta = {"format": FORMAT, "version": VERSION, "updater": dict(updater_state),
            "solver": solver_meta, "params": list(params)}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
    return arrays


def _members(params: Mapping[str, Any],
             states: Mapping[str, Any]) -> Iterator[Tuple[str, Any]]:
    """``(key, Variable)`` of every array a checkpoint of ``params`` and ``states`` (the
    solver's) holds besides ``meta``: ``param/<name>``, then ``solver/<name>/<key>``."""
    for name, v in params.items():
        yield f"param/{name}", v
    for name, st in states.items():
        for key, var in st.pstate.items():
            yield f"solver/{name}/{key}", var


def _copied(v: Any) -> np.ndarray:
    """A host copy of Variable ``v``'s data, in the dtype it holds, that leaves the array
    where it is: ``get_data("r")`` reads without the cast of ``v.d``, which makes the host
    copy the array's only one (on a GPU it frees the device copy, uploaded again at the
    next use; on the CPU it drops the float16 copy a half-precision pass made)."""
    return np.array(v.data.get_data("r"), copy=True)


def load(path: str, params: Mapping[str, Any], solver,
         check_updater_state: Callable[[Mapping], Any]) -> Mapping:
    """Restores what :func:`save` wrote into ``params`` and ``solver``; returns the updater
    state for the caller to load.

    Everything is checked first: that ``path`` is a regular file, the archive, its
    metadata (the solver states' ``t`` included), every array's presence, shape and dtype
    (from its header, before any array is read), that every value is finite, and the
    updater state with ``check_updater_state`` (which raises if it does not fit). Only
    then are the parameters and solver states written.

    Raises:
        TypeError, ValueError: ``path`` is not a path (the message names ``path``).
        FileNotFoundError: there is no file at ``path``.
        IsADirectoryError, OSError: ``path`` is a folder, a FIFO, a device or a socket
            (:mod:`nnabla_mpt.files.regular_file`); refused before it is read.
        ValueError: the file is not an nnabla_mpt checkpoint, is corrupted, its
            parameters, solver states or updater state do not match, or it holds values
            that are not finite (the message names ``path`` and lists the names).
    """
    path = check.path("path", path)
    states = solver.get_states()
    meta, data = _read(path, params, states)
    _check_finite(path, data)
    try:
        updater_state = check_updater_state(meta["updater"])
    except (TypeError, ValueError) as error:
        raise ValueError(f"the updater state in {path!r} does not fit this updater: "
                         f"{error}") from error

    for key, var in _members(params, states):
        var.d = data[key]
    for name, st in states.items():
        st.t = meta["solver"][name]["t"]
    solver.set_states(states)
    return updater_state


def _corrupted(path: str, what: Any) -> ValueError:
    return ValueError(f"{path!r} is corrupted: {what}")


@contextlib.contextmanager
def _damage_named(path: str, what: str) -> Iterator[None]:
    """Raises what reading a damaged archive raises as a ``ValueError`` naming ``path``."""
    try:
        yield
    except DAMAGED as error:
        raise _corrupted(path, f"{what} ({error})") from error


def _read(path: str, params: Mapping[str, Any],
          states: Mapping[str, Any]) -> Tuple[Dict[str, Any], Dict[str, np.ndarray]]:
    """The checked metadata and the arrays of the checkpoint at ``path``: each member's
    header is checked against ``params`` and ``states`` before any array is read."""
    with regular_file.open_for_reading(path, f"cannot load the checkpoint from {path!r}") as f:
        head = f.read(len(_ZIP_MAGIC))
        if head != _ZIP_MAGIC:
            raise ValueError(f"{path!r} is not an nnabla_mpt checkpoint: "
                             f"{'it is empty' if not head else 'not an .npz archive'}")
        f.seek(0)
        with _damage_named(path, "a damaged or truncated archive"):
            archive = zipfile.ZipFile(f)
        with archive:
            with _damage_named(path, "a damaged archive"):
                found = headers(archive)
            meta = _decoded_meta(path, _meta_bytes(path, archive, found,
                                                   _meta_limit(params, states)))
            _check_names(path, meta, params, states)
            shapes = {key: tuple(var.shape) for key, var in _members(params, states)}
            _check_headers(path, found, shapes)
            with _damage_named(path, "a damaged archive"):
                return meta, {key: array(archive, *found[key]) for key in shapes}


def _meta_limit(params: Mapping[str, Any], states: Mapping[str, Any]) -> int:
    """A bound on the bytes of the metadata of a checkpoint of ``params`` and ``states``."""
    names = [*params, *(f"{name}/{key}" for name, st in states.items() for key in st.pstate)]
    return _META_BYTES + _META_PER_CHAR * sum(len(name) + 1 for name in names)


def _meta_bytes(path: str, archive: zipfile.ZipFile, found: Mapping[str, Tuple[Any, Header]],
                limit: int) -> np.ndarray:
    """The archive's ``meta`` bytes, read once its header is known to be bytes, at most
    ``limit`` of them."""
    if "meta" not in found:
        raise ValueError(f"{path!r} is not an nnabla_mpt checkpoint (no metadata)")
    info, header = found["meta"]
    if not (header.dtype == np.uint8 and len(header.shape) == 1):
        raise _corrupted(path, "its metadata is not an array of bytes")
    if header.nbytes > limit:
        raise _corrupted(path, f"its metadata claims {header.nbytes} bytes, more than the "
                               f"{limit} a checkpoint of this model holds")
    with _damage_named(path, "a damaged archive"):
        return array(archive, info, header)


def _decoded_meta(path: str, raw: np.ndarray) -> Dict[str, Any]:
    """The metadata from the archive's ``meta`` bytes, checked for format and layout."""
    try:
        meta = json.loads(raw.tobytes().decode("utf-8"))
    except ValueError as error:           # UnicodeDecodeError, JSONDecodeError too
        raise _corrupted(path, f"its metadata is not UTF-8 JSON ({error})") from error
    if not isinstance(meta, dict):
        raise _corrupted(path, f"its metadata is a JSON {type(meta).__name__}, not an "
                               f"object")
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise ValueError(f"{path!r} is not an nnabla_mpt checkpoint of version {VERSION}: "
                         f"format={meta.get('format')!r}, version={meta.get('version')!r}")
    try:
        check.exact_keys("its metadata", meta, _META_KEYS)
        _strings("its metadata's 'params'", meta["params"])
        if not isinstance(meta["solver"], dict):
            raise TypeError(f"its metadata's 'solver' must be an object, got "
                            f"{meta['solver']!r}")
        for name, entry in meta["solver"].items():
            check.exact_keys(f"solver state {name!r}", entry, ("t", "keys"))
            check.integer(f"solver state {name!r}: 't'", entry["t"], ge=0)
            _strings(f"solver state {name!r}: 'keys'", entry["keys"])
    except (TypeError, ValueError) as error:
        raise _corrupted(path, error) from error
    return meta


def _strings(name: str, value: Any) -> None:
    if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        raise TypeError(f"{name} must be a list of strings, got {value!r}")
    if len(set(value)) != len(value):
        raise ValueError(f"{name} lists a name twice: {value!r}")


def _check_names(path: str, meta: Mapping, params: Mapping[str, Any],
                 states: Mapping[str, Any]) -> None:
    """The file holds exactly the parameters and solver states given."""
    check.exact_keys(f"parameters in {path!r}", dict.fromkeys(meta["params"]), params)
    check.exact_keys(f"solver states in {path!r}", meta["solver"], states)
    for name, st in states.items():
        check.exact_keys(f"solver state {name!r} in {path!r}",
                         dict.fromkeys(meta["solver"][name]["keys"]), st.pstate)


def _check_headers(path: str, found: Mapping[str, Tuple[Any, Header]],
                   shapes: Mapping[str, Tuple]) -> None:
    """The archive holds every array the metadata lists, and no other, each a float array
    in the shape of the solver's: checked from the headers, before any array is read."""
    arrays = {key: header for key, (_, header) in found.items() if key != "meta"}
    why = check.mismatch(shapes, arrays, "missing arrays", "arrays it does not list")
    if why:
        raise _corrupted(path, f"its arrays do not match its metadata: {why}")
    wrong = [f"{key}: {arrays[key].dtype}" for key in shapes if arrays[key].dtype.kind != "f"]
    if wrong:
        raise _corrupted(path, f"arrays that are not floating point: {'; '.join(wrong)}")
    wrong = [f"{key}: {arrays[key].shape} in the file, {shape} here"
             for key, shape in shapes.items() if arrays[key].shape != shape]
    if wrong:
        raise ValueError(f"arrays in {path!r} do not match the solver's shapes: "
                         f"{'; '.join(wrong)}")


def _check_finite(path: str, data: Mapping[str, np.ndarray]) -> None:
    """Every value in ``data`` is finite: a checkpoint of a run whose parameters or
    solver states are inf or NaN would make every later step overflow."""
    bad = []
    for key, values in data.items():
        count = values.size - int(np.count_nonzero(np.isfinite(values)))
        if count:
            bad.append(f"{key} ({count} of {values.size} values)")
    if bad:
        raise ValueError(f"{path!r} holds values that are not finite (inf or NaN) in "
                         f"{'; '.join(bad)}: a run cannot resume from them, load an "
                         f"earlier checkpoint")


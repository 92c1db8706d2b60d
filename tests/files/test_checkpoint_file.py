"""The checkpoint file itself: a save names the user's path when it cannot be made, leaves
nothing behind when it is killed, gives the file the permissions the user expects and writes
through a symlink; a foreign, damaged or crafted file is refused by name before anything is
changed."""
import fcntl
import io
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import tracemalloc
import zipfile

import numpy as np
import pytest

from doc_pages import ROOT
from nnabla_mpt import DynamicLossScalingUpdater
from support import (Net, assert_bitwise_equal, assert_names, assert_states_bitwise_equal,
                     raises_naming, solver_states)

WORKER = str(ROOT / "tests" / "workers" / "save_loop_worker.py")


def _adam_run(scope="net"):
    net = Net(scope=scope, hidden=3)
    solver = net.solver("Adam", alpha=1e-2)
    updater = DynamicLossScalingUpdater(solver, net.loss, net.feeder, scale=32.0, N=2)
    return net, solver, updater


def _everything(net, solver, updater):
    return net.snapshot(), solver_states(solver), updater.state_dict()


def _assert_unchanged(net, solver, updater, before):
    assert_bitwise_equal(net.snapshot(), before[0])
    assert_states_bitwise_equal(solver_states(solver), before[1])
    assert updater.state_dict() == before[2]


# -- saving: errors name the user's path ---------------------------------------------------

def test_save_into_a_missing_folder_names_the_path_and_the_folder(tmp_path):
    _, _, updater = _adam_run()
    path = tmp_path / "missing" / "ckpt.npz"
    with pytest.raises(FileNotFoundError) as info:
        updater.save_checkpoint(path)
    assert_names(str(info.value), "save", repr(str(path)), repr(str(tmp_path / "missing")),
                 "does not exist")
    assert os.listdir(tmp_path) == []

    (tmp_path / "file").write_text("x")
    with raises_naming(NotADirectoryError, "save", repr(str(tmp_path / "file" / "ckpt.npz")),
                       repr(str(tmp_path / "file")), "not a folder"):
        updater.save_checkpoint(tmp_path / "file" / "ckpt.npz")
    assert os.listdir(tmp_path) == ["file"]


# -- loading: a file that is no checkpoint, or a damaged one -------------------------------

def _saved(tmp_path):
    net, solver, updater = _adam_run()
    updater.update()
    path = tmp_path / "ckpt.npz"
    updater.save_checkpoint(path)
    return net, solver, updater, path


def _rewrite(source, target, edit_meta=None, drop=()):
    """Writes ``source``'s arrays to ``target`` as ``np.savez`` does: a consistent archive
    whose metadata ``edit_meta(meta)`` changed in place, without the arrays ``drop``."""
    with np.load(source) as archive:
        arrays = {k: archive[k] for k in archive.files if k not in drop}
    if edit_meta is not None:
        meta = json.loads(arrays["meta"].tobytes().decode("utf-8"))
        edit_meta(meta)
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
    np.savez(target, **arrays)


def _with_meta_bytes(source, target, raw):
    with np.load(source) as archive:
        arrays = {k: archive[k] for k in archive.files}
    arrays["meta"] = np.frombuffer(raw, dtype=np.uint8)
    np.savez(target, **arrays)


def _zip_with_raw_meta(source, target):
    with zipfile.ZipFile(target, "w") as archive:
        archive.writestr("meta", "{}")


DAMAGED = {
    "empty file": lambda s, t: t.write_bytes(b""),
    "text file": lambda s, t: t.write_text("step 3: loss 0.25\n"),
    "npy file": lambda s, t: np.save(str(t) + ".npy", np.zeros(3)) or os.rename(
        str(t) + ".npy", t),
    "truncated checkpoint": lambda s, t: t.write_bytes(s.read_bytes()[:-200]),
    "zip that is not npz": _zip_with_raw_meta,
    "meta not JSON": lambda s, t: _with_meta_bytes(s, t, b"{not json"),
    "meta not UTF-8": lambda s, t: _with_meta_bytes(s, t, b"\xff\xfe{}"),
    "meta not an object": lambda s, t: _with_meta_bytes(s, t, b"[1, 2]"),
    "meta without solver": lambda s, t: _rewrite(s, t, lambda m: m.pop("solver")),
    "meta without params": lambda s, t: _rewrite(s, t, lambda m: m.pop("params")),
    "solver entry without keys": lambda s, t: _rewrite(
        s, t, lambda m: m["solver"]["out/affine/b"].pop("keys")),
    "array missing": lambda s, t: _rewrite(s, t, drop=("param/out/affine/W",)),
    "solver array missing": lambda s, t: _rewrite(s, t, drop=("solver/out/affine/W/var",)),
    "array of strings": lambda s, t: _rewrite_array(s, t, "param/out/affine/b",
                                                    np.array(["a", "b"])),
    "array of booleans": lambda s, t: _rewrite_array(s, t, "param/out/affine/b",
                                                     np.array([True, False])),
}


def _rewrite_array(source, target, key, value):
    with np.load(source) as archive:
        arrays = {k: archive[k] for k in archive.files}
    arrays[key] = value
    np.savez(target, **arrays)


@pytest.mark.parametrize("case", sorted(DAMAGED))
def test_load_refuses_a_file_that_is_not_a_sound_checkpoint_by_name(tmp_path, case):
    net, solver, updater, good = _saved(tmp_path)
    path = tmp_path / "bad.npz"
    DAMAGED[case](good, path)
    updater.update()
    before = _everything(net, solver, updater)
    with pytest.raises(ValueError) as info:
        updater.load_checkpoint(path)
    message = str(info.value)
    assert_names(message, repr(str(path)))
    assert "not an nnabla_mpt checkpoint" in message or "is corrupted" in message, message
    _assert_unchanged(net, solver, updater, before)


def _set_t(value):
    def edit(meta):
        entry = meta["solver"]["out/affine/b"]
        if value is _MISSING:
            entry.pop("t")
        else:
            entry["t"] = value
    return edit


_MISSING = object()


@pytest.mark.parametrize("t", ["1", _MISSING, -1, 1.0, True],
                         ids=["string", "missing", "negative", "float", "bool"])
def test_load_with_a_bad_solver_t_changes_nothing(tmp_path, t):
    net, solver, updater, good = _saved(tmp_path)
    path = tmp_path / "crafted.npz"
    _rewrite(good, path, _set_t(t))
    updater.update()
    before = _everything(net, solver, updater)
    with raises_naming(ValueError, repr(str(path)), "'out/affine/b'", "'t'",
                       "missing" if t is _MISSING else repr(t)):
        updater.load_checkpoint(path)
    _assert_unchanged(net, solver, updater, before)


# -- nothing left behind -------------------------------------------------------------------

def test_a_stale_temporary_of_a_killed_save_is_replaced_by_the_next_save(tmp_path):
    _, _, updater = _adam_run()
    path = tmp_path / "ckpt.npz"
    updater.save_checkpoint(path)
    previous = path.read_bytes()
    # What a save killed after it had started writing leaves: part of an archive.
    (tmp_path / ".ckpt.npz.tmp").write_bytes(previous[:100])
    updater.update()
    updater.save_checkpoint(path)
    assert sorted(os.listdir(tmp_path)) == ["ckpt.npz"]
    assert path.read_bytes() != previous
    updater.load_checkpoint(path)
    assert updater.steps == 1


def test_a_save_waits_for_a_save_in_progress_to_the_same_file(tmp_path):
    """A temporary that is locked belongs to a save still writing: the next save waits for
    it instead of taking it over, then replaces it."""
    _, _, updater = _adam_run()
    path = tmp_path / "ckpt.npz"
    with open(tmp_path / ".ckpt.npz.tmp", "wb") as writing:   # another save, writing
        fcntl.flock(writing.fileno(), fcntl.LOCK_EX)
        errors = []
        second = threading.Thread(target=lambda: _run(errors, updater.save_checkpoint, path))
        second.start()
        second.join(0.5)
        assert second.is_alive()                  # it waits ...
        assert sorted(os.listdir(tmp_path)) == [".ckpt.npz.tmp"]
    second.join(60)                               # ... until the other one is gone
    assert not second.is_alive() and errors == []
    assert sorted(os.listdir(tmp_path)) == ["ckpt.npz"]
    updater.load_checkpoint(path)


def _run(errors, function, *args):
    try:
        function(*args)
    except BaseException as error:               # reported by the test's thread
        errors.append(error)


def _kill_while_writing(directory, timeout=60.0):
    """Starts a process that saves a large checkpoint to ``directory`` over and over, and
    kills it with SIGKILL once a save has started writing (a file beside the checkpoint
    holds some bytes). Returns the names in ``directory`` after the kill."""
    proc = subprocess.Popen([sys.executable, WORKER, str(directory / "ckpt.npz")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if _bytes_beside(directory / "ckpt.npz") > 0:   # a save is writing
                os.kill(proc.pid, signal.SIGKILL)
                break
            if proc.poll() is not None:
                raise AssertionError(proc.stderr.read().decode())
            time.sleep(0.001)
        else:
            raise AssertionError("the worker never started a second save")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    return sorted(os.listdir(directory))


def _bytes_beside(path):
    """The bytes in the files beside ``path`` (0 until ``path`` exists)."""
    if not path.exists():
        return 0
    total = 0
    for name in os.listdir(path.parent):
        if name != path.name:
            try:
                total += os.path.getsize(path.parent / name)
            except FileNotFoundError:               # renamed meanwhile
                pass
    return total


def test_a_save_killed_while_writing_leaves_nothing_after_the_next_save(tmp_path):
    # The kill can land between two saves, where nothing is being written; try again then.
    for _ in range(5):
        for name in os.listdir(tmp_path):
            os.unlink(tmp_path / name)
        left = _kill_while_writing(tmp_path)
        if _bytes_beside(tmp_path / "ckpt.npz") > 0:
            break
    assert _bytes_beside(tmp_path / "ckpt.npz") > 0, left   # the killed save's temporary
    with np.load(tmp_path / "ckpt.npz") as archive:  # the previous checkpoint is whole
        assert "meta" in archive.files and zipfile.is_zipfile(tmp_path / "ckpt.npz")
    _, _, updater = _adam_run()
    updater.save_checkpoint(tmp_path / "ckpt.npz")
    assert sorted(os.listdir(tmp_path)) == ["ckpt.npz"]
    updater.load_checkpoint(tmp_path / "ckpt.npz")


# -- permissions and symlinks --------------------------------------------------------------

@pytest.fixture
def umask():
    """Sets the process's umask for the test; the previous one is restored after."""
    previous = os.umask(0o022)
    yield os.umask
    os.umask(previous)


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o027, 0o640)],
                         ids=["umask 022", "umask 027"])
def test_a_new_checkpoint_gets_the_permissions_the_umask_gives(tmp_path, umask, mask, mode):
    _, _, updater = _adam_run()
    umask(mask)
    path = tmp_path / "ckpt.npz"
    updater.save_checkpoint(path)
    assert oct(os.stat(path).st_mode & 0o777) == oct(mode)


def test_an_existing_checkpoint_keeps_its_permissions(tmp_path, umask):
    _, _, updater = _adam_run()
    path = tmp_path / "ckpt.npz"
    updater.save_checkpoint(path)
    os.chmod(path, 0o640)
    updater.update()
    updater.save_checkpoint(path)
    assert oct(os.stat(path).st_mode & 0o777) == oct(0o640)
    updater.load_checkpoint(path)
    assert updater.steps == 1


def test_saving_through_a_symlink_replaces_the_link_target(tmp_path):
    _, _, updater = _adam_run()
    (tmp_path / "real").mkdir()
    link = tmp_path / "ckpt.npz"
    link.symlink_to(os.path.join("real", "ckpt.npz"))   # dangling until the first save
    for steps in (0, 1):
        updater.save_checkpoint(link)
        assert link.is_symlink()
        assert os.readlink(link) == os.path.join("real", "ckpt.npz")
        assert sorted(os.listdir(tmp_path)) == ["ckpt.npz", "real"]
        assert sorted(os.listdir(tmp_path / "real")) == ["ckpt.npz"]
        updater.update()
        updater.load_checkpoint(tmp_path / "real" / "ckpt.npz")
        assert updater.steps == steps
        updater.update()


# -- reading: a save copies the arrays without moving them ---------------------------------

def test_a_save_copies_the_arrays_without_dropping_their_other_copies(tmp_path):
    # Reading NdArray.data (.d) casts the array to the host and makes that its only copy:
    # on a GPU the device copy is freed and uploaded again at the next use. The CPU has no
    # device copy to show; what it shows is the same cast dropping the float16 copy that a
    # half-precision forward pass converted each float32 parameter into. A save reads with
    # get_data("r"), which copies and drops nothing.
    net = Net("half", hidden=3)
    solver = net.solver("Adam", alpha=1e-2)
    updater = DynamicLossScalingUpdater(solver, net.loss, net.feeder, scale=32.0)
    for _ in range(3):
        updater.update()
    net.loss.forward()      # an evaluation pass: every parameter gets its float16 copy again
    params = solver.get_parameters()
    halves = {k: v.data.get_data("r", np.float16) for k, v in params.items()}
    heads = {k: (v.data.dtype, v.grad.dtype) for k, v in params.items()}
    path = tmp_path / "ckpt.npz"
    updater.save_checkpoint(path)
    for k, v in params.items():
        assert v.data.get_data("r", np.float16).ctypes.data == halves[k].ctypes.data, (
            f"{k}: the save dropped the parameter's float16 copy")
        assert (v.data.dtype, v.grad.dtype) == heads[k] == (np.float32, np.float32)
    with np.load(path) as saved:
        for k, v in params.items():
            values = v.data.get_data("r")
            assert saved[f"param/{k}"].dtype == values.dtype
            assert saved[f"param/{k}"].tobytes() == values.tobytes(), k
        for name, st in solver.get_states().items():
            for key, var in st.pstate.items():
                values = var.data.get_data("r")
                assert saved[f"solver/{name}/{key}"].dtype == values.dtype
                assert saved[f"solver/{name}/{key}"].tobytes() == values.tobytes()


# -- what is not a regular file: refused by name and left as it is -------------------------

def _fifo(path):
    os.mkfifo(path)
    return stat.S_ISFIFO


def _folder(path):
    os.mkdir(path)
    return stat.S_ISDIR


def _socket(path):
    # AF_UNIX addresses are short: bind the name relative to the folder, as the test's cwd.
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(os.path.basename(path))
    return stat.S_ISSOCK


def _device(path):
    """A character device like /dev/null (major 1, minor 3) made in the test's folder:
    where a save replaced it, only this copy is lost."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("making a device node needs CAP_MKNOD")
    return stat.S_ISCHR


def _link_to_fifo(path):
    os.mkfifo(str(path) + ".fifo")
    os.symlink(os.path.basename(str(path) + ".fifo"), path)
    return stat.S_ISFIFO


NOT_REGULAR = {"fifo": (_fifo, "a FIFO (named pipe)"), "folder": (_folder, "a folder"),
               "socket": (_socket, "a socket"), "device": (_device, "a character device"),
               "symlink to a fifo": (_link_to_fifo, "a FIFO (named pipe)")}


def _what_is_at(path):
    st = os.stat(path)
    return stat.S_IFMT(st.st_mode), st.st_ino


@pytest.mark.parametrize("case", sorted(NOT_REGULAR))
def test_save_refuses_what_is_not_a_regular_file_and_leaves_it(tmp_path, monkeypatch, case):
    monkeypatch.chdir(tmp_path)
    make, kind = NOT_REGULAR[case]
    path = tmp_path / "ckpt.npz"
    is_kind = make(path)
    before, listed = _what_is_at(path), sorted(os.listdir(tmp_path))
    _, _, updater = _adam_run()
    with pytest.raises(OSError) as info:
        updater.save_checkpoint(path)
    assert_names(str(info.value), "save", repr(str(path)), kind,
                 *(() if kind == "a folder" else ("not a regular file",)))
    assert is_kind(os.stat(path).st_mode) and _what_is_at(path) == before
    assert sorted(os.listdir(tmp_path)) == listed      # no temporary left either


def test_saving_to_dev_null_is_refused_and_dev_null_stays_a_device(tmp_path):
    # Proven first on a FIFO of our own (the same check refuses devices): a save that
    # replaced what is at its path must not get to replace the machine's /dev/null.
    _, _, updater = _adam_run()
    os.mkfifo(tmp_path / "fifo")
    with raises_naming(OSError, "save", repr(str(tmp_path / "fifo")), "a FIFO",
                       "not a regular file"):
        updater.save_checkpoint(tmp_path / "fifo")
    before = _what_is_at("/dev/null")
    with raises_naming(OSError, "save", "'/dev/null'", "a character device",
                       "not a regular file"):
        updater.save_checkpoint("/dev/null")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode) and _what_is_at("/dev/null") == before
    assert not os.path.lexists("/dev/.null.tmp")


def _release_a_blocked_reader(fifo, done, seconds=5.0):
    """Opens ``fifo`` for writing and closes it if ``done`` is not set within ``seconds``:
    a load blocked in opening it goes on (and reads nothing) instead of hanging the test."""
    def release():
        if not done.wait(seconds):
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass          # no reader waits
    thread = threading.Thread(target=release, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("case", sorted(NOT_REGULAR) + ["/dev/zero"])
def test_load_refuses_what_is_not_a_regular_file_at_once(tmp_path, monkeypatch, case):
    monkeypatch.chdir(tmp_path)
    net, solver, updater = _adam_run()
    if case == "/dev/zero":
        path, kind = "/dev/zero", "a character device"
    else:
        make, kind = NOT_REGULAR[case]
        path = str(tmp_path / "ckpt.npz")
        make(path)
    updater.update()
    before = _everything(net, solver, updater)
    done = threading.Event()
    releaser = _release_a_blocked_reader(path, done)
    start = time.monotonic()
    try:
        with pytest.raises(OSError) as info:
            updater.load_checkpoint(path)
    finally:
        done.set()
        releaser.join()
    assert time.monotonic() - start < 2.0
    assert_names(str(info.value), "load", repr(path), kind)
    _assert_unchanged(net, solver, updater, before)


@pytest.mark.parametrize("method", ["save_checkpoint", "load_checkpoint"])
@pytest.mark.parametrize("value, error, facts", [
    (123, TypeError, ("path", "str", "os.PathLike", "123", "int")),
    ("", ValueError, ("path", "empty string", "''")),
    ("ckpt\0.npz", ValueError, ("path", "'ckpt\\x00.npz'", "NUL byte")),
], ids=["int", "empty", "nul"])
def test_a_path_that_is_no_path_is_refused_by_name(tmp_path, monkeypatch, method, value,
                                                   error, facts):
    monkeypatch.chdir(tmp_path)
    _, _, updater = _adam_run()
    with raises_naming(error, *facts):
        getattr(updater, method)(value)
    assert os.listdir(tmp_path) == []


# -- a crafted archive costs no more memory than the model -------------------------------

GIB_OF_FLOAT32 = (16384, 16384)


def _craft(source, target, key, header, data=b"", tail=b""):
    """``source``'s archive with the member ``key`` made of ``header`` (an .npy header
    dict), ``data`` and ``tail``, deflated: a small file whatever its header claims."""
    member = io.BytesIO()
    np.lib.format.write_array_header_1_0(member, header)
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(
            target, "w", compression=zipfile.ZIP_DEFLATED) as new:
        for info in old.infolist():
            if info.filename != f"{key}.npy":
                new.writestr(info.filename, old.read(info))
        new.writestr(f"{key}.npy", member.getvalue() + data + tail)
    assert os.path.getsize(target) < 1 << 20


def _huge_param(s, t):
    _craft(s, t, "param/out/affine/W",
           {"descr": "<f4", "fortran_order": False, "shape": GIB_OF_FLOAT32}, b"\0" * 64)


def _huge_meta(s, t):
    _craft(s, t, "meta", {"descr": "|u1", "fortran_order": False, "shape": (1 << 30,)},
           b"{}")


def _long_tail(s, t):
    with np.load(s) as archive:
        w = archive["param/out/affine/W"]
    _craft(s, t, "param/out/affine/W", {"descr": w.dtype.str, "fortran_order": False,
                                        "shape": w.shape}, w.tobytes(), bytes(1 << 26))


def _negative_meta(s, t):
    # numpy's header reader takes a shape of -1; behind it, 64 MiB that deflate to little
    _craft(s, t, "meta", {"descr": "|u1", "fortran_order": False, "shape": (-1,)},
           b"\0" * (64 << 20))


# (how to craft it, the facts the refusal carries besides the path)
CRAFTED = {
    "metadata of shape (-1,)": (_negative_meta, ("corrupted", "'meta.npy'", "not an .npy array",
                                                 "(-1,)")),
    "parameter claiming 1 GiB": (_huge_param, ("the solver's shapes", "param/out/affine/W",
                                               "(16384, 16384)", "(3, 2)")),
    "metadata claiming 1 GiB": (_huge_meta, ("corrupted", "metadata", "1073741824 bytes",
                                             "more than")),
    "parameter with 64 MiB past its data": (
        _long_tail, ("corrupted", "damaged archive", "'param/out/affine/W.npy'", "24 bytes")),
}


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_a_crafted_archive_is_refused_without_reading_what_it_claims(tmp_path, case):
    net, solver, updater, good = _saved(tmp_path)
    path = tmp_path / "crafted.npz"
    craft, facts = CRAFTED[case]
    craft(good, path)
    updater.update()
    before = _everything(net, solver, updater)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError) as info:
            updater.load_checkpoint(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"loading took {peak} bytes"
    assert_names(str(info.value), repr(str(path)), *facts)
    _assert_unchanged(net, solver, updater, before)


# -- values that are not finite ------------------------------------------------------------

def test_a_checkpoint_of_values_that_are_not_finite_is_refused_naming_them(tmp_path):
    net, solver, updater, good = _saved(tmp_path)
    with np.load(good) as archive:
        arrays = {k: archive[k] for k in archive.files}
    arrays["param/out/affine/W"] = np.full_like(arrays["param/out/affine/W"], np.nan)
    state = arrays["solver/out/affine/b/mean"].copy()
    state[0] = np.inf
    arrays["solver/out/affine/b/mean"] = state
    path = tmp_path / "diverged.npz"
    np.savez(path, **arrays)
    updater.update()
    before = _everything(net, solver, updater)
    with pytest.raises(ValueError) as info:
        updater.load_checkpoint(path)
    assert_names(str(info.value), repr(str(path)), "not finite", "inf or NaN",
                 "param/out/affine/W", "6 of 6", "solver/out/affine/b/mean", "1 of 2",
                 "cannot resume", "load an earlier checkpoint")
    _assert_unchanged(net, solver, updater, before)

"""A file replaced atomically: written in full under a temporary name, flushed, renamed.

:func:`write` is how a checkpoint reaches the disk:

* Where: through a symlink, the link's target is replaced and the link stays. The folder,
  and that the target is a regular file or nothing (never a FIFO, a device, a socket or
  a folder), are checked before anything is written; the error names the user's path.
* The temporary: one per target, ``.<name>.tmp`` beside it, locked (``flock``) while a save
  writes it. A save that was killed leaves it behind; the next save to the same target
  finds it unlocked and replaces it, so killed saves never pile up. A second save to the
  same target while one is writing waits for it.
* Permissions: a new file gets those the umask gives (``0644`` with the usual ``022``); an
  existing file keeps its own, as an editor that saves over it would.
* A crash leaves the previous file or the new one, never a partial one: the rename comes
  after ``fsync``, and the folder is flushed after the rename.

Linux (and POSIX) only, as the rest of the package.
"""
import contextlib
import errno
import fcntl
import os
import stat
from typing import BinaryIO, Callable

from . import regular_file


def write(path: str, fill: Callable[[BinaryIO], None], what: str) -> None:
    """Replaces the file at ``path`` (or at the target of the symlink ``path``) by what
    ``fill(f)`` writes to the binary file ``f``, atomically.

    ``fill`` is called only once the target's folder is known to exist. ``what`` names the
    file in errors (``"the checkpoint"``).

    Raises:
        FileNotFoundError, NotADirectoryError, IsADirectoryError: the folder does not exist,
            is not a folder, or ``path`` is a folder; checked before ``fill`` runs.
        OSError: (``EINVAL``) a FIFO, a device or a socket is at ``path`` (or at the
            target of the symlink ``path``); it is left as it is, checked before ``fill``
            runs (:mod:`nnabla_mpt.files.regular_file`).
        OSError: writing failed; the message names ``path``, the previous file is intact
            and the temporary is removed.
    """
    target = _checked_target(path, what)
    folder = os.path.dirname(target)
    temporary = os.path.join(folder, f".{os.path.basename(target)}.tmp")
    try:
        fd = _open_temporary(temporary)
        with os.fdopen(fd, "wb") as f:            # closing it releases the lock
            try:
                _keep_mode(f.fileno(), target)
                fill(f)
                f.flush()
                os.fsync(f.fileno())
                os.replace(temporary, target)
            except BaseException:
                os.unlink(temporary)              # still ours: the lock is held
                raise
    except OSError as error:
        raise OSError(error.errno, f"cannot save {what} to {path!r}: {error.strerror}"
                      + (f" ({error.filename!r})" if error.filename else "")) from error
    _fsync_dir(folder)


def _checked_target(path: str, what: str) -> str:
    """The file to replace: ``path``, or the target of the symlink ``path``; its folder
    must exist, and what is there must be a regular file or nothing."""
    target = os.path.realpath(path)
    folder = os.path.dirname(target)
    prefix = f"cannot save {what} to {path!r}"
    regular_file.check_existing(target, prefix)
    if not os.path.isdir(folder):
        if os.path.lexists(folder):
            raise NotADirectoryError(errno.ENOTDIR, f"{prefix}: {folder!r} is not a folder")
        raise FileNotFoundError(errno.ENOENT,
                                f"{prefix}: the folder {folder!r} does not exist")
    return target


def _open_temporary(temporary: str) -> int:
    """Creates ``temporary`` anew (so the umask gives its permissions) and locks it.

    An existing one belongs to a save in progress (locked: wait for it) or to a save that
    was killed (unlocked: remove it). Every change of the name ``temporary`` is made by
    the holder of the lock on the file it names, so whoever locks a file that still bears
    the name owns it.
    """
    while True:
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
            created = True
        except FileExistsError:
            try:
                fd = os.open(temporary, os.O_RDONLY | os.O_NOFOLLOW)
            except FileNotFoundError:
                continue                          # its save ended meanwhile
            created = False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)        # waits while a save writes it
            if _names(temporary, fd):
                if created:
                    return fd
                os.unlink(temporary)              # stale: its save was killed
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


def _names(path: str, fd: int) -> bool:
    """Whether ``path`` still names the open file ``fd``."""
    try:
        named = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return os.path.samestat(named, os.fstat(fd))


def _keep_mode(fd: int, target: str) -> None:
    """Gives the new file the permission bits of the file it replaces, if there is one."""
    with contextlib.suppress(FileNotFoundError):
        mode = stat.S_IMODE(os.stat(target).st_mode)
        os.fchmod(fd, mode)


def _fsync_dir(path: str) -> None:
    """Flushes the directory entry of a renamed file, where the platform allows it."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

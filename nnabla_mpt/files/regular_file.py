"""A checkpoint is a regular file: what else is at a path is refused by name.

A folder, a FIFO (named pipe), a character or block device (``/dev/null``) or a socket at
the path, or at the target of a symlink there, is neither replaced by a save nor read by a
load: the error names the user's path and what is there. Reading opens the file without
blocking and checks what it opened, so a FIFO never makes a load wait for a writer.

Linux (and POSIX) only, as the rest of the package.
"""
import contextlib
import errno
import fcntl
import os
import stat
from typing import BinaryIO

#: What is at a path that is not a regular file, by its ``stat`` test.
_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def refuse_other(mode: int, prefix: str) -> None:
    """Raises unless ``mode`` (an ``st_mode``) is a regular file's; ``prefix`` begins the
    message (``"cannot save the checkpoint to '/dev/null'"``).

    Raises:
        IsADirectoryError: it is a folder.
        OSError: (``EINVAL``) it is a FIFO, a device, a socket or anything else.
    """
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, f"{prefix}: it is a folder")
    kind = next((kind for test, kind in _KINDS if test(mode)),
                f"a file of type {stat.S_IFMT(mode):#o}")
    raise OSError(errno.EINVAL, f"{prefix}: it is {kind}, not a regular file")


def check_existing(path: str, prefix: str) -> None:
    """Refuses what is at ``path`` (a symlink followed) unless it is a regular file or
    nothing (its folder may be missing too: the caller says so)."""
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        refuse_other(os.stat(path).st_mode, prefix)


def open_for_reading(path: str, prefix: str) -> BinaryIO:
    """The regular file at ``path`` (a symlink followed), opened for binary reading.

    What is there is checked before it is opened (opening a device may act on it) and
    again once it is opened, without blocking (a FIFO would wait for a writer), so a
    file swapped in between is refused too.

    Raises:
        FileNotFoundError: there is nothing at ``path``.
        IsADirectoryError, OSError: what is there is not a regular file (:func:`refuse_other`).
    """
    refuse_other(os.stat(path).st_mode, prefix)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        refuse_other(os.fstat(fd).st_mode, prefix)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise

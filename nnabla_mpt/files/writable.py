"""Whether a file can be written in a folder, found by trying: ``os.access`` answers yes
to root where a read-only file system or ``/proc`` still refuses."""
import os
import tempfile


def cannot_write_in(folder: str) -> str:
    """Why no file can be written in ``folder`` (the system's words), or ``""``."""
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as err:
        return err.strerror or str(err)
    return ""


def writable_folder(name: str, path: str) -> None:
    """Makes the folder ``path`` (the argument ``name``) if it is missing, and checks that
    a file can be written in it.

    Raises:
        OSError: it cannot be made or written to; the message names the argument and the
            path.
    """
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as err:
        raise OSError(err.errno, f"{name} {path!r} cannot be made or written to: "
                                 f"{err.strerror}") from None
    why = cannot_write_in(path)
    if why:
        raise OSError(f"{name} {path!r} cannot be made or written to: {why}")

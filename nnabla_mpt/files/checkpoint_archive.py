"""Reading a checkpoint's ``.npz`` archive with memory bounded by what is asked of it.

An ``.npz`` archive is a zip file of ``.npy`` members. :func:`headers` reads every
member's ``.npy`` header (dtype, shape, order) and nothing more: a few hundred bytes each,
whatever the member holds. The caller checks them against its model; only then does
:func:`array` read a member, allocating what its checked header says and decompressing no
more than that (and one byte past it, to refuse a member longer than its header). A
crafted archive whose header claims gigabytes is thus refused before it costs them.
"""
import math
import zipfile
import zlib
from typing import BinaryIO, Dict, NamedTuple, Tuple

import numpy as np

#: What reading a damaged archive raises (bad zip structure or deflate stream, CRC, header).
DAMAGED = (zipfile.BadZipFile, zlib.error, EOFError, ValueError,
           RuntimeError, NotImplementedError)   # an encrypted member, an unknown method
#: The largest ``.npy`` header read (numpy's own default bound).
_MAX_HEADER = 10000
_READERS = {(1, 0): np.lib.format.read_array_header_1_0,
            (2, 0): np.lib.format.read_array_header_2_0}


class Header(NamedTuple):
    """A member's ``.npy`` header."""
    shape: Tuple[int, ...]
    fortran_order: bool
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def headers(archive: zipfile.ZipFile) -> Dict[str, Tuple[zipfile.ZipInfo, Header]]:
    """Every member's header, by its name without ``.npy`` (``np.load``'s key).

    Raises:
        ValueError: a member is not an ``.npy`` array, or two members have one name; the
            message names the member.
        zipfile.BadZipFile, zlib.error, EOFError: the archive is damaged.
    """
    found: Dict[str, Tuple[zipfile.ZipInfo, Header]] = {}
    for info in archive.infolist():
        name = info.filename
        key = name[:-len(".npy")] if name.endswith(".npy") else name
        if key in found:
            raise ValueError(f"it holds the member {name!r} twice")
        with archive.open(info) as stream:
            found[key] = (info, _header(name, stream))
    return found


def _header(name: str, stream: BinaryIO) -> Header:
    try:
        version = np.lib.format.read_magic(stream)
        if version not in _READERS:
            raise ValueError(f".npy format version {version} (this reads 1.0 and 2.0)")
        shape, fortran_order, dtype = _READERS[version](stream, max_header_size=_MAX_HEADER)
        if any(not isinstance(n, int) or n < 0 for n in shape):
            raise ValueError(f"its header gives the shape {shape!r}")   # numpy takes -1
    except ValueError as error:
        raise ValueError(f"the member {name!r} is not an .npy array: {error}") from error
    return Header(tuple(shape), bool(fortran_order), np.dtype(dtype))


def array(archive: zipfile.ZipFile, info: zipfile.ZipInfo, header: Header) -> np.ndarray:
    """The (read-only) array of the member ``info``, whose header :func:`headers` read as
    ``header``: ``header.nbytes`` are read, no more.

    Raises:
        ValueError: the member is shorter or longer than its header says, or its header
            changed since it was read.
        zipfile.BadZipFile, zlib.error, EOFError: the archive is damaged (a CRC mismatch
            included: the member is read to its end).
    """
    with archive.open(info) as stream:
        if _header(info.filename, stream) != header:
            raise ValueError(f"the header of the member {info.filename!r} changed while "
                             f"it was read")
        raw = stream.read(header.nbytes)
        if len(raw) != header.nbytes:
            raise ValueError(f"the member {info.filename!r} is truncated: {len(raw)} of "
                             f"{header.nbytes} bytes")
        if stream.read(1):
            raise ValueError(f"the member {info.filename!r} holds more than the "
                             f"{header.nbytes} bytes its header says")
    order = "F" if header.fortran_order else "C"
    return np.frombuffer(raw, dtype=header.dtype).reshape(header.shape, order=order)

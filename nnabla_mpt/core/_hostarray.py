"""nnabla NdArrays and host memory, both ways.

:func:`host_ndarray` is an :class:`nnabla.NdArray` over host memory that nnabla does not own.
nnabla borrows external memory through DLPack (:func:`nnabla.utils.dlpack.from_dlpack`).
The ``DLManagedTensor`` is built here with ctypes, in one ``calloc``'d (zeroed) block that also
holds its shape and strides; its deleter is libc's ``free``, so nnabla releases exactly
that block when the array goes away and never the memory it points to. The strides are
always given: nnabla 1.39 reads them without checking for the NULL that DLPack allows
for contiguous tensors (NumPy 1.26's capsules pass NULL, and nnabla crashes on them).

The caller keeps the memory alive for as long as any array over it exists.

:func:`host_view` is the other way round, a NumPy view of an NdArray's host memory, and
:func:`dtype_of` the dtype an NdArray holds.
"""
import ctypes
from typing import Sequence

import numpy as np

_KDL_CPU = 1
_CODES = {"f": 2, "i": 0, "u": 1}  # DLPack type codes: float, int, uint


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p),
                ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32),
                ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16),
                ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


_libc = ctypes.CDLL(None)
_calloc = _libc.calloc
_calloc.restype = ctypes.c_void_p
_calloc.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
_FREE = ctypes.cast(_libc.free, ctypes.c_void_p).value
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_HEAD = ctypes.sizeof(_DLManagedTensor)


def host_ndarray(ptr: int, shape: Sequence[int], dtype=np.float32):
    """An NdArray of ``shape`` and ``dtype`` whose data is the memory at ``ptr``.

    Writing the array writes that memory and the other way round, as long as nnabla keeps
    this array as the array's current copy (``NdArray.zero()`` and ``fill()``, for one,
    make nnabla drop it and allocate memory of its own on the next write).
    """
    from nnabla.utils.dlpack import from_dlpack

    dtype = np.dtype(dtype)
    if dtype.kind not in _CODES:
        raise TypeError(f"host_ndarray: dtype must be a float or integer type, got {dtype}")
    shape = [int(s) for s in shape]
    ndim = len(shape)
    block = _calloc(1, _HEAD + 16 * max(ndim, 1))     # zeroed: no manager_ctx, no offset
    if not block:
        raise MemoryError("host_ndarray: calloc failed")
    managed = _DLManagedTensor.from_address(block)
    shp = (ctypes.c_int64 * max(ndim, 1)).from_address(block + _HEAD)
    strides = (ctypes.c_int64 * max(ndim, 1)).from_address(block + _HEAD + 8 * max(ndim, 1))
    step = 1
    for i in range(ndim - 1, -1, -1):
        shp[i] = shape[i]
        strides[i] = step
        step *= shape[i]
    t = managed.dl_tensor
    t.data = ptr
    t.device_type, t.device_id = _KDL_CPU, 0
    t.ndim = ndim
    t.code, t.bits, t.lanes = _CODES[dtype.kind], 8 * dtype.itemsize, 1
    t.shape = ctypes.addressof(shp)
    t.strides = ctypes.addressof(strides)
    managed.deleter = _FREE
    return from_dlpack(_capsule_new(block, b"dltensor", None))


def host_view(a, dtype: np.dtype, ctx, write_only: bool = False) -> np.ndarray:
    """A flat numpy view of NdArray ``a``'s host memory in ``dtype`` (``ctx``: a CPU context).

    Goes through ``NdArray.data_ptr``, which (like ``NdArray.cast``) makes the array in
    ``dtype`` the only valid copy, so writes through the view are what nnabla reads
    next. ``NdArray.get_data`` does the same but costs some 40 microseconds per call,
    which for a model with 200 parameter arrays exceeds the reduction itself.
    The view is valid until nnabla next touches the array, so it is used at once.
    """
    if a.size == 0:
        return np.empty(0, dtype)
    ptr = a.data_ptr(dtype, ctx, write_only)
    return np.frombuffer((ctypes.c_char * (a.size * dtype.itemsize)).from_address(ptr),
                         dtype=dtype)


def dtype_of(a) -> np.dtype:
    """The dtype NdArray ``a`` holds; float32 for one never written (nnabla reads it so)."""
    try:
        return np.dtype(a.dtype)
    except RuntimeError:
        return np.dtype(np.float32)

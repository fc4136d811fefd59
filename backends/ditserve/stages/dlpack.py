"""Torch-free access to pb_utils tensors through their DLPack capsules.

The public models only pass tensors between stages, so they import neither torch nor
diffusers (an in-flight generation costs one such process: docs/scheduler.md). pb_utils
alone cannot do two things they need: drop the batch dimension of a tensor another model
returned (on the host or on a GPU), and read the bytes of a BF16 tensor (`as_numpy()`
refuses BF16). Both work on the DLManagedTensor of a fresh `to_dlpack()` capsule.

Triton 2.51's Python backend exports a capsule whose `shape` points into the tensor's own
dims and whose deleter releases only the tensor (python_backend src/pb_tensor.cc,
PbTensor::ToDLPack), and `from_dlpack` copies the dims it is given; so a view without the
leading dim of 1 is the same capsule with `shape` advanced by one and `ndim` one less.
"""
from __future__ import annotations

import ctypes
import math

import triton_python_backend_utils as pb_utils

from ..handoff import HostTensor


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32), ("dtype", _DataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class _ManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]

_CPU = 1
# (DLPack type code, bits) -> safetensors dtype. Codes: 0 int, 1 uint, 2 float, 4 bfloat, 6 bool.
_SAFETENSORS_DTYPES = {(0, 8): "I8", (0, 16): "I16", (0, 32): "I32", (0, 64): "I64", (1, 8): "U8", (1, 16): "U16",
                       (1, 32): "U32", (1, 64): "U64", (2, 16): "F16", (2, 32): "F32", (2, 64): "F64",
                       (4, 16): "BF16", (6, 8): "BOOL"}


def _dl_tensor(capsule) -> _Tensor:
    """The DLTensor inside a not yet consumed capsule (edits write through to it)."""
    return _ManagedTensor.from_address(_get_pointer(capsule, b"dltensor")).dl_tensor


def _dims(tensor: _Tensor) -> tuple[int, ...]:
    return tuple(tensor.shape[i] for i in range(tensor.ndim))


def _advanced(pointer, count: int = 1):
    return ctypes.cast(ctypes.addressof(pointer.contents) + count * ctypes.sizeof(ctypes.c_int64), type(pointer))


def without_batch(name: str, tensor) -> "pb_utils.Tensor":
    """`tensor` [1, ...] as a pb_utils.Tensor `name` [...], without a copy, where it lies
    (host or GPU). It keeps `tensor` alive as long as it lives."""
    capsule = tensor.to_dlpack()
    dl = _dl_tensor(capsule)
    dims = _dims(dl)
    if not dims or dims[0] != 1:
        raise ValueError(f"{tensor.name()}: expected a batch of one, got shape {list(dims)}")
    dl.shape = _advanced(dl.shape)
    if dl.strides:
        dl.strides = _advanced(dl.strides)
    dl.ndim -= 1
    return pb_utils.Tensor.from_dlpack(name, capsule)


def host_tensor(tensor) -> HostTensor:
    """A copy of a host pb_utils.Tensor's bytes with its dtype and shape, any dtype (BF16 too)."""
    if not tensor.is_cpu():
        raise ValueError(f"{tensor.name()}: expected a tensor on the host, got one on a GPU")
    capsule = tensor.to_dlpack()
    dl = _dl_tensor(capsule)
    key = (dl.dtype.code, dl.dtype.bits)
    if key not in _SAFETENSORS_DTYPES or dl.dtype.lanes != 1 or dl.device.device_type != _CPU:
        raise ValueError(f"{tensor.name()}: unsupported DLPack dtype {key} x{dl.dtype.lanes} on device "
                         f"type {dl.device.device_type}")
    dims = _dims(dl)
    size = math.prod(dims) * dl.dtype.bits // 8
    return HostTensor(_SAFETENSORS_DTYPES[key], dims, ctypes.string_at(dl.data + dl.byte_offset, size))

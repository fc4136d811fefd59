"""pb_utils tensors to and from torch, for the stages that compute (text_encoder, dit,
vae_decode, vae_encode). The public models pass tensors along without torch (stages/dlpack.py)."""
from __future__ import annotations

import torch
import triton_python_backend_utils as pb_utils
from torch.utils.dlpack import from_dlpack, to_dlpack


def to_torch(tensor) -> torch.Tensor:
    """Zero-copy view of a pb_utils.Tensor (CPU or GPU)."""
    return from_dlpack(tensor.to_dlpack())


def to_pb(name: str, tensor: torch.Tensor):
    """Zero-copy pb_utils.Tensor from torch (numpy would risk the numpy-2 empty-tensor bug)."""
    return pb_utils.Tensor.from_dlpack(name, to_dlpack(tensor.contiguous()))

"""Helpers shared by the stage shims: tensor conversion, config, I/O declarations."""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import torch
import triton_python_backend_utils as pb_utils
from torch.utils.dlpack import from_dlpack, to_dlpack


@dataclass(frozen=True)
class TensorSpec:
    """One input or output as auto_complete_config declares it."""

    name: str
    data_type: str
    dims: tuple[int, ...]
    optional: bool = False

    def as_input(self) -> dict:
        return {"name": self.name, "data_type": self.data_type, "dims": list(self.dims), "optional": self.optional}

    def as_output(self) -> dict:
        return {"name": self.name, "data_type": self.data_type, "dims": list(self.dims)}


def declare(config, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...]):
    """Fill inputs/outputs that config.pbtxt leaves out, so the pbtxt holds only policy."""
    have_in = {i["name"] for i in config.as_dict().get("input", [])}
    have_out = {o["name"] for o in config.as_dict().get("output", [])}
    for spec in inputs:
        if spec.name not in have_in:
            config.add_input(spec.as_input())
    for spec in outputs:
        if spec.name not in have_out:
            config.add_output(spec.as_output())
    return config


def parameter(model_config: dict, key: str, default: str | None = None) -> str | None:
    value = model_config.get("parameters", {}).get(key, {}).get("string_value")
    return default if value in (None, "") else value


def model_config_of(args: dict) -> dict:
    return json.loads(args["model_config"])


def to_torch(tensor) -> torch.Tensor:
    """Zero-copy view of a pb_utils.Tensor (CPU or GPU)."""
    return from_dlpack(tensor.to_dlpack())


def to_pb(name: str, tensor: torch.Tensor):
    """Zero-copy pb_utils.Tensor from torch (numpy would risk the numpy-2 empty-tensor bug)."""
    return pb_utils.Tensor.from_dlpack(name, to_dlpack(tensor.contiguous()))


def input_numpy(request, name: str) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def error_response(message: str, code=pb_utils.TritonError.INTERNAL):
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))

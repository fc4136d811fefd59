"""Helpers shared by the stage shims: config, I/O declarations, responses. Torch-free: the
public models use them too (torch conversions are in torch_io.py)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from ..deployment import DEFAULT_DEPLOYMENT, REPO_ROOT, Deployment, load_deployment
from ..pipelines import PipelineNames


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


def stage_names(model_config: dict) -> PipelineNames:
    """The model names of the pipeline a model belongs to: its config.pbtxt `pipeline`
    parameter (a repository rendered for several deployments), else the unprefixed names."""
    return PipelineNames(parameter(model_config, "pipeline"))


def stage_deployment(model_config: dict) -> Deployment:
    """The deployment a model serves: its config.pbtxt `deployment` parameter (written by
    scripts/render_repository.py for every deployment but the default), else
    $DITSERVE_DEPLOYMENT, else the default. A repository rendered for one deployment and a
    server started for another is an error, not a silent mix of two models. A named pipeline
    (one of several deployments in the repository) always serves the deployment it names:
    $DITSERVE_DEPLOYMENT speaks for single-deployment repositories only."""
    named, env = parameter(model_config, "deployment"), os.environ.get("DITSERVE_DEPLOYMENT")
    if stage_names(model_config).pipeline:
        return load_deployment(named or DEFAULT_DEPLOYMENT)
    if named and env and _resolved(named) != _resolved(env):
        raise ValueError(f"model '{model_config.get('name')}' was rendered for deployment {named} but the server "
                         f"was started with DITSERVE_DEPLOYMENT={env}; serve the repository rendered for {env} "
                         f"(python scripts/render_repository.py --deployment {env} --out DIR)")
    return load_deployment(named)


def _resolved(path: str) -> Path:
    p = Path(path)
    return (p if p.is_absolute() else REPO_ROOT / p).resolve()


def media_dims(deployment: Deployment) -> tuple[int, ...]:
    """Dims of one generation's media: [H, W, 3] for images, [F, H, W, 3] for video."""
    return (-1, -1, -1, 3) if deployment.is_video else (-1, -1, 3)


def utf8_text(tensor) -> str:
    """The message of dit's `error` output: UTF-8 bytes in a UINT8 tensor."""
    return tensor.as_numpy().reshape(-1).tobytes().decode("utf-8", errors="replace")


def input_numpy(request, name: str) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def requested_outputs(request, declared) -> set[str]:
    """The outputs the client asked for (all `declared` ones when it named none). A
    decoupled model's response must carry no others: on a CUDA host the 2.51 stub segfaults
    sending one the client did not request (perf/results/2026-11-29-h200-gpu-matrix.md)."""
    return set(request.requested_output_names()) or set(declared)


def error_response(message: str, code=None):
    """An error response, INTERNAL unless `code` says otherwise. (pb_utils.TritonError is not
    defined yet when model.py is imported, so it cannot be a default argument here.)"""
    code = pb_utils.TritonError.INTERNAL if code is None else code
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))


def ended_if_cancelled(request) -> bool:
    """End a decoupled request whose client is gone with the final flag alone, and say so.
    Sending any response to a cancelled request segfaulted Triton 2.51's stub
    (perf/repro_bls_cancel/)."""
    if not request.is_cancelled():
        return False
    request.get_response_sender().send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    return True


def warm_up(adapter, model_name: str, **sizes):
    """Compile and capture the stage's accelerated forwards before Triton reports READY, log
    what it cost and expose it as ditserve_accel_* gauges (kept alive by the caller). `sizes`:
    the stage's batch limits the adapter's warm_up takes (text_encoder: text_rows)."""
    from .metrics import AccelMetrics
    report = adapter.warm_up(**sizes)
    if report.variants:
        pb_utils.Logger.log_info(
            f"{model_name}: [accel] warmed {len(report.variants)} variant(s) in {report.seconds:.1f} s, "
            f"{report.device_bytes / 2**20:.0f} MiB of device memory: {', '.join(report.variants)}")
    return AccelMetrics(model_name, report)

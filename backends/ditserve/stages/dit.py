"""`dit`: the denoise loop as a decoupled iterative-sequence model.

Triton's sequence batcher (`iterative_sequence: true`) hands `execute` every request
that is ready for its next step: new ones and rescheduled ones. In `step` mode each
`execute` runs ONE denoise step for the whole batch, sends each request a progress
response, finishes the ones that are done (final response with CPU latents) and
reschedules the rest, so requests join and leave at step boundaries.
`serial` / `request_batch` modes run the batch start to end in one `execute` instead:
they are the controls that step batching is measured against.
"""
from __future__ import annotations

import torch
import triton_python_backend_utils as pb_utils

from ..adapters import adapter_for
from ..deployment import load_deployment
from ..engine import StepEngine
from ..schema import GenerationParams
from ..state import TextConditioning
from .common import TensorSpec, declare, input_numpy, to_pb, to_torch

INPUTS = (
    TensorSpec("embeds", "TYPE_FP32", (-1, -1, -1)),
    TensorSpec("mask", "TYPE_INT64", (-1, -1)),
    TensorSpec("params", "TYPE_STRING", (1,)),
)
OUTPUTS = (TensorSpec("progress", "TYPE_INT32", (2,)), TensorSpec("latents", "TYPE_FP32", (-1, -1, -1)))
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def request_key(request) -> str:
    """The sequence batcher's correlation ID identifies a generation across reschedules."""
    corr = request.correlation_id()
    return str(corr) if corr not in (0, "") else f"id:{request.request_id()}"


class DitStage:
    @staticmethod
    def auto_complete(config):
        return declare(config, INPUTS, OUTPUTS)

    def __init__(self, args: dict, model_config: dict):
        self.deployment = load_deployment()
        capacity = model_config.get("max_batch_size", 0)
        if capacity != self.deployment.engine.capacity:
            raise ValueError(
                f"dit config.pbtxt max_batch_size={capacity} but deployment {self.deployment.source} has "
                f"[engine] capacity={self.deployment.engine.capacity}; render the repository with "
                f"`python scripts/render_repository.py --deployment {self.deployment.source}`"
            )
        adapter = adapter_for(self.deployment.model.family)(self.deployment, "dit")
        self.engine = StepEngine(adapter)
        self.logger = pb_utils.Logger

    def execute(self, requests):
        active = []
        for request in requests:
            key = request_key(request)
            if request.is_cancelled():
                self._end(request, key, error="cancelled by the client")
                continue
            if key not in self.engine:
                try:
                    self._admit(request, key)
                except Exception as exc:
                    self._end(request, key, error=f"dit could not start the request: {exc}")
                    continue
            active.append((key, request))
        if self.deployment.engine.mode == "step":
            self._step(active)
            for key, request in active:
                if key in self.engine:
                    request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
        else:
            while active:
                self._step(active)
                active = [(k, r) for k, r in active if k in self.engine and not self._cancelled(r, k)]
        return None

    def _admit(self, request, key: str) -> None:
        params = GenerationParams.from_json(input_numpy(request, "params").reshape(-1)[0])
        embeds = to_torch(pb_utils.get_input_tensor_by_name(request, "embeds"))[0]
        mask = to_torch(pb_utils.get_input_tensor_by_name(request, "mask"))[0]
        self.engine.admit(key, params, TextConditioning(embeds, mask))

    def _step(self, active: list) -> None:
        """One denoise step for every active request; finished ones get their final response."""
        try:
            self.engine.step([key for key, _ in active])
        except Exception as exc:
            for key, request in active:
                self._end(request, key, error=f"dit denoise step failed: {exc}")
            return
        for key, request in active:
            state = self.engine.table[key]
            progress = to_pb("progress", torch.tensor([[state.step_index, state.total_steps]], dtype=torch.int32))
            sender = request.get_response_sender()
            if state.done:
                latents = to_pb("latents", state.latents.float().cpu())
                self.engine.release(key)
                sender.send(pb_utils.InferenceResponse([progress, latents]), flags=FINAL)
            else:
                sender.send(pb_utils.InferenceResponse([progress]))

    def _cancelled(self, request, key: str) -> bool:
        if request.is_cancelled():
            self._end(request, key, error="cancelled by the client")
            return True
        return False

    def _end(self, request, key: str, error: str) -> None:
        """The one terminal response of a request that did not finish; frees its state."""
        self.engine.release(key)
        request.get_response_sender().send(
            pb_utils.InferenceResponse(error=pb_utils.TritonError(error)), flags=FINAL
        )

    def finalize(self) -> None:
        self.engine.table.clear()

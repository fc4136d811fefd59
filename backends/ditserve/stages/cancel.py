"""The `cancel` model: cancel a generation by the request id its client gave it.

    request_id (BYTES [1]) -> state (BYTES [1]): "cancelling", "finished" or "pending"

One per pipeline (`cancel`, or `<pipeline>_cancel`), for every client protocol: a gRPC stream,
a unary gRPC call or an HTTP call started with a request id can be cancelled from anywhere
(another thread, another process) by that id. The cancelled generation ends with one
CANCELLED error at its next denoise step, as a cancelled stream does, and without the gRPC
cancel that can crash Triton 2.51 (cancellation.ClientCancels says why). Torch-free: this
stub only writes a flag file.
"""
from __future__ import annotations

import numpy as np
import triton_python_backend_utils as pb_utils

from ..cancellation import ClientCancels
from .common import TensorSpec, error_response, input_numpy, stage_names

IO_SPECS = ((TensorSpec("request_id", "TYPE_STRING", (1,)),), (TensorSpec("state", "TYPE_STRING", (1,)),))


class CancelStage:
    def __init__(self, args: dict, model_config: dict):
        self.cancels = ClientCancels(pipeline=stage_names(model_config).pipeline)

    def execute(self, requests):
        return [self._respond(request) for request in requests]

    def _respond(self, request):
        value = input_numpy(request, "request_id")
        request_id = value.reshape(-1)[0] if value is not None and value.size == 1 else None
        if isinstance(request_id, bytes):
            request_id = request_id.decode("utf-8", errors="replace")
        if not request_id:
            return error_response("input 'request_id' must be one non-empty string: the request id the generation "
                                  "was sent with (give each generation a unique id to cancel it)",
                                  pb_utils.TritonError.INVALID_ARG)
        state = self.cancels.request(str(request_id))
        return pb_utils.InferenceResponse([pb_utils.Tensor("state", np.array([state.encode()], dtype=np.object_))])

    def finalize(self) -> None:
        self.cancels.remove_all()

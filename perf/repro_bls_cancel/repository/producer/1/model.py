"""Decoupled model: N responses ~3 ms apart, each a 64-element tensor, BYTES (KIND 0) or UINT8 (KIND 1)."""
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def payload(kind: int):
    words = [f"msg {j}".encode() for j in range(64)]
    if kind == 0:
        return pb_utils.Tensor("OUT_BYTES", np.array(words, dtype=np.object_))
    return pb_utils.Tensor("OUT_U8", np.frombuffer(b"".join(words), dtype=np.uint8).copy())


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            kind = int(pb_utils.get_input_tensor_by_name(request, "KIND").as_numpy()[0])
            sender = request.get_response_sender()
            for i in range(n):
                time.sleep(0.003)
                sender.send(pb_utils.InferenceResponse([payload(kind)]), flags=FINAL if i == n - 1 else 0)
        return None

"""Decoupled model shaped like our public `*_stream` models: a decoupled BLS stream from
`producer`, a progress response per item until the client cancels (`is_cancelled`), the stream
read to its end, then the end of the request; Python allocations between items.

A cancelled request ends as $REPRO_CANCEL_END says: `error` (default) sends a final response
carrying a CANCELLED error, `flag` sends only the final flag, no response. An uncancelled request
ends as $REPRO_FINAL says: `with-response` (default) sends its last response with the final flag,
`separate` sends the last response, then the final flag alone. $REPRO_FINAL_BYTES > 0 adds an
output IMAGE of that many bytes to the last response, as our image is (a 256x256 RGB image is
196,608 bytes)."""
import faulthandler
import os

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
faulthandler.enable()  # a crash prints every thread's stack into the server log


def count_tensor(count: int):
    return pb_utils.Tensor("COUNT", np.array([count], dtype=np.int32))


class TritonPythonModel:
    def initialize(self, args):
        self.cancel_end = os.environ.get("REPRO_CANCEL_END", "error")
        self.final = os.environ.get("REPRO_FINAL", "with-response")
        self.final_bytes = int(os.environ.get("REPRO_FINAL_BYTES", "0"))

    def last(self, count: int):
        tensors = [count_tensor(count)]
        if self.final_bytes:
            tensors.append(pb_utils.Tensor("IMAGE", np.full([self.final_bytes], count % 256, dtype=np.uint8)))
        return pb_utils.InferenceResponse(tensors)

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            inputs = [pb_utils.get_input_tensor_by_name(request, name) for name in ("N", "KIND")]
            bls = pb_utils.InferenceRequest(model_name="producer", inputs=inputs,
                                            requested_output_names=["OUT_BYTES", "OUT_U8"])
            count, cancelled = 0, False
            for _ in bls.exec(decoupled=True):
                count += 1
                cancelled = cancelled or request.is_cancelled()
                if not cancelled:
                    sender.send(pb_utils.InferenceResponse([count_tensor(count)]))
                _ = [{"a": i, "b": str(i)} for i in range(1000)]
            if cancelled and self.cancel_end == "flag":
                sender.send(flags=FINAL)
            elif cancelled:
                error = pb_utils.TritonError("request cancelled", pb_utils.TritonError.CANCELLED)
                sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
            elif self.final == "separate":
                sender.send(self.last(count))
                sender.send(flags=FINAL)
            else:
                sender.send(self.last(count), flags=FINAL)
        return None

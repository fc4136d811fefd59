"""Client library for the public models, over gRPC streaming, gRPC unary or HTTP.

    client = DitClient("127.0.0.1:8001", protocol="grpc-stream")
    result = client.generate(GenerationRequest("a red cat", seed=1), on_progress=print)
    result.image  # numpy uint8 [H, W, 3]

`grpc-stream` calls `txt2img_stream` and reports one (done, total) pair per denoise
step; `grpc` and `http` call `txt2img` and get only the final image. With
`shm="system"` or `shm="cuda"` the image is written into a shared-memory region this
client registered (see `ditserve.shm`); the request must then give height and width.
"""
from __future__ import annotations

import queue
import uuid
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .shm import OutputRegionPool

PROTOCOLS = ("grpc-stream", "grpc", "http")


@dataclass
class GenerationRequest:
    """One text-to-image request; None leaves the deployment's default."""

    prompt: str
    negative_prompt: str | None = None
    height: int | None = None
    width: int | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    seed: int | None = None

    def tensors(self) -> list[tuple[str, np.ndarray, str]]:
        """(name, value with shape [1], Triton dtype) for every input that is set."""
        fields = [
            ("prompt", self.prompt, np.object_, "BYTES"),
            ("negative_prompt", self.negative_prompt, np.object_, "BYTES"),
            ("height", self.height, np.int32, "INT32"),
            ("width", self.width, np.int32, "INT32"),
            ("num_inference_steps", self.num_inference_steps, np.int32, "INT32"),
            ("guidance_scale", self.guidance_scale, np.float32, "FP32"),
            ("seed", self.seed, np.int64, "INT64"),
        ]
        out = []
        for name, value, np_type, triton_type in fields:
            if value is None:
                continue
            if np_type is np.object_:
                value = value.encode("utf-8")
            out.append((name, np.array([value], dtype=np_type), triton_type))
        return out


@dataclass
class GenerationResult:
    image: np.ndarray      # uint8 [H, W, 3]
    seed: int
    steps_reported: int    # progress responses received (streaming only)
    image_gpu: Any = None  # shm="cuda": torch view of the region, valid until the next request


class DitClient:
    def __init__(self, url: str, protocol: str = "grpc-stream", model: str = "txt2img", shm: str | None = None,
                 shm_device: int = 0):
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol {protocol!r}; choose one of {PROTOCOLS}")
        self.protocol = protocol
        self.model = model
        if protocol == "http":
            import tritonclient.http as module
        else:
            import tritonclient.grpc as module
        self._module = module
        # HTTP takes its timeout per client, gRPC per call (see generate()).
        self._client = module.InferenceServerClient(url, network_timeout=600.0) if protocol == "http" \
            else module.InferenceServerClient(url)
        self.pool = OutputRegionPool(self._client, shm, shm_device) if shm else None

    def _inputs(self, request: GenerationRequest) -> list:
        inputs = []
        for name, value, triton_type in request.tensors():
            tensor = self._module.InferInput(name, list(value.shape), triton_type)
            tensor.set_data_from_numpy(value)
            inputs.append(tensor)
        return inputs

    def _outputs(self, region=None, byte_size: int = 0) -> list:
        outputs = [self._module.InferRequestedOutput(name) for name in ("image", "seed", "progress")]
        if region is not None:
            outputs[0].set_shared_memory(region.name, byte_size)
        return outputs if self.protocol == "grpc-stream" else outputs[:2]

    def generate(self, request: GenerationRequest, on_progress: Callable[[int, int], None] | None = None,
                 timeout_s: float | None = None) -> GenerationResult:
        """Run one generation; raises tritonclient's InferenceServerException on a server error."""
        region, byte_size = None, 0
        if self.pool:
            if request.height is None or request.width is None:
                raise ValueError("shared-memory output needs explicit height and width to size the region")
            byte_size = request.height * request.width * 3
            region = self.pool.acquire(byte_size)
        try:
            final, steps = self._infer(request, self._outputs(region, byte_size), on_progress, timeout_s)
        except BaseException:
            if region is not None:
                self.pool.release(region, broken=True)
            raise
        seed = int(final.as_numpy("seed")[0])
        if region is None:
            return GenerationResult(final.as_numpy("image"), seed, steps)
        shape = self._output_shape(final, "image")
        result = GenerationResult(self.pool.read(region, shape), seed, steps)
        if self.pool.kind == "cuda":
            result.image_gpu = self.pool.as_torch(region, shape)
        self.pool.release(region)
        return result

    def _output_shape(self, result, name: str) -> list[int]:
        output = result.get_output(name)
        return list(output["shape"] if self.protocol == "http" else output.shape)

    def _infer(self, request, outputs, on_progress, timeout_s):
        """The final result object and the number of progress responses seen."""
        if self.protocol != "grpc-stream":
            kwargs = {"client_timeout": timeout_s} if timeout_s and self.protocol == "grpc" else {}
            return self._client.infer(self.model, self._inputs(request), outputs=outputs, **kwargs), 0
        responses: queue.Queue = queue.Queue()
        self._client.start_stream(callback=lambda result, error: responses.put((result, error)),
                                  stream_timeout=timeout_s)
        steps = 0
        try:
            self._client.async_stream_infer(f"{self.model}_stream", self._inputs(request), outputs=outputs,
                                            request_id=uuid.uuid4().hex)
            while True:
                result, error = responses.get(timeout=timeout_s)
                if error is not None:
                    raise error
                if result.get_output("image") is not None:
                    return result, steps
                done, total = (int(v) for v in result.as_numpy("progress"))
                steps += 1
                if on_progress:
                    on_progress(done, total)
        finally:
            self._client.stop_stream()

    def close(self) -> None:
        if self.pool:
            self.pool.close()
        self._client.close()

    def __enter__(self) -> "DitClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

"""Client library for the public models, over gRPC streaming, gRPC unary or HTTP.

    client = DitClient("127.0.0.1:8001", protocol="grpc-stream")
    result = client.generate(GenerationRequest("a red cat", seed=1), on_progress=print)
    result.media  # numpy uint8 [H, W, 3]

    video = DitClient("127.0.0.1:8001", task="txt2vid")
    result = video.generate(GenerationRequest("a wave", num_frames=17, output_format="mp4"))
    result.media, result.video_mp4  # uint8 [F, H, W, 3], MP4 bytes

`grpc-stream` calls `<task>_stream` and reports one (done, total) pair per denoise
step; `grpc` and `http` call `<task>` and get only the final media. A generation started
with a `request_id` can be cancelled from another thread or process, whatever its protocol,
with a client of its own (an HTTP client runs one call at a time):

    DitClient("127.0.0.1:8001").cancel("job-42")   # "cancelling", "finished" or "pending"

the generation then raises InferenceServerException "request cancelled". On a repository that
serves several deployments, `pipeline="flux"` calls that pipeline's `flux_<task>` models
(ditserve.pipelines). With
`shm="system"` or `shm="cuda"` the media is written into a shared-memory region this
client registered (see `ditserve.shm`); the request must then give height and width
(and num_frames for video) so the region can be sized.
"""
from __future__ import annotations

import queue
import uuid
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .pipelines import PipelineNames
from .shm import OutputRegionPool

PROTOCOLS = ("grpc-stream", "grpc", "http")
MEDIA_OUTPUT = {"txt2img": "image", "txt2vid": "video", "img2vid": "video"}


@dataclass
class GenerationRequest:
    """One generation request; None leaves the deployment's default. The video inputs
    (num_frames, fps, output_format) are for txt2vid and img2vid; `image` (uint8
    [H, W, 3], RGB) is img2vid's conditioning image."""

    prompt: str
    negative_prompt: str | None = None
    height: int | None = None
    width: int | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    seed: int | None = None
    num_frames: int | None = None
    fps: int | None = None
    output_format: str | None = None
    image: np.ndarray | None = None
    quality: str | None = None     # cache tier: "lossless" (the server's default) or a tier it enables
    guidance_scale_2: float | None = None   # Wan2.2 A14B only: the low-noise expert's guidance scale

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
            ("num_frames", self.num_frames, np.int32, "INT32"),
            ("fps", self.fps, np.int32, "INT32"),
            ("output_format", self.output_format, np.object_, "BYTES"),
            ("quality", self.quality, np.object_, "BYTES"),
            ("guidance_scale_2", self.guidance_scale_2, np.float32, "FP32"),
        ]
        out = []
        for name, value, np_type, triton_type in fields:
            if value is None:
                continue
            if np_type is np.object_:
                value = value.encode("utf-8")
            out.append((name, np.array([value], dtype=np_type), triton_type))
        if self.image is not None:  # media, sent with its own shape
            out.append(("image", np.ascontiguousarray(self.image), "UINT8"))
        return out


    def infer_inputs(self, module) -> list:
        """The request as `module.InferInput`s (`module`: tritonclient.grpc or tritonclient.http)."""
        inputs = []
        for name, value, triton_type in self.tensors():
            tensor = module.InferInput(name, list(value.shape), triton_type)
            tensor.set_data_from_numpy(value)
            inputs.append(tensor)
        return inputs

    def media_bytes(self) -> int:
        """Size of the raw media output, to size a shared-memory region."""
        if self.height is None or self.width is None:
            raise ValueError("shared-memory output needs explicit height and width to size the region")
        return (self.num_frames or 1) * self.height * self.width * 3


def cancel_inputs(module, request_id: str) -> list:
    """The `cancel` model's input naming generation `request_id` (`module`: tritonclient.grpc,
    tritonclient.grpc.aio or tritonclient.http); its output `state` says where it stood."""
    tensor = module.InferInput("request_id", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([request_id.encode("utf-8")], dtype=np.object_))
    return [tensor]


@dataclass
class GenerationResult:
    # uint8 [H, W, 3] (image) or [F, H, W, 3] (video): numpy, or with shm="cuda" and
    # keep_on_gpu=True a torch CUDA view of the region (no host copy), valid until the next request.
    media: Any
    seed: int
    steps_reported: int        # progress responses received (streaming only)
    video_mp4: bytes | None = None  # txt2vid with output_format="mp4"
    cache_hits: int = 0        # denoise steps the request's quality tier reused (0 for lossless)


class DitClient:
    def __init__(self, url: str, protocol: str = "grpc-stream", task: str = "txt2img", shm: str | None = None,
                 shm_device: int = 0, pipeline: str | None = None):
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol {protocol!r}; choose one of {PROTOCOLS}")
        if task not in MEDIA_OUTPUT:
            raise ValueError(f"task {task!r}; choose one of {sorted(MEDIA_OUTPUT)}")
        self.protocol = protocol
        names = PipelineNames(pipeline)
        self.model = names.public(task, streaming=protocol == "grpc-stream")
        self.cancel_model = names.model("cancel")
        self.media_name = MEDIA_OUTPUT[task]
        if protocol == "http":
            import tritonclient.http as module
        else:
            import tritonclient.grpc as module
        self._module = module
        # HTTP takes its timeout per client, gRPC per call (see generate()).
        self._client = module.InferenceServerClient(url, network_timeout=600.0) if protocol == "http" \
            else module.InferenceServerClient(url)
        self.pool = OutputRegionPool(self._client, shm, shm_device) if shm else None

    def _outputs(self, request: GenerationRequest, region=None, byte_size: int = 0) -> list:
        names = [self.media_name, "seed", "cache_hits"]
        if request.output_format == "mp4":
            names.append("video_mp4")
        if self.protocol == "grpc-stream":
            names.append("progress")
        outputs = [self._module.InferRequestedOutput(name) for name in names]
        if region is not None:
            outputs[0].set_shared_memory(region.name, byte_size)
        return outputs

    def generate(self, request: GenerationRequest, on_progress: Callable[[int, int], None] | None = None,
                 timeout_s: float | None = None, keep_on_gpu: bool = False,
                 request_id: str | None = None) -> GenerationResult:
        """Run one generation; raises tritonclient's InferenceServerException on a server error.

        `keep_on_gpu` (shm="cuda" only) returns the media as a torch tensor viewing the CUDA
        region instead of copying it to host memory. `request_id` (unique per generation) lets
        `cancel` end it; a random one is used when not given."""
        request_id = request_id or uuid.uuid4().hex
        if keep_on_gpu and (self.pool is None or self.pool.kind != "cuda"):
            raise ValueError("keep_on_gpu needs shm=\"cuda\"")
        region, byte_size = None, 0
        if self.pool:
            byte_size = request.media_bytes()
            region = self.pool.acquire(byte_size)
        try:
            final, steps = self._infer(request, self._outputs(request, region, byte_size), on_progress, timeout_s,
                                       request_id)
        except BaseException:
            if region is not None:
                self.pool.release(region, broken=True)
            raise
        seed, hits = int(final.as_numpy("seed")[0]), int(final.as_numpy("cache_hits")[0])
        mp4 = final.as_numpy("video_mp4") if request.output_format == "mp4" else None
        mp4 = None if mp4 is None else bytes(mp4.reshape(-1)[0])
        if region is None:
            return GenerationResult(final.as_numpy(self.media_name), seed, steps, video_mp4=mp4, cache_hits=hits)
        shape = self._output_shape(final, self.media_name)
        media = self.pool.as_torch(region, shape) if keep_on_gpu else self.pool.read(region, shape)
        self.pool.release(region)
        return GenerationResult(media, seed, steps, video_mp4=mp4, cache_hits=hits)

    def _output_shape(self, result, name: str) -> list[int]:
        output = result.get_output(name)
        return list(output["shape"] if self.protocol == "http" else output.shape)

    def _infer(self, request, outputs, on_progress, timeout_s, request_id: str):
        """The final result object and the number of progress responses seen."""
        if self.protocol != "grpc-stream":
            kwargs = {"client_timeout": timeout_s} if timeout_s and self.protocol == "grpc" else {}
            return self._client.infer(self.model, request.infer_inputs(self._module), outputs=outputs,
                                      request_id=request_id, **kwargs), 0
        responses: queue.Queue = queue.Queue()
        self._client.start_stream(callback=lambda result, error: responses.put((result, error)),
                                  stream_timeout=timeout_s)
        steps = 0
        try:
            self._client.async_stream_infer(self.model, request.infer_inputs(self._module), outputs=outputs,
                                            request_id=request_id)
            while True:
                result, error = responses.get(timeout=timeout_s)
                if error is not None:
                    raise error
                if result.get_output(self.media_name) is not None:
                    return result, steps
                done, total = (int(v) for v in result.as_numpy("progress"))
                steps += 1
                if on_progress:
                    on_progress(done, total)
        finally:
            self._client.stop_stream()

    def cancel(self, request_id: str) -> str:
        """Cancel the generation started with `request_id` (any protocol, any client) through the
        pipeline's `cancel` model: "cancelling" (it ends at its next denoise step), "finished"
        (it already ended) or "pending" (not started yet: it ends as it starts)."""
        result = self._client.infer(self.cancel_model, cancel_inputs(self._module, request_id))
        return result.as_numpy("state").reshape(-1)[0].decode()

    def close(self) -> None:
        if self.pool:
            self.pool.close()
        self._client.close()

    def __enter__(self) -> "DitClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

"""The public models, one implementation for every task and both variants.

`<task>` (any client) and `<task>_stream` (decoupled, gRPC streaming) for the task of the
deployment's family: `txt2img` returns `image` [H, W, 3]; `txt2vid` and `img2vid` (which
also takes an `image` [H, W, 3]) return `video` [F, H, W, 3] and, with `output_format` =
"mp4", also `video_mp4` (H.264 in MP4). The request is validated here, before any model
work, then driven through `text_encoder` (and `vae_encode` for img2vid) -> `dit` ->
`vae_decode` with BLS. `dit` streams one progress response
per step; the streaming variant (decoupled) forwards them to the client, the unary
variant only uses them to notice a cancelled client between steps. Only the final
latents are decoded. A decoupled model cannot answer unary or HTTP calls, hence two
models on this one class: `model_transaction_policy { decoupled }` picks the variant.

Every request gets exactly one terminal response: the media, or one error (invalid
input, cancelled, or the failing stage named).

Each in-flight generation holds one instance of this model, a stub process of its own, so
it imports neither torch nor diffusers (numpy and pb_utils only; tensors are passed on
through DLPack, stages/dlpack.py): tests/test_inflight_cost.py keeps it so, and
docs/scheduler.md says what an in-flight generation costs. The one exception is an MP4 of
media that vae_decode left on a GPU (`[engine] media_on_host = false`): its copy to the host
imports torch in that stub, at that request.
"""
from __future__ import annotations

import glob
import os
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Callable

import numpy as np
import triton_python_backend_utils as pb_utils

from ..cancellation import CancelRegistry, ClientCancels
from ..deployment import FAMILY_TEXT_CONDITIONING, TASK_CONDITIONING, Deployment
from ..faults import Subject, injector
from ..handoff import Arrivals, ConditioningStore, HostTensor
from ..schema import IMAGE_INPUT, GenerationParams, InvalidRequest, decode_image, decode_request, request_inputs
from .common import (TensorSpec, ended_if_cancelled, error_response, input_numpy, media_dims,
                     requested_outputs, stage_deployment, stage_names, utf8_text)
from .dlpack import host_tensor, without_batch
from .liveness import StubDied, StubWatch
from .metrics import GenerateMetrics
from .warm_path import warm_request, warm_request_path

_TYPES = {"BYTES": "TYPE_STRING", "INT32": "TYPE_INT32", "INT64": "TYPE_INT64", "FP32": "TYPE_FP32"}
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
HEAVY_MODULES = ("torch", "diffusers", "transformers")   # what an in-flight generation must not load


def watch_stubs(deployment: Deployment) -> bool:
    """[engine] watch_stubs: "auto" watches BLS calls on CPU deployments only (see stages/liveness.py)."""
    setting = deployment.engine.watch_stubs
    if setting != "auto":
        return setting == "on"
    device = deployment.model.device
    return not (device.startswith("cuda") or (device == "auto" and cuda_host()))


def cuda_host() -> bool:
    """Whether this process would see a CUDA GPU (what device "auto" resolves to in the stages
    that have torch), told without torch: an NVIDIA device node and CUDA_VISIBLE_DEVICES not
    hiding every device."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and (not visible.strip() or visible.strip().startswith("-1")):
        return False
    return bool(glob.glob("/dev/nvidia[0-9]*"))


def media_output(deployment: Deployment) -> str:
    return "video" if deployment.is_video else "image"


def io_specs(deployment: Deployment) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """Inputs and outputs of the deployment's task. Triton 2.51's Python backend cannot set
    response parameters, so the seed actually used (drawn when the request gave none) is
    returned as the output `seed`."""
    inputs = tuple(TensorSpec(s.name, "TYPE_UINT8", (-1, -1, 3)) if s is IMAGE_INPUT
                   else TensorSpec(s.name, _TYPES[s.dtype], (1,), s.optional) for s in request_inputs(deployment))
    outputs = [TensorSpec(media_output(deployment), "TYPE_UINT8", media_dims(deployment))]
    if deployment.is_video:
        outputs.append(TensorSpec("video_mp4", "TYPE_STRING", (1,)))
    outputs += [TensorSpec("seed", "TYPE_INT64", (1,)), TensorSpec("progress", "TYPE_INT32", (2,)),
                TensorSpec("cache_hits", "TYPE_INT32", (1,))]   # steps the `quality` tier reused
    return inputs, tuple(outputs)


class StageError(RuntimeError):
    """A stage failed; the message starts with the stage's name."""


class TimedOut(StageError):
    """The request's own `timeout` ran out; the message names the stage it ran out in."""


class Cancelled(RuntimeError):
    """The client went away; nothing more is computed for it."""


# Which of the pipeline's models does the work of each timed stage (error messages name the
# model as served: ditserve.pipelines.PipelineNames); "mp4" runs in the public model itself.
STAGE_MODEL = {"encode": "text_encoder", "condition": "vae_encode", "denoise": "dit", "decode": "vae_decode"}


class Deadline:
    """Triton's request-level `timeout` (microseconds, 0 = none), enforced at stage boundaries
    and at every denoise step: Triton itself only applies it while a request is queued."""

    def __init__(self, request, arrival: float):
        timeout_us = request.timeout()
        self.seconds = timeout_us / 1e6 if timeout_us else None
        self.at = arrival + self.seconds if timeout_us else None

    def expired(self) -> bool:
        return self.at is not None and time.monotonic() > self.at

    def message(self, where: str) -> str:
        return f"{where}: the request timeout of {self.seconds:g} s expired"

    def error(self, where: str) -> TimedOut:
        return TimedOut(self.message(where))


@dataclass(frozen=True)
class Stop:
    """Why a generation stopped before dit finished: the exception to raise, kept as its type
    and message. An exception object in a local of a frame it is raised through holds that
    frame through its traceback: a reference cycle that only Python's cyclic GC frees, at any
    later moment and on any thread, BLS tensors included. Triton 2.51's stubs segfaulted at
    exit when it did (tests/test_clean_shutdown.py; perf/results/2026-11-29-h200-soak.md)."""
    kind: type[Exception]
    message: str

    def exception(self) -> Exception:
        return self.kind(self.message)


def _bls(model: str, inputs: list, outputs: list[str], **kwargs):
    return pb_utils.InferenceRequest(model_name=model, inputs=inputs, requested_output_names=outputs, **kwargs)


def _checked(response, stage: str):
    if response.has_error():
        raise StageError(f"{stage}: {response.error().message()}")
    return response


class GenerateStage:
    def __init__(self, args: dict, model_config: dict):
        self.deployment = stage_deployment(model_config)
        self.names = stage_names(model_config)
        task = self.deployment.task
        if args["model_name"] not in (self.names.public(task), self.names.public(task, streaming=True)):
            raise ValueError(f"model '{args['model_name']}' cannot serve deployment {self.deployment.source}, whose "
                             f"task is {task}: render the repository for it (python scripts/render_repository.py "
                             f"--deployment {self.deployment.source} --out DIR) and serve that")
        self.dit = self.names.model("dit")
        self.inputs = [spec.name for spec in request_inputs(self.deployment)]
        self.output_names = [spec.name for spec in io_specs(self.deployment)[1]]
        self.streaming = pb_utils.using_decoupled_model_transaction_policy(model_config)
        self.cancels = CancelRegistry(pipeline=self.names.pipeline)
        self.client_cancels = ClientCancels(pipeline=self.names.pipeline)   # the `cancel` model's flags
        self.handoff = ConditioningStore(pipeline=self.names.pipeline)
        self.arrivals = Arrivals(pipeline=self.names.pipeline)
        self.metrics = GenerateMetrics(args["model_name"])
        self.model_name = args["model_name"]
        self.faults = injector(self.deployment, self.model_name)
        # BLS calls fail, not hang, when the called model's stub dies (where the watch is on).
        self.stubs = StubWatch(enabled=watch_stubs(self.deployment))
        self.last_dit_responses: list = []   # see _read_dit
        heavy = [name for name in HEAVY_MODULES if name in sys.modules]
        pb_utils.Logger.log_info(f"{self.model_name}: in-flight generation stub loaded; imported: "
                                 f"{', '.join(heavy) if heavy else 'none of ' + ', '.join(HEAVY_MODULES)}")
        warm_request_path(self.model_name, self._warm_request_path)

    def _warm_request_path(self) -> None:
        """What a request does here besides its BLS calls (BLS is not allowed in initialize):
        the hand-off store written, dit's params tensor, a final response with media."""
        params = warm_request(self.deployment)
        key = uuid.uuid4().hex
        self.handoff.put(key, {"embeds": HostTensor.from_numpy(np.zeros((1, 1), dtype=np.float32))})
        self.handoff.discard(key)   # only dit reads hand-offs (with torch, which this stub does not load)
        self.arrivals.announce(key)
        self.arrivals.discard(key)
        self._params_tensor(params)
        media = np.zeros((*(params.num_frames,) * self.deployment.is_video, params.height, params.width, 3),
                         dtype=np.uint8)
        pb_utils.InferenceResponse([pb_utils.Tensor(media_output(self.deployment), media),
                                    pb_utils.Tensor("seed", np.array([params.seed], dtype=np.int64))])

    def execute(self, requests):
        # Generations run in the execute thread: BLS and response sending from worker threads
        # crashed tritonserver 2.51 (SIGSEGV in libtriton_python.so) under concurrent streams.
        # Concurrency comes from instance count instead (scripts/render_repository.py). Each
        # BLS call does wait in one helper thread (stages/liveness.py, so a dead stub cannot
        # hang us), one call at a time, while responses are sent from this thread only.
        if self.streaming:
            for request in requests:
                self._serve_stream(request)
            return None
        return [self._respond(request, on_progress=None) for request in requests]

    def _serve_stream(self, request) -> None:
        sender = request.get_response_sender()
        wanted = requested_outputs(request, self.output_names)
        on_progress = (lambda progress: sender.send(pb_utils.InferenceResponse([progress]))) \
            if "progress" in wanted else None
        response = self._respond(request, on_progress)
        if ended_if_cancelled(request):
            return
        try:
            sender.send(response, flags=FINAL)
        except Exception as exc:  # never leave a stream without its final response
            sender.send(error_response(f"output: could not send the final response: {exc}"), flags=FINAL)

    def _respond(self, request, on_progress: Callable | None):
        """Run one generation and turn its outcome into the one terminal response."""
        request_id = request.request_id()
        # with an id the `cancel` model can cancel it (stages/cancel.py)
        record = self.client_cancels.start(request_id) if request_id else None
        try:
            return self._outcome(request, on_progress)
        finally:
            if record:
                self.client_cancels.end(request_id, record)

    def _cancelled(self, request) -> bool:
        """The client cancelled: its gRPC call (Triton's cancel) or its request id (the `cancel` model)."""
        request_id = request.request_id()
        return request.is_cancelled() or bool(request_id) and self.client_cancels.cancelled(request_id)

    def _outcome(self, request, on_progress: Callable | None):
        try:
            params, outputs = self.generate(request, on_progress)
        except InvalidRequest as exc:
            self.metrics.failed.increment(1)
            return error_response(str(exc), pb_utils.TritonError.INVALID_ARG)
        except Cancelled:
            self.metrics.cancelled.increment(1)
            return error_response("request cancelled", pb_utils.TritonError.CANCELLED)
        except TimedOut as exc:
            self.metrics.failed.increment(1)
            return error_response(str(exc), pb_utils.TritonError.UNAVAILABLE)
        except StageError as exc:
            self.metrics.failed.increment(1)
            return error_response(str(exc))
        except Exception as exc:  # a bug must still end the request with one error, never a hang
            self.metrics.failed.increment(1)
            return error_response(f"{self.model_name}: internal error: {type(exc).__name__}: {exc}")
        try:
            self.faults.at("output", [Subject(params.prompt, params.height)])
            seed = pb_utils.Tensor("seed", np.array([params.seed], dtype=np.int64))
            wanted = requested_outputs(request, self.output_names)
            response = pb_utils.InferenceResponse([t for t in (*outputs, seed) if t.name() in wanted])
        except Exception as exc:
            self.metrics.failed.increment(1)
            return error_response(f"output: could not build the final response: {type(exc).__name__}: {exc}")
        self.metrics.completed.increment(1)
        return response

    # ---- the pipeline ------------------------------------------------------------------
    def generate(self, request, on_progress: Callable | None) -> tuple[GenerationParams, list]:
        """Validate, encode, denoise step by step, decode; returns the params and the media outputs."""
        arrival = time.monotonic()
        params = decode_request({name: input_numpy(request, name) for name in self.inputs}, self.deployment)
        conditioned = self.deployment.task in TASK_CONDITIONING
        if conditioned:
            decode_image(input_numpy(request, "image"), self.deployment)
        deadline = Deadline(request, arrival)
        dit_id = uuid.uuid4().hex
        self.arrivals.announce(dit_id)   # dit may hold its next step for this generation (handoff.Arrivals)
        try:
            conditioning = self._timed("encode", self._encode, request, deadline, params)
            if conditioned:
                conditioning.update(self._timed("condition", self._condition, request, deadline, request, params))
            latents, hits = self._timed("denoise", self._denoise, request, deadline, request, params, dit_id,
                                        conditioning, on_progress, arrival, deadline)
        finally:
            self.arrivals.discard(dit_id)   # handed over by now, or ended before
        media = self._timed("decode", self._decode, request, deadline, latents)
        outputs = [without_batch(media_output(self.deployment), media), without_batch("cache_hits", hits)]
        if params.output_format == "mp4":
            outputs.append(self._timed("mp4", self._mp4, request, deadline, media, params.fps))
        if self._cancelled(request):  # the client left during the last stage: counted as cancelled, not sent
            raise Cancelled()
        return params, outputs

    def _timed(self, stage: str, fn, request, deadline: Deadline, *args):
        """Run one stage; any failure in it becomes a StageError that names the stage's model."""
        model = self.names.model(STAGE_MODEL[stage]) if stage in STAGE_MODEL else "mp4 encode"
        if self._cancelled(request):
            raise Cancelled()
        if deadline.expired():
            raise deadline.error(f"{model}: before the stage started")
        start = time.monotonic()
        try:
            result = fn(*args)
        except (StageError, Cancelled):
            raise
        except StubDied as exc:
            raise StageError(str(exc)) from exc
        except Exception as exc:
            raise StageError(f"{model}: {type(exc).__name__}: {exc}") from exc
        self.metrics.stage[stage].observe(time.monotonic() - start)
        if deadline.expired():
            raise deadline.error(f"{model}: after {time.monotonic() - start:.3f} s in the stage")
        return result

    def _encode(self, params: GenerationParams) -> dict[str, HostTensor]:
        """The generation's `embeds` [rows, L, D] and `mask` [rows, L] (rows: negative, prompt),
        and the family's other text conditioning (deployment.FAMILY_TEXT_CONDITIONING)."""
        texts = [params.negative_prompt, params.prompt] if params.do_cfg else [params.prompt]
        text = pb_utils.Tensor("text", np.array([[t.encode("utf-8") for t in texts]], dtype=np.object_))
        extras = FAMILY_TEXT_CONDITIONING.get(self.deployment.model.family, ())
        names = ["embeds", "mask", *(name for name, _ in extras)]
        response = self._call("text_encoder", [text], names)
        return {name: host_tensor(pb_utils.get_output_tensor_by_name(response, name)).without_batch()
                for name in names}

    def _condition(self, request, params: GenerationParams) -> dict[str, HostTensor]:
        """img2vid: vae_encode turns the input image into dit's conditioning tensors."""
        names = [name for name, _ in TASK_CONDITIONING[self.deployment.task]]
        response = self._call("vae_encode", [pb_utils.get_input_tensor_by_name(request, "image"),
                                             self._params_tensor(params, batched=False)], names)
        return {name: host_tensor(pb_utils.get_output_tensor_by_name(response, name)) for name in names}

    @staticmethod
    def _params_tensor(params: GenerationParams, batched: bool = True):
        """The `params` input (GenerationParams JSON) of a stage: [1, 1] for one request of a
        batching model (dit), [1] for one without a batch dimension (vae_encode)."""
        value = np.array([params.to_json().encode()], dtype=np.object_)
        return pb_utils.Tensor("params", value[None] if batched else value)

    def _denoise(self, request, params: GenerationParams, dit_id: str, conditioning: dict[str, HostTensor],
                 on_progress: Callable | None, arrival: float, deadline: Deadline):
        """dit's final latents and cache hits. Hands the conditioning to dit out of band (handoff.py: dit gets the same request
        back at every step, and with it any input it carries), then run the denoise loop."""
        self.handoff.put(dit_id, conditioning)
        self.arrivals.discard(dit_id)   # handed over: dit stops holding steps for it
        try:
            return self._stream_dit(request, params, dit_id, on_progress, arrival, deadline)
        finally:
            self.handoff.discard(dit_id)  # dit took it at admission, unless it never got there

    def _stream_dit(self, request, params: GenerationParams, dit_id: str, on_progress: Callable | None,
                    arrival: float, deadline: Deadline):
        """dit's final latents and cache hits, or the reason the generation stopped early, raised
        once `_read_dit` has read dit's stream to its end."""
        final, stop = self._read_dit(request, params, dit_id, on_progress, arrival, deadline)
        if stop is not None:
            self.cancels.discard(dit_id)  # dit may have finished before it saw the flag
            raise stop.exception()
        if final is None:
            raise StageError(f"{self.dit}: finished without latents")
        return final

    def _read_dit(self, request, params: GenerationParams, dit_id: str, on_progress: Callable | None,
                  arrival: float, deadline: Deadline) -> tuple[tuple | None, Stop | None]:
        """Read dit's per-step responses, forwarding progress. To stop early (client cancel,
        timeout, a progress response that cannot be sent) flag dit and keep reading: dit ends
        the stream with one error response at its next step boundary, so the stream is always
        read to its end rather than left half-read."""
        dit = _bls(self.dit, [self._params_tensor(params)], ["progress", "latents", "error", "cache_hits"],
                   request_id=dit_id)
        first_step, result, stop, done, read = None, None, None, 0, []
        for response in self.stubs.call(self.dit, lambda: dit.exec(decoupled=True)):
            read.append(response)
            progress = pb_utils.get_output_tensor_by_name(response, "progress")
            done = int(progress.as_numpy().reshape(-1)[0]) if progress is not None else done
            if stop is None:
                if self._cancelled(request):
                    stop = Stop(Cancelled, "request cancelled")
                elif deadline.expired():
                    where = f"{self.dit}: after denoise step {done}/{params.num_inference_steps}"
                    stop = Stop(TimedOut, deadline.message(where))
                if stop is not None:
                    self.cancels.cancel(dit_id)  # dit ends it at the next step boundary
            error = pb_utils.get_output_tensor_by_name(response, "error")
            if response.has_error() or error is not None:  # dit's last response
                if stop is None:
                    message = response.error().message() if response.has_error() else utf8_text(error)
                    stop = Stop(StageError, f"{self.dit}: {message}")
                continue
            if first_step is None:
                first_step = time.monotonic()
                self.metrics.first_step.observe(first_step - arrival)
            if progress is not None and on_progress is not None and stop is None:
                try:
                    on_progress(without_batch("progress", progress))
                except Exception as exc:
                    stop = Stop(StageError, f"output: could not send a progress response: {type(exc).__name__}: {exc}")
                    self.cancels.cancel(dit_id)
            final = pb_utils.get_output_tensor_by_name(response, "latents")
            if final is not None:
                result = (final, pb_utils.get_output_tensor_by_name(response, "cache_hits"))
        # Once a stream ends, a C++ thread of the stub drops its own reference to the stream's
        # responses without taking the GIL (python_backend's cleanup); were that the last one,
        # their numpy arrays would be freed there. Holding them until the next generation
        # leaves the last reference to this thread (a suspected cause of the H200 soak crashes).
        self.last_dit_responses = read
        return (None, stop) if stop is not None else (result, None)

    def _call(self, stage: str, inputs: list, outputs: list[str]):
        """The one response of this pipeline's `stage` model (text_encoder, vae_encode,
        vae_decode) to a BLS request; an error response raises StageError naming the model."""
        model = self.names.model(stage)
        bls = _bls(model, inputs, outputs)
        (response,) = self.stubs.call(model, lambda: [bls.exec()])
        return _checked(response, model)

    def _decode(self, latents):
        """vae_decode's `media` [1, ...] of the one generation, where it was handed (the host by default)."""
        decoded = self._call("vae_decode", [latents], ["media"])
        return pb_utils.get_output_tensor_by_name(decoded, "media")

    @staticmethod
    def _mp4(video, fps: int):
        """H.264 in MP4. It runs in this instance's own stub process, so an encode holds up
        no other request: every in-flight generation has its own public-model instance.
        PyAV is imported here so a server without it still serves raw video."""
        try:
            from ..media import encode_mp4
        except ImportError as exc:
            raise StageError(f"mp4 encode: output_format=mp4 needs PyAV on the server ({exc}); install it with "
                             f"`pip install av` or request output_format=raw") from exc
        data = encode_mp4(_host_numpy(video)[0], fps)
        return pb_utils.Tensor("video_mp4", np.array([data], dtype=np.object_))

    def finalize(self) -> None:
        pass


def _host_numpy(tensor) -> np.ndarray:
    """A pb_utils.Tensor as numpy. Media that vae_decode left on a GPU (media_on_host = false)
    needs a device-to-host copy, which pb_utils cannot do: only that path imports torch."""
    if tensor.is_cpu():
        return tensor.as_numpy()
    from .torch_io import to_torch
    return to_torch(tensor).cpu().numpy()

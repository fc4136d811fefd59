"""Public request schema of the generation models and its validation.

`decode_request` turns the raw input tensors of a public model (`txt2img`, `txt2vid` and
their `_stream` twins) into a `GenerationParams`, or raises `InvalidRequest` naming the
input and its allowed range.
It runs before any model work, so a bad request costs nothing and leaves no state.
"""
from __future__ import annotations

import json
import math
import secrets
from dataclasses import asdict, dataclass, replace
from typing import Mapping

import numpy as np

from .deployment import LOSSLESS, Deployment

MAX_SEED = 2**63 - 1


class InvalidRequest(ValueError):
    """A client error: the message says which input is wrong and what is allowed."""


@dataclass(frozen=True)
class InputSpec:
    name: str
    dtype: str          # Triton dtype name
    optional: bool


# The public API of txt2img / txt2img_stream (all shapes [1]).
TXT2IMG_INPUTS = (
    InputSpec("prompt", "BYTES", False),
    InputSpec("negative_prompt", "BYTES", True),
    InputSpec("height", "INT32", True),
    InputSpec("width", "INT32", True),
    InputSpec("num_inference_steps", "INT32", True),
    InputSpec("guidance_scale", "FP32", True),
    InputSpec("seed", "INT64", True),
    InputSpec("quality", "BYTES", True),   # cache tier: "lossless" (default) or one of [cache] tiers
)
# txt2vid / txt2vid_stream: the image inputs plus the video's length, rate and container.
TXT2VID_INPUTS = TXT2IMG_INPUTS + (
    InputSpec("num_frames", "INT32", True),
    InputSpec("fps", "INT32", True),
    InputSpec("output_format", "BYTES", True),
)
# img2vid / img2vid_stream: the video inputs plus the conditioning image, uint8 [H, W, 3].
IMAGE_INPUT = InputSpec("image", "UINT8", False)
TASK_INPUTS = {"txt2img": TXT2IMG_INPUTS, "txt2vid": TXT2VID_INPUTS, "img2vid": TXT2VID_INPUTS + (IMAGE_INPUT,)}
# Inputs only some families take, after their task's. Wan2.2 A14B: the guidance scale of its
# low-noise expert (diffusers' WanPipeline `guidance_scale_2`; unset, `guidance_scale` guides both).
GUIDANCE_SCALE_2 = InputSpec("guidance_scale_2", "FP32", True)
FAMILY_INPUTS = {"wan22-t2v": (GUIDANCE_SCALE_2,)}
# What each family-only input is, for the error a family without it gives.
FAMILY_INPUT_PURPOSE = {"guidance_scale_2": "the guidance scale of a second, low-noise expert"}
# `raw`: uint8 frames only; `mp4`: also H.264 in MP4 (output `video_mp4`).
OUTPUT_FORMATS = ("raw", "mp4")

_NUMPY_KIND = {"BYTES": (np.object_, np.bytes_), "INT32": (np.int32,), "INT64": (np.int64,), "FP32": (np.float32,)}


@dataclass(frozen=True)
class GenerationParams:
    """Everything that defines one generation; identical params + seed give identical media."""

    prompt: str
    negative_prompt: str
    height: int
    width: int
    num_inference_steps: int
    guidance_scale: float
    seed: int
    seed_was_drawn: bool = False
    num_frames: int = 1           # 1 for images
    fps: int = 16                 # video only
    output_format: str = "raw"    # video only: "raw" or "mp4"
    quality: str = LOSSLESS       # cache tier (deployment [cache]); never part of the compat key
    guidance_scale_2: float | None = None   # two-expert families: the low-noise expert's scale (None: guidance_scale)
    # False for guidance-distilled families (deployment.FAMILIES_WITHOUT_CFG): guidance_scale
    # then goes to the model itself, never into negative rows.
    cfg: bool = True

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> "GenerationParams":
        return cls(**json.loads(text))

    @property
    def do_cfg(self) -> bool:
        """Classifier-free guidance runs only above 1.0, exactly as in diffusers, and only for
        families that have it."""
        return self.cfg and self.guidance_scale > 1.0


def request_inputs(deployment: Deployment) -> tuple[InputSpec, ...]:
    """The inputs of the deployment's public models: its task's, then its family's own."""
    return TASK_INPUTS[deployment.task] + FAMILY_INPUTS.get(deployment.model.family, ())


def _family_input_error(name: str, family: str) -> InvalidRequest:
    takers = sorted(f for f, specs in FAMILY_INPUTS.items() if any(spec.name == name for spec in specs))
    return InvalidRequest(f"input '{name}' ({FAMILY_INPUT_PURPOSE[name]}) is not supported by family {family}; "
                          f"only {', '.join(takers)} take it: leave it out")


def _scalar(name: str, value: np.ndarray, dtype: str):
    if value.dtype.type not in _NUMPY_KIND[dtype]:
        raise InvalidRequest(f"input '{name}' must be {dtype}, got {value.dtype}")
    if value.size != 1:
        raise InvalidRequest(f"input '{name}' must hold exactly one element (shape [1]), got shape {list(value.shape)}")
    return value.reshape(-1)[0]


def _text(name: str, raw, max_bytes: int, allow_empty: bool) -> str:
    data = raw if isinstance(raw, bytes) else str(raw).encode()
    if len(data) > max_bytes:
        raise InvalidRequest(f"input '{name}' is {len(data)} bytes; the limit is {max_bytes} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"input '{name}' is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    if not allow_empty and not text.strip():
        raise InvalidRequest(f"input '{name}' is empty; send a non-empty UTF-8 string")
    return text


def _in_range(name: str, value, low, high, multiple: int | None = None):
    if not (low <= value <= high):
        raise InvalidRequest(f"input '{name}'={value} is out of range; allowed [{low}, {high}]")
    if multiple and value % multiple:
        raise InvalidRequest(f"input '{name}'={value} must be a multiple of {multiple} (allowed [{low}, {high}])")
    return value


def decode_request(inputs: Mapping[str, np.ndarray | None], deployment: Deployment) -> GenerationParams:
    """Validate raw inputs against the deployment's limits and fill defaults."""
    lim, dft = deployment.limits, deployment.defaults
    specs = request_inputs(deployment)
    known = {spec.name for spec in specs}
    extra = sorted(set(k for k, v in inputs.items() if v is not None) - known)
    for name in extra:
        if any(spec.name == name for family_specs in FAMILY_INPUTS.values() for spec in family_specs):
            raise _family_input_error(name, deployment.model.family)
    if extra:
        raise InvalidRequest(f"unknown input(s) {extra}; allowed: {sorted(known)}")
    values = {}
    for spec in specs:
        if spec is IMAGE_INPUT:  # media, not a scalar: decode_image checks it
            continue
        raw = inputs.get(spec.name)
        if raw is None:
            if not spec.optional:
                raise InvalidRequest(f"input '{spec.name}' ({spec.dtype}, shape [1]) is required")
            continue
        values[spec.name] = _scalar(spec.name, raw, spec.dtype)

    prompt = _text("prompt", values["prompt"], lim.max_prompt_bytes, allow_empty=False)
    negative = values.get("negative_prompt")
    negative = dft.negative_prompt if negative is None else _text("negative_prompt", negative, lim.max_prompt_bytes, True)
    seed_was_drawn = "seed" not in values
    quality = values.get("quality")
    quality = LOSSLESS if quality is None else _text("quality", quality, 64, allow_empty=False)
    params = GenerationParams(
        prompt, negative, int(values.get("height", dft.height)), int(values.get("width", dft.width)),
        int(values.get("num_inference_steps", dft.num_inference_steps)),
        float(values.get("guidance_scale", dft.guidance_scale)),
        secrets.randbelow(MAX_SEED) if seed_was_drawn else int(values["seed"]), seed_was_drawn, quality=quality,
        cfg=deployment.uses_cfg,
        guidance_scale_2=None if "guidance_scale_2" not in values else float(values["guidance_scale_2"]),
    )
    if deployment.is_video:
        fmt = values.get("output_format")
        fmt = "raw" if fmt is None else _text("output_format", fmt, 16, allow_empty=False)
        params = replace(params, num_frames=int(values.get("num_frames", dft.num_frames)),
                         fps=int(values.get("fps", dft.fps)), output_format=fmt)
    return check_params(params, deployment)


def decode_image(raw: np.ndarray | None, deployment: Deployment) -> np.ndarray:
    """The img2vid conditioning image: uint8 RGB [H, W, 3], each side in [1, max_image_side]."""
    if raw is None:
        raise InvalidRequest("input 'image' (UINT8, shape [height, width, 3]) is required")
    if raw.dtype != np.uint8:
        raise InvalidRequest(f"input 'image' must be UINT8 RGB values 0..255, got {raw.dtype}")
    if raw.ndim != 3 or raw.shape[-1] != 3:
        raise InvalidRequest(f"input 'image' must have shape [height, width, 3] (RGB, channels last), "
                             f"got {list(raw.shape)}")
    side = deployment.limits.max_image_side
    if not (1 <= raw.shape[0] <= side and 1 <= raw.shape[1] <= side):
        raise InvalidRequest(f"input 'image' is {raw.shape[1]}x{raw.shape[0]} (WxH); each side must be in [1, {side}]")
    return raw


def check_params(params: GenerationParams, deployment: Deployment) -> GenerationParams:
    """The deployment's limits on decoded params (also applied by `dit`, which clients can call directly)."""
    lim = deployment.limits
    for name in ("prompt", "negative_prompt"):
        text = getattr(params, name)
        if not isinstance(text, str):
            raise InvalidRequest(f"input '{name}' must be a string")
        if len(text.encode("utf-8", "surrogatepass")) > lim.max_prompt_bytes:
            raise InvalidRequest(f"input '{name}' is longer than the limit of {lim.max_prompt_bytes} bytes")
    if not params.prompt.strip():
        raise InvalidRequest("input 'prompt' is empty; send a non-empty UTF-8 string")
    if params.cfg != deployment.uses_cfg:
        raise InvalidRequest(f"params 'cfg'={params.cfg}, but family {deployment.model.family} "
                             f"{'runs' if deployment.uses_cfg else 'has no'} classifier-free guidance")
    if not deployment.uses_cfg and params.negative_prompt:
        raise InvalidRequest(f"input 'negative_prompt' is not supported by family {deployment.model.family}: it is "
                             f"guidance-distilled, with no classifier-free guidance; leave it out or send \"\"")
    for name in ("height", "width", "num_inference_steps", "seed"):
        if isinstance(getattr(params, name), bool) or not isinstance(getattr(params, name), int):
            raise InvalidRequest(f"input '{name}' must be an integer")
    if isinstance(params.guidance_scale, bool) or not isinstance(params.guidance_scale, (int, float)):
        raise InvalidRequest("input 'guidance_scale' must be a number")
    size = dict(low=lim.min_size, high=lim.max_size, multiple=lim.size_multiple)
    _in_range("height", params.height, **size)
    _in_range("width", params.width, **size)
    _in_range("num_inference_steps", params.num_inference_steps, lim.min_steps, lim.max_steps)
    if lim.max_guidance_scale == 0 and params.guidance_scale != 0:
        raise InvalidRequest(f"input 'guidance_scale'={params.guidance_scale}: this deployment's model takes no "
                             f"guidance ([limits] max_guidance_scale = 0, e.g. FLUX.1-schnell); leave it out or send 0")
    if not math.isfinite(params.guidance_scale):
        raise InvalidRequest(f"input 'guidance_scale'={params.guidance_scale} must be a finite number in "
                             f"[0, {lim.max_guidance_scale}]")
    _in_range("guidance_scale", params.guidance_scale, 0.0, lim.max_guidance_scale)
    if params.guidance_scale_2 is not None:
        _check_guidance_scale_2(params, deployment)
    _in_range("seed", params.seed, 0, MAX_SEED)
    allowed = deployment.cache.allowed
    if params.quality not in allowed:
        raise InvalidRequest(f"input 'quality'={params.quality!r} is not a tier this deployment enables; "
                             f"allowed: {list(allowed)}")
    for name in ("num_frames", "fps"):
        if isinstance(getattr(params, name), bool) or not isinstance(getattr(params, name), int):
            raise InvalidRequest(f"input '{name}' must be an integer")
    if not deployment.is_video:
        if (params.num_frames, params.output_format) != (1, "raw"):
            raise InvalidRequest(f"{deployment.task} makes images: num_frames must be 1 and output_format 'raw'")
        return params
    _in_range("num_frames", params.num_frames, lim.min_frames, lim.max_frames)
    if (params.num_frames - 1) % lim.frames_step:
        raise InvalidRequest(f"input 'num_frames'={params.num_frames} must be {lim.frames_step} x k + 1 "
                             f"(e.g. {lim.frames_step * ((params.num_frames - 1) // lim.frames_step) + 1}); "
                             f"allowed [{lim.min_frames}, {lim.max_frames}]")
    _in_range("fps", params.fps, 1, lim.max_fps)
    if params.output_format not in OUTPUT_FORMATS:
        raise InvalidRequest(f"input 'output_format'={params.output_format!r}; allowed: {list(OUTPUT_FORMATS)}")
    return params


def _check_guidance_scale_2(params: GenerationParams, deployment: Deployment) -> None:
    """The low-noise expert's scale: only for families that have one, a finite number within the
    guidance limit, and above 1 only where `guidance_scale` turns CFG on (diffusers' WanPipeline
    runs CFG iff guidance_scale > 1, and would then ignore guidance_scale_2 without a word)."""
    value, family = params.guidance_scale_2, deployment.model.family
    if GUIDANCE_SCALE_2 not in FAMILY_INPUTS.get(family, ()):
        raise _family_input_error("guidance_scale_2", family)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidRequest(f"input 'guidance_scale_2'={value} must be a finite number in "
                             f"[0, {deployment.limits.max_guidance_scale}]")
    _in_range("guidance_scale_2", value, 0.0, deployment.limits.max_guidance_scale)
    if value > 1.0 and not params.do_cfg:
        raise InvalidRequest(f"input 'guidance_scale_2'={value} needs classifier-free guidance, which runs only when "
                             f"guidance_scale > 1 (got guidance_scale={params.guidance_scale}); raise guidance_scale "
                             f"or leave guidance_scale_2 out")

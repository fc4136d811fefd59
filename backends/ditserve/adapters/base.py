"""The step contract every model family implements, and the logic they all share.

A family adapter wraps a diffusers pipeline loaded with `from_pretrained` and splits
its `__call__` into the pieces the serving stages need:

  encode_text  (text_encoder stage)   prompts -> embeddings + masks
  prepare      (dit, on admission)    params + conditioning -> RequestState
  denoise      (dit, every step)      batch of states -> guided model output per state
  scheduler_step (dit, per request)   advance one state with its own scheduler
  decode       (vae_decode stage)     latents -> uint8 media on the device

Image-conditioned families (wan_i2v.py) add the encoders a vae_encode stage calls and
hand prepare their per-request conditioning in `TextConditioning.extra`.

Only the pieces that differ between families are abstract.
"""
from __future__ import annotations

import copy
import inspect
from abc import ABC, abstractmethod
from typing import ClassVar

import torch
from diffusers.utils.torch_utils import randn_tensor

from ..deployment import Deployment
from ..schema import GenerationParams
from ..state import RequestState, TextConditioning

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

# Which pipeline components each serving stage needs; the others are not loaded.
STAGE_COMPONENTS = {
    "text_encoder": ("text_encoder", "tokenizer"),
    "dit": ("transformer", "scheduler"),
    "vae_decode": ("vae",),
    # Image-conditioned tasks (img2vid): the input image -> image embeddings + condition latents.
    "vae_encode": ("vae", "image_encoder", "image_processor"),
}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"deployment asks for device {name!r} but CUDA is not available; use device = \"auto\" or \"cpu\"")
    return device


def instance_device(args: dict) -> str | None:
    """The device Triton gave this model instance: `cuda:<id>` for a KIND_GPU instance
    (scripts/render_repository.py --gpus), else None (use the deployment's [model] device)."""
    if args.get("model_instance_kind") == "GPU":
        return f"cuda:{int(args['model_instance_device_id'])}"
    return None


class FamilyAdapter(ABC):
    """Shared loading, noise, scheduling and media conversion; families fill in the rest."""

    pipeline_class: ClassVar[type]
    component_names: ClassVar[tuple[str, ...]]
    family: ClassVar[str]           # the deployment's [model] family (deployment.FAMILY_TASKS)

    def __init__(self, deployment: Deployment, stage: str, device: str | None = None):
        """`device` overrides the deployment's [model] device (a KIND_GPU instance's GPU)."""
        self.deployment = deployment
        self.device = resolve_device(device or deployment.model.device)
        self.dtype = DTYPES[deployment.model.dtype]
        keep = set(STAGE_COMPONENTS[stage])
        skipped = {name: None for name in self.component_names if name not in keep}
        self.pipe = self.pipeline_class.from_pretrained(
            deployment.model_location(), torch_dtype=self.dtype, **skipped
        ).to(self.device)
        self.check_limits(stage)

    # ---- family-specific -------------------------------------------------------------
    @abstractmethod
    def encode_text(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Embeddings [N, L, D] and masks [N, L] for N texts, as the pipeline computes them."""

    @abstractmethod
    def latent_shape(self, params: GenerationParams) -> tuple[int, ...]:
        """Shape of one request's initial noise, batch dim included."""

    @abstractmethod
    def forward(self, latents: torch.Tensor, timesteps: torch.Tensor, cond: TextConditioning) -> torch.Tensor:
        """One transformer forward over a stacked batch; returns the scheduler-ready output."""

    @abstractmethod
    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """VAE decode to float media in [-1, 1], layout [N, C, H, W] (image) or [N, F, C, H, W] (video)."""

    def check_limits(self, stage: str) -> None:
        """Fail at load time when the deployment's limits disagree with the model."""

    @property
    def latent_dtype(self) -> torch.dtype:
        """dtype of the initial noise and of the latents the scheduler steps, as the pipeline makes them."""
        return self.dtype

    # ---- shared ------------------------------------------------------------------------
    def new_scheduler(self):
        """A private scheduler per request: multistep solvers keep per-request history."""
        return copy.deepcopy(self.pipe.scheduler)

    def prepare(self, key: str, params: GenerationParams, cond: TextConditioning) -> RequestState:
        scheduler = self.new_scheduler()
        scheduler.set_timesteps(params.num_inference_steps, device=self.device)
        # A CPU generator makes a seed mean the same noise on every device, as in diffusers.
        generator = torch.Generator("cpu").manual_seed(params.seed)
        latents = randn_tensor(self.latent_shape(params), generator=generator, device=self.device,
                               dtype=self.latent_dtype)
        latents = latents * scheduler.init_noise_sigma
        cond = TextConditioning(cond.embeds.to(self.device, self.dtype), cond.mask.to(self.device),
                                {name: t.to(self.device) for name, t in cond.extra.items()})
        accepts_generator = "generator" in inspect.signature(scheduler.step).parameters
        step_kwargs = {"generator": generator} if accepts_generator else {}
        return RequestState(key, params, scheduler, scheduler.timesteps, latents, cond, generator, step_kwargs)

    @torch.inference_mode()
    def denoise(self, states: list[RequestState]) -> list[torch.Tensor]:
        """One guided model output per state; all states must share a compat key."""
        latents, timesteps, embeds, masks = [], [], [], []
        extras = {name: [] for name in states[0].cond.extra}
        for s in states:
            rows = 2 if s.params.do_cfg else 1
            model_input = s.scheduler.scale_model_input(torch.cat([s.latents] * rows), s.timestep)
            latents.append(model_input)
            timesteps.append(s.timestep.reshape(1).expand(rows))
            embeds.append(s.cond.embeds)
            masks.append(s.cond.mask)
            for name, t in s.cond.extra.items():  # one row per request, shared by its CFG rows
                extras[name].append(t.expand(rows, *t.shape[1:]))
        out = self.forward(torch.cat(latents), torch.cat(timesteps).to(self.device),
                           TextConditioning(torch.cat(embeds), torch.cat(masks),
                                            {name: torch.cat(ts) for name, ts in extras.items()}))
        results, row = [], 0
        for s in states:
            if s.params.do_cfg:
                uncond, text = out[row:row + 1], out[row + 1:row + 2]
                results.append(uncond + s.params.guidance_scale * (text - uncond))
                row += 2
            else:
                results.append(out[row:row + 1])
                row += 1
        return results

    def scheduler_step(self, state: RequestState, model_output: torch.Tensor) -> None:
        state.latents = state.scheduler.step(
            model_output, state.timestep, state.latents, **state.step_kwargs, return_dict=False
        )[0]
        state.step_index += 1

    @torch.inference_mode()
    def decode(self, latents: torch.Tensor) -> tuple[torch.Tensor, list[bool]]:
        """uint8 media, channels last, made on the device (rounded as diffusers' numpy_to_pil),
        and per row whether the VAE output was finite: a NaN would silently become black pixels."""
        media = self.decode_latents(latents.to(self.device, self.pipe.vae.dtype))
        finite = torch.isfinite(media.flatten(1)).all(dim=1).tolist()
        media = (media / 2 + 0.5).clamp(0, 1)
        media = media.movedim(-3, -1)  # [..., C, H, W] -> [..., H, W, C]
        return (media.float() * 255).round().to(torch.uint8), finite

    def media_height(self, latents: torch.Tensor) -> int:
        """Pixel height of the media these latents decode to (latent layout [..., h, w])."""
        return int(latents.shape[-2]) * self.vae_scale_factor

    @property
    @abstractmethod
    def vae_scale_factor(self) -> int:
        """Pixels per latent element along height and width."""


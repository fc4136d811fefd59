"""The oracles shared by the image MMDiT adapter and server tests: plain diffusers
FluxPipeline, StableDiffusion3Pipeline and QwenImagePipeline at the tiny deployments' text lengths."""
from __future__ import annotations

import numpy as np
import torch

from ditserve.deployment import load_deployment

FLUX_DEPLOYMENT = load_deployment("configs/tiny-flux.toml")
SD3_DEPLOYMENT = load_deployment("configs/tiny-sd3.toml")
QWEN_DEPLOYMENT = load_deployment("configs/tiny-qwen-image.toml")


def _uint8(images) -> np.ndarray:
    """uint8 [H, W, 3] of the first image, rounded as diffusers' PIL output."""
    return (images[0] * 255).round().astype(np.uint8)


def diffusers_flux_image(pipe, prompt: str, seed: int, steps: int, guidance: float, height: int = 64,
                         width: int = 64) -> np.ndarray:
    return _uint8(pipe(prompt, height=height, width=width, num_inference_steps=steps, guidance_scale=guidance,
                       max_sequence_length=FLUX_DEPLOYMENT.model.max_sequence_length,
                       generator=torch.Generator("cpu").manual_seed(seed), output_type="np").images)


def diffusers_sd3_image(pipe, prompt: str, seed: int, steps: int, guidance: float, height: int = 64, width: int = 64,
                        negative_prompt: str = "") -> np.ndarray:
    return _uint8(pipe(prompt, negative_prompt=negative_prompt, height=height, width=width,
                       num_inference_steps=steps, guidance_scale=guidance,
                       max_sequence_length=SD3_DEPLOYMENT.model.max_sequence_length,
                       generator=torch.Generator("cpu").manual_seed(seed), output_type="np").images)


def diffusers_qwen_image(pipe, prompt: str, seed: int, steps: int, guidance: float, height: int = 64,
                         width: int = 64, negative_prompt: str = " ") -> np.ndarray:
    """Our guidance_scale is the pipeline's true_cfg_scale; the negative prompt is always passed."""
    return _uint8(pipe(prompt, negative_prompt=negative_prompt, true_cfg_scale=guidance, height=height, width=width,
                       num_inference_steps=steps, max_sequence_length=QWEN_DEPLOYMENT.model.max_sequence_length,
                       generator=torch.Generator("cpu").manual_seed(seed), output_type="np").images)

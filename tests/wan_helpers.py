"""Shared pieces of the pure-python adapter tests (Wan T2V and I2V, FLUX.1): the adapters of
each stage, the diffusers oracle, params, a step loop that lets requests join late, and the
parity check against diffusers."""
from __future__ import annotations

import numpy as np

from ditserve.adapters import adapter_for
from ditserve.deployment import Deployment
from ditserve.engine import StepEngine
from ditserve.schema import GenerationParams
from ditserve.state import RequestState, TextConditioning



def stage_adapters(deployment: Deployment, stages: tuple[str, ...] = ("text_encoder", "dit", "vae_decode")) -> dict:
    """One adapter per stage, as the serving stages hold them (each loads only its components)."""
    adapter = adapter_for(deployment.model.family)
    return {stage: adapter(deployment, stage) for stage in stages}


def oracle(pipeline_class, deployment: Deployment):
    """The plain diffusers pipeline on the deployment's checkpoint, without progress bars."""
    pipe = pipeline_class.from_pretrained(deployment.model_location())
    pipe.set_progress_bar_config(disable=True)
    return pipe


def encode(stages, params: GenerationParams) -> TextConditioning:
    """The request's conditioning from the text_encoder stage's adapter: [negative, prompt] rows with CFG."""
    texts = [params.negative_prompt, params.prompt] if params.do_cfg else [params.prompt]
    return stages["text_encoder"].encode_prompts(texts)


def video_params(seed: int, guidance: float = 5.0, frames: int = 9, height: int = 64, width: int = 64,
                 prompt: str = "a red cat on a blue sofa", negative: str = "blurry, dark") -> GenerationParams:
    return GenerationParams(prompt, negative, height, width, 10, guidance, seed, num_frames=frames)


def run_steps(stages, states: list[RequestState], start_ticks: list[int]) -> list[np.ndarray]:
    """Step all admitted states together (one denoise per tick) until done; uint8 videos."""
    tick = 0
    while not all(s.done for s in states):
        active = [s for s, start in zip(states, start_ticks) if start <= tick and not s.done]
        for state, output in zip(active, stages["dit"].denoise(active)):
            stages["dit"].scheduler_step(state, output)
        tick += 1
    videos = []
    for state in states:
        media, finite = stages["vae_decode"].decode(state.latents)
        assert finite == [True]
        videos.append(media[0].numpy())
    return videos


def run_engine(stages, requests: dict[str, GenerationParams], joins: dict[str, int], encode
               ) -> tuple[dict[str, np.ndarray], list[int]]:
    """Through the real StepEngine (its compatibility grouping): each request joins at its tick
    (`encode(params)` makes its conditioning), one engine step per tick until all are done;
    uint8 media per request and the size of every forward."""
    engine, tick, sizes = StepEngine(stages["dit"]), 0, []
    while tick == 0 or any(not s.done for s in engine.table.values()):
        for key in [k for k, start in joins.items() if start == tick]:
            engine.admit(key, requests[key], encode(requests[key]))
        report = engine.step([k for k, s in engine.table.items() if not s.done])
        assert not report.failed, report.failed
        sizes += report.batch_sizes
        tick += 1
    media = {}
    for key, state in engine.table.items():
        decoded, finite = stages["vae_decode"].decode(state.latents)
        assert finite == [True]
        media[key] = decoded[0].numpy()
    return media, sizes


def conditioning_image(seed: int, height: int = 40, width: int = 56) -> np.ndarray:
    """uint8 [H, W, 3]: gradients, a block and noise, of another size than the video (so it is resized)."""
    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([x * 255 // (width - 1), y * 255 // (height - 1), (x + y) * 127 // (height + width)], -1)
    pixels[height // 4:height // 2, width // 4:width // 2] = (250, 20, 60)
    noise = np.random.default_rng(seed).integers(-30, 30, pixels.shape)
    return np.clip(pixels + noise, 0, 255).astype(np.uint8)

#!/usr/bin/env python
"""Train the embedded tiny PixArt-Sigma on the coloured-shapes set, so that it draws its prompt.

Random weights make coloured noise, which tells a newcomer nothing and makes any quality
measurement (step caching, FP8, compiled kernels) meaningless. This trains the same
diffusers classes as the real checkpoint on scripts/shapes_dataset.py:

  1. an AutoencoderKL (64px -> 16x16x4 latents) on reconstruction, then frozen, its
     scaling factor set so the latents have unit variance;
  2. the PixArtTransformer2DModel and a small T5 encoder together, with the DDPM
     epsilon loss on those latents and 10 % of captions replaced by "" (classifier-free
     guidance); the weights saved are an exponential moving average.

The output is a normal diffusers folder (`PixArtSigmaPipeline.from_pretrained`), then
evaluated with that pipeline on scripts/shapes_dataset.eval_prompts() (held-out
combinations included); samples and scores go to --report.

    python scripts/train_tiny.py --out models/tiny-pixart-shapes --report outputs/train  # H200: 8 min + eval
    python scripts/train_tiny.py --out /tmp/x --vae-steps 20 --dit-steps 20 --batch 16     # CPU smoke run
    python scripts/train_tiny.py --out models/tiny-pixart-shapes --report outputs/eval --evaluate-only

The defaults are the run that made the shipped weights (docs/tiny-model.md). Each stage
stops at its step count or at its share of --max-minutes, whichever comes first, and the
log names the steps it ran: the same seed and step counts give the same run (bit-exact on
CPU; up to kernel nondeterminism on a GPU).
"""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import copy
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from diffusers import (
    AutoencoderKL,
    DDPMScheduler,
    DPMSolverMultistepScheduler,
    PixArtSigmaPipeline,
    PixArtTransformer2DModel,
)
from PIL import Image
from transformers import T5Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
import shapes_dataset as shapes  # noqa: E402
from build_tiny_pipelines import (  # noqa: E402
    PIXART_SIGMA_SCHEDULER_CONFIG,
    PIXART_SIGMA_TRANSFORMER_CONFIG,
    dir_size,
    tiny_t5_encoder,
    tiny_t5_tokenizer,
)

CAPTION_DROPOUT = 0.1
NO_CONDITIONS = {"resolution": None, "aspect_ratio": None}


@dataclass
class TrainConfig:
    """The command line, as the summary records it (the options both trainers share)."""

    out: Path
    report: Path | None
    seed: int
    device: str
    batch: int
    vae_steps: int
    dit_steps: int
    max_minutes: float
    vae_share: float  # of max_minutes, for stage 1
    lr: float
    ema_decay: float
    eval_seeds: int
    evaluate_only: bool


@dataclass
class Parts:
    """The trained pipeline's components (the scheduler has no weights)."""

    tokenizer: T5Tokenizer
    text_encoder: torch.nn.Module
    vae: AutoencoderKL
    transformer: PixArtTransformer2DModel


def build_parts(seed: int) -> Parts:
    """The pipeline's components, small: a 3-level VAE (4x downscale), an 8-layer 128-wide
    transformer with PixArt-Sigma's config otherwise, a 3-layer 64-wide T5 encoder."""
    torch.manual_seed(seed)
    tokenizer = tiny_t5_tokenizer(extra_words=shapes.WORDS)
    text_encoder = tiny_t5_encoder(len(tokenizer), d_model=64, d_kv=32, d_ff=128, num_layers=3, num_heads=2)
    torch.manual_seed(seed)
    vae = AutoencoderKL(
        in_channels=3, out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 3, up_block_types=("UpDecoderBlock2D",) * 3,
        block_out_channels=(32, 64, 64), layers_per_block=1, latent_channels=4, norm_num_groups=32,
        sample_size=shapes.SIZE,
    )
    torch.manual_seed(seed)
    transformer = PixArtTransformer2DModel(**{
        **PIXART_SIGMA_TRANSFORMER_CONFIG,
        "sample_size": shapes.SIZE // 4,  # latent side at 64px
        "num_layers": 8,
        "num_attention_heads": 4,
        "attention_head_dim": 32,
        "cross_attention_dim": 128,  # heads x head dim
        "caption_channels": text_encoder.config.d_model,
    })
    return Parts(tokenizer, text_encoder, vae, transformer)


class Progress:
    """One line every `every` steps: step, mean loss since the last line, elapsed, rate.
    Losses add up on the device, so that only a printed line waits for it."""

    def __init__(self, stage: str, steps: int, every: int = 100) -> None:
        self.stage, self.steps, self.every = stage, steps, every
        self.start = self.last = time.perf_counter()
        self.total, self.count = 0.0, 0

    def update(self, step: int, loss: torch.Tensor) -> None:
        self.total, self.count = self.total + loss, self.count + 1
        if step % self.every and step != self.steps:
            return
        now = time.perf_counter()
        print(f"[{self.stage}] step {step}/{self.steps} loss {float(self.total) / self.count:.5f} "
              f"elapsed {now - self.start:.1f}s ({self.count / max(now - self.last, 1e-9):.1f} steps/s)", flush=True)
        self.total, self.count, self.last = 0.0, 0, now


class EmaTrainer:
    """AdamW (200 warm-up steps, gradients clipped at 1) on `trained`, and their exponential
    moving averages: the copies that get saved. Shared by the tiny PixArt and Wan trainers."""

    def __init__(self, trained: dict[str, torch.nn.Module], lr: float, ema_decay: float) -> None:
        self.ema = {name: copy.deepcopy(model).eval().requires_grad_(False) for name, model in trained.items()}
        self.params = [p for model in trained.values() for p in model.parameters()]
        self.ema_params = [p for model in self.ema.values() for p in model.parameters()]
        self.optimizer = torch.optim.AdamW(self.params, lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
        self.warmup = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: min(1.0, (step + 1) / 200))
        self.ema_decay = ema_decay

    def step(self, loss: torch.Tensor, step: int) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.optimizer.step()
        self.warmup.step()
        with torch.no_grad():
            torch._foreach_lerp_(self.ema_params, self.params, 1.0 - min(self.ema_decay, (1 + step) / (10 + step)))


def autocast(device: torch.device):
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")


def train_vae(vae: torch.nn.Module, steps: int, draw: Callable[[], torch.Tensor], device: torch.device,
              deadline: float) -> int:
    """Reconstruction (MSE + L1) with a light KL term on the batches `draw` gives (pictures, or
    clips for the tiny Wan's VAE); returns the steps run."""
    vae.train().to(device)
    optimizer = torch.optim.AdamW(vae.parameters(), lr=1e-3, weight_decay=0.0)
    progress = Progress("vae", steps)
    step = 0
    while step < steps and time.perf_counter() < deadline:
        step += 1
        images = draw()
        with autocast(device):
            posterior = vae.encode(images).latent_dist
            recon = vae.decode(posterior.sample()).sample
        recon = recon.float()
        loss = F.mse_loss(recon, images) + 0.1 * F.l1_loss(recon, images) + 1e-7 * posterior.kl().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        optimizer.step()
        progress.update(step, loss.detach())
    vae.eval().requires_grad_(False)
    return step


@torch.no_grad()
def set_latent_scale(vae: AutoencoderKL, cfg: TrainConfig, device: torch.device, generator: torch.Generator) -> None:
    """scaling_factor = 1 / std of the latents, as Stable Diffusion's VAEs are calibrated."""
    images = shapes.sample(shapes.TRAIN_COMBOS, 512, generator, device).images
    latents = vae.encode(images).latent_dist.mean
    vae.register_to_config(scaling_factor=float(1.0 / latents.std()))
    recon = vae.decode(latents).sample.clamp(-1, 1)
    print(f"[vae] scaling_factor {vae.config.scaling_factor:.4f}, reconstruction MSE {F.mse_loss(recon, images):.5f}",
          flush=True)


class CaptionTable:
    """Every caption of `combos` in every template, tokenized once: [combo, template, tokens]."""

    def __init__(self, tokenizer: T5Tokenizer, combos: tuple[tuple[str, str, str], ...],
                 device: torch.device) -> None:
        texts = [shapes.caption(*combo, template) for combo in combos for template in range(len(shapes.TEMPLATES))]
        length = max(len(tokenizer(text).input_ids) for text in texts)
        tokens = tokenizer(texts + [""], padding="max_length", max_length=length, return_tensors="pt")
        shape = (len(combos), len(shapes.TEMPLATES), length)
        self.ids = tokens.input_ids[:-1].view(shape).to(device)
        self.mask = tokens.attention_mask[:-1].view(shape).to(device)
        self.empty_ids, self.empty_mask = tokens.input_ids[-1].to(device), tokens.attention_mask[-1].to(device)

    def pick(self, combos: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """A random phrasing per row; CAPTION_DROPOUT of the rows get the empty caption."""
        template = torch.randint(self.ids.shape[1], (len(combos),), generator=generator).to(combos.device)
        drop = (torch.rand(len(combos), generator=generator) < CAPTION_DROPOUT).to(combos.device).unsqueeze(1)
        ids = torch.where(drop, self.empty_ids, self.ids[combos, template])
        mask = torch.where(drop, self.empty_mask, self.mask[combos, template])
        return ids, mask


def train_dit(parts: Parts, cfg: TrainConfig, device: torch.device, deadline: float,
              generator: torch.Generator) -> tuple[int, dict[str, torch.nn.Module]]:
    """Epsilon-prediction DDPM loss on the frozen VAE's latents, transformer and T5 trained
    together; returns the steps run and the EMA copies of both."""
    trained = {"transformer": parts.transformer.train().to(device), "text_encoder": parts.text_encoder.train().to(device)}
    trainer = EmaTrainer(trained, cfg.lr, cfg.ema_decay)
    noise_schedule = DDPMScheduler(**{k: PIXART_SIGMA_SCHEDULER_CONFIG[k] for k in
                                      ("num_train_timesteps", "beta_start", "beta_end", "beta_schedule")})
    captions = CaptionTable(parts.tokenizer, shapes.TRAIN_COMBOS, device)
    vae, scale = parts.vae.to(device), parts.vae.config.scaling_factor
    latent_channels = parts.transformer.config.in_channels
    progress = Progress("dit", cfg.dit_steps)
    step = 0
    while step < cfg.dit_steps and time.perf_counter() < deadline:
        step += 1
        batch = shapes.sample(shapes.TRAIN_COMBOS, cfg.batch, generator, device)
        ids, mask = captions.pick(batch.combos, generator)
        noise = torch.randn(cfg.batch, latent_channels, shapes.SIZE // 4, shapes.SIZE // 4, generator=generator)
        timesteps = torch.randint(noise_schedule.config.num_train_timesteps, (cfg.batch,), generator=generator)
        noise, timesteps = noise.to(device), timesteps.to(device)
        with torch.no_grad(), autocast(device):
            latents = vae.encode(batch.images).latent_dist.mean.float() * scale
        noisy = noise_schedule.add_noise(latents, noise, timesteps)
        with autocast(device):
            embeds = trained["text_encoder"](ids, attention_mask=mask).last_hidden_state
            out = trained["transformer"](noisy, encoder_hidden_states=embeds, encoder_attention_mask=mask,
                                         timestep=timesteps, added_cond_kwargs=NO_CONDITIONS).sample
        loss = F.mse_loss(out[:, :latent_channels].float(), noise)  # the learned-sigma half is unused at inference
        trainer.step(loss, step)
        progress.update(step, loss.detach())
    return step, trainer.ema


def save(parts: Parts, ema: dict[str, torch.nn.Module], out: Path) -> None:
    pipe = PixArtSigmaPipeline(
        tokenizer=parts.tokenizer, text_encoder=ema["text_encoder"].cpu(), vae=parts.vae.cpu(),
        transformer=ema["transformer"].cpu(), scheduler=DPMSolverMultistepScheduler(**PIXART_SIGMA_SCHEDULER_CONFIG),
    )
    # Stored in float16 (every weight is far inside its range): half the size in git; a deployment
    # loads them in its own dtype.
    pipe.to(dtype=torch.float16).save_pretrained(out, safe_serialization=True)
    # transformers (v5) loads a model in the dtype its config names, diffusers in float32: name
    # float32 so that a plain from_pretrained(out) gives one dtype throughout.
    config = out / "text_encoder" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "dtype": "float32"}, indent=2) + "\n")
    print(f"[save] {out} ({dir_size(out) / 2**20:.2f} MiB)", flush=True)


def generate(pipe: PixArtSigmaPipeline, prompts: list[str], seeds: list[int], steps: int,
             guidance: float) -> list[np.ndarray]:
    """uint8 images as the server makes them: per-prompt CPU generators, no binning or cleaning."""
    images = pipe(prompts, height=shapes.SIZE, width=shapes.SIZE, num_inference_steps=steps, guidance_scale=guidance,
                  generator=[torch.Generator("cpu").manual_seed(s) for s in seeds], use_resolution_binning=False,
                  clean_caption=False, output_type="np").images
    return [(image * 255).round().astype(np.uint8) for image in images]


def evaluate(out: Path, report: Path, device: torch.device, seeds: int) -> dict:
    """Colour and shape scores of the saved folder, on seen and held-out prompts, over a grid
    of step counts and guidance scales. samples.png holds one row per setting (first seed of
    each prompt, held-out ones last)."""
    pipe = PixArtSigmaPipeline.from_pretrained(out, torch_dtype=torch.float32).to(device)  # stored in float16
    pipe.set_progress_bar_config(disable=True)
    combos = shapes.eval_prompts()
    asked = [combo for combo in combos for _ in range(seeds)]
    prompts = [shapes.caption(*combo) for combo in asked]
    seed_list = [seed for _ in combos for seed in range(seeds)]
    split = {name: [i for i, combo in enumerate(asked) if (combo in shapes.HELD_OUT) == flag]
             for name, flag in (("seen", False), ("held_out", True))}
    results, rows = {}, []
    for steps in (10, 20):
        for guidance in (1.0, 2.0, 3.0, 4.5, 7.0):
            images = generate(pipe, prompts, seed_list, steps, guidance)
            scores = {name: asdict(shapes.score([images[i] for i in idx], [asked[i] for i in idx]))
                      for name, idx in split.items()}
            key = f"steps{steps}_cfg{guidance}"
            results[key] = scores
            print(f"[eval] {key}: seen colours {scores['seen']['colours']:.3f} shapes {scores['seen']['shapes']:.3f}"
                  f" | held-out colours {scores['held_out']['colours']:.3f} shapes {scores['held_out']['shapes']:.3f}",
                  flush=True)
            rows.append(np.concatenate(images[::seeds], axis=1))
    Image.fromarray(np.concatenate(rows, axis=0)).save(report / "samples.png")
    results["prompts"] = [{"prompt": shapes.caption(*c), "held_out": c in shapes.HELD_OUT} for c in combos]
    return results


def trainer_arguments(doc: str, *, batch: int, vae_steps: int, dit_steps: int, max_minutes: float,
                      vae_share: float, eval_seeds: int, batch_help: str = "pictures per step",
                      eval_help: str = "") -> argparse.ArgumentParser:
    """The options both trainers take (TrainConfig's fields), with each trainer's defaults."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="diffusers folder to write")
    p.add_argument("--report", type=Path, help="folder for the training summary, scores and sample grids")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch", type=int, default=batch, help=batch_help)
    p.add_argument("--vae-steps", type=int, default=vae_steps)
    p.add_argument("--dit-steps", type=int, default=dit_steps)
    p.add_argument("--max-minutes", type=float, default=max_minutes,
                   help="wall-clock cap for both stages; whichever of it and the step counts comes first")
    p.add_argument("--vae-share", type=float, default=vae_share, help="fraction of --max-minutes for the VAE")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--ema-decay", type=float, default=0.999)
    p.add_argument("--eval-seeds", type=int, default=eval_seeds,
                   help="seeds per evaluation prompt (0: no evaluation)" + eval_help)
    p.add_argument("--evaluate-only", action="store_true", help="skip training: evaluate the folder at --out")
    return p


def parsed(config: type, parser: argparse.ArgumentParser, argv: list[str] | None):
    """`config` (a TrainConfig) built from the parsed command line."""
    return config(**{k.replace("-", "_"): v for k, v in vars(parser.parse_args(argv)).items()})


def parse_args(argv: list[str] | None) -> TrainConfig:
    parser = trainer_arguments(__doc__, batch=1024, vae_steps=767, dit_steps=4179, max_minutes=8.5, vae_share=0.2,
                               eval_seeds=2, eval_help="; 2 keeps training + evaluation inside one 10-minute device call")
    return parsed(TrainConfig, parser, argv)


def train(cfg: TrainConfig, device: torch.device) -> dict:
    """Both stages, then save; returns what the summary records."""
    start = time.perf_counter()
    generator = torch.Generator().manual_seed(cfg.seed)  # data, noise and timesteps: CPU, device-independent
    parts = build_parts(cfg.seed)
    vae_steps = train_vae(parts.vae, cfg.vae_steps,
                          lambda: shapes.sample(shapes.TRAIN_COMBOS, cfg.batch, generator, device).images, device,
                          start + 60 * cfg.max_minutes * cfg.vae_share)
    set_latent_scale(parts.vae, cfg, device, generator)
    dit_steps, ema = train_dit(parts, cfg, device, start + 60 * cfg.max_minutes, generator)
    train_s = time.perf_counter() - start
    print(f"[train] done: vae {vae_steps} steps, dit {dit_steps} steps, {train_s:.0f}s; "
          f"reproduce with --seed {cfg.seed} --batch {cfg.batch} --vae-steps {vae_steps} --dit-steps {dit_steps}",
          flush=True)
    save(parts, ema, cfg.out)
    return {"vae_steps": vae_steps, "dit_steps": dit_steps, "train_seconds": round(train_s, 1),
            "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "size_mib": round(dir_size(cfg.out) / 2**20, 2)}


def run(cfg, train: Callable[[Any, torch.device], dict], evaluate: Callable[[Any, torch.device], dict]) -> int:
    """Train (unless --evaluate-only), evaluate into --report and write its summary: the command
    of both tiny trainers, each with its own config, training and evaluation."""
    device = torch.device(cfg.device)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    print(f"[train] {cfg}", flush=True)
    summary = {"config": {k: str(v) for k, v in asdict(cfg).items()}}
    if not cfg.evaluate_only:
        summary |= train(cfg, device)
    if cfg.report is None:
        return 0
    cfg.report.mkdir(parents=True, exist_ok=True)
    if cfg.eval_seeds:
        summary["eval"] = evaluate(cfg, device)
    name = "eval.json" if cfg.evaluate_only else "summary.json"
    (cfg.report / name).write_text(json.dumps(summary, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(parse_args(argv), train, lambda cfg, device: evaluate(cfg.out, cfg.report, device, cfg.eval_seeds))


if __name__ == "__main__":
    sys.exit(main())

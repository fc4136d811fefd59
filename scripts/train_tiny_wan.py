#!/usr/bin/env python
"""Train a tiny Wan2.1 text-to-video model on clips of gliding coloured shapes.

The cache tiers (docs/cache.md) are calibrated per family on trained weights (random weights give
no real trajectory); this is Wan's trained model, as scripts/train_tiny.py is PixArt-Sigma's
(models/tiny-wan-shapes, docs/tiny-model.md). It trains the same diffusers classes as
Wan-AI/Wan2.1-T2V-1.3B-Diffusers on scripts/shapes_dataset.sample_video (9 frames of 64x64: one
shape of one colour gliding in a straight line over a flat background, captioned as the pictures
are):

  1. an AutoencoderKLWan (8x spatial, 4x temporal: 9x64x64 -> 3x8x8x16) on reconstruction,
     then frozen, its per-channel `latents_mean` / `latents_std` set from the data, as the
     real VAE's config holds them;
  2. the WanTransformer3DModel (8 blocks, so that the cache has blocks to skip) and a small
     UMT5 encoder together, with the flow-matching loss of Wan's UniPC scheduler
     (velocity = noise - clean latents, sigmas shifted by its flow_shift), 10 % of captions
     replaced by "" for classifier-free guidance; the text embeddings are zero-padded to
     `--max-sequence-length` as WanPipeline pads them; the weights saved are an EMA.

The output is a normal diffusers folder (`WanPipeline.from_pretrained`), then evaluated with
that pipeline on scripts/shapes_dataset.eval_prompts(): colour and shape scores of the first
and last frames; samples go to --report.

    python scripts/train_tiny_wan.py --out models/tiny-wan-shapes --report outputs/train-wan   # GPU, ~8 min + eval
    python scripts/train_tiny_wan.py --out /tmp/w --vae-steps 2 --dit-steps 2 --batch 2 --eval-seeds 0  # CPU smoke run
    python scripts/train_tiny_wan.py --resume models/tiny-wan-shapes --seed 1 --out /tmp/w2  # more transformer steps

A device call lasts at most 10 minutes, so a longer training continues a saved folder:
`--resume` keeps its VAE (and latent statistics) and trains its transformer and UMT5 further from
the saved EMA weights with a fresh optimizer (a new `--seed` draws new clips).

Each stage stops at its step count or at its share of --max-minutes, whichever comes first;
the log names the steps it ran (the same seed and step counts give the same run on CPU).
"""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
from PIL import Image
from transformers import T5Tokenizer, UMT5EncoderModel

sys.path.insert(0, str(Path(__file__).resolve().parent))
import shapes_dataset as shapes  # noqa: E402
from build_tiny_pipelines import (  # noqa: E402
    WAN_T2V_SCHEDULER_CONFIG,
    WAN_T2V_TRANSFORMER_CONFIG,
    WAN_VAE_CONFIG,
    dir_size,
    tiny_t5_encoder,
    tiny_t5_tokenizer,
)
from train_tiny import (CaptionTable, EmaTrainer, Progress, TrainConfig, autocast, parsed, run,  # noqa: E402
                        train_vae, trainer_arguments)

FRAMES = 9  # 1 + 4 x 2: three latent frames


@dataclass
class WanTrainConfig(TrainConfig):
    """The command line, as the summary records it: the shared options and Wan's own."""

    resume: Path | None
    vae_batch: int
    max_sequence_length: int


@dataclass
class Parts:
    """The trained pipeline's components (the scheduler has no weights)."""

    tokenizer: T5Tokenizer
    text_encoder: UMT5EncoderModel
    vae: AutoencoderKLWan
    transformer: WanTransformer3DModel


def build_parts(seed: int, max_sequence_length: int) -> Parts:
    """Wan2.1-T2V-1.3B's classes, small: a 16-wide VAE with one residual block per level, an
    8-block 128-wide transformer (4 heads of 32), a 3-layer 64-wide UMT5 encoder."""
    torch.manual_seed(seed)
    tokenizer = tiny_t5_tokenizer(model_max_length=max_sequence_length, extra_words=shapes.WORDS)
    text_encoder = tiny_t5_encoder(len(tokenizer), d_model=64, model_class=UMT5EncoderModel, d_kv=32, d_ff=128,
                                   num_layers=3, num_heads=2)
    torch.manual_seed(seed)
    vae = AutoencoderKLWan(**{**WAN_VAE_CONFIG, "base_dim": 16, "num_res_blocks": 1})
    torch.manual_seed(seed)
    transformer = WanTransformer3DModel(**{
        **WAN_T2V_TRANSFORMER_CONFIG,
        "num_attention_heads": 4,
        "attention_head_dim": 32,
        "ffn_dim": 256,
        "num_layers": 8,
        "text_dim": text_encoder.config.d_model,
    })
    return Parts(tokenizer, text_encoder, vae, transformer)


def load_parts(folder: Path) -> Parts:
    """A saved folder's components in float32, to train further (`--resume`)."""
    pipe = WanPipeline.from_pretrained(folder, torch_dtype=torch.float32)
    return Parts(pipe.tokenizer, pipe.text_encoder, pipe.vae.eval().requires_grad_(False), pipe.transformer)


@torch.no_grad()
def set_latent_statistics(vae: AutoencoderKLWan, device: torch.device, generator: torch.Generator) -> None:
    """latents_mean / latents_std per channel from the data: WanPipeline normalises with them
    (as the real VAE's config holds its own)."""
    clips = shapes.sample_video(shapes.TRAIN_COMBOS, 64, FRAMES, generator, device).images
    latents = vae.encode(clips).latent_dist.mean
    mean, std = latents.mean(dim=(0, 2, 3, 4)), latents.std(dim=(0, 2, 3, 4))
    vae.register_to_config(latents_mean=[round(float(v), 4) for v in mean],
                           latents_std=[round(float(v), 4) for v in std])
    recon = vae.decode(latents).sample.clamp(-1, 1)
    print(f"[vae] latent std {[round(float(v), 3) for v in std]}, reconstruction MSE {F.mse_loss(recon, clips):.5f}",
          flush=True)


def normalised_latents(vae: AutoencoderKLWan, clips: torch.Tensor) -> torch.Tensor:
    """The clean latents the transformer sees: (z - latents_mean) / latents_std, as WanPipeline undoes them."""
    z = vae.encode(clips).latent_dist.mean.float()
    view = (1, -1, 1, 1, 1)
    mean = torch.tensor(vae.config.latents_mean, device=z.device).view(view)
    std = torch.tensor(vae.config.latents_std, device=z.device).view(view)
    return (z - mean) / std


def padded_embeddings(text_encoder: UMT5EncoderModel, ids: torch.Tensor, mask: torch.Tensor,
                      length: int) -> torch.Tensor:
    """UMT5 embeddings of the caption tokens, zero past each caption and up to `length` tokens:
    what WanPipeline hands the transformer (it cuts each prompt at its length and zero-pads)."""
    embeds = text_encoder(ids, attention_mask=mask).last_hidden_state * mask.unsqueeze(-1)
    return F.pad(embeds, (0, 0, 0, length - embeds.shape[1]))


def train_dit(parts: Parts, cfg: WanTrainConfig, device: torch.device, deadline: float,
              generator: torch.Generator) -> tuple[int, dict[str, torch.nn.Module]]:
    """Flow-matching loss on the frozen VAE's latents, transformer and UMT5 trained together;
    returns the steps run and the EMA copies of both."""
    trained = {"transformer": parts.transformer.train().to(device), "text_encoder": parts.text_encoder.train().to(device)}
    trainer = EmaTrainer(trained, cfg.lr, cfg.ema_decay)
    shift = WAN_T2V_SCHEDULER_CONFIG["flow_shift"]
    captions = CaptionTable(parts.tokenizer, shapes.TRAIN_COMBOS, device)
    vae = parts.vae.to(device)
    progress = Progress("dit", cfg.dit_steps)
    step = 0
    while step < cfg.dit_steps and time.perf_counter() < deadline:
        step += 1
        batch = shapes.sample_video(shapes.TRAIN_COMBOS, cfg.batch, FRAMES, generator, device)
        ids, mask = captions.pick(batch.combos, generator)
        with torch.no_grad(), autocast(device):
            clean = normalised_latents(vae, batch.images)
        noise = torch.randn(clean.shape, generator=generator).to(device)
        u = torch.rand(cfg.batch, generator=generator).to(device)
        sigma = shift * u / (1 + (shift - 1) * u)   # the inference sigmas' shift, so training covers them alike
        noisy = (1 - sigma.view(-1, 1, 1, 1, 1)) * clean + sigma.view(-1, 1, 1, 1, 1) * noise
        with autocast(device):
            embeds = padded_embeddings(trained["text_encoder"], ids, mask, cfg.max_sequence_length)
            velocity = trained["transformer"](noisy, timestep=sigma * 1000, encoder_hidden_states=embeds,
                                              return_dict=False)[0]
        loss = F.mse_loss(velocity.float(), noise - clean)
        trainer.step(loss, step)
        progress.update(step, loss.detach())
    return step, trainer.ema


def save(parts: Parts, ema: dict[str, torch.nn.Module], out: Path) -> None:
    pipe = WanPipeline(tokenizer=parts.tokenizer, text_encoder=ema["text_encoder"].cpu(), vae=parts.vae.cpu(),
                       transformer=ema["transformer"].cpu(), scheduler=UniPCMultistepScheduler(**WAN_T2V_SCHEDULER_CONFIG))
    # float16 on disk (half the size; a deployment loads its own dtype), with the text encoder's
    # config naming float32 so that a plain from_pretrained gives one dtype throughout.
    pipe.to(dtype=torch.float16).save_pretrained(out, safe_serialization=True)
    config = out / "text_encoder" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "dtype": "float32"}, indent=2) + "\n")
    print(f"[save] {out} ({dir_size(out) / 2**20:.2f} MiB)", flush=True)


def evaluate(out: Path, report: Path, device: torch.device, seeds: int, max_sequence_length: int) -> dict:
    """Colour and shape scores of the first and last frames, on seen and held-out prompts, over
    a few step counts and guidance scales; samples.png holds the first and last frames of each
    prompt's first seed, one row per setting."""
    pipe = WanPipeline.from_pretrained(out, torch_dtype=torch.float32).to(device)
    pipe.set_progress_bar_config(disable=True)
    combos = shapes.eval_prompts()
    asked = [combo for combo in combos for _ in range(seeds)]
    prompts = [shapes.caption(*combo) for combo in asked]
    seed_list = [seed for _ in combos for seed in range(seeds)]
    split = {name: [i for i, combo in enumerate(asked) if (combo in shapes.HELD_OUT) == flag]
             for name, flag in (("seen", False), ("held_out", True))}
    results, rows = {}, []
    for steps in (10, 20):
        for guidance in (1.0, 3.0, 5.0):
            frames = pipe(prompts, negative_prompt="", height=shapes.SIZE, width=shapes.SIZE, num_frames=FRAMES,
                          num_inference_steps=steps, guidance_scale=guidance, max_sequence_length=max_sequence_length,
                          generator=[torch.Generator("cpu").manual_seed(s) for s in seed_list], output_type="np").frames
            clips = [(clip * 255).round().astype(np.uint8) for clip in frames]
            key, scores = f"steps{steps}_cfg{guidance}", {}
            for name, idx in split.items():
                for which, frame in (("first", 0), ("last", -1)):
                    scores[f"{name}_{which}"] = asdict(shapes.score([clips[i][frame] for i in idx], [asked[i] for i in idx]))
            results[key] = scores
            print(f"[eval] {key}: " + " | ".join(f"{k} colours {v['colours']:.3f} shapes {v['shapes']:.3f}"
                                                  for k, v in scores.items()), flush=True)
            rows.append(np.concatenate([np.concatenate([clip[0], clip[-1]], axis=0) for clip in clips[::seeds]], axis=1))
    Image.fromarray(np.concatenate(rows, axis=0)).save(report / "samples.png")
    results["prompts"] = [{"prompt": shapes.caption(*c), "held_out": c in shapes.HELD_OUT} for c in combos]
    return results


def parse_args(argv: list[str] | None) -> WanTrainConfig:
    p = trainer_arguments(__doc__, batch=256, vae_steps=1500, dit_steps=6000, max_minutes=8.0, vae_share=0.3,
                          eval_seeds=1, batch_help="clips per transformer step")
    p.add_argument("--resume", type=Path, help="a folder this script saved: keep its VAE, train the rest further")
    p.add_argument("--vae-batch", type=int, default=64, help="clips per VAE step")
    p.add_argument("--max-sequence-length", type=int, default=512, help="text tokens the transformer sees (the deployment's)")
    return parsed(WanTrainConfig, p, argv)


def train(cfg: WanTrainConfig, device: torch.device) -> dict:
    """Both stages, then save; returns what the summary records."""
    start = time.perf_counter()
    generator = torch.Generator().manual_seed(cfg.seed)  # data, noise and timesteps: CPU, device-independent
    if cfg.resume:
        parts, vae_steps = load_parts(cfg.resume), 0
        print(f"[train] resuming {cfg.resume}: its VAE kept, transformer and UMT5 trained further", flush=True)
    else:
        parts = build_parts(cfg.seed, cfg.max_sequence_length)
        vae_steps = train_vae(parts.vae, cfg.vae_steps,
                              lambda: shapes.sample_video(shapes.TRAIN_COMBOS, cfg.vae_batch, FRAMES, generator, device).images,
                              device, start + 60 * cfg.max_minutes * cfg.vae_share)
        set_latent_statistics(parts.vae, device, generator)
    dit_steps, ema = train_dit(parts, cfg, device, start + 60 * cfg.max_minutes, generator)
    train_s = time.perf_counter() - start
    print(f"[train] done: vae {vae_steps} steps, dit {dit_steps} steps, {train_s:.0f}s; reproduce with "
          f"{f'--resume {cfg.resume} ' if cfg.resume else ''}--seed {cfg.seed} --batch {cfg.batch} "
          f"--vae-batch {cfg.vae_batch} --vae-steps {vae_steps} --dit-steps {dit_steps}", flush=True)
    save(parts, ema, cfg.out)
    return {"resumed_from": str(cfg.resume) if cfg.resume else None, "vae_steps": vae_steps, "dit_steps": dit_steps,
            "train_seconds": round(train_s, 1),
            "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "size_mib": round(dir_size(cfg.out) / 2**20, 2)}


def main(argv: list[str] | None = None) -> int:
    return run(parse_args(argv), train,
               lambda cfg, device: evaluate(cfg.out, cfg.report, device, cfg.eval_seeds, cfg.max_sequence_length))


if __name__ == "__main__":
    sys.exit(main())

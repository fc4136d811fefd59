"""The tiny Wan trainer (scripts/train_tiny_wan.py) and its clips, on CPU: a one-step run writes a
folder that plain diffusers loads and runs, with latent statistics measured on the data; the
clips keep the asked shape and colours in frame from the first frame to the last."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import shapes_dataset as shapes  # noqa: E402


def test_clips_keep_the_asked_shape_and_colours_in_every_frame_and_move():
    combos = shapes.TRAIN_COMBOS
    batch = shapes.sample_video(combos, 8, 9, torch.Generator().manual_seed(3))
    assert batch.images.shape == (8, 3, 9, shapes.SIZE, shapes.SIZE)
    frames = ((batch.images.permute(0, 2, 3, 4, 1) + 1) * 127.5).round().clamp(0, 255).to(torch.uint8).numpy()
    asked = [combos[i] for i in batch.combos.tolist()]
    for frame in (0, 4, 8):
        score = shapes.score([clip[frame] for clip in frames], asked)
        assert score.colours == 1.0 and score.shapes >= 0.875, (frame, score)
    moved = [np.abs(clip[0].astype(int) - clip[-1].astype(int)).max() > 0 for clip in frames]
    assert sum(moved) >= 7, "the shapes glide between the first and last frame"


def test_one_step_run_writes_a_wan_pipeline_diffusers_runs(tmp_path):
    from diffusers import WanPipeline

    import train_tiny_wan

    out = tmp_path / "wan"
    assert train_tiny_wan.main(["--out", str(out), "--device", "cpu", "--vae-steps", "1", "--dit-steps", "1",
                                "--batch", "2", "--vae-batch", "2", "--eval-seeds", "0"]) == 0
    pipe = WanPipeline.from_pretrained(out, torch_dtype=torch.float32)
    assert len(pipe.transformer.blocks) == 8, "blocks for the cache tiers to skip"
    stats = pipe.vae.config.latents_std
    assert len(stats) == 16 and all(0 < s < 2 for s in stats), "measured on the clips, not the real VAE's"
    clip = pipe("a red circle on a blue background", height=64, width=64, num_frames=9, num_inference_steps=2,
                generator=torch.Generator().manual_seed(0), output_type="np").frames[0]
    assert clip.shape == (9, 64, 64, 3) and np.isfinite(clip).all()

    more = tmp_path / "wan-more"   # a second call continues the first: same VAE, the transformer moves on
    assert train_tiny_wan.main(["--out", str(more), "--resume", str(out), "--seed", "1", "--device", "cpu",
                                "--dit-steps", "1", "--batch", "2", "--eval-seeds", "0"]) == 0
    again = WanPipeline.from_pretrained(more, torch_dtype=torch.float32)
    assert again.vae.config.latents_std == stats
    assert torch.equal(again.vae.decoder.conv_out.weight, pipe.vae.decoder.conv_out.weight)
    assert not torch.equal(again.transformer.proj_out.weight, pipe.transformer.proj_out.weight)

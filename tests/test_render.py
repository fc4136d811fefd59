"""The committed model repository is the render of the default deployment."""
from __future__ import annotations

import filecmp
import subprocess
import sys

from conftest import ROOT


def test_committed_repository_matches_the_default_deployment(tmp_path):
    out = tmp_path / "repo"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "render_repository.py"), "--deployment",
                    "configs/tiny-pixart-sigma.toml", "--out", str(out)], check=True)
    for model in ("dit", "txt2img", "txt2img_stream", "text_encoder", "vae_decode"):
        assert filecmp.cmp(out / model / "config.pbtxt", ROOT / "model_repository" / model / "config.pbtxt",
                           shallow=False), model


def test_render_writes_capacity_into_dit_and_unary_instances(tmp_path):
    out = tmp_path / "repo"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "render_repository.py"), "--deployment",
                    "configs/pixart-sigma-1024.toml", "--out", str(out)], check=True)
    dit = (out / "dit" / "config.pbtxt").read_text()
    assert "max_batch_size: 8" in dit and "max_candidate_sequences: 8" in dit
    assert "count: 8" in (out / "txt2img" / "config.pbtxt").read_text()

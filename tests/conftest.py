"""Fixtures: one real tritonserver per test session, on free ports, default deployment."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "backends"))
sys.path.insert(0, str(ROOT))   # frontend/, a client of the server
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from ditserve.launcher import ServerOptions, TritonServer, free_ports  # noqa: E402

TINY_PIXART = ROOT / "models" / "tiny-pixart-sigma"
TINY_WAN = ROOT / "models" / "tiny-wan-t2v"
WAN_DEPLOYMENT = ROOT / "configs" / "tiny-wan-t2v.toml"
TINY_WAN_I2V = ROOT / "models" / "tiny-wan-i2v"
I2V_DEPLOYMENT = ROOT / "configs" / "tiny-wan-i2v.toml"
TINY_SHAPES = ROOT / "models" / "tiny-pixart-shapes"  # trained, committed (docs/tiny-model.md)
SHAPES_DEPLOYMENT = ROOT / "configs" / "tiny-pixart-shapes.toml"
TINY_FLUX = ROOT / "models" / "tiny-flux"
FLUX_DEPLOYMENT = ROOT / "configs" / "tiny-flux.toml"
TINY_SD3 = ROOT / "models" / "tiny-sd3"
SD3_DEPLOYMENT = ROOT / "configs" / "tiny-sd3.toml"
TINY_WAN22 = ROOT / "models" / "tiny-wan22"
WAN22_DEPLOYMENT = ROOT / "configs" / "tiny-wan22.toml"
TINY_QWEN = ROOT / "models" / "tiny-qwen-image"
QWEN_DEPLOYMENT = ROOT / "configs" / "tiny-qwen-image.toml"



def start_server(tmp_dir: Path, name: str, **options) -> TritonServer:
    http, grpc, metrics = free_ports(3)
    server = TritonServer(ServerOptions(http_port=http, grpc_port=grpc, metrics_port=metrics, **options),
                          log_path=tmp_dir / f"{name}.log")
    server.start()
    try:
        server.wait_ready(timeout_s=300)
    except Exception:
        server.stop()
        raise
    return server


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    if not TINY_PIXART.exists():
        pytest.fail(f"{TINY_PIXART} is missing: run `bash scripts/setup.sh` (it builds the tiny pipelines)")
    srv = start_server(tmp_path_factory.mktemp("triton"), "server")
    yield srv
    srv.stop()


def render_repository(deployment: Path, out: Path) -> Path:
    subprocess.run([sys.executable, str(ROOT / "scripts" / "render_repository.py"), "--deployment", str(deployment),
                    "--out", str(out)], check=True, capture_output=True)
    return out


def rendered_server(tmp_path_factory, deployment: Path, model: Path, name: str):
    """A real server on the repository rendered for `deployment` (a tiny pipeline at `model`)."""
    if not model.exists():
        pytest.fail(f"{model} is missing: run `bash scripts/setup.sh` (it builds the tiny pipelines)")
    tmp = tmp_path_factory.mktemp(name)
    repo = render_repository(deployment, tmp / "repo")
    return start_server(tmp, name, model_repository=repo, deployment=str(deployment))


@pytest.fixture(scope="session")
def perf_analyzer() -> str:
    """perf_analyzer installed (cached after the first run); skip only when it cannot be fetched."""
    unavailable = 75   # perf/install_perf_analyzer.sh: no network to fetch perf_analyzer
    proc = subprocess.run(["bash", str(ROOT / "perf" / "install_perf_analyzer.sh")], capture_output=True, text=True)
    if proc.returncode == unavailable:
        pytest.skip("perf_analyzer cannot be installed here (no network to the package index or apt): "
                    + proc.stderr.strip().splitlines()[-1])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def wan_server(tmp_path_factory):
    """A second real server, for the tiny Wan2.1 T2V deployment (txt2vid / txt2vid_stream)."""
    srv = rendered_server(tmp_path_factory, WAN_DEPLOYMENT, TINY_WAN, "wan-server")
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def i2v_server(tmp_path_factory):
    """A third real server, for the tiny Wan2.1 I2V deployment (img2vid / img2vid_stream, vae_encode)."""
    srv = rendered_server(tmp_path_factory, I2V_DEPLOYMENT, TINY_WAN_I2V, "i2v-server")
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def flux_server(tmp_path_factory):
    """A real server for the tiny FLUX.1 deployment (txt2img / txt2img_stream)."""
    srv = rendered_server(tmp_path_factory, FLUX_DEPLOYMENT, TINY_FLUX, "flux-server")
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def sd3_server(tmp_path_factory):
    """A real server for the tiny Stable Diffusion 3.5 deployment (txt2img / txt2img_stream)."""
    srv = rendered_server(tmp_path_factory, SD3_DEPLOYMENT, TINY_SD3, "sd3-server")
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def wan22_server(tmp_path_factory):
    """A real server for the tiny Wan2.2 A14B deployment (two experts; txt2vid / txt2vid_stream)."""
    srv = rendered_server(tmp_path_factory, WAN22_DEPLOYMENT, TINY_WAN22, "wan22-server")
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def qwen_server(tmp_path_factory):
    """A real server for the tiny Qwen-Image deployment (txt2img / txt2img_stream)."""
    srv = rendered_server(tmp_path_factory, QWEN_DEPLOYMENT, TINY_QWEN, "qwen-server")
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def diffusers_wan():
    """The video oracle: plain diffusers WanPipeline on the same tiny checkpoint."""
    from diffusers import WanPipeline

    return WanPipeline.from_pretrained(str(TINY_WAN))


def diffusers_video(pipe, prompt: str, seed: int, steps: int, guidance: float, num_frames: int, height: int = 64,
                    width: int = 64, negative_prompt: str = "", **pipeline_kwargs) -> np.ndarray:
    """uint8 [F, H, W, 3] from diffusers, rounded as for images; `pipeline_kwargs` go to the call
    as they are (Wan2.2 A14B: guidance_scale_2)."""
    import torch

    frames = pipe(prompt, negative_prompt=negative_prompt, height=height, width=width, num_frames=num_frames,
                  num_inference_steps=steps, guidance_scale=guidance,
                  generator=torch.Generator("cpu").manual_seed(seed), output_type="np", **pipeline_kwargs).frames
    return (frames[0] * 255).round().astype(np.uint8)


@pytest.fixture(scope="session")
def diffusers_pixart():
    """The oracle: plain diffusers PixArtSigmaPipeline on the same tiny checkpoint."""
    from diffusers import PixArtSigmaPipeline

    return PixArtSigmaPipeline.from_pretrained(str(TINY_PIXART))


def diffusers_image(pipe, prompt: str, seed: int, steps: int, guidance: float, height: int = 64, width: int = 64,
                    negative_prompt: str = "") -> np.ndarray:
    """uint8 [H, W, 3] from diffusers, rounded the way its PIL output is."""
    import torch

    images = pipe(prompt, negative_prompt=negative_prompt, height=height, width=width, num_inference_steps=steps,
                  guidance_scale=guidance, generator=torch.Generator("cpu").manual_seed(seed),
                  use_resolution_binning=False, clean_caption=False, output_type="np").images
    return (images[0] * 255).round().astype(np.uint8)

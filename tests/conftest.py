"""Fixtures: real tritonservers on free ports, one per deployment the session needs, shared by
every module that serves it (`shared_server`); the diffusers oracles."""
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

from ditserve.launcher import ServerOptions, TritonServer, free_ports, stop_servers_on_signals  # noqa: E402

TINY_PIXART = ROOT / "models" / "tiny-pixart-sigma"
TINY_WAN = ROOT / "models" / "tiny-wan-t2v"
WAN_DEPLOYMENT = ROOT / "configs" / "tiny-wan-t2v.toml"
TINY_WAN_I2V = ROOT / "models" / "tiny-wan-i2v"
I2V_DEPLOYMENT = ROOT / "configs" / "tiny-wan-i2v.toml"
TINY_SHAPES = ROOT / "models" / "tiny-pixart-shapes"  # trained, committed (docs/tiny-model.md)
SHAPES_DEPLOYMENT = ROOT / "configs" / "tiny-pixart-shapes.toml"
TINY_WAN_SHAPES = ROOT / "models" / "tiny-wan-shapes"  # trained, committed (docs/tiny-model.md)
WAN_SHAPES_DEPLOYMENT = ROOT / "configs" / "tiny-wan-shapes.toml"
TINY_FLUX = ROOT / "models" / "tiny-flux"
FLUX_DEPLOYMENT = ROOT / "configs" / "tiny-flux.toml"
TINY_SD3 = ROOT / "models" / "tiny-sd3"
SD3_DEPLOYMENT = ROOT / "configs" / "tiny-sd3.toml"
TINY_WAN22 = ROOT / "models" / "tiny-wan22"
WAN22_DEPLOYMENT = ROOT / "configs" / "tiny-wan22.toml"
TINY_QWEN = ROOT / "models" / "tiny-qwen-image"
QWEN_DEPLOYMENT = ROOT / "configs" / "tiny-qwen-image.toml"


def pytest_configure(config) -> None:
    # The servers run in their own sessions: a SIGTERM or SIGINT to pytest must stop them too,
    # or a killed run leaves them (and ~2 GB of stubs each) behind.
    stop_servers_on_signals()


def pytest_collection_modifyitems(config, items) -> None:
    """`@pytest.mark.gpu` tests skip where torch sees no CUDA device (CI); on the GPU machine
    `perf/gpu_recipe.sh gputests` runs them (`-m gpu`)."""
    import torch
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (perf/gpu_recipe.sh gputests runs it there)")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


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


def render_repository(deployment: Path, out: Path) -> Path:
    subprocess.run([sys.executable, str(ROOT / "scripts" / "render_repository.py"), "--deployment", str(deployment),
                    "--out", str(out)], check=True, capture_output=True)
    return out


def rendered_server(tmp_path_factory, deployment: Path | None, model: Path, name: str, **options) -> TritonServer:
    """A real server on the repository rendered for `deployment` (a tiny pipeline at `model`);
    `deployment=None` serves the committed model_repository/ (the default deployment)."""
    if not model.exists():
        pytest.fail(f"{model} is missing: run `bash scripts/setup.sh` (it builds the tiny pipelines)")
    tmp = tmp_path_factory.mktemp(name)
    if deployment is None:
        return start_server(tmp, name, **options)
    repo = render_repository(deployment, tmp / "repo")
    return start_server(tmp, name, model_repository=repo, deployment=str(deployment), **options)


# Stopping a tiny server takes ~10 s of mostly waiting (Triton polls its models once a second
# and takes the stubs down one by one), so fixtures stop theirs in the background: SIGINT when
# the last test is done with it, reaped when the session ends (pytest_sessionfinish).
_STOPPING: list[TritonServer] = []


def stop_later(srv: TritonServer) -> None:
    if srv not in _STOPPING:
        srv.request_stop()
        _STOPPING.append(srv)


def serve(srv: TritonServer):
    """A fixture's body: yield `srv` to its tests, then stop it in the background."""
    try:
        yield srv
    finally:
        stop_later(srv)


def pytest_sessionfinish(session, exitstatus) -> None:
    for srv in _STOPPING:
        srv.stop()


# Session servers, each stopped right after the last test that uses it (pytest_runtest_teardown):
# modules that serve the same deployment share one start-up, and a server no later test needs
# does not keep its stub processes (~2 GB for 11 stubs) for the rest of the session.
_SHARED: dict[str, TritonServer] = {}   # fixture name -> its running server
_LAST_USER: dict[str, str] = {}         # fixture name -> node id of the last test that uses it


def shared_server(deployment: Path | None, model: Path, doc: str):
    """A session fixture serving `deployment` (see rendered_server); its name is the attribute's."""
    def fixture(request, tmp_path_factory):
        srv = rendered_server(tmp_path_factory, deployment, model, request.fixturename)
        _SHARED[request.fixturename] = srv
        yield from serve(srv)

    fixture.__doc__ = doc
    return pytest.fixture(scope="session")(fixture)


def pytest_collection_finish(session) -> None:
    for item in session.items:   # final order, after any reordering plugin
        for name in getattr(item, "fixturenames", ()):
            _LAST_USER[name] = item.nodeid


def pytest_runtest_setup(item) -> None:
    """A test whose shared server has died (tritonserver itself can crash: docs/reliability.md,
    "Known crash of Triton 2.51 under client cancels") errors at once with that server's log tail,
    instead of failing later on a refused connection."""
    for name in getattr(item, "fixturenames", ()):
        srv = _SHARED.get(name)
        if srv is not None and srv.process.poll() is not None:
            pytest.fail(f"the session server `{name}` exited with code {srv.process.returncode} during an earlier "
                        f"test; its log ends:\n{srv.log_tail(40)}", pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    result = yield
    for name in [name for name in _SHARED if _LAST_USER.get(name) == item.nodeid]:
        stop_later(_SHARED.pop(name))
    return result


server = shared_server(None, TINY_PIXART, "The default deployment, as committed in model_repository/.")
soak_server = shared_server(None, TINY_PIXART, "The default deployment on a server of its own, for tests/test_soak.py: "
                            "its client cancels can crash Triton 2.51 (docs/reliability.md, Soak), which must not "
                            "take the session's other tests down with it.")
wan_server = shared_server(WAN_DEPLOYMENT, TINY_WAN, "Tiny Wan2.1 T2V (txt2vid / txt2vid_stream).")
i2v_server = shared_server(I2V_DEPLOYMENT, TINY_WAN_I2V, "Tiny Wan2.1 I2V (img2vid / img2vid_stream, vae_encode).")
flux_server = shared_server(FLUX_DEPLOYMENT, TINY_FLUX, "Tiny FLUX.1 (txt2img / txt2img_stream).")
sd3_server = shared_server(SD3_DEPLOYMENT, TINY_SD3, "Tiny Stable Diffusion 3.5 (txt2img / txt2img_stream).")
wan22_server = shared_server(WAN22_DEPLOYMENT, TINY_WAN22, "Tiny Wan2.2 A14B, two experts (txt2vid / txt2vid_stream).")
qwen_server = shared_server(QWEN_DEPLOYMENT, TINY_QWEN, "Tiny Qwen-Image (txt2img / txt2img_stream).")
shapes_server = shared_server(SHAPES_DEPLOYMENT, TINY_SHAPES,
                              "The trained tiny PixArt-Sigma with cache tiers (scripts/web.sh serves it).")
wan_shapes_server = shared_server(WAN_SHAPES_DEPLOYMENT, TINY_WAN_SHAPES,
                                  "The trained tiny Wan2.1 T2V (gliding shapes) with cache tiers.")


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
def diffusers_shapes():
    """The oracle for shapes_server: plain diffusers PixArtSigmaPipeline on the trained weights."""
    from diffusers import PixArtSigmaPipeline

    return PixArtSigmaPipeline.from_pretrained(str(TINY_SHAPES))


@pytest.fixture(scope="session")
def diffusers_wan():
    """The video oracle: plain diffusers WanPipeline on the same tiny checkpoint."""
    from diffusers import WanPipeline

    return WanPipeline.from_pretrained(str(TINY_WAN))


@pytest.fixture(scope="session")
def diffusers_wan_shapes():
    """The oracle for wan_shapes_server: plain diffusers WanPipeline on the trained weights."""
    from diffusers import WanPipeline

    return WanPipeline.from_pretrained(str(TINY_WAN_SHAPES))


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

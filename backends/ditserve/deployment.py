"""Deployment config: which checkpoint, dtype, device, defaults, limits and engine mode.

One TOML file per deployment under `configs/`. The model repository names none: every
stage reads `DITSERVE_DEPLOYMENT` (set by `scripts/serve.py`) or falls back to the
`deployment` parameter of its config.pbtxt, so switching checkpoints never edits code.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path

from .faults import FaultRule, parse_rules

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (the Triton 24.10 container)
    import tomli as tomllib

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DEPLOYMENT = "configs/tiny-pixart-sigma.toml"
ENGINE_MODES = ("serial", "request_batch", "step")
# The task each model family serves; it names the public models (`<task>`, `<task>_stream`).
FAMILY_TASKS = {"pixart-sigma": "txt2img", "wan-t2v": "txt2vid", "wan-i2v": "img2vid"}
VIDEO_TASKS = ("txt2vid", "img2vid")
# Per-request conditioning tensors a task passes from `vae_encode` to `dit` (name, rank of
# one request's tensor, batch 1 included): the media contract of image-conditioned tasks.
TASK_CONDITIONING = {"img2vid": (("image_embeds", 3), ("condition", 5))}


@dataclass(frozen=True)
class ModelSection:
    family: str
    path: str
    dtype: str = "float32"
    device: str = "auto"
    max_sequence_length: int = 300


@dataclass(frozen=True)
class Defaults:
    height: int = 1024
    width: int = 1024
    num_inference_steps: int = 20
    guidance_scale: float = 4.5
    negative_prompt: str = ""
    num_frames: int = 1          # video tasks only
    fps: int = 16                # video tasks only: frame rate written into MP4 output


@dataclass(frozen=True)
class Limits:
    size_multiple: int = 16
    min_size: int = 256
    max_size: int = 2048
    max_steps: int = 100
    max_guidance_scale: float = 30.0
    max_prompt_bytes: int = 8192
    # Video tasks only: num_frames in [min_frames, max_frames] with (num_frames - 1) a
    # multiple of frames_step (the VAE's temporal compression; checked against the model).
    min_frames: int = 1
    max_frames: int = 1
    frames_step: int = 4
    max_fps: int = 120
    max_image_side: int = 4096  # img2vid only: the conditioning image, before it is resized


@dataclass(frozen=True)
class EngineSection:
    mode: str = "step"
    capacity: int = 1
    # A state whose request has not come back for this long is released (its request
    # was lost, e.g. cancelled while queued for rescheduling).
    gc_idle_seconds: float = 300.0
    # Public models watch the stubs they call so a dead stub fails requests instead of
    # hanging them (stages/liveness.py): "on", "off", or "auto" = on unless the model is on a GPU.
    watch_stubs: str = "auto"
    # vae_decode hands the decoded media to the public model on the host (true) or on the
    # GPU (false). Host is the default: in Triton 2.51's Python backend a GPU tensor crossing
    # stubs while decoupled BLS responses flow can hang the stubs for good (seen on the H200;
    # the CUDA-pool handshake deadlock fixed upstream in python_backend PR #439). A client's
    # CUDA shm region is still filled on the server; false is for newer Tritons (docs/compatibility.md).
    media_on_host: bool = True


@dataclass(frozen=True)
class Faults:
    """Fault injection for reliability tests (see ditserve/faults.py). Empty = off, the default.

    Only this server-side file enables faults; no request input can.
    """

    rules: tuple[FaultRule, ...] = ()


@dataclass(frozen=True)
class Deployment:
    model: ModelSection
    defaults: Defaults = field(default_factory=Defaults)
    limits: Limits = field(default_factory=Limits)
    engine: EngineSection = field(default_factory=EngineSection)
    faults: Faults = field(default_factory=Faults)
    source: str = ""

    @property
    def task(self) -> str:
        return FAMILY_TASKS[self.model.family]

    @property
    def is_video(self) -> bool:
        return self.task in VIDEO_TASKS

    def model_location(self) -> str:
        """A local folder (resolved against the repo root) when it exists, else a hub id."""
        local = Path(self.model.path)
        if not local.is_absolute():
            local = REPO_ROOT / local
        return str(local) if local.exists() else self.model.path


def _section(cls, data: dict, name: str):
    known = {f.name for f in fields(cls)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"deployment [{name}] has unknown keys {sorted(unknown)}; allowed: {sorted(known)}")
    return cls(**data)


def load_deployment(path: str | os.PathLike | None = None) -> Deployment:
    """Load and check a deployment file; `path=None` uses $DITSERVE_DEPLOYMENT or the default."""
    path = Path(path or os.environ.get("DITSERVE_DEPLOYMENT") or DEFAULT_DEPLOYMENT)
    if not path.is_absolute():
        path = REPO_ROOT / path
    if not path.exists():
        raise FileNotFoundError(f"deployment config {path} not found; pick one under {REPO_ROOT / 'configs'}")
    data = tomllib.loads(path.read_text())
    unknown = set(data) - {"model", "defaults", "limits", "engine", "faults"}
    if unknown:
        raise ValueError(f"deployment {path} has unknown sections {sorted(unknown)}")
    if "model" not in data:
        raise ValueError(f"deployment {path} lacks a [model] section")
    dep = Deployment(
        model=_section(ModelSection, data["model"], "model"),
        defaults=_section(Defaults, data.get("defaults", {}), "defaults"),
        limits=_section(Limits, data.get("limits", {}), "limits"),
        engine=_section(EngineSection, data.get("engine", {}), "engine"),
        faults=Faults(parse_rules(data.get("faults", {}))),
        source=str(path),
    )
    if dep.model.family not in FAMILY_TASKS:
        raise ValueError(f"deployment [model] family={dep.model.family!r} is unknown; known: {sorted(FAMILY_TASKS)}")
    if dep.engine.mode not in ENGINE_MODES:
        raise ValueError(f"deployment [engine] mode={dep.engine.mode!r}; allowed: {ENGINE_MODES}")
    if dep.engine.watch_stubs not in ("auto", "on", "off"):
        raise ValueError(f"deployment [engine] watch_stubs={dep.engine.watch_stubs!r}; allowed: auto, on, off")
    if dep.engine.mode == "serial" and dep.engine.capacity != 1:
        raise ValueError(f"deployment [engine] mode=\"serial\" needs capacity = 1, got {dep.engine.capacity}")
    if dep.engine.capacity < 1:
        raise ValueError(f"deployment [engine] capacity={dep.engine.capacity}; must be >= 1")
    return dep


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def _is_table_array(v) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def dump_toml(data: dict) -> str:
    """Tables of scalars and lists, and arrays of tables (`[[faults.rules]]`): what a
    deployment holds."""
    lines = [f"{k} = {_toml_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for name, table in data.items():
        if isinstance(table, dict):
            lines += ["", f"[{name}]"] + [f"{k} = {_toml_value(v)}" for k, v in table.items()
                                          if not _is_table_array(v)]
            for key, rows in ((k, v) for k, v in table.items() if _is_table_array(v)):
                for row in rows:
                    lines += ["", f"[[{name}.{key}]]"] + [f"{k} = {_toml_value(v)}" for k, v in row.items()]
    return "\n".join(lines).lstrip() + "\n"


def write_variant(base: Path, out: Path, engine: dict, writer: str) -> Deployment:
    """Write `base` with the given [engine] keys replaced to `out` (perf tools serve such
    variants side by side); returns it loaded, so anything the server would reject fails here."""
    data = tomllib.loads(Path(base).read_text())
    data["engine"] = {**data.get("engine", {}), **engine}
    out.write_text(f"# variant of {base} with [engine] {engine} (written by {writer})\n" + dump_toml(data))
    return load_deployment(out)

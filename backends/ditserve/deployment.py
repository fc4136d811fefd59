"""Deployment config: which checkpoint, dtype, device, defaults, limits and engine mode.

One TOML file per deployment under `configs/`; switching checkpoints never edits code. Which
one a model serves (stages/common.stage_deployment): a model of a named pipeline (a repository
rendered for several deployments) always serves the deployment its config.pbtxt names, and
ignores `DITSERVE_DEPLOYMENT`. In a single-deployment repository, the `deployment` parameter
that scripts/render_repository.py writes into every config.pbtxt (for every deployment but the
default) comes first, and `DITSERVE_DEPLOYMENT` (set by `scripts/serve.py`) must then name the
same file or the model fails to load; a repository without the parameter (the committed one)
serves `DITSERVE_DEPLOYMENT`, else the default deployment.
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
SCHEDULERS = ("all", "cost")   # [engine] scheduler, step mode: ditserve/scheduler.py
# The task each model family serves; it names the public models (`<task>`, `<task>_stream`).
FAMILY_TASKS = {"pixart-sigma": "txt2img", "wan-t2v": "txt2vid", "wan-i2v": "img2vid", "flux": "txt2img",
                "sd3": "txt2img", "wan22-t2v": "txt2vid", "qwen-image": "txt2img",
                "wan22-ti2v": "txt2vid"}
# Families whose `guidance_scale` is not classifier-free guidance: FLUX.1 is guidance-distilled
# (dev feeds it to the transformer's guidance embedding, schnell takes none). They run one row
# per request and have no negative prompt.
FAMILIES_WITHOUT_CFG = frozenset({"flux"})
# Per-row text conditioning a family's text encoders make beside `embeds` and `mask` (name,
# rank of one generation's tensor [rows, ...]): text_encoder outputs it, dit takes it in
# TextConditioning.extra. FLUX.1 and SD3: the pooled CLIP embedding next to the T5 sequence.
FAMILY_TEXT_CONDITIONING = {"flux": (("pooled_embeds", 2),), "sd3": (("pooled_embeds", 2),)}
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
    min_steps: int = 1           # Qwen-Image: 2 (its schedule stretched to a terminal sigma is NaN for 1 step)
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
    # Generations the public models hold at once (their instance count; 0 = capacity). Past
    # capacity, the extra ones wait in dit's sequence backlog, encoded, and take a slot the
    # moment one frees, so dit stays full while other generations encode or decode (H200, 1024px,
    # capacity 8: 6.2 of 8 slots busy on average with in_flight = capacity, 2026-12-02).
    in_flight: int = 0
    # Step mode: dit runs up to this many denoise steps in one execute while nothing would change
    # the batch (every generation in dit stepped, none finished, failed or was cancelled, and no
    # new one waits for a free slot), instead of returning to Triton's sequence batcher after every
    # step. Progress still goes out at every step and cancels are read at every step; what it
    # saves is the round trip through Triton per step. 1 = one step per execute.
    steps_per_execute: int = 8
    # Instances per device of text_encoder and vae_decode; 0 = from capacity (one per 8 requests of
    # it: scripts/render_repository.py stage_sizing). On one GPU each instance is a CUDA context of
    # its own that time-slices the GPU with dit's (and a second T5 copy: ~9.5 GB for PixArt-Sigma).
    stage_instances: int = 0
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
    # Which ready generations step in each execute (ditserve/scheduler.py): "all" = every one
    # (processor sharing), "cost" = the subset a learned forward-cost curve says pays, fewest
    # remaining steps first; step mode only. Its knobs: the subset keeps at least
    # `throughput_floor` of the best throughput on the curve, or less when the arrivals need
    # less (they would keep the GPU `target_utilisation` busy at it); `cost_ewma` weighs a faster
    # forward timing (a slower one gets a tenth of it); a request in dit for over
    # `max_slowdown` x its estimated time alone goes ahead of every request that is not
    # (oldest first).
    scheduler: str = "all"
    throughput_floor: float = 0.95
    cost_ewma: float = 0.3
    max_slowdown: float = 2.0
    target_utilisation: float = 0.8
    # Step mode with scheduler "cost", on a GPU: 0 = dit queues each step as soon as the one before
    # starts; > 0 = it holds the next step back until this many ms (plus its own measured time to
    # queue one) before the running step's predicted end, so that a generation handed over
    # meanwhile joins it instead of waiting behind it (ditserve/late_queue.py).
    late_queue_ms: float = 0.0
    # Step mode on a GPU: a newcomer's first step that runs in a forward holding no running
    # request (another size, or split off by the `cost` scheduler where batching it would save no
    # time) runs at once, on a CUDA stream of the highest priority beside the step the GPU is
    # running, instead of after it (engine.StepEngine.overtake). Transformer eager or eager_graphs.
    overtake: bool = False

    @property
    def generations(self) -> int:
        """Generations in flight per dit instance: the public models' instance count (per GPU)."""
        return self.in_flight or self.capacity


TRANSFORMER_ACCEL = ("eager", "compile", "cuda_graphs", "eager_graphs")
STAGE_ACCEL = ("eager", "compile")
TEXT_ENCODER_ACCEL = ("eager", "compile", "cuda_graphs")
SCHEDULER_STEP_ACCEL = ("batched", "per_request")
ATTENTION_ACCEL = ("default", "cudnn")


def doublings(first: int, upto: int) -> tuple[int, ...]:
    """first, 2 x first, 4 x first, ... up to the first value >= `upto` (row buckets)."""
    out = [first]
    while out[-1] < upto:
        out.append(out[-1] * 2)
    return tuple(out)


@dataclass(frozen=True)
class AccelSection:
    """How the forwards run (ditserve/accel.py). All off by default: eager PyTorch, as diffusers.

    transformer  eager | compile (torch.compile) | cuda_graphs (torch.compile, then one CUDA
                 graph captured per row bucket and warm shape; GPU only: compile alone on CPU) |
                 eager_graphs (diffusers' eager forward captured per row bucket and warm shape,
                 no compile: loads in seconds; on CPU the same buckets run eager)
    row_buckets  a step batch of n rows (CFG: 2 per request) runs padded to the smallest bucket
                 >= n, so the compiled forward meets few shapes; empty = powers of two from 2
                 up to 2 x [engine] capacity (a lone row pads to 2: one compile then serves all)
    warm_sizes   the shapes compiled and captured while the model loads, before Triton reports
                 READY: "HxW" (images) or "FxHxW" (videos). Other sizes run eager: never a
                 compile on the request path
    compile_backend  torch.compile's backend: inductor on GPUs; aot_eager / eager trace the same
                 path on CPU in seconds (the CPU tests use them)
    compile_cache    inductor's cache directory (keep it on a volume: restarts then skip most
                 of the compile); "" = torch's default under /tmp
    vae_decode, text_encoder  eager | compile, for those stages' forwards (warmed for warm_sizes);
                 text_encoder also cuda_graphs (T5 / UMT5 encoders: the eager forward replayed from
                 CUDA graphs per row bucket and token length, captured at load in seconds)
    fp8          the linear layers of the transformer's blocks in FP8 e4m3 (ditserve/fp8.py: per-row
                 weight and dynamic activation scales, torch._scaled_mm); needs FP8 tensor cores on a GPU
    scheduler_step  batched (default): a step batch's scheduler steps run as one set of tensor
                 ops where ditserve/batched_step.py covers the scheduler (bit-identical to
                 diffusers' per-request `step` on CPU); per_request: each request's own
                 `scheduler.step`, as before (the control for measuring it)
    attention    default: torch's own choice of scaled-dot-product-attention kernel (flash first);
                 cudnn: cuDNN's fused attention first in dit's process (1.29x the PixArt forward
                 at 1024px on the H200), the others behind it for calls cuDNN cannot take
    """

    transformer: str = "eager"
    row_buckets: tuple[int, ...] = ()
    warm_sizes: tuple[str, ...] = ()
    compile_backend: str = "inductor"
    compile_cache: str = ""
    vae_decode: str = "eager"
    text_encoder: str = "eager"
    fp8: bool = False
    scheduler_step: str = "batched"
    attention: str = "default"

    def buckets(self, capacity: int) -> tuple[int, ...]:
        """Row buckets, ascending; the default covers a full batch with CFG (2 x capacity rows)."""
        if self.row_buckets:
            return tuple(sorted(self.row_buckets))
        return doublings(2, 2 * capacity)   # a lone row runs as 2: dynamo compiles a batch of 1 apart from all others

    def sizes(self, video: bool) -> list[tuple[int, int, int]]:
        """warm_sizes as (frames, height, width); frames = 1 for images."""
        parsed = []
        for text in self.warm_sizes:
            parts = text.lower().split("x")
            if len(parts) != (3 if video else 2) or not all(p.isdigit() and int(p) > 0 for p in parts):
                form = "FxHxW (frames x height x width), e.g. \"81x480x832\"" if video else "HxW, e.g. \"512x512\""
                raise ValueError(f"deployment [accel] warm_sizes entry {text!r} is not {form}")
            values = [int(p) for p in parts]
            parsed.append(tuple(values) if video else (1, *values))
        return parsed


LOSSLESS = "lossless"


@dataclass(frozen=True)
class CacheSection:
    """Per-request quality tiers (ditserve/cache.py): First-Block Cache thresholds, per family.

    tiers    tier name -> threshold on the first block's relative L1 change between a
             request's steps; below it the request reuses its cached residual of the other
             blocks. Higher = more reuse, more loss. Calibrated per model (docs/cache.md)
    enabled  the tiers requests may ask for (input `quality`); empty = every tier listed.
             `lossless` (every block, every step) is always allowed and is the default
    back_blocks  the last N blocks run for every row at every step (cache-dit's DBCache "Bn"): a
             reused step skips only the blocks between the first and these; more quality for
             N blocks' work per reused step (docs/cache.md)
    front_blocks  the first N blocks run for every row and their residual decides (DBCache "Fn",
             default 1): a steadier decision for N - 1 more blocks' work per reused step
    """

    tiers: dict = field(default_factory=dict)
    enabled: tuple[str, ...] = ()
    back_blocks: int = 0
    front_blocks: int = 1

    @property
    def allowed(self) -> tuple[str, ...]:
        """The values of input `quality` this deployment accepts, `lossless` first."""
        return (LOSSLESS, *(self.enabled or tuple(self.tiers)))

    def threshold(self, quality: str) -> float | None:
        """The tier's threshold; None for `lossless` (no cache state at all)."""
        return None if quality == LOSSLESS else float(self.tiers[quality])


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
    accel: AccelSection = field(default_factory=AccelSection)
    cache: CacheSection = field(default_factory=CacheSection)
    faults: Faults = field(default_factory=Faults)
    source: str = ""

    @property
    def task(self) -> str:
        return FAMILY_TASKS[self.model.family]

    @property
    def is_video(self) -> bool:
        return self.task in VIDEO_TASKS

    @property
    def uses_cfg(self) -> bool:
        """Whether guidance_scale > 1 means classifier-free guidance (a negative row per request)."""
        return self.model.family not in FAMILIES_WITHOUT_CFG

    @property
    def conditioning(self) -> tuple[tuple[str, int], ...]:
        """(name, rank) of every per-generation tensor dit takes beside `embeds` and `mask`:
        the family's text conditioning, then the task's (from vae_encode)."""
        return FAMILY_TEXT_CONDITIONING.get(self.model.family, ()) + TASK_CONDITIONING.get(self.task, ())

    def model_location(self) -> str:
        """A local folder (resolved against the repo root) when it exists, else a hub id."""
        local = Path(self.model.path)
        if not local.is_absolute():
            local = REPO_ROOT / local
        return str(local) if local.exists() else self.model.path


def parse_accel_overrides(items: list[str]) -> dict:
    """`KEY=VALUE` strings, as the perf tools take them on the command line, as [accel] keys:
    `row_buckets=2,8,16` and `warm_sizes=512x512,1024x1024` are lists, true / false booleans,
    the rest strings (write_variant checks them all, as a load would)."""
    lists = {"row_buckets": int, "warm_sizes": str}
    out: dict = {}
    for item in items:
        key, _, value = item.partition("=")
        if key in lists:
            out[key] = [lists[key](v) for v in value.split(",") if v]
        else:
            out[key] = {"true": True, "false": False}.get(value, value)
    return out


def _section(cls, data: dict, name: str):
    """A section's dataclass; TOML lists become tuples (the sections are frozen)."""
    known = {f.name for f in fields(cls)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"deployment [{name}] has unknown keys {sorted(unknown)}; allowed: {sorted(known)}")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


def load_deployment(path: str | os.PathLike | None = None) -> Deployment:
    """Load and check a deployment file; `path=None` uses $DITSERVE_DEPLOYMENT or the default."""
    path = Path(path or os.environ.get("DITSERVE_DEPLOYMENT") or DEFAULT_DEPLOYMENT)
    if not path.is_absolute():
        path = REPO_ROOT / path
    if not path.exists():
        raise FileNotFoundError(f"deployment config {path} not found; pick one under {REPO_ROOT / 'configs'}")
    data = tomllib.loads(path.read_text())
    unknown = set(data) - {"model", "defaults", "limits", "engine", "accel", "cache", "faults"}
    if unknown:
        raise ValueError(f"deployment {path} has unknown sections {sorted(unknown)}")
    if "model" not in data:
        raise ValueError(f"deployment {path} lacks a [model] section")
    dep = Deployment(
        model=_section(ModelSection, data["model"], "model"),
        defaults=_section(Defaults, data.get("defaults", {}), "defaults"),
        limits=_section(Limits, data.get("limits", {}), "limits"),
        engine=_section(EngineSection, data.get("engine", {}), "engine"),
        accel=_section(AccelSection, data.get("accel", {}), "accel"),
        cache=_section(CacheSection, data.get("cache", {}), "cache"),
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
    in_flight = dep.engine.in_flight
    if not _integer(in_flight) or (in_flight and in_flight < dep.engine.capacity):
        raise ValueError(f"deployment [engine] in_flight={in_flight!r}; allowed: 0 (= capacity) or an integer >= "
                         f"capacity ({dep.engine.capacity})")
    steps = dep.engine.steps_per_execute
    if not _integer(steps) or steps < 1:
        raise ValueError(f"deployment [engine] steps_per_execute={steps!r}; allowed: an integer >= 1 (1 = return "
                         "to Triton after every step)")
    count = dep.engine.stage_instances
    if not _integer(count) or count < 0:
        raise ValueError(f"deployment [engine] stage_instances={count!r}; allowed: 0 (from capacity) or an integer "
                         ">= 1 (instances per device of text_encoder and vae_decode)")
    _check_scheduler(dep.engine)
    _check_accel(dep)
    _check_cache(dep.cache)
    return dep


def _integer(value) -> bool:
    """An int as TOML gives one: `true` is a bool to TOML, though Python counts bools as ints."""
    return isinstance(value, int) and not isinstance(value, bool)


def _check_scheduler(engine: EngineSection) -> None:
    if engine.scheduler not in SCHEDULERS:
        raise ValueError(f"deployment [engine] scheduler={engine.scheduler!r}; allowed: {', '.join(SCHEDULERS)}")
    if engine.scheduler != "all" and engine.mode != "step":
        raise ValueError(f"deployment [engine] scheduler={engine.scheduler!r} needs mode = \"step\", "
                         f"got mode={engine.mode!r}")
    for name in ("throughput_floor", "cost_ewma", "target_utilisation"):
        value = getattr(engine, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
            raise ValueError(f"deployment [engine] {name}={value!r}; allowed: a number in (0, 1]")
    value = engine.max_slowdown
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 1:
        raise ValueError(f"deployment [engine] max_slowdown={value!r}; allowed: a number >= 1")
    value = engine.late_queue_ms
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"deployment [engine] late_queue_ms={value!r}; allowed: a number of milliseconds >= 0 "
                         "(0 = queue each step as soon as the one before starts)")
    if value and engine.scheduler != "cost":
        raise ValueError(f"deployment [engine] late_queue_ms={value!r} needs scheduler = \"cost\" (its cost curve "
                         f"predicts when a step ends), got scheduler={engine.scheduler!r}")
    if not isinstance(engine.overtake, bool):
        raise ValueError(f"deployment [engine] overtake={engine.overtake!r}; allowed: true or false")
    if engine.overtake and engine.mode != "step":
        raise ValueError(f"deployment [engine] overtake = true needs mode = \"step\" (a first step overtakes the "
                         f"running step), got mode={engine.mode!r}")


def _check_cache(cache: CacheSection) -> None:
    """[cache] tiers are names with positive thresholds; `enabled` names only listed tiers;
    `back_blocks` is an integer >= 0 and `front_blocks` one >= 1 (their upper bound, the model's
    block count, is checked by the adapter at load)."""
    if not isinstance(cache.tiers, dict):
        raise ValueError(f"deployment [cache] tiers={cache.tiers!r}; allowed: a table such as "
                         "{ balanced = 0.05, fast = 0.1 }")
    for name, value in cache.tiers.items():
        if name == LOSSLESS:
            raise ValueError(f"deployment [cache] tiers: {LOSSLESS!r} is built in (every block, every step); "
                             "name the lossy tiers only")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"deployment [cache] tiers.{name}={value!r}; allowed: a threshold > 0")
    unknown = [name for name in cache.enabled if name not in cache.tiers]
    if unknown:
        raise ValueError(f"deployment [cache] enabled={list(cache.enabled)} names tiers {unknown} that [cache] "
                         f"tiers does not define; defined: {sorted(cache.tiers)}")
    if not _integer(cache.back_blocks) or cache.back_blocks < 0:
        raise ValueError(f"deployment [cache] back_blocks={cache.back_blocks!r}; allowed: an integer >= 0")
    if not _integer(cache.front_blocks) or cache.front_blocks < 1:
        raise ValueError(f"deployment [cache] front_blocks={cache.front_blocks!r}; allowed: an integer >= 1")


def _check_accel(dep: Deployment) -> None:
    """Every [accel] value is checked here, at load, with the allowed values in the message."""
    accel = dep.accel
    choices = {"transformer": TRANSFORMER_ACCEL, "vae_decode": STAGE_ACCEL, "text_encoder": TEXT_ENCODER_ACCEL,
               "scheduler_step": SCHEDULER_STEP_ACCEL, "attention": ATTENTION_ACCEL}
    for key, allowed in choices.items():
        if getattr(accel, key) not in allowed:
            raise ValueError(f"deployment [accel] {key}={getattr(accel, key)!r}; allowed: {', '.join(allowed)}")
    if not isinstance(accel.fp8, bool):
        raise ValueError(f"deployment [accel] fp8={accel.fp8!r}; allowed: true, false")
    if not all(_integer(b) and b >= 1 for b in accel.row_buckets):
        raise ValueError(f"deployment [accel] row_buckets={list(accel.row_buckets)}; allowed: a list of "
                         "integers >= 1, e.g. [1, 2, 4, 8]")
    need = 2 * dep.engine.capacity
    if accel.row_buckets and max(accel.row_buckets) < need:
        raise ValueError(f"deployment [accel] row_buckets={list(accel.row_buckets)} must reach {need} rows "
                         f"(2 x [engine] capacity, CFG rows included); add {need} or leave it empty")
    accel.sizes(dep.is_video)  # raises on a malformed entry
    if dep.engine.overtake and accel.transformer not in ("eager", "eager_graphs"):
        raise ValueError(f"deployment [engine] overtake = true runs first steps with diffusers' eager kernels beside "
                         f"the transformer's own forwards; [accel] transformer={accel.transformer!r} would give "
                         "them other numerics: use transformer = \"eager_graphs\" or \"eager\", or overtake = false")
    if not isinstance(accel.compile_backend, str) or not accel.compile_backend:
        raise ValueError(f"deployment [accel] compile_backend={accel.compile_backend!r}; allowed: a torch.compile "
                         "backend name such as inductor, aot_eager, eager")


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):   # an inline table, e.g. [cache] tiers
        return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"
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


def write_variant(base: Path, out: Path, engine: dict, writer: str, accel: dict | None = None,
                  cache: dict | None = None) -> Deployment:
    """Write `base` with the given [engine] (and [accel], [cache]) keys replaced to `out` (perf tools serve
    such variants side by side); returns it loaded, so anything the server would reject fails here."""
    data = tomllib.loads(Path(base).read_text())
    changes = {"engine": engine, "accel": accel or {}, "cache": cache or {}}
    for section, keys in changes.items():
        if keys:
            data[section] = {**data.get(section, {}), **keys}
    said = {name: keys for name, keys in changes.items() if keys}
    out.write_text(f"# variant of {base} with {said} (written by {writer})\n" + dump_toml(data))
    return load_deployment(out)

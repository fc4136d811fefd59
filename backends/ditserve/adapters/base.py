"""The step contract every model family implements, and the logic they all share.

A family adapter wraps a diffusers pipeline loaded with `from_pretrained` and splits
its `__call__` into the pieces the serving stages need:

  encode_text  (text_encoder stage)   prompts -> embeddings + masks
  prepare      (dit, on admission)    params + conditioning -> RequestState
  denoise      (dit, every step)      batch of states -> guided model output per state
  scheduler_steps (dit, every step)   advance each state with its own scheduler's schedule
                                      (one batched solve where batched_step.py covers it)
  decode       (vae_decode stage)     latents -> uint8 media on the device

Image-conditioned families (wan_i2v.py) add the encoders a vae_encode stage calls and
hand prepare their per-request conditioning in `TextConditioning.extra`; families with more
than one text output (FLUX.1's pooled CLIP embedding) return it there from `encode_prompts`.
Families whose schedule depends on the request (FLUX.1's resolution-dependent shift)
override `set_timesteps`. Families whose forward picks one of several transformer modules by
timestep (Wan2.2's experts) override `transformer_modules`, `step_modules` and `forward_for`:
each request carries its per-step module plan, requests group by it, and each module has its
own (compiled) runner.

Only the pieces that differ between families are abstract.
"""
from __future__ import annotations

import contextlib
import copy
import inspect
from abc import ABC, abstractmethod
from typing import Callable, ClassVar, Iterator

import torch
from diffusers.utils.torch_utils import randn_tensor

from ..accel import (GraphedEncoder, TransformerRunner, WarmCompiled, WarmupReport, graph_encoder,
                     pin_processor_signatures, prefer_attention, signature, warm_attribute, warming)
from ..fp8 import apply_fp8
from ..batched_step import BatchedSolver, solver_for, warn_fallback
from ..cache import RowCache, first_block_cache
from ..cache_graphs import CachedGraphs
from ..deployment import Deployment
from ..schema import GenerationParams, check_params
from ..state import RequestState, TextConditioning
from ..text_padding import is_t5_encoder, pad_to_mask, trim_encoder_padding, warm_lengths

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

# Which pipeline components each serving stage needs; the others are not loaded.
STAGE_COMPONENTS = {
    # FLUX.1 adds a T5 (`_2`) beside CLIP, SD3 a third encoder (`_3`); a family loads those it has.
    "text_encoder": ("text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2", "text_encoder_3", "tokenizer_3"),
    "dit": ("transformer", "transformer_2", "scheduler"),   # transformer_2: Wan2.2's low-noise expert
    "vae_decode": ("vae",),
    # Image-conditioned tasks (img2vid): the input image -> image embeddings + condition latents.
    "vae_encode": ("vae", "image_encoder", "image_processor"),
}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"deployment asks for device {name!r} but CUDA is not available; use device = \"auto\" or \"cpu\"")
    return device


def instance_device(args: dict) -> str | None:
    """The device Triton gave this model instance: `cuda:<id>` for a KIND_GPU instance
    (scripts/render_repository.py --gpus), else None (use the deployment's [model] device)."""
    if args.get("model_instance_kind") == "GPU":
        return f"cuda:{int(args['model_instance_device_id'])}"
    return None


class FamilyAdapter(ABC):
    """Shared loading, noise, scheduling and media conversion; families fill in the rest."""

    pipeline_class: ClassVar[type]
    component_names: ClassVar[tuple[str, ...]]
    family: ClassVar[str]           # the deployment's [model] family (deployment.FAMILY_TASKS)
    # The transformer's block list that quality tiers cache (cache.first_block_cache); None: no tiers.
    cache_blocks: ClassVar[str | None] = None

    def __init__(self, deployment: Deployment, stage: str, device: str | None = None):
        """`device` overrides the deployment's [model] device (a KIND_GPU instance's GPU)."""
        self.deployment = deployment
        self.device = resolve_device(device or deployment.model.device)
        self.dtype = DTYPES[deployment.model.dtype]
        keep = set(STAGE_COMPONENTS[stage])
        skipped = {name: None for name in self.component_names if name not in keep}
        self.pipe = self.pipeline_class.from_pretrained(
            deployment.model_location(), torch_dtype=self.dtype, **skipped
        ).to(self.device)
        for component in self.pipe.components.values():
            if isinstance(component, torch.nn.Module):
                pin_processor_signatures(component)
        self.check_limits(stage)
        self.stage = stage
        self.runners: dict[str, TransformerRunner] = {}   # dit: one per transformer module
        self.cached_graphs: dict[str, CachedGraphs] = {}  # dit with CUDA graphs and quality tiers: per module
        self.run_forward, self.stage_runner = self._accelerate(stage)
        # text_encoder: a T5-family encoder runs on the prompts' tokens, not the padding (text_padding.py)
        self.text_trim = trim_encoder_padding(self.pipe.text_encoder) if stage == "text_encoder" else None
        # dit: the scheduler step of a whole batch at once, where the scheduler is covered
        self.solver: BatchedSolver | None = solver_for(self.pipe.scheduler) \
            if stage == "dit" and deployment.accel.scheduler_step == "batched" else None
        self.cache_hits = 0   # steps reused by all requests so far (ditserve_cache_hits_total)
        if stage == "dit" and deployment.cache.tiers and self.cache_blocks is None:
            raise ValueError(f"deployment [cache] tiers: family {self.family!r} has no cached forward yet; "
                             "remove the [cache] section")
        front, back = deployment.cache.front_blocks, deployment.cache.back_blocks
        if stage == "dit" and self.cache_blocks is not None and (front > 1 or back):
            blocks = len(getattr(self.pipe.transformer, self.cache_blocks))
            if front + back > blocks - 1:
                raise ValueError(f"deployment [cache] front_blocks={front}, back_blocks={back}; this transformer has "
                                 f"{blocks} blocks: allowed front_blocks + back_blocks up to {blocks - 1} (one "
                                 "block must be left to cache)")

    def _accelerate(self, stage: str) -> tuple[TransformerRunner | None, WarmCompiled | GraphedEncoder | None]:
        """The deployment's [accel] for this stage: dit's transformer runner, or a compiled (or
        graphed) text encoder / a compiled VAE decode. Compiling and capturing happen in `warm_up`,
        never on the request path."""
        accel = self.deployment.accel
        if stage == "dit":
            prefer_attention(accel)
            for module in self.transformer_modules:
                if accel.fp8:
                    apply_fp8(getattr(self.pipe, module))
                runner = TransformerRunner(self.forward_for(module), accel, self.deployment.engine.capacity, self.device)
                self.runners[module] = runner
                if runner.graphs is not None and self.deployment.cache.tiers and self.cache_blocks is not None:
                    # the quality tiers' segments: blocks compiled as the lossless forward is (eager_graphs: not)
                    blocks_backend = accel.compile_backend if runner.compiled.compiles else None
                    self.cached_graphs[module] = CachedGraphs(self.forward_for(module), getattr(self.pipe, module),
                                                              self.cache_blocks, runner.buckets, runner.pool,
                                                              compile_backend=blocks_backend,
                                                              front=self.deployment.cache.front_blocks,
                                                              back=self.deployment.cache.back_blocks)
            return self.runners["transformer"], None
        if stage == "text_encoder" and accel.text_encoder == "compile":
            return None, warm_attribute(self.pipe.text_encoder, "forward", accel)
        if stage == "text_encoder" and accel.text_encoder == "cuda_graphs":
            if not is_t5_encoder(self.pipe.text_encoder):
                raise ValueError(f"deployment [accel] text_encoder = \"cuda_graphs\" replays a T5 or UMT5 encoder; "
                                 f"family {self.family!r} encodes with {type(self.pipe.text_encoder).__name__}: "
                                 "use \"compile\" or \"eager\"")
            return None, graph_encoder(self.pipe.text_encoder, self.device)
        if stage == "vae_decode" and accel.vae_decode == "compile":
            return None, warm_attribute(self.pipe.vae, "decode", accel)
        return None, None

    def warm_up(self, text_rows: int = 2) -> WarmupReport:
        """Compile (and capture) this stage's accelerated forward for every warm size, before
        Triton reports the model READY, so that no request waits for a compile. `text_rows`: the
        most text rows one text_encoder execute encodes (its graphs' largest row bucket)."""
        report = WarmupReport()
        for params in self.warm_params():
            size = f"{params.num_frames}x" * self.deployment.is_video + f"{params.height}x{params.width}"
            if self.stage == "dit":
                state = self.prepare("warm-up", params, self.example_conditioning(params))
                for module, runner in self.runners.items():
                    state.modules = (module,) * state.total_steps
                    with runner.warming(report, size if module == "transformer" else f"{size} {module}"):
                        self.denoise([state])
                        if module in self.cached_graphs:   # the quality tiers' segments too
                            state.cache = RowCache(threshold=0.0)
                            self.denoise([state])
                            state.cache = None
            elif self.stage == "vae_decode":
                # Dynamic batching hands the decode 1..N latents: a batch of 2 compiles the dynamic
                # graph that serves 2..N, a batch of 1 its special case (dynamo specialises size 1).
                latents = torch.zeros(self.latent_shape(params), device=self.device)
                for rows in (2, 1):
                    with warming(self.stage_runner, report, f"{size} x {rows}"):
                        self.decode(torch.cat([latents] * rows))
        if self.stage == "text_encoder":
            # compile: with and without CFG (one dynamic compile, and the size-1 special case);
            # cuda_graphs: every row bucket
            graphed = isinstance(self.stage_runner, GraphedEncoder)
            for rows in self.stage_runner.warm_rows(text_rows) if graphed else (2, 1):
                with warming(self.stage_runner, report, f"{rows} texts"):
                    self.encode_text(["warm up"] * rows)
                    if self.stage_runner is not None and self.text_trim is not None:   # every trimmed length
                        warm_lengths(self.pipe.text_encoder, self.deployment.model.max_sequence_length, rows)
        return report

    def warm_params(self) -> list[GenerationParams]:
        """One request per [accel] warm size (checked against the deployment's limits)."""
        out = []
        for frames, height, width in self.deployment.accel.sizes(self.deployment.is_video):
            # Guidance 0: no CFG rows, and allowed where the model takes no guidance (FLUX.1-schnell).
            params = GenerationParams("warm up", "", height, width, 2, 0.0, 0, num_frames=frames,
                                      cfg=self.deployment.uses_cfg)
            try:
                check_params(params, self.deployment)
            except ValueError as exc:
                raise ValueError(f"deployment [accel] warm_sizes: {exc}") from exc
            out.append(params)
        return out

    @property
    def text_sequence_length(self) -> int:
        """Tokens per text row of `embeds` (families that put CLIP tokens before T5's add them)."""
        return self.deployment.model.max_sequence_length

    def example_conditioning(self, params: GenerationParams) -> TextConditioning:
        """Zero conditioning shaped as a real request's (two text rows with CFG): what warming needs."""
        length, rows = self.text_sequence_length, 1 + params.do_cfg
        return TextConditioning(torch.zeros(rows, length, self.text_embed_dim, dtype=self.dtype),
                                torch.ones(rows, length, dtype=torch.int64))

    # ---- family-specific -------------------------------------------------------------
    @abstractmethod
    def encode_text(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Embeddings [N, L, D] and masks [N, L] for N texts, as the pipeline computes them."""

    @abstractmethod
    def latent_shape(self, params: GenerationParams) -> tuple[int, ...]:
        """Shape of one request's initial noise, batch dim included."""

    @abstractmethod
    def forward(self, latents: torch.Tensor, timesteps: torch.Tensor, cond: TextConditioning) -> torch.Tensor:
        """One transformer forward over a stacked batch; returns the scheduler-ready output.

        Called by `denoise` under inference mode; not decorated itself, because torch.compile
        fails on an inference-mode function whose inputs are inference tensors."""

    @abstractmethod
    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """VAE decode to float media in [-1, 1], layout [N, C, H, W] (image) or [N, F, C, H, W] (video)."""

    @property
    @abstractmethod
    def text_embed_dim(self) -> int:
        """Width of the text embeddings the transformer takes (text_encoder's output)."""

    def cached_forward(self, latents: torch.Tensor, timesteps: torch.Tensor, cond: TextConditioning,
                       caches: list[RowCache | None]) -> torch.Tensor:
        """`forward` with a First-Block Cache per request over the family's `cache_blocks`, eager."""
        if self.cache_blocks is None:
            raise NotImplementedError(f"family {self.family!r} has no cached forward")
        cache = self.deployment.cache
        with first_block_cache(self.pipe.transformer, self.cache_blocks, caches, cache.front_blocks, cache.back_blocks):
            return self.forward(latents, timesteps, cond)

    def check_limits(self, stage: str) -> None:
        """Fail at load time when the deployment's limits disagree with the model."""

    @property
    def transformer_modules(self) -> tuple[str, ...]:
        """The pipeline components a dit forward may run, `transformer` first."""
        return ("transformer",)

    def step_modules(self, timesteps: torch.Tensor) -> tuple[str, ...]:
        """The module each step of a request with these timesteps runs (RequestState.modules)."""
        return ()

    def forward_for(self, module: str) -> Callable[[torch.Tensor, torch.Tensor, TextConditioning], torch.Tensor]:
        """`forward` running `module` instead of `transformer` (families with several modules)."""
        return self.forward

    @contextlib.contextmanager
    def eager_forwards(self) -> Iterator[None]:
        """Every transformer module's forwards inside run eager (TransformerRunner.eager_forwards)."""
        with contextlib.ExitStack() as stack:
            for runner in self.runners.values():
                stack.enter_context(runner.eager_forwards())
            yield

    @property
    def forward_calls(self) -> dict[str, int]:
        """Forwards run so far by path (compiled / eager), over every module's runner."""
        calls = [runner.calls for runner in self.runners.values()]
        return {path: sum(c[path] for c in calls) for path in ("compiled", "eager")}

    def encode_prompts(self, texts: list[str]) -> TextConditioning:
        """`encode_text` plus the family's per-row extra outputs (deployment.FAMILY_TEXT_CONDITIONING),
        which the text_encoder stage returns beside `embeds` and `mask`."""
        return TextConditioning(*self.encode_text(texts))

    def set_timesteps(self, scheduler, params: GenerationParams) -> None:
        """Set one request's schedule on its private scheduler, as the family's pipeline does."""
        scheduler.set_timesteps(params.num_inference_steps, device=self.device)

    @property
    def latent_dtype(self) -> torch.dtype:
        """dtype of the initial noise and of the latents the scheduler steps, as the pipeline makes them."""
        return self.dtype

    # ---- shared ------------------------------------------------------------------------
    def new_scheduler(self):
        """A private scheduler per request: multistep solvers keep per-request history."""
        return copy.deepcopy(self.pipe.scheduler)

    def prepare(self, key: str, params: GenerationParams, cond: TextConditioning) -> RequestState:
        scheduler = self.new_scheduler()
        self.set_timesteps(scheduler, params)
        # A CPU generator makes a seed mean the same noise on every device, as in diffusers.
        generator = torch.Generator("cpu").manual_seed(params.seed)
        latents = randn_tensor(self.latent_shape(params), generator=generator, device=self.device,
                               dtype=self.latent_dtype)
        latents = latents * getattr(scheduler, "init_noise_sigma", 1.0)  # flow-matching Euler has none
        # text_encoder cuts the embeddings' zero padding: put back here, on the device, which then
        # receives a tenth of the bytes (PixArt-Sigma, a 32-token prompt: 0.5 of 4.9 MB)
        embeds = pad_to_mask(cond.embeds.to(self.device, self.dtype), cond.mask)
        cond = TextConditioning(embeds, cond.mask.to(self.device),
                                {name: t.to(self.device) for name, t in cond.extra.items()})
        accepts_generator = "generator" in inspect.signature(scheduler.step).parameters
        step_kwargs = {"generator": generator} if accepts_generator else {}
        threshold = self.deployment.cache.threshold(params.quality)
        return RequestState(key, params, scheduler, scheduler.timesteps, latents, cond, generator, step_kwargs,
                            cache=None if threshold is None else RowCache(threshold),
                            modules=self.step_modules(scheduler.timesteps))

    @torch.inference_mode()
    def denoise(self, states: list[RequestState]) -> list[torch.Tensor]:
        """One guided model output per state; all states must share a compat key.

        A batch holding a lossy `quality` tier runs the cached forward (`_cached`). With a compiled
        transformer, lossless requests of that batch run apart, compiled: the result of a
        lossless request never depends on its peers' tiers."""
        runner = self.runners[states[0].module]   # one compat key: one module
        lossless = [s for s in states if s.cache is None]
        if runner.compiled is not None and 0 < len(lossless) < len(states):
            lossy = [s for s in states if s.cache is not None]
            outputs = dict(zip([s.key for s in lossless + lossy], self.denoise(lossless) + self.denoise(lossy)))
            return [outputs[s.key] for s in states]
        inputs = self.batch_inputs(states)
        caches = [s.cache for s in states]
        if any(cache is not None for cache in caches):   # a lossy tier in the batch: the cached path
            before = sum(cache.hits for cache in caches if cache is not None)
            out = self._cached(states[0].module, inputs, caches)
            self.cache_hits += sum(cache.hits for cache in caches if cache is not None) - before
        else:
            out = runner(*inputs)
        if not states[0].params.do_cfg:   # one compat key: all states guide alike
            return list(out.split(1))
        # CFG over the batch at once, rows [negative, prompt] per request, each with its own scale.
        # Copied without blocking: a blocking host-to-device copy waits for the stream, i.e. for
        # this forward, and the host could not queue the next step while the GPU runs this one.
        scales = torch.tensor([self.guidance_scale(s) for s in states], dtype=torch.float32)
        scales = scales.to(out.device, non_blocking=True)
        return list(self.guide(out[0::2], out[1::2], scales.view(-1, *[1] * (out.ndim - 1))).split(1))

    def batch_inputs(self, states: list[RequestState]) -> tuple[torch.Tensor, torch.Tensor, TextConditioning]:
        """The transformer's inputs for a step batch (one compat key): each request's rows
        ([negative, prompt] with CFG), its timestep per row, its text conditioning."""
        latents, timesteps, embeds, masks = [], [], [], []
        extras = {name: [] for name in states[0].cond.extra}
        for s in states:
            rows = 2 if s.params.do_cfg else 1
            model_input = torch.cat([s.latents] * rows)
            if hasattr(s.scheduler, "scale_model_input"):  # flow-matching Euler has none: input as is
                model_input = s.scheduler.scale_model_input(model_input, s.timestep)
            latents.append(model_input)
            timesteps.append(s.timestep.reshape(1).expand(rows))
            embeds.append(s.cond.embeds)
            masks.append(s.cond.mask)
            for name, t in s.cond.extra.items():  # one row shared by the CFG rows, or one per row
                extras[name].append(t.expand(rows, *t.shape[1:]))
        return (torch.cat(latents), torch.cat(timesteps).to(self.device),
                TextConditioning(torch.cat(embeds), torch.cat(masks), {name: torch.cat(ts) for name, ts in extras.items()}))

    def _cached(self, module: str, inputs: tuple, caches: list[RowCache | None]) -> torch.Tensor:
        """The cached forward of a batch holding a lossy tier: in CUDA graphs where its shape was
        captured at load (cache_graphs.py), else (or inside `eager_forwards`) eager. A capture
        that fails at load leaves the eager path serving, and the warm-up report says why."""
        runner = self.runners[module]
        graphs = None if runner.eager_only else self.cached_graphs.get(module)
        if graphs is not None:
            sig = signature(inputs, {})
            if runner.is_warming:
                try:
                    graphs.capture_all(sig, *inputs)
                except Exception as exc:   # noqa: BLE001: any capture failure leaves the eager path
                    del self.cached_graphs[module]
                    runner.note(f"quality tiers stay eager: their segments did not capture ({type(exc).__name__}: {exc})")
                    graphs = None
            if graphs is not None and graphs.fits(sig, inputs[0].shape[0]):
                runner.count_graph()
                return graphs(sig, *inputs, caches)
        runner.count_eager()
        return self.cached_forward(*inputs, caches)

    def guidance_scale(self, state: RequestState) -> float:
        """The CFG scale of the state's next step (Wan2.2 guides its low-noise expert's steps apart)."""
        return state.params.guidance_scale

    def guide(self, uncond: torch.Tensor, text: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        """Classifier-free guidance of a batch: diffusers' `uncond + scale * (text - uncond)` with
        a Python float scale (computed in float32, rounded to the output's dtype)."""
        return uncond + (scales * (text - uncond)).to(uncond.dtype)

    def scheduler_step(self, state: RequestState, model_output: torch.Tensor) -> None:
        state.latents = state.scheduler.step(
            model_output, state.timestep, state.latents, **state.step_kwargs, return_dict=False
        )[0]
        state.step_index += 1

    def scheduler_steps(self, states: list[RequestState], outputs: list[torch.Tensor]) -> dict[str, Exception]:
        """Advance each state (one compat group) by one step with its own schedule: one batched
        solve where the scheduler is covered, else (or if that raises) `scheduler.step` per request.
        Returns key -> exception for the requests that could not be stepped; the others advanced."""
        if self.solver is not None:
            try:
                new = self.solver.step([s.scheduler for s in states], [s.latents for s in states], outputs,
                                       [s.timestep for s in states])
            except Exception as exc:   # no scheduler changed: the per-request steps below say who fails
                warn_fallback(exc)
            else:
                for state, latents in zip(states, new):
                    state.latents, state.step_index = latents, state.step_index + 1
                return {}
        failures = {}
        for state, output in zip(states, outputs):
            try:
                self.scheduler_step(state, output)
            except Exception as exc:
                failures[state.key] = exc
        return failures

    @torch.inference_mode()
    def decode(self, latents: torch.Tensor) -> tuple[torch.Tensor, list[bool]]:
        """uint8 media, channels last, made on the device (rounded as diffusers' numpy_to_pil),
        and per row whether the VAE output was finite: a NaN would silently become black pixels."""
        media = self.decode_latents(latents.to(self.device, self.pipe.vae.dtype))
        finite = torch.isfinite(media.flatten(1)).all(dim=1).tolist()
        media = (media / 2 + 0.5).clamp(0, 1)
        media = media.movedim(-3, -1)  # [..., C, H, W] -> [..., H, W, C]
        return (media.float() * 255).round().to(torch.uint8), finite

    def media_height(self, latents: torch.Tensor) -> int:
        """Pixel height of the media these latents decode to (latent layout [..., h, w])."""
        return int(latents.shape[-2]) * self.vae_scale_factor

    @property
    @abstractmethod
    def vae_scale_factor(self) -> int:
        """Pixels per latent element along height and width."""


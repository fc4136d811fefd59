"""Model names of the pipelines in one Triton repository, and loading or unloading one of them.

A repository rendered for one deployment names its models for their stage and task
(`text_encoder`, `dit`, `vae_decode`, `txt2img`, `txt2img_stream`, ...). A repository rendered
for several deployments gives each a pipeline name and every model of that deployment the
prefix `<pipeline>_` (`pixart_txt2img`, `flux_dit`, ...), so two deployments of the same task
can share one server. This module is the one place that decides those names:
scripts/render_repository.py writes them, the public models call their stages by them, and
clients (ditserve.client, scripts/generate.py) address the public models by them.

Pipeline names are lower-case letters, digits and hyphens: no `_`, so `<pipeline>_<model>`
splits at its first `_` into exactly one pipeline and one model.
"""
from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .deployment import FAMILY_TASKS

PIPELINE_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}$")
# The internal stages every public model calls through BLS.
STAGE_MODELS = ("text_encoder", "vae_encode", "dit", "vae_decode")
# Models clients call beside the public ones: `cancel` (stages/cancel.py).
CONTROL_MODELS = ("cancel",)
PUBLIC_MODELS = tuple(f"{task}{suffix}" for task in dict.fromkeys(FAMILY_TASKS.values()) for suffix in ("", "_stream"))


def check_pipeline_name(name: str) -> str:
    """`name` if it can prefix model names, else a ValueError that says what is allowed."""
    if not PIPELINE_NAME.match(name):
        raise ValueError(f"pipeline name {name!r} is not allowed: use 1-32 lower-case letters, digits and "
                         f"hyphens, starting with a letter or digit (no '_': it separates the pipeline from "
                         f"the model, as in pixart_txt2img)")
    return name


@dataclass(frozen=True)
class PipelineNames:
    """The Triton model names of one deployment's models; `pipeline=None` gives the
    single-deployment names (no prefix)."""

    pipeline: str | None = None

    def __post_init__(self) -> None:
        if self.pipeline is not None:
            check_pipeline_name(self.pipeline)

    def model(self, base: str) -> str:
        """The served name of a stage (`dit`) or public model (`txt2img_stream`)."""
        return f"{self.pipeline}_{base}" if self.pipeline else base

    def public(self, task: str, streaming: bool = False) -> str:
        return self.model(f"{task}_stream" if streaming else task)


def split_model_name(name: str) -> tuple[str | None, str | None]:
    """(pipeline, base model) of a served model name: pipeline None for an unprefixed one,
    (None, None) for a model that is none of ours."""
    ours = STAGE_MODELS + CONTROL_MODELS + PUBLIC_MODELS
    if name in ours:
        return None, name
    pipeline, _, base = name.partition("_")
    if PIPELINE_NAME.match(pipeline) and base in ours:
        return pipeline, base
    return None, None


class RepositoryControl:
    """Load and unload whole pipelines through Triton's repository API (a server started with
    `--model-control-mode=explicit`). A public model calls its stages by BLS, which Triton does
    not track as a dependency, so the order matters: stages load before the public models
    (no request reaches a public model whose stages are missing), and public models unload
    first, and are gone (their in-flight generations finished), before their stages unload."""

    def __init__(self, url: str):
        import tritonclient.grpc as grpcclient

        self.url = url
        self.client = grpcclient.InferenceServerClient(url)

    def pipelines(self) -> dict[str, dict[str, str]]:
        """Each named pipeline in the repository -> {model: state}; the state is READY,
        UNLOADING, UNAVAILABLE (unloaded) or "" (never loaded)."""
        found: dict[str, dict[str, str]] = {}
        for model in self.client.get_model_repository_index(as_json=True).get("models", []):
            pipeline, _ = split_model_name(model["name"])
            if pipeline:
                found.setdefault(pipeline, {})[model["name"]] = model.get("state", "")
        return found

    def models(self, pipeline: str) -> dict[str, str]:
        """Every model of `pipeline` -> its state; a ValueError naming the pipelines there are."""
        pipelines = self.pipelines()
        if pipeline not in pipelines:
            raise ValueError(f"the repository has no pipeline {pipeline!r}; its pipelines: "
                             f"{', '.join(sorted(pipelines)) or 'none'}")
        return pipelines[pipeline]

    def load(self, pipeline: str) -> list[str]:
        """Load (or reload) every model of `pipeline`: the stages side by side, then the public
        models side by side; returns them in that order. Returns once Triton has loaded them
        all, or raises the first load error (which names the model)."""
        order = sorted(self.models(pipeline), key=self._is_public)
        for public in (False, True):
            group = [name for name in order if self._is_public(name) == public]
            with ThreadPoolExecutor(max(len(group), 1)) as pool:   # one client per thread
                list(pool.map(self._load_one, group))
        return order

    def _load_one(self, name: str) -> None:
        import tritonclient.grpc as grpcclient

        with grpcclient.InferenceServerClient(self.url) as client:
            client.load_model(name)

    def unload(self, pipeline: str, timeout_s: float = 300.0) -> list[str]:
        """Unload every model of `pipeline`, public models first; returns them in unload order.
        Triton lets a model's in-flight requests finish before it unloads it, so the stages
        are unloaded only once the public models are gone."""
        models = sorted(self.models(pipeline), key=lambda name: not self._is_public(name))
        public = [name for name in models if self._is_public(name)]
        for name in public:
            self.client.unload_model(name)
        self._wait_unloaded(pipeline, public, timeout_s)
        for name in models[len(public):]:
            self.client.unload_model(name)
        self._wait_unloaded(pipeline, models, timeout_s)
        return models

    def _wait_unloaded(self, pipeline: str, names: list[str], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            states = self.models(pipeline)
            left = [name for name in names if states.get(name) in ("READY", "UNLOADING")]
            if not left:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"pipeline {pipeline!r}: {', '.join(left)} still loaded after {timeout_s:.0f} s")
            time.sleep(0.2)

    @staticmethod
    def _is_public(name: str) -> bool:
        return split_model_name(name)[1] in PUBLIC_MODELS

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> "RepositoryControl":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

"""`text_encoder`: texts -> T5 embeddings + masks, plus a family's other per-row text
conditioning (FLUX.1's and SD3's pooled CLIP embedding: deployment.FAMILY_TEXT_CONDITIONING)
(dynamic batching; encoded on the device, returned on the host: GPU tensors crossing stubs
stall Triton 2.51, see `_encode_batch`).
The embeddings keep the deployment's dtype (`embeds` is BF16 for a bfloat16 deployment):
that is what the transformer takes, and fp32 would double the bytes that cross to the public
model and into the handoff (9.8 MB instead of 4.9 MB for PixArt-Sigma's two rows).

A request carries the texts of one generation as `text` [1, rows] (rows = 2 with CFG:
negative then prompt), so its outputs already have the shape `dit` takes.

Failures stay with the request that causes them: a batch whose encode fails is retried
one request at a time, and a request whose embeddings are not finite gets an error.

With CFG most requests keep the deployment's default negative prompt, half of the rows T5 would
encode: it is encoded once at load and its rows are reused (reused_text.py), as diffusers encodes a
negative prompt alone, apart from the prompt.
"""
from __future__ import annotations

import torch
import triton_python_backend_utils as pb_utils

from ..adapters import adapter_for
from ..adapters.base import instance_device
from ..faults import Subject, injector
from ..isolation import isolating_failures
from ..reused_text import ReusedRow
from ..state import TextConditioning
from ..text_padding import cut_zero_padding
from .common import error_response, stage_deployment, warm_up
from .metrics import counter
from .torch_io import to_pb

MAX_ROWS = 2  # negative + prompt: the only shape the public models send


class TextEncoderStage:
    def __init__(self, args: dict, model_config: dict):
        self.deployment = stage_deployment(model_config)
        self.adapter = adapter_for(self.deployment.model.family)(self.deployment, "text_encoder", instance_device(args))
        self.faults = injector(self.deployment, "text_encoder")
        # the most rows one dynamic-batching execute encodes: what graphs are captured up to
        text_rows = MAX_ROWS * max(1, int(model_config.get("max_batch_size", 1)))
        self.accel_metrics = warm_up(self.adapter, args["model_name"], text_rows=text_rows)
        negative = self.deployment.defaults.negative_prompt
        self.reused = ReusedRow(negative, self.adapter.encode_prompts([negative])) if self.deployment.uses_cfg else None
        self.reused_rows = counter("ditserve_text_rows_reused_total",
                                   "Text rows taken from the default negative prompt's encoding at load instead "
                                   "of encoded again", args["model_name"])
        self.accel_metrics.watch(self.adapter.stage_runner)

    def execute(self, requests):
        responses: list = [None] * len(requests)
        items = []
        for i, request in enumerate(requests):
            try:
                items.append((i, *self._texts(request)))
            except ValueError as exc:  # text_encoder is reachable directly, not only through txt2img
                responses[i] = error_response(str(exc), pb_utils.TritonError.INVALID_ARG)
        self._encode(items, responses)
        self.accel_metrics.count()
        return responses

    def _texts(self, request) -> tuple[tuple[int, ...], list[str]]:
        raw = pb_utils.get_input_tensor_by_name(request, "text").as_numpy()
        if raw.ndim != 2 or raw.shape[1] > MAX_ROWS or raw.size == 0:
            raise ValueError(f"input 'text' must have shape [1, 1..{MAX_ROWS}], got {list(raw.shape)}")
        limit = self.deployment.limits.max_prompt_bytes
        texts = []
        for t in raw.reshape(-1):
            data = t if isinstance(t, bytes) else str(t).encode()
            if len(data) > limit:
                raise ValueError(f"a text is {len(data)} bytes; the limit is {limit}")
            texts.append(data.decode("utf-8"))  # UnicodeDecodeError is a ValueError
        return raw.shape, texts

    def _encode(self, items: list, responses: list) -> None:
        """Encode the texts of `items` in one forward; a failing batch is retried per request."""
        def fail(item, exc: Exception) -> None:
            responses[item[0]] = error_response(f"encode failed: {type(exc).__name__}: {exc}")

        isolating_failures(items, lambda batch: self._encode_batch(batch, responses), fail)

    def _encode_batch(self, items: list, responses: list) -> None:
        if not items:
            return
        texts = [t for _, _, request_texts in items for t in request_texts]
        if self.reused is None:
            cond = self.adapter.encode_prompts(texts)
        else:
            cond, reused = self.reused.encode(texts, self.adapter.encode_prompts)
            if reused:
                self.reused_rows.increment(reused)
        # On the host from here: one copy per tensor, then host work. Each wait for the device
        # (a check's bool, a copy) waits for this process's turn on a GPU that dit keeps busy.
        cond = TextConditioning(cond.embeds.cpu(), cond.mask.cpu(), {k: t.cpu() for k, t in cond.extra.items()})
        embeds = self.faults.at("encode", [Subject(prompt=t) for t in texts], cond.embeds)
        embeds = cut_zero_padding(embeds, cond.mask)   # dit puts the zeros back (pad_to_mask)
        finite = torch.stack([torch.isfinite(t.flatten(1)).all(dim=1) for t in (embeds, *cond.extra.values())])
        finite = finite.all(dim=0).tolist()
        start = 0
        for i, shape, request_texts in items:
            n = len(request_texts)
            if not all(finite[start:start + n]):
                responses[i] = error_response("encode produced non-finite embeddings (NaN/inf)")
            else:
                # CPU outputs (copied above): they feed a BLS request into the decoupled `dit`, and
                # GPU tensors there stalled rescheduled batches on the H200 (perf/results, 2026-11-29).
                rows = slice(start, start + n)
                tensors = {name: t[rows].to(self.adapter.dtype).reshape(*shape, *t.shape[1:])
                           for name, t in (("embeds", embeds), *cond.extra.items())}
                tensors["mask"] = cond.mask[rows].to(torch.int64).reshape(*shape, -1)
                responses[i] = pb_utils.InferenceResponse([to_pb(name, t) for name, t in tensors.items()])
            start += n

    def finalize(self) -> None:
        pass

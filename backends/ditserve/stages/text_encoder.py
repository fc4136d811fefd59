"""`text_encoder`: texts -> T5 embeddings + masks (dynamic batching, kept on the device).

A request carries the texts of one generation as `text` [1, rows] (rows = 2 with CFG:
negative then prompt), so its outputs already have the shape `dit` takes.
"""
from __future__ import annotations

import torch
import triton_python_backend_utils as pb_utils

from ..adapters import adapter_for
from ..deployment import load_deployment
from .common import TensorSpec, declare, error_response, to_pb, to_torch

INPUTS = (TensorSpec("text", "TYPE_STRING", (-1,)),)
OUTPUTS = (TensorSpec("embeds", "TYPE_FP32", (-1, -1, -1)), TensorSpec("mask", "TYPE_INT64", (-1, -1)))


class TextEncoderStage:
    @staticmethod
    def auto_complete(config):
        return declare(config, INPUTS, OUTPUTS)

    def __init__(self, args: dict, model_config: dict):
        deployment = load_deployment()
        self.adapter = adapter_for(deployment.model.family)(deployment, "text_encoder")

    def execute(self, requests):
        texts, shapes = [], []
        for request in requests:
            raw = pb_utils.get_input_tensor_by_name(request, "text").as_numpy()
            shapes.append(raw.shape)
            texts.extend(t.decode("utf-8") if isinstance(t, bytes) else str(t) for t in raw.reshape(-1))
        try:
            embeds, mask = self.adapter.encode_text(texts)
        except Exception as exc:  # one failing batch must not take the server down
            return [error_response(f"text_encoder failed: {exc}") for _ in requests]
        responses, start = [], 0
        for shape in shapes:
            n = shape[0] * shape[1]
            e = embeds[start:start + n].float().reshape(*shape, *embeds.shape[1:])
            m = mask[start:start + n].to(torch.int64).reshape(*shape, -1)
            responses.append(pb_utils.InferenceResponse([to_pb("embeds", e), to_pb("mask", m)]))
            start += n
        return responses

    def finalize(self) -> None:
        pass

"""Model-family adapters: the step contract for each family, one file per family."""
from __future__ import annotations

from .base import FamilyAdapter
from .flux import FluxAdapter
from .pixart_sigma import PixArtSigmaAdapter
from .qwen_image import QwenImageAdapter
from .sd3 import SD3Adapter
from .wan import WanT2VAdapter
from .wan22 import Wan22T2VAdapter
from .wan22_ti2v import Wan22TI2VAdapter
from .wan_i2v import WanI2VAdapter

ADAPTERS: dict[str, type[FamilyAdapter]] = {
    adapter.family: adapter
    for adapter in (PixArtSigmaAdapter, WanT2VAdapter, WanI2VAdapter, FluxAdapter, SD3Adapter, Wan22T2VAdapter,
                    QwenImageAdapter, Wan22TI2VAdapter)
}


def adapter_for(family: str) -> type[FamilyAdapter]:
    try:
        return ADAPTERS[family]
    except KeyError:
        raise ValueError(f"unknown model family {family!r}; known: {sorted(ADAPTERS)}") from None

"""JPEG chroma subsampling at each quality: PSNR, size and encode time of Pillow's 4:2:0 default
against 4:4:4 on a 1024x1024 noise picture (random weights' output) and a smooth colour ramp.

    .venv/bin/python perf/results/2026-12-05-cpu-frontend-encode/jpeg_subsampling.py
"""
import io
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from accel_bench import psnr  # noqa: E402

rng = np.random.default_rng(0)
y, x = np.mgrid[0:1024, 0:1024]
pictures = {"noise": rng.integers(0, 256, (1024, 1024, 3), dtype=np.uint8),
            "smooth": np.stack([(x / 4) % 256, (y / 4) % 256, ((x + y) / 8) % 256], -1).astype(np.uint8)}
for name, picture in pictures.items():
    for quality in (100, 95, 90, 75):
        for subsampling, label in ((2, "4:2:0"), (0, "4:4:4")):
            buffer = io.BytesIO()
            start = time.perf_counter()
            Image.fromarray(picture).save(buffer, format="JPEG", quality=quality, subsampling=subsampling)
            ms = (time.perf_counter() - start) * 1e3
            decoded = np.asarray(Image.open(io.BytesIO(buffer.getvalue())).convert("RGB"))
            print(f"{name} q{quality} {label}: {psnr(decoded, picture):.1f} dB, {len(buffer.getvalue()) // 1024} KiB, "
                  f"{ms:.0f} ms")

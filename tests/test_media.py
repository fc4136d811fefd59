"""H.264/MP4 round trips through ditserve.media (CPU only, a second or two in all)."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from ditserve.media import decode_mp4, encode_mp4

# Codec tolerance at the default crf 18, in levels of 255 over all pixels and channels.
# Measured on the content below: mean 1.4-3.3, max 13-36. A swapped RGB/BGR order gives a mean
# of 47-59 and a BT.601/709 mix-up ~20 on saturated colours, so both fail by a wide margin.
MEAN_TOL = 4.5
MAX_TOL = 60


def smooth(num: int, height: int, width: int, seed: int = 0) -> np.ndarray:
    """Moving sinusoidal gradients (a different one per channel) plus a little pixel noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    out = np.empty((num, height, width, 3), np.uint8)
    for f in range(num):
        r = 128 + 90 * np.sin((x + 3 * f) / (width / 6))
        g = 128 + 90 * np.cos((y - 2 * f) / (height / 5))
        b = 40 + 170 * (x + y) / (height + width) + 10 * np.sin(f / 3)
        img = np.stack([r, g, b], -1) + rng.normal(0, 2.0, (height, width, 3))
        out[f] = np.clip(img, 0, 255).astype(np.uint8)
    return out


def scene(num: int, height: int, width: int) -> np.ndarray:
    """A real-looking shot: sky gradient, textured ground, soft horizon, a yellow ball flying by."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32) / np.float32(max(height, width))
    sky = np.stack([70 + 80 * y, 130 + 70 * y, 230 - 60 * y], -1)
    ground = np.stack([60 + 40 * np.sin(40 * x) * np.sin(30 * y),
                       140 + 30 * np.sin(25 * x + 7 * y), 50 + 20 * np.cos(33 * y)], -1)
    land = np.clip((y * max(height, width) - 0.6 * height) / 3 + 0.5, 0, 1)[..., None]
    out = np.empty((num, height, width, 3), np.uint8)
    for f in range(num):
        cx, cy = 0.15 + 0.6 * f / max(num - 1, 1), 0.25 + 0.1 * np.sin(f / 4)
        ball = np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / 0.004)[..., None]
        img = (land * ground + (1 - land) * sky) * (1 - ball) + ball * np.array([250, 200, 40])
        out[f] = np.clip(img, 0, 255).astype(np.uint8)
    return out


def abs_err(a: np.ndarray, b: np.ndarray) -> tuple[float, int]:
    e = np.abs(a.astype(np.int16) - b.astype(np.int16))
    return float(e.mean()), int(e.max())


def assert_round_trip(frames: np.ndarray, fps: int) -> np.ndarray:
    data = encode_mp4(frames, fps)
    decoded, got_fps = decode_mp4(data)
    assert decoded.shape == frames.shape and decoded.dtype == np.uint8
    assert got_fps == fps
    mean, peak = abs_err(decoded, frames)
    assert mean <= MEAN_TOL and peak <= MAX_TOL, (mean, peak)
    return decoded


@pytest.mark.parametrize("shape,fps", [((9, 64, 64), 16), ((5, 48, 80), 24), ((1, 64, 64), 8)])
def test_round_trip_smooth(shape, fps):
    assert_round_trip(smooth(*shape), fps)


def test_round_trip_real_looking_480x832():
    assert_round_trip(scene(17, 480, 832), 16)


def test_swapped_channels_are_caught():
    frames = smooth(3, 64, 64)
    decoded, _ = decode_mp4(encode_mp4(frames, 8))
    assert abs_err(decoded, frames)[0] <= MEAN_TOL
    assert abs_err(decoded, frames[..., ::-1])[0] > 5 * MEAN_TOL  # RGB read as BGR


def test_frame_order_kept():
    levels = np.linspace(20, 230, 12)
    frames = np.broadcast_to(levels[:, None, None, None], (12, 32, 48, 3)).astype(np.uint8).copy()
    frames[:, :, :, 0] //= 2  # not grey, so chroma is exercised too
    decoded, _ = decode_mp4(encode_mp4(frames, 12))
    means = decoded.reshape(12, -1).mean(axis=1)
    np.testing.assert_allclose(means, frames.reshape(12, -1).mean(axis=1), atol=2)
    assert np.all(np.diff(means) > 10)


def test_saturated_colours_bt709_round_trip():
    colours = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0),
               (0, 255, 255), (255, 0, 255), (128, 128, 128), (255, 255, 255)]
    frames = np.zeros((2, 64, 64, 3), np.uint8)
    for i, c in enumerate(colours):
        frames[:, (i // 4) * 32:(i // 4 + 1) * 32, (i % 4) * 16:(i % 4 + 1) * 16] = c
    decoded, _ = decode_mp4(encode_mp4(frames, 8))
    centres = decoded[0, [16] * 4 + [48] * 4, [8, 24, 40, 56] * 2]
    np.testing.assert_allclose(centres, np.array(colours), atol=4)


def test_faststart_puts_moov_before_mdat():
    data = encode_mp4(smooth(3, 32, 32), 8)
    atoms, pos = [], 0
    while pos < len(data):
        atoms.append(data[pos + 4:pos + 8])
        pos += int.from_bytes(data[pos:pos + 4], "big")
    assert atoms.index(b"moov") < atoms.index(b"mdat"), atoms


def test_thread_safe():
    clips = [smooth(4, 32, 48, seed) for seed in range(6)]
    with ThreadPoolExecutor(3) as pool:
        blobs = list(pool.map(lambda c: encode_mp4(c, 8), clips))
    for clip, blob in zip(clips, blobs):
        decoded, _ = decode_mp4(blob)
        assert abs_err(decoded, clip)[0] <= MEAN_TOL


@pytest.mark.parametrize("bad,match", [
    (np.zeros((2, 63, 64, 3), np.uint8), "64x63"),
    (np.zeros((2, 64, 33, 3), np.uint8), "33x64"),
    (np.zeros((2, 1, 1, 3), np.uint8), "1x1"),
    (np.zeros((0, 64, 64, 3), np.uint8), "F=0"),
    (np.zeros((2, 64, 64, 4), np.uint8), r"\[F, H, W, 3\]"),
    (np.zeros((64, 64, 3), np.uint8), r"\[F, H, W, 3\]"),
    (np.zeros((2, 64, 64, 3), np.float32), "uint8"),
    ([[[[0, 0, 0]]]], "numpy uint8"),
])
def test_bad_frames_rejected(bad, match):
    with pytest.raises(ValueError, match=match):
        encode_mp4(bad, 8)


@pytest.mark.parametrize("fps", [0, -1, 2.5, True, "16", None])
def test_bad_fps_rejected(fps):
    with pytest.raises(ValueError, match="fps"):
        encode_mp4(smooth(1, 16, 16), fps)


@pytest.mark.parametrize("crf", [-1, 52, 18.0])
def test_bad_crf_rejected(crf):
    with pytest.raises(ValueError, match="crf"):
        encode_mp4(smooth(1, 16, 16), 8, crf=crf)


def test_numpy_int_fps_accepted():
    _, fps = decode_mp4(encode_mp4(smooth(2, 16, 16), np.int64(30)))
    assert fps == 30


@pytest.mark.parametrize("data", [b"", b"not an mp4 at all" * 10, "truncated"])
def test_bad_mp4_rejected(data):
    if data == "truncated":
        data = encode_mp4(smooth(3, 32, 32), 8)[:200]
    with pytest.raises(ValueError):
        decode_mp4(data)

"""The coloured-shapes caption set the embedded tiny PixArt-Sigma is trained on, and the
measurement that checks its pictures.

An image is one shape (circle, square, triangle) of one colour on a flat background of
another colour, at a random position and size; its caption names the three. Some
(colour, shape, background) combinations are never drawn in training (`HELD_OUT`), so that
quality on them measures composition rather than memory. Both the training script and
the quality test import this module, so that the two agree on colours and captions.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch

SIZE = 64  # image side the model is trained at

# sRGB of each colour word: far apart, so a picture's colour is read back by nearest match.
PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 160, 60),
    "blue": (30, 70, 220),
    "yellow": (240, 220, 40),
    "orange": (245, 135, 20),
    "purple": (130, 40, 170),
    "white": (245, 245, 245),
    "black": (15, 15, 15),
}
COLOURS = tuple(PALETTE)
SHAPES = ("circle", "square", "triangle")
TEMPLATES = (
    "a {colour} {shape} on a {background} background",
    "{colour} {shape}, {background} background",
    "a {background} background with a {colour} {shape}",
    "a picture of a {colour} {shape} on {background}",
)
# Words the tokenizer keeps whole, beyond build_tiny_pipelines.COMMON_WORDS.
WORDS = (*SHAPES, "background", "picture", "with")

# Never drawn in training; every shape 3 times, every colour at least once on each side.
HELD_OUT: tuple[tuple[str, str, str], ...] = (
    ("green", "circle", "purple"),
    ("white", "circle", "orange"),
    ("black", "circle", "yellow"),
    ("yellow", "square", "black"),
    ("orange", "square", "blue"),
    ("red", "square", "white"),
    ("blue", "triangle", "green"),
    ("purple", "triangle", "red"),
    ("white", "triangle", "purple"),
)
ALL_COMBOS = tuple((c, s, b) for c, s, b in itertools.product(COLOURS, SHAPES, COLOURS) if c != b)
TRAIN_COMBOS = tuple(combo for combo in ALL_COMBOS if combo not in HELD_OUT)

MIN_RADIUS, MAX_RADIUS = 8, 20  # half the shape's extent, in pixels
MARGIN = 4  # pixels between the shape and the image edge, so the border shows the background
SUPERSAMPLE = 4  # edges are drawn anti-aliased: coverage of a 4x4 grid per pixel


def caption(colour: str, shape: str, background: str, template: int = 0) -> str:
    """The caption of one combination; template 0 is the canonical `a red circle on a blue background`."""
    return TEMPLATES[template].format(colour=colour, shape=shape, background=background)


def eval_prompts(seen: int = 15) -> list[tuple[str, str, str]]:
    """The fixed evaluation set: every held-out combination plus `seen` training ones spread
    over the list (the quickstart's red circle on blue first)."""
    quickstart = ("red", "circle", "blue")
    others = [combo for combo in TRAIN_COMBOS if combo != quickstart]
    stride = len(others) // (seen - 1)
    return [quickstart, *others[::stride][:seen - 1], *HELD_OUT]


@dataclass
class ShapeBatch:
    """Images in [-1, 1], [B, 3, SIZE, SIZE], and their combination indices into a combo list."""

    images: torch.Tensor
    combos: torch.Tensor


def draw(shape: torch.Tensor, colour: torch.Tensor, background: torch.Tensor, centre: torch.Tensor,
         radius: torch.Tensor) -> torch.Tensor:
    """Render a batch: shape [B] (index into SHAPES), colour/background [B, 3] in [0, 1],
    centre [B, 2] (x, y) and radius [B] in pixels. Returns [B, 3, SIZE, SIZE] in [0, 1]."""
    n = SIZE * SUPERSAMPLE
    grid = (torch.arange(n, device=shape.device, dtype=torch.float32) + 0.5) / SUPERSAMPLE
    y, x = grid.view(1, n, 1), grid.view(1, 1, n)
    cx, cy, r = (v.view(-1, 1, 1) for v in (centre[:, 0], centre[:, 1], radius))
    dx, dy = x - cx, y - cy
    inside = torch.stack([
        dx * dx + dy * dy <= r * r,  # circle
        (dx.abs() <= r) & (dy.abs() <= r),  # square
        (dy <= r) & (dy >= -r) & (dx.abs() <= (dy + r) / 2),  # triangle, apex up, base 2r, height 2r
    ], dim=1)
    mask = inside[torch.arange(len(shape)), shape].float().unsqueeze(1)
    coverage = torch.nn.functional.avg_pool2d(mask, SUPERSAMPLE)
    return background.view(-1, 3, 1, 1) * (1 - coverage) + colour.view(-1, 3, 1, 1) * coverage


def _pick(combos: list[tuple[str, str, str]] | tuple[tuple[str, str, str], ...], batch: int,
          generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Per row, drawn from `generator` (CPU): the combination's index, the shape, the shape's and
    the background's RGB in [0, 1], and the radius."""
    palette = torch.tensor([PALETTE[c] for c in COLOURS], dtype=torch.float32) / 255
    table = torch.tensor([[COLOURS.index(c), SHAPES.index(s), COLOURS.index(b)] for c, s, b in combos])
    index = torch.randint(len(combos), (batch,), generator=generator)
    colour, shape, background = table[index].unbind(1)
    radius = MIN_RADIUS + (MAX_RADIUS - MIN_RADIUS) * torch.rand(batch, generator=generator)
    return index, shape, palette[colour], palette[background], radius


def sample(combos: list[tuple[str, str, str]] | tuple[tuple[str, str, str], ...], batch: int,
           generator: torch.Generator, device: torch.device | str = "cpu") -> ShapeBatch:
    """A random batch over `combos`: combination, position and size drawn from `generator` (CPU)."""
    index, shape, colour, background, radius = _pick(combos, batch, generator)
    low, span = radius + MARGIN, SIZE - 2 * (radius + MARGIN)
    centre = low.unsqueeze(1) + span.unsqueeze(1) * torch.rand(batch, 2, generator=generator)
    images = draw(shape.to(device), colour.to(device), background.to(device), centre.to(device), radius.to(device))
    return ShapeBatch(images * 2 - 1, index.to(device))


def sample_video(combos: list[tuple[str, str, str]] | tuple[tuple[str, str, str], ...], batch: int, frames: int,
                 generator: torch.Generator, device: torch.device | str = "cpu") -> ShapeBatch:
    """A random batch of clips, images [B, 3, frames, SIZE, SIZE]: as `sample`, with the shape
    gliding in a straight line from one random position to another (both fully in frame)."""
    index, shape, colour, background, radius = _pick(combos, batch, generator)
    low, span = (radius + MARGIN).view(batch, 1, 1), (SIZE - 2 * (radius + MARGIN)).view(batch, 1, 1)
    ends = low + span * torch.rand(batch, 2, 2, generator=generator)   # [B, start/end, x/y]
    t = torch.linspace(0, 1, frames).view(1, frames, 1)
    centre = ends[:, :1] + (ends[:, 1:] - ends[:, :1]) * t              # [B, frames, 2]
    repeat = lambda v: v.repeat_interleave(frames, dim=0).to(device)  # noqa: E731  one row per frame
    images = draw(repeat(shape), repeat(colour), repeat(background), centre.reshape(-1, 2).to(device), repeat(radius))
    clips = images.view(batch, frames, 3, SIZE, SIZE).transpose(1, 2)
    return ShapeBatch(clips * 2 - 1, index.to(device))


@dataclass(frozen=True)
class Measured:
    """What a picture shows, read back from its pixels."""

    background: str
    colour: str | None  # None when no pixel differs from the background
    shape: str | None
    fill: float  # shape pixels / bounding-box pixels: ~1 square, ~0.79 circle, ~0.5 triangle


def nearest_colour(rgb: np.ndarray) -> str:
    palette = np.array([PALETTE[c] for c in COLOURS], dtype=np.float32)
    return COLOURS[int(np.argmin(((palette - rgb) ** 2).sum(axis=1)))]


def measure(image: np.ndarray, border: int = 2, threshold: float = 80.0) -> Measured:
    """Read an RGB uint8 [H, W, 3] picture: the background is the median colour of the
    `border`-pixel frame; shape pixels are those further than `threshold` (RGB distance)
    from it; the shape's colour is the mean of the 3x3 pixels at their centre of mass."""
    pixels = image.astype(np.float32)
    frame = np.concatenate([pixels[:border].reshape(-1, 3), pixels[-border:].reshape(-1, 3),
                            pixels[:, :border].reshape(-1, 3), pixels[:, -border:].reshape(-1, 3)])
    background_rgb = np.median(frame, axis=0)
    ys, xs = np.nonzero(np.linalg.norm(pixels - background_rgb, axis=2) > threshold)
    background = nearest_colour(background_rgb)
    if len(ys) == 0:
        return Measured(background, None, None, 0.0)
    cy, cx = int(round(ys.mean())), int(round(xs.mean()))
    centre = pixels[max(cy - 1, 0):cy + 2, max(cx - 1, 0):cx + 2].reshape(-1, 3).mean(axis=0)
    fill = len(ys) / ((ys.max() - ys.min() + 1) * (xs.max() - xs.min() + 1))
    shape = "square" if fill > 0.9 else "circle" if fill > 0.65 else "triangle"
    return Measured(background, nearest_colour(centre), shape, float(fill))


@dataclass(frozen=True)
class Score:
    """Fractions of pictures whose measured colours (and shape) are the asked ones."""

    colours: float  # background AND shape colour right
    shapes: float
    n: int


def score(images: list[np.ndarray], asked: list[tuple[str, str, str]]) -> Score:
    measured = [measure(image) for image in images]
    colours = sum(m.colour == c and m.background == b for m, (c, _, b) in zip(measured, asked))
    shapes = sum(m.shape == s for m, (_, s, _) in zip(measured, asked))
    return Score(colours / len(asked), shapes / len(asked), len(asked))


def score_with_held_out(pictures: dict[tuple[str, str, str], np.ndarray]) -> tuple[Score, Score]:
    """Scores of every picture (one per asked combination) and of the `HELD_OUT` combinations' alone:
    the second says whether the model composes colours and shapes it never saw together."""
    held_out = [combo for combo in pictures if combo in HELD_OUT]
    return (score(list(pictures.values()), list(pictures)),
            score([pictures[combo] for combo in held_out], held_out))

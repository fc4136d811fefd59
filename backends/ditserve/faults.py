"""Fault injection for reliability tests: off unless the deployment's `[faults]` names rules.

Only the deployment file (server side) can enable a fault; no request input can. A rule
fires at one named point of the pipeline for the requests it selects:

    [[faults.rules]]
    point = "denoise"            # see POINTS
    action = "raise"             # raise | sleep | nan | device (denoise, encode, decode)
    marker = "#fault-denoise"    # requests whose prompt contains it ("" = every request)
    height = 0                   # requests of this image height (0 = any)
    step = 0                     # only at this denoise step, 1-based (0 = any; denoise/scheduler_step only)
    seconds = 0.0                # how long `sleep` sleeps (`device`: occupies the emulated device)
    seconds_per_row = 0.0        # `sleep` also sleeps this long per selected row (request or image)

`raise` fails the whole call that contains a selected request (a batched forward fails
for every row in it, as a real exception would); `sleep` stalls it; `nan` poisons only the
selected requests' rows with NaN, which the stages must detect. A `sleep` of `seconds +
seconds_per_row x rows` also lets a tiny CPU pipeline keep a GPU's per-step and per-image
timings (perf/deployments/tiny-pixart-sigma-h200-timing.toml), to reproduce timing-dependent
behaviour without the GPU. `device` (dit's forwards on a CPU only) spends that time on an emulated
device instead of the host (emulated_device.py): dit then queues ahead of it, holds steps and
reads checks late as it does on a GPU. At "encode" and "decode", `device` is that stage's work on
the same emulated device, time-sliced with dit's forwards (`SharedWork`): it delays dit's pending
work by its length and the stage waits for it the longer. The stages call
`FaultInjector.at(point, subjects, values)` once per point; with no rules it returns at once.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, fields
from typing import Any, Sequence

from .emulated_device import EmulatedDevice, SharedWork
from .handoff import default_root

# point -> (where it runs, actions it supports)
POINTS = {
    "encode": ("text_encoder: after the T5 forward of a batch", ("raise", "sleep", "nan", "device")),
    "denoise": ("dit: after the transformer forward of a compatibility group", ("raise", "sleep", "nan", "device")),
    "scheduler_step": ("dit: after one request's scheduler step", ("raise", "sleep", "nan")),
    "decode": ("vae_decode: before the VAE decode of a batch (sees no prompt: select by height)",
               ("raise", "sleep", "nan", "device")),
    "output": ("txt2img/txt2img_stream: while building the final response", ("raise", "sleep")),
}
# Stages that never see the prompt, so a marker could never select anything there.
NO_PROMPT = {"decode"}
STEPPED = {"denoise", "scheduler_step"}


class InjectedFault(RuntimeError):
    """The exception a `raise` rule throws."""


@dataclass(frozen=True)
class Subject:
    """What a rule can select on, for one request (or one row of a batch)."""

    prompt: str = ""
    height: int = 0
    step: int = 0       # the denoise step being run, 1-based (dit only)


@dataclass(frozen=True)
class FaultRule:
    point: str
    action: str
    marker: str = ""
    height: int = 0
    step: int = 0
    seconds: float = 0.0
    seconds_per_row: float = 0.0

    def __post_init__(self):
        if self.point not in POINTS:
            raise ValueError(f"[faults] rule point={self.point!r}; allowed: {sorted(POINTS)}")
        actions = POINTS[self.point][1]
        if self.action not in actions:
            raise ValueError(f"[faults] rule at {self.point!r}: action={self.action!r}; allowed there: {list(actions)}")
        if self.point in NO_PROMPT and self.marker:
            raise ValueError(f"[faults] rule at {self.point!r} cannot use a marker (that stage never sees the prompt); "
                             "select by height")
        if self.step and self.point not in STEPPED:
            raise ValueError(f"[faults] rule at {self.point!r} cannot select a step; only {sorted(STEPPED)} can")
        if self.action in ("sleep", "device") and (self.seconds < 0 or self.seconds_per_row < 0
                                                   or self.seconds + self.seconds_per_row <= 0):
            raise ValueError(f"[faults] {self.action} rule at {self.point!r} needs seconds > 0 or seconds_per_row > 0 "
                             f"(neither negative)")

    def selects(self, subject: Subject) -> bool:
        return ((not self.marker or self.marker in subject.prompt)
                and (not self.height or self.height == subject.height)
                and (not self.step or self.step == subject.step))

    def describe(self) -> str:
        sel = [f"prompt contains {self.marker!r}"] if self.marker else []
        sel += [f"height={self.height}"] if self.height else []
        sel += [f"step {self.step}"] if self.step else []
        return f"{self.action} at {self.point} for {' and '.join(sel) or 'every request'}"


def parse_rules(section: dict) -> tuple[FaultRule, ...]:
    """The `[faults]` table of a deployment: `rules = [{point=..., action=...}, ...]`."""
    unknown = set(section) - {"rules"}
    if unknown:
        raise ValueError(f"deployment [faults] has unknown keys {sorted(unknown)}; allowed: ['rules']")
    known = {f.name for f in fields(FaultRule)}
    rules = []
    for raw in section.get("rules", []):
        extra = set(raw) - known
        if extra:
            raise ValueError(f"[faults] rule has unknown keys {sorted(extra)}; allowed: {sorted(known)}")
        rules.append(FaultRule(**raw))
    return tuple(rules)


class FaultInjector:
    def __init__(self, rules: Sequence[FaultRule] = (), owner: str = ""):
        self.by_point: dict[str, list[FaultRule]] = {}
        for rule in rules:
            self.by_point.setdefault(rule.point, []).append(rule)
        emulated = {rule.point for rule in rules if rule.action == "device"}
        # the device dit shares with the other stages (`device` at "encode" / "decode"), in the
        # server's scratch folder; None when only dit's forwards are emulated
        self.shared = (SharedWork(default_root(kind="emulated_device"))
                       if emulated & {"encode", "decode"} else None)
        # what dit's `device` rules occupy (the engine reads its events); None without one
        self.device = EmulatedDevice(self.shared) if "denoise" in emulated else None
        if rules:
            listed = "; ".join(rule.describe() for rule in rules)
            print(f"ditserve {owner}: FAULT INJECTION ENABLED by the deployment: {listed}", file=sys.stderr, flush=True)

    def at(self, point: str, subjects: Sequence[Subject], values: Any = None) -> Any:
        """Apply the rules of `point` to one call over `subjects` (one per row of `values`).

        `values` is a tensor whose first dim lines up with `subjects`, or a list of tensors
        that does; it comes back unchanged, or with the selected rows set to NaN.
        """
        rules = self.by_point.get(point)
        if not rules:
            return values
        for rule in rules:
            rows = [i for i, subject in enumerate(subjects) if rule.selects(subject)]
            if not rows:
                continue
            seconds = rule.seconds + rule.seconds_per_row * len(rows)   # sleep / device
            if rule.action == "sleep":
                time.sleep(seconds)
            elif rule.action == "device" and point == "denoise":
                self.device.occupy(seconds)
            elif rule.action == "device":   # another stage's work on the device dit's forwards run on
                time.sleep(self.shared.add(seconds))
            elif rule.action == "raise":
                raise InjectedFault(f"injected fault: {rule.describe()}")
            elif rule.action == "nan" and values is not None:
                values = _poison(values, rows)
        return values


def _poison(values, rows: list[int]):
    if isinstance(values, list):
        return [v * float("nan") if i in rows else v for i, v in enumerate(values)]
    values = values.clone()
    values[rows] = float("nan")
    return values


def injector(deployment, owner: str = "") -> FaultInjector:
    return FaultInjector(deployment.faults.rules, owner)

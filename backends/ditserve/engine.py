"""The step engine: a table of in-flight generations and one denoise step over a batch.

Triton's sequence batcher decides *which* requests are in a batch (new ones join at a
step boundary, finished ones leave); the engine decides *how* they run: requests are
grouped by compatibility key and each group shares one transformer forward. Every
group present in a batch is stepped in the same `execute`, so a request never waits
behind another group for more than one forward of each other group (bounded wait).
"""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

from .adapters.base import FamilyAdapter
from .schema import GenerationParams
from .state import RequestState, TextConditioning


@dataclass
class StepReport:
    """What one engine step did, for metrics and logs."""

    forwards: int
    batch_sizes: list[int]
    seconds: float


class StepEngine:
    def __init__(self, adapter: FamilyAdapter):
        self.adapter = adapter
        self.table: dict[str, RequestState] = {}

    def __contains__(self, key: str) -> bool:
        return key in self.table

    def __len__(self) -> int:
        return len(self.table)

    def admit(self, key: str, params: GenerationParams, cond: TextConditioning) -> RequestState:
        if key in self.table:
            raise KeyError(f"request {key} is already in flight")
        state = self.adapter.prepare(key, params, cond)
        self.table[key] = state
        return state

    def step(self, keys: list[str]) -> StepReport:
        """Advance every listed request by exactly one denoise step."""
        start = time.monotonic()
        groups: dict[tuple, list[RequestState]] = defaultdict(list)
        for key in keys:
            state = self.table[key]
            if state.done:
                raise RuntimeError(f"request {key} has no steps left")
            groups[state.compat_key].append(state)
        for states in groups.values():
            outputs = self.adapter.denoise(states)
            for state, output in zip(states, outputs):
                if state.first_step_at is None:
                    state.first_step_at = start
                state.last_seen = start
                self.adapter.scheduler_step(state, output)
        return StepReport(len(groups), [len(g) for g in groups.values()], time.monotonic() - start)

    def release(self, key: str) -> RequestState | None:
        """Drop a request's state; idempotent, so cancel, timeout and error may race."""
        return self.table.pop(key, None)

    def collect_garbage(self, live_keys: set[str], idle_seconds: float) -> list[str]:
        """Release states not seen in any batch for `idle_seconds` (their request never came back)."""
        now = time.monotonic()
        stale = [k for k, s in self.table.items() if k not in live_keys and now - s.last_seen > idle_seconds]
        for key in stale:
            self.release(key)
        return stale

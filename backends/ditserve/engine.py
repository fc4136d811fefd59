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
from dataclasses import dataclass, field

import torch

from .adapters.base import FamilyAdapter
from .faults import FaultInjector, Subject
from .isolation import isolating_failures
from .schema import GenerationParams
from .state import RequestState, TextConditioning


@dataclass
class StepReport:
    """What one engine step did, for metrics and logs."""

    forwards: int
    batch_sizes: list[int]
    seconds: float
    # key -> why that request cannot go on (names the step and the point that failed).
    # Its state stays in the table: the caller ends the request and releases it.
    failed: dict[str, str] = field(default_factory=dict)
    # Group forwards that failed and were retried one request at a time.
    isolation_retries: int = 0


def _subject(state: RequestState) -> Subject:
    return Subject(state.params.prompt, state.params.height, state.step_index + 1)


class StepEngine:
    def __init__(self, adapter: FamilyAdapter, faults: FaultInjector | None = None):
        self.adapter = adapter
        self.faults = faults or FaultInjector()
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
        """Advance every listed request by exactly one denoise step.

        A failure is contained: a failing group forward is retried one request at a time
        (so a poisoned request does not take its batch peers down), a failing scheduler
        step or non-finite latents fail only their request, and other groups go on. The
        failed requests are listed in the report, never half-stepped silently.
        """
        start = time.monotonic()
        groups: dict[tuple, list[RequestState]] = defaultdict(list)
        for key in keys:
            state = self.table[key]
            if state.done:
                raise RuntimeError(f"request {key} has no steps left")
            groups[state.compat_key].append(state)
        report, checks = StepReport(0, [], 0.0), []
        for states in groups.values():
            for state in states:
                if state.first_step_at is None:
                    state.first_step_at = start
                state.last_seen = start
            self._step_group(states, report, checks)
        if checks:
            # NaN/inf never reaches the VAE: one device sync per step reads every request's flags.
            flags = torch.stack([flag for _, _, pair in checks for flag in pair]).tolist()
            for i, (state, where, _) in enumerate(checks):
                if not flags[2 * i]:
                    report.failed[state.key] = f"{where[0]} produced non-finite values (NaN/inf) in the transformer " \
                                               f"output {where[1]}"
                elif not flags[2 * i + 1]:
                    report.failed[state.key] = f"{where[0]} produced non-finite latents (NaN/inf) in the scheduler " \
                                               f"step {where[1]}"
        report.forwards, report.seconds = len(report.batch_sizes), time.monotonic() - start
        return report

    def _step_group(self, states: list[RequestState], report: StepReport, checks: list) -> None:
        """One forward over a compatibility group (split per request if it fails), then steps."""
        def fail(state: RequestState, exc: Exception) -> None:
            report.failed[state.key] = (f"denoise step {state.step_index + 1}/{state.total_steps} failed in "
                                        f"the transformer forward: {type(exc).__name__}: {exc}")

        report.isolation_retries += isolating_failures(
            states, lambda group: self._forward_and_step(group, report, checks), fail)

    def _forward_and_step(self, states: list[RequestState], report: StepReport, checks: list) -> None:
        """Raises only from the forward, before any state changed; scheduler failures are per request."""
        outputs = self.faults.at("denoise", [_subject(s) for s in states], self.adapter.denoise(states))
        report.batch_sizes.append(len(states))
        batch = f"(in a forward of {len(states)} request{'s' if len(states) > 1 else ''})"
        for state, output in zip(states, outputs):
            step, subject = f"denoise step {state.step_index + 1}/{state.total_steps}", _subject(state)
            try:
                self.adapter.scheduler_step(state, output)
                state.latents = self.faults.at("scheduler_step", [subject], [state.latents])[0]
            except Exception as exc:
                report.failed[state.key] = f"{step} failed in the scheduler step {batch}: {type(exc).__name__}: {exc}"
                continue
            checks.append((state, (step, batch), (torch.isfinite(output).all(), torch.isfinite(state.latents).all())))

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

"""Failure isolation for batched work: one bad request must not fail its batch peers."""
from __future__ import annotations

from typing import Callable, Sequence, TypeVar

T = TypeVar("T")


def isolating_failures(items: Sequence[T], run: Callable[[Sequence[T]], None],
                       fail: Callable[[T, Exception], None]) -> int:
    """Run `run(items)` as one batch; if it raises, retry each item alone, so only an item
    that fails by itself is failed (`fail(item, exc)`). `run` must leave nothing half done
    when it raises. Returns how many batches had to be split."""
    try:
        run(items)
        return 0
    except Exception as exc:
        if len(items) == 1:
            fail(items[0], exc)
            return 0
    return 1 + sum(isolating_failures([item], run, fail) for item in items)

"""ditserve.handoff: the conditioning a public model hands to dit out of band (pure logic).

The writer (a public model) has no torch: it writes safetensors from raw bytes; the reader
(dit) loads with safetensors.torch, so these round trips check the writer against it."""
from __future__ import annotations

import os
import time

import pytest
import torch

from ditserve.handoff import Arrivals, ConditioningStore, HostTensor


def host(tensor: torch.Tensor) -> HostTensor:
    return HostTensor.from_numpy(tensor.numpy())


def test_take_returns_what_was_put_and_removes_it(tmp_path):
    store = ConditioningStore(tmp_path / "handoff")
    sent = {"embeds": torch.randn(2, 7, 4), "mask": torch.ones(2, 7, dtype=torch.int64)}
    store.put("gen-1", {name: host(t) for name, t in sent.items()})
    before = time.monotonic()
    handover = store.take("gen-1")
    got = handover.tensors
    assert got.keys() == sent.keys() and all(torch.equal(got[k], sent[k]) for k in sent)
    assert 0 <= before - handover.handed_at < 60   # stamped at put, on the host's monotonic clock
    assert not list(store.root.iterdir())
    with pytest.raises(KeyError, match="no conditioning was handed over for generation gen-1"):
        store.take("gen-1")


def test_discard_is_idempotent_and_ids_cannot_name_paths(tmp_path):
    store = ConditioningStore(tmp_path / "handoff")
    store.put("gen-2", {"embeds": host(torch.zeros(1))})
    store.discard("gen-2")
    store.discard("gen-2")
    assert not list(store.root.iterdir())
    with pytest.raises(ValueError, match="not a safe file name"):
        store.put("../escape", {"embeds": host(torch.zeros(1))})


def test_garbage_collection_drops_only_old_entries(tmp_path):
    store = ConditioningStore(tmp_path / "handoff")
    store.put("old", {"embeds": host(torch.zeros(1))})
    store.put("new", {"embeds": host(torch.zeros(1))})
    past = time.time() - 600
    os.utime(store.root / "old", (past, past))
    assert store.collect_garbage(300) == 1
    assert [p.name for p in store.root.iterdir()] == ["new"]


def test_bf16_bytes_and_a_dropped_batch_dim_read_back_as_torch(tmp_path):
    """BF16 has no numpy dtype: the public model hands its raw bytes over (stages/dlpack.py)."""
    store = ConditioningStore(tmp_path / "handoff")
    embeds = torch.randn(1, 2, 5, 3).to(torch.bfloat16)
    raw = HostTensor("BF16", tuple(embeds.shape), embeds.view(torch.int16).numpy().tobytes())
    store.put("gen-3", {"embeds": raw.without_batch(), "mask": host(torch.ones(2, 5, dtype=torch.int64))})
    got = store.take("gen-3").tensors
    assert got["embeds"].dtype == torch.bfloat16 and torch.equal(got["embeds"], embeds[0])
    assert torch.equal(got["mask"], torch.ones(2, 5, dtype=torch.int64))


def test_a_host_tensor_must_match_its_dtype_and_shape():
    with pytest.raises(ValueError, match="7 bytes for a F32 tensor of shape \\[2\\]"):
        HostTensor("F32", (2,), b"\0" * 7)
    with pytest.raises(ValueError, match="dtype 'F8'; allowed"):
        HostTensor("F8", (1,), b"\0")
    with pytest.raises(ValueError, match="expected a batch of one, got shape \\[2, 3\\]"):
        HostTensor("U8", (2, 3), b"\0" * 6).without_batch()


def test_an_announced_generation_is_pending_until_withdrawn_and_a_stale_one_never(tmp_path):
    arrivals = Arrivals(tmp_path / "incoming")
    assert not arrivals.pending()
    arrivals.announce("gen-3")
    assert arrivals.pending()
    arrivals.discard("gen-3")
    arrivals.discard("gen-3")
    assert not arrivals.pending()
    arrivals.announce("dead-writer")   # its public model died between announcing and withdrawing
    past = time.time() - Arrivals.MAX_AGE_S - 1
    os.utime(arrivals.root / "dead-writer", (past, past))
    assert not arrivals.pending(), "a stale announcement must not hold dit's steps"
    assert arrivals.collect_garbage(Arrivals.MAX_AGE_S) == 1
    arrivals.remove_all()   # dit unloaded; a public model still serving announces again
    arrivals.announce("gen-5")
    assert arrivals.pending()


def test_a_hold_lasts_until_the_handover_the_idle_device_or_the_withdrawal(tmp_path):
    """dit holds its next step only while all three hold: a generation is announced, nothing was
    handed over yet, and the device still runs queued work."""
    arrivals = Arrivals(tmp_path / "incoming")
    polls = []

    def busy_for(n: int):   # a device that finishes its queued work at the n-th poll
        polls.clear()
        return lambda: polls.append(1) or len(polls) < n

    assert not arrivals.hold(busy_for(9), lambda: False), "nothing announced: no hold"
    arrivals.announce("gen-4")
    assert not arrivals.hold(lambda: False, lambda: False), "an idle device is never held for"
    assert arrivals.hold(busy_for(9), lambda: len(polls) >= 3) and len(polls) == 3, "ends at the handover"
    assert arrivals.hold(busy_for(4), lambda: False) and len(polls) == 4, "ends when the device is idle"
    device = busy_for(9)

    def withdrawn_at_the_third_poll():
        if len(polls) == 2:
            arrivals.discard("gen-4")
        return device()
    assert arrivals.hold(withdrawn_at_the_third_poll, lambda: False) and len(polls) == 3, "ends when withdrawn"

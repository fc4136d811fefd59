"""ditserve.handoff: the conditioning a public model hands to dit out of band (pure logic)."""
from __future__ import annotations

import os
import time

import pytest
import torch

from ditserve.handoff import ConditioningStore


def test_take_returns_what_was_put_and_removes_it(tmp_path):
    store = ConditioningStore(tmp_path / "handoff")
    sent = {"embeds": torch.randn(2, 7, 4), "mask": torch.ones(2, 7, dtype=torch.int64)}
    store.put("gen-1", sent)
    got = store.take("gen-1")
    assert got.keys() == sent.keys() and all(torch.equal(got[k], sent[k]) for k in sent)
    assert not list(store.root.iterdir())
    with pytest.raises(KeyError, match="no conditioning was handed over for generation gen-1"):
        store.take("gen-1")


def test_discard_is_idempotent_and_ids_cannot_name_paths(tmp_path):
    store = ConditioningStore(tmp_path / "handoff")
    store.put("gen-2", {"embeds": torch.zeros(1)})
    store.discard("gen-2")
    store.discard("gen-2")
    assert not list(store.root.iterdir())
    with pytest.raises(ValueError, match="not a safe file name"):
        store.put("../escape", {"embeds": torch.zeros(1)})


def test_garbage_collection_drops_only_old_entries(tmp_path):
    store = ConditioningStore(tmp_path / "handoff")
    store.put("old", {"embeds": torch.zeros(1)})
    store.put("new", {"embeds": torch.zeros(1)})
    past = time.time() - 600
    os.utime(store.root / "old", (past, past))
    assert store.collect_garbage(300) == 1
    assert [p.name for p in store.root.iterdir()] == ["new"]

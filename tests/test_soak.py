"""Bounded soak (< 90 s) against a server of its own (`soak_server`): concurrent streams and unary calls with
~5 % client cancellations and ~2 % bad requests.

Every request must get exactly one terminal outcome on the client (image, error, or the
cancel we made), the server must stay ready, and the engine's state table must be empty at
the end. Resource figures (tritonserver + stub RSS, open fds, /dev/shm bytes the server
maps, state table; perf/resources.py) are sampled throughout; their deltas and slopes after
warm-up are printed (`pytest -s`) and held to loose bounds. The long recipe with arrivals
below, near and above saturation and injected faults is perf/soak.py.
"""
from __future__ import annotations

import os
import queue
import random
import sys
import threading
import time
import traceback
import uuid
from collections import Counter
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient

from ditserve.client import GenerationRequest, cancel_inputs
from helpers import grpc_inputs, scrape, wait_for_metric

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "perf"))
import resources  # noqa: E402  (perf/resources.py: the sampler perf/soak.py uses too)

DURATION_S = float(os.environ.get("DITSERVE_SOAK_SECONDS", 40))   # longer runs by hand: =600
WORKERS = 6
CANCEL_P, BAD_P, UNARY_P = 0.05, 0.02, 0.3
LAST_REQUEST_S = 180   # a request started before the end gets its outcome within this (clients wait 120 s)
BAD_REQUESTS = [   # (request, words of the error)
    (GenerationRequest("bad size", height=72, num_inference_steps=2), "height"),
    (GenerationRequest("   ", num_inference_steps=2), "prompt"),
    (GenerationRequest("bad guidance", guidance_scale=float("nan"), num_inference_steps=2), "guidance_scale"),
    (GenerationRequest("bad steps", num_inference_steps=0), "num_inference_steps"),
]


def _stacks(threads: list[threading.Thread]) -> str:
    """Where each of `threads` is now (a hung client is a finding: show it)."""
    frames = sys._current_frames()
    return "\n".join(f"{t.name}:\n{''.join(traceback.format_stack(frames[t.ident]))}"
                     for t in threads if t.ident in frames)


def sample(server) -> dict:
    return resources.sample(server.process.pid, lambda: scrape(server.metrics_url).get(
        ("ditserve_state_table_size", "dit"), 0.0))


# ---- load ---------------------------------------------------------------------------------
class Ledger:
    """Terminal outcomes per request id, as the client saw them."""

    def __init__(self):
        self.lock = threading.Lock()
        self.terminals: dict[str, list[str]] = {}
        self.kinds: dict[str, str] = {}        # what each request was: ok / bad / cancel
        self.problems: list[str] = []

    def start(self, rid: str, kind: str) -> None:
        with self.lock:
            self.terminals[rid], self.kinds[rid] = [], kind

    def terminal(self, rid: str, outcome: str) -> None:
        with self.lock:
            self.terminals[rid].append(outcome)

    def problem(self, text: str) -> None:
        with self.lock:
            self.problems.append(text)


def _stream_request(url: str, request: GenerationRequest, rid: str, ledger: Ledger, cancel_after: int | None,
                    bad_words: str | None, by_id: bool = False) -> None:
    """One stream, cancelled after `cancel_after` progress responses if set: its gRPC call, or
    `by_id` through the `cancel` model, when the stream is read on to its one terminal response."""
    if by_id:
        _stream_cancelled_by_id(url, request, rid, ledger, cancel_after)
        return
    client = grpcclient.InferenceServerClient(url)
    responses: queue.Queue = queue.Queue()

    def callback(result, error):
        if error is not None:
            responses.put(("error", error.message()))
        elif result.as_numpy("image") is not None:
            responses.put(("image", result.as_numpy("image")))
        else:
            responses.put(("progress", None))

    client.start_stream(callback=callback)
    client.async_stream_infer("txt2img_stream", grpc_inputs(request), request_id=rid)
    progress, cancelled = 0, False
    while True:
        kind, value = responses.get(timeout=120)
        if kind == "progress":
            progress += 1
            if cancel_after is not None and progress >= cancel_after:
                client.stop_stream(cancel_requests=True)
                cancelled = True
                ledger.terminal(rid, "cancelled")
                break
            continue
        ledger.terminal(rid, kind)
        _check(ledger, rid, kind, value, request, bad_words)
        break
    if not cancelled:
        client.stop_stream()   # returns once the server closed the stream: a 2nd terminal would be in by now
    late = []
    while not responses.empty():
        kind, value = responses.get()
        # tritonclient reports our own stream cancel as a local error: not a server response.
        if kind != "progress" and not (cancelled and kind == "error" and "cancel" in str(value).lower()):
            late.append(kind)
    if cancelled and len(late) > 1:
        # The cancel can cross the server's one terminal response (media or the cancel error)
        # in flight; two of them would be a duplicate.
        ledger.terminal(rid, "+".join(late))
    elif not cancelled:
        for kind in late:
            ledger.terminal(rid, kind)   # a second terminal outcome
    client.close()


def _stream_cancelled_by_id(url: str, request: GenerationRequest, rid: str, ledger: Ledger, cancel_after: int) -> None:
    """Cancelled by id after `cancel_after` progress responses: its one terminal response is the
    CANCELLED error, or the image when the cancel came after the last step; nothing after it."""
    client = grpcclient.InferenceServerClient(url)
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    client.async_stream_infer("txt2img_stream", grpc_inputs(request), request_id=rid)
    progress, outcomes = 0, []
    while not outcomes:
        result, error = responses.get(timeout=120)
        if error is not None:
            outcomes.append("cancelled" if error.message() == "request cancelled" else f"error: {error.message()}")
        elif result.as_numpy("image") is not None:
            outcomes.append("image")
        else:
            progress += 1
            if progress == cancel_after:
                client.infer("cancel", cancel_inputs(grpcclient, rid))
    client.stop_stream()   # returns once the server closed the stream: a 2nd terminal would be in by now
    while not responses.empty():
        result, error = responses.get()
        if error is not None or result.as_numpy("image") is not None:
            outcomes.append("late " + ("error" if error is not None else "image"))
    for outcome in outcomes:
        ledger.terminal(rid, outcome)
        if outcome not in ("cancelled", "image"):
            ledger.problem(f"{rid}: cancelled by id, got {outcome}")
    client.close()


def _unary_request(url: str, request: GenerationRequest, rid: str, ledger: Ledger, bad_words: str | None) -> None:
    with grpcclient.InferenceServerClient(url) as client:
        try:
            result = client.infer("txt2img", grpc_inputs(request), request_id=rid, client_timeout=120)
            kind, value = "image", result.as_numpy("image")
        except Exception as exc:  # noqa: BLE001 - classified below
            kind, value = "error", str(exc)
    ledger.terminal(rid, kind)
    _check(ledger, rid, kind, value, request, bad_words)


def _check(ledger: Ledger, rid: str, kind: str, value, request: GenerationRequest, bad_words: str | None) -> None:
    if bad_words is not None:
        if kind != "error" or bad_words not in value:
            ledger.problem(f"{rid}: bad request got {kind}: {value if kind == 'error' else ''}")
    elif kind != "image":
        ledger.problem(f"{rid}: good request got {kind}: {value}")
    elif value.shape != (request.height or 64, request.width or 64, 3):
        ledger.problem(f"{rid}: image shape {value.shape}")


def _worker(url: str, seed: int, deadline: float, ledger: Ledger) -> None:
    rng = random.Random(seed)
    while time.monotonic() < deadline:
        rid = uuid.uuid4().hex
        roll = rng.random()
        try:
            if roll < BAD_P:
                request, words = rng.choice(BAD_REQUESTS)
                ledger.start(rid, "bad")
                if rng.random() < UNARY_P:
                    _unary_request(url, request, rid, ledger, words)
                else:
                    _stream_request(url, request, rid, ledger, None, words)
                continue
            request = GenerationRequest(f"soak {rid[:6]}", seed=rng.randrange(2**31),
                                        num_inference_steps=rng.randint(2, 12), height=rng.choice([32, 64, 96]),
                                        width=rng.choice([32, 64]), guidance_scale=rng.choice([1.0, 4.5]))
            if roll < BAD_P + CANCEL_P:
                # Half by request id, at any step (the last included); half by cancelling the gRPC call
                # with at least half of the steps to go: a call cancel that crosses the final response
                # can segfault Triton 2.51's gRPC front end (docs/reliability.md, "Known crash of
                # Triton 2.51 under client cancels"); ours must hold for any cancel the server sees.
                request.num_inference_steps = rng.randint(8, 16)
                ledger.start(rid, "cancel")
                if rng.random() < 0.5:
                    _stream_request(url, request, rid, ledger, rng.randint(1, request.num_inference_steps), None,
                                    by_id=True)
                else:
                    _stream_request(url, request, rid, ledger, rng.randint(1, request.num_inference_steps // 2), None)
            elif roll < BAD_P + CANCEL_P + UNARY_P:
                ledger.start(rid, "ok")
                _unary_request(url, request, rid, ledger, None)
            else:
                ledger.start(rid, "ok")
                _stream_request(url, request, rid, ledger, None, None)
        except Exception as exc:  # noqa: BLE001 - a hang or client failure is a finding
            ledger.problem(f"{rid}: client failed: {type(exc).__name__}: {exc}")


def test_soak_every_request_ends_once_and_nothing_leaks(soak_server):
    before = scrape(soak_server.metrics_url)
    samples = [sample(soak_server)]
    ledger = Ledger()
    deadline = time.monotonic() + DURATION_S
    threads = [threading.Thread(target=_worker, args=(soak_server.grpc_url, i, deadline, ledger), daemon=True)
               for i in range(WORKERS)]
    for thread in threads:
        thread.start()
    not_ready = 0
    with grpcclient.InferenceServerClient(soak_server.grpc_url) as health:
        while any(t.is_alive() for t in threads):
            time.sleep(2)
            if time.monotonic() > deadline + LAST_REQUEST_S:
                pytest.fail(f"client workers still running {LAST_REQUEST_S} s after the soak's end (no request "
                            f"takes that long):\n{_stacks([t for t in threads if t.is_alive()])}")
            try:
                samples.append(sample(soak_server))
                not_ready += not health.is_server_ready(client_timeout=10)
            except Exception as exc:  # noqa: BLE001 - the server died or hangs: show why
                pytest.fail(f"the server stopped answering during the soak ({exc}; exit code "
                            f"{soak_server.process.poll()}; kinds so far {dict(Counter(ledger.kinds.values()))}):\n"
                            f"{soak_server.log_tail(60)}")
    assert wait_for_metric(soak_server.metrics_url, "ditserve_state_table_size", "dit", 0.0) == 0.0, "state leaked"
    time.sleep(1)
    samples.append(sample(soak_server))
    after = scrape(soak_server.metrics_url)

    outcomes = Counter(tuple(v) for v in ledger.terminals.values())
    kinds = Counter(ledger.kinds.values())
    warm = samples[len(samples) // 4:]
    delta = {key: warm[-1][key] - warm[0][key] for key in ("rss_mb", "fds", "shm_mb", "stubs")}
    print(f"\nsoak: {len(ledger.terminals)} requests in {DURATION_S} s by {WORKERS} workers; kinds {dict(kinds)}; "
          f"outcomes {dict(outcomes)}")
    print(f"soak: rss {samples[0]['rss_mb']:.0f} -> {samples[-1]['rss_mb']:.0f} MB "
          f"(after warm-up {delta['rss_mb']:+.1f} MB, {resources.slope_per_min(warm, 'rss_mb'):+.1f} MB/min); "
          f"fds {samples[0]['fds']} -> {samples[-1]['fds']} ({delta['fds']:+d}, "
          f"{resources.slope_per_min(warm, 'fds'):+.2f}/min); /dev/shm {samples[0]['shm_mb']:.1f} -> "
          f"{samples[-1]['shm_mb']:.1f} MB ({delta['shm_mb']:+.1f}); processes {samples[0]['processes']} -> "
          f"{samples[-1]['processes']}; state table max {max(s['state_table'] for s in samples):.0f}, "
          f"end {samples[-1]['state_table']:.0f}")
    counters = {name: sum(after.get((name, m), 0) - before.get((name, m), 0) for m in ("txt2img", "txt2img_stream"))
                for name in ("ditserve_requests_completed_total", "ditserve_requests_failed_total",
                             "ditserve_requests_cancelled_total")}
    print(f"soak: server counters {counters}")
    growth = {name: round(warm[-1]["by_process"].get(name, 0) - mb, 1) for name, mb in warm[0]["by_process"].items()}
    print(f"soak: RSS growth after warm-up per process (MB): {dict(sorted(growth.items(), key=lambda kv: -kv[1]))}")

    assert not ledger.problems, ledger.problems[:10]
    assert all(len(v) == 1 for v in ledger.terminals.values()), \
        {rid: v for rid, v in ledger.terminals.items() if len(v) != 1}
    assert kinds["ok"] > 50 and kinds["cancel"] > 0 and kinds["bad"] > 0, kinds
    assert not_ready == 0, "the server stopped being ready"
    images = outcomes[("image",)]
    # A cancel the server saw after the last step still completed there: completed is in between.
    assert images <= counters["ditserve_requests_completed_total"] <= images + kinds["cancel"]
    assert counters["ditserve_requests_failed_total"] == kinds["bad"], "only the bad requests failed"
    assert counters["ditserve_requests_cancelled_total"] <= kinds["cancel"]
    assert samples[-1]["state_table"] == 0
    assert samples[0]["stubs"] >= 5, "the sampler counts the stubs (3 stages and the public models' instances)"
    assert delta["stubs"] == 0, "stub processes came or went"
    assert delta["fds"] <= 20, f"open fds grew by {delta['fds']}"
    assert delta["shm_mb"] <= 64, f"/dev/shm grew by {delta['shm_mb']:.1f} MB"
    assert delta["rss_mb"] <= 500, f"RSS grew by {delta['rss_mb']:.0f} MB"


def test_soak_phases_take_length_weights():
    """perf/soak.py --phases: `FxW` makes a phase W times as long (a longer steady last phase for
    the slope fit); plain fractions keep weight 1; a zero or unreadable item is refused by name."""
    import soak   # perf/soak.py (perf/ is on the path above)
    assert soak.parse_phases("0.6,0.95,1.3,0.8x2") == ([0.6, 0.95, 1.3, 0.8], [1.0, 1.0, 1.0, 2.0])
    assert soak.parse_phases("0.5, 0.9,") == ([0.5, 0.9], [1.0, 1.0])
    for bad, words in (("0.8xx", "'0.8xx'"), ("0.8x0", "must be > 0"), ("", "at least one")):
        with pytest.raises(SystemExit, match=words):
            soak.parse_phases(bad)

"""Cancelling a generation by its request id through the `cancel` model (real server, tiny PixArt).

Unlike a cancelled gRPC call, which can crash Triton 2.51 when it meets the final response
(docs/reliability.md), a cancel by id leaves the generation's call alone: the stream ends
with one CANCELLED error response, and unary gRPC and HTTP calls can be cancelled as well.
"""
from __future__ import annotations

import os
import subprocess
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from ditserve.cancellation import PENDING_CANCEL_S, ClientCancels
from ditserve.client import DitClient, GenerationRequest
from helpers import StreamCall, delta_of, scrape, settled_scrape, wait_for_metric

STREAM = "txt2img_stream"
CANCELLED = "ditserve_requests_cancelled_total"


def _long(prompt: str, steps: int = 60) -> GenerationRequest:
    return GenerationRequest(prompt, seed=5, num_inference_steps=steps, height=128, width=128)


def _served_cleanly(server) -> None:
    """The state table empties and the next request gets its image."""
    assert wait_for_metric(server.metrics_url, "ditserve_state_table_size", "dit", 0.0) == 0.0
    with DitClient(server.grpc_url, "grpc") as client:
        assert client.generate(GenerationRequest("next", seed=1, num_inference_steps=2)).media.shape == (64, 64, 3)


def test_the_records_of_a_request_id_through_its_life(tmp_path):
    """Pure logic of cancellation.ClientCancels: pending before the start, cancelling while it
    runs, finished after; a reused id starts clean."""
    cancels = ClientCancels(root=tmp_path / "client-cancel")
    assert cancels.request("queued") == "pending"
    cancels.start("queued")
    assert cancels.cancelled("queued")              # a cancel sent while it was queued
    job = cancels.start("job")
    assert not cancels.cancelled("job")
    assert cancels.request("job") == "cancelling" and cancels.cancelled("job")
    cancels.end("job", job)
    assert not cancels.cancelled("job") and cancels.request("job") == "finished"
    again = cancels.start("job")                    # the same id again: a new generation
    assert not cancels.cancelled("job") and cancels.request("job") == "cancelling"
    cancels.end("job", again)
    assert cancels.request("any id / even ../this") == "pending"   # hashed: any id is a safe name
    cancels.remove_all()
    assert not (tmp_path / "client-cancel").exists()


def test_expired_records_are_dropped_off_the_response_path_once_for_all_processes(tmp_path):
    """A generation's end starts the collection of records older than PENDING_CANCEL_S (and of
    running records whose process died) in a thread; another process of the server (another
    ClientCancels on the folder) skips it within the minute, as the stamp says it was done."""
    cancels, other = (ClientCancels(root=tmp_path / "client-cancel") for _ in range(2))
    cancels.request("stale cancel")
    cancels.end("stale end", cancels.start("stale end"))
    cancels.collector.join()                          # the first end collected (nothing was old yet)
    dead = subprocess.Popen(["true"])                 # a stub that died mid-generation: its record stays
    dead.wait()
    cancels.running.mark(f"{ClientCancels.key('orphan')}.{dead.pid}.0")
    old = time.time() - PENDING_CANCEL_S - 1
    for records in (cancels.flags, cancels.ended):
        for entry in records.root.iterdir():
            os.utime(entry, (old, old))
    other.end("fresh", other.start("fresh"))
    assert other.collector is None                    # stamped less than a minute ago by `cancels`
    assert cancels.request("stale end") == "finished"   # not collected: this process did, < 1 min ago
    cancels.collected_at = 0.0
    cancels.stamp.touch()
    os.utime(cancels.stamp, (old, old))
    cancels.end("fresh", cancels.start("fresh"))
    cancels.collector.join()
    assert not cancels.cancelled("stale cancel") and cancels.request("stale end") == "pending"
    assert cancels.request("fresh") == "finished" and cancels.request("orphan") == "pending"


def test_two_generations_with_one_id_are_cancelled_together(tmp_path):
    """Clients may reuse an id: while any generation with it runs, a cancel reaches every one of
    them, also after another with that id ended."""
    cancels = ClientCancels(root=tmp_path / "client-cancel")
    first, second = cancels.start("job"), cancels.start("job")
    cancels.end("job", first)                       # ended before any cancel
    assert cancels.request("job") == "cancelling" and cancels.cancelled("job")   # the second still runs
    third = cancels.start("job")
    cancels.end("job", second)                      # saw the cancel and ended: the third has yet to see it
    assert cancels.cancelled("job")
    cancels.end("job", third)
    assert not cancels.cancelled("job") and cancels.request("job") == "finished"


@pytest.mark.parametrize("after_steps", [1, 30, 59], ids=["first", "middle", "last"])
def test_a_stream_cancelled_by_id_ends_with_one_cancelled_error(server, after_steps):
    """After 59 of 60 steps the cancel meets the final latents or the decode: the crash regime of
    a gRPC cancel. By id, the generation ends exactly once: cancelled (no response but the error),
    or, when the cancel came too late, with its image and the cancel answered `finished`."""
    before = settled_scrape(server.metrics_url)
    call = StreamCall(server.grpc_url, _long("doomed")).start()
    call.wait_progress(after_steps)
    state = call.cancel_by_id()
    kind, value = call.outcome()
    assert wait_for_metric(server.metrics_url, "ditserve_state_table_size", "dit", 0.0) == 0.0
    delta = delta_of(before, settled_scrape(server.metrics_url), STREAM)
    assert delta("ditserve_requests_failed_total") == 0
    if kind == "error":
        assert value == "request cancelled" and state in ("cancelling", "finished"), state
        assert delta(CANCELLED) == 1 and delta("ditserve_requests_completed_total") == 0
        # Triton 2.51 counts a decoupled request ended by an error response as a success (docs/metrics.md)
        assert delta("nv_inference_request_success") == 1
        if after_steps < 59:
            assert state == "cancelling" and delta("nv_inference_count", "vae_decode") == 0, "no decode after a cancel"
    else:
        assert after_steps == 59 and kind == "image" and value.shape == (128, 128, 3), (after_steps, kind)
        assert delta(CANCELLED) == 0 and delta("ditserve_requests_completed_total") == 1
    with DitClient(server.grpc_url, "grpc") as client:
        assert client.cancel(call.request_id) == "finished"   # a late cancel changes nothing
    _served_cleanly(server)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_unary_call_is_cancelled_from_another_thread(server, protocol):
    """A unary gRPC or HTTP client has no stream to cancel: its generation is ended by id from
    elsewhere, and its call raises the CANCELLED error."""
    before = settled_scrape(server.metrics_url)
    request_id = f"unary-{protocol}-{time.monotonic_ns()}"
    outcome: dict = {}

    def run() -> None:
        with DitClient(server.http_url if protocol == "http" else server.grpc_url, protocol) as client:
            try:
                outcome["result"] = client.generate(_long("doomed unary", steps=100), request_id=request_id)
            except InferenceServerException as exc:
                outcome["error"] = exc.message()

    worker = threading.Thread(target=run)
    worker.start()
    first_steps = ("ditserve_time_to_first_step_seconds_count", "txt2img")
    expected = before.get(first_steps, 0) + 1
    assert wait_for_metric(server.metrics_url, *first_steps, expected) == expected, outcome   # it denoises
    with DitClient(server.grpc_url, "grpc") as canceller:
        assert canceller.cancel(request_id) == "cancelling"
    worker.join(timeout=120)
    assert not worker.is_alive() and outcome == {"error": "request cancelled"}, outcome
    expected = before.get((CANCELLED, "txt2img"), 0) + 1
    assert wait_for_metric(server.metrics_url, CANCELLED, "txt2img", expected) == expected
    _served_cleanly(server)
    assert delta_of(before, scrape(server.metrics_url), "txt2img")("nv_inference_count", "vae_decode") == 1  # "next"


def test_a_cancel_sent_before_its_request_ends_it_before_any_model_work(server):
    """A cancel for an id the server has not seen yet (still queued, or not sent) is `pending`:
    the request ends as it starts, before its prompt is encoded."""
    before = settled_scrape(server.metrics_url)
    call = StreamCall(server.grpc_url, _long("never run"))
    with DitClient(server.grpc_url, "grpc") as client:
        assert client.cancel(call.request_id) == "pending"
    assert call.start().outcome() == ("error", "request cancelled")
    assert call.progress == []
    delta = delta_of(before, settled_scrape(server.metrics_url), STREAM)
    assert delta(CANCELLED) == 1
    assert delta("nv_inference_count", "text_encoder") == 0 and delta("nv_inference_count", "dit") == 0


def test_a_reused_id_still_cancels_the_generation_that_runs(server):
    """Two streams sent with one id: the second ends at once (rejected: too many steps), then a
    cancel by that id still reaches the first (each generation keeps its own running record)."""
    before = settled_scrape(server.metrics_url)
    long = StreamCall(server.grpc_url, _long("long twin")).start()
    long.wait_progress(1)
    twin = StreamCall(server.grpc_url, GenerationRequest("bad twin", num_inference_steps=1000),
                      request_id=long.request_id).start()
    kind, message = twin.outcome()
    assert kind == "error" and "num_inference_steps" in message, message
    assert long.cancel_by_id() == "cancelling"
    assert long.outcome() == ("error", "request cancelled")
    assert wait_for_metric(server.metrics_url, "ditserve_state_table_size", "dit", 0.0) == 0.0
    delta = delta_of(before, settled_scrape(server.metrics_url), STREAM)
    assert delta(CANCELLED) == 1 and delta("ditserve_requests_failed_total") == 1


def test_the_cancel_model_rejects_a_missing_id_with_what_to_send(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        tensor = grpcclient.InferInput("request_id", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([b""], dtype=np.object_))
        with pytest.raises(InferenceServerException, match="input 'request_id' must be one non-empty string") as err:
            client.infer("cancel", [tensor])
        assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    finally:
        client.close()

"""Generations that stop early leave nothing behind: after client cancels and request timeouts
mid-denoise, and then a storm of client cancels on `txt2img_stream`, that model unloads promptly
and the server stops cleanly, with no stub crash. One server (explicit model control) runs both
phases: each used to start its own, and each ends by taking the server down.

Why the early stops: the exception of an early stop used to sit in a reference cycle with the
frames of its own traceback, which held BLS tensors. Python's cyclic GC freed those later, on
whichever thread it ran, and Triton 2.51's stubs segfault when that thread is one of their own
or when it happens at exit. The H200 soak lost a txt2img_stream instance this way mid-run. On
CPU, before the fix (stages/generate.py `Stop`), four stubs segfaulted at shutdown in every run of
this scenario. The log then says "Fatal Python error: Segmentation fault ... Garbage-collecting".

Why the storm: Triton unloads a model only once every request, response factory and response of
it is gone; a cancelled stream whose final flag we never sent (or whose response sender we kept)
would keep `txt2img_stream` in UNLOADING for good, and server shutdown would wait out its exit
timeout. The storm cancels requests while they are queued, being encoded and mid-denoise (the
paths our models end), from several gRPC streams at once, as tritonclient users do.

Triton 2.51 does not deliver every stream cancel: a few storm requests, cancelled after 16-29
of their 60 progress responses, ran to their image with `is_cancelled()` false at every check,
several in one step batch at a time (perf/results/2026-12-04-cpu-storm-lost-cancels.md). The
storm therefore allows that share of completions, and fails when more complete.

Not covered here: cancels that cross the final response (the image) in flight. With Triton 2.51
those can leave the model UNLOADING for good inside Triton's gRPC frontend, whatever the model
does (docs/reliability.md, "Unload after cancel storms"; `perf/cancel_storm.py --cancel-at final`).
"""
from __future__ import annotations

import sys

import pytest

from conftest import ROOT, TINY_PIXART
from ditserve.client import GenerationRequest
from helpers import StreamCall, assert_stops_cleanly, delta_of, scrape, wait_for_metric

sys.path.insert(0, str(ROOT / "perf"))
from cancel_storm import MODEL, explicit_server_options, storm, unload_seconds  # noqa: E402
from ditserve.launcher import TritonServer  # noqa: E402

CANCELS = 8
TIMEOUTS = 4
STORM_S = 6.0
UNLOAD_BOUND_S = 30.0   # an unload that finishes took 7-15 s on a loaded 2-core host
# The share of a storm's cancels Triton 2.51 may lose mid-generation: 0.29 % measured, up to 4
# of 228 in one 6 s storm (1.8 %).
LOST_CANCELS = 0.03


def early_stops(url: str) -> None:
    """Cancels of overlapping pairs (so more than one stream instance stops early), then request
    timeouts that land mid-denoise. 100 steps (the limit): the pair's second request runs on while
    the first is cancelled, and with 40 a fresh-clone run on a 2-core host saw 3 of them finish
    before their cancel."""
    slow = dict(num_inference_steps=100)
    for i in range(CANCELS):
        calls = [StreamCall(url, GenerationRequest(f"cancel {i}-{j}", seed=i, **slow)).start() for j in range(2)]
        for call in calls:
            call.wait_progress(2)
            call.cancel()
    for i in range(TIMEOUTS):  # 0.3 s: past admission, long before 100 steps at 256 px end
        request = GenerationRequest(f"timeout {i}", seed=i, num_inference_steps=100, height=256, width=256)
        kind, message = StreamCall(url, request, timeout_us=300_000).start().outcome()
        assert kind == "error" and "request timeout" in message, (kind, message)


def test_early_stops_and_a_cancel_storm_leave_a_prompt_unload_and_a_clean_stop(tmp_path):
    if not TINY_PIXART.exists():
        pytest.fail(f"{TINY_PIXART} is missing: run `bash scripts/setup.sh`")
    server = TritonServer(explicit_server_options(), log_path=tmp_path / "server.log")
    server.start()
    try:
        server.wait_ready(300)
        early_stops(server.grpc_url)
        assert wait_for_metric(server.metrics_url, "ditserve_state_table_size", "dit", 0.0) == 0.0

        before = scrape(server.metrics_url)
        assert before.get(("ditserve_requests_completed_total", MODEL), 0) == 0, "an early-stopped request completed"
        # 60 steps, cancelled within the first 30: the rest outlasts a client thread starved on a loaded
        # host (with 20 steps, a helper's run at load 10+ saw 3 of them finish before their cancel)
        cancelled = storm(server.grpc_url, STORM_S, clients=4, steps=60)
        assert cancelled >= 20, f"only {cancelled} requests in {STORM_S:g} s"
        assert wait_for_metric(server.metrics_url, "ditserve_state_table_size", "dit", 0.0) == 0.0
        after = scrape(server.metrics_url)
        delta = delta_of(before, after, MODEL)
        # Every cancel ends once on the server: as cancelled, or not at all when Triton dropped it
        # from its queue before our model saw it. A completion is a cancel Triton 2.51 never
        # delivered (`is_cancelled()` false through the last step: 20 of 6,888 storm requests,
        # perf/results/2026-12-04-cpu-storm-lost-cancels.md); our cancel path failing would
        # complete most of them.
        completed, ended = delta("ditserve_requests_completed_total"), delta("ditserve_requests_cancelled_total")
        assert completed <= LOST_CANCELS * cancelled, f"{completed:.0f} of {cancelled} cancelled requests completed"
        assert 0 < ended and ended + completed <= cancelled
        seconds = unload_seconds(server.grpc_url, MODEL, UNLOAD_BOUND_S)
        assert seconds is not None, (f"{MODEL} still UNLOADING {UNLOAD_BOUND_S:g} s after a storm of {cancelled} "
                                     f"cancels\n{server.log_tail(30)}")
        print(f"{cancelled} cancels; {MODEL} unloaded in {seconds:.1f} s")
    finally:
        assert_stops_cleanly(server)

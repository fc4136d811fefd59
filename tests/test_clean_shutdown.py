"""Generations that stop early (client cancel mid-denoise, request timeout mid-denoise) leave
nothing behind that crashes a stub later: afterwards the server stops cleanly, no stub segfaults.

Why this is a test: the exception of an early stop used to sit in a reference cycle with the
frames of its own traceback, which held BLS tensors. Python's cyclic GC freed those later, on
whichever thread it ran, and Triton 2.51's stubs segfault when that thread is one of their own
or when it happens at exit. The H200 soak lost a txt2img_stream instance this way mid-run. On
CPU, before the fix (stages/generate.py `Stop`), four stubs segfaulted at shutdown in every run of
this scenario. The log then says "Fatal Python error: Segmentation fault ... Garbage-collecting".
"""
from __future__ import annotations

import pytest

from conftest import TINY_PIXART, start_server
from ditserve.client import GenerationRequest
from helpers import StreamCall, assert_stops_cleanly, wait_for_metric

CANCELS = 8
TIMEOUTS = 4


def test_early_stops_leave_no_stub_crash_at_shutdown(tmp_path):
    if not TINY_PIXART.exists():
        pytest.fail(f"{TINY_PIXART} is missing: run `bash scripts/setup.sh`")
    server = start_server(tmp_path, "server")
    try:
        slow = dict(num_inference_steps=40)
        for i in range(CANCELS):  # overlapping pairs, so more than one stream instance stops early
            calls = [StreamCall(server.grpc_url, GenerationRequest(f"cancel {i}-{j}", seed=i, **slow)).start()
                     for j in range(2)]
            for call in calls:
                call.wait_progress(2)
                call.cancel()
        for i in range(TIMEOUTS):  # 0.3 s: past admission, long before 100 steps at 256 px end
            request = GenerationRequest(f"timeout {i}", seed=i, num_inference_steps=100, height=256, width=256)
            call = StreamCall(server.grpc_url, request, timeout_us=300_000).start()
            kind, message = call.outcome()
            assert kind == "error" and "request timeout" in message, (kind, message)
        assert wait_for_metric(server.metrics_url, "ditserve_state_table_size", "dit", 0.0) == 0.0
    finally:
        assert_stops_cleanly(server)

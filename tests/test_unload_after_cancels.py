"""After a storm of client cancels on `txt2img_stream`, the model unloads promptly.

Triton unloads a model only once every request, response factory and response of it is gone;
a cancelled stream whose final flag we never sent (or whose response sender we kept) would keep
`txt2img_stream` in UNLOADING for good, and server shutdown would wait out its exit timeout.
The storm cancels requests while they are queued, being encoded and mid-denoise (the paths our
models end), from several gRPC streams at once, as tritonclient users do.

Not covered here: cancels that cross the final response (the image) in flight. With Triton 2.51
those can leave the model UNLOADING for good inside Triton's gRPC frontend, whatever the model
does (docs/reliability.md, "Unload after cancel storms"; `perf/cancel_storm.py --cancel-at final`).
"""
from __future__ import annotations

import sys

import pytest

from conftest import ROOT, TINY_PIXART
from helpers import assert_stops_cleanly, scrape, wait_for_metric

sys.path.insert(0, str(ROOT / "perf"))
from cancel_storm import MODEL, explicit_server_options, storm, unload_seconds  # noqa: E402
from ditserve.launcher import TritonServer  # noqa: E402

STORM_S = 6.0
UNLOAD_BOUND_S = 30.0   # an unload that finishes took 7-15 s on a loaded 2-core host


def test_txt2img_stream_unloads_promptly_after_a_cancel_storm(tmp_path):
    if not TINY_PIXART.exists():
        pytest.fail(f"{TINY_PIXART} is missing: run `bash scripts/setup.sh`")
    server = TritonServer(explicit_server_options(), log_path=tmp_path / "server.log")
    server.start()
    try:
        server.wait_ready(300)
        cancelled = storm(server.grpc_url, STORM_S, clients=4)
        assert cancelled >= 20, f"only {cancelled} requests in {STORM_S:g} s"
        assert wait_for_metric(server.metrics_url, "ditserve_state_table_size", "dit", 0.0) == 0.0
        counters = scrape(server.metrics_url)
        # Every cancel ends once on the server: as cancelled, or not at all when Triton dropped it
        # from its queue before our model saw it; never a completion, since none reached the end.
        assert counters.get(("ditserve_requests_completed_total", MODEL), 0) == 0
        assert 0 < counters.get(("ditserve_requests_cancelled_total", MODEL), 0) <= cancelled
        seconds = unload_seconds(server.grpc_url, MODEL, UNLOAD_BOUND_S)
        assert seconds is not None, (f"{MODEL} still UNLOADING {UNLOAD_BOUND_S:g} s after a storm of {cancelled} "
                                     f"cancels\n{server.log_tail(30)}")
        print(f"{cancelled} cancels; {MODEL} unloaded in {seconds:.1f} s")
    finally:
        assert_stops_cleanly(server)

"""perf/loadgen.py: reproducible traces, and a bounded smoke run against the real server."""
from __future__ import annotations

import asyncio
import importlib.util
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _loadgen():
    spec = importlib.util.spec_from_file_location("ditserve_perf_loadgen", ROOT / "perf" / "loadgen.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


loadgen = _loadgen()

REPORT_KEYS = (
    "total_requests", "completed_requests", "failed_requests", "cancelled_requests", "lost", "duplicated",
    "offered_request_rate", "request_throughput", "throughput_qps", "duration",
    "mean_e2el_ms", "p50_e2el_ms", "p95_e2el_ms", "p99_e2el_ms", "latency_mean", "latency_p99",
    "mean_ttfs_ms", "p50_ttfs_ms", "p99_ttfs_ms",
    "solo_latency_ms", "slo_scale", "slo_attainment_rate", "slo_met_success",
    "stage_mean_ms", "mean_step_batch_size", "server_completed", "server_cancelled", "server_counts_consistent",
    "gpu_memory_used_mb_peak",
)


def test_poisson_trace_is_reproducible_and_round_trips(tmp_path):
    spec = loadgen.WorkloadSpec(rate=5, num_requests=30, sizes=loadgen.parse_sizes("64,96x128"),
                                steps=loadgen.parse_steps("10-30"), cancel_rate=0.2, seed=7)
    first, second = loadgen.make_trace(spec), loadgen.make_trace(spec)
    assert first == second and first[0]["t"] == 0.0
    assert all(a["t"] <= b["t"] for a, b in zip(first, first[1:]))
    assert all(10 <= e["num_inference_steps"] <= 30 and (e["height"], e["width"]) in {(64, 64), (96, 128)} for e in first)
    path = tmp_path / "t.jsonl"
    loadgen.write_trace(first, path)
    assert loadgen.load_trace(path) == first


def test_cancel_by_id_marks_the_cancelled_entries_and_a_bad_value_is_refused(tmp_path):
    args = loadgen.build_parser().parse_args(["--rate", "5", "--num-requests", "30", "--cancel-rate", "0.3",
                                              "--cancel-by", "id"])
    entries, source = loadgen.entries_from_args(args)
    cancelled = [e for e in entries if "cancel_after_s" in e]
    assert cancelled and all(e["cancel_by"] == "id" for e in cancelled) and "cancelled by id" in source
    assert all("cancel_by" not in e for e in entries if "cancel_after_s" not in e)
    path = tmp_path / "bad.jsonl"
    path.write_text('{"t": 0, "prompt": "x", "cancel_after_s": 1, "cancel_by": "socket"}\n')
    with pytest.raises(ValueError, match="cancel_by 'socket'; allowed"):
        loadgen.load_trace(path)


def test_committed_tiny_trace_loads():
    entries = loadgen.load_trace(ROOT / "perf" / "traces" / "tiny_mixed_v1.jsonl")
    assert len(entries) == 40
    assert {e["height"] for e in entries} == {64, 96, 128}
    assert 1 <= sum("cancel_after_s" in e for e in entries) <= 4


def test_loadgen_smoke_against_server(server):
    """Seven requests at a high rate, two cancelled mid-generation (the gRPC call, and the request id
    through the `cancel` model): every request ends exactly once."""
    quick = {"prompt": "a red cat", "height": 64, "width": 64, "num_inference_steps": 5, "guidance_scale": 4.5}
    entries = [{**quick, "t": 0.02 * i, "seed": i} for i in range(5)]
    # 100 steps at 128 px takes far longer than 50 ms on any host, so this cancel lands
    # while the request is queued or denoising, never after it finished.
    doomed = {**quick, "t": 0.03, "height": 128, "width": 128, "num_inference_steps": 100, "cancel_after_s": 0.05}
    entries[2:2] = [{**doomed, "seed": 99}, {**doomed, "seed": 98, "cancel_by": "id"}]
    cfg = loadgen.LoadgenConfig(url=server.grpc_url, entries=entries, source="smoke", metrics_url=server.metrics_url,
                                warmup=0, solo_repeats=1, server_pid=server.process.pid, timeout_s=60, verbose=False)
    start = time.monotonic()
    report = asyncio.run(loadgen.run(cfg))
    assert time.monotonic() - start < 30

    missing = [k for k in REPORT_KEYS if k not in report]
    assert not missing, missing
    assert report["lost"] == 0 and report["duplicated"] == 0, report
    assert report["total_requests"] == 7
    assert report["cancelled_requests"] == 2 and report["failed_requests"] == 0, report["errors"]
    assert report["completed_requests"] + report["cancelled_requests"] == report["total_requests"]
    assert report["server_counts_consistent"] and report["server_completed"] >= 5
    assert report["mean_e2el_ms"] > 0 and report["mean_ttfs_ms"] <= report["mean_e2el_ms"]
    assert set(report["solo_latency_ms"]) == {"64x64-5steps-cfg"}  # the cancelled shape has no solo run needed
    assert report["mean_step_batch_size"] >= 1 and report["stage_mean_ms"]["denoise"] > 0
    solo = report["solo_server"]   # the lone request's own stage and step times, apart from the run's
    assert solo["server_completed"] == 1 and solo["step_batches"] == 5 and solo["mean_step_batch_size"] == 1, solo
    assert 0 < solo["stage_mean_ms"]["denoise"] < report["solo_latency_ms"]["64x64-5steps-cfg"], solo
    histogram = report["step_batch_size_histogram"]
    assert sum(histogram.values()) == report["step_batches"] and all(n >= 0 for n in histogram.values()), histogram
    assert report["server_rss_mb_peak"] > 0
    split = report["ttfs_split_ms"]   # where the server's time to first step went, in parts that add up
    assert split["encode"] > 0 and split["admission_wait"] > 0 and split["admission"] > 0, split
    assert split["text_encoder_compute_per_exec"] > 0 and split["first_step_and_rest"] > 0, split
    assert split["encode"] + split["admission_wait"] + split["admission"] + split["first_step_and_rest"] == \
        pytest.approx(report["server_mean_ttfs_ms"], abs=0.01)
    assert report["dit_holds"] == {"arrival": 0, "late": 0, "late_joins": 0, "late_overran": 0, "late_starved": 0,
                                   "overtakes": 0}, "a CPU never holds a step, nor overtakes one"


def test_known_solo_latencies_are_not_measured_again(server):
    """A ladder's later loads reuse the solo latencies measured at its first (perf/matched_control.py)."""
    quick = {"prompt": "a red cat", "height": 64, "width": 64, "num_inference_steps": 3, "guidance_scale": 1.0}
    entries = [{**quick, "t": 0.0, "seed": 1}, {**quick, "t": 0.01, "seed": 2, "num_inference_steps": 4}]
    cfg = loadgen.LoadgenConfig(url=server.grpc_url, entries=entries, source="known solo", warmup=0, solo_repeats=1,
                                known_solo_ms={"64x64-3steps-nocfg": 12.5, "96x96-9steps-cfg": 1.0},
                                timeout_s=60, verbose=False)
    report = asyncio.run(loadgen.run(cfg))
    assert report["completed_requests"] == 2 and report["lost"] == 0
    assert report["solo_known_shapes"] == ["64x64-3steps-nocfg"]   # a shape not in the trace is not carried
    assert report["solo_latency_ms"]["64x64-3steps-nocfg"] == 12.5
    assert report["solo_latency_ms"]["64x64-4steps-nocfg"] > 0     # the new shape is measured


def test_matched_control_keeps_a_deployments_fault_rules(tmp_path):
    # Its mode variants must carry [[faults.rules]] over: the H200-timing deployment is made of them.
    sys.path.insert(0, str(ROOT / "perf"))
    import matched_control
    base = ROOT / "perf" / "deployments" / "tiny-pixart-sigma-h200-timing.toml"
    path, capacity = matched_control.write_mode_deployment(base, "request_batch", None, tmp_path / "variant.toml")
    sys.path.insert(0, str(ROOT / "backends"))
    from ditserve.deployment import load_deployment
    original, variant = load_deployment(base), load_deployment(path)
    assert variant.engine.mode == "request_batch" and capacity == original.engine.capacity == 8
    assert variant.faults == original.faults and len(variant.faults.rules) == 3


def test_matched_control_mode_can_name_a_step_scheduler(tmp_path):
    sys.path.insert(0, str(ROOT / "perf"))
    import matched_control
    from ditserve.deployment import load_deployment
    base = ROOT / "configs" / "tiny-pixart-sigma.toml"
    path, _ = matched_control.write_mode_deployment(base, "step:cost", None, tmp_path / "variant.toml")
    engine = load_deployment(path).engine
    assert (engine.mode, engine.scheduler) == ("step", "cost")
    with pytest.raises(SystemExit, match="step:<scheduler>"):
        matched_control.write_mode_deployment(base, "step:fast", None, tmp_path / "bad.toml")
    # `#N` names a second server of the same mode (two servers' spread), nothing else.
    path, _ = matched_control.write_mode_deployment(base, "step:cost#2", None, tmp_path / "again.toml")
    engine = load_deployment(path).engine
    assert (engine.mode, engine.scheduler) == ("step", "cost")
    # `+KEY=VALUE` sets another [engine] key, typed as TOML would (the late queue's A/B).
    mode = "step:cost+late_queue_ms=2.5+steps_per_execute=4+overtake=true#2"
    path, _ = matched_control.write_mode_deployment(base, mode, None, tmp_path / "late.toml")
    engine = load_deployment(path).engine
    assert (engine.scheduler, engine.late_queue_ms, engine.steps_per_execute, engine.overtake) == ("cost", 2.5, 4, True)
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        matched_control.write_mode_deployment(base, "step:cost+late", None, tmp_path / "bad.toml")


def test_load_ladder_draws_one_trace_per_fraction_of_saturation():
    # The ladder replays the same traces in every mode: same seed, rate = fraction x saturation.
    sys.path.insert(0, str(ROOT / "perf"))
    import matched_control
    args = matched_control.build_parser().parse_args(
        ["--load-fractions", "0.5,0.95", "--num-requests", "400", "--sizes", "64", "--steps", "4,12", "--seed", "5"])
    traces = matched_control.ladder_traces(args, saturation_rps=10.0)
    assert list(traces) == ["load0p5", "load0p95"]        # no dots: they end up in file names
    for name, fraction in (("load0p5", 0.5), ("load0p95", 0.95)):
        entries = traces[name]
        assert len(entries) == 400
        offered = len(entries) / max(e["t"] for e in entries)
        assert abs(offered - 10.0 * fraction) / (10.0 * fraction) < 0.15
    assert traces == matched_control.ladder_traces(args, saturation_rps=10.0)   # seeded
    with pytest.raises(SystemExit, match="drop --trace"):
        matched_control.main(["--load-fractions", "0.5", "--trace", "perf/traces/tiny_mixed_v1.jsonl"])


def test_saturation_by_littles_law_ignores_the_drain():
    # 4 clients, 20 s a request, a 30 s window: 8 completed, the last ones drained until 60 s.
    sys.path.insert(0, str(ROOT / "perf"))
    import matched_control

    def rec(i, send, end, outcome="completed"):
        return loadgen.Record(i, "1024x1024-20steps-cfg", send, None, send_s=send, end_s=end, outcome=outcome)

    records = [rec(i, s, s + 20.0) for i, s in enumerate([0, 0, 0, 0, 20, 20, 20, 29])]
    est = matched_control.closed_loop_throughput(records, concurrency=4, wall_s=60.0)
    assert est["rps"] == est["rps_little"] == 0.2                  # N / mean response time = 4 / 20 s
    assert est["rps_completed_over_wall"] == round(8 / 60, 4) and est["completed"] == 8
    assert "Little's law" in est["source"] and not est["window_too_short"]
    est = matched_control.closed_loop_throughput(records, concurrency=4, wall_s=60.0, window_s=30.0)
    assert est["window_too_short"] and "lengthen --saturation-seconds" in est["source"], "30 s < 3 x 20 s"
    # A cancelled request held its client for 2 s without completing: N x completed / time in requests.
    est = matched_control.closed_loop_throughput(records + [rec(8, 40, 42, "cancelled")], concurrency=4, wall_s=60.0)
    assert est["rps"] == round(4 * 8 / 162, 4)
    # Fewer completed than clients: too few to average, completed / wall, and said so.
    est = matched_control.closed_loop_throughput(records[:3] + [rec(3, 0, 5, "failed")], concurrency=4, wall_s=25.0)
    assert est["rps"] == est["rps_completed_over_wall"] == 0.12 and est["rps_little"] is None
    assert "fewer completed than clients (3 < 4)" in est["source"]


def test_matched_control_warms_the_trace_sizes_unless_accel_names_them(tmp_path):
    # The cost scheduler profiles its curve at load for the warm sizes only: they follow the trace.
    sys.path.insert(0, str(ROOT / "perf"))
    import matched_control
    from ditserve.deployment import Defaults, load_deployment, parse_accel_overrides
    entries = [{"height": 512, "width": 512}, {"height": 512, "width": 768}, {"height": 512, "width": 512},
               {"prompt": "default size"}, {"height": 8, "width": 8, "expect_error": "size"}]
    defaults = Defaults(height=1024, width=1024, num_frames=81)
    assert matched_control.trace_sizes(entries, defaults) == ["512x512", "512x768", "1024x1024"]
    assert matched_control.trace_sizes(entries[:1], defaults, video=True) == ["81x512x512"]
    overrides = parse_accel_overrides(["transformer=compile"])
    assert matched_control.variant_accel(overrides, ["512x512"]) == {"transformer": "compile", "warm_sizes": ["512x512"]}
    given = parse_accel_overrides(["warm_sizes=1024x1024"])
    assert matched_control.variant_accel(given, ["512x512"]) == {"warm_sizes": ["1024x1024"]}
    path, _ = matched_control.write_mode_deployment(ROOT / "configs" / "tiny-pixart-sigma.toml", "step:cost", None,
                                                    tmp_path / "variant.toml", {"warm_sizes": ["64x64", "96x128"]})
    assert load_deployment(path).accel.warm_sizes == ("64x64", "96x128")

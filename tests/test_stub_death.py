"""The `dit` stub process dies mid-generation (SIGKILL): in-flight requests get an error, not
a hang; later requests fail fast until the model is reloaded; reloading `dit` through the
repository API (server started with --model-control-mode=explicit) restores service.

What Triton 2.51 does by itself, measured here: it never completes the dead stub's
in-flight requests (our public models stop waiting, see stages/liveness.py), it does not
restart the stub, it keeps reporting the server and `dit` READY, and the dead model
version never finishes unloading (shutdown waits out --exit-timeout-secs).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient

from conftest import ROOT, TINY_PIXART, start_server
from ditserve.client import DitClient, GenerationRequest
from helpers import StreamCall, grpc_inputs, scrape, wait_for_metric

MODELS = ("txt2img", "txt2img_stream", "text_encoder", "dit", "vae_decode")
ERROR_BOUND_S = 30   # an in-flight request must get its error within this (measured: ~2 s)


def test_watched_call_fails_when_the_called_stub_dies_and_passes_items_through(tmp_path):
    """stages/liveness.py without a server: a fake `dit` stub (argv[1] = <repo>/dit/1/model.py) that
    never answers, killed while we wait."""
    from ditserve.stages.liveness import StubDied, StubWatch, stub_pids

    script = tmp_path / "dit" / "1" / "model.py"
    script.parent.mkdir(parents=True)
    script.write_text("import time\ntime.sleep(60)\n")
    fake = subprocess.Popen([sys.executable, str(script)])
    try:
        exec_deadline = time.monotonic() + 10   # until it has exec'd, its cmdline is still pytest's
        while str(script).encode() not in Path(f"/proc/{fake.pid}/cmdline").read_bytes():
            assert time.monotonic() < exec_deadline, "the fake stub did not start"
            time.sleep(0.01)
        watch = StubWatch(server=os.getpid())
        assert stub_pids("dit", os.getpid()) == {fake.pid} and stub_pids("vae_decode", os.getpid()) == set()
        assert list(watch.call("dit", lambda: range(3), probe_s=0.1)) == [0, 1, 2]
        with pytest.raises(ValueError, match="boom"):   # the worker's exception reaches the caller
            list(watch.call("dit", lambda: (_ for _ in ()).throw(ValueError("boom")), probe_s=0.1))
        blocked = threading.Event()
        calls = watch.call("dit", lambda: [blocked.wait()], probe_s=0.1)
        threading.Timer(0.3, fake.kill).start()
        start = time.monotonic()
        with pytest.raises(StubDied, match=rf"dit: its stub process \(pid {fake.pid}\) died"):
            list(calls)
        assert time.monotonic() - start < 5
        blocked.set()
    finally:
        fake.kill()
        fake.wait()


def test_a_disabled_watch_calls_in_the_callers_thread():
    from ditserve.stages.liveness import StubWatch

    threads = []
    responses = lambda: (threads.append(threading.current_thread()) or range(2))  # noqa: E731
    assert list(StubWatch(enabled=False).call("dit", responses)) == [0, 1]
    assert threads == [threading.current_thread()]


@pytest.fixture(scope="module")
def explicit_server(tmp_path_factory):
    if not TINY_PIXART.exists():
        pytest.fail(f"{TINY_PIXART} is missing: run `bash scripts/setup.sh`")
    # The dead stub's model version never finishes unloading (its in-flight requests never end),
    # so shutdown waits out the whole exit timeout: keep it short here.
    server = start_server(tmp_path_factory.mktemp("stub-death"), "server",
                          extra_args=["--model-control-mode=explicit", "--load-model=*", "--exit-timeout-secs=5"])
    yield server
    stubs = _children(server.process.pid)
    start = time.monotonic()
    server.stop()
    print(f"server stopped in {time.monotonic() - start:.1f} s")
    deadline = time.monotonic() + 10.0   # they exit on their own; 1 s was too short on a loaded host
    while [pid for pid in stubs if _alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in stubs if _alive(pid)], "stubs outlived the server by 10 s"


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def stub_pid(server, instance: str) -> int:
    """The Python stub serving model instance `instance` (e.g. dit_0_0) of this server."""
    pids = []
    for pid in _children(server.process.pid):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if instance in argv:
            pids.append(pid)
    assert len(pids) == 1, f"stubs of {instance}: {pids}"
    return pids[0]


def _check_stubs(server) -> tuple[int, str]:
    """scripts/check_stubs.py against this server: (exit status, what it printed to stderr)."""
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_stubs.py"), "--url", server.http_url,
                           "--server-pid", str(server.process.pid)], capture_output=True, text=True, timeout=60)
    return done.returncode, done.stderr.strip()


def _unary(server, request: GenerationRequest, results: list) -> None:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        try:
            client.infer("txt2img", grpc_inputs(request), client_timeout=ERROR_BOUND_S + 30)
            results.append(("image", None))
        except Exception as exc:  # noqa: BLE001 - recorded and asserted below
            results.append(("error", str(exc)))


def test_dit_stub_death_fails_in_flight_requests_then_a_reload_recovers(explicit_server):
    server = explicit_server
    slow = dict(num_inference_steps=100, height=256, width=256)
    stream = StreamCall(server.grpc_url, GenerationRequest("victim stream", seed=1, **slow)).start()
    unary: list = []
    unary_thread = threading.Thread(target=_unary, args=(server, GenerationRequest("victim unary", seed=2, **slow),
                                                         unary))
    unary_thread.start()
    stream.wait_progress(3)
    assert _check_stubs(server) == (0, ""), "every stub is alive before the kill"
    dit = stub_pid(server, "dit_0_0")
    os.kill(dit, signal.SIGKILL)
    killed = time.monotonic()

    # 1. Each in-flight request gets exactly one error naming dit, within the bound.
    kind, message = stream.outcome(timeout=ERROR_BOUND_S)
    if server.process.poll() is not None:
        # Triton 2.51's own process sometimes aborts after a stub is SIGKILLed ("terminate called
        # after throwing an instance of 'std::system_error'": once in ~10 runs here, once in CI).
        # The client still got an error, not a hang; recovery is then a restart (docs/reliability.md).
        tail = server.log_tail(60)
        assert kind == "error" and "terminate called" in tail, (
            f"tritonserver exited (status {server.process.returncode}) after the dit stub was killed; "
            f"the stream got {kind}: {message!r}. Server log tail:\n{tail}")
        pytest.xfail("tritonserver 2.51 itself aborted (std::system_error) after the dit stub was killed")
    assert kind == "error" and "dit" in message and "died" in message, message
    unary_thread.join(ERROR_BOUND_S)
    assert not unary_thread.is_alive(), "the unary request hung"
    assert len(unary) == 1 and unary[0][0] == "error" and "dit" in unary[0][1], unary
    print(f"in-flight requests failed {time.monotonic() - killed:.1f} s after the kill")

    # 2. Until a reload, new requests fail fast with an error naming dit; the server stays up.
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        start = time.monotonic()
        with pytest.raises(Exception) as err:
            client.infer("txt2img", grpc_inputs(GenerationRequest("after", seed=3, num_inference_steps=2)),
                         client_timeout=60)
        assert "dit" in str(err.value) and "not healthy" in str(err.value), str(err.value)
        assert time.monotonic() - start < 15
        assert client.is_server_live() and client.is_server_ready()
        # Triton 2.51 keeps a model whose stub died READY (fixed in later Triton releases). If this
        # starts failing, Triton now reports it: update docs/reliability.md.
        assert client.is_model_ready("dit")
        assert all(client.is_model_ready(m) for m in MODELS if m != "dit")
        # ... which the liveness probe of deploy/k8s catches.
        rc, message = _check_stubs(server)
        assert rc == 1 and "'dit' has 0 of its 1 stub processes" in message, message

        # 3. Recovery: unload + load `dit` (a plain load of a loaded, unchanged model does nothing).
        start = time.monotonic()
        client.unload_model("dit")
        client.load_model("dit")
        assert client.is_model_ready("dit")
        print(f"dit reloaded in {time.monotonic() - start:.1f} s")
        assert stub_pid(server, "dit_0_0") != dit
        assert _check_stubs(server) == (0, "")

    # 4. Both public models serve again at full concurrency (the instances that served the lost
    #    requests returned when they sent the error; only their helper threads stay blocked).
    before = scrape(server.metrics_url)
    from concurrent.futures import ThreadPoolExecutor

    def unary_call(i: int):
        with DitClient(server.grpc_url, "grpc") as client:
            return client.generate(GenerationRequest(f"unary {i}", seed=i, num_inference_steps=20), timeout_s=60)

    calls = [StreamCall(server.grpc_url, GenerationRequest(f"recovered {i}", seed=i, num_inference_steps=20)).start()
             for i in range(4)]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(unary_call, range(4)))
    assert all(r.media.shape == (64, 64, 3) for r in results)
    assert all(call.outcome(timeout=60)[0] == "image" for call in calls)
    after = scrape(server.metrics_url)
    assert after[("ditserve_requests_completed_total", "txt2img_stream")] - \
        before.get(("ditserve_requests_completed_total", "txt2img_stream"), 0) == 4
    assert wait_for_metric(server.metrics_url, "ditserve_state_table_size", "dit", 0.0) == 0.0

"""`scripts/serve.py` runs in the foreground and Ctrl-C (SIGINT) stops it cleanly:
no orphaned Python stubs, no leftover /dev/shm regions. A pytest session killed with SIGTERM or
SIGINT stops the servers it started too (tests/conftest.py)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import ROOT
from ditserve.launcher import free_ports
from ditserve.scratch import SERVER_PREFIX


def _children(pid: int) -> set[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]


def _shm_mapped_by(pids: set[int]) -> set[str]:
    """The /dev/shm files these processes map (this server's regions, not another test's)."""
    names = set()
    for pid in pids:
        for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
            if "/dev/shm/" in line:
                names.add(line.split("/dev/shm/", 1)[1].split(" ")[0])
    return names


def test_serve_runs_until_ctrl_c_and_leaves_nothing_behind(tmp_path):
    gone = subprocess.Popen(["true"])
    gone.wait()   # a killed server's pid: its scratch folders (ditserve/scratch.py) are swept at start-up
    stale = [Path(base) / f"{SERVER_PREFIX}{gone.pid}" / kind for base, kind in
             ((tempfile.gettempdir(), "cancel"), ("/dev/shm", "handoff"))]
    for folder in stale:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "gen-1").write_bytes(b"x")
    http, grpc, metrics = free_ports(3)
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "serve.py"), "--http-port", str(http), "--grpc-port", str(grpc),
         "--metrics-port", str(metrics), "--log-file", str(tmp_path / "serve.log")],
        stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, proc.stderr.read()
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready", timeout=2).status == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "server did not become ready"
            time.sleep(0.5)
        (server_pid,) = _children(proc.pid)
        assert not [folder.parent for folder in stale if folder.parent.exists()], "stale scratch folders stayed"
        stubs = _children(server_pid)
        assert len(stubs) >= 5, "expected one Python stub per model instance"
        regions = _shm_mapped_by({server_pid, *stubs})
        assert regions, "the Python backend should hold shared-memory regions"

        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=90) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "stopping tritonserver" in proc.stderr.read()
    assert not _alive(server_pid)
    assert not [pid for pid in stubs if _alive(pid)], "Python stubs outlived the server"
    assert not regions & set(os.listdir("/dev/shm")), "shared-memory regions leaked"


def test_dump_stacks_writes_every_stubs_python_stacks_to_the_log(server):
    """The stall diagnostic (perf/README.md): SIGUSR1 makes each stub print its threads' stacks."""
    pids = server.dump_stacks()
    assert len(pids) >= 5, "text_encoder, dit, vae_decode and the public models each run a stub"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        log = Path(server.log_path).read_text(errors="replace")
        if log.count("most recent call first") >= len(pids):
            break
        time.sleep(0.2)
    assert log.count("most recent call first") >= len(pids), server.log_tail(60)
    assert urllib.request.urlopen(f"http://{server.http_url}/v2/health/ready", timeout=5).status == 200


# A pytest run of its own, with tests/conftest.py as its plugin: its one test starts a server on
# an empty repository (ready in about a second) through conftest's helper, then waits to be killed.
_KILLED_SESSION = '''
import os, time
from pathlib import Path
from conftest import start_server

def test_serve_until_killed(tmp_path):
    (tmp_path / "empty").mkdir()
    server = start_server(tmp_path, "empty", model_repository=tmp_path / "empty")
    Path(os.environ["SERVER_PID_FILE"]).write_text(str(server.process.pid))
    time.sleep(120)
'''


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_killed_pytest_stops_the_servers_it_started(tmp_path, sig):
    """SIGTERM (`timeout`, a cancelled CI job) or SIGINT to pytest stops the servers it started;
    they run in their own sessions, so the signal alone never reaches them
    (launcher.stop_servers_on_signals)."""
    (tmp_path / "test_killed.py").write_text(_KILLED_SESSION)
    pid_file = tmp_path / "server.pid"
    env = {**os.environ, "SERVER_PID_FILE": str(pid_file),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "tests"), os.environ.get("PYTHONPATH")]))}
    child = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
                              "test_killed.py"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    server_pid = None
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text()):
            assert child.poll() is None, child.stdout.read()
            assert time.monotonic() < deadline, "the child's server did not start"
            time.sleep(0.1)
        server_pid = int(pid_file.read_text())
        assert _alive(server_pid)
        child.send_signal(sig)
        output = child.communicate(timeout=30)[0]
        deadline = time.monotonic() + 5
        while _alive(server_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(server_pid), f"tritonserver {server_pid} outlived the killed pytest:\n{output}"
        assert "KeyboardInterrupt" in output, output
    finally:
        if child.poll() is None:
            child.kill()
        if server_pid is not None and _alive(server_pid):
            os.killpg(server_pid, signal.SIGKILL)

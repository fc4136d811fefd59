"""Start a real `tritonserver` (from the nvidia-pytriton wheel) on our model repository.

Triton loads a Python-based backend from `<backend-directory>/<name>/model.py` and runs it
with `<backend-directory>/python/libtriton_python.so` and a stub built for the running
Python. The wheel ships the stubs separately, so we assemble a backend directory under
`.triton/` (git-ignored) once, with symlinks back to the wheel and to `backends/diffusion`.
"""
from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
BACKEND_NAME = "diffusion"


def _pytriton_dir() -> Path:
    try:
        import pytriton  # noqa: F401  (only to locate the wheel)
    except ImportError as exc:  # pragma: no cover - install problem
        raise SystemExit("nvidia-pytriton is not installed: run `bash scripts/setup.sh` first") from exc
    return Path(pytriton.__file__).parent / "tritonserver"


def tritonserver_binary() -> Path:
    """Path of the tritonserver executable; `TRITONSERVER` overrides the wheel's copy."""
    return Path(os.environ.get("TRITONSERVER") or _pytriton_dir() / "bin" / "tritonserver")


def backend_directory(workdir: Path | None = None) -> Path:
    """Assemble (idempotently) the `--backend-directory` holding `python/` and `diffusion/`."""
    workdir = workdir or REPO_ROOT / ".triton"
    out = workdir / "backends"
    py = out / "python"
    py.mkdir(parents=True, exist_ok=True)
    source = Path(os.environ["TRITON_BACKENDS"]) / "python" if os.environ.get("TRITON_BACKENDS") else None
    if source is None:
        wheel = _pytriton_dir()
        source = wheel / "backends" / "python"
        stub = wheel / "python_backend_stubs" / f"{sys.version_info.major}.{sys.version_info.minor}" / "triton_python_backend_stub"
    else:
        stub = source / "triton_python_backend_stub"
    # Real copies: Triton refuses a backend library whose resolved path leaves the directory.
    for src in (source / "libtriton_python.so", source / "triton_python_backend_utils.py", stub):
        _copy_if_changed(src, py / src.name)
    (py / "triton_python_backend_stub").chmod(0o755)
    _link(REPO_ROOT / "backends" / BACKEND_NAME, out / BACKEND_NAME)
    return out


def _copy_if_changed(src: Path, dst: Path) -> None:
    if dst.is_symlink():
        dst.unlink()
    if not dst.exists() or dst.stat().st_size != src.stat().st_size or dst.stat().st_mtime < src.stat().st_mtime:
        shutil.copy2(src, dst)


def _link(src: Path, dst: Path) -> None:
    if dst.is_symlink() and os.readlink(dst) == str(src):
        return
    if dst.is_symlink() or dst.exists():
        dst.unlink()
    dst.symlink_to(src)


# Allocators tritonserver can run with instead of glibc malloc (`DITSERVE_MALLOC`,
# `ServerOptions.malloc`): the shared objects to preload, the first one found wins, and the
# Debian/Ubuntu package that ships them. Triton's docs suggest preloading tcmalloc or jemalloc
# against memory that glibc does not give back (docs/reliability.md, perf/results).
MALLOC_LIBRARIES = {
    "jemalloc": (("libjemalloc.so.2", "libjemalloc.so"), "libjemalloc2"),
    "tcmalloc": (("libtcmalloc_minimal.so.4", "libtcmalloc.so.4"), "libtcmalloc-minimal4"),
}


def _library_dirs() -> list[Path]:
    arch = os.uname().machine
    return [Path(d) for d in (f"/usr/lib/{arch}-linux-gnu", f"/lib/{arch}-linux-gnu", "/usr/lib64", "/usr/lib",
                              "/usr/local/lib")]


def malloc_choice(malloc: str | None = None) -> str:
    """The allocator a server started with `malloc` runs on: `malloc`, else `DITSERVE_MALLOC`, else glibc."""
    return (malloc if malloc is not None else os.environ.get("DITSERVE_MALLOC")) or "glibc"


def malloc_library(choice: str | None) -> Path | None:
    """The shared object to preload for an allocator choice; None for glibc's own malloc.

    `choice` is `glibc` (or empty), `jemalloc`, `tcmalloc`, or a path to a malloc library
    (e.g. one copied to a machine without the package). Raises RuntimeError naming the package
    when the library is not there: a server silently left on glibc would measure the wrong thing.
    """
    choice = (choice or "glibc").strip()
    if choice == "glibc":
        return None
    if "/" in choice:
        path = Path(choice)
        if not path.is_file():
            raise RuntimeError(f"malloc library {path} does not exist")
        return path.resolve()
    if choice not in MALLOC_LIBRARIES:
        raise RuntimeError(f"unknown allocator {choice!r}: use glibc, {', '.join(MALLOC_LIBRARIES)} or a path to a .so")
    names, package = MALLOC_LIBRARIES[choice]
    dirs = _library_dirs()
    for name in names:
        for d in dirs:
            if (d / name).is_file():
                return d / name
    raise RuntimeError(f"allocator {choice}: none of {', '.join(names)} in {', '.join(map(str, dirs))}; "
                       f"install the Debian/Ubuntu package {package} (apt-get install -y {package}) "
                       f"or pass the library's path")


def server_env(deployment: str | None = None, malloc: str | None = None) -> dict[str, str]:
    """Environment the server and its Python stubs need.

    The stub takes its site-packages from the first `python3` on PATH, so the running
    interpreter's `bin` goes first; the wheel's bundled libs and libpython go on
    LD_LIBRARY_PATH. `malloc` (default: `DITSERVE_MALLOC`) preloads another allocator into
    tritonserver and, through the inherited environment, into every stub (malloc_library()).
    """
    env = dict(os.environ)
    library = malloc_library(malloc_choice(malloc))
    if library is not None:
        env["LD_PRELOAD"] = f"{library}:{env['LD_PRELOAD']}" if env.get("LD_PRELOAD") else str(library)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    libs = []
    if not os.environ.get("TRITONSERVER"):
        libs.append(str(_pytriton_dir().parent.parent / "nvidia_pytriton.libs"))
    libs.append(sysconfig.get_config_var("LIBDIR"))
    if env.get("LD_LIBRARY_PATH"):
        libs.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = ":".join(libs)
    env.setdefault("HF_HUB_OFFLINE", "1")
    # Every model instance is its own stub process; torch's default of one thread per core
    # in each of them oversubscribes a CPU host and collapses throughput (perf/results).
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    # The package lives in backends/; the stub ignores PYTHONPATH, but an editable install
    # puts it on the path. Keep PYTHONPATH too for tools that honour it.
    env["PYTHONPATH"] = backends_on_pythonpath(env)
    if deployment:
        env["DITSERVE_DEPLOYMENT"] = str(Path(deployment).resolve())
    return env


def backends_on_pythonpath(env: Mapping[str, str]) -> str:
    """`env`'s PYTHONPATH with backends/ first: a child process finds `ditserve` in a checkout
    without the editable install (the lent GPU machine)."""
    return f"{REPO_ROOT / 'backends'}:{env.get('PYTHONPATH', '')}".rstrip(":")


def free_ports(n: int) -> list[int]:
    """n TCP ports free on 127.0.0.1 right now (for servers started beside others: tests, perf)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def cuda_pool_args() -> list[str]:
    """`DITSERVE_CUDA_POOL_BYTES=N` sizes the Python backend's CUDA memory pool on GPU 0.

    GPU tensors crossing stub boundaries (images) live in that pool, 64 MB by default;
    a GPU host serving many concurrent 1024px images may need more (perf/results)."""
    size = os.environ.get("DITSERVE_CUDA_POOL_BYTES")
    return [f"--cuda-memory-pool-byte-size=0:{int(size)}"] if size else []


@dataclass
class ServerOptions:
    """How to start tritonserver; ports 0 are not allowed by Triton, so callers pick free ones."""

    model_repository: Path = REPO_ROOT / "model_repository"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    host: str = "127.0.0.1"
    deployment: str | None = None
    log_verbose: int = 0
    extra_args: list[str] = field(default_factory=list)
    # glibc | jemalloc | tcmalloc | a path to a malloc .so; None: `DITSERVE_MALLOC`, else glibc
    malloc: str | None = None
    # added to the server's (and its stubs') environment, e.g. {"MALLOC_ARENA_MAX": "2"}
    env: dict[str, str] = field(default_factory=dict)


# Servers this process started and has not reaped yet: what stop_servers_on_signals() stops.
_RUNNING: list["TritonServer"] = []


class TritonServer:
    """A tritonserver child process with readiness wait and clean shutdown."""

    def __init__(self, options: ServerOptions, log_path: Path | None = None):
        self.options = options
        self.log_path = log_path
        self.process: subprocess.Popen | None = None
        self.stop_requested = False

    @property
    def http_url(self) -> str:
        return f"{self.options.host}:{self.options.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.options.host}:{self.options.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.options.host}:{self.options.metrics_port}/metrics"

    def command(self) -> list[str]:
        o = self.options
        return [
            str(tritonserver_binary()),
            f"--model-repository={o.model_repository}",
            f"--backend-directory={backend_directory()}",
            f"--http-address={o.host}", f"--http-port={o.http_port}",
            f"--grpc-address={o.host}", f"--grpc-port={o.grpc_port}",
            f"--metrics-address={o.host}", f"--metrics-port={o.metrics_port}",
            f"--log-verbose={o.log_verbose}",
            "--exit-timeout-secs=60",  # unloading stubs takes seconds on a busy 2-core host
            *cuda_pool_args(),
            *o.extra_args,
        ]

    def start(self) -> "TritonServer":
        if self.process and self.process.poll() is None:
            # A second start would lose the first process (it keeps the ports and serves on,
            # unreaped): `with server.start():` did that, as `__enter__` starts too.
            raise RuntimeError(f"tritonserver is already running (pid {self.process.pid}); use either "
                               "`with TritonServer(...) as server:` or `server.start()`, not both")
        self.stop_requested = False
        env = {**server_env(self.options.deployment, self.options.malloc), **self.options.env}
        out = open(self.log_path, "w") if self.log_path else None
        self.process = subprocess.Popen(
            self.command(), env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        if self not in _RUNNING:
            _RUNNING.append(self)
        return self

    def wait_ready(self, timeout_s: float = 180.0, progress: bool = False) -> None:
        """Poll `/v2/health/ready`, then `/metrics` (Triton starts the metrics service a few
        ms after HTTP reports ready); fail fast with the log tail if the process dies."""
        deadline = time.monotonic() + timeout_s
        pending = [f"http://{self.http_url}/v2/health/ready", self.metrics_url]
        while time.monotonic() < deadline:
            if self.process and self.process.poll() is not None:
                raise RuntimeError(f"tritonserver exited with code {self.process.returncode}\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(pending[0], timeout=2) as r:
                    if r.status == 200:
                        pending.pop(0)
                        if not pending:
                            return
                        continue
            except OSError:
                pass
            if progress:
                print(".", end="", flush=True, file=sys.stderr)
            time.sleep(0.5)
        raise TimeoutError(f"tritonserver not ready after {timeout_s:.0f}s\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path or not Path(self.log_path).exists():
            return ""
        return "\n".join(Path(self.log_path).read_text(errors="replace").splitlines()[-lines:])

    def request_stop(self) -> None:
        """Ask Triton to unload its models and exit, once; safe inside a signal handler (never
        waits). A caller may ask early and reap later with stop() (test fixtures do)."""
        if self.process and self.process.poll() is None and not self.stop_requested:
            self.stop_requested = True
            self.process.send_signal(signal.SIGINT)

    def stub_pids(self) -> list[int]:
        """Python-backend stub processes of this server (they share its process group)."""
        if not self.process or self.process.poll() is not None:
            return []
        pids = []
        for proc in Path("/proc").iterdir():
            try:
                if proc.name.isdigit() and os.getpgid(int(proc.name)) == self.process.pid and \
                        b"triton_python_backend_stub" in (proc / "cmdline").read_bytes():
                    pids.append(int(proc.name))
            except OSError:  # gone meanwhile
                continue
        return pids

    def dump_stacks(self) -> list[int]:
        """Ask every stub to print all its threads' Python stacks to the server log
        (backends/diffusion/model.py registers the SIGUSR1 handler): where a stall waits."""
        pids = self.stub_pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        return pids

    def kill(self) -> None:
        """Last resort: SIGKILL the server's whole process group, stubs included."""
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)

    def stop(self, timeout_s: float = 90.0) -> None:
        """SIGINT lets Triton unload models and reap its stubs; SIGKILL the group as a last resort."""
        if self.process and self.process.poll() is None:
            self.request_stop()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
                self.process.wait()
        if self in _RUNNING:
            _RUNNING.remove(self)

    def __enter__(self) -> "TritonServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def stop_servers_on_signals() -> None:
    """SIGTERM and SIGINT ask every server this process started to stop at once, then unwind the
    main thread as Ctrl-C does (KeyboardInterrupt); at exit the servers are reaped.

    A server runs in its own session (a terminal's Ctrl-C must not kill it mid-unload), so no
    signal to this process reaches it: without this, a killed parent (`timeout`, `kill`, a CI
    cancel) leaves its servers and their stubs running. Call it once, from the main thread."""
    def interrupt(signum, _frame):
        for server in list(_RUNNING):
            server.request_stop()   # never waits: the servers unload while this process unwinds
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, interrupt)
    atexit.unregister(_stop_all)   # once, however often this is called
    atexit.register(_stop_all)


def _stop_all() -> None:
    for server in list(_RUNNING):
        server.request_stop()       # all unload at once, then each is reaped
    for server in list(_RUNNING):
        server.stop()

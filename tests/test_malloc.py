"""Another allocator for tritonserver (issue 19: its RSS grows under glibc malloc in soaks).

`ServerOptions.malloc` / `DITSERVE_MALLOC` / `perf/soak.py --malloc` preload jemalloc or tcmalloc
into tritonserver and, through the inherited environment, into every Python stub
(perf/results/2026-12-02-cpu-rss-allocator.md). The server tests skip where the library is not
installed (Debian packages libjemalloc2, libtcmalloc-minimal4)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import TINY_PIXART, start_server
from ditserve import launcher
from ditserve.client import DitClient, GenerationRequest
from ditserve.launcher import MALLOC_LIBRARIES, malloc_library, server_env
from helpers import assert_stops_cleanly


def _mapped(pid: int) -> set[str]:
    return {line.split(None, 5)[5] for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
            if len(line.split(None, 5)) == 6}


def test_glibc_preloads_nothing(monkeypatch):
    monkeypatch.delenv("DITSERVE_MALLOC", raising=False)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    assert malloc_library("glibc") is None and malloc_library(None) is None
    assert "LD_PRELOAD" not in server_env()


def test_a_missing_library_is_an_error_naming_the_package(monkeypatch, tmp_path):
    monkeypatch.setattr(launcher, "_library_dirs", lambda: [tmp_path])
    for name, (_, package) in MALLOC_LIBRARIES.items():
        with pytest.raises(RuntimeError, match=package):
            malloc_library(name)
        with pytest.raises(RuntimeError, match=package):
            server_env(malloc=name)
    with pytest.raises(RuntimeError, match="unknown allocator"):
        malloc_library("mimalloc")
    with pytest.raises(RuntimeError, match="does not exist"):
        malloc_library(str(tmp_path / "libjemalloc.so.2"))


def test_the_library_goes_first_on_ld_preload(monkeypatch, tmp_path):
    lib = tmp_path / "libjemalloc.so.2"
    lib.write_bytes(b"")
    monkeypatch.setattr(launcher, "_library_dirs", lambda: [tmp_path])
    monkeypatch.setenv("LD_PRELOAD", "/other.so")
    assert server_env(malloc="jemalloc")["LD_PRELOAD"] == f"{lib}:/other.so"
    monkeypatch.setenv("DITSERVE_MALLOC", str(lib))   # a path works too (a library copied to a machine)
    assert server_env()["LD_PRELOAD"] == f"{lib}:/other.so"
    assert server_env(malloc="glibc")["LD_PRELOAD"] == "/other.so"   # the option overrides the variable


@pytest.mark.parametrize("name", sorted(MALLOC_LIBRARIES))
def test_server_and_stubs_run_on_the_preloaded_allocator(tmp_path, name):
    try:
        lib = malloc_library(name)
    except RuntimeError as exc:
        pytest.skip(str(exc))
    if not TINY_PIXART.exists():
        pytest.fail(f"{TINY_PIXART} is missing: run `bash scripts/setup.sh` (it builds the tiny pipelines)")
    server = start_server(tmp_path, f"malloc-{name}", malloc=name)
    stopped = False
    try:
        real = os.path.realpath(lib)
        assert real in _mapped(server.process.pid), f"tritonserver does not map {real}"
        stubs = server.stub_pids()
        assert len(stubs) >= 5, "expected one Python stub per model instance"
        assert all(real in _mapped(pid) for pid in stubs), f"a stub does not map {real}"
        with DitClient(server.grpc_url, "grpc-stream") as client:   # the stubs still serve
            result = client.generate(GenerationRequest("a castle", num_inference_steps=3, seed=3))
        assert result.media.shape == (64, 64, 3)
        stopped = True
        assert_stops_cleanly(server)   # no stub crashed on the way down either
    finally:
        if not stopped:
            server.stop()

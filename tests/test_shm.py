"""System shared-memory output through the real server (CUDA shm: perf/video_transport.py on a GPU host)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException
from tritonclient.utils import shared_memory as shm

from conftest import ROOT
from ditserve.client import DitClient, GenerationRequest
from ditserve.media import decode_mp4
from helpers import grpc_inputs, wait_for_metric
from test_txt2vid import LUMA_TOLERANCE, luma


def _segments(prefix: str = "ditserve-") -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith(prefix)}


@pytest.fixture
def segments_before() -> set[str]:
    """/dev/shm segments that existed before the test (another process's, on a shared host):
    a test checks only that it leaves none of its own."""
    return _segments()


def _registered(server) -> list[str]:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        return [r.name for r in client.get_system_shared_memory_status().regions.values()]


@pytest.mark.parametrize("protocol", ["grpc", "http", "grpc-stream"])
def test_image_lands_in_the_region_and_matches_plain_output(server, protocol, segments_before):
    url = server.http_url if protocol == "http" else server.grpc_url
    request = GenerationRequest("a cat", seed=3, num_inference_steps=4, height=96, width=64)
    with DitClient(url, protocol) as plain:
        expected = plain.generate(request).media
    with DitClient(url, protocol, shm="system") as client:
        result = client.generate(request)
        assert len(client.pool.regions) == 1 and client.pool.regions[0].byte_size == 96 * 64 * 3
    assert np.array_equal(result.media, expected)
    assert not _segments() - segments_before and not _registered(server), "regions freed and unregistered on close"


def test_regions_are_reused_across_requests(server):
    with DitClient(server.grpc_url, "grpc", shm="system") as client:
        for size in (128, 64, 128):
            image = client.generate(GenerationRequest("x", seed=1, num_inference_steps=2, height=size,
                                                      width=size)).media
            assert image.shape == (size, size, 3)
        assert len(client.pool.regions) == 1, "the 128x128 region served the smaller request too"
        assert len(_registered(server)) == 1


def test_a_too_small_region_is_a_clear_error_and_nothing_else_changes(server):
    name = f"ditserve-test-small-{os.getpid()}"
    handle = shm.create_shared_memory_region(name, f"/{name}", 1000)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.register_system_shared_memory(name, f"/{name}", 1000)
        try:
            output = grpcclient.InferRequestedOutput("image")
            output.set_shared_memory(name, 1000)
            with pytest.raises(InferenceServerException) as err:
                client.infer("txt2img", grpc_inputs(GenerationRequest("x", seed=1, num_inference_steps=2)),
                             outputs=[output])
            assert "image" in err.value.message() and ("size" in err.value.message() or "small" in err.value.message())
            assert client.is_server_ready()
        finally:
            client.unregister_system_shared_memory(name)
            shm.destroy_shared_memory_region(handle)
    with DitClient(server.grpc_url, "grpc") as client:
        assert client.generate(GenerationRequest("x", seed=1, num_inference_steps=2)).media.shape == (64, 64, 3)


def test_an_unregistered_region_is_a_clear_error(server):
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        output = grpcclient.InferRequestedOutput("image")
        output.set_shared_memory("ditserve-never-registered", 64 * 64 * 3)
        with pytest.raises(InferenceServerException, match="ditserve-never-registered"):
            client.infer("txt2img", grpc_inputs(GenerationRequest("x", seed=1, num_inference_steps=2)),
                         outputs=[output])


def test_regions_of_a_crashed_client_are_reaped_by_the_next_pool(server):
    crash = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(ROOT / "backends")!r})
        from ditserve.client import DitClient, GenerationRequest
        client = DitClient({server.grpc_url!r}, "grpc", shm="system")
        client.generate(GenerationRequest("x", seed=1, num_inference_steps=2, height=64, width=64))
        print(client.pool.regions[0].name, flush=True)
        os._exit(1)   # dies holding a registered region and a /dev/shm segment
    """)
    proc = subprocess.run([sys.executable, "-c", crash], capture_output=True, text=True, timeout=120)
    leaked = proc.stdout.strip()
    # Python's resource tracker unlinks the dead client's segment; the server still holds
    # the registration (and its mapping) until someone unregisters it.
    assert leaked in _registered(server)
    with DitClient(server.grpc_url, "grpc", shm="system") as client:
        assert leaked in client.pool.reaped
    assert leaked not in _registered(server) and leaked not in _segments()


def test_shm_needs_an_explicit_size(server):
    with DitClient(server.grpc_url, "grpc", shm="system") as client, pytest.raises(ValueError, match="height and width"):
        client.generate(GenerationRequest("x"))


def test_a_client_killed_mid_request_leaves_nothing_once_reaped(server):
    """The client dies while its 60-step request is still denoising into its region."""
    crash = textwrap.dedent(f"""
        import os, sys, threading, time
        sys.path.insert(0, {str(ROOT / "backends")!r})
        from ditserve.client import DitClient, GenerationRequest
        client = DitClient({server.grpc_url!r}, "grpc", shm="system")
        request = GenerationRequest("x", seed=1, num_inference_steps=60, height=128, width=128)
        threading.Thread(target=client.generate, args=(request,), daemon=True).start()
        while not client.pool.regions:
            time.sleep(0.01)
        time.sleep(0.5)
        print(client.pool.regions[0].name, flush=True)
        os._exit(1)   # mid-request: the server will still write the image into the region
    """)
    proc = subprocess.run([sys.executable, "-c", crash], capture_output=True, text=True, timeout=120)
    leaked = proc.stdout.strip()
    assert leaked in _registered(server)
    assert wait_for_metric(server.metrics_url, "ditserve_state_table_size", "dit", 0.0) == 0.0
    with DitClient(server.grpc_url, "grpc", shm="system") as client:
        assert leaked in client.pool.reaped
        assert client.generate(GenerationRequest("next", seed=1, num_inference_steps=2, height=64,
                                                 width=64)).media.shape == (64, 64, 3)
    assert leaked not in _registered(server) and leaked not in _segments()


def test_a_video_larger_than_64_mb_lands_in_the_region_beside_its_mp4(wan_server, segments_before):
    """Above Docker's default 64 MB /dev/shm; two outputs: the raw video in the region, the MP4 inline.
    57 frames at 480x832 (68 MB) is the shortest Wan video of that size above the limit."""
    request = GenerationRequest("a slow pan over hills", seed=2, num_inference_steps=1, guidance_scale=1.0,
                                num_frames=57, height=480, width=832, output_format="mp4")
    assert request.media_bytes() > 64 * 2**20
    with DitClient(wan_server.grpc_url, "grpc", task="txt2vid", shm="system") as client:
        result = client.generate(request)
        assert client.pool.regions[0].byte_size == request.media_bytes()
    assert result.media.shape == (57, 480, 832, 3)
    frames, _ = decode_mp4(result.video_mp4)   # encoded by the server from the same frames
    assert frames.shape == result.media.shape
    assert np.abs(luma(frames) - luma(result.media)).mean() < LUMA_TOLERANCE
    assert not _segments() - segments_before and not _registered(wan_server)

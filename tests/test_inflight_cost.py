"""An in-flight generation costs one public-model stub that loads neither torch nor diffusers.

Every instance of `txt2img` and `txt2img_stream` on the real server: the stub's load line says
which heavy modules it had imported once initialised, and after a generation has gone through
each of them (unary and streamed), no libtorch is mapped in any of those processes.
perf/inflight_cost.py measures what that saves (perf/results/2026-12-01-cpu-inflight-cost.md).
"""
from __future__ import annotations

import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ditserve.client import DitClient, GenerationRequest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "perf"))
import resources  # noqa: E402  (perf/resources.py: how perf/inflight_cost.py names the stubs too)

PUBLIC = ("txt2img", "txt2img_stream")
CAPACITY = 4   # the committed repository: count 4 of each public model


def public_stubs(server) -> dict[int, str]:
    stubs = {pid: resources.process_name(pid) for pid in server.stub_pids()}
    return {pid: name for pid, name in stubs.items() if name.rsplit("_", 2)[0] in PUBLIC}


def test_public_stubs_load_without_torch_or_diffusers(server):
    loads = re.findall(r'(txt2img(?:_stream)?): in-flight generation stub loaded; imported: ([^"\n]*)',
                       server.log_path.read_text(errors="replace"))
    assert sorted(model for model, _ in loads) == sorted(PUBLIC * CAPACITY), loads
    assert {heavy for _, heavy in loads} == {"none of torch, diffusers, transformers"}, loads


def test_no_public_stub_maps_libtorch_after_serving(server):
    def generate(protocol: str, seed: int) -> None:
        with DitClient(server.grpc_url, protocol=protocol) as client:
            client.generate(GenerationRequest("a red cat", seed=seed, num_inference_steps=2))

    # as many at once as there are instances: most (usually all) instances serve one
    with ThreadPoolExecutor(2 * CAPACITY) as pool:
        for job in [pool.submit(generate, protocol, seed) for protocol in ("grpc", "grpc-stream")
                    for seed in range(CAPACITY)]:
            job.result()
    stubs = public_stubs(server)
    assert len(stubs) == 2 * CAPACITY, stubs
    torch_maps = {name: line.split()[-1] for pid, name in stubs.items()
                  for line in Path(f"/proc/{pid}/maps").read_text().splitlines() if "libtorch" in line}
    assert not torch_maps, f"public-model stubs with torch loaded: {torch_maps}"

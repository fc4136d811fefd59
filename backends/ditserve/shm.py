"""Client-side shared-memory output regions: the final media lands in memory the client owns.

    with DitClient(url, "grpc", shm="system") as client:          # or shm="cuda" on a GPU host
        result = client.generate(GenerationRequest("a cat", height=64, width=64))

A pool registers regions with the server once and reuses them across requests (a region
is reused when it is large enough); it unregisters and frees them on `close()`, at
interpreter exit, and drops a region whose request failed so a broken region is never
reused. Region names carry the owner's pid: a new pool reaps the registrations (and, for
system memory on this host, the /dev/shm segments) of clients that died without cleaning up. `system` uses POSIX shared memory (/dev/shm); `cuda` uses cudaIPC memory on the
client's GPU and can hand the result to torch without a host copy.
"""
from __future__ import annotations

import atexit
import os
import re
import uuid
from pathlib import Path
from dataclasses import dataclass
from typing import Any

import numpy as np

KINDS = ("system", "cuda")
_NAME = re.compile(r"^ditserve-(\d+)-[0-9a-f]{8}-\d+$")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class Region:
    name: str
    kind: str
    byte_size: int
    handle: Any
    busy: bool = False


class OutputRegionPool:
    """Shared-memory regions registered with one server, reused across requests."""

    def __init__(self, client, kind: str, device_id: int = 0):
        if kind not in KINDS:
            raise ValueError(f"shared-memory kind {kind!r}; choose one of {KINDS}")
        self.client, self.kind, self.device_id = client, kind, device_id
        self.regions: list[Region] = []
        self._prefix = f"ditserve-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.reaped = self.reap_dead_owners()
        atexit.register(self.close)

    def _status(self) -> list[dict]:
        status = (self.client.get_system_shared_memory_status() if self.kind == "system"
                  else self.client.get_cuda_shared_memory_status())
        if isinstance(status, list):  # HTTP returns JSON
            return status
        return [{"name": r.name} for r in status.regions.values()]

    def reap_dead_owners(self) -> list[str]:
        """Unregister (and unlink) regions left by ditserve clients that no longer run here."""
        reaped = []
        for entry in self._status():
            match = _NAME.match(entry["name"])
            if not match or _alive(int(match.group(1))):
                continue
            if self.kind == "system":
                self.client.unregister_system_shared_memory(entry["name"])
                Path("/dev/shm", entry["name"]).unlink(missing_ok=True)
            else:
                self.client.unregister_cuda_shared_memory(entry["name"])
            reaped.append(entry["name"])
        return reaped

    def acquire(self, byte_size: int) -> Region:
        """A free registered region of at least `byte_size` bytes (created on first need)."""
        for region in self.regions:
            if not region.busy and region.byte_size >= byte_size:
                region.busy = True
                return region
        region = self._create(byte_size)
        region.busy = True
        self.regions.append(region)
        return region

    def release(self, region: Region, broken: bool = False) -> None:
        region.busy = False
        if broken:
            self._destroy(region)
            self.regions.remove(region)

    def read(self, region: Region, shape: list[int], dtype=np.uint8) -> np.ndarray:
        """A numpy copy of the result (host memory either way)."""
        if self.kind == "system":
            from tritonclient.utils import shared_memory as shm

            return np.array(shm.get_contents_as_numpy(region.handle, dtype, shape))
        from tritonclient.utils import cuda_shared_memory as cudashm

        return cudashm.get_contents_as_numpy(region.handle, dtype, shape)

    def as_torch(self, region: Region, shape: list[int]):
        """CUDA regions only: a torch tensor viewing the region on the GPU (no host copy).

        Valid until the region is reused by the next request; clone it to keep it."""
        if self.kind != "cuda":
            raise ValueError("as_torch needs a CUDA region; use read() for system shared memory")
        import torch
        from tritonclient.utils import cuda_shared_memory as cudashm

        return torch.from_dlpack(cudashm.as_shared_memory_tensor(region.handle, "UINT8", shape))

    def _create(self, byte_size: int) -> Region:
        name = f"{self._prefix}-{len(self.regions)}"
        if self.kind == "system":
            from tritonclient.utils import shared_memory as shm

            handle = shm.create_shared_memory_region(name, f"/{name}", byte_size)
            try:
                self.client.register_system_shared_memory(name, f"/{name}", byte_size)
            except Exception:
                shm.destroy_shared_memory_region(handle)
                raise
        else:
            from tritonclient.utils import cuda_shared_memory as cudashm

            handle = cudashm.create_shared_memory_region(name, byte_size, self.device_id)
            try:
                self.client.register_cuda_shared_memory(name, cudashm.get_raw_handle(handle), self.device_id,
                                                        byte_size)
            except Exception:
                cudashm.destroy_shared_memory_region(handle)
                raise
        return Region(name, self.kind, byte_size, handle)

    def _destroy(self, region: Region) -> None:
        try:
            if self.kind == "system":
                self.client.unregister_system_shared_memory(region.name)
            else:
                self.client.unregister_cuda_shared_memory(region.name)
        except Exception:  # the server may be gone; still free our side
            pass
        if self.kind == "system":
            from tritonclient.utils import shared_memory as shm

            shm.destroy_shared_memory_region(region.handle)
        else:
            from tritonclient.utils import cuda_shared_memory as cudashm

            cudashm.destroy_shared_memory_region(region.handle)

    def close(self) -> None:
        """Unregister and free every region; idempotent."""
        while self.regions:
            self._destroy(self.regions.pop())
        atexit.unregister(self.close)

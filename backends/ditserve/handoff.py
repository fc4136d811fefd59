"""A generation's conditioning, handed from a public model to `dit` once, out of band.

`dit` is an iterative-sequence model: Triton hands the same request back to `execute` at
every denoise step, and the Python backend copies the request's inputs into the stub each
time. Prompt embeddings are large (PixArt-Sigma's [2, 300, 4096] are 4.9 MB in bf16 and
9.8 MB in fp32, Wan's UMT5 [2, 512, 4096] 8.4 / 16.8 MB, plus Wan I2V's 10 MB first-frame
condition), and that copy measured 3.6 ms per step for 9.8 MB on a 2-core host
(perf/results/2026-11-29-cpu-step-overhead.md). So the public model writes them here under
the generation's id (the `dit` request id), sends `dit` only the small `params`, and `dit`
takes them at admission: the file is gone as soon as it is read.

Files live in a directory private to this server process (all stubs share tritonserver as
parent), on tmpfs where there is one. A file whose generation never reached `dit` (it
failed or was cancelled first) is removed by its writer, or, if the writer died, by `dit`'s
garbage collection after the idle timeout.

The format is safetensors, not torch.save: no pickle, and faster. On the 2-core dev host, the
median to write and read the file is 4.8 ms instead of 8.2 ms for PixArt's 9.8 MB, and 8.9 ms
instead of 14.9 ms for Wan's 16.8 MB. `take` maps the file, so the tensors read the tmpfs
pages directly; the file is unlinked at once and its pages go when the tensors do.
"""
from __future__ import annotations

import tempfile
import uuid
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .scratch import GenerationFiles, pipeline_dir


def default_root(server_pid: int | None = None, pipeline: str | None = None) -> Path:
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    return pipeline_dir(base, "handoff", pipeline, server_pid)


class ConditioningStore(GenerationFiles):
    def __init__(self, root: Path | None = None, pipeline: str | None = None):
        super().__init__(root or default_root(pipeline=pipeline))

    def put(self, key: str, tensors: dict[str, torch.Tensor]) -> None:
        """Write atomically (a reader never sees half a file)."""
        path = self._path(key)
        self.root.mkdir(parents=True, exist_ok=True)
        partial = self.root / f".{key}.{uuid.uuid4().hex}"
        save_file({name: t.detach().cpu().contiguous() for name, t in tensors.items()}, partial)
        partial.rename(path)

    def take(self, key: str) -> dict[str, torch.Tensor]:
        """Read and remove; a missing entry is a KeyError that says why it may be missing."""
        path = self._path(key)
        try:
            tensors = load_file(path)
        except FileNotFoundError:
            raise KeyError(f"no conditioning was handed over for generation {key} (its sender failed or "
                           f"was cancelled first, or it was collected after the idle timeout)") from None
        path.unlink(missing_ok=True)
        return tensors

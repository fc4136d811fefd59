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

The writer is the public model, which imports neither torch nor diffusers (docs/scheduler.md,
"What an in-flight generation costs"): it writes the format itself from raw bytes
(`HostTensor`), so BF16 embeddings need no numpy dtype. The reader is `dit`, which has torch.
"""
from __future__ import annotations

import json
import math
import os
import struct
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from .scratch import GenerationFiles, pipeline_dir

# numpy dtype name -> safetensors dtype (numpy has no bfloat16: BF16 arrives as raw bytes).
_NUMPY_DTYPES = {"bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "int32": "I32", "int64": "I64",
                 "float16": "F16", "float32": "F32", "float64": "F64"}
_ITEM_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "U16": 2, "I16": 2, "F16": 2, "BF16": 2, "U32": 4, "I32": 4, "F32": 4,
               "U64": 8, "I64": 8, "F64": 8}


@dataclass(frozen=True)
class HostTensor:
    """A tensor as the bytes of its C-contiguous, little-endian data, a safetensors dtype and a shape."""
    dtype: str
    shape: tuple[int, ...]
    data: bytes

    def __post_init__(self):
        if self.dtype not in _ITEM_BYTES:
            raise ValueError(f"dtype {self.dtype!r}; allowed: {sorted(_ITEM_BYTES)}")
        if len(self.data) != math.prod(self.shape) * _ITEM_BYTES[self.dtype]:
            raise ValueError(f"{len(self.data)} bytes for a {self.dtype} tensor of shape {list(self.shape)}")

    @classmethod
    def from_numpy(cls, array: np.ndarray) -> "HostTensor":
        array = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
        return cls(_NUMPY_DTYPES[array.dtype.name], tuple(array.shape), array.tobytes())

    def without_batch(self) -> "HostTensor":
        """The same bytes without a leading dimension of 1."""
        if not self.shape or self.shape[0] != 1:
            raise ValueError(f"expected a batch of one, got shape {list(self.shape)}")
        return HostTensor(self.dtype, self.shape[1:], self.data)


def serialize(tensors: Mapping[str, HostTensor], metadata: Mapping[str, str] | None = None) -> list[bytes]:
    """The safetensors file of `tensors` (and string `metadata`) as chunks: 8-byte header size,
    JSON header, data."""
    header, offset = ({"__metadata__": dict(metadata)} if metadata else {}), 0
    for name, tensor in tensors.items():
        header[name] = {"dtype": tensor.dtype, "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + len(tensor.data)]}
        offset += len(tensor.data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)   # the data starts 8-byte aligned
    return [struct.pack("<Q", len(text)), text, *(t.data for t in tensors.values())]


def default_root(server_pid: int | None = None, pipeline: str | None = None, kind: str = "handoff") -> Path:
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    return pipeline_dir(base, kind, pipeline, server_pid)


@dataclass
class Handover:
    """What dit takes at admission: the conditioning, and when the public model handed it over
    (time.monotonic(), one clock for every process of the host), so that dit can say how long a
    generation waited between its encode and its admission (ditserve_admission_wait_seconds)."""
    tensors: dict
    handed_at: float


class ConditioningStore(GenerationFiles):
    def __init__(self, root: Path | None = None, pipeline: str | None = None):
        super().__init__(root or default_root(pipeline=pipeline))

    def put(self, key: str, tensors: Mapping[str, HostTensor]) -> None:
        """Write atomically (a reader never sees half a file), stamped with the time of handing over."""
        path = self._path(key)
        self.root.mkdir(parents=True, exist_ok=True)
        partial = self.root / f".{key}.{uuid.uuid4().hex}"
        with open(partial, "wb") as f:
            f.writelines(serialize(tensors, {"handed_at": repr(time.monotonic())}))
        partial.rename(path)

    def waiting(self) -> bool:
        """Whether a generation's conditioning is here, i.e. handed over (or being written) for a
        dit request that has not been admitted yet: dit then returns to Triton so it can join."""
        try:
            with os.scandir(self.root) as entries:
                return next(entries, None) is not None
        except FileNotFoundError:
            return False

    def take(self, key: str) -> Handover:
        """Read (as torch tensors) and remove; a missing entry is a KeyError that says why it
        may be missing. Only dit reads, and it has torch loaded: the import costs nothing there
        and keeps it out of the public models."""
        from safetensors import safe_open

        path = self._path(key)
        try:
            with safe_open(path, framework="pt") as f:
                handover = Handover({name: f.get_tensor(name) for name in f.keys()},
                                    float(f.metadata()["handed_at"]))
        except FileNotFoundError:
            raise KeyError(f"no conditioning was handed over for generation {key} (its sender failed or "
                           f"was cancelled first, or it was collected after the idle timeout)") from None
        path.unlink(missing_ok=True)
        return handover


class Arrivals(GenerationFiles):
    """Generations on their way to dit: an empty file per generation, announced by the public
    model before it encodes the prompt and withdrawn once it has handed the conditioning over (or
    ended first). While one is announced and the device still runs the step dit queued last, dit
    holds its next step: if the conditioning is handed over meanwhile, the newcomer joins that
    step instead of waiting behind it (docs/scheduler.md, "A step held for an arrival")."""

    # An announcement older than this is a writer's that died between announcing and withdrawing:
    # ignored (and collected with the other scratch files), so it cannot hold dit's steps for good.
    MAX_AGE_S = 10.0

    def __init__(self, root: Path | None = None, pipeline: str | None = None):
        super().__init__(root or default_root(pipeline=pipeline, kind="incoming"))

    def announce(self, key: str) -> None:
        path = self._path(key)
        self.root.mkdir(parents=True, exist_ok=True)   # dit removes the folder when it unloads
        path.touch()

    def pending(self) -> bool:
        """Whether a generation is announced and not yet handed over (one directory scan)."""
        oldest = time.time() - self.MAX_AGE_S
        try:
            with os.scandir(self.root) as entries:
                for entry in entries:
                    try:
                        if entry.stat().st_mtime > oldest:
                            return True
                    except FileNotFoundError:   # withdrawn meanwhile
                        continue
        except FileNotFoundError:
            return False
        return False

    def hold(self, device_busy: Callable[[], bool], handed_over: Callable[[], bool], poll_s: float = 0.0002) -> bool:
        """Wait while a generation is announced, none has been handed over and the device still
        runs queued work; whether it waited at all (dit then holds its next step)."""
        held = False
        while device_busy() and not handed_over() and self.pending():
            held = True
            time.sleep(poll_s)
        return held

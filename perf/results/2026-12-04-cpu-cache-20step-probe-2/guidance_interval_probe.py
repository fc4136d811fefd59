"""Probe (kept with its results, not part of the server): a lossy tier that also stops classifier-free guidance for the last
GI_LAST steps (guidance interval), quality only, via perf/cache_frontier.py."""
import os
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]   # the repository (this file sits in perf/results/<run>/)
sys.path[:0] = [str(ROOT / "backends"), str(ROOT / "perf"), str(ROOT / "scripts")]
from ditserve.adapters import base  # noqa: E402

LAST = int(os.environ.get("GI_LAST", "0"))
original = base.FamilyAdapter.guidance_scale


def guidance_scale(self, state):
    steps = state.params.num_inference_steps
    if state.cache is not None and state.step_index >= steps - LAST:
        return 1.0
    return original(self, state)


base.FamilyAdapter.guidance_scale = guidance_scale
sys.argv = ["cache_frontier.py", *sys.argv[1:]]
runpy.run_path(str(ROOT / "perf" / "cache_frontier.py"), run_name="__main__")

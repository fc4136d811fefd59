import sys, time, statistics, inspect
sys.path[:0] = ["backends"]   # run from the repository root
import torch
torch.set_grad_enabled(False); torch.set_num_threads(1)
from diffusers.models.attention_processor import Attention, AttnProcessor2_0
a = Attention(64, heads=2, dim_head=32)
f = lambda: inspect.signature(a.processor.__call__)
for _ in range(1000): f()
t = time.perf_counter(); [f() for _ in range(20000)]; print("inspect.signature(bound __call__) us", (time.perf_counter()-t)/20000*1e6)
AttnProcessor2_0.__call__.__signature__ = inspect.signature(AttnProcessor2_0.__call__)
t = time.perf_counter(); [f() for _ in range(20000)]; print("pinned us", (time.perf_counter()-t)/20000*1e6)

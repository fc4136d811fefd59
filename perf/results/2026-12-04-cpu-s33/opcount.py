"""Count aten ops per denoise step: our engine step vs diffusers' pipeline step, full-depth tiny-width PixArt
(perf/results/2026-12-04-h200-scheduler-s33.md). Builds /tmp/deep/model from models/tiny-pixart-sigma."""
import json
import shutil
import sys
from pathlib import Path
import torch
from torch.utils._python_dispatch import TorchDispatchMode
ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "backends")]
from diffusers import PixArtTransformer2DModel, PixArtSigmaPipeline
src = ROOT / "models/tiny-pixart-sigma"; dst = Path("/tmp/deep/model")
if not dst.exists():
    shutil.copytree(src, dst)
    cfg = json.loads((src / "transformer/config.json").read_text()); cfg["num_layers"] = 28
    cfg = {k: v for k, v in cfg.items() if not k.startswith("_")}
    torch.manual_seed(0)
    PixArtTransformer2DModel(**cfg).eval().save_pretrained(dst / "transformer")
toml = (ROOT / "configs/tiny-pixart-sigma.toml").read_text().replace('path = "models/tiny-pixart-sigma"', f'path = "{dst}"')
Path("/tmp/deep/dep.toml").write_text(toml)

class Count(TorchDispatchMode):
    def __init__(self): super().__init__(); self.ops = {}
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] = self.ops.get(str(func), 0) + 1
        return func(*args, **(kwargs or {}))

from ditserve.deployment import load_deployment
from ditserve.adapters import adapter_for
from ditserve.engine import StepEngine
from ditserve.schema import GenerationParams
dep = load_deployment("/tmp/deep/dep.toml")
adapter = adapter_for(dep.model.family)(dep, "dit")
for solver_on in (False, True):
    engine = StepEngine(adapter)
    saved = adapter.solver
    if not solver_on: adapter.solver = None
    for guidance, name in ((4.5, "cfg"), (1.0, "nocfg")):
        p = GenerationParams("p", "", 64, 64, 20, guidance, 0)
        st = engine.admit(name, p, adapter.example_conditioning(p))
        for _ in range(3): engine.step([name])
        with torch.inference_mode():
            c = Count()
            with c: engine.step([name])
        f = Count()
        with torch.inference_mode(), f:
            adapter.denoise([st])
        print(f"engine.step solver={'batched' if solver_on else 'per_request'} {name}: {sum(c.ops.values())} ops; denoise alone {sum(f.ops.values())}")
        if name == "cfg" and solver_on:
            diff = {k: c.ops[k] - f.ops.get(k, 0) for k in c.ops if c.ops[k] - f.ops.get(k, 0) > 0}
            print("  outside denoise:", sorted(diff.items(), key=lambda x: -x[1])[:25])
        engine.release(name)
    adapter.solver = saved

# diffusers: one loop iteration of PixArtSigmaPipeline.__call__ (transformer + CFG + scheduler.step)
pipe = PixArtSigmaPipeline.from_pretrained(dst)
pipe.scheduler.set_timesteps(20)
lat = torch.randn(1, 4, 8, 8)
emb = torch.randn(2, 300, 32); mask = torch.ones(2, 300, dtype=torch.long)
for i, t in enumerate(pipe.scheduler.timesteps[:4]):
    c = Count()
    with torch.inference_mode(), c:
        inp = torch.cat([lat] * 2)
        inp = pipe.scheduler.scale_model_input(inp, t)
        ts = t.expand(inp.shape[0])
        out = pipe.transformer(inp, encoder_hidden_states=emb, encoder_attention_mask=mask, timestep=ts,
                               added_cond_kwargs={"resolution": None, "aspect_ratio": None}, return_dict=False)[0]
        u, tx = out.chunk(2); out = u + 4.5 * (tx - u)
        out = out.chunk(2, dim=1)[0]
        lat = pipe.scheduler.step(out, t, lat, return_dict=False)[0]
    if i == 3: print(f"diffusers step cfg: {sum(c.ops.values())} ops")
c = Count()
with torch.inference_mode(), c:
    pipe.transformer(torch.cat([lat]*2), encoder_hidden_states=emb, encoder_attention_mask=mask, timestep=ts, added_cond_kwargs={"resolution": None, "aspect_ratio": None}, return_dict=False)
print(f"diffusers transformer alone: {sum(c.ops.values())} ops")

"""Does the 1024px transformer forward's time depend on its inputs (encoder mask, timestep dtype,
no_grad vs inference_mode) or on the SDPA backend? Eager, full-size PixArt-Sigma, 2 rows (GPU).

    python perf/forward_inputs_probe.py    # after scripts/build_full_size_random.py; JSON lines on stdout

Written on 2026-12-01 because one call's probe timed the eager forward at 38.5 ms and a later
call's engine at 48.7 ms; this settles that the inputs are not the cause (machine variance is).
"""
import torch, time, statistics, json
from diffusers import PixArtTransformer2DModel
t = PixArtTransformer2DModel.from_pretrained("models/pixart-sigma-1024-random", subfolder="transformer", torch_dtype=torch.bfloat16).to("cuda")
def timed(fn, n=10):
    for _ in range(3): fn()
    torch.cuda.synchronize(); out=[]
    for _ in range(n):
        s=time.perf_counter(); fn(); torch.cuda.synchronize(); out.append((time.perf_counter()-s)*1000)
    return round(statistics.median(out),2)
rows=2
lat=torch.randn(rows,4,128,128,device="cuda",dtype=torch.bfloat16)
emb=torch.randn(rows,300,4096,device="cuda",dtype=torch.bfloat16)
for mask_kind in ["20ones","allones","none"]:
  for ts_kind in ["float","int64"]:
    for ctx in ["no_grad","inference_mode"]:
        mask=torch.ones(rows,300,device="cuda",dtype=torch.int64)
        if mask_kind=="20ones": mask[:,20:]=0
        if mask_kind=="none": mask=None
        ts=torch.full((rows,),500.0,device="cuda") if ts_kind=="float" else torch.full((rows,),500,device="cuda",dtype=torch.int64)
        c = torch.no_grad if ctx=="no_grad" else torch.inference_mode
        with c():
            ms=timed(lambda: t(lat,encoder_hidden_states=emb,encoder_attention_mask=mask,timestep=ts,added_cond_kwargs={"resolution":None,"aspect_ratio":None},return_dict=False))
        print(json.dumps({"mask":mask_kind,"ts":ts_kind,"ctx":ctx,"ms":ms}),flush=True)
from torch.nn.attention import sdpa_kernel, SDPBackend
mask=torch.ones(rows,300,device="cuda",dtype=torch.int64)
ts=torch.full((rows,),500.0,device="cuda")
for b in [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]:
    try:
        with torch.no_grad(), sdpa_kernel([b, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH] if b!=SDPBackend.EFFICIENT_ATTENTION else [b, SDPBackend.MATH]):
            print(json.dumps({"prefer":str(b),"mask":"allones","ms":timed(lambda: t(lat,encoder_hidden_states=emb,encoder_attention_mask=mask,timestep=ts,added_cond_kwargs={"resolution":None,"aspect_ratio":None},return_dict=False))}),flush=True)
    except Exception as e: print(b, e)

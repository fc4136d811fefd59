"""The transformer's linear layers in FP8 (`[accel] fp8 = true`), written as plain torch ops.

Each `nn.Linear` inside the transformer's blocks becomes a `Float8Linear`: its weight stored
once in float8 e4m3 with one scale per output row, its input quantised per row at every call
(dynamic scales), the product done by `torch._scaled_mm` (FP8 tensor cores on Hopper/Ada,
cuBLASLt) and returned in bfloat16. The scale arithmetic is a handful of elementwise ops that
torch.compile fuses around the matmul.

Why our own and not torchao's `Float8DynamicActivationFloat8Weight`: on torch 2.11 the
compile of the torchao-quantised PixArt transformer had not finished after ~310 s on the
H200 (perf/results/2026-12-01-h200-accel.md, run 2), while these plain ops trace like any other
module. The embedders and the final projection stay in their dtype (they are a sliver of the
FLOPs and the most sensitive to rounding).
"""
from __future__ import annotations

import torch
from torch import nn

E4M3_MAX = torch.finfo(torch.float8_e4m3fn).max   # 448.0
# torch._scaled_mm needs both dimensions of the weight divisible by 16.
MATMUL_MULTIPLE = 16


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x in float8 e4m3, float32 scale per row) with x ~= x_fp8 * scale, per row of a 2-D x."""
    amax = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12)
    scale = amax / E4M3_MAX
    return (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scale


class Float8Linear(nn.Module):
    """`y = x W^T + b` with W and x in FP8 (per-row scales), accumulated by `torch._scaled_mm`."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight, scale = quantize_rows(linear.weight.detach())
        self.register_buffer("weight_fp8", weight)
        self.register_buffer("weight_scale", scale.reshape(1, -1))          # (1, out): scale_b of _scaled_mm
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        x_fp8, x_scale = quantize_rows(rows)
        y = torch._scaled_mm(x_fp8, self.weight_fp8.t(), scale_a=x_scale, scale_b=self.weight_scale,
                             out_dtype=torch.bfloat16)
        y = y.to(x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8=e4m3 per-row"


def eligible(name: str, module: nn.Module) -> bool:
    """Linear layers inside the transformer's blocks whose shapes `_scaled_mm` accepts."""
    return (isinstance(module, nn.Linear) and "blocks." in name
            and module.in_features % MATMUL_MULTIPLE == 0 and module.out_features % MATMUL_MULTIPLE == 0)


def apply_fp8(transformer: nn.Module) -> int:
    """Replace the eligible linear layers of `transformer` in place; returns how many.

    Refuses a CUDA device without FP8 tensor cores (compute capability < 8.9). On CPU it runs
    (torch's CPU `_scaled_mm`), which the CPU tests use for correctness; it is not faster there."""
    device = next(transformer.parameters()).device
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        raise ValueError("deployment [accel] fp8 = true needs FP8 tensor cores (compute capability >= 8.9, "
                         f"e.g. H100/H200/L40S); {torch.cuda.get_device_name(device)} has "
                         f"{torch.cuda.get_device_capability(device)}: set fp8 = false")
    targets = [(name, module) for name, module in transformer.named_modules() if eligible(name, module)]
    if not targets:
        raise ValueError(f"deployment [accel] fp8 = true: {type(transformer).__name__} has no linear layer in "
                         "its blocks with both dimensions divisible by 16; set fp8 = false")
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        setattr(transformer.get_submodule(parent_name), child, Float8Linear(module))
    return len(targets)

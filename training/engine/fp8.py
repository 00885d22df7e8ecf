"""FP8 training (config `precision: fp8`): the decoder's linear layers multiply in float8.

The recipe is the plain "tensorwise" one (as in torchao's float8 training and Transformer Engine's
delayed-free mode): the weights stay in bf16 — the optimizer, LoRA and the saved checkpoints see
exactly the parameters they always do — and every matmul of a converted layer casts its two operands
to float8 with one dynamic scale per tensor (amax → the format's largest value) and runs on
`torch._scaled_mm`:

- forward        y  = x·Wᵀ   x and W in e4m3 (more mantissa; activations and weights)
- backward, dx   dx = g·W    g in e5m2 (more range; gradients)
- backward, dW   dW = gᵀ·x   only when W trains (a full fine-tune; a LoRA base is frozen)

The layer keeps x in float8 for its backward pass (1 byte an element instead of 2) and casts W again
there instead of keeping a float8 copy alive between the passes.

What is converted: every `nn.Linear` of the base model (exactly that class: a 4-bit QLoRA layer or a
LoRA adapter's own A/B are not) whose two sizes are multiples of 16, the float8 GEMM's alignment,
except the output head, whose logits stay in bf16 (the loss is sensitive to them and the head is where
the vocabulary's outliers live). A layer is converted by switching its class in place, so the
module tree, state-dict keys and parameters are unchanged and PEFT wraps it like any linear layer.

When: on CUDA with compute capability 8.9 or newer (Ada, Hopper, Blackwell), where the tensor cores
have float8 — Studio's validator already refuses fp8 on any other card — and only after one probe
multiply of each kind succeeds on this device; otherwise the run trains in bf16 and the log says why.
The CPU never gets here (fp8 needs a GPU: modeling.pick_device), though the layer itself runs on the
CPU too (torch has a reference `_scaled_mm` there), which is how its numbers are tested.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
from torch import nn

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
ALIGN = 16  # torch._scaled_mm: both sizes of the second operand, and the inner size, are multiples of 16
MIN_CAPABILITY = (8, 9)


def quantise(t: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(t in float8, the fp32 scalar that turns it back): one scale for the whole tensor, so that its
    largest magnitude lands on the format's largest finite value."""
    fmax = torch.finfo(dtype).max
    amax = t.detach().abs().amax().float().clamp(min=1e-12)
    scale = fmax / amax
    q = (t.detach().float() * scale).clamp(-fmax, fmax).to(dtype)
    return q, scale.reciprocal()


def _mm(a: torch.Tensor, a_inv: torch.Tensor, b: torch.Tensor, b_inv: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """a·b in float8. The GEMM wants `a` row-major and `b` column-major; the callers lay them out so."""
    return torch._scaled_mm(a, b, scale_a=a_inv, scale_b=b_inv, out_dtype=out_dtype)


def _column_major(t: torch.Tensor) -> torch.Tensor:
    return t.t().contiguous().t()


class _Fp8Matmul(torch.autograd.Function):
    """y = x·Wᵀ with x of any leading shape, W (out, in); the three GEMMs as in the module docstring."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1])
        x8, x_inv = quantise(x2, E4M3)
        w8, w_inv = quantise(weight, E4M3)
        y = _mm(x8.contiguous(), x_inv, w8.t(), w_inv, out_dtype)
        ctx.save_for_backward(x8, x_inv, weight)
        ctx.x_dtype = x.dtype
        return y.reshape(*lead, weight.shape[0])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        x8, x_inv, weight = ctx.saved_tensors
        lead = grad.shape[:-1]
        g2 = grad.reshape(-1, grad.shape[-1]).contiguous()
        g8, g_inv = quantise(g2, E5M2)
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:
            w8, w_inv = quantise(weight, E4M3)
            grad_x = _mm(g8, g_inv, _column_major(w8), w_inv, ctx.x_dtype).reshape(*lead, weight.shape[1])
        if ctx.needs_input_grad[1]:
            if g2.shape[0] % ALIGN == 0:
                grad_w = _mm(g8.t().contiguous(), g_inv, _column_major(x8), x_inv, weight.dtype)
            else:
                # The token count is the inner size here; the float8 GEMM cannot take an unaligned one.
                grad_w = (g2.t().to(weight.dtype) @ (x8.to(weight.dtype) * x_inv.to(weight.dtype))).to(weight.dtype)
        return grad_x, grad_w, None


class Fp8Linear(nn.Linear):
    """An nn.Linear whose matmul runs in float8 (the class a converted layer is switched to)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_autocast_enabled(x.device.type):
            out_dtype = torch.get_autocast_dtype(x.device.type)
        else:
            out_dtype = self.weight.dtype
        y = _Fp8Matmul.apply(x, self.weight, out_dtype)
        return y if self.bias is None else y + self.bias.to(y.dtype)


def convertible(name: str, module: nn.Module, head: nn.Module | None) -> bool:
    return (
        type(module) is nn.Linear
        and module is not head
        and "lora_" not in name
        and module.in_features % ALIGN == 0
        and module.out_features % ALIGN == 0
    )


def convert(model: nn.Module) -> int:
    """Switch every convertible linear layer of `model` to Fp8Linear in place; how many were."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None  # type: ignore[operator]  # nn.Module.__getattr__ types it Tensor | Module
    count = 0
    for name, module in model.named_modules():
        if convertible(name, module, head):
            module.__class__ = Fp8Linear
            count += 1
    return count


def capability(device: torch.device | str) -> tuple[bool, str]:
    """(can this device multiply in float8, why): the hardware and torch first, then one probe of the
    forward and both backward GEMMs on tensors of the layer's own alignment."""
    device = torch.device(device)
    if device.type != "cuda":
        return False, f"fp8 needs a CUDA GPU (this is {device.type})"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < MIN_CAPABILITY:
        return False, f"fp8 needs compute capability 8.9 or newer (Ada, Hopper, Blackwell); this GPU is {major}.{minor}"
    if not hasattr(torch, "_scaled_mm"):
        return False, f"this torch ({torch.__version__}) has no float8 GEMM (torch._scaled_mm)"
    try:
        layer = nn.Linear(ALIGN * 2, ALIGN * 2, bias=False, device=device, dtype=torch.bfloat16)
        layer.__class__ = Fp8Linear
        x = torch.randn(ALIGN * 2, ALIGN * 2, device=device, dtype=torch.bfloat16, requires_grad=True)
        layer(x).float().square().sum().backward()
        # backward() gave both leaves a gradient; the casts only tell mypy so (.grad is typed Optional)
        x_grad, weight_grad = cast(torch.Tensor, x.grad), cast(torch.Tensor, layer.weight.grad)
        if not (torch.isfinite(x_grad).all() and torch.isfinite(weight_grad).all()):
            return False, "the float8 GEMM probe gave non-finite gradients"
    except (RuntimeError, TypeError, ValueError) as exc:
        return False, f"the float8 GEMM probe failed on this GPU ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})"
    return True, f"float8 GEMMs on GPU capability {major}.{minor}"


def enable(model: nn.Module, device: torch.device | str, log: Callable[[str], None]) -> bool:
    """Convert `model` when this device can multiply in float8; log what was done, or why not."""
    ok, why = capability(device)
    if not ok:
        log(f"precision: fp8 off, training in bf16 ({why})")
        return False
    count = convert(model)
    if not count:
        log("precision: fp8 off, training in bf16 (no linear layer of this model can take float8: a 4-bit base, or sizes not multiples of 16)")
        return False
    log(f"precision: fp8 on {count} linear layers ({why}); the output head and the weights stay bf16")
    return True

"""Eager PyTorch under the precision stage's cast policy: the error a reduced precision makes by
itself, measured on the model, as the f64 twin measures f32's.

A fixed bf16 tolerance is both too loose and too tight. On a GPT's logits (up to ~50) its atol
allows ~0.9, so weights rounded to fp8 instead of bf16 pass; on a LayerNorm over three nearly
equal values, bf16 operands of the conv before it move the normalized result by ~0.09, well past
the fixed bound, though the compile does exactly what the policy says. Both are the condition of
the computation, which only a run of the model itself measures.

``policy_error`` runs the model in eager f32 with every contraction's narrowed operands rounded
to the policy's dtype first (``fexplore.pipeline.stages.precision``: linear, matmul, conv and
attention read bf16/fp8 operands and accumulate in f32), and returns per output the largest
distance from plain eager. A compile at that precision is then held to a small multiple of it
(``numeric.POLICY_MULTIPLE``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from fexplore.ir import DType

from .convert import ir_dtype
from .eager_modes import eager_under, runs_cond_branches

# The narrow dtype of each reduced-precision policy.
POLICY_DTYPES = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}

# The aten contractions eager reaches from what the precision stage narrows, and which of their
# arguments are its narrowed operands (biases, the added term of addmm, masks stay wide).
# upsample_bilinear is in the list because ingestion makes it two matmuls.
_OPERANDS = {
    "aten.mm.default": (0, 1), "aten.bmm.default": (0, 1), "aten.mv.default": (0, 1),
    "aten.dot.default": (0, 1), "aten.addmm.default": (1, 2), "aten.baddbmm.default": (1, 2),
    "aten.addbmm.default": (1, 2), "aten.addmv.default": (1, 2),
    "aten.convolution.default": (0, 1), "aten._grouped_mm.default": (0, 1),
    "aten._scaled_dot_product_flash_attention_for_cpu.default": (0, 1, 2),
    "aten._scaled_dot_product_efficient_attention.default": (0, 1, 2),
    "aten._scaled_dot_product_attention_math.default": (0, 1, 2),
    "aten.upsample_bilinear2d.vec": (0,), "aten.upsample_bilinear2d.default": (0,),
    # composite ops, which reach the mode whole inside a torch.cond branch (``eager_modes``)
    "aten.linear.default": (0, 1), "aten.matmul.default": (0, 1),
    "aten.conv1d.default": (0, 1), "aten.conv2d.default": (0, 1), "aten.conv3d.default": (0, 1),
    "aten.scaled_dot_product_attention.default": (0, 1, 2),
}

# e4m3's largest finite value: the precision stage saturates there, as the hardware does
_FP8_MAX = 448.0


@runs_cond_branches
class _NarrowContractions(TorchDispatchMode):
    """Rounds each contraction's narrowed operands to ``dtype`` (and back: the op itself runs in
    its own dtype, accumulating wide, as the chip does) and notes the narrowest float any op
    computes in, the model's own bf16 or f16 included."""

    def __init__(self, dtype: torch.dtype):
        super().__init__()
        self.dtype = dtype
        self.narrowest: set[torch.dtype] = set()
        self.paused = False  # inside an attention whose operands are already rounded
        self.recording = True

    def _round(self, t):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dtype == self.dtype:
            return t
        # called from the function mode (attention), these ops reach this dispatch mode: they
        # are the policy's rounding, not a dtype the model computes in
        self.recording = False
        try:
            if self.dtype == torch.float8_e4m3fn:
                t = t.clamp(-_FP8_MAX, _FP8_MAX)
            return t.to(self.dtype).to(t.dtype)
        finally:
            self.recording = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        which = None if self.paused else _OPERANDS.get(str(func))
        if which:
            args = tuple(self._round(a) if i in which else a for i, a in enumerate(args))
        out = func(*args, **kwargs)
        if self.recording:
            for t in pytree.tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.is_floating_point():
                    self.narrowest.add(t.dtype)
        return out


class _PolicyAttention(TorchFunctionMode):
    """Scaled-dot-product attention as the precision stage narrows it, whichever kernel eager
    picks: q, k and v rounded, then scores, softmax and the weighted sum wide.

    Eager's math path (taken for 3-d inputs, among others) is not one aten op but a scaling, two
    bmm and a softmax. Rounding those bmm operands would round ``q * scale`` instead of q and the
    probabilities before the second product, neither of which the IR's attention does (fuzz seed
    720379: a policy error 6x smaller than the compile's, which rounds exactly as the policy says).
    """

    def __init__(self, narrow: _NarrowContractions):
        super().__init__()
        self.narrow = narrow

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        args = tuple(self.narrow._round(a) if i < 3 else a for i, a in enumerate(args))
        kwargs = {k: self.narrow._round(v) if k in ("query", "key", "value") else v
                  for k, v in kwargs.items()}
        self.narrow.paused = True
        try:
            return func(*args, **kwargs)
        finally:
            self.narrow.paused = False


def policy_error(model: torch.nn.Module, args: tuple, outs: list[torch.Tensor], precision: str):
    """(per output, max |eager under the policy - eager|; the narrowest float dtype the model
    computes in by itself, as an IR DType). ``outs``: eager's flat tensor outputs on ``args``.
    Raises whatever the model raises under the policy (the caller then keeps the fixed
    tolerance)."""
    mode = _NarrowContractions(POLICY_DTYPES[precision])
    with torch.no_grad(), eager_under(mode), _PolicyAttention(mode):
        narrowed = model(*args)
    got = [o for o in pytree.tree_leaves(narrowed) if isinstance(o, torch.Tensor)]
    if len(got) != len(outs):
        raise ValueError("the run under the policy gave another number of outputs")
    if any(a.shape != b.shape for a, b in zip(got, outs)):
        raise ValueError("the run under the policy gave outputs of other shapes")
    errors = []
    for a, b in zip(got, outs):
        if not b.is_floating_point() or b.numel() == 0:
            errors.append(0.0)
            continue
        d = (a.double() - b.double()).abs()
        finite = torch.isfinite(d)
        errors.append(float(d[finite].max()) if bool(finite.any()) else 0.0)
    for x in pytree.tree_leaves(args):
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            mode.narrowest.add(x.dtype)
    order = [torch.float8_e4m3fn, torch.bfloat16, torch.float16, torch.float32]
    own = next((d for d in order if d in mode.narrowest), torch.float32)
    return errors, ir_dtype(own) if own != torch.float32 else DType.f32

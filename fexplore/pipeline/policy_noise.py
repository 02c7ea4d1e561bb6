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

Round-to-nearest can be lucky: where the roundings of an input set happen to cancel, eager under
the policy is off by far less than the policy's rounding can move the output, and a compile that
rounds other (equally narrowed) operands is held to that lucky bound. Fuzz seed 2490141: a row
scale ``(p * s) @ s`` that fusion takes out of the product (``(p @ s) * s``) narrows p instead of
p * s; on its second input set eager under the policy was off by 2.0e-4 and the compile by
6.6e-3, though on the example inputs eager was off by 3.4e-3 and the compile by 2.9e-3. So the
policy also runs with each narrowed operand one narrow ulp off round-to-nearest, at random
(``_NarrowContractions(jitter=...)``), and a quarter of that distance (``JITTER_SHARE``, as the
f32 noise takes of its own re-rounded run, ``numeric.REROUNDED_SHARE``) is the least the
policy's error is taken to be. A move past ``JITTER_DECISION_SHARE`` of the output's scale
flipped a decision (an argmax, a comparison) and is not used.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

from fexplore.ir import DType

from .convert import ir_dtype
from .eager_modes import eager_under, output_tensors, runs_higher_order_ops
from .rerounding import one_ulp_off, output_scale

# The narrow dtype of each reduced-precision policy.
POLICY_DTYPES = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}

# The aten contractions eager reaches from what the precision stage narrows, and which of their
# arguments are its narrowed operands (biases, the added term of addmm, masks stay wide).
# upsample_bilinear and the antialiased resizes are in the list because ingestion makes each two
# matmuls.
_OPERANDS = {
    "aten.mm.default": (0, 1), "aten.bmm.default": (0, 1), "aten.mv.default": (0, 1),
    "aten.dot.default": (0, 1), "aten.addmm.default": (1, 2), "aten.baddbmm.default": (1, 2),
    "aten.addbmm.default": (1, 2), "aten.addmv.default": (1, 2),
    "aten.convolution.default": (0, 1), "aten._grouped_mm.default": (0, 1),
    "aten._scaled_dot_product_flash_attention_for_cpu.default": (0, 1, 2),
    "aten._scaled_dot_product_efficient_attention.default": (0, 1, 2),
    "aten._scaled_dot_product_attention_math.default": (0, 1, 2),
    "aten.upsample_bilinear2d.vec": (0,), "aten.upsample_bilinear2d.default": (0,),
    "aten._upsample_bilinear2d_aa.vec": (0,), "aten._upsample_bilinear2d_aa.default": (0,),
    "aten._upsample_bicubic2d_aa.vec": (0,), "aten._upsample_bicubic2d_aa.default": (0,),
    # composite ops, which reach the mode whole inside a torch.cond branch (``eager_modes``)
    "aten.linear.default": (0, 1), "aten.matmul.default": (0, 1),
    "aten.conv1d.default": (0, 1), "aten.conv2d.default": (0, 1), "aten.conv3d.default": (0, 1),
    "aten.scaled_dot_product_attention.default": (0, 1, 2),
}

# e4m3's largest finite value: the precision stage saturates there, as the hardware does
_FP8_MAX = 448.0

# The share of a jittered policy run's distance the policy's error is at least: one ulp of random
# sign is ~3.5x the spread of round-to-nearest (numeric.REROUNDED_SHARE takes the same of f32's)
JITTER_SHARE = 0.25
# A jittered policy run's distance above this share of max(1, max|output|) is a flipped decision,
# not rounding (bf16's ulp is 2^-8 of a value: 5% is a twelvefold amplification of it)
JITTER_DECISION_SHARE = 0.05

# The floats a model may compute in, narrowest first; anything else (f64, integers) ranks as f32.
_FLOATS = (torch.float8_e4m3fn, torch.bfloat16, torch.float16, torch.float32)
_WIDE = len(_FLOATS) - 1


def _rank(t: torch.Tensor) -> int:
    return _FLOATS.index(t.dtype) if t.dtype in _FLOATS else _WIDE


@runs_higher_order_ops
class _NarrowContractions(TorchDispatchMode):
    """Rounds each contraction's narrowed operands to ``dtype`` (and back: the op itself runs in
    its own dtype, accumulating wide, as the chip does), and notes for every tensor the narrowest
    float it was computed through (``narrowest_of``): the model's own bf16 or f16, never the
    policy's rounding. It is per tensor, not per model: a model that casts one value to bf16
    (even a dead one, fuzz seed 1280423) still computes its other outputs in f32."""

    def __init__(self, dtype: torch.dtype, jitter: torch.Generator | None = None):
        super().__init__()
        self.dtype = dtype
        self.jitter = jitter   # each rounded operand one narrow ulp off nearest, up or down at random
        self.narrowest: WeakIdKeyDictionary = WeakIdKeyDictionary()   # tensor -> rank in _FLOATS
        self.paused = False  # inside an attention whose operands are already rounded
        self.recording = True

    def narrowest_of(self, t: torch.Tensor) -> torch.dtype:
        return _FLOATS[self._rank_of(t)]

    def _rank_of(self, t: torch.Tensor) -> int:
        return self.narrowest.get(t, _rank(t))   # not made under the mode: an input, a weight

    def _round(self, t):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dtype == self.dtype:
            return t
        # called from the function mode (attention), these ops reach this dispatch mode: they
        # are the policy's rounding, not a dtype the model computes in
        self.recording = False
        try:
            if self.dtype == torch.float8_e4m3fn:
                t = t.clamp(-_FP8_MAX, _FP8_MAX)
            narrow = t.to(self.dtype)
            if self.jitter is not None:
                narrow = one_ulp_off(narrow, self.jitter)
            return narrow.to(t.dtype)
        finally:
            self.recording = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        which = None if self.paused else _OPERANDS.get(str(func))
        if which:
            args = tuple(self._round(a) if i in which else a for i, a in enumerate(args))
        out = func(*args, **kwargs)
        # a result is as narrow as what it was computed from and, unless this op is the policy's
        # own rounding, as its own dtype (an in-place op's result is its mutated argument)
        read = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        made = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        low = min((self._rank_of(t) for t in read), default=_WIDE)
        if self.recording:
            low = min([low] + [_rank(t) for t in made])
        for t in made:
            self.narrowest[t] = min(low, self.narrowest.get(t, _WIDE))
        return out


class _PolicyAttention(TorchFunctionMode):
    """Scaled-dot-product attention under the policy, whichever kernel eager picks: q, k and v
    rounded; scores, mask and softmax wide; with ``round_probabilities`` (as the chip's kernel
    does: the second product's operand on the tensor unit) the probabilities rounded; the weighted
    sum accumulated wide.

    Eager's math path (taken for 3-d inputs, among others) is not one aten op but a scaling, two
    bmm and a softmax: rounding those bmm operands rounds ``q * scale`` instead of q (fuzz seed
    720379). Its fused CPU kernel is one op: rounding its operands leaves the probabilities wide,
    so a compile whose q, k, v are exact in bf16 had no allowance for their rounding on the chip
    (seed 1270235).
    """

    def __init__(self, narrow: _NarrowContractions, round_probabilities: bool):
        super().__init__()
        self.narrow = narrow
        self.round_probabilities = round_probabilities
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")
        call = dict(zip(names, args), **kwargs)
        if call.get("dropout_p", 0.0):
            return func(*args, **kwargs)  # random: no run to compare with anyway
        self.calls += 1
        q, k, v = (self.narrow._round(call[n]) for n in names[:3])
        self.narrow.paused = True
        try:
            return _attention(q, k, v, call.get("attn_mask"), call.get("is_causal", False),
                              call.get("scale"), call.get("enable_gqa", False),
                              self.narrow._round if self.round_probabilities else (lambda p: p))
        finally:
            self.narrow.paused = False


def _attention(q, k, v, mask, causal, scale, gqa, round_probabilities):
    """torch's attention written out (its math path, safe softmax). With a rounding of the
    probabilities, the chip kernel's way: the exponentials of the scores less their row maximum
    rounded (the second product's operand), and the weighted sum divided by the sum of the
    rounded ones (the row sums run on the tensor unit on the same operand). Rounding the
    normalized probabilities instead falls elsewhere, and the chip was off 4x more than that
    from eager on a bf16 result well within an ulp (fuzz seed 1740735)."""
    if gqa and q.dim() >= 3 and q.shape[-3] != k.shape[-3]:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], -3)
        v = v.repeat_interleave(q.shape[-3] // v.shape[-3], -3)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-2, -1)) * scale
    if causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
    top = s.amax(-1, keepdim=True)
    top = torch.where(torch.isneginf(top), torch.zeros_like(top), top)   # a row with nothing to attend to
    e = round_probabilities(torch.exp(s - top))
    total = e.sum(-1, keepdim=True)
    return (e @ v) / torch.where(total == 0, torch.ones_like(total), total)   # safe softmax: such rows 0


def policy_error(model: torch.nn.Module, args: tuple, outs: list[torch.Tensor], precision: str):
    """(per output, max |eager under the policy - eager|; per output, the narrowest float dtype
    it is computed through by the model itself, as an IR DType). ``outs``: eager's flat tensor
    outputs on ``args``. Raises whatever the model raises under the policy (the caller then
    keeps the fixed tolerance)."""
    mode = _NarrowContractions(POLICY_DTYPES[precision])
    flat, spec = pytree.tree_flatten(args)
    errors, own, attended = _errors_of_one_run(model, flat, spec, outs, mode, round_probabilities=False)
    if attended:
        # The IR's attention (the precision stage's graph) rounds q, k, v; the chip's kernel also
        # rounds the probabilities, the second product's operand. Both are the policy, and their
        # roundings fall differently (seed 720379: off 6x more from each other than from eager)
        more, _, _ = _errors_of_one_run(model, flat, spec, outs, mode, round_probabilities=True)
        errors = [max(a, b) for a, b in zip(errors, more)]
    # at least a share of how far one ulp off nearest moves each output (see the module)
    jittered = _NarrowContractions(POLICY_DTYPES[precision], jitter=torch.Generator().manual_seed(0))
    moved, _, _ = _errors_of_one_run(model, flat, spec, outs, jittered, round_probabilities=attended)
    for i, (m, o) in enumerate(zip(moved, outs)):
        if o.is_floating_point() and o.numel() and m <= JITTER_DECISION_SHARE * output_scale(o):
            errors[i] = max(errors[i], JITTER_SHARE * m)
    return errors, [DType.f32 if d == torch.float32 else ir_dtype(d) for d in own]


def _errors_of_one_run(model, flat, spec, outs, mode, *, round_probabilities: bool):
    """(per output max |run under the policy - eager|; per output the narrowest float the model
    computed it through; whether the model called attention). Each run gets its own copy of the
    inputs: a decode step appends to the cache it is given."""
    args = pytree.tree_unflatten([x.clone() if isinstance(x, torch.Tensor) else x for x in flat], spec)
    attention = _PolicyAttention(mode, round_probabilities)
    with torch.no_grad(), eager_under(mode), attention:
        narrowed = model(*args)
    got = output_tensors(narrowed)
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
    return errors, [mode.narrowest_of(t) for t in got], attention.calls > 0

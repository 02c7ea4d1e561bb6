"""ONNX's Attention op (opset 23 on) onto the IR's ``attention``, the op the torch door makes of
scaled_dot_product_attention, so fusion forms the same attention region from both doors.

3-D inputs are split into heads first; a KV cache (past_key, past_value) is concatenated and
returned as present_key/present_value. Causality counts from the end of the cache (query i sees
keys up to past + i) and sliding windows are static masks built here; a score softcap or a
requested qk_matmul_output takes the op apart into matmul/softmax, since the IR's attention
keeps its scores inside.
"""

from __future__ import annotations

import numpy as np

from fexplore.ir import DType

from .elementwise import scalar_like
from .movement import _reshape_to
from .registry import OnnxContext, onnx_converter


def _heads(ctx, x, n):
    """(B, S, n*D) -> (B, n, S, D)."""
    b, s, hidden = x.type.shape
    x = _reshape_to(ctx, x, (b, s, n, hidden // n))
    return ctx.emit("permute", [x], {"perm": (0, 2, 1, 3)})


def _static_mask(q_len, kv_len, offset, causal, left, right):
    """The bool (q, kv) mask causality and windows allow, or None when they allow everything."""
    i = np.arange(q_len).reshape(q_len, 1) + offset
    j = np.arange(kv_len).reshape(1, kv_len)
    allowed = np.ones((q_len, kv_len), dtype=bool)
    if causal:
        allowed &= j <= i
    if left is not None and left >= 0:
        allowed &= i - j <= left
    if right is not None and right >= 0:
        allowed &= j - i <= right
    return None if allowed.all() else allowed


@onnx_converter("Attention", since=23)
def _attention(ctx: OnnxContext):
    q, k, v = ctx.input(0), ctx.input(1), ctx.input(2)
    mask, past_k, past_v = ctx.input(3), ctx.input(4), ctx.input(5)
    three_d = q.type.rank == 3
    if three_d:
        q = _heads(ctx, q, ctx.attr("q_num_heads"))
        k = _heads(ctx, k, ctx.attr("kv_num_heads"))
        v = _heads(ctx, v, ctx.attr("kv_num_heads"))
    if past_k is not None:
        k = ctx.emit("concat", [past_k, k], {"axis": 2})
        v = ctx.emit("concat", [past_v, v], {"axis": 2})
    present_k, present_v = k, v
    q_len, kv_len = q.type.shape[2], k.type.shape[2]
    offset = past_k.type.shape[2] if past_k is not None else 0
    if not all(isinstance(d, int) for d in (q_len, kv_len, offset)):
        raise NotImplementedError("Attention with symbolic sequence lengths")
    causal = bool(ctx.attr("is_causal", 0))
    left, right = ctx.attr("left_window_size"), ctx.attr("right_window_size")
    if ctx.has_input(6):   # an external cache: each batch row's own length
        static = _lengths_mask(ctx, ctx.input(6), q_len, kv_len, causal, left, right)
    else:
        static = _static_mask(q_len, kv_len, offset, causal, left, right)
    mask = _full_mask(ctx, mask, static, kv_len, q.type.dtype)
    scale = ctx.attr("scale")
    gqa = q.type.shape[1] != k.type.shape[1]
    want_qk = len(ctx.onnx.output) > 3 and bool(ctx.onnx.output[3])
    softcap = ctx.attr("softcap", 0.0)
    if softcap or want_qk:
        y, qk = _decomposed(ctx, q, k, v, mask, scale, softcap, gqa)
    else:
        y = ctx.emit("attention", [q, k, v] + ([mask] if mask is not None else []),
                     {"causal": False, "scale": None if scale is None else float(scale),
                      "gqa": gqa})
        qk = None
    if three_d:
        y = ctx.emit("permute", [y], {"perm": (0, 2, 1, 3)})
        b, s, h, d = y.type.shape
        y = _reshape_to(ctx, y, (b, s, h * d))
    outs = (y, present_k, present_v, qk)
    return outs[:len(ctx.onnx.output)]


def _lengths_mask(ctx, lengths, q_len, kv_len, causal, left, right):
    """The bool (B, 1, q, kv) mask of an external cache holding ``lengths[b]`` valid keys per
    batch row: keys past the length are padding; the queries are the last q_len positions, so
    query i sits at lengths[b] - q_len + i for causality and windows."""
    n = ctx.emit("cast", [lengths], {"dtype": DType.i64})
    n = _reshape_to(ctx, n, (n.type.shape[0], 1, 1, 1))
    base = ctx._node_base()
    j = ctx.b.literal(np.arange(kv_len, dtype=np.int64).reshape(1, 1, 1, kv_len), f"{base}.j")
    ok = ctx.emit("lt", [j, n])
    # diff = position of the query - key index = n - q_len + i - j
    i_minus_j = np.arange(q_len).reshape(q_len, 1) - np.arange(kv_len).reshape(1, kv_len) - q_len
    diff = ctx.emit("add", [n, ctx.b.literal(i_minus_j.astype(np.int64).reshape(1, 1, q_len, kv_len),
                                             f"{base}.imj")])
    zero = ctx.scalar(0, DType.i64)
    if causal:
        ok = ctx.emit("logical_and", [ok, ctx.emit("ge", [diff, zero])])
    if left is not None and left >= 0:
        ok = ctx.emit("logical_and", [ok, ctx.emit("le", [diff, ctx.scalar(left, DType.i64)])])
    if right is not None and right >= 0:
        ok = ctx.emit("logical_and", [ok, ctx.emit("ge", [diff, ctx.scalar(-right, DType.i64)])])
    return ok


def _full_mask(ctx, mask, static, kv_len, dtype):
    """The user's mask (padded to the key length, as ONNX pads a shorter one) combined with the
    static causal/window mask: bool where both are bool, else additive floats."""
    if mask is not None and mask.type.shape[-1] != kv_len:
        pad = kv_len - mask.type.shape[-1]
        is_bool = mask.type.dtype == DType.bool
        mask = ctx.emit("pad", [mask], {"pads": (0, pad), "value": 0 if is_bool else float("-inf")})  # bool: False
    if static is None:
        return mask
    allowed = static if not isinstance(static, np.ndarray) else \
        ctx.b.literal(static, f"{ctx._node_base()}.allowed")
    if mask is None:
        return allowed
    if mask.type.dtype == DType.bool:
        return ctx.emit("logical_and", [mask, allowed])
    return ctx.emit("where", [allowed, mask, ctx.scalar(float("-inf"), mask.type.dtype)])


def _decomposed(ctx, q, k, v, mask, scale, softcap, gqa):
    """Attention as matmul/softmax/matmul, for a softcap or a requested qk_matmul_output (whose
    mode picks the scores before the mask, with it, or after the softmax)."""
    d = q.type.shape[-1]
    s = float(np.sqrt(scale if scale is not None else 1.0 / np.sqrt(d)))
    if gqa:
        rep = q.type.shape[1] // k.type.shape[1]
        k, v = (_repeat_heads(ctx, t, rep) for t in (k, v))
    kt = ctx.emit("permute", [k], {"perm": (0, 1, 3, 2)})
    qk = ctx.emit("matmul", [ctx.emit("mul", [q, scalar_like(ctx, s, q)]),
                             ctx.emit("mul", [kt, scalar_like(ctx, s, kt)])])
    if softcap:
        qk = ctx.emit("mul", [ctx.emit("tanh", [ctx.emit("div", [qk, scalar_like(ctx, softcap, qk)])]),
                              scalar_like(ctx, softcap, qk)])
    scores = qk
    bias = None
    if mask is not None:
        bias = mask if mask.type.dtype != DType.bool else ctx.emit(
            "where", [mask, scalar_like(ctx, 0.0, qk), scalar_like(ctx, float("-inf"), qk)])
        scores = ctx.emit("add", [qk, bias])
    p = ctx.emit("softmax", [scores], {"axis": -1})
    if bias is not None:  # a query that may see nothing gets zeros, not softmax's 0/0
        top = ctx.emit("amax", [bias], {"axes": (bias.type.rank - 1,), "keepdim": True})
        dead = ctx.emit("eq", [top, scalar_like(ctx, float("-inf"), top)])
        p = ctx.emit("where", [dead, scalar_like(ctx, 0.0, p), p])
    mode = ctx.attr("qk_matmul_output_mode", 0)
    out_qk = {0: qk, 1: qk, 2: scores, 3: p}[mode]
    return ctx.emit("matmul", [p, v]), out_qk


def _repeat_heads(ctx, t, rep):
    b, h, s, d = t.type.shape
    t = _reshape_to(ctx, t, (b, h, 1, s, d))
    t = ctx.emit("expand", [t], {"shape": (b, h, rep, s, d)})
    return _reshape_to(ctx, t, (b, h * rep, s, d))

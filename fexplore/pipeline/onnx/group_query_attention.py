"""ONNX Runtime's GroupQueryAttention (domain ``com.microsoft``): the attention op of the decoder
LLMs ONNX Runtime's GenAI model builder writes, with its KV cache, onto the IR's attention; and
its RotaryEmbedding, which the builder writes before it in half precision.

Per batch row b the op reads ``seqlens_k[b]`` (the index of the row's last valid key) at run time,
so the positions it implies are IR values over that input, not constants:
- ``n[b] = seqlens_k[b] + 1`` keys are valid; the new tokens sit at ``pos0[b] = n[b] - S`` (0 in
  a first prompt, ``S == total_sequence_length``, whose padded rows keep position 0);
- the present cache (length ``max(past length, total_sequence_length)``) holds the past keys
  before ``pos0[b]``, the new ones at ``pos0[b] .. pos0[b] + S``, and zeros after;
- query i of row b sees key j when ``j <= pos0[b] + i`` and ``j < n[b]`` (and, with a
  ``local_window_size`` w, ``j > pos0[b] + i - w``);
- with ``do_rotary``, query and new keys are rotated at those positions, from the cos and sin
  caches (half of the rotary width each; interleaved pairs or halves).
The semantics are ONNX Runtime's CPU kernel's; tests check each form against it. Not converted:
``smooth_softmax``, a head sink, explicit ``position_ids``, the QK output, and caches in BSNH.
"""

from __future__ import annotations

import numpy as np
import sympy

from fexplore.ir import DType

from ..convert.movement import positions
from .attention import _decomposed, _full_mask, _heads
from .movement import _reshape_to
from .registry import OnnxContext, onnx_converter

MS = "com.microsoft"


@onnx_converter("GroupQueryAttention", domain=MS, since=1)
def _group_query_attention(ctx: OnnxContext):
    heads, kv_heads = int(ctx.attr("num_heads")), int(ctx.attr("kv_num_heads"))
    unsupported = [name for name, on in (
        ("smooth_softmax", ctx.attr("smooth_softmax", 0)), ("qk_output", ctx.attr("qk_output", 0)),
        ("position_ids", ctx.has_input(9)), ("head_sink", ctx.has_input(11)),
        ("output_qk", len(ctx.onnx.output) > 3 and ctx.onnx.output[3])) if on]
    q, past_k, past_v = ctx.input(0), ctx.input(3), ctx.input(4)
    if past_k is not None and past_k.type.rank != 4:
        unsupported.append("a cache in BSNH")
    if unsupported:
        ctx.refuse(f"GroupQueryAttention with {', '.join(unsupported)}")
    b, s, width = q.type.shape
    if ctx.has_input(1):
        k, v = ctx.input(1), ctx.input(2)
        d = width // heads
    else:   # query, key and value packed along the hidden axis
        d = width // (heads + 2 * kv_heads)
        bounds = (0, heads * d, (heads + kv_heads) * d, (heads + 2 * kv_heads) * d)
        q, k, v = (ctx.emit("slice", [q], {"axis": 2, "start": lo, "end": hi, "step": 1})
                   for lo, hi in zip(bounds, bounds[1:]))
    q, k, v = _heads(ctx, q, heads), _heads(ctx, k, kv_heads), _heads(ctx, v, kv_heads)

    for cache in (past_k, past_v):   # a cache's heads and head size named by dim_params of its own
        for axis, size in ((1, kv_heads), (3, d)):
            if cache is not None and cache.type.shape[axis] != size and isinstance(cache.type.shape[axis], sympy.Symbol):
                ctx.importer.pin(cache.type.shape[axis], size)
    past = past_k.type.shape[2] if past_k is not None else 0
    total = ctx.const_ints(6, "total_sequence_length")[0]
    longer = _decided(sympy.Ge(total, past))
    length = total if longer else past if longer is False else sympy.Max(past, total)   # the present cache's
    n = _reshape_to(ctx, ctx.emit("cast", [ctx.input(5)], {"dtype": DType.i64}), (b, 1))
    n = ctx.emit("add", [n, ctx.scalar(1, DType.i64)])               # valid keys per row, (B, 1)
    later = ctx.emit("sub", [n, ctx.value(s, DType.i64)])            # the first new token's position
    first = _decided(sympy.Eq(s, total))                             # a first prompt starts at 0
    if first is None:   # the lengths are symbols: as ONNX Runtime does, compare them when it runs
        given = ctx.emit("cast", [ctx.input(6)], {"dtype": DType.i64})
        first = ctx.emit("eq", [given, ctx.value(s, DType.i64)])
        pos0 = ctx.emit("where", [first, ctx.scalar(0, DType.i64), later])
    else:
        pos0 = ctx.emit("full", [], {"shape": (b, 1), "value": 0, "dtype": DType.i64}) if first else later
    query_at = ctx.emit("add", [pos0, _reshape_to(ctx, positions(ctx, s, DType.i64), (1, s))])   # (B, S)

    if ctx.attr("do_rotary", 0):
        interleaved = bool(ctx.attr("rotary_interleaved", 0))
        cos = ctx.emit("embedding", [ctx.input(7), query_at])         # (B, S, R/2)
        sin = ctx.emit("embedding", [ctx.input(8), query_at])
        cos, sin = (_reshape_to(ctx, t, (b, 1, s, t.type.shape[2])) for t in (cos, sin))
        q, k = (_rotated(ctx, t, cos, sin, interleaved) for t in (q, k))

    present_k, present_v = (_present(ctx, past_t, new, pos0, past, length, s)
                            for past_t, new in ((past_k, k), (past_v, v)))

    # query i of row b sees key j when j <= its position, j < n[b], and within the window
    j = _reshape_to(ctx, positions(ctx, length, DType.i64), (1, 1, 1, length))
    at = _reshape_to(ctx, query_at, (b, 1, s, 1))
    ok = ctx.emit("logical_and", [ctx.emit("le", [j, at]),
                                  ctx.emit("lt", [j, _reshape_to(ctx, n, (b, 1, 1, 1))])])
    window = int(ctx.attr("local_window_size", -1))
    if window > 0:
        ok = ctx.emit("logical_and", [ok, ctx.emit("gt", [j, ctx.emit("sub", [at, ctx.scalar(window, DType.i64)])])])
    mask = _full_mask(ctx, ctx.input(10), ok, length, q.type.dtype)

    scale = ctx.attr("scale", 0.0) or None
    softcap = float(ctx.attr("softcap", 0.0))
    gqa = heads != kv_heads
    if softcap:
        y, _ = _decomposed(ctx, q, present_k, present_v, mask, scale, softcap, gqa)
    else:
        y = ctx.emit("attention", [q, present_k, present_v, mask],
                     {"causal": False, "scale": None if scale is None else float(scale), "gqa": gqa})
    y = _reshape_to(ctx, ctx.emit("permute", [y], {"perm": (0, 2, 1, 3)}), (b, s, heads * d))
    return (y, present_k, present_v)[:len(ctx.onnx.output)]


@onnx_converter("RotaryEmbedding", domain=MS, since=1)
def _rotary_embedding(ctx: OnnxContext):
    """ONNX Runtime's rotary embedding (what the GenAI builder writes before GroupQueryAttention
    in half precision): x (B, S, hidden) with ``num_heads`` heads, or (B, H, S, D); positions
    (B, S), or one offset the S positions count from; cos and sin caches of half the rotary
    width (``rotary_embedding_dim``, default the head size) each, by position."""
    x, at, cos_cache, sin_cache = (ctx.input(i) for i in range(4))
    if ctx.attr("is_packed_batching", 0) or x.type.rank not in (3, 4):
        ctx.refuse("RotaryEmbedding with packed batching or an input of rank other than 3 or 4")
    three_d = x.type.rank == 3
    if three_d:
        b, s, hidden = x.type.shape
        # without num_heads the rotation spans whole heads: the caches' width is half a head
        heads = int(ctx.attr("num_heads", 0)) or hidden // (2 * cos_cache.type.shape[1])
        x = ctx.emit("permute", [_reshape_to(ctx, x, (b, s, heads, hidden // heads))], {"perm": (0, 2, 1, 3)})
    b, _, s, _ = x.type.shape
    at = ctx.emit("cast", [at], {"dtype": DType.i64})
    if at.type.rank != 2:   # one offset: positions offset .. offset + S
        at = ctx.emit("add", [_reshape_to(ctx, at, (1, 1)), _reshape_to(ctx, positions(ctx, s, DType.i64), (1, s))])
    cos, sin = (ctx.emit("embedding", [cache, at]) for cache in (cos_cache, sin_cache))   # (B or 1, S, R/2)
    cos, sin = (_reshape_to(ctx, t, (t.type.shape[0], 1, s, t.type.shape[2])) for t in (cos, sin))
    y = _rotated(ctx, x, cos, sin, bool(ctx.attr("interleaved", 0)))
    if three_d:
        y = _reshape_to(ctx, ctx.emit("permute", [y], {"perm": (0, 2, 1, 3)}), (b, s, hidden))
    return y


def _decided(relation) -> bool | None:
    """A relation between sizes (ints or symbols) as a bool, or None when sympy cannot tell."""
    relation = sympy.simplify(relation)
    return bool(relation) if relation in (sympy.true, sympy.false) else None


def _rotated(ctx, x, cos, sin, interleaved: bool):
    """Heads x (B, H, S, D) rotated by angles whose cos and sin are (B, 1, S, R/2): the first R
    channels as pairs (x[2i], x[2i+1]) when interleaved, else as halves (x[i], x[i + R/2]); the
    channels past R unchanged."""
    bb, hh, s, d = x.type.shape
    half = cos.type.shape[3]
    rot = 2 * half

    def part(lo, hi, step=1):
        return ctx.emit("slice", [x], {"axis": 3, "start": lo, "end": hi, "step": step})
    a, c = (part(0, rot, 2), part(1, rot, 2)) if interleaved else (part(0, half), part(half, rot))
    first = ctx.emit("sub", [ctx.emit("mul", [a, cos]), ctx.emit("mul", [c, sin])])
    second = ctx.emit("add", [ctx.emit("mul", [c, cos]), ctx.emit("mul", [a, sin])])
    if interleaved:   # back to pairs: (.., R/2, 2) flattened
        pairs = [_reshape_to(ctx, t, (bb, hh, s, half, 1)) for t in (first, second)]
        turned = _reshape_to(ctx, ctx.emit("concat", pairs, {"axis": 4}), (bb, hh, s, rot))
    else:
        turned = ctx.emit("concat", [first, second], {"axis": 3})
    return turned if rot == d else ctx.emit("concat", [turned, part(rot, d)], {"axis": 3})


def _present(ctx, past, new, pos0, past_len, length, s):
    """The present cache (B, H, length, D): the past before pos0[b] (a row's own position), the
    S new entries from there, zeros after."""
    bb, hh, _, d = new.type.shape
    j = _reshape_to(ctx, positions(ctx, length, DType.i64), (1, length))
    at = ctx.emit("sub", [j, pos0])                                           # (B, length)
    zero, last = ctx.scalar(0, DType.i64), ctx.value(s - 1, DType.i64)
    is_new = ctx.emit("logical_and", [ctx.emit("ge", [at, zero]), ctx.emit("le", [at, last])])
    idx = ctx.emit("minimum", [ctx.emit("maximum", [at, zero]), last])
    idx = ctx.emit("expand", [_reshape_to(ctx, idx, (bb, 1, length, 1))], {"shape": (bb, hh, length, d)})
    out = ctx.emit("gather", [new, idx], {"axis": 2})
    is_new = _reshape_to(ctx, is_new, (bb, 1, length, 1))
    if past is not None and past_len:
        if past_len != length:   # zeros after the past, to the present's length (a symbol maybe)
            zeros = ctx.emit("full", [], {"shape": (bb, hh, length, d), "value": 0.0, "dtype": past.type.dtype})
            past = ctx.emit("slice", [ctx.emit("concat", [past, zeros], {"axis": 2})],
                            {"axis": 2, "start": 0, "end": length, "step": 1})
        kept = _reshape_to(ctx, ctx.emit("lt", [at, zero]), (bb, 1, length, 1))   # before pos0
        rest = ctx.emit("where", [kept, past, ctx.scalar(np.float32(0.0), new.type.dtype)])
    else:
        rest = ctx.scalar(0.0, new.type.dtype)
    return ctx.emit("where", [is_new, out, rest])

"""ONNX Runtime's contrib ops (domain ``com.microsoft``) that its graph optimizer writes into the
models it saves: an ONNX file "optimized for ONNX Runtime" (``SessionOptions.
optimized_model_filepath``, the transformers optimizer) replaces standard subgraphs with them.
Each becomes the standard ops it fuses, so fusion sees what it would see in the unoptimized
model: a matmul with its scale and transposes (FusedMatMul), GELU with its bias (FastGelu,
BiasGelu, Gelu), SiLU-like QuickGelu, and a residual add followed by a layer or RMS norm
(SkipLayerNormalization, SkipSimplifiedLayerNormalization, and SimplifiedLayerNormalization,
which ONNX Runtime registers in the standard domain). The semantics are ONNX Runtime's contrib
operator documentation's; tests check each against ONNX Runtime itself. MultiHeadAttention is
converted over separate query, key and value, with its cache (past and present keys and values)
and a key padding mask, and Attention (the input projection folded in: one weight for query,
key and value); each with its projection bias, an additive attention bias and a causal mask.
Attention's cache is its one packed past/present tensor. Packed query/key/value, a shared
cache buffer and rotary forms are refused by name.
GroupQueryAttention, with its KV cache, has a module of its own (``group_query_attention``).
"""

from __future__ import annotations


from .attention import _full_mask, _heads, _positions_mask, _static_mask
from .elementwise import scalar_like
from .movement import _reshape_to, axis
from .nn import _norm_last, inverse_deviation
from .registry import OnnxContext, onnx_converter

MS = "com.microsoft"


@onnx_converter("FusedMatMul", domain=MS, since=1)
def _fused_matmul(ctx: OnnxContext):
    """alpha * op(A) @ op(B), op a transpose of the last two axes when transA / transB."""
    if ctx.attr("transBatchA", 0) or ctx.attr("transBatchB", 0):
        ctx.refuse("FusedMatMul with transBatchA or transBatchB (batch axes moved into the matrix)")
    a, b = ctx.input(0), ctx.input(1)
    if ctx.attr("transA", 0):
        a = _swap_last(ctx, a)
    if ctx.attr("transB", 0):
        b = _swap_last(ctx, b)
    y = ctx.emit("matmul", [a, b])
    alpha = float(ctx.attr("alpha", 1.0))
    return y if alpha == 1.0 else ctx.emit("mul", [y, scalar_like(ctx, alpha, y)])


def _swap_last(ctx, x):
    if x.type.rank < 2:
        return x
    perm = tuple(range(x.type.rank - 2)) + (x.type.rank - 1, x.type.rank - 2)
    return ctx.emit("permute", [x], {"perm": perm})


def _plus_bias(ctx, x, i: int):
    bias = ctx.input(i)
    return x if bias is None else ctx.emit("add", [x, bias])


@onnx_converter("FastGelu", domain=MS, since=1)
def _fast_gelu(ctx: OnnxContext):
    """GELU's tanh approximation of X (+ bias)."""
    return ctx.emit("gelu", [_plus_bias(ctx, ctx.input(0), 1)], {"approximate": "tanh"})


@onnx_converter("Gelu", domain=MS, since=1)
def _gelu(ctx: OnnxContext):
    return ctx.emit("gelu", [ctx.input(0)], {"approximate": "none"})


@onnx_converter("BiasGelu", domain=MS, since=1)
def _bias_gelu(ctx: OnnxContext):
    return ctx.emit("gelu", [_plus_bias(ctx, ctx.input(0), 1)], {"approximate": "none"})


@onnx_converter("QuickGelu", domain=MS, since=1)
def _quick_gelu(ctx: OnnxContext):
    """x * sigmoid(alpha * x); with alpha 1 (what the optimizer writes for SiLU) the IR's silu."""
    x = ctx.input(0)
    alpha = float(ctx.attr("alpha", 1.702))
    if alpha == 1.0:
        return ctx.emit("silu", [x])
    return ctx.emit("mul", [x, ctx.emit("sigmoid", [ctx.emit("mul", [x, scalar_like(ctx, alpha, x)])])])


def _norm_outputs(ctx, x, normed, axes, eps, *, rms: bool, sum_output: int | None):
    """The outputs after the first that the node asks for: mean (layer norm only), inverse
    standard deviation, and (at `sum_output`) the normalized input itself."""
    want = [i for i, o in enumerate(ctx.onnx.output) if o and i > 0]
    if not want:
        return normed
    outs = [normed]
    for i in range(1, max(want) + 1):
        if i == sum_output:
            outs.append(x)
        elif i not in want:
            outs.append(normed)   # not asked for: the importer skips an output without a name
        elif i == 1 and not rms:
            outs.append(ctx.emit("mean", [x], {"axes": axes, "keepdim": True}))
        else:
            outs.append(inverse_deviation(ctx, x, axes, eps, centered=not rms))
    return tuple(outs)


@onnx_converter("SkipLayerNormalization", domain=MS, since=1)
def _skip_layer_norm(ctx: OnnxContext):
    """input + skip (+ bias), then a layer norm over the last axis with gamma (and beta).
    Outputs: the normed sum, its mean, its inverse standard deviation, the sum itself."""
    eps = float(ctx.attr("epsilon", 1e-12))
    x = _plus_bias(ctx, ctx.emit("add", [ctx.input(0), ctx.input(1)]), 4)
    ax = x.type.rank - 1
    normed = _norm_last(ctx, "layer_norm", x, ax, ctx.input(2), ctx.input(3), eps)
    return _norm_outputs(ctx, x, normed, (ax,), eps, rms=False, sum_output=3)


@onnx_converter("SkipSimplifiedLayerNormalization", domain=MS, since=1)
def _skip_rms_norm(ctx: OnnxContext):
    """input + skip (+ bias), then an RMS norm over the last axis with gamma. Outputs: the
    normed sum, (mean: none), its inverse root mean square, the sum itself."""
    eps = float(ctx.attr("epsilon", 1e-12))
    x = _plus_bias(ctx, ctx.emit("add", [ctx.input(0), ctx.input(1)]), 3)
    ax = x.type.rank - 1
    normed = _norm_last(ctx, "rms_norm", x, ax, ctx.input(2), None, eps)
    return _norm_outputs(ctx, x, normed, (ax,), eps, rms=True, sum_output=3)


@onnx_converter("SimplifiedLayerNormalization")
def _simplified_layer_norm(ctx: OnnxContext):
    """ONNX Runtime's RMS norm in the standard domain (before ONNX had RMSNormalization): over
    the axes from `axis` on, with scale. Outputs: the normed input, its inverse root mean
    square."""
    x, scale = ctx.input(0), ctx.input(1)
    ax = axis(ctx.attr("axis", -1), x.type.rank)
    eps = float(ctx.attr("epsilon", 1e-5))
    normed = _norm_last(ctx, "rms_norm", x, ax, scale, None, eps)
    return _norm_outputs(ctx, x, normed, tuple(range(ax, x.type.rank)), eps, rms=True, sum_output=None)


@onnx_converter("MultiHeadAttention", domain=MS, since=1)
def _multi_head_attention(ctx: OnnxContext):
    """Attention over `num_heads` heads of query (B, S, D), key (B, L, D) and value (B, L, Dv),
    each plus its part of the projection bias (D + D + Dv); a cache as past_key and past_value
    (B, heads, P, head size), returned as present_key and present_value (see
    ``_cached_heads_attention``)."""
    q, k, v, bias = (ctx.input(i) for i in range(4))
    pad, past_k, past_v = ctx.input(4), ctx.input(6), ctx.input(7)
    if k is None or v is None or not q.type.rank == k.type.rank == v.type.rank == 3 or \
            (past_k is None) != (past_v is None) or (past_k is not None and past_k.type.rank != 4) or \
            (pad is not None and pad.type.rank != 2):
        ctx.refuse("MultiHeadAttention other than over separate 3-D query, key and value (a cache in "
                   "BNSH, a key padding mask of shape (batch, keys))")
    d, dv = q.type.shape[2], v.type.shape[2]
    if bias is not None:
        parts = [(q, 0, d), (k, d, 2 * d), (v, 2 * d, 2 * d + dv)]
        q, k, v = (ctx.emit("add", [x, ctx.emit("slice", [bias], {"axis": 0, "start": lo, "end": hi, "step": 1})])
                   for x, lo, hi in parts)
    y, k, v = _cached_heads_attention(ctx, q, k, v, past_k, past_v, pad, ctx.input(5))
    return (y, k, v)[:len(ctx.onnx.output)]


def _cached_heads_attention(ctx, q, k, v, past_k, past_v, pad, attention_bias):
    """(output (B, S, Dv), all keys, all values) of query (B, S, D), key (B, L, D) and value
    (B, L, Dv) split into `num_heads` heads: the past keys and values (B, heads, P, head size),
    when given, go before the new ones, and causality (``unidirectional``) counts from the end of
    the past (query i sees keys up to P + i). The attention bias is added to the scores, and so
    is ``mask_filter_value`` (-10000) for the keys whose entry of the padding mask (B, P + L) is
    not positive, as ONNX Runtime adds it (a query with every key dropped averages them, as
    there). Scaled by ``scale``, default 1/sqrt(head size)."""
    heads = int(ctx.attr("num_heads"))
    (b, s, d), length, dv = q.type.shape, k.type.shape[1], v.type.shape[2]
    q, k, v = _heads(ctx, q, heads), _heads(ctx, k, heads), _heads(ctx, v, heads)
    past = 0
    if past_k is not None:
        past = past_k.type.shape[2]
        k, v = (ctx.emit("concat", [p, x], {"axis": 2}) for p, x in ((past_k, k), (past_v, v)))
    total = k.type.shape[2]
    causal = bool(ctx.attr("unidirectional", 0))
    if causal and past_k is None and s != length:
        ctx.refuse(f"a causal {ctx.onnx.op_type} without a cache whose query and key lengths differ")
    allowed = None
    if causal:
        allowed = _static_mask(s, total, past, True, None, None) \
            if all(isinstance(n, int) for n in (s, total, past)) else _positions_mask(ctx, s, total, past, True, None, None)
    scores_bias = attention_bias
    if pad is not None:
        keep = _reshape_to(ctx, ctx.emit("gt", [pad, ctx.scalar(0, pad.type.dtype)]), (b, 1, 1, total))
        dropped = float(ctx.attr("mask_filter_value", -10000.0))
        padding = ctx.emit("where", [keep, scalar_like(ctx, 0.0, q), scalar_like(ctx, dropped, q)])
        scores_bias = padding if scores_bias is None else ctx.emit("add", [scores_bias, padding])
    mask = _full_mask(ctx, scores_bias, allowed, total, q.type.dtype)
    scale = ctx.attr("scale", None)
    if pad is None:
        y = ctx.emit("attention", [q, k, v] + ([mask] if mask is not None else []),
                     {"causal": False, "scale": None if not scale else float(scale), "gqa": False})
    else:   # in ONNX Runtime's order: a query whose keys are all dropped averages scores shifted
        # by -10000, where an f32 ulp is 1e-3, so the order of the roundings is the result
        scores = ctx.emit("matmul", [q, ctx.emit("permute", [k], {"perm": (0, 1, 3, 2)})])
        scores = ctx.emit("mul", [scores, scalar_like(ctx, float(scale) if scale else (d // heads) ** -0.5, scores)])
        y = ctx.emit("matmul", [ctx.emit("softmax", [ctx.emit("add", [scores, mask])], {"axis": -1}), v])
    return _reshape_to(ctx, ctx.emit("permute", [y], {"perm": (0, 2, 1, 3)}), (b, s, dv)), k, v


@onnx_converter("Attention", domain=MS, since=1)
def _attention(ctx: OnnxContext):
    """Self-attention with its input projection: input (B, S, Din) times one weight (Din,
    D + D + Dv; `qkv_hidden_sizes` when they differ) plus its bias gives query, key and value,
    then as MultiHeadAttention. Its cache is one tensor, past (2, B, heads, P, head size), keys
    then values, and so is present; its mask (mask_index) the padding mask (B, P + S)."""
    x, w, bias, pad, past_both = (ctx.input(i) for i in range(5))
    extra = (["past_sequence_length"] if ctx.has_input(6) else []) + \
        (["do_rotary"] if ctx.attr("do_rotary", 0) else []) + \
        (["a mask_index other than (batch, keys)"] if pad is not None and pad.type.rank != 2 else []) + \
        (["a past other than (2, batch, heads, length, head size)"] if past_both is not None and
         past_both.type.rank != 5 else [])
    if extra or x.type.rank != 3:
        ctx.refuse(f"Attention with {', '.join(extra) or 'an input of rank other than 3'}")
    sizes = ctx.attr("qkv_hidden_sizes", None)
    d_all = w.type.shape[1]
    d, dk, dv = sizes if sizes else (d_all // 3,) * 3
    projected = ctx.emit("matmul", [x, w])
    if bias is not None:
        projected = ctx.emit("add", [projected, bias])
    q, k, v = (ctx.emit("slice", [projected], {"axis": 2, "start": lo, "end": hi, "step": 1})
               for lo, hi in ((0, d), (d, d + dk), (d + dk, d + dk + dv)))
    past_k = past_v = None
    if past_both is not None:
        past_k, past_v = (ctx.emit("select", [past_both], {"axis": 0, "index": i}) for i in (0, 1))
    y, k, v = _cached_heads_attention(ctx, q, k, v, past_k, past_v, pad, ctx.input(5))
    if len(ctx.onnx.output) < 2 or not ctx.onnx.output[1]:
        return y
    shape = (1,) + tuple(k.type.shape)
    return y, ctx.emit("concat", [_reshape_to(ctx, k, shape), _reshape_to(ctx, v, shape)], {"axis": 0})

"""ONNX's Attention op (opset 23 on) onto the IR's ``attention``, the op the torch door makes of
scaled_dot_product_attention, so fusion forms the same attention region from both doors.

3-D inputs are split into heads first; a KV cache (past_key, past_value) is concatenated and
returned as present_key/present_value. Causality counts from the end of the cache (query i sees
keys up to past + i) and sliding windows are masks built here (constants, or for symbolic lengths
IR ops over the positions that fold to the same constants at each size); a score softcap or a
requested qk_matmul_output takes the op apart into matmul/softmax, since the IR's attention
keeps its scores inside.
"""

from __future__ import annotations

import numpy as np

from fexplore.ir import DType

from ..convert.movement import positions, repeat_interleave
from .elementwise import only_use_of, scalar_like
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
    known = all(isinstance(d, int) for d in (q_len, kv_len, offset))
    causal = bool(ctx.attr("is_causal", 0))
    left, right = ctx.attr("left_window_size"), ctx.attr("right_window_size")
    if ctx.has_input(6):   # an external cache: each batch row's own length
        if not known:
            raise NotImplementedError("Attention over an external cache with symbolic lengths")
        static = _lengths_mask(ctx, ctx.input(6), q_len, kv_len, causal, left, right)
    elif known:
        static = _static_mask(q_len, kv_len, offset, causal, left, right)
    else:
        static = _positions_mask(ctx, q_len, kv_len, offset, causal, left, right)
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


def _positions_mask(ctx, q_len, kv_len, offset, causal, left, right):
    """``_static_mask`` for lengths known at run time (a symbolic sequence, a cache of symbolic
    length): the same bool (q, kv) mask, built by IR ops over the positions, which a size's
    compile folds to ``_static_mask``'s constant. None when it allows everything."""
    if not causal and (left is None or left < 0) and (right is None or right < 0):
        return None

    def along(n, shape):
        return ctx.emit("reshape", [positions(ctx, n, DType.i64)], {"shape": shape})
    i = along(q_len, (q_len, 1))
    if not (isinstance(offset, int) and offset == 0):   # query i sits at past + i
        i = ctx.emit("add", [i, ctx.value(offset)])
    diff = ctx.emit("sub", [i, along(kv_len, (1, kv_len))])   # query position - key index
    tests = []
    if causal:
        tests.append(ctx.emit("ge", [diff, ctx.scalar(0, DType.i64)]))
    if left is not None and left >= 0:
        tests.append(ctx.emit("le", [diff, ctx.scalar(left, DType.i64)]))
    if right is not None and right >= 0:
        tests.append(ctx.emit("ge", [diff, ctx.scalar(-right, DType.i64)]))
    ok = tests[0]
    for t in tests[1:]:
        ok = ctx.emit("logical_and", [ok, t])
    return ok


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
        if not isinstance(pad, int):
            raise NotImplementedError("an Attention mask shorter than a symbolic key length")
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
        k, v = (repeat_interleave(ctx, t, rep, 1) for t in (k, v))
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


# -- scaled_dot_product_attention as exporters write it, read back -------------------------

def _scalar_factor(ctx, name):
    """(the other operand, the factor) of a single-use Mul by a known one-element constant,
    else (name, 1.0)."""

    mul = only_use_of(ctx, name, "Mul")
    if mul is not None:
        for i in (0, 1):
            c = ctx.importer.lookup_known(mul.input[i])
            if c is not None and c.dtype != object and np.asarray(c).size == 1:
                return mul.input[1 - i], float(np.asarray(c).reshape(-1)[0])
    return name, 1.0


def as_attention(ctx):
    """``Softmax((q * a) @ (kT * b) [+ mask]) @ v`` is how exporters write
    scaled_dot_product_attention: it becomes the IR's attention (scale a*b, k the transpose of
    kT, the mask added to the scores), the op the torch door keeps, so fusion forms the same
    attention region from both doors."""

    imp = ctx.importer
    soft = only_use_of(ctx, ctx.onnx.input[0], "Softmax") or _safe_softmax(ctx, ctx.onnx.input[0])
    if soft is None:
        return None
    scores, mask = soft.input[0], None
    add = only_use_of(ctx, scores, "Add")
    if add is not None:
        for i in (0, 1):
            if imp.producers.get(add.input[i]) is not None and \
                    imp.producers[add.input[i]].op_type == "MatMul":
                scores, mask = add.input[i], add.input[1 - i]
                break
        else:
            return None
    qk = only_use_of(ctx, scores, "MatMul")
    if qk is None:
        return None
    q_name, a = _scalar_factor(ctx, qk.input[0])
    kt_name, b = _scalar_factor(ctx, qk.input[1])
    q, kt, v = imp.value(q_name, ctx), imp.value(kt_name, ctx), ctx.input(1)
    r = q.type.rank
    if r < 3 or kt.type.rank != r or v.type.rank != r or \
            not q.type.dtype.is_float or soft_axis(soft, r) != r - 1:
        return None
    k, k_heads = _untransposed(ctx, kt_name, kt)
    if k is None:
        k = ctx.emit("permute", [kt], {"perm": tuple(range(r - 2)) + (r - 1, r - 2)})
    k_heads = k_heads if k_heads is not None else _unrepeated(ctx, k)
    v_heads = _unrepeated(ctx, v)
    gqa = False
    if k_heads is not None and v_heads is not None and \
            k_heads.type.shape[-3] == v_heads.type.shape[-3]:
        k, v, gqa = k_heads, v_heads, True   # grouped-query attention, as the torch door has it
    elif k is None or k.type.rank != r:   # only the grouped k was found: repeat it as given
        k = ctx.emit("permute", [kt], {"perm": tuple(range(r - 2)) + (r - 1, r - 2)})
    ins = [q, k, v] + ([imp.value(mask, ctx)] if mask is not None else [])
    return ctx.emit("attention", ins, {"causal": False, "scale": a * b, "gqa": gqa})


def _producer_value(ctx, v, op_type):
    """(the ONNX node of op_type computing IR value v, its first input's IR value), or None."""
    node = ctx.importer.producers.get(v.name)
    if node is None or node.op_type != op_type or node.input[0] not in ctx.importer.env:
        return None
    return node, ctx.importer.env[node.input[0]]


def _untransposed(ctx, kt_name, kt):
    """(k, its heads before repeat_kv or None) when kT is k with its last two axes swapped
    the way exporters write it for 4-D attention: Reshape (B*H, S, D) -> Transpose (0, 2, 1)
    -> Reshape (B, H, D, S), the first Reshape possibly flattening repeat_kv's
    (B, Hkv, n, S, D) directly; else (None, None)."""
    outer = _producer_value(ctx, kt, "Reshape")
    if outer is None:
        return None, None
    mid = _producer_value(ctx, outer[1], "Transpose")
    if mid is None or list(ctx_attr(mid[0], "perm") or ()) != [0, 2, 1]:
        return None, None
    inner = _producer_value(ctx, mid[1], "Reshape")
    if inner is None:
        return None, None
    k = inner[1]
    ks, kts = k.type.shape, kt.type.shape
    if k.type.rank == kt.type.rank + 1 == 5:   # repeat_kv's expanded heads, flattened
        b, h, n, s, d = ks
        src = _expanded_source(ctx, k)
        if src is None or tuple(kts) != (b, h * n, d, s):
            return None, None
        return None, src
    if k.type.rank != kt.type.rank or ks[:-2] != kts[:-2] or ks[-2:] != kts[-2:][::-1]:
        return None, None
    return k, None


def _expanded_source(ctx, t5):
    """The (B, Hkv, S, D) heads an Expand to (B, Hkv, n, S, D) repeats, or None."""
    exp = _producer_value(ctx, t5, "Expand")
    if exp is None or exp[1].type.rank != 5:
        return None
    b, h, one, s, d = exp[1].type.shape
    if one != 1 or (b, h, s, d) != tuple(t5.type.shape[:2]) + tuple(t5.type.shape[3:]):
        return None
    inner = _producer_value(ctx, exp[1], "Unsqueeze") or _producer_value(ctx, exp[1], "Reshape")
    if inner is None or tuple(inner[1].type.shape) != (b, h, s, d):
        return None
    return inner[1]


def _unrepeated(ctx, t):
    """The key/value heads before repeat_kv (Reshape (B, Hkv, 1, S, D) -> Expand
    (B, Hkv, n, S, D) -> Reshape (B, Hkv*n, S, D)), or None."""
    if t.type.rank != 4:
        return None
    outer = _producer_value(ctx, t, "Reshape")
    if outer is None or outer[1].type.rank != 5:
        return None
    src = _expanded_source(ctx, outer[1])
    if src is None:
        return None
    b, h, n, s, d = outer[1].type.shape
    return src if tuple(t.type.shape) == (b, h * n, s, d) else None


def ctx_attr(node, name):
    from onnx import helper

    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), None)


def _safe_softmax(ctx, name):
    """The Softmax under ``Where(IsNaN(p), 0, p)`` (a fully masked row's NaNs made zeros, as
    the IR's attention gives them), or None."""

    imp = ctx.importer
    where = only_use_of(ctx, name, "Where")
    if where is None or len(where.input) != 3:
        return None
    isnan = imp.producers.get(where.input[0])
    p = where.input[2]
    zero = imp.lookup_known(where.input[1])
    soft = imp.producers.get(p)
    if isnan is None or isnan.op_type != "IsNaN" or isnan.input[0] != p or zero is None or \
            zero.dtype == object or np.any(np.asarray(zero) != 0) or soft is None or \
            soft.op_type != "Softmax" or p in imp.graph_outputs or \
            len(imp.consumers.get(p, [])) != 2 or len(imp.consumers.get(where.input[0], [])) != 1:
        return None
    return soft


def soft_axis(node, rank: int) -> int:
    from onnx import helper

    ax = next((helper.get_attribute_value(x) for x in node.attribute if x.name == "axis"), -1)
    return ax % rank

"""``flex_attention`` (torch.nn.attention.flex_attention; what Hugging Face models run with
``attn_implementation="flex_attention"``): attention whose scores pass through a ``score_mod``
and a ``mask_mod``, two small traced functions of (score,) batch, head, query and key index.

What it computes is torch's own eager reference (``sdpa_dense``): scores = q @ k^T * scale in f32
(f64 for f64 inputs), ``where(mask_mod(b, h, m, n), score_mod(scores, b, h, m, n), -inf)``, a
safe softmax (a row that keeps nothing is zeros), @ v in q's dtype; GQA by repeating each key and
value head for its group. The block structure of a BlockMask only says where a fused kernel may
skip work; the reference, and so this, reads the mask_mod alone.

The two functions are traced by torch on 0-d indices (vmapped four times in eager). Here they are
run again on broadcast indices: b (B,1,1,1), h (1,H,1,1), m (1,1,L,1), n (1,1,1,S), with torch's
fake tensors propagated through them at those shapes, then converted like any subgraph and
inlined. An indexing of a captured buffer (``bias[h]``) broadcasts as the vmapped one does.

A score_mod that leaves the score alone, adds to it a term of the indices (ALiBi, a relative
bias), or masks it with ``where(cond, score, -inf)`` becomes the IR's ``attention`` op with an
additive or boolean mask: a flash-attention kernel on the chip. Any other (a softcap's tanh)
is written out as attention is written in eager: matmul, the score_mod, the mask, softmax,
matmul, which fusion makes a flash kernel of too; the safe softmax's empty rows are zeroed
after the product (from the mask_mod's rows, which keep a key or not). The log-sum-exp and row-max
outputs (``return_lse``), when read, are computed from the written-out scores, in log2 units
as the op gives them.
"""

from __future__ import annotations

import math
import operator

import numpy as np
import torch

from fexplore.ir import Constant, DType, Graph, Value

from .movement import positions, repeat_interleave
from .registry import ConvertContext, converter, torch_dtype


@converter("higher_order.flex_attention")
def _flex_attention(ctx: ConvertContext):
    q, k, v, score_gm, block_mask, scale = ctx.args[:6]
    score_bufs = list(ctx.arg(7, default=()) or ())
    mask_bufs = list(ctx.arg(8, default=()) or ())
    mask_gm = block_mask[-1]
    B, H, L, _ = q.type.shape
    S = k.type.shape[2]
    work = DType.f64 if q.type.dtype == DType.f64 else DType.f32
    k, v, gqa = _heads_and_batch(ctx, q, k, v)
    index = [_index(ctx, n, axis) for axis, n in enumerate((B, H, L, S))]
    fx = ctx.node.args
    tb, th, tl = fx[0].meta["val"].shape[:3]   # the sizes as torch has them (SymInts when dynamic)
    ts = fx[1].meta["val"].shape[2]
    score_body = _broadcast_body(ctx, score_gm, "score_mod", [(tb, th, tl, ts), (tb, 1, 1, 1), (1, th, 1, 1),
                                                              (1, 1, tl, 1), (1, 1, 1, ts)],
                                 [torch_dtype(work)] + [torch.int64] * 4, fx[7] if len(fx) > 7 else ())
    mask_body = _broadcast_body(ctx, mask_gm, "mask_mod", [(tb, 1, 1, 1), (1, th, 1, 1), (1, 1, tl, 1), (1, 1, 1, ts)],
                                [torch.int64] * 4, fx[8] if len(fx) > 8 else ())
    keep = _inline(ctx, mask_body, index + mask_bufs)[0]
    keep = None if _all_true(ctx, keep) else _to_scores(ctx, keep, (L, S))

    wants = {u.args[1] for u in ctx.node.users if u.target is operator.getitem}
    out = lse = row_max = None
    fast = _as_mask(ctx, score_body, index + score_bufs, keep, work, (L, S))
    if fast is not None and 0 in wants:
        mask, = fast
        out = ctx.emit("attention", [q, k, v] + ([mask] if mask is not None else []),
                       {"scale": float(scale), "gqa": gqa})
    if (0 in wants and out is None) or 1 in wants or 2 in wants:
        scores = _post_mod_scores(ctx, q, k, scale, score_body, index + score_bufs, keep, work, gqa)
        if 0 in wants and out is None:
            out = _softmax_times_v(ctx, scores, v, q.type.dtype, gqa,
                                   _rows_kept(ctx, scores, keep, score_body))
        if 1 in wants or 2 in wants:
            lse, row_max = _lse_and_max(ctx, scores)
    return out, lse, row_max


def _heads_and_batch(ctx, q, k, v):
    """k and v broadcast to q's batch (a batch of 1 shared); grouped heads left to the op (gqa)."""
    B, Hq = q.type.shape[:2]
    Bk, Hk = k.type.shape[:2]
    if Bk != B:
        k = ctx.emit("expand", [k], {"shape": (B,) + tuple(k.type.shape[1:])})
        v = ctx.emit("expand", [v], {"shape": (B,) + tuple(v.type.shape[1:])})
    return k, v, Hk != Hq


def _index(ctx, n, axis: int) -> Value:
    """arange(n) along ``axis`` of a rank-4 broadcast shape (i64, as the reference's)."""
    shape = [1, 1, 1, 1]
    shape[axis] = n
    return ctx.emit("reshape", [positions(ctx, n, DType.i64)], {"shape": tuple(shape)})


def _broadcast_body(ctx, gm, name, shapes, dtypes, buffer_nodes) -> Graph:
    """``gm`` (a score_mod or mask_mod, traced on 0-d indices) as an IR graph over broadcast
    indices of ``shapes``: torch's fake tensors propagated through it at those shapes, then
    converted. The subgraph's own metadata is put back afterwards."""
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    mode = ctx.node.args[0].meta["val"].fake_mode
    saved = {n: n.meta.get("val") for n in gm.graph.nodes}
    with mode:
        fakes = [torch.empty(s, dtype=d) for s, d in zip(shapes, dtypes)]
    fakes += [b.meta["val"] for b in buffer_nodes]
    try:
        FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fakes)
        return ctx.graph_module_converter(gm, name)
    finally:
        for n, val in saved.items():
            n.meta["val"] = val


def _inline(ctx, body: Graph, ins, *, drop=None, outputs=None) -> list[Value]:
    """``body``'s nodes emitted here on ``ins``; ``drop``: a node left out, ``outputs``: the
    values to give back instead of the body's outputs."""
    if drop is not None or outputs is not None:
        body = Graph(body.name, list(body.inputs), list(body.constants),
                     [n for n in body.nodes if n is not drop], list(outputs or body.outputs), dict(body.symbols))
    return ctx.inline(body, ins, body.name)


def _all_true(ctx, keep: Value) -> bool:
    """A mask_mod that keeps everything (flex_attention's default, ``noop_mask``)."""
    if isinstance(keep, Constant):
        return keep.payload is not None and bool(np.all(keep.payload))
    node = next((n for n in reversed(ctx.b.nodes) if any(o is keep for o in n.outputs)), None)
    return node is not None and node.op.name == "full" and node.attrs.get("value") in (True, 1)


def _to_scores(ctx, x: Value, sizes) -> Value:
    """A mask or bias of the indices at rank 4, its last two axes the scores' (L, S)."""
    shape = tuple(x.type.shape)
    if len(shape) < 4:
        x = ctx.emit("reshape", [x], {"shape": (1,) * (4 - len(shape)) + shape})
        shape = tuple(x.type.shape)
    want = shape[:2] + tuple(sizes)
    return x if shape == want else ctx.emit("expand", [x], {"shape": want})


def _as_mask(ctx, body: Graph, ins, keep, work: DType, sizes):
    """The score_mod as a mask of the ``attention`` op, as a 1-tuple (None: no mask at all), or
    None when it is not one: identity, ``score + bias`` or ``where(cond, score, -inf)``."""
    score = body.inputs[0]
    (result,) = body.outputs
    ins = [score] + list(ins)   # the score itself is read by no node that is inlined
    readers = [n for n in body.nodes if any(x is score for x in n.inputs)]
    if result is score:
        return (keep,)
    if len(readers) != 1 or readers[0].outputs[0] is not result:
        return None
    node = readers[0]
    others = [x for x in node.inputs if x is not score]
    if node.op.name == "add" and len(others) == 1:
        (bias,) = _inline(ctx, body, ins, drop=node, outputs=others)
        bias = _to_scores(ctx, ctx.emit("cast", [bias], {"dtype": work}) if bias.type.dtype != work else bias, sizes)
        if keep is not None:
            bias = ctx.emit("where", [keep, bias, ctx.scalar(-math.inf, work)])
        return (bias,)
    if node.op.name == "where" and node.inputs[1] is score and _is_minus_inf(body, node.inputs[2]):
        (cond,) = _inline(ctx, body, ins, drop=node, outputs=[node.inputs[0]])
        cond = _to_scores(ctx, cond, sizes)
        return (cond if keep is None else ctx.emit("logical_and", [keep, cond]),)
    return None


def _is_minus_inf(body: Graph, x: Value) -> bool:
    if isinstance(x, Constant):
        return x.payload is not None and bool(np.all(np.isneginf(np.asarray(x.payload, dtype=np.float64))))
    node = next((n for n in body.nodes if any(o is x for o in n.outputs)), None)
    return node is not None and node.op.name == "full" and node.attrs.get("value") == -math.inf


def _post_mod_scores(ctx, q, k, scale, body: Graph, ins, keep, work: DType, gqa: bool) -> Value:
    """The reference's post_mod_scores: (B, H, L, S) in the working dtype."""
    qw = ctx.emit("cast", [q], {"dtype": work}) if q.type.dtype != work else q
    kw = ctx.emit("cast", [k], {"dtype": work}) if k.type.dtype != work else k
    if gqa:
        kw = _repeat_heads(ctx, kw, q.type.shape[1])
    s = ctx.emit("matmul", [qw, ctx.emit("permute", [kw], {"perm": (0, 1, 3, 2)})])
    s = ctx.emit("mul", [s, ctx.scalar(float(scale), work)])
    (s,) = _inline(ctx, body, [s] + list(ins))
    if s.type.dtype != work:
        s = ctx.emit("cast", [s], {"dtype": work})
    if keep is not None:
        s = ctx.emit("where", [keep, s, ctx.scalar(-math.inf, work)])
    return s


def _repeat_heads(ctx, x: Value, heads) -> Value:
    """Each key/value head repeated for the query heads of its group."""
    return repeat_interleave(ctx, x, heads // x.type.shape[1], 1)


def _rows_kept(ctx, scores: Value, keep, body: Graph):
    """Which query rows keep a key (B|1, H|1, L, 1), or None when every row must: a row that
    keeps none has zeros out of the reference's safe softmax. From the mask_mod when the
    score_mod cannot make a score -inf itself (it holds no -inf); else from the scores' row max,
    a pass over the scores of its own."""
    makes_minus_inf = any(_is_minus_inf(body, x) for n in body.nodes for x in n.inputs)
    if not makes_minus_inf:
        return None if keep is None else ctx.emit("any", [keep], {"axes": (-1,), "keepdim": True})
    row_max = ctx.emit("amax", [scores], {"axes": (-1,), "keepdim": True})
    return ctx.emit("ne", [row_max, ctx.scalar(-math.inf, scores.type.dtype)])


def _softmax_times_v(ctx, scores: Value, v: Value, dtype: DType, gqa: bool, kept) -> Value:
    """softmax(``scores``) in ``dtype`` @ v, as attention is written (fusion makes a flash
    kernel of it); the rows ``kept`` says keep no key are zeros, as the reference's safe softmax
    gives them (softmax's 0/0 there is replaced after the product)."""
    p = ctx.emit("softmax", [scores], {"axis": -1})
    if gqa:
        v = _repeat_heads(ctx, v, scores.type.shape[1])
    p = ctx.emit("cast", [p], {"dtype": dtype}) if dtype != p.type.dtype else p
    v = ctx.emit("cast", [v], {"dtype": dtype}) if dtype != v.type.dtype else v
    out = ctx.emit("matmul", [p, v])
    if kept is None:
        return out
    return ctx.emit("where", [kept, out, ctx.scalar(0.0, dtype)])


def _lse_and_max(ctx, scores: Value):
    """log-sum-exp and max of each row, in log2 units (the op's; its caller multiplies by ln 2);
    a row that keeps nothing has -inf for both."""
    dt = scores.type.dtype
    row_max = ctx.emit("amax", [scores], {"axes": (-1,), "keepdim": True})
    finite = ctx.emit("where", [ctx.emit("ne", [row_max, ctx.scalar(-math.inf, dt)]), row_max, ctx.scalar(0.0, dt)])
    total = ctx.emit("sum", [ctx.emit("exp", [ctx.emit("sub", [scores, finite])])], {"axes": (-1,), "keepdim": True})
    lse = ctx.emit("add", [ctx.emit("log", [total]), finite])
    inv_ln2 = ctx.scalar(1.0 / math.log(2.0), dt)
    lse = ctx.emit("reshape", [ctx.emit("mul", [lse, inv_ln2])], {"shape": tuple(scores.type.shape[:-1])})
    row_max = ctx.emit("reshape", [ctx.emit("mul", [row_max, inv_ln2])], {"shape": tuple(scores.type.shape[:-1])})
    return lse, row_max

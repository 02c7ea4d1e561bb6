"""simplify: canonicalization by named rules, then CSE and DCE, to a fixed point.

Each rule looks at one node (and the node producing its input) and either answers with a value
that replaces the node's result or declines. Every firing is recorded (rule, nodes) for the
explorer. A rule may only replace a result with a value of exactly the same type (layout
included), which keeps every rewrite local and the verifier's job easy.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from fexplore.ir import Category, Constant, DType, Graph, Node, TensorType, Value

from ..stage import Rewrite, StageResult
from .forward_substitution import raise_forward_substitution
from .rewrite import Rewriter, map_regions

Rule = Callable[[Rewriter, Node, list, dict], "Value | None"]
RULES: list[tuple[str, Rule]] = []


def rule(name: str):
    def deco(fn: Rule) -> Rule:
        RULES.append((name, fn))
        return fn

    return deco


def _const_all(v: Value, x: float) -> bool:
    return isinstance(v, Constant) and v.payload is not None and v.payload.size <= 1 << 16 \
        and bool(np.all(v.payload == x))


@rule("drop-identity-reshape")
def _identity_reshape(rw, n, ins, made):
    return ins[0] if n.op.name == "reshape" and ins[0].type.shape == n.output.type.shape else None


@rule("collapse-reshape-chain")
def _reshape_chain(rw, n, ins, made):
    if n.op.name != "reshape":
        return None
    inner = made.get(ins[0].name)
    if inner is None or inner.op.name != "reshape":
        return None
    src = inner.inputs[0]
    if src.type.shape == n.output.type.shape:
        return src
    return rw.emit("reshape", [src], dict(n.attrs), name=n.output.name,
                   loc=n.loc, layout=n.output.type.layout)


@rule("drop-identity-permute")
def _identity_permute(rw, n, ins, made):
    if n.op.name == "permute" and tuple(n.attrs["perm"]) == tuple(range(len(n.attrs["perm"]))):
        return ins[0]
    return None


@rule("cancel-transpose-pair")
def _permute_pair(rw, n, ins, made):
    if n.op.name != "permute":
        return None
    inner = made.get(ins[0].name)
    if inner is None or inner.op.name != "permute":
        return None
    p, q = inner.attrs["perm"], n.attrs["perm"]
    perm = tuple(p[i] for i in q)
    src = inner.inputs[0]
    if perm == tuple(range(len(perm))):
        return src
    return rw.emit("permute", [src], {"perm": perm}, name=n.output.name,
                   loc=n.loc, layout=n.output.type.layout)


@rule("drop-noop-expand")
def _noop_expand(rw, n, ins, made):
    return ins[0] if n.op.name == "expand" and ins[0].type.shape == n.output.type.shape else None


@rule("broadcast-in-the-op")
def _expand_into_broadcast(rw, n, ins, made):
    """An elementwise op broadcasts its operands itself: an expand in front of one that its other
    operands already give the full shape is a copy written to DRAM for nothing (a linear-attention
    scan's `state * decay[..., None, None].exp()` expanded the decay to the state's shape)."""
    if n.op.category != Category.elementwise or n.regions or len(ins) < 2:
        return None
    expanded = [i for i, x in enumerate(ins) if made.get(x.name) is not None and made[x.name].op.name == "expand"]
    for i in expanded:
        new = list(ins)
        new[i] = made[ins[i].name].inputs[0]
        others = [tuple(x.type.shape) for j, x in enumerate(new) if j != i]
        if not all(isinstance(d, int) for s in others for d in s) or \
                np.broadcast_shapes(*others) != tuple(n.output.type.shape):
            continue   # the expand is what gives the result its shape (or sizes are symbols)
        return rw.emit(n.op.name, new, dict(n.attrs), name=n.output.name, loc=n.loc, layout=n.output.type.layout)
    return None


@rule("drop-noop-cast")
def _noop_cast(rw, n, ins, made):
    return ins[0] if n.op.name == "cast" and ins[0].type.dtype == n.attrs["dtype"] else None


@rule("drop-full-slice")
def _full_slice(rw, n, ins, made):
    if n.op.name == "slice" and n.attrs["start"] == 0 and n.attrs["step"] == 1 and \
            ins[0].type.shape == n.output.type.shape:
        return ins[0]
    return None


@rule("drop-single-concat")
def _single_concat(rw, n, ins, made):
    return ins[0] if n.op.name == "concat" and len(ins) == 1 else None


@rule("drop-multiply-by-one")
def _mul_one(rw, n, ins, made):
    if n.op.name == "mul":
        for x, c in ((ins[0], ins[1]), (ins[1], ins[0])):
            if _const_all(c, 1):
                return x
    if n.op.name == "div" and n.attrs["rounding"] == "none" and _const_all(ins[1], 1):
        return ins[0]
    return None


@rule("drop-add-zero")
def _add_zero(rw, n, ins, made):
    if n.op.name == "add":
        for x, c in ((ins[0], ins[1]), (ins[1], ins[0])):
            if _const_all(c, 0):
                return x
    if n.op.name == "sub" and _const_all(ins[1], 0):
        return ins[0]
    return None


@rule("drop-where-same-branches")
def _where_same(rw, n, ins, made):
    return ins[1] if n.op.name == "where" and ins[1] is ins[2] else None


@rule("pick-where-branch-of-a-constant-condition")
def _where_constant(rw, n, ins, made):
    """where(c, a, b) with c a constant all true (all false) is a (b), broadcast to the result:
    a condition made of sizes (a first prompt's S == total length), known once the size is."""
    cond = ins[0] if n.op.name == "where" else None
    if not isinstance(cond, Constant) or cond.payload is None or cond.payload.size > 1 << 16:
        return None
    c = np.asarray(cond.payload)
    if not (c.all() or not c.any()):
        return None
    pick, out = (ins[1] if c.all() else ins[2]), n.output.type
    if pick.type.dtype != out.dtype:
        return None
    if pick.type.shape == out.shape:
        return pick
    return rw.emit("expand", [pick], {"shape": out.shape}, name=n.output.name, loc=n.loc, layout=out.layout)


@rule("vector-matmul-as-matrix")
def _vector_matmul(rw, n, ins, made):
    """A matmul with a 1-d operand (torch's vector-matrix, matrix-vector, dot) as one of matrices:
    the vector a row (1, K) or a column (K, 1), the size-1 axis dropped from the result again.
    Reshapes of a row-major tensor move no data, and the kernels see a contraction's usual ranks."""
    if n.op.name != "matmul" or not any(x.type.rank == 1 for x in ins[:2]):
        return None
    a, b = ins[0], ins[1]
    if a.type.rank == 1:
        a = rw.emit("reshape", [a], {"shape": (1,) + tuple(a.type.shape)}, name=rw.fresh_name(f"{a.name}_row"),
                    loc=n.loc)
    if b.type.rank == 1:
        b = rw.emit("reshape", [b], {"shape": tuple(b.type.shape) + (1,)}, name=rw.fresh_name(f"{b.name}_col"),
                    loc=n.loc)
    y = rw.emit("matmul", [a, b, *ins[2:]], dict(n.attrs), name=rw.fresh_name(f"{n.output.name}_2d"), loc=n.loc)
    return rw.emit("reshape", [y], {"shape": tuple(n.output.type.shape)}, name=n.output.name, loc=n.loc,
                   layout=n.output.type.layout)


@rule("read-grouped-matrices-transposed")
def _grouped_matrices_transposed(rw, n, ins, made):
    """grouped_matmul(x, w.transpose(1, 2)): the kernel reads each group's matrix transposed, in
    place (transformers' experts store (G, N, K) and transpose them on every call; a permute of a
    weight too large to fold would be a relayout of all the experts on every call)."""
    if n.op.name != "grouped_matmul":
        return None
    p = made.get(ins[1].name)
    if p is None or p.op.name != "permute" or tuple(p.attrs["perm"]) != (0, 2, 1):
        return None
    attrs = dict(n.attrs, transpose_w=not n.attrs["transpose_w"])
    return rw.emit("grouped_matmul", [ins[0], p.inputs[0], ins[2]], attrs, name=n.output.name, loc=n.loc,
                   layout=n.output.type.layout)


@rule("contract-unflattened-rows")
def _contract_unflattened_rows(rw, n, ins, made):
    """reshape(f(x.view(-1, ...)), [*rows, ...]): ops computed on rows flattened into one axis and
    unflattened after are computed on the rows as they were. f is made of contractions
    (a matmul or linear over the rows, a batched matmul over the flat axis), elementwise ops and
    softmax over another axis, each read by nothing else. GPT-2's Conv1D flattens the rows around
    its matmul, and the view between it and the GELU or residual add after kept those out of the
    contraction's epilogue; XGLM and BLOOM flatten batch and heads into one axis for their bmm
    attention, which kept it from being the attention kernel. A flat operand is unflattened by
    the reshape (or permute of it) it came from, or by a new reshape: views, all of them."""
    if n.op.name != "reshape":
        return None
    flat, out = ins[0].type, n.output.type
    k = out.rank - flat.rank + 1   # the axes the flat first axis splits into
    lead, F = tuple(out.shape[:k]), flat.shape[0] if flat.rank else 1
    if flat.rank < 2 or k < 2 or F == 1 or tuple(out.shape[k:]) != tuple(flat.shape[1:]):
        return None   # (a first axis of one: a unit axis inserted, not an unflatten)

    def batched(x: Value) -> bool:
        return x.type.rank == flat.rank and x.type.shape[0] == F

    moved, leaves, stack = {}, {}, [ins[0]]
    while stack:
        v = stack.pop()
        p = made.get(v.name)
        rows_mm = p is not None and p.op.name in ("matmul", "linear") and p.inputs[1].type.rank == 2
        if p is not None and rw.readers(v.name) == 1 and not p.regions and len(p.outputs) == 1 and \
                batched(p.output) and (p.op.category == Category.elementwise or rows_mm or
                                       p.op.name == "matmul" and all(batched(x) for x in p.inputs[:2]) or
                                       p.op.name in ("softmax", "log_softmax") and p.attrs["axis"] % flat.rank):
            moved[id(p)] = p
            stack += [x for x in (p.inputs[:1] if rows_mm else p.inputs) if batched(x)]
        else:
            leaves[v.name] = v
    if not any(made.get(v) is not None and made[v].op.name == "reshape" and
               tuple(made[v].inputs[0].type.shape[:k]) == lead for v in leaves):
        return None   # no flatten of these axes under it: nothing cancels
    if not any(p.op.name in ("matmul", "linear") for p in moved.values()):
        return None   # elementwise ops alone run as well on the flat rows: no contraction to move

    def unflat(x: Value) -> Value:
        src = made.get(x.name)
        if src is not None and src.op.name == "reshape" and tuple(src.inputs[0].type.shape) == (*lead, *x.type.shape[1:]):
            return src.inputs[0]
        if src is not None and src.op.name == "permute" and src.attrs["perm"][0] == 0:
            perm = tuple(range(k)) + tuple(a + k - 1 for a in src.attrs["perm"][1:])
            return rw.emit("permute", [unflat(src.inputs[0])], {"perm": perm},
                           name=rw.fresh_name(f"{x.name}_rows"), loc=src.loc)
        return rw.emit("reshape", [x], {"shape": (*lead, *x.type.shape[1:])}, name=rw.fresh_name(f"{x.name}_rows"),
                       loc=n.loc)

    order = {id(node): i for i, node in enumerate(rw.nodes)}
    new: dict[str, Value] = {}
    root = made[ins[0].name] if id(made.get(ins[0].name)) in moved else None
    if root is None:
        return None
    for p in sorted(moved.values(), key=lambda node: order[id(node)]):
        operands = [new[x.name] if x.name in new else unflat(x) if x.name in leaves and batched(x) else x
                    for x in p.inputs]
        attrs = dict(p.attrs)
        if p.op.name in ("softmax", "log_softmax"):
            attrs["axis"] = p.attrs["axis"] % flat.rank + k - 1
        new[p.output.name] = rw.emit(p.op.name, operands, attrs, loc=p.loc,
                                     name=n.output.name if p is root else rw.fresh_name(f"{p.output.name}_rows"))
    return new[root.output.name]


@rule("scale-rows-after-the-matmul")
def _row_scale_after_matmul(rw, n, ins, made):
    """matmul(a * s, b) with s one number per row of a (size 1 along the contracted axis) is
    matmul(a, b) * s, and likewise a scale per column of b: the scale moves from an operand, where
    it was a kernel of its own writing the scaled operand to DRAM, to the contraction's epilogue.
    The chunked scans of linear-attention and state-space layers read their state this way
    (queries scaled by their decay, times the state). A scalar is left where it is: on an
    attention's scores it would be a vector pass per score instead of one per query element."""
    if n.op.name != "matmul" or len(ins) != 2 or n.output.type.rank < 2 or n.attrs.get("out_dtype") is not None:
        return None
    for side, free in ((0, -2), (1, -1)):
        p = made.get(ins[side].name)
        if p is None or p.op.name != "mul" or rw.readers(ins[side].name) != 1 or ins[side].type.rank < 2:
            continue
        for x, s in (p.inputs, p.inputs[::-1]):
            shape = s.type.shape
            if x.type != ins[side].type or len(shape) < 2 or \
                    shape[-1 if side == 0 else -2] != 1 or shape[free] == 1:
                continue
            y = rw.emit("matmul", [x, ins[1]] if side == 0 else [ins[0], x],
                        name=rw.fresh_name(f"{n.output.name}_unscaled"), loc=n.loc)
            return rw.emit("mul", [y, s], name=n.output.name, loc=p.loc, layout=n.output.type.layout)
    return None


_MOVES_DATA_ONLY = {"reshape", "permute", "slice", "select", "expand"}


def _scalar(v: Value) -> float | None:
    """The value of a float constant holding one number."""
    if isinstance(v, Constant) and v.payload is not None and v.payload.size == 1 and v.type.dtype.is_float:
        return float(np.asarray(v.payload).reshape(()))
    return None


def _scaled_source(v: Value, made) -> tuple[Value, list[Node], float] | None:
    """When `v` is views of x * c (or x / c), c a scalar: the same views of x and the factor c.
    A scalar commutes with every op that only moves data, so the factor can be applied after."""
    views = []
    n = made.get(v.name)
    while n is not None and n.op.name in _MOVES_DATA_ONLY and len(n.outputs) == 1:
        views.append(n)
        n = made.get(n.inputs[0].name)
    if n is None or n.op.name not in ("mul", "div"):
        return None
    a, b = n.inputs
    if n.op.name == "mul" and _scalar(a) is not None:
        a, b = b, a
    c = _scalar(b)
    if c is None or c == 0 or a.type.dtype != n.output.type.dtype or a.type.shape != n.output.type.shape or \
            (n.op.name == "div" and n.attrs["rounding"] != "none"):
        return None
    return a, views, (c if n.op.name == "mul" else 1.0 / c)


@rule("fold-query-key-scale-into-attention")
def _attention_scale(rw, n, ins, made):
    """attention(q * c, k, v, scale=s) is attention(q, k, v, scale=s * c), and so for k (BART,
    OPT, Whisper and XGLM scale the query projection before the heads are split out): the
    attention kernel scales its scores anyway, and q and k stay plain views of the projection."""
    if n.op.name != "attention":
        return None
    scale = n.attrs["scale"] if n.attrs["scale"] is not None else 1.0 / math.sqrt(ins[0].type.shape[-1])
    new = list(ins)
    for i in (0, 1):
        found = _scaled_source(ins[i], made)
        if found is None:
            continue
        x, views, c = found
        for view in reversed(views):
            x = rw.emit(view.op.name, [x], dict(view.attrs), name=rw.fresh_name(f"{view.output.name}_unscaled"),
                        loc=view.loc)
        new[i], scale = x, scale * c
    if new == list(ins):
        return None
    return rw.emit("attention", new, dict(n.attrs, scale=scale), name=n.output.name, loc=n.loc,
                   layout=n.output.type.layout)


@rule("raise-written-out-rms-norm")
def _written_out_rms_norm(rw, n, ins, made):
    """x * rsqrt(mean(x ** 2 over the last axes) + eps), as Llama, T5, Gemma, Qwen and Mistral
    write their RMSNorm, is the rms_norm op: then a contraction takes it as its prologue (the
    normed rows never go to DRAM) instead of it being a kernel of its own."""
    if n.op.name != "mul":
        return None
    for x, r in ((ins[0], ins[1]), (ins[1], ins[0])):
        found = _rms_of(x, r, made)
        if found is not None:
            ndim, eps = found
            return rw.emit("rms_norm", [x], {"ndim": ndim, "eps": eps}, name=n.output.name, loc=n.loc,
                           layout=n.output.type.layout)
    return None


def _rms_of(x: Value, r: Value, made) -> tuple[int, float] | None:
    """(ndim, eps) when `r` is rsqrt(mean(x * x over the last ndim axes, kept) + eps), else None."""
    if not x.type.dtype.is_float or r.type.dtype != x.type.dtype:
        return None
    rsqrt = made.get(r.name)
    if rsqrt is None or rsqrt.op.name != "rsqrt":
        return None
    add = made.get(rsqrt.inputs[0].name)
    if add is None or add.op.name != "add":
        return None
    for m, eps in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
        mean = made.get(m.name)
        if mean is None or mean.op.name != "mean" or not mean.attrs["keepdim"] or \
                not isinstance(eps, Constant) or eps.payload is None or eps.payload.size != 1:
            continue
        rank = x.type.rank
        axes = sorted(a % rank for a in mean.attrs["axes"])
        if not axes or axes != list(range(rank - len(axes), rank)):
            continue
        sq = made.get(mean.inputs[0].name)
        if sq is None or not (sq.op.name == "mul" and sq.inputs[0] is x and sq.inputs[1] is x or
                              sq.op.name == "pow" and sq.inputs[0] is x and _const_all(sq.inputs[1], 2)):
            continue
        return len(axes), float(np.asarray(eps.payload).reshape(()))
    return None


@rule("fold-weight-into-rms-norm")
def _rms_norm_weight(rw, n, ins, made):
    """rms_norm(x) * w, w a constant over the normalized axes, is rms_norm(x, w)."""
    if n.op.name != "mul":
        return None
    for y, w in ((ins[0], ins[1]), (ins[1], ins[0])):
        norm = made.get(y.name)
        if norm is None or norm.op.name != "rms_norm" or len(norm.inputs) != 1 or not isinstance(w, Constant):
            continue
        ndim = norm.attrs["ndim"]
        if tuple(w.type.shape) == tuple(y.type.shape[y.type.rank - ndim:]) and w.type.dtype == y.type.dtype:
            return rw.emit("rms_norm", [norm.inputs[0], w], dict(norm.attrs), name=n.output.name, loc=n.loc,
                           layout=n.output.type.layout)
    return None


@rule("fold-weight-into-rms-norm-through-cast")
def _rms_norm_weight_through_cast(rw, n, ins, made):
    """cast(rms_norm(x)) * w = cast(rms_norm(x, w)), w a constant over the normalized axes: a model
    in bf16 (Hugging Face's Llama-family norms: ``weight * x.to(input_dtype)``) normalizes in f32,
    casts back and then multiplies by its weight, so `fold-weight-into-rms-norm` does not see the
    norm and the multiply stays an elementwise pass of its own. Moved inside the cast, the product
    is rounded once where eager rounds the normed rows and then the product (within the dtype's
    tolerance, checked after the stage). Only where the cast reads the norm alone and the multiply
    alone reads the cast (a norm kept for another reader would run twice), and not into fp8, whose
    cast saturates first."""
    if n.op.name != "mul":
        return None
    for y, w in ((ins[0], ins[1]), (ins[1], ins[0])):
        cast = made.get(y.name)
        if cast is None or cast.op.name != "cast" or not isinstance(w, Constant) or \
                not _read_only_by(rw, y.name, n.output.name) or not _rounds_on_write(y.type.dtype):
            continue
        norm = made.get(cast.inputs[0].name)
        if norm is None or norm.op.name != "rms_norm" or len(norm.inputs) != 1 or \
                not _read_only_by(rw, norm.output.name, y.name):
            continue
        wide = norm.output.type.dtype
        ndim = norm.attrs["ndim"]
        if tuple(w.type.shape) != tuple(y.type.shape[y.type.rank - ndim:]) or w.type.dtype != y.type.dtype:
            continue
        w_wide = rw.computed_constant(f"{w.name}.{wide.value}", lambda: rw.values(w), TensorType(w.type.shape, wide))
        weighted = rw.emit("rms_norm", [norm.inputs[0], w_wide], dict(norm.attrs),
                           name=rw.fresh_name(norm.output.name + "_weighted"), loc=n.loc)
        return rw.emit("cast", [weighted], dict(cast.attrs), name=n.output.name, loc=n.loc,
                       layout=n.output.type.layout)
    return None


def _read_only_by(rw, name: str, reader: str) -> bool:
    """Whether value `name` is not a graph output and every node of the input graph that reads it
    makes `reader` (a value made this round has no readers there: the rule that made it knows)."""
    return not any(v.name == name for v in rw.graph.outputs) and \
        all(u.outputs[0].name == reader for u in rw.users(name))


def _rounds_on_write(dt) -> bool:
    """A float dtype a cast rounds into (fp8's cast saturates to e4m3's range first)."""
    return dt.is_float and dt != DType.fp8


@rule("fold-norm-affine-into-linear")
def _norm_affine_into_linear(rw, n, ins, made):
    """linear(norm(x, g, b0), W, b) = linear(norm(x), W * g, b + W @ b0): a layer or RMS norm's
    weight scales the linear's weight along K and its bias is a bias of the linear (as a batch norm
    folds into a convolution). The norm is then a contraction's prologue without operands of its
    own: its weight and bias are not loaded, one DMA start-up each on every PE that normalizes rows
    (GPT-2's MLP input projection in bf16: 18,795 -> 18,118 cycles). Only where every reader of
    the normed rows is such a linear, each linear's weight is read by it alone, and a norm's bias
    has a linear bias to go into: a weight tied elsewhere (an lm_head tied to the embedding) would
    be copied, a norm kept for another reader would run twice, and a bias made for a linear
    without one is a load in place of the one saved. The same through a cast between the norm and
    the linears (a model in bf16 normalizes in f32 and casts the rows back: Llama's norms, once
    `fold-weight-into-rms-norm-through-cast` has moved the weight inside): the linears then read
    the unscaled rows cast, and g is rounded into W * g instead of into the rows. On structure
    alone on the meta device, as every fold."""
    if n.op.name != "linear":
        return None
    norm = made.get(ins[0].name)
    cast = None
    if norm is not None and norm.op.name == "cast" and _rounds_on_write(norm.output.type.dtype):
        # the rows normalized in f32 and cast to the linear's dtype (a model in bf16): the
        # weight's scaling is rounded into W * g instead of into the normed rows
        cast, norm = norm, made.get(norm.inputs[0].name)
    if norm is None or norm.op.name not in ("layer_norm", "rms_norm") or len(norm.inputs) < 2 or \
            norm.attrs["ndim"] != 1 or not all(isinstance(rw.lookup(v), Constant) for v in norm.inputs[1:]):
        return None
    if cast is not None and not _read_only_by(rw, norm.output.name, cast.output.name):
        return None
    normed = (cast or norm).output.name   # what the linears read
    if any(v.name == normed for v in rw.graph.outputs):
        return None
    beta = norm.inputs[2] if len(norm.inputs) == 3 else None
    for u in rw.users(normed):
        if u.op.name != "linear" or u.inputs[0].name != normed or any(v.name == normed for v in u.inputs[1:]) or \
                not all(isinstance(rw.lookup(v), Constant) for v in u.inputs[1:]) or \
                rw.readers(u.inputs[1].name) != 1 or (beta is not None and len(u.inputs) < 3):
            return None
    x, gamma = norm.inputs[0], norm.inputs[1]
    w = ins[1]
    bias = ins[2] if len(ins) == 3 else None
    plain = rw.emit(norm.op.name, [x], dict(norm.attrs), name=rw.fresh_name(norm.output.name + "_unscaled"),
                    loc=norm.loc)
    if cast is not None:
        plain = rw.emit("cast", [plain], dict(cast.attrs), name=rw.fresh_name(normed + "_unscaled"), loc=cast.loc)
    new_w = rw.computed_constant(f"{w.name}.norm_scaled", lambda: rw.values(w) * rw.values(gamma), w.type)
    ops = [plain, new_w]
    if beta is not None:
        ops.append(rw.computed_constant(f"{bias.name}.norm_shifted",
                                        lambda: rw.values(bias) + rw.values(w) @ rw.values(beta), bias.type))
    elif bias is not None:
        ops.append(bias)
    return rw.emit("linear", ops, dict(n.attrs), name=n.output.name, loc=n.loc, layout=n.output.type.layout)


rule("raise-forward-substitution")(raise_forward_substitution)


def simplify(graph: Graph, options) -> StageResult:
    rewrites: list[Rewrite] = []
    for _ in range(20):  # a fixed point comes in two or three rounds; the bound is a guard
        fired = len(rewrites)
        graph = map_regions(graph, lambda g: _round(g, rewrites))
        if len(rewrites) == fired:  # a round with no rewrite changed nothing
            break
    fired: dict[str, int] = {}
    for r in rewrites:
        fired[r.rule] = fired.get(r.rule, 0) + 1
    summary = f"{len(rewrites)} rewrites" + (
        f" ({', '.join(f'{k} {v}' for k, v in sorted(fired.items()))})" if fired else "")
    return StageResult(graph, {"rules_fired": fired}, rewrites, summary)


def _round(graph: Graph, rewrites: list[Rewrite]) -> Graph:
    rw = Rewriter(graph)
    made: dict[str, Node] = {}  # value name -> the node that now produces it
    seen: dict[tuple, Node] = {}  # CSE table
    _dedupe_constants(rw)
    for node in graph.nodes:
        ins = [rw.lookup(v) for v in node.inputs]
        if len(node.outputs) == 1 and not node.regions and _apply_rules(rw, node, ins, made):
            continue
        if _inline_decided_cond(rw, node, ins, made):
            continue
        key = None if node.regions else (node.op.name, tuple(v.name for v in ins), node.attrs)
        if key is not None and key in seen:
            for old, new in zip(node.outputs, seen[key].outputs):
                rw.replace(old, new)
            rw.record("cse", [v.name for v in node.outputs], [v.name for v in seen[key].outputs])
            continue
        kept = rw.keep(node)
        for v in kept.outputs:
            made[v.name] = kept
        if key is not None:
            seen[key] = kept
    g = _dce(rw)
    rewrites.extend(rw.rewrites)
    return g


def _apply_rules(rw: Rewriter, node: Node, ins, made) -> bool:
    for name, fn in RULES:
        before = len(rw.nodes)
        result = fn(rw, node, ins, made)
        if result is None:
            continue
        if result.type != node.output.type:  # a rule must not change a value's type
            del rw.nodes[before:]
            continue
        for n in rw.nodes[before:]:
            for v in n.outputs:
                made[v.name] = n
        rw.replace(node.output, result)
        rw.record(name, [node.output.name], [result.name])
        return True
    return False


def _inline_decided_cond(rw: Rewriter, node: Node, ins, made) -> bool:
    """A cond whose predicate is a constant (a condition on sizes, once they are known) is the
    branch it takes: that region's nodes, inlined."""
    if node.op.name != "cond" or not isinstance(ins[0], Constant) or ins[0].payload is None:
        return False
    before = len(rw.nodes)
    branch = node.regions[0] if bool(np.asarray(ins[0].payload)) else node.regions[1]
    outs = rw.inline(branch, ins[1:], node.loc)
    for n in rw.nodes[before:]:
        for v in n.outputs:
            made[v.name] = n
    for old, new in zip(node.outputs, outs):
        rw.replace(old, new)
    rw.record("inline-cond-of-a-constant-predicate", [v.name for v in node.outputs], [v.name for v in outs])
    return True


def _dedupe_constants(rw: Rewriter) -> None:
    """Identical literal or folded constants (same type and content) become one."""
    first: dict[tuple, Constant] = {}
    for c in rw.constants:
        if c.source is not None or c.payload is None:
            continue
        key = (c.type, c.digest)
        if key in first:
            rw.replace(c, first[key])
            rw.record("dedupe-constant", [c.name], [first[key].name])
        else:
            first[key] = c


# A multi-result op whose extra results nothing reads, and the op that computes its first result
# alone. torch's MaxPool3d and max_pool2d(return_indices=...) export the indices form whether or
# not the indices are used (and the 3-d pool is two 2-d passes of it, `convert.nn._max_pool3d`):
# the plain pool's kernel is the cheaper one, the indices form carries each maximum's position.
_FIRST_RESULT_ONLY = {"max_pool2d_with_indices": ("max_pool2d", "drop-unused-pool-indices")}


def _dce(rw: Rewriter) -> Graph:
    """Drop nodes none of whose results are used (every op is pure), and compute only the first
    result of an op whose others nothing reads, where it has a single-result twin."""
    outs = [rw.lookup(v) for v in rw.graph.outputs]
    live = {v.name for v in outs}
    kept = []
    for n in reversed(rw.nodes):
        if any(v.name in live for v in n.outputs):
            twin = _FIRST_RESULT_ONLY.get(n.op.name)
            if twin is not None and not any(v.name in live for v in n.outputs[1:]):
                rw.record(twin[1], [v.name for v in n.outputs], [n.outputs[0].name])
                n = Node(twin[0], n.inputs, dict(n.attrs), n.outputs[:1], n.loc)
            kept.append(n)
            live.update(v.name for v in n.inputs)
        else:
            rw.record("dce", [v.name for v in n.outputs])
    rw.nodes = kept[::-1]
    return rw.finish()

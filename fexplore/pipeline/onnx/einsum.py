"""ONNX Einsum as the IR's permute/reshape/sum/matmul: one operand is summed and permuted; two
are brought to (batch, free, contracted) x (batch, contracted, free) and multiplied, the way a
contraction reaches the chip's tensor unit; more multiply two at a time; a letter repeated in one
operand takes a diagonal."""

from __future__ import annotations

import string

import numpy as np

from .movement import _reshape_to, product
from .registry import OnnxContext, onnx_converter


def _parse(eq: str, ranks):
    eq = eq.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ValueError(f"einsum {eq!r} names {len(terms)} operands, got {len(ranks)}")
    free = [c for c in string.ascii_letters if c not in eq]
    ell = max((r - (len(t) - 3) for t, r in zip(terms, ranks) if "..." in t), default=0)
    fill = "".join(free[:ell])
    terms = [t.replace("...", fill[ell - (r - (len(t) - 3)):]) if "..." in t else t
             for t, r in zip(terms, ranks)]
    if arrow:
        out = rhs.replace("...", fill)
    else:   # implicit output: the ellipsis, then the letters seen once, sorted
        once = sorted(c for c in set("".join(terms)) if "".join(terms).count(c) == 1
                      and c not in fill)
        out = fill + "".join(once)
    return terms, out


def _diagonals(ctx, x, term: str):
    """Take the diagonal of every letter ``term`` repeats (``ii`` in ``bii->bi``): the two dims
    go last and an index with equal row and column numbers picks the diagonal out of them, which
    then carries the letter once, last."""
    while len(set(term)) != len(term):
        c = next(c for c in term if term.count(c) > 1)
        p = term.index(c)
        q = term.index(c, p + 1)
        n = x.type.shape[p]
        if not isinstance(n, int):
            ctx.refuse(f"Einsum diagonal of a symbolic dim ({c!r})")
        r = x.type.rank
        perm = tuple(i for i in range(r) if i not in (p, q)) + (p, q)
        if perm != tuple(range(r)):
            x = ctx.emit("permute", [x], {"perm": perm})
        at = ctx.b.literal(np.arange(n, dtype=np.int64), f"{ctx.node.name}.diag_{c}")
        x = ctx.emit("index", [x, at, at], {"axes": (r - 2, r - 1)})
        term = "".join(t for i, t in enumerate(term) if i not in (p, q)) + c
    return x, term


def _reduce_to(ctx, x, term: str, keep: set):
    """Take the diagonals ``term`` asks for, then sum away its letters not in ``keep``."""
    x, term = _diagonals(ctx, x, term)
    axes = tuple(i for i, c in enumerate(term) if c not in keep)
    if axes:
        x = ctx.emit("sum", [x], {"axes": axes, "keepdim": False})
        term = "".join(c for c in term if c in keep)
    return x, term


def _permute(ctx, x, term: str, order: str):
    perm = tuple(term.index(c) for c in order)
    if perm == tuple(range(len(perm))):
        return x
    return ctx.emit("permute", [x], {"perm": perm})


@onnx_converter("Einsum")
def _einsum(ctx: OnnxContext):
    xs = [x for x in ctx.inputs() if x is not None]
    terms, out = _parse(ctx.attr("equation"), [x.type.rank for x in xs])
    # each operand first takes its diagonals and sums away the letters only it has
    ops = [_reduce_to(ctx, x, t, set(out).union(*(u for j, u in enumerate(terms) if j != i)))
           for i, (x, t) in enumerate(zip(xs, terms))]
    # then the operands multiply in order, two at a time, each product keeping the letters the
    # output or a later operand still needs (numpy's einsum without path optimization)
    y, ty = ops[0]
    for i in range(1, len(ops)):
        keep = set(out).union(*(t for _, t in ops[i + 1:]))
        b, tb = ops[i]
        pair = "".join(c for c in dict.fromkeys(ty + tb) if c in keep)
        y, ty = _product(ctx, y, ty, b, tb, pair), pair
    return _permute(ctx, y, ty, out)


def _product(ctx, a, ta: str, b, tb: str, out: str):
    """Two operands (no letter left that only one of them has and ``out`` lacks) as a batched
    matmul: (batch, free, contracted) x (batch, contracted, free), reshaped to the letters of
    ``out``."""
    size = {}
    for x, t in ((a, ta), (b, tb)):
        for c, d in zip(t, x.type.shape):
            if size.get(c, 1) == 1:
                size[c] = d
    batch = "".join(c for c in ta if c in tb and c in out)
    con = "".join(c for c in ta if c in tb and c not in out)
    left = "".join(c for c in ta if c not in tb)
    right = "".join(c for c in tb if c not in ta)

    def dims(s):
        return tuple(size[c] for c in s)

    a = _permute(ctx, a, ta, batch + left + con)
    b = _permute(ctx, b, tb, batch + con + right)
    # a letter of size 1 on one side only broadcasts: expand it to the other's size
    for x_name in ("a", "b"):
        x = a if x_name == "a" else b
        want = dims(batch + left + con) if x_name == "a" else dims(batch + con + right)
        if x.type.shape != want:
            x = ctx.emit("expand", [x], {"shape": want})
        a, b = (x, b) if x_name == "a" else (a, x)
    a = _reshape_to(ctx, a, dims(batch) + (product(dims(left)), product(dims(con))))
    b = _reshape_to(ctx, b, dims(batch) + (product(dims(con)), product(dims(right))))
    y = ctx.emit("matmul", [a, b])
    y = _reshape_to(ctx, y, dims(batch + left + right))
    return _permute(ctx, y, batch + left + right, out)

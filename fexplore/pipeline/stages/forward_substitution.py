"""The inverse of a unit lower-triangular matrix, written as a loop of row updates, raised to a few
matmuls (a simplify rule).

The gated delta-rule layers of Hugging Face's linear-attention models (Qwen3-Next, Qwen3.5,
Kimi Linear, OLMo hybrid, Bailing hybrid, ...) solve a unit lower-triangular system per chunk of
64 positions. Under torch.export they build its inverse by forward substitution::

    A = -U.tril(-1)
    for i in range(1, n):
        row = A[..., i, :i].clone()
        sub = A[..., :i, :i].clone()
        A[..., i, :i] = row + (row.unsqueeze(-1) * sub).sum(-2)

Unrolled, each step is a select, slices, a multiply, a sum and a write of one row: about ten ops
per row, 630 kernels for n = 64, each waiting on the last. With A strictly lower-triangular
(nilpotent: A^n = 0) the loop computes T = A + A T, that is T = (I - A)^-1 - I, and

    (I - A)^-1 = I + A + A^2 + ... + A^(n-1) = (I + A)(I + A^2)(I + A^4) ... (I + A^(2^(K-1)))

with 2^K >= n: 2(K - 1) matmuls of n x n (ten for n = 64) on the tensor unit. The rule fires only
on the whole loop (rows 1 to n - 1, in order, each step exactly the update above) over a matrix
known to be zero on and above its diagonal; anything else is left as written.
"""

from __future__ import annotations

import math

import numpy as np

from fexplore.ir import Constant, Node, Value


def raise_forward_substitution(rw, n: Node, ins, made) -> Value | None:
    """At the write of the last row: the loop's result, as matmuls over the matrix it started from."""
    t = n.output.type
    if n.op.name != "where" or t.rank < 2 or not t.dtype.is_float:
        return None
    size = t.shape[-1]
    if t.shape[-2] != size or not isinstance(size, int) or size < 3:
        return None
    step = ins   # the where writing row i: (condition, the row broadcast, the matrix it updates)
    for i in range(size - 1, 0, -1):   # from the last row down to row 1
        x = _row_update(*step, i, size, made)
        if x is None or x.type != t:
            return None
        if i > 1:
            w = made.get(x.name)
            if w is None or w.op.name != "where":
                return None
            step = w.inputs
    if not _strictly_lower(x, size, made):
        return None
    return _series(rw, x, size, n)


def _row_update(cond: Value, written: Value, x: Value, i: int, size: int, made) -> Value | None:
    """`x`, when where(cond, written, x) writes row `i`, columns `:i`, of it with
    row + sum(row[:, None] * sub, -2) (row = its row i, columns :i; sub = its [:i, :i]); else None."""
    r = x.type.rank
    if not _one_row(cond, i, size):
        return None
    # the written row, broadcast over the rows: expand(reshape(slice_scatter(select(x, i), new)));
    # simplify's broadcast-in-the-op may have dropped the expand
    e = made.get(written.name)
    if e is not None and e.op.name == "expand":
        e = made.get(e.inputs[0].name)
    if e is None or e.op.name != "reshape":
        return None
    ss = made.get(e.inputs[0].name)
    if ss is None or ss.op.name != "slice_scatter" or not _span(ss, r - 2, 0, i):
        return None
    selected, new = ss.inputs
    if not _is_row(selected, x, i, r, made):
        return None
    add = made.get(new.name)
    if add is None or add.op.name != "add":
        return None
    for row, total in (add.inputs, add.inputs[::-1]):
        if _is_slice_of(row, selected, r - 2, i, made) and _row_times_sub(total, row, x, i, r, made):
            return x
    return None


def _row_times_sub(total: Value, row: Value, x: Value, i: int, r: int, made) -> bool:
    """`total` is sum(row[..., :, None] * x[..., :i, :i], axis -2)."""
    s = made.get(total.name)
    if s is None or s.op.name != "sum" or tuple(s.attrs["axes"]) not in ((r - 2,), (-2,)) or s.attrs["keepdim"]:
        return False
    m = made.get(s.inputs[0].name)
    if m is None or m.op.name != "mul":
        return False
    for col, sub in (m.inputs, m.inputs[::-1]):
        c = made.get(col.name)
        if c is not None and c.op.name == "reshape" and c.inputs[0].name == row.name and \
                tuple(col.type.shape) == (*row.type.shape, 1) and _is_block(sub, x, i, r, made):
            return True
    return False


def _is_row(v: Value, x: Value, i: int, r: int, made) -> bool:
    p = made.get(v.name)
    return p is not None and p.op.name == "select" and p.inputs[0].name == x.name and \
        p.attrs["axis"] % r == r - 2 and p.attrs["index"] == i


def _is_slice_of(v: Value, of: Value, axis: int, end: int, made) -> bool:
    p = made.get(v.name)
    return p is not None and p.op.name == "slice" and p.inputs[0].name == of.name and _span(p, axis, 0, end)


def _is_block(v: Value, x: Value, i: int, r: int, made) -> bool:
    """`v` is x[..., :i, :i], sliced in either order."""
    p = made.get(v.name)
    if p is None or p.op.name != "slice":
        return False
    q = made.get(p.inputs[0].name)
    return q is not None and q.op.name == "slice" and q.inputs[0].name == x.name and \
        {(p.attrs["axis"] % r), (q.attrs["axis"] % r)} == {r - 2, r - 1} and \
        _span(p, p.attrs["axis"] % r, 0, i) and _span(q, q.attrs["axis"] % r, 0, i)


def _span(node: Node, axis: int, start: int, end: int) -> bool:
    r = node.inputs[0].type.rank
    return node.attrs["axis"] % r == axis and node.attrs["start"] == start and node.attrs["end"] == end and \
        node.attrs.get("step", 1) == 1


def _one_row(cond: Value, i: int, size: int) -> bool:
    """A constant condition true at row `i` of the last two axes, whatever the leading ones."""
    grid = _grid(cond, size)
    if grid is None:
        return False
    want = np.zeros((size, size), bool)
    want[i] = True
    return bool(np.array_equal(grid[0], want) and np.array_equal(grid[1], want))


def _grid(v: Value, size: int):
    """(where it is nonzero at every leading index, where at any) over the last two axes, or None
    when `v` is not a constant with values."""
    if not isinstance(v, Constant) or v.payload is None or v.type.rank > 0 and v.payload.size > 1 << 22:
        return None
    a = np.asarray(v.payload) != 0
    a = a.reshape((1,) * max(0, 2 - a.ndim) + a.shape)
    lead = tuple(range(a.ndim - 2))
    every, some = a.all(axis=lead), a.any(axis=lead)
    return np.broadcast_to(every, (size, size)), np.broadcast_to(some, (size, size))


def _strictly_lower(v: Value, size: int, made) -> bool:
    """`v` is zero on and above the diagonal of its last two axes, by how it is made."""
    return bool(np.all(_known_zero(v, size, made, 8)[np.triu_indices(size)]))


def _known_zero(v: Value, size: int, made, depth: int) -> np.ndarray:
    """Where in the last two axes `v` is zero at every leading index, as far as its making shows."""
    grid = _grid(v, size)
    if grid is not None:
        return ~grid[1]
    p = made.get(v.name)
    none = np.zeros((size, size), bool)
    if p is None or depth == 0 or v.type.rank < 2 or tuple(v.type.shape[-2:]) != (size, size):
        return none
    if p.op.name == "neg":
        return _known_zero(p.inputs[0], size, made, depth - 1)
    if p.op.name == "mul":
        return _known_zero(p.inputs[0], size, made, depth - 1) | _known_zero(p.inputs[1], size, made, depth - 1)
    if p.op.name == "where":
        cond = _grid(p.inputs[0], size)
        if cond is None:
            return none
        a, b = (_zero_operand(x, size, made, depth - 1) for x in p.inputs[1:])
        return (cond[0] & a) | (~cond[1] & b) | (a & b)
    return none


def _zero_operand(x: Value, size: int, made, depth: int) -> np.ndarray:
    """An operand of a where: a zero scalar is zero everywhere it is taken."""
    if isinstance(x, Constant) and x.payload is not None and x.payload.size == 1:
        return np.full((size, size), float(np.asarray(x.payload).reshape(())) == 0.0)
    return _known_zero(x, size, made, depth)


def _series(rw, a: Value, size: int, n: Node) -> Value:
    """(I + A)(I + A^2)(I + A^4)... - I: the loop's result for strictly lower-triangular A."""
    t = a.type
    eye = rw.constant(rw.fresh_name("eye"), np.eye(size, dtype=t.dtype.numpy))
    base = n.output.name

    def emit(op, xs, what):
        return rw.emit(op, xs, name=rw.fresh_name(f"{base}_{what}"), loc=n.loc)

    product = emit("add", [a, eye], "series")
    power = a
    for k in range(1, math.ceil(math.log2(size))):
        power = emit("matmul", [power, power], f"pow{2 ** k}")
        product = emit("matmul", [product, emit("add", [power, eye], f"term{2 ** k}")], "series")
    return rw.emit("sub", [product, eye], name=base, loc=n.loc, layout=t.layout)

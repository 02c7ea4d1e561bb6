"""Import-time evaluation of ONNX nodes whose inputs are all known.

Exporters compute shapes with tensors: ``Shape -> Gather -> Unsqueeze -> Concat -> Reshape``.
The IR states shapes as attributes (static ints or symbolic dims), so ingestion evaluates such
chains while it reads the graph. Numeric values go through onnx's own reference evaluator (the
op's meaning, from the onnx package); values holding symbolic sizes (object arrays of sympy
expressions, from ``Shape`` of a value with a ``dim_param`` dim) through the few integer ops
shape arithmetic uses, written here on object arrays.
"""

from __future__ import annotations

import numpy as np
import sympy

_SYMBOLIC_UNARY = {"Identity", "Cast", "Neg", "Abs", "Unsqueeze", "Squeeze", "Reshape",
                   "Flatten"}


def fold_node(node, vals, shape_only: bool = False, opset: int | None = None):
    """The node's outputs as numpy arrays, or None when it cannot be evaluated here."""
    if shape_only or node.op_type in ("Shape", "Size"):
        return [_shape(node, vals[0])]
    if any(v is not None and v.dtype == object for v in vals):
        try:
            out = _symbolic(node, vals)
        except Exception:  # noqa: BLE001  (anything not evaluable here stays an IR node)
            return None
        return None if out is None else [out]
    return _reference(node, vals, opset)


def _attrs(node) -> dict:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _shape(node, x):
    shape = tuple(x.shape)
    if node.op_type == "Size":
        n = 1
        for d in shape:
            n = n * d
        return _array([n]).reshape(())
    a = _attrs(node)
    r = len(shape)
    start, end = a.get("start", 0), a.get("end", r)
    start = min(max(start + r if start < 0 else start, 0), r)
    end = min(max(end + r if end < 0 else end, 0), r)
    return _array(shape[start:end])


def _array(items) -> np.ndarray:
    items = [sympy.sympify(x) if isinstance(x, sympy.Expr) else int(x) for x in items]
    if all(isinstance(x, int) or (isinstance(x, sympy.Expr) and x.is_Integer) for x in items):
        return np.asarray([int(x) for x in items], dtype=np.int64)
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


def _settle(a: np.ndarray) -> np.ndarray:
    """An object array whose every entry became a number is an i64 array again."""
    if not isinstance(a, np.ndarray):   # a 0-d pick (np.take with a scalar index)
        out = np.empty((), dtype=object)
        out[()] = a
        a = out
    flat = a.reshape(-1)
    if all(isinstance(x, (int, np.integer)) or (isinstance(x, sympy.Expr) and x.is_Integer)
           for x in flat):
        return np.asarray([int(x) for x in flat], dtype=np.int64).reshape(a.shape)
    return a


def _symbolic(node, vals):
    op, a = node.op_type, _attrs(node)
    x = vals[0]
    if op in ("Identity", "Cast"):
        return x
    if op == "Unsqueeze":
        axes = a.get("axes") or [int(i) for i in vals[1]]
        out = x
        r = x.ndim + len(axes)
        for ax in sorted(int(i) % r for i in axes):
            out = np.expand_dims(out, ax)
        return out
    if op == "Squeeze":
        axes = a.get("axes") or (list(vals[1]) if len(vals) > 1 and vals[1] is not None else None)
        return np.squeeze(x, tuple(int(i) % x.ndim for i in axes) if axes else None)
    if op == "Reshape":
        shape = [int(s) for s in vals[1]]
        return x.reshape([x.size if s == -1 and len(shape) == 1 else s for s in shape])
    if op == "Gather":
        axis = a.get("axis", 0)
        return _settle(np.take(x, np.asarray(vals[1], dtype=np.int64), axis=axis))
    if op == "Concat":
        parts = [v.astype(object) for v in vals if v is not None]
        return _settle(np.concatenate(parts, axis=a.get("axis", 0)))
    if op == "Slice":
        starts, ends = [int(v) for v in vals[1]], [int(v) for v in vals[2]]
        axes = [int(v) for v in vals[3]] if len(vals) > 3 and vals[3] is not None \
            else list(range(len(starts)))
        steps = [int(v) for v in vals[4]] if len(vals) > 4 and vals[4] is not None \
            else [1] * len(starts)
        idx = [slice(None)] * x.ndim
        for s, e, ax, st in zip(starts, ends, axes, steps):
            idx[ax % x.ndim] = slice(s, e, st)
        return _settle(x[tuple(idx)])
    if op in ("Add", "Sub", "Mul", "Div", "Mod", "Max", "Min", "Equal"):
        lhs, rhs = (v.astype(object) for v in vals[:2])
        fn = {"Add": lambda p, q: p + q, "Sub": lambda p, q: p - q, "Mul": lambda p, q: p * q,
              "Div": lambda p, q: sympy.floor(sympy.sympify(p) / q),
              "Mod": lambda p, q: sympy.Mod(p, q),
              "Max": lambda p, q: sympy.Max(p, q), "Min": lambda p, q: sympy.Min(p, q),
              "Equal": lambda p, q: sympy.sympify(p) == sympy.sympify(q)}[op]
        out = np.frompyfunc(fn, 2, 1)(lhs, rhs)
        if op == "Equal":
            return np.asarray(out, dtype=bool)
        return _settle(np.asarray(out, dtype=object))
    if op == "Where":
        return _settle(np.where(np.asarray(vals[0], bool), vals[1].astype(object),
                                vals[2].astype(object)))
    return None


def _reference(node, vals, opset):
    from onnx.reference import ReferenceEvaluator

    try:
        ev = ReferenceEvaluator(node, opsets={"": opset} if opset else None)
        feeds = {n: v for n, v in zip(node.input, vals) if n}
        outs = ev.run(None, feeds)
    except Exception:  # any op the reference cannot evaluate stays an IR node
        return None
    return [np.asarray(o) for o in outs]

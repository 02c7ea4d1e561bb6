"""Converters for control flow: ``torch.cond`` becomes a ``cond`` node owning two regions;
``map`` (functorch's, over the leading axis) and ``scan`` are unrolled, as torch.export unrolls
a Python loop.

A predicate on sizes (``x.shape[0] > 2`` with a dynamic dim: a SymBool) becomes a 0-d bool
computed from the sizes, so the cond stays a cond while the size is a symbol; once a size is
known (a static compile, a schedule made for one size) it is a constant and simplify's
"inline-cond-of-a-constant-predicate" keeps the taken branch alone.
"""

from __future__ import annotations

import sympy
import torch

from fexplore.ir import DType, Value

from .registry import ConvertContext, converter

# sympy's relations and the IR's comparison ops of the same meaning
_COMPARISONS = {sympy.StrictGreaterThan: "gt", sympy.GreaterThan: "ge", sympy.StrictLessThan: "lt",
                sympy.LessThan: "le", sympy.Eq: "eq", sympy.Ne: "ne"}
_LOGIC = {sympy.And: "logical_and", sympy.Or: "logical_or"}


@converter("higher_order.cond")
def _cond(ctx: ConvertContext):
    pred, true_gm, false_gm, operands = ctx.args[:4]
    if not isinstance(pred, Value):
        pred = size_predicate(ctx, pred)
    then_g = ctx.graph_module_converter(true_gm, "then")
    else_g = ctx.graph_module_converter(false_gm, "else")
    outs = ctx.emit_region_op("cond", [pred, *operands], [then_g, else_g])
    return outs if isinstance(outs, tuple) else (outs,)


@converter("higher_order.map_impl")
def _map(ctx: ConvertContext):
    """``map(f, xs, *args)``: f on each slice ``xs[i]`` along the leading axis (with the other
    operands whole), the results stacked."""
    body_gm, xs, extra = ctx.args[:3]
    n = _steps(xs, "map")
    body = ctx.graph_module_converter(body_gm, "body")
    steps = [_step(ctx, body, [_slice(ctx, x, i) for x in xs] + list(extra), i) for i in range(n)]
    return tuple(_stacked(ctx, steps, body.outputs))


@converter("higher_order.scan")
def _scan(ctx: ConvertContext):
    """``scan(f, init, xs, additional_inputs)``: carries start at ``init``; each step
    ``carries, ys = f(*carries, *xs[i], *additional_inputs)``. Gives the last carries, then
    each y stacked over the steps (torch's wrapper has moved the scanned axis first and
    flipped xs for a reverse scan)."""
    body_gm, init, xs, extra = ctx.args[:4]
    n = _steps(xs, "scan")
    body = ctx.graph_module_converter(body_gm, "combine")
    carries, steps = list(init), []
    for i in range(n):
        outs = _step(ctx, body, carries + [_slice(ctx, x, i) for x in xs] + list(extra), i)
        carries, ys = outs[:len(init)], outs[len(init):]
        steps.append(ys)
    return tuple(carries) + tuple(_stacked(ctx, steps, body.outputs[len(init):]))


@converter("higher_order.while_loop")
def _while_loop(ctx: ConvertContext):
    raise NotImplementedError(
        "a while_loop runs until a condition on tensor values fails: a compiled program has no "
        "run-time loop (write the loop in Python over a known count, or as torch scan/map, "
        "which are unrolled)")


def _steps(xs, what: str) -> int:
    """The number of steps of an unrolled loop: one copy of its body per step, so it must be
    known when compiling."""
    n = xs[0].type.shape[0]
    if not isinstance(n, int):
        raise NotImplementedError(
            f"{what} over a leading axis of symbolic length {n}: it is unrolled, one copy of the "
            "body per slice, so the length must be static (no dynamic_shapes on that dim)")
    return n


def _slice(ctx: ConvertContext, x: Value, i: int) -> Value:
    return ctx.emit("select", [x], {"axis": 0, "index": i})


def _step(ctx: ConvertContext, body, ins, i: int) -> list[Value]:
    """Step ``i``: one copy of ``body`` on ``ins``."""
    return ctx.inline(body, ins, str(i))


def _stacked(ctx: ConvertContext, steps: list, outputs) -> list[Value]:
    """Each of the body's ``outputs`` stacked over the steps (a new leading axis)."""
    stacked = []
    for k, out in enumerate(outputs):
        shape = tuple(out.type.shape)
        if not steps:
            stacked.append(ctx.emit("full", [], {"shape": (0,) + shape, "value": 0, "dtype": out.type.dtype}))
            continue
        rows = [ctx.emit("reshape", [step[k]], {"shape": (1,) + shape}) for step in steps]
        stacked.append(ctx.emit("concat", rows, {"axis": 0}))
    return stacked


def size_predicate(ctx: ConvertContext, pred) -> Value:
    """A predicate over sizes (a SymBool, or a bool export decided) as a 0-d bool tensor."""
    if isinstance(pred, torch.SymBool):
        pred = ctx.b.symbols.expr(pred.node.expr)
    if isinstance(pred, (bool, type(sympy.true), type(sympy.false))):
        return ctx.value(bool(pred))
    return _relation(ctx, pred)


def _relation(ctx: ConvertContext, rel) -> Value:
    if rel in (sympy.true, sympy.false):
        return ctx.value(bool(rel))
    if type(rel) in _COMPARISONS:
        a, b = (ctx.value(int(x) if x.is_Integer else x, DType.i64) for x in rel.args)
        return ctx.emit(_COMPARISONS[type(rel)], [a, b])
    if type(rel) in _LOGIC:
        parts = [_relation(ctx, x) for x in rel.args]
        out = parts[0]
        for p in parts[1:]:
            out = ctx.emit(_LOGIC[type(rel)], [out, p])
        return out
    if isinstance(rel, sympy.Not):
        return ctx.emit("logical_not", [_relation(ctx, rel.args[0])])
    raise NotImplementedError(f"torch.cond on the size condition {rel} (a {type(rel).__name__})")

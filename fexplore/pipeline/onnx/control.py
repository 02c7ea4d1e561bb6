"""ONNX control flow: ``If`` becomes the IR's ``cond`` (the op torch.cond becomes too).

An ONNX branch reads outer values by name; an IR region is closed, so the outer values either
branch reads become the cond's operands and both regions' inputs, in one order. A condition
known when compiling picks its branch then, and the other is never converted.
"""

from __future__ import annotations

import numpy as np

from fexplore.ir import Value

from .registry import OnnxContext, onnx_converter


@onnx_converter("If")
def _if(ctx: OnnxContext):
    from .importer import _Importer

    imp = ctx.importer
    known = imp.lookup_known(ctx.onnx.input[0])
    then_gp, else_gp = ctx.attr("then_branch"), ctx.attr("else_branch")
    if known is not None:  # decided at compile time: the taken branch, inlined
        branch = then_gp if bool(np.asarray(known).reshape(-1)[0]) else else_gp
        sub = _Importer(branch, imp.opset, imp.b.symbols, parent=imp)
        g = sub.convert("branch")
        outer = [imp.value(n, ctx) for n in sub.captured]
        outs = _inline(ctx, g, outer)
        return tuple(outs)
    pred = ctx.input(0)
    if pred.type.rank:
        pred = ctx.emit("reshape", [pred], {"shape": ()})
    subs = [_Importer(gp, imp.opset, imp.b.symbols, parent=imp) for gp in (then_gp, else_gp)]
    graphs = [s.convert(name) for s, name in zip(subs, ("then", "else"))]
    order = list(dict.fromkeys(subs[0].captured + subs[1].captured))
    for s, g in zip(subs, graphs):
        by_name = dict(zip(s.captured, g.inputs))
        g.inputs[:] = [by_name.get(n) or Value(f"{n}.unused", imp.value(n, ctx).type) for n in order]
    operands = [imp.value(n, ctx) for n in order]
    outs = ctx.emit_region_op("cond", [pred, *operands], graphs)
    return outs if isinstance(outs, tuple) else (outs,)


def _inline(ctx, g, outer):
    """The branch's nodes, re-emitted into the enclosing graph (its constants and nodes move
    over; its inputs are the outer values)."""
    env = {v.name: o for v, o in zip(g.inputs, outer)}
    b = ctx.b
    for c in g.constants:
        env[c.name] = b.literal(c.payload, c.name) if c.source is None else c
        if c.source is not None:
            b.constants.append(c)
    from fexplore.ir import Node

    for n in g.nodes:
        ins = [env.get(v.name, v) for v in n.inputs]
        outs = [Value(b._unique(v.name), v.type) for v in n.outputs]
        for v, o in zip(n.outputs, outs):
            env[v.name] = o
        b.nodes.append(Node(n.op, ins, n.attrs, outs, n.loc, n.regions))
    return [env.get(v.name, v) for v in g.outputs]

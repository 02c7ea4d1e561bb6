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
    if known is not None:  # decided at compile time: the taken branch, in this scope
        branch = then_gp if bool(np.asarray(known).reshape(-1)[0]) else else_gp
        return _inline_branch(ctx, imp, branch)
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


def _inline_branch(ctx, imp, branch):
    """The branch's nodes converted in the enclosing scope (they read its values by name, and
    what is known there stays known: a shape computed in a branch still folds); each output of
    the If is the branch's output, through an Identity the import-time evaluation can follow."""
    from onnx import helper, numpy_helper

    for init in branch.initializer:
        imp.known[init.name] = numpy_helper.to_array(init)
    for node in branch.node:
        imp._node(node)
    outs = []
    for src, dst in zip((o.name for o in branch.output), ctx.onnx.output):
        imp.producers[dst] = helper.make_node("Identity", [src], [dst])
        k = imp.lookup_known(src)
        outs.append(np.asarray(k) if k is not None else imp.value(src, ctx))
    return tuple(outs)

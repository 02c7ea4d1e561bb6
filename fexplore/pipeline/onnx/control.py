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


@onnx_converter("Scan")
def _scan(ctx: OnnxContext):
    """Scan unrolled: the body once per step of the scanned axis (a static length), each copy's
    values renamed under the step, its states carried to the next copy, its scan outputs
    stacked along their axis at the end."""
    from onnx import numpy_helper

    imp = ctx.importer
    body = ctx.attr("body")
    m = ctx.attr("num_scan_inputs")
    n_state = ctx.n_inputs - m
    n_body_out = len(body.output)
    k = n_body_out - n_state
    in_axes = list(ctx.attr("scan_input_axes") or (0,) * m)
    in_dirs = list(ctx.attr("scan_input_directions") or (0,) * m)
    out_axes = list(ctx.attr("scan_output_axes") or (0,) * k)
    out_dirs = list(ctx.attr("scan_output_directions") or (0,) * k)
    scans = [ctx.input(n_state + j) for j in range(m)]
    in_axes = [a % s.type.rank for a, s in zip(in_axes, scans)]
    length = scans[0].type.shape[in_axes[0]]
    if not isinstance(length, int):
        raise NotImplementedError("Scan over a symbolic length")
    states = [ctx.onnx.input[i] for i in range(n_state)]
    defined = {o for nd in body.node for o in nd.output} | {i.name for i in body.initializer}
    formal = [i.name for i in body.input]
    steps: list[list] = [[] for _ in range(k)]
    base = ctx.onnx.name or ctx.onnx.output[0]
    for t in range(length):
        prefix = f"{base}::step{t}::"
        names = dict(zip(formal[:n_state], states))
        for j, (s, ax, d) in enumerate(zip(scans, in_axes, in_dirs)):
            idx = length - 1 - t if d else t
            name = f"{prefix}{formal[n_state + j]}"
            imp.env[name] = ctx.emit("select", [s], {"axis": ax, "index": idx})
            names[formal[n_state + j]] = name

        def rename(x, names=names, prefix=prefix):
            if x in names:
                return names[x]
            return prefix + x if x in defined else x

        for init in body.initializer:
            imp.known[rename(init.name)] = numpy_helper.to_array(init)
        for nd in body.node:
            copy = type(nd)()
            copy.CopyFrom(nd)
            copy.input[:] = [rename(x) if x else "" for x in nd.input]
            copy.output[:] = [rename(x) if x else "" for x in nd.output]
            if not copy.name:
                copy.name = copy.output[0]
            copy.name = prefix + copy.name
            imp._node(copy)
        outs = [rename(o.name) for o in body.output]
        states = outs[:n_state]
        for j in range(k):
            steps[j].append(imp.value(outs[n_state + j], ctx))
    results = [imp.value(s, ctx) for s in states]
    for j in range(k):
        parts = steps[j][::-1] if out_dirs[j] else steps[j]
        rank = parts[0].type.rank + 1
        ax = out_axes[j] % rank
        parts = [ctx.emit("reshape", [p], {"shape": p.type.shape[:ax] + (1,) + p.type.shape[ax:]})
                 for p in parts]
        results.append(parts[0] if len(parts) == 1 else ctx.emit("concat", parts, {"axis": ax}))
    return tuple(results)

"""ONNX control flow: ``If`` becomes the IR's ``cond`` (the op torch.cond becomes too); ``Scan``
and ``Loop`` are unrolled, as torch.export unrolls a Python loop.

An ONNX branch reads outer values by name; an IR region is closed, so the outer values either
branch reads become the cond's operands and both regions' inputs, in one order. A condition
known when compiling picks its branch then, and the other is never converted. A loop unrolls
when its number of steps is known when compiling: Scan's scanned length, Loop's trip count and
conditions (constants, or graph inputs frozen to their example values like any shape-like
operand); a Loop whose condition depends on run-time values is refused.
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


def _body_step(imp, body, prefix: str, names: dict) -> list[str]:
    """One copy of a loop body converted in the enclosing scope: the body's inputs read the
    values ``names`` gives them, what the body defines is renamed under ``prefix`` (what it reads
    from outside keeps its name). Returns the names of the copy's outputs."""
    from onnx import numpy_helper

    defined = {o for nd in body.node for o in nd.output} | {i.name for i in body.initializer}

    def rename(x):
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
    return [rename(o.name) for o in body.output]


def _stack(ctx, parts: list, ax: int):
    """Values of one shape stacked along a new axis ``ax``."""
    rank = parts[0].type.rank + 1
    ax = ax % rank
    parts = [ctx.emit("reshape", [p], {"shape": p.type.shape[:ax] + (1,) + p.type.shape[ax:]})
             for p in parts]
    return parts[0] if len(parts) == 1 else ctx.emit("concat", parts, {"axis": ax})


@onnx_converter("Scan")
def _scan(ctx: OnnxContext):
    """Scan unrolled: the body once per step of the scanned axis (a static length), each copy's
    values renamed under the step, its states carried to the next copy, its scan outputs
    stacked along their axis at the end."""
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

        outs = _body_step(imp, body, prefix, names)
        states = outs[:n_state]
        for j in range(k):
            steps[j].append(imp.value(outs[n_state + j], ctx))
    results = [imp.value(s, ctx) for s in states]
    for j in range(k):
        results.append(_stack(ctx, steps[j][::-1] if out_dirs[j] else steps[j], out_axes[j]))
    return tuple(results)


# Unrolling copies the body once per step: past this many, the graph would be the loop's body
# times its trip count, which is no longer a program a person can read or a compile can afford.
MAX_UNROLLED_STEPS = 1024


@onnx_converter("Loop")
def _loop(ctx: OnnxContext):
    """Loop unrolled: the body once per step while the step is below the trip count and the
    condition holds, both known when compiling (the body's condition output is evaluated after
    each step); the carried values go from copy to copy, the scan outputs are stacked on a new
    first axis."""
    imp = ctx.importer
    body = ctx.attr("body")
    trip = ctx.const(0, "trip count")
    cond = ctx.const(1, "loop condition")
    limit = int(np.asarray(trip).reshape(-1)[0]) if trip is not None else None
    going = bool(np.asarray(cond).reshape(-1)[0]) if cond is not None else True
    n_carried = ctx.n_inputs - 2
    k = len(body.output) - 1 - n_carried
    formal = [i.name for i in body.input]
    carried = [ctx.onnx.input[2 + i] for i in range(n_carried)]
    steps: list[list] = [[] for _ in range(k)]
    base = ctx.onnx.name or ctx.onnx.output[0]
    t = 0
    while going and (limit is None or t < limit):
        if t == MAX_UNROLLED_STEPS:
            ctx.refuse(f"a Loop of more than {MAX_UNROLLED_STEPS} steps (it is unrolled)",
                       hint="export the model with a smaller trip count, or keep the loop "
                            "outside the model")
        prefix = f"{base}::iter{t}::"
        # the step number and the condition under the body's own input names (no value the body
        # defines can have them)
        step, going_in = prefix + formal[0], prefix + formal[1]
        imp.known[step] = np.array(t, np.int64)
        imp.known[going_in] = np.array(True)
        names = dict(zip(formal, [step, going_in, *carried]))
        outs = _body_step(imp, body, prefix, names)
        # known from constants and the step number alone; a condition read from the data
        # (even data given as a graph input, which a shape-like operand would freeze) is refused
        known = imp.lookup_known(outs[0])
        if known is None:
            ctx.refuse("its loop condition is computed from run-time values, so the number of "
                       "steps is not known when compiling",
                       hint="export the model with a fixed trip count (the condition a "
                            "constant true), or keep the loop outside the model")
        going = bool(np.asarray(known).reshape(-1)[0])
        carried = outs[1:1 + n_carried]
        for j in range(k):
            steps[j].append(imp.value(outs[1 + n_carried + j], ctx))
        t += 1
    if k and not t:
        ctx.refuse("a Loop that runs no step and has scan outputs (their shape is unknown)")
    results = [imp.value(c, ctx) for c in carried]
    return tuple(results + [_stack(ctx, steps[j], 0) for j in range(k)])

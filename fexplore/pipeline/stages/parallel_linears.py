"""Parallel linears over one input become one linear over their weights side by side.

Attention's q, k and v projections (and DeepSeek's q_a and kv_a, an encoder-decoder's cross-
attention k and v, two heads on one trunk) each read the same activations with a weight of their
own. As separate kernels each loads the activations again and the norm before them cannot be a
prologue (it has three readers), so it is a kernel of its own whose result goes to DRAM and back.
One linear whose weight is the weights concatenated along N (a constant, made at compile time)
computes the same dot products, and each projection's result is a slice of its columns: a view
the attention kernel reads in place.

Only linears whose results go into attention are merged: the attention region takes the slices (and
the views, norms of each head and rotary embedding after them) as part of its kernel. A slice read
by anything else is a copy kernel of its own, more than the merge saves (two heads returned side by
side). Two linears whose results meet again in an elementwise op (SwiGLU's gate and up projections)
are left apart: fusion makes them sibling contractions of one kernel, whose epilogue pairs each
column tile of one with the same tile of the other, which slices of one wide result would not.

For the same reason the reverse holds for a linear written fused: Phi-3's ``gate_up_proj``,
chunked in two whose halves meet in SwiGLU's product, is split into one linear per part (its
weight's rows cut at compile time), which fusion then makes sibling contractions of one kernel;
as one linear, its chunks were a copy kernel and the product a kernel of its own.
"""

from __future__ import annotations

import os

import numpy as np

from fexplore.errors import SourceLoc
from fexplore.ir import Category, Constant, Graph, Node, TensorType

from .rewrite import Rewriter

REACH = 8   # elementwise steps followed from a linear to see whether its result meets another's


def merge_parallel_linears(graph: Graph) -> tuple[Graph, list]:
    """(the graph with each group of parallel linears merged, the rewrites made)."""
    groups = _groups(graph)
    if not groups:
        return graph, []
    first_of = {id(g[0]): g for g in groups}
    merged = {id(n) for g in groups for n in g}
    rw = Rewriter(graph)
    for node in graph.nodes:
        if id(node) in first_of:
            _merge(rw, first_of[id(node)])
        elif id(node) not in merged:
            rw.keep(node)
    return rw.finish(), rw.rewrites


def split_fused_linears(graph: Graph) -> tuple[Graph, list]:
    """(the graph with each fused linear whose parts meet again split into a linear per part, the
    rewrites made)."""
    users = graph.users()
    fused = {}   # id(linear) -> the split reading it
    for n in graph.nodes:
        if n.op.name != "linear" or not _constant_operands(n):
            continue
        readers = users.get(n.output.name, [])
        if len(readers) != 1 or readers[0].op.name != "split" or len(readers[0].outputs) < 2:
            continue
        sp = readers[0]
        if sp.attrs["axis"] % n.output.type.rank != n.output.type.rank - 1:
            continue
        reach = [_elementwise_reach([v], users) for v in sp.outputs]
        if any(reach[i] & reach[j] for i in range(len(reach)) for j in range(i + 1, len(reach))):
            fused[id(n)] = sp
    if not fused:
        return graph, []
    splits = {id(sp) for sp in fused.values()}
    rw = Rewriter(graph)
    for node in graph.nodes:
        if id(node) in fused:
            _split(rw, node, fused[id(node)])
        elif id(node) not in splits:
            rw.keep(node)
    return rw.finish(), rw.rewrites


def _split(rw: Rewriter, linear: Node, sp: Node) -> None:
    x, w = rw.lookup(linear.inputs[0]), rw.lookup(linear.inputs[1])
    bias = rw.lookup(linear.inputs[2]) if len(linear.inputs) == 3 else None
    start, made = 0, []
    for part, size in zip(sp.outputs, sp.attrs["sizes"]):
        end = start + size
        ins = [x, _rows(rw, w, start, end, f"{w.name}.rows_{start}_{end}")]
        if bias is not None:
            ins.append(_rows(rw, bias, start, end, f"{bias.name}.rows_{start}_{end}"))
        out = rw.emit("linear", ins, dict(linear.attrs), name=part.name, loc=linear.loc,
                      layout=part.type.layout)
        rw.replace(part, out)
        made.append(out.name)
        start = end
    rw.record("split-fused-linear", [linear.output.name], made)


def _rows(rw: Rewriter, c: Constant, start: int, end: int, name: str) -> Constant:
    """Rows start:end of constant `c` (on the meta device by structure)."""
    t = TensorType((end - start,) + tuple(c.type.shape[1:]), c.type.dtype)
    return rw.computed_constant(name, lambda: rw.values(c)[start:end], t)


def _groups(graph: Graph) -> list[list[Node]]:
    """Linears reading one activation with constant weights (and biases, all or none) of one dtype
    and K, in groups of two or more whose results never meet in an elementwise op."""
    users = graph.users()
    by_input: dict[tuple, list[Node]] = {}
    for n in graph.nodes:
        if n.op.name != "linear" or not _constant_operands(n) or not _feeds_attention_only(n, users):
            continue
        w = n.inputs[1]
        key = (n.inputs[0].name, w.type.dtype, w.type.shape[1], len(n.inputs),
               n.inputs[2].type.dtype if len(n.inputs) == 3 else None, n.attrs)
        by_input.setdefault(key, []).append(n)
    groups = []
    for members in by_input.values():
        if len(members) < 2:
            continue
        reach = {id(n): _elementwise_reach(n.outputs, users) for n in members}
        parts: list[list[Node]] = []
        for n in members:   # in program order: each joins the first part it meets no one in
            for part in parts:
                if all(not (reach[id(n)] & reach[id(m)]) for m in part):
                    part.append(n)
                    break
            else:
                parts.append([n])
        groups += [p for p in parts if len(p) >= 2]
    return groups


def _constant_operands(n: Node) -> bool:
    w = n.inputs[1]
    return isinstance(w, Constant) and w.type.rank == 2 and all(isinstance(d, int) for d in w.type.shape) and \
        all(isinstance(v, Constant) and v.type.rank == 1 for v in n.inputs[2:])


def _feeds_attention_only(n: Node, users) -> bool:
    """`n`'s result, through views and elementwise ops (head reshapes, rotary embedding, a KV
    cache's concat), reaches attention (the op, or a matmul of attention written out) and
    nothing else that computes. A norm over each head's depth on the way (QK-norm: Qwen 3,
    Gemma 3), written out or not, is passed through too: the attention kernel computes it as it
    loads q and k. A norm over any other width (OLMo 2's and OLMoE's, over all heads) is not: it
    would be a kernel of its own, reading its slice through a copy, which costs more than the
    merge saves."""
    found, depths, normed = False, set(), set()
    for u in _readers(n.outputs, users, 4 * REACH):
        if u.op.name in ("attention", "matmul"):
            found = True
            depths.add(u.inputs[0].type.shape[-1])
        elif _row_statistic(u):
            normed.add(u.inputs[0].type.shape[-1])
        elif not _passes_on(u):
            return False
    return found and normed <= depths


def _elementwise_reach(values, users) -> set[int]:
    """The elementwise nodes `values` flow into within REACH steps (views passed through)."""
    return {id(u) for u in _readers(values, users, REACH) if u.op.category == Category.elementwise}


def _passes_on(u: Node) -> bool:
    return not u.regions and (u.op.category in (Category.elementwise, Category.movement, Category.broadcast)
                              or _row_statistic(u))


def _row_statistic(u: Node) -> bool:
    """A norm of the last axis, or a mean or sum over it alone, kept (a written-out norm's
    statistic)."""
    if u.op.name in ("rms_norm", "layer_norm"):
        return u.attrs["ndim"] == 1
    if u.op.name not in ("mean", "sum") or not u.inputs or u.inputs[0].type.rank == 0:
        return False
    rank = u.inputs[0].type.rank
    axes = u.attrs.get("axes") or tuple(range(rank))   # () reduces every axis
    return sorted({a % rank for a in axes}) == [rank - 1] and bool(u.attrs.get("keepdim", False))


def _readers(values, users, steps: int):
    """Each node reading `values` within `steps` steps, once; the walk goes on through
    elementwise ops and views only."""
    seen: set[int] = set()
    frontier = list(values)
    for _ in range(steps):
        nxt = []
        for v in frontier:
            for u in users.get(v.name, []):
                if id(u) not in seen:
                    seen.add(id(u))
                    yield u
                    if _passes_on(u):
                        nxt.extend(u.outputs)
        frontier = nxt


def _merge(rw: Rewriter, group: list[Node]) -> None:
    first = group[0]
    weights = [rw.lookup(n.inputs[1]) for n in group]
    w = _concatenated(rw, weights, f"{first.output.name}.merged_weight")
    ins = [rw.lookup(first.inputs[0]), w]
    if len(first.inputs) == 3:
        ins.append(_concatenated(rw, [rw.lookup(n.inputs[2]) for n in group], f"{first.output.name}.merged_bias"))
    wide = rw.emit("linear", ins, dict(first.attrs), name=rw.fresh_name(f"{first.output.name}_merged"),
                   loc=_loc(group))
    last, start = wide.type.rank - 1, 0
    for n, wt in zip(group, weights):
        end = start + wt.type.shape[0]
        part = rw.emit("slice", [wide], {"axis": last, "start": start, "end": end, "step": 1},
                       name=n.output.name, loc=n.loc, layout=n.output.type.layout)
        rw.replace(n.output, part)
        start = end
    rw.record("merge-parallel-linears", [n.output.name for n in group], [wide.name])


def _concatenated(rw: Rewriter, parts: list[Constant], name: str) -> Constant:
    """The constants side by side along axis 0 (on the meta device by structure)."""
    shape = (sum(p.type.shape[0] for p in parts),) + tuple(parts[0].type.shape[1:])
    return rw.computed_constant(name, lambda: np.concatenate([rw.values(p) for p in parts], axis=0),
                                TensorType(shape, parts[0].type.dtype))


def _loc(group: list[Node]) -> SourceLoc | None:
    """The first member's place, its module path naming every member's module
    (``...self_attn.q_proj+k_proj+v_proj``), so the kernel is named for all of them."""
    loc = group[0].loc
    mods = [n.loc.module for n in group if n.loc is not None and n.loc.module]
    if loc is None or len(mods) != len(group):
        return loc
    parent = os.path.commonprefix([m.split(".") for m in mods])
    tails = ["/".join(m.split(".")[len(parent):]) or m for m in mods]
    return SourceLoc(loc.file, loc.line, ".".join(parent + ["+".join(tails)]))

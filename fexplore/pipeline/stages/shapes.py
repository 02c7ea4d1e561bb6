"""shapes: shape inference to a fixed point, with symbolic dims simplified under their ranges;
and ``specialize``, which binds symbolic dims to buckets (seq in {128, 512}) and yields one static
graph per bucket, the way NPU serving stacks compile prefill/decode buckets.
"""

from __future__ import annotations

import itertools
from typing import Mapping, Sequence

import sympy

from fexplore.ir import Attrs, Graph, Node, TensorType, Value, symbol

from ..stage import StageResult
from .rewrite import Rewriter


def simplify_dim(d, ranges: Mapping[str, tuple[int, int | None]]):
    """Simplify a symbolic dim using the symbols' ranges: ``Min(seq, 64)`` is ``seq`` when
    seq <= 63. Min/Max are decided by bounding the difference of their arguments at the corners
    of the range box (exact for the affine dims shapes are made of)."""
    if isinstance(d, int):
        return d
    d = sympy.simplify(d)

    def decide(expr):
        keep = list(expr.args)
        changed = True
        while changed and len(keep) > 1:
            changed = False
            for a, b in itertools.permutations(keep, 2):
                lo, hi = _bounds(a - b, ranges)
                # Min drops an argument never below another; Max one never above another
                if (lo is not None and lo >= 0) if expr.func is sympy.Min else \
                        (hi is not None and hi <= 0):
                    keep.remove(a)
                    changed = True
                    break
        return keep[0] if len(keep) == 1 else expr.func(*keep)

    out = d.replace(lambda e: isinstance(e, (sympy.Min, sympy.Max)), decide)
    out = sympy.simplify(out)
    return int(out) if out.is_Integer else out


def _bounds(expr, ranges):
    syms = sorted(expr.free_symbols, key=lambda s: s.name)
    if not syms:
        v = int(expr) if expr.is_Integer else float(expr)
        return v, v
    if len(syms) > 4 or any(ranges.get(s.name, (0, None))[1] is None for s in syms):
        return None, None
    values = []
    for corner in itertools.product(*[ranges[s.name] for s in syms]):
        values.append(expr.xreplace(dict(zip(syms, corner))))
    if not all(v.is_number for v in values):
        return None, None
    return min(values), max(values)


def shapes(graph: Graph, options) -> StageResult:
    """Re-infer every type (through regions), simplifying symbolic dims, until nothing changes."""
    simplified = 0
    for _ in range(10):
        new, n = _propagate(graph, graph.symbols)
        simplified += n
        if new == graph:
            break
        graph = new
    dynamic = sum(1 for n in graph.walk() for v in n.outputs if not v.type.is_static)
    total = sum(len(n.outputs) for n in graph.walk())
    stats = {"dims_simplified": simplified, "dynamic_values": dynamic,
             "static_values": total - dynamic}
    return StageResult(graph, stats, [], f"{dynamic} symbolic values, {simplified} dims simplified")


def _propagate(graph: Graph, ranges) -> tuple[Graph, int]:
    rw = Rewriter(graph)
    count = 0
    for node in graph.nodes:
        ins = [rw.lookup(v) for v in node.inputs]
        regions = [_propagate(r, ranges)[0] for r in node.regions]
        attrs = Attrs({k: _simplify_attr(v, ranges) for k, v in node.attrs.items()})
        types = node.op.infer_types([v.type for v in ins], attrs, regions)
        outs = []
        for old, t in zip(node.outputs, types):
            shape = tuple(simplify_dim(d, ranges) for d in t.shape)
            t = TensorType(shape, t.dtype, old.type.layout)
            if shape != t.shape or t != old.type:
                count += 1
            new = old if t == old.type else Value(old.name, t)
            rw.replace(old, new)
            outs.append(new)
        if all(a is b for a, b in zip(ins, node.inputs)) and outs == list(node.outputs) and \
                attrs == node.attrs and all(a is b for a, b in zip(regions, node.regions)):
            rw.nodes.append(node)
        else:
            rw.nodes.append(Node(node.op, ins, attrs, outs, node.loc, regions))
    return rw.finish(prune=False), count


def _simplify_attr(v, ranges):
    if isinstance(v, tuple):
        return tuple(_simplify_attr(x, ranges) for x in v)
    if isinstance(v, sympy.Expr):
        return simplify_dim(v, ranges)
    return v


# -- bucket specialization -------------------------------------------------------------------

def specialize(graph: Graph, **values: int) -> Graph:
    """The static graph for given symbol values: ``specialize(g, seq=128)``."""
    for name, val in values.items():
        if name not in graph.symbols:
            raise KeyError(f"@{graph.name} has no symbolic dim {name!r}; it has "
                           f"{sorted(graph.symbols)}")
        lo, hi = graph.symbols[name]
        if val < lo or (hi is not None and val > hi):
            from fexplore.errors import ConfigError

            raise ConfigError(f"bucket {name}={val} is outside its range [{lo}, {hi}]")
    bindings = {symbol(k): int(v) for k, v in values.items()}
    g = _substitute(graph, bindings)
    g.symbols = {k: r for k, r in graph.symbols.items() if k not in values}
    return g


def specialize_buckets(graph: Graph, buckets: Mapping[str, Sequence[int]]) -> dict:
    """One static graph per combination of bucket values: ``{(("seq", 128),): graph, ...}``."""
    names = sorted(buckets)
    out = {}
    for combo in itertools.product(*[buckets[n] for n in names]):
        key = tuple(zip(names, combo))
        out[key] = specialize(graph, **dict(key))
    return out


def _substitute(graph: Graph, bindings) -> Graph:
    def sub_type(t: TensorType) -> TensorType:
        shape = tuple(d if isinstance(d, int) else sympy.sympify(d).xreplace(bindings)
                      for d in t.shape)
        return TensorType(shape, t.dtype, t.layout)

    inputs = [Value(v.name, sub_type(v.type)) for v in graph.inputs]
    g = Graph(graph.name, inputs, list(graph.constants), list(graph.nodes),
              list(graph.outputs), dict(graph.symbols))
    rw = Rewriter(g)
    for old, new in zip(graph.inputs, inputs):
        rw.replace(old, new)
    for node in graph.nodes:
        ins = [rw.lookup(v) for v in node.inputs]
        attrs = {k: _bind_attr(v, bindings) for k, v in node.attrs.items()}
        regions = [_substitute(r, bindings) for r in node.regions]
        rw.rebuild(node, ins, attrs=attrs, regions=regions)
    return rw.finish(prune=False)


def _bind_attr(v, bindings):
    if isinstance(v, tuple):
        return tuple(_bind_attr(x, bindings) for x in v)
    if isinstance(v, sympy.Expr):
        r = sympy.simplify(sympy.sympify(v).xreplace(bindings))
        return int(r) if r.is_Integer else r
    return v

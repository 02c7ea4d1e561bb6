"""Graphs and stage records built by hand for the view tests: small, fast, and with fused regions
whatever the pipeline's stages can do today."""

from __future__ import annotations

import functools
import warnings

from fexplore.errors import SourceLoc
from fexplore.ir import Constant, DType, Graph, Node, TensorType, Value, get_op, verify


def f32(*shape):
    return TensorType(shape, DType.f32)


def wrap_region(g: Graph, names: list[str], kind: str = "fused", body_name: str | None = None) -> Graph:
    """A copy of ``g`` with the nodes defining ``names`` (consecutive, in order) moved into one
    ``region`` node, the way the fusion stage builds them: the body is closed (everything it reads,
    constants included, comes in as region inputs) and keeps the value names it had outside."""
    picked = [n for n in g.nodes if n.outputs and n.outputs[0].name in names]
    assert [n.outputs[0].name for n in picked] == list(names), "names must be nodes of g, in order"
    first = g.nodes.index(picked[0])
    assert g.nodes[first:first + len(picked)] == picked, "the nodes must be consecutive"
    inside = {v.name for n in picked for v in n.outputs}
    operands: list[Value] = []
    for n in picked:
        for v in n.inputs:
            if v.name not in inside and all(v.name != o.name for o in operands):
                operands.append(v)
    later = {v.name for n in g.nodes[first + len(picked):] for v in n.inputs} | \
        {v.name for v in g.outputs}
    results = [v for n in picked for v in n.outputs if v.name in later]
    body = Graph(body_name or f"{kind}_{picked[0].name}", [Value(v.name, v.type) for v in operands],
                 [], list(picked), list(results))
    region = Node("region", operands, {"kind": kind}, results, picked[-1].loc, [body])
    nodes = g.nodes[:first] + [region] + g.nodes[first + len(picked):]
    out = Graph(g.name, list(g.inputs), list(g.constants), nodes, list(g.outputs), dict(g.symbols))
    verify(out)
    return out


def node(op: str, inputs, outputs, loc=None, **attrs) -> Node:
    """A node with every attribute filled in (defaults included), as the verifier wants."""
    return Node(op, inputs, get_op(op).complete_attrs(attrs), outputs, loc)


def small_graph() -> Graph:
    """x -> linear(w, b) -> gelu -> add(x) -> relu: four ops with locations and one parameter."""
    import numpy as np

    loc = SourceLoc(__file__, 20, "block.mlp")
    x = Value("x", f32(2, 8))
    w = Constant("block.mlp.fc.weight", f32(8, 8), np.eye(8, dtype=np.float32),
                 source="block.mlp.fc.weight")
    b = Constant("block.mlp.fc.bias", f32(8), np.zeros(8, dtype=np.float32), source="block.mlp.fc.bias")
    h, a, s, y = (Value(n, f32(2, 8)) for n in ("fc", "act", "res", "out"))
    nodes = [node("linear", [x, w, b], [h], SourceLoc(__file__, 21, "block.mlp.fc")),
             node("gelu", [h], [a], loc, approximate="none"),
             node("add", [a, x], [s], SourceLoc(__file__, 23, "block")),
             node("relu", [s], [y], SourceLoc(__file__, 24, "block"))]
    g = Graph("forward", [x], [w, b], nodes, [y])
    verify(g)
    return g


@functools.lru_cache(maxsize=None)
def compiled_gpt():
    """The GPT-style zoo model explored to the end (every stage the pipeline has today); made
    once per test session, so treat it as read-only."""
    import fexplore
    from fexplore.models import ZOO

    model, inputs = ZOO["gpt"]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ex = fexplore.explore(model, inputs)
        ex.run_all(progress=False)
    return ex

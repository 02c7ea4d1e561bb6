"""Copying a region's body into another graph (a cond whose branch is decided, an unrolled map)."""

from __future__ import annotations

from typing import Sequence

from .graph import Constant, Graph, Node, Value, unique_name


def inline_body(body: Graph, ins: Sequence[Value], taken: set[str], loc=None, sep: str = ".",
                prefix: str = "") -> tuple[list[Constant], list[Node], list[Value]]:
    """Copies of ``body``'s constants and nodes, reading ``ins`` for its inputs, each name
    ``prefix`` + its own made unique among ``taken`` (and added to it); a node without a source
    line of its own takes ``loc``. Returns (constants, nodes, the values standing for the body's outputs). Node
    objects are new, ops, attrs and nested regions shared (regions are closed graphs)."""
    env: dict[str, Value] = {v.name: x for v, x in zip(body.inputs, ins)}
    constants = []
    for c in body.constants:
        env[c.name] = Constant(unique_name(prefix + c.name, taken, sep), c.type, c.payload, source=c.source,
                               digest=c.digest)
        constants.append(env[c.name])
    nodes = []
    for n in body.nodes:
        outs = [Value(unique_name(prefix + v.name, taken, sep), v.type) for v in n.outputs]
        nodes.append(Node(n.op, [env[v.name] for v in n.inputs], n.attrs, outs, n.loc or loc, n.regions))
        env.update((v.name, new) for v, new in zip(n.outputs, outs))
    return constants, nodes, [env[v.name] for v in body.outputs]

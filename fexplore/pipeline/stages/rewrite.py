"""The one rewrite engine the graph stages share.

A stage walks its input graph in order and, for each node, either keeps it (re-typed if its inputs
changed), replaces its results with other values, or emits new nodes. Nothing is edited in place:
the Rewriter builds a new graph, reusing every untouched Node object, so the input snapshot stays
valid and cheap.

Names stay stable: a kept node keeps its result names; a node that replaces another takes the
replaced value's name, so diffs between stages line up.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from fexplore.errors import SourceLoc
from fexplore.ir import Attrs, Constant, DType, Graph, Node, TensorType, Value, get_op
from fexplore.ir.graph import unique_name
from fexplore.ir.inline import inline_body

from ..stage import Rewrite


class NoValues(Exception):
    """A constant read for its values has none (a meta-device weight)."""


class Rewriter:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.nodes: list[Node] = []
        self.constants: list[Constant] = list(graph.constants)
        self.rewrites: list[Rewrite] = []
        self._subst: dict[str, Value] = {}
        self._users: dict[str, list[Node]] | None = None
        self._names = {v.name for v in graph.inputs} | {c.name for c in graph.constants} | \
            {v.name for n in graph.nodes for v in n.outputs}

    # -- values ------------------------------------------------------------------------------

    def lookup(self, v: Value) -> Value:
        while v.name in self._subst and self._subst[v.name] is not v:
            v = self._subst[v.name]
        return v

    def replace(self, old: Value, new: Value) -> None:
        """Every later use of ``old`` reads ``new`` instead."""
        if old.name != new.name or old is not new:
            self._subst[old.name] = new

    def readers(self, name: str) -> int:
        """How many nodes of the input graph read value `name` (a graph output counts as one)."""
        return len(self.users(name)) + sum(v.name == name for v in self.graph.outputs)

    def users(self, name: str) -> list[Node]:
        """The nodes of the input graph that read value `name` (once per operand it is)."""
        if self._users is None:
            self._users = self.graph.users()
        return self._users.get(name, [])

    def fresh_name(self, base: str) -> str:
        return unique_name(base, self._names)

    def constant(self, name: str, payload: np.ndarray | None, *, source: str | None = None,
                 type: TensorType | None = None, digest: str | None = None) -> Constant:
        """A new constant; ``payload=None`` (a meta-device weight) needs its ``type`` and a digest."""
        t = type or TensorType(payload.shape, DType.from_numpy(payload.dtype))
        c = Constant(name if name not in {x.name for x in self.constants} else
                     self.fresh_name(name), t, payload, source=source, digest=digest)
        self._names.add(c.name)
        self.constants.append(c)
        return c

    def values(self, v: Value) -> np.ndarray:
        """The payload of constant ``v`` in float64; raises `NoValues` for a meta-device weight."""
        payload = self.lookup(v).payload
        if payload is None:
            raise NoValues
        return payload.astype(np.float64)

    def computed_constant(self, name: str, compute, type: TensorType) -> Constant:
        """A constant computed from others at compile time by ``compute()`` (reading them with
        `values`), or, when any of them is a meta-device weight without values, the same constant
        by structure alone: a ``meta-`` digest, which later stages treat as the weights are (the
        precision stage narrows it at compile time)."""
        try:
            payload = compute()
        except NoValues:
            return self.constant(name, None, type=type, digest=f"meta-folded-{name}")
        return self.constant(name, np.asarray(payload).astype(type.dtype.numpy).reshape(type.shape), type=type)

    # -- nodes -------------------------------------------------------------------------------

    def keep(self, node: Node) -> Node:
        """Keep ``node``, reading its inputs through the substitutions; re-type it if needed."""
        ins = [self.lookup(v) for v in node.inputs]
        if all(a is b for a, b in zip(ins, node.inputs)):
            self.nodes.append(node)
            return node
        return self.rebuild(node, ins)

    def rebuild(self, node: Node, ins: list[Value], attrs=None, regions=None) -> Node:
        attrs = node.attrs if attrs is None else Attrs(attrs)
        regions = node.regions if regions is None else regions
        types = node.op.infer_types([v.type for v in ins], attrs, regions)
        outs = []
        for old, t in zip(node.outputs, types):
            if old.type.layout is not None and t.layout is None:
                t = TensorType(t.shape, t.dtype, old.type.layout)
            new = old if old.type == t else Value(old.name, t)
            if new is not old:
                self.replace(old, new)
            outs.append(new)
        n = Node(node.op, ins, attrs, outs, node.loc, regions)
        self.nodes.append(n)
        return n

    def emit(self, op: str, inputs: Iterable[Value], attrs: dict | None = None, *, name: str,
             loc: SourceLoc | None = None, layout=None) -> Value:
        """A new single-result node; ``name`` should come from the value it stands for."""
        opdef = get_op(op)
        ins = [self.lookup(v) for v in inputs]
        full = Attrs(opdef.complete_attrs(dict(attrs or {})))
        (t,) = opdef.infer_types([v.type for v in ins], full)
        if layout is not None:
            t = TensorType(t.shape, t.dtype, layout)
        out = Value(name, t)
        self._names.add(name)
        self.nodes.append(Node(opdef, ins, full, [out], loc))
        return out

    def inline(self, body: Graph, ins: list[Value], loc: SourceLoc | None = None) -> list[Value]:
        """``body``'s nodes (a region's) in this graph, reading ``ins`` for its inputs; returns
        what stands for its outputs (``ir.inline.inline_body``: names made unique here)."""
        constants, nodes, outs = inline_body(body, [self.lookup(x) for x in ins], self._names, loc)
        self.constants += constants
        self.nodes += nodes
        return outs

    def record(self, rule: str, nodes: Iterable[str], result: Iterable[str] = ()) -> None:
        self.rewrites.append(Rewrite(rule, tuple(nodes), tuple(result)))

    # -- the result --------------------------------------------------------------------------

    def finish(self, outputs: list[Value] | None = None, *, prune: bool = True) -> Graph:
        outs = [self.lookup(v) for v in (outputs if outputs is not None else self.graph.outputs)]
        consts = self.constants
        if prune:  # constants no node reads any more (folded away, deduplicated)
            used = {v.name for n in self.nodes for v in n.inputs} | {v.name for v in outs}
            consts = [c for c in consts if c.name in used]
        return Graph(self.graph.name, list(self.graph.inputs), consts, self.nodes, outs,
                     dict(self.graph.symbols))


def map_regions(graph: Graph, fn) -> Graph:
    """Apply a graph -> graph function to every region body, recursively, and to ``graph``."""
    if not any(n.regions for n in graph.nodes):
        return fn(graph)
    rw = Rewriter(graph)
    for n in graph.nodes:
        if n.regions:
            rw.rebuild(n, [rw.lookup(v) for v in n.inputs],
                       regions=[map_regions(r, fn) for r in n.regions])
        else:
            rw.keep(n)
    return fn(rw.finish(prune=False))

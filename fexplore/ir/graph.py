"""The IR core: Value, Constant, Node, Graph.

Typed SSA. Values and nodes are immutable, and a value does not point at its producer, so a stage
can build a new graph that reuses every node it did not touch: snapshots are cheap, and the graph
a notebook cell is holding never changes under it.

Names are stable: they come from provenance (torch.export's node names, parameter names), never
from a per-print counter, so the diff between two stages shows real changes only.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping

import numpy as np
from fexplore.errors import SourceLoc

from .types import TensorType


def unique_name(base: str, taken: set[str], sep: str = ".") -> str:
    """``base``, or ``base.1``, ``base.2``... whichever is free; the result is added to ``taken``."""
    name, k = base, 1
    while name in taken:
        name, k = f"{base}{sep}{k}", k + 1
    taken.add(name)
    return name


class Value:
    """An SSA value: a graph input, a constant, or a node result."""

    __slots__ = ("name", "type")

    def __init__(self, name: str, type: TensorType):
        self.name = name
        self.type = type

    def __repr__(self) -> str:
        return f"%{self.name}: {self.type}"


class Constant(Value):
    """A named constant. ``source`` names the model parameter/buffer it came from (None for folded or
    literal constants). The numpy payload is shared with the model, never copied, and made read-only;
    a graph parsed from text has ``payload=None`` and only the digest until payloads are bound."""

    __slots__ = ("source", "payload", "_digest")

    def __init__(self, name: str, type: TensorType, payload: np.ndarray | None, *,
                 source: str | None = None, digest: str | None = None):
        super().__init__(name, type)
        self.source = source
        if payload is not None:
            payload = np.asarray(payload)
            if payload.flags.writeable:
                payload = payload.view()  # our own read-only view; the caller's array is untouched
                payload.flags.writeable = False
        self.payload = payload
        self._digest = digest

    @property
    def digest(self) -> str:
        """A content hash (16 hex digits) of the payload: what the text form stores for big constants."""
        if self._digest is None:
            assert self.payload is not None
            data = np.ascontiguousarray(self.payload)
            h = hashlib.blake2b(data.view(np.uint8).reshape(-1) if data.size else b"", digest_size=8)
            h.update(str(data.shape).encode())
            self._digest = h.hexdigest()
        return self._digest

    @property
    def is_inline(self) -> bool:
        """Small constants are written out in the text form; big ones by name and digest."""
        return self.source is None and isinstance(self.type.numel, int) and self.type.numel <= 16


class Attrs(Mapping[str, Any]):
    """Immutable, typed node attributes (the OpDef's schema says which names and kinds)."""

    __slots__ = ("_items", "_hash")

    def __init__(self, items: Mapping[str, Any] | Iterable[tuple[str, Any]] = ()):
        d = dict(items)
        self._items = tuple(sorted(d.items()))
        self._hash = None

    def __getitem__(self, k):
        for name, v in self._items:
            if name == k:
                return v
        raise KeyError(k)

    def __iter__(self):
        return (k for k, _ in self._items)

    def __len__(self):
        return len(self._items)

    def __eq__(self, other):
        if not isinstance(other, Attrs):
            return NotImplemented
        return all(k1 == k2 and attr_equal(v1, v2)
                   for (k1, v1), (k2, v2) in zip(self._items, other._items)) \
            and len(self._items) == len(other._items)

    def __hash__(self):
        if self._hash is None:
            self._hash = hash(tuple((k, _attr_key(v)) for k, v in self._items))
        return self._hash

    def replace(self, **changes) -> "Attrs":
        d = dict(self._items)
        d.update(changes)
        return Attrs(d)

    def __repr__(self):
        return "{" + ", ".join(f"{k}={v!r}" for k, v in self._items) + "}"


def _attr_key(v):
    # The kind is part of the key: 1 and 1.0 and True are three different attribute values.
    if isinstance(v, tuple):
        return ("t", tuple(_attr_key(x) for x in v))
    if isinstance(v, float) and v != v:
        return ("f", "nan")
    return (type(v).__name__, v)


def attr_equal(a, b) -> bool:
    return _attr_key(a) == _attr_key(b)


class Node:
    """One operation: ``outputs = op(inputs) {attrs}``, with the user's source location and, for
    region ops (fused regions, ``cond``), the subgraphs it owns."""

    __slots__ = ("op", "inputs", "attrs", "outputs", "loc", "regions")

    def __init__(self, op, inputs: Iterable[Value], attrs: Attrs | Mapping = (),
                 outputs: Iterable[Value] = (), loc: SourceLoc | None = None,
                 regions: Iterable["Graph"] = ()):
        from .opset import get_op  # the registry lives beside the op definitions

        self.op = get_op(op) if isinstance(op, str) else op
        self.inputs = tuple(inputs)
        if not isinstance(attrs, Attrs):  # hand-built: fill in the defaults the OpDef declares
            attrs = Attrs({**self.op.defaults(), **dict(attrs)})
        self.attrs = attrs
        self.outputs = tuple(outputs)
        self.loc = loc
        self.regions = tuple(regions)

    @property
    def name(self) -> str:
        return self.outputs[0].name if self.outputs else f"<{self.op.name}>"

    @property
    def output(self) -> Value:
        assert len(self.outputs) == 1, f"{self.op.name} has {len(self.outputs)} outputs"
        return self.outputs[0]

    def __repr__(self) -> str:
        outs = ", ".join(f"%{v.name}" for v in self.outputs)
        ins = ", ".join(f"%{v.name}" for v in self.inputs)
        return f"<Node {outs} = {self.op.name}({ins})>"


@dataclass
class Graph:
    """A typed SSA program. Regions are Graphs too: closed (all they use comes in as inputs) and
    handled by the same printer, verifier and interpreter.

    ``symbols`` maps each symbolic dim's name to its inclusive range ``(lo, hi)``; ``hi`` may be
    None for unbounded.
    """

    name: str
    inputs: list[Value]
    constants: list[Constant]
    nodes: list[Node]
    outputs: list[Value]
    symbols: dict[str, tuple[int, int | None]] = field(default_factory=dict)

    # -- queries -----------------------------------------------------------------------------

    def __str__(self) -> str:
        from .printer import print_graph

        return print_graph(self)

    def __repr__(self) -> str:
        return (f"<Graph @{self.name}: {len(self.inputs)} inputs, {len(self.constants)} constants, "
                f"{len(self.nodes)} nodes, {len(self.outputs)} outputs>")

    def _repr_html_(self) -> str:
        try:
            from fexplore.viz.graph_view import graph_html
        except ImportError:  # the explorer views land with the viz package
            import html

            return f"<pre>{html.escape(str(self))}</pre>"
        return graph_html(self)

    def view(self, **options):
        """A graph picture (``expand="layers.0"``, ``collapse=``, ``depth=``, ``max_nodes=``);
        rendering lives in ``fexplore.viz``, imported only when asked for."""
        from fexplore.viz.graph_view import GraphView

        return GraphView(self, **options)

    def walk(self) -> Iterator[Node]:
        """Every node, including those inside regions (depth first)."""
        for n in self.nodes:
            yield n
            for r in n.regions:
                yield from r.walk()

    def producers(self) -> dict[str, Node]:
        return {v.name: n for n in self.nodes for v in n.outputs}

    def users(self) -> dict[str, list[Node]]:
        out: dict[str, list[Node]] = {}
        for n in self.nodes:
            for v in n.inputs:
                out.setdefault(v.name, []).append(n)
        return out

    def value(self, name: str) -> Value:
        for v in self.inputs:
            if v.name == name:
                return v
        for c in self.constants:
            if c.name == name:
                return c
        for n in self.nodes:
            for v in n.outputs:
                if v.name == name:
                    return v
        raise KeyError(name)

    @property
    def payloads(self) -> dict[str, np.ndarray]:
        return {c.name: c.payload for c in self.constants if c.payload is not None}

    def bind(self, payloads: Mapping[str, np.ndarray]) -> "Graph":
        """A copy whose unbound constants (as parsed from text) take their payloads by name."""
        consts = []
        for c in self.constants:
            if c.payload is None and c.name in payloads:
                p = np.asarray(payloads[c.name])
                c = Constant(c.name, c.type, p, source=c.source, digest=None)
            consts.append(c)
        return Graph(self.name, list(self.inputs), consts, list(self.nodes), list(self.outputs),
                     dict(self.symbols))

    def op_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for n in self.walk():
            out[n.op.name] = out.get(n.op.name, 0) + 1
        return out

    # -- structural equality -----------------------------------------------------------------

    def __eq__(self, other) -> bool:
        if not isinstance(other, Graph):
            return NotImplemented
        return graph_diff(self, other) is None

    __hash__ = None  # mutable container


def _value_sig(v: Value):
    return (v.name, v.type)


def graph_diff(a: Graph, b: Graph) -> str | None:
    """The first structural difference between two graphs, or None when they are equal.
    Constants compare by name, type, source and payload digest."""
    if a.name != b.name:
        return f"graph name {a.name!r} != {b.name!r}"
    if a.symbols != b.symbols:
        return f"symbols {a.symbols} != {b.symbols}"
    if [_value_sig(v) for v in a.inputs] != [_value_sig(v) for v in b.inputs]:
        return "inputs differ"
    if len(a.constants) != len(b.constants):
        return "constant count differs"
    for x, y in zip(a.constants, b.constants):
        if x is y:  # shared between snapshots: equal without hashing the payload
            continue
        if (_value_sig(x), x.source, x.digest) != (_value_sig(y), y.source, y.digest):
            return f"constant %{x.name} differs from %{y.name}"
    if len(a.nodes) != len(b.nodes):
        return f"node count {len(a.nodes)} != {len(b.nodes)}"
    for x, y in zip(a.nodes, b.nodes):
        if x is y:
            continue
        if x.op.name != y.op.name:
            return f"node %{x.name}: op {x.op.name} != {y.op.name}"
        if [v.name for v in x.inputs] != [v.name for v in y.inputs]:
            return f"node %{x.name}: inputs differ"
        if [_value_sig(v) for v in x.outputs] != [_value_sig(v) for v in y.outputs]:
            return f"node %{x.name}: outputs differ"
        if x.attrs != y.attrs:
            return f"node %{x.name}: attrs {x.attrs} != {y.attrs}"
        if x.loc != y.loc:
            return f"node %{x.name}: loc {x.loc} != {y.loc}"
        if len(x.regions) != len(y.regions):
            return f"node %{x.name}: region count differs"
        for ra, rb in zip(x.regions, y.regions):
            d = graph_diff(ra, rb)
            if d:
                return f"node %{x.name}, region @{ra.name}: {d}"
    if [v.name for v in a.outputs] != [v.name for v in b.outputs]:
        return "outputs differ"
    return None

"""What every generator needs: the node's body as a graph, its inputs sorted into kernel
parameters and literals, the kernel's name and its header comment."""

from __future__ import annotations

import re
from dataclasses import dataclass

from fexplore.ir import Graph, Node, Value

from .generated import Param
from .source import Names, fl_dtype, scalar_constant, where_from


def body_of(node: Node) -> Graph:
    """A region's body; a plain op as a one-node body over its own inputs."""
    if node.op.name == "region":
        return node.regions[0]
    if node.regions:
        from .errors import UnsupportedRegionError

        raise UnsupportedRegionError(node.op.name, node.name, "an op with subgraphs", loc=node.loc)
    return Graph(f"op_{node.name}", list(node.inputs), [], [node], list(node.outputs), {})


def region_label(node: Node) -> str:
    return f"region {node.regions[0].name}" if node.op.name == "region" else f"op %{node.name}"


def kernel_name(node: Node) -> str:
    base = node.loc.module if node.loc is not None and node.loc.module else \
        (node.regions[0].name if node.op.name == "region" else f"{node.op.name}_{node.name}")
    name = re.sub(r"[^0-9A-Za-z_]+", "_", base).strip("_").lower() or "kernel"
    return name if not name[0].isdigit() else f"k_{name}"


@dataclass
class Inputs:
    """The body's inputs: a literal for each scalar constant, the rest become parameters."""

    literals: dict[str, str]          # body input name -> Python literal
    index: dict[str, int]             # body input name -> node input index

    @classmethod
    def of(cls, node: Node, body: Graph) -> "Inputs":
        literals, index = {}, {}
        for i, (outer, inner) in enumerate(zip(node.inputs, body.inputs)):
            index[inner.name] = i
            lit = scalar_constant(outer)
            if lit is not None:
                literals[inner.name] = lit
        return cls(literals, index)


class Signature:
    """A kernel's parameters as a generator adds them: the ``Param`` records (which node input
    feeds each), the annotations of its ``def`` line (``x: fl.f32["M", "K"]``) and the rows of
    its header comment."""

    def __init__(self, names: Names, inputs: Inputs):
        self.names, self.inputs = names, inputs
        self.params: list[Param] = []
        self.annotations: list[str] = []
        self.header: list[tuple[str, Value, tuple]] = []

    def add(self, v: Value, shape, spec) -> str:
        """A parameter for ``v`` of the given (viewed) shape; ``spec`` spells its axes."""
        pname = self.names.new(v.name)
        self.params.append(Param(pname, self.inputs.index[v.name], tuple(shape)))
        self.annotations.append(f"{pname}: {fl_dtype(v.type.dtype)}[{', '.join(spec)}]")
        self.header.append((pname, v, tuple(shape)))
        return pname


def header(w, node: Node, body: Graph, kind: str, params: list[tuple[str, Value, tuple]],
           literals: dict[str, str]) -> None:
    ops = " -> ".join(n.op.name for n in body.nodes)
    w(f"# {region_label(node)} ({node.attrs['kind'] if node.op.name == 'region' else 'op'}), "
      f"made into a {kind} kernel: {ops}")
    w(f"# from {where_from(node)}")
    for pname, v, shape in params:
        view = "" if tuple(shape) == tuple(v.type.shape) else f", viewed as {list(shape)}"
        w(f"#   {pname} = %{v.name}: {v.type}{view}")
    for name, lit in literals.items():
        w(f"#   %{name} = {lit} (a constant, written in)")


def param_name(names: Names, v: Value) -> str:
    return names.new(v.name)

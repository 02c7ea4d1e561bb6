"""DRAM traffic estimates: what each kernel moves, before and after fusion, against the
compulsory traffic (weights, inputs and outputs each moved once).

Every node outside a region is its own kernel and moves what its OpDef's cost says (views move
nothing); a region moves its operands in and its results out, once. Symbolic dims are counted at
the top of their range (the bucket that costs most).
"""

from __future__ import annotations

import sympy

from fexplore.ir import Constant, Graph, Node, TensorType, symbol


def _at_top(d, symbols) -> int:
    if isinstance(d, int):
        return d
    subs = {symbol(k): (hi if hi is not None else lo) for k, (lo, hi) in symbols.items()}
    return int(sympy.sympify(d).xreplace(subs))


def type_bytes(t: TensorType, symbols) -> int:
    return _at_top(t.nbytes(), symbols)


def node_bytes(n: Node, symbols) -> int:
    cost = n.op.cost([v.type for v in n.inputs], [v.type for v in n.outputs], n.attrs)
    return _at_top(cost.bytes, symbols)


def graph_traffic(g: Graph) -> int:
    """Bytes crossing kernel boundaries when each top-level node is one kernel."""
    return sum(node_bytes(n, g.symbols) for n in g.nodes)


def compulsory_traffic(g: Graph) -> int:
    """Weights (the constants nodes read), inputs and outputs, each moved once."""
    used = {v.name for n in g.nodes for v in n.inputs}
    total = sum(type_bytes(c.type, g.symbols) for c in g.constants if c.name in used)
    total += sum(type_bytes(v.type, g.symbols) for v in g.inputs)
    total += sum(type_bytes(v.type, g.symbols) for v in g.outputs
                 if not isinstance(v, Constant))
    return total

"""The IR: types, Graph/Node/Value, the opset (one OpDef per op), printer, parser, verifier and the
reference interpreter. Imports nothing else of fexplore but ``fexplore.errors``."""

from .graph import Attrs, Constant, Graph, Node, Value, graph_diff
from .interpreter import bind_symbols, evaluate_node, evaluate_op, run
from .opdef import AttrSpec, Category, Cost, OpDef
from .opset import all_ops, get_op, register
from .parser import parse
from .printer import print_graph
from .types import DType, Layout, TensorType, symbol
from .verifier import verify

__all__ = [
    "Attrs", "AttrSpec", "Category", "Constant", "Cost", "DType", "Graph", "Layout", "Node",
    "OpDef", "TensorType", "Value", "all_ops", "bind_symbols", "evaluate_node", "evaluate_op",
    "get_op", "graph_diff", "parse", "print_graph", "register", "run", "symbol", "verify",
]

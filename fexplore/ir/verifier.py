"""The structural verifier: definitions before uses, every use defined, attributes complete and of
the right kinds, stored types equal to re-inferred types, regions well formed, symbols declared.

A failure shows a window of the IR around the bad node, the user's source line for it, and a hint.
"""

from __future__ import annotations

from fexplore.errors import VerificationError

from .graph import Attrs, Graph, Node
from .printer import node_str
from .types import DType


def verify(g: Graph, *, stage: str | None = None) -> None:
    """Raise VerificationError on the first broken invariant; return None when ``g`` is valid."""
    _verify_graph(g, g, set(g.symbols), stage)


def _fail(top: Graph, g: Graph, idx: int | None, msg: str, stage: str | None, hint: str):
    where = f" after stage '{stage}'" if stage else ""
    detail = _window(g, idx) if idx is not None else None
    loc = g.nodes[idx].loc if idx is not None and idx < len(g.nodes) else None
    raise VerificationError(f"invalid IR{where} in @{g.name}: {msg}", loc=loc, hint=hint,
                            detail=detail)


def _window(g: Graph, idx: int, radius: int = 3) -> str:
    lines = []
    for i in range(max(0, idx - radius), min(len(g.nodes), idx + radius + 1)):
        mark = ">>" if i == idx else "  "
        lines.append(f"  {mark} {node_str(g.nodes[i])}")
    return "\n".join(lines)


def _verify_graph(top: Graph, g: Graph, symbols: set[str], stage: str | None) -> None:
    defined: dict[str, object] = {}

    def define(name, idx, what):
        if name in defined:
            _fail(top, g, idx, f"%{name} ({what}) is defined twice", stage,
                  "every value needs a unique name within its graph")
        defined[name] = what

    for v in g.inputs:
        define(v.name, None, "input")
        _check_symbols(top, g, None, v.type, symbols, stage)
    for c in g.constants:
        define(c.name, None, "constant")
        if c.payload is not None:
            if tuple(c.payload.shape) != c.type.shape or \
                    DType.from_numpy(c.payload.dtype) != c.type.dtype:
                _fail(top, g, None, f"constant %{c.name} holds {c.payload.dtype}{list(c.payload.shape)}"
                      f" but is typed {c.type}", stage, "the payload must match the type")

    for idx, node in enumerate(g.nodes):
        _verify_node(top, g, idx, node, defined, symbols, stage)
        for v in node.outputs:
            define(v.name, idx, node.op.name)
            _check_symbols(top, g, idx, v.type, symbols, stage)

    for v in g.outputs:
        if v.name not in defined:
            _fail(top, g, len(g.nodes) - 1 if g.nodes else None, f"output %{v.name} is not defined",
                  stage, "return only values the graph defines")


def _verify_node(top, g, idx, node: Node, defined, symbols, stage):
    op = node.op
    for v in node.inputs:
        if v.name not in defined:
            _fail(top, g, idx, f"%{v.name} is used by {op.name} before it is defined (or never)",
                  stage, "nodes must come after the nodes defining their inputs")
    bad = op.check_arity(len(node.inputs))
    if bad:
        _fail(top, g, idx, bad, stage, f"see the OpDef of {op.name}")
    try:
        full = Attrs(op.complete_attrs(dict(node.attrs)))
    except TypeError as e:
        _fail(top, g, idx, str(e), stage, f"see the attribute schema of {op.name}")
    if full != node.attrs:
        _fail(top, g, idx, f"attributes {node.attrs} are missing defaults {full}", stage,
              "nodes store every attribute explicitly")
    if len(node.regions) != op.num_regions:
        _fail(top, g, idx, f"{op.name} needs {op.num_regions} region(s), has {len(node.regions)}",
              stage, "")
    for r in node.regions:
        _verify_graph(top, r, symbols, stage)
    try:
        inferred = op.infer_types([v.type for v in node.inputs], node.attrs, node.regions)
    except TypeError as e:
        _fail(top, g, idx, f"{op.name} rejects its operands: {e}", stage,
              "the operands' types do not satisfy the op's type rule")
    if len(inferred) != len(node.outputs):
        _fail(top, g, idx, f"{op.name} yields {len(inferred)} results, node declares "
              f"{len(node.outputs)}", stage, "")
    for v, t in zip(node.outputs, inferred):
        # Layouts are assigned by the layout stage, not by type rules: a rule that says nothing
        # about layout (None) accepts any stored layout.
        stored = v.type if t.layout is not None else v.type.with_layout(None)
        if stored != t and not stored.same_as(t):
            _fail(top, g, idx, f"%{v.name} is typed {v.type} but {op.name} gives {t}", stage,
                  "a pass changed operands without updating result types")
    _check_layouts(top, g, idx, node, stage)


# Contractions read their operands after the first (a weight, a bias) as stored: a weight laid
# out at compile time for its consumer (a conv's OHWI, a tiled matrix) carries its own layout.
_WEIGHT_READERS = ("conv2d", "linear", "matmul", "grouped_matmul")


def _check_layouts(top, g, idx, node: Node, stage):
    """An op reads its operands in the layout it computes in: every operand of its result's rank
    in its result's layout, every other one row-major. Only a relayout converts. A conv claiming
    channels-last results from a row-major activation (a relayout forgotten) would read the
    wrong elements on the chip, though the interpreter, which ignores layouts, gives the right
    numbers; so this is checked on the types, where the layout stage writes it."""
    if node.op.name == "relayout" or node.regions or not node.outputs:
        return
    out = node.outputs[0].type
    for i, v in enumerate(node.inputs):
        if i > 0 and node.op.name in _WEIGHT_READERS:
            continue
        want = out.layout if v.type.rank == out.rank else None
        if v.type.layout != want:
            _fail(top, g, idx, f"{node.op.name} computes in layout {out.layout or 'row-major'} but "
                  f"reads %{v.name} in layout {v.type.layout or 'row-major'}", stage,
                  "a relayout is missing: an op reads its operands in its result's layout")


def _check_symbols(top, g, idx, t, symbols, stage):
    for d in t.shape:
        if not isinstance(d, int):
            unknown = {s.name for s in d.free_symbols} - symbols
            if unknown:
                _fail(top, g, idx, f"type {t} uses undeclared symbol(s) {sorted(unknown)}", stage,
                      "declare every symbolic dim in the graph's symbols")

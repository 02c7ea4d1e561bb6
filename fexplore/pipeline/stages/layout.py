"""layout: assign NPU layouts, insert explicit relayouts where a consumer needs another layout,
and keep conversions few by propagating layouts through layout-agnostic ops.

The policy, op by op:
- conv2d reads and writes channels-last (NHWC) activations; its weight is laid out OHWI.
- contraction weights (constant operands of linear/matmul) are stored tile-aligned to the tensor
  unit's native tile. Constants are laid out at compile time, so they cost no conversion.
- layout-agnostic ops (elementwise, batch norm, pooling, and the box copies concat, split, slice
  and pad) take the layout of their operands, so a conv -> bn -> relu -> add -> pool chain stays
  channels-last with no conversion between, and so does a DenseNet's or a U-Net's concatenation
  of feature maps along their channels;
- every other op reads and writes the default row-major layout.
A value converted once is reused by every consumer that needs that layout, and a relayout of a
relayout collapses (conversions sink and cancel). Statistics compare the conversions of a naive
per-op assignment with what propagation leaves.

The stage is idempotent: it first strips layouts and relayouts, then assigns afresh.
"""

from __future__ import annotations

from fexplore.ir import Category, Constant, Graph, Layout, Node, TensorType, Value

from ..stage import StageResult
from .rewrite import Rewriter

NHWC = Layout((0, 2, 3, 1))
OHWI = Layout((0, 2, 3, 1))
_AGNOSTIC_OPS = {"batch_norm", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d"}
# ops that move boxes of their operands (DMA box copies along any axis): a channels-last map is
# concatenated, split, sliced or padded as it is, not converted there and back
_BOX_OPS = {"concat", "split", "slice", "pad"}
_LAYOUT_NAMES = {None: "rowmajor", NHWC: "nhwc"}


def layout(graph: Graph, options) -> StageResult:
    base = strip_layouts(graph)
    tile = _weight_tile(options)
    naive = _assign(base, tile, propagate=False)
    result = _assign(base, tile, propagate=True)
    before = _conversions(naive.graph)
    after = _conversions(result.graph)
    stats = {"layout_conversions_naive": before, "layout_conversions": after,
             "weights_laid_out": result.weights, "relayout_bytes": _relayout_bytes(result.graph)}
    summary = f"{after} relayouts (naive {before}), {result.weights} weights laid out"
    return StageResult(result.graph, stats, result.rw.rewrites, summary)


def _weight_tile(options) -> tuple[int, int]:
    """The tensor unit's native (k, n) tile, from the target config (rngd: 16 x 16)."""
    try:
        _, n, k = options.chip.tensor_tile
        return (k, n)
    except AttributeError:
        return (16, 16)


class _Assigned:
    def __init__(self, graph, rw, weights):
        self.graph, self.rw, self.weights = graph, rw, weights


def _assign(graph: Graph, tile, propagate: bool) -> _Assigned:
    rw = Rewriter(graph)
    converted: dict[tuple[str, Layout | None], Value] = {}
    made_by: dict[str, Node] = {}
    weights = 0

    def ensure(v: Value, want: Layout | None) -> Value:
        v = rw.lookup(v)
        if v.type.layout == want:
            return v
        key = (v.name, want)
        if key in converted:
            return converted[key]
        src = made_by.get(v.name)
        if src is not None and src.op.name == "relayout" and src.inputs[0].type.layout == want:
            out = src.inputs[0]  # converting back: cancel the earlier relayout
            rw.record("cancel-relayout", [v.name], [out.name])
        else:
            order = want.order if want else tuple(range(v.type.rank))
            tiles = want.tile if want else ()
            out = rw.emit("relayout", [v], {"order": order, "tile": tiles},
                          name=rw.fresh_name(f"{v.name}.{_LAYOUT_NAMES.get(want, 'tiled')}"))
            made_by[out.name] = rw.nodes[-1]
            rw.record("insert-relayout", [v.name], [out.name])
        converted[key] = out
        return out

    def lay_constant(c: Constant, want: Layout) -> Value:
        nonlocal weights
        key = (c.name, want)
        if key not in converted:
            weights += 1
            converted[key] = rw.constant(f"{c.name}.{_LAYOUT_NAMES.get(want, 'tiled')}",
                                         c.payload, source=c.source,
                                         type=c.type.with_layout(want)) \
                if c.payload is not None else c
        return converted[key]

    for node in graph.nodes:
        ins = [rw.lookup(v) for v in node.inputs]
        name = node.op.name
        if name == "conv2d":
            new_ins = [ensure(ins[0], NHWC)]
            new_ins.append(lay_constant(ins[1], OHWI) if isinstance(ins[1], Constant)
                           else ensure(ins[1], None))
            new_ins += [ensure(v, None) for v in ins[2:]]
            _emit_with_layout(rw, node, new_ins, NHWC, made_by)
        elif name in ("linear", "matmul") and isinstance(ins[1], Constant) and ins[1].type.rank == 2:
            w = lay_constant(ins[1], Layout((0, 1), tile))
            rest = [ensure(v, None) for v in ins[2:]]
            _emit_with_layout(rw, node, [ensure(ins[0], None), w] + rest, None, made_by)
        elif propagate and _agnostic(node):
            out_rank = node.outputs[0].type.rank
            full = [v for v in ins if v.type.rank == out_rank]
            want = _majority([v.type.layout for v in full]) if full else None
            new_ins = [ensure(v, want) if v.type.rank == out_rank else ensure(v, None)
                       for v in ins]
            _emit_with_layout(rw, node, new_ins, want, made_by)
        else:
            _emit_with_layout(rw, node, [ensure(v, None) for v in ins], None, made_by)
    outputs = [ensure(v, None) for v in graph.outputs]
    return _Assigned(rw.finish(outputs), rw, weights)


def _agnostic(node: Node) -> bool:
    if node.regions:
        return False
    return node.op.category == Category.elementwise or node.op.name in _AGNOSTIC_OPS | _BOX_OPS


def _majority(layouts):
    counts: dict = {}
    for lay in layouts:
        counts[lay] = counts.get(lay, 0) + 1
    best = max(counts.values())
    return next(lay for lay in layouts if counts[lay] == best)


def _emit_with_layout(rw: Rewriter, node: Node, ins, out_layout, made_by) -> None:
    types = node.op.infer_types([v.type for v in ins], node.attrs, node.regions)
    outs = []
    for old, t in zip(node.outputs, types):
        t = TensorType(t.shape, t.dtype, out_layout)
        new = old if old.type == t else Value(old.name, t)
        rw.replace(old, new)
        outs.append(new)
    if outs == list(node.outputs) and all(a is b for a, b in zip(ins, node.inputs)):
        n = node
    else:
        n = Node(node.op, ins, node.attrs, outs, node.loc, node.regions)
    rw.nodes.append(n)
    for v in n.outputs:
        made_by[v.name] = n


def strip_layouts(graph: Graph) -> Graph:
    """The graph with every relayout removed and every layout back to the default."""
    if not any(n.op.name == "relayout" or any(v.type.layout for v in n.outputs)
               for n in graph.nodes) and not any(c.type.layout for c in graph.constants):
        return graph
    rw = Rewriter(graph)
    for c in graph.constants:
        if c.type.layout is not None:  # a laid-out weight: back to the plain constant it was
            base = c.name.rsplit(".", 1)[0] if c.name.endswith(_SUFFIXES) else c.name
            rw.replace(c, Constant(base, c.type.with_layout(None), c.payload, source=c.source))
    rw.constants = list({rw.lookup(c).name: rw.lookup(c) for c in graph.constants}.values())
    for node in graph.nodes:
        ins = [rw.lookup(v) for v in node.inputs]
        if node.op.name == "relayout":
            rw.replace(node.output, ins[0])
            continue
        types = node.op.infer_types([v.type for v in ins], node.attrs, node.regions)
        outs = [Value(o.name, t) if o.type != t else o for o, t in zip(node.outputs, types)]
        for o, n in zip(node.outputs, outs):
            rw.replace(o, n)
        rw.nodes.append(Node(node.op, ins, node.attrs, outs, node.loc, node.regions))
    return rw.finish()


_SUFFIXES = (".nhwc", ".tiled", ".rowmajor")


def _conversions(g: Graph) -> int:
    return sum(1 for n in g.nodes if n.op.name == "relayout")


def _relayout_bytes(g: Graph) -> int:
    total = 0
    for n in g.nodes:
        if n.op.name == "relayout":
            b = n.output.type.nbytes()
            total += b if isinstance(b, int) else 0
    return total

"""fold: constant folding and propagation, by running the reference interpreter.

Everything computed from constants alone becomes a constant: masks, position ids, aranges,
transposed or reshaped weights, rotary tables. A batch norm after a convolution with constant
weights folds into the convolution's weight and bias; any other batch norm with constant
statistics (inference) becomes a per-channel scale and shift, two elementwise ops that fuse with
their neighbours. On the meta device both rewrites are made on structure alone (the folded
constants have no values), so a real-size model reaches the graph it would with weights. The fold
size limit (an option) keeps huge results from being materialized, and broadcasts stay lazy (an
expanded constant is cheaper to regenerate than to store) -- except in f64, which the chip has no
datapath for: a rotary table computed in f64 from an expanded constant would be host work on every
call, where folded it is a constant.

Last, linears reading one input with constant weights become one linear over the weights side by
side (`parallel_linears`: attention's q, k and v projections as one kernel).
"""

from __future__ import annotations

import numpy as np

from fexplore.ir import Constant, Graph, Node, TensorType, evaluate_node
from fexplore.ir.types import names_a_symbol
from fexplore.lang.codegen import NO_DATAPATH

from ..stage import StageResult
from .parallel_linears import merge_parallel_linears, split_fused_linears
from .rewrite import Rewriter

_NEVER_FOLD = {"expand"}  # materializing a broadcast only bloats the constant pool


def fold(graph: Graph, options, *, regions: bool = False) -> StageResult:
    """``regions``: fold a region node (a fused region, a control-flow op) whose inputs are all
    constant too. The stage runs before fusion and leaves control flow alone; a graph specialized
    to a static size after fusion (``chip.Schedules``) folds its constant regions, such as the
    rotary tables a fused region computes from the now-known positions."""
    limit = options.fold_limit_bytes
    users = graph.users()
    rw = Rewriter(graph)
    folded = skipped_for_size = 0
    folded_bytes = 0
    absorbed: set[str] = set()  # conv outputs whose batch norm folds into them
    scale_shift = 0             # other batch norms, become a per-channel scale and shift
    emptied = 0                 # values with no elements

    producers = graph.producers()
    for node in graph.nodes:
        if node.op.name == "conv2d" and _conv_bn_pair(node, users, rw):
            absorbed.add(node.output.name)  # emitted at its batch norm, with the folded weights
            continue
        if node.op.name == "batch_norm" and node.inputs[0].name in absorbed:
            _fold_conv_bn(rw, producers[node.inputs[0].name], node)
            continue
        if node.op.name == "batch_norm" and node.inputs[0].type.dtype.is_float and \
                all(_is_const(rw, v) for v in node.inputs[1:]):
            _batch_norm_as_scale_and_shift(rw, node)
            scale_shift += 1
            continue
        if _all_empty(node):
            # a value with no elements holds no data: it is a constant, whatever computed it
            for v in node.outputs:
                rw.replace(v, rw.constant(v.name, np.empty(v.type.shape, v.type.dtype.numpy), type=v.type))
            emptied += 1
            rw.record("fold-empty", [v.name for v in node.outputs])
            continue
        ins = [rw.lookup(v) for v in node.inputs]
        if node.op.name == "concat" and _drop_empty_operands(rw, node, ins):
            continue
        if _writes_nothing(node, ins):
            rw.replace(node.output, ins[0])
            rw.record("write-of-nothing", [node.output.name])
            continue
        if not _foldable(node, ins, regions):
            rw.keep(node)
            continue
        nbytes = sum(int(v.type.nbytes()) for v in node.outputs)
        if nbytes > limit:
            skipped_for_size += 1
            rw.keep(node)
            continue
        if any(c.payload is None for c in ins):
            # a meta-device model: the value is as constant as with real weights but has no
            # content; it folds all the same (structure only), so a real-size model on the meta
            # device reaches the graph the same model with weights does (a causal mask sliced
            # from a buffer becomes a constant operand of attention, not ops in its region)
            for v in node.outputs:
                rw.replace(v, rw.constant(v.name, None, type=v.type, digest=f"meta-folded-{v.name}"))
        else:
            arrays = evaluate_node(node, [c.payload for c in ins])
            for v, a in zip(node.outputs, arrays):
                rw.replace(v, rw.constant(v.name, np.asarray(a, order="C"), type=v.type))
        folded += 1
        folded_bytes += nbytes
        rw.record("fold-constant", [v.name for v in node.outputs])
    g = rw.finish()
    rewrites = rw.rewrites
    merged = cut = []
    if not regions:   # the stage itself; a graph specialized after fusion has its kernels already
        g, merged = merge_parallel_linears(g)
        g, cut = split_fused_linears(g)
        rewrites = rewrites + merged + cut
    stats = {"constants_folded": folded, "folded_bytes": folded_bytes,
             "conv_batchnorm_folded": len(absorbed), "batchnorm_as_scale_shift": scale_shift,
             "not_folded_over_size_limit": skipped_for_size, "empty_values": emptied,
             "parallel_linears_merged": sum(len(r.nodes) for r in merged), "fused_linears_split": len(cut)}
    summary = f"{folded} values folded ({folded_bytes:,} B), {len(absorbed)} conv+batch-norm pairs" + \
        (f", {scale_shift} batch norms as scale and shift" if scale_shift else "") + \
        (f", {len(merged)} groups of parallel linears merged" if merged else "") + \
        (f", {len(cut)} fused linears split into their parts" if cut else "")
    return StageResult(g, stats, rewrites, summary)


def _all_empty(node: Node) -> bool:
    """Every result has no elements (a static shape with a 0 in it): a slice of nothing, a rotary
    half of a zero-width rotation, whatever reads them elementwise."""
    return not node.regions and bool(node.outputs) and \
        all(v.type.is_static and _empty(v) for v in node.outputs)   # a constant needs its shape


def _drop_empty_operands(rw: Rewriter, node: Node, ins) -> bool:
    """A concat without its operands of no elements (they add nothing; a kernel has no tile for
    them), or the one operand left. False when there is none to drop."""
    kept = [v for v in ins if not _empty(v)]
    if len(kept) == len(ins) or not kept:
        return False
    if len(kept) == 1 and kept[0].type.shape == node.output.type.shape:
        rw.replace(node.output, kept[0])
    else:
        rw.rebuild(node, kept)
    rw.record("concat-drop-empty", [node.output.name])
    return True


def _empty(v) -> bool:
    """No elements: a dim that is 0 whatever the symbols are (a zero-width rotary half of a
    [1, heads, seq, 0] slice is empty at every sequence length)."""
    return any(isinstance(d, int) and d == 0 for d in v.type.shape)


# the operands whose emptiness makes a write into a copy of input 0 write nothing
_UPDATES = {"slice_scatter": (1,), "scatter": (1,), "index_put": None}   # None: any index


def _writes_nothing(node: Node, ins) -> bool:
    """A slice_scatter of no values, a scatter or index_put at no index: the result is input 0."""
    if node.op.name not in _UPDATES or node.output.type != ins[0].type:
        return False
    which = _UPDATES[node.op.name]
    return any(_empty(v) for v in (ins[2:] if which is None else [ins[i] for i in which]))


def _foldable(node: Node, ins, regions: bool = False) -> bool:
    if node.regions and not regions:
        return False
    if node.op.name in _NEVER_FOLD and not any(v.type.dtype in NO_DATAPATH for v in node.outputs):
        return False
    if not all(isinstance(v, Constant) for v in ins):
        return False
    if not all(v.type.is_static for v in node.outputs):
        return False
    return not any(names_a_symbol(a) for a in node.attrs.values())


def _is_const(rw: Rewriter, v) -> bool:
    """A constant, with values or (a meta-device weight) without."""
    return isinstance(rw.lookup(v), Constant)


def _conv_bn_pair(conv: Node, users, rw: Rewriter) -> bool:
    """A conv2d with constant weight (and bias) whose only user is a batch norm with constant
    statistics and affine parameters."""
    us = users.get(conv.output.name, [])
    if len(us) != 1 or us[0].op.name != "batch_norm" or us[0].inputs[0] is not conv.output:
        return False
    return all(_is_const(rw, v) for v in conv.inputs[1:]) and \
        all(_is_const(rw, v) for v in us[0].inputs[1:])


def _bn_scale(rw: Rewriter, bn: Node) -> np.ndarray:
    """A batch norm's per-channel scale, weight / sqrt(running var + eps) (raises NoValues on the
    meta device)."""
    gamma, var = rw.values(bn.inputs[1]), rw.values(bn.inputs[4])
    return gamma / np.sqrt(var + bn.attrs["eps"])


def _fold_conv_bn(rw: Rewriter, conv: Node, bn: Node) -> None:
    def weight():
        return rw.values(conv.inputs[1]) * _bn_scale(rw, bn).reshape(-1, 1, 1, 1)

    def bias():
        b = rw.values(conv.inputs[2]) if len(conv.inputs) == 3 else 0.0
        return (b - rw.values(bn.inputs[3])) * _bn_scale(rw, bn) + rw.values(bn.inputs[2])

    wt = conv.inputs[1].type
    new_w = rw.computed_constant(f"{bn.output.name}.weight", weight, TensorType(wt.shape, wt.dtype))
    new_b = rw.computed_constant(f"{bn.output.name}.bias", bias, TensorType((wt.shape[0],), wt.dtype))
    x = rw.lookup(conv.inputs[0])
    out = rw.emit("conv2d", [x, new_w, new_b], dict(conv.attrs), name=bn.output.name,
                  loc=conv.loc)
    rw.replace(bn.output, out)
    rw.record("fold-conv-batchnorm", [conv.output.name, bn.output.name], [out.name])


def _batch_norm_as_scale_and_shift(rw: Rewriter, bn: Node) -> None:
    """y = x * scale + shift, scale = weight / sqrt(var + eps), shift = bias - mean * scale, both
    shaped (C, 1, ...) to broadcast along the channel axis (axis 1) of x."""
    x = rw.lookup(bn.inputs[0])
    C = bn.inputs[1].type.shape[0]
    t = TensorType((C,) + (1,) * (x.type.rank - 2), x.type.dtype)

    def shift():
        return rw.values(bn.inputs[2]) - rw.values(bn.inputs[3]) * _bn_scale(rw, bn)

    name = bn.output.name
    scale = rw.computed_constant(f"{name}.scale", lambda: _bn_scale(rw, bn), t)
    scaled = rw.emit("mul", [x, scale], name=rw.fresh_name(f"{name}_scaled"),
                     loc=bn.loc)
    out = rw.emit("add", [scaled, rw.computed_constant(f"{name}.shift", shift, t)], name=name, loc=bn.loc)
    rw.replace(bn.output, out)
    rw.record("batchnorm-as-scale-shift", [name], [scaled.name, out.name])

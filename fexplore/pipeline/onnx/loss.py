"""ONNX's loss ops: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss, written with the
IR's gather, log_softmax and reductions (what a training graph exported for evaluation holds)."""

from __future__ import annotations

from fexplore.ir import DType

from .elementwise import scalar_like
from .movement import _reshape_to
from .registry import OnnxContext, onnx_converter


def nll(ctx: OnnxContext, logp, target, weight):
    """-logp[n, target[n, ...], ...] * weight[target], reduced as the node says, with
    ignore_index's positions counting for nothing (neither loss nor weight)."""
    t = target if target.type.dtype == DType.i64 else ctx.emit("cast", [target], {"dtype": DType.i64})
    ignore = ctx.attr("ignore_index")
    keep = None
    if ignore is not None:
        keep = ctx.emit("ne", [t, ctx.scalar(ignore, DType.i64)])
        t = ctx.emit("where", [keep, t, ctx.scalar(0, DType.i64)])  # any valid class; masked below
    idx = _reshape_to(ctx, t, t.type.shape[:1] + (1,) + t.type.shape[1:])
    picked = ctx.emit("gather", [logp, idx], {"axis": 1})
    loss = ctx.emit("neg", [_reshape_to(ctx, picked, t.type.shape)])
    w = None
    if weight is not None:
        w = ctx.emit("index", [weight, t], {"axes": (0,)})
    if keep is not None:
        k = ctx.emit("cast", [keep], {"dtype": logp.type.dtype})
        w = k if w is None else ctx.emit("mul", [w, k])
    if w is not None:
        loss = ctx.emit("mul", [loss, w])
    reduction = ctx.attr("reduction", "mean")
    axes = tuple(range(loss.type.rank))
    if reduction == "none":
        return loss
    total = ctx.emit("sum", [loss], {"axes": axes, "keepdim": False})
    if reduction == "sum":
        return total
    if w is None:
        n = 1
        for d in loss.type.shape:
            n = n * d
        return ctx.emit("div", [total, scalar_like(ctx, float(n), total)])
    return ctx.emit("div", [total, ctx.emit("sum", [w], {"axes": axes, "keepdim": False})])


@onnx_converter("NegativeLogLikelihoodLoss")
def _nll_loss(ctx):
    return nll(ctx, ctx.input(0), ctx.input(1), ctx.input(2))


@onnx_converter("SoftmaxCrossEntropyLoss")
def _softmax_cross_entropy(ctx):
    scores = ctx.input(0)
    logp = ctx.emit("log_softmax", [scores], {"axis": 1})
    loss = nll(ctx, logp, ctx.input(1), ctx.input(2))
    if len(ctx.onnx.output) > 1 and ctx.onnx.output[1]:
        return (loss, logp)
    return loss

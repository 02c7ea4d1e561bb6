"""Converters for control flow: ``torch.cond`` becomes a ``cond`` node owning two regions."""

from __future__ import annotations

from fexplore.ir import Value

from .registry import ConvertContext, converter


@converter("higher_order.cond")
def _cond(ctx: ConvertContext):
    pred, true_gm, false_gm, operands = ctx.args[:4]
    if not isinstance(pred, Value):
        raise NotImplementedError(
            "torch.cond on a shape condition (export resolves those at trace time when it can; "
            "make the predicate a tensor)")
    then_g = ctx.graph_module_converter(true_gm, "then")
    else_g = ctx.graph_module_converter(false_gm, "else")
    outs = ctx.emit_region_op("cond", [pred, *operands], [then_g, else_g])
    return outs if isinstance(outs, tuple) else (outs,)

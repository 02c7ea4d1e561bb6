"""Ops fexplore refuses on purpose, each with the reason: a compiled NPU program has static shapes
and is deterministic, so ops whose result size depends on the data, and random ops, have no
faithful translation. Each is refused with an UnsupportedOperatorError naming the op, the user's
line and why, rather than with the generic "no converter yet"."""

from __future__ import annotations

from fexplore.errors import UnsupportedOperatorError

from .registry import CONVERTERS, ConvertContext, converter

_DATA_DEPENDENT = ("its result's size depends on the values of its input, and a compiled program "
                   "has static shapes; compute a fixed-size result instead (a mask with "
                   "torch.where, or topk with a fixed k)")
_RANDOM = ("it draws random numbers, and a compiled program is deterministic and verified "
           "against eager value for value; call model.eval() (dropout), or pass the random "
           "tensor in as an input")

OUT_OF_SCOPE = {
    **{op: _DATA_DEPENDENT for op in (
        "aten.masked_select.default", "aten.nonzero.default", "aten.nonzero_static.default",
        "aten.argwhere.default", "aten.unique.default", "aten._unique2.default",
        "aten.unique_dim.default", "aten.unique_consecutive.default")},
    **{op: _RANDOM for op in (
        "aten.native_dropout.default", "aten.bernoulli.default", "aten.bernoulli.p",
        "aten.rand.default", "aten.rand_like.default", "aten.randn.default",
        "aten.randn_like.default", "aten.randint.default", "aten.randint.low",
        "aten.randint_like.default", "aten.randint_like.low_dtype", "aten.randperm.default",
        "aten.normal.Tensor_Tensor", "aten.normal.float_Tensor", "aten.normal.Tensor_float",
        "aten.normal_functional.default", "aten.uniform.default", "aten.exponential.default",
        "aten.multinomial.default", "aten.rrelu_with_noise.default",
        "aten.rrelu_with_noise_functional.default", "aten.cauchy.default",
        "aten.log_normal.default", "aten.geometric.default")},
}


def refuse(ctx: ConvertContext, why: str):
    raise UnsupportedOperatorError(str(ctx.node.target), loc=ctx.loc,
                                   hint=f"fexplore does not compile this op: {why}")


for _op, _why in OUT_OF_SCOPE.items():
    if _op not in CONVERTERS:  # a real converter, registered first, always wins
        converter(_op)(lambda ctx, _why=_why: refuse(ctx, _why))

"""Ops fexplore refuses on purpose, each with the reason. A compiled NPU program is deterministic
and verified against eager value for value, so random ops have no faithful translation; they are
refused with an UnsupportedOperatorError naming the op, the user's line and why, rather than with
the generic "no converter yet". (Ops whose result size depends on the data are refused by
ingestion itself, from the result's unbacked size, whatever the op.)"""

from __future__ import annotations

import torch

from fexplore.errors import UnsupportedOperatorError

from .registry import CONVERTERS, ConvertContext, converter

_RANDOM = "it draws random numbers, and a compiled program is deterministic"
_DROPOUT_HINT = ("fexplore compiles what it can verify against eager value for value: call model.eval() "
                 "so dropout draws nothing, or pass the random tensor in as a model input")
# a random op left in eval mode is drawn by the model's own forward (a masking noise, a sampler)
_RANDOM_HINT = ("fexplore compiles what it can verify against eager value for value; this draw is in the "
                "model's forward even in eval mode: pass the random tensor in as a model input instead "
                "(many models take it as an argument, e.g. noise=)")
# the draws a training-mode layer makes (dropout, rrelu's noise): model.eval() removes them
_DROPOUT_OPS = ("aten.native_dropout.default", "aten.bernoulli.default", "aten.bernoulli.p",
                "aten.rrelu_with_noise.default", "aten.rrelu_with_noise_functional.default")

OUT_OF_SCOPE = {op: _RANDOM for op in _DROPOUT_OPS + (
    "aten.rand.default", "aten.rand_like.default", "aten.randn.default",
    "aten.randn_like.default", "aten.randint.default", "aten.randint.low",
    "aten.randint_like.default", "aten.randint_like.low_dtype", "aten.randperm.default",
    "aten.normal.Tensor_Tensor", "aten.normal.float_Tensor", "aten.normal.Tensor_float",
    "aten.normal_functional.default", "aten.uniform.default", "aten.exponential.default",
    "aten.multinomial.default", "aten.cauchy.default", "aten.log_normal.default",
    "aten.geometric.default")}


def refuse(ctx: ConvertContext, why: str):
    training = str(ctx.node.target) in _DROPOUT_OPS
    raise UnsupportedOperatorError(str(ctx.node.target), loc=ctx.loc, reason=why,
                                   hint=_DROPOUT_HINT if training else _RANDOM_HINT)


def random_draw_refusal(op, loc) -> UnsupportedOperatorError | None:
    """The refusal of a random op with no converter and no entry above (an overload such as
    randn.generator, which a model reaches by passing its optional generator): torch tags every op
    that draws from the generator `nondeterministic_seeded`. None for any other op."""
    if torch.Tag.nondeterministic_seeded not in getattr(op, "tags", ()):
        return None
    return UnsupportedOperatorError(str(op), loc=loc, reason=_RANDOM, hint=_RANDOM_HINT)


for _op, _why in OUT_OF_SCOPE.items():
    if _op not in CONVERTERS:  # a real converter, registered first, always wins
        converter(_op)(lambda ctx, _why=_why: refuse(ctx, _why))

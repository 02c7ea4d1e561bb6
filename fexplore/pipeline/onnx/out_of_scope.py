"""ONNX ops fexplore refuses on purpose, each with its reason (the ONNX counterpart of
``fexplore.pipeline.convert.out_of_scope``): a result whose size depends on the input's values
has no place in a program whose shapes follow from the input shapes, and a random op has no
faithful translation into a program verified value for value."""

from __future__ import annotations

from fexplore.errors import UnsupportedOperatorError

from .registry import OnnxContext, lookup, onnx_converter

_DATA_DEPENDENT = {
    "NonZero": "it gives as many indices as there are non-zero elements",
    "Compress": "it keeps as many slices as the condition has true elements",
    "Unique": "it gives as many elements as the input has distinct values",
    "NonMaxSuppression": "it keeps as many boxes as survive the suppression",
    "StringSplit": "it splits strings into as many parts as they hold",
}
_DATA_HINT = ("fexplore compiles programs whose shapes follow from the input shapes; write it "
              "densely (a mask and Where instead of the selected elements)")
_RANDOM = {op: "it draws random numbers, and a compiled program is deterministic" for op in (
    "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
    "Bernoulli")}
_RANDOM_HINT = "pass the random tensor in as a model input"


def _refuse(why: str, hint: str):
    def conv(ctx: OnnxContext):
        raise UnsupportedOperatorError(f"ai.onnx::{ctx.onnx.op_type}", loc=ctx.loc, reason=why,
                                       hint=hint)

    return conv


for _op, _why in _DATA_DEPENDENT.items():
    if lookup("", _op, 13) is None:
        onnx_converter(_op, since=1)(_refuse(_why, _DATA_HINT))
for _op, _why in _RANDOM.items():
    if lookup("", _op, 13) is None:
        onnx_converter(_op, since=1)(_refuse(_why, _RANDOM_HINT))

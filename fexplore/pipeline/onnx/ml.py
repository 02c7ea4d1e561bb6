"""ai.onnx.ml, ONNX's classical-ML domain: the ops of it that are tensor programs.

scikit-learn pipelines exported to ONNX put feature selection and thresholding around the model
in this domain. Those two are plain tensor ops and compile; its tree ensembles, label encoders
(strings) and text vectorizers stay refused by name.
"""

from __future__ import annotations

import math

from .elementwise import cast
from .movement import nonneg_indices
from .registry import OnnxContext, onnx_converter

ML = "ai.onnx.ml"


@onnx_converter("Binarizer", domain=ML, since=1)
def _binarizer(ctx: OnnxContext):
    """1 where x > threshold, else 0, in x's dtype. For integers, x > t is x > floor(t)."""
    x = ctx.input(0)
    t = float(ctx.attr("threshold", 0.0))
    bound = ctx.scalar(t if x.type.dtype.is_float else math.floor(t), x.type.dtype)
    return cast(ctx, ctx.emit("gt", [x, bound]), x.type.dtype)


@onnx_converter("ArrayFeatureExtractor", domain=ML, since=1)
def _array_feature_extractor(ctx: OnnxContext):
    """x[..., indices]: the columns of the last axis that the (flattened) indices name; a 1-d x
    is one row, so the result is (1, n), as ONNX Runtime gives it."""
    x, idx = ctx.input(0), ctx.input(1)
    if x.type.rank == 1:
        x = ctx.emit("reshape", [x], {"shape": (1,) + tuple(x.type.shape)})
    last = x.type.rank - 1
    idx = nonneg_indices(ctx, idx, x.type.shape[last])   # (a known constant: in its own shape)
    if idx.type.rank != 1:
        idx = ctx.emit("reshape", [idx], {"shape": (math.prod(idx.type.shape),)})
    return ctx.emit("index", [x, idx], {"axes": (last,)})

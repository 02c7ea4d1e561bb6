"""ONNX Resize as per-axis gathers (nearest) or interpolation matmuls (linear, cubic)."""

from __future__ import annotations

import numpy as np

from .elementwise import scalar_like
from .registry import onnx_converter

# -- Resize -----------------------------------------------------------------------------------
#
# Resize is separable and, along each axis, linear in its input (for the nearest, linear and
# cubic modes, antialiased or not): output line = M @ input line. M is taken from onnx's own
# reference Resize, run on inputs that are one-hot along the axis and constant along the others,
# so every coordinate mode, rounding rule, cubic coefficient, exclude_outside, antialias filter
# and keep_aspect_ratio policy means exactly what ONNX says. Nearest becomes a gather; the
# others a matmul with M. tf_crop_and_resize's extrapolated positions get their value last.


def _reference_resize(node, x, roi, scales, sizes, opset):
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    names = ["x", "roi" if roi is not None else "", "scales" if scales is not None else "",
             "sizes" if sizes is not None else ""]
    while names and not names[-1]:
        names.pop()
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    attrs["extrapolation_value"] = float("nan")   # marks the positions extrapolated
    n = helper.make_node("Resize", names, ["y"], **attrs)
    feeds = {"x": x}
    for k, v in (("roi", roi), ("scales", scales), ("sizes", sizes)):
        if v is not None:
            feeds[k] = v
    return ReferenceEvaluator(n, opsets={"": opset}).run(None, feeds)[0]


@onnx_converter("Resize")
def _resize(ctx):
    from ..convert.movement import _gather_axis

    x = ctx.input(0)
    roi, scales, sizes = (ctx.const(i, what) for i, what in ((1, "roi"), (2, "scales"), (3, "sizes")))
    roi, scales, sizes = ((None if v is None or np.asarray(v).size == 0 else np.asarray(v))
                          for v in (roi, scales, sizes))
    shape = x.type.shape
    if not all(isinstance(d, int) for d in shape):
        raise NotImplementedError("Resize of a tensor with symbolic dims")
    mode = ctx.attr("mode", "nearest")
    if mode not in ("nearest", "linear", "cubic"):
        ctx.refuse(f"Resize mode {mode!r}")
    work = np.float64 if mode != "nearest" else np.float32
    ones = _reference_resize(ctx.onnx, np.ones(shape, work), roi, scales, sizes, ctx.opset)
    out_shape = ones.shape
    extrapolated = np.isnan(ones)
    # Each axis on its own, the others of size 1, when nothing couples them (no aspect-ratio
    # policy, no per-axis roi, no axes subset): the reference then runs on lines, not images.
    alone = ctx.attr("keep_aspect_ratio_policy", "stretch") == "stretch" and roi is None and \
        not ctx.has_attr("axes")
    y = x
    for a in range(len(shape)):
        n_in, n_out = shape[a], out_shape[a]
        m = np.zeros((n_out, n_in))
        b_shape, b_scales, b_sizes = shape, scales, sizes
        if alone:
            b_shape = tuple(n_in if j == a else 1 for j in range(len(shape)))
            if sizes is not None:
                b_sizes = np.array([n_out if j == a else 1 for j in range(len(shape))], np.int64)
            else:
                b_scales = np.array([scales[j] if j == a else 1.0 for j in range(len(shape))],
                                    np.asarray(scales).dtype)
        for i in range(n_in):
            basis = np.zeros(b_shape, work)
            idx = [slice(None)] * len(shape)
            idx[a] = i
            basis[tuple(idx)] = 1
            line = _reference_resize(ctx.onnx, basis, roi, b_scales, b_sizes, ctx.opset)
            pick = [0] * len(shape)
            pick[a] = slice(None)
            m[:, i] = np.nan_to_num(line[tuple(pick)], nan=0.0)
        if n_in == n_out and np.allclose(m, np.eye(n_in)):
            continue
        if mode == "nearest":
            if not np.all((m == 0) | (m == 1)) or not np.all(m.sum(1) <= 1):
                ctx.refuse("a nearest Resize that mixes inputs")
            y = _gather_axis(ctx, y, a, m.argmax(1))
            continue
        if not y.type.dtype.is_float:
            ctx.refuse(f"{mode} Resize of an integer tensor")
        mt = ctx.b.literal(m.T.astype(y.type.dtype.numpy), f"{ctx._node_base()}.interp{a}")
        r = y.type.rank
        perm = tuple(j for j in range(r) if j != a) + (a,)
        z = ctx.emit("permute", [y], {"perm": perm}) if a != r - 1 else y
        z = ctx.emit("matmul", [z, mt])
        if a != r - 1:
            z = ctx.emit("permute", [z], {"perm": tuple(int(p) for p in np.argsort(perm))})
        y = z
    if extrapolated.any():
        mask = ctx.b.literal(extrapolated, f"{ctx._node_base()}.outside")
        y = ctx.emit("where", [mask, scalar_like(ctx, ctx.attr("extrapolation_value", 0.0), y), y])
    return y

"""ONNX's linear quantization ops (QuantizeLinear, DequantizeLinear, QLinearMatMul,
MatMulInteger) in the IR's float and integer arithmetic: dequantize = (q - zero point) * scale;
quantize = saturate(round-half-even(x / scale) + zero point) into the integer type."""

from __future__ import annotations

import numpy as np

from fexplore.ir import DType

from .elementwise import cast
from .importer import onnx_dtype
from .movement import _reshape_to, axis
from .registry import OnnxContext, onnx_converter


def _per_axis(ctx, v, x, ax):
    """A per-tensor (0-d or one element) or per-axis (1-D along ax) parameter, shaped to
    broadcast against x."""
    if v.type.rank == 0 or (v.type.rank == 1 and v.type.shape[0] == 1 and x.type.shape[ax] != 1):
        return _reshape_to(ctx, v, ())
    if v.type.rank != 1:
        ctx.refuse("blocked quantization (a scale per block)")
    shape = [1] * x.type.rank
    shape[ax] = v.type.shape[0]
    return _reshape_to(ctx, v, tuple(shape))


def dequantize(ctx, q, scale, zp, ax):
    f = scale.type.dtype
    y = cast(ctx, q, f)
    if zp is not None:
        y = ctx.emit("sub", [y, cast(ctx, _per_axis(ctx, zp, q, ax), f)])
    return ctx.emit("mul", [y, _per_axis(ctx, scale, q, ax)])


def quantize(ctx, x, scale, zp, ax, dt: DType):
    y = ctx.emit("round", [ctx.emit("div", [x, _per_axis(ctx, scale, x, ax)])])
    if zp is not None:
        y = ctx.emit("add", [y, cast(ctx, _per_axis(ctx, zp, x, ax), y.type.dtype)])
    if not dt.is_int:
        ctx.refuse(f"quantization to {dt}")
    info = np.iinfo(dt.numpy)
    y = ctx.emit("clamp", [y], {"min": float(info.min), "max": float(info.max)})
    return cast(ctx, y, dt)


@onnx_converter("DequantizeLinear")
def _dequantize(ctx: OnnxContext):
    if ctx.attr("block_size", 0):
        ctx.refuse("blocked quantization (block_size)")
    q = ctx.input(0)
    return dequantize(ctx, q, ctx.input(1), ctx.input(2), axis(ctx.attr("axis", 1), max(q.type.rank, 1)))


@onnx_converter("QuantizeLinear")
def _quantize(ctx: OnnxContext):
    if ctx.attr("block_size", 0):
        ctx.refuse("blocked quantization (block_size)")
    x, zp = ctx.input(0), ctx.input(2)
    if zp is not None:
        dt = zp.type.dtype
    elif ctx.attr("output_dtype"):
        dt = onnx_dtype(ctx.attr("output_dtype"))
    else:
        dt = DType.u8
    return quantize(ctx, x, ctx.input(1), zp, axis(ctx.attr("axis", 1), max(x.type.rank, 1)), dt)


def _matrix_param(ctx, v, which: str):
    """A QLinearMatMul scale or zero point: per tensor, per row of a (M,) or per column of b."""
    if v.type.rank == 0 or v.type.shape == (1,):
        return _reshape_to(ctx, v, ())
    return _reshape_to(ctx, v, (v.type.shape[0], 1)) if which == "a" else v


@onnx_converter("QLinearMatMul")
def _qlinear_matmul(ctx: OnnxContext):
    a, sa, za, b, sb, zb, sy, zy = ctx.inputs()[:8]
    f = DType.f64   # exact for the integer products of 8-bit operands
    af = ctx.emit("sub", [cast(ctx, a, f), cast(ctx, _matrix_param(ctx, za, "a"), f)])
    bf = ctx.emit("sub", [cast(ctx, b, f), cast(ctx, _matrix_param(ctx, zb, "b"), f)])
    acc = ctx.emit("matmul", [af, bf])
    scale = ctx.emit("div", [ctx.emit("mul", [cast(ctx, _matrix_param(ctx, sa, "a"), f),
                                              cast(ctx, _matrix_param(ctx, sb, "b"), f)]),
                             cast(ctx, _reshape_to(ctx, sy, ()), f)])
    y = ctx.emit("round", [ctx.emit("mul", [acc, scale])])
    y = ctx.emit("add", [y, cast(ctx, _reshape_to(ctx, zy, ()), f)])
    info = np.iinfo(zy.type.dtype.numpy)
    y = ctx.emit("clamp", [y], {"min": float(info.min), "max": float(info.max)})
    return cast(ctx, y, zy.type.dtype)


@onnx_converter("MatMulInteger")
def _matmul_integer(ctx: OnnxContext):
    a, b, za, zb = ctx.input(0), ctx.input(1), ctx.input(2), ctx.input(3)
    a32, b32 = cast(ctx, a, DType.i32), cast(ctx, b, DType.i32)
    if za is not None:
        a32 = ctx.emit("sub", [a32, cast(ctx, _matrix_param(ctx, za, "a"), DType.i32)])
    if zb is not None:
        b32 = ctx.emit("sub", [b32, cast(ctx, _matrix_param(ctx, zb, "b"), DType.i32)])
    return ctx.emit("matmul", [a32, b32])

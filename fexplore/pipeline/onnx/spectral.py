"""ONNX's DFT: the same contractions with constant cos and sin tables as torch.fft's
(``fexplore.pipeline.convert.complex``), on ONNX's layout of a signal: a trailing axis of 1 (real)
or 2 (real and imaginary parts)."""

from __future__ import annotations

from ..convert.complex import dft_parts, pack_parts, real_from_half_spectrum
from .registry import OnnxContext, onnx_converter


@onnx_converter("DFT", since=17)
def _dft(ctx: OnnxContext):
    x = ctx.input(0)
    rank = x.type.rank
    if ctx.opset >= 20:   # the axis moved from an attribute to an input
        axis = ctx.const_ints(2, "axis")[0] if ctx.has_input(2) else -2
    else:
        axis = ctx.attr("axis", 1)
    if not -rank <= axis < rank or axis % rank == rank - 1:
        ctx.refuse(f"axis {axis} is not a signal axis of a rank-{rank} input (its last axis holds the "
                   f"real and imaginary parts)")
    axis %= rank
    pairs = x.type.shape[-1]
    if pairs not in (1, 2):
        ctx.refuse(f"the last axis is {pairs} long; ONNX's DFT takes 1 (real) or 2 (complex)")
    re = ctx.emit("select", [x], {"axis": rank - 1, "index": 0})
    im = ctx.emit("select", [x], {"axis": rank - 1, "index": 1}) if pairs == 2 else None
    inverse, onesided = bool(ctx.attr("inverse", 0)), bool(ctx.attr("onesided", 0))
    n = re.type.shape[axis]
    length = ctx.const_ints(1, "dft_length")[0] if ctx.has_input(1) else None
    if inverse and onesided:   # the real signal of a half spectrum (numpy's irfft)
        length = length or 2 * (n - 1)
        y = real_from_half_spectrum(ctx, re, im, axis, length, 1.0 / length)
        return ctx.emit("reshape", [y], {"shape": y.type.shape + (1,)})
    length = length or n
    m = length // 2 + 1 if onesided else length
    re, im = dft_parts(ctx, re, im, axis, m, inverse, 1.0 / length if inverse else 1.0, length)
    return pack_parts(ctx, re, im)

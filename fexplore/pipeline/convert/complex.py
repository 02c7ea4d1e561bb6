"""Complex tensors, decomposed to real arithmetic at ingestion.

The IR has no complex dtype. A complex tensor of shape S is held as a real tensor of shape
S + (2,), view_as_real's layout: ``[..., 0]`` the real parts, ``[..., 1]`` the imaginary ones.
``view_as_complex`` and ``view_as_real`` are then the identity, ``polar`` and complex products
(rotary embeddings written as Meta's Llama does) are a few real multiplies and adds, and views of
complex tensors are views of their real layout with dims counted on the complex shape.

Ingestion sends every node that reads or makes a complex tensor here (``COMPLEX_CONVERTERS``)
and checks each result against torch's fake tensor, complex64 read as f32[..., 2].
"""

from __future__ import annotations

import numpy as np

from fexplore.ir import DType, Value

from . import movement as mv
from . import reduction as red
from .elementwise import _identity
from .registry import ConvertContext, complex_converter, is_complex, part_dtype

# -- operands: a complex value as its (real, imaginary) parts ------------------------------------


def _parts(ctx: ConvertContext, z: Value):
    """(re, im) of a complex value in the real layout, each of the complex shape."""
    last = z.type.rank - 1
    re = ctx.emit("select", [z], {"axis": last, "index": 0})
    im = ctx.emit("select", [z], {"axis": last, "index": 1})
    return re, im


def pack_parts(ctx: ConvertContext, re, im) -> Value:
    """The real layout of re + i*im (im None: zero)."""
    re = ctx.value(re)
    if im is None:
        im = ctx.emit("full", [], {"shape": re.type.shape, "value": 0.0, "dtype": re.type.dtype})
    im = ctx.value(im)
    if im.type.shape != re.type.shape:  # a broadcast operand (a real tensor times i, say)
        shape = ctx.out_type().shape[:-1]
        re = re if re.type.shape == shape else ctx.emit("expand", [re], {"shape": shape})
        im = im if im.type.shape == shape else ctx.emit("expand", [im], {"shape": shape})
    if im.type.dtype != re.type.dtype:
        im = ctx.emit("cast", [im], {"dtype": re.type.dtype})
    shape = re.type.shape + (1,)
    parts = [ctx.emit("reshape", [p], {"shape": shape}) for p in (re, im)]
    return ctx.emit("concat", parts, {"axis": len(shape) - 1})


def _operand(ctx: ConvertContext, i: int, name: str | None = None):
    """Argument i as (re, im): im None for a real operand; Python numbers stay numbers."""
    fx = ctx.node.args[i] if i < len(ctx.node.args) else ctx.node.kwargs.get(name)
    x = ctx.arg(i, name)
    if isinstance(x, Value):
        return _parts(ctx, x) if is_complex(fx) else (x, None)
    if isinstance(x, complex):
        return x.real, x.imag
    return x, None


def _out_dtype(ctx) -> DType:
    return part_dtype(ctx.meta.dtype)


def _cast(ctx, v, dt: DType):
    if isinstance(v, Value) and v.type.dtype != dt:
        return ctx.emit("cast", [v], {"dtype": dt})
    return v


def _bin(ctx, op: str, a, b):
    """a op b where either may be None (a zero part)."""
    if a is None:
        return None if b is None else (b if op == "add" else
                                       ctx.emit("neg", [b]) if op == "sub" else None)
    if b is None:
        return a if op in ("add", "sub") else None
    return ctx.emit(op, [a, b])


def _scale(ctx, x, alpha):
    if alpha == 1 or x is None:
        return x
    return ctx.emit("mul", [x, alpha])


# -- making and unmaking complex values -----------------------------------------------------------

@complex_converter("aten.view_as_complex.default", "aten.view_as_real.default",
                   "aten.view_as_complex_copy.default", "aten.view_as_real_copy.default",
                   "aten.resolve_conj.default", "aten.resolve_neg.default",
                   "aten.clone.default", "aten.alias.default", "aten.detach.default",
                   "aten.contiguous.default", "aten.lift_fresh_copy.default",
                   "aten.copy.default", "aten.alias_copy.default", "aten.dropout.default")
def _same_layout(ctx):
    # view_as_complex / view_as_real change only how torch reads the pairs: the IR's value is
    # the same. (torch asks for a trailing dim of 2 with stride 1; the IR has no strides.)
    return _identity(ctx)


@complex_converter("aten.polar.default")
def _polar(ctx):
    r, theta = ctx.args[0], ctx.args[1]
    return pack_parts(ctx, ctx.emit("mul", [r, ctx.emit("cos", [theta])]),
                 ctx.emit("mul", [r, ctx.emit("sin", [theta])]))


@complex_converter("aten.complex.default")
def _complex(ctx):
    return pack_parts(ctx, ctx.args[0], ctx.args[1])


@complex_converter("aten.real.default", "aten.imag.default")
def _real_imag(ctx):
    re, im = _parts(ctx, ctx.args[0])
    return re if str(ctx.node.target).startswith("aten.real") else im


@complex_converter("aten._to_copy.default", "aten.to.dtype", "aten.to.dtype_layout",
                   "aten._to_dtype.default", "aten.type_as.default")
def _to_copy(ctx):
    src_complex = is_complex(ctx.node.args[0])
    dt = _out_dtype(ctx)
    x = ctx.args[0]
    if src_complex and is_complex(ctx.node):  # complex64 <-> complex128: both parts
        return _cast(ctx, x, dt)
    if src_complex:  # complex to real keeps the real part (torch warns that imag is lost)
        return _cast(ctx, _parts(ctx, x)[0], dt)
    return pack_parts(ctx, _cast(ctx, x, dt), None)


def _complex_fill(ctx, value):
    shape = ctx.out_type().shape[:-1]
    dt = _out_dtype(ctx)
    value = complex(value)
    re = ctx.emit("full", [], {"shape": shape, "value": float(value.real), "dtype": dt})
    im = ctx.emit("full", [], {"shape": shape, "value": float(value.imag), "dtype": dt})
    return pack_parts(ctx, re, im)


@complex_converter("aten.zeros.default", "aten.zeros_like.default", "aten.new_zeros.default",
                   "aten.empty.memory_format", "aten.empty_like.default",
                   "aten.new_empty.default", "aten.empty_strided.default",
                   "aten.empty_permuted.default")
def _zeros(ctx):
    return _complex_fill(ctx, 0)


@complex_converter("aten.ones.default", "aten.ones_like.default", "aten.new_ones.default")
def _ones(ctx):
    return _complex_fill(ctx, 1)


@complex_converter("aten.full.default", "aten.full_like.default")
def _full(ctx):
    return _complex_fill(ctx, ctx.args[1])


@complex_converter("aten.scalar_tensor.default")
def _scalar_tensor(ctx):
    return _complex_fill(ctx, ctx.args[0])


# -- arithmetic -----------------------------------------------------------------------------------

def _cmul(ctx, x, y):
    """(a + bi)(c + di) = (ac - bd) + (ad + bc)i, as parts."""
    (a, b), (c, d) = x, y
    re = _bin(ctx, "sub", _bin(ctx, "mul", a, c), _bin(ctx, "mul", b, d))
    im = _bin(ctx, "add", _bin(ctx, "mul", a, d), _bin(ctx, "mul", b, c))
    return re, im


def _creciprocal(ctx, x):
    """1 / (a + bi) = (a - bi) / (a^2 + b^2), as parts."""
    a, b = x
    den = ctx.emit("add", [ctx.emit("mul", [a, a]), ctx.emit("mul", [b, b])])
    return ctx.emit("div", [a, den]), ctx.emit("neg", [ctx.emit("div", [b, den])])


@complex_converter("aten.mul.Tensor", "aten.mul.Scalar")
def _mul(ctx):
    re, im = _cmul(ctx, _operand(ctx, 0), _operand(ctx, 1))
    return pack_parts(ctx, _cast(ctx, re, _out_dtype(ctx)), _cast(ctx, im, _out_dtype(ctx)))


@complex_converter("aten.reciprocal.default")
def _reciprocal(ctx):
    return pack_parts(ctx, *_creciprocal(ctx, _parts(ctx, ctx.args[0])))


@complex_converter("aten.pow.Tensor_Scalar")
def _pow(ctx):
    """z ** n for an integer n, by repeated squaring (z ** 2 in a model is a product)."""
    n = ctx.args[1]
    if isinstance(n, float) and n.is_integer():
        n = int(n)
    if not isinstance(n, int) or isinstance(n, bool):
        raise NotImplementedError(f"a complex power with exponent {n!r} (integers only)")
    if n == 0:
        return _complex_fill(ctx, 1)
    base = _parts(ctx, ctx.args[0])
    if n < 0:
        base, n = _creciprocal(ctx, base), -n
    result = (1.0, None)
    while n:
        if n & 1:
            result = base if result == (1.0, None) else _cmul(ctx, result, base)
        n >>= 1
        if n:
            base = _cmul(ctx, base, base)
    return pack_parts(ctx, *result)


def _add_sub(op):
    def conv(ctx):
        (a, b), (c, d) = _operand(ctx, 0), _operand(ctx, 1)
        alpha = ctx.kwargs.get("alpha", 1)
        c, d = _scale(ctx, c, alpha), _scale(ctx, d, alpha)
        re, im = _bin(ctx, op, a, c), _bin(ctx, op, b, d)
        return pack_parts(ctx, _cast(ctx, re, _out_dtype(ctx)), _cast(ctx, im, _out_dtype(ctx)))

    return conv


complex_converter("aten.add.Tensor", "aten.add.Scalar")(_add_sub("add"))
complex_converter("aten.sub.Tensor", "aten.sub.Scalar")(_add_sub("sub"))


@complex_converter("aten.div.Tensor", "aten.div.Scalar")
def _div(ctx):
    (a, b), (c, d) = _operand(ctx, 0), _operand(ctx, 1)
    if d is None:  # by a real divisor: each part
        re, im = ctx.emit("div", [a, c]), _bin(ctx, "div", b, c)
    else:  # (a + bi) / (c + di) = ((ac + bd) + (bc - ad)i) / (c^2 + d^2)
        den = ctx.emit("add", [ctx.emit("mul", [c, c]), ctx.emit("mul", [d, d])])
        re = ctx.emit("div", [_bin(ctx, "add", _bin(ctx, "mul", a, c), _bin(ctx, "mul", b, d)),
                              den])
        num_im = _bin(ctx, "sub", _bin(ctx, "mul", b, c), _bin(ctx, "mul", a, d))
        im = ctx.emit("div", [num_im, den])
    return pack_parts(ctx, _cast(ctx, re, _out_dtype(ctx)), _cast(ctx, im, _out_dtype(ctx)))


@complex_converter("aten.mm.default", "aten.bmm.default", "aten.matmul.default")
def _matmul(ctx):
    (a, b), (c, d) = _operand(ctx, 0), _operand(ctx, 1)
    dt = _out_dtype(ctx)
    a, b, c, d = (_cast(ctx, v, dt) for v in (a, b, c, d))  # a real operand: the parts' dtype
    re = _bin(ctx, "sub", _bin(ctx, "matmul", a, c), _bin(ctx, "matmul", b, d))
    im = _bin(ctx, "add", _bin(ctx, "matmul", a, d), _bin(ctx, "matmul", b, c))
    return pack_parts(ctx, re, im)


@complex_converter("aten.neg.default")
def _neg(ctx):
    return ctx.emit("neg", [ctx.args[0]])


@complex_converter("aten.conj_physical.default", "aten._conj.default", "aten.conj.default",
                   "aten._conj_physical.default")
def _conj(ctx):
    re, im = _parts(ctx, ctx.args[0])
    return pack_parts(ctx, re, ctx.emit("neg", [im]))


@complex_converter("aten.abs.default")
def _abs(ctx):
    re, im = _parts(ctx, ctx.args[0])
    return ctx.emit("sqrt", [ctx.emit("add", [ctx.emit("mul", [re, re]),
                                              ctx.emit("mul", [im, im])])])


@complex_converter("aten.exp.default")
def _exp(ctx):
    re, im = _parts(ctx, ctx.args[0])
    m = ctx.emit("exp", [re])
    return pack_parts(ctx, ctx.emit("mul", [m, ctx.emit("cos", [im])]),
                 ctx.emit("mul", [m, ctx.emit("sin", [im])]))


# -- views and data movement: the real layout's, with dims counted on the complex shape ---------

def _with_dims(real_conv, *positions, names=("dim", "dims"), extra: int = 0):
    """Run a real converter on the real layout after resolving its dim arguments (an int or a
    list, at ``positions`` or under ``names``) against the complex rank (+ ``extra`` for ops
    that add an axis), so that -1 means the last complex axis, not the pair axis."""

    def conv(ctx):
        first = ctx.args[0][0] if isinstance(ctx.args[0], (list, tuple)) else ctx.args[0]
        rank = first.type.rank - 1 + extra

        def norm(d):
            if isinstance(d, (list, tuple)):
                return type(d)(norm(x) for x in d)
            return d % rank if isinstance(d, int) and rank else d

        args = list(ctx.args)
        for p in positions:
            if p < len(args) and args[p] is not None:
                args[p] = norm(args[p])
        ctx.args = tuple(args)
        ctx.kwargs = {k: norm(v) if k in names and v is not None else v
                      for k, v in ctx.kwargs.items()}
        return real_conv(ctx)

    return conv


# Views whose converters read the result shape from torch (the real layout's, here).
complex_converter("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default",
                  "aten.view_copy.default", "aten.unsqueeze.default", "aten.squeeze.dim",
                  "aten.squeeze.dims", "aten.squeeze.default", "aten.flatten.using_ints",
                  "aten.unflatten.int", "aten.unsqueeze_copy.default",
                  "aten.squeeze_copy.dim")(mv._reshape)
complex_converter("aten.expand.default", "aten.expand_copy.default", "aten.expand_as.default",
                  "aten.broadcast_to.default")(mv._expand)
complex_converter("aten.slice.Tensor", "aten.slice_copy.Tensor")(_with_dims(mv._slice, 1))
complex_converter("aten.select.int", "aten.select_copy.int")(_with_dims(mv._select, 1))
complex_converter("aten.narrow.default")(_with_dims(mv._narrow, 1))
complex_converter("aten.cat.default", "aten.concat.default",
                  "aten.concatenate.default")(_with_dims(mv._cat, 1))
complex_converter("aten.stack.default")(_with_dims(mv._stack, 1, extra=1))
complex_converter("aten.split_with_sizes.default", "aten.split.Tensor", "aten.split.sizes",
                  "aten.chunk.default", "aten.tensor_split.sections",
                  "aten.split_with_sizes_copy.default")(_with_dims(mv._split, 2))
complex_converter("aten.unbind.int", "aten.unbind_copy.int")(_with_dims(mv._unbind, 1))
complex_converter("aten.index_select.default")(_with_dims(mv._index_select, 1))
complex_converter("aten.index.Tensor", "aten._unsafe_index.Tensor")(mv._index)
complex_converter("aten.flip.default")(_with_dims(mv._flip, 1))
complex_converter("aten.roll.default")(_with_dims(mv._roll, 2))
complex_converter("aten.repeat_interleave.self_int")(_with_dims(mv._repeat_interleave, 2))


@complex_converter("aten.permute.default", "aten.permute_copy.default")
def _permute(ctx):
    x = ctx.args[0]
    rank = x.type.rank - 1
    perm = tuple(p % rank for p in ctx.args[1]) + (rank,)
    if perm == tuple(range(rank + 1)):
        return x
    return ctx.emit("permute", [x], {"perm": perm})


@complex_converter("aten.transpose.int", "aten.t.default", "aten.transpose_copy.int",
                   "aten.swapaxes.default")
def _transpose(ctx):
    x = ctx.args[0]
    rank = x.type.rank - 1
    if rank < 2:
        return x
    d0, d1 = (ctx.args[1], ctx.args[2]) if len(ctx.args) > 2 else (0, 1)
    perm = list(range(rank + 1))
    a, b = d0 % rank, d1 % rank
    perm[a], perm[b] = perm[b], perm[a]
    return ctx.emit("permute", [x], {"perm": tuple(perm)})


@complex_converter("aten.repeat.default")
def _repeat(ctx):
    ctx.args = (ctx.args[0], tuple(ctx.args[1]) + (1,)) + tuple(ctx.args[2:])
    return mv._repeat(ctx)


@complex_converter("aten.sum.dim_IntList", "aten.sum.default", "aten.mean.dim",
                   "aten.mean.default")
def _sum_mean(ctx):
    """Sums and means of complex values: of both parts, over the complex axes."""
    x = ctx.args[0]
    rank = x.type.rank - 1
    dims = ctx.arg(1, "dim")
    keep = ctx.arg(2, "keepdim", False)
    if dims is None or isinstance(dims, bool) or (isinstance(dims, (list, tuple)) and not dims):
        dims, keep = list(range(rank)), bool(keep) if not isinstance(dims, bool) else False
    op = "mean" if "mean" in str(ctx.node.target) else "sum"
    axes = red._axes(dims, rank)
    y = ctx.emit(op, [x], {"axes": axes, "keepdim": bool(keep)})
    return _cast(ctx, y, _out_dtype(ctx))


@complex_converter("aten.where.self")
def _where(ctx):
    cond = ctx.args[0]
    (a, b), (c, d) = _operand(ctx, 1), _operand(ctx, 2)
    re = ctx.emit("where", [cond, a, c])
    zero = 0.0
    im = ctx.emit("where", [cond, b if b is not None else zero, d if d is not None else zero])
    return pack_parts(ctx, _cast(ctx, re, _out_dtype(ctx)), _cast(ctx, im, _out_dtype(ctx)))


# -- discrete Fourier transforms: contractions with constant cos / sin tables ---------------------
#
# A DFT along one axis of n points is a matrix product: X_k = sum_j x_j e^(-+2 pi i jk/n), so with
# C[j, k] = cos(2 pi jk/n) and S[j, k] = sin(2 pi jk/n), the forward transform of re + i im is
# (re C + im S) + i (im C - re S) and the inverse (re C - im S) + i (im C + re S). The tables are
# constants, so a transform is two to four contractions on the tensor unit per axis (an FFT's
# butterflies do fewer flops, but a small DFT is what a tensor unit does best). torch's scaling
# (none, 1/sqrt(n), 1/n over all transformed axes) is folded into the tables axis by axis.

_NORM = {0: lambda n: 1.0, 1: lambda n: n ** -0.5, 2: lambda n: 1.0 / n}


def _dft_tables(ctx, n: int, m: int, scale, dt: DType, period: int | None = None):
    """(C, S): [n, m] tables of cos and sin(2 pi jk / period) for inputs j < n and outputs k < m
    (period: the transform's length, n by default; longer when the input is zero-padded to it),
    times `scale` (a number, or one weight per input j), as constants of dtype `dt`."""
    period = period or n
    j = np.arange(n, dtype=np.float64)[:, None]
    k = np.arange(m, dtype=np.float64)[None, :]
    angle = 2 * np.pi * ((j * k) % period) / period   # exact reduction first: large jk stay precise
    scale = np.reshape(np.asarray(scale, dtype=np.float64), (-1, 1))
    name = f"{ctx.node.name}.dft{period}x{m}"
    return (ctx.b.literal((np.cos(angle) * scale).astype(dt.numpy), name + ".cos"),
            ctx.b.literal((np.sin(angle) * scale).astype(dt.numpy), name + ".sin"))


def _along(ctx, x, axis: int, table):
    """x contracted with `table` ([n, m]) along `axis`: that axis becomes m long."""
    if x is None:
        return None
    rank = x.type.rank
    if axis == rank - 1:
        return ctx.emit("matmul", [x, table])
    perm = tuple(a for a in range(rank) if a != axis) + (axis,)
    back = tuple(perm.index(a) for a in range(rank))
    y = ctx.emit("matmul", [ctx.emit("permute", [x], {"perm": perm}), table])
    return ctx.emit("permute", [y], {"perm": back})


def _first(ctx, x, axis: int, n: int):
    """x's first n entries along `axis` (x itself when it has no more)."""
    if x is None or x.type.shape[axis] <= n:
        return x
    return ctx.emit("slice", [x], {"axis": axis, "start": 0, "end": n})


def dft_parts(ctx, re, im, axis: int, m: int, inverse: bool, scale: float, length: int | None = None):
    """(re, im) of the DFT of re + i im (im None: a real input) along `axis`, of `length` points
    (the input's own by default; a shorter input counts as zero-padded to it, a longer one is cut
    to it), keeping the first m outputs."""
    length = length or re.type.shape[axis]
    re, im = _first(ctx, re, axis, length), _first(ctx, im, axis, length)
    C, S = _dft_tables(ctx, re.type.shape[axis], m, scale, re.type.dtype, length)
    rc, rs = _along(ctx, re, axis, C), _along(ctx, re, axis, S)
    ic, is_ = _along(ctx, im, axis, C), _along(ctx, im, axis, S)
    if inverse:
        return _bin(ctx, "sub", rc, is_), _bin(ctx, "add", ic, rs)
    return _bin(ctx, "add", rc, is_), _bin(ctx, "sub", ic, rs)


def real_from_half_spectrum(ctx, re, im, axis: int, length: int, scale: float):
    """The real inverse DFT of `length` points along `axis` from its first length // 2 + 1
    outputs (re + i im; fewer count as zero): each stored output but the first (and the middle
    one of an even length) counts twice, for its conjugate. Only the real part is computed: sin
    vanishes where an imaginary part is not determined (the first and the middle output)."""
    K = min(re.type.shape[axis], length // 2 + 1)
    re, im = _first(ctx, re, axis, K), _first(ctx, im, axis, K)
    halves = [scale * (1.0 if k == 0 or 2 * k == length else 2.0) for k in range(K)]
    C, S = _dft_tables(ctx, K, length, halves, re.type.dtype, period=length)   # stored k in, j out
    y = _along(ctx, re, axis, C)
    return y if im is None else ctx.emit("sub", [y, _along(ctx, im, axis, S)])


def _fft_axes(ctx, rank: int) -> list[int]:
    dims = ctx.arg(1, "dim")
    dims = [dims] if isinstance(dims, int) else list(dims)
    return [d % rank for d in dims]


def _scale_of(ctx, shape, axes, sizes=None) -> list[float]:
    """Per axis, its share of torch's scaling (normalization 0, 1 or 2 over the product of the
    signal sizes); `sizes` overrides the signal size of an axis (c2r's output length)."""
    mode = ctx.arg(2, "normalization")
    if mode not in _NORM:
        raise NotImplementedError(f"FFT normalization mode {mode!r}")
    return [_NORM[mode]((sizes or {}).get(a, shape[a])) for a in axes]


@complex_converter("aten._fft_c2c.default")
def _fft_c2c(ctx):
    re, im = _parts(ctx, ctx.args[0])
    axes = _fft_axes(ctx, re.type.rank)
    inverse = not ctx.arg(3, "forward")
    for a, s in zip(axes, _scale_of(ctx, re.type.shape, axes)):
        re, im = dft_parts(ctx, re, im, a, re.type.shape[a], inverse, s)
    return pack_parts(ctx, _cast(ctx, re, _out_dtype(ctx)), _cast(ctx, im, _out_dtype(ctx)))


@complex_converter("aten._fft_r2c.default")
def _fft_r2c(ctx):
    """A real input's transform; `onesided` keeps the last axis' first n // 2 + 1 outputs (the
    rest are their conjugates), transformed first, as a real input, and the other axes after."""
    x = ctx.args[0]
    axes = _fft_axes(ctx, x.type.rank)
    scales = _scale_of(ctx, x.type.shape, axes)
    last = axes[-1]
    n = x.type.shape[last]
    m = n // 2 + 1 if ctx.arg(3, "onesided") else n
    re, im = dft_parts(ctx, x, None, last, m, False, scales[-1])
    for a, s in zip(axes[:-1], scales[:-1]):
        re, im = dft_parts(ctx, re, im, a, re.type.shape[a], False, s)
    return pack_parts(ctx, _cast(ctx, re, _out_dtype(ctx)), _cast(ctx, im, _out_dtype(ctx)))


@complex_converter("aten._fft_c2r.default")
def _fft_c2r(ctx):
    """The inverse of a onesided transform: the other axes as complex inverses, then the last
    axis from its stored half to `last_dim_size` real values."""
    re, im = _parts(ctx, ctx.args[0])
    axes = _fft_axes(ctx, re.type.rank)
    last = axes[-1]
    N = ctx.arg(3, "last_dim_size")
    scales = _scale_of(ctx, re.type.shape, axes, {last: N})
    for a, s in zip(axes[:-1], scales[:-1]):
        re, im = dft_parts(ctx, re, im, a, re.type.shape[a], True, s)
    return _cast(ctx, real_from_half_spectrum(ctx, re, im, last, N, scales[-1]), _out_dtype(ctx))


@complex_converter("aten.constant_pad_nd.default", "aten.pad.default")
def _pad(ctx):
    """Zero padding (a transform's signal padded to its length) is the real layout's, the pair
    axis left as is; another fill pads each part with its own part of the value."""
    value = complex(mv.constant_pad_value(ctx) or 0)
    x, pads = mv._crop_negative_pads(ctx, ctx.args[0], (0, 0) + tuple(ctx.args[1]))
    if not any(pads):
        return x
    if value == 0:
        return ctx.emit("pad", [x], {"pads": pads, "value": 0.0})
    re, im = _parts(ctx, x)
    part_pads = pads[2:]
    return pack_parts(ctx, ctx.emit("pad", [re], {"pads": part_pads, "value": value.real}),
                      ctx.emit("pad", [im], {"pads": part_pads, "value": value.imag}))

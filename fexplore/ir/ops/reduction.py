"""Reductions and the ops built around one: sum, mean, amax, amin, any, argmax, var, softmax,
log_softmax, and the scans cumsum, cumprod, logcumsumexp, cummax and cummin."""

from __future__ import annotations

import numpy as np

from ..opdef import AttrSpec, Category, Cost, OpDef, elementwise_cost, io_bytes
from ..opset import register
from ..types import DType, TensorType, numel
from .rules import float_result, norm_axes, norm_axis, zero_d_as_vector

_AXES = AttrSpec("axes", "ints", ())  # () reduces every axis
_KEEPDIM = AttrSpec("keepdim", "bool", False)


def _reduced_shape(t: TensorType, axes, keepdim):
    axes = norm_axes(axes, t.rank)
    if keepdim:
        return tuple(1 if i in axes else d for i, d in enumerate(t.shape))
    return tuple(d for i, d in enumerate(t.shape) if i not in axes)


def _reduction_cost(ins, outs, attrs) -> Cost:
    return Cost(flops=numel(ins[0].shape), bytes=io_bytes(ins, outs))


def reduction(name, fn, *, result="same", extra_attrs=()):
    """``result``: 'same' keeps the dtype, 'float' makes ints f32, 'bool' gives bool,
    'sum' follows torch.sum (bool and ints accumulate to i64)."""

    def infer(ins, a):
        (t,) = ins
        dt = t.dtype
        if result == "float":
            dt = float_result(dt)
        elif result == "bool":
            dt = DType.bool
        elif result == "sum" and not dt.is_float:
            dt = DType.i64
        return [TensorType(_reduced_shape(t, a["axes"], a["keepdim"]), dt)]

    def reference(xs, a):
        (x,) = xs
        axes = norm_axes(a["axes"], x.ndim)
        if result in ("float", "sum") and x.dtype.kind == "f":
            x = x.astype(np.float64)  # accumulate wide, as torch's pairwise sums come close to
        return [fn(x, axis=axes, keepdims=a["keepdim"], **{k: a[k] for k, *_ in extra_attrs})]

    attrs = (_AXES, _KEEPDIM) + tuple(AttrSpec(*e) for e in extra_attrs)
    return register(OpDef(name, Category.reduction, infer, reference, _reduction_cost,
                          attrs=attrs, arity=1))


reduction("sum", lambda x, axis, keepdims: np.sum(x, axis=axis, keepdims=keepdims), result="sum")
reduction("prod", lambda x, axis, keepdims: np.prod(x, axis=axis, keepdims=keepdims),
          result="sum")
reduction("mean", lambda x, axis, keepdims: np.mean(x, axis=axis, keepdims=keepdims),
          result="float")
reduction("amax", lambda x, axis, keepdims: np.max(x, axis=axis, keepdims=keepdims))
reduction("amin", lambda x, axis, keepdims: np.min(x, axis=axis, keepdims=keepdims))
reduction("any", lambda x, axis, keepdims: np.any(x, axis=axis, keepdims=keepdims), result="bool")
reduction("var", lambda x, axis, keepdims, correction: np.var(x, axis=axis, keepdims=keepdims,
                                                              ddof=correction),
          result="float", extra_attrs=[("correction", "number", 1)])


def _argmax_type(ins, a):
    (t,) = ins
    if a["axis"] is None:
        shape = (1,) * t.rank if a["keepdim"] else ()
    else:
        shape = _reduced_shape(t, (a["axis"],), a["keepdim"])
    return [TensorType(shape, DType.i64)]


def _arg_extreme(pick):
    def ref(xs, a):
        (x,) = xs
        if x.dtype == np.bool_:
            x = x.astype(np.int8)
        if a["axis"] is None:
            r = pick(x.reshape(-1))
            return [np.asarray(r).reshape((1,) * x.ndim if a["keepdim"] else ())]
        return [pick(x, axis=norm_axis(a["axis"], x.ndim), keepdims=a["keepdim"])]

    return ref


# The first extreme wins; a NaN counts as the extreme, as in torch.
for _name, _pick in (("argmax", np.argmax), ("argmin", np.argmin)):
    register(OpDef(_name, Category.reduction, _argmax_type, zero_d_as_vector(_arg_extreme(_pick)),
                   _reduction_cost, attrs=(AttrSpec("axis", "int", None, optional=True), _KEEPDIM),
                   arity=1))


# -- softmax family: a reduction with its surroundings, kept whole for fusion ---------------------

def _softmax_type(ins, a):
    (t,) = ins
    norm_axis(a["axis"], t.rank)
    return [TensorType(t.shape, float_result(t.dtype))]


def _softmax_ref(xs, a):
    x = xs[0].astype(np.float64)
    axis = norm_axis(a["axis"], x.ndim)
    m = np.max(x, axis=axis, keepdims=True, initial=-np.inf)  # initial: empty rows
    m = np.where(np.isfinite(m), m, 0.0)  # a row of -inf gives NaN, as torch does, not a warning
    e = np.exp(x - m)
    return [e / np.sum(e, axis=axis, keepdims=True)]


def _log_softmax_ref(xs, a):
    x = xs[0].astype(np.float64)
    axis = norm_axis(a["axis"], x.ndim)
    m = np.max(x, axis=axis, keepdims=True, initial=-np.inf)  # initial: empty rows
    m = np.where(np.isfinite(m), m, 0.0)
    return [x - m - np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True))]


_AXIS = AttrSpec("axis", "int")
register(OpDef("softmax", Category.reduction, _softmax_type, zero_d_as_vector(_softmax_ref),
               elementwise_cost(5),
               attrs=(_AXIS,), arity=1))
register(OpDef("log_softmax", Category.reduction, _softmax_type,
               zero_d_as_vector(_log_softmax_ref),
               elementwise_cost(5), attrs=(_AXIS,), arity=1))


def _cumsum_type(ins, a):
    (t,) = ins
    norm_axis(a["axis"], t.rank)
    dt = t.dtype if t.dtype.is_float else DType.i64
    return [TensorType(t.shape, dt)]


def _scan(fn):
    """A running sum or product along 'axis': floats accumulate in f64, bools and ints in i64."""

    def reference(xs, a):
        x = xs[0]
        if x.dtype.kind == "f":
            x = x.astype(np.float64)
        elif x.dtype.kind == "b":
            x = x.astype(np.int64)
        return [fn(x, axis=norm_axis(a["axis"], x.ndim))]

    return reference


register(OpDef("cumsum", Category.reduction, _cumsum_type, zero_d_as_vector(_scan(np.cumsum)),
               elementwise_cost(1),
               attrs=(_AXIS,), arity=1))


register(OpDef("cumprod", Category.reduction, _cumsum_type, zero_d_as_vector(_scan(np.cumprod)),
               elementwise_cost(1), attrs=(_AXIS,), arity=1,
               doc="running product along 'axis'; bools and ints accumulate in i64"))


def _logcumsumexp_ref(xs, a):
    """log(cumsum(exp(x))) along 'axis' as a running log-add-exp (in f64, from -inf): no exp of
    the whole row, so a row whose values span more than exp's range keeps its small terms."""
    x = xs[0].astype(np.float64)
    if not x.size:
        return [x]
    return [np.logaddexp.accumulate(x, axis=norm_axis(a["axis"], x.ndim))]


register(OpDef("logcumsumexp", Category.reduction, _softmax_type, zero_d_as_vector(_logcumsumexp_ref),
               elementwise_cost(4), attrs=(_AXIS,), arity=1,
               doc="log(cumsum(exp(x))) along 'axis', computed as a running log-add-exp"))


def _cum_extreme_type(ins, a):
    (t,) = ins
    norm_axis(a["axis"], t.rank)
    return [TensorType(t.shape, t.dtype), TensorType(t.shape, DType.i64)]


def _cum_extreme(better):
    """torch's cummax/cummin: the running extreme and the index it was last seen at (a tie moves
    the index forward); once a NaN is seen it is the extreme from there on."""

    def ref(xs, a):
        x = xs[0]
        axis = norm_axis(a["axis"], x.ndim)
        xm = np.moveaxis(x, axis, -1)
        values = np.empty_like(xm)
        index = np.zeros(xm.shape, np.int64)
        floats = xm.dtype.kind == "f"
        if xm.shape[-1] and xm.size:
            cur, at = xm[..., 0].copy(), np.zeros(xm.shape[:-1], np.int64)
            for i in range(xm.shape[-1]):
                v = xm[..., i]
                take = better(v, cur)
                if floats:
                    take = np.isnan(v) | (~np.isnan(cur) & take)
                cur = np.where(take, v, cur)
                at = np.where(take, i, at)
                values[..., i], index[..., i] = cur, at
        return [np.moveaxis(values, -1, axis), np.moveaxis(index, -1, axis)]

    return ref


for _name, _better in (("cummax", np.greater_equal), ("cummin", np.less_equal)):
    register(OpDef(_name, Category.reduction, _cum_extreme_type,
                   zero_d_as_vector(_cum_extreme(_better)), elementwise_cost(1),
                   attrs=(_AXIS,), arity=1,
                   doc="(values, indices): the running extreme along 'axis' and where it is"))

"""Converters for reductions, softmax and cumsum."""

from __future__ import annotations

from fexplore.ir import DType

from .registry import ConvertContext, converter, ir_dtype


def _ax(d: int, rank: int) -> int:
    return d % rank if rank else 0  # a 0-d tensor's one "axis" is dim 0 (or -1), as in torch


def _axes(dims, rank):
    if dims is None:
        return ()
    if isinstance(dims, int):
        dims = [dims]
    return tuple(sorted(d % rank for d in dims)) if rank else ()


def _maybe_cast(ctx: ConvertContext, x):
    dt = ctx.kwargs.get("dtype")
    if dt is not None and ir_dtype(dt) != x.type.dtype:
        return ctx.emit("cast", [x], {"dtype": ir_dtype(dt)})
    return x


def _reduce(op):
    def conv(ctx: ConvertContext):
        x = _maybe_cast(ctx, ctx.args[0])
        dims = ctx.arg(1, "dim")
        keep = ctx.arg(2, "keepdim", False)
        if isinstance(dims, bool):  # any.default / sum.default have no dim argument
            dims, keep = None, False
        y = ctx.emit(op, [x], {"axes": _axes(dims, x.type.rank), "keepdim": bool(keep)})
        if op == "any" and x.type.dtype == DType.u8:  # torch's any/all of u8 answer in u8
            y = ctx.emit("cast", [y], {"dtype": DType.u8})
        dt = ctx.kwargs.get("dtype")
        if dt is not None and y.type.dtype != ir_dtype(dt):   # an integer sum widens to i64 unless told
            y = ctx.emit("cast", [y], {"dtype": ir_dtype(dt)})
        return y

    return conv


for _aten, _ir in [("sum", "sum"), ("mean", "mean"), ("amax", "amax"), ("amin", "amin"),
                   ("any", "any")]:
    converter(f"aten.{_aten}.dim_IntList", f"aten.{_aten}.default", f"aten.{_aten}.dim",
              f"aten.{_aten}.dims")(_reduce(_ir))
# the 0-d tensor torch.export puts before a runtime check (torch._check on a tensor condition)
converter("aten._is_any_true.default")(_reduce("any"))

converter("aten.max.default")(_reduce("amax"))
converter("aten.min.default")(_reduce("amin"))


@converter("aten.all.default", "aten.all.dim", "aten.all.dims", "aten._is_all_true.default")
def _all(ctx):
    # all(x) == not any(not x)
    x = ctx.args[0]
    if x.type.dtype != DType.bool:
        x = ctx.emit("ne", [x, 0])
    inner = _reduce("any")
    ctx.args = (ctx.emit("logical_not", [x]),) + tuple(ctx.args[1:])
    return ctx.emit("logical_not", [inner(ctx)])


def _value_and_index(red_op):
    def conv(ctx: ConvertContext):
        x, dim = ctx.args[0], ctx.args[1]
        keep = ctx.arg(2, "keepdim", False)
        if x.type.rank == 0:   # torch takes dim 0 (or -1) of a 0-d tensor as its one element
            return x, ctx.value(0)
        ax = _ax(dim, x.type.rank)
        values = ctx.emit(red_op, [x], {"axes": (ax,), "keepdim": keep})
        arg = "argmax" if red_op == "amax" else "argmin"
        return (values, ctx.emit(arg, [x], {"axis": ax, "keepdim": keep}))

    return conv


converter("aten.max.dim")(_value_and_index("amax"))
converter("aten.min.dim")(_value_and_index("amin"))


@converter("aten.argmax.default")
def _argmax(ctx):
    x = ctx.args[0]
    dim = ctx.arg(1, "dim")
    keep = ctx.arg(2, "keepdim", False)
    return ctx.emit("argmax", [x], {"axis": None if dim is None else _ax(dim, x.type.rank),
                                    "keepdim": keep})


@converter("aten.argmin.default")
def _argmin(ctx):
    x = ctx.args[0]
    dim = ctx.arg(1, "dim")
    keep = ctx.arg(2, "keepdim", False)
    return ctx.emit("argmin", [x],
                    {"axis": None if dim is None else _ax(dim, x.type.rank), "keepdim": keep})


def _var_attrs(ctx):
    x = ctx.args[0]
    dims = ctx.arg(1, "dim")
    correction = ctx.kwargs.get("correction")
    if correction is None:
        unbiased = ctx.kwargs.get("unbiased", ctx.arg(2) if isinstance(ctx.arg(2), bool) else True)
        correction = 1 if unbiased else 0
    keep = ctx.kwargs.get("keepdim", False)
    return {"axes": _axes(dims, x.type.rank), "keepdim": keep, "correction": correction}


@converter("aten.var.correction", "aten.var.dim", "aten.var.default")
def _var(ctx):
    return ctx.emit("var", [ctx.args[0]], _var_attrs(ctx))


@converter("aten.var_mean.correction", "aten.var_mean.dim", "aten.var_mean.default")
def _var_mean(ctx):
    x, attrs = ctx.args[0], _var_attrs(ctx)
    mean = ctx.emit("mean", [x], {"axes": attrs["axes"], "keepdim": attrs["keepdim"]})
    return (ctx.emit("var", [x], attrs), mean)


def _softmax(op):
    def conv(ctx: ConvertContext):
        # the output's dtype differs from the input's by softmax.int's dtype (its third argument,
        # positional) or _softmax's half_to_float: torch casts the input and computes in that dtype
        x = ctx.args[0]
        want = ctx.out_type().dtype
        if x.type.dtype != want:
            x = ctx.emit("cast", [x], {"dtype": want})
        return ctx.emit(op, [x], {"axis": _ax(ctx.args[1], x.type.rank)})

    return conv


converter("aten.softmax.int", "aten._softmax.default", "aten.special_softmax.default")(
    _softmax("softmax"))
converter("aten.log_softmax.int", "aten._log_softmax.default")(_softmax("log_softmax"))


@converter("aten.cumsum.default", "aten.cumprod.default")
def _cumsum(ctx):
    x = _maybe_cast(ctx, ctx.args[0])
    op = str(ctx.node.target).split(".")[1]
    y = ctx.emit(op, [x], {"axis": _ax(ctx.args[1], x.type.rank)})
    want = ctx.out_type().dtype
    # cumsum widens integers to i64 unless a dtype is asked for (MoE offsets ask for i32);
    # the sums agree modulo 2^32, so the narrowing is exact wherever torch's is
    return y if y.type.dtype == want else ctx.emit("cast", [y], {"dtype": want})


@converter("aten.logcumsumexp.default")
def _logcumsumexp(ctx):
    x = ctx.args[0]
    return ctx.emit("logcumsumexp", [x], {"axis": _ax(ctx.args[1], x.type.rank)})


@converter("aten.cummax.default", "aten.cummin.default")
def _cum_extreme(ctx):
    x = ctx.args[0]
    op = str(ctx.node.target).split(".")[1]
    return ctx.emit(op, [x], {"axis": _ax(ctx.args[1], x.type.rank)}, n_results=2)


@converter("aten.prod.dim_int", "aten.prod.default")
def _prod(ctx):
    x = _maybe_cast(ctx, ctx.args[0])
    dim = ctx.arg(1, "dim")
    keep = ctx.arg(2, "keepdim", False)
    return ctx.emit("prod", [x], {"axes": _axes(dim, x.type.rank), "keepdim": bool(keep)})


@converter("aten.linalg_vector_norm.default")
def _vector_norm(ctx):
    x = _maybe_cast(ctx, ctx.args[0])   # dtype=: torch casts the input first
    order = ctx.arg(1, "ord", 2)
    axes = _axes(ctx.arg(2, "dim"), x.type.rank)
    keep = bool(ctx.arg(3, "keepdim", False))
    red = {"axes": axes, "keepdim": keep}
    want = ctx.out_type().dtype
    if order not in (float("inf"), float("-inf"), 0) and x.type.dtype in (DType.f16, DType.bf16):
        # torch's kernel computes an f16/bf16 norm in f32 and rounds once; squares rounded to f16
        # underflow below ~2e-4 and overflow above 256
        x = ctx.emit("cast", [x], {"dtype": DType.f32})
    mag = ctx.emit("abs", [x])
    if order == float("inf"):
        return ctx.emit("amax", [mag], red)
    if order == float("-inf"):
        return ctx.emit("amin", [mag], red)
    if order == 0:  # the number of nonzero elements
        count = ctx.emit("sum", [ctx.emit("ne", [x, 0])], red)
        return ctx.emit("cast", [count], {"dtype": want})
    if order == 2:
        y = ctx.emit("sqrt", [ctx.emit("sum", [ctx.emit("mul", [x, x])], red)])
    elif order == 1:
        y = ctx.emit("sum", [mag], red)
    else:
        p = float(order)
        y = ctx.emit("pow", [ctx.emit("sum", [ctx.emit("pow", [mag, p])], red), 1.0 / p])
    return y if y.type.dtype == want else ctx.emit("cast", [y], {"dtype": want})


@converter("aten.topk.default")
def _topk(ctx):
    x, k = ctx.args[0], ctx.args[1]
    axis = _ax(ctx.arg(2, "dim", -1), x.type.rank)
    return ctx.emit("topk", [x], {"k": k, "axis": axis, "largest": bool(ctx.arg(3, "largest", True))},
                    n_results=2)


@converter("aten.sort.default", "aten.sort.stable")
def _sort(ctx):
    x = ctx.args[0]
    if str(ctx.node.target) == "aten.sort.stable":
        axis, desc = ctx.kwargs.get("dim", -1), ctx.kwargs.get("descending", False)
    else:
        axis, desc = ctx.arg(1, "dim", -1), ctx.arg(2, "descending", False)
    return ctx.emit("sort", [x], {"axis": _ax(axis, x.type.rank), "descending": bool(desc)},
                    n_results=2)


@converter("aten.histc.default")
def _histc(ctx):
    """torch.histc (an MoE router's expert load, say): each element's bin is
    trunc((x - min) * bins / (max - min)), computed in x's dtype in torch's order, the value max
    falling in the last bin and values outside [min, max] in none; the counts are a scatter-add
    of ones into ``bins`` zeros. min == max == 0 (the default) takes the data's own range."""
    x = ctx.args[0]
    bins = int(ctx.arg(1, "bins", 100))
    lo, hi = ctx.arg(2, "min", 0), ctx.arg(3, "max", 0)
    dt = x.type.dtype
    n = 1
    for d in x.type.shape:
        n = n * d
    x = ctx.emit("reshape", [x], {"shape": (n,)}) if x.type.shape != (n,) else x
    if lo == hi == 0:  # the data's range, widened by one either way when it is a single value
        lo = ctx.emit("amin", [x], {"axes": (0,)})
        hi = ctx.emit("amax", [x], {"axes": (0,)})
        same = ctx.emit("eq", [lo, hi])
        lo = ctx.emit("where", [same, ctx.emit("sub", [lo, 1]), lo])
        hi = ctx.emit("where", [same, ctx.emit("add", [hi, 1]), hi])
    else:
        lo, hi = float(lo), float(hi)
        if lo == hi:
            lo, hi = lo - 1, hi + 1
        lo, hi = ctx.scalar(lo, dt), ctx.scalar(hi, dt)
    pos = ctx.emit("div", [ctx.emit("mul", [ctx.emit("sub", [x, lo]), bins]),
                           ctx.emit("sub", [hi, lo])])
    inside = ctx.emit("logical_and", [ctx.emit("ge", [x, lo]), ctx.emit("le", [x, hi])])
    pos = ctx.emit("clamp", [ctx.emit("cast", [pos], {"dtype": DType.i64})],
                   {"min": 0, "max": bins - 1})
    pos = ctx.emit("where", [inside, pos, 0])  # NaN and out-of-range: any bin, weight 0
    ones = ctx.emit("cast", [inside], {"dtype": dt})
    zeros = ctx.emit("full", [], {"shape": (bins,), "value": 0.0, "dtype": dt})
    return ctx.emit("scatter", [zeros, pos, ones], {"axis": 0, "reduce": "add"})


@converter("aten.bucketize.Tensor", "aten.searchsorted.Tensor")
def _bucketize(ctx):
    """The bucket of each value: how many boundaries lie below it (``right``: at or below), a
    comparison with every boundary and a count, as a static shape allows. searchsorted is the same
    with the sorted sequence first, per row when it has leading axes."""
    search = "searchsorted" in str(ctx.node.target)
    seq, x = (ctx.args[0], ctx.args[1]) if search else (ctx.args[1], ctx.args[0])
    if ctx.kwargs.get("sorter") is not None:
        raise NotImplementedError("a searchsorted with a sorter")
    right = ctx.kwargs.get("right", False) or ctx.kwargs.get("side") == "right"
    if not isinstance(x, type(seq)):   # a Python number searched for
        raise NotImplementedError("a bucketize of a Python number")
    if seq.type.rank == 1:
        bs = seq
    elif seq.type.rank == x.type.rank and tuple(seq.type.shape[:-1]) == tuple(x.type.shape[:-1]):
        bs = ctx.emit("reshape", [seq], {"shape": tuple(seq.type.shape[:-1]) + (1, seq.type.shape[-1])})
    else:
        raise NotImplementedError("a sorted sequence whose leading axes are not the values'")
    xs = ctx.emit("reshape", [x], {"shape": tuple(x.type.shape) + (1,)})
    below = ctx.emit("le" if right else "lt", [bs, xs])
    count = ctx.emit("sum", [ctx.emit("cast", [below], {"dtype": DType.i64})],
                     {"axes": (below.type.rank - 1,), "keepdim": False})
    if ctx.kwargs.get("out_int32", False):
        count = ctx.emit("cast", [count], {"dtype": DType.i32})
    return count

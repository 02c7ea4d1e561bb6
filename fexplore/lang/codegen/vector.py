"""The vector-unit parts: one IR node (an elementwise OpDef, a reduction over the last axis, a
norm, softmax) as lines of ``fl`` code on tiles. Both generators use these for everything that is
not a contraction: a whole row-wise region, a contraction's norm prologue and its epilogue.

Each IR elementwise op maps onto the vector unit's op of the same meaning (`VECTOR_OPS`); the
table below is the whole mapping, and `check_table` (run by the tests) keeps it in step with the
IR's opset.
"""

from __future__ import annotations

import numpy as np

from fexplore.ir import Category, DType, Node, all_ops
from fexplore.npu.vector_ops import VECTOR_OPS

from .errors import UnsupportedRegionError
from .source import Names, Writer, fl_dtype, literal

# IR elementwise op -> vector-unit op with the same name and meaning
SAME_NAME = {"exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "tanh", "erf", "erfc",
             "sigmoid", "silu", "neg", "abs", "relu", "floor", "ceil", "round", "sign", "logical_not",
             "add", "sub", "mul", "maximum", "minimum", "pow", "remainder", "fmod", "eq", "ne", "lt", "le",
             "gt", "ge", "logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or", "where",
             "exp2", "log2", "log10", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh",
             "atanh", "trunc", "signbit", "isnan", "isinf", "atan2", "hypot", "copysign", "fmax", "fmin",
             "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift"}
# written with more than one vector op, or with an attribute picking the op
COMPOSED = {"gelu", "div", "clamp", "cast"}
# IR ops that are views the generator treats as identities (the values do not change)
IDENTITY = {"relayout"}
REDUCTIONS = {"sum": "sum", "mean": "mean", "amax": "max", "amin": "min"}
ROW_OPS = {"layer_norm", "rms_norm", "softmax", "log_softmax", "var"}
_OPERATORS = {"add": "+", "sub": "-", "mul": "*", "pow": "**"}
# elementwise IR ops with no per-element meaning on a tile (they depend on the element's position)
POSITIONAL = {"tril", "triu"}


def check_table() -> list[str]:
    """IR elementwise ops the vector parts cannot write (empty when the table is complete)."""
    missing = []
    for op in all_ops().values():
        if op.category != Category.elementwise or op.name in POSITIONAL:
            continue
        if op.name in SAME_NAME:
            if op.name not in VECTOR_OPS:
                missing.append(op.name)
        elif op.name not in COMPOSED:
            missing.append(op.name)
    return missing


def supported(node: Node) -> bool:
    n = node.op.name
    return n in SAME_NAME or n in COMPOSED or n in IDENTITY or n in REDUCTIONS or n in ROW_OPS


class VectorEmitter:
    """Writes vector-unit code for IR nodes into `w`. `axis` is how the code names the last axis
    of a full row (an axis name like ``"C"``, or ``-1``)."""

    def __init__(self, w: Writer, names: Names, region: str, axis: str = "-1"):
        self.w = w
        self.names = names
        self.region = region
        self.axis = axis

    def unsupported(self, node: Node, why: str):
        raise UnsupportedRegionError(node.op.name, self.region, why, loc=node.loc, node=node)

    # -- one node --------------------------------------------------------------------------------
    def node(self, node: Node, args: list[str], last_axis: int, write: DType | None = None) -> str:
        """Emit `node` applied to `args` (tile names or literals); return the result's name.
        `last_axis` is the index, in IR terms, that the code's last tile axis stands for. `write`:
        for a norm or softmax, the dtype to write its result in instead of its own, when its one
        consumer casts it there (the unit computes in f32 and casts on write: the same values,
        one vector pass fewer than a cast of its own)."""
        op = node.op.name
        if op in IDENTITY:
            return args[0]
        out_t = node.outputs[0].type
        name = self.names.new(node.outputs[0].name)
        if op in REDUCTIONS or op == "var":
            self._check_last_axis(node, last_axis)
        if op in REDUCTIONS:
            dt = self.dtype_kw(out_t.dtype, DType.f32)
            self.w(f"{name} = {args[0]}.{REDUCTIONS[op]}(axis={self.axis}{dt})")
        elif op == "var":
            xc, c = self.names.new(name + "_centered"), node.attrs["correction"]
            n = node.inputs[0].type.shape[-1]
            self.w(f"{xc} = {args[0]} - {args[0]}.mean(axis={self.axis})")
            self.w(f"{name} = fl.div(({xc} * {xc}).sum(axis={self.axis}), {literal(n - c)}"
                   f"{self.dtype_kw(out_t.dtype, DType.f32)})")
        elif op in ROW_OPS:
            self._row_op(node, args, name, last_axis, write or out_t.dtype)
        elif op in SAME_NAME or op in COMPOSED:
            self.w(f"{name} = {self.elementwise(node, args)}")
        else:
            self.unsupported(node, "not an op of the vector unit")
        return name

    def _check_last_axis(self, node: Node, last_axis: int) -> None:
        rank = node.inputs[0].type.rank
        if not reduces_last_axis_only(node):
            self.unsupported(node, not_last_axis(node))
        if last_axis != rank - 1:
            self.unsupported(node, "reduces an axis that is not the tile's last")

    def dtype_kw(self, dt: DType, default: DType) -> str:
        return "" if dt == default else f", dtype={fl_dtype(dt)}"

    def elementwise(self, node: Node, args: list[str]) -> str:
        """The expression of an elementwise IR node on `args`."""
        op = node.op.name
        dt = node.outputs[0].type.dtype
        compare = VECTOR_OPS.get(op) is not None and VECTOR_OPS[op].kind == "compare"
        default = DType.bool if compare else DType.f32
        kw = self.dtype_kw(dt, default)
        if op in _OPERATORS and not kw and not all(_is_literal(a) for a in args):
            a, b = args
            return f"{a} {_OPERATORS[op]} {_paren(b)}"
        if op == "gelu":
            fn = "gelu_tanh" if node.attrs["approximate"] == "tanh" else "gelu"
            return f"fl.{fn}({args[0]}{kw})"
        if op == "div":
            rounding = node.attrs["rounding"]
            if rounding == "none":
                return f"{args[0]} / {_paren(args[1])}" if not kw else f"fl.div({args[0]}, {args[1]}{kw})"
            return f"fl.{'trunc' if rounding == 'trunc' else 'floor'}(fl.div({args[0]}, {args[1]}){kw})"
        if op == "clamp":
            x = args[0]
            lo, hi = node.attrs["min"], node.attrs["max"]
            if lo is not None:
                x = f"fl.maximum({x}, {literal(lo)}{kw if hi is None else ''})"
            if hi is not None:
                x = f"fl.minimum({x}, {literal(hi)}{kw})"
            if lo is None and hi is None:
                x = f"fl.copy({x})"
            return x
        if op == "cast":
            x = args[0]
            if dt == DType.fp8 and node.inputs[0].type.dtype.is_float:   # torch saturates to e4m3's range
                x = f"fl.minimum(fl.maximum({x}, -448.0), 448.0)"
            return f"fl.cast({x}, {fl_dtype(dt)})"
        if op == "where" and _is_literal(args[0]):
            self.unsupported(node, "a constant condition (fold it first)")
        return f"fl.{op}({', '.join(args)}{kw})"

    # -- row ops: norms and softmax over the last axis ------------------------------------------
    def softmax(self, node: Node, x: str, name: str, dt: DType | None = None) -> None:
        """`name` = softmax (or log-softmax) of tile `x` along the code's axis `self.axis`, written
        in `dt` (by default the node's dtype; the reduction part writes one over a middle axis with
        these lines too)."""
        w, ax = self.w, self.axis
        kw = self.dtype_kw(dt or node.outputs[0].type.dtype, DType.f32)
        if node.op.name == "softmax":
            e = self.names.new(name + "_exp")
            w(f"{e} = fl.exp({x} - {x}.max(axis={ax}))   # minus the max: exp cannot overflow")
            w(f"{name} = fl.div({e}, {e}.sum(axis={ax}){kw})")
        else:
            s = self.names.new(name + "_shifted")
            w(f"{s} = {x} - {x}.max(axis={ax})")
            w(f"{name} = fl.sub({s}, fl.log(fl.exp({s}).sum(axis={ax})){kw})")

    def _row_op(self, node: Node, args: list[str], name: str, last_axis: int, dt: DType) -> None:
        op = node.op.name
        rank = node.inputs[0].type.rank
        if op in ("softmax", "log_softmax"):
            if node.attrs["axis"] % rank != rank - 1 or last_axis != rank - 1:
                self.unsupported(node, f"{op} over axis {node.attrs['axis']}; the vector part handles the "
                                       f"last axis")
        elif node.attrs["ndim"] != 1 or last_axis != rank - 1:
            self.unsupported(node, f"normalizes the last {node.attrs['ndim']} axes; the vector part "
                                   f"handles the last one")
        w, ax, x = self.w, self.axis, args[0]
        kw = self.dtype_kw(dt, DType.f32)
        if op in ("softmax", "log_softmax"):
            self.softmax(node, x, name, dt)
        elif op == "layer_norm":
            # Two centring passes, as careful layer norms do: the f32 mean (sum / n) of a row of
            # equal values can be an ulp off, leaving x - mean a constant ulp-sized row that
            # 1/sqrt(var + eps) magnifies ~1/sqrt(eps) times where the exact answer is 0. The
            # second pass subtracts the mean of that residue, so what is left is an ulp of an ulp.
            # It costs one more row reduction per norm.
            xc0 = self.names.new(name + "_centered_once")
            xc, rstd = self.names.new(name + "_centered"), self.names.new(name + "_rstd")
            w(f"{xc0} = {x} - {x}.mean(axis={ax})")
            w(f"{xc} = {xc0} - {xc0}.mean(axis={ax})")
            w(f"{rstd} = fl.rsqrt(({xc} * {xc}).mean(axis={ax}) + {norm_eps(node)})")
            self.affine(name, (xc, rstd), args[1:], kw)
        else:  # rms_norm
            rms = self.names.new(name + "_rrms")
            w(f"{rms} = fl.rsqrt(({x} * {x}).mean(axis={ax}) + {norm_eps(node)})")
            self.affine(name, (x, rms), args[1:], kw)

    def affine(self, name: str, normed: str | tuple[str, str], params: list[str], kw: str) -> None:
        """`name` = `normed` times a norm's weight plus its bias (`params`: none, the weight, or
        both), in the dtype `kw` asks for: with no params, the expression cast (a statistic too).
        `normed` as two factors (the centred rows, in parentheses if a difference, and their 1/std):
        with no params, their product is written in the dtype itself (a norm whose weight folded
        into the linear after it), one vector pass, not a multiply and then a cast."""
        if isinstance(normed, tuple):
            if not params and kw:
                self.w(f"{name} = fl.mul({normed[0]}, {normed[1]}{kw})")
                return
            normed = f"{normed[0]} * {normed[1]}"
        if not params:
            self.w(f"{name} = {normed}" if not kw else f"{name} = fl.cast({normed}{kw.replace(', dtype=', ', ')})")
        elif len(params) == 1:
            self.w(f"{name} = fl.mul({normed}, {params[0]}{kw})")
        else:   # one multiply-add: a pass over the tile fewer than a multiply then an add, same rounding
            self.w(f"{name} = fl.fma({normed}, {params[0]}, {params[1]}{kw})")


def contraction_value(w: Writer, names: Names, acc: str, bias: str | None, out: Node, body, results,
                      tiles: dict) -> Node | None:
    """Write the value of contraction node `out` (of region `body`, whose results are `results`)
    from its f32 (or i32) accumulator `acc` and its bias tile `bias` (or None), into `tiles` by
    value name. A bias and a cast to a narrower dtype are one vector pass (the unit adds in f32 and
    rounds on write, as a cast after the add would), not an add and then a cast: the node's own
    dtype, or that of the cast that is its one reader, whose value it then is too. Returns that
    cast (the epilogue does not write it again), or None."""
    rounding = _rounding_cast(out, body.nodes, results) if bias is not None else None
    dt = (rounding or out).outputs[0].type.dtype
    if bias is None:
        val = acc
        if dt != DType.f32:
            val = names.new(out.outputs[0].name + "_c")
            w(f"{val} = {acc}.astype({fl_dtype(dt)})")
    else:
        val = names.new(out.outputs[0].name)
        w(f"{val} = {acc} + {bias}" if dt == DType.f32 else f"{val} = fl.add({acc}, {bias}, dtype={fl_dtype(dt)})")
    for node in (out, rounding):
        if node is not None:
            tiles[node.outputs[0].name] = val
    return rounding


def _rounding_cast(node: Node, nodes, outputs) -> Node | None:
    """The cast that reads f32 contraction `node`'s result and nothing else does (among `nodes`,
    the region body's, with `outputs` its results), when the vector unit can round into its dtype
    on write; else None. fp8 is not such a dtype: its cast saturates to e4m3's range first."""
    val = node.outputs[0]
    if val.type.dtype != DType.f32 or any(o is val for o in outputs):
        return None
    readers = [n for n in nodes if any(x is val for x in n.inputs)]
    if len(readers) != 1 or readers[0].op.name != "cast":
        return None
    dt = readers[0].outputs[0].type.dtype
    return readers[0] if dt.is_float and dt != DType.fp8 else None


def norm_eps(node: Node) -> str:
    """A layer or RMS norm's eps as a literal; an RMS norm without one has torch's default, f32's
    machine epsilon (for bf16 and f16 inputs too)."""
    eps = node.attrs["eps"]
    return literal(eps if eps is not None else float(np.finfo(np.float32).eps))


def _is_literal(a: str) -> bool:
    return a[:1].isdigit() or a[:1] == "-" or a.startswith("float(")


def _paren(a: str) -> str:
    return f"({a})" if a.startswith("-") else a


def reduces_last_axis_only(node: Node) -> bool:
    """Whether a reduction reduces its input's last axis and no other (a vector's only axis)."""
    rank = node.inputs[0].type.rank
    axes = node.attrs["axes"] if "axes" in node.attrs else ()
    return (sorted({a % rank for a in axes}) if axes else list(range(rank))) == [rank - 1]


def not_last_axis(node: Node) -> str:
    """Why the vector part refuses a reduction `reduces_last_axis_only` rejects."""
    axes = node.attrs["axes"] if "axes" in node.attrs else ()
    return f"reduces axes {list(axes) or 'all'}; the vector part reduces the last axis only"


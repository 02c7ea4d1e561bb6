"""Random PyTorch modules from a seed, for differential fuzzing of the compiler against eager.

A case is a :class:`Program`: model inputs, a list of ops (each a kind, the names of its operands
and plain-data attributes) and the names returned. The same Program renders to standalone Python
source (a module class, ``make_model()`` and ``make_inputs(seed)``), and the module a test compiles
is built by executing that source, so what fails is exactly what a person reads and keeps as a
regression test.

Op attributes are stored relative to the operands' shapes where they can be (a linear layer keeps
its output width, not its input width; a slice keeps its start and step, not its end): rendering
reads the operands' shapes from a run of the earlier lines, so a shrinker can make an input smaller
and every op follows. Whether a program is valid is decided the same way: its lines run in eager on
its inputs; an op whose line raises, or whose value is not finite, is not a valid program.

Generation favours what real models do and what has broken graph compilers: broadcasting against
size-1 dims, values used by several consumers, views and strided slices, reductions to 0-d values
used again, contractions (matmul, linear, conv, attention with and without masks), norms, casts
to bf16/f16 and back, bool and integer values from comparisons, constants made in ``forward`` and
in-place updates of clones. Shapes stay small: every case runs on the simulator.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch
import torch.nn.functional as F  # noqa: N812 (the name the rendered source uses)

# -- the description ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Input:
    name: str
    shape: tuple[int, ...]
    dtype: str  # "float32", "bfloat16", "float16", "int64" (values in [0, 5)) or "bool"
    # how the tensor is laid out in memory: "contiguous", "transposed" (its last two dims
    # swapped in storage) or "broadcast" (a stride-0 expand of its first dim)
    layout: str = "contiguous"


@dataclass(frozen=True)
class Op:
    kind: str
    args: tuple[str, ...]  # operand names, in order
    attrs: tuple[tuple[str, Any], ...]  # plain data, hashable
    out: str

    def attr(self, key: str, default=None):
        return dict(self.attrs).get(key, default)


@dataclass(frozen=True)
class Program:
    seed: int  # seeds the module's parameters (make_model) and the example inputs (make_inputs)
    inputs: tuple[Input, ...]
    ops: tuple[Op, ...]
    outputs: tuple[str, ...]
    label: str = ""  # where it came from ("seed 7", "seed 7, shrunk"): a comment in the source
    nested: bool = False  # return {"out": first, "rest": (others...)} instead of a tuple
    # the first input's dim 0 (and that of every input of the same size there) is a batch dim
    # exported as dynamic (Dim.AUTO): the compiled model then runs at another batch size too
    dynamic: bool = False

    def batch_inputs(self) -> list[str]:
        """The inputs whose dim 0 is the batch dim (none unless ``dynamic``)."""
        if not self.dynamic or not self.inputs or not self.inputs[0].shape or \
                self.inputs[0].shape[0] < 2:
            return []
        n = self.inputs[0].shape[0]
        return [s.name for s in self.inputs if s.shape and s.shape[0] == n]

    def source(self) -> str:
        return render(self).source

    def build(self, input_seed: int | None = None):
        """(model, inputs): the module made by executing this program's source, and its inputs
        drawn with ``input_seed`` (the program's own seed: the example inputs)."""
        return build_from_source(self.source(), self.seed if input_seed is None else input_seed)


class InvalidProgram(Exception):
    """A program whose lines do not run in eager (or give non-finite or huge values)."""


# -- op kinds ----------------------------------------------------------------------------------

@dataclass
class Rendered:
    init: list[str]  # lines of __init__ after super().__init__(), with ``self.``
    forward: list[str]  # lines of forward; the last assigns the op's output name


@dataclass
class OpKind:
    name: str
    weight: float
    pick: Callable  # (gen) -> (args, attrs) or None when nothing fits
    render: Callable  # (out, args, attrs, tensors) -> Rendered
    exact: bool = False  # moves or selects values: the result is bit-exact if its operands are


KINDS: dict[str, OpKind] = {}


def kind(name: str, weight: float, exact: bool = False):
    def register(pick):
        def add_render(render):
            KINDS[name] = OpKind(name, weight, pick, render, exact)
            return render
        pick.render = add_render
        return pick
    return register


def _fwd(out: str, expr: str, init: list[str] | None = None) -> Rendered:
    return Rendered(init or [], [f"{out} = {expr}"])


def _attrs(**kw) -> tuple:
    return tuple(sorted(kw.items()))


def _is_float(t) -> bool:
    return t.dtype.is_floating_point


UNARY = {
    "torch.relu({a})": True, "torch.abs({a})": True, "-{a}": True,
    "{a}.clamp(-0.5, 0.5)": True, "F.gelu({a})": False, "F.gelu({a}, approximate='tanh')": False,
    "F.silu({a})": False, "torch.tanh({a})": False, "torch.sigmoid({a})": False,
    "torch.exp(torch.tanh({a}))": False, "torch.log({a}.abs() + 1)": False,
    "torch.rsqrt({a} * {a} + 1)": False, "torch.sqrt({a}.abs())": False,
    "F.leaky_relu({a}, 0.1)": False, "torch.sin({a})": False, "{a} * 0.5 + 0.25": False,
    "F.hardswish({a})": False, "torch.erf({a})": False,
}


@kind("unary", 3.0)
def _pick_unary(gen):
    a = gen.value(_is_float)
    return (a,), _attrs(expr=gen.rng.choice(sorted(UNARY)))


@_pick_unary.render
def _render_unary(out, args, attrs, ts):
    return _fwd(out, dict(attrs)["expr"].format(a=args[0]))


BINARY = ("{a} + {b}", "{a} - {b}", "{a} * {b}", "torch.maximum({a}, {b})",
          "torch.minimum({a}, {b})", "{a} / ({b}.abs() + 0.5)")


@kind("binary", 4.0)
def _pick_binary(gen):
    a = gen.value(_is_float)
    ta = gen.env[a]
    expr = gen.rng.choice(BINARY)
    how = gen.rng.choice(["value", "value", "zero_d", "input", "param", "scalar"])
    if how == "scalar":
        return (a,), _attrs(expr=expr.replace("({b}.abs() + 0.5)", "{b}"), scalar=gen.rng.choice(
            [0.5, 2.0, -1.5, 3.0]))
    if how == "value" or how == "zero_d":
        want_0d = how == "zero_d"
        b = gen.value(lambda t: _is_float(t) and _broadcasts(t.shape, ta.shape)
                      and (t.dim() == 0) == want_0d, avoid=a)
        if b is not None:
            return (a, b), _attrs(expr=expr)
    shape = _broadcast_partner(gen.rng, tuple(ta.shape))
    if how == "param":
        return (a,), _attrs(expr=expr, param=shape)
    return (a, gen.new_input(shape, "float32")), _attrs(expr=expr)


@_pick_binary.render
def _render_binary(out, args, attrs, ts):
    at = dict(attrs)
    init = []
    if "scalar" in at:
        b = repr(at["scalar"])
    elif "param" in at:
        b = f"self.{out}_w"
        shape = ", ".join(map(str, at["param"]))
        init.append(f"self.{out}_w = torch.nn.Parameter(torch.randn({shape}))" if shape else
                    f"self.{out}_w = torch.nn.Parameter(torch.randn(()))")
    else:
        b = args[1]
    return _fwd(out, at["expr"].format(a=args[0], b=b), init)


def _broadcasts(s, t) -> bool:
    try:
        return tuple(torch.broadcast_shapes(s, t)) == tuple(t) or len(s) <= len(t) and \
            all(x in (1, y) for x, y in zip(s[::-1], t[::-1]))
    except RuntimeError:
        return False


def _broadcast_partner(rng, shape: tuple) -> tuple:
    """A shape that broadcasts against ``shape``: some dims set to 1, maybe leading dims dropped."""
    out = [1 if rng.random() < 0.4 else d for d in shape]
    drop = rng.randrange(len(out) + 1) if out and rng.random() < 0.4 else 0
    return tuple(out[drop:])


@kind("compare", 2.0, exact=True)
def _pick_compare(gen):
    a = gen.value(lambda t: t.dtype != torch.bool, exact=True)
    if a is None:
        return None
    op = gen.rng.choice([">", "<", ">=", "<="])
    ta = gen.env[a]
    b = gen.value(lambda t: t.dtype == ta.dtype and _broadcasts(t.shape, ta.shape), exact=True,
                  avoid=a) if gen.rng.random() < 0.5 else None
    if b is not None:
        return (a, b), _attrs(op=op)
    return (a,), _attrs(op=op, scalar=2 if not _is_float(ta) else gen.rng.choice([0.0, 0.3, -0.5]))


@_pick_compare.render
def _render_compare(out, args, attrs, ts):
    at = dict(attrs)
    rhs = args[1] if len(args) > 1 else repr(at["scalar"])
    return _fwd(out, f"{args[0]} {at['op']} {rhs}")


@kind("logic", 0.8, exact=True)
def _pick_logic(gen):
    a = gen.value(lambda t: t.dtype == torch.bool)
    if a is None:
        return None
    b = gen.value(lambda t: t.dtype == torch.bool and _broadcasts(t.shape, gen.env[a].shape),
                  avoid=a)
    if b is None or gen.rng.random() < 0.3:
        return (a,), _attrs(op="~")
    return (a, b), _attrs(op=gen.rng.choice(["&", "|", "^"]))


@_pick_logic.render
def _render_logic(out, args, attrs, ts):
    op = dict(attrs)["op"]
    return _fwd(out, f"~{args[0]}" if op == "~" else f"{args[0]} {op} {args[1]}")


@kind("where", 2.0, exact=True)
def _pick_where(gen):
    c = gen.value(lambda t: t.dtype == torch.bool)
    if c is None:
        return None
    tc = gen.env[c]
    a = gen.value(lambda t: _is_float(t) and _broadcasts(tc.shape, torch.broadcast_shapes(
        tc.shape, t.shape)) and _broadcasts(t.shape, torch.broadcast_shapes(tc.shape, t.shape)))
    if a is None:
        return None
    ta = gen.env[a]
    if gen.rng.random() < 0.3:
        return (c, a), _attrs(form="masked_fill", fill=gen.rng.choice([0.0, -1.0]))
    b = gen.value(lambda t: t.dtype == ta.dtype and _broadcasts(t.shape, ta.shape), avoid=a)
    if b is None:
        return (c, a), _attrs(form="where_scalar", fill=0.0)
    return (c, a, b), _attrs(form="where")


@_pick_where.render
def _render_where(out, args, attrs, ts):
    at = dict(attrs)
    if at["form"] == "masked_fill":
        # masked_fill's mask must broadcast to the value's shape, not the other way round
        return _fwd(out, f"{args[1]}.masked_fill({args[0]}, {at['fill']!r})")
    if at["form"] == "where_scalar":
        return _fwd(out, f"torch.where({args[0]}, {args[1]}, {at['fill']!r})")
    return _fwd(out, f"torch.where({args[0]}, {args[1]}, {args[2]})")


@kind("from_bool", 1.5, exact=True)
def _pick_from_bool(gen):
    c = gen.value(lambda t: t.dtype == torch.bool)
    if c is None:
        return None
    rank = gen.env[c].dim()
    form = gen.rng.choice(["float", "long", "sum", "any", "all"] if rank else ["float", "long"])
    return (c,), _attrs(form=form, dim=gen.rng.randrange(-rank, rank) if rank else 0)


@_pick_from_bool.render
def _render_from_bool(out, args, attrs, ts):
    at = dict(attrs)
    c, form, d = args[0], at["form"], at["dim"]
    expr = {"float": f"{c}.float()", "long": f"{c}.long()", "sum": f"{c}.sum({d})",
            "any": f"{c}.any({d})", "all": f"{c}.all({d})"}[form]
    return _fwd(out, expr)


INT_ARITH = ("{a} * 3 + 1", "{a} + {b}", "torch.maximum({a}, {b})", "{a} // 2", "{a} % 3",
             "{a}.float() * 0.5", "({a} - {b}).abs()")


@kind("int_arith", 1.0, exact=True)
def _pick_int(gen):
    a = gen.value(lambda t: t.dtype == torch.int64)
    if a is None:
        return None
    expr = gen.rng.choice(INT_ARITH)
    if "{b}" not in expr:
        return (a,), _attrs(expr=expr)
    b = gen.value(lambda t: t.dtype == torch.int64 and _broadcasts(t.shape, gen.env[a].shape))
    return ((a, b), _attrs(expr=expr)) if b is not None else None


@_pick_int.render
def _render_int(out, args, attrs, ts):
    expr = dict(attrs)["expr"]
    return _fwd(out, expr.format(a=args[0], b=args[1] if len(args) > 1 else ""))


REDUCE = {"sum": False, "mean": False, "amax": True, "amin": True, "var": False,
          "logsumexp": False}


@kind("reduce", 2.5)
def _pick_reduce(gen):
    a = gen.value(lambda t: _is_float(t) and t.dim() > 0)
    if a is None:
        return None
    rank = gen.env[a].dim()
    fn = gen.rng.choice(sorted(REDUCE))
    whole = fn in ("sum", "mean", "amax", "amin") and gen.rng.random() < 0.3
    return (a,), _attrs(fn=fn, dim=None if whole else gen.rng.randrange(-rank, rank),
                        keepdim=gen.rng.random() < 0.5)


@_pick_reduce.render
def _render_reduce(out, args, attrs, ts):
    at = dict(attrs)
    a, fn, d, keep = args[0], at["fn"], at["dim"], at["keepdim"]
    if d is None:
        return _fwd(out, f"{a}.{fn}()")
    if fn == "var":
        return _fwd(out, f"torch.var({a}, {d}, correction=0, keepdim={keep})")
    if fn == "logsumexp":
        return _fwd(out, f"torch.logsumexp({a}, {d}, keepdim={keep})")
    return _fwd(out, f"{a}.{fn}({d}, keepdim={keep})")


@kind("softmax", 1.2)
def _pick_softmax(gen):
    a = gen.value(lambda t: _is_float(t) and t.dim() > 0)
    if a is None:
        return None
    rank = gen.env[a].dim()
    return (a,), _attrs(fn=gen.rng.choice(["torch.softmax", "F.log_softmax"]),
                        dim=gen.rng.randrange(-rank, rank))


@_pick_softmax.render
def _render_softmax(out, args, attrs, ts):
    at = dict(attrs)
    return _fwd(out, f"{at['fn']}({args[0]}, dim={at['dim']})")


@kind("view", 3.0, exact=True)
def _pick_view(gen):
    a = gen.value(lambda t: True)
    shape = tuple(gen.env[a].shape)
    rank, rng = len(shape), gen.rng
    forms = ["unsqueeze", "reshape_flat"]
    if rank >= 2:
        forms += ["permute", "transpose", "flatten", "contiguous_t"]
    if any(d == 1 for d in shape):
        forms += ["squeeze", "expand", "expand"]
    if any(d % 2 == 0 and d > 1 for d in shape):
        forms += ["unflatten"]
    form = rng.choice(forms)
    if form == "permute":
        perm = list(range(rank))
        rng.shuffle(perm)
        return (a,), _attrs(form=form, perm=tuple(perm))
    if form in ("transpose", "contiguous_t"):
        d0, d1 = rng.sample(range(rank), 2)
        return (a,), _attrs(form=form, dims=(d0, d1))
    if form == "unsqueeze":
        return (a,), _attrs(form=form, dim=rng.randrange(rank + 1))
    if form == "squeeze":
        return (a,), _attrs(form=form, dim=rng.choice([i for i, d in enumerate(shape) if d == 1]))
    if form == "flatten":
        d = rng.randrange(rank - 1)
        return (a,), _attrs(form=form, dim=d)
    if form == "unflatten":
        d = rng.choice([i for i, s in enumerate(shape) if s % 2 == 0 and s > 1])
        return (a,), _attrs(form=form, dim=d, factor=2)
    if form == "expand":
        sizes = tuple(rng.choice([2, 3, 4]) if s == 1 and rng.random() < 0.7 else -1
                      for s in shape)
        return (a,), _attrs(form=form, sizes=sizes)
    return (a,), _attrs(form=form)


@_pick_view.render
def _render_view(out, args, attrs, ts):
    at = dict(attrs)
    a, form = args[0], at["form"]
    if form == "permute":
        return _fwd(out, f"{a}.permute{tuple(at['perm'])}")
    if form == "transpose":
        return _fwd(out, f"{a}.transpose{tuple(at['dims'])}")
    if form == "contiguous_t":
        return _fwd(out, f"{a}.transpose{tuple(at['dims'])}.contiguous()")
    if form == "unsqueeze":
        return _fwd(out, f"{a}.unsqueeze({at['dim']})")
    if form == "squeeze":
        return _fwd(out, f"{a}.squeeze({at['dim']})")
    if form == "flatten":
        return _fwd(out, f"{a}.flatten({at['dim']}, {at['dim'] + 1})")
    if form == "unflatten":
        return _fwd(out, f"{a}.unflatten({at['dim']}, ({at['factor']}, -1))")
    if form == "expand":
        # a size-1 dim grows; others keep their size (-1)
        return _fwd(out, f"{a}.expand{tuple(at['sizes'])}")
    return _fwd(out, f"{a}.reshape(-1)")


@kind("slice", 2.0, exact=True)
def _pick_slice(gen):
    a = gen.value(lambda t: t.dim() > 0 and max(t.shape) > 1)
    if a is None:
        return None
    shape = tuple(gen.env[a].shape)
    rng = gen.rng
    d = rng.choice([i for i, s in enumerate(shape) if s > 1])
    form = rng.choice(["step", "step", "head", "select", "narrow", "flip"])
    if form == "step":
        return (a,), _attrs(form=form, dim=d, start=rng.choice([0, 1]), step=rng.choice([2, 3]))
    if form == "head":
        return (a,), _attrs(form=form, dim=d, stop=rng.choice([-1, 1, 2]))
    if form == "select":
        return (a,), _attrs(form=form, dim=d, index=rng.choice([0, -1, 1]))
    if form == "narrow":
        return (a,), _attrs(form=form, dim=d, start=1, length=rng.choice([1, 2]))
    return (a,), _attrs(form=form, dim=d)


@_pick_slice.render
def _render_slice(out, args, attrs, ts):
    at = dict(attrs)
    a, form, d = args[0], at["form"], at["dim"]
    lead = ":, " * d
    if form == "step":
        return _fwd(out, f"{a}[{lead}{at['start']}::{at['step']}]")
    if form == "head":
        return _fwd(out, f"{a}[{lead}:{at['stop']}]")
    if form == "select":
        return _fwd(out, f"{a}.select({d}, {at['index']})")
    if form == "narrow":
        return _fwd(out, f"{a}.narrow({d}, {at['start']}, {at['length']})")
    return _fwd(out, f"torch.flip({a}, ({d},))")


@kind("join", 1.2, exact=True)
def _pick_join(gen):
    a = gen.value(lambda t: t.dim() > 0)
    ta = gen.env[a]
    rng = gen.rng

    def joinable(t):  # same rank and dtype, shapes differ in at most one dim
        return t.dtype == ta.dtype and t.dim() == ta.dim() and \
            sum(x != y for x, y in zip(t.shape, ta.shape)) <= 1
    b = gen.value(joinable) or a
    tb = gen.env[b]
    diff = [i for i, (x, y) in enumerate(zip(ta.shape, tb.shape)) if x != y]
    if diff:
        return (a, b), _attrs(form="cat", dim=diff[0])
    form = rng.choice(["cat", "stack", "chunk"])
    if form == "chunk":
        d = rng.randrange(ta.dim())
        return (a,), _attrs(form="chunk", dim=d, pieces=2, index=rng.choice([0, -1]))
    return (a, b), _attrs(form=form, dim=rng.randrange(ta.dim() + (form == "stack")))


@_pick_join.render
def _render_join(out, args, attrs, ts):
    at = dict(attrs)
    if at["form"] == "chunk":
        return _fwd(out, f"torch.chunk({args[0]}, {at['pieces']}, {at['dim']})[{at['index']}]")
    fn = "torch.cat" if at["form"] == "cat" else "torch.stack"
    return _fwd(out, f"{fn}([{', '.join(args)}], {at['dim']})")


@kind("matmul", 2.5)
def _pick_matmul(gen):
    a = gen.value(lambda t: _is_float(t) and t.dim() >= 1)
    ta = gen.env[a]
    k = ta.shape[-1]
    rng = gen.rng
    form = rng.choice(["linear", "linear", "param", "value", "scores"])
    if form == "value" and ta.dim() >= 2:
        b = gen.value(lambda t: t.dtype == ta.dtype and t.dim() >= 2 and t.shape[-2] == k and
                      _batch_ok(ta.shape[:-2], t.shape[:-2]), avoid=a)
        if b is not None:
            return (a, b), _attrs(form="value")
    if form == "scores" and ta.dim() >= 2:
        b = gen.value(lambda t: t.dtype == ta.dtype and t.dim() == ta.dim() and
                      t.shape[-1] == k and _batch_ok(ta.shape[:-2], t.shape[:-2]))
        if b is not None:
            return (a, b), _attrs(form="scores")
    n = rng.choice([1, 3, 4, 6, 8, 17])
    if form == "param":
        return (a,), _attrs(form="param", n=n)
    return (a,), _attrs(form="linear", n=n, bias=rng.random() < 0.7)


def _batch_ok(s, t) -> bool:
    try:
        torch.broadcast_shapes(s, t)
        return True
    except RuntimeError:
        return False


@_pick_matmul.render
def _render_matmul(out, args, attrs, ts):
    at = dict(attrs)
    a, form = args[0], at["form"]
    if form == "value":
        return _fwd(out, f"torch.matmul({a}, {args[1]})")
    if form == "scores":
        return _fwd(out, f"{a} @ {args[1]}.transpose(-1, -2)")
    k = ts[0].shape[-1]
    if form == "param":
        return _fwd(out, f"{a} @ self.{out}_w", [
            f"self.{out}_w = torch.nn.Parameter((torch.randn({k}, {at['n']}) / {k}**0.5)"
            f"{_to(ts[0])})"])
    return _fwd(out, f"self.{out}_linear({a})", [
        f"self.{out}_linear = torch.nn.Linear({k}, {at['n']}, bias={at['bias']}"
        f"{_dtype_kw(ts[0])})"])


def _to(t) -> str:
    """A parameter in its operand's dtype (a bf16 layer of a bf16 model)."""
    return "" if t.dtype == torch.float32 else f".to({t.dtype})"


def _dtype_kw(t) -> str:
    return "" if t.dtype == torch.float32 else f", dtype={t.dtype}"


@kind("conv", 1.5)
def _pick_conv(gen):
    a = gen.value(lambda t: _is_float(t) and t.dim() in (3, 4) and min(t.shape[2:]) >= 3)
    if a is None:
        return None
    ta, rng = gen.env[a], gen.rng
    c = ta.shape[1]
    groups = c if c > 1 and rng.random() < 0.25 else 1
    return (a,), _attrs(out_ch=groups * rng.choice([1, 2]) if groups > 1 else rng.choice([2, 4]),
                        k=rng.choice([1, 3]), stride=rng.choice([1, 1, 2]),
                        padding=rng.choice([0, 1]), groups=groups, bias=rng.random() < 0.7)


@_pick_conv.render
def _render_conv(out, args, attrs, ts):
    at = dict(attrs)
    cls = "Conv2d" if ts[0].dim() == 4 else "Conv1d"
    return _fwd(out, f"self.{out}_conv({args[0]})", [
        f"self.{out}_conv = torch.nn.{cls}({ts[0].shape[1]}, {at['out_ch']}, {at['k']}, "
        f"stride={at['stride']}, padding={at['padding']}, groups={at['groups']}, "
        f"bias={at['bias']}{_dtype_kw(ts[0])})"])


POOLS = ("F.max_pool2d({a}, 2)", "F.avg_pool2d({a}, 2)", "F.max_pool2d({a}, 3, 2, 1)",
         "F.adaptive_avg_pool2d({a}, 1)", "F.avg_pool2d({a}, 3, 1, 1)")


@kind("pool", 1.0, exact=False)
def _pick_pool(gen):
    a = gen.value(lambda t: _is_float(t) and t.dim() == 4 and min(t.shape[2:]) >= 2)
    if a is None:
        return None
    return (a,), _attrs(expr=gen.rng.choice(POOLS))


@_pick_pool.render
def _render_pool(out, args, attrs, ts):
    return _fwd(out, dict(attrs)["expr"].format(a=args[0]))


@kind("norm", 1.5)
def _pick_norm(gen):
    a = gen.value(lambda t: _is_float(t) and t.dim() >= 1)
    ta, rng = gen.env[a], gen.rng
    forms = ["layer", "rms", "normalize"]
    if ta.dim() in (2, 3, 4) and ta.shape[0] >= 1:
        forms.append("batch")
    if ta.dim() >= 3 and ta.shape[1] % 2 == 0:
        forms.append("group")
    return (a,), _attrs(form=rng.choice(forms), affine=rng.random() < 0.7)


@_pick_norm.render
def _render_norm(out, args, attrs, ts):
    at = dict(attrs)
    a, form, affine = args[0], at["form"], at["affine"]
    t = ts[0]
    m = f"self.{out}_norm"
    init = []
    if form == "layer":
        init.append(f"{m} = torch.nn.LayerNorm({t.shape[-1]}, elementwise_affine={affine}"
                    f"{_dtype_kw(t)})")
    elif form == "rms":
        init.append(f"{m} = torch.nn.RMSNorm({t.shape[-1]}, elementwise_affine={affine}"
                    f"{_dtype_kw(t)})")
    elif form == "normalize":
        return _fwd(out, f"F.normalize({a}, dim=-1)")
    elif form == "batch":
        cls = "BatchNorm2d" if t.dim() == 4 else "BatchNorm1d"
        init += [f"{m} = torch.nn.{cls}({t.shape[1]}, affine={affine}{_dtype_kw(t)})",
                 f"{m}.running_mean.uniform_(-1, 1)", f"{m}.running_var.uniform_(0.5, 2)"]
    else:
        init.append(f"{m} = torch.nn.GroupNorm(2, {t.shape[1]}, affine={affine}{_dtype_kw(t)})")
    if affine and form in ("layer", "rms", "batch", "group"):
        init.append(f"torch.nn.init.uniform_({m}.weight, 0.5, 1.5)")
        if form != "rms":
            init.append(f"torch.nn.init.uniform_({m}.bias, -0.5, 0.5)")
    return _fwd(out, f"{m}({a})", init)


@kind("attention", 1.5)
def _pick_attention(gen):
    q = gen.value(lambda t: _is_float(t) and t.dim() in (3, 4) and t.shape[-2] >= 1)
    if q is None:
        return None
    tq, rng = gen.env[q], gen.rng
    kv = gen.value(lambda t: t.dtype == tq.dtype and t.dim() == tq.dim() and
                   t.shape[:-2] == tq.shape[:-2] and t.shape[-1] == tq.shape[-1], avoid=q)
    args = (q, kv) if kv is not None and rng.random() < 0.6 else (q,)
    mask = rng.choice(["none", "causal", "additive", "bool", "bool_value"])
    if mask == "bool_value":
        m = gen.value(lambda t: t.dtype == torch.bool and 1 <= t.dim() <= 2)
        mask = "bool" if m is None else mask
        args += (m,) if m is not None else ()
    return args, _attrs(mask=mask, scale=rng.choice([None, None, 0.5]), project=rng.random() < 0.5)


@_pick_attention.render
def _render_attention(out, args, attrs, ts):
    at = dict(attrs)
    q, mask = args[0], at["mask"]
    kv = args[1] if len(args) > 1 and ts[1].dtype != torch.bool else q
    tkv = ts[1] if kv != q else ts[0]
    e = ts[0].shape[-1]
    init, lines = [], []
    if at["project"]:
        # query/key/value projections of the operands, as attention layers have them
        for p, src in (("q", q), ("k", kv), ("v", kv)):
            init.append(f"self.{out}_{p} = torch.nn.Linear({e}, {e}{_dtype_kw(ts[0])})")
            lines.append(f"{out}_{p} = self.{out}_{p}({src})")
        qn, kn, vn = f"{out}_q", f"{out}_k", f"{out}_v"
    else:
        qn, kn, vn = q, kv, kv
    l_, s_ = ts[0].shape[-2], tkv.shape[-2]
    extra = ""
    if mask == "causal":
        extra = ", is_causal=True"
    elif mask == "additive":
        lines.append(f"{out}_mask = torch.zeros({l_}, {s_}, dtype={ts[0].dtype}).masked_fill("
                     f"torch.ones({l_}, {s_}, dtype=torch.bool).triu(1), float('-inf'))")
        extra = f", attn_mask={out}_mask"
    elif mask == "bool":
        lines.append(f"{out}_mask = torch.ones({l_}, {s_}, dtype=torch.bool).tril()")
        extra = f", attn_mask={out}_mask"
    elif mask == "bool_value":
        # every query keeps key 0: a fully masked row is NaN in eager, not a test of the compiler
        lines.append(f"{out}_mask = {args[-1]} | (torch.arange({s_}) == 0)")
        extra = f", attn_mask={out}_mask"
    if at["scale"] is not None:
        extra += f", scale={at['scale']}"
    lines.append(f"{out} = F.scaled_dot_product_attention({qn}, {kn}, {vn}{extra})")
    return Rendered(init, lines)


@kind("cast", 1.2, exact=True)
def _pick_cast(gen):
    a = gen.value(lambda t: t.dtype != torch.bool)
    t = gen.env[a]
    if t.dtype == torch.float32:
        to = gen.rng.choice(["bfloat16", "float16"] + (["long"] if gen.exact.get(a) else []))
    elif t.dtype in (torch.bfloat16, torch.float16):
        to = "float"
    else:
        to = "float"
    return (a,), _attrs(to=to)


@_pick_cast.render
def _render_cast(out, args, attrs, ts):
    to = dict(attrs)["to"]
    if to in ("float", "long"):
        return _fwd(out, f"{args[0]}.{to}()")
    return _fwd(out, f"{args[0]}.to(torch.{to})")


CONSTS = ("torch.ones_like({a})", "torch.full_like({a}, 0.5)", "torch.zeros_like({a})",
          "torch.arange({a}.shape[-1], dtype=torch.float32)",
          "torch.linspace(-1, 1, {a}.shape[-1])", "torch.eye({a}.shape[-1])",
          "torch.tensor(1.5)", "torch.ones({a}.shape[-1], {a}.shape[-1]).tril()")


@kind("const", 1.0, exact=True)
def _pick_const(gen):
    a = gen.value(lambda t: _is_float(t) and t.dim() >= 1)
    if a is None:
        return None
    return (a,), _attrs(expr=gen.rng.choice(CONSTS))


@_pick_const.render
def _render_const(out, args, attrs, ts):
    return _fwd(out, dict(attrs)["expr"].format(a=args[0]))


@kind("inplace", 1.5)
def _pick_inplace(gen):
    a = gen.value(lambda t: _is_float(t) and t.dim() >= 1)
    ta, rng = gen.env[a], gen.rng
    forms = ["set_slice", "mul_", "relu_", "add_slice"]
    b = gen.value(lambda t: t.dtype == ta.dtype and _broadcasts(t.shape, ta.shape), avoid=a)
    if b is not None:
        forms.append("add_")
    m = gen.value(lambda t: t.dtype == torch.bool and _broadcasts(t.shape, ta.shape))
    if m is not None:
        forms.append("masked_fill_")
    form = rng.choice(forms)
    d = rng.randrange(ta.dim())
    if form == "add_":
        return (a, b), _attrs(form=form)
    if form == "masked_fill_":
        return (a, m), _attrs(form=form)
    return (a,), _attrs(form=form, dim=d, step=rng.choice([1, 2]))


@_pick_inplace.render
def _render_inplace(out, args, attrs, ts):
    at = dict(attrs)
    a, form = args[0], at["form"]
    lead = ":, " * at.get("dim", 0)
    step = at.get("step", 1)
    body = {
        "set_slice": f"{out}[{lead}::{step}] = 0.0",
        "add_slice": f"{out}[{lead}:1] += 1.0",
        "mul_": f"{out}.mul_(2.0)",
        "relu_": f"{out}.relu_()",
        "add_": f"{out}.add_({args[-1]})",
        "masked_fill_": f"{out}.masked_fill_({args[-1]}, -1.0)",
    }[form]
    return Rendered([], [f"{out} = {a}.clone()", body])


def _op_exact(op: Op) -> bool:
    """Whether the op only moves, selects or exactly rescales values (then any correct
    implementation gives the same bits, and a comparison of its result cannot flip)."""
    if op.kind == "inplace":
        return op.attr("form") in ("set_slice", "mul_", "relu_", "masked_fill_")
    if op.kind == "repeat":
        return op.attr("mode") != "bilinear"
    if op.kind == "scan_sort":
        return op.attr("form") != "cumsum"
    return KINDS[op.kind].exact


@kind("pad", 1.0, exact=True)
def _pick_pad(gen):
    a = gen.value(lambda t: t.dim() >= 1 and t.dtype != torch.bool)
    if a is None:
        return None
    ta, rng = gen.env[a], gen.rng
    mode = "constant"
    if _is_float(ta) and ta.dim() in (3, 4) and min(ta.shape[-1:]) >= 3 and rng.random() < 0.4:
        mode = rng.choice(["reflect", "replicate"])
    n = 2 if ta.dim() == 1 or mode != "constant" or rng.random() < 0.5 else 4
    if mode != "constant" and ta.dim() == 3:
        n = 2
    if mode != "constant" and ta.dim() == 4 and min(ta.shape[-2:]) < 3:
        n = 2
    return (a,), _attrs(pads=tuple(rng.choice([0, 1, 2]) for _ in range(n)), mode=mode)


@_pick_pad.render
def _render_pad(out, args, attrs, ts):
    at = dict(attrs)
    value = "" if at["mode"] != "constant" else ", value=0.5" if _is_float(ts[0]) else ""
    return _fwd(out, f"F.pad({args[0]}, {tuple(at['pads'])}, mode={at['mode']!r}{value})")


@kind("gather", 1.2, exact=True)
def _pick_gather(gen):
    a = gen.value(lambda t: t.dim() >= 1)
    ta, rng = gen.env[a], gen.rng
    form = rng.choice(["index_select", "index_select", "embedding", "take_along"])
    if form == "embedding":
        i = gen.value(lambda t: t.dtype == torch.int64 and t.dim() <= 2)
        if i is None:
            i = gen.new_input((rng.choice([1, 2]), rng.choice([3, 5])), "int64")
        return (i,), _attrs(form=form, rows=rng.choice([5, 7]), width=rng.choice([4, 8]))
    d = rng.randrange(ta.dim())
    if form == "take_along":
        return (a,), _attrs(form=form, dim=d)
    n = ta.shape[d]
    return (a,), _attrs(form=form, dim=d, index=tuple(rng.randrange(n) for _ in
                                                       range(rng.choice([1, 2, 3, n + 1]))))


@_pick_gather.render
def _render_gather(out, args, attrs, ts):
    at = dict(attrs)
    a = args[0]
    if at["form"] == "embedding":
        return _fwd(out, f"self.{out}_emb({a} % {at['rows']})",
                    [f"self.{out}_emb = torch.nn.Embedding({at['rows']}, {at['width']})"])
    d = at["dim"]
    if at["form"] == "take_along":
        # indices made in forward: each position reads its mirror along the dim
        n = ts[0].shape[d]
        shape = [1] * ts[0].dim()
        shape[d] = n
        return _fwd(out, f"torch.take_along_dim({a}, (torch.arange({n}).flip(0) % {n})"
                         f".reshape{tuple(shape)}.expand{tuple(ts[0].shape)}, {d})")
    index = list(at["index"])
    return _fwd(out, f"{a}.index_select({d}, torch.tensor({index}))")


@kind("scan_sort", 1.0)
def _pick_scan_sort(gen):
    a = gen.value(lambda t: _is_float(t) and t.dim() >= 1)
    ta, rng = gen.env[a], gen.rng
    d = rng.randrange(-ta.dim(), ta.dim())
    form = rng.choice(["cumsum", "sort", "topk", "cummax"])
    return (a,), _attrs(form=form, dim=d, k=min(2, ta.shape[d]), descending=rng.random() < 0.5)


@_pick_scan_sort.render
def _render_scan_sort(out, args, attrs, ts):
    at = dict(attrs)
    a, d = args[0], at["dim"]
    expr = {"cumsum": f"torch.cumsum({a}, {d})",
            "sort": f"torch.sort({a}, {d}, descending={at['descending']}).values",
            "topk": f"torch.topk({a}, {at['k']}, {d}).values",
            "cummax": f"torch.cummax({a}, {d}).values"}[at["form"]]
    return _fwd(out, expr)


@kind("repeat", 0.8, exact=True)
def _pick_repeat(gen):
    a = gen.value(lambda t: t.dim() >= 1 and t.numel() <= 512)
    ta, rng = gen.env[a], gen.rng
    form = rng.choice(["repeat", "repeat_interleave", "interpolate"])
    if form == "interpolate" and _is_float(ta) and ta.dim() == 4:
        return (a,), _attrs(form=form, mode=rng.choice(["nearest", "bilinear"]))
    if form == "repeat_interleave":
        return (a,), _attrs(form=form, dim=rng.randrange(ta.dim()), times=2)
    return (a,), _attrs(form="repeat", times=tuple(rng.choice([1, 1, 2, 3])
                                                   for _ in range(ta.dim())))


@_pick_repeat.render
def _render_repeat(out, args, attrs, ts):
    at = dict(attrs)
    a = args[0]
    if at["form"] == "interpolate":
        extra = ", align_corners=False" if at["mode"] == "bilinear" else ""
        return _fwd(out, f"F.interpolate({a}, scale_factor=2, mode={at['mode']!r}{extra})")
    if at["form"] == "repeat_interleave":
        return _fwd(out, f"{a}.repeat_interleave({at['times']}, {at['dim']})")
    return _fwd(out, f"{a}.repeat{tuple(at['times'])}")


# -- rendering and building --------------------------------------------------------------------

@dataclass
class Materialized:
    source: str
    values: dict  # name -> eager tensor on the program's example inputs


def make_input(spec: Input, g: torch.Generator) -> torch.Tensor:
    return eval(_input_expr(spec), {"torch": torch, "g": g})


def _dims(shape) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def _input_expr(spec: Input, batch: bool = False) -> str:
    """The expression make_inputs() draws the input with (``batch``: its dim 0 is the
    ``batch`` argument)."""
    shape = tuple(spec.shape)
    if batch:
        shape = ("batch",) + shape[1:]
    layout = spec.layout if len(shape) >= 2 else "contiguous"
    stored = shape
    if layout == "transposed":
        stored = shape[:-2] + (shape[-1], shape[-2])
    elif layout == "broadcast":
        stored = (1,) + shape[1:]
    s = _dims(stored)
    if spec.dtype == "float32":
        expr = f"torch.randn({s}, generator=g)"
    elif spec.dtype in ("bfloat16", "float16"):
        expr = f"torch.randn({s}, generator=g).to(torch.{spec.dtype})"
    elif spec.dtype == "int64":
        expr = f"torch.randint(0, 5, {s}, generator=g)"
    else:
        expr = f"(torch.rand({s}, generator=g) < 0.5)"
    if layout == "transposed":
        return f"{expr}.transpose(-1, -2)"
    if layout == "broadcast":
        return f"{expr}.expand{_dims(shape)}"
    return expr


_NAMESPACE = {"torch": torch, "F": F}


def render(p: Program) -> Materialized:
    """The program's source. Each op's lines also run in eager on the example inputs (shapes for
    the next op's rendering come from that run): InvalidProgram when a line raises or gives a
    non-finite or huge value."""
    g = torch.Generator().manual_seed(p.seed)
    env: dict[str, Any] = {spec.name: make_input(spec, g) for spec in p.inputs}
    torch.manual_seed(p.seed)  # as make_model() does: parameters are drawn in init order
    holder = torch.nn.Module()
    init_lines: list[str] = []
    fwd_lines: list[str] = []
    scope = {**_NAMESPACE, "self": holder}
    for op in p.ops:
        try:
            ts = [env[a] for a in op.args]
        except KeyError as e:
            raise InvalidProgram(f"{op.out} uses undefined {e}") from None
        r = KINDS[op.kind].render(op.out, op.args, op.attrs, ts)
        init_lines += r.init
        fwd_lines += r.forward
        try:
            with torch.no_grad():
                for line in r.init:
                    exec(line, scope)
                local = dict(env)
                for line in r.forward:
                    exec(line, scope, local)
        except Exception as e:
            raise InvalidProgram(f"{op.out}: {type(e).__name__}: {str(e)[:200]}") from None
        value = local[op.out]
        _check_value(op.out, value)
        env[op.out] = value
    missing = [o for o in p.outputs if o not in env]
    if missing:
        raise InvalidProgram(f"outputs {missing} are not defined")
    return Materialized(_source(p, init_lines, fwd_lines), env)


def _check_value(name: str, v) -> None:
    if not isinstance(v, torch.Tensor):
        raise InvalidProgram(f"{name} is not a tensor")
    if v.numel() == 0 or v.numel() > 8192:
        raise InvalidProgram(f"{name} has {v.numel()} elements")
    if v.dtype.is_floating_point:
        f = v.float()
        if not bool(torch.isfinite(f).all()) or float(f.abs().max()) > 1e4:
            raise InvalidProgram(f"{name} has non-finite or huge values")


def _source(p: Program, init: list[str], fwd: list[str]) -> str:
    args = ", ".join(["self"] + [s.name for s in p.inputs])
    ret = p.outputs[0] if len(p.outputs) == 1 else "(" + ", ".join(p.outputs) + ",)"
    if p.nested:
        ret = f'{{"out": {p.outputs[0]}, "rest": ({"".join(o + ", " for o in p.outputs[1:])})}}'
    body_init = "".join(f"        {line}\n" for line in init)
    body_fwd = "".join(f"        {line}\n" for line in fwd)
    batch = p.batch_inputs()
    inputs = "".join(f"        {_input_expr(s, s.name in batch)},\n" for s in p.inputs)
    label = f" ({p.label})" if p.label else ""
    head, signature = f"SEED = {p.seed}\n", "seed=SEED"
    if batch:
        dyn = ", ".join("{0: Dim.AUTO}" if s.name in batch else "None" for s in p.inputs)
        head += (f"BATCH = {p.inputs[0].shape[0]}\n"
                 f"# dim 0 of {', '.join(batch)} is exported as dynamic\n"
                 f"DYNAMIC_SHAPES = ({dyn},)\n")
        signature += ", batch=BATCH"
    return f'''"""A module generated by fexplore's differential fuzzer{label}."""

import torch
import torch.nn.functional as F
{"from torch.export import Dim" + chr(10) if batch else ""}
{head}

class Fuzzed(torch.nn.Module):
    def __init__(self):
        super().__init__()
{body_init}
    def forward({args}):
{body_fwd}        return {ret}


def make_model():
    torch.manual_seed(SEED)
    with torch.no_grad():
        return Fuzzed().eval()


def make_inputs({signature}):
    g = torch.Generator().manual_seed(seed)
    return (
{inputs}    )
'''


def load_source(source: str) -> dict:
    """The names a rendered program's source defines (make_model, make_inputs, SEED, and for a
    dynamic program BATCH and DYNAMIC_SHAPES)."""
    scope: dict[str, Any] = {"__name__": "fexplore_fuzz_case"}
    exec(compile(source, "<fuzz case>", "exec"), scope)
    return scope


def build_from_source(source: str, input_seed: int | None = None):
    """(model, inputs) from a rendered program's source; ``make_inputs`` itself when
    ``input_seed`` is None."""
    scope = load_source(source)
    make = scope["make_inputs"]
    return scope["make_model"](), (make if input_seed is None else make(input_seed))


# -- generation --------------------------------------------------------------------------------

@dataclass
class _Gen:
    rng: random.Random
    seed: int
    inputs: list = field(default_factory=list)
    ops: list = field(default_factory=list)
    env: dict = field(default_factory=dict)  # name -> example tensor
    exact: dict = field(default_factory=dict)  # name -> bit-exact in any correct implementation
    used: set = field(default_factory=set)
    counter: int = 0
    holder: torch.nn.Module = field(default_factory=torch.nn.Module)  # parameters made so far

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def new_input(self, shape: tuple, dtype: str, layout: str = "contiguous") -> str:
        name = self.fresh("x")
        if layout == "broadcast" and (len(shape) < 2 or shape[0] == 1):
            layout = "contiguous"
        self.inputs.append(Input(name, tuple(shape), dtype, layout))
        # drawn as make_inputs() draws: every input in order from one generator
        g = torch.Generator().manual_seed(self.seed)
        for spec in self.inputs:
            value = make_input(spec, g)
        self.env[name] = value
        self.exact[name] = True
        return name

    def value(self, pred, *, exact: bool = False, avoid: str | None = None) -> str | None:
        """A defined value satisfying ``pred``; recent values are likelier (chains get deep),
        older ones still come back (values with several consumers)."""
        names = [n for n, t in self.env.items() if n != avoid and (not exact or self.exact[n])
                 and _safe(pred, t)]
        if not names:
            return None
        weights = [1.0 + i for i in range(len(names))]
        return self.rng.choices(names, weights)[0]


def _safe(pred, t) -> bool:
    try:
        return bool(pred(t))
    except Exception:
        return False


def _layout(rng: random.Random) -> str:
    return rng.choice(["contiguous"] * 6 + ["transposed", "broadcast"])


def _first_input_shape(rng: random.Random) -> tuple[int, ...]:
    dims = (1, 2, 3, 4, 5, 6, 8)
    form = rng.choice(["image", "sequence", "sequence", "flat", "any", "tile_edge"])
    if form == "tile_edge":
        # a dim just past a power of two: tiles with a ragged last one
        edge = rng.choice([7, 9, 15, 17, 31, 33, 63, 65])
        return (rng.choice([1, 2, 3]), edge) if rng.random() < 0.5 else \
            (rng.choice([1, 2]), edge, rng.choice([4, 8, 16]))
    if form == "image":
        return (rng.choice([1, 2]), rng.choice([1, 2, 3, 4]), rng.choice([4, 5, 6, 8]),
                rng.choice([4, 5, 6, 8]))
    if form == "sequence":
        return (rng.choice([1, 2]), rng.choice([3, 4, 5, 8]), rng.choice([4, 6, 8]))
    if form == "flat":
        return (rng.choice(dims), rng.choice([4, 6, 8]))
    return tuple(rng.choice(dims) for _ in range(rng.randint(1, 4)))


def generate(seed: int, *, max_ops: int = 12) -> Program:
    """A random valid program from ``seed`` (the same seed gives the same program). Torch's
    global random state is left as it was."""
    with torch.random.fork_rng():
        # parameters drawn in the order make_model() draws them, so the values checked here
        # are the ones the built module computes
        torch.manual_seed(seed)
        return _generate(seed, max_ops)


def _generate(seed: int, max_ops: int) -> Program:
    rng = random.Random(seed)
    gen = _Gen(rng, seed)
    gen.new_input(_first_input_shape(rng), "float32", _layout(rng))
    if rng.random() < 0.3:
        shape = tuple(gen.env["x1"].shape)
        gen.new_input(shape if rng.random() < 0.5 else _broadcast_partner(rng, shape),
                      rng.choice(["float32", "float32", "int64", "bool"]), _layout(rng))
    n_ops = rng.randint(2, max_ops)
    kinds = sorted(KINDS)
    weights = [KINDS[k].weight for k in kinds]
    attempts = 0
    while len(gen.ops) < n_ops and attempts < n_ops * 8:
        attempts += 1
        k = rng.choices(kinds, weights)[0]
        n_inputs, counter, rng_state = len(gen.inputs), gen.counter, torch.get_rng_state()
        picked = _safe_pick(k, gen)
        if picked is None:
            _roll_back(gen, n_inputs, counter)
            continue
        args, attrs = picked
        op = Op(k, tuple(args), attrs, gen.fresh("v"))
        try:
            value = _run_one(op, gen)
        except InvalidProgram:
            _roll_back(gen, n_inputs, counter)
            torch.set_rng_state(rng_state)
            continue
        gen.ops.append(op)
        gen.env[op.out] = value
        gen.exact[op.out] = _op_exact(op) and all(gen.exact[a] for a in args)
        gen.used.update(args)
    outputs = _choose_outputs(gen)
    p = Program(seed, tuple(gen.inputs), tuple(gen.ops), outputs, f"seed {seed}",
                nested=rng.random() < 0.1, dynamic=rng.random() < 0.2)
    render(p)  # the whole program once more, as make_model() builds it: parameters in order
    return p


def _safe_pick(k: str, gen: _Gen):
    try:
        return KINDS[k].pick(gen)
    except (IndexError, ValueError, RuntimeError, TypeError, KeyError):
        return None


def _run_one(op: Op, gen: _Gen):
    """The op's value on the generator's example tensors."""
    ts = [gen.env[a] for a in op.args]
    r = KINDS[op.kind].render(op.out, op.args, op.attrs, ts)
    scope = {**_NAMESPACE, "self": gen.holder}
    local = dict(gen.env)
    try:
        with torch.no_grad():
            for line in r.init:
                exec(line, scope)
            for line in r.forward:
                exec(line, scope, local)
    except Exception as e:
        raise InvalidProgram(f"{type(e).__name__}: {e}") from None
    _check_value(op.out, local[op.out])
    return local[op.out]


def _roll_back(gen: _Gen, n_inputs: int, counter: int) -> None:
    for spec in gen.inputs[n_inputs:]:
        gen.env.pop(spec.name, None)
        gen.exact.pop(spec.name, None)
    del gen.inputs[n_inputs:]
    gen.counter = counter


def _choose_outputs(gen: _Gen) -> tuple[str, ...]:
    """The values no op consumed (at most three, the last op's among them): every op then
    reaches an output or is a dead branch the compiler must drop. Now and then an output
    aliases another value: an input returned as is, or an intermediate also consumed."""
    if not gen.ops:
        return (gen.inputs[0].name,)
    last = gen.ops[-1].out
    leaves = [op.out for op in gen.ops if op.out not in gen.used and op.out != last]
    gen.rng.shuffle(leaves)
    outputs = sorted(leaves[:2], key=lambda n: int(n[1:])) + [last]
    if gen.rng.random() < 0.1:
        outputs.insert(0, gen.rng.choice(gen.inputs).name)
    if gen.rng.random() < 0.1 and len(gen.ops) > 1:
        inner = gen.rng.choice(gen.ops[:-1]).out
        if inner not in outputs:
            outputs.append(inner)
    return tuple(outputs)


# -- editing, for the shrinker -----------------------------------------------------------------

def live(p: Program) -> Program:
    """Without ops no output depends on, and without inputs nothing uses."""
    needed = set(p.outputs)
    kept = []
    for op in reversed(p.ops):
        if op.out in needed:
            kept.append(op)
            needed.update(op.args)
    ops = tuple(reversed(kept))
    inputs = tuple(s for s in p.inputs if s.name in needed)
    return replace(p, inputs=inputs, ops=ops)


def substitute(p: Program, old: str, new: str) -> Program:
    """Every use of value ``old`` (as an operand or output) becomes ``new``."""
    ops = tuple(replace(op, args=tuple(new if a == old else a for a in op.args)) for op in p.ops)
    outputs = tuple(dict.fromkeys(new if o == old else o for o in p.outputs))
    return replace(p, ops=ops, outputs=outputs)


DTYPE_NAMES = {torch.float32: "float32", torch.int64: "int64", torch.bool: "bool"}

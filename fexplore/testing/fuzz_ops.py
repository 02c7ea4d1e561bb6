"""The fuzzer's op kinds: what each can add to a random module, and the source it adds.

Each kind has a ``pick`` (given the generator's state: its random stream, the values defined so far
with their example tensors, and a way to add a model input; returns the operands' names and
plain-data attributes, or None when nothing fits) and a ``render`` (given the output's name, the
operands' names, the attributes and the operands' example tensors: the lines the op adds to
``__init__`` and ``forward``). Attributes are relative to the operands' shapes where they can be, so
that shrinking an input reshapes every op after it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

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
    """Registers the decorated pick function as kind ``name``; its renderer is registered with
    ``@<pick>.render`` right after it."""
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


def _render_template(out, args, attrs, ts):
    """A kind whose attrs hold one template over its operand (``torch.relu({a})``)."""
    return _fwd(out, dict(attrs)["expr"].format(a=args[0]))


_pick_unary.render(_render_template)


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
    shape = broadcast_partner(gen.rng, tuple(ta.shape))
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


def broadcast_partner(rng, shape: tuple) -> tuple:
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


_pick_pool.render(_render_template)


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
    # grouped-query attention: half the key/value heads, each shared by two query heads
    # a (batch, seq, width) operand split into two heads, as multi-head layers do
    heads = tq.dim() == 3 and tq.shape[-1] % 2 == 0 and rng.random() < 0.5
    gqa = (heads or tq.dim() == 4 and tq.shape[1] % 2 == 0) and rng.random() < 0.4
    return args, _attrs(mask=mask, scale=rng.choice([None, None, 0.5]), project=rng.random() < 0.5,
                        gqa=gqa, heads=heads)


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
    if at.get("heads"):
        lines.append(f"{out}_qh, {out}_kh, {out}_vh = (t.unflatten(-1, (2, -1)).transpose(1, 2) "
                     f"for t in ({qn}, {kn}, {vn}))")
        qn, kn, vn = f"{out}_qh", f"{out}_kh", f"{out}_vh"
    if at.get("gqa"):
        half = (2 if at.get("heads") else ts[0].shape[1]) // 2
        lines.append(f"{out}_kg, {out}_vg = {kn}[:, :{half}], {vn}[:, {half}:]")
        kn, vn = f"{out}_kg", f"{out}_vg"
        extra += ", enable_gqa=True"
    if at.get("heads"):
        lines.append(f"{out} = F.scaled_dot_product_attention({qn}, {kn}, {vn}{extra})"
                     f".transpose(1, 2).flatten(-2)")
    else:
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


_pick_const.render(_render_template)


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


def op_exact(op) -> bool:
    """Whether the op (a fuzz.Op) only moves, selects or exactly rescales values (then any
    correct implementation gives the same bits, and a comparison of its result cannot flip)."""
    if op.kind == "unary":
        return UNARY[op.attr("expr")]
    if op.kind == "inplace":
        return op.attr("form") in ("set_slice", "mul_", "relu_", "masked_fill_")
    if op.kind == "repeat":
        return op.attr("mode") != "bilinear"
    if op.kind == "scan_sort":
        return op.attr("form") != "cumsum"
    if op.kind == "route":   # the indices are distinct: a scatter into zeros adds nothing up
        return op.attr("form") != "index_add"
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


@kind("route", 0.8)
def _pick_route(gen):
    """Indices computed at run time, as a mixture-of-experts router makes them: the order or the
    top k of a ranking (a fresh input: its values are exact and, being random, tie-free, so
    eager and the compile pick the same indices), used to gather, select, scatter into zeros or
    add into a value."""
    a = gen.value(lambda t: _is_float(t) and t.dim() >= 1 and t.numel() <= 4096)
    if a is None:
        return None
    ta, rng = gen.env[a], gen.rng
    d = rng.randrange(ta.dim())
    form = rng.choice(["gather", "scatter_add", "index_select", "index_add"])
    ranking = tuple(ta.shape) if form in ("gather", "scatter_add") else (ta.shape[d],)
    return (a, gen.new_input(ranking, "float32")), _attrs(form=form, dim=d)


@_pick_route.render
def _render_route(out, args, attrs, ts):
    at = dict(attrs)
    (a, r), d, form = args, at["dim"], at["form"]
    k = max(1, ts[0].shape[d] // 2)
    top = f"torch.topk({r}, {k}, {d if form == 'scatter_add' else 0}).indices"
    return _fwd(out, {
        "gather": f"torch.gather({a}, {d}, torch.argsort({r}, {d}))",
        "scatter_add": f"torch.zeros_like({a}).scatter_add({d}, {top}, {a}.narrow({d}, 0, {k}))",
        "index_select": f"{a}.index_select({d}, {top})",
        "index_add": f"{a}.index_add({d}, {top}, {a}.narrow({d}, 0, {k}) * 0.5)",
    }[form])


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


@kind("experts", 0.6)
def _pick_experts(gen):
    """A mixture of experts' expert layer as transformers runs it: the rows of a value routed each
    to the expert a ranking picks (a fresh input, tie-free), sorted by expert, counted into offsets
    (histc), one grouped matmul over all experts (bf16, grouped_mm's dtype), and put back in order."""
    a = gen.value(lambda t: _is_float(t) and t.dim() >= 2 and t.numel() <= 4096)
    if a is None:
        return None
    ta, rng = gen.env[a], gen.rng
    rows, groups = ta.numel() // ta.shape[-1], rng.choice([2, 3, 5, 8])
    return (a, gen.new_input((rows, groups), "float32")), _attrs(
        groups=groups, n=rng.choice([1, 3, 4, 8, 17]), transposed=rng.random() < 0.5)


@_pick_experts.render
def _render_experts(out, args, attrs, ts):
    at = dict(attrs)
    (a, r), g, n = args, at["groups"], at["n"]
    k, lead = ts[0].shape[-1], tuple(ts[0].shape[:-1])
    w = (g, n, k) if at["transposed"] else (g, k, n)
    mats = f"self.{out}_w.transpose(1, 2)" if at["transposed"] else f"self.{out}_w"
    init = [f"self.{out}_w = torch.nn.Parameter((torch.randn{w} / {k}**0.5).to(torch.bfloat16))"]
    return Rendered(init, [
        f"{out}_e = {r}.argmax(-1)",
        f"{out}_o = torch.sort({out}_e, stable=True).indices",
        f"{out}_offs = torch.histc({out}_e.float(), bins={g}, min=0, max={g - 1}).cumsum(0).to(torch.int32)",
        f"{out}_y = F.grouped_mm({a}.reshape(-1, {k})[{out}_o].to(torch.bfloat16), {mats}, "
        f"offs={out}_offs).to({a}.dtype)",
        f"{out} = {out}_y[torch.argsort({out}_o)].reshape({lead + (n,)})",
    ])

"""Symbolic dims from torch.export into the IR's own sympy symbols.

torch names size symbols ``s0``, ``s45``...; the IR names each after the user's ``torch.export.Dim``
when one is given (``seq``), so types read ``i64[1, seq]``. torch's sympy also has its own functions
(FloorDiv, CeilDiv, Mod, ...); they become plain sympy here, so the IR needs nothing of torch to
print, parse or evaluate a dim.
"""

from __future__ import annotations

import inspect
import math
import re
from fractions import Fraction

import sympy
import torch
from sympy.printing.pycode import PythonCodePrinter

from fexplore.ir.types import canon_dim, symbol


# How far ``SymbolTable.rely_on`` looks either side of the example size for where a guard holds.
_GUARD_SCAN = 4096

# An input's size in torch's guard code: L['x'].size()[0], or inside a container of the
# forward's arguments L['args'][1].size()[0] (the input torch names args_1)
_INPUT_SIZE = re.compile(r"L\['([A-Za-z_][A-Za-z0-9_]*)'\]((?:\[\d+\])*)\.size\(\)\[(\d+)\]")


class SymbolTable:
    """Maps torch's symbols to IR symbols and carries their ranges."""

    def __init__(self, shape_env=None):
        self.to_ir: dict[sympy.Symbol, sympy.Symbol] = {}
        self.ranges: dict[str, tuple[int, int | None]] = {}
        # torch's ShapeEnv of the export: the facts its guards established about the symbols
        self.shape_env = shape_env
        # torch's guards over several symbols (``y.size()[1] <= x.size()[1]``), which no range
        # can hold: (torch's code, the same in IR dims), checked on each call's inputs
        self.relations: list[tuple[str, str]] = []
        # torch symbols ``tie`` made an expression of another's IR symbol
        self.tied: set[sympy.Symbol] = set()
        # torch's unbacked symbols of values read from a tensor (``.item()``: ``u0``) -> the IR
        # value of the 0-d tensor read: a converter that can take the value at run time does
        self.read_from: dict[sympy.Symbol, object] = {}

    def add(self, torch_sym: sympy.Symbol, name: str, lo: int, hi: int | None) -> None:
        taken = {s.name for s in self.to_ir.values() if isinstance(s, sympy.Symbol)}
        base, k = name, 1
        while name in taken:
            name, k = f"{base}_{k}", k + 1
        self.to_ir[torch_sym] = symbol(name)
        self.ranges[name] = (lo, hi)

    def tie(self, a, b) -> bool:
        """Make two torch dims one IR dim, where an op means them equal but torch's trace did
        not guard it, so each kept its own symbol: attention's key and value lengths, from two
        cache inputs exported with ``Dim.AUTO``, are ``keys_dim3 + 1`` and ``values_dim3 + 1``,
        and the attention they feed has no meaning unless they agree.

        The symbol of ``b`` that the equality solves for (``values_dim3``) becomes ``a``'s
        symbol plus a constant; its range narrows the one left, and a call whose inputs
        disagree is refused when its sizes are bound. False (nothing tied) when the two are
        not a symbol each apart from a constant, or the examples do not agree."""
        ia, ib = sympy.sympify(self.dim(a)), sympy.sympify(self.dim(b))
        if sympy.expand(ia - ib) == 0:
            return True
        if len(ia.free_symbols) != 1 or len(ib.free_symbols) != 1:
            return False
        (keep,), (drop,) = ia.free_symbols, ib.free_symbols
        owned = {s.name: t for s, t in self._to_torch().items()}
        if keep == drop or drop.name not in owned or not {keep.name, drop.name} <= set(self.ranges):
            return False
        # ia = keep + ca and ib = drop + cb are equal where drop = keep + (ca - cb)
        if not ((ia - keep).is_Integer and (ib - drop).is_Integer):
            return False
        offset = int((ia - keep) - (ib - drop))
        known_keep, known_drop = self._example(keep), self._example(drop)
        if known_keep is not None and known_drop is not None and known_drop != known_keep + offset:
            return False
        lo, hi = self.ranges[keep.name]
        dlo, dhi = self.ranges.pop(drop.name)
        lo = max(lo, dlo - offset)
        hi = hi if dhi is None else (dhi - offset if hi is None else min(hi, dhi - offset))
        self.ranges[keep.name] = (lo, hi)
        self.to_ir[owned[drop.name]] = keep + offset
        self.tied.add(owned[drop.name])
        return True

    def _to_torch(self) -> dict:
        """{IR symbol: the torch symbol it was made for} (not the ones ``tie`` pointed at it)."""
        return {s: t for t, s in self.to_ir.items() if t not in self.tied}

    def dim(self, d):
        """A torch dim (int, SymInt or sympy expr) as an IR dim."""
        if isinstance(d, torch.SymInt):
            expr = d.node.expr
        elif isinstance(d, (int,)):
            return int(d)
        else:
            expr = d
        return canon_dim(sympy.sympify(self.expr(expr)))

    def proves_equal(self, ir_dim, torch_dim) -> bool:
        """Whether torch's shape environment proves an IR dim equal to a torch dim from the
        facts tracing established (its guards): a chunk of a dynamic batch broadcast against a
        static 2 is torch's ``s - ceil(s/2)`` but pinned to 2 wherever the program runs. An
        equality torch cannot prove, or an IR dim in symbols torch does not know, is False."""
        if self.shape_env is None:
            return False
        want = torch_dim.node.expr if isinstance(torch_dim, torch.SymInt) else sympy.Integer(torch_dim)
        to_torch = self._to_torch()
        got = sympy.sympify(ir_dim)
        if not got.free_symbols <= set(to_torch):
            return False
        # torch proves from its guards as recorded (``Eq(s//2, 1)``), so the claim is also asked
        # with the terms both sides share cancelled (in the IR's plain sympy, where torch's
        # ``(s+1)//2`` and the IR's ``floor(s/2 + 1/2)`` are one term): the two halves of ``s``
        # concatenated, ``s//2 + (s+1)//2``, are ``floor(s/2 + 1/2) + 1`` by that guard, which
        # torch does not see in the claim as written
        claims = [sympy.Eq(want, got.xreplace(to_torch))]
        if want.free_symbols <= set(self.to_ir):   # (expr would add a symbol it does not know)
            constant, rest = (self.expr(want) - got).as_coeff_Add()
            rest = _floors_as_torch(rest.xreplace(to_torch))
            if rest is not None:
                claims.append(sympy.Eq(rest, -constant))
        for claim in claims:
            try:
                fact = self.shape_env._maybe_evaluate_static(claim)
            except Exception:  # torch's symbolic reasoning gave up on this expression: no proof
                continue
            if fact is sympy.true:
                return True
        return False

    def pinned(self, torch_dim) -> int | None:
        """The one size a symbolic torch dim can have where the program runs, when torch's
        guards pin it (``floor(s/2)`` fed to a conv's 2 input channels), else None. The
        symbol's range is narrowed to where the guard holds (``rely_on``)."""
        if not isinstance(torch_dim, torch.SymInt) or torch_dim.node.expr.is_Symbol:
            return None  # an input's own size symbol is dynamic: torch would have specialized it
        hint = torch_dim.node.hint
        if not isinstance(hint, int) or not self.proves_equal(hint, torch_dim) or \
                not self.rely_on(self.dim(torch_dim), hint):
            return None
        return hint

    def rely_on(self, ir_dim, size: int) -> bool:
        """Narrow the range of the one symbol of ``ir_dim`` to the sizes around the example's
        where ``ir_dim`` equals ``size``: a compile that relies on a guard torch recorded
        (``floor(s/2) == 1``) then refuses inputs where it fails, as torch's exported program
        does, instead of computing with a wrong size. False (nothing narrowed) when ``ir_dim``
        has another number of symbols, or the example itself does not satisfy it."""
        free = sympy.sympify(ir_dim).free_symbols
        if len(free) != 1:
            return False
        (n,) = free
        example = self._example(n)
        if example is None:
            return False
        value = _exact_function(n, ir_dim)
        return self._narrow(n.name, example, lambda v: value(v) == size)

    def _example(self, ir_symbol) -> int | None:
        """The size the export's example inputs gave an IR symbol, or None (no shape environment,
        or a symbol torch did not make)."""
        if self.shape_env is None:
            return None
        # (backed_var_to_val in newer torch, which deprecates var_to_val; older torch has only that)
        known = getattr(self.shape_env, "backed_var_to_val", None)
        to_torch = self._to_torch()
        v = (known if known is not None else self.shape_env.var_to_val).get(to_torch.get(ir_symbol))
        return None if v is None else int(v)

    def _narrow(self, name: str, v0: int, holds) -> bool:
        """Narrow symbol ``name``'s range to the sizes around ``v0`` where ``holds(size)``
        (False, nothing narrowed, when it fails at ``v0`` itself)."""
        if not holds(v0):
            return False
        lo, hi = self.ranges[name]
        a = v0
        while a - 1 >= lo and v0 - a < _GUARD_SCAN and holds(a - 1):
            a -= 1
        b = v0
        while (hi is None or b + 1 <= hi) and b - v0 < _GUARD_SCAN and holds(b + 1):
            b += 1
        # equal that far up (a Min with a constant): taken as equal for every larger size
        self.ranges[name] = (a, hi if b - v0 >= _GUARD_SCAN else b)
        return True

    def hold_input_guards(self, guards, input_shapes: dict) -> None:
        """Hold torch's guards on the input sizes, as its exported program does.

        torch.export records guards its tracing relied on that no dim of the program shows
        (``linspace(-1, 1, x[1::2].shape[0])`` makes its steps the example's 2 and guards
        ``x.size()[0] // 2 == 2``); its exported program refuses inputs that fail them, and so
        must the compile. ``guards``: Python over ``L['name'].size()[i]`` (the export's
        ``_guards_code``); ``input_shapes``: each user input's IR shape by placeholder name. A
        guard on one symbol narrows its range around the example's size; a guard over several
        (``y.size()[1] <= x.size()[1]``) is kept in ``relations``, for each call to check."""
        for code in guards or ():
            readable = _in_ir_dims(code, input_shapes)
            if readable is None:   # an input the guard names that is not a tensor argument
                continue
            text, free, bare = readable
            if len(free) == 1 and bare:   # over one input size itself: a range holds it
                (n,) = free
                test = compile(text, "<guard>", "eval")
                example = self._example(n)
                if example is not None and n.name in self.ranges:
                    self._narrow(n.name, example, lambda v: bool(eval(test, {}, {n.name: v})))
            elif len(free) > 1:
                self.relations.append((code, text))

    def expr(self, e):
        if isinstance(e, (int, float)):
            return e
        if e.is_Symbol:
            if e not in self.to_ir:  # a symbol torch made on its own (an unbacked size, say)
                self.add(e, e.name, 0, None)
            return self.to_ir[e]
        if e.is_Number:
            return e
        args = [self.expr(a) for a in e.args]
        name = type(e).__name__
        if name == "FloorDiv":
            return sympy.floor(args[0] / args[1])
        if name in ("CeilDiv", "IntTrueDiv", "CleanDiv"):
            return sympy.ceiling(args[0] / args[1]) if name == "CeilDiv" else args[0] / args[1]
        if name in ("Mod", "PythonMod"):
            return sympy.Mod(args[0], args[1])
        if name == "ModularIndexing":
            return sympy.Mod(sympy.floor(args[0] / args[1]), args[2])
        if name == "Max":
            return sympy.Max(*args)
        if name == "Min":
            return sympy.Min(*args)
        if name in ("TruncToInt", "FloorToInt", "RoundToInt"):
            return sympy.floor(args[0])
        if name == "CeilToInt":
            return sympy.ceiling(args[0])
        return e.func(*args)


def _floors_as_torch(e):
    """A plain sympy dim in torch's own terms (``floor(p/q)`` as its ``FloorDiv(p, q)``), so torch's
    shape environment matches it against its guards; None when some floor is not of a quotient
    of integer expressions."""
    from torch.utils._sympy.functions import FloorDiv

    ok = True

    def as_floordiv(f):
        nonlocal ok
        p, q = sympy.fraction(sympy.together(f.args[0]))
        if not (q.is_Integer and p.is_integer is not False):
            ok = False
            return f
        return FloorDiv(p, q)

    out = e.replace(lambda x: isinstance(x, sympy.floor), as_floordiv)
    return out if ok else None


def build_symbol_table(ep, user_inputs, dynamic_shapes, forward) -> SymbolTable:
    """Name torch's symbols after the user's Dims, matching the dynamic_shapes spec against the
    example inputs' dims; ranges come from the ExportedProgram's range constraints."""
    table = SymbolTable(_shape_env(user_inputs))
    names = _dim_names(user_inputs, dynamic_shapes, forward, ep.call_spec.in_spec)
    for sym, vr in ep.range_constraints.items():
        if not sym.is_Symbol:   # a range of an expression of sizes (2*s): its guard says the same
            continue
        # an unbounded end is sympy's oo or torch's int_oo (which calls itself finite); a size
        # read from data (.item(), a tensor of split points) may be unbounded below too
        lo = int(vr.lower) if isinstance(vr.lower, sympy.Integer) else 0
        hi = int(vr.upper) if isinstance(vr.upper, sympy.Integer) else None
        table.add(sym, names.get(sym, sym.name), lo, hi)
    return table


def _shape_env(fakes):
    """The ShapeEnv behind the export's symbolic input sizes (None when every size is static)."""
    for fake in fakes:
        for d in getattr(fake, "shape", ()):
            if isinstance(d, torch.SymInt):
                return d.node.shape_env
    return None


def _dim_names(user_inputs, dynamic_shapes, forward, in_spec=None) -> dict:
    """{torch symbol: IR name} for the input dims declared dynamic: the user's Dim's name, or for
    a ``Dim.AUTO`` / ``Dim.DYNAMIC`` dim the input's and axis's (``x_dim0``), not torch's ``s77``.

    ``dynamic_shapes`` follows the forward's signature (a dict by parameter name, or one entry per
    parameter, where a ``*args`` parameter takes a tuple and a container input a container of
    specs); ``in_spec``, the export's pytree spec of (args, kwargs), puts the flat user inputs
    back in that structure so each tensor meets its own spec."""
    if not dynamic_shapes:
        return {}
    named, unnamed = {}, {}
    for fake, spec, path in _tensor_specs(user_inputs, dynamic_shapes, forward, in_spec):
        if spec is None or not hasattr(fake, "shape"):
            continue
        items = spec.items() if isinstance(spec, dict) else enumerate(spec)
        for axis, dim in items:
            if dim is None or not isinstance(axis, int) or axis >= len(fake.shape):
                continue
            size = fake.shape[axis]
            if not isinstance(size, torch.SymInt) or not size.node.expr.is_Symbol:
                continue
            name = getattr(dim, "__name__", None)
            if name:
                named.setdefault(size.node.expr, name)
            elif path:
                unnamed.setdefault(size.node.expr, re.sub(r"\W", "_", f"{path}_dim{axis}"))
    return {**unnamed, **named}   # a symbol a Dim names somewhere takes that name


def _tensor_specs(user_inputs, dynamic_shapes, forward, in_spec):
    """(input tensor, its dims spec, its path) triples, walking the inputs' structure and the
    spec's together; the path names the parameter and the place in it (``args_1``, ``pair_0``),
    or is None without a signature to go by."""
    import torch.utils._pytree as pytree

    try:
        args, kwargs = pytree.tree_unflatten(list(user_inputs), in_spec)
        bound = inspect.signature(forward).bind(*args, **kwargs).arguments
    except Exception:   # no spec or signature to go by: the inputs in order, one spec each
        specs = dynamic_shapes.values() if isinstance(dynamic_shapes, dict) else dynamic_shapes
        yield from ((x, spec, None) for x, spec in zip(user_inputs, specs))
        return
    if isinstance(dynamic_shapes, dict):
        pairs = [(v, dynamic_shapes.get(k), k) for k, v in bound.items()]
    else:
        pairs = [(v, spec, k) for (k, v), spec in zip(bound.items(), dynamic_shapes)]
    while pairs:
        value, spec, path = pairs.pop(0)
        if spec is None:
            continue
        if isinstance(value, torch.Tensor):
            yield value, spec, path
        elif isinstance(value, dict) and isinstance(spec, dict):
            pairs[:0] = [(v, spec.get(k), f"{path}_{k}") for k, v in value.items()]
        elif isinstance(value, (list, tuple)) and isinstance(spec, (list, tuple)):
            pairs[:0] = [(v, sp, f"{path}_{i}") for i, (v, sp) in enumerate(zip(value, spec))]
        elif type(value) in pytree.SUPPORTED_NODES and isinstance(spec, (list, tuple)):
            # a class registered with pytree (a cache object): its spec follows its flat children
            children = pytree.SUPPORTED_NODES[type(value)].flatten_fn(value)[0]
            pairs[:0] = [(v, sp, f"{path}_{i}") for i, (v, sp) in enumerate(zip(children, spec))]


class _ExactPrinter(PythonCodePrinter):
    """Python source of a dim expression in exact arithmetic: its rationals as Fractions."""

    def _print_Rational(self, e):
        return f"Fraction({e.p}, {e.q})"


def _exact_function(n: sympy.Symbol, expr):
    """``expr`` as a function of the integer ``n``, evaluated exactly. In floats a torch length
    such as floor(s/3 + 1/3) is 1.9999999999999998 at s = 5 and floors to 1, so a guard's range
    reached sizes where it fails (fuzz seed 1530032)."""
    f = sympy.lambdify(n, expr, modules=[{"Fraction": Fraction, "math": math}, "math"], printer=_ExactPrinter)
    return lambda v: f(Fraction(v))


def _in_ir_dims(code: str, input_shapes: dict):
    """(a guard's code with each input size written as its IR dim, the IR dims' free symbols,
    whether each such dim is a symbol itself), or None when it reads something other than the
    size of a tensor input."""
    dims = []

    def size(m):
        name = m.group(1) + "".join(f"_{i}" for i in re.findall(r"\d+", m.group(2)))
        shape = input_shapes.get(name)
        axis = int(m.group(3))
        if shape is None or axis >= len(shape):
            raise LookupError(m.group(0))
        dims.append(shape[axis])
        return f"({shape[axis]})"
    try:
        text = _INPUT_SIZE.sub(size, code)
    except LookupError:
        return None
    if "L[" in text:
        return None
    symbolic = [sympy.sympify(d) for d in dims if not isinstance(d, int)]
    free = set().union(*(d.free_symbols for d in symbolic))
    return text, free, all(d.is_Symbol for d in symbolic)


def broken_relation(relations, inputs) -> str | None:
    """The first of torch's guards over several sizes (``SymbolTable.relations``) that the call's
    inputs fail, in IR dims (``(y_dim1) <= (x_dim1)``); None when all hold. ``inputs``: the
    forward's arguments by parameter name, as torch's guard code reads them (``L['x']``)."""
    for code, text in relations:
        try:
            ok = bool(eval(code, {}, {"L": inputs}))
        except Exception:  # noqa: BLE001 - a guard this call's structure cannot answer is not ours to hold
            continue
        if not ok:
            return text
    return None

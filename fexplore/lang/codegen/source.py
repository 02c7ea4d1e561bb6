"""Writing kernel source: names a person would pick, literals, indentation, the header comment."""

from __future__ import annotations

import ast
import functools
import keyword
import math
import os
import re

import numpy as np

from fexplore.ir import Constant, DType

_RESERVED = {"fl", "target", "pipelining", "functional", "range", "sum", "max", "min", "abs", "round"}


# what the layout stage adds to a parameter's name, simplify to a linear's weight and bias it
# folds a norm's affine part into, and the precision stage (and simplify) to a constant's copy in
# another dtype (the kernel reads them as the weight and bias they stand for: ``c_attn_weight``
# for ``h.0.attn.c_attn.weight.tiled.bf16``, not ``bf16``)
_SUFFIXES = {"tiled", "relayout", "norm_scaled", "norm_shifted"} | {d.value for d in DType}
_GENERIC = {"weight", "bias"}


class Names:
    """Unique Python identifiers derived from IR names (``h.0.ln_1.weight`` -> ``ln_1_weight``)."""

    def __init__(self, taken=()):
        self.taken: set[str] = set(taken) | _RESERVED

    def new(self, hint: str) -> str:
        parts = [p for p in re.split(r"[^0-9A-Za-z_]+", hint) if p]
        while len(parts) > 1 and parts[-1] in _SUFFIXES:
            parts.pop()
        k = len(parts) - 1
        while k > 0 and (parts[k] in _GENERIC or parts[k].isdigit()):
            k -= 1   # blocks.0.mlp.2.weight -> mlp_2_weight
        base = "_".join(parts[max(k, 0):]) if parts else "t"
        base = re.sub(r"^(\d)", r"v\1", base.lstrip("_")).lower() or "t"
        if keyword.iskeyword(base):
            base += "_"
        name, k = base, 1
        while name in self.taken:
            name, k = f"{base}_{k}", k + 1
        self.taken.add(name)
        return name


def literal(value) -> str:
    """A Python literal for a scalar (what a constant 0-d region input becomes)."""
    v = np.asarray(value).item()
    if isinstance(v, bool):
        return "1" if v else "0"   # an int: bit ops take it, and arithmetic promotes it
    if isinstance(v, int):
        return str(v)
    if math.isnan(v):
        return 'float("nan")'
    if math.isinf(v):
        return 'float("inf")' if v > 0 else 'float("-inf")'
    return repr(float(np.float32(v))) if abs(v) > 0 else "0.0"


def scalar_constant(v) -> str | None:
    """The literal of a region input that is a 0-d (or 1-element) constant, else None."""
    if isinstance(v, Constant) and v.payload is not None and np.asarray(v.payload).size == 1 \
            and np.asarray(v.payload).ndim == 0:
        return literal(v.payload)
    return None


def fl_dtype(dt: DType) -> str:
    return {"bool": "fl.bool_"}.get(dt.name, f"fl.{dt.name}")


def where_from(node) -> str:
    """``h.0.mlp.c_fc (gpt.py:73)``: the module path and the file's name and line, no directories."""
    loc = node.loc
    if loc is None:
        return "no source location"
    module = loc.module or "the model"
    if loc.file:
        return f"{module} ({os.path.basename(loc.file)}:{loc.line})"
    return module


class Writer:
    def __init__(self):
        self.lines: list[str] = []
        self.depth = 0

    def __call__(self, line: str = "") -> None:
        self.lines.append(("    " * self.depth + line) if line else "")

    def indent(self):
        writer = self

        class _Block:
            def __enter__(self):
                writer.depth += 1

            def __exit__(self, *exc):
                writer.depth -= 1

        return _Block()

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def cast_to(expr: str, src: DType, dst: DType) -> str:
    """`expr` (a tile of dtype `src`) as an operand of dtype `dst` for the tensor unit; fp8 saturates
    to its range first, as the IR's cast does."""
    if src == dst:
        return expr
    if dst == DType.fp8 and src.is_float:
        return f"fl.cast(fl.minimum(fl.maximum({expr}, -448.0), 448.0), fl.fp8)"
    return astype(expr, dst)


def astype(expr: str, dt: DType) -> str:
    """``expr.astype(dt)`` as source, `expr` in parentheses unless it binds tighter than the
    attribute access (a name, a call, a subscript): ``(acc / K).astype(...)``, not
    ``acc / K.astype(...)``."""
    try:
        primary = isinstance(ast.parse(expr, mode="eval").body,
                             (ast.Name, ast.Attribute, ast.Call, ast.Subscript))
    except SyntaxError:
        primary = False
    return f"{expr if primary else f'({expr})'}.astype({fl_dtype(dt)})"


@functools.lru_cache(maxsize=4096)   # asked again for each kernel on every build of a whole program
def canonical_source(source: str, *, numbers: bool = True) -> str:
    """`source` without comments and with its names renamed in order of first appearance
    (attribute names, keywords and builtins kept): two kernels that differ only in the names of
    their values (layer 0's and layer 11's) have the same canonical source, so what is learned
    about one (its best tiles, that it computes right on these shapes) holds for the other."""
    import builtins
    import io
    import keyword
    import tokenize

    renamed: dict[str, str] = {}
    out, after_dot = [], False
    # numbers=False: literals count as one (layer 3's cache update at row 3, layer 4's at row 4)
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type in (tokenize.COMMENT, tokenize.NL):
                continue
            text = tok.string
            if tok.type == tokenize.NAME and not after_dot and not keyword.iskeyword(text) \
                    and not hasattr(builtins, text) and text != "fl":
                text = renamed.setdefault(text, f"v{len(renamed)}")
            if tok.type == tokenize.NUMBER and not numbers:
                text = "0"
            after_dot = tok.type == tokenize.OP and tok.string == "."
            out.append(text)
    except (tokenize.TokenError, SyntaxError):   # not a whole program (a user's lambda, say): as is
        return source
    return " ".join(out)

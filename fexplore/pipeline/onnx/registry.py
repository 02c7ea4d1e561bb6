"""The ONNX converter registry: (domain, op type, opset range) -> a function emitting fexplore ops.

It mirrors the ATen registry (``fexplore.pipeline.convert.registry``): a converter receives an
``OnnxContext`` for one ONNX node and returns the IR value(s) of that node's outputs, emitting
nodes with ``ctx.emit``, the same ``ConvertContext.emit`` the ATen converters use, so both doors
build the same IR ops with the same type rules. An op's meaning can change between opsets
(Squeeze's axes moved from an attribute to an input at 13); each registration says from which
opset up to which it holds, and lookup picks the one covering the model's opset.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from fexplore.errors import ErrorDoc, FexploreError, SourceLoc

from ..convert.registry import ConvertContext

OnnxConverter = Callable[["OnnxContext"], Any]

# The oldest opset the converters are written for; an older model is upgraded to it on load.
MIN_OPSET = 13


@dataclass(frozen=True)
class Registration:
    domain: str
    op_type: str
    since: int
    until: int | None  # the last opset it holds for; None: every newer one
    fn: OnnxConverter

    def covers(self, opset: int) -> bool:
        return self.since <= opset and (self.until is None or opset <= self.until)


ONNX_CONVERTERS: dict[tuple[str, str], list[Registration]] = {}


def onnx_converter(*op_types: str, domain: str = "", since: int = MIN_OPSET,
                   until: int | None = None, replace: bool = False):
    """Register a converter for ONNX op types of ``domain`` ("" is the default ai.onnx domain)
    at opsets ``since`` to ``until`` (inclusive; None: every newer one). Two converters for one
    opset are an error unless ``replace=True``, which takes the opsets over from the one there::

        @onnx_converter("Gelu", since=20)
        def _gelu(ctx):
            return ctx.emit("gelu", [ctx.input(0)], {"approximate": ctx.attr("approximate", "none")})
    """

    def deco(fn: OnnxConverter) -> OnnxConverter:
        for op in op_types:
            regs = ONNX_CONVERTERS.setdefault((_domain(domain), op), [])
            if replace:
                regs[:] = [r for r in regs if not _overlap(r, since, until)]
            for r in regs:  # two converters for one opset would leave the last import in charge
                if r.fn is not fn and _overlap(r, since, until):
                    raise ValueError(f"{domain or 'ai.onnx'}::{op} opsets {since}..{until} "
                                     f"already have a converter ({r.fn.__module__}.{r.fn.__name__})"
                                     "; pass replace=True to take them over")
            regs.append(Registration(_domain(domain), op, since, until, fn))
        return fn

    return deco


def _overlap(r: Registration, since: int, until: int | None) -> bool:
    return (until is None or r.since <= until) and (r.until is None or since <= r.until)


def _domain(d: str) -> str:
    return "" if d in ("", "ai.onnx") else d


def lookup(domain: str, op_type: str, opset: int) -> OnnxConverter | None:
    for r in ONNX_CONVERTERS.get((_domain(domain), op_type), []):
        if r.covers(opset):
            return r.fn
    return None


def registered_opsets(domain: str, op_type: str) -> list[tuple[int, int | None]]:
    return [(r.since, r.until) for r in ONNX_CONVERTERS.get((_domain(domain), op_type), [])]


class OnnxConversionError(FexploreError):
    """An ONNX node uses its op in a way fexplore does not compile (an attribute value, a dtype,
    a data-dependent operand); the message says which."""

    code = "FX410"
    doc = ErrorDoc(
        when="An ONNX node uses an op fexplore converts, in a way it does not compile: an attribute "
             "value, a dtype or an operand form the converter declines (BitCast between types of "
             "different widths, Cast to float8 without saturation, a Loop whose condition is "
             "computed from the data).",
        example="onnx.helper.make_node(\"BitCast\", [\"x\"], [\"y\"], to=onnx.TensorProto.INT64)"
                "   # x is float32: 32 bits, not 64",
        fix="Rewrite that node in the exporting model (a Cast, if values were meant), or register "
            "a converter of your own for the op with onnx_converter(..., replace=True).")


class _NodeRef:
    """What ``ConvertContext`` reads of its node: the base name of the values it emits."""

    def __init__(self, name: str):
        self.name = name
        self.meta: dict = {}


class OnnxContext(ConvertContext):
    """What an ONNX converter sees: the node's attributes (``attr``), its inputs as IR values
    (``input``) or as values known at import time (``const``: initializers, Constant nodes,
    shapes; a graph input read this way is frozen to its example value), the opset, and
    ``emit`` (inherited: one emit for both doors)."""

    def __init__(self, builder, onnx_node, importer, opset: int, loc: SourceLoc):
        base = onnx_node.output[0] if onnx_node.output and onnx_node.output[0] else \
            (onnx_node.name or onnx_node.op_type.lower())
        super().__init__(builder, _NodeRef(base), [], {}, loc)
        self.onnx = onnx_node
        self.importer = importer
        self.opset = opset
        self._attrs = {a.name: a for a in onnx_node.attribute}

    # -- attributes ------------------------------------------------------------------------

    def attr(self, name: str, default=None):
        """An attribute's value as Python (ints, floats, strings, tuples; a tensor as numpy; a
        graph as the GraphProto)."""
        a = self._attrs.get(name)
        if a is None:
            return default
        from onnx import helper, numpy_helper

        v = helper.get_attribute_value(a)
        if isinstance(v, bytes):
            return v.decode()
        if isinstance(v, list):
            return tuple(x.decode() if isinstance(x, bytes) else x for x in v)
        if a.type == a.TENSOR:
            return numpy_helper.to_array(v)
        return v

    def has_attr(self, name: str) -> bool:
        return name in self._attrs

    # -- inputs ----------------------------------------------------------------------------

    @property
    def n_inputs(self) -> int:
        return len(self.onnx.input)

    def has_input(self, i: int) -> bool:
        return i < len(self.onnx.input) and bool(self.onnx.input[i])

    def input(self, i: int):
        """Input i as an IR Value (None when it is absent or empty)."""
        if not self.has_input(i):
            return None
        return self.importer.value(self.onnx.input[i], self)

    def inputs(self) -> list:
        return [self.input(i) for i in range(self.n_inputs)]

    def const(self, i: int, what: str = "operand"):
        """Input i's value, known at import time (numpy; None when absent). A shape-like operand
        given as a graph input is frozen to the example's value (recorded in the ingest stage,
        checked on every call); one computed at run time is refused."""
        if not self.has_input(i):
            return None
        return self.importer.known_value(self.onnx.input[i], self, what)

    def const_ints(self, i: int, what: str = "operand") -> tuple | None:
        v = self.const(i, what)
        return None if v is None else tuple(_as_int(x) for x in np.asarray(v).reshape(-1))

    def _node_base(self) -> str:
        return self.node.name

    def refuse(self, why: str, hint: str | None = None):
        raise OnnxConversionError(
            f"{self.onnx.op_type} node {self.onnx.name or self.onnx.output[0]!r}: {why}",
            loc=self.loc, hint=hint or "this use of the op is not supported yet; a converter of "
            "your own takes over with @fexplore.pipeline.onnx.onnx_converter("
            f"{self.onnx.op_type!r}, since={self.opset}, replace=True)")


def _as_int(x):
    import sympy

    if isinstance(x, sympy.Expr):
        return int(x) if x.is_Integer else x
    return int(x)

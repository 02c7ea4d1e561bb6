"""OpDef: everything about one op in one place.

An OpDef holds the attribute schema, the type rule, the numpy reference (the op's meaning), the
cost model (flops, bytes) and the category. The interpreter, the verifier, the cost reports and
the passes all ask the OpDef; no op rule lives anywhere else.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import sympy

from .types import DType, Dim, TensorType, numel

REQUIRED = object()


class Category(enum.Enum):
    elementwise = "elementwise"
    broadcast = "broadcast"  # creates or broadcasts data (full, arange, expand)
    reduction = "reduction"
    contraction = "contraction"
    movement = "data movement"
    opaque = "opaque"  # normalizations, attention, custom ops: more than one of the above
    region = "region"


# Attribute kinds: each names the Python types an attribute value may have.
_KINDS: dict[str, Callable[[Any], bool]] = {
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, float),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "bool": lambda v: isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "dtype": lambda v: isinstance(v, DType),
    "dim": lambda v: (isinstance(v, int) and not isinstance(v, bool)) or isinstance(v, sympy.Expr),
    "scalar": lambda v: (isinstance(v, (int, float)) and not isinstance(v, bool))
    or isinstance(v, sympy.Expr),
    # a fill value: a number, a bool (a bool tensor's fill) or a symbolic size
    "literal": lambda v: isinstance(v, (int, float, bool)) or isinstance(v, sympy.Expr),
    "ints": lambda v: isinstance(v, tuple) and all(_KINDS["int"](x) for x in v),
    "dims": lambda v: isinstance(v, tuple) and all(_KINDS["dim"](x) for x in v),
}


@dataclass(frozen=True)
class AttrSpec:
    name: str
    kind: str  # a key of _KINDS
    default: Any = REQUIRED
    optional: bool = False  # None allowed

    def check(self, v) -> bool:
        return (v is None and self.optional) or _KINDS[self.kind](v)


@dataclass(frozen=True)
class Cost:
    flops: Dim
    bytes: Dim  # bytes read + written, each operand once (the DRAM traffic if run alone)


TypeRule = Callable[[Sequence[TensorType], Any], list[TensorType]]
Reference = Callable[[Sequence[np.ndarray], Any], list[np.ndarray]]
CostRule = Callable[[Sequence[TensorType], Sequence[TensorType], Any], Cost]


def io_bytes(ins: Sequence[TensorType], outs: Sequence[TensorType]) -> Dim:
    total: Dim = 0
    for t in list(ins) + list(outs):
        total = total + t.nbytes()
    return total


def elementwise_cost(flops_per_element: int = 1) -> CostRule:
    def cost(ins, outs, attrs) -> Cost:
        return Cost(flops=numel(outs[0].shape) * flops_per_element, bytes=io_bytes(ins, outs))

    return cost


def movement_cost(ins, outs, attrs) -> Cost:
    return Cost(flops=0, bytes=io_bytes(ins, outs))


@dataclass(frozen=True, eq=False)
class OpDef:
    """The definition of one op.

    ``infer`` maps input types and attrs to output types; ``reference`` maps numpy inputs and
    (concrete) attrs to numpy outputs of exactly the inferred types; ``cost`` gives flops and bytes.
    ``arity`` is the exact input count, or None for variadic ops (``min_inputs`` then applies).
    Region ops set ``run_regions``: ``(inputs, attrs, regions, run_graph) -> outputs``, where
    ``run_graph(graph, inputs)`` is supplied by the interpreter.
    """

    name: str
    category: Category
    infer: TypeRule
    reference: Reference | None
    cost: CostRule
    attrs: tuple[AttrSpec, ...] = ()
    arity: int | None = 1
    min_inputs: int = 0
    doc: str = ""
    run_regions: Callable | None = None
    num_regions: int = 0
    # the reference reads its inputs' stored bits (bitcast), so the interpreter hands it the
    # arrays as they are instead of widening f16/bf16/fp8 to f32 first
    stored_inputs: bool = False

    def infer_types(self, ins: Sequence[TensorType], attrs, regions=()) -> list[TensorType]:
        """The type rule; region ops' rules also see their bodies."""
        if self.num_regions:
            return self.infer(ins, attrs, regions)
        return self.infer(ins, attrs)

    def attr_spec(self, name: str) -> AttrSpec | None:
        for a in self.attrs:
            if a.name == name:
                return a
        return None

    def defaults(self) -> dict:
        return {a.name: a.default for a in self.attrs if a.default is not REQUIRED}

    def is_default(self, name: str, value) -> bool:
        from .graph import attr_equal

        spec = self.attr_spec(name)
        return spec is not None and spec.default is not REQUIRED and \
            attr_equal(spec.default, value)

    def complete_attrs(self, given: dict) -> dict:
        """Fill defaults and check kinds; raises TypeError naming the bad attribute."""
        out = {}
        for spec in self.attrs:
            if spec.name in given:
                v = given[spec.name]
            elif spec.default is not REQUIRED:
                v = spec.default
            else:
                raise TypeError(f"{self.name}: missing attribute {spec.name!r}")
            if not spec.check(v):
                raise TypeError(f"{self.name}: attribute {spec.name}={v!r} is not a {spec.kind}")
            out[spec.name] = v
        extra = set(given) - {a.name for a in self.attrs}
        if extra:
            raise TypeError(f"{self.name}: unknown attribute(s) {sorted(extra)}")
        return out

    def check_arity(self, n: int) -> str | None:
        if self.arity is not None and n != self.arity:
            return f"{self.name} takes {self.arity} input(s), got {n}"
        if self.arity is None and n < self.min_inputs:
            return f"{self.name} takes at least {self.min_inputs} input(s), got {n}"
        return None

    def __repr__(self) -> str:
        return f"<OpDef {self.name} ({self.category.value})>"

"""The converter registry: ATen overload -> a function emitting fexplore ops.

A converter receives a ``ConvertContext`` for one FX node and returns the IR value(s) standing for
that node's result (a Value, or a tuple of Values for multi-result ops). It emits nodes with
``ctx.emit``, which infers result types from the OpDef; ingestion then checks them against torch's
own fake-tensor types, so a converter that misreads an op fails at once, on the user's line.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import sympy
import torch

from fexplore.errors import SourceLoc
from fexplore.ir import Attrs, Constant, DType, Node, TensorType, Value, get_op
from fexplore.ir.types import promote_types

Converter = Callable[["ConvertContext"], Any]
CONVERTERS: dict[str, Converter] = {}
# Converters for nodes that read or make complex tensors (see complex.py); ingestion picks this
# table for such a node, so a real converter never sees a complex value in its real layout.
COMPLEX_CONVERTERS: dict[str, Converter] = {}


def converter(*targets: str):
    """Register a converter for one or more ATen overloads, by their printed name
    (``"aten.add.Tensor"``), so that a lookup needs no torch op objects."""

    def deco(fn: Converter) -> Converter:
        _add(CONVERTERS, targets, fn)
        return fn

    return deco


def _add(table: dict[str, Converter], targets, fn: Converter) -> None:
    # Two converters for one overload would leave the one imported last silently in charge.
    for t in targets:
        if t in table and table[t] is not fn:
            raise ValueError(f"{t} already has a converter ({table[t].__module__}."
                             f"{table[t].__name__}); one overload, one converter")
        table[t] = fn


_TORCH_DTYPES = {
    torch.float64: DType.f64, torch.float32: DType.f32, torch.float16: DType.f16, torch.bfloat16: DType.bf16,
    torch.float8_e4m3fn: DType.fp8, torch.int64: DType.i64, torch.int32: DType.i32,
    torch.int16: DType.i16, torch.int8: DType.i8, torch.uint8: DType.u8, torch.bool: DType.bool,
}


def complex_converter(*targets: str):
    """Register the converter of ATen overloads for nodes touching complex tensors."""

    def deco(fn: Converter) -> Converter:
        _add(COMPLEX_CONVERTERS, targets, fn)
        return fn

    return deco


# The IR has no complex dtype: a complex tensor is its view_as_real layout, a real tensor with a
# trailing axis of 2 (real, imaginary), of the matching real dtype.
_COMPLEX_PARTS = {torch.complex64: torch.float32, torch.complex128: torch.float64,
                  torch.complex32: torch.float16}


def is_complex(x) -> bool:
    """Whether an FX node's value (or a fake tensor) is a complex tensor."""
    val = x.meta.get("val") if isinstance(x, torch.fx.Node) else x
    return isinstance(val, torch.Tensor) and val.dtype in _COMPLEX_PARTS


def fake_type(val: torch.Tensor, dim: Callable) -> TensorType:
    """The IR type of a torch (fake) tensor; a complex one in its real layout, ``[..., 2]``."""
    shape = tuple(dim(d) for d in val.shape)
    if val.dtype in _COMPLEX_PARTS:
        return TensorType(shape + (2,), ir_dtype(_COMPLEX_PARTS[val.dtype]))
    return TensorType(shape, ir_dtype(val.dtype))


def part_dtype(dt: torch.dtype) -> DType:
    """The IR dtype holding a torch dtype's values: a complex dtype's real part's."""
    return ir_dtype(_COMPLEX_PARTS.get(dt, dt))


def ir_dtype(dt: torch.dtype) -> DType:
    try:
        return _TORCH_DTYPES[dt]
    except KeyError:
        raise TypeError(f"dtype {dt} has no IR counterpart") from None


def torch_dtype(dt: DType) -> torch.dtype:
    return {v: k for k, v in _TORCH_DTYPES.items()}[dt]


class ConvertContext:
    """What a converter sees: the FX node, its arguments resolved to IR values or dims, and ``emit``.

    ``ctx.args``/``ctx.kwargs`` hold the node's arguments with FX nodes replaced by what ingestion
    made of them: Values for tensors, ints or sympy expressions for SymInts.
    """

    def __init__(self, builder, fx_node, args, kwargs, loc: SourceLoc | None):
        self.b = builder
        self.node = fx_node
        self.args = args
        self.kwargs = kwargs
        self.loc = loc
        self._count = 0
        self._literals = 0
        self._taken: set[str] = set()

    # -- what torch says about this node --------------------------------------------------

    @property
    def meta(self):
        return self.node.meta.get("val")

    def out_type(self, i: int | None = None) -> TensorType:
        """The type torch computed for result i (or the only result). A dim torch keeps as an
        expression but pins to one size by a guard (take_along_dim's static index broadcast
        against ``floor(s/2)``, guarded equal to 4) is that size, as ingestion gives the result
        itself (``ingest._pin_guarded_dims``), so a converter building from this type agrees."""
        val = self.meta if i is None else self.meta[i]
        t = fake_type(val, self.b.symbols.dim)
        if not isinstance(val, torch.Tensor) or len(val.shape) != t.rank:
            return t
        shape = tuple(d if isinstance(d, int) else (self.b.symbols.pinned(v) or d)
                      for d, v in zip(t.shape, val.shape))
        return t if shape == t.shape else t.with_shape(shape)

    def arg(self, i: int, name: str | None = None, default=None):
        if i < len(self.args):
            return self.args[i]
        if name is not None and name in self.kwargs:
            return self.kwargs[name]
        return default

    # -- building --------------------------------------------------------------------------

    def _name(self) -> str:
        base = self.node.name
        while True:  # a multi-result node's values (base.0, base.1, ...) may hold the next names
            name = base if self._count == 0 else f"{base}.{self._count}"
            self._count += 1
            if name not in self._taken:
                return name

    def _take(self, values) -> None:
        self._taken.update(v.name for v in values)

    def emit(self, op: str, inputs, attrs: dict | None = None, *, n_results: int | None = None):
        """Emit one node; returns its Value (or a tuple of Values for multi-result ops)."""
        opdef = get_op(op)
        inputs = [self.value(x, self._weak_scalar_dtype(x, inputs)) for x in inputs]
        full = Attrs(opdef.complete_attrs(dict(attrs or {})))
        types = opdef.infer_types([v.type for v in inputs], full)
        name = self._name()
        if len(types) == 1 and n_results is None:
            outs = [Value(name, types[0])]
        else:
            outs = [Value(f"{name}.{i}", t) for i, t in enumerate(types)]
        self._take(outs)
        self.b.nodes.append(Node(opdef, inputs, full, outs, self.loc))
        return outs[0] if len(outs) == 1 and n_results is None else tuple(outs)

    def inline(self, body, inputs, tag: str) -> list[Value]:
        """``body``'s nodes (a converted subgraph: a loop body, a score_mod) emitted here on
        ``inputs``; returns what stands for its outputs. Its values are named under this node's
        name and ``tag``: a converter names values after their FX node, and the subgraph's own
        names (``add``, ``full``) may be those of the model's nodes."""
        from fexplore.ir.inline import inline_body

        constants, nodes, outs = inline_body(body, inputs, self.b._names, self.loc, sep="_",
                                             prefix=f"{self.node.name}.{tag}.")
        self.b.constants += constants
        self.b.nodes += nodes
        return outs

    def emit_region_op(self, op: str, inputs, regions, attrs: dict | None = None):
        opdef = get_op(op)
        inputs = [self.value(x) for x in inputs]
        full = Attrs(opdef.complete_attrs(dict(attrs or {})))
        types = opdef.infer_types([v.type for v in inputs], full, regions)
        name = self._name()
        outs = [Value(f"{name}.{i}" if len(types) > 1 else name, t) for i, t in enumerate(types)]
        self._take(outs)
        self.b.nodes.append(Node(opdef, inputs, full, outs, self.loc, regions))
        return outs[0] if len(outs) == 1 else tuple(outs)

    @staticmethod
    def _weak_scalar_dtype(x, inputs) -> DType | None:
        """torch ranks a Python number below every tensor, 0-d ones too: beside 0-d tensors of
        its own kind or a wider one (an int with i32 tensors, a float with f16 ones) it takes
        their dtype. (Beside dimensioned tensors promote_types already lets them win.)"""
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            return None
        tensors = [v.type for v in inputs if isinstance(v, Value)]
        if not tensors or any(t.rank for t in tensors):
            return None
        common = promote_types(tensors)
        kind = 2 if isinstance(x, float) else 1
        have = 2 if common.is_float else (1 if common.is_int else 0)
        return common if have >= kind else None

    def value(self, x, dtype: DType | None = None) -> Value:
        """A tensor operand: Values pass through; Python numbers and dims become 0-d constants
        (ints i64, floats f32, bools bool: torch's weak scalar types, see promote_types), or of
        ``dtype`` when given (a symbolic size too: its value once the size is known)."""
        if isinstance(x, Value):
            return x
        if dtype is not None and isinstance(x, (int, float)) and not isinstance(x, bool):
            return self.scalar(x, dtype)
        if isinstance(x, bool):
            return self.scalar(x, DType.bool)
        if isinstance(x, int):
            return self.scalar(x, DType.i64)
        if isinstance(x, float):
            return self.scalar(x, DType.f32)
        if isinstance(x, sympy.Expr):  # a symbolic size used as a tensor operand
            return self.emit("full", [], {"shape": (), "value": x, "dtype": dtype or DType.i64})
        raise TypeError(f"cannot use {x!r} as a tensor operand")

    def scalar(self, v, dtype: DType) -> Constant:
        self._literals += 1
        with np.errstate(over="ignore"):  # -1 as u8 is 255, as torch wraps it
            array = np.asarray(v).astype(dtype.numpy)
        return self.b.literal(array,
                              f"{self.node.name}.c{self._literals - 1}")

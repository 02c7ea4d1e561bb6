"""The reference interpreter: the meaning of the IR.

Constant folding, stage verification and the simulator's functional mode all run graphs through
here; no one else re-implements an op. Each node is computed by its OpDef's numpy reference,
low-precision floats computing in f32 and rounding to the node's declared dtype once at the end.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np
import sympy

from fexplore.errors import InputError

from .graph import Attrs, Graph, Node
from .types import DType, TensorType, concrete_shape, symbol

NodeHook = Callable[[Node, Sequence[np.ndarray]], None]


# torch's names for the IR's dtypes, for a hint a user can paste
_TORCH_NAMES = {"f64": "float64", "f32": "float32", "f16": "float16", "bf16": "bfloat16",
                "fp8": "float8_e4m3fn", "i64": "int64", "i32": "int32", "i16": "int16", "i8": "int8",
                "u64": "uint64", "u32": "uint32", "u16": "uint16", "u8": "uint8", "bool": "bool"}
_SIZES_HINT = ("pass inputs of the shapes it was compiled with; for sizes that vary, compile with "
               "dynamic_shapes= (torch.export.Dim)")


def bind_symbols(g: Graph, arrays: Sequence[np.ndarray]) -> dict:
    """Unify the graph's input types with concrete arrays: ``{Symbol: int}``. Raises InputError on
    a count, rank, dtype, static-dim or symbol-range mismatch."""
    if len(arrays) != len(g.inputs):
        raise InputError(f"{g.name} takes {len(g.inputs)} inputs, got {len(arrays)}",
                         hint="pass one array per graph input, in the order of its signature")
    bindings: dict = {}
    deferred = []
    for v, a in zip(g.inputs, arrays):
        t = v.type
        if a.ndim != t.rank:
            raise InputError(f"input %{v.name} expects rank {t.rank} ({t}), got shape {a.shape}",
                             hint=_SIZES_HINT)
        if a.dtype != t.dtype.numpy:
            torch_name = _TORCH_NAMES.get(t.dtype.value, t.dtype.value)
            raise InputError(f"input %{v.name} expects {t.dtype}, got {a.dtype}",
                             hint=f"convert it first (x.to(torch.{torch_name}) for a tensor, "
                                  f"a.astype(...) for an array)")
        for d, n in zip(t.shape, a.shape):
            if isinstance(d, int):
                if d != n:
                    raise InputError(f"input %{v.name} expects shape {t}, got {a.shape}",
                                     hint=_SIZES_HINT)
            elif isinstance(d, sympy.Symbol):
                if bindings.setdefault(d, n) != n:
                    raise InputError(f"dim {d} is {bindings[d]} elsewhere but {n} in %{v.name}",
                                     hint="inputs that share a symbolic dim must agree on its size")
            else:
                deferred.append((v, d, n))
    for v, d, n in deferred:
        if int(d.xreplace(bindings)) != n:
            raise InputError(f"input %{v.name}: dim {d} should be {d.xreplace(bindings)}, got {n}",
                             hint="this dim follows from the others' sizes (the model's export says how)")
    for name, (lo, hi) in g.symbols.items():
        val = bindings.get(symbol(name))
        if val is not None and (val < lo or (hi is not None and val > hi)):
            raise InputError(f"dim {name}={val} is outside the compiled range [{lo}, {hi}]",
                             hint="the range is the Dim's, narrowed to where torch's guards on the "
                                  "sizes hold (where the traced program is the model's); recompile "
                                  "with a wider Dim range, or an example of the sizes you call with")
    return bindings


def concrete_attrs(attrs: Attrs, bindings: Mapping) -> Attrs:
    """Evaluate symbolic attribute values (reshape targets, slice bounds) under the bindings."""
    if not any(_is_symbolic(v) for v in attrs.values()):
        return attrs
    return Attrs({k: _concrete(v, bindings) for k, v in attrs.items()})


def _is_symbolic(v) -> bool:
    if isinstance(v, sympy.Expr):
        return True
    return isinstance(v, tuple) and any(_is_symbolic(x) for x in v)


def _concrete(v, bindings):
    if isinstance(v, sympy.Expr):
        r = sympy.sympify(v.xreplace(bindings))  # a bare symbol is replaced by a Python int
        return int(r) if r.is_integer else float(r)
    if isinstance(v, tuple):
        return tuple(_concrete(x, bindings) for x in v)
    return v


def _compute_form(x: np.ndarray) -> np.ndarray:
    if x.dtype.kind == "V" or x.dtype == np.float16 or x.dtype.name in ("bfloat16",
                                                                       "float8_e4m3fn"):
        return x.astype(np.float32)
    return x


def evaluate_node(node: Node, inputs: Sequence[np.ndarray], bindings: Mapping | None = None,
                  run_graph=None) -> list[np.ndarray]:
    """Run one node on concrete inputs; outputs have exactly the node's declared dtypes and
    (concretized) shapes."""
    bindings = bindings or {}
    op = node.op
    attrs = concrete_attrs(node.attrs, bindings)
    if op.run_regions is not None:
        runner = run_graph or (lambda g, xs: run(g, xs, bindings=bindings))
        raw = op.run_regions(list(inputs), attrs, node.regions, runner)
    else:
        with np.errstate(all="ignore"):  # inf/NaN propagate as in torch, without warnings
            raw = op.reference(list(inputs) if op.stored_inputs else
                               [_compute_form(x) for x in inputs], attrs)
    if len(raw) != len(node.outputs):
        raise AssertionError(f"{op.name} reference returned {len(raw)} outputs, "
                             f"declared {len(node.outputs)}")
    outs = []
    for r, v in zip(raw, node.outputs):
        r = np.asarray(r)
        want = v.type.dtype.numpy
        if r.dtype != want:
            with np.errstate(all="ignore"):
                r = r.astype(want)
        shape = concrete_shape(v.type.shape, bindings)
        if r.shape != shape:
            raise AssertionError(f"%{v.name} = {op.name}: reference gave shape {r.shape}, "
                                 f"type says {shape}")
        outs.append(r)
    return outs


def run(g: Graph, inputs: Sequence, *, bindings: Mapping | None = None,
        hook: NodeHook | None = None) -> list[np.ndarray]:
    """Run ``g`` on numpy inputs. ``hook(node, outputs)`` sees every node's results (for
    bisection and tracing)."""
    arrays = [np.asarray(x) for x in inputs]
    if bindings is None:
        bindings = bind_symbols(g, arrays)
    env: dict[str, np.ndarray] = {}
    for v, a in zip(g.inputs, arrays):
        env[v.name] = a
    for c in g.constants:
        if c.payload is None:
            raise InputError(f"constant %{c.name} has no payload",
                             hint="parse(text, payloads=graph.payloads) binds constants by name")
        env[c.name] = c.payload

    def run_region(body: Graph, xs):
        return run(body, xs, bindings=bindings, hook=hook)

    for node in g.nodes:
        outs = evaluate_node(node, [env[v.name] for v in node.inputs], bindings, run_region)
        if hook is not None:
            hook(node, outs)
        for v, a in zip(node.outputs, outs):
            env[v.name] = a
    return [env[v.name] for v in g.outputs]


def evaluate_op(opname: str, inputs: Sequence[np.ndarray], **attrs) -> list[np.ndarray]:
    """Run one op on static numpy inputs (infers the output types first). Handy in tests and
    notebooks: ``evaluate_op("softmax", x, axis=-1)``."""
    from .graph import Value
    from .opset import get_op

    op = get_op(opname)
    arrays = [np.asarray(x) for x in inputs]
    types = [TensorType(a.shape, DType.from_numpy(a.dtype)) for a in arrays]
    full = Attrs(op.complete_attrs(attrs))
    outs = op.infer_types(types, full)
    node = Node(op, [Value(f"in{i}", t) for i, t in enumerate(types)], full,
                [Value(f"out{i}", t) for i, t in enumerate(outs)])
    return evaluate_node(node, arrays)

"""Numeric verification: a stage's graph, run by the reference interpreter, against PyTorch eager.

The oracle runs the user's model once per input set (the example inputs and fresh random inputs of
the same spec) and keeps the flattened outputs; every stage's graph is then checked against them.
When a stage fails, ``first_divergent`` compares the values of the stage's output graph with those
of its input graph by name (names are stable across stages) and names the first node that left.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
import torch.utils._pytree as pytree

from fexplore.ir import DType, Graph, run

from .convert import ir_dtype
from .ingest import tensor_payload
from .stage import NumericCheck


@dataclass(frozen=True)
class Tolerance:
    """``|got - want| <= atol * max(1, max|want|) + rtol * |want|`` elementwise: the absolute part
    scales with the output's magnitude, so logits of size 30 are held to the same relative
    standard as probabilities."""

    atol: float
    rtol: float

    def __str__(self) -> str:
        return f"atol {self.atol:g}, rtol {self.rtol:g}"


# By the dtype a graph computes in. f32 follows torch.testing's defaults; bf16's rtol is its
# epsilon (2^-7 rounded up), fp8 e4m3's a quarter (3 mantissa bits, errors compound).
TOLERANCES = {
    DType.f32: Tolerance(1e-5, 1.3e-6),
    DType.f16: Tolerance(1e-3, 1e-3),
    DType.bf16: Tolerance(1.6e-2, 1.6e-2),
    DType.fp8: Tolerance(1.25e-1, 1.25e-1),
}


def to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    if t.dtype in (torch.bfloat16, torch.float8_e4m3fn):
        return tensor_payload(t.contiguous()).copy()
    return t.cpu().numpy()


def to_torch(a: np.ndarray) -> torch.Tensor:
    dt = DType.from_numpy(a.dtype)
    if dt == DType.bf16:
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16).copy()).view(torch.bfloat16)
    if dt == DType.fp8:
        return torch.from_numpy(np.ascontiguousarray(a).view(np.uint8).copy()).view(
            torch.float8_e4m3fn)
    return torch.from_numpy(np.array(a, copy=True))


class Oracle:
    """Eager PyTorch outputs for the example inputs and ``random_sets`` fresh input sets."""

    def __init__(self, model: torch.nn.Module, example_args: tuple, *, random_sets: int = 1,
                 seed: int = 0):
        self.input_sets: list[list[np.ndarray]] = []
        self.expected: list[list[np.ndarray]] = []
        flat, spec = pytree.tree_flatten(example_args)
        rng = np.random.default_rng(seed)
        sets = [flat] + [[_like(x, rng) for x in flat] for _ in range(random_sets)]
        for leaves in sets:
            args = pytree.tree_unflatten(leaves, spec)
            with torch.no_grad():
                out = model(*args)
            self.input_sets.append([to_numpy(x) for x in leaves if isinstance(x, torch.Tensor)])
            self.expected.append([to_numpy(o) for o in pytree.tree_leaves(out)
                                  if isinstance(o, torch.Tensor)])


def _like(x, rng: np.random.Generator):
    """A fresh input of the same spec: floats with the example's spread, ints within the
    example's range (token ids stay valid), bools at random."""
    if not isinstance(x, torch.Tensor):
        return x
    if x.dtype == torch.bool:
        return torch.from_numpy(rng.random(tuple(x.shape)) < 0.5)
    if x.dtype.is_floating_point:
        std = float(x.float().std()) if x.numel() > 1 else 1.0
        mean = float(x.float().mean()) if x.numel() else 0.0
        a = rng.standard_normal(tuple(x.shape)) * (std or 1.0) + mean
        return torch.from_numpy(a.astype(np.float32)).to(x.dtype)
    lo, hi = (int(x.min()), int(x.max())) if x.numel() else (0, 1)
    return torch.from_numpy(rng.integers(lo, hi + 1, size=tuple(x.shape))).to(x.dtype)


def compute_dtype(g: Graph) -> DType:
    """The lowest-precision float a graph's results or contraction operands carry."""
    order = [DType.fp8, DType.bf16, DType.f16, DType.f32]
    seen = {v.type.dtype for n in g.walk() for v in list(n.outputs) + list(n.inputs)}
    for d in order:
        if d in seen:
            return d
    return DType.f32


def compare(got: Sequence[np.ndarray], want: Sequence[np.ndarray], tol: Tolerance):
    """(max_abs, max_rel, ok, detail) over all outputs."""
    if len(got) != len(want):
        return np.inf, np.inf, False, f"{len(got)} outputs, eager gives {len(want)}"
    max_abs = max_rel = 0.0
    ok, detail = True, None
    for i, (a, b) in enumerate(zip(got, want)):
        if a.shape != b.shape:
            return np.inf, np.inf, False, f"output {i}: shape {a.shape}, eager {b.shape}"
        if b.dtype.kind in "biu" or b.dtype == np.bool_:
            bad = int(np.count_nonzero(a != b))
            if bad:
                ok, detail = False, f"output {i}: {bad} of {b.size} integer values differ"
                max_abs = max(max_abs, float(np.max(np.abs(a.astype(np.int64) - b.astype(np.int64)))))
            continue
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        both = np.isfinite(a64) & np.isfinite(b64)
        if not np.array_equal(np.isfinite(a64), np.isfinite(b64)) or \
                not np.array_equal(a64[~both], b64[~both], equal_nan=True):
            ok, detail = False, f"output {i}: non-finite values differ from eager"
        diff = np.abs(a64 - b64)[both]
        if diff.size == 0:
            continue
        scale = max(1.0, float(np.max(np.abs(b64[both]))))
        mag = np.abs(b64[both])
        max_abs = max(max_abs, float(diff.max()))
        max_rel = max(max_rel, float(np.max(diff / np.maximum(mag, tol.atol))))
        limit = tol.atol * scale + tol.rtol * mag
        if np.any(diff > limit):
            worst = int(np.argmax(diff - limit))
            ok = False
            detail = detail or (f"output {i}: |diff| {diff[worst]:.3e} exceeds "
                                f"{limit[worst]:.3e} ({tol})")
    return max_abs, max_rel, ok, detail


def check_graph(g: Graph, oracle: Oracle, tol: Tolerance | None = None,
                before: Graph | None = None) -> NumericCheck:
    tol = tol or TOLERANCES[compute_dtype(g)]
    worst_abs = worst_rel = 0.0
    ok, detail = True, None
    for inputs, want in zip(oracle.input_sets, oracle.expected):
        got = run(g, inputs)
        a, r, good, d = compare(got, want, tol)
        worst_abs, worst_rel = max(worst_abs, a), max(worst_rel, r)
        if not good and ok:
            ok, detail = False, d
    divergent = None
    if not ok and before is not None:
        divergent = first_divergent(before, g, oracle.input_sets[0], tol)
    return NumericCheck(worst_abs, worst_rel, ok, len(oracle.input_sets), str(tol), divergent,
                        detail)


def first_divergent(before: Graph, after: Graph, inputs, tol: Tolerance) -> str | None:
    """The first node of ``after`` whose value differs from the same-named value of ``before``."""
    ref: dict[str, np.ndarray] = {}
    run(before, inputs, hook=lambda n, outs: ref.update(
        {v.name: o for v, o in zip(n.outputs, outs)}))
    found: list[str] = []

    def hook(node, outs):
        if found:
            return
        for v, o in zip(node.outputs, outs):
            if v.name in ref and ref[v.name].shape == o.shape and \
                    not compare([o], [ref[v.name]], tol)[2]:
                found.append(f"%{v.name} = {node.op.name}(...)"
                             + (f" at {node.loc}" if node.loc else ""))
                return

    run(after, inputs, hook=hook)
    return found[0] if found else None

"""Numeric verification: a stage's graph, run by the reference interpreter, against PyTorch eager.

The oracle runs the user's model once per input set (the example inputs and fresh random inputs of
the same spec) and keeps the flattened outputs; every stage's graph is then checked against them.
It also runs an f64 copy of the model on the same inputs: how far eager's f32 result is from the
f64 one is eager's own rounding noise, and a stage may differ from eager by a small multiple of it
(besides the dtype's fixed tolerance). A deep network's f32 rounding thus never fails a stage,
while a real bug, whose error dwarfs the noise, still does.
When a stage fails, ``first_divergent`` compares the values of the stage's output graph with those
of its input graph by name (names are stable across stages) and names the first node that left.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass
from typing import Sequence

import math

import numpy as np
import sympy
import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from fexplore.errors import ExportError

from fexplore.ir import DType, Graph, run

from .eager_modes import eager_only, eager_under, output_tensors, runs_higher_order_ops
from .ingest import tensor_payload
from .policy_noise import POLICY_DTYPES, policy_error
from .rerounding import rerounding_distance
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


# A stage may differ from eager f32 by this many times eager's own f32 error (its distance from
# the f64 run): the interpreter rounds in another order than torch's kernels, so its error is of
# the same size as eager's, not smaller; a wrong rewrite is off by orders of magnitude more.
NOISE_MULTIPLE = 8.0

# Eager's noise is at least this share of how far re-rounding every op by an ulp moves the
# output (``rerounding``): one ulp of random sign is ~3.5x the spread of round-to-nearest. It
# counts where eager's rounding happened to be exact but the output is sensitive to rounding.
REROUNDED_SHARE = 0.25

# A model that computes in f16 or bf16 by itself (its own casts and narrow weights) rounds at every
# such op; a compile rounds at the same ops, but not always the same way (it adds a linear's bias
# before rounding, where eager's CPU kernel rounds the product first), and a one-ulp difference
# early in a chain grows through what follows. Eager's distance from the model's exact arithmetic
# (every op in f64, only the model's own casts rounding: ``narrow_noise``) is what rounding along
# the chain does to an output; a compile as accurate as eager is within twice it of eager.
NARROW_MULTIPLE = 2.0

# A compile at a reduced precision may differ from eager f32 by this many times the error eager
# itself makes under the same cast policy (``policy_noise``): the compile rounds the same
# operands, so its error is of that size; rounding them coarser (fp8 for bf16) is 16x that.
POLICY_MULTIPLE = 4.0

# The f64 twin is a deep copy of the model: skipped above this many bytes of parameters.
F64_TWIN_LIMIT_BYTES = 1 << 30


def to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    if t.dtype in (torch.bfloat16, torch.float8_e4m3fn):
        return tensor_payload(t.contiguous()).copy()
    return t.cpu().numpy()


def to_torch(a: np.ndarray) -> torch.Tensor:
    dt = DType.from_numpy(a.dtype)
    # np.array(order="C"), not np.ascontiguousarray: that makes a 0-d array 1-d
    if dt == DType.bf16:
        return torch.from_numpy(np.array(a, order="C").view(np.int16)).view(torch.bfloat16)
    if dt == DType.fp8:
        return torch.from_numpy(np.array(a, order="C").view(np.uint8)).view(torch.float8_e4m3fn)
    return torch.from_numpy(np.array(a, copy=True))


class KeywordCall(torch.nn.Module):
    """``model`` called with keyword inputs given as a last positional dict: how the oracle's
    runs, which take one tuple of inputs, call a model compiled with ``example_kwargs``."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, *args):
        *args, kwargs = args
        return self.model(*args, **kwargs)


class AsPureFunction(torch.nn.Module):
    """A model that updates some of its inputs or buffers in place, as the pure function the
    compiled graph is, for the oracle: it runs on copies of the tensor inputs and returns, after
    the model's own outputs, the new values of the inputs it updated (``updated``: their indices
    among the tensor inputs, in the graph's order) and of the buffers it updated (``state``: their
    qualified names). The buffers' values come in as a last argument, a list, and are written
    into a copy of the model before it runs (in place: what else holds them, a cache object,
    sees them), so the user's model is untouched. The oracle's input sets stay what they were,
    and each set's expected outputs include the updates, so every stage is checked on them."""

    def __init__(self, model: torch.nn.Module, updated: list, state: list):
        super().__init__()
        self.model = copy.deepcopy(model) if state else model
        self.updated, self.state = list(updated), list(state)

    def forward(self, *args, **kwargs):
        if self.state:
            *args, values = args
        leaves, spec = pytree.tree_flatten((tuple(args), kwargs))
        leaves = [x.clone() if isinstance(x, torch.Tensor) else x for x in leaves]
        args, kwargs = pytree.tree_unflatten(leaves, spec)
        buffers = dict(self.model.named_buffers(remove_duplicate=False))
        with torch.no_grad():
            for name, value in zip(self.state, values if self.state else ()):
                buffers[name].copy_(value)
        out = self.model(*args, **kwargs)
        tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
        return out, [tensors[i] for i in self.updated], [buffers[name].clone() for name in self.state]


class Oracle:
    """Eager PyTorch outputs for the example inputs and ``random_sets`` fresh input sets, and for
    each output eager's own rounding noise (``noise``: max |eager - the f64 twin|, and at least
    ``REROUNDED_SHARE`` of how far re-rounding every op moves it (``rerounding``); 0 where the f64
    twin cannot be made; ``f64_note`` says why). For a model that computes in f16 or bf16 by
    itself, ``narrow_noise`` is per set and output max |eager - the model's exact arithmetic|
    (``_NoNarrowing``), the rounding along the chain (None for a model of no narrow floats, or
    where that run fails). A random set the model itself refuses
    (it raises: the set breaks an invariant of its inputs, such as a count of special tokens)
    is dropped, and ``dropped_sets`` says why.

    ``resized``: for a model compiled with symbolic dims, each tensor input's shape at another
    size in the compiled range (``shapes_at_another_size``); the first random set takes it, so
    every stage is checked at a size it was not traced at too."""

    def __init__(self, model: torch.nn.Module, example_args: tuple, *, random_sets: int = 1,
                 seed: int = 0, precision: str = "fp32", exact_narrow: bool = True,
                 resized: list | None = None):
        self.input_sets: list[list[np.ndarray]] = []
        self.expected: list[list[np.ndarray]] = []
        self.noise: list[list[float]] = []
        self.narrow_noise: list[list[float]] | None = None
        # Under a reduced-precision policy (``precision`` bf16 or fp8): per set and output, eager's
        # own error under that policy (``fexplore.pipeline.policy_noise``), and per output the
        # narrowest float the model computes it through by itself. None when fp32, or when the
        # model does not run under the policy (``policy_note`` says why): the fixed tolerance
        # of the policy's dtype then applies.
        self.precision = precision
        self.policy_noise: list[list[float]] | None = [] if precision in POLICY_DTYPES else None
        self.model_dtypes: list[DType] | None = None
        self.policy_note: str | None = None
        flat, spec = pytree.tree_flatten(example_args)
        rng = np.random.default_rng(seed)
        sets = [flat] + [[_like(x, rng) for x in flat] for _ in range(random_sets)]
        if resized is not None and random_sets:
            shapes = iter(resized)
            sets[1] = [_like(x, rng, next(shapes)) if isinstance(x, torch.Tensor) else x for x in flat]
        self.dropped_sets: list[str] = []
        twin, self.f64_note = _f64_twin(model)
        exact = None   # the all-f64 twin, made once a narrow op is seen
        chains, narrow_seen = [], False
        for i, leaves in enumerate(sets):
            args = pytree.tree_unflatten(leaves, spec)
            # the policy run gets its own copy of the inputs: a decode step appends to the cache
            # object it is given (and may write into its tensors), so a second run on the same
            # arguments would see one more position
            policy_leaves = [x.clone() if isinstance(x, torch.Tensor) else x for x in leaves] \
                if self.policy_noise is not None else None
            try:
                with torch.no_grad(), eager_only():
                    out = model(*args)
            except Exception as e:
                if i == 0:  # the user's own inputs: export ran them, so this is not expected
                    raise ExportError(f"the model raised on its example inputs: "
                                      f"{type(e).__name__}: {e}") from None
                self.dropped_sets.append(f"random input set {i}: the model raised "
                                         f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
                continue
            self.input_sets.append([to_numpy(x) for x in leaves if isinstance(x, torch.Tensor)])
            outs = output_tensors(out)
            self.expected.append([to_numpy(o) for o in outs])
            noise = [0.0] * len(outs)
            chain = None
            if twin is not None:
                seen = _ExactNarrowOps()
                noise, note = _f32_noise(twin, leaves, spec, outs, exact_narrow, seen)
                self.f64_note = self.f64_note or note
                moved = rerounding_distance(model, leaves, spec, outs, seed + i)
                if moved is not None:
                    noise = [max(n, REROUNDED_SHARE * m) for n, m in zip(noise, moved)]
                chain = noise   # no narrow op: the exact arithmetic is the twin's
                if seen.narrow and exact_narrow and note is None:
                    narrow_seen = True
                    exact = exact or _exact_twin(model)
                    chain = _narrow_noise(exact, leaves, spec, outs) if exact is not None else None
            chains.append(chain)
            self.noise.append(noise)
            if self.policy_noise is not None:
                self._measure_policy(model, pytree.tree_unflatten(policy_leaves, spec), outs)
        if narrow_seen and all(c is not None for c in chains):   # every set, or none
            self.narrow_noise = chains

    def _measure_policy(self, model, args, outs) -> None:
        try:
            errors, own = policy_error(model, args, outs, self.precision)
        except Exception as e:  # a model that breaks under the dispatch mode: fixed tolerance
            self.policy_noise, self.model_dtypes = None, None
            self.policy_note = (f"no {self.precision} reference: the model does not run under "
                                f"the policy ({type(e).__name__})")
            return
        self.policy_noise.append(errors)
        # per output, the narrowest over every set
        self.model_dtypes = own if self.model_dtypes is None else \
            [min(a, b, key=_NARROW_FIRST.index) for a, b in zip(self.model_dtypes, own)]


def shapes_at_another_size(g: Graph, example_shapes: list) -> list | None:
    """Each graph input's shape (``example_shapes``: theirs in the example) with every symbol one
    more than the example's size, one less at the top of its range: an odd step, where a floor
    in a length (x[1::3], a stride-2 window) turns, as in the guard ranges fuzzing found wrong.
    None for a static graph, when no symbol can move, or when an input dim is an expression of
    a symbol no dim shows bare."""
    if not g.symbols or len(example_shapes) != len(g.inputs):
        return None
    example = {}
    for v, shape in zip(g.inputs, example_shapes):
        for d, n in zip(v.type.shape, shape):
            if isinstance(d, sympy.Symbol):
                example[d] = int(n)
    moved = {}
    for sym, n in example.items():
        lo, hi = g.symbols.get(sym.name, (n, n))
        moved[sym] = n + 1 if (hi is None or n + 1 <= hi) else (n - 1 if n - 1 >= lo else n)
    if moved == example:
        return None
    out = []
    for v in g.inputs:
        shape = []
        for d in v.type.shape:
            size = sympy.sympify(sympy.sympify(d).xreplace(moved))
            if not size.is_Integer:
                return None
            shape.append(int(size))
        out.append(tuple(shape))
    return out


def _f64_twin(model: torch.nn.Module):
    """An f64 deep copy of the model (the user's model is not touched), or (None, why not). Only
    its f32 parameters and buffers widen: f16 and bf16 ones stay as the model has them, as its
    own casts in ``forward`` do, and ``_ExactNarrowOps`` computes their ops in f64 and rounds
    once. (Widened too, an f16 layer fed by a cast to f16 in ``forward`` would raise on its f64
    weight, and the model would get no f64 reference at all.)"""
    nbytes = sum(t.numel() * t.element_size() for t in
                 list(model.parameters()) + list(model.buffers()))
    if nbytes > F64_TWIN_LIMIT_BYTES:
        return None, f"no f64 reference: the model has {nbytes / 1e9:.1f} GB of parameters"
    if any(t.is_meta for t in model.parameters()):
        return None, "no f64 reference: the model is on the meta device"
    try:
        return copy.deepcopy(model)._apply(_widen_f32), None
    except Exception as e:  # a model that cannot be copied is still compiled, at the floor tolerance
        return None, f"no f64 reference: copying the model failed ({type(e).__name__})"


def _widen_f32(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float64) if t.dtype == torch.float32 else t


def _exact_twin(model: torch.nn.Module):
    """An all-f64 copy of the model (its f16 and bf16 weights too), for ``_NoNarrowing``; None
    when it cannot be made, or would pass the f64 twin's size limit (a bf16 model's copy is four
    times its size)."""
    numel = sum(t.numel() for t in list(model.parameters()) + list(model.buffers()))
    if 8 * numel > F64_TWIN_LIMIT_BYTES:
        return None
    try:
        return copy.deepcopy(model).to(torch.float64)
    except Exception:  # noqa: BLE001 - no exact reference: the round-once noise alone applies
        return None


_NARROW_FLOATS = (torch.float16, torch.bfloat16)


@runs_higher_order_ops
class _ExactNarrowOps(TorchDispatchMode):
    """The f64 twin's ops on the model's own f16/bf16 values (a cast inside ``forward`` stays a
    cast in the twin) computed in f64 and rounded once, to the dtype eager gives: eager's kernels
    round inside such an op too (CPU ``logsumexp`` of f16 sums its exponentials in f16), and that
    is eager's error, which the twin would otherwise share. Ops that write or return a view of
    their input run as they are; so do ops of no narrow float. ``narrow`` says whether any op
    had a narrow float."""

    narrow = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        narrow = [t for t in pytree.tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor) and t.dtype in _NARROW_FLOATS]
        self.narrow = self.narrow or bool(narrow)
        schema = func._schema
        if not narrow or schema.is_mutable or any(r.alias_info is not None for r in schema.returns):
            return out
        wide_args, wide_kwargs = pytree.tree_map(
            lambda t: t.to(torch.float64) if isinstance(t, torch.Tensor) and t.dtype in _NARROW_FLOATS
            else t, (args, kwargs))
        wide = func(*wide_args, **wide_kwargs)
        return pytree.tree_map(
            lambda o, w: w.to(o.dtype) if isinstance(o, torch.Tensor) and o.is_floating_point()
            and isinstance(w, torch.Tensor) and w.shape == o.shape else o, out, wide)


@runs_higher_order_ops
class _NoNarrowing(TorchDispatchMode):
    """The model's exact arithmetic, on the all-f64 twin: every op computes in f64, and what one
    gives in f16 or bf16 (a cast in ``forward``, a tensor made in a narrow dtype) is widened
    again. So the model's own casts still round, as they do in eager and in any compile (a cast
    has one right answer), and only the rounding of the ops in between, which implementations
    do each their own way, is gone. Ops that write or return a view of their input run as they
    are (no narrow value reaches them)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        schema = func._schema
        if schema.is_mutable or any(r.alias_info is not None for r in schema.returns):
            return out
        return pytree.tree_map(lambda t: t.to(torch.float64) if isinstance(t, torch.Tensor)
                               and t.dtype in _NARROW_FLOATS else t, out)


def _narrow_noise(exact, leaves, spec, outs) -> list[float] | None:
    """Per float output, max |eager - the model's exact arithmetic| (``_NoNarrowing``); None
    when the exact run fails or gives other outputs."""
    wide = [x.to(torch.float64) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
            for x in leaves]
    try:
        with torch.no_grad(), eager_under(_NoNarrowing()):
            out64 = exact(*pytree.tree_unflatten(wide, spec))
    except Exception:  # noqa: BLE001 - no exact reference: the round-once noise alone applies
        return None
    outs64 = output_tensors(out64)
    return _max_diffs(outs, outs64) if len(outs64) == len(outs) else None


def _max_diffs(outs, refs) -> list[float]:
    """Per output, max |out - ref| over the finite differences (0 for non-float outputs and
    shape mismatches)."""
    noise = []
    for a, b in zip(outs, refs):
        if not a.is_floating_point() or a.shape != b.shape or a.numel() == 0:
            noise.append(0.0)
            continue
        d = (a.double() - b.double()).abs()
        finite = torch.isfinite(d)
        noise.append(float(d[finite].max()) if bool(finite.any()) else 0.0)
    return noise


def _f32_noise(twin, leaves, spec, outs32, exact_narrow: bool = True, mode=None):
    """Per float output, max |eager - the f64 twin| (0 for other outputs): eager's own rounding,
    in its f32 ops and, with `exact_narrow`, inside its ops on the model's own f16/bf16 values
    (``_ExactNarrowOps``; ``mode``, when given, is the one used)."""
    leaves64 = [x.to(torch.float64) if isinstance(x, torch.Tensor) and x.dtype == torch.float32
                else x for x in leaves]
    try:
        mode = eager_under(mode or _ExactNarrowOps()) if exact_narrow else contextlib.nullcontext()
        with torch.no_grad(), mode:
            out64 = twin(*pytree.tree_unflatten(leaves64, spec))
    except Exception as e:  # models that insist on f32 somewhere inside: floor tolerance only
        return [0.0] * len(outs32), f"no f64 reference: the model does not run in f64 " \
                                    f"({type(e).__name__})"
    outs64 = output_tensors(out64)
    if len(outs64) != len(outs32):
        return [0.0] * len(outs32), "no f64 reference: the f64 run's outputs differ in number"
    return _max_diffs(outs32, outs64), None


def _like(x, rng: np.random.Generator, shape: tuple | None = None):
    """A fresh input of the same spec (of ``shape``, when given): floats with the example's
    spread, ints within the example's range (token ids stay valid), bools at random. A single
    float (a temperature, a scale) keeps its sign and size within a factor of two, as a model
    expects of it. An example sorted along its last axis gives a sorted one: searchsorted's and
    bucketize's boundaries must be, and torch's result on unsorted ones is unspecified."""
    if not isinstance(x, torch.Tensor):
        return x
    shape = tuple(x.shape) if shape is None else tuple(shape)
    if x.dtype == torch.bool:
        a = rng.random(shape) < 0.5
    elif x.dtype.is_floating_point and x.numel() == 1 and math.prod(shape) == 1:
        a = x.double().numpy() * rng.uniform(0.5, 1.5)
    elif x.dtype.is_floating_point:
        # the spread of the finite values: an example with -inf (a mask) would otherwise give
        # a spread of nan and a random input of nothing but NaN
        finite = x.float()[torch.isfinite(x.float())]
        std = float(finite.std()) if finite.numel() > 1 else 1.0
        mean = float(finite.mean()) if finite.numel() else 0.0
        a = rng.standard_normal(shape) * (std or 1.0) + mean
    else:
        lo, hi = (int(x.min()), int(x.max())) if x.numel() else (0, 1)
        a = rng.integers(lo, hi + 1, size=shape)
    if x.dtype != torch.bool and x.dim() and x.shape[-1] > 1 and bool((x[..., 1:] >= x[..., :-1]).all()):
        a = np.sort(a, axis=-1)
    # numpy gives scalars, not arrays, for shape (): torch.from_numpy takes only arrays
    return torch.from_numpy(np.asarray(a)).to(x.dtype)


_NARROW_FIRST = [DType.fp8, DType.bf16, DType.f16, DType.f32]


def compute_dtype(g: Graph) -> DType:
    """The lowest-precision float a graph's results or contraction operands carry, or its outputs
    (an output folded into a constant has no node)."""
    seen = {v.type.dtype for n in g.walk() for v in list(n.outputs) + list(n.inputs)} | \
        {v.type.dtype for v in g.outputs}
    for d in _NARROW_FIRST:
        if d in seen:
            return d
    return DType.f32


def output_dtypes(g: Graph) -> list[DType]:
    """Per output, the lowest-precision float it is computed through: its own dtype and that of
    every value read or written on its way (through fused regions output by output). A value no
    output depends on narrows nothing."""
    return [_NARROW_FIRST[r] for r in _output_ranks(g, {})]


def _rank(d: DType) -> int:
    return _NARROW_FIRST.index(d) if d in _NARROW_FIRST else len(_NARROW_FIRST) - 1


def _output_ranks(g: Graph, given: dict[str, int]) -> list[int]:
    low = dict(given)
    for n in g.nodes:   # in order: a node's inputs are ranked before it
        ins = [low.get(v.name, _rank(v.type.dtype)) for v in n.inputs]
        closed = [r for r in n.regions if len(r.inputs) == len(n.inputs) and len(r.outputs) == len(n.outputs)]
        if n.regions and len(closed) == len(n.regions):   # a fused region: its inputs are the node's
            per_region = [_output_ranks(r, {x.name: k for x, k in zip(r.inputs, ins)}) for r in closed]
            outs = [min(rs) for rs in zip(*per_region)]
        else:   # any other region (a cond's branches): every value inside reaches every output
            inside = [_rank(v.type.dtype) for r in n.regions for m in r.walk()
                      for v in list(m.inputs) + list(m.outputs)]
            outs = [min(ins + inside + [_rank(v.type.dtype) for v in n.outputs])] * len(n.outputs)
        for v, k in zip(n.outputs, outs):
            low[v.name] = min(k, _rank(v.type.dtype))
    return [min(low.get(v.name, _rank(v.type.dtype)), _rank(v.type.dtype)) for v in g.outputs]


def compare(got: Sequence[np.ndarray], want: Sequence[np.ndarray], tol: Tolerance | Sequence[Tolerance],
            noise: Sequence[float] | None = None, policy_noise: Sequence[float | None] | None = None,
            policy: str = "", narrow_noise: Sequence[float] | None = None):
    """(max_abs, max_rel, ok, detail) over all outputs. ``tol``: one for all, or one per output.
    ``noise[i]`` is eager's own f32 error on output i; ``NOISE_MULTIPLE`` times it is allowed on
    top of the tolerance. ``policy_noise[i]`` is eager's error under the reduced-precision
    ``policy`` (None: output i is not narrowed by it); ``POLICY_MULTIPLE`` times it is allowed
    too. ``narrow_noise[i]`` is eager's distance from the model's exact arithmetic, for a model
    that computes in f16/bf16 by itself; ``NARROW_MULTIPLE`` times it is allowed too."""
    tols = [tol] * len(want) if isinstance(tol, Tolerance) else list(tol)
    if len(got) != len(want):
        return np.inf, np.inf, False, f"{len(got)} outputs, eager gives {len(want)}"
    max_abs = max_rel = 0.0
    ok, detail = True, None
    for i, (a, b, tol) in enumerate(zip(got, want, tols)):
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
        diff = np.abs(a64[both] - b64[both])   # inf - inf is not a difference to measure
        if diff.size == 0:
            continue
        scale = max(1.0, float(np.max(np.abs(b64[both]))))
        mag = np.abs(b64[both])
        max_abs = max(max_abs, float(diff.max()))
        max_rel = max(max_rel, float(np.max(diff / np.maximum(mag, tol.atol))))
        slack = NOISE_MULTIPLE * noise[i] if noise else 0.0
        narrowed = POLICY_MULTIPLE * (policy_noise[i] or 0.0) if policy_noise else 0.0
        chain = NARROW_MULTIPLE * narrow_noise[i] if narrow_noise else 0.0
        limit = tol.atol * scale + tol.rtol * mag + slack + narrowed + chain
        if np.any(diff > limit):
            worst = int(np.argmax(diff - limit))
            ok = False
            extra = f" + {NOISE_MULTIPLE:g}x eager's f32 noise {noise[i]:.1e}" if slack else ""
            if policy_noise is not None and policy_noise[i] is not None:
                extra += f" + {POLICY_MULTIPLE:g}x eager's {policy} error {policy_noise[i]:.1e}"
            if chain:
                extra += f" + {NARROW_MULTIPLE:g}x eager's f16/bf16 rounding {narrow_noise[i]:.1e}"
            detail = detail or (f"output {i}: |diff| {diff[worst]:.3e} exceeds "
                                f"{limit[worst]:.3e} ({tol}{extra})")
    return max_abs, max_rel, ok, detail


def check_graph(g: Graph, oracle: Oracle, tol: Tolerance | None = None,
                before: Graph | None = None) -> NumericCheck:
    tols = [tol] * len(g.outputs) if tol else tolerances_of(g, oracle)
    worst_abs = worst_rel = 0.0
    ok, detail = True, None
    for k, (inputs, want, noise) in enumerate(zip(oracle.input_sets, oracle.expected, oracle.noise)):
        try:
            got = accept_tie_order(g, inputs, run(g, inputs), want)
        except MemoryError:   # no verdict: the compile says the check could not run
            raise
        except Exception as e:  # noqa: BLE001 - a graph that does not run is a failed check, not a crash
            if ok:
                ok, detail = False, (f"the graph does not run on input set {k}: {type(e).__name__}: "
                                     f"{str(e).splitlines()[0] if str(e) else ''}")
            continue
        a, r, good, d = compare(got, want, tols, noise, policy_noise_of(oracle, k, g),
                                getattr(oracle, "precision", ""), narrow_noise_of(oracle, k))
        worst_abs, worst_rel = max(worst_abs, a), max(worst_rel, r)
        if not good and ok:
            ok, detail = False, d
    divergent = None
    if not ok and before is not None:
        try:
            divergent = first_divergent(before, g, oracle.input_sets[0], tol or tolerance_of(g, oracle))
        except Exception:  # noqa: BLE001 - the failure is reported; the bisection could not run
            divergent = None
    worst_noise = max((n for ns in oracle.noise for n in ns), default=0.0)
    described = _described(tols) or str(tolerance_of(g, oracle))
    if worst_noise:
        described += f" + {NOISE_MULTIPLE:g}x eager's f32 noise (up to {worst_noise:.1e})"
    if policy_noise_of(oracle, 0, g) is not None:
        worst_policy = max((n for ns in oracle.policy_noise for n in ns), default=0.0)
        described += (f" + {POLICY_MULTIPLE:g}x eager's {oracle.precision} error "
                      f"(up to {worst_policy:.1e})")
    chains = getattr(oracle, "narrow_noise", None)
    if chains:
        described += (f" + {NARROW_MULTIPLE:g}x eager's f16/bf16 rounding "
                      f"(up to {max((n for ns in chains for n in ns), default=0.0):.1e})")
    if getattr(oracle, "reference_note", None):   # the ONNX door's reference, when not ONNX Runtime
        described += f"; {oracle.reference_note}"
    return NumericCheck(worst_abs, worst_rel, ok, len(oracle.input_sets), described, divergent,
                        detail, worst_noise)


def _described(tols: list[Tolerance]) -> str:
    """One tolerance as it reads; several as which outputs each holds ("outputs 0, 2: ...")."""
    by: dict[str, list[int]] = {}
    for i, t in enumerate(tols):
        by.setdefault(str(t), []).append(i)
    if len(by) <= 1:
        return next(iter(by), "")
    return "; ".join(f"output{'s' if len(ix) > 1 else ''} {', '.join(map(str, ix))}: {t}"
                     for t, ix in by.items())


def tolerances_of(g: Graph, oracle) -> list[Tolerance]:
    """Per output, the fixed tolerance ``g`` is held to against the oracle: that of the narrowest
    float the output is computed through; for an output the policy narrowed (under a policy
    whose error the oracle measured), that of the narrowest float the model computes it through
    by itself (the policy's casts are allowed their measured error instead, ``POLICY_MULTIPLE``
    x ``policy_noise``). An ONNX oracle measures no policy."""
    dtypes = output_dtypes(g)
    narrowed = narrowed_outputs(g, oracle)
    if narrowed is None:
        return [TOLERANCES[d] for d in dtypes]
    return [TOLERANCES[own if n else d] for d, own, n in zip(dtypes, oracle.model_dtypes, narrowed)]


def tolerance_of(g: Graph, oracle) -> Tolerance:
    """The loosest of ``tolerances_of``: for values inside ``g``, which no one output owns."""
    return max(tolerances_of(g, oracle), key=lambda t: (t.atol, t.rtol),
               default=TOLERANCES[compute_dtype(g)])


def narrowed_outputs(g: Graph, oracle) -> list[bool] | None:
    """Per output, whether ``g`` computes it through a narrower float than the model does by
    itself, which only the precision stage's casts make: the graphs of the stages before it are
    held to the model's own tolerance, with no allowance for the policy. None: the oracle
    measured no policy (or ``g``'s outputs are not the model's, one for one)."""
    own = getattr(oracle, "model_dtypes", None)
    if getattr(oracle, "policy_noise", None) is None or own is None or len(own) != len(g.outputs):
        return None
    return [_NARROW_FIRST.index(d) < _NARROW_FIRST.index(m) for d, m in zip(output_dtypes(g), own)]


def policy_noise_of(oracle, k: int, g: Graph) -> list[float | None] | None:
    """Eager's error under the compile's reduced-precision policy on input set ``k``, per output
    (None for an output the policy moves neither in ``g`` nor in eager; None in all: no policy,
    not measured, or ``g`` narrows nothing).

    Once ``g`` carries the policy (`carries_policy`), an output it does not narrow by dtype
    is allowed its measured error too: one the model rounds to bf16 by itself at the end shows
    no narrower dtype, yet the policy's operands upstream move it (fuzz seed 1530844: a layer
    norm over two near-equal values, then the model's own cast). An output the policy does not
    reach measured no error, and is allowed none."""
    noise = getattr(oracle, "policy_noise", None)
    if not noise:
        return None
    narrowed = narrowed_outputs(g, oracle)
    if not narrowed or not (any(narrowed) or carries_policy(g)):
        return None
    return [e if n or e else None for e, n in zip(noise[k], narrowed)]


def carries_policy(g: Graph) -> bool:
    """Whether ``g`` has the precision stage's narrowed contractions: operands narrower than the
    result they accumulate into (``out_dtype``, which only that stage sets). The graphs of the
    stages before it compute as the model does."""
    for n in g.walk():
        out = n.attrs["out_dtype"] if "out_dtype" in n.attrs else None
        floats = [v.type.dtype for v in n.inputs if v.type.dtype in _NARROW_FIRST]
        if out in _NARROW_FIRST and any(_NARROW_FIRST.index(d) < _NARROW_FIRST.index(out) for d in floats):
            return True
    return False


def compare_with_oracle(g: Graph, oracle, k: int, got: Sequence[np.ndarray]):
    """``compare`` of outputs ``got`` of (a lowering or schedule of) ``g`` with eager's on input
    set ``k``, at the oracle's tolerance for ``g``."""
    return compare(got, oracle.expected[k], tolerances_of(g, oracle), oracle.noise[k],
                   policy_noise_of(oracle, k, g), getattr(oracle, "precision", ""),
                   narrow_noise_of(oracle, k))


def narrow_noise_of(oracle, k: int) -> list[float] | None:
    """Eager's distance from the model's exact arithmetic on input set ``k``, per output, for a
    model that computes in f16/bf16 by itself; None otherwise (and for oracles that do not
    measure it, such as the ONNX door's)."""
    chains = getattr(oracle, "narrow_noise", None)
    return chains[k] if chains else None


# Ops whose index result torch leaves unspecified among equal values: its sort is unstable by
# default and topk picks among ties as its selection algorithm happens to, so eager's indices of
# equal values are one valid answer among several.
_TIE_ORDER_OPS = ("sort", "topk")


def accept_tie_order(g: Graph, inputs, got: list, want: list) -> list:
    """``got`` with each sort/topk index output that picks the same values as eager's (ties in
    another order) replaced by eager's, so that comparing checks what torch promises: the
    values, and indices that point at them. Indices that pick other values stay as they are."""
    producers = {n.outputs[1].name: n for n in g.nodes
                 if n.op.name in _TIE_ORDER_OPS and len(n.outputs) == 2}
    slots = [i for i, v in enumerate(g.outputs) if v.name in producers and i < len(want)]
    if not slots:
        return got
    env = {v.name: np.asarray(a) for v, a in zip(g.inputs, inputs)}
    env.update({c.name: c.payload for c in g.constants})
    needed = {producers[g.outputs[i].name].inputs[0].name for i in slots} - set(env)
    if needed:
        run(g, inputs, hook=lambda n, outs: env.update(
            {v.name: o for v, o in zip(n.outputs, outs) if v.name in needed}))
    out = list(got)
    for i in slots:
        node = producers[g.outputs[i].name]
        if _same_picks(env[node.inputs[0].name], got[i], want[i], node.attrs["axis"]):
            out[i] = want[i]
    return out


def _same_picks(x: np.ndarray, a: np.ndarray, b: np.ndarray, axis: int) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype or x.ndim == 0:
        return False
    n = x.shape[axis]
    if a.size and (a.min() < 0 or a.max() >= n or b.min() < 0 or b.max() >= n):
        return False
    va = np.take_along_axis(x, a.astype(np.int64), axis).astype(np.float64)
    vb = np.take_along_axis(x, b.astype(np.int64), axis).astype(np.float64)
    return bool(np.array_equal(va, vb, equal_nan=True))


# torch's ops that give memory with no values yet (filled by copies after them): what they hold
# differs run to run; ingest fills it with zeros, and so does the replay of the exported program
_UNINITIALIZED = ("aten.empty.", "aten.empty_like.", "aten.empty_strided.", "aten.empty_permuted.",
                  "aten.new_empty.", "aten.new_empty_strided.")


def first_divergent_from_export(ingested, inputs, tol: Tolerance) -> str | None:
    """The first op of the ingested graph whose value differs from what the same node of the
    exported program computes in torch (the graph ingest read), on the model's `inputs` (a flat
    list, as the program takes them): which op of the model a wrong ingest comes from (a custom
    op's reference, a converter). None if every op agrees, or the program cannot run."""
    from torch.export.graph_signature import InputKind

    from fexplore.ir import Value

    ep = ingested.exported
    ours: dict[str, tuple] = {}
    flat = list(inputs)
    tensors = [to_numpy(x) for x in flat if isinstance(x, torch.Tensor)]
    run(ingested.graph, tensors, hook=lambda n, outs: ours.update({v.name: (n, o) for v, o in zip(n.outputs, outs)}))
    state = ingested.state   # the buffers the model updates: the last inputs
    values = dict(zip(state, flat[len(flat) - len(state):])) if state else {}
    args, user = [], iter(flat)
    for spec in ep.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            args.append(next(user))
        elif spec.target in values:
            args.append(values[spec.target])
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            t = ep.state_dict.get(spec.target)
            args.append(t if t is not None else ep.constants[spec.target])
        else:
            return None
    found: list[str] = []

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            if n.op == "call_function" and str(n.target).startswith(_UNINITIALIZED):
                out = out.zero_()   # as ingest fills it: what is read unwritten then agrees
            made = ingested.values_of.get(n.name) if not found and n.op == "call_function" else None
            if made is not None:
                pairs = zip(made, out) if isinstance(made, tuple) and isinstance(out, (tuple, list)) \
                    else [(made, out)]
                for v, t in pairs:
                    if isinstance(v, Value) and isinstance(t, torch.Tensor) and v.name in ours:
                        node, o = ours[v.name]
                        want = to_numpy(t)
                        if o.shape == want.shape and not compare([o], [want], tol)[2]:
                            ties = node.op.name in ("topk", "sort") and v is node.outputs[-1]
                            found.append(_divergence(node, v, f"torch's {n.target}")
                                         + (" (its values agree, its indices do not: among equal values "
                                            "torch's CPU kernel picks in an order of its own, fexplore the "
                                            "first index)" if ties else ""))
                            break
            return out

    try:
        with torch.no_grad():
            Recorder(ep.graph_module).run(*args)
    except Exception:  # noqa: BLE001 - a program torch cannot rerun is located no further
        pass
    return found[0] if found else None


def _divergence(node, v, origin: str | None = None) -> str:
    """How a first divergent value is named: `%v = op(...)`, where it came from, its source line."""
    return (f"%{v.name} = {node.op.name}(...)" + (f", from {origin}" if origin else "")
            + (f" at {node.loc}" if node.loc else ""))


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
                found.append(_divergence(node, v))
                return

    run(after, inputs, hook=hook)
    return found[0] if found else None

"""The kernel language as its authors write it: ``fl.load``, ``fl.contract``, ``fl.exp``, ``fl.range``...

Thin on purpose: each builtin parses its arguments and hands them to the semantic layer
(`semantics.py`), which checks and records. The vector ops are generated from the NPU's vector-op
table, so the language has exactly the ops the vector unit has, with the unit's own meaning.
"""

from __future__ import annotations

import builtins as _py
import itertools

from fexplore.lang import compute, semantics
from fexplore.lang.errors import TraceError
from fexplore.lang.tracer import current
from fexplore.lang.types import ACC, SRAM, f32
from fexplore.npu.vector_ops import VECTOR_OPS

# ---- DRAM and DMA ---------------------------------------------------------------------------------


def output(spec, dtype=None, *, axes=None, name=None, init=None):
    """Declare an output tensor in DRAM: ``C = fl.output(fl.bf16["M", "N"])`` (axis names resolve to
    the sizes the arguments bound) or ``fl.output((M, N), fl.bf16, axes="M N")``. Return it.

    ``init=X``, a parameter of the same shape and dtype: the output starts as a copy of X (a cache
    whose new rows the kernel then scatters in). The copy is DMA, block by block over the PEs; a
    caller that gives the output X's own bytes (a whole program where X is read by nothing after
    this kernel) has nothing to copy, and the kernel updates X in place."""
    return semantics.output(spec, dtype, axes=axes, name=name, init=init)


def scratch(spec, dtype=None, *, axes=None, name=None):
    """A DRAM tensor for intermediates (not returned); like `output`."""
    return semantics.output(spec, dtype, axes=axes, name=name, kind="scratch")


def load(src, *, into=None):
    """DMA a DRAM box into SRAM; returns the tile (or fills `into`, an existing SRAM tile)."""
    return semantics.load(src, into=into)


def store(dst, src):
    """DMA a tile into a DRAM box of the same shape and dtype; returns a handle with ``.wait()``."""
    return semantics.store(dst, src)


def gather(table, idx, *, axis=0, mode: str = "rows"):
    """DMA gather: the rows of DRAM box `table` picked by the values of `idx` (an integer SRAM tile),
    ``np.take(table, idx, axis)``: the tile has the box's shape with `axis` replaced by ``idx.shape``.
    ``mode="elements"``: ``np.take_along_axis`` (torch.gather), one element per index position.
    A tuple of index tiles of one shape picks along consecutive axes from `axis` together
    (``table[:, i, j]`` with ``axis=1``). Index values in [-n, n) are valid (negative from the end);
    others fail when the kernel runs (FK140)."""
    return semantics.gather(table, idx, axis=axis, mode=mode)


def scatter(dst, idx, src, *, axis=0, reduce=None, mode: str = "rows"):
    """DMA scatter: the rows of tile `src` into DRAM box `dst` at the rows `idx` picks (the inverse of
    `gather`). ``reduce="add"`` accumulates, ``"max"``/``"min"`` keep the larger/smaller value,
    ``"mul"`` multiplies (the DMA engine's read-modify-write); ``None`` overwrites, and of duplicate
    indices the last one wins. Returns a handle with ``.wait()``, like `store`."""
    return semantics.scatter(dst, idx, src, axis=axis, reduce=reduce, mode=mode)


def transpose(x, perm):
    """`x` with its axes permuted (``np.transpose(x, perm)``; axes by index or name), on the PE's
    transpose engine. A new SRAM tile."""
    return semantics.transpose(x, perm)


def wait(handle) -> None:
    """Everything issued after this on the PE starts once the DMA (`handle`, or the last load into
    a tile) is done. Dependencies are inferred anyway: a wait orders, it never changes results."""
    semantics.wait(handle)


# ---- tensor unit ----------------------------------------------------------------------------------


def contract(spec: str, a, b, *, acc=None):
    """``einsum(spec, a, b)`` on the tensor unit, f32 accumulation. ``acc=None`` makes a fresh
    accumulator tile (space ACC); ``acc=tile`` adds onto it in place and returns it."""
    return compute.contract(spec, a, b, acc=acc)


# ---- tiles ----------------------------------------------------------------------------------------


def zeros(shape, dtype=f32, *, axes=None, space=SRAM):
    return semantics.fill(shape, 0.0, dtype, axes, space, what="zeros")


def full(shape, value, dtype=f32, *, axes=None, space=SRAM):
    return semantics.fill(shape, value, dtype, axes, space, what="full")


def empty(shape, dtype=f32, *, axes=None, space=SRAM):
    """An uninitialized tile (write it with ``fl.load(..., into=t)`` or an ``out=`` before reading)."""
    return semantics.empty(shape, dtype, axes, space)


def broadcast_to(x, shape, *, axes=None):
    return compute.broadcast_to(x, shape, axes)


def cast(x, dtype):
    """`x` converted to `dtype` on the vector unit (``x.astype(dtype)``; no-op if it already is)."""
    return compute.cast(x, dtype)


def where(mask, a, b, *, dtype=None, out=None):
    return compute.vector("where", (mask, a, b), dtype=dtype, out=out)


def copy(x, *, out=None):
    return compute.vector("copy", (x,), out=out)


def _elementwise(name: str):
    def op(*operands, dtype=None, out=None):
        return compute.vector(name, operands, dtype=dtype, out=out)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = (f"``{name}`` on the vector unit ({VECTOR_OPS[name].arity} operand(s): tiles or numbers, "
                  f"broadcasting). Computes in f32; the result is f32 unless `dtype=` (or `out=`) says "
                  f"otherwise" + (" (comparisons give bool masks)." if VECTOR_OPS[name].kind == "compare"
                                  else "."))
    return op


def _reduction(name: str):
    def op(x, axis=-1, *, keepdims: bool = True, dtype=None, out=None):
        return compute.vector(name, (x,), dtype=dtype, out=out, axis=axis, keepdims=keepdims)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = (f"``{name}`` over one axis (a name like ``'N'`` or an int) on the vector unit; keeps the "
                  f"axis with size 1 by default, so the result broadcasts back.")
    return op


_SPECIAL = {"fill", "copy", "cast", "where"}
ELEMENTWISE = {name: _elementwise(name) for name, d in VECTOR_OPS.items()
               if d.kind in ("elementwise", "compare") and name not in _SPECIAL}
REDUCTIONS = {name: _reduction(name) for name, d in VECTOR_OPS.items() if d.kind == "reduction"}


# ---- loops --------------------------------------------------------------------------------------


def tiles(n: int | slice, size: int) -> list[slice]:
    """Slices that tile ``[0, n)`` in steps of `size` (the last one may be shorter). Given a slice
    (``fl.tiles(ps, 128)``: the column tiles of a panel `ps` a loop is already over), tile that span."""
    span = n if isinstance(n, slice) else slice(0, n)
    start, stop = span.start or 0, span.stop
    if not (span.step in (None, 1) and all(isinstance(v, int) and not isinstance(v, bool) for v in (start, stop, size))
            and 0 <= start < stop and size > 0):
        tr = current("tiles")
        raise TraceError("fl.tiles: bad extent or tile size",
                         expected="fl.tiles(n, size) with two positive ints, or fl.tiles(span, size) with a "
                                  "step-1 slice of ints", given=f"n={n!r}, size={size!r}", loc=tr.where()[0])
    return [slice(i, min(i + size, stop)) for i in _py.range(start, stop, size)]


def range(*args, stages: int = 1):  # noqa: A001 - fl.range, like tl.range / T.Pipelined
    """A loop with trace-time bounds: ``fl.range(stop)``, ``fl.range(start, stop[, step])`` or
    ``fl.range(iterable)`` (e.g. ``fl.tiles(K, 128)``). ``stages=2`` declares double buffering:
    consecutive iterations use different SRAM buffers for the tiles made in the loop, so the DMA of
    iteration i+1 overlaps the compute of iteration i."""
    tr = current("range")
    loc, site = tr.where()
    items = _items(args, "fl.range", loc)
    _check_stages(stages, "fl.range", loc)
    return _loop(tr, tr.loop_frame(site, stages, parallel=False), items)


def parallel(*iterables, stages: int = 1):
    """Spread iterations over the PEs, round-robin: ``for ms, ns in fl.parallel(fl.tiles(M, 128),
    fl.tiles(N, 128))`` (several iterables: their product; an int n means range(n)). Tiles made in an
    iteration live on its PE. ``stages=2``: consecutive iterations on a PE use different buffers."""
    tr = current("parallel")
    loc, site = tr.where()
    if any(f.parallel for f in tr.loops):
        raise TraceError("fl.parallel inside fl.parallel", expected="one fl.parallel loop level "
                         "(pass several iterables to it for a multi-dimensional grid)",
                         given="a nested fl.parallel", loc=loc,
                         hint="fl.parallel(fl.tiles(M, tm), fl.tiles(N, tn)) loops over both")
    if not iterables:
        raise TraceError("fl.parallel needs at least one iterable", given="fl.parallel()", loc=loc)
    lists = [_items((it,), "fl.parallel", loc) for it in iterables]
    items = lists[0] if len(lists) == 1 else list(itertools.product(*lists))
    _check_stages(stages, "fl.parallel", loc)
    return _loop(tr, tr.loop_frame(site, stages, parallel=True), items)


def _loop(tr, frame, items):
    tr.loops.append(frame)
    try:
        for i, item in enumerate(items):
            tr.begin_iteration(frame, i)
            yield item
    finally:
        tr.loops.remove(frame)
        if frame.parallel:
            tr.pe = 0


def _items(args, what: str, loc) -> list:
    if len(args) == 1 and not isinstance(args[0], int):
        try:
            return list(args[0])
        except TypeError:
            pass
    if args and all(isinstance(a, int) and not isinstance(a, bool) for a in args) and len(args) <= 3:
        return list(_py.range(*args))
    raise TraceError(f"{what}: loop bounds must be known at trace time",
                     expected="ints (start, stop, step) or an iterable, e.g. fl.tiles(K, 128)",
                     given=", ".join(repr(a) for a in args) or "nothing", loc=loc,
                     hint="a bound computed from a tile's value is data-dependent: use shapes instead")


def _check_stages(stages, what: str, loc) -> None:
    if not (isinstance(stages, int) and not isinstance(stages, bool) and 1 <= stages <= 8):
        raise TraceError(f"{what}: stages must be an int from 1 to 8",
                         expected="stages=1 (serial) or 2 (double buffering), ...", given=f"stages={stages!r}",
                         loc=loc)


# ---- the chip -------------------------------------------------------------------------------------


def target():
    """The NPUConfig the kernel is being traced for (choose tile sizes from it)."""
    return current("target").target


def num_pes() -> int:
    return current("num_pes").target.num_pes


def pe() -> int:
    """The PE the code at this point runs on (inside fl.parallel: the iteration's PE)."""
    return current("pe").pe


__all__ = ["ACC", "SRAM", "broadcast_to", "cast", "contract", "copy", "empty", "full", "gather", "load", "num_pes",
           "output", "parallel", "pe", "range", "scatter", "scratch", "store", "target", "tiles", "transpose",
           "wait", "where",
           "zeros", *ELEMENTWISE, *REDUCTIONS]

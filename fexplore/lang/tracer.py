"""The trace in progress: which kernel is being traced, on which PE, inside which loops, and where in
the author's code each builtin was called from.

A `Tracer` is pushed for the duration of one trace (``with Tracer(...)``) and popped after, so no
state survives between traces or notebook cells. Builtins find it with `current()`.

Source positions. Each op records the author's line: the innermost frame outside fexplore's own
kernel-language code (the shipped example kernels count as author code). Each tile also records
its allocation *site*: the chain of (code, instruction) positions from that frame up to the kernel
function. Tiles made by the same call in different loop iterations share a site, and the SRAM
plan gives them the same buffers, as a hand-written kernel would.
"""

from __future__ import annotations

import ast
import functools
import linecache
import os
import re
import sys

from fexplore.errors import SourceLoc
from fexplore.lang.errors import TraceError, TraceLimitError
from fexplore.lang.ir import KernelTrace, Op
from fexplore.lang.types import DType
from fexplore.lang.values import Tile

_LANG_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_EXAMPLES_DIR = os.path.join(_LANG_DIR, "examples") + os.sep
_STACK: list["Tracer"] = []
# The most ops one kernel's trace may record. Each op is a Python object (about a kilobyte with its
# tiles), so this bounds a trace at a few gigabytes; real models' kernels at their default tiles
# trace far fewer (the largest of a 4-layer, 1024-wide CHMv2 on tiny: 349k ops).
MAX_TRACE_OPS = 4_000_000

_ASSIGNED = re.compile(r"^\s*([A-Za-z_]\w*)\s*(?::[^=]*)?=(?!=)\s*")
_internal_cache: dict[str, bool] = {}
_positions_cache: dict = {}


def _internal(filename: str) -> bool:
    hit = _internal_cache.get(filename)
    if hit is None:
        hit = _internal_cache[filename] = filename.startswith(_LANG_DIR) and \
            not filename.startswith(_EXAMPLES_DIR)
    return hit


def _assigned_name(code, lasti: int) -> str | None:
    """Whether the instruction at `lasti` computes exactly the right-hand side of a one-line
    assignment ``name = <rhs>`` (its source span is the rhs's), and if so the name."""
    positions = _positions_cache.get(code)
    if positions is None:
        positions = _positions_cache[code] = list(code.co_positions())
    line, end_line, col, end_col = positions[lasti // 2]
    if line is None or line != end_line or col is None:
        return None
    span = _rhs_span(linecache.getline(code.co_filename, line))
    if span is None:
        return None
    name, start, end = span
    return name if col == start and (end is None or end_col == end) else None


@functools.lru_cache(maxsize=8192)   # a kernel's lines recur in every kernel generated alike
def _rhs_span(text: str) -> tuple[str, int, int | None] | None:
    """(name, start column, end column) of the right-hand side of the one-line assignment `text`
    (end None: a statement over several lines, whose start column is trusted), or None."""
    m = _ASSIGNED.match(text)
    if not m:
        return None
    indent = len(text) - len(text.lstrip())
    try:
        stmt = ast.parse(text.strip()).body[0]
    except (SyntaxError, IndexError):   # a statement over several lines: trust the start column
        return m.group(1), m.end(), None
    if not isinstance(stmt, (ast.Assign, ast.AnnAssign)) or stmt.value is None:
        return None
    rhs = stmt.value
    return m.group(1), rhs.col_offset + indent, rhs.end_col_offset + indent


def current(what: str) -> "Tracer":
    """The active tracer, or FK170 naming the builtin that was called outside a kernel."""
    if not _STACK:
        raise TraceError(f"fl.{what} was called outside a kernel",
                         expected="a call inside a function decorated with @fl.kernel (or defined in a "
                                  "%%furiosa_kernel cell), while it runs",
                         given=f"fl.{what} called directly", loc=user_loc(),
                         hint="kernel builtins only mean something while a kernel is traced: call the "
                              "kernel, e.g. k(a, b) or k.simulate(a, b)")
    return _STACK[-1]


def user_loc(depth: int = 1) -> SourceLoc | None:
    """The innermost frame outside the kernel language's own code."""
    f = sys._getframe(depth)
    while f is not None and _internal(f.f_code.co_filename):
        f = f.f_back
    return SourceLoc(f.f_code.co_filename, f.f_lineno) if f is not None else None


class LoopFrame:
    """One enclosing `fl.range` / `fl.parallel` loop: its site, stages, and the iteration now running
    (per PE, counted across re-entries, so buffers keep rotating from one entry to the next)."""

    __slots__ = ("site", "stages", "parallel", "iteration")

    def __init__(self, site, stages: int, parallel: bool):
        self.site, self.stages, self.parallel = site, stages, parallel
        self.iteration = -1


class Tracer:
    def __init__(self, trace: KernelTrace, fn_code, interpreter=None):
        self.trace = trace
        self.target = trace.target
        self.fn_code = fn_code
        self.interp = interpreter         # the numpy interpreter, when running eagerly
        self.pe = 0
        self.loops: list[LoopFrame] = []
        self.counters: dict[tuple, int] = {}
        self.coverage: dict[str, object] = {}   # output/scratch name -> bool mask of stored elements
        self._names: dict[tuple, str | None] = {}

    def __enter__(self) -> "Tracer":
        _STACK.append(self)
        return self

    def __exit__(self, *exc) -> None:
        popped = _STACK.pop()
        assert popped is self

    # ---- where in the author's code -----------------------------------------------------------
    def where(self) -> tuple[SourceLoc | None, tuple]:
        """(the author's location, the allocation site) of the builtin being executed."""
        f = sys._getframe(1)
        site = []
        loc = None
        while f is not None:
            code = f.f_code
            if not _internal(code.co_filename):
                if loc is None:
                    loc = SourceLoc(code.co_filename, f.f_lineno)
                site.append((code, f.f_lasti))
                if code is self.fn_code:
                    break
            f = f.f_back
        return loc, tuple(site)

    def assigned_name(self, site: tuple, default: str) -> str:
        """The variable the author's statement assigns the tile to: ``acc = fl.contract(...)`` names
        the contraction's tile ``acc``; a sub-expression (``fl.load(k)`` inside the call, or
        ``l * alpha`` inside ``l = l * alpha + s``) keeps its `default` name (its tensor or op)."""
        if not site:
            return default
        key = site[0]
        if key not in self._names:
            self._names[key] = _assigned_name(*key)
        return self._names[key] or default

    # ---- recording ----------------------------------------------------------------------------
    def record(self, op: Op) -> Op:
        op.index = len(self.trace.ops)
        if op.index >= MAX_TRACE_OPS:
            raise TraceLimitError(
                f"kernel {self.trace.name} traces more than {MAX_TRACE_OPS:,} ops",
                expected="tiles that cut the tensors into at most a few thousand pieces",
                given=f"{op.index:,} ops recorded, this line's among them", loc=op.loc,
                hint="use bigger tiles: the same bytes move in far fewer ops")
        self.trace.ops.append(op)
        if self.interp is not None:
            self.interp.run(op)
        return op

    def new_tile(self, shape, dtype: DType, axes, space: str, *, loc, site, name: str,
                 origin: str) -> Tile:
        stamps = tuple((frame.site, self.pe, frame.iteration, frame.stages)
                       for frame in self.loops if frame.stages > 1)
        t = Tile(self.trace, len(self.trace.tiles), shape, dtype, axes, space, self.pe, name, loc,
                 site, stamps, origin)
        self.trace.tiles.append(t)
        return t

    # ---- loops --------------------------------------------------------------------------------
    def loop_frame(self, site, stages: int, parallel: bool) -> LoopFrame:
        if not self.trace.pipelining:
            stages = 1
        return LoopFrame(site, stages, parallel)

    def begin_iteration(self, frame: LoopFrame, index: int) -> None:
        """Enter iteration `index` of `frame`: a parallel loop deals iterations round-robin to PEs."""
        if frame.parallel:
            self.pe = index % self.target.num_pes
            frame.iteration = index // self.target.num_pes
        else:
            key = (frame.site, self.pe)
            frame.iteration = self.counters.get(key, -1) + 1
            self.counters[key] = frame.iteration

"""Tile sizes per kernel, searched with the cost model.

A generated kernel's tiling is a set of keyword parameters with the generator's defaults
(``tm``, ``tn``, ``tk`` of a contraction, ``rows`` of a vector kernel, ``bq``, ``bk`` of
attention). The schedule stage hands a `TileSearch` every generated kernel of the program: starting
from a kernel's defaults, it tries each parameter doubled, quadrupled and halved (coordinate
descent, one pass, then the best combination of the winners), traces each candidate for the
target (a candidate whose tiles do not fit SRAM fails to trace and is dropped), times it alone on
the simulator, and keeps the fastest if it beats the defaults by `MIN_GAIN` (or is as fast and
moves fewer DRAM bytes: alone, a kernel has all of DRAM, which it shares in the program). A
candidate that grows a buffer past `max_tile_bytes` is dropped too: alone it fits, but in the
program such tiles fragment SRAM. ``stages`` (double buffering), a panel's row step ``tr`` and the
heads a projection makes at a time ``hg`` (`IN_PROGRAM_ONLY`) are the generator's choices and are
not searched.

A size past the axis it cuts (`tile_extents`: tm = 1024 of 512 rows, a panel's tn past its
tp) cuts what the whole axis does; such a candidate is clipped to the axis and, being a program
already timed, not traced again (it still takes its slot, so the parameters tried do not change).
Tried and dropped: handing the freed slots on, so a panel's ``tk`` (which the slots never reach)
was searched too. Alone its kernels got faster (GPT-2's MLP output projection 6%); in the
programs they got slower, as their K slabs no longer met the column panels their producers write
(GPT-2-small 783 -> 818 us; with the K slabs evened out, 803 us, and a 32-layer Llama decode step
10.1 -> 10.4 ms). Timed alone, a kernel cannot see that.

The search is bounded per kernel: at most `MAX_CANDIDATES` candidates; kernels whose default program
is larger than `MAX_COMMANDS` keep their defaults (their tile counts are already large); and so do
kernels whose copies in the program together run under `MIN_SEARCH_CYCLES` alone (a kernel's
cycles at its defaults times its copies): a candidate costs as much to trace and time for a small
kernel as for a large one, and small ones have little to give, unless the program runs them many
times (a decode step's per-layer kernels). Over the Hugging Face architectures of the suite and the
lower and schedule stages' tests (both targets and precisions), kernels under 4,000 such cycles
took 38% of the search's time (52 of 136 s of candidate timing) and gave 5% of the cycles it
saved in the programs (the floor was 2,000 cycles alone, copies not counted; at 6,000 they took
half and gave 9%).

And it is bounded per compile: the candidates of one program may trace at most `SEARCH_BUDGET`
commands in all. The kernels are searched slowest first (a kernel's default cycles alone times
the number of its copies in the program), so when a model of hundreds of kernels on a small chip
spends the budget, it is the kernels with the least to give that keep their defaults. The budget
counts commands, not seconds, so a compile chooses the same tiles on any machine, and a kernel's
measurements kept from an earlier compile are charged as if traced again.

Kernels alike (the same canonical source and argument shapes, on the same target: each layer's
copy of a kernel) share one search; their measurements are kept across compiles.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from dataclasses import dataclass, field, replace

from fexplore.lang.examples._tiling import max_tile_bytes

MAX_CANDIDATES = 10
MIN_GAIN = 0.03   # a retiling must be 3% faster alone (or as fast with less DRAM traffic)
MAX_COMMANDS = 20_000
MIN_SEARCH_CYCLES = 4_000   # a kernel whose copies take fewer cycles (alone, all told) keeps its defaults
# commands the candidates of one compile may trace: five times what the largest models of
# bench/npu_models.py spend (GPT-2-small at seq 512: 31k, Llama-3.1-8B decode: 41k), about half a
# minute of search (100 to 170 us a command); EfficientNet on tiny spent 970k, minutes, unbounded
SEARCH_BUDGET = 200_000
FACTORS = (2, 4, 0.5)
# parameters whose worth shows only in the program: a weight-stationary panel's row step (``tr``)
# lets the kernel start before its producer has written every row and overlaps its row loads with
# the contractions of the step before; alone, a kernel has no producer to overlap, so the search
# would see only the cost of more, shorter commands and undo it; a projection's heads per group
# (``hg``) likewise buys the attention reading them an early start, which alone does not show
IN_PROGRAM_ONLY = ("tr", "hg")


@dataclass
class TileChoice:
    kernel: str
    default: dict
    chosen: dict
    default_cycles: int
    cycles: int
    tried: int
    skipped: str = ""          # why the search did not run
    candidates: list = field(default_factory=list)   # (params, cycles or None)
    same_as: str = ""          # decided by the search of this identical kernel (names aside)
    cut_short: bool = False    # the compile's budget ran out before or during this kernel's search
    copies: int = 1            # the kernels alike in the program that share this search

    @property
    def changed(self) -> bool:
        return self.chosen != self.default

    def __str__(self) -> str:
        if self.skipped:
            return f"{self.kernel}: defaults kept ({self.skipped})"
        diff = ", ".join(f"{k} {self.default[k]}→{v}" for k, v in self.chosen.items() if self.default[k] != v)
        how = f"as {self.same_as}" if self.same_as else f"{self.tried} candidates"
        cut = ", cut short by the compile's search budget" if self.cut_short else ""
        return (f"{self.kernel}: {diff or 'defaults are best'} ({self.default_cycles:,} → {self.cycles:,} "
                f"cycles alone, {how}{cut})")


@dataclass(frozen=True)
class _Measure:
    cycles: int | None   # alone on the simulator; None: not timed (does not trace, or too big)
    dram_bytes: int = 0
    biggest: int = 0     # its largest SRAM buffer
    commands: int = 0    # what tracing it cost, charged to the budget


_MEASURED: dict = {}   # (kernel key, target, params) -> _Measure, across compiles


def tile_params(kernel) -> dict:
    """The kernel's tiling parameters and their defaults (keyword-only ints, not ``stages``)."""
    fn = getattr(kernel, "fn", None)
    if fn is None:
        return {}
    return {p.name: p.default for p in inspect.signature(fn).parameters.values()
            if p.kind == p.KEYWORD_ONLY and isinstance(p.default, int) and not isinstance(p.default, bool)
            and p.name != "stages"}


def tile_extents(kernel, params: dict | None = None) -> dict[str, int]:
    """Per tiling parameter, the extent of the axis it cuts at `params` (the defaults if None): a
    size of the kernel's, or the value of the parameter whose tiles it cuts again (a panel's
    column tiles, ``fl.tiles(ps, tn)``, cut the panel's ``tp``).

    Read from the kernel's source, the ``fl.tiles(<extent>, <parameter>)`` calls: the extent a
    literal, a name the kernel binds to literals only (``M, N, K = 512, 768, 3072``), or a loop
    variable over another parameter's tiles. A parameter that tiles axes of different extents, or
    one whose extent is not written so, has none; the search then tries it unbounded."""
    params = dict(tile_params(kernel), **(params or {}))
    return _resolve(_written_extents(kernel, set(params)), params)


def _resolve(written: dict, params: dict) -> dict[str, int]:
    """`_written_extents` at `params`: a parameter's name stands for its value."""
    return {p: params[e] if isinstance(e, str) else e for p, e in written.items()}


def _written_extents(kernel, params: set) -> dict:
    """Per parameter in `params`, the extent its ``fl.tiles`` calls write: an int, or the name of
    the parameter whose tiles it cuts (see `tile_extents`)."""
    try:
        source = textwrap.dedent(inspect.getsource(kernel.fn))
    except (OSError, TypeError, AttributeError):
        return {}
    return dict(_extents_in(source, frozenset(params)))


@functools.lru_cache(maxsize=1024)   # each layer's copy of a kernel has the same source
def _extents_in(source: str, params: frozenset) -> tuple:
    """`_written_extents` of a kernel's source, as (parameter, extent) pairs."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ()
    consts: dict = {}   # name -> int, or None once bound to anything else
    cuts: dict = {}     # loop variable -> the parameter whose tiles it runs over
    calls = []

    def tiles_call(node) -> bool:
        return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "tiles"
                and len(node.args) == 2)

    def bind(target, value) -> None:
        if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
            for t, v in zip(target.elts, value.elts):
                bind(t, v)
        elif isinstance(target, ast.Name):
            literal = isinstance(value, ast.Constant) and type(value.value) is int
            known = consts.get(target.id, value.value if literal else None)
            consts[target.id] = value.value if literal and known == value.value else None
        elif isinstance(target, ast.Tuple):
            for t in target.elts:
                bind(t, None)

    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                bind(target, node.value)
        elif isinstance(node, ast.For):
            loops = node.iter.args if isinstance(node.iter, ast.Call) and not tiles_call(node.iter) else [node.iter]
            names = node.target.elts if isinstance(node.target, ast.Tuple) else [node.target]
            for name, loop in zip(names, loops) if len(names) == len(loops) else ():
                if isinstance(name, ast.Name) and tiles_call(loop) and isinstance(loop.args[1], ast.Name):
                    cut = loop.args[1].id
                    cuts[name.id] = cut if cuts.get(name.id, cut) == cut else None
        if tiles_call(node) and isinstance(node.args[1], ast.Name) and node.args[1].id in params:
            calls.append((node.args[1].id, node.args[0]))
    extents: dict = {}
    for param, what in calls:
        if isinstance(what, ast.Constant) and type(what.value) is int:
            extent = what.value
        elif isinstance(what, ast.Name) and consts.get(what.id) is not None:
            extent = consts[what.id]
        elif isinstance(what, ast.Name) and cuts.get(what.id) in params:
            extent = cuts[what.id]
        else:
            extent = None
        extents[param] = extent if extents.get(param, extent) == extent else None
    return tuple((p, e) for p, e in extents.items() if e is not None)


def _params_key(params: dict) -> tuple:
    return tuple(sorted(params.items()))


class TileSearch:
    """The tile choices of one program on target `cfg`, within a budget of traced commands.

    `plan` searches the program's generated kernels, slowest first; `trace` then gives each
    kernel's trace with its choice. A kernel `plan` was not told of is searched when traced, with
    what is left of the budget."""

    def __init__(self, cfg, budget: int | None = None):
        self.cfg, self.spent, self.closed = cfg, 0, False   # closed: the budget ran out
        self.budget = SEARCH_BUDGET if budget is None else budget
        self.choices: dict = {}   # kernel key -> (params, TileChoice)

    @property
    def exhausted(self) -> list[TileChoice]:
        """The choices the budget left at their defaults or cut short."""
        return [c for _, c in self.choices.values() if c.cut_short]

    def plan(self, kernels) -> None:
        """Search `kernels` ((name, kernel, args, key) in program order), slowest first."""
        first: dict = {}
        copies: dict = {}
        for name, kernel, args, key in kernels:
            first.setdefault(key, (name, kernel, args))
            copies[key] = copies.get(key, 0) + 1
        weight = {}
        for key, (name, kernel, args) in first.items():
            default = tile_params(kernel)
            m = self._measure(kernel, args, key, default, limit=MAX_COMMANDS) if default else _Measure(None)
            weight[key] = (m.cycles or 0) * copies[key]
        for key in sorted(first, key=lambda k: -weight[k]):   # stable: program order among equals
            if key not in self.choices:
                self.choices[key] = self._search(*first[key], key, copies[key])

    def trace(self, name: str, kernel, args, key):
        """(trace, TileChoice) of `kernel` on `args` with the tiles chosen for its key."""
        if key not in self.choices:
            self.choices[key] = self._search(name, kernel, args, key)
        params, choice = self.choices[key]
        if choice.kernel != name:
            choice = replace(choice, kernel=name, same_as=choice.same_as or choice.kernel)
        try:
            return kernel.trace(*args, target=self.cfg, **params), choice
        except MemoryError:   # the machine's limit, not the candidate's (FX505)
            raise
        except Exception:  # noqa: BLE001 - alike is not identical: its tiles do not fit this one
            return kernel.trace(*args, target=self.cfg), replace(
                choice, chosen=choice.default, cycles=choice.default_cycles,
                skipped=f"{choice.same_as}'s tiles do not fit")

    def _measure(self, kernel, args, key, params, limit: int | None = None) -> _Measure:
        """`kernel` with `params` traced and timed alone (not timed over `limit` commands)."""
        k = (key, self.cfg, _params_key(params))
        m = _MEASURED.get(k)
        if m is None:
            m = _MEASURED[k] = self._time(kernel, args, params, limit)
            if len(_MEASURED) > 50_000:
                _MEASURED.clear()
        return m

    def _time(self, kernel, args, params, limit) -> _Measure:
        try:
            prog = kernel.trace(*args, target=self.cfg, **params).program()
        except MemoryError:   # the machine's limit, not the candidate's (FX505)
            raise
        except Exception:  # noqa: BLE001 - tiles that do not fit (or do not divide): not a candidate
            return _Measure(None)
        n = len(prog.commands)
        if limit is not None and n > limit:
            return _Measure(None, commands=n)
        try:
            res = prog.simulate()
        except MemoryError:   # the machine's limit, not the candidate's (FX505)
            raise
        except Exception:  # noqa: BLE001 - a candidate the simulator refuses is not one
            return _Measure(None, commands=n)
        return _Measure(res.cycles, res.dram_bytes, max((b.nbytes for b in prog.buffers), default=0), n)

    def _search(self, name, kernel, args, key, copies: int = 1):
        """(params, TileChoice) of the kernel `key` names, of which the program runs `copies`."""
        default = tile_params(kernel)
        if not default:
            return {}, TileChoice(name, {}, {}, 0, 0, 0, skipped="no tiling parameters", copies=copies)
        base = self._measure(kernel, args, key, default, limit=MAX_COMMANDS)
        if base.cycles is None:
            why = (f"{base.commands:,} commands, over the search's limit of {MAX_COMMANDS:,}" if base.commands
                   else "the default tiling does not lower")
            return default, TileChoice(name, default, default, 0, 0, 1, skipped=why, copies=copies)
        if base.cycles * copies < MIN_SEARCH_CYCLES:
            times = f" x {copies} copies" if copies > 1 else ""
            return default, TileChoice(
                name, default, default, base.cycles, base.cycles, 1, copies=copies,
                skipped=f"{base.cycles:,} cycles alone{times}, under the search's floor of {MIN_SEARCH_CYCLES:,}")
        timed = {_params_key(default): base}
        cut = False
        # a candidate may fit alone, but a tile past the program's share fragments its SRAM
        # (unless the defaults already have one that big)
        room = max(max_tile_bytes(self.cfg), base.biggest)

        def measure(params) -> _Measure | None:
            """The candidate's measure, charged to the budget; None once the budget is spent (a
            candidate is taken to cost what the defaults did; once one is refused, the search is
            over for every kernel after it, so the slowest kernels are the ones searched)."""
            nonlocal cut
            k = _params_key(params)
            if k not in timed:
                if self.closed or self.spent + base.commands > self.budget:
                    cut = self.closed = True
                    return None
                timed[k] = self._measure(kernel, args, key, params)
                self.spent += timed[k].commands
            return timed[k]

        def usable(m) -> bool:
            return m is not None and m.cycles is not None and m.biggest <= room

        def better(m, best) -> bool:
            """Faster by more than `MIN_GAIN`; or as fast and moving fewer DRAM bytes. Timed alone, a
            kernel has all of DRAM: a small gain bought with more traffic is a loss in the program."""
            if not usable(m):
                return False
            if m.cycles < best.cycles * (1 - MIN_GAIN):
                return True
            return m.cycles <= best.cycles * (1 + MIN_GAIN) and m.dram_bytes < best.dram_bytes

        best_params, best = dict(default), base
        winners = {}
        written = _written_extents(kernel, set(default))

        def clipped(cand: dict) -> dict:
            """No tile past the axis it cuts, nor past the tile it cuts again (a panel's columns,
            tn <= tp): past it, the same program as at its size."""
            bounds = _resolve(written, cand)
            return {q: min(v, bounds[q]) if q in bounds else v for q, v in cand.items()}

        # the candidates' slots: a size past its axis takes one untraced (it is the same program
        # as one timed), so the search tries the parameters it always did
        slots = {_params_key(default)}
        for p, v in default.items():
            if p in IN_PROGRAM_ONLY:
                continue
            for f in FACTORS:
                if len(slots) >= MAX_CANDIDATES or cut:
                    break
                cand = dict(default, **{p: max(1, int(v * f))})
                slots.add(_params_key(cand))
                cand = clipped(cand)
                if _params_key(cand) in timed:
                    continue
                m = measure(cand)
                if better(m, best):
                    best_params, best = cand, m
                    winners[p] = cand[p]
        if len(winners) > 1 and len(slots) < MAX_CANDIDATES + 1 and not cut:
            cand = clipped(dict(default, **winners))
            m = measure(cand)
            if better(m, best):
                best_params, best = cand, m
        if len(timed) == 1 and cut:
            return default, TileChoice(
                name, default, default, base.cycles, base.cycles, 1,
                skipped=f"the compile's search budget ({self.budget:,} commands) went to slower kernels",
                cut_short=True, copies=copies)
        return best_params, TileChoice(name, default, best_params, base.cycles, best.cycles, len(timed),
                                       candidates=[(dict(k), m.cycles if usable(m) else None) for k, m in timed.items()],
                                       cut_short=cut, copies=copies)

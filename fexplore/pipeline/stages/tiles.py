"""Tile sizes per kernel, searched with the cost model.

A generated kernel's tiling is a set of keyword parameters with the generator's defaults
(``tm``, ``tn``, ``tk`` of a contraction, ``rows`` of a vector kernel, ``bq``, ``bk`` of
attention). The schedule stage asks `best_trace` for each distinct kernel: starting from the
defaults, it tries each parameter doubled, quadrupled and halved (coordinate descent, one pass,
then the best combination of the winners), traces each candidate for the target (a candidate
whose tiles do not fit SRAM fails to trace and is dropped), times it alone on the simulator, and
keeps the fastest if it beats the defaults by `MIN_GAIN` (or is as fast and moves fewer DRAM
bytes: alone, a kernel has all of DRAM, which it shares in the program). A candidate that grows a
buffer past `max_tile_bytes` is dropped too: alone it fits, but in the program such tiles fragment
SRAM. ``stages`` (double buffering), a panel's row step ``tr`` and the heads a projection makes
at a time ``hg`` (`IN_PROGRAM_ONLY`) are the generator's choices and are not searched.

The search is bounded: at most `MAX_CANDIDATES` traces per kernel; kernels whose default
program is larger than `MAX_COMMANDS` keep their defaults (their tile counts are already large,
and a real-size model would spend its compile there); and so do kernels that run under
`MIN_SEARCH_CYCLES` alone: a candidate costs as much to trace and time for a small kernel as for a
large one, and small ones have little to give (over the Hugging Face architectures of the suite,
on both targets and precisions, kernels under 2,000 cycles took two thirds of the candidates and
gave 5% of the cycles the search saved). Results are cached per kernel source,
argument shapes and target, so the repeated layers of a model are searched once.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field, replace

from fexplore.lang.examples._tiling import max_tile_bytes

MAX_CANDIDATES = 10
MIN_GAIN = 0.03   # a retiling must be 3% faster alone (or as fast with less DRAM traffic)
MAX_COMMANDS = 20_000
MIN_SEARCH_CYCLES = 2_000   # a kernel faster than this alone keeps its defaults
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

    @property
    def changed(self) -> bool:
        return self.chosen != self.default

    def __str__(self) -> str:
        if self.skipped:
            return f"{self.kernel}: defaults kept ({self.skipped})"
        diff = ", ".join(f"{k} {self.default[k]}→{v}" for k, v in self.chosen.items() if self.default[k] != v)
        how = f"as {self.same_as}" if self.same_as else f"{self.tried} candidates"
        return (f"{self.kernel}: {diff or 'defaults are best'} ({self.default_cycles:,} → {self.cycles:,} "
                f"cycles alone, {how})")


_CACHE: dict = {}


def tile_params(kernel) -> dict:
    """The kernel's tiling parameters and their defaults (keyword-only ints, not ``stages``)."""
    fn = getattr(kernel, "fn", None)
    if fn is None:
        return {}
    return {p.name: p.default for p in inspect.signature(fn).parameters.values()
            if p.kind == p.KEYWORD_ONLY and isinstance(p.default, int) and not isinstance(p.default, bool)
            and p.name != "stages"}


def best_trace(name: str, kernel, args, cfg, key):
    """(trace, TileChoice): the fastest tiling of `kernel` on `cfg` for `args` (see the module)."""
    hit = _CACHE.get((key, cfg))
    if hit is not None:   # a kernel alike (its canonical source) was searched already
        params, choice = hit
        if choice.kernel != name:
            choice = replace(choice, kernel=name, same_as=choice.same_as or choice.kernel)
        try:
            return kernel.trace(*args, target=cfg, **params), choice
        except Exception:  # noqa: BLE001 - alike is not identical: its tiles do not fit this one
            default = tile_params(kernel)
            return kernel.trace(*args, target=cfg), replace(
                choice, chosen=default, cycles=choice.default_cycles, skipped=f"{choice.same_as}'s tiles do not fit")
    default = tile_params(kernel)
    base = kernel.trace(*args, target=cfg)
    if not default:
        choice = TileChoice(name, {}, {}, 0, 0, 0, skipped="no tiling parameters")
        return base, _remember(key, cfg, {}, choice)
    if len(base.ops) > MAX_COMMANDS:
        choice = TileChoice(name, default, default, 0, 0, 0, skipped=f"{len(base.ops):,} ops, over the search budget")
        return base, _remember(key, cfg, default, choice)
    timed: dict[tuple, int | None] = {}

    moved: dict[tuple, int] = {}
    biggest: dict[tuple, int] = {}   # the largest buffer of each candidate
    base_key = tuple(sorted(default.items()))

    def cycles(params):
        k = tuple(sorted(params.items()))
        if k not in timed:
            try:
                prog = kernel.trace(*args, target=cfg, **params).program()
                res = prog.simulate()
                timed[k], moved[k] = res.cycles, res.dram_bytes
                biggest[k] = max((b.nbytes for b in prog.buffers), default=0)
                if biggest[k] > max(max_tile_bytes(cfg), biggest.get(base_key, 0)):
                    timed[k] = None   # fits alone, but a tile that big fragments the program's SRAM
            except Exception:  # noqa: BLE001 - tiles that do not fit (or do not divide): not a candidate
                timed[k] = None
        return timed[k]

    def better(cand, c, best, best_c) -> bool:
        """Faster by more than `MIN_GAIN`; or as fast and moving fewer DRAM bytes. Timed alone, a
        kernel has all of DRAM: a small gain bought with more traffic is a loss in the program."""
        if c is None:
            return False
        if c < best_c * (1 - MIN_GAIN):
            return True
        return c <= best_c * (1 + MIN_GAIN) and moved[tuple(sorted(cand.items()))] < moved[tuple(sorted(best.items()))]

    best, best_cycles = dict(default), cycles(default)
    if best_cycles is None:
        return base, _remember(key, cfg, default, TileChoice(name, default, default, 0, 0, 1,
                                                             skipped="the default tiling does not lower"))
    if best_cycles < MIN_SEARCH_CYCLES:
        return base, _remember(key, cfg, default, TileChoice(
            name, default, default, best_cycles, best_cycles, 1,
            skipped=f"{best_cycles:,} cycles alone, under the search's floor of {MIN_SEARCH_CYCLES:,}"))
    winners = {}
    for p, v in default.items():
        if p in IN_PROGRAM_ONLY:
            continue
        for f in FACTORS:
            if len(timed) >= MAX_CANDIDATES:
                break
            cand = dict(default, **{p: max(1, int(v * f))})
            c = cycles(cand)
            if better(cand, c, best, best_cycles):
                best, best_cycles = cand, c
                winners[p] = cand[p]
    if len(winners) > 1 and len(timed) < MAX_CANDIDATES + 1:
        cand = dict(default, **winners)
        c = cycles(cand)
        if better(cand, c, best, best_cycles):
            best, best_cycles = cand, c
    choice = TileChoice(name, default, best, timed[base_key], best_cycles, len(timed),
                        candidates=[(dict(k), c) for k, c in timed.items()])
    trace = base if best == default else kernel.trace(*args, target=cfg, **best)
    return trace, _remember(key, cfg, best, choice)


def _remember(key, cfg, params, choice):
    if len(_CACHE) > 512:
        _CACHE.clear()
    _CACHE[(key, cfg)] = (params, choice)
    return choice

"""PE fusion: which arrangement of the chip's PEs a compile lowers and schedules for.

The chip lets up to 4 PEs fuse into one (`NPUConfig.fused`): fewer, wider PEs with the same
totals. What fusion buys: an operand every PE of a split needs (a weight panel, an activation row
tile) crosses one fused PE's DMA engines once instead of each PE's, and each transfer's start-up
is paid once for a wider one. What it costs: the tensor unit's tile is wider (a narrow contraction
wastes more of it) and there are fewer PEs to split small work over. Which wins depends on the
model: a prefill's large contractions gain, a decode step that streams weights gains little.

The compile option ``pe_fusion``:
  1        the chip's own PEs (the default);
  2, 4     that fusion, for every kernel of the model;
  "auto"   each arrangement the chip allows is lowered, every distinct kernel's tiling searched
           and timed alone (`tiles.best_trace`, whose cache the schedule stage then hits), and a
           fusion is kept when its kernels take `MIN_GAIN` fewer cycles in total than the chip's
           own PEs'. A sum of kernels timed alone leaves out what the whole program overlaps (a
           small model's kernels mostly overlap): it ranks arrangements coarsely, hence the
           margin; it is not their latency (the schedule stage reports that).

The choice is for the whole program: the simulator runs one arrangement at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fexplore.errors import ConfigError
from fexplore.npu import NPUConfig, get_target

# A fusion must beat the unfused chip's kernels-alone total by this much to be chosen
MIN_GAIN = 0.10


@dataclass(frozen=True)
class Arrangement:
    """One arrangement tried by ``pe_fusion="auto"``: the kernels' cycles timed alone, summed."""

    group: int
    target: str
    kernel_cycles: int
    kernels: int

    def __str__(self) -> str:
        return f"{self.target}: {self.kernel_cycles:,} kernel cycles ({self.kernels} kernels)"


def check_pe_fusion(pe_fusion, target) -> None:
    """Raises ConfigError for a ``pe_fusion`` the chip cannot do."""
    if pe_fusion == "auto":
        return
    if isinstance(pe_fusion, bool) or not isinstance(pe_fusion, int):
        raise ConfigError(f"pe_fusion must be 'auto' or a number of PEs to fuse, got {pe_fusion!r}",
                          hint="1 keeps the chip's PEs; 2 or 4 fuses them; 'auto' picks by the cost model")
    get_target(target).fused(pe_fusion)


def candidate_groups(chip: NPUConfig) -> list[int]:
    """The fusions `chip` allows (1 first)."""
    out = []
    for g in range(1, chip.max_fused_pes // chip.fused_pes + 1):
        try:
            chip.fused(g)
        except ConfigError:
            continue
        out.append(g)
    return out


def arranged_target(graph, options, lower_for) -> tuple[NPUConfig, list[Arrangement], object]:
    """(the chip to lower for, the arrangements tried, the lowering made for it if one was).
    `lower_for(cfg)` lowers `graph` for one chip arrangement."""
    chip = get_target(options.target)
    pe_fusion = getattr(options, "pe_fusion", 1)   # options made by hand (tests) may lack it
    if pe_fusion != "auto":
        return chip.fused(pe_fusion), [], None
    groups = candidate_groups(chip)
    if len(groups) == 1:
        return chip, [], None
    tried, made = [], []
    for g in groups:
        cfg = chip.fused(g)
        low = lower_for(cfg)
        cycles, n = kernels_alone(graph, low, cfg)
        tried.append(Arrangement(g, cfg.name, cycles, n))
        made.append((cycles, cfg, low))
    unfused = made[0][0]   # groups[0] is 1: the chip's own PEs are the ones to beat
    best = min((m for m in made if m[1].fused_pes == chip.fused_pes or m[0] < unfused * (1 - MIN_GAIN)),
               key=lambda m: m[0])
    return best[1], tried, best[2]


def kernels_alone(graph, lowering, cfg) -> tuple[int, int]:
    """(total cycles, kernels) of the lowering's kernels, each at its searched tiles, timed alone
    on `cfg`. Repeated kernels (a model's layers) are searched once and counted each time."""
    from fexplore.lang.codegen.source import canonical_source

    from .stages.tiles import best_trace

    total = n = 0
    for x in lowering.kernels:
        if x.how != "generated":
            continue   # a user kernel is the same on every arrangement the user wrote it for
        node, gk = x.node, x.kernel
        args = gk.arguments([np.zeros(tuple(int(d) for d in v.type.shape), v.type.dtype.numpy)
                             for v in node.inputs])
        kernel = x.traced or gk.kernel()
        key = (canonical_source(gk.source, numbers=False), tuple((a.shape, str(a.dtype)) for a in args))
        trace, choice = best_trace(x.name, kernel, args, cfg, key)
        cycles = choice.cycles or trace.program().simulate().cycles   # a search skipped: time the default
        total += cycles
        n += 1
    return total, n

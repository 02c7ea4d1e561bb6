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
  "auto"   each arrangement the chip allows is lowered and scheduled as the schedule stage
           does it (`stages.schedule.schedule_with_fallbacks`) and simulated, timing only; a
           fusion is kept when its program is `MIN_GAIN` faster than on the chip's own PEs. Kernels timed alone do not rank arrangements: what a fused chip buys is partly
           between kernels (more SRAM to keep intermediates and re-read weights on chip, the next
           kernel's weights streaming in during this one), so the whole program is timed. The
           cost is the schedule of each arrangement tried; the one kept starts the stage's.

The choice is for the whole program: the simulator runs one arrangement at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

from fexplore.errors import ConfigError
from fexplore.npu import NPUConfig, get_target

# A fusion must beat the unfused chip's simulated cycles by this much to be chosen: an arrangement
# changes every kernel, and a gain within the cost model's noise is not worth the change
MIN_GAIN = 0.03


@dataclass(frozen=True)
class Arrangement:
    """One arrangement tried by ``pe_fusion="auto"``: its whole program's simulated cycles."""

    group: int
    target: str
    cycles: int
    kernels: int

    def __str__(self) -> str:
        return f"{self.target}: {self.cycles:,} cycles ({self.kernels} kernels)"


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


def arranged_target(graph, options, lower_for, building: str = "lower") -> tuple[NPUConfig, list[Arrangement], object]:
    """(the chip to lower for, the arrangements tried, the lowering made for it if one was).
    `lower_for(cfg)` lowers `graph` for one chip arrangement; `building`: who asks (the lower
    stage, or a stage's cost), which a refusal of a program too big to build names."""
    from .stages.schedule import not_schedulable

    chip = get_target(options.target)
    pe_fusion = getattr(options, "pe_fusion", 1)   # options made by hand (tests) may lack it
    if pe_fusion != "auto":
        return chip.fused(pe_fusion), [], None
    groups = candidate_groups(chip)
    if len(groups) == 1 or not_schedulable(graph):
        # no program to time (symbolic sizes are scheduled per size on first call, each size
        # choosing for itself)
        return chip, [], None
    tried, made = [], []
    for g in groups:
        cfg = chip.fused(g)
        low = lower_for(cfg)
        cycles, low.made = program_cycles(graph, low, cfg, building)   # the schedule stage takes it as made
        tried.append(Arrangement(g, cfg.name, cycles, len(low.kernels)))
        made.append((cycles, cfg, low))
    unfused = made[0][0]   # groups[0] is 1: the chip's own PEs are the ones to beat
    best = min((m for m in made if m[1].fused_pes == chip.fused_pes or m[0] < unfused * (1 - MIN_GAIN)),
               key=lambda m: m[0])
    return best[1], tried, best[2]


def program_cycles(graph, lowering, cfg, building: str = "lower"):
    """(simulated cycles, (Schedule, spills)) of the whole program on `cfg`, made as the schedule
    stage makes it (`schedule_with_fallbacks`)."""
    from .stages.schedule import schedule_with_fallbacks

    made = schedule_with_fallbacks(graph, lowering, cfg, building=building)
    return made[0].simulate().cycles, made

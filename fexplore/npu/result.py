"""What a simulation returns: `SimResult` (outputs, cycles, latency, utilization, DRAM traffic,
SRAM peaks, timeline) and its `Roofline`.

The roofline bound is the time no schedule can beat: the largest of the tensor-unit time
(flops / chip peak for each command's dtype), the vector-unit time (element passes / all lanes)
and the DRAM time (compulsory bytes / DRAM bandwidth; compulsory = every DRAM tensor the program
touches read once and written once). `ratio` = bound / achieved cycles, at most 1: the fraction
of the best possible this schedule attains. Figures that need a pass over all commands are
computed on first use, so a timing-only run pays for none it does not ask for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from fexplore.npu.commands import ENGINES, Gather, Load, Scatter, Store
from fexplore.npu.program import Program
from fexplore.npu.simulator import TimingTrace


@dataclass(frozen=True)
class Roofline:
    achieved_cycles: float
    tensor_cycles: float     # flops / peak flops per cycle (all PEs, per dtype)
    vector_cycles: float     # vector element passes / lanes of all PEs
    memory_cycles: float     # compulsory DRAM bytes / DRAM bytes per cycle
    flops: int
    compulsory_bytes: int
    peak_flops_per_cycle: float  # chip peak for the program's (first) contraction dtype, bf16 if none
    dram_bytes_per_cycle: float

    @property
    def bound_cycles(self) -> float:
        return max(self.tensor_cycles, self.vector_cycles, self.memory_cycles)

    @property
    def limiter(self) -> str:
        """Which resource sets the bound: "tensor", "vector" or "memory"."""
        figures = {"tensor": self.tensor_cycles, "vector": self.vector_cycles, "memory": self.memory_cycles}
        return max(figures, key=figures.get)

    @property
    def ratio(self) -> float:
        """bound / achieved: the attained fraction of the best this program could do (<= 1)."""
        return self.bound_cycles / self.achieved_cycles if self.achieved_cycles else 1.0

    @property
    def flops_fraction(self) -> float:
        """Attained fraction of the chip's peak flops."""
        return self.tensor_cycles / self.achieved_cycles if self.achieved_cycles else 0.0

    @property
    def bandwidth_fraction(self) -> float:
        """Compulsory traffic per cycle as a fraction of the DRAM bandwidth."""
        return self.memory_cycles / self.achieved_cycles if self.achieved_cycles else 0.0

    def __repr__(self) -> str:
        return (f"Roofline(bound={self.bound_cycles:,.0f} cycles ({self.limiter}), "
                f"achieved={self.achieved_cycles:,.0f}, ratio={self.ratio:.1%})")


class SimResult:
    """One run of a program on the simulated chip."""

    def __init__(self, program: Program, trace: TimingTrace, dram: dict | None, wall_s: float = 0.0):
        self.program = program
        self.target = program.target
        self.trace = trace
        self.functional = dram is not None
        self.dram = dram  # every DRAM tensor by name (functional mode), else None
        self.wall_s = wall_s
        # whole cycles, rounded up; the tolerance absorbs float noise from shared-bandwidth DMAs
        self.cycles = math.ceil(trace.makespan - 1e-6) if trace.makespan > 0 else 0
        self.latency_s = self.cycles / self.target.clock_hz

    @property
    def outputs(self) -> dict:
        """Output tensors by name (numpy), in functional mode; empty in timing-only mode."""
        if self.dram is None:
            return {}
        return {name: self.dram[name] for name in self.program.outputs}

    @cached_property
    def timeline(self):
        from fexplore.npu.timeline import Timeline

        return Timeline(self.program, self.trace)

    @cached_property
    def busy_cycles(self) -> dict[tuple[int, str], float]:
        """Busy cycles per (pe, engine)."""
        start, end = self.trace.start, self.trace.end
        busy = {}
        for q, cmds in enumerate(self.program.queues):
            if cmds:
                busy[(q // 3, ENGINES[q % 3])] = sum(end[c] - start[c] for c in cmds)
        return busy

    @cached_property
    def utilization(self) -> dict[str, float]:
        """{engine: busy fraction}, over all PEs of the chip for the whole run."""
        total = self.trace.makespan * self.target.num_pes
        out = {e: 0.0 for e in ENGINES}
        for (_, engine), cycles in self.busy_cycles.items():
            out[engine] += cycles
        return {e: (v / total if total else 0.0) for e, v in out.items()}

    @cached_property
    def utilization_by_pe(self) -> dict[tuple[int, str], float]:
        span = self.trace.makespan
        return {k: (v / span if span else 0.0) for k, v in self.busy_cycles.items()}

    @cached_property
    def dram_bytes_read(self) -> int:
        """Bytes loaded from DRAM, after rounding each contiguous run up to the minimum transfer."""
        moved = self.program.moved_bytes
        return sum(moved[c.id] for c in self.program.commands if isinstance(c, (Load, Gather)))

    @cached_property
    def dram_bytes_written(self) -> int:
        moved = self.program.moved_bytes
        return sum(moved[c.id] for c in self.program.commands if isinstance(c, (Store, Scatter)))

    @property
    def dram_bytes(self) -> int:
        return self.dram_bytes_read + self.dram_bytes_written

    @cached_property
    def sram_peak(self) -> list[int]:
        """Most SRAM bytes occupied at once during the run, per PE (a buffer occupies its space from
        the start of its first command to the end of its last one)."""
        occupancy = self.timeline.sram_occupancy()
        return [max(live for _, live in occupancy[pe]) for pe in range(self.target.num_pes)]

    @cached_property
    def roofline(self) -> Roofline:
        prog, cfg = self.program, self.target
        dtype = next((c.dtype for c in prog.commands if c.kind == "contract"), "bf16")
        compulsory = prog.compulsory_bytes()
        return Roofline(
            achieved_cycles=self.trace.makespan,
            tensor_cycles=prog.tensor_bound_cycles(),
            vector_cycles=prog.vector_bound_cycles(),
            memory_cycles=compulsory / cfg.dram_bytes_per_cycle,
            flops=prog.flops,
            compulsory_bytes=compulsory,
            peak_flops_per_cycle=cfg.peak_flops_per_cycle(dtype),
            dram_bytes_per_cycle=cfg.dram_bytes_per_cycle,
        )

    def summary(self) -> dict:
        """The headline figures as a flat dict (one row of a report table)."""
        r = self.roofline
        return {"program": self.program.name, "target": self.target.name,
                "commands": len(self.program.commands), "cycles": self.cycles,
                "latency_us": self.latency_s * 1e6,
                **{f"util_{e}": u for e, u in self.utilization.items()},
                "dram_bytes": self.dram_bytes, "sram_peak_max": max(self.sram_peak, default=0),
                "flops": r.flops, "bound_cycles": r.bound_cycles, "limiter": r.limiter,
                "roofline_ratio": r.ratio}

    def __repr__(self) -> str:
        util = " ".join(f"{e} {u:.0%}" for e, u in self.utilization.items())
        return (f"<SimResult {self.program.name!r} on {self.target.name}: {self.cycles:,} cycles "
                f"({self.latency_s * 1e6:,.2f} us), busy {util}, roofline {self.roofline.ratio:.0%}"
                f"{', functional' if self.functional else ''}>")

    def _repr_html_(self) -> str:
        from fexplore.viz.timeline import sim_result_html  # lazy: matplotlib only when rendering

        return sim_result_html(self)

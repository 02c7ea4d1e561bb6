"""Chip configurations: the `rngd` preset from public figures, a `tiny` preset for tests, and
user-defined configs (``NPUConfig(...)`` or ``get_target("rngd").replace(num_pes=4)``).

Sources for the `rngd` figures (each field below says which one it comes from):

  [RNGD-docs]  FuriosaAI developer documentation, "FuriosaAI RNGD" overview and hardware
               specification (developer.furiosa.ai, overview/rngd): TSMC 5 nm, 1.0 GHz clock,
               256 TFLOPS BF16, 512 TFLOPS FP8, 512 TOPS INT8, 1024 TOPS INT4, two HBM3 modules
               with 1.5 TB/s aggregate bandwidth, PCIe Gen5 x16. (FuriosaAI's RNGD product page
               and launch blog give the same 256/512/1024 TOPS.)
  [HC2024]     Hot Chips 2024 talk "FuriosaAI RNGD: A Tensor Contraction Processor for Sustainable
               AI Computing" (figures as reported by Chips and Cheese and ServeTheHome): 8
               processing elements, 64 active slices per PE (plus one spare), 256 MB on-chip
               SRAM = 32 MB per PE, 48 GB of 12-high HBM3, contraction / vector / transpose
               engines per slice.
  [derived]    computed from the figures above (the arithmetic is in the comment).
  [ASSUMPTION] not published; a modeling choice of fexplore, named as such. Change it with
               ``replace`` if you know better.

Every field is validated on construction, so a bad config fails where it is made, with a
``fexplore.errors.ConfigError`` naming the field, the value and what would be valid.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from fexplore.errors import ConfigError

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB


@dataclass(frozen=True)
class NPUConfig:
    """One simulated chip. Per PE: a DMA engine, a tensor (contraction) unit, a vector unit and an
    SRAM scratchpad; all PEs share the DRAM bandwidth."""

    name: str = "custom"
    clock_hz: float = 1.0e9
    num_pes: int = 8
    slices_per_pe: int = 64

    # Tensor unit. `tensor_tile` is the native tile (m, n, k) for bf16: each cycle the unit
    # computes an m x n output block over a k-deep slice of the reduction. Contractions are padded
    # up to multiples of it (tile quantization). The k depth scales with the dtype's rate.
    tensor_tile: tuple[int, int, int] = (64, 16, 16)
    tensor_dtype_rates: tuple[tuple[str, float], ...] = (
        ("bf16", 1.0), ("f16", 1.0), ("fp8", 2.0), ("i8", 2.0), ("i4", 4.0), ("f32", 0.25))
    tensor_latency_cycles: int = 32

    # Vector unit: f32 elements per cycle per PE, plus a fixed pipeline latency per command.
    vector_lanes: int = 256
    vector_latency_cycles: int = 16

    # Transpose engine: elements relaid out per cycle per PE. Modeled on the vector unit's queue
    # (the engine shares the slice's vector datapath in this model), plus `vector_latency_cycles`.
    transpose_elements_per_cycle: int = 128

    # Memories and data movement.
    sram_bytes_per_pe: int = 32 * MiB
    sram_alignment_bytes: int = 64
    dram_bytes: int = 48 * GiB
    dram_bytes_per_cycle: float = 1500.0
    dram_min_transfer_bytes: int = 256
    dma_bytes_per_cycle: float = 256.0
    dma_startup_cycles: int = 500
    host_bytes_per_cycle: float = 30.0
    # An SRAM-to-SRAM DMA (a tensor kept on chip between kernels) skips DRAM: a shorter start-up.
    onchip_copy_startup_cycles: int = 64
    # A host op (one the chip cannot run) also costs the host's compute: f32 flops per chip cycle.
    host_flops_per_cycle: float = 100.0

    # PE fusion: `fused_pes` of the chip's PEs act as each PE of this config (1: unfused); the
    # chip lets up to `max_fused_pes` fuse. See `fused`.
    fused_pes: int = 1
    max_fused_pes: int = 4

    def __post_init__(self):
        rates = self.tensor_dtype_rates
        if isinstance(rates, dict):
            rates = tuple(rates.items())
        try:
            rates = tuple((str(k), float(v)) for k, v in rates)
            tile = tuple(int(x) for x in self.tensor_tile)
        except (TypeError, ValueError):
            raise ConfigError(
                f"config {self.name!r}: tensor_tile must be three ints and tensor_dtype_rates a "
                f"mapping dtype -> rate, got {self.tensor_tile!r} and {self.tensor_dtype_rates!r}",
                hint="e.g. tensor_tile=(64, 16, 16), tensor_dtype_rates={'bf16': 1, 'fp8': 2}") from None
        object.__setattr__(self, "tensor_dtype_rates", rates)
        object.__setattr__(self, "tensor_tile", tile)
        self._validate()

    # ---- validation -----------------------------------------------------------------------
    def _validate(self) -> None:
        positive_ints = ("num_pes", "slices_per_pe", "vector_lanes", "transpose_elements_per_cycle",
                         "sram_bytes_per_pe", "fused_pes", "max_fused_pes",
                         "sram_alignment_bytes", "dram_bytes", "dram_min_transfer_bytes")
        for name in positive_ints:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ConfigError(f"config {self.name!r}: {name} must be a positive integer, got {v!r}",
                                  hint="see get_target('rngd').describe() for sensible values")
        for name in ("tensor_latency_cycles", "vector_latency_cycles", "dma_startup_cycles",
                     "onchip_copy_startup_cycles"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"config {self.name!r}: {name} must be an integer >= 0, got {v!r}",
                                  hint="see get_target('rngd').describe() for sensible values")
        for name in ("clock_hz", "dram_bytes_per_cycle", "dma_bytes_per_cycle", "host_bytes_per_cycle",
                     "host_flops_per_cycle"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ConfigError(f"config {self.name!r}: {name} must be a positive number, got {v!r}",
                                  hint="see get_target('rngd').describe() for sensible values")
        if self.sram_bytes_per_pe < self.dram_min_transfer_bytes:
            raise ConfigError(
                f"config {self.name!r}: sram_bytes_per_pe={self.sram_bytes_per_pe} is smaller than one "
                f"{self.dram_min_transfer_bytes}-byte DRAM transfer line",
                hint="SRAM must hold at least one DMA line (dram_min_transfer_bytes)")
        if len(self.tensor_tile) != 3 or min(self.tensor_tile) <= 0:
            raise ConfigError(f"config {self.name!r}: tensor_tile must be three positive ints (m, n, k), "
                              f"got {self.tensor_tile!r}", hint="e.g. tensor_tile=(64, 16, 16)")
        k = self.tensor_tile[2]
        for dt, rate in self.tensor_dtype_rates:
            depth = k * rate
            if rate <= 0 or depth < 1 or depth != int(depth):
                raise ConfigError(
                    f"config {self.name!r}: tensor rate {rate} for {dt} gives a k depth of {depth} "
                    f"(tensor_tile k={k} x rate); it must be a whole number >= 1",
                    hint="pick a rate so that k * rate is an integer")

    # ---- derived figures ------------------------------------------------------------------
    def replace(self, **changes) -> "NPUConfig":
        """A copy with some fields changed, validated like a fresh config."""
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise ConfigError(f"unknown config field(s) {', '.join(unknown)}",
                              hint=f"fields are: {', '.join(sorted(names))}")
        if "name" not in changes:
            what = ",".join(f"{k}={v}" for k, v in changes.items())
            changes["name"] = f"{self.name}[{what}]" if what else self.name
        return dataclasses.replace(self, **changes)

    def fused(self, group: int) -> "NPUConfig":
        """The chip with every `group` PEs fused into one: fewer, wider PEs with the same chip
        totals (tensor peak, vector lanes, SRAM, DMA engines; DRAM bandwidth is the chip's).

        A fused PE's slices work as one: its tensor unit's native tile is `group` times wider (n),
        its SRAM one address space, and its `group` DMA engines move one transfer together
        ([ASSUMPTION]: one start-up, `group` x the bandwidth). What fusion buys is that a tile is
        delivered once to the fused PE instead of once to each PE that needs it; what it costs is
        coarser tile quantization and fewer PEs to split work over."""
        total = self.num_pes * self.fused_pes
        ok = isinstance(group, int) and not isinstance(group, bool) and group >= 1
        if not ok or self.num_pes % group or self.fused_pes * group > self.max_fused_pes:
            raise ConfigError(f"config {self.name!r}: cannot fuse its PEs in groups of {group!r}",
                              hint=f"a group divides its {self.num_pes} PEs and fuses at most "
                                   f"{self.max_fused_pes} of the chip's {total} PEs")
        if group == 1:
            return self
        m, n, k = self.tensor_tile
        base = (parse_fused_name(self.name) or (self.name, 1))[0]
        g = self.fused_pes * group
        return dataclasses.replace(
            self, name=fused_name(base, g), num_pes=self.num_pes // group, fused_pes=g,
            slices_per_pe=self.slices_per_pe * group, tensor_tile=(m, n * group, k),
            vector_lanes=self.vector_lanes * group,
            transpose_elements_per_cycle=self.transpose_elements_per_cycle * group,
            sram_bytes_per_pe=self.sram_bytes_per_pe * group,
            dma_bytes_per_cycle=self.dma_bytes_per_cycle * group)

    def tensor_rate(self, dtype: str) -> float:
        for dt, rate in self.tensor_dtype_rates:
            if dt == dtype:
                return rate
        raise ConfigError(f"target {self.name!r} has no tensor-unit rate for dtype {dtype}",
                          hint=f"supported: {', '.join(d for d, _ in self.tensor_dtype_rates)}")

    def native_tile(self, dtype: str) -> tuple[int, int, int]:
        """The tensor unit's native (m, n, k) tile for `dtype`; k scales with the dtype's rate."""
        m, n, k = self.tensor_tile
        return m, n, int(k * self.tensor_rate(dtype))

    def macs_per_cycle(self, dtype: str) -> int:
        """Peak MACs per cycle of one PE's tensor unit."""
        m, n, k = self.native_tile(dtype)
        return m * n * k

    def peak_flops_per_cycle(self, dtype: str) -> int:
        """Chip-wide peak (all PEs), counting a MAC as two flops."""
        return 2 * self.macs_per_cycle(dtype) * self.num_pes

    def peak_tflops(self, dtype: str = "bf16") -> float:
        return self.peak_flops_per_cycle(dtype) * self.clock_hz / 1e12

    def describe(self):
        """A pandas table of every field with its value and, where it is rngd's figure, its source."""
        import pandas as pd  # lazy: headless use of the simulator does not need pandas

        rows = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            rows.append((f.name, value, SOURCES.get(f.name, "") if value == getattr(RNGD, f.name) else ""))
        return pd.DataFrame(rows, columns=["field", "value", "source"]).set_index("field")


# Where each `rngd` figure comes from; shown by NPUConfig.describe().
SOURCES = {
    "clock_hz": "[RNGD-docs] 1.0 GHz",
    "num_pes": "[HC2024] 8 processing elements per chip",
    "slices_per_pe": "[HC2024] 64 active slices per PE (65 built, one spare)",
    "tensor_tile": "[derived]+[ASSUMPTION] 256 bf16 MAC/cycle per slice x 64 slices = 16,384 per PE, "
                   "since 256 TFLOPS [RNGD-docs] / (2 flops x 8 PEs x 1 GHz) = 16,000 ~ 16,384; "
                   "the (64, 16, 16) shape is an assumption",
    "tensor_dtype_rates": "[RNGD-docs] fp8 and int8 2x bf16 (512 vs 256 T), int4 4x (1024 TOPS); "
                          "f32 at 1/4 is an [ASSUMPTION] (not published)",
    "tensor_latency_cycles": "[ASSUMPTION] pipeline fill per contraction command",
    "vector_lanes": "[ASSUMPTION] 4 f32 elements/cycle per slice x 64 slices (DESIGN.md); "
                    "the rate is not in the public sources we cite",
    "vector_latency_cycles": "[ASSUMPTION] fixed latency per vector command",
    "transpose_elements_per_cycle": "[HC2024] a transpose engine per slice; its rate is an [ASSUMPTION]: "
                                    "2 elements/cycle per slice x 64 slices, run on the vector "
                                    "unit's queue (one relayout at a time per PE)",
    "sram_bytes_per_pe": "[HC2024] 256 MB per chip = 32 MB per PE (512 KB per slice)",
    "sram_alignment_bytes": "[ASSUMPTION] allocation granularity of the SRAM allocator",
    "dram_bytes": "[HC2024] 48 GB HBM3",
    "dram_bytes_per_cycle": "[derived] 1.5 TB/s [RNGD-docs] / 1.0 GHz = 1500 B/cycle, shared by all PEs",
    "dram_min_transfer_bytes": "[ASSUMPTION] 256 B minimum DRAM transfer (DESIGN.md)",
    "dma_bytes_per_cycle": "[ASSUMPTION] one DMA engine per PE at 256 B/cycle (DESIGN.md)",
    "dma_startup_cycles": "[ASSUMPTION] ~500 cycles start-up per DMA command (DESIGN.md)",
    "host_bytes_per_cycle": "[derived] PCIe Gen5 x16 [RNGD-docs], ~30 GB/s modeled / 1 GHz",
    "onchip_copy_startup_cycles": "[ASSUMPTION] SRAM-to-SRAM DMA start-up, no DRAM round trip",
    "host_flops_per_cycle": "[ASSUMPTION] a host CPU core's ~100 GFLOPS f32 / 1 GHz chip clock, for host ops",
    "fused_pes": "unfused: each PE is one of the chip's (NPUConfig.fused makes wider ones)",
    "max_fused_pes": "up to 4 PEs can fuse into one (DESIGN.md's chip figures)",
}

RNGD = NPUConfig(
    name="rngd",
    clock_hz=1.0e9,                    # [RNGD-docs]
    num_pes=8,                         # [HC2024]
    slices_per_pe=64,                  # [HC2024]
    tensor_tile=(64, 16, 16),          # [derived] 16,384 bf16 MAC/cycle/PE; shape [ASSUMPTION]
    tensor_dtype_rates=(("bf16", 1.0), ("f16", 1.0),   # f16 = bf16 rate: [ASSUMPTION]
                        ("fp8", 2.0), ("i8", 2.0),     # [RNGD-docs] 512 T vs 256 T
                        ("i4", 4.0),                   # [RNGD-docs] 1024 TOPS
                        ("f32", 0.25)),                # [ASSUMPTION] not published
    tensor_latency_cycles=32,          # [ASSUMPTION]
    vector_lanes=256,                  # [ASSUMPTION] 4 f32/cycle/slice x 64 (DESIGN.md)
    vector_latency_cycles=16,          # [ASSUMPTION]
    transpose_elements_per_cycle=128,  # [HC2024] engine exists; rate [ASSUMPTION]
    sram_bytes_per_pe=32 * MiB,        # [HC2024] 256 MB / 8 PEs
    sram_alignment_bytes=64,           # [ASSUMPTION]
    dram_bytes=48 * 10**9,             # [HC2024] 48 GB HBM3
    dram_bytes_per_cycle=1500.0,       # [derived] 1.5 TB/s at 1 GHz
    dram_min_transfer_bytes=256,       # [ASSUMPTION]
    dma_bytes_per_cycle=256.0,         # [ASSUMPTION]
    dma_startup_cycles=500,            # [ASSUMPTION]
    host_bytes_per_cycle=30.0,         # [derived] PCIe Gen5 x16, ~30 GB/s
)

# A toy chip for tests and tutorials: small enough that real tiling, spills and SRAM overflow show
# up on small tensors, and DRAM (96 B/cycle) is slower than two DMA engines (2 x 64 B/cycle), so
# two PEs contend for it. Every figure here is made up on purpose.
TINY = NPUConfig(
    name="tiny",
    clock_hz=1.0e9,
    num_pes=2,
    slices_per_pe=4,
    tensor_tile=(4, 4, 4),             # 64 bf16 MAC/cycle/PE
    tensor_dtype_rates=(("bf16", 1.0), ("f16", 1.0), ("fp8", 2.0), ("i8", 2.0), ("i4", 4.0),
                        ("f32", 0.25)),
    tensor_latency_cycles=4,
    vector_lanes=16,
    vector_latency_cycles=2,
    transpose_elements_per_cycle=8,
    sram_bytes_per_pe=64 * KiB,
    sram_alignment_bytes=64,
    dram_bytes=64 * MiB,
    dram_bytes_per_cycle=96.0,
    dram_min_transfer_bytes=256,
    dma_bytes_per_cycle=64.0,
    dma_startup_cycles=20,
    host_bytes_per_cycle=4.0,
    max_fused_pes=2,
)

PRESETS = {"rngd": RNGD, "tiny": TINY}
# Configs a compile or a kernel was given, by name: a generated kernel's source names its target
# (``@fl.kernel(target="rngd[num_pes=4]")``), so that name must resolve to the config it was made for.
_USED: dict[str, NPUConfig] = {}


def get_target(target: str | NPUConfig = "rngd") -> NPUConfig:
    """A preset by name (``"rngd"``, ``"tiny"``), or an NPUConfig passed through unchanged (and
    known by its name from then on, the latest config of a name winning)."""
    if isinstance(target, NPUConfig):
        preset = PRESETS.get(target.name)
        if preset is not None and preset != target:
            raise ConfigError(f"config named {target.name!r} differs from the preset of that name",
                              hint=f"name it apart, e.g. get_target({target.name!r}).replace(...) names "
                                   "the result after its changes")
        _USED[target.name] = target
        return target
    try:
        return PRESETS[target] if target in PRESETS else _USED[target]
    except (KeyError, TypeError):
        fused = parse_fused_name(target) if isinstance(target, str) else None
        if fused and fused[0] in PRESETS:   # a generated kernel's target, in a new session
            return get_target(PRESETS[fused[0]].fused(fused[1]))
        raise ConfigError(f"unknown target {target!r}",
                          hint=f"presets are {', '.join(PRESETS)}; or pass an NPUConfig") from None


# The name of a fused chip, "rngd[fused 4]": written by `NPUConfig.fused`, read back by `get_target`
# (a generated kernel's source names its target so).
_FUSED_NAME = re.compile(r"(.+)\[fused (\d+)\]")


def fused_name(base: str, group: int) -> str:
    """The name of chip `base` with every `group` PEs fused."""
    return f"{base}[fused {group}]"


def parse_fused_name(name: str) -> tuple[str, int] | None:
    """(base, group) of a name `fused_name` wrote; None for any other name."""
    m = _FUSED_NAME.fullmatch(name)
    return (m[1], int(m[2])) if m else None

"""Compile options: one explicit object, validated when made, never read from the environment."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from fexplore.errors import ConfigError

from fexplore.npu import NPUConfig, get_target

PRECISIONS = ("fp32", "bf16", "fp8")


@dataclass(frozen=True)
class CompileOptions:
    target: Any = "rngd"  # a preset name or an fexplore.npu.NPUConfig
    dynamic_shapes: Any = None  # as torch.export takes it
    precision: str = "fp32"
    verify: bool = True  # structural and numeric verification after every stage
    random_input_sets: int = 1  # fresh random input sets checked besides the example inputs
    fold_limit_bytes: int = 64 << 20  # constant folding never materializes more than this
    seed: int = 0
    # dynamic dims on a static chip (see pipeline/buckets.py): with declared buckets
    # ({dim name: sizes}) and the caller's word that padding at the end leaves the outputs' real
    # part unchanged, a call of another size runs on the next bucket up
    buckets: Any = None
    pad_safe: bool = False
    pad_value: Any = 0  # one number for every input, or one per input
    # PE fusion (pipeline/arrangement.py): 1 keeps the chip's PEs, 2 or 4 fuses them, "auto"
    # lowers for each arrangement the chip allows and keeps the one whose kernels are fastest
    pe_fusion: Any = 1
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise ConfigError(f"unknown precision {self.precision!r}",
                              hint=f"one of {', '.join(PRECISIONS)}")
        get_target(self.target)  # raises ConfigError for an unknown preset
        from .arrangement import check_pe_fusion

        check_pe_fusion(self.pe_fusion, self.target)
        if not isinstance(self.verify, bool):
            raise ConfigError("verify must be True or False",
                              hint="verify=True checks every stage, verify=False skips the checks")
        if self.random_input_sets < 0:
            raise ConfigError("random_input_sets must be >= 0",
                              hint="how many fresh random input sets each stage is checked on "
                                   "besides the example inputs; 0 checks the example inputs only")
        if self.buckets is not None:
            if not isinstance(self.buckets, dict) or not all(
                    isinstance(k, str) and len(v) and all(isinstance(s, int) and s > 0 for s in v)
                    for k, v in self.buckets.items()):
                raise ConfigError("buckets must map a dim name to positive sizes",
                                  hint='e.g. buckets={"seq": [128, 256, 512]}')
        if not isinstance(self.pad_safe, bool):
            raise ConfigError("pad_safe must be True or False")
        if self.pad_safe and not self.buckets:
            raise ConfigError("pad_safe=True without buckets: there is nothing to pad to",
                              hint='declare the sizes too, e.g. buckets={"seq": [128, 256, 512]}')

    @property
    def chip(self) -> NPUConfig:
        return get_target(self.target)

    def replace(self, **changes) -> "CompileOptions":
        return replace(self, **changes)

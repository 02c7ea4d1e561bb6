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
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise ConfigError(f"unknown precision {self.precision!r}",
                              hint=f"one of {', '.join(PRECISIONS)}")
        get_target(self.target)  # raises ConfigError for an unknown preset
        if not isinstance(self.verify, bool):
            raise ConfigError("verify must be True or False")
        if self.random_input_sets < 0:
            raise ConfigError("random_input_sets must be >= 0")

    @property
    def chip(self) -> NPUConfig:
        return get_target(self.target)

    def replace(self, **changes) -> "CompileOptions":
        return replace(self, **changes)

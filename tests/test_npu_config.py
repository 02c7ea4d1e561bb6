"""Chip configs: the rngd preset's public figures, the tiny preset, validation of user configs."""

import pytest

from fexplore.errors import ConfigError, FexploreError
from fexplore.npu import NPUConfig, get_target
from fexplore.npu.config import SOURCES


def test_rngd_preset_figures():
    t = get_target("rngd")
    assert t.num_pes == 8 and t.clock_hz == 1.0e9 and t.slices_per_pe == 64
    assert t.macs_per_cycle("bf16") == 16_384            # 256 per slice x 64 slices
    assert t.macs_per_cycle("fp8") == t.macs_per_cycle("i8") == 2 * 16_384
    assert t.macs_per_cycle("f32") == 16_384 // 4           # named assumption
    assert t.peak_tflops("bf16") == pytest.approx(262.1, abs=0.1)
    assert t.vector_lanes == 256
    assert t.sram_bytes_per_pe == 32 * 2**20
    assert t.dram_bytes_per_cycle == 1500                   # 1.5 TB/s at 1 GHz
    assert t.dram_min_transfer_bytes == 256
    assert (t.dma_bytes_per_cycle, t.dma_startup_cycles) == (256, 500)


def test_every_rngd_figure_has_a_source():
    t = get_target("rngd")
    table = t.describe()
    for name in SOURCES:
        assert SOURCES[name] and table.loc[name, "source"] == SOURCES[name]
    # what is not published is said to be an assumption
    for name in ("tensor_latency_cycles", "vector_latency_cycles", "dma_startup_cycles"):
        assert "ASSUMPTION" in SOURCES[name]


def test_tiny_preset_is_small():
    t = get_target("tiny")
    assert t.num_pes == 2
    assert t.sram_bytes_per_pe < 2**20
    # DRAM slower than two DMA engines together, so two PEs contend for it
    assert t.dram_bytes_per_cycle < 2 * t.dma_bytes_per_cycle


def test_replace_is_validated_and_renamed():
    t4 = get_target("rngd").replace(num_pes=4)
    assert t4.num_pes == 4 and t4.name == "rngd[num_pes=4]"
    assert t4.peak_tflops() == pytest.approx(get_target("rngd").peak_tflops() / 2)
    assert get_target("rngd").num_pes == 8  # the preset is untouched
    assert get_target(t4) is t4


@pytest.mark.parametrize("field,value", [
    ("num_pes", 0), ("num_pes", -1), ("num_pes", 2.5),
    ("sram_bytes_per_pe", 255), ("sram_bytes_per_pe", 0),
    ("dram_bytes_per_cycle", 0), ("dma_startup_cycles", -1), ("tensor_tile", (0, 16, 16)),
    ("tensor_dtype_rates", {"bf16": 1.0, "f32": 0.01}),
])
def test_invalid_configs_are_rejected(field, value):
    with pytest.raises(ConfigError) as construct:
        NPUConfig(**{field: value})
    assert field.split("_")[0] in str(construct.value) or "rate" in str(construct.value)
    with pytest.raises(ConfigError):
        get_target("rngd").replace(**{field: value})
    with pytest.raises(ConfigError):
        get_target("tiny").replace(**{field: value})


def test_sram_smaller_than_one_line_names_the_line():
    with pytest.raises(ConfigError, match="256-byte") as err:
        get_target("tiny").replace(sram_bytes_per_pe=128)
    assert err.value.code == "FX100" and isinstance(err.value, FexploreError)
    get_target("tiny").replace(sram_bytes_per_pe=256)  # exactly one line is fine


def test_unknown_field_and_unknown_target():
    with pytest.raises(ConfigError, match="unknown config field"):
        get_target("rngd").replace(num_pe=4)
    with pytest.raises(ConfigError, match="presets are rngd, tiny"):
        get_target("h100")

"""Chips other than the presets: a user's config and PE fusion (`NPUConfig.fused`).

A generated kernel's source names its target; a config the compile was given must resolve by that
name, or every kernel of the model would fall back to the host. A fused chip has the preset's
totals in fewer, wider PEs; a model compiled for it runs on it and equals eager.
"""

from __future__ import annotations

import json

import pytest
import torch

import fexplore
from fexplore.errors import ConfigError
from fexplore.models import ZOO
from fexplore.npu import NPUConfig, get_target


def test_a_fused_chip_keeps_the_chips_totals_in_fewer_wider_pes():
    t = get_target("rngd")
    for g in (2, 4):
        f = t.fused(g)
        assert (f.num_pes, f.fused_pes) == (t.num_pes // g, g)
        assert f.peak_flops_per_cycle("bf16") == t.peak_flops_per_cycle("bf16")
        assert f.num_pes * f.vector_lanes == t.num_pes * t.vector_lanes
        assert f.num_pes * f.sram_bytes_per_pe == t.num_pes * t.sram_bytes_per_pe
        assert f.num_pes * f.dma_bytes_per_cycle == t.num_pes * t.dma_bytes_per_cycle
        assert f.dram_bytes_per_cycle == t.dram_bytes_per_cycle   # DRAM is the chip's
    assert t.fused(1) is t
    assert t.fused(2).fused(2) == t.fused(4)


@pytest.mark.parametrize("target, group", [("rngd", 3), ("rngd", 8), ("tiny", 4), ("rngd", True)])
def test_a_fusion_the_chip_cannot_do_is_a_config_error(target, group):
    with pytest.raises(ConfigError) as e:
        get_target(target).fused(group)
    assert "fuse" in str(e.value) and e.value.hint


def test_a_config_named_like_a_preset_but_different_is_refused():
    with pytest.raises(ConfigError, match="differs from the preset"):
        get_target(NPUConfig(name="rngd", num_pes=4))


@pytest.mark.parametrize("make_target", [
    lambda: get_target("tiny").replace(num_pes=1),
    lambda: get_target("tiny").fused(2),
    lambda: get_target("rngd").fused(4),
], ids=["tiny-1pe", "tiny-fused", "rngd-fused"])
def test_a_model_compiled_for_a_users_chip_runs_its_kernels_on_it(make_target):
    target = make_target()
    torch.manual_seed(0)
    model, inputs = ZOO["gpt"]()
    cm = fexplore.compile(model, inputs, target=target, precision="fp32")
    low = cm["lower"].stats
    assert low["host_ops"] == 0 and not low.get("codegen_bugs"), low.get("codegen_bugs")
    assert all(f'target="{target.name}"' in k.source for k in cm.kernels if k.source)
    assert cm.schedule.program.target == target
    with torch.no_grad():
        want = model(*inputs)
    torch.testing.assert_close(cm(*inputs), want, rtol=1.3e-6, atol=2e-5)


def test_a_fused_chips_timeline_names_the_pes_each_lane_is():
    torch.manual_seed(0)
    model, inputs = ZOO["mlp"]()
    cm = fexplore.compile(model, inputs, target=get_target("rngd").fused(4), verify=False)
    trace = cm.simulate().timeline.to_perfetto_dict()
    names = [e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"]
    assert "PE 0 (PEs 0-3 fused)" in names and "PE 1 (PEs 4-7 fused)" in names
    json.dumps(trace)


def test_fusion_delivers_a_shared_operand_once_per_fused_pe():
    """A matmul whose every PE needs all of A: on the fused chip A crosses fewer DMA engines."""
    import numpy as np

    from fexplore import lang

    a = np.ones((256, 512), np.float32)
    b = np.ones((512, 2048), np.float32)
    moved = {}
    for name, cfg in (("8 PEs", get_target("rngd")), ("2 fused", get_target("rngd").fused(4))):
        res = lang.examples.matmul.simulate(a, b, target=cfg)
        np.testing.assert_allclose(res.outputs[next(iter(res.outputs))], a @ b, rtol=1e-5)
        moved[name] = res.dram_bytes_read
    assert moved["2 fused"] < moved["8 PEs"]


class _Wide(torch.nn.Module):
    """Two wide projections over 256 rows: every PE of an unfused split reads a whole row tile or
    weight panel, which is what fusion shares."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(256, 1024)
        self.down = torch.nn.Linear(1024, 256)

    def forward(self, x):
        return self.down(torch.relu(self.up(x))) + x


def test_auto_pe_fusion_schedules_every_arrangement_and_keeps_the_fastest():
    from fexplore.pipeline.arrangement import MIN_GAIN

    torch.manual_seed(0)
    model, x = _Wide(), torch.randn(256, 256)
    cm = fexplore.compile(model, (x,), target="rngd", pe_fusion="auto")
    tried = cm["lower"].stats["arrangements"]
    assert list(tried) == ["rngd", "rngd[fused 2]", "rngd[fused 4]"]
    chosen = cm.schedule.program.target.name
    eligible = {k: v for k, v in tried.items() if k == "rngd" or v < (1 - MIN_GAIN) * tried["rngd"]}
    assert chosen == min(eligible, key=eligible.get)
    assert cm.simulate().cycles == tried[chosen]   # the program timed is the program kept
    # what each stage bought is costed on the arrangement chosen, so the last row is the program
    assert cm.costs()["cycles"].iloc[-1] == tried[chosen]
    assert all(f'target="{chosen}"' in k.source for k in cm.kernels)
    with torch.no_grad():
        want = model(x)
    torch.testing.assert_close(cm(x), want, rtol=1.3e-6, atol=2e-5)


def test_auto_times_each_arrangement_as_compiling_for_it_does():
    """What auto times for an arrangement is the program a compile fixed to that arrangement
    schedules (the exhaustive answer), so auto's choice is the rule applied to those programs."""
    from fexplore.pipeline.arrangement import MIN_GAIN

    torch.manual_seed(0)
    model, x = _Wide(), torch.randn(256, 256)
    auto = fexplore.compile(model, (x,), target="rngd", pe_fusion="auto")
    tried = auto["lower"].stats["arrangements"]
    fixed = {}
    for group in (1, 2, 4):
        cm = fexplore.compile(model, (x,), target="rngd", pe_fusion=group)
        fixed[cm.schedule.program.target.name] = cm.simulate().cycles
    assert tried == fixed
    eligible = {k: v for k, v in fixed.items() if k == "rngd" or v < (1 - MIN_GAIN) * fixed["rngd"]}
    assert auto.schedule.program.target.name == min(eligible, key=eligible.get)


def _meta_gpt():
    """A GPT of real width on the meta device: its weights are re-read by every row tile, and
    staging them on chip costs more than it saves."""
    from fexplore.models.gpt import gpt

    model, inputs = gpt(vocab=512, layers=2, width=512, heads=8, seq_len=256, max_seq=256)
    return model.to("meta"), tuple(x.to("meta") for x in inputs)


@pytest.mark.parametrize("name", ["cnn", "vit", "meta gpt"])
def test_staging_re_read_weights_is_kept_only_where_it_is_not_slower(name):
    """Staging copies re-read inputs and weights on chip: less DRAM traffic, but SRAM and DMA time
    of their own. The stage keeps the staged program only if it is not slower."""
    from fexplore.pipeline.stages.schedule import STAGE_MAX_LOSS, build_schedule

    torch.manual_seed(0)
    model, inputs = _meta_gpt() if name == "meta gpt" else ZOO[name]()
    cm = fexplore.compile(model, inputs, target="rngd", precision="bf16", verify=False)
    plain = build_schedule(cm.graph, cm.lowering, "rngd").simulate()
    kept = cm.simulate()
    assert kept.cycles <= plain.cycles * (1 + STAGE_MAX_LOSS)
    said = [why for what, why in cm.schedule.decisions if what == "no staging"]
    if kept.dram_bytes == plain.dram_bytes and said:   # staging was refused: the stage says why
        assert "cycles instead of" in said[0] or "overflows SRAM" in said[0]


@pytest.mark.parametrize("bad", [3, 8, "yes", True, 2.0])
def test_a_pe_fusion_the_chip_cannot_do_is_refused_before_compiling(bad):
    with pytest.raises(ConfigError) as e:
        fexplore.explore(_Wide(), (torch.randn(4, 256),), pe_fusion=bad)
    assert e.value.hint


def test_the_cli_takes_pe_fusion():
    from fexplore.cli import parser

    args = parser().parse_args(["demo", "--pe-fusion", "auto", "--no-report"])
    assert args.pe_fusion == "auto"
    assert parser().parse_args(["demo", "--pe-fusion", "4"]).pe_fusion == 4
    with pytest.raises(SystemExit):
        parser().parse_args(["demo", "--pe-fusion", "many"])


def test_a_fused_chips_name_resolves_in_a_fresh_process():
    """Generated kernels name their target (`@fl.kernel(target="rngd[fused 4]")`), and their
    source pasted into a new session must run: the name of a fusion of a preset resolves there."""
    import subprocess
    import sys

    code = ("from fexplore.npu import get_target\n"
            "t = get_target('rngd[fused 4]')\n"
            "assert t == get_target('rngd').fused(4), t\n"
            "assert get_target('tiny[fused 2]') == get_target('tiny').fused(2)\n"
            "try:\n"
            "    get_target('tiny[fused 4]')\n"
            "except Exception as e:\n"
            "    print(type(e).__name__, getattr(e, 'code', ''))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ConfigError FX100", out.stdout   # tiny fuses at most 2 PEs

"""The ``fexplore`` command: help that explains itself, compile by factory or zoo name, the report
folder, and exit codes that a script can act on."""

import subprocess
import sys
import textwrap

import pytest

from fexplore import cli
from fexplore.pipeline import Stage, StageResult, driver


def test_help_explains_itself():
    out = subprocess.run([sys.executable, "-m", "fexplore.cli", "--help"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0
    for words in ("demo", "compile", "MODULE:FACTORY", "report.html", "verified",
                  "fexplore compile fexplore.models:gpt", "exit status"):
        assert words in out.stdout
    sub = cli.parser()._subparsers._group_actions[0].choices["compile"].format_help()
    assert "--target" in sub and "--out DIR" in sub and "(model, example_inputs)" in sub


def test_compile_a_factory_writes_ir_csv_and_report(tmp_path, monkeypatch, capsys):
    (tmp_path / "mymodels.py").write_text(textwrap.dedent("""
        import torch

        def tiny():
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
            return model, (torch.randn(2, 8),)
    """))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["compile", "mymodels:tiny", "--out", "rep"]) == 0
    out = capsys.readouterr().out
    assert "compiled @forward" in out and "wrote rep/" in out
    files = sorted(p.name for p in (tmp_path / "rep").iterdir())
    assert files[0] == "00_ingest.fx.txt" and "verification.csv" in files and "report.html" in files
    assert len([f for f in files if f.endswith(".fx.txt")]) == len(driver.GRAPH_STAGES) + 1
    assert "<svg" in (tmp_path / "rep" / "report.html").read_text()
    assert str(tmp_path) not in sys.path  # the factory's folder was on sys.path only while loading


def test_a_factory_may_give_keyword_inputs(tmp_path, monkeypatch, capsys):
    (tmp_path / "kwmodels.py").write_text(textwrap.dedent("""
        import torch

        class Gated(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = torch.nn.Linear(8, 8)

            def forward(self, x, *, gate=None):
                y = self.proj(x)
                return y if gate is None else y * gate

        def gated():
            torch.manual_seed(0)
            return Gated().eval(), (torch.randn(2, 8),), {"gate": torch.rand(2, 8)}
    """))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["compile", "kwmodels:gated", "--no-report"]) == 0
    assert "compiled @forward" in capsys.readouterr().out


def test_compile_a_zoo_model_by_name_without_writing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["compile", "mlp", "--no-report"]) == 0
    assert "compiled @forward" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("spec, message", [
    ("nosuchmodel", "expected MODULE:FACTORY or a zoo model name"),
    ("no_such_module_xyz:f", "cannot import no_such_module_xyz"),
    ("fexplore.models:nothing_here", "fexplore.models has no function nothing_here"),
])
def test_usage_errors_exit_2_with_a_hint(spec, message, capsys):
    assert cli.main(["compile", spec, "--no-report"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("error: [FX")


def test_a_stage_failing_verification_exits_1_and_still_writes_the_report(tmp_path, monkeypatch,
                                                                         capsys):
    from fexplore.ir import Graph, Node

    def negate_output(graph: Graph, options) -> StageResult:  # deliberately wrong
        last = graph.nodes[-1]
        neg = Node("neg", [last.output], {}, [last.output.__class__("negated", last.output.type)])
        return StageResult(Graph(graph.name, graph.inputs, graph.constants,
                                 graph.nodes + [neg], neg.outputs, graph.symbols))

    monkeypatch.setattr(driver, "GRAPH_STAGES", [Stage("wrong", negate_output)])
    assert cli.main(["compile", "mlp", "--out", str(tmp_path / "rep")]) == 1
    captured = capsys.readouterr()
    assert "stage 'wrong' changed the model's numbers" in captured.err
    report = (tmp_path / "rep" / "report.html").read_text()
    assert "verification failed: numbers changed" in report


def test_demo(tmp_path, capsys):
    assert cli.main(["demo", "--out", str(tmp_path / "demo")]) == 0
    out = capsys.readouterr().out
    assert "compiling the bundled GPT-style model" in out
    assert "max |compiled - eager|" in out
    assert (tmp_path / "demo" / "report.html").exists()

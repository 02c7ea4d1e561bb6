"""The explorer around the stage views: the pipeline overview, the stepper widget, the compiled
model's view, the HTML report, and progress on long compiles."""

import time
import warnings

import pytest
from viz_cases import compiled_gpt, small_graph

import fexplore
from fexplore.ir import Graph
from fexplore.models import ZOO
from fexplore.pipeline import Exploration, Stage, StageResult
from fexplore.pipeline.options import CompileOptions


@pytest.fixture
def fresh_mlp():
    """A new Exploration of the zoo MLP: nothing run yet (the cheapest real compile)."""
    model, inputs = ZOO["mlp"]()
    return fexplore.explore(model, inputs)


def test_overview_lists_every_stage_with_its_status(fresh_mlp):
    ex = fresh_mlp
    ex.step()
    df = ex.overview()
    assert list(df["stage"]) == ex.stage_names
    assert list(df["status"]) == ["done", "next"] + ["pending"] * (len(ex.stage_names) - 2)
    assert df.loc[0, "nodes_after"] == len(ex.records[0].after.nodes) and df.loc[0, "ok"]
    html = ex._repr_html_()
    assert f"1 of {len(ex.stage_names)} stages run" in html
    assert '<span class="muted">next</span>' in html
    assert "ex.widget()" in html


def test_overview_shows_what_each_stage_changed():
    ex = compiled_gpt()
    df = ex.overview()
    fold = df[df.stage == "fold"].iloc[0]
    assert fold.status == "done" and bool(fold.changed) and fold.nodes_after < fold.nodes_before
    assert "constants_folded" in fold.key_stats  # a stage's own statistics, not the generic ones
    assert "ops_by_category" not in fold.key_stats


def test_step_renders_the_stage_it_ran(fresh_mlp):
    rec = fresh_mlp.step()
    html = rec._repr_html_()
    assert '<span class="fx-name">ingest</span>' in html and "<svg" in html


def test_stepper_steps_switches_views_and_runs_stages_on_demand(fresh_mlp):
    ex = fresh_mlp
    w = ex.widget()
    assert len(ex.records) == 1 and w.current == "ingest"  # opening it ran the first stage
    assert w.prev_button.disabled and not w.next_button.disabled
    assert "<svg" in w.content.value and '<span class="fx-name">ingest</span>' in w.content.value
    w.next_button.click()  # runs the second stage
    assert len(ex.records) == 2 and w.current == ex.stage_names[1]
    assert f'<span class="fx-name">{ex.stage_names[1]}</span>' in w.content.value
    assert w.stage.options[0][0] == "1. ingest ✓" and w.stage.options[-1][0].endswith("(not run)")
    w.view.value = "diff"
    assert "diff" in w.view.value and "fx-summary" in w.content.value
    w.view.value = "IR"
    assert "graph @forward" in w.content.value
    w.view.value = "stats"
    assert "<th>statistic</th>" in w.content.value or "statistic" in w.content.value
    w.view.value = "pipeline"
    assert "▶ <b>" in w.content.value
    w.prev_button.click()
    assert w.current == "ingest" and len(ex.records) == 2
    w.stage.value = ex.stage_names[-1]  # choosing a stage that has not run runs up to it
    assert ex.done and w.current == ex.stage_names[-1] and w.next_button.disabled
    assert w.run_all_button.disabled


def test_stepper_shows_a_failing_stage_instead_of_raising():
    def broken(graph: Graph, options) -> StageResult:
        raise fexplore.errors.FexploreError("this stage always fails", hint="it is a test")

    model, inputs = ZOO["mlp"]()
    ex = Exploration(model, inputs, CompileOptions(verify=False), stages=[Stage("broken", broken)])
    w = ex.widget(view="IR")
    w.next_button.click()
    assert "this stage always fails" in w.content.value
    assert w.current == "ingest"


def test_compiled_model_view_and_report(tmp_path):
    cm = compiled_gpt().result
    html = cm._repr_html_()
    assert "compiled @forward" in html and "<h3>verification</h3>" in html
    assert "fold-constant ×" in html  # what the fold stage did, by rule
    assert "creates the graph" in html
    folder = cm.save(tmp_path / "out")
    report = (tmp_path / "out" / "report.html").read_text()
    assert report.startswith("<!DOCTYPE html>")
    assert report.count("<svg") >= len(cm.stages)  # every stage's graph, inline
    assert 'class="fx-diff"' in report  # and the diffs
    assert "<script" not in report and "http://" not in report.replace(
        "http://www.w3.org", "")  # self-contained: opens offline
    assert (tmp_path / "out" / "verification.csv").exists() and folder.endswith("out")


def test_long_compiles_show_progress(capsys):
    def slow(graph: Graph, options) -> StageResult:
        time.sleep(0.7)  # longer than the bar's delay
        return StageResult(Graph(graph.name, graph.inputs, graph.constants, graph.nodes,
                                 graph.outputs, graph.symbols))

    model, inputs = ZOO["mlp"]()
    ex = Exploration(model, inputs, CompileOptions(verify=False), stages=[Stage("slow", slow)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ex.run_all()
    err = capsys.readouterr().err
    assert "fexplore:" in err and "stage" in err
    ex2 = Exploration(model, inputs, CompileOptions(verify=False), stages=[Stage("slow", slow)])
    ex2.run_all(progress=False)
    assert "fexplore:" not in capsys.readouterr().err


def test_graph_of_a_hand_built_graph_renders_inline():
    assert "<svg" in small_graph()._repr_html_()

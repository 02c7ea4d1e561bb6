"""The diff view and the stage view: highlighted lines, folded runs, the structural summary by rule,
the header's numbers, IR with source lines, statistics as a pandas table."""

import re

from viz_cases import compiled_gpt, node, small_graph, wrap_region

from fexplore.ir import Graph
from fexplore.pipeline.stage import NumericCheck, Rewrite, StageRecord, Verification
from fexplore.viz.diff_view import diff_html, side_by_side, structural_changes
from fexplore.viz.stage_view import ir_html, stage_html, stats_frame


def with_relu_for_gelu(g: Graph) -> Graph:
    """The same graph with its gelu replaced by a relu of the same name (a changed node)."""
    nodes = [node("relu", n.inputs, n.outputs, n.loc) if n.op.name == "gelu" else n
             for n in g.nodes]
    return Graph(g.name, g.inputs, g.constants, nodes, g.outputs, g.symbols)


def record(before, after, *, rewrites=(), ok=True, name="fusion") -> StageRecord:
    check = NumericCheck(1.25e-7 if ok else 0.5, 3.5e-6 if ok else 0.9, ok, 2,
                         "atol 1e-05, rtol 1.3e-06", first_divergent=None if ok else "%act",
                         detail=None if ok else "output 0 differs")
    return StageRecord(name, before, after, {"nodes": len(after.nodes), "fused_regions": 1,
                                             "ops_by_category": {"contraction": 1}},
                       list(rewrites), Verification(True, None, check), 0.0123)


def test_changed_lines_are_highlighted_with_the_changed_characters():
    g = small_graph()
    html = diff_html(g, with_relu_for_gelu(g))
    assert html.count('class="chg-a"') == 1 and html.count('class="chg-b"') == 1
    assert "= <del>gelu</del>(%fc)" in html and "= <ins>relu</ins>(%fc)" in html
    assert "nodes 4 → 4 · 1 changed" in html


def test_unchanged_runs_fold_and_deletions_and_insertions_show_on_their_side():
    a = [f"line {i}" for i in range(40)]
    b = a[:20] + ["new line"] + a[20:30] + a[31:]
    html = side_by_side(a, b, context=3)
    assert "⋯ 17 unchanged lines" in html  # lines 0..16 fold, 17..19 stay as context
    assert "⋯ 4 unchanged lines" in html  # 10 between the insertion and the deletion, 3 + 3 shown
    assert "⋯ 6 unchanged lines" in html  # 9 after the deletion, 3 shown
    assert html.count('class="add"') == 1 and html.count('class="del"') == 1
    assert re.search(r'<td class="ln">31</td><td class="del">line 30</td>', html)
    # a fold opens on a click (no JavaScript): the hidden lines are inside a <details>
    assert "<details><summary>⋯ 17 unchanged lines</summary><pre>line 0\nline 1" in html


def test_structural_summary_counts_fusion_and_lists_rules():
    before = small_graph()
    after = wrap_region(before, ["fc", "act"], kind="epilogue")
    c = structural_changes(before, after)
    assert sorted(c.fused) == ["act", "fc"] and c.regions == ["act"]
    rw = [Rewrite("fuse-epilogue", ("fc", "act"), ("act",))]
    html = diff_html(before, after, rewrites=rw)
    assert "nodes 4 → 3 · 2 fused into 1 region(s)" in html
    assert "<code>fuse-epilogue</code></td><td>1</td><td>2</td><td>1</td>" in html


def test_real_stages_summaries_name_their_rules():
    ex = compiled_gpt()
    fold = next(r for r in ex.records if r.name == "fold")
    html = fold._repr_html_()
    assert "<code>fold-constant</code>" in html
    assert re.search(r"nodes 62 → \d+ · \d+ removed", html)
    assert "diff against the previous stage" in html


def test_stage_header_holds_the_numbers():
    before = small_graph()
    rec = record(before, wrap_region(before, ["fc", "act"]),
                 rewrites=[Rewrite("fuse-epilogue", ("fc", "act"), ("act",))])
    html = stage_html(rec)
    head = re.search(r'<div class="fx-head">(.*?)</div>', html).group(1)
    assert '<span class="fx-name">fusion</span>' in head
    assert "nodes 4 → 3" in head and "12 ms" in head
    assert '<span class="ok">✓</span> max abs 1.2e-07, rel 3.5e-06' in head
    assert "1 rewrite(s)" in head
    for title in ("diff against the previous stage", "graph", "IR text, with source lines",
                  "statistics"):
        assert f"<summary>{title}</summary>" in html
    assert 'class="cluster fx&#45;region"' in html  # the graph section draws the region


def test_failed_verification_is_marked_and_explained():
    g = small_graph()
    html = stage_html(record(g, with_relu_for_gelu(g), ok=False))
    assert '<span class="bad">✗</span> max abs 5.0e-01' in html
    assert "verification failed: numbers changed" in html
    assert "first divergent node: %act" in html


def test_first_stage_and_unchanged_stage():
    g = small_graph()
    first = StageRecord("ingest", None, g, {}, [], None, 1.5)
    html = stage_html(first)
    assert "nodes – → 4" in html and "not verified" in html
    assert "nothing before it to compare with" in html
    same = stage_html(StageRecord("shapes", g, g, {}, [], None, 0.001))
    assert "no change" in same and "the IR text is unchanged" in same


def test_ir_text_shows_source_lines():
    html = ir_html(str(small_graph()))
    # the node at viz_cases.py:21 is followed by that line of viz_cases.py, as a comment
    src = open(__import__("viz_cases").__file__).read().splitlines()[20].strip()
    line = next(x for x in html.splitlines() if "= linear(" in x)
    assert '<span class="fx-src">  # ' in line
    assert src[:15].replace('"', "&quot;") in line


def test_stats_are_a_pandas_table():
    df = stats_frame({"nodes": 5, "fused_regions": 2, "ops_by_category": {"elementwise": 3},
                      "symbols": {"seq": (2, 64)}})
    assert list(df.index) == ["nodes", "fused_regions", "ops_by_category.elementwise", "symbols"]
    assert df.loc["fused_regions", "value"] == 2
    assert df.loc["symbols", "value"] == "{'seq': (2, 64)}"

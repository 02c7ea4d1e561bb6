"""The graph view: colored, labeled nodes with source tooltips, a cluster per fused region,
collapse by module path for big graphs, and a text fallback that says why when ``dot`` is missing."""

import re
import subprocess
import sys

import graphviz
import pytest
from viz_cases import f32, small_graph, wrap_region

from fexplore.errors import SourceLoc
from fexplore.ir import Graph, Node, Value, verify
from fexplore.viz.drawing import choose_depth, draw, module_levels
from fexplore.viz.graph_view import GraphView, graph_html


def big_graph(layers=8, ops=25) -> Graph:
    """layers × ops relu nodes under ``layers.{i}.{attn|mlp}``: over the collapse threshold."""
    x = Value("x", f32(4, 4))
    cur, nodes = x, []
    for i in range(layers):
        for j in range(ops):
            v = Value(f"l{i}_{j}", f32(4, 4))
            part = "attn" if j < ops // 2 else "mlp"
            nodes.append(Node("relu", [cur], {}, [v], SourceLoc(__file__, 10 + j,
                                                                   f"layers.{i}.{part}")))
            cur = v
    g = Graph("big", [x], [], nodes, [cur])
    verify(g)
    return g


def test_nodes_are_colored_by_category_and_labeled_with_op_and_type():
    svg = GraphView(small_graph()).svg()
    assert svg.startswith("<svg")
    assert 'class="node fx&#45;op cat&#45;contraction"' in svg  # linear
    assert 'class="node fx&#45;op cat&#45;elementwise"' in svg  # gelu, add, relu
    assert "#f7c6c0" in svg  # the contraction color
    assert ">linear<" in svg and "f32[2, 8]" in svg
    assert "+ weight, bias" in svg  # the parameters an op reads are part of its label
    assert ">%x<" in svg and ">%out<" in svg  # graph input and output


def test_edges_carry_sizes_and_tooltips_carry_the_source_line():
    svg = GraphView(small_graph()).svg()
    assert ">64 B<" in svg  # f32[2, 8]
    # the tooltip: IR line, module path and the user's source line (this repo's viz_cases.py)
    tips = re.findall(r'xlink:title="([^"]*)"', svg)
    linear = next(t for t in tips if "= linear(" in t)
    assert "tests/viz_cases.py:21 in block.mlp.fc" in linear or "viz_cases.py:21 in block.mlp.fc" in linear
    assert "import warnings" not in linear
    src = open(__import__("viz_cases").__file__).read().splitlines()[20].strip()
    assert src.replace('"', "&quot;")[:20] in linear


def test_a_cluster_per_region_holding_the_fused_ops():
    g = wrap_region(small_graph(), ["fc", "act"], kind="epilogue")
    g = wrap_region(g, ["res", "out"], kind="elementwise")
    svg = GraphView(g).svg()
    assert svg.count('class="cluster fx&#45;region"') == 2
    assert "region epilogue @epilogue_fc (2 ops)" in svg
    assert "region elementwise @elementwise_res (2 ops)" in svg
    # the fused ops are still drawn, inside their clusters, and wired through the region boundary
    d = draw(g)
    regions = [c for c in d.root.clusters if c.kind == "region"]
    inside = [[d.boxes[b].title for b in c.boxes] for c in regions]
    assert inside == [["linear", "gelu"], ["add", "relu"]]
    titles = {bid: b.title for bid, b in d.boxes.items()}
    wires = {(titles[e.src], titles[e.dst]) for e in d.edges}
    assert {("%x", "linear"), ("gelu", "add"), ("%x", "add"), ("relu", "%out")} <= wires


def test_nested_regions_and_cond_branches_are_clusters_too():
    inner = wrap_region(small_graph(), ["fc", "act"])
    outer = wrap_region(inner, [inner.nodes[0].name, "res"], kind="block")
    d = draw(outer)
    (block,) = d.root.clusters
    assert block.kind == "region" and [c.kind for c in block.clusters] == ["region"]
    assert GraphView(outer).svg().count('class="cluster fx&#45;region"') == 2


def test_repr_html_of_a_graph_and_of_a_real_stage():
    from viz_cases import compiled_gpt

    ex = compiled_gpt()
    html = ex.records[-1].after._repr_html_()
    assert "<svg" in html and "graph @forward" in html
    assert "fexplore/models/gpt.py:" in html  # tooltips point at the model's source
    assert "collapsed" not in html  # 50-odd ops: shown whole


def test_module_levels_keep_indices_with_their_container():
    assert module_levels("layers.0.attn.q_proj") == ["layers.0", "layers.0.attn",
                                                     "layers.0.attn.q_proj"]
    assert module_levels("blocks.1.0.conv") == ["blocks.1.0", "blocks.1.0.conv"]
    assert module_levels(None) == []


def test_big_graphs_collapse_by_module_path():
    g = big_graph()
    assert sum(1 for _ in g.walk()) == 200
    assert choose_depth(g.nodes) == 2  # 16 boxes (layers.i.attn / .mlp); depth 1 would give 8
    view = g.view()
    d = view.drawing
    assert d.collapsed and d.depth == 2
    groups = [b for b in d.boxes.values() if b.kind == "group"]
    assert len(groups) == 16 and groups[0].title == "layers.0.attn" and sum(groups[0].ops.values()) == 12
    html = view._repr_html_()
    assert "collapsed by module path into 16 boxes" in html
    assert 'expand=&quot;layers.0.attn&quot;' in html  # how to open a part
    assert html.count('class="node fx&#45;group"') == 16


def test_expand_opens_one_part_and_folds_the_rest():
    g = big_graph()
    d = g.view(expand="layers.3").drawing
    (opened,) = [c for c in d.root.clusters if c.kind == "module"]
    assert opened.label == "layers.3" and len(opened.boxes) == 25
    groups = sorted(b.title for b in d.boxes.values() if b.kind == "group")
    assert groups == [f"layers.{i}" for i in range(8) if i != 3]
    # still one chain: x -> 3 groups -> 25 opened ops -> 4 groups -> output
    assert len(d.edges) == (1 + 2 + 1) + 24 + (1 + 3 + 1)
    svg = g.view(expand="layers.3").svg()
    assert 'class="cluster fx&#45;module"' in svg


def test_small_graphs_stay_whole_unless_asked():
    g = small_graph()
    assert not draw(g).collapsed
    d = draw(g, collapse=True, depth=1)
    assert [b.title for b in d.boxes.values() if b.kind == "group"] == ["block"]
    assert draw(big_graph(), collapse=False).collapsed is False


def test_without_dot_the_view_says_so_and_shows_text(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty PATH: no `dot` to run
    with pytest.raises(graphviz.ExecutableNotFound):
        GraphView(small_graph()).svg()
    html = graph_html(wrap_region(small_graph(), ["fc", "act"]))
    assert "<svg" not in html
    assert "graphviz&#x27;s <code>dot</code> program was not found" in html or \
        "<code>dot</code> program was not found" in html
    assert "apt-get install graphviz" in html
    # the text shows the same drawing: the region as a block, each op with its source
    assert "region fused @fused_fc (2 ops) {" in html
    assert "%fc = linear(%x, %block.mlp.fc.weight, %block.mlp.fc.bias) : f32[2, 8]" in html
    assert "viz_cases.py:21 in block.mlp.fc" in html


def test_collapsed_text_fallback_lists_groups(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    text = big_graph().view().text()
    assert "[layers.0.attn] 12 ops: relu×12" in text
    assert text.splitlines()[0] == "graph @big (200 ops, collapsed by module path at depth 2)"


def test_headless_use_imports_no_rendering_library():
    code = ("import sys, warnings; warnings.simplefilter('ignore'); import fexplore;"
            "from fexplore.models import ZOO; m, i = ZOO['mlp']();"
            "cm = fexplore.compile(m, i); repr(cm); cm.summary(); cm.verification;"
            "bad = [k for k in ('ipywidgets', 'matplotlib', 'graphviz', 'fexplore.viz.graph_view')"
            " if k in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_source_lines_with_backslashes_and_markup_do_not_break_the_picture(tmp_path):
    src = tmp_path / "model.py"
    # a line continuation: the tooltip then ends in a backslash, right before DOT's closing quote
    src.write_text('y = torch.relu(x) + 0 * "<b>not html</b>" + \\\n    x\n')
    x, y = Value("x", f32(3)), Value("y", f32(3))
    g = Graph("g", [x], [], [Node("relu", [x], {}, [y], SourceLoc(str(src), 1, "m"))], [y])
    svg = GraphView(g).svg()  # dot accepted it: the backslash did not swallow the quote
    tip = next(t for t in re.findall(r'xlink:title="([^"]*)"', svg) if "relu(%x)" in t)
    assert tip.endswith("\\") and "&lt;b&gt;not html&lt;/b&gt;" in tip


def test_a_fused_op_still_shows_the_parameters_it_reads():
    g = wrap_region(small_graph(), ["fc", "act"])
    (linear,) = [b for b in draw(g).boxes.values() if b.title == "linear"]
    assert linear.lines[-1] == "+ weight, bias"  # region inputs bound to the model's parameters

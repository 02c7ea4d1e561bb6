"""Rendering only: every view of the explorer, as HTML a notebook, a browser or a report shows.

Objects elsewhere define ``_repr_html_`` and import from here lazily, so headless use (scripts, the
CLI without a report, tests of the compiler) never imports graphviz, ipywidgets or matplotlib.

    page.py              the shared stylesheet, escaping, small formatters
    drawing.py           what a graph view draws: boxes, region clusters, collapse by module path
    graph_view.py        that drawing as graphviz SVG, or as text when ``dot`` is missing
    diff_view.py         a stage's structural summary and side-by-side IR diff
    stage_view.py        one stage: header, diff, graph, IR with source lines, statistics
    exploration_view.py  the pipeline overview of an Exploration
    stepper.py           the ipywidgets stepper (``ex.widget()``)
    compiled_view.py     the compiled model: verification, stage timings, what changed
    report.py            the self-contained HTML report ``CompiledModel.save`` writes
    timeline.py          timelines as matplotlib Gantt charts
"""

"""nbval settings for the tutorials.

nbval compares every stored output with a fresh run. The plain-text forms (reprs, prints,
DataFrames) are compared, through the sanitizers in nbval_sanitize.cfg. The HTML forms are not:
they embed graphviz SVG (coordinates move with the graphviz version) and wall times deep inside
tables, and every view's HTML is checked by tests/test_viz_*.py instead. Widget state is skipped
by nbval itself (its model ids are random).
"""


def pytest_collectstart(collector):
    if collector.fspath and collector.fspath.ext == ".ipynb":
        collector.skip_compare += ("text/html", "image/svg+xml")

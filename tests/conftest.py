import warnings

import pytest

# torch.export's own deprecation chatter (pytree LeafSpec) is not ours to fix.
warnings.filterwarnings("ignore", category=FutureWarning, module="copyreg")


@pytest.fixture(scope="session")
def zoo_compiled():
    """Each zoo model compiled once for the whole session: (model, inputs, CompiledModel)."""
    import fexplore
    from fexplore.models import ZOO

    cache = {}

    def get(name):
        if name not in cache:
            model, inputs = ZOO[name]()
            cache[name] = (model, inputs, fexplore.compile(model, inputs))
        return cache[name]

    return get


@pytest.fixture
def without_simplify_rule(monkeypatch):
    """``drop(name)``: the compiles after it run simplify without that rule (what the rule buys,
    or a case its rewrite would change)."""
    import importlib

    stage = importlib.import_module("fexplore.pipeline.stages.simplify")   # not the stage function

    def drop(name):
        monkeypatch.setattr(stage, "RULES", [r for r in stage.RULES if r[0] != name])

    return drop


@pytest.fixture
def softmax_generator_raises(monkeypatch):
    """The kernel generator raises on any node holding a softmax (a codegen bug): the lower stage
    then runs that node on the host."""
    from fexplore.lang import codegen

    real = codegen.generate

    def broken(node, target, **kw):
        ops = {n.op.name for n in node.regions[0].nodes} if node.regions else {node.op.name}
        if "softmax" in ops:
            raise AttributeError("'int' object has no attribute 'astype'")
        return real(node, target, **kw)

    monkeypatch.setattr(codegen, "generate", broken)


def pytest_configure(config):
    # Under pytest-xdist each worker is a process of its own: one intra-op thread each, so the
    # workers share the cores instead of oversubscribing them.
    import os

    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)

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

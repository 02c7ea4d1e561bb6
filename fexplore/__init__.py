"""fexplore: a Jupyter-first explorer over an NPU compiler front end.

    cm = fexplore.compile(model, example_inputs)      # headless
    ex = fexplore.explore(model, example_inputs)      # step through it in a notebook
"""

from . import errors
from .pipeline import (CompiledModel, Exploration, compile, explore, register_kernel, register_op,
                       unregister_kernels)

__version__ = "0.1.0"
__all__ = ["CompiledModel", "Exploration", "compile", "errors", "explore", "load_ipython_extension",
           "register_kernel", "register_op", "unregister_kernels"]


def load_ipython_extension(ipython):
    """``%load_ext fexplore``: registers the ``%%furiosa_kernel`` cell magic."""
    from .lang.magic import load_ipython_extension as _load

    _load(ipython)

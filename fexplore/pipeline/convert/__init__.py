"""ATen -> fexplore converters. Importing this package fills the registry."""

from . import control, elementwise, movement, nn, reduction  # noqa: F401
from . import out_of_scope  # noqa: F401  (last: it never shadows a real converter)
from .registry import CONVERTERS, ConvertContext, converter, ir_dtype, torch_dtype

__all__ = ["CONVERTERS", "ConvertContext", "converter", "ir_dtype", "torch_dtype"]

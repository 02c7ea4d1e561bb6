"""ATen -> fexplore converters. Importing this package fills the registry."""

from . import complex, control, elementwise, flex_attention, movement, nn, reduction  # noqa: F401
from . import out_of_scope  # noqa: F401  (last: it never shadows a real converter)
from .registry import (COMPLEX_CONVERTERS, CONVERTERS, ConvertContext, complex_converter, converter,
                       fake_type, ir_dtype, is_complex, torch_dtype)

__all__ = ["CONVERTERS", "COMPLEX_CONVERTERS", "ConvertContext", "converter", "complex_converter",
           "fake_type", "ir_dtype", "is_complex", "torch_dtype"]

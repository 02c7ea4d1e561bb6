"""The built-in opset. Importing this package registers every OpDef (see ``fexplore.ir.opset``)."""

from . import elementwise, movement, nn, reduction, regions  # noqa: F401

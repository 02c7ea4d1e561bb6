"""The built-in opset. Importing this package registers every OpDef (see ``fexplore.ir.opset``)."""

from . import elementwise, movement, nn, ordering, reduction, regions, scatter  # noqa: F401

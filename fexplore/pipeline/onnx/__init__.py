"""The ONNX front door: ONNX models into the same IR the torch door builds.

``fexplore.compile(model_proto_or_path, numpy_inputs)`` ingests through here; converters are
registered by ``(domain, op type, opset range)`` with ``onnx_converter``. Importing this
package fills the registry.
"""

from . import (attention, contrib, control, einsum, elementwise, group_query_attention, loss, ml,  # noqa: F401
               movement, nn, recurrent, quant, reduction, resize, sampling, spectral)  # noqa: F401
from . import out_of_scope  # noqa: F401,E402  (last: it never shadows a real converter)
from .importer import (OnnxIngested, OnnxModelError, check_frozen, graph_inputs, ingest_onnx,
                       is_onnx_model, load_model)
from .registry import (ONNX_CONVERTERS, OnnxContext, OnnxConversionError, lookup,
                       onnx_converter)

__all__ = ["ONNX_CONVERTERS", "OnnxContext", "OnnxConversionError", "OnnxIngested",
           "OnnxModelError", "check_frozen", "graph_inputs", "ingest_onnx", "is_onnx_model",
           "load_model", "lookup", "onnx_converter"]

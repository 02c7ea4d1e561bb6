"""The graph stages, in DESIGN.md's order. Each is a function ``(graph, options) -> StageResult``
that builds a new graph (never edits its input) and is idempotent."""

from ..stage import Stage
from .fold import fold
from .fusion import fusion
from .layout import layout
from .lower import lower, register_kernel, unregister_kernels
from .precision import precision
from .schedule import schedule
from .shapes import shapes, specialize, specialize_buckets
from .simplify import simplify

# `reads`: the options each stage's result depends on (`Stage.reads`)
GRAPH_STAGE_LIST = [
    Stage("fold", fold, "constant folding through the interpreter; conv + batch norm folding; "
                        "projections of one input into attention merged",
          reads=frozenset({"fold_limit_bytes"})),
    Stage("simplify", simplify, "canonicalization rules, CSE, DCE", reads=frozenset()),
    Stage("shapes", shapes, "shape inference to a fixed point, symbolic dims simplified",
          reads=frozenset()),
    Stage("layout", layout, "NPU layouts (channels-last, tiled weights), relayouts sunk and "
                            "cancelled", reads=frozenset({"target"})),
    Stage("fusion", fusion, "fused regions: attention, contraction + epilogue, norms, "
                            "elementwise chains; split to fit SRAM", reads=frozenset({"target"})),
    Stage("precision", precision, "the cast policy (fp32, bf16, fp8 with f32 accumulation)",
          reads=frozenset({"precision"})),
    Stage("lower", lower, "every region and op a kernel-language kernel (generated or the "
                          "user's), a free view or an explicit host op",
          reads=frozenset({"target", "pe_fusion"})),
    Stage("schedule", schedule, "one NPU program: kernels interleaved by one list scheduler "
                                "(weights prefetched, independent kernels overlapped)",
          uses_lowering=True, reads=frozenset({"buckets", "pad_value"})),   # its chip: the lowering's
]

__all__ = ["GRAPH_STAGE_LIST", "register_kernel", "unregister_kernels", "specialize", "specialize_buckets"]

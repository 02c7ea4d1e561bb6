"""Ingestion from torch.export, the stages, the pass manager, compile/explore orchestration."""

from .compiled import CompiledModel
from .custom_ops import register_op
from .driver import GRAPH_STAGES, Exploration, compile, explore
from .options import CompileOptions
from .stage import Rewrite, Stage, StageRecord, StageResult
from .stages import register_kernel, unregister_kernels

__all__ = ["CompiledModel", "CompileOptions", "Exploration", "GRAPH_STAGES", "Rewrite", "Stage",
           "StageRecord", "StageResult", "compile", "explore", "register_kernel", "register_op",
           "unregister_kernels"]

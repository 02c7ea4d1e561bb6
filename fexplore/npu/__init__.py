"""The simulated NPU: chip configs, the command set, programs, the simulator, timelines.

    from fexplore.npu import ProgramBuilder, get_target
    b = ProgramBuilder(get_target("tiny"))
    ...                      # alloc / load / contract / vector / store
    res = b.build().simulate(inputs)
    res.cycles, res.utilization, res.roofline.ratio, res.timeline.to_perfetto("trace.json")

Headless: nothing here imports matplotlib or pandas until a view or a table is asked for.
"""

from fexplore.npu.builder import ProgramBuilder
from fexplore.npu.commands import (ENGINES, Buffer, BufferView, Command, Contract, DramRef, DramTensor, Gather, Load,
                                   Scatter, Stage, Store, Sync, Transpose, Vector)
from fexplore.npu.config import PRESETS, NPUConfig, get_target
from fexplore.npu.errors import HazardError, IndexOutOfRangeError, ProgramError, SRAMOverflowError
from fexplore.npu.program import Program
from fexplore.npu.result import Roofline, SimResult
from fexplore.npu.simulator import simulate
from fexplore.npu.timeline import Timeline, TimelineEvent
from fexplore.npu.vector_ops import VECTOR_OPS

__all__ = [
    "NPUConfig", "get_target", "PRESETS",
    "ProgramBuilder", "Program", "simulate", "SimResult", "Roofline", "Timeline", "TimelineEvent",
    "Buffer", "BufferView", "DramTensor", "DramRef", "Command", "Load", "Stage", "Store", "Contract", "Vector", "Sync",
    "Gather", "Scatter", "Transpose", "IndexOutOfRangeError",
    "ENGINES", "VECTOR_OPS", "HazardError", "ProgramError", "SRAMOverflowError",
]

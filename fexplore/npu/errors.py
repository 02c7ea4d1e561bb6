"""Errors the NPU layer can raise at a user.

Codes FX5xx belong to the NPU (programs, memory, simulation). Each derives from
``fexplore.errors.FexploreError``, so it carries a stable code, a message in the user's terms, the
source location of the command (model op or kernel line) that caused it, and a hint.
Invalid chip configs raise the shared ``fexplore.errors.ConfigError`` (FX100).
"""

from __future__ import annotations

from fexplore.errors import ErrorDoc, FexploreError


class SRAMOverflowError(FexploreError):
    """The buffers live on one PE at some point of the program do not fit in its SRAM."""

    code = "FX500"
    doc = ErrorDoc(
        when="A command program built with fexplore.npu.ProgramBuilder keeps more buffers live on "
             "one PE at some point than its SRAM holds (the message lists the live buffers, the "
             "capacity and the line of the allocation).",
        example='b = ProgramBuilder("tiny")            # 64 KiB per PE\n'
                'bufs = [b.alloc(f"x{i}", (96, 64), "f32") for i in range(3)]   # 24 KiB each\n'
                '...   # all three live at once\n'
                'b.build()',
        fix="Use smaller tiles, free (stop using) a buffer before allocating the next, spread "
            "the work over more PEs, or target a chip with more SRAM.")


class ProgramError(FexploreError):
    """A command program is malformed: wrong PE, shape or dtype mismatch, unknown op, bad einsum."""

    code = "FX501"
    doc = ErrorDoc(
        when="A command given to fexplore.npu.ProgramBuilder does not fit: DMA between boxes of "
             "different shapes or dtypes, operands on different PEs, an einsum that does not "
             "match its buffers, an unknown vector op, a PE the target does not have, a handle "
             "from another program.",
        example='b = ProgramBuilder("tiny")\n'
                'b.vector(b.alloc("o", (8, 8), "f32"), "softplus", b.alloc("a", (8, 8), "f32"))',
        fix="The message names the command and what did not fit; the hint lists what is "
            "allowed (vector ops, PEs, dtypes).")


class IndexOutOfRangeError(FexploreError):
    """A gather or scatter met an index value outside its DRAM box when it ran (functional mode)."""

    code = "FX502"
    doc = ErrorDoc(
        when="A gather or scatter met an index value outside its DRAM box while a program ran on "
             "the simulator in functional mode (an embedding lookup with a token id past the "
             "vocabulary, say).",
        example="tr = embed.trace(table, np.array([1, 10]), target=\"tiny\")   # table has 10 rows\n"
                "tr.simulate({\"table\": table, \"ids\": np.array([1, 10])})",
        fix="Check the index data: every index must be in [-n, n) for a box of n rows (torch "
            "raises on the same input).")


class HazardError(FexploreError):
    """A simulated run broke program order: two commands touching the same memory overlapped in
    time, or two live buffers shared SRAM addresses (`racecheck`): a dependency is missing."""

    code = "FX503"
    doc = ErrorDoc(
        when="A functional run on the simulator found two commands touching the same memory "
             "overlapping in time, or two live buffers sharing SRAM addresses: the program misses "
             "a dependency (a compiler bug in the schedule or the SRAM plan, or a hand-built "
             "program with a missing wait).",
        example="prog = b.build()                   # load a; exp a -> e; store e\n"
                "vec = prog.commands[1]\n"
                "vec.deps = ()                       # the exp no longer waits for the load\n"
                "Program(prog.name, prog.target, list(prog.commands), list(prog.buffers),\n"
                "        prog.tensors, prog.allocation).simulate(inputs)",
        fix="Let the builder infer dependencies (omit deps=) or add the missing one; for a "
            "compiled model, report it: the schedule stage's check names the command pair.")


class SimulationMemoryError(FexploreError):
    """A functional run on the simulator needs more memory than the machine has: the program's
    DRAM tensors (inputs, weights, every intermediate) are numpy arrays of their full size."""

    code = "FX504"
    doc = ErrorDoc(
        when="A program run on the simulator in functional mode (cm(x), cm.simulate(x), "
             "trace.simulate(inputs)) needs more memory than the machine has: its DRAM is numpy "
             "arrays of every tensor's full size (inputs, weights, intermediates), and the run's "
             "hazard check tracks each element some command writes while it is alive. The "
             "program is not known to be wrong; it could not be run here.",
        example="cm = fexplore.compile(big_image_model, (x,), verify=False)\n"
                "cm(x)   # 24 layers of 180 channels at full resolution",
        fix="Run a smaller input (a shorter sequence, a smaller image) or a smaller "
            "configuration of the model; cm.simulate() without inputs times the program "
            "without computing its values.")


class CompileMemoryError(FexploreError):
    """A compile stage needs more memory than the machine has: lowering traces every kernel of the
    model and scheduling builds the whole NPU program, each a Python object per tile operation."""

    code = "FX505"
    doc = ErrorDoc(
        when="A stage of the compile itself (not its check) runs out of memory. The stages after "
             "precision hold the whole model's kernels op by op: `lower` traces each kernel at its "
             "tile sizes and `schedule` builds one NPU program of every command, so a large model "
             "on a chip of small SRAM (many small tiles) can need more than the machine has. A "
             "program past fexplore.pipeline.stages.schedule.MAX_PROGRAM_OPS operations (its "
             "kernels' traces, counted after lowering) is refused before it is built, with the "
             "kernels that make the most named. The model is not known to be wrong; the "
             "Exploration stays at the stage before.",
        example="ex = fexplore.explore(vit_large, (image,), target=\"tiny\")\n"
                "ex[\"schedule\"]   # 24 layers of 1024 channels in tiles of 64 KiB",
        fix="Compile a smaller configuration of the model (fewer layers, a smaller input), or for "
            "a chip with more SRAM per PE (target=\"rngd\"), whose bigger tiles make fewer ops.")

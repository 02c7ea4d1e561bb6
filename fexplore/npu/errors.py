"""Errors the NPU layer can raise at a user.

Codes FX5xx belong to the NPU (programs, memory, simulation). Each derives from
``fexplore.errors.FexploreError``, so it carries a stable code, a message in the user's terms, the
source location of the command (model op or kernel line) that caused it, and a hint.
Invalid chip configs raise the shared ``fexplore.errors.ConfigError`` (FX100).
"""

from __future__ import annotations

from fexplore.errors import FexploreError


class SRAMOverflowError(FexploreError):
    """The buffers live on one PE at some point of the program do not fit in its SRAM."""

    code = "FX500"


class ProgramError(FexploreError):
    """A command program is malformed: wrong PE, shape or dtype mismatch, unknown op, bad einsum."""

    code = "FX501"


class IndexOutOfRangeError(FexploreError):
    """A gather or scatter met an index value outside its DRAM box when it ran (functional mode)."""

    code = "FX502"


class HazardError(FexploreError):
    """A simulated run broke program order: two commands touching the same memory overlapped in
    time, or two live buffers shared SRAM addresses (`racecheck`): a dependency is missing."""

    code = "FX503"

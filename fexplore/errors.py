"""Every error a user can cause.

Each carries a stable ``code`` (documented, greppable, never renumbered), a message in the user's
terms, the user's source location where one exists, and a hint saying how to fix it. ``str(err)``
is the whole story, so a notebook or a terminal shows it without a traceback into fexplore.
"""

from __future__ import annotations

import linecache
from dataclasses import dataclass


@dataclass(frozen=True)
class SourceLoc:
    """Where a thing came from in the user's code: ``file:line`` and, for model ops, the module path
    (``model.layers.0.attn.q_proj``)."""

    file: str | None = None
    line: int | None = None
    module: str | None = None

    def __str__(self) -> str:
        parts = []
        if self.file:
            parts.append(f"{self.file}:{self.line}" if self.line else self.file)
        if self.module:
            parts.append(f"in {self.module}")
        return " ".join(parts) if parts else "<unknown location>"

    def source_line(self) -> str | None:
        """The text of the user's line, when the file is readable."""
        if not self.file or not self.line:
            return None
        text = linecache.getline(self.file, self.line)
        return text.strip() or None


class FexploreError(Exception):
    """Base of every user-facing error."""

    code = "FX000"

    def __init__(self, message: str, *, loc: SourceLoc | None = None, hint: str | None = None,
                 detail: str | None = None):
        self.message = message
        self.loc = loc
        self.hint = hint
        self.detail = detail
        super().__init__(self._render())

    def _render(self) -> str:
        lines = [f"[{self.code}] {self.message}", *self._facts()]
        where = self._where()
        if where:
            lines.append(f"  at {where}")
            src = self.loc.source_line()
            if src:
                lines.append(f"    {src}")
        if self.detail:
            lines.append(self.detail)
        if self.hint:
            lines.append(f"  hint: {self.hint}")
        lines.extend(self._epilogue())
        return "\n".join(lines)

    # Subclasses add lines without re-writing the layout (the kernel language's errors say what
    # was expected and given, and end with a fixed example).
    def _facts(self) -> list[str]:
        return []

    def _where(self) -> str | None:
        if self.loc is not None and (self.loc.file or self.loc.module):
            return str(self.loc)
        return None

    def _epilogue(self) -> list[str]:
        return []


class ConfigError(FexploreError):
    """A target/chip configuration or an option value is invalid."""

    code = "FX100"


class ParseError(FexploreError):
    """IR text could not be parsed; carries line and column."""

    code = "FX200"

    def __init__(self, message: str, *, line: int, column: int, text: str | None = None,
                 hint: str | None = None):
        self.line = line
        self.column = column
        detail = None
        if text is not None:
            lines = text.splitlines()
            if 1 <= line <= len(lines):
                detail = f"  {line:4d} | {lines[line - 1]}\n       | {' ' * (column - 1)}^"
        super().__init__(f"{message} (line {line}, column {column})", hint=hint, detail=detail)


class VerificationError(FexploreError):
    """The IR broke an invariant (structural), or a stage changed the numbers (numeric)."""

    code = "FX300"


class NumericMismatchError(VerificationError):
    code = "FX301"


class UnsupportedOperatorError(FexploreError):
    """The model uses an op fexplore has no converter for, or one it cannot compile as used
    (``reason`` says why: a result whose size depends on the data, a complex operand...)."""

    code = "FX400"

    def __init__(self, op: str, *, loc: SourceLoc | None = None, hint: str | None = None,
                 reason: str | None = None):
        self.op = op
        self.reason = reason
        msg = f"unsupported operator {op}" + (f": {reason}" if reason else "")
        super().__init__(msg, loc=loc, hint=hint)


class ExportError(FexploreError):
    """torch.export could not capture the model."""

    code = "FX401"


class InputError(FexploreError):
    """Inputs given to a compiled model do not match what it was compiled for."""

    code = "FX402"

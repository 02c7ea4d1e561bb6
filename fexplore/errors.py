"""Every error a user can cause.

Each carries a stable ``code`` (documented, greppable, never renumbered), a message in the user's
terms, the user's source location where one exists, and a hint saying how to fix it. ``str(err)``
is the whole story, so a notebook or a terminal shows it without a traceback into fexplore.

Each error class also documents itself in its ``doc`` (an `ErrorDoc`: when it happens, an
example, the fix); ``fexplore.error_catalog`` gathers those into ``docs/errors.md``.
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


@dataclass(frozen=True)
class ErrorDoc:
    """An error's catalog entry, kept on its class so the two cannot drift apart.

    ``when``: what the user did that raises it; ``example``: a short snippet (Python or IR text)
    that raises it; ``fix``: what to do instead."""

    when: str
    example: str
    fix: str


class FexploreError(Exception):
    """Base of every user-facing error. Used as such for misuse of the API itself."""

    code = "FX000"
    doc = ErrorDoc(
        when="The API is used the wrong way: something other than a torch.nn.Module is compiled, "
             "an Exploration is stepped past its last stage, or the CLI is given a spec it "
             "cannot resolve.",
        example="fexplore.compile(lambda x: x * 2, (torch.randn(4),))",
        fix="Pass the model object itself (an nn.Module); read the hint, which names the call "
            "that was meant.")

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


class RegistrationError(FexploreError, TypeError):
    """``fexplore.register_op`` or ``fexplore.register_kernel`` was given something it cannot
    register. Also a TypeError, as a wrong argument type is."""

    code = "FX001"
    doc = ErrorDoc(
        when="fexplore.register_op is given something other than a torch.library custom op, or "
             "an op with an argument kind the IR cannot hold as an attribute; "
             "fexplore.register_kernel is given a match that is neither a region kind, an op "
             "name nor a predicate, or a kernel that is not callable.",
        example="fexplore.register_op(torch.sin)        # a function, not a torch.ops custom op\n"
                "fexplore.register_kernel(3, my_kernel)  # 3 names no region or op",
        fix="register_op(torch.ops.mylib.myop) after defining it with torch.library.custom_op; "
            "register_kernel(\"attention\" | \"gelu\" | lambda node: ..., an fl.kernel).")


class ConfigError(FexploreError):
    """A target/chip configuration or an option value is invalid."""

    code = "FX100"
    doc = ErrorDoc(
        when="A chip config field is out of range or unknown, a target name is unknown, or a "
             "compile option (precision, verify, buckets, pad_safe, random_input_sets) has a bad "
             "value. Raised before anything is compiled.",
        example='fexplore.compile(model, inputs, precision="fp4")\n'
                'get_target("rngd").replace(num_pes=0)',
        fix="Use a value the hint lists: targets from fexplore.npu.get_target's presets, "
            "precision one of fp32/bf16/fp8, positive sizes in configs and buckets.")


class ParseError(FexploreError):
    """IR text could not be parsed; carries line and column."""

    code = "FX200"
    doc = ErrorDoc(
        when="fexplore.ir.parse was given text that is not IR as the printer writes it: a "
             "syntax error, an unknown dtype or op, an undeclared symbol, a value used before "
             "it is defined, or hostile input (too large, nested too deep, numbers or shapes "
             "beyond any tensor, control characters). The message ends with the line and "
             "column, and shows the line with a caret.",
        example='fexplore.ir.parse("graph @f(%x: f33[2]) {\\n  return %x\\n}")',
        fix="Parse text written by str(graph) or a saved *.fx.txt file; fix the text at the "
            "line and column shown.")

    def __init__(self, message: str, *, line: int, column: int, text: str | None = None,
                 hint: str | None = None):
        self.line = line
        self.column = column
        detail = None
        if text is not None:
            lines = text.splitlines()
            if 1 <= line <= len(lines):
                shown, at = _window(lines[line - 1], column - 1)
                shown = shown.translate(_UNPRINTABLE)   # never echo a terminal escape back
                detail = f"  {line:4d} | {shown}\n       | {' ' * at}^"
        super().__init__(f"{message} (line {line}, column {column})", hint=hint, detail=detail)


# control characters shown as one replacement character each, so the caret stays aligned
_UNPRINTABLE = {c: "\ufffd" for c in [*range(0x00, 0x09), *range(0x0b, 0x20), 0x7f]}


def _window(text: str, at: int, width: int = 60) -> tuple[str, int]:
    """A long line cut to ``width`` characters either side of ``at`` (IR text can hold a line of
    any length); returns the shown text and where ``at`` falls in it."""
    if len(text) <= 2 * width + 20:
        return text, at
    start = max(0, at - width)
    shown = ("..." if start else "") + text[start:at + width] + ("..." if at + width < len(text) else "")
    return shown, at - start + (3 if start else 0)


class VerificationError(FexploreError):
    """The IR broke an invariant (structural), or a stage changed the numbers (numeric)."""

    code = "FX300"
    doc = ErrorDoc(
        when="A graph breaks an invariant of the IR: a use before its definition, a stored type "
             "the op's type rule does not give, a missing or unknown attribute, an undeclared "
             "symbol. Raised by fexplore.ir.verify, and by a compile whose stage produced such "
             "a graph.",
        example='g = fexplore.ir.parse(text_where_a_permute_claims_the_wrong_shape)\n'
                'fexplore.ir.verify(g)',
        fix="The message shows a window of IR around the bad node and its source line; correct "
            "that node (for a hand-built graph) or report the stage that produced it.")


class NumericMismatchError(VerificationError):
    """A stage's program computes different numbers from the model (or the lowered program
    different numbers from the stage's IR)."""

    code = "FX301"
    doc = ErrorDoc(
        when="A stage's output program computes different numbers from PyTorch eager on the "
             "example inputs (or fresh random ones), beyond the dtype's tolerance; or a lowered "
             "program run the chip way differs. Most often a custom op registered with a wrong "
             "numpy reference, or a user kernel that computes something else.",
        example="fexplore.register_op(torch.ops.mylib.scaled_tanh,\n"
                "                     reference=lambda x, s: np.tanh(x))   # forgets the scale\n"
                "fexplore.compile(UsesScaledTanh(), (x,))",
        fix="fexplore.explore(model, inputs) and look at the named stage's diff and first "
            "divergent node; fix the reference or the kernel. compile(..., verify=False) skips "
            "the check.")


class VerificationMemoryError(VerificationError):
    """A stage's check could not run: it needs more memory than there is. Nothing is known to
    be wrong with the program; it is not checked."""

    code = "FX303"
    doc = ErrorDoc(
        when="A stage's check runs out of memory: it runs the stage's program in numpy (the IR "
             "interpreter, each kernel, the scheduled program) on the example inputs and on "
             "random input sets, and a real-sized model can hold a tensor too large for the "
             "machine (a mixture of experts that gathers each token's expert weights). The "
             "program is not known to be wrong; it could not be checked.",
        example="fexplore.compile(full_size_moe, inputs)   # gathers 128 experts' 2048x1024 weights",
        fix="Verify a smaller configuration of the same architecture (fewer layers or experts, a "
            "shorter sequence) or fewer random input sets (random_input_sets=0); "
            "compile(..., verify=False) skips the checks.")


class UnsupportedOperatorError(FexploreError):
    """The model uses an op fexplore has no converter for, or one it cannot compile as used
    (``reason`` says why: a result whose size depends on the data, a complex operand...)."""

    code = "FX400"
    doc = ErrorDoc(
        when="The model uses an op fexplore has no converter for (an FFT, a custom op not yet "
             "registered), or one it cannot compile as used: a result whose size depends on the "
             "data (nonzero, x[mask], unique), a complex operand. The error names the op, the "
             "user's source line and module path.",
        example="class M(torch.nn.Module):\n"
                "    def forward(self, x):\n"
                "        return torch.nonzero(x)",
        fix="Write the computation densely (torch.where(mask, x, 0) instead of x[mask]); for "
            "a custom op, fexplore.register_op(torch.ops.ns.op, reference=...).")

    def __init__(self, op: str, *, loc: SourceLoc | None = None, hint: str | None = None,
                 reason: str | None = None):
        self.op = op
        self.reason = reason
        msg = f"unsupported operator {op}" + (f": {reason}" if reason else "")
        super().__init__(msg, loc=loc, hint=hint)


class ExportError(FexploreError):
    """torch.export could not capture the model."""

    code = "FX401"
    doc = ErrorDoc(
        when="torch.export cannot capture the model: the model raises on its example inputs, "
             "takes or returns something other than tensors, updates a buffer that has no value "
             "(a model on the meta device), or a dynamic-shape range is one the model does not "
             "support. Or it captures a program that, run by torch itself, computes different "
             "numbers from the model (an op whose decomposition differs from its eager kernel), "
             "while ingest agrees with that program op by op.",
        example="class M(torch.nn.Module):\n"
                "    def forward(self, x):\n"
                "        return x @ torch.ones(3, 3)   # x is (2, 4): the model itself fails",
        fix="Make the model run on the example inputs in eager first; torch's own message (in "
            "the error) names the failing guard or call.")


class InputError(FexploreError):
    """Inputs given to a compiled model do not match what it was compiled for."""

    code = "FX402"
    doc = ErrorDoc(
        when="A CompiledModel (or the IR interpreter) is called with inputs that do not match "
             "what it was compiled for: a different count or nesting structure, a different "
             "shape, rank or dtype, a symbolic dim outside its range, or meta tensors.",
        example="cm = fexplore.compile(model, (torch.randn(2, 8),))\n"
                "cm(torch.randn(3, 8))",
        fix="Call it with inputs like the example inputs; compile with dynamic_shapes= for sizes "
            "that vary.")


class ControlFlowError(ExportError):
    """The model's Python control flow depends on a tensor's values, which a traced program
    cannot hold (an ``if`` on a tensor, a loop count from ``.item()``)."""

    code = "FX404"
    doc = ErrorDoc(
        when="forward makes a Python decision from a tensor's value: `if x.sum() > 0:`, "
             "`range(int(x.max()))`, `x.item()` used as a size. torch.export traces one path "
             "for every input, so it cannot decide such a branch. The error points at the line.",
        example="class M(torch.nn.Module):\n"
                "    def forward(self, x):\n"
                "        if x.sum() > 0:\n"
                "            return x * 2\n"
                "        return x - 1",
        fix="Compute both sides and choose elementwise with torch.where(cond, a, b), or use "
            "torch.cond(pred, true_fn, false_fn, (x,)) for a real branch; loop counts must be "
            "Python ints or shapes, not tensor values.")

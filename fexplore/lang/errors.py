"""The kernel language's error catalog: every mistake a kernel author can make, caught at trace time.

Each error has a stable code (FK1xx, never renumbered), says what was expected and what was given,
points at the author's own line (file and line; for a ``%%furiosa_kernel`` cell, the cell's line as
the notebook shows it), and ends with a fixed example of the right way. ``str(err)`` is the whole
story; in IPython ``_render_traceback_`` shows just that, not a traceback into fexplore.

    code   class                    caught when
    FK100  KernelDefinitionError    a parameter annotation or the kernel's signature is malformed
    FK101  ArgumentError            call arguments do not match the declared parameters
    FK110  ShapeError               shapes do not fit (elementwise broadcast, DMA box vs tile, out=)
    FK111  ContractionError         an einsum spec does not fit its operands
    FK112  AxisError                named axes disagree, or a named axis does not exist
    FK120  DTypeError               dtypes do not fit (contraction operands, DMA, masks, tensor unit)
    FK130  MemorySpaceError         a value is in the wrong memory space (DRAM / SRAM / ACC) or PE
    FK140  OutOfBoundsError         a DRAM tile slice leaves its tensor, or is not a unit-stride box;
                                    or (when the kernel runs) a gather/scatter index leaves its box
    FK150  UninitializedReadError   a tile (or DRAM region) is read before anything was written to it
    FK160  SRAMOverflowError        the tiles live at some point do not fit a PE's SRAM on the target
    FK170  TraceError               trace-time misuse: value-dependent Python control flow, a builtin
                                    outside a kernel, a tile from another trace, bad loop bounds
    FK180  OutputError              an output is never (or only partly) stored, or not returned
"""

from __future__ import annotations

from fexplore.errors import FexploreError, SourceLoc
from fexplore.npu.errors import SRAMOverflowError as _NPUSRAMOverflowError

CELL_PREFIX = "<furiosa_kernel cell "   # filenames the cell magic compiles its cells under


def describe_loc(loc: SourceLoc | None) -> str | None:
    """`file:line`, or for a magic cell the line as the notebook numbers it."""
    if loc is None or not loc.file:
        return None
    if loc.file.startswith(CELL_PREFIX):
        cell = loc.file[len(CELL_PREFIX):].rstrip(">")
        return f"line {loc.line} of %%furiosa_kernel cell {cell}"
    return f"{loc.file}:{loc.line}"


class KernelError(FexploreError):
    """Base of the kernel language's errors."""

    code = "FK100"
    example = ""   # the fixed example shown under every error of this kind

    def __init__(self, message: str, *, expected: str | None = None, given: str | None = None,
                 loc: SourceLoc | None = None, hint: str | None = None, detail: str | None = None):
        self.expected = expected
        self.given = given
        super().__init__(message, loc=loc, hint=hint, detail=detail)

    @property
    def line(self) -> int | None:
        return self.loc.line if self.loc is not None else None

    def _facts(self) -> list[str]:
        lines = []
        if self.expected is not None:
            lines.append(f"  expected: {self.expected}")
        if self.given is not None:
            lines.append(f"  given:    {self.given}")
        return lines

    def _where(self) -> str | None:
        return describe_loc(self.loc)

    def _epilogue(self) -> list[str]:
        if not self.example:
            return []
        return ["  example:", *(f"    {ln}" for ln in self.example.splitlines())]

    def _render_traceback_(self) -> list[str]:
        # IPython shows these lines instead of a traceback: the author's line, not fexplore's.
        first, *rest = str(self).splitlines()
        return [f"{type(self).__name__}: {first}", *rest]


class KernelDefinitionError(KernelError):
    code = "FK100"
    example = ("@fl.kernel\n"
               "def matmul(a: fl.bf16['M', 'K'], b: fl.bf16['K', 'N'], *, tile: int = 128): ...")


class ArgumentError(KernelError):
    code = "FK101"
    example = ("# matmul(a: fl.f32['M', 'K'], b: fl.f32['K', 'N']): both K must agree\n"
               "matmul(np.ones((64, 32), np.float32), np.ones((32, 16), np.float32))")


class ShapeError(KernelError):
    code = "FK110"
    example = ("y = x - x.max(axis='N')            # (64, 128) - (64, 1) broadcasts\n"
               "fl.store(Y[rows, :], y)            # the tile's shape equals the box's")


class ContractionError(KernelError):
    code = "FK111"
    example = ("c = fl.contract('mk,kn->mn', a, b)   # a: (M, K) tile, b: (K, N) tile\n"
               "c = fl.contract('sd,td->st', q, k)   # q @ k.T: the spec transposes, no copy")


class AxisError(KernelError):
    code = "FK112"
    example = ("s = fl.contract('sd,td->st', q, k)   # letters bind to the tiles' named axes\n"
               "m = s.max(axis='T')                  # reduce a named axis the tile has")


class DTypeError(KernelError):
    code = "FK120"
    example = ("p = fl.exp(s - m, dtype=fl.bf16)     # produce the dtype you need ...\n"
               "fl.store(C[ms, ns], acc.astype(C.dtype))   # ... or cast before a DMA")


class MemorySpaceError(KernelError):
    code = "FK130"
    example = ("a = fl.load(A[ms, ks])               # DRAM -> SRAM first\n"
               "acc = fl.contract('mk,kn->mn', a, b, acc=acc)   # SRAM x SRAM -> accumulator")


class OutOfBoundsError(KernelError):
    code = "FK140"
    example = ("for ms in fl.tiles(M, 128):          # slices that stay inside [0, M)\n"
               "    x = fl.load(X[ms, :])")


class UninitializedReadError(KernelError):
    code = "FK150"
    example = ("t = fl.empty((128, 64), fl.f32)\n"
               "fl.load(X[0:128, 0:64], into=t)      # write it before reading it\n"
               "y = fl.exp(t)")


class SRAMOverflowError(KernelError, _NPUSRAMOverflowError):
    """Also an ``fexplore.npu.SRAMOverflowError``, so code catching the chip's error catches this."""

    code = "FK160"
    example = ("tm, tn, tk = 64, 64, 64              # smaller tiles, or fewer stages\n"
               "for ks in fl.range(fl.tiles(K, tk), stages=2): ...")


class TraceError(KernelError):
    code = "FK170"
    example = ("y = fl.where(x > 0, x, 0.0)          # data-dependent choice: where, not `if`\n"
               "for ks in fl.range(fl.tiles(K, 128)):   # loop bounds are Python ints")


class OutputError(KernelError):
    code = "FK180"
    example = ("C = fl.output(fl.f32['M', 'N'])\n"
               "for ms in fl.tiles(M, 128):\n"
               "    fl.store(C[ms, :], ...)          # cover every element\n"
               "return C")


CATALOG: dict[str, type[KernelError]] = {cls.code: cls for cls in (
    KernelDefinitionError, ArgumentError, ShapeError, ContractionError, AxisError, DTypeError,
    MemorySpaceError, OutOfBoundsError, UninitializedReadError, SRAMOverflowError, TraceError,
    OutputError)}


def catalog_table() -> list[tuple[str, str, str]]:
    """(code, class name, first line of its docstring or summary) for every error, for docs."""
    summary: dict[str, str] = {}
    code = None
    for line in __doc__.splitlines():
        words = line.split()
        if words and words[0].startswith("FK"):
            code = words[0]
            summary[code] = " ".join(words[2:])
        elif code and line.startswith(" " * 36) and words:   # a wrapped summary line
            summary[code] += " " + " ".join(words)
        else:
            code = None
    return [(code, cls.__name__, summary.get(code, "")) for code, cls in CATALOG.items()]

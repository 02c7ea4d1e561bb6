"""`GeneratedKernel`: kernel-language source made from one IR node, and how to run it.

The source is ordinary ``fl`` code (it pastes into a ``%%furiosa_kernel`` cell as is). What the
source cannot say by itself is how the node's operands become the kernel's parameters: a kernel
parameter is one of the node's inputs seen through a free DRAM view (a reshape of the row-major
array: leading axes merged, size-1 axes dropped), and a scalar constant of the region is written into
the source as a literal instead. `Param` and `Result` record that mapping, so `run` takes the
node's own inputs and gives the node's own outputs.
"""

from __future__ import annotations

import hashlib
import linecache
from dataclasses import dataclass

import numpy as np

from fexplore.npu import NPUConfig



@dataclass(frozen=True)
class Param:
    """Kernel parameter `name` is node input `index` viewed with `shape` (a free reshape)."""

    name: str
    index: int
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Result:
    """Kernel output number `position` is node output `index`, whose own shape is `shape`."""

    index: int
    shape: tuple[int, ...]


@dataclass(frozen=True)
class GeneratedKernel:
    name: str                 # the kernel function's name in the source
    kind: str                 # the generator that made it: "vector", "contraction"
    source: str               # kernel-language Python, with the region's module path and line
    target: NPUConfig
    params: tuple[Param, ...]
    results: tuple[Result, ...]
    parts: tuple[str, ...] = ()   # what the kernel was composed of, e.g. ("norm", "contraction", "epilogue")
    # (node output, node input): the output starts as the input (`fl.output(init=)`, a scatter's
    # table), so a program where nothing reads the input after this kernel may give the output
    # the input's bytes (the schedule's `_updates_in_place`), and the kernel copies nothing
    initial: tuple[tuple[int, int], ...] = ()

    def kernel(self):
        """The traced `fexplore.lang.Kernel`: the source executed with ``fl`` bound, as the cell
        magic would (the source is registered with linecache, so errors show its lines)."""
        from fexplore import lang

        # named by content, so compiling the same model again reuses the entry: a counter here
        # grew linecache by every kernel of every compile, for the life of the process
        digest = hashlib.blake2b(self.source.encode(), digest_size=6).hexdigest()
        filename = f"<generated kernel {self.name} {digest}>"
        linecache.cache[filename] = (len(self.source), None, self.source.splitlines(True), filename)
        ns: dict = {"fl": lang, "__name__": f"fexplore_generated_{self.name}"}
        exec(compile(self.source, filename, "exec", dont_inherit=True), ns)  # noqa: S102 - our own source
        k = ns[self.name]
        if not isinstance(k, lang.Kernel):
            raise TypeError(f"generated source defines {self.name!r} but not as an fl.kernel")
        return k

    def arguments(self, inputs) -> list[np.ndarray]:
        """The kernel's arguments from the node's inputs (free views; literals dropped)."""
        arrays = [np.asarray(x) for x in inputs]
        return [arrays[p.index].reshape(p.shape) for p in self.params]

    def run(self, inputs, kernel=None) -> list[np.ndarray]:
        """Run the kernel in the kernel-language interpreter on the node's inputs; return the
        node's outputs (in the node's shapes)."""
        k = kernel or self.kernel()
        got = k(*self.arguments(inputs), target=self.target)
        got = got if isinstance(got, tuple) else (got,)
        out: list = [None] * (max(r.index for r in self.results) + 1)
        for r, y in zip(self.results, got):
            out[r.index] = np.asarray(y).reshape(r.shape)
        return out

    def __repr__(self) -> str:
        return (f"<GeneratedKernel {self.name} ({self.kind}: {' + '.join(self.parts)}) on {self.target.name}, "
                f"{len(self.source.splitlines())} lines>")

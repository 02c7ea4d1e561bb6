"""``%%furiosa_kernel``: write kernels in a notebook cell, check them, see their timeline.

    %load_ext fexplore

    %%furiosa_kernel --target tiny --shapes M=64,K=48,N=32 --ref ref_matmul --timeline
    def matmul(a: fl.f32["M", "K"], b: fl.f32["K", "N"]):
        ...

The cell runs in the notebook's namespace, where the extension has put the language as ``fl``
(unless that name is taken). Every top-level function of the cell with tensor-spec parameters
becomes a `fexplore.lang.Kernel` under its name (others stay plain helpers). Options:

    --target NAME       the kernels' default target (rngd, tiny)
    --kernel NAME       which kernel of the cell to run (default: the last one)
    --shapes M=64,K=48  run it on random inputs (seeded) with these axis sizes ...
    --inputs a,b        ... or on these notebook variables
    --static tm=32      static (non-tensor) arguments, Python literals
    --ref EXPR          a function of the inputs giving the expected output: compare
    --seed N            the random inputs' seed (default 0)
    --timeline          show the simulated timeline
    --no-sim            run the interpreter only

Errors name the cell's own lines (numbered as the notebook shows them, the ``%%`` line being 1),
and show no traceback into fexplore.
"""

from __future__ import annotations

import argparse
import ast
import itertools
import linecache
import shlex

import numpy as np

from fexplore import lang
from fexplore.errors import ErrorDoc, NumericMismatchError
from fexplore.lang.errors import CELL_PREFIX
from fexplore.lang.kernel import Kernel
from fexplore.npu import get_target

_CELLS = itertools.count(1)


class ReferenceMismatchError(NumericMismatchError):
    """A kernel run by the magic disagrees with its reference (or the simulator with the interpreter)."""

    code = "FX302"
    doc = ErrorDoc(
        when="A %%furiosa_kernel cell (or `fexplore kernel FILE.py`) ran the kernel and its output "
             "differs from the reference given with --ref, or the simulator's outputs differ from "
             "the interpreter's.",
        example="%%furiosa_kernel --ref np.exp\n"
                "@fl.kernel\n"
                "def k(x: fl.f32['M', 'N']):   # computes exp(x) + 1\n"
                "    ...",
        fix="Compare the kernel's math with the reference (the message gives the largest "
            "difference and where); a simulator/interpreter disagreement means a DMA or "
            "pipelining hazard in the kernel.")

    def _render_traceback_(self) -> list[str]:
        first, *rest = str(self).splitlines()
        return [f"{type(self).__name__}: {first}", *rest]


def load_ipython_extension(ipython) -> None:
    from IPython.core.magic import Magics, cell_magic, magics_class

    @magics_class
    class KernelMagics(Magics):
        @cell_magic
        def furiosa_kernel(self, line, cell):
            return run_cell(self.shell, line, cell)

    ipython.register_magics(KernelMagics)
    ipython.user_ns.setdefault("fl", lang)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="%%furiosa_kernel", add_help=False)
    p.add_argument("--target", default=None)
    p.add_argument("--kernel", default=None)
    p.add_argument("--shapes", default=None)
    p.add_argument("--inputs", default=None)
    p.add_argument("--static", default=None)
    p.add_argument("--ref", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeline", action="store_true")
    p.add_argument("--no-sim", dest="sim", action="store_false")
    return p


def run_cell(shell, line: str, cell: str):
    from IPython.core.error import UsageError

    try:
        opts = _parser().parse_args(shlex.split(line))
    except SystemExit:
        raise UsageError(f"%%furiosa_kernel: bad options {line!r}; see fexplore.lang.magic's docstring") from None
    ns = shell.user_ns
    filename = f"{CELL_PREFIX}{next(_CELLS)}>"
    source = "\n" + cell   # line 1 is the %%furiosa_kernel line, as the notebook numbers it
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    tree = ast.parse(source, filename)
    defined = [node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))] + \
        [t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)]
    # the notebook's own __future__ flags, not this module's (which would turn annotations to strings)
    flags = getattr(getattr(shell, "compile", None), "flags", 0)
    exec(compile(tree, filename, "exec", flags=flags, dont_inherit=True), ns)

    kernels = {}
    for name in dict.fromkeys(defined):
        value = ns.get(name)
        if isinstance(value, Kernel):
            k = value
        elif callable(value) and getattr(getattr(value, "__code__", None), "co_filename", None) == filename:
            k = Kernel(value)
            if not k.tensor_params:
                continue   # a plain helper function
        else:
            continue
        if opts.target:
            k.target = get_target(opts.target)
        ns[name] = kernels[name] = k
    if not kernels:
        raise UsageError("%%furiosa_kernel: the cell defines no kernel (a function whose parameters are "
                         "annotated with tensor specs, e.g. a: fl.f32['M', 'K'])")
    if opts.shapes is None and opts.inputs is None:
        for k in kernels.values():
            print(f"kernel {k._signature_text()} on {k.target.name}")
        return None

    name = opts.kernel or list(kernels)[-1]
    if name not in kernels:
        raise UsageError(f"%%furiosa_kernel: --kernel {name!r}; the cell defines {', '.join(kernels)}")
    k = kernels[name]
    inputs = _inputs(k, opts, ns)
    static = _static(opts.static)
    _check(k, inputs, static, opts, ns)
    return None


def _inputs(k: Kernel, opts, ns) -> list:
    from IPython.core.error import UsageError

    if opts.inputs is not None:
        names = [n.strip() for n in opts.inputs.split(",") if n.strip()]
        missing = [n for n in names if n not in ns]
        if missing:
            raise UsageError(f"%%furiosa_kernel --inputs: no variable(s) {', '.join(missing)} in the notebook")
        return [ns[n] for n in names]
    sizes = {}
    for part in opts.shapes.split(","):
        key, _, value = part.partition("=")
        if not value.strip().isdigit():
            raise UsageError(f"%%furiosa_kernel --shapes: {part!r} is not AXIS=SIZE")
        sizes[key.strip()] = int(value)
    rng = np.random.default_rng(opts.seed)
    out = []
    for pname, sp in k.tensor_params.items():
        try:
            shape = sp.resolve(sizes)
        except KeyError as e:
            raise UsageError(f"%%furiosa_kernel --shapes: no size for axis {e.args[0]} of {pname}: {sp}") from None
        dtype = (sp.dtype or lang.f32).numpy
        out.append(rng.standard_normal(shape).astype(dtype))
    return out


def _static(text: str | None) -> dict:
    if not text:
        return {}
    out = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        out[key.strip()] = ast.literal_eval(value.strip())
    return out


def _tolerance(dtype) -> tuple[float, float]:
    return (2e-2, 2e-2) if np.dtype(dtype).itemsize <= 2 else (1e-4, 1e-5)


def _check(k: Kernel, inputs: list, static: dict, opts, ns) -> None:
    target = opts.target or k.target
    shapes = ", ".join(f"{n}{list(np.shape(x))}" for n, x in zip(k.tensor_params, inputs))
    print(f"{k.name} on {get_target(target).name}: {shapes}")
    got = k(*inputs, target=target, **static)
    got_t = got if isinstance(got, tuple) else (got,)
    if opts.ref:
        ref = eval(opts.ref, ns)(*inputs)  # noqa: S307 - the notebook's own expression
        ref_t = ref if isinstance(ref, tuple) else (ref,)
        for y, r in zip(got_t, ref_t):
            y64, r64 = np.asarray(y, np.float64), np.asarray(r, np.float64)
            err = float(np.abs(y64 - r64).max()) if y64.size else 0.0
            rtol, atol = _tolerance(np.asarray(y).dtype)
            ok = y64.shape == r64.shape and np.allclose(y64, r64, rtol=rtol, atol=atol)
            print(f"  interpreter vs {opts.ref}: max abs error {err:.1e} "
                  f"({'ok' if ok else 'MISMATCH'}, rtol {rtol:g})")
            if not ok:
                raise ReferenceMismatchError(f"{k.name}: the interpreter's output differs from {opts.ref} "
                                             f"(max abs error {err:.3g}, shapes {y64.shape} vs {r64.shape})",
                                             hint="compare the kernel's math with the reference's on "
                                                  "these inputs: call the kernel and the reference and "
                                                  "look where they differ")
    if not opts.sim:
        return
    res = k.simulate(*inputs, target=target, **static)
    sim_t = k.last_trace.unpack(res.outputs)
    sim_t = sim_t if isinstance(sim_t, tuple) else (sim_t,)
    same = all(np.array_equal(np.asarray(a, np.float64), np.asarray(b, np.float64), equal_nan=True)
               for a, b in zip(sim_t, got_t))
    if not same:
        raise ReferenceMismatchError(f"{k.name}: the simulator's outputs differ from the interpreter's",
                                     hint="a DMA or pipelining hazard: a tile read before its load is "
                                          "waited on, or overwritten while still in use; try stages=1")
    util = ", ".join(f"{e} {u:.0%}" for e, u in res.utilization.items())
    peak = max(k.last_trace.plan.peak, default=0)
    print(f"  simulator: same outputs as the interpreter; {res.cycles:,} cycles "
          f"({res.latency_s * 1e6:,.2f} us), busy {util}; SRAM peak {peak:,} B per PE")
    if opts.timeline:
        from IPython.display import display

        from fexplore.lang.view import timeline_image

        display(timeline_image(res.timeline))

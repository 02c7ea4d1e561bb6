"""The ``fexplore`` command: ``fexplore demo``, ``fexplore compile MODULE:FACTORY`` and
``fexplore kernel FILE.py``.

Both compile headless through every stage, verifying each, print a summary, and write a report
folder: the IR text of every stage, ``verification.csv`` and ``report.html`` (every view on one
self-contained page that opens offline).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings

from fexplore.errors import FexploreError

DEFAULT_OUT = "fexplore-report"

DESCRIPTION = """\
Compile PyTorch models through fexplore's NPU compiler front end, headless.

A model goes through the pipeline's stages (ingest from torch.export, then the graph stages:
constant folding, simplification, and whichever later stages this version has). Every stage is
verified twice: the IR's structure, and its numbers against PyTorch eager on the example inputs.
The report folder holds the IR text of every stage, verification.csv, and report.html: the
explorer's views (diffs, graphs, statistics) on one page that opens offline in a browser.

In a notebook, the same compile can be stepped through:
    ex = fexplore.explore(model, example_inputs); ex.widget()
"""

EPILOG = """\
examples:
  fexplore demo                                  compile the bundled GPT-style model
  fexplore compile fexplore.models:gpt           a factory returning (model, example_inputs),
                                                 or (model, example_inputs, example_kwargs)
  fexplore compile llama --target tiny           a model of the bundled zoo, by name
  fexplore compile mypkg.nets:build --out build/fx --precision bf16
  fexplore kernel kernels.py                     list the kernels a file defines
  fexplore kernel kernels.py --kernel matmul --shapes M=256,K=128,N=64 --ref ref_matmul

exit status: 0 compiled and verified; 1 a stage failed verification (the report shows which);
2 a usage error (bad factory, unknown target, unsupported operator, ...).
"""


def _quiet_torch():
    # torch.export's internal deprecation chatter is not the user's business on a terminal.
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)


def _load_factory(spec: str):
    """``MODULE:FACTORY``, or the name of a zoo model (``gpt``, ``llama``, ...)."""
    if ":" not in spec:
        from fexplore.models import ZOO

        if spec in ZOO:
            return ZOO[spec]
        raise FexploreError(f"expected MODULE:FACTORY or a zoo model name, got {spec!r}",
                            hint=f"e.g. fexplore compile fexplore.models:gpt; zoo models: "
                                 f"{', '.join(ZOO)}")
    mod, fn = spec.split(":", 1)
    sys.path.insert(0, os.getcwd())  # as `python -m` does: the user's own modules import
    try:
        module = importlib.import_module(mod)
    except ImportError as e:
        raise FexploreError(f"cannot import {mod}: {e}",
                            hint="run from the folder that holds the module, or install it") from None
    finally:
        sys.path.remove(os.getcwd())
    factory = getattr(module, fn, None)
    if factory is None or not callable(factory):
        raise FexploreError(f"{mod} has no function {fn}",
                            hint="FACTORY is a function returning (model, example_inputs)")
    return factory


def _build(factory):
    """(model, example_inputs, example_kwargs) from a factory that returns the first two, or all
    three (keyword inputs, for a model called by keyword)."""
    made = factory()
    if isinstance(made, tuple) and len(made) == 2:
        return made + ({},)
    if isinstance(made, tuple) and len(made) == 3 and isinstance(made[2], dict):
        return made
    raise FexploreError(f"the factory returned {type(made).__name__}, not "
                        "(model, example_inputs) or (model, example_inputs, example_kwargs)")


def compile_and_report(model, inputs, args, kwargs=None):
    """Compile, print the summary, write the report folder. A stage that fails verification still
    gets its report written: that is when a person most needs to look. Returns (status, model).
    ``kwargs``: the model's keyword inputs."""
    import fexplore
    from fexplore.pipeline import CompiledModel

    ex = fexplore.explore(model, inputs, example_kwargs=kwargs, target=args.target, precision=args.precision,
                          verify=not args.no_verify, pe_fusion=args.pe_fusion)
    ex.run_all()
    status = 0
    try:
        cm = ex.result
    except FexploreError as e:
        print(f"error: {e}", file=sys.stderr)
        cm = CompiledModel(ex.records, ex._ingested, ex.options)  # for the report only
        status = 1
    print(cm.summary())
    if status == 0 and getattr(args, "simulate", True) and cm.schedule is not None:
        print_simulation(cm)
    if args.out:
        folder = cm.save(args.out)
        trace = ", trace.json (open in ui.perfetto.dev)" if cm.schedule is not None else ""
        print(f"\nwrote {folder}/: the IR of {len(cm.stages)} stages, verification.csv, report.csv"
              f"{trace} and report.html (open {os.path.join(folder, 'report.html')} in a browser)")
    return status, cm


def print_simulation(cm, top: int = 5) -> None:
    """The simulated latency on the target and the kernels where the time goes."""
    res = cm.simulate()
    rl = res.roofline
    print(f"\nsimulated on {cm.schedule.target.name}: {res.latency_s * 1e6:,.1f} us "
          f"({res.cycles:,} cycles), {res.cycles / rl.bound_cycles:.1f}x the roofline bound "
          f"({rl.limiter}); DRAM {res.dram_bytes / 1e6:.2f} MB")
    df = cm.report().sort_values("cycles", ascending=False).head(top)
    print(f"{'kernel':<40}{'kind':<13}{'us':>9}{'share':>8}  bound")
    for r in df.itertuples():
        print(f"{r.kernel[:39]:<40}{r.kind:<13}{r.cycles / cm.schedule.target.clock_hz * 1e6:>9.1f}"
              f"{r.share:>8.0%}  {r.bound}")


def cmd_demo(args) -> int:
    from fexplore.models import ZOO

    model, inputs = ZOO["gpt"]()
    print("fexplore demo: compiling the bundled GPT-style model "
          f"({sum(p.numel() for p in model.parameters()):,} parameters, "
          f"input {tuple(inputs[0].shape)})\n")
    status, cm = compile_and_report(model, inputs, args)
    if status == 0:
        import torch

        with torch.no_grad():
            err = float((cm(*inputs) - model(*inputs)).abs().max())
        print(f"running the compiled model on the example input: max |compiled - eager| = {err:.2e}")
    return status


def cmd_compile(args) -> int:
    if args.factory.endswith(".onnx"):
        from fexplore.pipeline.onnx.cli_inputs import example_inputs

        inputs = example_inputs(args.factory, args.input_shapes or [], seed=args.seed)
        return compile_and_report(args.factory, inputs, args)[0]
    if args.input_shapes:
        raise FexploreError("--input-shapes is for ONNX models (a .onnx file)",
                            hint="a factory returns its own example inputs")
    model, inputs, kwargs = _build(_load_factory(args.factory))
    return compile_and_report(model, inputs, args, kwargs)[0]


def cmd_kernel(args) -> int:
    """Check, run and simulate a kernel defined in a Python file, as the cell magic does."""
    import runpy

    from fexplore import lang
    from fexplore.lang import magic
    from fexplore.lang.kernel import Kernel

    if not os.path.exists(args.file):
        raise FexploreError(f"no file {args.file}")
    ns = runpy.run_path(args.file, init_globals={"fl": lang}, run_name="__fexplore_kernel__")
    path = os.path.abspath(args.file)
    kernels = {}
    for name, value in ns.items():
        if isinstance(value, Kernel):
            kernels[name] = value
        elif callable(value) and getattr(getattr(value, "__code__", None), "co_filename",
                                         None) == path:
            k = Kernel(value)
            if k.tensor_params:
                kernels[name] = k
    if not kernels:
        raise FexploreError(f"{args.file} defines no kernel",
                            hint="a kernel is a function whose parameters are annotated with "
                                 "tensor specs, e.g. a: fl.f32['M', 'K']")
    if args.shapes is None:
        for k in kernels.values():
            print(f"kernel {k._signature_text()}")
        return 0
    name = args.kernel or list(kernels)[-1]
    if name not in kernels:
        raise FexploreError(f"--kernel {name!r}: {args.file} defines {', '.join(kernels)}")
    k = kernels[name]
    opts = argparse.Namespace(shapes=args.shapes, inputs=None, seed=args.seed, ref=args.ref,
                              target=args.target, sim=not args.no_sim, timeline=False)
    from IPython.core.error import UsageError

    try:
        inputs = magic._inputs(k, opts, ns)
    except UsageError as e:
        raise FexploreError(str(e).replace("%%furiosa_kernel ", "")) from None
    static = magic._static(args.static)
    try:
        magic._check(k, inputs, static, opts, ns)
    except magic.ReferenceMismatchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.trace and not args.no_sim:
        res = k.simulate(*inputs, target=args.target, **static)
        res.timeline.to_perfetto(args.trace)
        print(f"  wrote the timeline to {args.trace} (Perfetto's UI or chrome://tracing opens it)")
    return 0


def _pe_fusion(text: str):
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: 1, 2, 4 or auto") from None


def _common(p: argparse.ArgumentParser, out_help: str) -> None:
    p.add_argument("--target", default="rngd", help="NPU preset: rngd (default) or tiny")
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "fp8"),
                   help="compute precision (default fp32)")
    p.add_argument("--pe-fusion", default=1, type=_pe_fusion, metavar="{1,2,4,auto}",
                   help="fuse the chip's PEs in groups of 2 or 4, or let the cost model pick "
                        "('auto'); default 1, the chip's own PEs")
    p.add_argument("--out", default=DEFAULT_OUT, metavar="DIR", help=out_help)
    p.add_argument("--no-report", dest="out", action="store_const", const=None,
                   help="print the summary only; write nothing")
    p.add_argument("--no-verify", action="store_true",
                   help="skip the structural and numeric checks after each stage")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fexplore", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    d = sub.add_parser("demo", help="compile the bundled GPT-style model, print a summary and "
                                    "write a report",
                       description="Compile the bundled GPT-style model on the default target, "
                                   "print a summary, write a report, and run the compiled model.")
    _common(d, f"report folder (default {DEFAULT_OUT})")
    d.set_defaults(func=cmd_demo)
    c = sub.add_parser("compile", help="compile MODULE:FACTORY (or a zoo model name) and write "
                                       "the IR of every stage, a verification CSV and an HTML "
                                       "report",
                       description="Compile the model that FACTORY returns. FACTORY is a function "
                                   "taking no arguments and returning (model, example_inputs), "
                                   "or (model, example_inputs, example_kwargs) for keyword inputs; "
                                   "a bare name (gpt, llama, cnn, mlp, vit, vla) picks a model "
                                   "of the bundled zoo. A path to a .onnx file compiles that ONNX "
                                   "model on seeded random inputs of the --input-shapes given.")
    c.add_argument("factory", metavar="MODULE:FACTORY",
                   help="e.g. fexplore.models:gpt, or gpt, or model.onnx")
    c.add_argument("--input-shapes", nargs="*", metavar="NAME=2x16",
                   help="for a .onnx model: each input's shape, by name (input_ids=1x16) or in "
                        "the graph's input order (1x16); inputs with static shapes may be left out")
    c.add_argument("--seed", type=int, default=0, help="seed of the random ONNX inputs")
    c.add_argument("--simulate", action="store_true",
                   help="print the simulated latency on the target and the top kernels")
    _common(c, f"report folder (default {DEFAULT_OUT})")
    c.set_defaults(func=cmd_compile)
    k = sub.add_parser("kernel", help="check, run and simulate a kernel-language kernel from a "
                                      "file",
                       description="Load FILE.py (with the kernel language in scope as fl), list "
                                   "its kernels, or run one on seeded random inputs: the numpy "
                                   "interpreter, an optional reference, then the simulator.")
    k.add_argument("file", metavar="FILE.py")
    k.add_argument("--kernel", help="which kernel (default: the last one defined)")
    k.add_argument("--shapes", help="axis sizes for random inputs, e.g. M=256,K=128,N=64")
    k.add_argument("--static", help="static arguments, e.g. tile=64")
    k.add_argument("--ref", help="a function in FILE.py giving the expected output")
    k.add_argument("--target", default="rngd", help="NPU preset: rngd (default) or tiny")
    k.add_argument("--seed", type=int, default=0)
    k.add_argument("--no-sim", action="store_true", help="run the interpreter only")
    k.add_argument("--trace", metavar="OUT.json", help="write the simulated timeline as "
                                                       "Chrome/Perfetto trace JSON")
    k.set_defaults(func=cmd_kernel)
    return p


def main(argv=None) -> int:
    _quiet_torch()
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except FexploreError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

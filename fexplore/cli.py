"""The ``fexplore`` command: ``fexplore demo``, ``fexplore compile MODULE:FACTORY``."""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings

from fexplore.errors import FexploreError


def _quiet_torch():
    # torch.export's internal deprecation chatter is not the user's business on a terminal.
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)


def cmd_demo(args) -> int:
    import fexplore
    from fexplore.models import ZOO

    model, inputs = ZOO["gpt"]()
    print("fexplore demo: compiling the bundled GPT-style model "
          f"({sum(p.numel() for p in model.parameters()):,} parameters, "
          f"input {tuple(inputs[0].shape)})\n")
    cm = fexplore.compile(model, inputs, target=args.target)
    print(cm.summary())
    import torch

    with torch.no_grad():
        err = float((cm(*inputs) - model(*inputs)).abs().max())
    print(f"\nrunning the compiled model on the example input: max |compiled - eager| = {err:.2e}")
    if args.out:
        print(f"wrote {cm.save(args.out)}")
    return 0


def _load_factory(spec: str):
    if ":" not in spec:
        raise FexploreError(f"expected MODULE:FACTORY, got {spec!r}",
                            hint="e.g. fexplore compile fexplore.models:gpt")
    mod, fn = spec.split(":", 1)
    try:
        module = importlib.import_module(mod)
    except ImportError as e:
        raise FexploreError(f"cannot import {mod}: {e}") from None
    factory = getattr(module, fn, None)
    if factory is None:
        raise FexploreError(f"{mod} has no {fn}")
    return factory


def cmd_compile(args) -> int:
    import fexplore

    model, inputs = _load_factory(args.factory)()
    cm = fexplore.compile(model, inputs, target=args.target)
    print(cm.summary())
    if args.out:
        print(f"wrote {cm.save(args.out)}")
    return 0


def main(argv=None) -> int:
    _quiet_torch()
    p = argparse.ArgumentParser(
        prog="fexplore",
        description="Compile PyTorch models through fexplore's verified NPU front end.")
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="compile the bundled GPT-style model and print a summary")
    d.add_argument("--target", default="rngd", help="NPU preset (rngd, tiny)")
    d.add_argument("--out", default=None, help="also write the stage IR and reports here")
    d.set_defaults(func=cmd_demo)
    c = sub.add_parser("compile", help="compile MODULE:FACTORY, a function returning "
                                       "(model, example_inputs)")
    c.add_argument("factory", help="e.g. fexplore.models:gpt")
    c.add_argument("--target", default="rngd")
    c.add_argument("--out", default=None, help="folder for the stage IR and verification CSV")
    c.set_defaults(func=cmd_compile)
    args = p.parse_args(argv)
    try:
        return args.func(args)
    except FexploreError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

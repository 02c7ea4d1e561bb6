"""Numerics: how far fexplore's stages are from eager, measured against eager's own f32 error.

For every model, one compile with verification: the oracle runs eager in f32 and an f64 copy of the
model, so eager's own rounding noise (max |eager f32 - eager f64| over the outputs) is known. The
table shows, per model, the output's magnitude, that noise, fexplore's worst error over every stage,
and their ratio. A ratio near 1 says fexplore's interpreter rounds as well as torch's kernels do; a
ratio far above 1 on some model is a numerics problem worth a look (the tolerance allows 8).

    .venv/bin/python bench/numerics.py [--models mlp,gpt,...] [--hf]

``--hf`` adds the Hugging Face architectures of tests/test_hf_models.py (tiny random-init configs).

Prints a table and writes bench/results/numerics.md. No assertion: a benchmark reports.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import os
import platform
import sys
import warnings
from pathlib import Path

# this folder off the path: its kernels.py would shadow the `kernels` package transformers imports
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TQDM_DISABLE", "1")

import torch  # noqa: E402

import fexplore  # noqa: E402
from fexplore.models import ZOO  # noqa: E402
from fexplore.pipeline.numeric import NOISE_MULTIPLE, TOLERANCES  # noqa: E402
from fexplore.ir import DType  # noqa: E402

warnings.filterwarnings("ignore")


class _Logits(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x).logits


def _resnet50(size):
    """Hugging Face's ResNet-50 (its default config), random weights, a 1000-way head."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.ResNetConfig(num_labels=1000)
    return _Logits(transformers.ResNetForImageClassification(cfg).eval()), \
        (torch.randn(1, 3, size, size),)


def _hf_models():
    """The Hugging Face factories of the test suite, loaded from its file (one list of models)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "tests" / "test_hf_models.py"
    spec = importlib.util.spec_from_file_location("hf_models", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return {f"hf:{name}": (lambda name=name: mod.build(name)) for name in sorted(mod.FACTORIES)}


def models(hf: bool = False):
    out = {name: (lambda name=name: ZOO[name]()) for name in ZOO}
    if hf:
        out.update(_hf_models())
    try:
        import transformers  # noqa: F401
        out["resnet50-64px"] = lambda: _resnet50(64)
        out["resnet50-224px"] = lambda: _resnet50(224)
    except ImportError:
        pass
    return out


def measure(name, factory):
    model, inputs = factory()
    ex = fexplore.explore(model, inputs)
    ex.run_all(progress=False)
    checks = [r.verification.numeric for r in ex.records]
    worst = max(checks, key=lambda n: n.max_abs)
    stage = ex.records[checks.index(worst)].name
    with torch.no_grad():
        outs = [o for o in torch.utils._pytree.tree_leaves(model(*copy.deepcopy(inputs)))
                if isinstance(o, torch.Tensor) and o.is_floating_point()]
    mag = max((float(o.abs().max()) for o in outs if o.numel()), default=0.0)
    noise = worst.eager_noise
    floor = TOLERANCES[DType.f32].atol * max(1.0, mag)
    return {
        "model": name, "max|out|": mag, "eager f32 noise": noise, "fexplore max err": worst.max_abs,
        "worst stage": stage, "err / noise": worst.max_abs / noise if noise else float("nan"),
        "floor": floor, "floor alone passes": worst.max_abs <= floor,
        "all stages ok": all(r.verification.ok for r in ex.records),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", help="comma-separated subset")
    ap.add_argument("--hf", action="store_true", help="add the Hugging Face architectures")
    args = ap.parse_args()
    table = models(args.hf)
    names = args.models.split(",") if args.models else list(table)
    rows = [measure(n, table[n]) for n in names]
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = [f"{v:.2e}" if isinstance(v, float) and k != "err / noise" else
                 (f"{v:.2f}" if isinstance(v, float) else str(v)) for k, v in r.items()]
        lines.append("| " + " | ".join(cells) + " |")
    body = "\n".join(lines)
    print(body)
    head = (f"# Numerics: fexplore's error against eager's own f32 error\n\n"
            f"{datetime.date.today()}, {platform.machine()}, torch {torch.__version__}. "
            f"Command: `.venv/bin/python bench/numerics.py{' --hf' if args.hf else ''}`.\n\n"
            f"A stage passes when |got - eager| <= atol*max(1, max|out|) + rtol*|out| + "
            f"{NOISE_MULTIPLE:g} x eager f32 noise (docs/numerics.md). `floor alone passes` says "
            f"whether the fixed f32 tolerance would have been enough.\n\n")
    out = Path(__file__).parent / "results" / "numerics.md"
    out.write_text(head + body + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()

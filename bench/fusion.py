"""Fusion: fexplore's fused regions and DRAM traffic, side by side with TorchInductor on CPU.

For every zoo model (default sizes, plus the GPT-style model at a mid size) this compiles the model
twice in the same run:

* fexplore (``fexplore.compile(..., verify=False)``), reading the fusion stage's statistics: regions
  by kind, DRAM traffic after fusion over before, and over the compulsory traffic (weights, inputs
  and outputs each moved once). Our kernel count is the top-level nodes after fusion that move
  data: every region, and every unfused node whose cost moves bytes. Pure views (an OpDef whose
  cost moves no bytes: today ``reshape`` and ``expand``) are not kernels, the same way the traffic
  model charges them nothing and Inductor turns them into ``reinterpret_tensor``; they are counted
  in a column of their own. ``permute``, ``slice``, ``concat``, ``relayout``... move data and count.
* TorchInductor (``torch.compile(model, backend="inductor")``, run once under no_grad, FX graph
  cache off so codegen really runs). Two Inductor figures:
  - ``generated_kernel_count + extern calls``: the issue's definition. On CPU
    ``torch._inductor.metrics.generated_kernel_count`` counts every ``Kernel`` object codegen made,
    and the C++ backend makes several per fused loop nest (scalar, vectorized, tail variants), so
    it is larger than what runs. ``torch._inductor.metrics`` has no extern-call counter, so extern
    calls (matmul, conv, other ATen fallbacks) are counted in the generated wrapper code.
  - launches: the calls in the generated wrapper's ``call()`` (generated C++ kernels + extern
    calls + ATen fallbacks), i.e. what actually runs per forward. The stricter comparison.

Goals (from the issue): traffic after fusion <= 1.5x compulsory on the GPT-style model; no more
kernels than Inductor. Ends with one sanity compile of every model with ``verify=True``.

    .venv/bin/python bench/fusion.py [--models mlp,cnn,...] [--no-inductor] [--no-verify]

Prints a table and writes bench/results/fusion.md. No assertion: a benchmark reports.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TQDM_DISABLE", "1")  # compile()'s progress bars would swamp the output

import torch  # noqa: E402

import fexplore  # noqa: E402
from fexplore.models import ZOO  # noqa: E402

TRAFFIC_GOAL = 1.5
GPT_ROWS = ("gpt", "gpt-mid")  # the GPT-style rows the traffic goal is checked on
warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)

# (row label, zoo factory, size overrides)
CONFIGS = [(name, name, {}) for name in ZOO] + [("gpt-mid", "gpt", dict(layers=4, width=256))]

_MATMUL = {"mm", "addmm", "bmm", "baddbmm", "linear", "_mkl_linear", "_linear_pointwise",
           "matmul", "addbmm"}
_CONV = {"convolution", "_convolution_pointwise", "mkldnn_convolution", "conv2d"}
# a call in the wrapper's call(): a generated C++ kernel, an extern kernel or an ATen fallback
_CALL = re.compile(r"^\s+(?:\w+(?:, \w+)* = )?(?P<fn>cpp_fused_\w+|kernel_cpp_\w+|"
                   r"extern_kernels\.\w+|aten\.[\w.]+|torch\.ops\.[\w.]+|inductor_ops\.[\w.]+|"
                   r"_quantized\.[\w.]+)\(", re.M)


# -- fexplore ------------------------------------------------------------------------------------

def is_view(node) -> bool:
    """A node is a view when its op's cost moves no bytes (reshape, expand)."""
    if node.op.name == "region" or not node.inputs:
        return False
    cost = node.op.cost([v.type for v in node.inputs], [v.type for v in node.outputs], node.attrs)
    return cost.bytes == 0


def measure_fexplore(model, inputs) -> dict:
    t0 = time.perf_counter()
    cm = fexplore.compile(model, inputs, verify=False)
    elapsed = time.perf_counter() - t0
    rec = next(r for r in cm.stages if r.name == "fusion")
    s = rec.stats
    top = rec.after.nodes
    views = [n for n in top if is_view(n)]
    unfused = Counter(n.op.name for n in top if n.op.name != "region" and not is_view(n))
    return dict(
        compile_s=elapsed,
        nodes_before=len(rec.before.nodes),
        regions=s["fused_regions"],
        by_kind=dict(s["regions_by_kind"]),
        unfused=unfused,
        views=Counter(n.op.name for n in views),
        kernels=len(top) - len(views),
        before=s["dram_bytes_before"], after=s["dram_bytes_after"],
        compulsory=s["dram_bytes_compulsory"],
        after_over_before=s["traffic_after_over_before"],
        after_over_compulsory=s["traffic_after_over_compulsory"],
        splits=len(s["split_for_sram"]),
    )


# -- TorchInductor -------------------------------------------------------------------------------

def _wrapper_calls(code: str) -> list[str]:
    """The calls inside the wrapper's ``call()`` (the code Inductor runs per forward)."""
    start = code.find("def call(self, args)")
    if start < 0:
        start = code.find("def call(args)")
    body = code[start:] if start >= 0 else ""
    end = re.search(r"^(?:def |class |async_compile\.wait|if __name__)", body[1:], re.M)
    body = body[: end.start() + 1] if end else body
    return [m.group("fn") for m in _CALL.finditer(body)]


def _kind(fn: str) -> str:
    if fn.startswith(("cpp_fused_", "kernel_cpp_")):
        return "generated"
    leaf = fn.split(".")[-1] if not fn.endswith(".default") else fn.split(".")[-2]
    if leaf in _MATMUL:
        return "matmul"
    if leaf in _CONV:
        return "conv"
    return "other"


def measure_inductor(model, inputs) -> dict:
    import torch._inductor.config as inductor_config
    import torch._inductor.metrics as metrics
    from torch._inductor.utils import run_and_get_code

    inductor_config.fx_graph_cache = False  # a cache hit would skip codegen and the counters
    torch._dynamo.reset()
    metrics.reset()
    t0 = time.perf_counter()
    with torch.no_grad():
        _, codes = run_and_get_code(torch.compile(model, backend="inductor"), *inputs)
    elapsed = time.perf_counter() - t0
    calls = [fn for code in codes for fn in _wrapper_calls(code)]
    kinds = Counter(_kind(fn) for fn in calls)
    extern = kinds["matmul"] + kinds["conv"] + kinds["other"]
    return dict(compile_s=elapsed, graphs=len(codes),
                generated_kernel_count=metrics.generated_kernel_count,
                vec_kernel_count=metrics.generated_cpp_vec_kernel_count,
                generated_launches=kinds["generated"], matmul=kinds["matmul"], conv=kinds["conv"],
                other=kinds["other"], other_names=sorted({fn for fn in calls
                                                          if _kind(fn) == "other"}),
                extern=extern, metric_kernels=metrics.generated_kernel_count + extern,
                launches=len(calls))


def cxx_compiler() -> str | None:
    for name in ("g++", "c++", "clang++"):
        path = shutil.which(name)
        if path:
            try:
                out = subprocess.run([path, "--version"], capture_output=True, text=True,
                                     timeout=30).stdout.splitlines()
                return out[0] if out else path
            except (OSError, subprocess.SubprocessError):
                return path
    return None


# -- report --------------------------------------------------------------------------------------

def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def _fmt_counter(c: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(c.items())) or "-"


def report(rows, compiler, sanity) -> str:
    lines = [
        "# Fusion: fexplore regions and DRAM traffic vs TorchInductor (CPU)",
        "",
        f"Run {datetime.datetime.now():%Y-%m-%d %H:%M}; {platform.node()} "
        f"({platform.machine()}, {os.cpu_count()} cores, shared), Python "
        f"{platform.python_version()}, torch {torch.__version__} with {torch.get_num_threads()} "
        f"threads; C++ compiler for Inductor: {compiler or 'NONE FOUND (Inductor not run)'}.",
        "fexplore: `fexplore.compile(model, inputs, verify=False)`, target `rngd` (32 MB SRAM per "
        "PE), fp32; figures from the fusion stage. Inductor: `torch.compile(model, "
        "backend=\"inductor\")`, one run under no_grad, FX graph cache off, "
        "`torch._inductor.metrics.reset()` and `torch._dynamo.reset()` before each model.",
        "",
        "Counting. **fx kernels** = top-level nodes after fusion that move data (regions + "
        "unfused nodes); pure views (ops whose cost moves no bytes: reshape, expand) are not "
        "kernels and are counted under *views*. **ind metric** = "
        "`generated_kernel_count` + extern calls (the issue's definition; on CPU the metric "
        "counts every codegen `Kernel` object, several per loop nest, so it exceeds what runs; "
        "`torch._inductor.metrics` has no extern counter, so extern calls are counted in the "
        "generated wrapper). **ind launches** = calls in the wrapper's `call()`: generated C++ "
        "kernels + extern matmul/conv + other ATen fallbacks, i.e. what runs per forward.",
        "",
        "| model | sizes | IR nodes | regions by kind | unfused kernels | views | fx kernels | "
        "traffic after / before | after / compulsory | SRAM splits | ind generated_kernel_count "
        "| ind C++ launches | ind extern matmul / conv / other | ind metric | ind launches |",
        "|---|---|---:|---|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in rows:
        f, ind = r["fx"], r["ind"]
        sizes = ", ".join(f"{k}={v}" for k, v in r["sizes"].items()) or "defaults"
        if f is None:
            fx_cols = ["error"] * 8
        else:
            fx_cols = [str(f["nodes_before"]), _fmt_counter(f["by_kind"]),
                       _fmt_counter(f["unfused"]), _fmt_counter(f["views"]), str(f["kernels"]),
                       f"{f['after_over_before']:.3f}", f"{f['after_over_compulsory']:.3f}",
                       str(f["splits"])]
        if isinstance(ind, dict):
            ind_cols = [str(ind["generated_kernel_count"]), str(ind["generated_launches"]),
                        f"{ind['matmul']} / {ind['conv']} / {ind['other']}",
                        str(ind["metric_kernels"]), str(ind["launches"])]
        else:
            ind_cols = [ind] + ["-"] * 4
        lines.append("| " + " | ".join([r["label"], sizes] + fx_cols + ind_cols) + " |")
    others = {r["label"]: r["ind"]["other_names"] for r in rows
              if isinstance(r["ind"], dict) and r["ind"]["other_names"]}
    if others:
        lines += ["", "Inductor 'other' extern/fallback calls: " +
                  "; ".join(f"{k}: {', '.join(v)}" for k, v in others.items()) + "."]
    lines += ["", "DRAM bytes (fexplore traffic model):", "",
              "| model | before fusion | after fusion | compulsory | fexplore compile s | "
              "inductor compile+run s |", "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        f, ind = r["fx"], r["ind"]
        if f is None:
            continue
        ind_s = f"{ind['compile_s']:.1f}" if isinstance(ind, dict) else "-"
        lines.append(f"| {r['label']} | {f['before']:,} | {f['after']:,} | {f['compulsory']:,} | "
                     f"{f['compile_s']:.2f} | {ind_s} |")

    # goals
    gpt_rows = [r for r in rows if r["label"] in GPT_ROWS and r["fx"] is not None]
    worst_gpt = max((r["fx"]["after_over_compulsory"] for r in gpt_rows), default=None)
    measured = [r for r in rows if r["fx"] is not None and isinstance(r["ind"], dict)]
    vs_metric = [r["label"] for r in measured if r["fx"]["kernels"] > r["ind"]["metric_kernels"]]
    vs_launch = [r["label"] for r in measured if r["fx"]["kernels"] > r["ind"]["launches"]]
    lines += ["", "| goal | measured | result |", "|---|---|---|"]
    if worst_gpt is None:
        lines.append(f"| traffic after fusion <= {TRAFFIC_GOAL}x compulsory, GPT-style | "
                     "not measured in this run | n/a |")
    else:
        detail = ", ".join(f"{r['label']} {r['fx']['after_over_compulsory']:.3f}x"
                           for r in gpt_rows)
        lines.append(f"| traffic after fusion <= {TRAFFIC_GOAL}x compulsory, GPT-style | "
                     f"{detail} | {verdict(worst_gpt <= TRAFFIC_GOAL)} |")
    if not measured:
        reason = "Inductor not run (no C++ compiler)" if compiler is None else "Inductor failed"
        lines.append(f"| no more kernels than Inductor | {reason} | n/a |")
    else:
        lines.append(
            "| no more kernels than Inductor (issue's count: generated_kernel_count + extern) | "
            f"fx <= ind on {len(measured) - len(vs_metric)}/{len(measured)} models"
            + (f"; more on {', '.join(vs_metric)}" if vs_metric else "")
            + f" | {verdict(not vs_metric)} |")
        lines.append(
            "| no more kernels than Inductor (stricter: wrapper launches) | "
            f"fx <= ind on {len(measured) - len(vs_launch)}/{len(measured)} models"
            + (f"; more on {', '.join(vs_launch)}" if vs_launch else "")
            + f" | {verdict(not vs_launch)} |")
    if sanity:
        lines += ["", "Sanity: every model compiled again with `verify=True` (structural + "
                  "numeric check after every stage, against PyTorch eager):", ""]
        lines += [f"- {label}: {msg}" for label, msg in sanity]
    lines.append("")
    return "\n".join(lines)


def sanity_check(label, factory, sizes) -> str:
    model, inputs = ZOO[factory](**sizes)
    try:
        cm = fexplore.compile(model, inputs, verify=True)
    except Exception as e:  # a failed verification raises; report it, never stop the bench
        return f"FAILED: {type(e).__name__}: {str(e).splitlines()[0]}"
    bad = [r.name for r in cm.stages if r.verification is not None and not r.verification.ok]
    worst = max((r.verification.numeric.max_abs for r in cm.stages
                 if r.verification is not None and r.verification.numeric is not None),
                default=float("nan"))
    return ("ok, every stage verified" if not bad else f"FAILED at {', '.join(bad)}") + \
        f" (worst max abs err {worst:.1e})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(label for label, _, _ in CONFIGS),
                    help="row labels to run (zoo names, and gpt-mid)")
    ap.add_argument("--no-inductor", action="store_true")
    ap.add_argument("--no-verify", action="store_true", help="skip the final verify=True run")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "fusion.md"))
    args = ap.parse_args(argv)
    wanted = args.models.split(",")
    configs = [c for c in CONFIGS if c[0] in wanted]
    compiler = cxx_compiler()
    rows = []
    for label, factory, sizes in configs:
        model, inputs = ZOO[factory](**sizes)
        try:
            fx = measure_fexplore(model, inputs)
        except Exception:
            traceback.print_exc()
            fx = None
        if args.no_inductor:
            ind = "not run (--no-inductor)"
        elif compiler is None:
            ind = "no C++ compiler"
        else:
            try:
                ind = measure_inductor(model, inputs)
            except Exception as e:
                traceback.print_exc()
                ind = f"failed: {type(e).__name__}"
        rows.append(dict(label=label, sizes=sizes, fx=fx, ind=ind))
        print(f"  {label} done", file=sys.stderr, flush=True)
    sanity = [] if args.no_verify else [(label, sanity_check(label, factory, sizes))
                                        for label, factory, sizes in configs]
    text = report(rows, compiler, sanity)
    print(text)
    if set(wanted) >= {label for label, _, _ in CONFIGS}:  # a partial run must not overwrite
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

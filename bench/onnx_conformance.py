"""ONNX's backend node tests as a conformance run of the ONNX door.

Every case ``onnx.backend.test.case.node.collect_testcases()`` builds (a one-op model, inputs and
expected outputs; numpy's RNG seeded, so every run builds the same cases) goes through ONNX
Runtime first; only the cases ONNX Runtime loads, runs and gets right count. Those go through
fexplore (ingest, fold, simplify, shapes, layout, fusion, then the IR interpreter) and are compared
with ONNX Runtime's outputs (see ``fexplore.testing.onnx_conformance`` for the outcomes). The goal:
fexplore passes >= 95% of the counted cases over >= 100 op types, every other one a clear refusal,
no raw Python exception, no wrong result.

    .venv/bin/python bench/onnx_conformance.py [--pattern OP_TYPE] [--chip]

``--chip`` compiles each case through every stage (lower, schedule) and runs the CompiledModel on
the simulated NPU instead of the interpreter after fusion (about ten times slower).

Writes bench/results/onnx_conformance.md (per-op-type table) and prints the summary. No
assertion: a benchmark reports; tests/test_onnx_conformance.py asserts on a seeded subset.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TQDM_DISABLE", "1")

from fexplore.testing.onnx_conformance import collect, run_case  # noqa: E402


def op_types(cases) -> dict[str, str]:
    """Each case's op type: a one-node model's node; an ``_expanded`` case (the op written as
    its function body) counts for the op it expands."""
    single = {c.name: c.model.graph.node[0].op_type for c in cases if len(c.model.graph.node) == 1}
    out = {}
    for c in cases:
        if c.name in single:
            out[c.name] = single[c.name]
            continue
        base = c.name.split("_expanded")[0]
        out[c.name] = single.get(base) or c.model.graph.node[-1].op_type
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pattern", default=None, help="only this op type (collect_testcases' filter)")
    ap.add_argument("--chip", action="store_true",
                    help="every stage, run on the simulated NPU (default: up to fusion, interpreter)")
    ap.add_argument("--out", default=None, help="the table (default bench/results/"
                                                "onnx_conformance[_chip].md)")
    args = ap.parse_args()
    import onnx
    import onnxruntime

    t0 = time.perf_counter()
    cases = collect(args.pattern)
    ops = op_types(cases)
    results = []
    out = args.out or str(Path(__file__).parent / "results" /
                          ("onnx_conformance_chip.md" if args.chip else "onnx_conformance.md"))
    for c in cases:
        o = run_case(c, chip=args.chip)
        o.op_type = ops[c.name]
        results.append(o)
    elapsed = time.perf_counter() - t0
    counted = [o for o in results if o.status != "skip"]
    by = collections.Counter(o.status for o in counted)
    per_op: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for o in results:
        per_op[o.op_type][o.status] += 1
    passing_ops = sorted(op for op, c in per_op.items() if c["pass"])
    rate = by["pass"] / max(len(counted), 1)
    summary = (f"{by['pass']}/{len(counted)} = {100 * rate:.1f}% of the cases ONNX Runtime passes; "
               f"{by['refused']} clear refusals, {by['wrong']} wrong, {by['crash']} raw exceptions; "
               f"{len(passing_ops)} op types with a passing case; "
               f"{sum(1 for o in results if o.status == 'skip')} cases ONNX Runtime fails (not "
               f"counted); {elapsed:.0f} s")
    print(summary)
    lines = [
        "# ONNX node-test conformance", "",
        f"Run {datetime.date.today()} by `bench/onnx_conformance.py`: onnx {onnx.__version__}, "
        f"onnxruntime {onnxruntime.__version__}; {len(cases)} cases from "
        "`onnx.backend.test.case.node.collect_testcases()`.", "",
        f"**{summary}.**", "",
        "A case counts when ONNX Runtime loads and runs it and matches the case's expected "
        "outputs; fexplore then ingests it, "
        + ("compiles it through every stage and runs the CompiledModel on the simulated NPU"
           if args.chip else "runs the graph stages up to fusion and the IR interpreter")
        + ", and is compared with ONNX Runtime (integers exactly, floats rtol 1e-3, "
        "atol 1e-5). `_expanded` cases (the op written as its ONNX function body) count under "
        "the op they expand.", "",
        "| op type | counted | pass | refused | wrong | crash | ORT fails | first refusal |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    first_refusal = {}
    for o in results:
        if o.status == "refused":
            first_refusal.setdefault(o.op_type, o.detail.replace("|", "/")[:110])
    for op in sorted(per_op):
        c = per_op[op]
        counted_n = c["pass"] + c["refused"] + c["wrong"] + c["crash"]
        lines.append(f"| {op} | {counted_n} | {c['pass']} | {c['refused']} | {c['wrong']} | "
                     f"{c['crash']} | {c['skip']} | {first_refusal.get(op, '')} |")
    bad = [o for o in results if o.status in ("wrong", "crash")]
    if bad:
        lines += ["", "## Wrong results and raw exceptions", ""]
        if args.chip:
            lines += ["Cases compile here with `verify=False`, so a kernel the chip gets wrong "
                      "shows as a wrong result; a default compile checks every stage against "
                      "ONNX Runtime and refuses it instead (FX301 at the lower stage). A wrong "
                      "result here that the interpreter run does not have is the back end's, "
                      "shared by both doors.", ""]
        lines += [f"- `{o.name}` ({o.status}): {o.detail}" for o in bad]
    Path(out).write_text("\n".join(lines) + "\n")
    print(f"table: {out}")


if __name__ == "__main__":
    main()

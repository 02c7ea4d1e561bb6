"""Differential fuzzing campaign: random modules, each compiled through every stage and run on the
simulated NPU, compared with eager.

Seeds ``--seed``, ``--seed + 1``, ... are generated (``fexplore.testing.fuzz``), compiled and run on
two input sets (``fexplore.testing.fuzz_check``) until ``--minutes`` have passed; each case has a
time limit. Reports cases per minute and the count of passes, clear refusals, crashes, wrong
results, timeouts (and invalid modules, a generator bug); with ``--shrink``, every failure is
shrunk to a minimal module and printed as Python source (``--regressions DIR`` also writes each
one there as a regression test).

    .venv/bin/python bench/fuzz.py --minutes 5 [--seed 0] [--jobs 1] [--timeout 60] [--shrink]

Writes bench/results/fuzz.md. No assertion: a benchmark reports; tests/test_fuzz.py asserts on a
seeded batch.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime
import os
import platform
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TQDM_DISABLE", "1")

import torch  # noqa: E402

warnings.filterwarnings("ignore")

FAILURES = ("crash", "wrong", "timeout", "invalid")


def _init_worker() -> None:
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")


def run_seed(seed: int, max_ops: int, timeout: float, target: str, precision: str) -> dict:
    from fexplore.testing import fuzz, fuzz_check

    t0 = time.perf_counter()
    try:
        program = fuzz.generate(seed, max_ops=max_ops)
    except Exception as e:  # the generator's own bug: reported, never hidden
        return {"seed": seed, "outcome": "invalid", "detail": f"generate: {type(e).__name__}: {e}",
                "code": "", "stage": "", "seconds": time.perf_counter() - t0, "kinds": []}
    r = fuzz_check.check(program, timeout=timeout, target=target, precision=precision)
    return {"seed": seed, "outcome": r.outcome, "detail": r.detail, "code": r.code,
            "stage": r.stage, "seconds": r.seconds, "signature": r.signature,
            "kinds": sorted({op.kind for op in program.ops})}


def campaign(args) -> tuple[list[dict], float]:
    deadline = time.perf_counter() + args.minutes * 60
    t0 = time.perf_counter()
    results: list[dict] = []

    def note(r: dict) -> None:
        results.append(r)
        if r["outcome"] in FAILURES:
            print(f"  {r['outcome']:7s} seed {r['seed']} [{r['stage']}] {r['code']} "
                  f"{r['detail'][:160]}", flush=True)
        if len(results) % 100 == 0:
            print(f"  {len(results)} cases, {time.perf_counter() - t0:.0f} s", flush=True)

    seed = args.seed
    if args.jobs <= 1:
        _init_worker()
        while time.perf_counter() < deadline:
            note(run_seed(seed, args.max_ops, args.timeout, args.target, args.precision))
            seed += 1
        return results, time.perf_counter() - t0
    with cf.ProcessPoolExecutor(args.jobs, initializer=_init_worker) as pool:
        pending = set()
        while True:
            while time.perf_counter() < deadline and len(pending) < 2 * args.jobs:
                pending.add(pool.submit(run_seed, seed, args.max_ops, args.timeout,
                                        args.target, args.precision))
                seed += 1
            if not pending:
                break
            done, pending = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
            for f in done:
                note(f.result())
    results.sort(key=lambda r: r["seed"])
    return results, time.perf_counter() - t0


def shrink_failures(results: list[dict], args) -> list[tuple[dict, str]]:
    from fexplore.testing import fuzz, fuzz_check, fuzz_shrink

    shrunk = []
    seen: set[str] = set()
    for r in results:
        if r["outcome"] not in ("crash", "wrong") or r["signature"] in seen:
            continue
        seen.add(r["signature"])  # one minimal module per distinct failure
        program = fuzz.generate(r["seed"], max_ops=args.max_ops)

        def check(p):
            return fuzz_check.check(p, timeout=args.timeout, target=args.target,
                                    precision=args.precision)

        s = fuzz_shrink.shrink(program, check(program), budget_s=args.shrink_budget,
                               check_fn=check)
        print(f"\n# seed {r['seed']}: {s.result.signature}, {len(program.ops)} -> "
              f"{len(s.program.ops)} ops in {s.checks} checks ({s.seconds:.0f} s)")
        print(s.program.source())
        if args.regressions:
            path = Path(args.regressions) / f"test_fuzz_seed{r['seed']}.py"
            path.write_text(fuzz_shrink.regression_source(
                s.program, s.result, target=args.target, precision=args.precision))
            print(f"wrote {path.name}")
        shrunk.append((r, s.program.source()))
    return shrunk


def report(results: list[dict], elapsed: float, args, shrunk) -> str:
    counts = Counter(r["outcome"] for r in results)
    n = len(results)
    per_min = n / (elapsed / 60) if elapsed else 0.0
    kinds = Counter(k for r in results for k in r["kinds"])
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    cmd = (f"`.venv/bin/python bench/fuzz.py --minutes {args.minutes:g} --seed {args.seed} "
           f"--jobs {args.jobs} --timeout {args.timeout:g} --max-ops {args.max_ops} "
           f"--target {args.target} --precision {args.precision}`")
    lines = [
        "# Differential fuzzing: random modules through every stage, against eager",
        "",
        f"Run {stamp}; {os.cpu_count()} cores (shared), torch {torch.__version__}, "
        f"Python {platform.python_version()}. Command: {cmd}: seeds {args.seed} to "
        f"{args.seed + n - 1}, {elapsed / 60:.1f} min.",
        "",
        "Each seed is a random module (`fexplore.testing.fuzz`: broadcasting, branching DAGs, views "
        "and strided slices, reductions, matmul/linear, conv and pools, attention with and without "
        "masks, norms, bf16/f16 casts, bool and int values, constants made in forward, in-place "
        "updates of clones), compiled through every stage for the target and run on the "
        "simulated NPU on its example inputs and on a second input set, compared with eager "
        "(`fexplore.testing.fuzz_check`; refusal codes and tolerances there).",
        "",
        "| | cases |",
        "|---|---:|",
        f"| modules run | {n} |",
        f"| cases per minute | {per_min:.1f} ({args.jobs} process{'es' if args.jobs > 1 else ''}) |",
    ]
    for o in ("pass", "refused", "crash", "wrong", "timeout", "invalid"):
        lines.append(f"| {o} | {counts[o]} |")
    lines += ["", "## Op kinds covered", "", "| kind | modules using it | of which not passing |",
              "|---|---:|---:|"]
    for k, c in sorted(kinds.items(), key=lambda kv: -kv[1]):
        bad = sum(1 for r in results if k in r["kinds"] and r["outcome"] != "pass")
        lines.append(f"| {k} | {c} | {bad} |")
    refusals = Counter((r["code"], r["detail"][:100]) for r in results if r["outcome"] == "refused")
    lines += ["", "## Refusals", ""]
    if refusals:
        lines += ["| code | reason | cases |", "|---|---|---:|"]
        lines += [f"| {c} | {_cell(d)} | {k} |" for (c, d), k in refusals.most_common()]
    else:
        lines.append("None.")
    lines += ["", "## Failures", ""]
    failures = [r for r in results if r["outcome"] in FAILURES]
    if failures:
        lines += ["| seed | outcome | stage | code | detail |", "|---:|---|---|---|---|"]
        lines += [f"| {r['seed']} | {r['outcome']} | {r['stage']} | {r['code']} | "
                  f"{_cell(r['detail'])} |" for r in failures]
    else:
        lines.append("None.")
    for r, src in shrunk:
        lines += ["", f"### seed {r['seed']}, shrunk", "", "```python", src.rstrip(), "```"]
    return "\n".join(lines) + "\n"


def _cell(s: str) -> str:
    s = s.replace("|", "\\|").replace("\n", " ")
    # machine paths have no place in a results file (a size like s/2 is not one)
    words = ("<path>" if w.startswith(("/", "~", "./")) or ".py" in w else w for w in s.split())
    return " ".join(words)[:200]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=0, help="first seed")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per case")
    ap.add_argument("--max-ops", type=int, default=12)
    ap.add_argument("--target", default="rngd", help="chip preset: rngd (the default target) "
                    "or tiny (small SRAM: tiling and spills at these sizes)")
    ap.add_argument("--precision", default="fp32", help="compile precision: fp32, bf16, fp8")
    ap.add_argument("--shrink", action="store_true", help="shrink each distinct failure")
    ap.add_argument("--shrink-budget", type=float, default=120.0, help="seconds per failure")
    ap.add_argument("--regressions", default="", help="folder to write shrunk failures to")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "fuzz.md"))
    args = ap.parse_args()
    results, elapsed = campaign(args)
    shrunk = shrink_failures(results, args) if args.shrink else []
    text = report(results, elapsed, args, shrunk)
    Path(args.out).write_text(text)
    print(text.split("\n## ")[0])
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

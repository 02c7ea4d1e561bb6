"""Differential fuzzing campaign: random modules, each compiled through every stage and run on the
simulated NPU, compared with eager.

Seeds ``--seed``, ``--seed + 1``, ... are generated (``fexplore.testing.fuzz``), compiled and run on
two input sets (``fexplore.testing.fuzz_check``) until ``--minutes`` have passed; each case has a
time limit. Reports cases per minute and the count of passes, clear refusals, crashes, wrong
results, timeouts (and invalid modules, a generator bug); with ``--shrink``, every failure is
shrunk to a minimal module and printed as Python source (``--regressions DIR`` also writes each
one there as a regression test).

    .venv/bin/python bench/fuzz.py --minutes 5 [--count N] [--seed 0] [--jobs 1] [--timeout 60] [--shrink]

``--json FILE`` also keeps every case's outcome; ``--combine A.json B.json [--recheck]`` then
writes one table of several runs (a campaign at fp32 and one at bf16, say), with each failure's
outcome on the current code when rechecked. Writes bench/results/fuzz.md (``--out``). No assertion: a benchmark reports; tests/test_fuzz.py asserts on a
seeded batch.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime
import json
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
    stop = args.seed + args.count if args.count else float("inf")
    if args.jobs <= 1:
        _init_worker()
        while time.perf_counter() < deadline and seed < stop:
            note(run_seed(seed, args.max_ops, args.timeout, args.target, args.precision))
            seed += 1
        return results, time.perf_counter() - t0
    with cf.ProcessPoolExecutor(args.jobs, initializer=_init_worker) as pool:
        pending = set()
        while True:
            while (time.perf_counter() < deadline and seed < stop
                   and len(pending) < 2 * args.jobs):
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


def report(runs: list[dict]) -> str:
    """The results table of one or more campaigns (each ``{"args", "elapsed", "results",
    "shrunk"}``, as ``--json`` writes them): counts per run and in total, then the op kinds,
    refusals and failures over all of them. With ``"now"`` on a failure (``--recheck``), its
    outcome on the code that writes the report."""
    everything = [r for run in runs for r in run["results"]]
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    lines = [
        "# Differential fuzzing: random modules through every stage, against eager",
        "",
        f"Written {stamp}; {os.cpu_count()} cores (shared), torch {torch.__version__}, "
        f"Python {platform.python_version()}.",
        "",
        "Each seed is a random module (`fexplore.testing.fuzz`: broadcasting, branching DAGs, views "
        "and strided slices, reductions, matmul/linear, conv and pools, attention with and without "
        "masks, norms, bf16/f16 casts, bool and int values, constants made in forward, in-place "
        "updates of clones), compiled through every stage for the target and run on the "
        "simulated NPU on its example inputs and on a second input set, compared with eager "
        "(`fexplore.testing.fuzz_check`; refusal codes and tolerances there).",
        "",
        "Commands:",
        "",
    ]
    for k, run in enumerate(runs, 1):
        a, n = run["args"], len(run["results"])
        lines.append(f"{k}. {_command(a)}: seeds {a['seed']} to {a['seed'] + n - 1}, "
                     f"{run['elapsed'] / 60:.1f} min")
    head = " | ".join(f"run {k} ({run['args']['precision']})" for k, run in enumerate(runs, 1))
    total = "" if len(runs) == 1 else " total |"
    lines += ["", f"| | {head} |{total}", "|---|" + "---:|" * (len(runs) + (len(runs) > 1))]
    columns = [run["results"] for run in runs] + ([everything] if len(runs) > 1 else [])
    elapsed = [run["elapsed"] for run in runs] + ([sum(r["elapsed"] for r in runs)] if len(runs) > 1 else [])
    lines.append("| modules run | " + " | ".join(str(len(c)) for c in columns) + " |")
    lines.append("| cases per minute (1 process) | " + " | ".join(
        f"{len(c) / (e / 60):.1f}" if e else "0" for c, e in zip(columns, elapsed)) + " |")
    for o in ("pass", "refused", "crash", "wrong", "timeout", "invalid"):
        lines.append(f"| {o} | " + " | ".join(
            str(sum(r["outcome"] == o for r in c)) for c in columns) + " |")
    kinds = Counter(k for r in everything for k in r["kinds"])
    lines += ["", "## Op kinds covered", "", "| kind | modules using it | of which not passing |",
              "|---|---:|---:|"]
    for k, c in sorted(kinds.items(), key=lambda kv: -kv[1]):
        bad = sum(1 for r in everything if k in r["kinds"] and r["outcome"] != "pass")
        lines.append(f"| {k} | {c} | {bad} |")
    refusals = Counter((r["code"], r["detail"][:100]) for r in everything if r["outcome"] == "refused")
    lines += ["", "## Refusals", ""]
    if refusals:
        lines += ["| code | reason | cases |", "|---|---|---:|"]
        lines += [f"| {c} | {_cell(d)} | {k} |" for (c, d), k in refusals.most_common()]
    else:
        lines.append("None.")
    lines += ["", "## Failures", ""]
    failures = [(run["args"]["precision"], r) for run in runs for r in run["results"]
                if r["outcome"] in FAILURES]
    if failures:
        now = any("now" in r for _, r in failures)
        lines += ["| seed | precision | outcome | stage | code | detail |" + (" now |" if now else ""),
                  "|---:|---|---|---|---|---|" + ("---|" if now else "")]
        lines += [f"| {r['seed']} | {p} | {r['outcome']} | {r['stage']} | {r['code']} | "
                  f"{_cell(r['detail'])} |" + (f" {r.get('now', '')} |" if now else "")
                  for p, r in failures]
    else:
        lines.append("None.")
    for run in runs:
        for r, src in run["shrunk"]:
            lines += ["", f"### seed {r['seed']} ({run['args']['precision']}), shrunk", "",
                      "```python", src.rstrip(), "```"]
    return "\n".join(lines) + "\n"


def _command(a: dict) -> str:
    count = f" --count {a['count']}" if a.get("count") else ""
    return (f"`.venv/bin/python bench/fuzz.py --minutes {a['minutes']:g}{count} --seed {a['seed']} "
            f"--jobs {a['jobs']} --timeout {a['timeout']:g} --max-ops {a['max_ops']} "
            f"--target {a['target']} --precision {a['precision']}`")


def recheck(runs: list[dict]) -> None:
    """Each failure's seed checked again on this code: its outcome goes in ``"now"``."""
    for run in runs:
        a = run["args"]
        for r in run["results"]:
            if r["outcome"] in FAILURES:
                r["now"] = run_seed(r["seed"], a["max_ops"], a["timeout"], a["target"],
                                    a["precision"])["outcome"]
                print(f"  seed {r['seed']} ({a['precision']}): {r['outcome']} -> {r['now']}")


def _cell(s: str) -> str:
    s = s.replace("|", "\\|").replace("\n", " ")
    # machine paths have no place in a results file (a size like s/2 is not one)
    words = ("<path>" if w.startswith(("/", "~", "./")) or ".py" in w else w for w in s.split())
    return " ".join(words)[:200]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--count", type=int, default=0,
                    help="stop after this many modules (0: only --minutes bounds the run)")
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
    ap.add_argument("--json", default="",
                    help="also write every case's outcome as JSON (to combine runs)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "fuzz.md"))
    ap.add_argument("--combine", nargs="+", default=[], metavar="JSON",
                    help="write one table of these runs (files --json wrote) instead of running")
    ap.add_argument("--recheck", action="store_true",
                    help="with --combine: check each failure's seed again on this code")
    args = ap.parse_args()
    if args.combine:
        runs = [json.loads(Path(p).read_text()) for p in args.combine]
        if args.recheck:
            _init_worker()
            recheck(runs)
    else:
        results, elapsed = campaign(args)
        shrunk = shrink_failures(results, args) if args.shrink else []
        runs = [{"args": vars(args), "elapsed": elapsed, "results": results, "shrunk": shrunk}]
        if args.json:
            Path(args.json).write_text(json.dumps(runs[0], indent=0))
    text = report(runs)
    Path(args.out).write_text(text)
    print(text.split("\n## ")[0])
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

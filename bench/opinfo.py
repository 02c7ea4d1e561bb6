"""PyTorch's OpInfo samples as a conformance run: how many of the samples torch.export gets right
does fexplore get right too, and how does it fail the others?

Every OpInfo entry of an op the converter registry claims, plus the ops real models use most
(``fexplore.testing.opinfo.COMMON_OPS``), sampled in float32, in float16 and bfloat16 (models
that compute in them by themselves), and in the integer/bool dtypes the entry takes. Each sample becomes a one-op module, compiled through every stage against eager and
run; the same module also goes through torch.export alone (export, run_decompositions, run) as the
reference. The goal: fexplore passes >= 98% of the samples torch.export passes, and fails every
other one with a clear refusal (a FexploreError with code and hint), never a wrong result or a raw
Python exception.

    .venv/bin/python bench/opinfo.py [--float-samples N] [--narrow-samples N] [--int-samples N] [--ops a,b,...]

or in two shards side by side (the machine has two cores), then the table from both:

    .venv/bin/python bench/opinfo.py --shard 0/2 --jsonl shard0.jsonl &
    .venv/bin/python bench/opinfo.py --shard 1/2 --jsonl shard1.jsonl; wait
    .venv/bin/python bench/opinfo.py --merge shard0.jsonl,shard1.jsonl

Writes bench/results/opinfo.md (per-op table) and prints the summary. No assertion: a benchmark
reports; tests/test_opinfo.py asserts on a seeded subset.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TQDM_DISABLE", "1")

import torch  # noqa: E402

from fexplore.testing import opinfo  # noqa: E402

warnings.filterwarnings("ignore")

GOAL = 0.98


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--float-samples", type=int, default=4,
                    help="samples per entry in float32 (OpInfo order; 0 = all)")
    ap.add_argument("--narrow-samples", type=int, default=2,
                    help="samples per entry in each of float16 and bfloat16 (0 = all, -1 = none)")
    ap.add_argument("--int-samples", type=int, default=1,
                    help="samples per entry in each integer/bool dtype it takes (0 = all)")
    ap.add_argument("--ops", default="", help="comma-separated OpInfo names (default: all)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "opinfo.md"))
    ap.add_argument("--shard", default="", help="i/n: run every n-th entry from the i-th (0-based) "
                    "and write its samples as JSON lines to --jsonl, for --merge")
    ap.add_argument("--jsonl", default="", help="where a shard writes its samples")
    ap.add_argument("--merge", default="", help="comma-separated shard files: write the table")
    args = ap.parse_args()
    if args.merge:
        results, elapsed, n_entries, settings = [], 0.0, 0, None
        for path in args.merge.split(","):
            lines = Path(path).read_text().splitlines()
            head = json.loads(lines[0])
            elapsed, n_entries = max(elapsed, head["elapsed"]), n_entries + head["entries"]
            results += [opinfo.SampleResult(**json.loads(line)) for line in lines[1:]]
            # the table states the shards' sample counts, not this command's defaults
            if settings is not None and head.get("settings") != settings:
                raise SystemExit(f"{path} was run with {head.get('settings')}, another shard with {settings}")
            settings = head.get("settings")
        for name, value in (settings or {}).items():
            setattr(args, name, value)
        text = report(results, args, elapsed, n_entries)
        Path(args.out).write_text(text)
        print(text.split("\n## ")[0])
        print(f"wrote {args.out}")
        return

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    infos = opinfo.select_opinfos()
    if args.ops:
        wanted = set(args.ops.split(","))
        infos = [i for i in infos if i.name in wanted]
    if args.shard:
        i, n = map(int, args.shard.split("/"))
        infos = infos[i::n]
    caps = {torch.float32: args.float_samples or None,
            **{d: args.narrow_samples or None for d in opinfo.NARROW_DTYPES if args.narrow_samples >= 0},
            **{d: args.int_samples or None for d in opinfo.INT_DTYPES}}
    done = [0]

    def progress(r):
        done[0] += 1
        if r.outcome in ("raw", "wrong") and r.counted:
            print(f"  {r.outcome:7s} {r.op} {r.dtype} #{r.index}: {r.detail[:160]}", flush=True)
        if done[0] % 100 == 0:
            print(f"  {done[0]} samples, {time.perf_counter() - t0:.0f} s", flush=True)

    results = opinfo.run(infos, dtypes=tuple(caps), max_per_dtype=caps, progress=progress)
    elapsed = time.perf_counter() - t0
    if args.shard:
        settings = {k: getattr(args, k) for k in ("float_samples", "narrow_samples", "int_samples", "ops")}
        rows = [json.dumps({"elapsed": elapsed, "entries": len(infos), "settings": settings})]
        rows += [json.dumps(dataclasses.asdict(r)) for r in results]
        Path(args.jsonl).write_text("\n".join(rows) + "\n")
        print(f"shard {args.shard}: {len(results)} samples in {elapsed:.0f} s -> {args.jsonl}")
        return
    text = report(results, args, elapsed, len(infos))
    Path(args.out).write_text(text)
    print(text.split("\n## ")[0])
    print(f"wrote {args.out}")


def report(results, args, elapsed: float, n_entries: int) -> str:
    s = opinfo.summarize(results)
    counts = s.counts
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    lines = [
        "# OpInfo conformance: PyTorch's own op samples, one op at a time, through every stage",
        "",
        f"Run {stamp}; {os.cpu_count()} cores (shared), torch {torch.__version__}, "
        f"Python {platform.python_version()}; {elapsed / 60:.1f} min.",
        f"Command: `.venv/bin/python bench/opinfo.py --float-samples {args.float_samples} "
        f"--narrow-samples {args.narrow_samples} --int-samples {args.int_samples}"
        + (f" --ops {args.ops}" if args.ops else "") + "`"
        + (f", in {len(args.merge.split(','))} shards side by side (`--shard i/n`), merged "
           "(`--merge`); the time is the slower shard's" if args.merge else "") + ".",
        "",
        f"{n_entries} OpInfo entries: every entry of an op the converter registry claims, plus the "
        "ops real models use most (`fexplore.testing.opinfo.COMMON_OPS`). Samples: the first "
        f"{args.float_samples or 'all'} of each entry in float32, "
        + (f"the first {args.narrow_samples or 'all'} in each of float16 and bfloat16, "
           if args.narrow_samples >= 0 else "") +
        f"and the first {args.int_samples or 'all'} in each of int64, int32, uint8 and bool where the entry "
        "takes that dtype (OpInfo's order, seeded). Each sample is a one-op module compiled "
        "through every stage (verified against eager at each) and run; torch.export alone "
        "(export, `run_decompositions()`, run) is the reference. Values are compared with "
        "fexplore's own `compare` at the output dtype's tolerance plus eager's own rounding noise; "
        "integers and bools exactly.",
        "",
        "| | samples |",
        "|---|---:|",
        f"| samples run | {s.samples} |",
        f"| excluded: not a test of an op (eager raises, its output is not tensors, or torch "
        f"leaves its contents unspecified: the empty_* entries) | "
        f"{s.excluded} |",
        f"| torch.export alone fails (left out of the denominator) | {s.export_fail} |",
        f"| **torch.export alone passes (the denominator)** | **{s.export_pass}** |",
        f"| fexplore passes | {counts['pass']} ({100 * s.pass_rate:.1f}%) |",
        f"| fexplore refuses clearly (FexploreError with code and hint) | {counts['refused']} |",
        f"| fexplore wrong (numeric mismatch or outputs differ from eager) | {counts['wrong']} |",
        f"| fexplore raw Python exception | {counts['raw']} |",
        "",
        "Where torch.export alone fails, fexplore: " + (", ".join(
            f"{k} {v}" for k, v in sorted(s.beyond_export.items())) or "nothing to report") + ".",
        "",
        "| goal | measured | result |",
        "|---|---|---|",
        f"| fexplore passes >= {GOAL:.0%} of the samples torch.export passes | "
        f"{counts['pass']}/{s.export_pass} = {100 * s.pass_rate:.1f}% | "
        f"{'PASS' if s.pass_rate >= GOAL else 'MISS'} |",
        f"| every other sample a clear refusal: no wrong results, no raw exceptions | "
        f"{counts['wrong']} wrong, {counts['raw']} raw | "
        f"{'PASS' if counts['wrong'] + counts['raw'] == 0 else 'MISS'} |",
        "",
        "## Refusals by reason",
        "",
        "| code | reason | samples |",
        "|---|---|---:|",
    ]
    reasons: dict[tuple[str, str], int] = {}
    for r in results:
        if r.counted and r.outcome == "refused":
            key = (r.code, r.detail.split(" (torch.export")[0][:120])
            reasons[key] = reasons.get(key, 0) + 1
    for (code, why), n in sorted(reasons.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {code} | {_cell(why)} | {n} |")
    lines += ["", "## Per entry", "",
              "Counts over samples torch.export passes, except *excluded* and *export fails*; "
              "the note is the first problem seen (or why samples were excluded).", "",
              "| OpInfo entry | samples | excluded | export fails | pass | refused | wrong | raw | "
              "s | note |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for row in sorted(opinfo.per_op_rows(results), key=lambda r: r["op"]):
        lines.append(f"| {row['op']} | {row['samples']} | {row['excluded']} | "
                     f"{row['export_fail']} | {row['pass']} | {row['refused']} | {row['wrong']} | "
                     f"{row['raw']} | {row['seconds']:.1f} | {_cell(row['note'])} |")
    return "\n".join(lines) + "\n"


def _cell(s: str) -> str:
    s = s.replace("|", "\\|").replace("\n", " ")
    # machine paths have no place in a results file
    words = (w if "/" not in w or w.startswith("aten") else "<path>" for w in s.split())
    return " ".join(words)[:200]


if __name__ == "__main__":
    main()

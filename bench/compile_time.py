"""Front-end compile time: ingestion and the graph stages vs torch.export, the interpreter vs eager.

Model: `fexplore.models.gpt` (GPT-2 style) at several depths, width 768, 12 heads, seq 128, batch 1.
vocab is 8192, not GPT-2's 50257: the tied LM head would otherwise dominate every figure and hide
how the per-layer costs scale. Goals (from the issue):
  1. ingest() after export <= 0.25x torch.export.export's own time, at every depth;
  2. ingest time grows linearly with layers (least-squares fit of ingest_s on layers, R^2);
  3. ir.run() <= 2x torch eager (under no_grad) on the same inputs;
  4. all graph stages (fold, simplify, shapes, layout, fusion, precision; the sum of their
     ``elapsed_s`` as the pass manager records them, verification off) <= 0.5x torch.export.export's
     time at 16 layers;
  5. graph-stage time grows linearly with layers (least-squares fit, R^2).
Each graph-stage repetition starts from a fresh ingest() of the same ExportedProgram, untimed: a
stage may cache on the graph's objects (constants cache their payload digest), and a real compile
pays for that once, so re-running the stages on one graph would hide it.

    .venv/bin/python bench/compile_time.py [--layers 1,2,4,8,16] [--quick] [--profile]

Every figure is a ratio of two things timed in the same run, because the machine is shared and noisy.
Prints a table and writes bench/results/compile_time.md. No assertion: a benchmark reports.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import gc
import io
import os
import pstats
import statistics
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from fexplore import ir  # noqa: E402
from fexplore.models.gpt import gpt  # noqa: E402
from fexplore.pipeline import GRAPH_STAGES, CompileOptions  # noqa: E402
from fexplore.pipeline.decomposition import decomposition_table, export_decomposed  # noqa: E402
from fexplore.pipeline.ingest import ingest  # noqa: E402
from fexplore.pipeline.passmanager import PassManager  # noqa: E402

INGEST_GOAL, INTERP_GOAL, R2_GOAL, STAGES_GOAL, STAGES_GOAL_LAYERS = 0.25, 2.0, 0.98, 0.5, 16
STAGE_NAMES = [s.name for s in GRAPH_STAGES]
# torch's own pytree code trips its own deprecation on every export; it says nothing about us.
warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)


def timed(fn, repeat: int):
    """Median wall time of ``repeat`` calls, and the last result."""
    gc.collect()  # don't charge this measurement for the garbage the previous one left
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def measure(layers: int, cfg: dict, reps: dict) -> dict:
    model, args = gpt(layers=layers, **cfg)
    # torch.export's own capture, which the ingest goal compares against
    export_s, _ = timed(lambda: torch.export.export(model, args, strict=False), reps["export"])
    # the capture compile runs (one trace to core ATen, `export_decomposed`), against torch's own
    # two steps with the same table (export, then run_decompositions), alternated so a burst of
    # load hits both
    ours, torchs = [], []
    for _ in range(reps["capture"]):
        torchs.append(timed(lambda: torch.export.export(model, args, strict=False).run_decompositions(
            decomposition_table()), 1)[0])
        t, ep = timed(lambda: export_decomposed(model, args, None, None), 1)
        ours.append(t)
    capture_s, two_steps_s = statistics.median(ours), statistics.median(torchs)
    ingest_s, ing = timed(lambda: ingest(ep), reps["ingest"])
    x = [a.numpy() for a in args]
    eager, interp = [], []
    with torch.no_grad():
        model(*args), ir.run(ing.graph, x)  # warm-up: first calls allocate, later ones reuse
        # Alternated, so a burst of load from other work hits both sides of the ratio alike.
        for _ in range(reps["run"]):
            eager.append(timed(lambda: model(*args), 1))
            interp.append(timed(lambda: ir.run(ing.graph, x), 1))
    eager_s, ref = statistics.median(t for t, _ in eager), eager[-1][1]
    interp_s, out = statistics.median(t for t, _ in interp), interp[-1][1][0]
    stages, stages_total, final_nodes, stages_export = measure_stages(model, args, ep,
                                                                      reps["stages"])
    return dict(layers=layers, nodes=len(ing.graph.nodes), export=export_s, capture=capture_s,
                two_steps=two_steps_s,
                ingest=ingest_s, eager=eager_s, interp=interp_s,
                err=float(np.abs(out - ref.numpy()).max()), ingested=ing, inputs=x,
                stages=stages, stages_total=stages_total, final_nodes=final_nodes,
                stages_export=stages_export)


def measure_stages(model, args, ep, repeat: int):
    """Every graph stage through the pass manager, as compile() runs them with verify=False: the
    median over ``repeat`` runs of each stage's own ``elapsed_s`` and of their sum. Each run
    starts from a fresh, untimed ingest() so no cache on the graph's objects carries over.
    torch.export.export runs alternate with the stage runs (median returned too), so a burst of
    load from other work hits both sides of the ratio alike."""
    options = CompileOptions(verify=False)
    per_stage, totals, exports, final_nodes = defaultdict(list), [], [], 0
    for _ in range(repeat):
        exports.append(timed(lambda: torch.export.export(model, args, strict=False), 1)[0])
        graph = ingest(ep).graph
        gc.collect()
        records = PassManager(GRAPH_STAGES).run(graph, options)
        for rec in records:
            per_stage[rec.name].append(rec.elapsed_s)
        totals.append(sum(rec.elapsed_s for rec in records))
        final_nodes = len(records[-1].after.nodes)
    return ({name: statistics.median(ts) for name, ts in per_stage.items()},
            statistics.median(totals), final_nodes, statistics.median(exports))


def linear_fit(xs, ys):
    """Least-squares y = a*x + b and its R^2."""
    a, b = np.polyfit(xs, ys, 1)
    pred = np.polyval([a, b], xs)
    ss_tot = float(np.sum((np.asarray(ys) - np.mean(ys)) ** 2))
    r2 = 1.0 - float(np.sum((np.asarray(ys) - pred) ** 2)) / ss_tot if ss_tot else 1.0
    return float(a), float(b), r2


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def report(rows, cfg, reps) -> str:
    fit = linear_fit([r["layers"] for r in rows], [r["ingest"] for r in rows])
    worst_ingest = max(r["ingest"] / r["export"] for r in rows)
    worst_interp = max(r["interp"] / r["eager"] for r in rows)
    linear = verdict(fit[2] >= R2_GOAL) if len(rows) >= 3 else "n/a (fewer than 3 depths)"
    lines = [
        "# Front-end compile time: ingest and graph stages vs torch.export, interpreter vs eager",
        "",
        f"Run {datetime.datetime.now():%Y-%m-%d %H:%M}; {os.cpu_count()} cores (shared, noisy), "
        f"torch {torch.__version__} with {torch.get_num_threads()} threads, numpy {np.__version__} "
        f"(OpenBLAS threads: OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}"
        ", i.e. its default of one per core).",
        f"Model: `gpt(vocab={cfg['vocab']}, width={cfg['width']}, heads={cfg['heads']}, "
        f"seq_len={cfg['seq_len']}, max_seq={cfg['max_seq']}, batch=1)`; vocab shrunk from 50257 so "
        "the tied LM head does not swamp the per-layer costs.",
        "A throwaway export + ingest + run of a tiny model ran first, so torch.export's one-time "
        f"costs are not charged to the first row. Medians of: export {reps['export']}, "
        f"capture {reps['capture']}, ingest {reps['ingest']}, eager/interp {reps['run']} "
        "runs (after one warm-up run each; eager and interp runs alternate).",
        "",
        "*capture s* is the capture to core ATen compile runs, one trace "
        "(`decomposition.export_decomposed`); *torch's s* is torch's own two steps, `torch.export.export` "
        "then `run_decompositions` with the same table, whose program ingests to the same IR.",
        "",
        "| layers | IR nodes | export s | capture s | torch's s | capture / torch's | ingest s | "
        "ingest / export | ingest s / layer | eager s | interp s | interp / eager | max abs err |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['layers']} | {r['nodes']} | {r['export']:.3f} | {r['capture']:.3f} | "
            f"{r['two_steps']:.3f} | {r['capture'] / r['two_steps']:.2f}x | {r['ingest']:.3f} | "
            f"{r['ingest'] / r['export']:.2f}x | "
            f"{r['ingest'] / r['layers']:.4f} | {r['eager']:.4f} | {r['interp']:.4f} | "
            f"{r['interp'] / r['eager']:.2f}x | {r['err']:.1e} |")
    lines += [
        "",
        f"Ingest time fit: {fit[0]:.4f} s/layer + {fit[1]:.4f} s, R^2 = {fit[2]:.4f}.",
        "",
        "| goal | measured | result |",
        "|---|---|---|",
        f"| ingest <= {INGEST_GOAL}x torch.export.export, every depth | worst "
        f"{worst_ingest:.2f}x | {verdict(worst_ingest <= INGEST_GOAL)} |",
        f"| ingest grows linearly with layers (R^2 >= {R2_GOAL}, >= 3 depths) | "
        f"R^2 {fit[2]:.4f} over {len(rows)} depths | {linear} |",
        f"| interpreter <= {INTERP_GOAL}x torch eager, every depth | worst {worst_interp:.2f}x | "
        f"{verdict(worst_interp <= INTERP_GOAL)} |",
        "",
    ]
    return "\n".join(lines + stages_report(rows, reps))


def stages_report(rows, reps) -> list[str]:
    """The second table: every graph stage, against torch.export.export's time."""
    fit = linear_fit([r["layers"] for r in rows], [r["stages_total"] for r in rows])
    goal_rows = [r for r in rows if r["layers"] == STAGES_GOAL_LAYERS]
    at = goal_rows[0] if goal_rows else rows[-1]
    ratio = at["stages_total"] / at["stages_export"]
    at_goal = verdict(ratio <= STAGES_GOAL) if goal_rows else \
        f"n/a ({STAGES_GOAL_LAYERS} layers not run; {verdict(ratio <= STAGES_GOAL)} at {at['layers']})"
    linear = verdict(fit[2] >= R2_GOAL) if len(rows) >= 3 else "n/a (fewer than 3 depths)"
    slowest = max(STAGE_NAMES, key=lambda n: at["stages"][n])
    lines = [
        "## Graph stages vs torch.export",
        "",
        "All graph stages (" + ", ".join(STAGE_NAMES) + ") run through the pass manager on the "
        "ingested graph, as `fexplore.compile(..., verify=False)` runs them; each stage's time is "
        "its `StageRecord.elapsed_s`, *stages s* their sum. Medians of "
        f"{reps['stages']} runs, each from a fresh, untimed `ingest()` (a stage may cache on the "
        "graph's objects, e.g. constants cache their payload digest, and a real compile pays that "
        "once). *export s* here is the median of its own "
        f"{reps['stages']} `torch.export.export` runs, alternated with the stage runs so a burst "
        "of load from other work hits both sides of the ratio alike.",
        "",
        "| layers | nodes in -> out | export s | stages s | stages / export | stages s / layer | "
        + " | ".join(f"{n} s" for n in STAGE_NAMES) + " |",
        "|---:|---:|---:|---:|---:|---:|" + "---:|" * len(STAGE_NAMES),
    ]
    for r in rows:
        lines.append(
            f"| {r['layers']} | {r['nodes']} -> {r['final_nodes']} | {r['stages_export']:.3f} | "
            f"{r['stages_total']:.3f} | {r['stages_total'] / r['stages_export']:.2f}x | "
            f"{r['stages_total'] / r['layers']:.4f} | "
            + " | ".join(f"{r['stages'][n]:.4f}" for n in STAGE_NAMES) + " |")
    lines += [
        "",
        f"Graph-stage time fit: {fit[0]:.4f} s/layer + {fit[1]:.4f} s, R^2 = {fit[2]:.4f}. "
        f"Slowest stage at {at['layers']} layers: {slowest} "
        f"({at['stages'][slowest] / at['stages_total']:.0%} of the stages' time).",
        "",
        "| goal | measured | result |",
        "|---|---|---|",
        f"| all graph stages <= {STAGES_GOAL}x torch.export.export at {STAGES_GOAL_LAYERS} layers | "
        f"{ratio:.2f}x at {at['layers']} layers | {at_goal} |",
        f"| graph-stage time grows linearly with layers (R^2 >= {R2_GOAL}, >= 3 depths) | "
        f"R^2 {fit[2]:.4f} over {len(rows)} depths | {linear} |",
        "",
    ]
    return lines


def profile(row) -> str:
    """Where the time goes at the deepest model: ingest() under cProfile, interpreter per op."""
    prof = cProfile.Profile()
    prof.runcall(ingest, row["ingested"].exported)
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(15)
    runs = []  # per-op seconds, one dict per run; the median per op damps bursts of load
    for _ in range(3):
        per_op, count, last = defaultdict(float), defaultdict(int), [time.perf_counter()]

        def hook(node, outs):  # time since the previous node finished = this node's evaluation
            now = time.perf_counter()
            per_op[node.op.name] += now - last[0]
            count[node.op.name] += 1
            last[0] = now

        last[0] = time.perf_counter()
        ir.run(row["ingested"].graph, row["inputs"], hook=hook)
        runs.append(per_op)
    per_op = {name: statistics.median(r[name] for r in runs) for name in runs[0]}
    total = sum(per_op.values())
    ops = "\n".join(f"  {name:<24} {count[name]:>5}  {s:8.4f} s  {s / total:6.1%}"
                    for name, s in sorted(per_op.items(), key=lambda kv: -kv[1])[:15])
    return (f"## ingest() profile, {row['layers']} layers (top 15 by cumulative time)\n"
            f"{buf.getvalue()}\n## interpreter time per op, {row['layers']} layers (median of 3)\n"
            f"  {'op':<24} {'count':>5}  {'time':>10}  share\n{ops}\n"
            + profile_stages(row))


def profile_stages(row) -> str:
    """cProfile of all graph stages on a fresh ingest at the deepest model, and of the slowest
    stage alone (its input made by the stages before it, untimed)."""
    options = CompileOptions(verify=False)
    ep = row["ingested"].exported
    prof = cProfile.Profile()
    prof.runcall(PassManager(GRAPH_STAGES).run, ingest(ep).graph, options)
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(15)
    slowest = max(STAGE_NAMES, key=lambda n: row["stages"][n])
    graph = ingest(ep).graph
    for stage in GRAPH_STAGES:
        if stage.name == slowest:
            break
        graph = stage.run(graph, options).graph
    prof = cProfile.Profile()
    prof.runcall(stage.run, graph, options)
    buf2 = io.StringIO()
    pstats.Stats(prof, stream=buf2).sort_stats("cumulative").print_stats(15)
    return (f"## graph stages profile, {row['layers']} layers, fresh ingest (top 15 by cumulative "
            f"time)\n{buf.getvalue()}\n## slowest stage alone: {slowest}, {row['layers']} layers "
            f"(top 15 by cumulative time)\n{buf2.getvalue()}\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default="1,2,4,8,16")
    ap.add_argument("--quick", action="store_true", help="layers 1,2 at width 128: a smoke run")
    ap.add_argument("--profile", action="store_true",
                    help="also print a cProfile of ingest() and per-op interpreter times")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "compile_time.md"))
    args = ap.parse_args(argv)
    cfg = dict(vocab=8192, width=768, heads=12, seq_len=128, max_seq=256)
    # ingest takes milliseconds, so many repetitions are cheap and a few are too noisy to fit a line to.
    reps = dict(export=2, capture=3, ingest=15, run=5, stages=5)
    layers = [int(n) for n in args.layers.split(",")]
    if args.quick:
        cfg.update(vocab=512, width=128, heads=4)
        layers = [1, 2]
    # Warm-up: the first torch.export in a process pays for imports, dispatcher and dynamo setup.
    measure(1, dict(cfg, width=64, heads=4, vocab=128, seq_len=16),
            dict(export=1, capture=1, ingest=1, run=1, stages=1))
    rows = []
    for n in layers:
        rows.append(measure(n, cfg, reps))
        print(f"  {n} layers done", file=sys.stderr, flush=True)
    text = report(rows, cfg, reps)
    print(text)
    out = Path(args.out)
    if not args.quick:  # a smoke run must not overwrite the recorded table
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    if args.profile:
        print(profile(rows[-1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

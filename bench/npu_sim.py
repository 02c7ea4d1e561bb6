"""Simulator throughput: simulated commands per second of wall time.

The program is `fexplore.npu.examples.synthetic`: ~10^5 commands over the 8 PEs of `rngd` (per PE a
double-buffered loop of load, load, contract, and every 4th step a vector epilogue and a store).
The goal is >= 200,000 commands/s in timing mode (functional mode off). Functional mode (numpy
executing every command, on small 16x16 tiles) and the Perfetto export are shown for scale.

    .venv/bin/python bench/npu_sim.py [--commands 100000] [--repeat 5]

Prints a table and writes bench/results/npu_sim.md. No assertion: a benchmark reports, it does not fail.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from fexplore.npu import examples, get_target  # noqa: E402
from fexplore.npu.simulator import simulate  # noqa: E402

GOAL = 200_000


def _timed(fn, repeat: int) -> tuple[list[float], object]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return times, out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commands", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "npu_sim.md"))
    args = ap.parse_args(argv)
    target = get_target("rngd")

    t0 = time.perf_counter()
    prog = examples.synthetic(target, args.commands)
    build_s = time.perf_counter() - t0
    n = len(prog)

    def timing_run():
        res = simulate(prog)
        res.cycles  # noqa: B018 - the figures a caller reads first
        return res

    timing, res = _timed(timing_run, args.repeat)
    full, _ = _timed(lambda: simulate(prog).summary(), max(1, args.repeat // 2))

    small = examples.synthetic(target, args.commands, tile=16)
    inputs = {name: np.ones(t.shape, np.float32) for name, t in small.inputs.items()}
    functional, _ = _timed(lambda: simulate(small, inputs), 1)

    with tempfile.TemporaryDirectory() as tmp:
        perfetto, _ = _timed(lambda: res.timeline.to_perfetto(os.path.join(tmp, "t.json")), 1)

    rows = [
        ("build (ProgramBuilder, hazards, SRAM allocation)", [build_s], "once"),
        ("simulate, timing mode (functional off)", timing, f"best of {len(timing)}"),
        ("simulate + summary (utilization, roofline, SRAM peaks)", full, f"best of {len(full)}"),
        ("simulate, functional mode (numpy, 16x16 tiles)", functional, "once"),
        ("Perfetto JSON export (with flows and counters)", perfetto, "once"),
    ]
    best_timing = n / min(timing)
    lines = [
        "# NPU simulator throughput",
        "",
        f"Synthetic program: {n:,} commands on `{target.name}` ({target.num_pes} PEs), "
        f"{res.cycles:,} simulated cycles; busy " +
        ", ".join(f"{e} {u:.0%}" for e, u in res.utilization.items()) + ".",
        f"Run {time.strftime('%Y-%m-%d %H:%M')}; Python {platform.python_version()} on "
        f"{platform.machine()}, {os.cpu_count()} cores (shared, noisy: figures vary run to run).",
        "",
        "| what | wall s (best) | wall s (median) | commands / s | runs |",
        "|---|---:|---:|---:|---|",
    ]
    for what, times, runs in rows:
        lines.append(f"| {what} | {min(times):.3f} | {statistics.median(times):.3f} | "
                     f"{n / min(times):,.0f} | {runs} |")
    verdict = "PASS" if best_timing >= GOAL else "MISS"
    lines += ["", "| goal | measured | result |", "|---|---|---|",
              f"| timing mode >= {GOAL:,} commands/s (10^5 commands, {target.num_pes} PEs) | "
              f"{best_timing:,.0f} best, {n / statistics.median(timing):,.0f} median | {verdict} |", ""]
    text = "\n".join(lines)
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

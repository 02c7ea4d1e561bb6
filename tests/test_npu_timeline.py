"""Timelines: Perfetto trace-event JSON, tables, and the matplotlib Gantt view."""

import json
import subprocess
import sys
from collections import Counter

import pytest

from fexplore.npu import examples, get_target


@pytest.fixture(scope="module")
def result():
    return examples.tiled_matmul("tiny", 64, 64, 64, tile=(32, 32, 32)).simulate()


def test_perfetto_json_has_a_track_per_engine_per_pe_and_every_event(result, tmp_path):
    path = result.timeline.to_perfetto(tmp_path / "trace.json")
    with open(path) as f:
        doc = json.load(f)
    events = doc["traceEvents"]
    tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
              if e["ph"] == "M" and e["name"] == "thread_name"}
    pes = get_target("tiny").num_pes
    assert set(tracks) == {(pe, eng) for pe in range(pes) for eng in range(3)}
    assert tracks[(1, 1)] == "PE1 tensor"
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == len(result.timeline) == len(result.program.commands)
    assert Counter(e["cat"] for e in complete) == Counter(e.engine for e in result.timeline)
    # timestamps are microseconds: at 1 GHz one cycle is 1 ns
    last = max(e["ts"] + e["dur"] for e in complete)
    assert last == pytest.approx(result.cycles / 1000, abs=1e-3)


def test_perfetto_flows_and_counters(result):
    events = result.timeline.to_perfetto_dict()["traceEvents"]
    starts = {e["id"] for e in events if e["ph"] == "s"}
    finishes = {e["id"] for e in events if e["ph"] == "f"}
    assert starts and starts == finishes                 # every dependency arrow has both ends
    counters = Counter(e["name"] for e in events if e["ph"] == "C")
    assert counters["SRAM bytes"] > 0 and counters["DRAM bandwidth (B/cycle)"] > 0
    peak = max(e["args"]["live"] for e in events if e["ph"] == "C" and e["name"] == "SRAM bytes")
    assert peak == max(result.sram_peak) <= get_target("tiny").sram_bytes_per_pe
    bw = [e["args"]["in use"] for e in events if e["name"] == "DRAM bandwidth (B/cycle)"]
    assert max(bw) <= get_target("tiny").dram_bytes_per_cycle and bw[-1] == 0
    no_flows = result.timeline.to_perfetto_dict(flows=False)["traceEvents"]
    assert not any(e["ph"] in "sf" for e in no_flows)


def test_timeline_dataframe_and_window(result):
    df = result.timeline.to_dataframe()
    assert len(df) == len(result.timeline)
    assert set(df.columns) >= {"pe", "engine", "start", "end", "cmd", "name", "loc", "cycles"}
    assert (df.cycles > 0).all()
    mid = result.cycles / 2
    inside = result.timeline.window(mid, mid + 100)
    assert inside and all(e.end > mid and e.start < mid + 100 for e in inside)


def test_gantt_chart_and_inline_html(result):
    from fexplore.viz.timeline import plot_timeline

    fig = plot_timeline(result.timeline)
    ax = fig.axes[0]
    assert len(ax.get_yticklabels()) == 3 * get_target("tiny").num_pes   # a lane per engine per PE
    assert ax.get_xlim() == (0, result.timeline.makespan)
    zoomed = result.timeline.plot(window=(100, 600))
    assert zoomed.axes[0].get_xlim() == (100, 600)
    assert result.timeline._repr_html_().startswith("<img src=\"data:image/png;base64,")
    html = result._repr_html_()
    assert "cycles" in html and "<img" in html and "roofline" in html


def test_headless_use_imports_neither_matplotlib_nor_pandas():
    # whatever the rest of fexplore imports, the NPU layer itself adds neither until a view is asked for
    code = ("import sys, fexplore\n"
            "before = {m for m in ('matplotlib', 'pandas') if m in sys.modules}\n"
            "from fexplore.npu import examples\n"
            "r = examples.softmax('tiny', 32, 64).simulate()\n"
            "r.timeline.to_perfetto_dict(); r.roofline; r.utilization; r.sram_peak; repr(r)\n"
            "bad = [m for m in ('matplotlib', 'pandas') if m in sys.modules and m not in before]\n"
            "assert not bad, bad\n"
            "assert 'matplotlib' not in before\n")
    subprocess.run([sys.executable, "-c", code], check=True)

"""ONNX's backend node tests as a conformance run for the ONNX door.

``onnx.backend.test.case.node.collect_testcases`` builds every node test in memory: a one-op
model, its inputs and expected outputs (numpy's RNG seeded, so the cases are the same on every
run). Each case runs through ONNX Runtime first; a case ONNX Runtime cannot load, run or get
right is not counted. The others are ingested by fexplore, taken through the graph stages up to
fusion, and run by the IR interpreter; the result is compared with ONNX Runtime's. Outcomes:

- ``pass``: same numbers (integers exactly; floats within the tolerance below);
- ``refused``: a FexploreError (a clear refusal, with code and hint);
- ``wrong``: different numbers, or outputs of another shape or dtype;
- ``crash``: any other exception (a bug: fexplore must never raise a raw Python exception); on the
  chip, also a kernel generator that raised, whose node then ran on the host (``codegen_bugs``).
"""

from __future__ import annotations

import contextlib
import io
import warnings
from dataclasses import dataclass

import numpy as np

from fexplore.errors import FexploreError

# ONNX's own backend tests compare with rtol 1e-3, atol 1e-7; the interpreter and ONNX Runtime
# round f32 differently (transcendentals, summation order), so the absolute term is a little wider.
RTOL, ATOL = 1e-3, 1e-5
STAGES_RUN = ("ingest", "fold", "simplify", "shapes", "layout", "fusion")


@dataclass
class Outcome:
    name: str
    op_type: str
    status: str        # pass, refused, wrong, crash, or skip (ONNX Runtime fails it)
    detail: str = ""


def collect(pattern: str | None = None) -> list:
    """The node test cases (model, data sets), with their generators' warnings silenced; with
    `pattern`, those of that op type (a case with a node of it, and its ``_expanded`` twins).

    ONNX's ``collect_testcases(op_type)`` filters at import time, once per process: a filtered
    first call leaves every later one with that op's cases only. So all are collected, always,
    and filtered here."""
    from onnx.backend.test.case import node

    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        cases = node.collect_testcases(None)
    cases = [c for c in cases if c.model is not None and c.data_sets]
    if pattern is None:
        return cases
    own = {c.name for c in cases if any(n.op_type == pattern for n in c.model.graph.node)}
    return [c for c in cases if c.name in own or c.name.split("_expanded")[0] in own]


def op_type_of(case) -> str:
    """The op a case tests: its model's main node (the last one of a few, else the only)."""
    nodes = case.model.graph.node
    return nodes[-1].op_type if nodes else "?"


def _close(got, want) -> str | None:
    if len(got) != len(want):
        return f"{len(got)} outputs, ONNX Runtime gives {len(want)}"
    for i, (a, b) in enumerate(zip(got, want)):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            return f"output {i}: shape {a.shape}, ONNX Runtime {b.shape}"
        if a.dtype != b.dtype:
            return f"output {i}: dtype {a.dtype}, ONNX Runtime {b.dtype}"
        if b.dtype.kind in "biuUSO":
            if not np.array_equal(a, b):
                return f"output {i}: {int(np.count_nonzero(a != b))} of {b.size} values differ"
            continue
        if not np.allclose(a.astype(np.float64), b.astype(np.float64), rtol=RTOL, atol=ATOL,
                           equal_nan=True):
            d = np.abs(a.astype(np.float64) - b.astype(np.float64))
            return f"output {i}: max |diff| {np.nanmax(d):.3g}"
    return None


def reference(case):
    """ONNX Runtime's outputs on the case's first data set, or None if ONNX Runtime cannot load
    or run the model or disagrees with the expected outputs."""
    from fexplore.pipeline.onnx.oracle import run_session, session

    inputs, expected = case.data_sets[0]
    if not all(isinstance(a, np.ndarray) for a in list(inputs) + list(expected)):
        return None  # sequences, optionals: not tensors
    try:
        sess = session(case.model)
        names = [i.name for i in sess.get_inputs()]
        outs = run_session(sess, names, inputs)
    except Exception:
        return None
    if _close(outs, expected) is not None:
        return None
    return outs


def run_case(case, stages=STAGES_RUN, *, chip: bool = False) -> Outcome:
    """One case through ``stages`` and the interpreter, or with ``chip`` through every stage
    to a CompiledModel run on the simulated NPU."""
    from fexplore.ir import run
    from fexplore.pipeline.driver import explore

    op = op_type_of(case)
    want = reference(case)
    if want is None:
        return Outcome(case.name, op, "skip", "ONNX Runtime fails it")
    inputs = list(case.data_sets[0][0])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ex = explore(case.model, inputs, verify=False)
            if chip:
                got = ex.result(*inputs)
            else:
                for _ in stages:
                    ex.step()
                got = run(ex.records[-1].after, inputs)
    except FexploreError as e:
        return Outcome(case.name, op, "refused", str(e).splitlines()[0][:160])
    except Exception as e:  # noqa: BLE001  (the point: count every raw exception)
        return Outcome(case.name, op, "crash", f"{type(e).__name__}: {str(e)[:160]}")
    bugs = ex.result.codegen_bugs if chip else None
    if bugs:   # a generator that raised: its node ran on the host, right but not on the chip
        return Outcome(case.name, op, "crash", f"codegen bug behind a host fallback: {bugs[0][:160]}")
    bad = _close(got, want)
    return Outcome(case.name, op, "wrong" if bad else "pass", bad or "")

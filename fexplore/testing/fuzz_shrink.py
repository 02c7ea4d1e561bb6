"""Shrinking a failing fuzz case to a minimal module that fails the same way.

Greedy, in rounds until nothing changes (or the budget runs out), each step kept only if the
program is still valid in eager and still fails with the same signature (outcome, stage and
error code, see ``CaseResult.signature``):

1. drop outputs (and every op only they needed), or return an operand of an output's op instead;
2. bypass an op: its uses read one of its operands of the same shape and dtype instead, or a new
   model input of its shape and dtype (always possible, so any op can go);
3. turn an op's flag off (a bias, a projection, an affine norm);
4. shrink a model input's dims (to 1, to half, by one): every op's rendering follows the shapes.

The result prints as standalone Python source (``Program.source()``) and, with
:func:`regression_source`, as a regression test.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable

from .fuzz import Input, InvalidProgram, Op, Program, live, render, substitute
from .fuzz_check import CaseResult, check

DTYPE_NAMES = {"torch.float32": "float32", "torch.bfloat16": "bfloat16",
               "torch.float16": "float16", "torch.int64": "int64", "torch.bool": "bool"}


@dataclass
class Shrunk:
    program: Program
    result: CaseResult  # the shrunk program's failure
    checks: int  # compiles run while shrinking
    seconds: float


def shrink(program: Program, failure: CaseResult | None = None, *,
           check_fn: Callable[[Program], CaseResult] = check, budget_s: float = 180.0,
           max_checks: int = 300) -> Shrunk:
    """The smallest program found that fails like ``program`` (``failure``: its result, else it
    is checked first)."""
    t0 = time.perf_counter()
    failure = failure or check_fn(program)
    want = failure.signature
    best, best_result = program, failure
    checks = 0

    def still_fails(candidate: Program) -> CaseResult | None:
        nonlocal checks
        try:
            render(candidate)
        except InvalidProgram:
            return None
        checks += 1
        r = check_fn(candidate)
        return r if r.signature == want else None

    def out_of_budget() -> bool:
        return time.perf_counter() - t0 > budget_s or checks >= max_checks

    changed = True
    while changed and not out_of_budget():
        changed = False
        for candidate in _candidates(best):
            if out_of_budget():
                break
            candidate = live(candidate)
            if _size(candidate) >= _size(best):
                continue
            r = still_fails(candidate)
            if r is not None:
                best, best_result, changed = candidate, r, True
                break  # candidates are re-made from the smaller program
    label = f"{program.label}, shrunk" if program.label else "shrunk"
    return Shrunk(replace(best, label=label), best_result, checks, time.perf_counter() - t0)


def _size(p: Program) -> tuple:
    """Smaller is simpler: fewer ops, fewer outputs, fewer elements in the inputs, fewer flags
    set."""
    elements = sum(_numel(s.shape) for s in p.inputs)
    flags = sum(1 for op in p.ops for _, v in op.attrs if v is True) + p.nested + p.dynamic
    return (len(p.ops), len(p.outputs), elements, flags)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _candidates(p: Program):
    if len(p.outputs) > 1:
        for i in range(len(p.outputs)):
            yield replace(p, outputs=p.outputs[:i] + p.outputs[i + 1:])
    if p.nested:
        yield replace(p, nested=False)
    producers = {op.out: op for op in p.ops}
    for i, o in enumerate(p.outputs):  # return an operand of the output's op instead
        for a in dict.fromkeys(producers[o].args if o in producers else ()):
            if a in producers and a not in p.outputs:
                yield replace(p, outputs=p.outputs[:i] + (a,) + p.outputs[i + 1:])
    try:
        values = render(p).values
    except InvalidProgram:
        return
    for op in reversed(p.ops):
        yield from _bypasses(p, op, values)
    for i, op in enumerate(p.ops):
        for key, v in op.attrs:
            if v is True:
                attrs = tuple((k, False if k == key else x) for k, x in op.attrs)
                yield replace(p, ops=p.ops[:i] + (replace(op, attrs=attrs),) + p.ops[i + 1:])
    for i, spec in enumerate(p.inputs):
        for d, size in enumerate(spec.shape):
            for smaller in sorted({1, size // 2, size - 1}):
                if 1 <= smaller < size:
                    shape = spec.shape[:d] + (smaller,) + spec.shape[d + 1:]
                    inputs = p.inputs[:i] + (replace(spec, shape=shape),) + p.inputs[i + 1:]
                    yield replace(p, inputs=inputs)


def _bypasses(p: Program, op: Op, values: dict):
    out = values[op.out]
    for a in dict.fromkeys(op.args):
        t = values[a]
        if tuple(t.shape) == tuple(out.shape) and t.dtype == out.dtype:
            yield substitute(p, op.out, a)
    dtype = DTYPE_NAMES.get(str(out.dtype))
    if dtype is not None:
        name = f"x_{op.out}"
        q = substitute(p, op.out, name)
        yield replace(q, inputs=q.inputs + (Input(name, tuple(out.shape), dtype),))


def regression_source(program: Program, failure: CaseResult, *, xfail: str | None = None,
                      target: str = "rngd", precision: str = "fp32") -> str:
    """The program's source as a pytest module: the failure it reproduced in its docstring, and a
    test that it now compiles and equals eager (``xfail``: the reason of a known open bug; the
    test is then expected to fail, strictly)."""
    src = program.source()
    doc, rest = src.split('"""', 2)[1], src.split('"""', 2)[2]
    found = (f"Found failing: {failure.outcome} in stage '{failure.stage}'"
             + (f" [{failure.code}]" if failure.code else "") + f": {failure.detail}")
    head = f'"""{doc}\n\n{_wrap(found)}\n"""'
    mark = ""
    if xfail:
        mark = f"@pytest.mark.xfail(strict=True, reason={xfail!r})\n"
    where = ("" if target == "rngd" else f", target={target!r}") + \
        ("" if precision == "fp32" else f", precision={precision!r}")
    test = (f"\n\n\n{mark}def test_compiles_and_matches_eager():\n"
            f"    assert_matches_eager(globals(){where})\n")
    imports = "import pytest\n" if xfail else ""
    rest = rest.replace("\nSEED = ", "\nfrom fexplore.testing.fuzz_check import assert_matches_eager\n"
                        "\nSEED = ", 1)
    return head + "\n\n" + imports + rest.lstrip("\n").rstrip("\n") + test


def _wrap(text: str, width: int = 96) -> str:
    words, lines, line = text.split(), [], ""
    for w in words:
        if line and len(line) + 1 + len(w) > width:
            lines.append(line)
            line = w
        else:
            line = f"{line} {w}" if line else w
    return "\n".join(lines + [line])

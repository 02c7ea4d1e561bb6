"""One fuzz case, compiled through every stage and compared with eager on two input sets.

A case is compiled the way ``fexplore.compile`` does (default target: every graph stage, lower,
schedule, each verified), then the compiled model runs on the simulated NPU on the example inputs
and on a second input set the compile never saw. Its outputs must equal eager's: same number,
dtypes and shapes; integers and bools exactly; floats within the tolerance of the lowest-precision
float the model computes in (``fexplore.pipeline.numeric.TOLERANCES``) plus the multiple of eager's
own f32 noise the compile's verification allows (``docs/numerics.md``).

Each case ends in one outcome:

- ``pass``: compiled, and both runs equal eager;
- ``refused``: a FexploreError whose code is in ``REFUSAL_CODES``: fexplore said clearly that it
  does not take this op or model;
- ``crash``: any other exception, including a FexploreError that is not a refusal (the verifier's
  structural error, a kernel-language error from generated code, a malformed NPU program): a
  stage was wrong or broke; or the compile changed the user's model (a parameter, a buffer, a
  training flag); or a kernel generator raised and the lower stage ran its node on the host
  (``codegen_bugs``: the numbers are right, the chip never saw the node);
- ``wrong``: the compiled model's outputs differ from eager's, or the compile's own numeric
  verification caught a stage changing the numbers (``NumericMismatchError``);
- ``timeout``: the case took longer than its time limit;
- ``invalid``: the module itself does not run in eager (a generator bug, not a compiler bug).
"""

from __future__ import annotations

import contextlib
import io
import time
import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

from .fuzz import InvalidProgram, Program, load_source
from .limits import CaseTimeout, time_limit

# Codes that are a clear refusal, not a bug:
# - FX400 UnsupportedOperatorError: the model uses an op (or an op in a way) fexplore declares it
#   does not compile; the message names the op and the hint says how to add it.
# - FX401 ExportError: torch.export itself cannot capture the module; nothing of fexplore ran.
# Every other code is a bug when a valid small module meets it: FX300/FX403 are stages producing
# wrong IR, FK1xx are generated kernels breaking the kernel language's rules, FX5xx are a schedule
# the simulator rejects (these shapes are far below the chip's SRAM), FX402 is the compiled model
# rejecting the very inputs it was compiled for.
REFUSAL_CODES = {
    "FX400": "unsupported operator",
    "FX401": "torch.export cannot capture the module",
}

OUTCOMES = ("pass", "refused", "crash", "wrong", "timeout", "invalid")

# The second input set's seed, offset from the example set's
SECOND_SET = 7919


@dataclass
class CaseResult:
    outcome: str
    detail: str = ""
    code: str = ""  # the FexploreError's code, if one was raised
    stage: str = ""  # the stage that raised or whose verification failed; "run" for cm(*inputs)
    seconds: float = 0.0

    @property
    def signature(self) -> str:
        """What makes two failures the same failure (the shrinker keeps it)."""
        return f"{self.outcome}:{self.stage}:{self.code or self.detail.split(':')[0]}"


def check(program: Program, *, timeout: float | None = 60.0, target="rngd",
          precision: str = "fp32") -> CaseResult:
    """Compile the program's module and compare it with eager (see the module doc)."""
    t0 = time.perf_counter()
    try:
        scope = load_source(program.source())
    except InvalidProgram as e:
        return CaseResult("invalid", str(e), seconds=time.perf_counter() - t0)
    sets, resize = input_sets_of(scope)
    r = check_model(scope["make_model"](), sets, resize, timeout=timeout, target=target,
                    precision=precision, dynamic_shapes=scope.get("DYNAMIC_SHAPES"))
    r.seconds = time.perf_counter() - t0
    return r


def input_sets_of(scope: dict) -> tuple[list, Any]:
    """(the example inputs and a second set of their size, a function giving a second set at
    another batch size: None unless the program is dynamic)."""
    make, seed = scope["make_inputs"], scope["SEED"]
    sets = [make(seed), make(seed + SECOND_SET)]
    if "BATCH" not in scope:
        return sets, None
    return sets, lambda batch: make(seed + SECOND_SET, batch=batch)


def check_model(model: torch.nn.Module, input_sets, resize=None, *,
                timeout: float | None = 60.0, target="rngd", precision: str = "fp32",
                dynamic_shapes=None) -> CaseResult:
    """Compile ``model`` for ``target`` at ``precision`` (and ``dynamic_shapes``) on the first
    input set and compare it with eager on every set (a set is a tuple of the forward's
    arguments, or one tensor). ``resize(n)``: a second set at batch size ``n``, which replaces
    the second set when the compiled graph's first dim is symbolic (at the nearest size in the
    range torch.export found for it that eager also runs)."""
    import fexplore
    from fexplore.errors import FexploreError, NumericMismatchError
    from fexplore.pipeline.numeric import Oracle

    t0 = time.perf_counter()
    input_sets = [(s,) if isinstance(s, torch.Tensor) else tuple(s) for s in input_sets]
    oracles = []
    for inputs in input_sets:
        try:
            with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                oracles.append(Oracle(model, tuple(inputs), random_sets=0, precision=precision))
        except Exception as e:
            return CaseResult("invalid", f"eager raises: {type(e).__name__}: {_line(str(e))}")
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    training = [m.training for m in model.modules()]
    ex = None
    stage = "ingest"
    try:
        with time_limit(timeout), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ex = fexplore.explore(model, tuple(input_sets[0]), target=target,
                                  precision=precision, dynamic_shapes=dynamic_shapes)
            while not ex.done:
                stage = ex.stage_names[len(ex.records)]
                ex.step()
            stage = "result"
            cm = ex.result
            stage = "run"
            if resize is not None:
                input_sets, oracles = _resized(cm, model, input_sets, oracles, resize, precision)
            outs = [pytree.tree_leaves(cm(*inputs)) for inputs in input_sets]
    except CaseTimeout as e:
        return CaseResult("timeout", str(e), stage=stage, seconds=time.perf_counter() - t0)
    except NumericMismatchError as e:
        return CaseResult("wrong", _line(e.message), e.code, _failed_stage(ex, stage),
                          time.perf_counter() - t0)
    except FexploreError as e:
        outcome = "refused" if e.code in REFUSAL_CODES else "crash"
        return CaseResult(outcome, _line(e.message), e.code, _failed_stage(ex, stage),
                          time.perf_counter() - t0)
    except Exception as e:
        return CaseResult("crash", f"{type(e).__name__}: {_line(str(e))}", "", stage,
                          time.perf_counter() - t0)
    changed = [k for k, v in model.state_dict().items()
               if k not in before or not torch.equal(v, before[k])]
    if changed or training != [m.training for m in model.modules()]:
        what = f"its {', '.join(changed[:3])}" if changed else "a module's training flag"
        return CaseResult("crash", f"compiling changed the user's model: {what}", "", "compile",
                          time.perf_counter() - t0)
    bugs = cm.codegen_bugs
    if bugs:   # a generator that raised: its node ran on the host, right but not on the chip
        return CaseResult("crash", f"codegen bug behind a host fallback: {_line(bugs[0])}", "", "lower",
                          time.perf_counter() - t0)
    for i, (got, oracle) in enumerate(zip(outs, oracles)):
        bad = compare_with_eager(got, oracle, cm)
        if bad:
            which = "example inputs" if i == 0 else "a second input set"
            return CaseResult("wrong", f"on {which}: {bad}", "", "run", time.perf_counter() - t0)
    return CaseResult("pass", seconds=time.perf_counter() - t0)


def _resized(cm, model, input_sets, oracles, resize, precision):
    """The sets with the second one at another batch size, if the compiled graph's first input
    has a symbolic dim 0 whose range (torch.export's) holds another size eager runs at."""
    from fexplore.pipeline.numeric import Oracle

    g = cm.stages[0].after
    dim = g.inputs[0].type.shape[0] if g.inputs and g.inputs[0].type.shape else 0
    if isinstance(dim, int) or str(dim) not in g.symbols:
        return input_sets, oracles
    batch = int(input_sets[0][0].shape[0])
    # every input resize() grows must be dynamic in that same dim: export may have kept one
    # of them static, and the compiled model then rightly refuses it at another size
    for v, x in zip(g.inputs, input_sets[0]):
        if isinstance(x, torch.Tensor) and x.dim() and x.shape[0] == batch and \
                (not v.type.shape or str(v.type.shape[0]) != str(dim)):
            return input_sets, oracles
    lo, hi = g.symbols[str(dim)]
    for n in (batch + 1, batch - 1, batch + 2):
        if n >= max(lo, 1) and (hi is None or n <= hi):
            other = tuple(resize(n))
            try:
                with contextlib.redirect_stderr(io.StringIO()):
                    oracle = Oracle(model, other, random_sets=0, precision=precision)
            except Exception:  # the module ties its batch to a size: not this one
                continue
            return [input_sets[0], other], [oracles[0], oracle]
    return input_sets, oracles


def _failed_stage(ex, running: str) -> str:
    """The stage whose verification failed (the result property raises for it), else the one
    that was running."""
    if ex is not None and running == "result":
        bad = next((r.name for r in ex.records
                    if r.verification is not None and not r.verification.ok), None)
        return bad or running
    return running


def compare_with_eager(got: list, oracle, cm) -> str | None:
    """None when the compiled model's flat outputs equal eager's; else what differs."""
    from fexplore.ir import DType
    from fexplore.pipeline.convert import ir_dtype
    from fexplore.pipeline.numeric import (TOLERANCES, compare, narrow_noise_of, output_dtypes,
                                           policy_noise_of, to_numpy)

    want = oracle.expected[0]
    if len(got) != len(want):
        return f"{len(got)} outputs, eager gives {len(want)}"
    eager = oracle_torch_dtypes(oracle)
    for i, (g, w) in enumerate(zip(got, want)):
        if not isinstance(g, torch.Tensor):
            return f"output {i} is a {type(g).__name__}, not a tensor"
        if tuple(g.shape) != tuple(w.shape) or (eager and g.dtype != eager[i]):
            return (f"output {i} is {g.dtype}{list(g.shape)}, eager gives "
                    f"{eager[i] if eager else w.dtype}{list(w.shape)}")
    # per output, the tolerance of the lowest-precision float the model computes it through, as
    # its compile is held: an output the precision stage's casts narrowed is allowed eager's
    # measured error under the same policy when the oracle measured it, else that policy's
    # fixed tolerance
    order = list(TOLERANCES)[::-1]  # fp8, bf16, f16, f32
    policy = policy_noise_of(oracle, 0, cm.graph)
    own, compiled = output_dtypes(cm.stages[0].after), output_dtypes(cm.graph)
    tols = []
    for i, g in enumerate(got):
        dtypes = {own[i] if i < len(own) else DType.f32}
        if g.dtype.is_floating_point:
            dtypes.add(ir_dtype(g.dtype))
        if (policy is None or policy[i] is None) and i < len(compiled):
            dtypes.add(compiled[i])
        tols.append(TOLERANCES[next((d for d in order if d in dtypes), order[-1])])
    _, _, ok, detail = compare([to_numpy(g) for g in got], want, tols, oracle.noise[0],
                               policy, oracle.precision, narrow_noise_of(oracle, 0))
    return None if ok else detail


def oracle_torch_dtypes(oracle) -> list:
    """Eager's output dtypes as torch dtypes (the oracle keeps numpy arrays)."""
    from fexplore.ir import DType
    from fexplore.pipeline.convert import torch_dtype

    try:
        return [torch_dtype(DType.from_numpy(a.dtype)) for a in oracle.expected[0]]
    except Exception:
        return []


def assert_matches_eager(scope: dict, *, target="rngd", precision: str = "fp32",
                         timeout: float | None = None):
    """A regression test's body, given its module's globals (make_model, make_inputs, SEED,
    and BATCH and DYNAMIC_SHAPES for a dynamic one): the module compiles (for ``target`` at
    ``precision``) and equals eager on its example inputs and on a second input set."""
    sets, resize = input_sets_of(scope)
    r = check_model(scope["make_model"](), sets, resize, timeout=timeout, target=target,
                    precision=precision, dynamic_shapes=scope.get("DYNAMIC_SHAPES"))
    assert r.outcome == "pass", f"{r.outcome} in {r.stage}: [{r.code}] {r.detail}"


def _line(s: str) -> str:
    s = s.strip()
    return s.splitlines()[0][:300] if s else ""

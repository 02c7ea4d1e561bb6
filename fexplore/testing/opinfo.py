"""PyTorch's OpInfo database as a conformance suite for fexplore.

``torch.testing._internal.common_methods_invocations.op_db`` holds, for every op, PyTorch's own
sample inputs (the ones its own test suite runs). Each sample becomes a one-op module whose tensor
arguments are its inputs; that module is compiled through every stage (verified against eager at
each one) and the compiled model's outputs are compared with eager's. The same module also goes
through torch.export alone (export, ``run_decompositions``, run): what torch.export itself gets
right is the reference pass rate, and samples it fails are left out of fexplore's denominator.

Each sample ends in one of these outcomes:

- ``pass``: every stage verified, and the compiled model gives eager's dtypes, shapes and values;
- ``refused``: a :class:`fexplore.errors.FexploreError` (code, message, hint) that is not a numeric
  mismatch, i.e. fexplore said clearly that it does not do this;
- ``wrong``: a :class:`~fexplore.errors.NumericMismatchError`, or outputs that differ from eager;
- ``raw``: any other exception, a bug by definition; or a kernel generator that raised, whose node
  the lower stage then ran on the host (``codegen_bugs``: right, but not on the chip);
- ``excluded``: the sample is not a test of an op (eager raised, or its output is not tensors).

Values are compared with fexplore's own :func:`fexplore.pipeline.numeric.compare`, at the
tolerance of the output's dtype plus eager's own rounding noise (an f64 run of the same module, as
the compile's verification does); integers and bools must be equal.

Used by ``tests/test_opinfo.py`` (a seeded subset) and ``bench/opinfo.py`` (the whole run).
"""

from __future__ import annotations

import contextlib
import io
import random
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Sequence

import torch
import torch.utils._pytree as pytree

# The float dtype every op is sampled in; the narrow floats a model may compute in by itself; and
# the integer/bool dtypes. Each but the first is sampled where an op takes it.
FLOAT_DTYPE = torch.float32
NARROW_DTYPES = (torch.float16, torch.bfloat16)
INT_DTYPES = (torch.int64, torch.int32, torch.uint8, torch.bool)

# OpInfo entries of the ops real models use most, beside those matching a converter's ATen name.
# Complex-only, linear-algebra, FFT and special-function entries are left out: no model the
# compiler targets carries them.
COMMON_OPS = (
    # layers
    "nn.functional.linear", "nn.functional.conv1d", "nn.functional.conv2d",
    "nn.functional.conv_transpose2d", "nn.functional.embedding", "nn.functional.layer_norm",
    "nn.functional.batch_norm", "nn.functional.group_norm", "nn.functional.instance_norm",
    "nn.functional.rms_norm", "nn.functional.local_response_norm",
    "nn.functional.scaled_dot_product_attention", "nn.functional.max_pool1d",
    "nn.functional.max_pool2d", "nn.functional.avg_pool1d", "nn.functional.avg_pool2d",
    "nn.functional.adaptive_avg_pool1d", "nn.functional.adaptive_avg_pool2d",
    "nn.functional.adaptive_max_pool1d", "nn.functional.adaptive_max_pool2d",
    "nn.functional.adaptive_max_pool3d", "nn.functional.pad", "nn.functional.interpolate",
    "nn.functional.upsample_nearest", "nn.functional.upsample_bilinear",
    "nn.functional.pixel_shuffle", "nn.functional.pixel_unshuffle", "nn.functional.unfold",
    "nn.functional.channel_shuffle", "nn.functional.dropout", "nn.functional.one_hot",
    "nn.functional.normalize", "nn.functional.cosine_similarity",
    "nn.functional.pairwise_distance",
    # activations
    "nn.functional.relu", "nn.functional.relu6", "nn.functional.gelu", "nn.functional.silu",
    "nn.functional.elu", "nn.functional.celu", "nn.functional.selu", "nn.functional.leaky_relu",
    "nn.functional.prelu", "nn.functional.hardtanh", "nn.functional.hardsigmoid",
    "nn.functional.hardswish", "nn.functional.softplus", "nn.functional.mish",
    "nn.functional.logsigmoid", "nn.functional.softsign", "nn.functional.tanhshrink",
    "nn.functional.threshold", "nn.functional.hardshrink", "nn.functional.softshrink",
    "nn.functional.glu", "nn.functional.softmin",
    # losses
    "nn.functional.cross_entropy", "nn.functional.nll_loss", "nn.functional.mse_loss",
    "nn.functional.l1_loss", "nn.functional.smooth_l1_loss", "nn.functional.huber_loss",
    "nn.functional.binary_cross_entropy_with_logits", "nn.functional.kl_div",
    # elementwise math
    "exp2", "log2", "log10", "square", "trunc", "frac", "tan", "sinh", "cosh", "asin", "acos",
    "atan", "asinh", "atan2", "erfc", "logit", "sinc", "deg2rad", "rad2deg", "float_power",
    "true_divide", "xlogy", "logaddexp", "hypot", "copysign", "fmax", "fmin", "lerp", "addcmul",
    "addcdiv", "nan_to_num", "isnan", "isinf", "isfinite", "signbit", "sgn", "positive",
    "heaviside", "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift",
    "__radd__", "__rsub__", "__rmul__", "__rdiv__", "__rpow__", "__rmod__",
    # reductions and scans
    "logsumexp", "std", "std_mean", "var_mean", "aminmax", "nansum", "nanmean", "count_nonzero",
    "cumprod", "logcumsumexp", "cummax", "cummin", "argsort", "norm", "linalg.vector_norm",
    "diff",
    # contractions
    "baddbmm", "addbmm", "addmv", "addr", "einsum", "outer", "dot", "mv", "inner", "tensordot",
    "__rmatmul__",
    # shapes, views, joins and gathers
    "movedim", "ravel", "view_as", "reshape_as", "tile", "hstack", "vstack", "dstack",
    "column_stack", "atleast_1d", "atleast_2d", "atleast_3d", "broadcast_tensors", "hsplit",
    "vsplit", "unsafe_split", "unsafe_chunk", "flipud", "fliplr", "rot90", "narrow_copy",
    "take_along_dim", "index_add", "index_fill", "scatter_reduce", "diagonal", "diag_embed",
    "mT", "T", "__getitem__",
    # creation and casts
    "eye", "linspace", "tril_indices", "triu_indices", "empty", "empty_like", "new_empty",
    "fill", "zero_", "float", "double", "half", "bfloat16", "long", "int", "short", "char",
    "byte", "bool",
)


# Entries whose output torch leaves unspecified (uninitialized memory): any content is a right
# answer, so their samples compare nothing and are excluded (PyTorch's own tests skip them too).
UNSPECIFIED_OUTPUT = {"empty", "empty_like", "new_empty", "empty_permuted", "empty_strided",
                      "new_empty_strided"}

# Variants of selected entries that test something no model the compiler targets does.
SKIPPED_VARIANTS = {
    "norm.nuc": "the nuclear norm is a singular value decomposition (linear algebra)",
}


@dataclass
class SampleResult:
    op: str  # the OpInfo entry's name (with its variant, ``max.reduction_with_dim``)
    dtype: str
    index: int  # the sample's position among the entry's samples of that dtype
    outcome: str  # pass | refused | wrong | raw | excluded
    export: str  # pass | fail | excluded: what torch.export alone does with the sample
    detail: str = ""  # the refusal's code and message, the mismatch, or why it was excluded
    code: str = ""  # the FexploreError's code for refusals and mismatches
    seconds: float = 0.0

    @property
    def counted(self) -> bool:
        """In fexplore's denominator: a test of an op that torch.export itself gets right."""
        return self.outcome != "excluded" and self.export == "pass"


@dataclass
class Case:
    """One OpInfo sample as a module and its inputs."""

    op: str
    dtype: torch.dtype
    index: int
    module: torch.nn.Module
    inputs: tuple
    describe: str = ""
    after: list = field(default_factory=list)   # the inputs as eager leaves them (``_eager``)

    def fresh_inputs(self) -> tuple:
        """Copies of the inputs: an op that writes into an argument (running statistics, say)
        must not change what the next run sees."""
        return tuple(x.clone() for x in self.inputs)


class OneOp(torch.nn.Module):
    """``op(*args, **kwargs)`` of one sample; its tensors are the forward's inputs, every other
    argument (dims, sizes, flags) is fixed as torch.export fixes Python values."""

    def __init__(self, fn, spec, leaves: Sequence, tensor_slots: Sequence[int]):
        super().__init__()
        self.fn = fn
        self.spec = spec
        self.leaves = list(leaves)
        self.slots = list(tensor_slots)

    def forward(self, *tensors):
        leaves = list(self.leaves)
        for slot, t in zip(self.slots, tensors):
            leaves[slot] = t
        x, args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        out = self.fn(x, *args, **kwargs)
        # a complex result is compared in its real layout (view_as_real), as the IR holds it: a
        # model's outputs cannot be complex (FX401), but a transform into real ones is the test
        return pytree.tree_map(lambda t: torch.view_as_real(t.resolve_conj())
                               if isinstance(t, torch.Tensor) and t.is_complex() else t, out)


def op_db() -> list:
    """PyTorch's OpInfo database (imported lazily: it takes seconds and pulls in test utilities)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.testing._internal.common_methods_invocations import op_db as db
    return list(db)


def _entry_name(info) -> str:
    return info.name + (f".{info.variant_test_name}" if info.variant_test_name else "")


def select_opinfos(db: Sequence | None = None, extra: Iterable[str] = COMMON_OPS) -> list:
    """The OpInfo entries (every variant) of every op the converter registry claims, matched by
    ATen name (``aten.cumsum.default`` is OpInfo ``cumsum``; ``aten.gelu.default`` is
    ``nn.functional.gelu``), plus ``extra``."""
    from fexplore.pipeline.convert import COMPLEX_CONVERTERS, CONVERTERS

    from fexplore.pipeline.convert.out_of_scope import OUT_OF_SCOPE

    db = op_db() if db is None else db
    claimed = {k.split(".")[1] for k in CONVERTERS
               if k.startswith("aten.") and k not in OUT_OF_SCOPE}  # refusals are no claim
    wanted = set(extra)
    for n in claimed:
        wanted.update((n, f"nn.functional.{n}"))
    # torch.fft's entries all decompose to the three transforms the complex registry claims
    if "aten._fft_c2c.default" in COMPLEX_CONVERTERS:
        wanted.update(info.name for info in db if info.name.startswith("fft."))
    return [info for info in db if info.name in wanted and
            _entry_name(info) not in SKIPPED_VARIANTS]


def _supports(info, dtype) -> bool:
    try:
        return dtype in info.supported_dtypes("cpu")
    except Exception:
        return dtype in getattr(info, "dtypes", ())


def cases(info, dtypes: Sequence[torch.dtype] = (FLOAT_DTYPE,) + INT_DTYPES, *,
          max_per_dtype: int | dict | None = None, seed: int = 0) -> Iterator[Case]:
    """The entry's samples in each dtype it supports, as one-op modules; seeded (OpInfo's
    generators draw from torch's global RNG). ``max_per_dtype`` caps the samples taken per dtype
    (an int for all, or ``{dtype: cap}``; None: every sample)."""
    for dtype in dtypes:
        if not _supports(info, dtype):
            continue
        torch.manual_seed(seed)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                samples = list(info.sample_inputs("cpu", dtype, requires_grad=False))
        except Exception:  # an entry whose generator needs something absent here (CUDA, scipy)
            continue
        cap = max_per_dtype.get(dtype) if isinstance(max_per_dtype, dict) else max_per_dtype
        for i, s in enumerate(samples[:cap]):
            yield _case(info, dtype, i, s)


def _case(info, dtype, index, sample) -> Case:
    leaves, spec = pytree.tree_flatten((sample.input, tuple(sample.args), dict(sample.kwargs)))
    slots = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
    inputs = tuple(leaves[i].detach().clone() for i in slots)
    module = OneOp(info.op, spec, [None if i in slots else x for i, x in enumerate(leaves)], slots)
    return Case(_entry_name(info), dtype, index, module, inputs, _describe(sample))


def _describe(sample) -> str:
    def one(x):
        if isinstance(x, torch.Tensor):
            return f"{str(x.dtype).replace('torch.', '')}{list(x.shape)}"
        if isinstance(x, (list, tuple)):
            return "(" + ", ".join(one(y) for y in x) + ")"
        return repr(x)

    parts = [one(sample.input)] + [one(a) for a in sample.args] + \
        [f"{k}={one(v)}" for k, v in sample.kwargs.items()]
    return ", ".join(parts)


# -- running one case ------------------------------------------------------------------------------

def _eager(case: Case):
    """Eager outputs as a flat list of tensors, or None with the reason they are not a test. The
    inputs as eager leaves them (an op that updates an argument in place: running statistics)
    go to ``case.after``."""
    torch.manual_seed(0)
    inputs = case.fresh_inputs()
    try:
        with torch.no_grad():
            out = case.module(*inputs)
    except Exception as e:
        return None, f"eager raises {type(e).__name__}"
    leaves = pytree.tree_leaves(out)
    if not leaves or not all(isinstance(x, torch.Tensor) for x in leaves):
        return None, "eager's output is not tensors"
    if any(x.layout != torch.strided for x in leaves):   # a complex one is in its real layout (OneOp)
        return None, "eager's output is sparse"
    case.after = [x.detach().clone() for x in inputs]
    return [x.detach().clone() for x in leaves], ""


def _inputs_differ(case: Case, inputs) -> str | None:
    """What differs between the inputs after a run and after eager's (None when they agree): an
    op that updates an argument in place must update it as eager does."""
    bad = _compare(inputs, case.after, [0.0] * len(inputs))
    return None if bad is None else f"its inputs after the call: {bad}"


def _compare(got, want, noise, graph=None, inputs=()) -> str | None:
    """None when ``got`` (flat torch tensors) is eager's ``want``: dtype, shape and values (at
    fexplore's tolerance for the output dtype, plus eager's f32 noise); else what differs. With
    the compiled ``graph`` and its ``inputs``, sort/topk indices of ties in another order than
    eager's count as equal (torch leaves that order unspecified), as the compile's own checks
    count them."""
    from fexplore.ir import DType
    from fexplore.pipeline.convert import ir_dtype
    from fexplore.pipeline.numeric import TOLERANCES, accept_tie_order, compare, to_numpy

    got = list(got)
    if len(got) != len(want):
        return f"{len(got)} outputs, eager gives {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        if not isinstance(g, torch.Tensor):
            return f"output {i} is {type(g).__name__}, not a tensor"
        if g.dtype != w.dtype or tuple(g.shape) != tuple(w.shape):
            return (f"output {i} is {g.dtype}{list(g.shape)}, eager gives "
                    f"{w.dtype}{list(w.shape)}")
    floats = [ir_dtype(w.dtype) for w in want if w.dtype.is_floating_point]
    order = [DType.fp8, DType.bf16, DType.f16, DType.f32]
    low = next((d for d in order if d in floats), DType.f32)
    got_np, want_np = [to_numpy(g) for g in got], [to_numpy(w) for w in want]
    if graph is not None:
        got_np = accept_tie_order(graph, [to_numpy(x) for x in inputs], got_np, want_np)
    _, _, ok, detail = compare(got_np, want_np, TOLERANCES[low], noise)
    return None if ok else detail


def _noise(case: Case, want) -> list[float]:
    """Eager's own f32 error per output (max |f32 - f64|), as the compile's oracle measures it."""
    from fexplore.pipeline.numeric import Oracle

    try:
        with contextlib.redirect_stderr(io.StringIO()):
            oracle = Oracle(case.module, case.fresh_inputs(), random_sets=0)
        noise = list(oracle.noise[0])
    except Exception:
        noise = []
    return noise if len(noise) == len(want) else [0.0] * len(want)


def export_reference(case: Case, want, noise) -> tuple[str, str]:
    """torch.export alone: export, ``run_decompositions()`` (torch's default table), run."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ep = torch.export.export(case.module, case.fresh_inputs(), strict=False)
            ep = ep.run_decompositions()
            torch.manual_seed(0)
            inputs = case.fresh_inputs()
            with torch.no_grad():
                out = ep.module()(*inputs)
    except Exception as e:
        return "fail", f"{type(e).__name__}: {_first_line(str(e))}"
    bad = _compare(pytree.tree_leaves(out), want, noise) or _inputs_differ(case, inputs)
    return ("fail", f"differs from eager: {bad}") if bad else ("pass", "")


def run_fexplore(case: Case, want, noise) -> tuple[str, str, str]:
    """(outcome, detail, code) of compiling the case through every stage and running it."""
    import fexplore
    from fexplore.errors import FexploreError, NumericMismatchError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ex = fexplore.explore(case.module, case.fresh_inputs())
            ex.run_all(progress=False)
            cm = ex.result
            inputs = case.fresh_inputs()
            out = cm(*inputs)
    except NumericMismatchError as e:
        return "wrong", _first_line(e.message), e.code
    except FexploreError as e:
        return "refused", _first_line(e.message), e.code
    except Exception as e:
        return "raw", f"{type(e).__name__}: {_first_line(str(e))}", ""
    bugs = cm.codegen_bugs
    if bugs:   # a generator that raised: its node ran on the host, right but not on the chip
        return "raw", f"codegen bug behind a host fallback: {_first_line(bugs[0])}", ""
    bad = _compare(pytree.tree_leaves(out), want, noise, cm.graph, case.inputs) or _inputs_differ(case, inputs)
    return ("wrong", bad, "") if bad else ("pass", "", "")


def run_case(case: Case, *, reference: bool = True) -> SampleResult:
    """Classify one case (see the module doc). ``reference=False`` skips the torch.export pass
    (then every case counts)."""
    t0 = time.perf_counter()
    dtype = str(case.dtype).replace("torch.", "")
    want, why = _eager(case)
    if case.op in UNSPECIFIED_OUTPUT:
        want, why = None, "torch leaves the output's contents unspecified"
    if want is None:
        return SampleResult(case.op, dtype, case.index, "excluded", "excluded", why,
                            seconds=time.perf_counter() - t0)
    noise = _noise(case, want)
    export, export_detail = export_reference(case, want, noise) if reference else ("pass", "")
    outcome, detail, code = run_fexplore(case, want, noise)
    if export != "pass" and outcome != "pass":
        detail = f"{detail} (torch.export: {export_detail})"
    return SampleResult(case.op, dtype, case.index, outcome, export, detail, code,
                        time.perf_counter() - t0)


def _first_line(s: str) -> str:
    s = s.strip()
    return s.splitlines()[0][:300] if s else ""


# -- whole runs -------------------------------------------------------------------------------

def run(infos: Sequence, *, dtypes=(FLOAT_DTYPE,) + INT_DTYPES,
        max_per_dtype: int | dict | None = None,
        progress=None) -> list[SampleResult]:
    results = []
    from fexplore.pipeline.decomposition import reused_cia_scan

    # torch.export alone (`export_reference`) decomposes too: its scan of the ops is shared
    with reused_cia_scan():
        for info in infos:
            for case in cases(info, dtypes, max_per_dtype=max_per_dtype):
                r = run_case(case)
                results.append(r)
                if progress is not None:
                    progress(r)
    return results


def seeded_subset(infos: Sequence, n_ops: int, seed: int) -> list:
    """``n_ops`` entries drawn with a fixed seed (the same subset on every run)."""
    rng = random.Random(seed)
    return sorted(rng.sample(list(infos), min(n_ops, len(infos))), key=_entry_name)


@dataclass
class Summary:
    entries: int
    samples: int
    excluded: int  # not a test of an op (eager raises, non-tensor output)
    export_pass: int  # the denominator: samples torch.export alone gets right
    export_fail: int
    counts: Counter = field(default_factory=Counter)  # outcome -> count, over the denominator
    beyond_export: Counter = field(default_factory=Counter)  # outcomes where export fails

    @property
    def pass_rate(self) -> float:
        return self.counts["pass"] / self.export_pass if self.export_pass else 1.0


def summarize(results: Sequence[SampleResult]) -> Summary:
    s = Summary(entries=len({r.op for r in results}), samples=len(results),
                excluded=sum(r.outcome == "excluded" for r in results),
                export_pass=sum(r.counted for r in results),
                export_fail=sum(r.outcome != "excluded" and r.export == "fail" for r in results))
    s.counts.update(r.outcome for r in results if r.counted)
    s.beyond_export.update(r.outcome for r in results
                           if r.outcome != "excluded" and r.export == "fail")
    return s


def per_op_rows(results: Sequence[SampleResult]) -> list[dict[str, Any]]:
    """One row per OpInfo entry: counts per outcome and the first problem seen."""
    rows: dict[str, dict[str, Any]] = {}
    for r in results:
        row = rows.setdefault(r.op, {"op": r.op, "samples": 0, "excluded": 0, "export_fail": 0,
                                     "pass": 0, "refused": 0, "wrong": 0, "raw": 0,
                                     "seconds": 0.0, "note": ""})
        row["samples"] += 1
        row["seconds"] += r.seconds
        if r.outcome == "excluded":
            row["excluded"] += 1
            row["note"] = row["note"] or f"excluded: {r.detail}"
            continue
        if r.export != "pass":
            row["export_fail"] += 1
            continue
        row[r.outcome] += 1
        if r.outcome != "pass" and not row["note"].startswith(("raw", "wrong", "refused")):
            code = f"[{r.code}] " if r.code else ""
            row["note"] = f"{r.outcome} ({r.dtype} #{r.index}): {code}{r.detail}"
    return list(rows.values())


def problems(results: Sequence[SampleResult], outcomes=("raw", "wrong")) -> list[SampleResult]:
    return [r for r in results if r.counted and r.outcome in outcomes]

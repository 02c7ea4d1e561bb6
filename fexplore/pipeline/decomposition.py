"""Decomposition of an exported program to core ATen, keeping the ops whose intent matters to an NPU
(`INTENT_OPS`: a matmul should arrive as a matmul, not be re-recognized from mul + sum).

`decompose(ep)` gives the program ``ep.run_decompositions(decomposition_table())`` gives, for less.
torch's call splits the table into composite-implicit (CIA) ops and the others, then, for as long as
it retraces the program, overrides the Python kernel of every one of the 500-odd CIA ops it found:
to keep it (the intent ops) or to decompose it with what the table holds. For most of them what
the table holds is the op's own CIA kernel, which tracing runs anyway for a CIA op with no
override. Here the split is made once per state of the op registry, and only the CIA ops kept or
decomposed otherwise than by their own kernel (about 50) are overridden; torch's retrace is then
called as ``run_decompositions`` calls it. That cuts its fixed cost of about 0.3 s to a few
hundredths (test_export_decomposition.py checks that the programs are torch's own). On a torch
whose internals differ, torch's call.

`export_decomposed(model, ...)` is what ingestion calls first: torch.export's trace asked for the
inference program, under the same overrides and table, decomposes as it traces, so the model is
traced once instead of exported and then retraced (half the time or less on the Hugging Face
architectures of the suite). `decompose` is for the programs it cannot make.
"""

from __future__ import annotations

import contextlib
import functools
import inspect

import torch

# Ops kept whole through the decomposition. Each is something the later stages map directly onto
# the chip (contractions, normalizations, attention, activations with a native vector form).
INTENT_OPS = [
    "aten.linear.default",
    "aten.addmm.default",
    "aten.matmul.default",
    "aten.layer_norm.default",
    "aten.rms_norm.default",
    "aten.softmax.int",
    "aten.log_softmax.int",
    "aten.scaled_dot_product_attention.default",
    "aten.gelu.default",
    "aten.silu.default",
    "aten.conv1d.default",
    "aten.conv2d.default",
    "aten.batch_norm.default",
    "aten.max_pool2d.default",
    "aten.adaptive_avg_pool2d.default",
    "aten.hardtanh.default",
]


def _overload(qualname: str):
    ns, op, overload = qualname.split(".")
    return getattr(getattr(getattr(torch.ops, ns), op), overload)


def decompose(ep):
    """``ep.run_decompositions(decomposition_table())``, the same program, for less (see above)."""
    plan, retrace = _kept(_PLAN, _decomposition_plan), _retrace()
    if plan is None or retrace is None:
        return ep.run_decompositions(decomposition_table())
    cia, python = plan
    return retrace(ep, cia_to_decomp=dict(cia), python_decomp_table=dict(python), joint_loss_index=None,
                   decompose_custom_triton_ops=False)


def _retrace():
    """torch's retrace as ``run_decompositions`` calls it, or None when it does not take what
    `decompose` passes."""
    import torch.export.exported_program as exported_program

    retrace = getattr(exported_program, "_decompose_exported_program", None)
    if (retrace is None or not hasattr(exported_program, "_disable_prexisiting_fake_mode")
            or not {"cia_to_decomp", "python_decomp_table", "joint_loss_index",
                    "decompose_custom_triton_ops"} <= set(inspect.signature(retrace).parameters)):
        return None
    return exported_program._disable_prexisiting_fake_mode(retrace)


def export_decomposed(model, args, kwargs, dynamic_shapes):
    """The program ``decompose(torch.export.export(model, ...))`` gives, traced once instead of twice,
    or None on a torch without the internals it uses (see `_one_trace_hooks`).

    Non-strict torch.export traces the model to training IR, and the decomposition retraces that
    whole program: the retrace costs about as much as the export. Here torch's own export is asked
    for the inference program (``pre_dispatch=False``, the trace `run_decompositions` makes),
    under the same CIA overrides and with the same table, so the one trace decomposes as it goes.
    What differs from the two-step program is bookkeeping: a weight tied under two names is two
    placeholders of one tensor (the retrace reads one of them; `ingest` makes them one constant),
    ops whose results nothing reads are not kept, and the `_assert_tensor_metadata` checks are
    not there (ingest drops them). test_export_decomposition.py checks that the IR ingested from
    both is the same. A model this cannot trace (it writes into a tensor that is not its
    parameter or buffer: functionalization refuses) raises, and `export` takes the two steps."""
    plan, hooks = _kept(_PLAN, _decomposition_plan), _one_trace_hooks()
    if plan is None or hooks is None:
        return None
    trace, override, to_aten = hooks
    cia, python = plan
    import torch.export._trace as export_trace

    # torch's `_export` builds its tracer from this module-level function when called; the table
    # rides on it for the call (there is no parameter for it)
    export_trace._export_to_aten_ir = functools.partial(to_aten, decomp_table=dict(python))
    try:
        with override(dict(cia)):
            return trace(model, args, kwargs, dynamic_shapes, strict=False, pre_dispatch=False)
    finally:
        export_trace._export_to_aten_ir = to_aten


def _one_trace_hooks():
    """(torch's ``_export``, its CIA override context, its ``_export_to_aten_ir``), or None when one
    of them is missing or does not take what `export_decomposed` passes."""
    import torch.export._trace as export_trace
    import torch.export.exported_program as exported_program

    trace = getattr(export_trace, "_export", None)
    to_aten = getattr(export_trace, "_export_to_aten_ir", None)
    override = getattr(exported_program, "_override_composite_implicit_decomp", None)
    if trace is None or to_aten is None or override is None:
        return None
    if not ({"strict", "pre_dispatch"} <= set(inspect.signature(trace).parameters)
            and "decomp_table" in inspect.signature(to_aten).parameters
            and "_export_to_aten_ir" in inspect.unwrap(trace).__code__.co_names):
        return None
    return trace, override, to_aten


def decomposition_table() -> dict:
    """torch's core-ATen table without the `INTENT_OPS`, as a plain dict (a fresh copy each call:
    torch's ``run_decompositions`` takes entries out of the table it is given)."""
    return dict(_kept(_TABLE, _build_table))


def _build_table() -> dict:
    with reused_cia_scan():
        table = torch.export.default_decompositions()
        for name in INTENT_OPS:
            table.pop(_overload(name), None)
        return dict(table.items())


def _decomposition_plan():
    """(the CIA ops to override and how, the other ops' decompositions) for `decompose` and
    `export_decomposed`, or None on a torch without the split it uses."""
    import torch.export.exported_program as exported_program

    split = getattr(exported_program, "_split_decomp_table_to_cia_and_python_decomp", None)
    if split is None:
        return None
    with reused_cia_scan():
        cia, python = split(decomposition_table())
    return {op: fn for op, fn in cia.items() if not _is_own_cia_kernel(fn)}, python


def _is_own_cia_kernel(fn) -> bool:
    """Whether a table's entry for a CIA op is torch's stand-in for the op's own C++ CIA kernel
    (``torch._export.utils._get_decomp_for_cia``), which tracing runs without being told."""
    return (isinstance(fn, functools.partial)
            and getattr(fn.func, "__name__", "") == "_special_op_to_decompose_cia")


# what is built from torch's op registry, each for the registry's state it was built in
_TABLE: dict = {}
_PLAN: dict = {}
_CIA_SCAN: dict = {}


def _kept(cache: dict, build):
    """``build()``, built again only when torch's op registry has changed since it was built. The
    state is taken after building: a build that scans the ops loads ops."""
    if cache.get("state") != _op_registry_state():
        value = build()
        cache.update(state=_op_registry_state(), value=value)
    return cache["value"]


def _op_registry_state() -> tuple:
    """What torch's scan for composite-implicit ops depends on: the ops with such a kernel in
    C++, and the ops each namespace of ``torch.ops`` other than aten has loaded (a custom op
    defined in Python joins one; torch itself scans aten once per process). A new op, or a new
    kernel of that key, changes it."""
    cia = torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd")
    return len(cia), tuple((ns, len(getattr(torch.ops, ns)._dir)) for ns in list(torch.ops._dir)
                           if ns != "aten")


@contextlib.contextmanager
def reused_cia_scan():
    """Within the block, torch.export's scan for composite-implicit ops runs once per state of the op
    registry (`_op_registry_state`) instead of on every call that asks for it (building a table,
    ``run_decompositions`` twice). The scan walks every op of every namespace, about 0.1 s. Its
    result depends only on the registry, so what gets decomposed is the same. Restores torch as it
    was on exit; on a torch without this scan, does nothing."""
    import torch.export.decomp_utils as decomp_utils
    import torch.export.exported_program as exported_program

    modules = [m for m in (exported_program, decomp_utils) if hasattr(m, "_collect_all_valid_cia_ops")]
    if not modules:
        yield
        return
    original = modules[0]._collect_all_valid_cia_ops

    def scan() -> set:
        return set(_kept(_CIA_SCAN, lambda: frozenset(original())))   # its callers take ops out

    for m in modules:
        m._collect_all_valid_cia_ops = scan
    try:
        yield
    finally:
        for m in modules:
            m._collect_all_valid_cia_ops = original

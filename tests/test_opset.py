"""Opset conformance: every OpDef has every rule, and every reference matches torch.

The case table lives in ``opset_cases.py``: numpy inputs, IR attributes and the equivalent torch
call for every op but the region ops (``region`` and ``cond`` own subgraphs; their tests run
graphs). For each case the type rule must give torch's shape and dtype, the reference (through
``evaluate_op``) torch's values, and the cost rule non-negative flops and bytes.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from fexplore.ir import (Attrs, Category, Cost, DType, OpDef, TensorType, all_ops, evaluate_op,
                         get_op)
from fexplore.ir.opdef import REQUIRED

from opset_cases import CASES, COVERED, Case

REGION_OPS = {"region", "cond"}

# numpy (ml_dtypes) dtype of each torch dtype the opset uses
TORCH_TO_NUMPY = {
    torch.float64: np.dtype(np.float64),
    torch.float32: np.dtype(np.float32),
    torch.float16: np.dtype(np.float16),
    torch.bfloat16: np.dtype(ml_dtypes.bfloat16),
    torch.float8_e4m3fn: np.dtype(ml_dtypes.float8_e4m3fn),
    torch.int64: np.dtype(np.int64),
    torch.int32: np.dtype(np.int32),
    torch.int16: np.dtype(np.int16),
    torch.int8: np.dtype(np.int8),
    torch.uint8: np.dtype(np.uint8),
    torch.bool: np.dtype(np.bool_),
}
NUMPY_TO_TORCH = {v: k for k, v in TORCH_TO_NUMPY.items()}

# (rtol, atol) per output dtype. f32 is the project's tolerance; it covers torch's f32 kernels
# (SLEEF transcendentals are within 1 ulp, pairwise sums within a few) against the reference,
# which computes in f64 and rounds once. The low-precision floats allow an ulp or two of their
# own (f16 eps ~1e-3, bf16 eps ~7.8e-3): torch rounds some intermediates to the storage dtype,
# the reference does not. fp8 results come from a conversion both sides do exactly.
TOLERANCE = {
    np.dtype(np.float64): (1e-12, 1e-12),
    np.dtype(np.float32): (1.3e-6, 1e-5),
    np.dtype(np.float16): (1e-3, 1e-5),
    np.dtype(ml_dtypes.bfloat16): (1.6e-2, 1e-5),
    np.dtype(ml_dtypes.float8_e4m3fn): (0.0, 0.0),
}


def to_torch(x: np.ndarray) -> torch.Tensor:
    dt = NUMPY_TO_TORCH[x.dtype]
    if dt in (torch.bfloat16, torch.float8_e4m3fn):  # exact: f32 holds every such value
        return torch.from_numpy(x.astype(np.float32)).to(dt)
    return torch.from_numpy(x.copy())


def to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    want = TORCH_TO_NUMPY[t.dtype]
    if t.dtype in (torch.bfloat16, torch.float8_e4m3fn):
        return t.float().numpy().astype(want)
    return t.numpy()


def assert_values_close(got: np.ndarray, want: np.ndarray, rtol: float, atol: float, what: str):
    if got.dtype.kind in "iub":
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    g, w = got.astype(np.float64), want.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=f"{what}: NaN positions")
    np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, equal_nan=True, err_msg=what)


# -- every OpDef has every rule -------------------------------------------------------------------

ALL = all_ops()
# the built-in ops (custom ops registered by other tests or by users are not in the case table)
BUILTIN = {name for name, op in ALL.items() if op.infer.__module__.startswith("fexplore.ir.ops.")}


@pytest.mark.parametrize("name", sorted(ALL))
def test_opdef_is_complete(name):
    op = ALL[name]
    assert isinstance(op, OpDef) and op.name == name and get_op(name) is op
    assert isinstance(op.category, Category)
    assert callable(op.infer) and callable(op.cost)
    if op.category == Category.region:
        assert callable(op.run_regions) and op.num_regions >= 1
    else:
        assert callable(op.reference) and op.run_regions is None and op.num_regions == 0
    assert op.arity is None or op.arity >= 0
    names = [spec.name for spec in op.attrs]
    assert len(names) == len(set(names)), f"{name}: duplicate attribute names"
    for spec in op.attrs:
        assert spec.default is REQUIRED or spec.check(spec.default), \
            f"{name}.{spec.name}: default {spec.default!r} is not a {spec.kind}"
    # with every required attribute missing, completing the attributes names the first one
    if any(spec.default is REQUIRED for spec in op.attrs):
        with pytest.raises(TypeError, match="missing attribute"):
            op.complete_attrs({})
    else:
        assert set(op.complete_attrs({})) == set(names)


def test_every_op_has_a_torch_case():
    assert REGION_OPS < BUILTIN and len(BUILTIN) > 70
    missing = sorted(BUILTIN - REGION_OPS - COVERED)
    assert not missing, f"ops without a conformance case: {missing}"
    unknown = sorted(COVERED - BUILTIN)
    assert not unknown, f"cases for ops that do not exist: {unknown}"


# -- each reference matches torch -----------------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_reference_matches_torch(case: Case):
    op = get_op(case.op)
    in_types = [TensorType(x.shape, DType.from_numpy(x.dtype)) for x in case.inputs]
    attrs = Attrs(op.complete_attrs(case.attrs))
    out_types = op.infer_types(in_types, attrs)

    before = [x.copy() for x in case.inputs]
    got = evaluate_op(case.op, list(case.inputs), **case.attrs)
    for b, x in zip(before, case.inputs):  # a reference writing into its operand would corrupt
        np.testing.assert_array_equal(b, x, err_msg=f"{case.id} mutated an input")
    with torch.no_grad():
        want = case.torch_fn(*[to_torch(x) for x in case.inputs])
    want = [want] if isinstance(want, torch.Tensor) else list(want)
    assert len(out_types) == len(got) == len(want)

    for i, (t, g, w) in enumerate(zip(out_types, got, want)):
        w = to_numpy(w)
        what = f"{case.id} output {i}"
        # the type rule says what torch says ...
        assert t.shape == w.shape, f"{what}: type rule gives shape {t.shape}, torch {w.shape}"
        assert t.dtype.numpy == w.dtype, f"{what}: type rule gives {t.dtype}, torch {w.dtype}"
        # ... and the interpreter's array is of that type
        assert g.shape == w.shape and g.dtype == w.dtype, f"{what}: got {g.dtype}{g.shape}"
        rtol, atol = TOLERANCE.get(w.dtype, (0.0, 0.0))
        rtol = rtol if case.rtol is None else case.rtol
        atol = atol if case.atol is None else case.atol
        assert_values_close(g, w, rtol, atol, what)

    cost = op.cost(in_types, out_types, attrs)
    assert isinstance(cost, Cost)
    for field in ("flops", "bytes"):
        v = getattr(cost, field)
        assert isinstance(v, (int, np.integer)) and v >= 0, f"{case.id}: cost {field} = {v!r}"


# -- type rules reject bad operands ---------------------------------------------------------------

f32 = np.zeros


BAD = [
    ("matmul-inner-dim", "matmul", [f32((2, 3)), f32((4, 5))], {}),
    ("matmul-batch", "matmul", [f32((2, 3, 4)), f32((3, 4, 5))], {}),
    ("matmul-dtypes", "matmul", [f32((2, 3)), np.zeros((3, 4), np.int64)], {}),
    ("matmul-0d", "matmul", [f32(()), f32((3,))], {}),
    ("linear-weight", "linear", [f32((2, 3)), f32((4, 5))], {}),
    ("linear-bias", "linear", [f32((2, 3)), f32((4, 3)), f32((5,))], {}),
    ("reshape-numel", "reshape", [f32((2, 3))], {"shape": (4,)}),
    ("permute-not-perm", "permute", [f32((2, 3))], {"perm": (0, 0)}),
    ("expand-incompatible", "expand", [f32((3, 2))], {"shape": (3, 4)}),
    ("expand-rank-down", "expand", [f32((3, 2))], {"shape": (2,)}),
    ("concat-rank", "concat", [f32((2, 3)), f32((3,))], {"axis": 0}),
    ("concat-other-dim", "concat", [f32((2, 3)), f32((2, 4))], {"axis": 0}),
    ("where-non-bool", "where", [np.zeros((3,), np.int32), f32((3,)), f32((3,))], {}),
    ("where-broadcast", "where", [np.zeros((3,), bool), f32((4,)), f32((3,))], {}),
    ("add-broadcast", "add", [f32((3, 2)), f32((3,))], {}),
    ("slice-end-past-size", "slice", [f32((4, 5))], {"axis": -1, "start": 1, "end": 6}),
    ("slice-negative-start", "slice", [f32((4, 5))], {"axis": -1, "start": -2, "end": 5}),
    ("slice-end-before-start", "slice", [f32((4, 5))], {"axis": 0, "start": 3, "end": 1}),
    ("slice-step0", "slice", [f32((4, 5))], {"axis": 0, "start": 0, "end": 4, "step": 0}),
    ("slice-axis", "slice", [f32((4, 5))], {"axis": 2, "start": 0, "end": 1}),
    ("split-sizes", "split", [f32((4, 5))], {"axis": -1, "sizes": (2, 2)}),
    ("softmax-axis", "softmax", [f32((4, 5))], {"axis": -3}),
    ("sum-axis", "sum", [f32((4, 5))], {"axes": (2,)}),
    ("gather-float-index", "gather", [f32((3, 4)), f32((3, 2))], {"axis": 1}),
    ("gather-rank", "gather", [f32((3, 4)), np.zeros((3,), np.int64)], {"axis": 1}),
    ("gather-index-too-big", "gather", [f32((3, 4)), np.zeros((4, 2), np.int64)], {"axis": 1}),
    ("index-bool", "index", [f32((3, 4)), np.zeros((3,), bool)], {"axes": (0,)}),
    ("index-axes-count", "index", [f32((3, 4)), np.zeros((2,), np.int64)], {"axes": (0, 1)}),
    ("embedding-float-index", "embedding", [f32((5, 3)), f32((2,))], {}),
    ("pad-odd", "pad", [f32((3, 4))], {"pads": (1, 2, 3)}),
    ("pad-negative", "pad", [f32((3, 4))], {"pads": (-1, 2)}),
    ("tril-1d", "tril", [f32((4,))], {}),
    ("conv2d-channels", "conv2d", [f32((1, 3, 5, 5)), f32((4, 2, 3, 3))], {}),
    ("layer_norm-affine", "layer_norm", [f32((2, 8)), f32((7,))], {}),
    ("attention-heads", "attention", [f32((1, 4, 3, 8)), f32((1, 2, 5, 8)), f32((1, 2, 5, 8))], {}),
    ("attention-head-dim", "attention", [f32((1, 2, 3, 8)), f32((1, 2, 5, 4)), f32((1, 2, 5, 8))],
     {}),
    ("attention-batch", "attention", [f32((2, 2, 3, 8)), f32((3, 2, 5, 8)), f32((3, 2, 5, 8))],
     {}),
    ("bitcast-width", "bitcast", [np.zeros((4,), np.float32)], {"dtype": DType.i64}),
    ("bitcast-to-bool", "bitcast", [np.zeros((4,), np.uint8)], {"dtype": DType.bool}),
    ("arange-step0", "arange", [], {"end": 5, "step": 0}),
    ("attr-kind", "softmax", [f32((4, 5))], {"axis": 1.0}),
    ("attr-unknown", "softmax", [f32((4, 5))], {"axis": 1, "dim": 1}),
    ("attr-missing", "reshape", [f32((4, 5))], {}),
]


@pytest.mark.parametrize("opname,inputs,attrs", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_type_rule_rejects(opname, inputs, attrs):
    with pytest.raises(TypeError):
        evaluate_op(opname, inputs, **attrs)

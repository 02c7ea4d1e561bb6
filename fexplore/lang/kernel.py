"""`Kernel`: a traced kernel-language function, and its three ways to run.

    @fl.kernel
    def matmul(a: fl.Tensor["M", "K"], b: fl.Tensor["K", "N"], *, tile: int = 128): ...

    matmul(a, b)                          # numpy interpreter (runs the kernel; breakpoints work)
    matmul.simulate(a, b, target="tiny")  # lowered to NPU commands, run on the cycle simulator
    matmul.trace(a, b)                    # the kernel IR and its SRAM plan, nothing run
    matmul.simulate(fl.spec((4096, 4096), "bf16"), ...)   # timing only, no data needed

Parameters annotated with a tensor spec are DRAM tensors; the others are static (trace-time Python
values, e.g. tile sizes). ``target=`` and ``pipelining=`` are the kernel's own keyword arguments.
A trace is made per (argument shapes and dtypes, static values, target, pipelining) and cached.
"""

from __future__ import annotations

import functools
import inspect
from collections import OrderedDict
from typing import NamedTuple

import numpy as np

from fexplore.errors import SourceLoc
from fexplore.lang import semantics
from fexplore.lang.errors import ArgumentError, KernelDefinitionError
from fexplore.lang.interpreter import Interpreter
from fexplore.lang.ir import KernelTrace
from fexplore.lang.plan import make_plan
from fexplore.lang.tracer import Tracer, user_loc
from fexplore.lang.types import DType, TensorSpec, as_dtype, parse_spec, shape_text
from fexplore.lang.values import DramTensor
from fexplore.npu import get_target

_CACHE_SIZE = 16


class ArgSpec(NamedTuple):
    """A stand-in argument with a shape and a dtype but no data, for timing-only simulation."""

    shape: tuple
    dtype: DType


def spec(shape, dtype="f32") -> ArgSpec:
    return ArgSpec(tuple(int(d) for d in shape), as_dtype(dtype))


def kernel(fn=None, *, name: str | None = None, target="rngd"):
    """Make a `Kernel` of a function: ``@fl.kernel`` or ``@fl.kernel(target="tiny")``."""
    if fn is None:
        return lambda f: Kernel(f, name=name, target=target)
    return Kernel(fn, name=name, target=target)


class Kernel:
    def __init__(self, fn, *, name: str | None = None, target="rngd"):
        if isinstance(fn, Kernel):
            fn = fn.fn
        self.fn = fn
        self.name = name or fn.__name__
        self.target = get_target(target)
        self.signature = inspect.signature(fn)
        self.tensor_params: dict[str, TensorSpec] = _tensor_params(fn, self.signature)
        self.last_trace: KernelTrace | None = None
        self.last_result = None
        self._traces: OrderedDict = OrderedDict()
        functools.update_wrapper(self, fn)

    # ---- the three ways to run ----------------------------------------------------------------
    def __call__(self, *args, target=None, pipelining: bool = True, **kwargs):
        """Run the kernel with the numpy interpreter; returns what it returns, as numpy arrays."""
        cfg, arrays, static = self._bind(args, kwargs, target, need_data=True)
        # inputs enter "DRAM" under their parameter names, converted to the dtype the kernel sees
        interp = Interpreter({k: np.array(v, dtype=_dtype_of(v).numpy) for k, v in arrays.items()})
        trace = self._trace(cfg, arrays, static, pipelining, interp)
        self._remember(cfg, arrays, static, pipelining, trace)
        return trace.unpack({k: v.copy() for k, v in interp.outputs(trace).items()})

    def simulate(self, *args, target=None, functional: bool | None = None, pipelining: bool = True,
                 **kwargs):
        """Lower to NPU commands and run them on the cycle simulator; returns its SimResult
        (``.outputs`` by output name, ``.cycles``, ``.utilization``, ``.timeline``). Functional
        (real outputs) when the arguments are arrays, timing only when they are `fl.spec`s."""
        cfg, arrays, static = self._bind(args, kwargs, target, need_data=bool(functional))
        if functional is None:
            functional = all(isinstance(a, np.ndarray) for a in arrays.values())
        trace = self._cached(cfg, arrays, static, pipelining)
        result = trace.simulate(arrays if functional else None, functional=functional)
        self.last_result = result
        return result

    def trace(self, *args, target=None, pipelining: bool = True, **kwargs) -> KernelTrace:
        """The kernel IR (and SRAM plan) for these arguments' shapes and dtypes; nothing is run."""
        cfg, arrays, static = self._bind(args, kwargs, target, need_data=False)
        return self._cached(cfg, arrays, static, pipelining)

    def lower(self, *args, target=None, pipelining: bool = True, **kwargs):
        """The NPU command program (`fexplore.npu.Program`) for these arguments."""
        return self.trace(*args, target=target, pipelining=pipelining, **kwargs).program()

    def check_pipelining(self, *args, target=None, **kwargs) -> "PipelineCheck":
        """Simulate serially (every ``stages=`` treated as 1) and pipelined; compare results."""
        serial = self.simulate(*args, target=target, pipelining=False, functional=True, **kwargs)
        piped = self.simulate(*args, target=target, pipelining=True, functional=True, **kwargs)
        return PipelineCheck(self.name, serial, piped)

    # ---- binding arguments --------------------------------------------------------------------
    def _bind(self, args, kwargs, target, *, need_data: bool):
        loc = user_loc()
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as e:
            raise ArgumentError(f"{self.name}: {e}", expected=self._signature_text(),
                                given=f"{len(args)} positional argument(s), keywords {sorted(kwargs)}",
                                loc=loc) from None
        bound.apply_defaults()
        cfg = get_target(target if target is not None else self.target)
        arrays, static, axes = {}, {}, {}
        for pname, value in bound.arguments.items():
            sp = self.tensor_params.get(pname)
            if sp is None:
                static[pname] = value
                continue
            arrays[pname] = _argument(self.name, pname, sp, value, axes, need_data, loc)
        return cfg, arrays, static

    def _signature_text(self) -> str:
        parts = []
        for p in self.signature.parameters.values():
            sp = self.tensor_params.get(p.name)
            parts.append(f"{p.name}: {sp}" if sp is not None else str(p))
        return f"{self.name}({', '.join(parts)})"

    # ---- tracing ------------------------------------------------------------------------------
    def _key(self, cfg, arrays, static, pipelining) -> tuple:
        shapes = tuple((k, tuple(v.shape), _dtype_of(v).name) for k, v in arrays.items())
        stat = tuple((k, v if _hashable(v) else repr(v)) for k, v in static.items())
        return shapes, stat, cfg, pipelining

    def _cached(self, cfg, arrays, static, pipelining) -> KernelTrace:
        trace = self._traces.get(self._key(cfg, arrays, static, pipelining))
        if trace is None:
            trace = self._trace(cfg, arrays, static, pipelining, None)
            self._remember(cfg, arrays, static, pipelining, trace)
        self.last_trace = trace
        return trace

    def _remember(self, cfg, arrays, static, pipelining, trace) -> None:
        self._traces[self._key(cfg, arrays, static, pipelining)] = trace
        while len(self._traces) > _CACHE_SIZE:
            self._traces.popitem(last=False)
        self.last_trace = trace

    def _trace(self, cfg, arrays, static, pipelining, interp) -> KernelTrace:
        trace = KernelTrace(self.name, cfg, pipelining=pipelining)
        tracer = Tracer(trace, self.fn.__code__, interp)
        call = dict(static)
        for pname, arr in arrays.items():
            sp = self.tensor_params[pname]
            for ax, d in zip(sp.axes, arr.shape):
                if ax is not None:
                    trace.axes[ax] = d
            t = DramTensor(trace, pname, tuple(arr.shape), _dtype_of(arr), sp.axes, "input")
            trace.tensors.append(t)
            trace.params.append(t)
            call[pname] = t
        trace.static = dict(static)
        with tracer:
            returned = self.fn(**call)
            semantics.finish(tracer, returned, self._def_loc())
        trace.plan = make_plan(trace)
        return trace

    def _def_loc(self) -> SourceLoc:
        code = self.fn.__code__
        return SourceLoc(code.co_filename, code.co_firstlineno)

    # ---- views --------------------------------------------------------------------------------
    def __repr__(self) -> str:
        return f"<Kernel {self._signature_text()} on {self.target.name}>"

    def _repr_html_(self) -> str:
        from fexplore.lang.view import kernel_html

        return kernel_html(self)


class PipelineCheck:
    """Serial vs pipelined simulation of one kernel: same numbers, fewer cycles?"""

    def __init__(self, name, serial, pipelined):
        self.name = name
        self.serial = serial
        self.pipelined = pipelined
        self.max_abs_diff = 0.0
        self.same = True
        for k, a in serial.outputs.items():
            a64, b64 = np.asarray(a, np.float64), np.asarray(pipelined.outputs[k], np.float64)
            self.same &= bool(np.array_equal(a64, b64, equal_nan=True))
            diff = np.abs(a64 - b64)
            self.max_abs_diff = max(self.max_abs_diff, float(np.nanmax(diff)) if diff.size else 0.0)

    @property
    def speedup(self) -> float:
        return self.serial.cycles / self.pipelined.cycles if self.pipelined.cycles else 1.0

    def __repr__(self) -> str:
        verdict = "identical outputs" if self.same else f"outputs differ (max abs {self.max_abs_diff:.3g})"
        return (f"<PipelineCheck {self.name}: serial {self.serial.cycles:,} cycles, pipelined "
                f"{self.pipelined.cycles:,} cycles ({self.speedup:.2f}x), {verdict}>")


# ---- helpers ---------------------------------------------------------------------------------------
def _tensor_params(fn, sig: inspect.Signature) -> dict[str, TensorSpec]:
    raw = getattr(fn, "__annotations__", {})
    code = fn.__code__
    loc = SourceLoc(code.co_filename, code.co_firstlineno)
    out = {}
    for p in sig.parameters.values():
        ann = raw.get(p.name, inspect.Parameter.empty)
        sp = _as_spec(ann, fn.__globals__)
        if isinstance(ann, DType) or (isinstance(sp, DType)):
            raise KernelDefinitionError(
                f"parameter {p.name!r} of kernel {fn.__name__!r} has a dtype but no axes",
                expected="a tensor spec with named axes, e.g. fl.bf16['M', 'K']",
                given=f"{p.name}: {ann}", loc=loc)
        if isinstance(ann, str) and sp is None and "[" in ann:
            raise KernelDefinitionError(
                f"parameter {p.name!r} of kernel {fn.__name__!r}: annotation {ann!r} is not a tensor spec",
                expected="'dtype[A, B]' (e.g. 'bf16[M, K]') or fl.bf16['M', 'K']",
                given=f"{p.name}: {ann!r}", loc=loc)
        if isinstance(sp, TensorSpec):
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise KernelDefinitionError(f"kernel {fn.__name__!r}: *args/**kwargs cannot be tensors",
                                            expected="one named parameter per tensor", given=str(p), loc=loc)
            out[p.name] = sp
    reserved = {"target", "pipelining", "functional"} & set(sig.parameters)
    if reserved:
        raise KernelDefinitionError(f"kernel {fn.__name__!r}: parameter name(s) {sorted(reserved)} are reserved",
                                    expected="other names (these are Kernel.simulate's own options)",
                                    given=", ".join(sorted(reserved)), loc=loc)
    return out


def _as_spec(ann, globals_):
    if isinstance(ann, (TensorSpec, DType)):
        return ann
    if isinstance(ann, str):
        try:
            return parse_spec(ann)
        except ValueError:
            pass
        try:
            value = eval(ann, dict(globals_))  # noqa: S307 - the author's own annotation, as typing does
        except Exception:
            return None
        return value if isinstance(value, (TensorSpec, DType)) else None
    return None


def _dtype_of(x) -> DType:
    return x.dtype if isinstance(x, ArgSpec) else as_dtype(x.dtype)


def _argument(kname: str, pname: str, sp: TensorSpec, value, axes: dict, need_data: bool, loc):
    """Check one tensor argument against its spec, binding axis names; returns an array or ArgSpec."""
    if isinstance(value, ArgSpec):
        if need_data:
            raise ArgumentError(f"{kname}: argument {pname!r} is an fl.spec (no data), but this run needs data",
                                expected="a numpy array", given=repr(value), loc=loc,
                                hint="pass arrays, or simulate with functional=False")
        arr = value
    else:
        if hasattr(value, "detach"):   # a torch tensor
            value = value.detach().cpu().numpy()
        arr = np.asarray(value)
    try:
        dt = _dtype_of(arr)
    except ValueError:
        raise ArgumentError(f"{kname}: argument {pname!r} has dtype {arr.dtype}, which the NPU does not have",
                            expected=f"{sp}", given=f"dtype {arr.dtype}", loc=loc) from None
    if len(arr.shape) != len(sp.dims):
        raise ArgumentError(f"{kname}: argument {pname!r} has {len(arr.shape)} axes, its spec {len(sp.dims)}",
                            expected=f"{pname}: {sp}", given=f"shape {tuple(arr.shape)}", loc=loc)
    for i, (d, n) in enumerate(zip(sp.dims, arr.shape)):
        if isinstance(d, int) and d != n:
            raise ArgumentError(f"{kname}: argument {pname!r} has size {n} on axis {i}, its spec fixes {d}",
                                expected=f"{pname}: {sp}", given=f"shape {tuple(arr.shape)}", loc=loc)
        if isinstance(d, str):
            if d in axes and axes[d][0] != n:
                size, where = axes[d]
                raise ArgumentError(f"{kname}: axis {d} is {size} in {where!r} but {n} in {pname!r}",
                                    expected=f"{d} = {size} everywhere", given=f"{pname}: shape {tuple(arr.shape)}",
                                    loc=loc)
            axes.setdefault(d, (n, pname))
    if sp.dtype is not None and dt != sp.dtype:
        if not (dt.is_float and sp.dtype.is_float):
            raise ArgumentError(f"{kname}: argument {pname!r} is {dt}, declared {sp.dtype}",
                                expected=f"{pname}: {sp}", given=f"dtype {dt} [{shape_text(arr.shape)}]", loc=loc)
        # floats convert to the declared float type, as copying them to the device would
        arr = ArgSpec(tuple(arr.shape), sp.dtype) if isinstance(arr, ArgSpec) else arr.astype(sp.dtype.numpy)
    return arr


def _hashable(v) -> bool:
    try:
        hash(v)
        return True
    except TypeError:
        return False

"""Random PyTorch modules from a seed, for differential fuzzing of the compiler against eager.

A case is a :class:`Program`: model inputs, a list of ops (each a kind, the names of its operands
and plain-data attributes) and the names returned. The same Program renders to standalone Python
source (a module class, ``make_model()`` and ``make_inputs(seed)``), and the module a test compiles
is built by executing that source, so what fails is exactly what a person reads and keeps as a
regression test.

Op attributes are stored relative to the operands' shapes where they can be (a linear layer keeps
its output width, not its input width; a slice keeps its start and step, not its end): rendering
reads the operands' shapes from a run of the earlier lines, so a shrinker can make an input smaller
and every op follows. Whether a program is valid is decided the same way: its lines run in eager on
its inputs; an op whose line raises, or whose value is not finite, is not a valid program.

Generation favours what real models do and what has broken graph compilers: broadcasting against
size-1 dims, values used by several consumers, views and strided slices, reductions to 0-d values
used again, contractions (matmul, linear, conv, attention with and without masks), norms, casts
to bf16/f16 and back, bool and integer values from comparisons, constants made in ``forward`` and
in-place updates of clones. Shapes stay small: every case runs on the simulator.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 (the name the rendered source uses)

from .fuzz_ops import KINDS, broadcast_partner, op_exact

# -- the description ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Input:
    name: str
    shape: tuple[int, ...]
    dtype: str  # "float32", "bfloat16", "float16", "int64" (values in [0, 5)) or "bool"
    # how the tensor is laid out in memory: "contiguous", "transposed" (its last two dims
    # swapped in storage) or "broadcast" (a stride-0 expand of its first dim)
    layout: str = "contiguous"


@dataclass(frozen=True)
class Op:
    kind: str
    args: tuple[str, ...]  # operand names, in order
    attrs: tuple[tuple[str, Any], ...]  # plain data, hashable
    out: str

    def attr(self, key: str, default=None):
        return dict(self.attrs).get(key, default)


@dataclass(frozen=True)
class Program:
    seed: int  # seeds the module's parameters (make_model) and the example inputs (make_inputs)
    inputs: tuple[Input, ...]
    ops: tuple[Op, ...]
    outputs: tuple[str, ...]
    label: str = ""  # where it came from ("seed 7", "seed 7, shrunk"): a comment in the source
    nested: bool = False  # return {"out": first, "rest": (others...)} instead of a tuple
    # the first input's dim 0 (and that of every input of the same size there) is a batch dim
    # exported as dynamic (Dim.AUTO): the compiled model then runs at another batch size too
    dynamic: bool = False

    def batch_inputs(self) -> list[str]:
        """The inputs whose dim 0 is the batch dim (none unless ``dynamic``)."""
        if not self.dynamic or not self.inputs or not self.inputs[0].shape or \
                self.inputs[0].shape[0] < 2:
            return []
        n = self.inputs[0].shape[0]
        return [s.name for s in self.inputs if s.shape and s.shape[0] == n]

    def source(self) -> str:
        return render(self).source

    def build(self, input_seed: int | None = None):
        """(model, inputs): the module made by executing this program's source, and its inputs
        drawn with ``input_seed`` (the program's own seed: the example inputs)."""
        return build_from_source(self.source(), self.seed if input_seed is None else input_seed)


class InvalidProgram(Exception):
    """A program whose lines do not run in eager (or give non-finite or huge values)."""


# -- rendering and building --------------------------------------------------------------------

@dataclass
class Materialized:
    source: str
    values: dict  # name -> eager tensor on the program's example inputs


def make_input(spec: Input, g: torch.Generator) -> torch.Tensor:
    return eval(_input_expr(spec), {"torch": torch, "g": g})


def _dims(shape) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def _input_expr(spec: Input, batch: bool = False) -> str:
    """The expression make_inputs() draws the input with (``batch``: its dim 0 is the
    ``batch`` argument)."""
    shape = tuple(spec.shape)
    if batch:
        shape = ("batch",) + shape[1:]
    layout = spec.layout if len(shape) >= 2 else "contiguous"
    stored = shape
    if layout == "transposed":
        stored = shape[:-2] + (shape[-1], shape[-2])
    elif layout == "broadcast":
        stored = (1,) + shape[1:]
    s = _dims(stored)
    if spec.dtype == "float32":
        expr = f"torch.randn({s}, generator=g)"
    elif spec.dtype in ("bfloat16", "float16"):
        expr = f"torch.randn({s}, generator=g).to(torch.{spec.dtype})"
    elif spec.dtype == "int64":
        expr = f"torch.randint(0, 5, {s}, generator=g)"
    else:
        expr = f"(torch.rand({s}, generator=g) < 0.5)"
    if layout == "transposed":
        return f"{expr}.transpose(-1, -2)"
    if layout == "broadcast":
        return f"{expr}.expand{_dims(shape)}"
    return expr


_NAMESPACE = {"torch": torch, "F": F}


def render(p: Program) -> Materialized:
    """The program's source. Each op's lines also run in eager on the example inputs (shapes for
    the next op's rendering come from that run): InvalidProgram when a line raises or gives a
    non-finite or huge value."""
    g = torch.Generator().manual_seed(p.seed)
    env: dict[str, Any] = {spec.name: make_input(spec, g) for spec in p.inputs}
    torch.manual_seed(p.seed)  # as make_model() does: parameters are drawn in init order
    holder = torch.nn.Module()
    init_lines: list[str] = []
    fwd_lines: list[str] = []
    scope = {**_NAMESPACE, "self": holder}
    for op in p.ops:
        try:
            ts = [env[a] for a in op.args]
        except KeyError as e:
            raise InvalidProgram(f"{op.out} uses undefined {e}") from None
        r = KINDS[op.kind].render(op.out, op.args, op.attrs, ts)
        init_lines += r.init
        fwd_lines += r.forward
        try:
            with torch.no_grad():
                for line in r.init:
                    exec(line, scope)
                local = dict(env)
                for line in r.forward:
                    exec(line, scope, local)
        except Exception as e:
            raise InvalidProgram(f"{op.out}: {type(e).__name__}: {str(e)[:200]}") from None
        value = local[op.out]
        _check_value(op.out, value)
        env[op.out] = value
    missing = [o for o in p.outputs if o not in env]
    if missing:
        raise InvalidProgram(f"outputs {missing} are not defined")
    return Materialized(_source(p, init_lines, fwd_lines), env)


def _check_value(name: str, v) -> None:
    if not isinstance(v, torch.Tensor):
        raise InvalidProgram(f"{name} is not a tensor")
    if v.numel() == 0 or v.numel() > 8192:
        raise InvalidProgram(f"{name} has {v.numel()} elements")
    if v.dtype.is_floating_point:
        f = v.float()
        if not bool(torch.isfinite(f).all()) or float(f.abs().max()) > 1e4:
            raise InvalidProgram(f"{name} has non-finite or huge values")


def _source(p: Program, init: list[str], fwd: list[str]) -> str:
    args = ", ".join(["self"] + [s.name for s in p.inputs])
    ret = p.outputs[0] if len(p.outputs) == 1 else "(" + ", ".join(p.outputs) + ",)"
    if p.nested:
        ret = f'{{"out": {p.outputs[0]}, "rest": ({"".join(o + ", " for o in p.outputs[1:])})}}'
    body_init = "".join(f"        {line}\n" for line in init)
    body_fwd = "".join(f"        {line}\n" for line in fwd)
    batch = p.batch_inputs()
    inputs = "".join(f"        {_input_expr(s, s.name in batch)},\n" for s in p.inputs)
    label = f" ({p.label})" if p.label else ""
    head, signature = f"SEED = {p.seed}\n", "seed=SEED"
    if batch:
        dyn = ", ".join("{0: Dim.AUTO}" if s.name in batch else "None" for s in p.inputs)
        head += (f"BATCH = {p.inputs[0].shape[0]}\n"
                 f"# dim 0 of {', '.join(batch)} is exported as dynamic\n"
                 f"DYNAMIC_SHAPES = ({dyn},)\n")
        signature += ", batch=BATCH"
    return f'''"""A module generated by fexplore's differential fuzzer{label}."""

import torch
import torch.nn.functional as F
{"from torch.export import Dim" + chr(10) if batch else ""}
{head}

class Fuzzed(torch.nn.Module):
    def __init__(self):
        super().__init__()
{body_init}
    def forward({args}):
{body_fwd}        return {ret}


def make_model():
    torch.manual_seed(SEED)
    with torch.no_grad():
        return Fuzzed().eval()


def make_inputs({signature}):
    g = torch.Generator().manual_seed(seed)
    return (
{inputs}    )
'''


def load_source(source: str) -> dict:
    """The names a rendered program's source defines (make_model, make_inputs, SEED, and for a
    dynamic program BATCH and DYNAMIC_SHAPES)."""
    scope: dict[str, Any] = {"__name__": "fexplore_fuzz_case"}
    exec(compile(source, "<fuzz case>", "exec"), scope)
    return scope


def build_from_source(source: str, input_seed: int | None = None):
    """(model, inputs) from a rendered program's source; ``make_inputs`` itself when
    ``input_seed`` is None."""
    scope = load_source(source)
    make = scope["make_inputs"]
    return scope["make_model"](), (make if input_seed is None else make(input_seed))


# -- generation --------------------------------------------------------------------------------

@dataclass
class _Gen:
    rng: random.Random
    seed: int
    inputs: list = field(default_factory=list)
    ops: list = field(default_factory=list)
    env: dict = field(default_factory=dict)  # name -> example tensor
    exact: dict = field(default_factory=dict)  # name -> bit-exact in any correct implementation
    used: set = field(default_factory=set)
    counter: int = 0
    holder: torch.nn.Module = field(default_factory=torch.nn.Module)  # parameters made so far

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def new_input(self, shape: tuple, dtype: str, layout: str = "contiguous") -> str:
        name = self.fresh("x")
        if layout == "broadcast" and (len(shape) < 2 or shape[0] == 1):
            layout = "contiguous"
        self.inputs.append(Input(name, tuple(shape), dtype, layout))
        # drawn as make_inputs() draws: every input in order from one generator
        g = torch.Generator().manual_seed(self.seed)
        for spec in self.inputs:
            value = make_input(spec, g)
        self.env[name] = value
        self.exact[name] = True
        return name

    def value(self, pred, *, exact: bool = False, avoid: str | None = None) -> str | None:
        """A defined value satisfying ``pred``; recent values are likelier (chains get deep),
        older ones still come back (values with several consumers)."""
        names = [n for n, t in self.env.items() if n != avoid and (not exact or self.exact[n])
                 and _safe(pred, t)]
        if not names:
            return None
        weights = [1.0 + i for i in range(len(names))]
        return self.rng.choices(names, weights)[0]


def _safe(pred, t) -> bool:
    try:
        return bool(pred(t))
    except Exception:
        return False


def _layout(rng: random.Random) -> str:
    return rng.choice(["contiguous"] * 6 + ["transposed", "broadcast"])


def _first_input_shape(rng: random.Random) -> tuple[int, ...]:
    dims = (1, 2, 3, 4, 5, 6, 8)
    form = rng.choice(["image", "sequence", "sequence", "flat", "any", "tile_edge"])
    if form == "tile_edge":
        # a dim just past a power of two: tiles with a ragged last one
        edge = rng.choice([7, 9, 15, 17, 31, 33, 63, 65])
        return (rng.choice([1, 2, 3]), edge) if rng.random() < 0.5 else \
            (rng.choice([1, 2]), edge, rng.choice([4, 8, 16]))
    if form == "image":
        return (rng.choice([1, 2]), rng.choice([1, 2, 3, 4]), rng.choice([4, 5, 6, 8]),
                rng.choice([4, 5, 6, 8]))
    if form == "sequence":
        return (rng.choice([1, 2]), rng.choice([3, 4, 5, 8]), rng.choice([4, 6, 8]))
    if form == "flat":
        return (rng.choice(dims), rng.choice([4, 6, 8]))
    return tuple(rng.choice(dims) for _ in range(rng.randint(1, 4)))


def generate(seed: int, *, max_ops: int = 12) -> Program:
    """A random valid program from ``seed`` (the same seed gives the same program). Torch's
    global random state is left as it was."""
    with torch.random.fork_rng():
        # parameters drawn in the order make_model() draws them, so the values checked here
        # are the ones the built module computes
        torch.manual_seed(seed)
        return _generate(seed, max_ops)


def _generate(seed: int, max_ops: int) -> Program:
    rng = random.Random(seed)
    gen = _Gen(rng, seed)
    gen.new_input(_first_input_shape(rng), "float32", _layout(rng))
    if rng.random() < 0.3:
        shape = tuple(gen.env["x1"].shape)
        gen.new_input(shape if rng.random() < 0.5 else broadcast_partner(rng, shape),
                      rng.choice(["float32", "float32", "int64", "bool"]), _layout(rng))
    n_ops = rng.randint(2, max_ops)
    kinds = sorted(KINDS)
    weights = [KINDS[k].weight for k in kinds]
    attempts = 0
    while len(gen.ops) < n_ops and attempts < n_ops * 8:
        attempts += 1
        k = rng.choices(kinds, weights)[0]
        n_inputs, counter, rng_state = len(gen.inputs), gen.counter, torch.get_rng_state()
        picked = _safe_pick(k, gen)
        if picked is None:
            _roll_back(gen, n_inputs, counter)
            continue
        args, attrs = picked
        op = Op(k, tuple(args), attrs, gen.fresh("v"))
        try:
            value = _run_one(op, gen)
        except InvalidProgram:
            _roll_back(gen, n_inputs, counter)
            torch.set_rng_state(rng_state)
            continue
        gen.ops.append(op)
        gen.env[op.out] = value
        gen.exact[op.out] = op_exact(op) and all(gen.exact[a] for a in args)
        gen.used.update(args)
    outputs = _choose_outputs(gen)
    p = Program(seed, tuple(gen.inputs), tuple(gen.ops), outputs, f"seed {seed}",
                nested=rng.random() < 0.1, dynamic=rng.random() < 0.2)
    render(p)  # the whole program once more, as make_model() builds it: parameters in order
    return p


def _safe_pick(k: str, gen: _Gen):
    try:
        return KINDS[k].pick(gen)
    except (IndexError, ValueError, RuntimeError, TypeError, KeyError):
        return None


def _run_one(op: Op, gen: _Gen):
    """The op's value on the generator's example tensors."""
    ts = [gen.env[a] for a in op.args]
    r = KINDS[op.kind].render(op.out, op.args, op.attrs, ts)
    scope = {**_NAMESPACE, "self": gen.holder}
    local = dict(gen.env)
    try:
        with torch.no_grad():
            for line in r.init:
                exec(line, scope)
            for line in r.forward:
                exec(line, scope, local)
    except Exception as e:
        raise InvalidProgram(f"{type(e).__name__}: {e}") from None
    _check_value(op.out, local[op.out])
    return local[op.out]


def _roll_back(gen: _Gen, n_inputs: int, counter: int) -> None:
    for spec in gen.inputs[n_inputs:]:
        gen.env.pop(spec.name, None)
        gen.exact.pop(spec.name, None)
    del gen.inputs[n_inputs:]
    gen.counter = counter


def _choose_outputs(gen: _Gen) -> tuple[str, ...]:
    """The values no op consumed (at most three, the last op's among them): every op then
    reaches an output or is a dead branch the compiler must drop. Now and then an output
    aliases another value: an input returned as is, or an intermediate also consumed."""
    if not gen.ops:
        return (gen.inputs[0].name,)
    last = gen.ops[-1].out
    leaves = [op.out for op in gen.ops if op.out not in gen.used and op.out != last]
    gen.rng.shuffle(leaves)
    outputs = sorted(leaves[:2], key=lambda n: int(n[1:])) + [last]
    if gen.rng.random() < 0.1:
        outputs.insert(0, gen.rng.choice(gen.inputs).name)
    if gen.rng.random() < 0.1 and len(gen.ops) > 1:
        inner = gen.rng.choice(gen.ops[:-1]).out
        if inner not in outputs:
            outputs.append(inner)
    return tuple(outputs)


# -- editing, for the shrinker -----------------------------------------------------------------

def live(p: Program) -> Program:
    """Without ops no output depends on, and without inputs nothing uses."""
    needed = set(p.outputs)
    kept = []
    for op in reversed(p.ops):
        if op.out in needed:
            kept.append(op)
            needed.update(op.args)
    ops = tuple(reversed(kept))
    inputs = tuple(s for s in p.inputs if s.name in needed)
    return replace(p, inputs=inputs, ops=ops)


def substitute(p: Program, old: str, new: str) -> Program:
    """Every use of value ``old`` (as an operand or output) becomes ``new``."""
    ops = tuple(replace(op, args=tuple(new if a == old else a for a in op.args)) for op in p.ops)
    outputs = tuple(dict.fromkeys(new if o == old else o for o in p.outputs))
    return replace(p, ops=ops, outputs=outputs)


"""Mutation testing of the compiler: faults injected into fexplore's own passes, each of which the
verification (or the simulator's checks) must catch.

A :class:`Mutant` is a named fault in one pass: one or more :class:`Patch` es, each an exact piece
of a function's source replaced by a faulty one. While the mutant is active
(``with mutant.active():``),
each patched function runs the faulty code: the edited source is compiled and swapped into the
function's ``__code__``, so every caller (a ``from x import f`` taken before, a method, a stage
list) runs it, and nothing on disk changes. Leaving the ``with`` restores the original code. A
patch whose text is no longer in the source raises at once, so a mutant cannot silently turn into
the unmutated code when the code it breaks is edited.

:func:`detect` then compiles a set of :class:`Case` s (the zoo models at their small default sizes
and a few targeted modules) with verification on and runs each compiled model on the simulated NPU
against eager, stopping at the first check that fires: the structural verifier after a stage, a
stage's numeric check, the lower stage's kernel check, a generator bug the lower stage recorded
behind its fallback to a host op, the schedule stage's simulator check or the simulator's hazard
check, a stage that raised, or the compiled model's outputs.

Used by ``bench/mutants.py`` (every mutant, a table) and ``tests/test_mutants.py`` (a few, and the
same cases passing with no mutant).
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import textwrap
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
import torch.utils._pytree as pytree

from .limits import CaseTimeout
from .limits import time_limit as limit_time


# -- the mechanism -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Patch:
    """In function ``where`` ("module:function" or "module:Class.method"), the source text
    ``old`` (which must occur exactly once) becomes ``new``. ``where`` may also name a module's
    string constant (code a generator pastes into the kernels it writes)."""

    where: str
    old: str
    new: str

    def target(self):
        module, _, qual = self.where.partition(":")
        obj = importlib.import_module(module)
        for part in qual.split("."):
            obj = getattr(obj, part)
        return obj

    def edited(self, src: str) -> str:
        found = src.count(self.old)
        if found != 1:
            raise RuntimeError(f"mutant patch of {self.where}: the text to replace occurs {found} times "
                               f"(expected once); has the code changed?\n  {self.old!r}")
        return src.replace(self.old, self.new)

    @contextlib.contextmanager
    def applied(self):
        obj = self.target()
        if isinstance(obj, str):   # a module constant: swapped in the module for the duration
            module, _, name = self.where.partition(":")
            mod = importlib.import_module(module)
            setattr(mod, name, self.edited(obj))
            try:
                yield
            finally:
                setattr(mod, name, obj)
            return
        fn, code = self.compiled()
        old, fn.__code__ = fn.__code__, code
        try:
            yield
        finally:
            fn.__code__ = old

    def compiled(self):
        """The function and its faulty code object."""
        fn = inspect.unwrap(self.target())
        src = textwrap.dedent(inspect.getsource(fn))
        tree = ast.parse(self.edited(src))
        fdef = tree.body[0]
        fdef.decorator_list = []   # the decorators already wrap the original function object
        ast.increment_lineno(tree, fn.__code__.co_firstlineno - 1)   # tracebacks point at the file
        ns = dict(fn.__globals__)
        exec(compile(tree, fn.__code__.co_filename, "exec"), ns)
        code = ns[fdef.name].__code__
        if code.co_freevars != fn.__code__.co_freevars:
            raise RuntimeError(f"mutant patch of {self.where}: a closure or super() call cannot be patched")
        return fn, code


@dataclass(frozen=True)
class Mutant:
    """A fault in one pass: ``name``, the pass or module it ``breaks``, a one-line ``description``
    and the source ``patches`` that make it."""

    name: str
    breaks: str
    description: str
    patches: tuple[Patch, ...]
    # why the mutant is known to survive (an equivalent mutant, or a gap in the checks, measured):
    # reported beside it, never used to count it as caught
    known_gap: str = ""

    @contextlib.contextmanager
    def active(self):
        with contextlib.ExitStack() as stack:
            for p in self.patches:
                stack.enter_context(p.applied())
            stack.callback(_clear_caches)
            _clear_caches()
            yield self


def _clear_caches() -> None:
    """Results kept across compiles that a mutant may have made (tile measurements per kernel source)."""
    from fexplore.pipeline.stages import tiles

    tiles._MEASURED.clear()


# -- the mutants -------------------------------------------------------------------------------

_CG = "fexplore.lang.codegen"

MUTANTS: list[Mutant] = [
    Mutant("epilogue-op-dropped", "lower: contraction codegen",
           "the last op of a contraction's epilogue is skipped (its input passed on as its result)",
           (Patch(f"{_CG}.contraction:generate_contraction",
                  "tiles[n.outputs[0].name] = emit.node(n, [tiles[x.name] for x in n.inputs], -1)",
                  "tiles[n.outputs[0].name] = tiles[n.inputs[0].name] if n is epilogue[-1] else "
                  "emit.node(n, [tiles[x.name] for x in n.inputs], -1)"),)),
    Mutant("bias-dropped", "lower: contraction codegen",
           "a linear's or a convolution's bias is loaded but never added to the accumulator",
           (Patch(f"{_CG}.vector:contraction_value",
                  'f"{val} = {acc} + {bias}" if dt == DType.f32 else f"{val} = fl.add({acc}, {bias}, dtype=',
                  'f"{val} = {acc}" if dt == DType.f32 else f"{val} = fl.add({acc}, 0.0, dtype='),)),
    Mutant("streamed-weights-stale", "lower: contraction codegen (rows streamed in steps)",
           "a panel that streams its rows keeps its weight tiles by K slab alone: each column tile "
           "after the first contracts with the first one's weights",
           (Patch(f"{_CG}.contraction:generate_contraction",
                  'wkey = f"(ns.start, {_slab_key(permuted)})"', "wkey = _slab_key(permuted)"),)),
    Mutant("transpose-axes-swapped", "simplify: cancel-transpose-pair",
           "two permutes compose in the wrong order (q∘p for p∘q): axes swapped unless they commute",
           (Patch("fexplore.pipeline.stages.simplify:_permute_pair",
                  "perm = tuple(p[i] for i in q)", "perm = tuple(q[i] for i in p)"),)),
    Mutant("permute-converter-axes-swapped", "ingest: aten.permute converter",
           "aten.permute of rank > 2 swaps the last two entries of its permutation",
           (Patch("fexplore.pipeline.convert.movement:_permute",
                  "    if perm == tuple(range(x.type.rank)):",
                  "    perm = perm[:-2] + (perm[-1], perm[-2]) if len(perm) > 2 else perm\n"
                  "    if perm == tuple(range(x.type.rank)):"),)),
    Mutant("fold-wrong-constant", "fold: constant folding",
           "folded float constants are stored rounded through f16",
           (Patch("fexplore.pipeline.stages.fold:fold",
                  'rw.replace(v, rw.constant(v.name, np.asarray(a, order="C"), type=v.type))',
                  'rw.replace(v, rw.constant(v.name, np.asarray(np.asarray(a).astype(np.float16).astype('
                  'np.asarray(a).dtype) if np.asarray(a).dtype.kind == "f" else a, order="C"), type=v.type))'),)),
    Mutant("merged-projections-misaligned", "fold: parallel linears merged",
           "the merged weight puts the projections in reverse order while the slices take them in "
           "order (q reads v's and k's columns)",
           (Patch("fexplore.pipeline.stages.parallel_linears:_merge",
                  'w = _concatenated(rw, weights, f"{first.output.name}.merged_weight")',
                  'w = _concatenated(rw, weights[::-1], f"{first.output.name}.merged_weight")'),)),
    Mutant("rms-norm-weight-dropped", "simplify: fold-weight-into-rms-norm",
           "a written-out RMSNorm's weight is taken into the rms_norm op and then left out of it",
           (Patch("fexplore.pipeline.stages.simplify:_rms_norm_weight",
                  'return rw.emit("rms_norm", [norm.inputs[0], w], dict(norm.attrs)',
                  'return rw.emit("rms_norm", [norm.inputs[0]], dict(norm.attrs)'),)),
    Mutant("rms-norm-weight-through-cast-dropped", "simplify: fold-weight-into-rms-norm-through-cast",
           "a cast-back RMSNorm's weight multiply is taken into the rms_norm op and then left out of it",
           (Patch("fexplore.pipeline.stages.simplify:_rms_norm_weight_through_cast",
                  'weighted = rw.emit("rms_norm", [norm.inputs[0], w_wide], dict(norm.attrs)',
                  'weighted = rw.emit("rms_norm", [norm.inputs[0]], dict(norm.attrs)'),)),
    Mutant("norm-affine-weight-unscaled", "simplify: fold-norm-affine-into-linear",
           "a norm's weight is taken out of the norm but not multiplied into the linear's weight",
           (Patch("fexplore.pipeline.stages.simplify:_norm_affine_into_linear",
                  "lambda: rw.values(w) * rw.values(gamma)", "lambda: rw.values(w)"),)),
    Mutant("norm-affine-bias-unshifted", "simplify: fold-norm-affine-into-linear",
           "a norm's bias is taken out of the norm but the linear's bias is not shifted by W @ bias",
           (Patch("fexplore.pipeline.stages.simplify:_norm_affine_into_linear",
                  "lambda: rw.values(bias) + rw.values(w) @ rw.values(beta)", "lambda: rw.values(bias)"),)),
    Mutant("qk-norm-of-one-piece", "lower: attention kernel, a norm of each head of q and k",
           "the norm's statistic sums the first piece of the row only (a rotation by halves cuts "
           "D in two), not the whole row",
           (Patch("fexplore.lang.codegen.attention:_Pieces._norm_statistics",
                  "for t in tiles)}) \"", "for t in tiles[:1])}) \""),)),
    Mutant("narrow-copy-of-the-input", "precision: a row-wise result written both wide and narrow",
           "the narrow copy a norm's kernel writes for its bf16 readers is a copy of the norm's input "
           "rows, not of its result",
           (Patch("fexplore.pipeline.stages.precision:_narrow_copies",
                  "nodes.append(_cast(o, ",
                  "nodes.append(_cast(body.nodes[0].inputs[0], "),)),
    Mutant("fused-linear-split-same-rows", "fold: a fused linear split into its parts",
           "every part of a split fused linear takes the first rows of the weight (gate's for up)",
           (Patch("fexplore.pipeline.stages.parallel_linears:_split",
                  'ins = [x, _rows(rw, w, start, end, f"{w.name}.rows_{start}_{end}")]',
                  'ins = [x, _rows(rw, w, 0, end - start, f"{w.name}.rows_{start}_{end}")]'),)),
    Mutant("unflattened-softmax-axis-kept", "simplify: contract-unflattened-rows",
           "a softmax moved onto the unflattened axes keeps its axis number: it normalizes over "
           "the queries instead of the keys",
           (Patch("fexplore.pipeline.stages.simplify:_contract_unflattened_rows",
                  'attrs["axis"] = p.attrs["axis"] % flat.rank + k - 1', 'attrs["axis"] = p.attrs["axis"] % flat.rank'),)),
    Mutant("unflattened-permute-axes-swapped", "simplify: contract-unflattened-rows",
           "kᵀ of the flat heads, unflattened, also swaps the axes the flat one splits into (batch "
           "and heads)",
           (Patch("fexplore.pipeline.stages.simplify:_contract_unflattened_rows",
                  "perm = tuple(range(k)) + ", "perm = tuple(range(k))[::-1] + "),)),
    Mutant("query-scale-lost", "simplify: fold-query-key-scale-into-attention",
           "q's scale factor is taken off q but not multiplied into the attention's scale",
           (Patch("fexplore.pipeline.stages.simplify:_attention_scale",
                  "new[i], scale = x, scale * c", "new[i], scale = x, scale"),)),
    Mutant("series-last-factor-dropped", "simplify: raise-forward-substitution",
           "the product for the inverse stops one factor short: powers of A from 2^(K-1) on are lost",
           (Patch("fexplore.pipeline.stages.forward_substitution:_series",
                  "range(1, math.ceil(math.log2(size)))", "range(1, math.ceil(math.log2(size)) - 1)"),)),
    Mutant("row-scale-squared-product", "simplify: scale-rows-after-the-matmul",
           "the scale moved off an operand multiplies the product by itself instead of by the scale",
           (Patch("fexplore.pipeline.stages.simplify:_row_scale_after_matmul",
                  'rw.emit("mul", [y, s]', 'rw.emit("mul", [y, y]'),)),
    Mutant("fold-batchnorm-without-eps", "fold: conv + batch norm folding",
           "the folded scale is gamma / sqrt(var), the batch norm's eps forgotten",
           (Patch("fexplore.pipeline.stages.fold:_bn_scale",
                  'return gamma / np.sqrt(var + bn.attrs["eps"])', "return gamma / np.sqrt(var)"),)),
    Mutant("window-last-row-dropped", "lower: convolution and pooling windows",
           "an offset is taken to reach one output row (column) fewer than it does inside the input: "
           "the last row (column) near a border misses that offset's contribution",
           (Patch("fexplore.lang.codegen.conv:COVERED",
                  "min(band.stop, -((off - n) // stride))", "min(band.stop, -((off - n) // stride) - 1)"),)),
    Mutant("cse-ignores-attributes", "simplify: CSE",
           "common-subexpression elimination merges nodes with the same op and inputs but other attributes",
           (Patch("fexplore.pipeline.stages.simplify:_round",
                  "(node.op.name, tuple(v.name for v in ins), node.attrs)",
                  "(node.op.name, tuple(v.name for v in ins))"),)),
    Mutant("fusion-non-convex", "fusion: region formation",
           "the convexity check always passes: a region may be fused across a path that leaves it and comes back",
           (Patch("fexplore.pipeline.stages.fusion:_Fuser.convex",
                  "    seen: set[int] = set()", "    return True\n    seen: set[int] = set()"),)),
    Mutant("tile-bound-off-by-one", "kernel language: fl.tiles (every tiled loop)",
           "the last tile of fl.tiles(n, size) stops one element short",
           (Patch("fexplore.lang.builtins:tiles",
                  "return [slice(i, min(i + size, stop)) for i in _py.range(start, stop, size)]",
                  "return [slice(i, min(i + size, stop) - (1 if i + size >= stop > i + 1 else 0)) "
                  "for i in _py.range(start, stop, size)]"),)),
    Mutant("k-accumulation-dropped", "lower: contraction codegen (the K-loop reduction)",
           "each K tile's partial product overwrites the accumulator instead of adding to it",
           (Patch(f"{_CG}.contraction:generate_contraction",
                  """w(f'{acc} = fl.contract("{spec}", {a}, {wb}, acc={acc})')""",
                  """w(f'{acc} = fl.contract("{spec}", {a}, {wb})')"""),)),
    Mutant("reduction-tiles-mispaired", "lower: contraction codegen (the K-loop reduction)",
           "the K loop sums its tiles in another order for the weights than for the activations "
           "(weight tile K - ks for activation tile ks)",
           (Patch(f"{_CG}.contraction:generate_contraction",
                  'w_k = permuted.weight_index() if permuted is not None else ("ks" if staged else k_idx)',
                  'w_k = permuted.weight_index() if permuted is not None else ("ks" if staged else '
                  '(k_idx if k_idx != "ks" else "slice(K - ks.stop, K - ks.start)"))'),)),
    Mutant("reduction-wrong-identity", "lower: reduction codegen",
           "amax starts its accumulator at 0 instead of -inf (a reduction seeded with the wrong identity)",
           (Patch(f"{_CG}.reduce:_accumulate",
                  'w(f"acc = fl.full({shape}, {init})")',
                  'w(f"acc = fl.full({shape}, {\'0.0\' if op == \'amax\' else init})")'),)),
    Mutant("softmax-wrong-axis", "lower: vector codegen (softmax)",
           "softmax normalizes by the sum over the tile's rows instead of along the row",
           (Patch(f"{_CG}.vector:VectorEmitter.softmax",
                  'w(f"{name} = fl.div({e}, {e}.sum(axis={ax}){kw})")',
                  'w(f"{name} = fl.div({e}, {e}.sum(axis=0){kw})")'),)),
    Mutant("split-row-statistics-short", "lower: vector codegen (split rows)",
           "the statistics passes over a row taken in chunks of columns skip its last chunk: a norm's "
           "mean and variance, a softmax's max and sum, of part of the row",
           (Patch(f"{_CG}.rowwise:SplitRow._pass",
                  'w("for cs in fl.range(fl.tiles(C, cols), stages=stages):")',
                  'w("for cs in fl.range([cs for cs in fl.tiles(C, cols)][:-1], stages=stages):")'),)),
    Mutant("attention-mask-off-by-one", "lower: attention codegen (causal mask)",
           "the causal mask keeps key j < query i: the diagonal is masked out",
           (Patch(f"{_CG}.attention:_generate",
                  'tri_src = f"fl.load({kpos}[:, 0:key[2]]) <= fl.transpose(',
                  'tri_src = f"fl.load({kpos}[:, 0:key[2]]) < fl.transpose('),)),
    Mutant("conv-padding-tap-dropped", "lower: conv and pool codegen (padding)",
           "a kernel offset is taken to reach the output rows (columns) from one after the first whose "
           "input is inside the image: the first such row misses that offset's contribution",
           (Patch(f"{_CG}.conv:COVERED",
                  "max(band.start, -(off // stride))", "max(band.start, -(off // stride) + 1)"),)),
    Mutant("precision-cast-misplaced", "precision: cast policy (bf16)",
           "contractions write the narrow dtype, so the epilogues, norms and softmax run in bf16",
           (Patch("fexplore.pipeline.stages.precision:_Policy.apply",
                  'attrs["out_dtype"] = node.outputs[0].type.dtype', 'attrs["out_dtype"] = self.dtype'),)),
    Mutant("precision-weights-at-fp8", "precision: weight conversion (bf16)",
           "weights converted to bf16 are first rounded to fp8 (e4m3) resolution",
           (Patch("fexplore.pipeline.stages.precision:_constant_in",
                  "return rw.constant(f\"{c.name}.{dtype.value}\", payload.astype(dtype.numpy),",
                  "return rw.constant(f\"{c.name}.{dtype.value}\", np.clip(payload, -448.0, 448.0)"
                  ".astype(DType.fp8.numpy).astype(np.float32).astype(dtype.numpy),"),)),
    Mutant("broadcast-axes-merged", "lower: codegen domain (broadcasting)",
           "neighbouring leading axes are merged even where an operand broadcasts along one and not the other",
           (Patch(f"{_CG}.domain:group_axes",
                  "if groups and groups[-1][-1] == i - 1 and all(p[i] == p[i - 1] and p[i] != OWN for p in patterns):",
                  "if groups and groups[-1][-1] == i - 1 and all(p[i] != OWN for p in patterns):"),)),
    Mutant("layout-transpose-forgotten", "layout: relayout insertion",
           "a conv2d's activation is not relaid out to channels-last (NHWC)",
           (Patch("fexplore.pipeline.stages.layout:_assign",
                  "new_ins = [ensure(ins[0], NHWC)]", "new_ins = [ins[0]]"),)),
    Mutant("dma-wait-missing", "npu: hazard inference (DRAM)",
           "a load does not wait for the store that wrote the DRAM it reads",
           (Patch("fexplore.npu.hazards:HazardTracker.dram_deps",
                  "                if acc.writer >= 0:\n                    deps.add(acc.writer)",
                  "                pass"),)),
    Mutant("hazard-write-ignored", "npu: hazard inference (SRAM)",
           "a write to an SRAM buffer is not recorded: its readers do not wait for it",
           (Patch("fexplore.npu.hazards:HazardTracker.buffer_deps",
                  "        acc.writer, acc.readers = cid, []", "        acc.readers = []"),)),
    Mutant("sram-offset-wrong", "npu: SRAM allocator",
           "every buffer above the first alignment unit is placed one alignment unit too low",
           (Patch("fexplore.npu.sram:allocate",
                  "alloc.offset[buf.id], alloc.size[buf.id] = off, size",
                  "alloc.offset[buf.id], alloc.size[buf.id] = (off - align if off >= align else off), size"),)),
    Mutant("sram-reuse-wait-missing", "npu: SRAM allocator",
           "a buffer placed in space another buffer used does not wait for that buffer's last reader",
           (Patch("fexplore.npu.sram:allocate",
                  "            if before:\n                # a tile's", "            if False:\n                # a tile's"),)),
    Mutant("sram-reuse-wait-first-writer-only", "npu: SRAM allocator",
           "of a resident tensor written box by box, only the first writer waits for the space's last "
           "reader (the others are not ordered after it)",
           (Patch("fexplore.npu.sram:allocate",
                  "for w in dict.fromkeys([c.id, *resident_writers.get(buf.id, ())]):", "for w in (c.id,):"),)),
    Mutant("scatter-identity-skipped", "lower: scatter codegen (reduce without include_self)",
           "a scatter_reduce without include_self leaves out the pass writing the reduction's identity "
           "at the picked places: they combine with the tensor's own value",
           (Patch(f"{_CG}.gather:_elements",
                  "w(f\"fl.scatter({box('OUT', xs, True)}, i, fl.full(i.shape, {start}",
                  "w(f\"pass  # ({box('OUT', xs, True)}, i, fl.full(i.shape, {start}"),)),
    Mutant("grouped-tile-shared-by-two-groups-overwritten", "lower: grouped contraction codegen",
           "a step writing a row tile the step before wrote zeroes the rows of the group before "
           "instead of keeping them (a row tile holding the end of one group and the start of the next)",
           (Patch("fexplore.lang.codegen.grouped:_steps", "fl.where(same[step], written[ns.start], 0.0)", "0.0"),)),
    Mutant("concat-pieces-in-place-at-one-offset", "schedule: concatenations written in place",
           "every piece of a concatenation its producers write in place is placed at the start of the "
           "result (the second layer's cache of a decode step over the first's)",
           (Patch("fexplore.pipeline.stages.schedule:_concats_in_place",
                  "offset += _shape(v)[axis] * inner", "offset += 0"),)),
    Mutant("update-in-place-before-a-later-reader", "schedule: updates written in place",
           "an update is written into its table's storage even though a kernel after it reads the old "
           "table (it reads the new rows)",
           (Patch("fexplore.pipeline.stages.schedule:_updates_in_place",
                  "dead = all(j <= i for j in readers.get(where, []))", "dead = True"),)),
    Mutant("initial-copy-dropped-unbound", "lang: an output started as a parameter (fl.output(init=))",
           "the copy that starts an output as its parameter is dropped whether or not the output was given "
           "the parameter's storage (the update's other rows are never written)",
           (Patch("fexplore.lang.lowering:_copies_in_place",
                  "if (a.storage, a.storage_offset, a.shape) == (b.storage, b.storage_offset, b.shape):",
                  "if True:"),)),
    Mutant("scatter-max-adds", "npu/lang: a DMA scatter's reduce on write",
           "a scatter with reduce='max' adds its values instead (the interpreter and the simulator share it)",
           (Patch("fexplore.npu.functional:scatter_rows",
                  '(np.maximum if reduce == "max" else np.minimum)', '(np.add if reduce == "max" else np.minimum)'),)),
]

BY_NAME = {m.name: m for m in MUTANTS}


# -- the detection cases -----------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    """A model to compile (``build() -> (model, inputs)``) with compile ``options``."""

    name: str
    build: Callable[[], tuple]
    options: dict = field(default_factory=dict)


def _zoo(name: str) -> Callable[[], tuple]:
    def build():
        from fexplore.models import ZOO

        return ZOO[name]()
    return build


class _TiledLinear(torch.nn.Module):
    """Sizes that are no multiple of the tiles on `tiny`: several K tiles, a short last tile."""

    def __init__(self, k=200, n=72):
        super().__init__()
        self.fc = torch.nn.Linear(k, n)

    def forward(self, x):
        return torch.nn.functional.gelu(self.fc(x)) * 2.0


class _StackedCaches(torch.nn.Module):
    """Two projections stacked, as a decode step stacks each layer's cache: on `tiny` the pieces
    (32 KB each) do not stay in SRAM, so their kernels store them into the stack in place."""

    def __init__(self, k=64, n=512):
        super().__init__()
        self.k, self.v = torch.nn.Linear(k, n), torch.nn.Linear(k, n)

    def forward(self, x):
        return torch.stack([torch.tanh(self.k(x)), self.v(x) * 2.0])


class _CacheUpdates(torch.nn.Module):
    """Two caches updated at a step's rows (index_put): the first is read as it was after its
    update, so its update copies it; nothing reads the second after its update, which is written
    into the second's own storage (no copy)."""

    def forward(self, cache, other, at, rows):
        updated = torch.ops.aten.index_put(cache, [at], rows)
        stale = cache * 0.5
        other.index_put_([at], rows * 2.0)
        return updated, stale, other.sum(0)


class _StreamedLinear(torch.nn.Module):
    """Many rows and wide panels on `rngd`: each PE's panel runs its rows in steps, and several
    column tiles each keep their own weight slabs over the steps (K deep enough that a column
    tile's weights are worth a DMA of their own, so a panel has more than one)."""

    def __init__(self, k=256, n=4096):
        super().__init__()
        self.fc = torch.nn.Linear(k, n)

    def forward(self, x):
        return torch.relu(self.fc(x))


class _CausalAttention(torch.nn.Module):
    def forward(self, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


class _NormedAttention(torch.nn.Module):
    """RMSNorm written out (weight off 1), then q, k and v projections of the normed rows into
    attention, k normalized per head (QK-norm) and q and k rotated by halves: the rms_norm raising,
    the merged projection and the attention kernel's norm of each head, summed over its halves."""

    def __init__(self, g):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(32, generator=g) + 0.5)
        self.k_weight = torch.nn.Parameter(torch.rand(16, generator=g) + 0.5)
        self.q, self.k, self.v = (torch.nn.Linear(32, n, bias=False) for n in (32, 16, 16))
        angle = torch.arange(12.0)[:, None] * torch.rand(16, generator=g)[None, :]
        self.register_buffer("cos", torch.cos(angle))
        self.register_buffer("sin", torch.sin(angle))

    def _rotated(self, x):
        return x * self.cos + torch.cat((-x[..., 8:], x[..., :8]), -1) * self.sin

    def forward(self, x):
        h = self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
        q = self._rotated(self.q(h).view(1, -1, 2, 16).transpose(1, 2))
        k = self.k(h).view(1, -1, 1, 16)
        k = self.k_weight * (k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + 1e-6))
        k = self._rotated(k.transpose(1, 2)).expand(1, 2, -1, 16)
        v = self.v(h).view(1, -1, 1, 16).transpose(1, 2).expand(1, 2, -1, 16)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


class _ConvBlock(torch.nn.Module):
    """conv (padded) + batch norm with running statistics of a trained network (not 0 and 1)."""

    def __init__(self, g):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        with torch.no_grad():
            self.bn.running_mean.copy_(torch.randn(8, generator=g) * 0.1)
            self.bn.running_var.copy_(torch.rand(8, generator=g) * 0.05 + 1e-3)
            self.bn.weight.copy_(torch.rand(8, generator=g) + 0.5)
            self.bn.bias.copy_(torch.randn(8, generator=g) * 0.1)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


class _Reductions(torch.nn.Module):
    """Reductions over axes other than the last (the reduction part, not the vector one), of
    negative data, so a wrong identity or axis shows."""

    def forward(self, x):
        return x.amax(dim=1) + x.sum(dim=(0, 1)), x.mean(dim=1)


class _ScatterReductions(torch.nn.Module):
    """A graph network's aggregations of messages into nodes (scatter_reduce): max without the
    node's own value, a mean, a sum onto it; repeated targets, and nodes no message reaches."""

    def forward(self, nodes, msg, dst):
        at = dst[:, None].expand(-1, nodes.shape[1])
        return (nodes.scatter_reduce(0, at, msg, "amax", include_self=False),
                nodes.scatter_reduce(0, at, msg, "mean", include_self=False),
                nodes.scatter_reduce(0, at, msg, "sum"))


class _Permutes(torch.nn.Module):
    """Chains of permutes over axes of one size: a wrong permutation keeps the shape, so only the
    values can show it."""

    def forward(self, x):
        return x.permute(0, 2, 1, 3).transpose(-1, -2) * 2.0 + x.transpose(1, 3)


class _ScanBetween(torch.nn.Module):
    """Two elementwise ops with a scan between them: fusing the two (as a chain) would make a
    region that feeds the scan and reads it back."""

    def forward(self, x):
        e = torch.tanh(x)
        return e * e.cumsum(-1) + 1.0


class _Broadcasts(torch.nn.Module):
    """Elementwise ops over operands with size-1 and missing dims, a transpose by negative dims."""

    def forward(self, x, row, col):
        y = torch.tanh(x * row + col) - x.transpose(-2, -1).transpose(-2, -1) * 0.5
        return torch.softmax(y, dim=-1)


class _LongRows(torch.nn.Module):
    """A layer norm and a softmax over rows too long for tiny's SRAM: each row is taken in chunks
    of columns, its statistics in passes over them (split rows)."""

    def forward(self, x):
        return torch.nn.functional.layer_norm(x, x.shape[-1:]) + torch.softmax(x, dim=-1)


class _NormMLP(torch.nn.Module):
    """A layer norm, an MLP on it and the residual add (48 tokens of 96, on `tiny`): kernels
    whose tiles take SRAM another kernel's tiles used. Whether a missing reuse wait then shows
    depends on the tiles the schedule picks; `_reuse_before_last_reader` builds the case by hand."""

    def __init__(self, k=96, n=256):
        super().__init__()
        self.ln = torch.nn.LayerNorm(k)
        self.fc = torch.nn.Linear(k, n)
        self.fc2 = torch.nn.Linear(n, k)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc(self.ln(x)))) + x


class _CastBackNorm(torch.nn.Module):
    """A model in bf16 with Hugging Face's Llama RMSNorm written out (rows normalized in f32, cast
    back to bf16, then times the weight) before a gated MLP and its residual add."""

    def __init__(self, g, k=32, n=64):
        super().__init__()
        self.weight = torch.nn.Parameter(1.0 + 0.5 * torch.rand(k, generator=g))
        self.gate, self.up = (torch.nn.Linear(k, n, bias=False) for _ in range(2))
        self.down = torch.nn.Linear(n, k, bias=False)
        with torch.no_grad():
            for lin in (self.gate, self.up, self.down):
                lin.weight.copy_(torch.randn(lin.weight.shape, generator=g) * lin.in_features ** -0.5)

    def forward(self, x):
        h = x.float()
        rows = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)
        y = self.weight * rows
        return self.down(torch.nn.functional.silu(self.gate(y)) * self.up(y)) + x


class _PostNorm(torch.nn.Module):
    """Two post-norm blocks (BERT's order, layer norm after the residual add), in bf16: the first
    norm's rows are read in f32 by the MLP's residual add and in bf16 by its first projection."""

    def __init__(self, k=32):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = torch.nn.Linear(k, k), torch.nn.Linear(k, 2 * k), torch.nn.Linear(2 * k, k)
        self.ln1, self.ln2 = torch.nn.LayerNorm(k), torch.nn.LayerNorm(k)

    def forward(self, x):
        h = self.ln1(x + self.fc1(x))
        return self.ln2(h + self.fc3(torch.relu(self.fc2(h))))


class _FusedGateUp(torch.nn.Module):
    """Phi-3's MLP: gate and up projections as one linear, chunked in two that meet in SwiGLU's
    product (the fold stage splits it into sibling linears)."""

    def __init__(self, k=32, n=48):
        super().__init__()
        self.gate_up = torch.nn.Linear(k, 2 * n)
        self.down = torch.nn.Linear(n, k, bias=False)

    def forward(self, x):
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(up * torch.nn.functional.silu(gate))


class _FlatProjections(torch.nn.Module):
    """GPT-2's Conv1D (the rows flattened around an addmm, x.view(-1, K) @ W + b, unflattened
    after) into attention with q scaled before its heads are split out (OPT, BART), then into a
    tanh GELU written out: the contraction over the unflattened rows, the bias moved with it and
    the scale taken into the attention's."""

    def __init__(self, g):
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.randn(32, 96, generator=g) * 0.2)
        self.b1 = torch.nn.Parameter(torch.randn(96, generator=g) * 0.5)
        self.w2 = torch.nn.Parameter(torch.randn(32, 48, generator=g) * 0.2)
        self.b2 = torch.nn.Parameter(torch.randn(48, generator=g) * 0.5)

    def forward(self, x):
        qkv = torch.addmm(self.b1, x.view(-1, 32), self.w1).view(1, -1, 96)
        q, k, v = (t.view(1, -1, 2, 16).transpose(1, 2) for t in (qkv[..., :32] * 0.7, qkv[..., 32:64], qkv[..., 64:]))
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
        h = torch.addmm(self.b2, a.reshape(-1, 32), self.w2).view(1, -1, 48)
        return 0.5 * h * (1.0 + torch.tanh(0.8 * (h + 0.044715 * torch.pow(h, 3.0))))


class _FlatHeadsAttention(torch.nn.Module):
    """Attention written out over batch and heads flattened into one axis (XGLM, BLOOM): bmm of q
    and kᵀ, an additive bias of its own per head, softmax, bmm with v, unflattened after; the
    contraction-unflattened-rows rule makes it the written-out attention of [B, H, S, D] views."""

    def __init__(self, g):
        super().__init__()
        self.qkv = torch.nn.Linear(32, 96)
        self.bias = torch.nn.Parameter(torch.randn(4, 1, 10, generator=g))

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (t.view(b, s, 2, 16).transpose(1, 2).reshape(b * 2, s, 16) for t in self.qkv(x).split(32, -1))
        scores = torch.bmm(q, k.transpose(1, 2)) * 0.25 + self.bias
        out = torch.bmm(torch.softmax(scores, dim=-1), v).view(b, 2, s, 16)
        return out.transpose(1, 2).reshape(b, s, 32)


class DeltaRuleChunks(torch.nn.Module):
    """The chunked gated delta rule of Hugging Face's linear-attention layers (Qwen3-Next, Kimi
    Linear, OLMo hybrid), as they run under torch.export: q, k, v, a gate and a decay projected
    from x; keys and queries L2-normed; per chunk, the unit lower-triangular system inverted by
    forward substitution (a loop of row updates) and applied to the values; then the scan over
    chunks carrying the state. `chunk` positions per chunk, `heads` heads of width `dim`."""

    def __init__(self, g=None, width: int = 32, heads: int = 2, dim: int = 8, chunk: int = 8):
        super().__init__()
        self.heads, self.dim, self.chunk = heads, dim, chunk
        self.qkv = torch.nn.Linear(width, 3 * heads * dim, bias=False)
        self.gates = torch.nn.Linear(width, 2 * heads, bias=False)
        if g is not None:
            with torch.no_grad():
                for lin in (self.qkv, self.gates):
                    lin.weight.copy_(torch.randn(lin.weight.shape, generator=g) / width ** 0.5)

    def forward(self, x):
        b, s, _ = x.shape
        h, d, c = self.heads, self.dim, self.chunk
        q, k, v = (t.view(b, s, h, d).transpose(1, 2) for t in self.qkv(x).split(h * d, -1))
        beta, decay = (t.transpose(1, 2) for t in self.gates(x).split(h, -1))
        beta, decay = beta.sigmoid(), -0.1 * torch.nn.functional.softplus(decay)   # slow decay, as trained
        q = torch.nn.functional.normalize(q, dim=-1) * d ** -0.5
        k = torch.nn.functional.normalize(k, dim=-1)
        q, k, v = (t.reshape(b, h, s // c, c, d) for t in (q, k, v))
        beta, decay = beta.reshape(b, h, s // c, c), decay.reshape(b, h, s // c, c).cumsum(-1)
        upper = torch.ones(c, c, dtype=torch.bool).triu(1)
        pairwise = (decay.unsqueeze(-1) - decay.unsqueeze(-2)).masked_fill(upper, float("-inf")).exp()
        k_beta, v_beta = k * beta.unsqueeze(-1), v * beta.unsqueeze(-1)
        system = -((k_beta @ k.transpose(-1, -2)) * pairwise).tril(-1)
        for i in range(1, c):
            row = system[..., i, :i].clone()
            sub = system[..., :i, :i].clone()
            system[..., i, :i] = row + (row.unsqueeze(-1) * sub).sum(-2)
        system = system + torch.eye(c)
        values, k_decayed = system @ v_beta, system @ (k_beta * decay.exp().unsqueeze(-1))
        intra = (q @ k.transpose(-1, -2)) * pairwise
        state = torch.zeros(b, h, d, d)
        out = []
        for j in range(s // c):
            v_new = values[:, :, j] - k_decayed[:, :, j] @ state
            out.append(q[:, :, j] * decay[:, :, j].exp().unsqueeze(-1) @ state + intra[:, :, j] @ v_new)
            tail = (decay[:, :, j, -1:] - decay[:, :, j]).exp().unsqueeze(-1)
            state = state * decay[:, :, j, -1].exp()[..., None, None] + (k[:, :, j] * tail).transpose(-1, -2) @ v_new
        return torch.stack(out, 2).reshape(b, h, s, d).transpose(1, 2).reshape(b, s, h * d)


class SortedExperts(torch.nn.Module):
    """A mixture of experts run the way transformers runs it by default: each token's top-k experts
    flattened and sorted by expert, the tokens' rows gathered in that order, the rows per expert
    counted (histc) into offsets, one grouped matmul per projection over all experts
    (torch.nn.functional.grouped_mm, the weights stored (G, N, K) and transposed on the call),
    and the weighted rows summed back onto their tokens. bf16 (grouped_mm's own dtype)."""

    def __init__(self, g=None, width: int = 16, experts: int = 4, hidden: int = 24, k: int = 2):
        super().__init__()
        self.k = k
        self.router = torch.nn.Linear(width, experts, bias=False)
        self.gate_up = torch.nn.Parameter(torch.randn(experts, 2 * hidden, width, generator=g) / width ** 0.5)
        self.down = torch.nn.Parameter(torch.randn(experts, width, hidden, generator=g) / hidden ** 0.5)
        if g is not None:
            with torch.no_grad():
                self.router.weight.copy_(torch.randn(self.router.weight.shape, generator=g))
        self.to(torch.bfloat16)

    def forward(self, x):
        e = self.gate_up.shape[0]
        weights, experts = torch.softmax(self.router(x).float(), -1).topk(self.k, -1)
        flat = experts.reshape(-1)
        order = torch.sort(flat, stable=True)[1]
        rows = x[order // self.k]
        offs = torch.histc(flat.float(), bins=e, min=0, max=e - 1).cumsum(0).to(torch.int32)
        gate, up = torch.nn.functional.grouped_mm(rows, self.gate_up.transpose(1, 2), offs=offs).chunk(2, -1)
        y = torch.nn.functional.grouped_mm(torch.nn.functional.silu(gate) * up, self.down.transpose(1, 2), offs=offs)
        y = y.float() * weights.reshape(-1)[order, None]
        return x.new_zeros(x.shape, dtype=torch.float32).index_add(0, order // self.k, y)


class _EncoderDecoder(torch.nn.Module):
    """A transformers encoder-decoder (BART) run on the same ids as encoder and decoder input."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids, decoder_input_ids=ids, use_cache=False).last_hidden_state


def _bart_tiny(g):
    """One encoder and one decoder layer of BART at width 64, 24 tokens, on `tiny`: resident layer
    norms written from both PEs over space that weight tiles used before, so a missing SRAM reuse
    wait shows as two live buffers on one address (found by running BART, not written for it)."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.BartConfig(vocab_size=100, d_model=64, encoder_layers=1, decoder_layers=1,
                                  encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                                  decoder_ffn_dim=128, max_position_embeddings=64, use_cache=False)
    return _EncoderDecoder(transformers.BartModel(cfg).eval()), (torch.randint(3, 100, (1, 24), generator=g),)


@dataclass(frozen=True)
class ProgramCase:
    """An NPU program built by hand (``build() -> (program, inputs)``), simulated and checked by
    the simulator's hazard check: for faults of the npu layer that a compile reaches only by chance
    (a schedule has to put the very commands side by side)."""

    name: str
    build: Callable[[], tuple]


def _resident_over_reused_space():
    """On `tiny`, a resident tensor whose SRAM is the space a tile used, written box by box from
    both PEs: PE 0's SRAM is full but for the tile's space (so the tensor lands there); the tile's
    last reader is a long contraction; the second box is stored from PE 1, whose data is ready
    long before. Only a wait of every writer (not just the first) for the contraction keeps it
    from overwriting the tile while it is read."""
    from fexplore.npu import ProgramBuilder

    b = ProgramBuilder("tiny", name="resident-over-reused-space")
    X, W, F = b.input("X", (32, 64)), b.input("W", (64, 64)), b.input("F", (112, 64))
    Y, Z, G = b.output("Y", (32, 64)), b.output("Z", (32, 64)), b.output("G", (112, 64))
    x, w, acc = b.alloc("x", (32, 64), pe=0), b.alloc("w", (64, 64), pe=0), b.alloc("acc", (32, 64), pe=0)
    filler, t0 = b.alloc("filler", (112, 64), pe=0), b.alloc("t0", (16, 64), pe=0)   # 64 KiB in all
    t1, r = b.alloc("t1", (16, 64), pe=1), b.alloc("r", (32, 64), pe=1)
    R = b.resident("R", (32, 64), pe=0)
    b.load(x, X)
    b.load(w, W)
    b.load(filler, F)
    b.load(t0, X[0:16])
    b.load(t1, X[16:32])
    b.vector(t1, "exp", t1)
    for i in range(4):   # x's readers, the last long after t1 is ready
        b.contract(acc, "mk,kn->mn", x, w, accumulate=i > 0)
    b.vector(t0, "exp", t0)
    b.store(R[0:16], t0)    # the first writer of R
    b.store(R[16:32], t1)   # the second, from PE 1
    b.load(r, R)
    b.store(Z, r)
    b.store(Y, acc)
    b.store(G, filler)
    return b.build(), _normal_inputs(X=(32, 64), W=(64, 64), F=(112, 64))


def _reuse_before_last_reader():
    """On `tiny`, a tile that must take the space of two tiles a long contraction still reads: PE
    0's 64 KiB hold x, w, acc and a filler, and z (16 KiB) fits only where x or w was. z's load
    needs nothing z's data depends on, so only the allocator's reuse wait keeps it after the last
    contraction reading that space."""
    from fexplore.npu import ProgramBuilder

    b = ProgramBuilder("tiny", name="reuse-before-last-reader")
    X, W, F = b.input("X", (64, 64)), b.input("W", (64, 64)), b.input("F", (48, 64))
    Y, Z, G = b.output("Y", (64, 64)), b.output("Z", (64, 64)), b.output("G", (48, 64))
    x, w, acc = b.alloc("x", (64, 64), pe=0), b.alloc("w", (64, 64), pe=0), b.alloc("acc", (64, 64), pe=0)
    filler = b.alloc("filler", (48, 64), pe=0)   # 60 KiB in all
    b.load(x, X)
    b.load(w, W)
    b.load(filler, F)
    for i in range(4):   # x's and w's last readers, long after the DMA queue is free
        b.contract(acc, "mk,kn->mn", x, w, accumulate=i > 0)
    z = b.alloc("z", (64, 64), pe=0)
    b.load(z, X)   # z's data: X again (any DRAM box); its space: x's or w's
    b.vector(z, "exp", z)
    b.store(Z, z)
    b.store(Y, acc)
    b.store(G, filler)
    return b.build(), _normal_inputs(X=(64, 64), W=(64, 64), F=(48, 64))


def _normal_inputs(**shapes) -> dict:
    """A hand-built program's inputs by name: standard normal f32, seeded."""
    rng = np.random.default_rng(0)
    return {n: rng.standard_normal(shape).astype(np.float32) for n, shape in shapes.items()}


def _seeded(fn):
    def build():
        g = torch.Generator().manual_seed(0)
        return fn(g)
    return build


# cheap targeted cases first: a mutant they catch costs a second or two
CASES: list[Case] = [
    Case("mlp", _zoo("mlp")),
    Case("permutes", _seeded(lambda g: (_Permutes(), (torch.randn(2, 4, 4, 4, generator=g),)))),
    Case("scan-between", _seeded(lambda g: (_ScanBetween(), (torch.randn(4, 16, generator=g),)))),
    # 200 rows: enough row tiles, with the tiles the schedule picks, that SRAM space is reused
    Case("tiled-linear@tiny", _seeded(lambda g: (_TiledLinear().eval(), (torch.randn(200, 200, generator=g),))),
         {"target": "tiny"}),
    Case("streamed-linear", _seeded(lambda g: (_StreamedLinear().eval(), (torch.randn(512, 256, generator=g),)))),
    Case("causal-attention", _seeded(lambda g: (_CausalAttention(), tuple(
        torch.randn(1, 2, 40, 16, generator=g) for _ in range(3))))),
    Case("normed-attention", _seeded(lambda g: (_NormedAttention(g).eval(), (torch.randn(1, 12, 32, generator=g),)))),
    Case("conv-bn", _seeded(lambda g: (_ConvBlock(g).eval(), (torch.randn(2, 3, 12, 12, generator=g),)))),
    Case("reductions", _seeded(lambda g: (_Reductions(), (torch.randn(4, 6, 10, generator=g) - 3.0,)))),
    Case("scatter-reductions@tiny", _seeded(lambda g: (_ScatterReductions(), (
        torch.randn(9, 6, generator=g), torch.randn(20, 6, generator=g) - 2.0,
        torch.randint(0, 7, (20,), generator=g)))), {"target": "tiny"}),
    Case("broadcasts", _seeded(lambda g: (_Broadcasts(), (torch.randn(2, 8, 16, generator=g),
                                                           torch.randn(1, 1, 16, generator=g),
                                                           torch.randn(8, 1, generator=g))))),
    Case("long-rows@tiny", _seeded(lambda g: (_LongRows(), (torch.randn(3, 3000, generator=g) * 2.0 + 5.0,))),
         {"target": "tiny"}),
    Case("flat-projections", _seeded(lambda g: (_FlatProjections(g).eval(), (torch.randn(1, 12, 32, generator=g),)))),
    Case("flat-heads-attention", _seeded(lambda g: (_FlatHeadsAttention(g).eval(), (torch.randn(2, 10, 32, generator=g),)))),
    Case("delta-rule-chunks", _seeded(lambda g: (DeltaRuleChunks(g).eval(), (torch.randn(1, 16, 32, generator=g),)))),
    Case("sorted-experts@tiny", _seeded(lambda g: (SortedExperts(g).eval(), (torch.randn(10, 16, generator=g).bfloat16(),))),
         {"target": "tiny"}),
    Case("stacked-caches@tiny", _seeded(lambda g: (_StackedCaches().eval(), (torch.randn(16, 64, generator=g),))),
         {"target": "tiny"}),
    Case("cache-updates", _seeded(lambda g: (_CacheUpdates(), (
        torch.randn(64, 16, generator=g), torch.randn(64, 16, generator=g), torch.tensor([3, 60]),
        torch.randn(2, 16, generator=g))))),
    Case("fused-gate-up", _seeded(lambda g: (_FusedGateUp().eval(), (torch.randn(1, 12, 32, generator=g),)))),
    Case("cast-back-norm-bf16", _seeded(lambda g: (_CastBackNorm(g).eval().to(torch.bfloat16),
                                                    (torch.randn(1, 12, 32, generator=g).bfloat16(),)))),
    Case("post-norm-bf16", _seeded(lambda g: (_PostNorm().eval(), (torch.randn(2, 24, 32, generator=g),))),
         {"precision": "bf16"}),
    Case("norm-mlp@tiny", _seeded(lambda g: (_NormMLP().eval(), (torch.randn(1, 48, 96, generator=g),))),
         {"target": "tiny"}),
    ProgramCase("resident-over-reused-sram@tiny", _resident_over_reused_space),
    ProgramCase("reuse-before-last-reader@tiny", _reuse_before_last_reader),
    Case("gpt", _zoo("gpt")),
    Case("bart@tiny", _seeded(_bart_tiny), {"target": "tiny"}),
    Case("llama", _zoo("llama")),
    Case("gpt-bf16", _zoo("gpt"), {"precision": "bf16"}),
    Case("llama-decode", _zoo("llama_decode")),
    Case("vla", _zoo("vla")),
    Case("vit", _zoo("vit")),
    Case("cnn", _zoo("cnn")),
]

CASE_BY_NAME = {c.name: c for c in CASES}


# -- detection ---------------------------------------------------------------------------------

@dataclass
class Caught:
    """Which check fired first, on which case, and what it said."""

    case: str
    check: str
    detail: str


@dataclass
class Outcome:
    mutant: str
    caught: Caught | None
    cases_run: list[str]
    elapsed_s: float

    @property
    def ok(self) -> bool:
        return self.caught is not None


def _first_line(text) -> str:
    text = str(text or "").strip()
    return text.splitlines()[0][:240] if text else ""


def check_case(case: Case | ProgramCase, *, time_limit: float = 180.0) -> Caught | None:
    """Compile ``case`` with verification on, then run the compiled model on the simulated NPU on
    its example inputs and on a fresh set, against eager. None when everything passes; else the
    first check that fired. A `ProgramCase` is built, simulated and checked for hazards."""
    import fexplore

    if isinstance(case, ProgramCase):
        return _check_program(case, time_limit)
    with warnings.catch_warnings(), limit_time(time_limit):
        warnings.simplefilter("ignore")
        model, inputs = case.build()
        ex = fexplore.explore(model, inputs, **case.options)
        try:
            while not ex.done:
                ex.step()
        except CaseTimeout as e:
            return Caught(case.name, f"stage {ex.stage_names[len(ex.records)]} did not finish", str(e))
        except Exception as e:   # a crash inside a stage (or its verification) is a detection too
            stage = ex.stage_names[len(ex.records)]
            return Caught(case.name, f"stage {stage} raised {type(e).__name__}", _first_line(e))
        for rec in ex.records:
            found = _failed_check(rec)
            if found is not None:
                return Caught(case.name, *found)
            bugs = rec.stats.get("codegen_bugs") if rec.name == "lower" else None
            if bugs:   # the compile went on (split, host op), but a generator is broken
                return Caught(case.name, "lower stage: codegen bug behind the host fallback", _first_line(bugs[0]))
        cm = ex.result
        fresh = _fresh_inputs(inputs)
        for label, args in (("example inputs", inputs), ("fresh inputs", fresh)):
            try:
                got = cm(*args)
            except CaseTimeout as e:
                return Caught(case.name, f"compiled model on {label} did not finish", str(e))
            except Exception as e:
                return Caught(case.name, f"compiled model on {label} raised {type(e).__name__}",
                              _first_line(e))
            with torch.no_grad():
                want = model(*args)
            bad = _differs(got, want, case.options.get("precision", "fp32"))
            if bad:
                return Caught(case.name, f"compiled model vs eager ({label})", bad)
    return None


def _check_program(case: ProgramCase, time_limit: float) -> Caught | None:
    """Build and run the program with data: the simulator checks the run's order first."""
    from fexplore.npu import HazardError

    with limit_time(time_limit):
        try:
            prog, inputs = case.build()
            prog.simulate(inputs)
        except HazardError as e:
            return Caught(case.name, "simulator hazard check (program)", _first_line(e.detail))
        except Exception as e:   # the npu layer raising on its own program is a detection too
            return Caught(case.name, f"program raised {type(e).__name__}", _first_line(e))
    return None


def _failed_check(rec):
    v = rec.verification
    if v is None:
        return None
    if not v.structural_ok:
        return f"structural verifier after {rec.name}", _first_line(v.structural_error)
    if v.numeric is not None and not v.numeric.ok:
        where = f"; first divergent {v.numeric.first_divergent}" if v.numeric.first_divergent else ""
        return f"numeric check of {rec.name}", _first_line(v.numeric.detail) + where
    k = v.kernels
    if k is not None and not k.ok:
        detail = str(k.detail or "")
        if detail.startswith("simulator hazard check"):
            return "simulator hazard check (schedule)", _first_line(detail.splitlines()[-1] if "\n" in detail
                                                                    else detail)
        if rec.name == "schedule":
            return "schedule check (simulator vs eager)", _first_line(detail)
        return f"{rec.name} check (kernels in the interpreter)", _first_line(detail)
    return None


def _fresh_inputs(inputs):
    """Another input set of the same spec (as the oracle makes its random sets)."""
    from fexplore.pipeline.numeric import _like

    rng = np.random.default_rng(1)
    leaves, spec = pytree.tree_flatten(inputs)
    return pytree.tree_unflatten([_like(x, rng) if isinstance(x, torch.Tensor) else x for x in leaves], spec)


def _differs(got, want, precision: str) -> str | None:
    from fexplore.pipeline.numeric import TOLERANCES, compare, to_numpy
    from fexplore.ir import DType

    wanted = [t for t in pytree.tree_leaves(want) if isinstance(t, torch.Tensor)]
    g = [to_numpy(t) for t in pytree.tree_leaves(got) if isinstance(t, torch.Tensor)]
    w = [to_numpy(t) for t in wanted]
    # a model loaded in bf16 computes in bf16 under the fp32 policy too (eager rounds as it does)
    narrow = any(t.dtype in (torch.bfloat16, torch.float16) for t in wanted)
    tol = TOLERANCES[{"bf16": DType.bf16, "fp8": DType.fp8}.get(precision, DType.bf16 if narrow else DType.f32)]
    # eager's own f32 noise is not measured here: twice the floor tolerance stands in for it
    tol = type(tol)(tol.atol * 2, tol.rtol * 2)
    _, _, ok, detail = compare(g, w, tol)
    return None if ok else detail


def detect(mutant: Mutant | None, cases=None, *, time_limit: float = 180.0) -> Outcome:
    """Run the cases (all by default) under ``mutant`` (None: the unmutated compiler) until a check
    fires; the outcome names it, or is not ``ok`` when every case passed."""
    cases = CASES if cases is None else [CASE_BY_NAME[c] if isinstance(c, str) else c for c in cases]
    t0 = time.perf_counter()
    run: list[str] = []
    ctx = mutant.active() if mutant is not None else contextlib.nullcontext()
    with ctx:
        for case in cases:
            run.append(case.name)
            caught = check_case(case, time_limit=time_limit)
            if caught is not None:
                return Outcome(mutant.name if mutant else "(none)", caught, run, time.perf_counter() - t0)
    return Outcome(mutant.name if mutant else "(none)", None, run, time.perf_counter() - t0)

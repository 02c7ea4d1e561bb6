"""The relayout part: ``permute`` of any permutation, as box copies and transposes.

First the permutation is reduced: size-1 axes dropped, and input axes that stay next to each other
in the same order merged (free views), so e.g. (B, S, H, D) -> (B, H, S, D) with B = 1 is a swap of
two axes in front of a contiguous D. Then:

  - the last axis stays last: each block is a box of rows copied DRAM -> SRAM -> DRAM, no compute
    (the store's box is just laid out in the output's order);
  - the last axis moves: each block is a 2-D tile over the input's last axis and the axis that ends
    up last, turned on the PE's transpose engine (`fl.transpose`) between its load and its store.

The other axes are looped over one index at a time; blocks go round-robin to the PEs.
"""

from __future__ import annotations

import math

from fexplore.ir import Node

from .common import Inputs, Signature, body_of, header, kernel_name, region_label
from .errors import UnsupportedRegionError
from .gather import MAX_ITERATIONS
from .generated import GeneratedKernel, Result
from .source import Names, Writer, fl_dtype

STAGES = 2


def reduce_permutation(shape, perm) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(input shape, permutation) with size-1 axes dropped and axes that travel together merged."""
    keep = [d for d in range(len(shape)) if shape[d] != 1]
    renum = {d: i for i, d in enumerate(keep)}
    shape = [shape[d] for d in keep]
    perm = [renum[p] for p in perm if p in renum]
    groups: list[list[int]] = []            # runs of consecutive input axes, in output order
    for p in perm:
        if groups and groups[-1][-1] + 1 == p:
            groups[-1].append(p)
        else:
            groups.append([p])
    order = sorted(range(len(groups)), key=lambda g: groups[g][0])   # groups in input order
    in_shape = tuple(math.prod(shape[d] for d in groups[g]) for g in order)
    rank_of = {g: i for i, g in enumerate(order)}
    return in_shape, tuple(rank_of[g] for g in range(len(groups)))


def generate_permute(node: Node, cfg) -> GeneratedKernel:
    label = region_label(node)
    x, y = node.inputs[0], node.outputs[0]
    if any(not isinstance(d, int) for d in x.type.shape):
        raise UnsupportedRegionError("permute", label, "symbolic sizes (specialize the shapes first)", loc=node.loc)
    shape, perm = reduce_permutation(tuple(x.type.shape), tuple(node.attrs["perm"]))
    if len(shape) <= 1:   # a pure copy: view both as one row
        shape, perm = (1, max(1, math.prod(shape))), (0, 1)
    k = len(shape)
    item = x.type.dtype.itemsize
    budget = cfg.sram_bytes_per_pe // 4
    moves = perm[-1] != k - 1
    if moves:
        a, b = perm[-1], k - 1          # the input axis that ends up last, and the input's last axis
        edge = 512 if budget >= 4 * STAGES * 512 * 512 * item else 1
        while edge < 512 and 2 * STAGES * (2 * edge) ** 2 * item <= budget:
            edge *= 2
        ta, tb = min(shape[a], edge), min(shape[b], edge)
    else:
        a, b = perm[-2], k - 1          # the input axis that ends up next to last, and the last
        tb = shape[b]
        while tb > 16 and STAGES * tb * item > budget // 8:
            tb = -(-tb // 2)
        ta = max(1, min(shape[a], budget // (STAGES * tb * item), 512))
    others = [d for d in range(k) if d not in (a, b)]
    blocks = math.prod(shape[d] for d in others)
    while ta > 8 and blocks * math.ceil(shape[a] / ta) * math.ceil(shape[b] / tb) < cfg.num_pes:
        ta = -(-ta // 2)
    iterations = blocks * math.ceil(shape[a] / ta) * math.ceil(shape[b] / tb)
    if iterations > MAX_ITERATIONS:
        raise UnsupportedRegionError("permute", label, f"{iterations:,} blocks (more than {MAX_ITERATIONS:,} to "
                                                       "unroll)", loc=node.loc)

    body = body_of(node)
    names = Names({"rows", "cols", "stages", "t", "tt", "OUT", *(f"i{d}" for d in range(k)),
                   *(f"s{d}" for d in range(k)), *(f"S{d}" for d in range(k))})
    fname = kernel_name(node)
    names.taken.add(fname)
    sig = Signature(names, Inputs.of(node, body))
    axes = [f"S{d}" for d in range(k)]
    xname = sig.add(x, shape, [f'"{n}"' for n in axes])
    var = {d: (f"s{d}" if d in (a, b) else f"i{d}") for d in range(k)}

    w = Writer()
    header(w, node, body, "relayout", sig.header, {})
    view = "" if tuple(y.type.shape) == tuple(shape[p] for p in perm) else \
        f", viewed as {[shape[p] for p in perm]}"
    w(f"# permute {list(node.attrs['perm'])} = {list(perm)} on the merged axes{view}: "
      + ("the last axis moves, so each tile is turned on the transpose engine" if moves else
         "the last axis stays, so each block is a plain box copy"))
    w(f'@fl.kernel(target="{cfg.name}")')
    w(f"def {fname}({sig.annotations[0]}, *, rows: int = {ta}, cols: int = {tb}, stages: int = {STAGES}):")
    with w.indent():
        w(f"{', '.join(axes)}{',' if k == 1 else ''} = {xname}.shape")
        out_axes = ", ".join(f'"{axes[p]}"' for p in perm)
        w(f"OUT = fl.output({fl_dtype(x.type.dtype)}[{out_axes}])")
        loop_vars = [var[d] for d in others] + [var[a], var[b]]
        grid = [axes[d] for d in others] + [f"fl.tiles({axes[a]}, rows)", f"fl.tiles({axes[b]}, cols)"]
        w(f"for {', '.join(loop_vars)} in fl.parallel({', '.join(grid)}, stages=stages):")
        with w.indent():
            w(f"t = fl.load({xname}[{', '.join(var[d] for d in range(k))}])")
            src = "t"
            if moves:
                w("tt = fl.transpose(t, (1, 0))   # the transpose engine")
                src = "tt"
            w(f"fl.store(OUT[{', '.join(var[p] for p in perm)}], {src})")
        w("return OUT")
    results = (Result(0, tuple(y.type.shape)),)
    return GeneratedKernel(fname, "relayout", w.text(), cfg, tuple(sig.params), results,
                           ("transpose" if moves else "box copy",))

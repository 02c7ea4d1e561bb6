"""The contraction kernel: linear / matmul / batched matmul on the tensor unit, composed with a
prologue on its activations (free views, a slice or select of rows, a layer or RMS norm) and an
epilogue chain on its result (bias, any elementwise op, residual adds, scaling, casts; a sibling
contraction over the same activations, as in SwiGLU, shares the loop and gets its own accumulator).

The right operand is a region input read through free views: a cast (applied after the load) or a
transpose of its last two axes (a tied lm_head, k^T: the same box, the contraction told n comes
before k).

Plain rows of activations are a panel contraction: each PE's item is a row tile (tm) and a panel of
columns (tp), split so the items fill the PEs in one round with the fewest operand bytes per PE
(`panel_tiles`); the panel's first column tile (tn) loads the row tile's K slabs and the others
reuse them, so the activations are read once per panel, not once per output tile. A panel of many
rows is weight-stationary (`streamed_rows`): its weight tiles are loaded by the first row step (tr
rows) and kept, and the rows stream through step by step, so in a program the kernel starts on the
first rows its producer has written and a chain of kernels pipelines; the panel's bias is one load,
sliced per column tile. Otherwise output tiles (tm x tn) go round-robin to the PEs. The K loop is
double buffered. A norm prologue needs whole rows of the activations: with one or two N tiles a K
slab is the whole of K and the norm runs in the kernel, once per panel item (or row step), its
column tiles contracting the normed rows kept in SRAM; with more, the rows are normalized once (a
row tile per PE) into a DRAM scratch that a plain K loop then reads, rather than once per item. Heads
merged into K (PermutedAccess) are read as slabs of whole heads, a two-axis contraction
'hmk,nhk->mn'. The epilogue runs on the vector unit straight off the accumulators, one line per IR
node (`vector.VectorEmitter`).
"""

from __future__ import annotations

import contextlib
import math
from typing import NamedTuple

from fexplore.ir import DType, Node

from fexplore.lang.examples._tiling import matmul_tiles, panel_tiles, streamed_rows

from . import vector
from .common import Inputs, Signature, body_of, header, kernel_name, region_label
from .activations import PermutedAccess, RowAccess
from .domain import OWN, Groups, aligned, group_axes, leading_broadcast, pattern, trimmed
from .errors import UnsupportedRegionError
from .generated import GeneratedKernel, Result
from .source import Names, Writer, cast_to, fl_dtype

CONTRACTIONS = {"linear", "matmul"}
STAGES = 2
_VIEWS = {"relayout", "reshape", "select", "slice", "permute"}


def generate_contraction(node: Node, cfg, head_layout: tuple | None = None) -> GeneratedKernel:
    """The kernel of a contraction region. `head_layout` (parts, heads, depth): an attention reads
    the region's output as `parts` (q, k, v) of `heads` heads of `depth` columns each; the kernel
    then makes whole heads, a group at a time on each PE (see `_head_groups`)."""
    body = body_of(node)
    label = region_label(node)
    inputs = Inputs.of(node, body)
    producer = {v.name: n for n in body.nodes for v in n.outputs}
    body_inputs = {v.name: v for v in body.inputs}
    cons = [n for n in body.nodes if n.op.name in CONTRACTIONS]
    if not cons:
        raise UnsupportedRegionError(body.nodes[0].op.name, label, "no contraction")

    def fail(n, why):
        raise UnsupportedRegionError(n.op.name, label, why, loc=n.loc, node=n)

    first = cons[0]
    upstream = {}
    for n in body.nodes:
        upstream[n.outputs[0].name] = set().union(*(upstream.get(x.name, set()) for x in n.inputs)) | \
            ({n.outputs[0].name} if n.op.name in CONTRACTIONS else set())
    for c in cons:
        if any(upstream.get(x.name) for x in c.inputs):
            fail(c, "a contraction of another contraction's result (attention): the streaming attention "
                    "part is not written yet")
    for c in cons:
        if c.op.name != first.op.name or c.inputs[0].name != first.inputs[0].name or \
                c.outputs[0].type.shape != first.outputs[0].type.shape:
            fail(c, "two contractions over different activations (only siblings sharing theirs fuse)")
        if any(not isinstance(d, int) for d in c.outputs[0].type.shape + c.inputs[0].type.shape):
            fail(c, "symbolic sizes (specialize the shapes first)")
    # -- the prologue: from a region input to the activations --------------------------------------
    a_val = first.inputs[0]
    if a_val.name in producer and producer[a_val.name].op.name == "cast":   # the operand dtype (precision)
        a_val = producer[a_val.name].inputs[0]
        if a_val.name in producer and producer[a_val.name].op.name == "cast":
            fail(producer[a_val.name], "two casts of the activations")
    chain, v = [], a_val
    while v.name in producer:
        p = producer[v.name]
        if p.op.name not in _VIEWS and p.op.name not in ("layer_norm", "rms_norm"):
            fail(p, "in a contraction's prologue (views, a slice of rows and a norm are handled)")
        chain.insert(0, p)
        v = p.inputs[0]
    x_in = v
    if x_in.name in inputs.literals:
        fail(first, "constant activations")
    permuted = PermutedAccess.of(x_in, chain, fail) if any(n.op.name == "permute" for n in chain) else None
    access = permuted or RowAccess.of(x_in, chain, a_val, fail)
    # -- the weights: region inputs, through identity views ---------------------------------------
    # (a cast, or a transpose of the last two axes: a weight tied to an embedding, k^T, x^T x, is
    # read through a box in its own layout, the contraction told that it holds n before k)
    weights, w_views = [], set()
    for c in cons:
        wv, transposed, casts = c.inputs[1], False, 0
        while wv.name in producer and producer[wv.name].op.name in ("relayout", "cast", "permute"):
            p = producer[wv.name]
            if p.op.name == "permute":
                perm, r = list(p.attrs["perm"]), p.inputs[0].type.rank
                if r < 2 or perm != list(range(r - 2)) + [r - 1, r - 2]:
                    fail(p, "a permute of the weights other than a transpose of the last two axes")
                transposed = not transposed
            casts += p.op.name == "cast"
            if casts > 1:
                fail(p, "two casts of the weights")
            w_views.add(id(p))
            wv = p.inputs[0]
        if wv.name not in body_inputs or wv.name in inputs.literals:
            fail(c, "weights computed inside the region (other than a cast or a transpose of a region input)")
        bias = c.inputs[2] if len(c.inputs) == 3 else None
        if bias is not None and bias.name not in body_inputs:
            fail(c, "a bias computed inside the region")
        weights.append((wv, bias, transposed))
    prologue = {id(n) for n in chain} | w_views | \
        ({id(producer[first.inputs[0].name])} if a_val is not first.inputs[0] else set())
    epilogue = [n for n in body.nodes if id(n) not in prologue and n.op.name not in CONTRACTIONS]
    for n in epilogue:
        if n.op.name not in vector.SAME_NAME | vector.COMPOSED | vector.IDENTITY:
            fail(n, "in a contraction's epilogue (elementwise ops are handled)")
        if math.prod(n.outputs[0].type.shape) > math.prod(first.outputs[0].type.shape):
            fail(n, "an epilogue that broadcasts the contraction's result to a larger shape: the kernel's "
                    "tiles are the contraction's output")
    in_prologue = {v.name for n in body.nodes if id(n) in prologue for v in n.outputs} | {first.inputs[0].name}
    for o in body.outputs:
        if o.name in in_prologue:
            fail(producer[o.name], "a prologue value leaves the region")
    for n in epilogue:   # its tiles are the activations' (rows x K), not the output's (rows x N)
        if any(x.name in in_prologue for x in n.inputs):
            fail(n, "an epilogue operand from the prologue (a view or norm of the activations)")

    # -- the domain: the contraction's output, (lead..., N) -----------------------------------------
    out_t = first.outputs[0].type
    lead, N = tuple(out_t.shape[:-1]), out_t.shape[-1]
    K = first.inputs[0].type.shape[-1]
    rank = len(out_t.shape)
    is_linear = first.op.name == "linear"
    w_rank = weights[0][0].type.rank
    batched_b = not is_linear and w_rank > 2
    epi_params = []      # (body input, domain-aligned shape)
    seen = set()
    for n in epilogue:
        for x in n.inputs:
            if x.name in body_inputs and x.name not in inputs.literals and x.name not in seen:
                if x.type.rank > rank:
                    fail(n, "an epilogue operand with more axes than the result")
                seen.add(x.name)
                epi_params.append((x, aligned(x.type.shape, rank)))
    for o in body.outputs:   # every output is stored as a tile of the contraction's output
        if tuple(o.type.shape) != tuple(out_t.shape) or o.name in inputs.literals:
            fail(producer.get(o.name, first), f"a region output of shape {list(o.type.shape)} beside the "
                 f"contraction's {list(out_t.shape)}")
        if o.name in body_inputs and o.name not in seen:   # passed on: a region split to fit SRAM
            seen.add(o.name)                               # hands a value to the piece after it
            epi_params.append((o, aligned(o.type.shape, rank)))
    pats = [pattern(s[:-1], lead) for _, s in epi_params]
    a_lead = aligned(first.inputs[0].type.shape[:-1], len(lead))
    if access.indexed and any(a == 1 and d != 1 for a, d in zip(a_lead, lead)):
        # a slice or select of the input's rows indexes its boxes by the domain's loop variables
        # (plus the start): one such row broadcast along a batch would be read at b + start
        fail(first, "a sliced or selected activation broadcast along the batch")
    a_pat = tuple(OWN if access.indexed and d != 1 else p for p, d in zip(pattern(a_lead, lead), lead))
    pats.append(a_pat)
    if batched_b:
        b_pat = pattern(aligned(weights[0][0].type.shape[:-2], len(lead) - 1), lead[:-1]) + ("one",)
        pats.append(b_pat)
        bg = group_axes(lead[:-1], [p[:-1] for p in pats])
        real = tuple(g for g in bg.groups if g[0] < len(lead) - 1 and lead[g[0]] != 1) if lead[:-1] else ()
        groups = Groups(lead, real + ((len(lead) - 1,),))
    else:
        groups = group_axes(lead, pats)
    sizes = groups.sizes
    M = sizes[-1]
    outer_names = ["B"] if len(sizes) == 2 else [f"B{i}" for i in range(len(sizes) - 1)]
    axis_names = outer_names + ["M"]
    loop_vars = [a.lower() for a in outer_names] + ["ms"]

    # -- tile sizes ----------------------------------------------------------------------------------
    dt = first.inputs[0].type.dtype
    op_dt = first.inputs[1].type.dtype   # the tensor unit's operand dtype: the weights'
    if dt != op_dt:
        fail(first, f"activations of {dt} and weights of {op_dt}")
    norm = next((n for n in chain if n.op.name in ("layer_norm", "rms_norm")), None)
    tm, tn, tk = matmul_tiles(M, N, K, max(dt.itemsize, 1), cfg, dt.name, STAGES)
    budget = cfg.sram_bytes_per_pe // 2
    tk0 = tk
    if norm is not None:
        tk = K
    if permuted is not None:
        # heads merged into K: a slab of whole heads (several per load when D is small) when the
        # tile allows, else tiles of D within one head
        tk = max(tk, permuted.inner) if len(permuted.k_names) == 2 else min(tk, permuted.inner)
    nb = len(cons)

    def footprint(tm, tn, tk):
        # operand tiles: double buffered by the K loop and by the tile loop; with a norm there is
        # no K loop, but the row statistics and the normalized rows are tiles too
        operands = STAGES * (tm * tk * 3 + nb * tk * tn) if norm is not None else \
            2 * STAGES * (tm * tk + nb * tk * tn)
        return operands * 4 + 2 * tm * tn * 4 * (nb + 1 + len(epilogue))

    while footprint(tm, tn, tk) > budget and max(tm, tn, tk if norm is None else 0) > 1:
        if norm is None and tk >= max(tm, tn):
            tk = max(1, tk // 2)
        elif tm >= tn:
            tm = max(1, tm // 2)
        else:
            tn = max(1, tn // 2)
    if permuted is not None and norm is not None:
        fail(norm, "a norm over permuted activations")
    if footprint(tm, tn, tk) > budget:
        fail(norm or first, f"rows of {K} activations do not fit one PE's SRAM on {cfg.name}")
    # a norm prologue with several N tiles: normalized once per row tile into a DRAM scratch (bf16
    # when the operands are), then a plain K loop over it, instead of once per (row, N) tile
    # an output an attention reads head by head (`head_layout`) is made head by head where the
    # heads divide over the PEs and fit (`_head_groups`); a norm prologue is then staged once
    heads = None
    if head_layout is not None and len(cons) == 1 and permuted is None and not access.indexed \
            and not batched_b and len(sizes) == 1:
        x_item = max(op_dt.itemsize, 1) if norm is not None else max(x_in.type.dtype.itemsize, op_dt.itemsize, 1)
        heads = _head_groups(head_layout, N, M, K, x_item, max(op_dt.itemsize, 1), cfg)
    staged = norm is not None and (-(-N // tn) > 2 or heads is not None)
    if staged:
        tk = min(tk0, K)
    in_prologue_norm = norm is not None and not staged   # the norm of whole rows, in the kernel
    # a panel per PE when a row tile's whole K fits: its K slabs are loaded once and reused by the
    # panel's column tiles (see `panel_tiles`). A norm that is not staged runs on an item's whole
    # rows once, and the item's column tiles share them: its items are the grid's output tiles
    # (tm x tn, whole K: what the norm needs, sized to fit above), as one column tile by default;
    # the tile search may cut it into narrower ones, so the first contraction waits for a part of
    # the weights instead of all of them (GPT-2's final norm into a 512-column head: 7,724 -> 7,217
    # cycles alone). The split over the PEs stays the grid's: `panel_tiles`' own split, which has
    # no norm in its model, gave the zoo GPT's norm-fed projections one item instead of two
    panel, norm_rows, tr = None, tm, None     # (the normed rows of a staged norm fit SRAM at tm, whole K)
    if not batched_b:
        x_item = max(op_dt.itemsize, 1) if staged else max(x_in.type.dtype.itemsize, op_dt.itemsize, 1)
        if in_prologue_norm:   # tm x tn of whole rows fits: the footprint above was sized at tk = K
            panel = (tm, tn, tn, K)
        else:
            panel = panel_tiles(M, N, K, x_item, cfg, dt.name, STAGES, siblings=nb,
                                extra_tile_bytes=4 * len(epilogue))
        if panel is not None:
            tm, tp, tn, tk = panel
            tr = streamed_rows(tm, tp, tn, tk, K, x_item, cfg, dt.name, STAGES, siblings=nb,
                               extra_tile_bytes=4 * len(epilogue))
            if tr and in_prologue_norm and footprint(tr, tn, K) + nb * K * tp * 4 > budget:
                tr = None   # the panel's weights kept beside a step's rows, their norm and its temporaries
    if permuted is not None:
        permuted.whole_heads = len(permuted.k_names) == 2 and tk >= permuted.inner
        tk = tk // permuted.inner * permuted.inner if permuted.whole_heads else min(tk, permuted.inner)
    if heads:
        tr = tr or tm   # the rows of a group stream in steps of tr

    # -- parameters ------------------------------------------------------------------------------------
    names = Names({"tm", "tp", "tr", "tn", "tk", "ps", "mt", "stages", "rows", "ms", "ns", "ks", "ds", "h", "hs",
                   "hg", "per", "groups", "w_blocks", "b_blocks", "slabs", "pe", "lo", "off", "c", "j",
                   "itertools", "b", *(f"b{i}" for i in range(8)), *(f"h{i}" for i in range(8))})
    fname = kernel_name(node)
    names.taken.add(fname)
    sig = Signature(names, inputs)
    add_param = sig.add

    def group_spec(view):
        k = leading_broadcast(view, sizes)
        return [f'"{axis_names[j]}"' if view[j] != 1 or sizes[j] == 1 else "1" for j in range(k, len(view))], k

    def group_index(view, k, ends_in_m=True):
        # a broadcast group is indexed away ("0"), but M, the last group of a view that ends in
        # it, stays an axis of one ("0:1"); a batched weight's view stops before M
        return [loop_vars[j] if view[j] != 1 or sizes[j] == 1 else
                ("0:1" if ends_in_m and j == len(view) - 1 else "0")
                for j in range(k, len(view))]

    # activations
    k_idx = ":" if norm is not None else "ks"
    if permuted is not None:
        x_shape = permuted.shape
        try:
            x_spec, x_idx = permuted.spec_and_index(lead, axis_names, loop_vars, batched_b)
        except NotImplementedError as e:   # a layout the box cannot read: refused, not a codegen bug
            fail(first, str(e))
    elif access.indexed:
        x_shape = access.base_shape
        x_spec, x_idx = access.spec_and_index(lead, groups, axis_names, loop_vars, k_idx)
    else:
        view = groups.view(a_pat)
        x_shape = trimmed(view, (K,), sizes)
        sp, k0 = group_spec(view)
        x_spec, x_idx = sp + ['"K"'], group_index(view, k0) + [k_idx]
    x_name = add_param(x_in, x_shape, x_spec)
    x_box = f"{x_name}[{', '.join(x_idx)}]"
    norm_params = []
    if norm is not None:
        for g in norm.inputs[1:]:
            if g.name not in body_inputs:
                fail(norm, "norm weights computed inside the region")
            norm_params.append(add_param(g, (K,), ['"K"']))
    # weights and biases
    w_boxes, b_names, w_meta = [], [], []
    for (wv, bias, transposed), c in zip(weights, cons):
        a_letters = permuted.letters if permuted is not None else "mk"
        w_k = permuted.weight_index() if permuted is not None else ("ks" if staged else k_idx)
        nk = is_linear != transposed    # the weights' own layout holds n before k
        tail, tail_spec, tail_idx = ((N, K), ['"N"', '"K"'], ["ns", w_k]) if nk else \
            ((K, N), ['"K"', '"N"'], [w_k, "ns"])
        letters = "nk" if nk else "kn"
        if permuted is not None and permuted.whole_heads:   # K viewed as (heads, D): a slab of heads
            hd = (permuted.shape[permuted.k_axes[0]], permuted.inner)
            hd_spec, hd_idx = [str(hd[0]), str(hd[1])], ["hs", ":"]
            tail, tail_spec, tail_idx = ((N, *hd), ['"N"', *hd_spec], ["ns", *hd_idx]) if nk else \
                ((*hd, N), [*hd_spec, '"N"'], [*hd_idx, "ns"])
            letters = "nhk" if nk else "hkn"
        if not batched_b:
            wn = add_param(wv, tail, tail_spec)
            box = f"{wn}[{', '.join(tail_idx)}]"
        else:
            view = groups.view(b_pat)[:-1] + (1,)
            sp, k0 = group_spec(view[:-1])
            idx = group_index(view[:-1], k0, ends_in_m=False)
            wn = add_param(wv, trimmed(view[:-1], tail, sizes[:-1]), sp + tail_spec)
            box = f"{wn}[{', '.join(idx + tail_idx)}]"
        w_boxes.append((cast_to(f"fl.load({box})", wv.type.dtype, c.inputs[1].type.dtype),
                        f"{a_letters},{letters}->mn"))
        w_meta.append((wn, nk, wv.type.dtype, c.inputs[1].type.dtype))
        b_names.append(add_param(bias, (N,), ['"N"']) if bias is not None else None)
    # epilogue operands
    epi_boxes = {}
    for x, s in epi_params:
        view = groups.view(pattern(s[:-1], lead))
        tail = N if s[-1] == N and N != 1 else 1
        sp, k0 = group_spec(view)
        sp.append('"N"' if tail == N and N != 1 else "1")
        idx = group_index(view, k0) + ["ns" if tail == N and N != 1 else ":"]
        pname = add_param(x, trimmed(view, (tail,), sizes), sp)
        epi_boxes[x.name] = f"{pname}[{', '.join(idx)}]"

    # -- the source --------------------------------------------------------------------------------------
    w = Writer()
    header(w, node, body, "contraction", sig.header, inputs.literals)
    if permuted is not None and len(permuted.k_names) > 2:
        w("import itertools")
        w()
    w(f'@fl.kernel(target="{cfg.name}")')
    if heads:   # no panels of columns: groups of heads
        tiling = f"tm: int = {tm}, tr: int = {tr}, tk: int = {tk}, hg: int = {heads.group}"
    else:
        tiling = f"tm: int = {tm}, " + (f"tp: int = {tp}, " if panel else "") + (f"tr: int = {tr}, " if tr else "") + \
            f"tn: int = {tn}, tk: int = {tk}"
    w(f"def {fname}({', '.join(sig.annotations)}, *, {tiling}, stages: int = {STAGES}):")
    with w.indent():
        w(f"{', '.join(axis_names + ['N', 'K'])} = {', '.join(str(s) for s in sizes + (N, K))}")
        out_vals = list(body.outputs)
        onames, results = [], []
        for i, o in enumerate(out_vals):
            oname = names.new(o.name + "_out").upper()
            onames.append(oname)
            results.append(Result(i, tuple(node.outputs[i].type.shape)))
            w(f'{oname} = fl.output(({", ".join(axis_names)}, N), {fl_dtype(o.type.dtype)}, '
              f'axes="{" ".join(axis_names)} N")')
        def write_tail(bias_of, tiles=None, accs=None):
            """The contractions' values (+ bias), then the epilogue, then the stores of the
            column tile ``ns``: `bias_of(bias name)` is the bias tile's expression (None: load it)."""
            tiles = dict(inputs.literals) if tiles is None else tiles
            emit = vector.VectorEmitter(w, names, label, axis='"N"')
            rounded = set()   # casts the contractions' values were written through
            for c, acc, bn in zip(cons, accs or ["acc"], b_names):
                bt = None
                if bn is not None:
                    bt = bias_of(bn)
                    if bt is None:
                        bt = names.new(bn + "_t")
                        w(f"{bt} = fl.load({bn}[ns])")
                cast = vector.contraction_value(w, names, acc, bt, c, body, out_vals, tiles)
                if cast is not None:
                    rounded.add(id(cast))
            for x, _ in epi_params:
                t = names.new(epi_boxes[x.name].split("[")[0] + "_t")
                w(f"{t} = fl.load({epi_boxes[x.name]})")
                tiles[x.name] = t
            for n in (n for n in epilogue if id(n) not in rounded):
                tiles[n.outputs[0].name] = emit.node(n, [tiles[x.name] for x in n.inputs], -1)
            idx = ", ".join(loop_vars + ["ns"])
            for o, oname in zip(out_vals, onames):
                w(f"fl.store({oname}[{idx}], {tiles[o.name]})")

        outer_grid = [f"range({a})" for a in outer_names[:len(sizes) - 1]]
        if staged:
            xn = names.new(x_in.name + "_normed").upper()
            w(f"# the {norm.op.name} once per row tile, into DRAM: each of the N tiles reads it back")
            w(f'{xn} = fl.scratch(({", ".join(axis_names)}, K), {fl_dtype(op_dt)}, axes="{" ".join(axis_names)} K")')
            # a few row tiles per PE (not one each): the norm of the first rows, and the contraction
            # on them, start as soon as the producer has written them, and the last tile's norm is
            # a short tail after it; each tile still a whole tensor-unit row tile or more
            w(f"rows = min({norm_rows}, -(-M // fl.num_pes()), "
              f"max({cfg.native_tile(dt.name)[0]}, -(-M // (4 * fl.num_pes()))))   # the norm is vector work")
            w(f"for {', '.join(loop_vars)} in fl.parallel({', '.join(outer_grid + ['fl.tiles(M, rows)'])}, "
              f"stages=stages):")
            with w.indent():
                emit = vector.VectorEmitter(w, names, label, axis='"K"')
                a_tile, normed_dt = _normed_rows(w, names, emit, norm, norm_params, x_in, x_box, "", op_dt)
                w(f"fl.store({xn}[{', '.join(loop_vars)}, :], {cast_to(a_tile, normed_dt, op_dt)})")
            x_box = f"{xn}[{', '.join(loop_vars)}, ks]"
            x_dt = op_dt
        else:
            x_dt = x_in.type.dtype
        if heads:
            _write_head_groups(w, heads, x_box, x_dt, op_dt, w_meta[0], b_names[0], names.new("acc"), write_tail)
            w(f"return {', '.join(onames)}")
            return _kernel(fname, w, cfg, sig, results, chain, norm, epilogue)
        grid = ", ".join(outer_grid + ["fl.tiles(M, tm)", f"fl.tiles(N, {'tp' if panel else 'tn'})"])
        item_vars = loop_vars[:-1] + ["mt"] if tr else loop_vars
        w(f"for {', '.join(item_vars + ['ps' if panel else 'ns'])} in fl.parallel({grid}, stages=stages):")
        with w.indent(), contextlib.ExitStack() as column_loop:
            w_cache, panel_bias = [], {}
            for bn in (b for b in b_names if b is not None and panel):
                panel_bias[bn] = names.new(bn + "_p")
                w(f"{panel_bias[bn]} = fl.load({bn}[ps])   # the panel's bias: one load, sliced per column tile")
            if tr:
                # weight-stationary: the panel's weight tiles are loaded by the first row step and
                # kept; the rows stream through in steps of tr, so the first step starts as soon as
                # its rows exist (a producer kernel writes them step by step too)
                for i in range(len(cons)):
                    w_cache.append(names.new(f"w{i}_tiles" if len(cons) > 1 else "w_tiles"))
                    w(f"{w_cache[-1]} = {{}}   # the panel's weight tiles: loaded once, reused by every row step")
            kept_params = None
            if tr and in_prologue_norm:   # the norm's weights: loaded once, kept for every row step
                kept_params = _load_norm_params(w, names, norm_params)
            if tr:
                w("for ms in fl.range(fl.tiles(mt, tr), stages=stages):")
                column_loop.enter_context(w.indent())
            emit = vector.VectorEmitter(w, names, label, axis='"K"')

            def normed_rows(note):
                a_tile, normed_dt = _normed_rows(w, names, emit, norm, norm_params, x_in, x_box, note, op_dt,
                                                 kept_params)
                if normed_dt != op_dt:
                    a_tile_c = names.new(a_tile + "_op")
                    w(f"{a_tile_c} = {cast_to(a_tile, normed_dt, op_dt)}")
                    a_tile = a_tile_c
                return a_tile

            if panel and in_prologue_norm:
                # the rows' norm once per row tile (or step), before the panel's column tiles
                a_tile = normed_rows(f"   # whole rows: the {norm.op.name} needs them; normed once for the panel")
                w("for ns in fl.range(fl.tiles(ps, tn), stages=stages):")
                column_loop.enter_context(w.indent())
            elif panel:
                slabs = names.new(x_in.name + "_slabs")
                w(f"{slabs} = {{}}   # the row tile's K slabs: each loaded once, reused by every column tile")
                w("for ns in fl.range(fl.tiles(ps, tn), stages=stages):")
                column_loop.enter_context(w.indent())
            tiles: dict[str, str] = dict(inputs.literals)
            accs = [names.new("acc") for _ in cons]
            if in_prologue_norm:
                if not panel:
                    a_tile = normed_rows(f"   # whole rows: the {norm.op.name} needs them")
                for i, (acc, (wb, spec)) in enumerate(zip(accs, w_boxes)):
                    if w_cache:
                        w(f"if ns.start not in {w_cache[i]}:")
                        with w.indent():
                            w(f"{w_cache[i]}[ns.start] = {wb}")
                        wb = f"{w_cache[i]}[ns.start]"
                    w(f'{acc} = fl.contract("{spec}", {a_tile}, {wb})')
            else:
                w(f"{' = '.join(accs)} = None")
                if permuted is not None and permuted.whole_heads:
                    w(f"# K = H x D: slabs of whole heads, read straight from %{x_in.name}'s layout")
                    w(f"for hs in fl.range(fl.tiles({permuted.shape[permuted.k_axes[0]]}, "
                      f"max(1, tk // {permuted.inner})), stages=stages):")
                elif permuted is not None and len(permuted.k_names) == 1:
                    w(f"# the activations are a permute of %{x_in.name}: K tiles read straight from its layout")
                    w(f"for ds in fl.range({permuted.k_iter()}, stages=stages):")
                elif permuted is not None:
                    w(f"# K = {' x '.join(permuted.k_names)}: one slab per {', '.join(permuted.k_names[:-1])} "
                      f"and tile of {permuted.k_names[-1]}, read straight from %{x_in.name}'s layout")
                    w(f"for {permuted.k_loop_vars()} in fl.range({permuted.k_iter()}, stages=stages):")
                else:
                    w("for ks in fl.range(fl.tiles(K, tk), stages=stages):")
                with w.indent():
                    if panel:
                        key = _slab_key(permuted)
                        w(f"if {key} not in {slabs}:   # the first column tile loads it")
                        with w.indent():
                            w(f"{slabs}[{key}] = {cast_to(f'fl.load({x_box})', x_dt, op_dt)}")
                        a = f"{slabs}[{key}]"
                    elif len(cons) == 1:
                        a = cast_to(f"fl.load({x_box})", x_dt, op_dt)
                    else:   # siblings share one load of the activations
                        a = names.new(x_in.name + "_t")
                        w(f"{a} = {cast_to(f'fl.load({x_box})', x_dt, op_dt)}")
                    for i, (acc, (wb, spec)) in enumerate(zip(accs, w_boxes)):
                        if w_cache:
                            wkey = f"(ns.start, {_slab_key(permuted)})"
                            w(f"if {wkey} not in {w_cache[i]}:")
                            with w.indent():
                                w(f"{w_cache[i]}[{wkey}] = {wb}")
                            wb = f"{w_cache[i]}[{wkey}]"
                        w(f'{acc} = fl.contract("{spec}", {a}, {wb}, acc={acc})')
            write_tail(lambda bn: f"{panel_bias[bn]}[ns.start - ps.start:ns.stop - ps.start]"
                       if bn in panel_bias else None, tiles, accs)
        w(f"return {', '.join(onames)}")
    return _kernel(fname, w, cfg, sig, results, chain, norm, epilogue)


class HeadGroups(NamedTuple):
    parts: int    # q, k, v
    heads: int
    depth: int
    group: int    # heads a PE makes at a time (the kernel's ``hg``)


def _head_groups(layout: tuple, N: int, M: int, K: int, x_item: int, w_item: int, cfg) -> HeadGroups | None:
    """How each PE makes its own heads of an output that `layout` (parts, heads, depth) describes,
    a few groups each, when its weights of those heads and the activation rows, kept for all its
    groups, fit a quarter of its SRAM. None otherwise (the heads do not divide over the PEs, or do
    not fit)."""
    parts, heads, depth = layout
    if parts * heads * depth != N or heads % cfg.num_pes:
        return None
    per = heads // cfg.num_pes
    # at least 3 groups a PE where it has the heads: the attention starts after the first third
    group = max((d for d in range(1, per + 1) if per % d == 0 and per // d >= 3), default=1)
    kept = parts * per * depth * K * w_item + M * K * x_item
    if kept > cfg.sram_bytes_per_pe // 4:
        return None
    return HeadGroups(parts, heads, depth, group)


def _write_head_groups(w, heads: HeadGroups, x_box: str, x_dt, op_dt, w_meta, bias: str | None, acc: str,
                       write_tail) -> None:
    """The grid of a contraction whose output an attention reads head by head: each PE makes the
    heads of its own share, ``hg`` heads at a time (every part of them: q, k and v), so the
    attention, dealt the same heads per PE, starts on the first groups while later ones are made.
    A PE's weights of its heads are one load per part, sliced per group; the activation rows are
    loaded once per PE and kept for its groups."""
    parts, H, D, _ = heads
    E = H * D
    wn, nk, w_dt, w_op_dt = w_meta
    rows = "c * {E} + lo:c * {E} + lo + per * {D}".format(E=E, D=D)
    block = f"{wn}[{rows}, :]" if nk else f"{wn}[:, {rows}]"
    part = "[off:off + hg * {D}, ks]".format(D=D) if nk else "[ks, off:off + hg * {D}]".format(D=D)
    spec = "mk,nk->mn" if nk else "mk,kn->mn"
    w(f"# the output is {parts} parts of {H} heads of {D}, which an attention reads head by head: each PE")
    w("# makes whole heads of its own share, hg at a time, so the attention starts on the first groups")
    w(f"per = {H} // fl.num_pes()")
    w("groups = [p * (per // hg) + i for i in range(per // hg) for p in range(fl.num_pes())]   # PE p: its own")
    w("w_blocks, b_blocks, slabs = {}, {}, {}")
    w("for mt, j in fl.parallel(fl.tiles(M, tm), groups, stages=stages):")
    with w.indent():
        w("pe = fl.pe()")
        w(f"lo = pe * per * {D}   # the PE's heads, within each part")
        w("if pe not in w_blocks:   # the weights of the PE's heads: one load per part, sliced per group")
        with w.indent():
            w(f"w_blocks[pe] = [{cast_to(f'fl.load({block})', w_dt, w_op_dt)} for c in range({parts})]")
            if bias is not None:
                w(f"b_blocks[pe] = [fl.load({bias}[{rows}]) for c in range({parts})]")
        w(f"off = j * hg * {D} - lo")
        w("for ms in fl.range(fl.tiles(mt, tr), stages=stages):")
        with w.indent():
            w(f"for c in range({parts}):")
            with w.indent():
                w(f"ns = slice(c * {E} + j * hg * {D}, c * {E} + (j + 1) * hg * {D})")
                w(f"{acc} = None")
                w("for ks in fl.range(fl.tiles(K, tk), stages=stages):")
                with w.indent():
                    w("if (pe, ms.start, ks.start) not in slabs:   # the PE's rows: loaded once, kept")
                    with w.indent():
                        w(f"slabs[pe, ms.start, ks.start] = {cast_to(f'fl.load({x_box})', x_dt, op_dt)}")
                    w(f'{acc} = fl.contract("{spec}", slabs[pe, ms.start, ks.start], w_blocks[pe][c]{part}, '
                      f'acc={acc})')
                write_tail(lambda bn: f"b_blocks[pe][c][off:off + hg * {D}]", accs=[acc])


def _kernel(fname, w, cfg, sig, results, chain, norm, epilogue) -> GeneratedKernel:
    parts = (["view"] if any(n.op.name in _VIEWS for n in chain) else []) + \
        (["norm"] if norm is not None else []) + ["contraction"] + (["epilogue"] if epilogue else [])
    return GeneratedKernel(fname, "contraction", w.text(), cfg, tuple(sig.params), tuple(results), tuple(parts))


def _slab_key(permuted) -> str:
    """How a panel kernel names a K slab of its row tile: the K loop's variables (a slice's start)."""
    if permuted is None:
        return "ks.start"
    if permuted.whole_heads:
        return "hs.start"
    loop_vars = permuted.k_loop_vars().split(", ")
    return f"({', '.join(loop_vars[:-1])}, ds.start)" if len(loop_vars) > 1 else "ds.start"


def _load_norm_params(w, names, norm_params) -> list[str]:
    """Write the loads of a norm's parameters (weight, bias: whole K); return their tiles' names."""
    tiles = []
    for pn in norm_params:
        t = names.new(pn + "_t")
        w(f"{t} = fl.load({pn}[:])")
        tiles.append(t)
    return tiles


def _normed_rows(w, names, emit, norm, norm_params, x_in, x_box: str, note: str,
                 op_dt: DType, kept_params: list[str] | None = None) -> tuple[str, DType]:
    """Write the loads of whole activation rows and the norm's parameters (unless `kept_params`
    holds their tiles already), and the norm over them; return the normed tile's name and the
    dtype it is in. The norm writes the tensor unit's operand dtype `op_dt` itself (no cast of its
    own after it), except fp8, which saturates to its range first: that cast is the caller's."""
    xt = names.new(x_in.name + "_t")
    w(f"{xt} = fl.load({x_box}){note}")
    ptiles = kept_params if kept_params is not None else _load_norm_params(w, names, norm_params)
    written = norm.outputs[0].type.dtype if op_dt == DType.fp8 else op_dt
    return emit.node(norm, [xt] + ptiles, norm.inputs[0].type.rank - 1, write=written), written

"""The pooling kernel: max_pool2d, avg_pool2d and adaptive_avg_pool2d (equal bins) as windowed
reductions on the vector unit.

The NCHW input is seen as planes (P = N * C) of rows; its width as (W / SW, SW), so that the
columns one window position reads across a whole output row (``kw * DW + SW * ow``) are one
unit-stride box: ``[q + ow, r]`` with ``q, r = divmod(kw * DW, SW)``. Each output row is a loop
over the window's KH * KW boxes of (planes, OW), maxed (or summed) into an accumulator. Padding,
and the overhang of ceil_mode's last window, come from a padded copy of the input in DRAM scratch
(filled with -inf or 0, then the input copied into its middle one column phase at a time).
Global average pooling (an output of 1 x 1) is a mean over H and W: the reduction part writes it.
"""

from __future__ import annotations

from fexplore.ir import DType, Node

from .boxes import STAGES, Loops, spec, tile_sizes
from .common import Inputs, Signature, body_of, header, kernel_name, region_label
from .errors import UnsupportedRegionError
from .generated import GeneratedKernel, Result
from .source import Names, Writer, fl_dtype

POOLS = {"max_pool2d", "avg_pool2d", "adaptive_avg_pool2d"}


def generate_pool(node: Node, cfg) -> GeneratedKernel:
    body = body_of(node)
    n = body.nodes[0]
    label = region_label(node)
    x, y = n.inputs[0], n.outputs[0]
    if any(not isinstance(d, int) for d in tuple(x.type.shape) + tuple(y.type.shape)):
        raise UnsupportedRegionError(n.op.name, label, "symbolic sizes (specialize the shapes first)", loc=n.loc)
    N, Cc, H, W = x.type.shape
    OH, OW = y.type.shape[2:]
    op = n.op.name
    if 0 in tuple(x.type.shape) + tuple(y.type.shape):
        raise UnsupportedRegionError(op, label, "an empty tensor", loc=n.loc)
    if op == "adaptive_avg_pool2d":
        if H % OH or W % OW:
            raise UnsupportedRegionError(op, label, f"adaptive bins of unequal sizes ({H}x{W} -> {OH}x{OW}): "
                                                    f"only bins that divide the input are written", loc=n.loc)
        KH, KW, SH, SW, PH, PW, DH, DW = H // OH, W // OW, H // OH, W // OW, 0, 0, 1, 1
    else:
        (KH, KW), (SH, SW), (PH, PW) = n.attrs["kernel"], n.attrs["stride"], n.attrs["padding"]
        DH, DW = n.attrs["dilation"] if op == "max_pool2d" else (1, 1)
    need_h, need_w = (OH - 1) * SH + DH * (KH - 1) + 1, (OW - 1) * SW + DW * (KW - 1) + 1
    if W % SW:
        raise UnsupportedRegionError(op, label, f"a column stride {SW} that does not divide the width {W}: the "
                                                f"columns of a window row are not one unit-stride box", loc=n.loc)
    padded = PH or PW or need_h > H or need_w > W
    divisor = None
    if op != "max_pool2d":
        divisor = n.attrs["divisor"] if op == "avg_pool2d" else None
        if divisor is None:
            whole = need_h <= H + 2 * PH and need_w <= W + 2 * PW
            if (PH or PW) and not n.attrs["count_include_pad"] or not whole:
                raise UnsupportedRegionError(op, label, "windows that count different numbers of cells "
                                                        "(count_include_pad=False with padding, or ceil_mode's "
                                                        "partial windows): the divisor varies per window",
                                             loc=n.loc)
            divisor = KH * KW
    P = N * Cc
    tiles = tile_sizes((P, OW), cfg, live=3)
    if tiles[1] < OW:
        raise UnsupportedRegionError(op, label, f"an output row of {OW} does not fit one tile on {cfg.name}",
                                     loc=n.loc)
    names = Names({"stages", "XP"})
    fname = kernel_name(node)
    names.taken.add(fname)
    inputs = Inputs.of(node, body)
    sig = Signature(names, inputs)
    WQ = W // SW
    xname = sig.add(x, (P, H, WQ, SW), spec(["P", "H", "WQ", "SW"], (P, H, WQ, SW), {"P", "H"}))
    w = Writer()
    header(w, node, body, "pooling", sig.header, inputs.literals)
    w(f'@fl.kernel(target="{cfg.name}")')
    w(f"def {fname}({', '.join(sig.annotations)}, *, stages: int = {STAGES}):")
    maxing = op == "max_pool2d"
    fill = 'float("-inf")' if maxing else "0.0"
    dt = fl_dtype(x.type.dtype)
    with w.indent():
        w(f"P, H, OH, OW = {P}, {H}, {OH}, {OW}")
        w(f"KH, KW, SH, SW, DH, DW = {KH}, {KW}, {SH}, {SW}, {DH}, {DW}")
        w(f'OUT = fl.output((P, OH, OW), {fl_dtype(y.type.dtype)}, axes="P _ _")')
        src = xname
        if padded:
            src = "XP"
            HP = max(H + 2 * PH, need_h)
            WP = max(W + 2 * PW, need_w)
            WPQ = -(-WP // SW)
            w(f"# the input padded (rows {PH}, columns {PW}, and room for the last window) with {fill}")
            w(f"XP = fl.scratch((P, {HP}, {WPQ}, SW), {dt})")
            fl_tiles = tile_sizes((P, HP, WPQ, SW), cfg)
            loops = Loops(["P", "HP", "WPQ", "SW"], (P, HP, WPQ, SW), fl_tiles, {"P", "SW"})
            w(loops.header())
            with w.indent():
                shape = ", ".join(loops.extent(i) for i in range(4))
                idx = ", ".join(loops.index(i, 0, e) for i, e in enumerate((P, HP, WPQ, SW)))
                w(f"fl.store(XP[{idx}], fl.full(({shape}), {fill}, {dt}))")
            w(f"for r in range(SW):   # input column q * SW + r is padded column q * SW + r + {PW}: "
              f"[q + (r + {PW}) // SW, (r + {PW}) % SW]")
            with w.indent():
                cp = tile_sizes((P, H, WQ), cfg)
                loops = Loops(["P", "H", "WQ"], (P, H, WQ), cp, {"P", "H"})
                w(loops.header())
                with w.indent():
                    w(f"q, c = divmod(r + {PW}, SW)")
                    pi, hi, wi = loops.index(0, 0, P), loops.index(1, 0, H), loops.index(2, 0, WQ)
                    hrow = loops.index(1, PH, None)
                    wcol = f"q + {loops.vars[2]}.start:q + {loops.vars[2]}.stop" if 2 in loops.vars else f"q:q + {WQ}"
                    w(f"fl.store(XP[{pi}, {hrow}, {wcol}, c], fl.load({xname}[{pi}, {hi}, {wi}, r]))")
        grid = f"fl.tiles(P, {tiles[0]}), range(OH)"
        w(f"for ps, oh in fl.parallel({grid}, stages=stages):")
        with w.indent():
            w(f"acc = fl.full((ps, OW), {fill})")
            w("for kh in fl.range(KH):")
            with w.indent():
                w("for kw in fl.range(KW):")
                with w.indent():
                    w("q, r = divmod(kw * DW, SW)   # the window's column kw in every output column: [q + ow, r]")
                    w(f"t = fl.load({src}[ps, oh * SH + kh * DH, q:q + OW, r])")
                    w(f"fl.{'maximum' if maxing else 'add'}(acc, t, out=acc)")
            result = "acc" if maxing else f"acc / {divisor}"
            if y.type.dtype != DType.f32:
                result = f"({result}).astype({fl_dtype(y.type.dtype)})" if not maxing else \
                    f"acc.astype({fl_dtype(y.type.dtype)})"
            w(f"fl.store(OUT[ps, oh, :], {result})")
        w("return OUT")
    return GeneratedKernel(fname, "pooling", w.text(), cfg, tuple(sig.params),
                           (Result(0, tuple(y.type.shape)),), (op,))

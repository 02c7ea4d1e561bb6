"""The pooling kernel: max_pool2d, avg_pool2d and adaptive_avg_pool2d as windowed reductions on the
vector unit.

The NCHW input is seen as planes (P = N * C) of rows. An item is a tile of planes and a band of
output rows; it loads the input rows the band's windows cover, whole (one unit-stride box per
plane), and each of the KH * KW window offsets is a stepped slice of that tile in SRAM
(``win[:, kh * DH :: SH, kw * DW :: SW]``, no copy), maxed (or summed) into the band's accumulator.
So the input is read about once (the windows' overlap of rows between bands aside), in one DMA
per item. Padding, and the overhang of ceil_mode's last window, are never copied: an offset that
reads outside the input for some output cells reduces only into the part of the accumulator whose
cells it reaches inside (the accumulator starts at -inf for max, 0 for a sum). An average whose
windows count different numbers of cells (count_include_pad=False, ceil_mode's last windows)
divides by a per-cell count made the same way.
Global average pooling (an output of 1 x 1) is a mean over H and W: the reduction part writes it.

max_pool2d_with_indices (unpooling reads the indices) carries, beside the running max, where it
is: each window offset's cells' flat positions in the plane (h * W + w, from two index rows the
kernel writes once) replace the accumulator's where that offset's value wins. A value wins when it
is greater, when the cell has no value yet (its first tap inside the input), or when it is NaN: as
torch's kernel, the first maximum in scan order, or the last NaN.

Adaptive bins that do not divide the input (PSPNet's and UperNet's pyramid pooling: 16 rows into
3 or 6 bins, or 1 into 6) are no windows at one stride: bin i spans rows [i*H//OH,
ceil((i+1)*H/OH)). Their sum is separable: the rows of each output row's bin are summed into a
tile of whole input rows, then the columns of each output column's bin into the result, and each
cell divided by its bin's cell count, as torch divides (`_adaptive_bins`).
"""

from __future__ import annotations

from fexplore.ir import DType, Node

from .boxes import STAGES, index_row, spec, tile_sizes
from . import conv
from .common import Inputs, Signature, body_of, header, kernel_name, region_label
from .errors import UnsupportedRegionError
from .generated import GeneratedKernel, Result
from .source import Names, Writer, fl_dtype

POOLS = {"max_pool2d", "max_pool2d_with_indices", "avg_pool2d", "adaptive_avg_pool2d"}
# positions are carried as f32 beside the running max: exact up to 2^24 cells a plane
_MAX_POSITIONS = 1 << 24


def generate_pool(node: Node, cfg) -> GeneratedKernel:
    n, x, y = _pool_of(node)
    label = region_label(node)
    if any(not isinstance(d, int) for d in tuple(x.type.shape) + tuple(y.type.shape)):
        raise UnsupportedRegionError(n.op.name, label, "symbolic sizes (specialize the shapes first)", loc=n.loc)
    P, H, W, OH, OW = _planes(x, y)
    op = n.op.name
    if 0 in tuple(x.type.shape) + tuple(y.type.shape):
        raise UnsupportedRegionError(op, label, "an empty tensor", loc=n.loc)
    if op == "adaptive_avg_pool2d":
        if H % OH or W % OW:
            return _adaptive_bins(node, cfg)
        KH, KW, SH, SW, PH, PW, DH, DW = H // OH, W // OW, H // OH, W // OW, 0, 0, 1, 1
    else:
        (KH, KW), (SH, SW), (PH, PW) = n.attrs["kernel"], n.attrs["stride"], n.attrs["padding"]
        DH, DW = n.attrs["dilation"] if op.startswith("max_pool2d") else (1, 1)
    indices = op == "max_pool2d_with_indices"
    if indices and H * W > _MAX_POSITIONS:
        raise UnsupportedRegionError(op, label, f"a plane of {H * W} cells: its positions are not exact "
                                     "in f32", loc=n.loc)
    need_h, need_w = (OH - 1) * SH + DH * (KH - 1) + 1, (OW - 1) * SW + DW * (KW - 1) + 1
    divisor, counted = None, None
    if not op.startswith("max_pool2d"):
        divisor = n.attrs["divisor"] if op == "avg_pool2d" else None
        if divisor is None:
            whole = need_h <= H + 2 * PH and need_w <= W + 2 * PW
            with_pad = op == "adaptive_avg_pool2d" or n.attrs["count_include_pad"]
            if (PH or PW) and not with_pad or not whole:
                # the divisor varies per window: its cells inside the input (count_include_pad=False)
                # or inside the padded input (ceil_mode's last windows), counted per output cell
                counted = (H + 2 * PH, W + 2 * PW, 0, 0) if with_pad else (H, W, PH, PW)
            else:
                divisor = KH * KW
    # an item's window rows per output row (SH, plus the window's height once) and its columns (W
    # for OW outputs): how many accumulator-sized tiles it takes
    window = -(-((SH + DH * (KH - 1)) * W) // OW)
    planes, rows, fname, sig, xname, w = _opening(
        node, cfg, live=3 + window + (3 if indices else 0),
        taken={"stages", "win", "acc", "part", "ps", "ohs", "kh", "kw", "p0", "p1", "q0", "q1", "r", "c", "top",
               "bottom", "rows", "planes", "rows_in", "cols_in", "covered", "cnt", "n", "js", "HPOS", "WPOS", "at",
               "spot", "hpos", "wpos", "tap", "pos", "won"})
    for line in conv.COVERED.splitlines():   # the convolutions' helper, read when it is written
        w(line)
    w()
    w()
    w(f'@fl.kernel(target="{cfg.name}")')
    w(f"def {fname}({', '.join(sig.annotations)}, *, planes: int = {planes}, rows: int = {rows}, "
      f"stages: int = {STAGES}):")
    maxing = op.startswith("max_pool2d")
    fill = 'float("-inf")' if maxing else "0.0"
    with w.indent():
        w(f"P, H, W, OH, OW = {P}, {H}, {W}, {OH}, {OW}")
        w(f"KH, KW, SH, SW, DH, DW, PH, PW = {KH}, {KW}, {SH}, {SW}, {DH}, {DW}, {PH}, {PW}")
        w(f'OUT = fl.output((P, OH, OW), {fl_dtype(y.type.dtype)}, axes="P _ _")')
        if indices:
            w(f'AT = fl.output((P, OH, OW), {fl_dtype(n.outputs[1].type.dtype)}, axes="P _ _")')
            index_row(w, cfg, "HPOS", H, 3, 1, "the row of each input cell")
            index_row(w, cfg, "WPOS", W, 3, 2, "the column of each input cell")
        w("# a band of output rows per item: the input rows its windows cover, loaded whole; each window")
        w("# offset is a stepped slice of them (rows SH apart, columns SW apart), reduced into the part of")
        w("# the band whose windows it reaches inside the input (the padding adds nothing)")
        w("for ps, ohs in fl.parallel(fl.tiles(P, planes), fl.tiles(OH, rows), stages=stages):")
        with w.indent():
            w("rows_in = covered(ohs, H, KH, SH, DH, PH)   # (offset, first, stop output row) inside the input")
            w("cols_in = covered(slice(0, OW), W, KW, SW, DW, PW)")
            w(f"acc = fl.full((ps, ohs, OW), {fill})")
            if indices:
                w("at = fl.full((ps, ohs, OW), -1.0)   # where each cell's max is; -1: no value yet")
            w("if rows_in and cols_in:")
            with w.indent():
                w("top = min(p0 * SH + kh * DH - PH for kh, p0, p1 in rows_in)")
                w("bottom = max((p1 - 1) * SH + kh * DH - PH + 1 for kh, p0, p1 in rows_in)")
                w(f"win = fl.load({xname}[ps, top:bottom, :])")
                if indices:
                    w("hpos = fl.load(HPOS[:, top:bottom, :]) * W   # each loaded row's first position")
                    w("wpos = fl.load(WPOS)")
                w("for kh, p0, p1 in rows_in:")
                with w.indent():
                    w("for kw, q0, q1 in cols_in:")
                    with w.indent():
                        w("r, c = p0 * SH + kh * DH - PH - top, q0 * SW + kw * DW - PW   # the first input cell")
                        w("part = acc[:, p0 - ohs.start:p1 - ohs.start, q0:q1]")
                        if not indices:
                            w(f"fl.{'maximum' if maxing else 'add'}(part, win[:, r:r + (p1 - p0 - 1) * SH + 1:SH, "
                              f"c:c + (q1 - q0 - 1) * SW + 1:SW], out=part)")
                        else:
                            w("spot = at[:, p0 - ohs.start:p1 - ohs.start, q0:q1]")
                            w("tap = win[:, r:r + (p1 - p0 - 1) * SH + 1:SH, c:c + (q1 - q0 - 1) * SW + 1:SW]")
                            w("pos = hpos[:, r:r + (p1 - p0 - 1) * SH + 1:SH, :] + wpos[:, :, c:c + (q1 - q0 - 1) * SW + 1:SW]")
                            w("# greater, the cell's first value, or a NaN: torch's first maximum, or its last NaN")
                            w("won = fl.logical_or(fl.logical_or(tap > part, spot < 0.0), fl.isnan(tap))")
                            w("fl.where(won, pos, spot, out=spot)")
                            w("fl.where(won, tap, part, out=part)")
            if counted is not None:
                hc, wc, pc, qc = counted
                what = "the padded input" if pc == 0 and (PH or PW) else "the input"
                w(f"# each output cell's divisor: the cells of its window inside {what}")
                w("cnt = fl.zeros((1, ohs, OW))")
                w(f"for kh, p0, p1 in covered(ohs, {hc}, KH, SH, DH, {pc}):")
                with w.indent():
                    w(f"for kw, q0, q1 in covered(slice(0, OW), {wc}, KW, SW, DW, {qc}):")
                    with w.indent():
                        w("part = cnt[:, p0 - ohs.start:p1 - ohs.start, q0:q1]")
                        w("fl.add(part, 1.0, out=part)")
            result = "acc" if maxing else ("acc / cnt" if counted is not None else f"acc / {divisor}")
            if y.type.dtype != DType.f32:
                result = f"({result}).astype({fl_dtype(y.type.dtype)})" if not maxing else \
                    f"acc.astype({fl_dtype(y.type.dtype)})"
            w(f"fl.store(OUT[ps, ohs, :], {result})")
            if indices:
                w("fl.store(AT[ps, ohs, :], at.astype(fl.i64))")
        w("return (OUT, AT)" if indices else "return OUT")
    results = tuple(Result(i, tuple(v.type.shape)) for i, v in enumerate(n.outputs))
    return GeneratedKernel(fname, "pooling", w.text(), cfg, tuple(sig.params), results, (op,))


def _adaptive_bins(node: Node, cfg) -> GeneratedKernel:
    """adaptive_avg_pool2d whose bins do not divide the input: per band of output rows, the input
    rows its bins cover are loaded once; each bin's rows are added into a row sum (input width),
    each bin's columns of that into the result, and each cell divided by its bin's size."""
    from fexplore.ir.ops.nn import adaptive_bins

    n, x, y = _pool_of(node)
    P, H, W, OH, OW = _planes(x, y)
    bins_h, bins_w = adaptive_bins(H, OH), adaptive_bins(W, OW)
    tallest = max(b - a for a, b in bins_h)
    # live tiles, in output-row tiles (OW wide): the input rows of a band (its rows' share of H,
    # plus one bin's height), the row sums (W wide), the result and the counts
    live = 3 + -(-(-(-H // OH) + tallest) * W // OW) + -(-W // OW)
    planes, rows, fname, sig, xname, w = _opening(
        node, cfg, live=live, taken={"stages", "win", "acc", "part", "ps", "ohs", "rows", "planes", "top", "bottom",
                                    "sums", "cnt", "i", "j", "r", "c", "r0", "r1", "c0", "c1", "BINS_H", "BINS_W"})
    w()
    w()
    w(f'@fl.kernel(target="{cfg.name}")')
    w(f"def {fname}({', '.join(sig.annotations)}, *, planes: int = {planes}, rows: int = {rows}, "
      f"stages: int = {STAGES}):")
    with w.indent():
        w(f"P, H, W, OH, OW = {P}, {H}, {W}, {OH}, {OW}")
        w("# the input rows and columns of each output row's and column's bin: [i*H//OH, ceil((i+1)*H/OH))")
        w(f"BINS_H = {bins_h}")
        w(f"BINS_W = {bins_w}")
        w(f'OUT = fl.output((P, OH, OW), {fl_dtype(y.type.dtype)}, axes="P _ _")')
        w("for ps, ohs in fl.parallel(fl.tiles(P, planes), fl.tiles(OH, rows), stages=stages):")
        with w.indent():
            w("top, bottom = BINS_H[ohs.start][0], BINS_H[ohs.stop - 1][1]")
            w("win = fl.load(" + xname + "[ps, top:bottom, :])")
            w("sums = fl.zeros((ps, ohs, W))   # per output row: its bin's rows added up")
            w("cnt = fl.zeros((1, ohs, OW))    # per output cell: its bin's cell count")
            w("for i in range(ohs.start, ohs.stop):")
            with w.indent():
                w("r0, r1 = BINS_H[i]")
                w("part = sums[:, i - ohs.start:i - ohs.start + 1, :]")
                w("for r in range(r0, r1):")
                with w.indent():
                    w("fl.add(part, win[:, r - top:r - top + 1, :], out=part)")
                w("part = cnt[:, i - ohs.start:i - ohs.start + 1, :]")
                w("fl.add(part, float(r1 - r0), out=part)")
            w("acc = fl.zeros((ps, ohs, OW))")
            w("for j, (c0, c1) in enumerate(BINS_W):")
            with w.indent():
                w("part = acc[:, :, j:j + 1]")
                w("for c in range(c0, c1):")
                with w.indent():
                    w("fl.add(part, sums[:, :, c:c + 1], out=part)")
                w("part = cnt[:, :, j:j + 1]")
                w("fl.mul(part, float(c1 - c0), out=part)")
            result = "acc / cnt"
            if y.type.dtype != DType.f32:
                result = f"({result}).astype({fl_dtype(y.type.dtype)})"
            w(f"fl.store(OUT[ps, ohs, :], {result})")
        w("return OUT")
    return GeneratedKernel(fname, "pooling", w.text(), cfg, tuple(sig.params),
                           (Result(0, tuple(y.type.shape)),), (n.op.name, "unequal bins"))


def _opening(node: Node, cfg, live: int, taken: set):
    """(planes, rows, name, signature, input's name, writer) of a pooling kernel: its output tiled
    as planes x rows of whole output rows, with `live` such tiles in SRAM and an item for every PE
    where the rows allow; the input a parameter of (P, H, W) planes; the header comment written."""
    body = body_of(node)
    n, x, y = _pool_of(node)
    P, H, W, OH, OW = _planes(x, y)
    planes, rows, cols = tile_sizes((P, OH, OW), cfg, live=live)
    if cols < OW:
        raise UnsupportedRegionError(n.op.name, region_label(node),
                                     f"an output row of {OW} does not fit one tile on {cfg.name}", loc=n.loc)
    while -(-P // planes) * -(-OH // rows) < cfg.num_pes and rows > 1:   # an item for every PE
        rows = -(-rows // 2)
    names = Names(set(taken))
    fname = kernel_name(node)
    names.taken.add(fname)
    inputs = Inputs.of(node, body)
    sig = Signature(names, inputs)
    xname = sig.add(x, (P, H, W), spec(["P", "H", "W"], (P, H, W), {"P", "H", "W"}))
    w = Writer()
    header(w, node, body, "pooling", sig.header, inputs.literals)
    return planes, rows, fname, sig, xname, w


def _pool_of(node: Node):
    """(the pooling op, its input, its first result) of a pooling node or region."""
    n = body_of(node).nodes[0]
    return n, n.inputs[0], n.outputs[0]


def _planes(x, y) -> tuple[int, ...]:
    """(P, H, W, OH, OW): an NCHW pool's N * C planes and its input's and output's plane sizes."""
    N, Cc, H, W = x.type.shape
    return (N * Cc, H, W) + tuple(y.type.shape[2:])

"""Hand-built command programs: the shapes of code the kernel language and the scheduler emit.

Each builds a `Program` for a target with a given tiling: tiles spread round-robin over the PEs,
and double buffering (two SRAM slots per operand, alternating) so the DMA of the next tile
overlaps the compute of this one. They serve the tests (numbers equal numpy), the tutorials, and
the benchmark (`synthetic`).
"""

from __future__ import annotations

from fexplore.npu.builder import ProgramBuilder
from fexplore.npu.commands import Buffer
from fexplore.npu.config import NPUConfig


class _Slots:
    """Reusable SRAM buffers keyed by (pe, role, slot, shape): one buffer per key, so a loop reuses
    the same space each time round instead of allocating per tile."""

    def __init__(self, b: ProgramBuilder):
        self.b = b
        self.bufs: dict[tuple, Buffer] = {}

    def get(self, pe: int, role: str, slot: int, shape: tuple[int, ...], dtype: str) -> Buffer:
        key = (pe, role, slot, shape, dtype)
        if key not in self.bufs:
            self.bufs[key] = self.b.alloc(f"{role}{slot}_{'x'.join(map(str, shape))}", shape, dtype, pe=pe)
        return self.bufs[key]


def _ranges(n: int, step: int) -> list[tuple[int, int]]:
    return [(i, min(i + step, n)) for i in range(0, n, step)]


def tiled_matmul(target: str | NPUConfig, M: int, N: int, K: int, *, tile=(32, 32, 32), dtype: str = "f32",
                 out_dtype: str = "f32", pes: int | None = None, slots: int = 2) -> "Program":
    """C[M, N] = A[M, K] @ B[K, N]: output tiles round-robin over PEs, K loop accumulating in f32.

    Engine queues issue in order, so issue order matters: a tile's store is issued after the next
    tile's first loads on that PE, else the store (waiting for the last contraction) would hold
    up the DMA queue and the next tile could not be prefetched."""
    b = ProgramBuilder(target, name=f"matmul_{M}x{N}x{K}", capture_locs=False)
    pes = pes or b.target.num_pes
    A, B = b.input("A", (M, K), dtype), b.input("B", (K, N), dtype)
    C = b.output("C", (M, N), out_dtype)
    tm, tn, tk = tile
    buf = _Slots(b)
    turn = [0] * pes
    deferred: dict[int, tuple] = {}   # pe -> (acc, box, slot) of the tile whose store is pending

    def finish_tile(pe: int) -> None:
        if pe in deferred:
            acc, box, slot = deferred.pop(pe)
            out = acc
            if out_dtype != "f32":
                out = buf.get(pe, "c", slot, acc.shape, out_dtype)
                b.vector(out, "cast", acc)
            b.store(box, out)

    for t, ((m0, m1), (n0, n1)) in enumerate((mr, nr) for mr in _ranges(M, tm) for nr in _ranges(N, tn)):
        pe, tile_slot = t % pes, t // pes % slots
        acc = buf.get(pe, "acc", tile_slot, (m1 - m0, n1 - n0), "f32")
        for kk, (k0, k1) in enumerate(_ranges(K, tk)):
            slot = turn[pe] % slots
            turn[pe] += 1
            a = buf.get(pe, "a", slot, (m1 - m0, k1 - k0), dtype)
            bt = buf.get(pe, "b", slot, (k1 - k0, n1 - n0), dtype)
            b.load(a, A[m0:m1, k0:k1])
            b.load(bt, B[k0:k1, n0:n1])
            if kk == 0:
                finish_tile(pe)
            b.contract(acc, "mk,kn->mn", a, bt, accumulate=kk > 0)
        deferred[pe] = (acc, C[m0:m1, n0:n1], tile_slot)
    for pe in sorted(deferred):
        finish_tile(pe)
    return b.build()


def softmax(target: str | NPUConfig, R: int, C: int, *, rows: int = 16, pes: int | None = None) -> "Program":
    """Y = softmax(X, axis=-1), row tiles round-robin over PEs, computed in place in SRAM."""
    b = ProgramBuilder(target, name=f"softmax_{R}x{C}", capture_locs=False)
    pes = pes or b.target.num_pes
    X, Y = b.input("X", (R, C)), b.output("Y", (R, C))
    buf = _Slots(b)
    for t, (r0, r1) in enumerate(_ranges(R, rows)):
        pe, slot, h = t % pes, t // pes % 2, r1 - r0
        x = buf.get(pe, "x", slot, (h, C), "f32")
        m = buf.get(pe, "m", slot, (h, 1), "f32")
        b.load(x, X[r0:r1])
        b.vector(m, "max", x)           # row max, for a stable exp
        b.vector(x, "sub", x, m)
        b.vector(x, "exp", x)
        b.vector(m, "sum", x)
        b.vector(x, "div", x, m)
        b.store(Y[r0:r1], x)
    return b.build()


def layer_norm(target: str | NPUConfig, R: int, D: int, *, rows: int = 16, eps: float = 1e-5,
               pes: int | None = None) -> "Program":
    """Y = (X - mean) / sqrt(var + eps) * gamma + beta over the last axis."""
    b = ProgramBuilder(target, name=f"layer_norm_{R}x{D}", capture_locs=False)
    pes = pes or b.target.num_pes
    X, G, Bt = b.input("X", (R, D)), b.input("gamma", (D,)), b.input("beta", (D,))
    Y = b.output("Y", (R, D))
    buf = _Slots(b)
    params = {}
    for pe in range(pes):
        g, be = buf.get(pe, "gamma", 0, (D,), "f32"), buf.get(pe, "beta", 0, (D,), "f32")
        b.load(g, G)
        b.load(be, Bt)
        params[pe] = (g, be)
    for t, (r0, r1) in enumerate(_ranges(R, rows)):
        pe, slot, h = t % pes, t // pes % 2, r1 - r0
        g, be = params[pe]
        x = buf.get(pe, "x", slot, (h, D), "f32")
        sq = buf.get(pe, "sq", slot, (h, D), "f32")
        mu = buf.get(pe, "mu", slot, (h, 1), "f32")
        rs = buf.get(pe, "rstd", slot, (h, 1), "f32")
        b.load(x, X[r0:r1])
        b.vector(mu, "mean", x)
        b.vector(x, "sub", x, mu)
        b.vector(sq, "mul", x, x)
        b.vector(rs, "mean", sq)
        b.vector(rs, "add", rs, eps)
        b.vector(rs, "rsqrt", rs)
        b.vector(x, "mul", x, rs)
        b.vector(x, "mul", x, g)
        b.vector(x, "add", x, be)
        b.store(Y[r0:r1], x)
    return b.build()


def synthetic(target: str | NPUConfig, num_commands: int, *, pes: int | None = None,
              tile: int = 128, dtype: str = "bf16") -> "Program":
    """A long, realistic-looking command stream for benchmarking the simulator: per PE, a double-
    buffered loop of load, load, contract (accumulating), and every 4th step a vector epilogue and
    a store. Exactly `num_commands` commands in all."""
    b = ProgramBuilder(target, name=f"synthetic_{num_commands}", capture_locs=False)
    pes = pes or b.target.num_pes
    max_steps = num_commands // (pes * 3) + 1  # each step issues at least 3 commands per PE
    rows = tile * (max_steps // 4 + 1)
    A = b.input("A", (tile * pes, tile * 8), dtype)
    B = b.input("B", (tile * 8, tile), dtype)
    C = b.output("C", (rows, tile * pes), dtype)
    shape = (tile, tile)
    per_pe = []
    for pe in range(pes):
        per_pe.append(dict(
            a=[b.alloc(f"a{s}", shape, dtype, pe=pe) for s in range(2)],
            w=[b.alloc(f"w{s}", shape, dtype, pe=pe) for s in range(2)],
            acc=[b.alloc(f"acc{s}", shape, "f32", pe=pe) for s in range(2)],
            out=b.alloc("out", shape, dtype, pe=pe)))
    def room() -> bool:
        return len(b) < num_commands

    step = 0
    while room():
        for pe in range(pes):
            bufs, s, k = per_pe[pe], step % 2, step % 8
            acc = bufs["acc"][(step // 4) % 2]
            if room():
                b.load(bufs["a"][s], A[pe * tile:(pe + 1) * tile, k * tile:(k + 1) * tile])
            if room():
                b.load(bufs["w"][s], B[k * tile:(k + 1) * tile, :])
            if room():
                b.contract(acc, "mk,kn->mn", bufs["a"][s], bufs["w"][s], accumulate=step % 4 != 0)
            if step % 4 == 3 and room():
                b.vector(bufs["out"], "gelu", acc)
            if step % 4 == 3 and room():
                r = step // 4
                b.store(C[r * tile:(r + 1) * tile, pe * tile:(pe + 1) * tile], bufs["out"])
        step += 1
    return b.build()

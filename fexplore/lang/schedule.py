"""Issue order: which command each engine queue gets next.

Each engine of the chip runs its queue in order, so the order commands are issued in decides the
overlap. Issued in trace order, a kernel stalls: a store at the end of one tile sits in the DMA queue
in front of the next tile's loads, waiting for the tile's last contraction; in flash attention the
next block's scores wait behind this block's P @ V, which waits for the softmax. So the lowering
issues ops by a list scheduler instead. Repeatedly, among the ready ops (all the ops they depend on
issued), take the one with the earliest estimated start (its inputs ready, its engine free); but if
another op for the same engine could start before that one would finish and is more urgent, take
that one: a load feeding the next computation goes before a store nothing waits for. Dependencies
(data hazards on buffers and DRAM boxes, and waits) are never crossed, so the result is what trace
order computes; the simulator's functional mode checks that.

"More urgent" has no one right answer on three engines, so the order is made under three rules
(`RULES`) and the one whose estimated end comes first is issued:
- ``height``: the longer path from the op to the end of the kernel, the op's own cycles included;
- ``tail``: the longer path after the op (Jackson's rule for one machine: by delivery time). A
  short load that a long vector chain waits for goes before a long weight load: with ``height``
  a layer norm's weight and bias queued behind lm_head's weights, and the norm stalled on them;
- ``exchange``: the op whose going first, of the two, ends the pair's paths sooner (both orders
  of the pair worked out, idle time included).
Each wins somewhere (bench/kernels.py: tail 4% on lm_head's layer norm, height 10% on short flash
attention, exchange 1% more on long flash attention); the best of the three was never worse than
any one over the kernels bench and the whole models (ResNet 85.6 -> 79.6 us, GPT-2-small
783 -> 768 us), at three times the scheduling work.

The look-ahead is a window of `window` ops per PE past the first one not yet issued (PEs do not
share engines, so each PE gets its own window): wide enough to reach into the next loop iteration,
bounded so scheduling stays linear in the number of ops.
"""

from __future__ import annotations

MAX_PASSES = 2   # how often an op may be passed over for a more urgent one
WINDOW = 64      # ops per PE the scheduler looks ahead over (see the module)
RULES = ("height", "tail", "exchange")   # what "more urgent" means (see the module)


def list_schedule(pe_of: list[int], engine_of: list[int], duration: list[float], deps: list[list[int]],
                  num_pes: int, *, window: int = WINDOW, touches=None, buffer_bytes=None,
                  sram_limit: float | None = None, rules: tuple[str, ...] | None = None) -> list[int]:
    """Issue order of ops 0..n-1: of the orders `issue_order` makes under each of `rules`
    (default `RULES`), the one whose estimated end is first (the earlier rule on a tie)."""
    best = None
    for rule in rules or RULES:
        order, end = issue_order(pe_of, engine_of, duration, deps, num_pes, window=window, touches=touches,
                                 buffer_bytes=buffer_bytes, sram_limit=sram_limit, rule=rule)
        if best is None or end < best[1]:
            best = (order, end)
    return best[0]


def issue_order(pe_of: list[int], engine_of: list[int], duration: list[float], deps: list[list[int]],
                num_pes: int, *, window: int = WINDOW, touches=None, buffer_bytes=None,
                sram_limit: float | None = None, rule: str = "height") -> tuple[list[int], float]:
    """(issue order of ops 0..n-1, the estimated cycle its last op ends) under `rule` (one of
    `RULES`). `engine_of[i]` is 0/1/2 (dma/tensor/vector) or -1 (no engine); `deps[i]` lists
    earlier ops that must be issued (and, in the estimate, finished) before op i.

    With `touches` (per op, the ids of the SRAM buffers it uses, on its own PE), `buffer_bytes`
    and `sram_limit`, the order is memory-aware: a buffer is live from the first op issued that
    uses it to the last, and an op that would open buffers beyond `sram_limit` bytes live on its
    PE waits while other ops can go (the SRAM allocator places buffers in this order; hoisting a
    kernel's loads ahead of the stores that free its buffers overflowed it)."""
    n = len(pe_of)
    aware = touches is not None and sram_limit is not None
    live = [0.0] * num_pes
    opened: set = set()
    users_left: dict[int, int] = {}
    if aware:
        for ts in touches:
            for b in ts:
                users_left[b] = users_left.get(b, 0) + 1

    pending = [len(d) for d in deps]
    dependents: list[list[int]] = [[] for _ in range(n)]
    for i, ds in enumerate(deps):
        for d in ds:
            dependents[d].append(i)
    height = list(duration)      # longest path of estimated cycles from the op to the end
    for i in range(n - 1, -1, -1):
        if dependents[i]:
            height[i] += max(height[j] for j in dependents[i])
    tail = [h - d for h, d in zip(height, duration)]   # the path after the op
    seqs: list[list[int]] = [[] for _ in range(num_pes)]
    for i in range(n):
        seqs[pe_of[i]].append(i)
    head = [0] * num_pes          # position of the first op of the PE not issued yet
    limit = [0] * num_pes         # ops at positions < limit are in the window
    admitted = [False] * n
    issued = [False] * n
    ready: list[list[int]] = [[] for _ in range(num_pes)]
    inputs_at = [0.0] * n         # when the last dependency is estimated to finish
    free = [[0.0, 0.0, 0.0] for _ in range(num_pes)]
    best: list[tuple | None] = [None] * num_pes
    passed = [0] * n              # how often the earliest-starting op was passed over for another

    def admit(p: int) -> None:
        seq, stop = seqs[p], min(len(seqs[p]), head[p] + window)
        while limit[p] < stop:
            i = seq[limit[p]]
            admitted[i] = True
            limit[p] += 1
            if pending[i] == 0:
                ready[p].append(i)

    def pick(p: int, force: bool = False):
        """(start, op, the earliest-starting op) of the op PE `p` issues next, or None. The hot loop
        of a compile (every candidate tile size of every kernel is scheduled three times): written
        with locals and without a tuple per ready op."""
        fp = free[p]
        check = aware and not force
        used = live[p]
        ts, ids = [], []          # the estimated starts of the ready ops that may go, and the ops
        t0 = i0 = None
        for i in ready[p]:
            if check:             # an op opening buffers past the SRAM limit waits
                need = 0
                for b in touches[i]:
                    if b not in opened:
                        need += buffer_bytes[b]
                if need and used + need > sram_limit:
                    continue
            t = inputs_at[i]
            e = engine_of[i]
            if e >= 0 and fp[e] >= t:
                t = fp[e]
            ts.append(t)
            ids.append(i)
            if t0 is None or t < t0 or (t == t0 and i < i0):
                t0, i0 = t, i
        if i0 is None:
            return None
        if passed[i0] >= MAX_PASSES:   # no starving: an op passed over often enough goes now
            return (t0, i0, i0)
        e0, horizon = engine_of[i0], t0 + duration[i0]
        bt, bi = t0, i0
        if rule == "exchange":   # the other op whose going first ends the pair's paths soonest
            d0, q0 = duration[i0], tail[i0]
            gain = 0.0
            for t, i in zip(ts, ids):
                if engine_of[i] != e0 or t >= horizon or i == i0:
                    continue
                d1, q1 = duration[i], tail[i]
                first_goes_first = max(t0 + d0 + q0, max(t, t0 + d0) + d1 + q1)
                other_goes_first = max(t + d1 + q1, t + d1 + d0 + q0)
                if first_goes_first - other_goes_first > gain + 1e-9:
                    gain, bt, bi = first_goes_first - other_goes_first, t, i
            return (bt, bi, i0)
        key = tail if rule == "tail" else height
        bk = key[i0]
        for t, i in zip(ts, ids):   # a more urgent op that can start before the first would finish
            if t < horizon and engine_of[i] == e0:
                k = key[i]
                if k > bk or (k == bk and (t < bt or (t == bt and i < bi))):
                    bt, bi, bk = t, i, k
        return (bt, bi, i0)

    for p in range(num_pes):
        admit(p)
        best[p] = pick(p)
    order: list[int] = []
    makespan = 0.0               # the estimated end of the last op issued so far
    while len(order) < n:
        choice = None
        for p in range(num_pes):
            b = best[p]
            if b is not None and (choice is None or b < choice[0]):
                choice = (b, p)
        if choice is None:   # every ready op would overflow its PE: the earliest goes anyway
            for p in range(num_pes):
                b = pick(p, force=True)
                if b is not None and (choice is None or b < choice[0]):
                    choice = (b, p)
        (start, i, first), p = choice
        if first != i:
            passed[first] += 1
        order.append(i)
        issued[i] = True
        ready[p].remove(i)
        if aware:
            for b in touches[i]:
                if b not in opened:
                    opened.add(b)
                    live[p] += buffer_bytes[b]
                users_left[b] -= 1
                if users_left[b] == 0:
                    live[p] -= buffer_bytes[b]
        end = start + duration[i]
        makespan = max(makespan, end)
        if engine_of[i] >= 0:
            free[p][engine_of[i]] = end
        dirty = {p}
        for d in dependents[i]:
            pending[d] -= 1
            if inputs_at[d] < end:
                inputs_at[d] = end
            if pending[d] == 0 and admitted[d]:
                ready[pe_of[d]].append(d)
                dirty.add(pe_of[d])
        seq = seqs[p]
        while head[p] < len(seq) and issued[seq[head[p]]]:
            head[p] += 1
        admit(p)
        for q in dirty:
            best[q] = pick(q)
    return order, makespan

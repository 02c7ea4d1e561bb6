"""fusion: group nodes into fused regions, each a ``region`` node owning its body graph.

Patterns, claimed in this order (a node joins at most one region):
1. attention: the ``attention`` op, or q·kᵀ -> scale -> mask -> softmax -> ·v written out, with
   what feeds it exclusively (head reshapes and transposes, the qkv split, rotary embedding on q
   and k, grouped-query expansion, a norm of each head of q and k);
2. contraction + epilogue: linear / matmul / conv2d with the elementwise chain after it (bias,
   activation, scaling, residual add; an activation written out as a graph on the result too),
   and as prologue the views and the norm feeding it exclusively (a cast that widens a result
   the region writes out anyway for a norm is that norm's, not a second, wider result);
3. reductions with their surroundings: layer_norm, rms_norm (simplify raises the written-out
   form to the op; other written-out reductions are grouped as they stand), batch norm, softmax,
   with the residual add before a norm when no epilogue took it, and the one after it;
4. elementwise chains: what is left, grouped vertically and with siblings (a group that is not
   convex, as siblings in two layers reading one table are, in convex parts).

Every region must be convex (no path leaves it and comes back) and the working set of one tile
step (a block of rows of every value it touches) must fit one PE's SRAM on the target; a region
that does not fit is split by giving its last nodes back, and the split is reported. Regions stay interpretable: the interpreter runs
their bodies.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from fexplore.ir import Category, Constant, Graph, Node, Value

from ..stage import Rewrite, StageResult
from .traffic import compulsory_traffic, graph_traffic, type_bytes

_NORMS = {"layer_norm", "rms_norm", "batch_norm", "softmax", "log_softmax"}
_REDUCTIONS = {"sum", "mean", "amax", "amin", "var"}
_CONTRACTIONS = {"linear", "matmul", "conv2d"}
_NOT_ABSORBED = {"embedding", "gather", "index", "index_put", "scatter"}  # gathers and scatters are kernels of their own
# views a kernel reads as boxes of their operand, in place (a relayout, concat or pad moves data)
_IN_PLACE_VIEWS = {"slice", "select", "split", "reshape", "permute"}


TILE_ROWS, TILE_COLS = 128, 8192


def _tile_bytes(v: Value, symbols) -> int:
    shape = v.type.shape
    if not shape or not all(isinstance(d, int) for d in shape):
        return type_bytes(v.type, symbols)
    last = shape[-1]
    rows = 1
    for d in shape[:-1]:
        rows *= d
    return min(rows, TILE_ROWS) * min(last, TILE_COLS) * v.type.dtype.numpy.itemsize


@dataclass
class _Group:
    kind: str
    anchor: int
    members: set[int] = field(default_factory=set)


class _Fuser:
    def __init__(self, graph: Graph, sram_bytes: int):
        self.g = graph
        self.nodes = graph.nodes
        self.sram = sram_bytes
        self.producer = {v.name: i for i, n in enumerate(self.nodes) for v in n.outputs}
        self.users: dict[str, list[int]] = {}
        for i, n in enumerate(self.nodes):
            for v in n.inputs:
                self.users.setdefault(v.name, []).append(i)
        self.graph_outputs = {v.name for v in graph.outputs}
        self.claimed: dict[int, _Group] = {}
        self.groups: list[_Group] = []
        self.splits: list[dict] = []
        self.rejected: list[dict] = []
        self._positional_memo: dict[int, bool] = {}

    # -- predicates ----------------------------------------------------------------------------

    def op(self, i: int) -> str:
        return self.nodes[i].op.name

    def free(self, i: int) -> bool:
        return i not in self.claimed and not self.nodes[i].regions

    def elementwise(self, i: int) -> bool:
        return self.nodes[i].op.category == Category.elementwise and not self.nodes[i].regions

    def movement(self, i: int) -> bool:
        n = self.nodes[i]
        return n.op.category in (Category.movement, Category.broadcast) and \
            n.op.name not in _NOT_ABSORBED and bool(n.inputs)

    def exclusive_to(self, i: int, members: set[int], exported_ok: bool = False) -> bool:
        """Every reader of node i's results is in ``members`` (with ``exported_ok``, a model
        output may read them too: the region then exports the value, as for a KV cache)."""
        for v in self.nodes[i].outputs:
            if v.name in self.graph_outputs and not exported_ok:
                return False
            outside = [u for u in self.users.get(v.name, []) if u not in members]
            if outside and not (exported_ok and all(self.feeds_only_outputs(u) for u in outside)):
                return False
        return True

    def feeds_only_outputs(self, i: int) -> bool:
        """Node i only rearranges data on its way to model outputs (stacking a KV cache)."""
        if not self.movement(i):
            return False
        return all(v.name in self.graph_outputs or
                   all(self.feeds_only_outputs(u) for u in self.users.get(v.name, []))
                   for v in self.nodes[i].outputs)

    # -- growing ---------------------------------------------------------------------------

    def absorb_producers(self, members: set[int], ok, exported_ok: bool = False) -> None:
        """Pull in producers used only by the group (and accepted by ``ok``), to a fixed point."""
        changed = True
        while changed:
            changed = False
            for m in sorted(members, reverse=True):
                for v in self.nodes[m].inputs:
                    p = self.producer.get(v.name)
                    if p is None or p in members or not self.free(p) or not ok(p):
                        continue
                    if self.exclusive_to(p, members, exported_ok):
                        members.add(p)
                        changed = True

    def extend_chain(self, members: set[int], tail: int, rows_of=None) -> int:
        """Follow single-use elementwise consumers from ``tail`` (an epilogue). With ``rows_of``
        (a row-wise region's shape) only consumers of that shape join, and no contraction."""
        while len(self.nodes[tail].outputs) == 1:
            v = self.nodes[tail].output
            us = self.users.get(v.name, [])
            if len(us) != 1 or v.name in self.graph_outputs:
                break
            u = us[0]
            if not self.free(u) or not self.elementwise(u) or \
                    rows_of is not None and self.nodes[u].output.type.shape != rows_of:
                break
            members.add(u)
            if rows_of is not None:
                tail = u
                continue
            # a sibling contraction feeding the same op (SwiGLU's up projection, a ResNet
            # block's projection shortcut) joins too, when the op is its only reader; a linear or
            # matmul only over the same activations (the kernel shares their loop): the output
            # projection of a parallel attention block (GPT-NeoX, Phi, GPT-J) is an operand of
            # the MLP's epilogue, not a second contraction in its kernel
            for x in self.nodes[u].inputs:
                p = self.producer.get(x.name)
                if p is not None and p not in members and self.free(p) and \
                        self.op(p) in _CONTRACTIONS and self.exclusive_to(p, members) and \
                        (self.op(p) == "conv2d" or self._same_activations(p, members)):
                    members.add(p)
            tail = u
        return tail

    def extend_closure(self, members: set[int], result_shape=None) -> None:
        """Add elementwise consumers all of whose inputs the group already has (a norm's tail).
        With ``result_shape`` (a contraction's epilogue, whose tiles are the result's) only
        consumers of that shape whose inputs the group makes: an activation written out as a
        graph rather than a chain (GPT-2's tanh GELU reads its input three times), which
        `extend_chain` stops at."""
        changed = True
        while changed:
            changed = False
            known = {v.name for m in members for v in self.nodes[m].outputs}
            if result_shape is None:
                known |= {v.name for m in members for v in self.nodes[m].inputs}
            for m in sorted(members):
                for v in self.nodes[m].outputs:
                    for u in self.users.get(v.name, []):
                        if u in members or not self.free(u) or not self.elementwise(u) or \
                                result_shape is not None and self.nodes[u].output.type.shape != result_shape:
                            continue
                        if self._widened_for_a_norm(u, v, members):
                            continue
                        if all(x.name in known or isinstance(x, Constant)
                               for x in self.nodes[u].inputs):
                            members.add(u)
                            known |= {x.name for x in self.nodes[u].outputs}
                            changed = True

    def _widened_for_a_norm(self, u: int, v: Value, members: set[int]) -> bool:
        """Node u widens `v`, a result the group writes out anyway, for one norm or reduction
        only (a model in bf16 normalizing its residual stream in f32, as Hugging Face's do). Left
        out, the cast is the prologue of the norm reading it (`reductions`), which reads the
        narrow result and widens it on chip; taken in, the group would write the wide copy too,
        and the norm read it: twice the bytes of the narrow result more, each way. (A cast two
        norms read would be a kernel of its own, left out: it stays in.)"""
        n = self.nodes[u]
        if n.op.name != "cast" or n.output.type.dtype.itemsize <= v.type.dtype.itemsize or \
                n.output.name in self.graph_outputs:
            return False
        written_anyway = v.name in self.graph_outputs or \
            any(w != u and w not in members for w in self.users.get(v.name, []))
        readers = self.users.get(n.output.name, [])
        return written_anyway and len(readers) == 1 and self.op(readers[0]) in _NORMS | _REDUCTIONS

    def _same_activations(self, p: int, members: set[int]) -> bool:
        """Contraction p reads the activations a contraction among `members` reads."""
        return any(self.op(m) in _CONTRACTIONS and self.nodes[m].inputs[0].name == self.nodes[p].inputs[0].name
                   for m in members)

    # -- checks ----------------------------------------------------------------------------

    def convex(self, members: set[int]) -> bool:
        """No path leaves the group and comes back, counting regions already formed as single
        nodes: two groups that are each convex can still feed each other (A -> B and B -> A
        through different members), which would make the fused graph cyclic."""
        seen: set[int] = set()
        stack = [u for m in members for v in self.nodes[m].outputs
                 for u in self.users.get(v.name, []) if u not in members]
        while stack:
            i = stack.pop()
            if i in seen:
                continue
            seen.add(i)
            group = self.claimed.get(i)
            for j in (group.members if group is not None else (i,)):
                seen.add(j)
                for v in self.nodes[j].outputs:
                    for u in self.users.get(v.name, []):
                        if u in members:
                            return False
                        if u not in seen:
                            stack.append(u)
        return True

    def working_set(self, members: set[int]) -> int:
        """The SRAM one tile step of the region needs: a block of `TILE_ROWS` rows of every value
        it touches (the last dim up to `TILE_COLS` wide). The lowered kernels tile rows and
        stream weights, so the region's whole values need not fit, only a tile of each; a
        region whose tile step does not fit SRAM cannot be lowered as one kernel."""
        values: dict[str, Value] = {}
        for m in members:
            for v in list(self.nodes[m].inputs) + list(self.nodes[m].outputs):
                values[v.name] = v
        made = {v.name for m in members for v in self.nodes[m].outputs}
        # an operand the region reads only through views (the q, k and v slices of one merged
        # projection) is loaded as those views' boxes, never whole: the views are counted
        through_views = {name for name in values if name not in made and
                         all(self.op(u) in _IN_PLACE_VIEWS for u in self.users.get(name, []) if u in members)}
        # and a view made in the region (a reshape, a head permute, a grouped-query expand) is its
        # source's tile read another way, not a tile of its own
        views = {v.name for m in members if self.op(m) in _IN_PLACE_VIEWS | {"expand"} for v in self.nodes[m].outputs}
        return sum(_tile_bytes(v, self.g.symbols) for name, v in values.items()
                   if name not in through_views and name not in views)

    def claim(self, kind: str, anchor: int, members: set[int]) -> None:
        members = set(members)
        size = original = self.working_set(members)
        dropped = []
        # Give back the last node until the rest fits (convexity is checked after).
        while size > self.sram and len(members) > 1:
            last = max(members)
            members.discard(last)
            dropped.append(self.nodes[last].name)
            size = self.working_set(members)
        fits = size <= self.sram and len(members) > 1
        if dropped:
            self.splits.append({"region": self.nodes[anchor].name, "kind": kind,
                                "working_set_bytes": original,
                                "sram_bytes": self.sram, "given_back": dropped, "fused": fits})
        if not fits:
            return
        if not self.convex(members):
            self.rejected.append({"region": self.nodes[anchor].name, "kind": kind,
                                  "reason": "not convex"})
            return
        anchor = anchor if anchor in members else max(members)
        group = _Group(kind, anchor, members)
        for m in members:
            self.claimed[m] = group
        self.groups.append(group)

    # -- the patterns ----------------------------------------------------------------------

    def attention(self) -> None:
        for i, n in enumerate(self.nodes):
            if not self.free(i):
                continue
            if n.op.name == "attention":
                members = {i}
            elif n.op.name == "softmax":
                members = self._written_out_attention(i)
                if members is None:
                    continue
            else:
                continue
            # the new keys and values a decode step appends to its KV cache are computed here
            # and exported, rather than left as kernels of their own; a norm over each head's
            # depth (QK-norm) is computed as q and k are loaded, as rotary embeddings are
            # (an elementwise op straight on a projection's result, its bias or scale, is left to
            # that contraction's epilogue: the kernel that has the accumulators applies it)
            depth = self._depth(members)
            masks = self._score_operands(members)
            self.absorb_producers(members, lambda p: p not in masks and (
                self.elementwise(p) and not self._on_projection(p, members) or self.movement(p) or
                self._head_norm(p, depth)), exported_ok=True)
            self.claim("attention", i, members)

    def _on_projection(self, p: int, members: set[int]) -> bool:
        """Node p reads the result of a contraction outside `members` directly."""
        return any(self.producer.get(v.name) not in (None, *members) and self.op(self.producer[v.name]) in _CONTRACTIONS
                   for v in self.nodes[p].inputs)

    def _depth(self, members: set[int]):
        """The depth D of the attention in `members`: its queries' last axis."""
        core = next((m for m in sorted(members) if self.op(m) in ("attention", "matmul")), None)
        return self.nodes[core].inputs[0].type.shape[-1] if core is not None else None

    def _head_norm(self, p: int, depth) -> bool:
        """A layer or RMS norm over the last axis alone, that axis `depth` long: a norm of each head."""
        n = self.nodes[p]
        return n.op.name in ("layer_norm", "rms_norm") and n.attrs["ndim"] == 1 and \
            depth is not None and n.inputs[0].type.shape[-1] == depth

    def _written_out_attention(self, s: int):
        us = self.users.get(self.nodes[s].output.name, [])
        if len(us) != 1 or self.op(us[0]) != "matmul" or \
                self.nodes[us[0]].inputs[0].name != self.nodes[s].output.name:
            return None
        frontier, path = [s], {s}
        for _ in range(6):  # scale, mask, bias... a handful of elementwise steps at most
            nxt = []
            for i in frontier:
                for v in self.nodes[i].inputs:
                    p = self.producer.get(v.name)
                    if p is None or not self.free(p):
                        continue
                    if self.op(p) == "matmul":
                        return path | {p, us[0]}
                    if self.elementwise(p) and not self._positional(p):   # a step of the scores, not a mask
                        if not self._one_computed_score(p):
                            return None
                        nxt.append(p)
                        if self.exclusive_to(p, path):   # the region's from the start: its masks are known
                            path.add(p)
            frontier = nxt
        return None

    def _one_computed_score(self, p: int) -> bool:
        """Score op p combines the scores with operands read as they are (views of inputs, a mask
        made from positions alone: `_positional`), not with a second computed value (DeBERTa adds
        position scores it computes with projections): the attention kernel runs the score ops on
        each block of scores, with nothing else computed."""
        computed = {v.name for v in self.nodes[p].inputs if self.producer.get(v.name) is not None and
                    not self.movement(self.producer[v.name]) and self.free(self.producer[v.name]) and
                    self.nodes[self.producer[v.name]].op.name not in _NOT_ABSORBED and
                    not self._positional(self.producer[v.name])}
        return len(computed) <= 1

    def _positional(self, i: int) -> bool:
        """Node i computes no contraction, nor reads one's result at any depth: a mask or bias made
        from positions and inputs (a decode step's sliding-window mask from the cache position).
        An attention kernel loads it as it loads a mask given as an input; its nodes stay out of
        the attention region (`_score_operands`), a kernel of their own."""
        memo = self._positional_memo
        stack = [i]
        while stack:
            j = stack[-1]
            if j in memo:
                stack.pop()
                continue
            n = self.nodes[j]
            if n.regions or n.op.name in _CONTRACTIONS or n.op.name == "attention":
                memo[j] = False
                stack.pop()
                continue
            ups = [self.producer[v.name] for v in n.inputs if v.name in self.producer]
            todo = [u for u in ups if u not in memo]
            if todo:
                stack += todo
                continue
            memo[j] = all(memo[u] for u in ups)
            stack.pop()
        return memo[i]

    def _score_operands(self, members: set[int]) -> set[int]:
        """The nodes making the positional masks the score ops of `members` read (through views):
        left out of the region, so the kernel loads the mask and computes only the scores."""
        out = set()
        for m in members:
            if not self.elementwise(m):
                continue
            for v in self.nodes[m].inputs:
                p = self.producer.get(v.name)
                while p is not None and p not in members and self.movement(p):
                    p = self.producer.get(self.nodes[p].inputs[0].name)
                if p is not None and p not in members and not self.movement(p) and self._positional(p):
                    out.add(p)
        return out

    def epilogues(self) -> None:
        for i, n in enumerate(self.nodes):
            if n.op.name not in _CONTRACTIONS or not self.free(i):
                continue
            members, tail = {i}, i
            while True:
                size = len(members)
                self.extend_chain(members, tail)
                self.extend_closure(members, result_shape=n.output.type.shape)
                if len(members) == size:
                    break
                tail = max(members)
            # a prologue: views, and a norm whose only reader is this contraction (a norm the
            # epilogue reads too, as a post-norm block's residual add does, stays out: the kernel
            # has the normed rows only as its operand tiles, not where the epilogue reads them)
            self.absorb_producers(members, lambda p: self.movement(p) or
                                  (self.op(p) in ("layer_norm", "rms_norm") and self._only_operand_of(p, members)))
            self.claim("contraction", i, members)

    def _only_operand_of(self, p: int, members: set[int]) -> bool:
        """Node p's results are read, directly or through views, only by the contractions among
        `members` (the anchor and its siblings, SwiGLU's gate and up)."""
        stack = [p]
        while stack:
            for v in self.nodes[stack.pop()].outputs:
                for u in self.users.get(v.name, []):
                    if u in members and self.op(u) in _CONTRACTIONS:
                        continue
                    if not self.movement(u):
                        return False
                    stack.append(u)
        return True

    def reductions(self) -> None:
        for i, n in enumerate(self.nodes):
            if not self.free(i) or n.op.name not in _NORMS | _REDUCTIONS:
                continue
            members = {i}
            self.absorb_producers(members, lambda p: self.elementwise(p))
            if n.op.name in ("layer_norm", "rms_norm") or n.op.name in _REDUCTIONS:
                self._take_residual_add(members)
            self.extend_closure(members)
            if n.op.name in ("layer_norm", "rms_norm"):
                # the residual add after a norm of a projection's result (Gemma's sandwich norms)
                # is computed on the normed rows, not in a kernel of its own
                exits = [m for m in members for v in self.nodes[m].outputs
                         if v.name in self.graph_outputs or any(u not in members for u in self.users.get(v.name, []))]
                if len(exits) == 1:
                    self.extend_chain(members, exits[0], rows_of=n.output.type.shape)
            self.claim("norm" if n.op.name not in ("softmax", "log_softmax") else "softmax",
                       i, members)

    def _take_residual_add(self, members: set[int]) -> None:
        first = min(members)
        p = self.producer.get(self.nodes[first].inputs[0].name)
        if p is not None and self.free(p) and self.op(p) == "add":
            members.add(p)

    def chains(self) -> None:
        free = [i for i in range(len(self.nodes)) if self.free(i) and self.elementwise(i)]
        parent = {i: i for i in free}

        def find(i):
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        for i in free:
            for v in self.nodes[i].inputs:
                p = self.producer.get(v.name)
                if p in parent:
                    parent[find(i)] = find(p)  # vertical
            for v in self.nodes[i].inputs:  # siblings: elementwise ops reading one value
                if isinstance(v, Constant):
                    continue
                for u in self.users.get(v.name, []):
                    if u in parent and u != i:
                        parent[find(i)] = find(u)
        comps: dict[int, set[int]] = {}
        for i in free:
            comps.setdefault(find(i), set()).add(i)
        for members in sorted(comps.values(), key=min):
            if len(members) < 2:
                continue
            if self.convex(members):
                self.claim("elementwise", min(members), members)
                continue
            # siblings far apart (two layers' rotary embeddings reading one cos table) make a
            # group a path leaves and re-enters: claim its convex parts instead of nothing
            for part in self._convex_parts(members):
                if len(part) >= 2:
                    self.claim("elementwise", min(part), part)

    def _convex_parts(self, members: set[int]) -> list[set[int]]:
        """`members` (elementwise nodes) in parts, each convex: joined along producer -> user
        links first, then two parts reading one value when the two together stay convex."""
        part = {i: {i} for i in members}

        def join(a: int, b: int, check: bool) -> None:
            pa, pb = part[a], part[b]
            if pa is pb or (check and not self.convex(pa | pb)):
                return
            merged = pa | pb
            for m in merged:
                part[m] = merged
        for i in sorted(members):
            for v in self.nodes[i].inputs:
                p = self.producer.get(v.name)
                if p in members:
                    join(i, p, check=True)
        for i in sorted(members):
            for v in self.nodes[i].inputs:
                if isinstance(v, Constant):
                    continue
                for u in self.users.get(v.name, []):
                    if u in members:
                        join(i, u, check=True)
        unique = {id(p): p for p in part.values()}
        return sorted(unique.values(), key=min)


def fusion(graph: Graph, options) -> StageResult:
    sram = options.chip.sram_bytes_per_pe
    f = _Fuser(graph, sram)
    f.attention()
    f.epilogues()
    f.reductions()
    f.chains()
    new_graph, rewrites = _build(graph, f)
    by_kind: dict[str, int] = {}
    for n in new_graph.nodes:
        if n.op.name == "region":
            by_kind[n.attrs["kind"]] = by_kind.get(n.attrs["kind"], 0) + 1
    before = graph_traffic(graph)
    after = graph_traffic(new_graph)
    compulsory = compulsory_traffic(graph)
    stats = {
        "fused_regions": sum(by_kind.values()),
        "regions_by_kind": by_kind,
        "nodes_fused": sum(len(g.members) for g in f.groups),
        "dram_bytes_before": before,
        "dram_bytes_after": after,
        "dram_bytes_compulsory": compulsory,
        "traffic_after_over_before": after / before if before else 1.0,
        "traffic_after_over_compulsory": after / compulsory if compulsory else 1.0,
        "sram_bytes_per_pe": sram,
        "split_for_sram": f.splits,
        "rejected": f.rejected,
    }
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(by_kind.items()))
    summary = (f"{stats['fused_regions']} regions ({kinds}); DRAM traffic "
               f"{stats['traffic_after_over_before']:.2f}x before, "
               f"{stats['traffic_after_over_compulsory']:.2f}x compulsory")
    return StageResult(new_graph, stats, rewrites, summary)


def _build(graph: Graph, f: _Fuser) -> tuple[Graph, list[Rewrite]]:
    """Replace each group by a region node; order units topologically (regions may need to move
    past nodes that sat between their members)."""
    units: list[tuple[int, object]] = []  # (first index, node or group)
    for i, n in enumerate(graph.nodes):
        g = f.claimed.get(i)
        if g is None:
            units.append((i, n))
        elif i == min(g.members):
            units.append((i, g))
    made = [_region_node(graph, f, u) if isinstance(u, _Group) else u for _, u in units]
    defined_by = {v.name: k for k, n in enumerate(made) for v in n.outputs}
    deps = [{defined_by[v.name] for v in n.inputs if v.name in defined_by} for n in made]
    waiting = [len(d) for d in deps]
    dependents: dict[int, list[int]] = {}
    for k, d in enumerate(deps):
        for j in d:
            dependents.setdefault(j, []).append(k)
    ready = [(units[k][0], k) for k in range(len(made)) if waiting[k] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, k = heapq.heappop(ready)
        order.append(made[k])
        for j in dependents.get(k, []):
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(ready, (units[j][0], j))
    assert len(order) == len(made), "fusion produced a cycle; convexity should have prevented it"
    rewrites = [Rewrite(f"fuse-{g.kind}", tuple(graph.nodes[m].name for m in sorted(g.members)),
                        (_region_outputs(graph, f, g)[0].name,)) for g in f.groups]
    return Graph(graph.name, list(graph.inputs), list(graph.constants), order,
                 list(graph.outputs), dict(graph.symbols)), rewrites


def _region_outputs(graph: Graph, f: _Fuser, g: _Group) -> list[Value]:
    outs = []
    for m in sorted(g.members):
        for v in graph.nodes[m].outputs:
            if v.name in f.graph_outputs or any(u not in g.members
                                                for u in f.users.get(v.name, [])):
                outs.append(v)
    return outs


def _region_node(graph: Graph, f: _Fuser, g: _Group) -> Node:
    members = [graph.nodes[m] for m in sorted(g.members)]
    anchor = graph.nodes[g.anchor]
    return region_node(members, _region_outputs(graph, f, g), g.kind,
                       f"{g.kind}_{anchor.name}".replace(".", "_"), anchor.loc)


def region_kind(members: list[Node]) -> str:
    """The kind fusion would give a region of ``members``, by the strongest op it holds."""
    ops = {n.op.name for n in members}
    if "attention" in ops or ("softmax" in ops and "matmul" in ops):
        return "attention"
    if ops & _CONTRACTIONS:
        return "contraction"
    if ops & {"softmax", "log_softmax"}:
        return "softmax"
    if ops & (_NORMS | _REDUCTIONS):
        return "norm"
    return "elementwise"


def region_node(members: list[Node], outputs: list[Value], kind: str, name: str, loc) -> Node:
    """A ``region`` node of ``kind`` owning ``members`` (in program order) as its body: its inputs
    are the values the members read and do not make, in order of first use; ``outputs`` are the
    values it gives back. Fusion builds its regions with it, and the lower stage the pieces of a
    region it splits."""
    inside = {v.name for n in members for v in n.outputs}
    inputs: dict[str, Value] = {}
    for n in members:
        for v in n.inputs:
            if v.name not in inside:
                inputs.setdefault(v.name, v)
    body = Graph(name, list(inputs.values()), [], list(members), list(outputs), {})
    return Node("region", list(inputs.values()), {"kind": kind}, list(outputs), loc, [body])

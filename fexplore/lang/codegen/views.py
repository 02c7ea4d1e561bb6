"""Views of a region input as index maps, so a kernel reads a view straight from the input.

A chain of views (reshape that splits axes, permute, slice, select, split, relayout, expand)
maps each index of the view to an index of the input that is affine in the view's indices: an
input index is ``const + sum(coef * view index)`` (an expanded axis has coefficient 0). A box of
the view where every view axis is an int (a loop variable) or a unit-stride range that lands on
an input axis with coefficient 1 is then one unit-stride box of the input: ``q[b, h, qs, :]`` of
(B, T, 3*H*D) -> (B, H, T, D) is ``qkv[b, qs, 0 * 64 + h * 16 + 0:0 * 64 + h * 16 + 16]``.
"""

from __future__ import annotations


VIEW_OPS = {"reshape", "permute", "slice", "select", "split", "relayout", "expand"}


class ViewMap:
    def __init__(self, source, shape, terms):
        self.source = source     # the region input Value
        self.shape = shape       # the view's shape
        self.terms = terms       # per input axis: (const, [(coef, view axis)])

    @classmethod
    def identity(cls, v):
        shape = tuple(v.type.shape)
        return cls(v, shape, [(0, [(1, i)]) for i in range(len(shape))])

    @classmethod
    def of(cls, value, producer, inputs, fail):
        """The map of `value` from the region input it is a view of (`fail(node, why)` otherwise)."""
        chain, v = [], value
        while v.name in producer:
            n = producer[v.name]
            if n.op.name not in VIEW_OPS:
                fail(n, "an operand of attention computed inside the region (rotary embedding, a cache "
                        "append): the attention part reads views of region inputs only")
            chain.insert(0, (n, v))
            v = n.inputs[0]
        if v.name not in inputs:
            fail(producer[value.name] if value.name in producer else None, "a constant attention operand")
        m = cls.identity(v)
        for n, out in chain:
            m = m._apply(n, out, fail)
        return m

    def _substitute(self, fn):
        """New terms where each old view axis i is replaced by fn(i) -> (const, [(coef, new axis)])."""
        out = []
        for const, lin in self.terms:
            c, new = const, []
            for coef, i in lin:
                k, sub = fn(i)
                c += coef * k
                new += [(coef * s, j) for s, j in sub]
            out.append((c, new))
        return out

    def _apply(self, n, out, fail):
        op = n.op.name
        new_shape = tuple(out.type.shape)
        if op == "relayout":
            return ViewMap(self.source, new_shape, self.terms)
        if op == "permute":
            perm = n.attrs["perm"]
            inv = {p: i for i, p in enumerate(perm)}
            return ViewMap(self.source, new_shape, self._substitute(lambda i: (0, [(1, inv[i])])))
        if op in ("slice", "split"):
            axis = n.attrs["axis"] % len(self.shape)
            if op == "slice" and n.attrs["step"] != 1:
                fail(n, "a strided slice")
            start = part_start(n, out)
            return ViewMap(self.source, new_shape,
                           self._substitute(lambda i: (start if i == axis else 0, [(1, i)])))
        if op == "expand":
            # axes of size 1 broadcast (and new leading axes): every index there reads index 0
            shift = len(new_shape) - len(self.shape)
            return ViewMap(self.source, new_shape, self._substitute(
                lambda i: (0, []) if self.shape[i] == 1 and new_shape[i + shift] != 1 else (0, [(1, i + shift)])))
        if op == "select":
            axis, index = n.attrs["axis"] % len(self.shape), n.attrs["index"]
            return ViewMap(self.source, new_shape, self._substitute(
                lambda i: (index, []) if i == axis else (0, [(1, i - (i > axis))])))
        if op == "reshape":
            groups = _split_groups(self.shape, new_shape)
            if groups is None:
                fail(n, "a reshape that merges axes of an attention operand")
            # old axis i -> new axes groups[i]: index = sum(new_j * stride_j)
            def fn(i):
                axes = groups[i]
                sub, stride = [], 1
                for j in reversed(axes):
                    sub.append((stride, j))
                    stride *= new_shape[j]
                return 0, sub
            return ViewMap(self.source, new_shape, self._substitute(fn))
        fail(n, "an unexpected view")

    def box(self, index: dict[int, str], slices: dict[int, tuple[str, str]]):
        """The input box for view indices: `index` maps view axes to int expressions, `slices`
        maps view axes to (start, stop) expressions of a unit-stride range. Returns the index
        text and the view axes of the tile, in the tile's axis order."""
        parts, order = [], []
        for const, lin in self.terms:
            ranged = [(c, i) for c, i in lin if i in slices]
            fixed = [f"{_coef(c)}{_group(index[i]) if c != 1 else index[i]}" for c, i in lin
                     if i in index and index[i] != "0"]
            base = " + ".join(([str(const)] if const else []) + fixed)
            if not ranged:
                parts.append(base or "0")
                continue
            if len(ranged) > 1 or ranged[0][0] != 1:
                raise ValueError("not a unit-stride box")
            start, stop = slices[ranged[0][1]]
            if not base:
                whole = start.endswith(".start") and stop == start[:-6] + ".stop"
                parts.append(start[:-6] if whole else f"{start}:{stop}")
            elif start == "0":
                parts.append(f"{base}:{base} + {stop}")
            else:
                parts.append(f"{base} + {start}:{base} + {stop}")
            order.append(ranged[0][1])
        return ", ".join(parts), order


def part_start(n, out) -> int:
    """Where the result `out` of slice or split `n` starts along the axis it takes a part of."""
    if n.op.name == "slice":
        return n.attrs["start"]
    return sum(n.attrs["sizes"][:[o.name for o in n.outputs].index(out.name)])


def _group(expr: str) -> str:
    return f"({expr})" if " " in expr else expr


def _coef(c: int) -> str:
    return "" if c == 1 else f"{c} * "


def _split_groups(old, new):
    """For a reshape that only splits axes (and adds or drops size-1 axes): the new axes each old
    axis becomes. None when it merges axes."""
    groups, j = [], 0
    for d in old:
        if d == 1:
            if j < len(new) and new[j] == 1:
                groups.append([j])
                j += 1
            else:
                groups.append([])
            continue
        axes, size = [], 1
        while j < len(new) and size < d:
            size *= new[j]
            axes.append(j)
            j += 1
        if size != d:
            return None
        groups.append(axes)
    trailing = list(range(j, len(new)))
    if any(new[t] != 1 for t in trailing) or (trailing and not groups):
        return None
    # trailing size-1 axes (a head dim of 1: [.., H] -> [.., H, 1]) belong to the last axis that
    # has any: left out, a box of the view read them away (the tile one axis short)
    if trailing:
        next((g for g in reversed(groups) if g), groups[-1]).extend(trailing)
    return groups

"""How a contraction reads its activations from a region input, through the prologue's views.

`RowAccess`: free views (the input viewed as rows x K), or a select / slice of rows, and at most
one norm over K (applied after the load). `PermutedAccess`: a permute and a reshape merging the
last axes into K (attention heads merged before the output projection; size-1 axes may come and
go, and a reshape may come before the permute), or a permute alone; contracted as slabs of whole
heads (or tiles of D), read straight from the input's own layout.
"""

from __future__ import annotations


class RowAccess:
    """How the activations are read from their region input: through free views only (the input
    is viewed as rows x K), or through a select/slice of rows (then the box says where)."""

    def __init__(self, base_shape, ops, indexed):
        self.base_shape = base_shape   # the input's shape after the leading free reshapes
        self.ops = ops                 # [(kind, axis, start)] in base axes: "select" or "slice"
        self.indexed = indexed

    @classmethod
    def of(cls, x, chain, a_val, fail):
        shape = tuple(x.type.shape)
        ops, normed = [], False
        cur = list(range(len(shape)))   # base axis of each current axis
        for n in chain:
            op = n.op.name
            if op == "relayout":
                continue
            if op in ("layer_norm", "rms_norm"):
                if normed:
                    fail(n, "two norms in one prologue")
                normed = True
                continue
            if op == "reshape":
                new = tuple(n.outputs[0].type.shape)
                if ops:
                    fail(n, "a reshape after a slice of the activations")
                if normed and (not new or new[-1] != shape[-1]):
                    fail(n, "a reshape that changes the rows a norm works on")
                if not normed:
                    shape = new
                    cur = list(range(len(shape)))
                continue
            axis = n.attrs["axis"] % n.inputs[0].type.rank
            if axis == n.inputs[0].type.rank - 1:
                fail(n, "a slice of the contracted axis")
            if op == "slice":
                if n.attrs["step"] != 1:
                    fail(n, "a strided slice")
                ops.append(("slice", cur[axis], n.attrs["start"]))
            else:
                ops.append(("select", cur[axis], n.attrs["index"]))
                cur.pop(axis)
        if normed and ops and tuple(a_val.type.shape[-1:]) != shape[-1:]:
            fail(chain[-1], "a view that changes the rows")
        return cls(shape, ops, bool(ops))

    def spec_and_index(self, lead, groups, axis_names, loop_vars, k_idx):
        """Spec and box index of the base input, for an un-merged domain (each size>1 axis a group)."""
        selected = {a: i for kind, a, i in self.ops if kind == "select"}
        offset = {a: s for kind, a, s in self.ops if kind == "slice"}
        base_lead = [a for a in range(len(self.base_shape) - 1) if a not in selected]
        g_of = {g[0]: j for j, g in enumerate(groups.groups)}
        shift = len(lead) - len(base_lead)
        spec, idx = [], []
        last = len(groups.groups) - 1
        # a domain of one row (every leading axis size 1): the box keeps its last axis as M's unit axis
        m_unit = base_lead[-1] if base_lead and last not in (g_of.get(i + shift) for i in range(len(base_lead))) \
            else None
        # every leading axis selected away (one vector's row, x[0] @ w.T): the last selected
        # axis is M's unit axis, else the box would have no row axis
        m_selected = max(selected) if selected and not base_lead else None
        for a in range(len(self.base_shape) - 1):
            size = self.base_shape[a]
            if a in selected:
                spec.append(str(size))
                idx.append(f"{selected[a]}:{selected[a] + 1}" if a == m_selected else str(selected[a]))
                continue
            i = base_lead.index(a) + shift
            s = offset.get(a, 0)
            j = g_of.get(i)
            if j is None:    # a size-1 axis of the domain
                spec.append(str(size))
                idx.append(f"{s}:{s + 1}" if a == m_unit else str(s))
            elif j == len(groups.groups) - 1:
                spec.append(f'"{axis_names[j]}"' if a not in offset else str(size))
                idx.append(loop_vars[j] if not s else f"{loop_vars[j]}.start + {s}:{loop_vars[j]}.stop + {s}")
            else:
                spec.append(f'"{axis_names[j]}"' if a not in offset else str(size))
                idx.append(loop_vars[j] if not s else f"{loop_vars[j]} + {s}")
        spec.append('"K"')
        idx.append(k_idx)
        return spec, idx


class PermutedAccess:
    """Activations that are a permute of the region input followed by a reshape merging the last
    axes into K (attention heads (B, H, T, D) -> (B, T, H*D) before the output projection). No
    copy is made: K is contracted as slabs, one per outer merged index (a head) and tile of the
    innermost merged axis (D), each a unit-stride box of the input in its own layout, against
    the matching columns of the weights."""

    indexed = True

    def __init__(self, shape, lead_axes, k_axes):
        self.shape = shape            # the region input's shape
        self.lead_axes = lead_axes    # input axis of each leading axis of the activations
        self.k_axes = k_axes          # input axes merged into K, outer to inner
        self.inner = shape[k_axes[-1]]
        outer = ["H"] if len(k_axes) == 2 else [f"H{i}" for i in range(len(k_axes) - 1)]
        self.k_names = outer + ["D"]
        self.letters = "mk"
        self.whole_heads = False      # K = (H, D) read as slabs of whole heads (set by the tiling)

    @classmethod
    def of(cls, x, chain, fail):
        shape = tuple(x.type.shape)
        cur = list(range(len(shape)))   # input axis of each current axis
        merged, permuted = None, False
        for n in chain:
            op = n.op.name
            if op == "relayout":
                continue
            if op == "reshape" and not permuted:   # before any permute: a free view of the input
                shape = tuple(n.outputs[0].type.shape)
                cur = list(range(len(shape)))
                continue
            if op == "permute" and merged is None:
                permuted = True
                cur = [cur[p] for p in n.attrs["perm"]]
                continue
            if op == "reshape" and merged is None:
                src, new = tuple(n.inputs[0].type.shape), tuple(n.outputs[0].type.shape)
                r = len(new) - 1
                # the last axes merge into K; the leading ones stay, but for axes of size 1
                # (dropped or added: a batch of one, (1, T, H, D) -> (T, H*D))
                j = next((j for j in range(len(src) - 2, -1, -1) if _prod(src[j:]) == new[-1]), None)
                big = [d for d in new[:r] if d != 1]
                if j is None or [d for d in src[:j] if d != 1] != big:
                    fail(n, "a reshape of permuted activations other than merging the last axes into K")
                src_big = iter(a for a, d in zip(cur[:j], src[:j]) if d != 1)
                merged = ([next(src_big) if d != 1 else None for d in new[:r]], cur[j:])
                continue
            fail(n, "a view of permuted activations other than a reshape merging the last axes")
        if merged is None:   # a permute alone: K is the axis that ends last, read in the input's layout
            merged = (cur[:-1], cur[-1:])
        lead, k_axes = merged
        used = [a for a in lead if a is not None] + k_axes
        if len(set(used)) != len(used) or any(shape[a] != 1 for a in range(len(shape)) if a not in used):
            fail(chain[-1], "an unexpected permutation")
        if len(used) == len(shape) and not any(a is not None for a in lead):
            # every axis is K (a vector contracted: one row, M = 1): the input is viewed with a
            # leading axis of one for the row to be read along
            return cls((1,) + shape, [None] * len(lead), [a + 1 for a in k_axes])
        return cls(shape, lead, k_axes)

    def k_loop_vars(self) -> str:
        return ", ".join([n.lower() for n in self.k_names[:-1]] + ["ds"])

    def k_iter(self) -> str:
        outer = [f"range({self.shape[a]})" for a in self.k_axes[:-1]]
        if not outer:
            return f"fl.tiles({self.inner}, tk)"
        if len(outer) == 1:
            return f"[({self.k_names[0].lower()}, ds) for {self.k_names[0].lower()} in {outer[0]} " \
                   f"for ds in fl.tiles({self.inner}, tk)]"
        return f"itertools.product({', '.join(outer)}, fl.tiles({self.inner}, tk))"

    def weight_index(self) -> str:
        if len(self.k_names) == 1:
            return "ds"
        flat = self.k_names[0].lower()
        for a, name in zip(self.k_axes[1:-1], self.k_names[1:-1]):
            flat = f"({flat} * {self.shape[a]} + {name.lower()})"
        base = f"{flat} * {self.inner}"
        return f"{base} + ds.start:{base} + ds.stop"

    def spec_and_index(self, lead, axis_names, loop_vars, batched: bool = False):
        """The input's spec and its box for one slab: leading axes by their loop variables (M,
        the last one of size > 1, by its tile; in a batched matmul the last leading axis is M
        even when it has size 1 and the batch axes before it are not), merged K axes by the K
        loop's."""
        lead = lead or (1,)   # a vector's result: its one row has no axis
        big = [i for i, d in enumerate(lead) if d != 1]
        m_axis = len(lead) - 1 if batched or not big else big[-1]
        group_of = {i: j for j, i in enumerate(a for a in big if a != m_axis)}
        spec, idx = ["1"] * len(self.shape), ["0"] * len(self.shape)   # axes of size 1 the views drop
        # the activations may have fewer leading axes than the result (broadcast batch axes)
        off = len(lead) - len(self.lead_axes)
        if off < 0:
            raise NotImplementedError("activations with more leading axes than the result")
        lead_axes = [None] * off + list(self.lead_axes)
        if lead_axes[m_axis] is None:   # M has size 1 and no axis of its own: the box keeps a unit axis for it
            spare = [a for a in range(len(self.shape)) if a not in lead_axes and a not in self.k_axes]
            if not spare:
                raise NotImplementedError("a row of activations with no axis to read it along")
            lead_axes[m_axis] = spare[0]
        for i, a in enumerate(lead_axes):
            if a is None:
                continue
            if i == m_axis:
                j = len(axis_names) - 1
                spec[a], idx[a] = f'"{axis_names[j]}"' if lead[i] != 1 else "1", loop_vars[j]
            elif i in group_of and self.shape[a] != 1:
                j = group_of[i]
                spec[a], idx[a] = f'"{axis_names[j]}"', loop_vars[j]
            else:   # an axis of one, or one the activations broadcast along the batch
                spec[a], idx[a] = "1", "0"
        for a, name in zip(self.k_axes, self.k_names):
            # the contracted axis binds the weights' K in the tile, so it carries no name of its own
            spec[a] = f'"{name}"' if name != "D" else str(self.inner)
            idx[a] = name.lower() if name != "D" else "ds"
        m_in = lead_axes[m_axis]
        self.letters = "mk" if m_in < self.k_axes[-1] else "km"
        if self.whole_heads:
            h_axis, d_axis = self.k_axes
            spec[h_axis], idx[h_axis], idx[d_axis] = str(self.shape[h_axis]), "hs", ":"
            self.letters = "".join(c for _, c in sorted([(m_in, "m"), (h_axis, "h"), (d_axis, "k")]))
        return spec, idx


def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= x
    return out

"""CompiledModel: the result of a compile. Callable like the model; holds every stage's record."""

from __future__ import annotations

import os


import torch
import torch.utils._pytree as pytree

from fexplore.errors import InputError
from fexplore.ir import Graph, run

from .numeric import to_numpy, to_torch


def lowering_kinds(low) -> dict:
    out: dict[str, int] = {}
    for k in low.kernels:
        out[k.kind] = out.get(k.kind, 0) + 1
    return out


class CompiledModel:
    def __init__(self, records, ingested, options):
        self.stages = list(records)
        self.options = options
        self._ingested = ingested

    @property
    def graph(self) -> Graph:
        """The final stage's graph."""
        return self.stages[-1].after

    def __getitem__(self, name: str):
        """The record of the stage called ``name`` (``cm["fusion"]``)."""
        for r in self.stages:
            if r.name == name:
                return r
        raise KeyError(f"no stage {name!r}; stages are {[r.name for r in self.stages]}")

    @property
    def lowering(self):
        """The lower stage's Lowering (kernels, free views, host ops), or None."""
        rec = next((r for r in self.stages if r.lowering is not None), None)
        return rec.lowering if rec is not None else None

    @property
    def kernels(self) -> list:
        """The lower stage's kernels, in program order: each has .name, .kind, .region (the
        node), .source (kernel-language Python), .how ("generated" or "user"), .kernel. The
        pieces of a split region are kernels here (their .of names the region)."""
        low = self.lowering
        return low.kernels if low is not None else []

    @property
    def exported(self) -> torch.export.ExportedProgram:
        return self._ingested.exported

    def __call__(self, *args, **kwargs):
        """Run on new inputs (same structure as the model's); returns torch tensors in the
        model's output structure."""
        arrays = self._flatten_inputs(args, kwargs)
        outs = run(self.graph, arrays)
        return pytree.tree_unflatten([to_torch(o) for o in outs], self._ingested.out_spec)

    def _flatten_inputs(self, args, kwargs):
        leaves, spec = pytree.tree_flatten((args, kwargs))
        if spec != self._ingested.in_spec:
            raise InputError("inputs do not have the structure the model was compiled with",
                             detail=f"  expected {self._ingested.in_spec}\n  got      {spec}")
        return [to_numpy(x) for x in leaves if isinstance(x, torch.Tensor)]

    # -- reports ---------------------------------------------------------------------------

    @property
    def verification(self):
        """One row per stage: structural check, max abs/rel error against eager, eager's own f32
        error (its distance from an f64 run, the scale the error is judged by), ok."""
        import pandas as pd

        rows = []
        for r in self.stages:
            v = r.verification
            n = v.numeric if v else None
            rows.append({
                "stage": r.name,
                "structural": None if v is None else v.structural_ok,
                "max_abs_err": None if n is None else n.max_abs,
                "max_rel_err": None if n is None else n.max_rel,
                "eager_f32_noise": None if n is None else n.eager_noise,
                "input_sets": None if n is None else n.input_sets,
                "tolerance": None if n is None else n.tolerance,
                "ok": None if v is None else v.ok,
                "nodes": len(r.after.nodes),
                "elapsed_s": r.elapsed_s,
            })
        return pd.DataFrame(rows)

    def summary(self) -> str:
        """A readable account of the compile, for terminals (``fexplore demo`` prints it)."""
        g = self.graph
        lines = [f"compiled @{g.name}: {len(g.inputs)} input(s), {len(g.outputs)} output(s), "
                 f"target {self.options.chip.name}, precision {self.options.precision}"]
        if g.symbols:
            dims = ", ".join(f"{k} in [{lo}, {'inf' if hi is None else hi}]"
                             for k, (lo, hi) in g.symbols.items())
            lines.append(f"symbolic dims: {dims}")
        lines.append("")
        lines.append(f"{'stage':<12}{'nodes':>7}{'time':>10}  {'verification':<46}what changed")
        for r in self.stages:
            v = r.verification.summary() if r.verification else "not verified"
            lines.append(f"{r.name:<12}{len(r.after.nodes):>7}{r.elapsed_s * 1e3:>8.0f}ms  "
                         f"{v:<46}{r.summary}")
        stats = self.stages[-1].stats
        lines.append("")
        cats = ", ".join(f"{k} {v}" for k, v in stats.get("ops_by_category", {}).items())
        lines.append(f"ops by category: {cats}")
        lines.append(f"constants: {stats['constants']} ({stats['constant_bytes'] / 1e6:.2f} MB, "
                     "shared with the model)")
        counts = sorted(g.op_counts().items(), key=lambda kv: -kv[1])
        lines.append("ops: " + ", ".join(f"{k}×{v}" for k, v in counts))
        low = self.lowering
        if low is not None:
            kinds = ", ".join(f"{k} {v}" for k, v in lowering_kinds(low).items())
            lines.append(f"kernels: {len(low.kernels)} ({kinds}); free views: {len(low.free_views)}; "
                         f"host ops: {len(low.host_ops)}"
                         + (" (" + ", ".join(f"{x.op} %{x.node.name}" for x in low.host_ops) + ")"
                            if low.host_ops else ""))
            if low.splits:
                lines.append("split regions: " + ", ".join(f"{x.label} into {len(x.pieces)} pieces"
                                                            for x in low.splits))
            if low.replaced:
                lines.append("user kernels: " + ", ".join(f"{x.name} for {x.label}" for x in low.replaced))
        return "\n".join(lines)

    def save(self, folder: str | os.PathLike, *, report: bool = True) -> str:
        """Write the IR text of every stage, the verification table and each kernel's source
        (``kernels/<name>.py``) into ``folder``, and
        (``report=True``) ``report.html``: every view on one self-contained page."""
        os.makedirs(folder, exist_ok=True)
        for i, r in enumerate(self.stages):
            with open(os.path.join(folder, f"{i:02d}_{r.name}.fx.txt"), "w") as f:
                f.write(str(r.after))
        self.verification.to_csv(os.path.join(folder, "verification.csv"), index=False)
        if self.kernels:
            os.makedirs(os.path.join(folder, "kernels"), exist_ok=True)
            for k in self.kernels:
                with open(os.path.join(folder, "kernels", f"{k.name}.py"), "w") as f:
                    f.write(k.source)
        if report:
            from fexplore.viz.report import write_report  # lazy: rendering is not headless work

            write_report(self, os.path.join(folder, "report.html"))
        return str(folder)

    def __repr__(self) -> str:
        ok = all(r.verification is None or r.verification.ok for r in self.stages)
        return (f"<CompiledModel @{self.graph.name}: {len(self.stages)} stage(s), "
                f"{len(self.graph.nodes)} nodes, verification {'ok' if ok else 'FAILED'}>")

    def _repr_html_(self) -> str:
        try:
            from fexplore.viz.compiled_view import compiled_html
        except ImportError:
            import html

            return f"<pre>{html.escape(self.summary())}</pre>" + self.verification.to_html()
        return compiled_html(self)


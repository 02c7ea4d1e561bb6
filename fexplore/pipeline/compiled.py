"""CompiledModel: the result of a compile. Callable like the model; holds every stage's record."""

from __future__ import annotations

import os


import numpy as np
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


def _structure_mismatch(want, got) -> str:
    """What differs between two (args, kwargs) pytree specs, in the user's terms."""
    head = "inputs do not have the structure the model was compiled with: "
    (want_args, want_kw), (got_args, got_kw) = want.children(), got.children()
    if want_args.num_children != got_args.num_children:
        return (head + f"it takes {want_args.num_children} positional input(s), "
                f"got {got_args.num_children}")
    if list(want_kw.context or []) != list(got_kw.context or []):
        return (head + f"it was compiled with keyword inputs {list(want_kw.context or [])}, "
                f"got {list(got_kw.context or [])}")
    return head + "the nesting of tuples, lists or dicts differs"


class CompiledModel:
    def __init__(self, records, ingested, options, reference=None):
        """``reference``: inputs (flat arrays) -> an oracle of eager on them, against which a
        schedule made on first call for a new size is checked (None: not checked)."""
        self.stages = list(records)
        self.options = options
        self._ingested = ingested
        self._reference = reference
        self.reset_state()

    @property
    def state(self) -> dict:
        """The buffers the model updates in forward (a counter, a static KV cache), by qualified
        name, as the calls so far left them: the compiled model carries them from call to call,
        as the model carries its buffers (which the compile leaves untouched). Empty for a model
        without such buffers."""
        return self._state

    def reset_state(self) -> None:
        """Start again from the buffers' values at compile time."""
        self._state = {k: v.clone() for k, v in getattr(self._ingested, "state", {}).items()}

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

    @property
    def is_onnx(self) -> bool:
        """Whether the model came in through the ONNX door (numpy in, numpy out)."""
        return self._ingested.out_spec is None and hasattr(self._ingested, "frozen")

    def _structure(self, outs, args=(), kwargs=None):
        """Outputs as the model gives them: the torch model's structure (torch tensors), or
        for an ONNX model a list of numpy arrays in the graph's output order. After the model's
        outputs come the new values of the inputs it updates in place, written into the caller's
        tensors as torch's exported program does, then those of the buffers it updates, kept in
        ``state`` for the next call. An output that is an input as given is the caller's tensor
        itself, and one tensor returned twice is one tensor twice (`_aliased`), as eager's are."""
        if self.is_onnx:
            return [np.asarray(o) for o in outs]
        if self._state:   # the buffers' new values come last
            outs, new = outs[:len(outs) - len(self._state)], outs[len(outs) - len(self._state):]
            for name, value in zip(list(self._state), new):
                self._state[name] = to_torch(value).clone()
        updated = self._ingested.input_mutations
        if updated:
            tensors = [x for x in pytree.tree_leaves((args, kwargs or {})) if isinstance(x, torch.Tensor)]
            outs, new = outs[:len(outs) - len(updated)], outs[len(outs) - len(updated):]
            with torch.no_grad():
                for i, value in zip(updated, new):
                    tensors[i].copy_(to_torch(value))
        made = self._aliased([to_torch(o) for o in outs], args, kwargs)
        for i, kind in self._ingested.number_outputs.items():   # a size or constant the model returns
            made[i] = kind(made[i].item())
        return pytree.tree_unflatten(made, self._ingested.out_spec)

    def _aliased(self, outs: list, args, kwargs) -> list:
        """`outs` with the aliasing of eager's outputs that torch's exported program records: an
        output that is a user input itself (the model returned its input untouched) is the
        caller's tensor, not a copy; one tensor returned more than once is one tensor. Read from
        the exported program's signature, not from fexplore's graph: there a ``clone()`` or an
        ``x + 0`` has become the input itself, which eager returns as a new tensor. A view of an
        input (a reshape, a slice, a ``detach()``) is that view of the caller's tensor, made
        again by the exported program's view ops (`aliasing.view_of_input`)."""
        from .aliasing import view_of_input

        from torch.export.graph_signature import InputKind, OutputKind, TensorArgument

        def tensor(arg):   # a number's argument has no name of its own (several share "")
            return arg.name if isinstance(arg, TensorArgument) else None

        sig = self._ingested.exported.graph_signature
        leaves = pytree.tree_leaves((args, kwargs or {}))
        users = [tensor(s.arg) for s in sig.input_specs if s.kind == InputKind.USER_INPUT]
        returned = [tensor(s.arg) for s in sig.output_specs if s.kind == OutputKind.USER_OUTPUT]
        if len(users) != len(leaves) or len(returned) != len(outs):   # not one for one: leave them
            return outs
        given = {name: x for name, x in zip(users, leaves) if name is not None and isinstance(x, torch.Tensor)}
        first: dict[str, int] = {}
        out = list(outs)
        nodes = self._exported_nodes()
        for i, name in enumerate(returned):
            if name in given:
                out[i] = given[name]
            elif name in first:
                out[i] = out[first[name]]
            elif name is not None:
                first[name] = i
                view = view_of_input(nodes, name, given)
                if view is not None and view.shape == out[i].shape and view.dtype == out[i].dtype:
                    out[i] = view
        return out

    def _exported_nodes(self) -> dict:
        """The exported program's nodes by name (made once: `_aliased` reads them every call)."""
        if getattr(self, "_nodes_by_name", None) is None:
            self._nodes_by_name = {n.name: n for n in self._ingested.exported.graph.nodes}
        return self._nodes_by_name

    def __call__(self, *args, **kwargs):
        """Run on new inputs (same structure as the model's) on the simulated NPU (functional
        mode of the whole-model program); returns torch tensors in the model's output structure.
        A compile that stopped before the schedule stage runs the final graph's interpreter."""
        arrays = self._flatten_inputs(args, kwargs)
        call = self.schedules.prepare(arrays) if self.schedules is not None else None
        if call is None or call.made.schedule is None:   # no schedule (e.g. empty tensors): interpreter
            outs = run(self.graph, arrays)
        else:
            outs = call.outputs(call.made.schedule.simulate(call.arrays))
        return self._structure(outs, args, kwargs)

    # -- on the chip -----------------------------------------------------------------------

    @property
    def schedule(self):
        """The schedule stage's whole-model program (`stages.schedule.Schedule`), or None (a
        model with symbolic dims is scheduled per size: see `schedules`)."""
        rec = next((r for r in self.stages if r.schedule is not None), None)
        return rec.schedule if rec is not None else None

    @property
    def schedules(self):
        """The schedules made for this model, one per static size (`chip.Schedules`); None if
        the compile has no schedule stage."""
        if not any(r.name == "schedule" for r in self.stages):
            return None
        if getattr(self, "_schedules", None) is None:
            from .chip import Schedules
            from .stages import GRAPH_STAGE_LIST

            # a size's graph is compiled by this compile's graph stages, when they are the
            # standard ones (an exploration with stages of its own specializes its final graph)
            standard = [(st.name, st.run) for st in GRAPH_STAGE_LIST if st.name not in ("lower", "schedule")]
            names = [r.name for r in self.stages]
            restage = standard if names[1:1 + len(standard)] == [n for n, _ in standard] else ()
            self._schedules = Schedules(self.graph, self.options, self.schedule,
                                        ingested=self.stages[0].after, graph_stages=restage,
                                        reference=self._reference)
            # the schedule stage's view lists the schedules made (for symbolic dims, per size)
            self["schedule"].schedules = self._schedules
        return self._schedules

    @property
    def codegen_bugs(self) -> list[str]:
        """Kernel generators that raised while lowering this model (each such node ran on the host
        instead: right, but not on the chip): the lower stage's, and for symbolic dims those of the
        sizes scheduled so far. Empty when every generator either made its kernel or refused
        clearly."""
        low = self.lowering.codegen_bugs if self.lowering is not None else []
        scheds = self.schedules if any(r.name == "schedule" for r in self.stages) else None
        made = list(scheds._by_size.values()) if scheds is not None else []
        return list(low) + [b for m in made for b in m.codegen_bugs if b not in low]

    def simulate(self, *args, **kwargs):
        """Run on the simulated NPU. With inputs: functional mode, the SimResult's ``outputs``
        are the model's outputs (torch, in its structure) and ``.npu_outputs`` the raw DRAM
        tensors. Without inputs: timing only (for a model with symbolic dims, the first schedule
        made, else pass inputs)."""
        scheds = self._need_schedules()
        if not args and not kwargs:
            made = next(iter(scheds._by_size.values()), None)
            if made is None:
                raise InputError("this model has symbolic dims: pass inputs to pick the size to simulate")
            return made.schedule.simulate()
        arrays = self._flatten_inputs(args, kwargs)
        call = scheds.prepare(arrays)
        if call.made.schedule is None:
            raise InputError(f"nothing to simulate for these inputs: {call.made.why}")
        res = call.made.schedule.simulate(call.arrays)
        outs = call.outputs(res)
        res.model_outputs = self._structure(outs, args, kwargs)
        return res

    @property
    def timeline(self):
        """The timeline of the whole-model program (timing only; cached)."""
        if getattr(self, "_timing", None) is None:
            self._timing = self.simulate()
        return self._timing.timeline

    def report(self, *inputs):
        """One row per kernel (and host op): kind, module, source line, cycles, share of the
        total, flops, DRAM bytes, what bounds it and how far it is from its roofline."""
        from .chip import kernel_report

        scheds = self._need_schedules()
        if inputs:
            made = scheds.for_inputs(self._flatten_inputs(inputs, {}))
            res = made.schedule.simulate()
        else:
            res = self.simulate() if getattr(self, "_timing", None) is None else self._timing
            self._timing = res
            made = next(iter(scheds._by_size.values()))
        return kernel_report(made.schedule, res)

    def costs(self):
        """Simulated latency and DRAM traffic after every stage (each stage's output lowered and
        scheduled on the target), with the change each stage made: a table, and with
        ``fexplore.viz.timeline.cost_waterfall(cm.costs())`` a waterfall chart."""
        from .chip import stage_costs

        return stage_costs(self.stages, self.options)

    def _need_schedules(self):
        if self.schedules is None:
            raise InputError("this compile has no schedule stage", hint="compile with every stage")
        return self.schedules

    def _flatten_inputs(self, args, kwargs):
        if self.is_onnx:
            return self._onnx_inputs(args, kwargs)
        order = self._ingested.in_spec.children()[1].context or []
        if set(kwargs) == set(order):   # keywords in any order, as Python takes them
            kwargs = {k: kwargs[k] for k in order}
        leaves, spec = pytree.tree_flatten((args, kwargs))
        if spec != self._ingested.in_spec:
            raise InputError(_structure_mismatch(self._ingested.in_spec, spec),
                             detail=f"  expected {self._ingested.in_spec}\n  got      {spec}",
                             hint="call it as you called the model for the compile: the same "
                                  "number of arguments, the same nesting, the same keywords")
        self._check_size_relations(args, kwargs)
        tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
        if any(x.is_meta for x in tensors):
            raise InputError("meta tensors have shapes but no values: there is nothing to compute with",
                             hint="cm.simulate() with no inputs runs timing only; give real tensors to run")
        return [to_numpy(x) for x in tensors] + [to_numpy(v) for v in self._state.values()]

    def _check_size_relations(self, args, kwargs) -> None:
        """Refuse sizes that break a guard torch's trace relies on over several of them, as its
        exported program does (``x[:, :y.shape[1]]`` is traced for y no wider than x)."""
        ing = self._ingested
        if not ing.size_relations or ing.signature is None:
            return
        from .symbols import broken_relation

        try:
            named = ing.signature.bind(*args, **kwargs).arguments
        except TypeError:
            return   # the structure check above speaks for a call of another shape
        broken = broken_relation(ing.size_relations, named)
        if broken is not None:
            raise InputError(f"these input sizes break {broken}, which the traced program relies on",
                             hint="torch.export recorded it while tracing (its exported program "
                                  "refuses these sizes too); call with sizes that meet it, or "
                                  "export with examples that show the sizes you will use")

    def _onnx_inputs(self, args, kwargs):
        from .onnx import check_frozen

        ing = self._ingested
        if kwargs:
            raise InputError("an ONNX model takes its inputs by position",
                             hint=f"pass {len(ing.input_names)} numpy arrays in the graph's "
                                  f"input order: {', '.join(ing.input_names)}")
        arrays = [to_numpy(a) if isinstance(a, torch.Tensor) else np.asarray(a) for a in args]
        if len(arrays) != len(ing.input_names):
            raise InputError(f"the model takes {len(ing.input_names)} inputs "
                             f"({', '.join(ing.input_names)}), got {len(arrays)}")
        check_frozen(ing, arrays)
        return arrays

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
        """Write the IR text of every stage, the verification table, each kernel's source
        (``kernels/<name>.py``), the per-kernel report (``report.csv``) and the simulated
        timeline (``trace.json``, Perfetto) into ``folder``, and
        (``report=True``) ``report.html``: every view on one self-contained page."""
        os.makedirs(folder, exist_ok=True)
        for i, r in enumerate(self.stages):
            with open(os.path.join(folder, f"{i:02d}_{r.name}.fx.txt"), "w") as f:
                f.write(str(r.after))
        self.verification.to_csv(os.path.join(folder, "verification.csv"), index=False)
        if self.schedule is not None:
            self.report().to_csv(os.path.join(folder, "report.csv"), index=False)
            self.timeline.to_perfetto(os.path.join(folder, "trace.json"))
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


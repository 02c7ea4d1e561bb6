"""Orchestration: ``compile()`` and ``explore()``.

An Exploration holds the model, the options, and the stage records made so far; ``step()`` runs the
next stage. ``compile()`` is an Exploration run to the end. The first stage, ``ingest``, turns the
model into a graph; the graph stages after it run through the pass manager, whose hook verifies
each one (structure, then numbers against PyTorch eager).
"""

from __future__ import annotations

import dataclasses
import time
import torch

from fexplore.errors import ConfigError, ExportError, FexploreError, NumericMismatchError, VerificationError, VerificationMemoryError
from fexplore.ir import DType, verify
from fexplore.npu.errors import CompileMemoryError, SimulationMemoryError

from .compiled import CompiledModel
from .export import export_model, real_state
from .ingest import Ingested, ingest
from .numeric import (AsPureFunction, KeywordCall, Oracle, check_graph, compare_with_oracle, compute_dtype,
                      first_divergent_from_export, output_tensors, shapes_at_another_size, to_numpy, to_torch,
                      tolerance_of)
from .options import CompileOptions
from .passmanager import PassManager
from .stage import Stage, StageRecord, Verification, graph_stats

from .stages import GRAPH_STAGE_LIST
from .stages.lower import check_lowering
from .stages.schedule import check_schedule

# The graph stages after ingestion, in DESIGN.md's order.
GRAPH_STAGES: list[Stage] = list(GRAPH_STAGE_LIST)

# The options ingestion and every stage's check depend on: torch.export's dims; the oracle's input
# sets (seed, random_input_sets); whether there are checks at all. A fork changing one shares no
# stage. (The oracle's precision policy noise is rebuilt by a fork that changes the precision.)
INGEST_READS = frozenset({"dynamic_shapes", "seed", "random_input_sets", "verify"})


class Exploration:
    """A compile you can step through: ``step()``, ``run_all()``, ``ex["ingest"]``, ``result``."""

    def __init__(self, model, example_inputs, options: CompileOptions,
                 stages: list[Stage] | None = None, example_kwargs: dict | None = None):
        from .onnx.importer import is_onnx_model

        # the second front door: an onnx.ModelProto or a path to a .onnx file
        self.is_onnx = is_onnx_model(model)
        if not self.is_onnx and not isinstance(model, torch.nn.Module):
            raise FexploreError(f"expected a torch.nn.Module, got {type(model).__name__}",
                                hint="pass the model object itself, e.g. fexplore.compile(model, "
                                     "(x,)), or an ONNX model (an onnx.ModelProto or a path to a "
                                     ".onnx file)")
        self.model = model
        self.example_inputs = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) \
            else (example_inputs,)
        # keyword inputs, as torch.export takes them; eager runs (the oracle's) call the model
        # through KeywordCall with them as a last positional dict, so the flat inputs are the
        # positional ones' then theirs, as the exported program orders them
        self.example_kwargs = dict(example_kwargs or {})
        if self.is_onnx:
            if self.example_kwargs:
                raise FexploreError("an ONNX model's inputs are positional, in the graph's input order",
                                    hint="pass them as example_inputs")
            self.example_inputs = tuple(_as_numpy(x) for x in self.example_inputs)
        self.options = options
        self.graph_stages = list(GRAPH_STAGES if stages is None else stages)
        self.records: list[StageRecord] = []
        self.shared = 0   # of the records, how many a fork took from its parent (see fork)
        self._ingested: Ingested | None = None
        self._oracle: Oracle | None = None
        self._result: CompiledModel | None = None
        self._pm = PassManager(self.graph_stages, hooks=[self._verify_hook])
        # A model on the meta device (or meta inputs) has shapes and no values: it compiles with
        # structural verification only and simulates timing-only.
        leaves = [x for x in torch.utils._pytree.tree_leaves(self._call_example) if isinstance(x, torch.Tensor)]
        self.meta = not self.is_onnx and \
            any(t.is_meta for t in list(model.parameters()) + list(model.buffers()) + leaves)

    @property
    def _call_example(self) -> tuple:
        """The example inputs as eager runs take them: the positional ones, then the keyword
        ones as one dict (see `_eager`)."""
        return self.example_inputs + ((self.example_kwargs,) if self.example_kwargs else ())

    def _eager(self, model):
        """``model`` called as `_call_example` holds its inputs."""
        return KeywordCall(model) if self.example_kwargs else model

    # -- stepping --------------------------------------------------------------------------

    @property
    def stage_names(self) -> list[str]:
        return ["ingest"] + [s.name for s in self.graph_stages]

    @property
    def done(self) -> bool:
        return len(self.records) == len(self.stage_names)

    def step(self) -> StageRecord:
        """Run the next stage and return its record (it renders itself in a notebook)."""
        if self.done:
            raise FexploreError("every stage has run", hint="see ex.result or ex.records")
        name = self.stage_names[len(self.records)]
        try:
            if not self.records:
                rec = self._ingest()
            else:
                stage = self.graph_stages[len(self.records) - 1]
                rec = self._pm.run_stage(stage, self.records[-1].after, self.options, self.records[-1].lowering)
        except MemoryError as e:   # the stage itself, not its check (FX303 says that): nothing recorded
            chip = getattr(self.options.target, "name", self.options.target)
            raise CompileMemoryError(
                f"stage '{name}' ran out of memory ({_first_line(e) or 'MemoryError'})",
                hint=f"compile a smaller configuration (fewer layers, a smaller input) or for a chip "
                     f"with more SRAM per PE than {chip!r}; the exploration stays at the stage "
                     f"before") from None
        self.records.append(rec)
        return rec

    def run_all(self, *, progress: bool = True) -> "Exploration":
        """Run every remaining stage. ``progress`` shows a tqdm bar (a widget in notebooks, stderr
        in terminals) once the compile has taken more than a moment."""
        if not progress:
            while not self.done:
                self.step()
            return self
        from tqdm.auto import tqdm  # lazy: only a long compile needs it

        with tqdm(total=len(self.stage_names), initial=len(self.records), unit="stage",
                  desc="fexplore", delay=0.5) as bar:
            while not self.done:
                bar.set_postfix_str(self.stage_names[len(self.records)])  # the stage now running
                self.step()
                if not self.done:
                    bar.set_postfix_str(self.stage_names[len(self.records)], refresh=False)
                bar.update(1)
        return self

    def __getitem__(self, name: str) -> StageRecord:
        if name not in self.stage_names:
            raise KeyError(f"no stage {name!r}; stages are {self.stage_names}")
        while not any(r.name == name for r in self.records):
            self.step()
        return next(r for r in self.records if r.name == name)

    @property
    def result(self) -> CompiledModel:
        if self._result is None:
            self.run_all()
            first_bad = next((r for r in self.records
                              if r.verification is not None and not r.verification.ok), None)
            if first_bad is not None:
                _raise_failed(first_bad)
            self._result = CompiledModel(self.records, self._ingested, self.options,
                                         reference=self._oracle_at if self._checks_sizes() else None)
        return self._result

    def fork(self, **changes) -> "Exploration":
        """The same model and inputs compiled with some options changed (``target``,
        ``precision``, ``pe_fusion``, ...): the stages already run that read none of the changed
        options are shared with this exploration (`Stage.reads`), not run again, and the fork
        steps on from the first one that does. ``ex.fork(precision="bf16")`` after ``fusion``
        starts at the precision stage; ``ex.fork(target="tiny")`` at layout. This exploration is
        left as it was."""
        try:
            options = self.options.replace(**changes)
        except TypeError:
            known = ", ".join(f.name for f in dataclasses.fields(CompileOptions))
            raise ConfigError(f"fork() takes compile options; got {', '.join(sorted(changes))}",
                              hint=f"the options are {known}") from None
        changed = {name for name in changes if _differs(name, self.options, options)}
        shared = 0
        if not changed & INGEST_READS:
            for rec, reads in zip(self.records, [frozenset()] + [s.reads for s in self.graph_stages]):
                if reads is None or changed & reads:
                    break
                shared += 1
        fork = Exploration.__new__(Exploration)
        fork.__dict__.update(self.__dict__)
        fork.options = options
        fork.records = [dataclasses.replace(r, options=options, schedules=None) for r in self.records[:shared]]
        fork.shared = shared
        fork._ingested = self._ingested if shared else None
        # the oracle measures eager's error under the precision policy (its policy noise)
        fork._oracle = self._oracle if shared and "precision" not in changed else None
        fork._result = None
        fork._pm = PassManager(fork.graph_stages, hooks=[fork._verify_hook])
        return fork

    def __repr__(self) -> str:
        done = [r.name for r in self.records]
        todo = self.stage_names[len(done):]
        forked = f" ({self.shared} shared with the exploration it was forked from)" if self.shared else ""
        return f"<Exploration done={done} next={todo}{forked}>"

    # -- views (rendering lives in fexplore.viz, imported only when asked for) -------------

    def overview(self, *, costs: bool = False):
        """A pandas DataFrame: one row per stage (done, next or pending), what it changed, key
        statistics, verification and time; ``costs=True`` adds each stage's simulated latency
        and DRAM traffic on the target (its output lowered and scheduled: a few seconds)."""
        from fexplore.viz.exploration_view import overview_frame

        return overview_frame(self, costs=costs)

    def costs(self):
        """Simulated latency and DRAM traffic of every stage's output program run so far (each
        lowered and scheduled on the target): what each stage bought on the chip."""
        from .chip import stage_costs

        return stage_costs(self.records, self.options)

    def widget(self, view: str = "graph"):
        """An ipywidgets stepper: pick a stage, step back and forth, switch views ("diff",
        "graph", "IR", "stats", "pipeline"). Runs the first stage if nothing has run yet."""
        from fexplore.viz.stepper import Stepper

        return Stepper(self, view=view)

    def _repr_html_(self) -> str:
        from fexplore.viz.exploration_view import exploration_html

        return exploration_html(self)

    # -- stages ----------------------------------------------------------------------------

    def _ingest(self) -> StageRecord:
        if self.is_onnx:
            return self._ingest_onnx()
        t0 = time.perf_counter()
        with _model_untouched(self.model):
            ep = export_model(self.model, self.example_inputs, kwargs=self.example_kwargs,
                              dynamic_shapes=self.options.dynamic_shapes)
            t_export = time.perf_counter() - t0
            self._ingested = ingest(ep, dynamic_shapes=self.options.dynamic_shapes,
                                    forward=self.model.forward, values=real_state(self.model))
        elapsed = time.perf_counter() - t0
        g = self._ingested.graph
        stats = {**graph_stats(g), "export_s": t_export, "convert_s": elapsed - t_export}
        rec = StageRecord("ingest", None, g, stats, [], None, elapsed,
                          f"{stats['nodes']} nodes, {stats['constants']} constants "
                          f"({stats['constant_bytes'] / 1e6:.2f} MB, shared with the model)",
                          options=self.options)
        self._verify_hook(rec)
        return rec

    def _ingest_onnx(self) -> StageRecord:
        from .onnx import ingest_onnx

        if self.options.dynamic_shapes is not None:
            raise FexploreError(
                "dynamic_shapes is for torch models; an ONNX model's dynamic dims are its inputs' "
                "dim_param dims", hint="export the model with symbolic dims (torch.onnx.export("
                "..., dynamic_shapes=...)) and compile without dynamic_shapes")
        t0 = time.perf_counter()
        self._ingested = ingest_onnx(self.model, self.example_inputs)
        elapsed = time.perf_counter() - t0
        g = self._ingested.graph
        stats = {**graph_stats(g), "convert_s": elapsed, "source": "onnx",
                 "opset": self._ingested.opset,
                 "frozen_inputs": list(self._ingested.frozen_names)}
        summary = (f"{stats['nodes']} nodes, {stats['constants']} constants "
                   f"({stats['constant_bytes'] / 1e6:.2f} MB) from ONNX opset "
                   f"{self._ingested.opset}")
        if self._ingested.notes:
            summary += "; " + "; ".join(self._ingested.notes)
        rec = StageRecord("ingest", None, g, stats, [], None, elapsed, summary,
                          options=self.options)
        self._verify_hook(rec)
        return rec

    def _first_divergent_from_export(self, g):
        """The first op where the ingested graph leaves torch's exported program, on the example
        inputs and then on each of the oracle's random sets (a tie among equal values, say, may
        show on a random set only)."""
        tol = tolerance_of(g, self._oracle)
        sets = (self._input_leaves(k) for k in range(len(self._oracle.input_sets)))
        return next((d for d in (first_divergent_from_export(self._ingested, s, tol) for s in sets) if d), None)

    def _input_leaves(self, k: int) -> list:
        """The program's flat inputs on the oracle's input set ``k`` (0: the example inputs
        themselves): the model's input leaves, then the buffers it updates (the graph's last
        inputs; their values the oracle's)."""
        leaves = torch.utils._pytree.tree_leaves(self._call_example) + list(self._ingested.state.values())
        if k == 0:
            return leaves
        fresh = iter(self._oracle.input_sets[k])
        return [to_torch(next(fresh)) if isinstance(x, torch.Tensor) else x for x in leaves]

    def _export_misses_eager(self, g) -> bool:
        """Whether torch's exported program itself, run by torch, misses eager on one of the
        oracle's input sets: when ingest agrees with it op by op, the difference is torch's (an op
        its decomposition computes otherwise than its eager kernel), not fexplore's. Only asked
        of a model that updates no inputs and no state: its outputs are then the program's."""
        ing = self._ingested
        if ing.input_mutations or ing.state:
            return False
        spec = torch.utils._pytree.tree_structure(self._call_example)
        program = self._eager(ing.exported.module())
        for k in range(len(self._oracle.input_sets)):
            args = torch.utils._pytree.tree_unflatten(self._input_leaves(k), spec)
            try:
                with torch.no_grad():
                    out = program(*args)
            except Exception:  # noqa: BLE001 - a program torch cannot rerun says nothing either way
                return False
            got = [to_numpy(t) for t in output_tensors(out)]
            if not compare_with_oracle(g, self._oracle, k, got)[2]:
                return True
        return False

    def _make_oracle(self, example=None, state=None):
        """The oracle of the stages' checks: eager on the example inputs and the random sets. With
        `example` (inputs at a size the compile scheduled on first call), eager on those alone,
        and for a model that updates its buffers, from `state` (the values the compiled model
        carries into that call; default the model's own)."""
        fresh = example is None
        example = self._call_example if fresh else example
        random_sets = self.options.random_input_sets if fresh else 0
        if self.is_onnx:
            from .onnx.oracle import OnnxOracle

            return OnnxOracle(self._ingested, example, random_sets=random_sets, seed=self.options.seed)
        # the twin's exact narrow ops (a dispatch mode: a Python call per op) only where the model
        # computes in f16/bf16; elsewhere they would change nothing
        g = self._ingested.graph
        narrow = compute_dtype(g) in (DType.f16, DType.bf16)
        examples = [tuple(x.shape) for x in torch.utils._pytree.tree_leaves(example)
                    if isinstance(x, torch.Tensor)] + [tuple(v.shape) for v in self._ingested.state.values()]
        resized = shapes_at_another_size(g, examples) if random_sets else None
        if resized is not None and not self._sizes_meet_relations(resized):
            resized = None   # the other size breaks a guard over several sizes: not one to check at
        model = self._eager(self.model)
        ing = self._ingested
        if ing.input_mutations or ing.state:
            model = AsPureFunction(model, ing.input_mutations, list(ing.state))
            if ing.state:   # the buffers' values as they are now: the graph's last inputs
                values = list(state) if state is not None else [v.clone() for v in ing.state.values()]
                example = tuple(example) + (values,)
        with _model_untouched(self.model):
            return Oracle(model, example,
                          random_sets=random_sets, seed=self.options.seed,
                          precision=self.options.precision, exact_narrow=narrow, resized=resized)

    def _oracle_at(self, arrays):
        """`_make_oracle` on a call's inputs (flat arrays, as the compiled model runs them: its
        tensor inputs, then the values of the buffers it carries): the reference a schedule made
        for their size on first call is checked against. A model that updates its inputs runs on
        copies; one that updates its buffers runs from the carried values, so the check sees
        the call the program makes (a decode step on the cache the prefill wrote)."""
        spec = torch.utils._pytree.tree_structure(self._call_example)
        given = iter(arrays)
        leaves = [next(given) if self.is_onnx else to_torch(next(given)) if isinstance(x, torch.Tensor) else x
                  for x in torch.utils._pytree.tree_leaves(self._call_example)]
        state = [to_torch(a) for a in given] if getattr(self._ingested, "state", None) else None
        return self._make_oracle(torch.utils._pytree.tree_unflatten(leaves, spec), state)

    def _checks_sizes(self) -> bool:
        """Whether a schedule made on first call for a new size is checked against eager: when the
        compile verifies and has values."""
        return bool(self.options.verify and not self.meta and self._ingested is not None)

    def _sizes_meet_relations(self, shapes) -> bool:
        """Whether tensor inputs of these shapes meet torch's guards over several sizes."""
        from .symbols import broken_relation

        ing = self._ingested
        if not ing.size_relations or ing.signature is None:
            return True
        shapes = iter(shapes)
        leaves, spec = torch.utils._pytree.tree_flatten((self.example_inputs, self.example_kwargs))
        sized = [torch.empty(next(shapes), device="meta") if isinstance(x, torch.Tensor) else x
                 for x in leaves]
        args, kwargs = torch.utils._pytree.tree_unflatten(sized, spec)
        named = ing.signature.bind(*args, **kwargs).arguments
        return broken_relation(ing.size_relations, named) is None

    def _verify_hook(self, rec: StageRecord) -> None:
        if not self.options.verify:
            return
        try:
            self._verify(rec)
        except (MemoryError, SimulationMemoryError) as e:   # the check could not run: no verdict
            why = e.message if isinstance(e, SimulationMemoryError) else (_first_line(e) or "MemoryError")
            raise VerificationMemoryError(
                f"stage '{rec.name}': its check ran out of memory ({why})",
                hint="verify a smaller configuration of the model, or pass random_input_sets=0; "
                     "compile(..., verify=False) skips the checks") from None

    def _verify(self, rec: StageRecord) -> None:
        try:
            verify(rec.after, stage=rec.name)
            structural = (True, None)
        except VerificationError as e:
            structural = (False, str(e))
        numeric = None
        if structural[0] and self.meta:
            rec.verification = Verification(True, None, None, None)
            return
        if structural[0]:
            if self._oracle is None:
                self._oracle = self._make_oracle()
            numeric = check_graph(rec.after, self._oracle, before=rec.before)
            if not numeric.ok and rec.name == "ingest" and self._ingested is not None and not self.is_onnx:
                numeric.first_divergent = self._first_divergent_from_export(rec.after)
                if numeric.first_divergent is None:
                    numeric.export_differs = self._export_misses_eager(rec.after)
        kernels = None
        if structural[0] and rec.schedule is not None:
            kernels = check_schedule(rec.after, rec.schedule, self._oracle)
        elif structural[0] and rec.lowering is not None:
            kernels = check_lowering(rec.after, rec.lowering, self._oracle)
        rec.verification = Verification(structural[0], structural[1], numeric, kernels)


def _differs(name: str, old: CompileOptions, new: CompileOptions) -> bool:
    """Whether option ``name`` differs: a target by its chip ("rngd" is the rngd preset); a value
    that cannot be compared (torch.export Dims) is taken to differ unless it is the same object."""
    if name == "target":
        return old.chip != new.chip
    a, b = getattr(old, name), getattr(new, name)
    if a is b:
        return False
    try:
        return bool(a != b)
    except Exception:  # noqa: BLE001 - an object without a truthful ==
        return True


def _as_numpy(x):
    """An ONNX model's example input: numpy arrays (a torch tensor is taken as its values)."""
    import numpy as np

    if isinstance(x, torch.Tensor):
        from .numeric import to_numpy

        return to_numpy(x)
    return np.asarray(x)


def _first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else ""


def _raise_failed(rec: StageRecord):
    v = rec.verification
    if not v.structural_ok:
        raise VerificationError(f"stage '{rec.name}' produced invalid IR",
                                detail=v.structural_error)
    k = v.kernels
    if k is not None and not k.ok and (v.numeric is None or v.numeric.ok):
        where = f"; first divergent: {k.first_divergent}" if k.first_divergent else ""
        raise NumericMismatchError(
            f"stage '{rec.name}': the lowered program run the chip way is wrong: {k.detail}{where}",
            hint="cm.kernels / the lower stage's view show each kernel's source; a user kernel "
                 "registered with fexplore.register_kernel is checked like a generated one")
    n = v.numeric
    if n.export_differs:
        raise ExportError(
            f"torch.export's program of the model computes different numbers from the model: {n.detail}",
            hint="fexplore compiles the program torch.export gives (decomposed to core ATen), and "
                 "ingest agrees with it op by op: torch's decomposition of an op differs from its eager "
                 "kernel here (torch.linspace's, say). Compute that value another way, or pass "
                 "verify=False to take the exported program's numbers")
    where = f"; first divergent node: {n.first_divergent}" if n.first_divergent else ""
    raise NumericMismatchError(
        f"stage '{rec.name}' changed the model's numbers: {n.detail}{where}",
        hint="explore the compile (fexplore.explore) to see this stage's diff; "
             "compile(..., verify=False) skips the checks")


class _model_untouched:
    """Restores every module's training flag, whatever export or the oracle did; the user's
    parameters are never written (constants share their storage read-only)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def __enter__(self):
        self.flags = [(m, m.training) for m in self.model.modules()]

    def __exit__(self, *exc):
        for m, flag in self.flags:
            m.training = flag
        return False


def explore(model, example_inputs, *, target="rngd", dynamic_shapes=None, precision="fp32",
            verify=True, example_kwargs=None, **extra) -> Exploration:
    """An Exploration of compiling ``model``: nothing runs until you step. ``example_kwargs``:
    keyword inputs (``model(*example_inputs, **example_kwargs)``), as torch.export takes them;
    the compiled model is then called with the same keywords."""
    options = CompileOptions(target=target, dynamic_shapes=dynamic_shapes, precision=precision,
                             verify=verify, **extra)
    return Exploration(model, example_inputs, options, example_kwargs=example_kwargs)


def compile(model, example_inputs, *, target="rngd", dynamic_shapes=None, precision="fp32",
            verify=True, example_kwargs=None, **extra) -> CompiledModel:
    """Compile ``model`` through every stage, verifying each; returns a CompiledModel."""
    return explore(model, example_inputs, target=target, dynamic_shapes=dynamic_shapes,
                   precision=precision, verify=verify, example_kwargs=example_kwargs, **extra).result


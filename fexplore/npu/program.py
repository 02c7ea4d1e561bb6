"""A built command program: commands in program order, bound to one chip config.

Program order is the meaning (the functional result is the result of running the commands in
order); dependencies (inferred hazards, SRAM reuse, explicit ones) say what may overlap. Building
also fixes every buffer's SRAM address and every command's cost on the target, so simulating the
same program again only replays the event loop.

`str(program)` is a readable listing, one command per line.
"""

from __future__ import annotations

from collections import Counter

from fexplore.npu import cost
from fexplore.npu.commands import (DMA, ENGINES, NO_ENGINE, Buffer, Command, Contract, DramTensor, Gather,
                                   Host, Load, Scatter, Store, Transpose, Vector)
from fexplore.npu.config import NPUConfig
from fexplore.npu.sram import Allocation


class Program:
    """Immutable once built. Build one with `ProgramBuilder`."""

    def __init__(self, name: str, target: NPUConfig, commands: list[Command], buffers: list[Buffer],
                 tensors: dict[str, DramTensor], allocation: Allocation):
        self.name = name
        self.target = target
        self.commands = tuple(commands)
        self.buffers = tuple(buffers)
        self.tensors = dict(tensors)
        self.allocation = allocation
        self._precompute()

    # ---- what the simulator needs, as flat lists of plain numbers ------------------------------
    def _precompute(self) -> None:
        cfg = self.target
        n = len(self.commands)
        self.queue_of = [-1] * n       # engine queue (pe * 3 + engine), -1 for syncs
        self.position = [0] * n        # index within its queue
        self.duration = [0] * n        # cycles (DMA: start-up only; the transfer is simulated)
        self.moved_bytes = [0] * n     # DMA bytes after 256-byte rounding
        self.dependents: list[list[int]] = [[] for _ in range(n)]
        self.queues: list[list[int]] = [[] for _ in range(cfg.num_pes * len(ENGINES))]
        self.buffer_users: list[list[int]] = [[] for _ in self.buffers]
        for c in self.commands:
            i = c.id
            for d in c.deps:
                self.dependents[d].append(i)
            for buf in dict.fromkeys(c.reads + c.writes):
                self.buffer_users[buf.id].append(i)
            if c.engine == NO_ENGINE:
                continue
            q = c.pe * len(ENGINES) + c.engine
            self.queue_of[i] = q
            self.position[i] = len(self.queues[q])
            self.queues[q].append(i)
            if isinstance(c, Host):  # the host link and the host, not DRAM bandwidth
                self.duration[i] = cost.host_cycles(c, cfg)
            elif c.engine == DMA and c.ref.tensor.resident:   # on-chip copy: no DRAM traffic
                self.duration[i] = cost.onchip_copy_cycles(c.ref, cfg)
            elif c.engine == DMA:
                self.duration[i] = cfg.dma_startup_cycles
                self.moved_bytes[i] = cost.dma_command_bytes(c, cfg)
            elif isinstance(c, Contract):
                self.duration[i] = cost.contract_cycles(c, cfg)
            elif isinstance(c, Transpose):
                self.duration[i] = cost.transpose_cycles(c, cfg)
            else:
                self.duration[i] = cost.vector_cycles(c, cfg)
        self.num_deps = [len(c.deps) for c in self.commands]

    # ---- figures the roofline and reports use ---------------------------------------------------
    @property
    def inputs(self) -> dict[str, DramTensor]:
        return {k: t for k, t in self.tensors.items() if t.kind == "input"}

    @property
    def outputs(self) -> dict[str, DramTensor]:
        return {k: t for k, t in self.tensors.items() if t.kind == "output"}

    @property
    def flops(self) -> int:
        return sum(2 * c.macs for c in self.commands if isinstance(c, Contract))

    def tensor_bound_cycles(self) -> float:
        """Contraction work at the chip's peak rate for each command's dtype, all PEs busy."""
        cfg = self.target
        return sum(c.macs / (cfg.macs_per_cycle(c.dtype) * cfg.num_pes)
                   for c in self.commands if isinstance(c, Contract))

    def vector_bound_cycles(self) -> float:
        cfg = self.target
        return sum(c.elements * c.op.passes for c in self.commands
                   if isinstance(c, Vector)) / (cfg.vector_lanes * cfg.num_pes)

    def compulsory_bytes(self) -> int:
        """Each input the program reads, read once; each output it writes, written once (of a
        tensor only gathered from, the rows picked; only scattered into, the rows written). Scratch
        (an intermediate a schedule put in DRAM) is not compulsory: another schedule keeps it on
        chip, so counting it would flatter every ratio against the bound; nor is reading back an
        output the program wrote."""
        # the storages of inputs and of results (a result may be a view of a tensor the program
        # computes under another name: a reshape that moves no data; or of an input it updates)
        inputs = {t.storage for t in self.tensors.values() if t.kind == "input"}
        results = {t.storage for t in self.tensors.values() if t.returned}

        def at(t, ends) -> bool:
            return not t.resident and t.storage in ends

        read = {c.src.tensor.storage for c in self.commands if isinstance(c, Load) and at(c.src.tensor, inputs)}
        written = {c.dst.tensor.storage for c in self.commands if isinstance(c, Store) and at(c.dst.tensor, results)}
        # a gather reads only the rows it picks (an embedding table); a scatter writes only its rows
        # (a cache updated in place: the step's new rows are what it must write)
        picked: dict[tuple[str, str], int] = {}
        for c in self.commands:
            if isinstance(c, Gather) and at(c.src.tensor, inputs) and c.src.tensor.storage not in read:
                key = (c.src.tensor.storage, "read")
            elif isinstance(c, Scatter) and at(c.dst.tensor, results) and c.dst.tensor.storage not in written:
                key = (c.dst.tensor.storage, "written")
            else:
                continue
            picked[key] = picked.get(key, 0) + c.nbytes
        return sum(self.tensors[n].nbytes for n in read) + sum(self.tensors[n].nbytes for n in written) + \
            sum(min(b, self.tensors[n].nbytes) for (n, _), b in picked.items())

    def stats(self) -> dict:
        kinds = Counter(c.kind for c in self.commands)
        return {"commands": len(self.commands), **kinds, "buffers": len(self.buffers),
                "flops": self.flops, "dram_bytes_moved": sum(self.moved_bytes),
                "compulsory_bytes": self.compulsory_bytes(), "sram_peak": list(self.allocation.peak)}

    # ---- running ------------------------------------------------------------------------------
    def simulate(self, inputs=None, *, functional: bool | None = None):
        """Run on the simulated chip; see `fexplore.npu.simulate`."""
        from fexplore.npu.simulator import simulate

        return simulate(self, inputs, functional=functional)

    # ---- text ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.commands)

    def __str__(self) -> str:
        lines = [f"program {self.name} on {self.target.name}:"]
        for t in self.tensors.values():
            lines.append(f"  {t!r}")
        for b in self.buffers:
            off = self.allocation.offset[b.id]
            where = f"@{off:#x}" if off >= 0 else "(unused)"
            lines.append(f"  sram {b!r} {where}")
        lines.extend(f"  {c}" for c in self.commands)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<Program {self.name!r} on {self.target.name}: {len(self.commands)} commands>"

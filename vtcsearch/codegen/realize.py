"""Realization: a graph and a valid strategy -> an executable that runs it with virtual tensors.

Every physical tensor gets a storage (parameters and buffers are the module's
own tensors, so a KV cache is updated in place; user inputs get static buffers
the call copies into; intermediates are allocated once, lazily, so a tensor
that lives only inside a fused kernel never gets memory).  Every virtual
tensor is an :class:`~vtcsearch.codegen.kernels.Operand` over those storages.  Then the
graph's steps (:mod:`vtcsearch.core.fusion`) become launches:

* a kernel group -> its lowering (:mod:`vtcsearch.codegen.lowering`): Triton templates
  whose loads and stores go through the operands' maps, or its ATen ops when no
  template fits; or, where the strategy chose the ``library`` implementation,
  a vendor kernel on dense operands (:mod:`vtcsearch.codegen.library`); or,
  for ``inductor``, Inductor's code for it, consecutive inductor groups with
  physical tensors between them compiled as one region
  (:mod:`vtcsearch.codegen.inductor`);
* a movement op -> the copy kernels of its residual copies (none when the
  strategy eliminated it).  A movement op or kernel group of constants only
  (a weight's transpose, a resize's index arithmetic) is folded: run once
  here, as a compiler folds constants.

Building launches every kernel once (that is when Triton compiles and
autotunes); the module's mutable buffers are restored afterwards, so building
has no visible effect.  :meth:`Executable.cuda_graph` captures the whole step
list in one CUDA graph, as torch.compile's ``reduce-overhead`` mode does.
Outputs are the executable's own storages, overwritten by the next call (clone
to keep them), again as with CUDA graphs.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, Mapping, Sequence

import torch

from ..core import implementation as im
from ..core.graph import TensorGraph, constant_tensors, folded
from ..core.mapping import contiguous_strides
from .kernels import Operand, copy_pieces
from .kernels.codecache import interpreting
from .inductor import is_region_step, lower_inductor, region_io, region_ops, regions, returned_outputs
from .library import has_epilogue, lower_as
from .lowering import Context, Launch
from . import layout, memory
from .memory import Arena
from .timing import capture_graph, side_stream
from ..core.strategy import Strategy

__all__ = ["Executable", "PlannedCopy", "Step", "planned_copies", "realize", "state_from_module"]


@dataclass
class Step:
    name: str
    kind: str          # "kernel" | "copy"
    launch: Launch

    @property
    def lowering(self) -> str:
        return self.launch.kind

    @property
    def kernels(self) -> int:
        return self.launch.kernels


def state_from_module(graph: TensorGraph, module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Graph input name -> the module's parameter, buffer or constant (by the export's fully qualified names)."""
    ep = graph.exported
    if ep is None:
        raise ValueError("the graph was not captured with torch.export: pass state explicitly")
    named = dict(module.named_parameters(remove_duplicate=False)) | dict(module.named_buffers(remove_duplicate=False))
    state: dict[str, torch.Tensor] = {}
    for spec in ep.graph_signature.input_specs:
        if spec.target is None or spec.arg.name not in graph.tensors:
            continue
        if spec.target in named:
            state[spec.arg.name] = named[spec.target]
        else:
            obj = module
            try:
                for part in spec.target.split("."):
                    obj = getattr(obj, part)
            except AttributeError:
                obj = ep.constants.get(spec.target) if hasattr(ep, "constants") else None
            if not isinstance(obj, torch.Tensor):
                raise KeyError(f"the module has no tensor {spec.target!r} for graph input {spec.arg.name}")
            state[spec.arg.name] = obj
    return state


class Executable:
    """The graph as kernels over physical storages, per a strategy."""

    def __init__(self, graph: TensorGraph, strategy: Strategy, state: Mapping[str, torch.Tensor], *,
                 device: torch.device | str | None = None, validate: bool = True, poison: bool = True,
                 reuse_memory: bool = True, inputs: Sequence[Any] | None = None):
        """``reuse_memory``: intermediate storages with disjoint lifetimes share blocks
        (:mod:`vtcsearch.codegen.memory`); off, every storage has its own.  ``inputs``: the tensors every call
        will be made with, kept alive by the caller (a benchmark replaying a CUDA graph): each unmutated one is
        bound as its input's storage and read in place, as torch.compile in a CUDA graph reads static inputs;
        no copy in, and no slab bytes for it."""
        if validate:
            strategy.validate()
        self.graph, self.strategy = graph, strategy
        if device is None:
            first = next(iter(state.values()), None)
            device = first.device if first is not None else \
                ("cuda" if torch.cuda.is_available() and not interpreting() else "cpu")
        dev = torch.device(device)
        if dev.type != "cuda" and not interpreting():
            raise RuntimeError("realizing runs Triton kernels: it needs a CUDA device, or TRITON_INTERPRET=1 "
                               "(Triton's CPU interpreter) for CPU tensors")
        self.device, self.poison = dev, poison
        self.storages: dict[str, torch.Tensor] = {}
        self.in_place: set[str] = set()   # inputs read in place from the caller's tensors
        given = [a for a in inputs if isinstance(a, torch.Tensor)] if inputs is not None else []
        for k, t in enumerate(graph.inputs):   # building launches every kernel once: indices must be valid then
            info = graph.tensors[t]
            x = given[k] if k < len(given) else None
            if x is not None and not info.mutable and x.device.type == dev.type \
                    and dev.index in (None, x.device.index) and x.dtype == info.dtype \
                    and tuple(x.shape) == info.shape and tuple(x.stride()) == tuple(info.strides):
                self.storages[t] = x
                self.in_place.add(t)
            else:
                self.storages[t] = torch.empty_strided(info.shape, info.strides, dtype=info.dtype,
                                                       device=dev).zero_()
        for t, info in graph.tensors.items():
            if info.is_graph_input and info.kind != "input":
                if t not in state:
                    raise KeyError(f"no tensor for graph input {t} ({info.kind})")
                v = state[t]
                if tuple(v.shape) != info.shape or v.dtype != info.dtype:
                    raise ValueError(f"{t}: expected {info.shape} {info.dtype}, got {tuple(v.shape)} {v.dtype}")
                self.storages[t] = v if v.device == dev else v.to(dev)
        self._own_bytes = 0
        self.reuse_memory = reuse_memory
        # storages laid out NHWC (opt-in, :mod:`vtcsearch.codegen.layout`; set by the build): indexed as NCHW
        self.channels_last: set[str] = set()
        self.arena = Arena(dev)
        self._operands: dict[str, Operand] = {}
        self.steps: list[Step] = []
        self.folded: list[str] = []
        self.build_seconds: dict[str, float] = {}   # build seconds by lowering (inductor, triton, library, copy, ...)
        mutable = self._saved_mutable()
        with torch.no_grad():
            self._build()
        for t, v in mutable.items():
            self.storages[t].copy_(v)

    def _saved_mutable(self) -> dict[str, torch.Tensor]:
        """Host copies of the mutable storages (a KV cache), restored after a build or capture runs every kernel
        once: kept in host memory, since Gemma 2 9B's caches at batch 16 take 22 GB of the GPU."""
        return {t: self.storages[t].to("cpu", copy=True) for t, i in self.graph.tensors.items() if i.mutable}

    # -- storages and operands ------------------------------------------------
    def storage(self, name: str) -> torch.Tensor:
        """The tensor of a physical storage, allocated on first use."""
        s = self.storages.get(name)
        if s is None:
            info = self.graph.tensors[name]
            s = self._allocate(name if self.arena.shares(name) else "", info.shape, info.dtype)
            if name in self.channels_last:   # the same bytes, in NHWC order
                s = s.as_strided(info.shape, layout.channels_last_strides(info.shape))
            self.storages[name] = s
        self.arena.touched((name,))
        return s

    def _scratch(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """Memory a lowering uses within its own step (shared with other steps' scratch when reusing)."""
        return self._allocate(None if self.reuse_memory else "", shape, dtype)

    def _allocate(self, name: str | None, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """``name``: a storage the arena plans; None: this step's scratch; "": memory of its own."""
        if name == "":
            s = torch.empty(tuple(shape), dtype=dtype, device=self.device)
            self._own_bytes += s.numel() * s.element_size()
        else:
            s = self.arena.take(name, shape, dtype)
        if self.poison and dtype.is_floating_point:
            s.fill_(float("nan"))
        else:   # integers may be read as indices: never uninitialised memory
            s.zero_()
        return s

    @property
    def allocated_bytes(self) -> int:
        """Bytes this executable allocated for intermediates and scratch (not the module's state)."""
        return self._own_bytes + self.arena.allocated_bytes

    def operand(self, t: str) -> Operand:
        """Tensor ``t`` as kernels see it: its resolved map over the storages."""
        m = self.strategy.resolve(t)
        # looked up on every use, cached or not: storage() records the binding for the memory plan's check
        storages = {s: self.storage(s) for s in m.targets()}
        tables = {tb: self.index_tensor(tb) for tb in m.tables()}
        op = self._operands.get(t)
        if op is None:
            op = self._operands[t] = Operand(m, storages, tables=tables, dtype=self.graph.tensors[t].dtype)
        return op

    def index_tensor(self, name: str) -> torch.Tensor:
        """The index tensor an indirect map reads (it must be physical: kernels read it as a plain array)."""
        tm = self.strategy.resolve(name)
        if not tm.is_identity_layout() or len(tm.targets()) != 1:
            raise NotImplementedError(f"index tensor {name} is virtual; an indirect map needs it physical")
        return self.storage(next(iter(tm.targets())))

    # -- building -----------------------------------------------------------
    def _build(self) -> None:
        g, s = self.graph, self.strategy
        const = constant_tensors(g)
        runs = regions(g, s, g.steps, const)
        self.returned = returned_outputs(g, s, runs, const)   # an Inductor region's own tensors, bound per call
        ctx = Context(g, self.operand, self._scratch, self.device, s.resolve, self.returned, self._bind)
        if layout.enabled():
            self.channels_last = layout.channels_last_storages(g, s, runs)
        if self.reuse_memory:
            keep = (set(self.storages) - set(memory.copied_inputs(g))) | self.in_place   # the module's state
            for t in sorted(const):
                keep |= set(s.resolve(t).targets())
            outs = {u for t in g.outputs for u in s.resolve(t).targets()}
            self.arena = Arena(self.device, memory.plan(g, s, runs, keep, outputs=outs, returned=self.returned))
            for t in g.inputs:   # the inputs the plan shares move into the arena (zeros, as above)
                if self.arena.shares(t):
                    info = g.tensors[t]
                    self.storages[t] = self.arena.take(t, info.shape, info.dtype).zero_()
        for k, run in enumerate(runs):
            self.arena.begin(k)
            t0, n = time.perf_counter(), len(self.steps)
            self._build_step(ctx, run, const)
            what = self.steps[-1].lowering if len(self.steps) > n else "copy"   # folded, or nothing to copy
            self.build_seconds[what] = self.build_seconds.get(what, 0.0) + time.perf_counter() - t0
        self.arena.check()

    def _bind(self, t: str, value: torch.Tensor) -> None:
        """Output ``t`` of this call is ``value``, a tensor an Inductor region returned (:attr:`returned`), laid
        out as the graph's output (a copy where Inductor chose other strides)."""
        info = self.graph.tensors[t]
        if tuple(value.stride()) != tuple(info.strides):
            value = torch.empty_strided(info.shape, info.strides, dtype=value.dtype,
                                        device=value.device).copy_(value)
        self.storages[t] = value

    def _build_step(self, ctx: Context, run: Sequence[str], const: set[str]) -> None:
        """Lower one step of ``runs`` (realization's order) and run it once: an Inductor region, a kernel group
        in its implementation, or a movement op's residual copies (none: nothing to run, or folded)."""
        g, s = self.graph, self.strategy
        name = run[0]
        if any(is_region_step(g, s, st) for st in run):   # compiled (and run once) as a region
            # a folded group runs once, at build: its ATen ops in eager, not a compile for one call
            step = Step(name, "kernel", lower_inductor(ctx, run, eager=len(run) == 1 and folded(g, name, const)))
        elif name in g.groups:   # in the implementation the strategy chose (default: the Triton template)
            launch = lower_as(ctx, g.groups[name], s.implementation(name))
            if launch.fn is not None:
                # templates ran once when lowered; an ATen fallback must too, or a later kernel reads its
                # output unwritten (int64 scratch read as gather indices crashes the process)
                launch.fn()
            step = Step(name, "kernel", launch)
        else:
            copies = s.residuals_of(name)
            if not copies:
                return
            launch = Launch(name, "copy")
            for r in copies:
                tensors = {p.target: self.storage(p.target) for pair in r.pairs for p in pair if p.target}
                plan = copy_pieces(r.domain, r.pairs, tensors, tables=self._tables(r))
                if plan is not None:
                    launch.plans.append((plan, plan.take_args()))
            if not launch.plans:
                return
            step = Step(name, "copy", launch)
        if len(run) == 1 and folded(g, name, const):
            self.folded.append(name)       # done once, just now: its outputs are constants from here on
        else:
            self.steps.append(step)

    def _tables(self, r) -> dict[str, torch.Tensor]:
        out = {}
        for pair in r.pairs:
            for p in pair:
                for e in list(p.index) + [c for c, _, _ in p.conds]:
                    for lk in e.lookups():
                        out[lk.table] = self.index_tensor(lk.table)
        return out

    # -- running --------------------------------------------------------------
    def run(self) -> None:
        """Every step once, on the current contents of the input buffers."""
        for st in self.steps:
            st.launch()

    def set_inputs(self, *inputs: Any) -> None:
        tensors = [a for a in inputs if isinstance(a, torch.Tensor)]
        if len(tensors) != len(self.graph.inputs):
            raise ValueError(f"expected {len(self.graph.inputs)} tensor inputs, got {len(tensors)}")
        for name, x in zip(self.graph.inputs, tensors):
            dst = self.storages[name]
            if tuple(x.shape) != tuple(dst.shape):
                raise ValueError(f"input {name}: expected shape {tuple(dst.shape)}, got {tuple(x.shape)}")
            if x.data_ptr() != dst.data_ptr():
                if name in self.in_place:   # copying into it would overwrite the caller's tensor
                    raise ValueError(f"input {name} is bound to the tensor given at build (realize(inputs=...)): "
                                     f"call with that tensor, or realize without inputs")
                dst.copy_(x)

    def outputs(self) -> list[torch.Tensor]:
        return [self.storages[t] for t in self.graph.outputs]

    def __call__(self, *inputs: Any) -> list[torch.Tensor]:
        with torch.no_grad():
            self.set_inputs(*inputs)
            self.run()
        return self.outputs()

    def bound(self, *inputs: Any) -> Callable[[], None]:
        """One call's work on ``inputs``, which the caller keeps alive: copy them in, then every step.

        :meth:`run` alone computes on what the input storages hold, and the memory plan lets a dense input's
        bytes go to other storages after its last reader (:func:`memory.plan`): a second :meth:`run` without a
        new copy reads whatever was written there (token ids read as garbage crashed a whole Llama decode
        step).  So whatever repeats a call without arguments (a CUDA graph's ``replay``) repeats this."""
        def call() -> None:
            self.set_inputs(*inputs)
            self.run()
        return call

    def cuda_graph(self, *inputs: Any) -> Callable[..., list[torch.Tensor]]:
        """The whole step list captured in one CUDA graph; calling it copies inputs in and replays.

        With ``inputs`` (tensors the caller keeps alive) the graph copies them in itself, so its bare
        ``replay`` is a whole call on them, as a benchmark replays a CUDA graph; without, only calling
        the returned function with inputs is a call (``replay`` alone would run on stale input storages)."""
        if self.device.type != "cuda":
            raise RuntimeError("CUDA graphs need a CUDA device")
        mutable = self._saved_mutable()
        body = self.bound(*inputs) if inputs else self.run
        stream = side_stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.no_grad(), torch.cuda.stream(stream):
            body()
        torch.cuda.current_stream().wait_stream(stream)
        with torch.no_grad():
            graph = capture_graph(body)
        for t, v in mutable.items():
            self.storages[t].copy_(v)

        def call(*inputs: Any) -> list[torch.Tensor]:
            self.set_inputs(*inputs)
            graph.replay()
            return self.outputs()

        call.graph = graph  # type: ignore[attr-defined]
        call.replay = graph.replay  # type: ignore[attr-defined]
        return call

    # -- reporting ------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """Kernels per call by kind, fallbacks, folded ops, bytes this executable allocated."""
        kinds: dict[str, int] = {}
        for st in self.steps:
            kinds[st.lowering] = kinds.get(st.lowering, 0) + max(st.kernels, 1 if st.lowering in
                                                                 ("aten", "library", "inductor") else 0)
        return {"steps": len(self.steps), "kernels": sum(st.kernels for st in self.steps),
                "copy_kernels": sum(st.kernels for st in self.steps if st.kind == "copy"),
                "by_lowering": kinds,
                "fallbacks": {st.name: st.launch.note for st in self.steps if st.lowering == "aten"},
                "folded": list(self.folded), "allocated_bytes": self.allocated_bytes,
                "build_seconds": dict(self.build_seconds)}

    def table(self) -> list[dict[str, Any]]:
        return [{"step": st.name, "kind": st.kind, "lowering": st.lowering, "kernels": st.kernels,
                 "note": st.launch.note} for st in self.steps]


@dataclass
class PlannedCopy:
    step: str       # the movement op, or the kernel group whose operand is gathered or scattered
    kind: str       # "copy" (a movement op's residual copy), "gather" or "scatter" (a library or Inductor operand)
    tensor: str
    bytes: int      # bytes written


def planned_copies(graph: TensorGraph, strategy: Strategy) -> list[PlannedCopy]:
    """Every copy kernel that realizing ``strategy`` launches per call, decided as realization decides it but
    without allocating or compiling anything (so a whole model on the meta device can be checked): the residual
    copies of the movement ops that run (not folded), and the dense operands that library kernels and Inductor
    regions gather and scatter.  What a cost model priced as fused or free should not appear here."""
    def strides(u: str) -> tuple[int, ...]:   # the module's state as it is laid out; the executable's contiguous
        info = graph.tensors[u]
        return tuple(info.strides) if info.is_graph_input else contiguous_strides(info.shape)

    def copied(kind: str, t: str) -> bool:
        m = strategy.resolve(t)
        return im.needs_copy(kind, m, {u: strides(u) for u in m.targets()})

    def step_of(op: str) -> str:   # the kernel group an op belongs to (a movement op is its own step)
        return graph.ops[op].kernel or op

    const = constant_tensors(graph)
    ctx = SimpleNamespace(graph=graph, resolve=strategy.resolve)
    out: list[PlannedCopy] = []
    for run in regions(graph, strategy, graph.steps, const):
        name = run[0]
        if len(run) == 1 and folded(graph, name, const):
            continue                        # run once, at build
        if any(is_region_step(graph, strategy, st) for st in run):
            ins, outs = region_io(ctx, run)   # type: ignore[arg-type]
            ops = set(region_ops(graph, run))
            out += [PlannedCopy(step_of(next(c for c in graph.tensors[t].consumers if c in ops)), "gather", t,
                                graph.tensors[t].nbytes) for t in ins if copied(im.INDUCTOR, t)]
            out += [PlannedCopy(step_of(graph.tensors[t].producer), "scatter", t, graph.tensors[t].nbytes)
                    for t in outs if copied(im.INDUCTOR, t)]
        elif name in graph.groups:
            gr = graph.groups[name]
            if strategy.implementation(name) == im.LIBRARY:
                ins, outs = im.library_operands(graph, gr)
                out += [PlannedCopy(name, "gather", t, graph.tensors[t].nbytes) for t in ins
                        if copied(im.operand_kind(gr, t), t)]
                if not has_epilogue(gr):   # an epilogue writes the group's result through its maps itself
                    out += [PlannedCopy(name, "scatter", t, graph.tensors[t].nbytes) for t in outs
                            if copied(gr.kind, t)]
        else:
            out += [PlannedCopy(name, "copy", r.dst_tensor, r.elements * graph.tensors[r.dst_tensor].dtype.itemsize)
                    for r in strategy.residuals_of(name)]
    return out


def realize(graph: TensorGraph, strategy: Strategy, state: Mapping[str, torch.Tensor] | torch.nn.Module, *,
            device: torch.device | str | None = None, validate: bool = True, reuse_memory: bool = True,
            inputs: Sequence[Any] | None = None) -> Executable:
    """Build the executable of ``graph`` under ``strategy``; ``state`` is the module (or its graph-named tensors);
    ``reuse_memory``: intermediates with disjoint lifetimes share memory (:mod:`vtcsearch.codegen.memory`);
    ``inputs``: the tensors every call is made with, read in place (:class:`Executable`)."""
    if isinstance(state, torch.nn.Module):
        state = state_from_module(graph, state)
    return Executable(graph, strategy, state, device=device, validate=validate, reuse_memory=reuse_memory,
                      inputs=inputs)

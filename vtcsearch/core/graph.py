"""TensorGraph: the captured program as tensors and ops, each op either compute or data movement.

This is the compiler's view of a model after capture (:mod:`vtcsearch.core.capture`):
every tensor with its shape, dtype, strides and size; every op classified by the
movement registry (:mod:`vtcsearch.core.ops`) as data movement or compute; compute ops
grouped into kernels the way a fusing compiler would (pointwise ops join the
kernel that produces their input).  Graph inputs and outputs, parameters and
mutated buffers (a KV cache) are marked, since they must stay physical.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from .ops import Movement, MovementOp, OpCall

# what a tensor is, for deciding whether it may be virtual or written
PARAMETER, BUFFER, INPUT, CONSTANT, INTERMEDIATE = "parameter", "buffer", "input", "constant", "intermediate"


@dataclass
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    strides: tuple[int, ...]
    kind: str = INTERMEDIATE
    producer: str | None = None
    consumers: list[str] = field(default_factory=list)
    is_output: bool = False
    storage: str = ""          # the storage this tensor owns when physical ("" = its own name)
    mutable: bool = False      # a buffer the program writes (its storage is writable)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    @property
    def is_graph_input(self) -> bool:
        return self.kind != INTERMEDIATE

    @property
    def physical_only(self) -> bool:
        """Graph inputs and outputs are real tensors the caller owns."""
        return self.is_graph_input or self.is_output

    @property
    def read_only(self) -> bool:
        """Storage the program must not write: parameters, user inputs, constants, unmutated buffers."""
        return self.is_graph_input and not self.mutable

    @property
    def storage_name(self) -> str:
        return self.storage or self.name


@dataclass
class OpNode:
    name: str
    target: Any
    kind: str                            # "movement" | "compute"
    inputs: list[str]                    # tensor inputs, in order
    outputs: list[str]
    category: str = "other"              # compute: matmul | conv | attention | reduction | pointwise | other
    movement: Movement | None = None     # the registry's description (movement ops)
    movement_op: MovementOp | None = None
    call: OpCall | None = None
    kernel: str | None = None            # compute kernel (fusion group) this op belongs to
    node: Any = None                     # the torch.fx node

    @property
    def target_name(self) -> str:
        return _target_name(self.target)


def _target_name(target: Any) -> str:
    if isinstance(target, str):
        return target
    return getattr(target, "__name__", None) or str(target)


class TensorGraph:
    """Tensors and ops of a captured program, in execution order."""

    def __init__(self) -> None:
        self.tensors: dict[str, TensorInfo] = {}
        self.ops: dict[str, OpNode] = {}
        self.inputs: list[str] = []            # user inputs, in call order
        self.outputs: list[str] = []           # user outputs, in return order
        self.mutations: dict[str, str] = {}    # new value -> buffer it is written back to
        self.unclassified: Counter[str] = Counter()
        self.exported: Any = None              # torch.export.ExportedProgram, when captured
        self.hfuse: Any = None                 # core.hfuse.HFuseReport, when capture fused GEMMs horizontally
        self.groups: dict[str, Any] = {}       # kernel name -> fusion.Group (set by set_kernels())
        self.steps: list[str] = []             # kernels and unabsorbed movement ops, in run order
        self._order: dict[str, int] | None = None

    # -- building -----------------------------------------------------------
    def add_tensor(self, t: TensorInfo) -> TensorInfo:
        if t.name in self.tensors:
            raise ValueError(f"tensor {t.name!r} defined twice")
        self.tensors[t.name] = t
        return t

    def add_op(self, op: OpNode) -> OpNode:
        if op.name in self.ops:
            raise ValueError(f"op {op.name!r} defined twice")
        for t in op.inputs:
            self.tensors[t].consumers.append(op.name)
        for t in op.outputs:
            self.tensors[t].producer = op.name
        self.ops[op.name] = op
        return op

    # -- queries ------------------------------------------------------------
    def movement_ops(self) -> list[OpNode]:
        """Movement ops between kernels (the VTOG's ops); those a kernel absorbed are not here."""
        return [o for o in self.ops.values() if o.kind == "movement" and o.kernel is None]

    def compute_ops(self) -> list[OpNode]:
        return [o for o in self.ops.values() if o.kind == "compute"]

    def order(self) -> dict[str, int]:
        """Execution step of each op: every op of a kernel shares the kernel's step."""
        if self._order is None:
            return {name: k for k, name in enumerate(self.ops)}
        return dict(self._order)

    def kernels(self) -> dict[str, list[str]]:
        """Compute kernel -> its ops (absorbed movement ops included), in run order."""
        if not self.groups:
            return {o.name: [o.name] for o in self.compute_ops()}
        return {s: list(self.groups[s].ops) for s in self.steps if s in self.groups}

    def kernel_io(self, kernel: str) -> tuple[list[str], list[str]]:
        """Tensors a kernel reads from and writes to global memory."""
        return kernel_io(self, self.kernels()[kernel])

    def set_kernels(self, groups: dict[str, Any], steps: list[str]) -> None:
        """Record a fusion result (:func:`vtcsearch.core.fusion.fuse_graph`): the groups and the run order."""
        for o in self.ops.values():
            o.kernel = None
        self.groups = groups
        for gr in groups.values():
            for o in gr.ops:
                self.ops[o].kernel = gr.name
        self.steps = list(steps)
        step = {s: k for k, s in enumerate(self.steps)}
        self._order = {o.name: step[o.kernel or o.name] for o in self.ops.values()}

    def summary(self) -> dict[str, Any]:
        mv = self.movement_ops()
        return {
            "tensors": len(self.tensors),
            "ops": len(self.ops),
            "movement_ops": len(mv),
            "compute_ops": len(self.compute_ops()),
            "kernels": len(self.kernels()),
            "movement_by_onnx": dict(Counter(o.movement_op.onnx for o in mv if o.movement_op)),
            "unclassified": dict(self.unclassified),
            "parameter_bytes": sum(t.nbytes for t in self.tensors.values() if t.kind == PARAMETER),
        }

    def __repr__(self) -> str:
        s = self.summary()
        return (f"TensorGraph({s['tensors']} tensors, {s['compute_ops']} compute ops in {s['kernels']} kernels, "
                f"{s['movement_ops']} movement ops)")


# The largest output of a movement op of constants that realization folds (copies once, at build).  A folded
# copy lives as long as the executable, beside the module's own tensor: a transposed copy of every QKV weight
# held 1.5 GiB more than torch.compile for Llama 3 8B (2.3 GiB for Gemma 2 9B), which reads the weights in place.
# Above it, the op is an ordinary movement op: eliminated (its readers go through the map), or a copy per call.
FOLD_LIMIT_BYTES = 64 << 10


# Ops whose result is not a function of their inputs (random numbers, uninitialised memory): never folded.
NOT_FOLDABLE = ("rand", "bernoulli", "dropout", "normal", "uniform", "exponential", "multinomial", "poisson",
                 "empty")


def constant_tensors(graph: TensorGraph, fold_limit: int = FOLD_LIMIT_BYTES, by_op: bool = False) -> set[str]:
    """Tensors whose values are fixed at build time: parameters, constants, unmutated buffers, and the outputs
    of ``fold_limit`` bytes or less of steps that read only those.  A step is a movement op (a rotary table's
    slice) or a whole kernel group (the index arithmetic of a bilinear resize: ``arange`` -> ``mul`` ->
    ``clamp`` -> ``_to_copy``, a detection head's anchor grid).  Realization runs such a step once at build,
    as a compiler folds constants, or an Inductor region reads it as a view; either way it costs nothing per
    call, and the cost model says so.  Random and uninitialising ops, program outputs and buffer updates are
    never folded.  ``by_op``: every op on its own, as before fusion groups them (fusion keeps what folds apart
    from what runs per call)."""
    const = {t for t, i in graph.tensors.items() if i.read_only and i.kind != "input"}
    kernels = {o.name: [o.name] for o in graph.compute_ops()} if by_op else graph.kernels()
    for name in list(graph.ops) if by_op else graph.steps or list(graph.ops):
        if name in kernels:
            ops = kernels[name]
            if any(any(w in graph.ops[o].target_name for w in NOT_FOLDABLE) for o in ops):
                continue
            ins, _ = kernel_io(graph, ops)
            outs = [t for o in ops for t in graph.ops[o].outputs]
            if any(graph.tensors[t].is_output or t in graph.mutations for t in outs):
                continue
        else:
            op = graph.ops[name]
            if op.kind != "movement" or (op.kernel is not None and not by_op) or not op.inputs:
                continue
            ins, outs = op.inputs, op.outputs
        if outs and all(t in const for t in ins) and all(graph.tensors[t].nbytes <= fold_limit for t in outs):
            const.update(outs)
    return const


def folded(graph: TensorGraph, step: str, const: set[str]) -> bool:
    """Whether ``step`` (a movement op or a kernel group) is folded at build: every tensor it makes is a
    constant (:func:`constant_tensors`)."""
    outs = step_outputs(graph, step)
    return bool(outs) and all(t in const for t in outs)


def step_outputs(graph: TensorGraph, step: str) -> list[str]:
    """The tensors a step (a kernel group or a movement op) makes, its ops' intermediates included."""
    return [t for o in (graph.groups[step].ops if step in graph.groups else [step]) for t in graph.ops[o].outputs]


def written_back_within(g: TensorGraph, t: str, ops: set[str] | frozenset[str]) -> bool:
    """``t`` is a buffer's new value whose writeback (and every other reader) is among ``ops``: run together,
    they write the buffer, and ``t`` itself needs no storage."""
    return t in g.mutations and not g.tensors[t].is_output and all(c in ops for c in g.tensors[t].consumers)


def kernel_io(g: TensorGraph, names: list[str] | tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(inputs, outputs) of the ops ``names`` run as one kernel: tensors read from outside them, and
    tensors read outside them, returned by the program or written back into a buffer."""
    ops = set(names)
    ins: list[str] = []
    outs: list[str] = []
    for name in names:
        o = g.ops[name]
        for t in o.inputs:
            if g.tensors[t].producer not in ops and t not in ins:
                ins.append(t)
        for t in o.outputs:
            info = g.tensors[t]
            if info.is_output or any(c not in ops for c in info.consumers) or t in g.mutations:
                outs.append(t)
    return ins, outs

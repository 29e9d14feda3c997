"""Memory planning: intermediate storages share memory when their lifetimes do not overlap.

An executable runs its steps in one fixed order, on one stream (and replays them as one CUDA graph), so
a storage is live from the first step that writes it to the last step that reads it.  Two storages
whose live ranges are disjoint can occupy the same bytes, as Inductor's and every inference runtime's
buffer reuse does; without it every intermediate of a whole model stays allocated (ResNet-50 at batch 1:
37 MiB of activations where torch.compile's peak is 6 MiB).

What shares: intermediates, and the call's dense tensor inputs (the call copies them in before the first
step, and after their last reader their bytes are free; torch.compile holds no copy of its inputs, and a
resident copy of a batch-16 image was a third of ShuffleNetV2's activation peak), and outputs before their
first write (they live to the end of the call; the next call overwrites them anyway: a separate logits buffer
put ShuffleNetV2's peak 31 KB above torch.compile's).  What never shares:
parameters and buffers (the module's own tensors), storages of build-time
constants (a folded weight transpose is written once, at build), and any storage a step reads before a step
of the call writes it (its contents must survive from the previous call).  Scratch memory a lowering asks
for (dense operands of a library kernel, gathered inputs) lives for its own step only.

:func:`plan` computes the live ranges from the strategy before anything is lowered.  Sizes are known then
too, so :func:`place` fixes every shared storage's offset in one slab: largest first, each in the smallest
gap among the storages live at the same time (the "greedy by size" offset planning of inference runtimes).
A free list of whole blocks, which cannot split or merge them, allocated 23.6 MB on ShuffleNetV2 at batch 16
where the most intermediate bytes ever live at once are 12.0 MB; the slab is 12.0 MB for them, 14.45 MB
with the input image.  :class:`Arena` allocates the slab at first use.  Scratch takes a gap of the slab that no
storage live at its step occupies, else a block (best fit among blocks at most twice the request).
Realization records which storages each step really binds and :meth:`Arena.check` refuses an executable in
which a step touched a storage outside its planned range: a planner bug is an error at build, never a wrong
answer.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Sequence

import numpy as np
import torch

from ..core.graph import TensorGraph, kernel_io, written_back_within
from ..core.mapping import contiguous_strides

if TYPE_CHECKING:
    from ..core.strategy import Strategy

__all__ = ["Arena", "Plan", "carve", "copied_inputs", "place", "plan", "storages_of", "step_access"]

ALIGN = 128   # bytes: blocks start aligned for any dtype and 16-byte vector loads
SLACK = 1 << 20   # bytes a block may exceed its request by, whatever the ratio (small requests share freely)


def storages_of(strategy: "Strategy", t: str) -> set[str]:
    """The storages tensor ``t``'s resolved map touches, index tables included."""
    m = strategy.resolve(t)
    out = set(m.targets())
    for tb in m.tables():
        out |= set(strategy.resolve(tb).targets())
    return out


def step_access(graph: TensorGraph, strategy: "Strategy", run: Sequence[str]) -> tuple[set[str], set[str]]:
    """(storages read, storages written) by one step of realization: a kernel group, an Inductor region
    (its groups and the copies inside it), or a movement op's residual copies."""
    reads: set[str] = set()
    writes: set[str] = set()
    if run[0] in graph.groups or len(run) > 1:   # a kernel group, or a region (which may open with a copy)
        ops = [o for st in run for o in (graph.groups[st].ops if st in graph.groups else [st])]
        ins, outs = kernel_io(graph, ops)
        # a buffer's new value whose writeback runs in this step: the buffer is written instead (as
        # :func:`vtcsearch.codegen.inductor.region_io` does), so the value needs no storage of its own
        inside = set(ops)
        outs = [t for t in outs if not written_back_within(graph, t, inside)]
        for t in ins:
            reads |= storages_of(strategy, t)
        for t in outs:
            m = strategy.resolve(t)
            writes |= set(m.targets())
            for tb in m.tables():
                reads |= set(strategy.resolve(tb).targets())
        return reads, writes
    for r in strategy.residuals_of(run[0]):
        for dst, src in r.pairs:
            if dst.target:
                writes.add(dst.target)
            if src.target:
                reads.add(src.target)
            for p in (dst, src):
                for e in list(p.index) + [c for c, _, _ in p.conds]:
                    for lk in e.lookups():
                        reads |= set(strategy.resolve(lk.table).targets())
    return reads, writes


@dataclass
class Plan:
    """Live ranges (first step, last step) of the storages that may share memory; the rest persist.
    ``sizes`` (bytes, aligned) and ``offsets`` place each shared storage in one slab of ``slab_bytes``."""

    ranges: dict[str, tuple[int, int]] = field(default_factory=dict)
    persistent: set[str] = field(default_factory=set)
    sizes: dict[str, int] = field(default_factory=dict)
    offsets: dict[str, int] = field(default_factory=dict)
    slab_bytes: int = 0


def _aligned(nbytes: int) -> int:
    return max(ALIGN, -(-nbytes // ALIGN) * ALIGN)


def place(ranges: dict[str, tuple[int, int]], sizes: dict[str, int]) -> tuple[dict[str, int], int]:
    """Offsets of storages in one slab such that two whose live ranges overlap never overlap in bytes.

    Largest first (ties: earlier first, then by name, for a deterministic plan); each goes to the smallest gap
    between the already placed storages that are live at the same time, or above them all."""
    offsets: dict[str, int] = {}
    top = 0
    for s in sorted(ranges, key=lambda s: (-sizes[s], ranges[s][0], s)):
        lo, hi = ranges[s]
        offsets[s] = _gap(((offsets[o], offsets[o] + sizes[o]) for o in offsets
                           if ranges[o][0] <= hi and lo <= ranges[o][1]), sizes[s])
        top = max(top, offsets[s] + sizes[s])
    return offsets, top


def _gap(busy: Iterable[tuple[int, int]], size: int) -> int:
    """Where ``size`` bytes go among the ``busy`` byte ranges (start, end): the smallest gap between them that
    fits, or above them all.  The planner places storages with it, the arena a step's scratch."""
    best, best_gap, top = None, None, 0
    for start, end in sorted(busy):
        if start - top >= size and (best_gap is None or start - top < best_gap):
            best, best_gap = top, start - top
        top = max(top, end)
    return top if best is None else best


def copied_inputs(graph: TensorGraph) -> list[str]:
    """The call's tensor inputs that may share memory: the call copies them in before the first step, and no
    step writes them, so once their last reader ran their bytes are free until the next call's copy.  (A
    strided input keeps its own storage: the slab holds dense storages.)"""
    out = []
    for t in graph.inputs:
        i = graph.tensors[t]
        if i.kind == "input" and not i.mutable and tuple(i.strides) == contiguous_strides(i.shape):
            out.append(t)
    return out


def plan(graph: TensorGraph, strategy: "Strategy", runs: Sequence[Sequence[str]],
         persistent: Iterable[str], outputs: Iterable[str] = (), returned: Iterable[str] = ()) -> Plan:
    """Live ranges over ``runs`` (realization's step order); ``persistent``: storages that never share;
    ``outputs``: storages the caller reads after the call, live from their first write to the last step;
    ``returned``: outputs an Inductor region returns as its own tensors, which take no storage here.

    The call's dense, unmutated tensor inputs live from the first step (the call copies them in) to their last
    reader.  Other graph inputs and mutable buffers always persist: a step may write only part of them (a KV
    cache row), so a first access that writes does not make the rest of their contents dead.  Outputs share
    like intermediates before they are written: the next call overwrites them anyway (as a CUDA graph's do),
    and a model's logits then take no memory beside the activation peak."""
    persistent = set(persistent)
    copied = [t for t in copied_inputs(graph) if t not in persistent]
    keep = persistent | {t for t, i in graph.tensors.items()
                              if (i.is_graph_input or i.mutable) and t not in copied}
    first: dict[str, int] = {t: 0 for t in copied}
    last: dict[str, int] = {t: 0 for t in copied}
    returned = set(returned)
    for k, run in enumerate(runs):
        reads, writes = step_access(graph, strategy, run)
        for s in (reads | writes) - returned:
            if s not in first:
                first[s] = k
                if s not in writes:
                    keep.add(s)   # read before this call writes it: its contents outlive the call
            last[s] = k
    for s in outputs:
        if s in last:
            last[s] = len(runs) - 1
    ranges = {s: (first[s], last[s]) for s in first if s not in keep}
    sizes = {s: _aligned(graph.tensors[s].nbytes) for s in ranges}
    offsets, slab = place(ranges, sizes)
    return Plan(ranges, keep, sizes, offsets, slab)


def carve(slab: torch.Tensor, offset: int, nbytes: int) -> torch.Tensor | None:
    """``nbytes`` of ``slab`` from ``offset``, as a uint8 tensor with a storage object of its own.

    A view of the slab would do for the Triton kernels, but not for Inductor: every storage live at one step
    would then be one PyTorch storage, and AOTAutograd treats a region's arguments that share a storage as
    aliases (it refuses mutated aliased inputs outright).  The tensor does not own the memory; the arena's slab
    does, and the object each part is made from holds the slab, so the slab lives as long as any part: an output
    the caller keeps outlives the executable (it read freed memory once the executable was gone).  None where no
    such tensor can be made."""
    ptr = slab.data_ptr() + offset
    try:
        if slab.device.type == "cuda":
            holder = type("SlabPart", (), {"__cuda_array_interface__": {
                "shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "strides": None, "version": 2}})()
            holder.slab = slab          # torch keeps the holder alive with the tensor's storage
            part = torch.as_tensor(holder, device=slab.device)
        elif slab.device.type == "cpu":
            view = (ctypes.c_uint8 * nbytes).from_address(ptr)
            view.slab = slab            # numpy keeps the ctypes array, torch the numpy array
            part = torch.from_numpy(np.ctypeslib.as_array(view))
        else:
            return slab[offset:offset + nbytes]   # meta: no memory to alias
    except Exception:   # no way to carve here: the caller gives the storage memory of its own
        return None
    return part if part.data_ptr() == ptr and part.numel() == nbytes else None


class Arena:
    """The planned storages at their offsets in one slab, and blocks of scratch memory handed out best fit;
    both allocated on first use."""

    def __init__(self, device: torch.device, plan: Plan | None = None):
        self.device, self.plan = device, plan or Plan()
        self.step = -1
        self.allocated_bytes = 0
        self._slab: torch.Tensor | None = None
        self._free: list[torch.Tensor] = []                  # blocks nobody holds, by size
        self._held: dict[str, torch.Tensor] = {}             # storage -> its block
        self._until: list[tuple[int, str]] = []              # (last step, storage) of held blocks
        self._used: dict[str, list[int]] = {}                # storage -> steps that bound it (for check)
        self._scratch = 0
        self._step_scratch: list[tuple[int, int]] = []       # (start, end) of this step's scratch in the slab
        self.scratch_in_slab = 0                             # scratch requests the slab's free bytes took

    def begin(self, step: int) -> None:
        """Step ``step`` is about to be lowered: blocks of storages (and scratch) dead before it are free."""
        self.step = step
        self._step_scratch = []
        still = []
        for end, s in self._until:
            if end < step:
                self._free.append(self._held.pop(s))
            else:
                still.append((end, s))
        self._until = still

    def shares(self, name: str) -> bool:
        return name in self.plan.ranges

    def take(self, name: str | None, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """A tensor for storage ``name`` (None: scratch of the current step) in a block it may share."""
        numel = 1
        for d in shape:
            numel *= int(d)
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        if name is not None and name in self.plan.offsets:
            return self._placed(name, nbytes, shape, dtype)
        size = _aligned(nbytes)
        if name is None:
            part = self._scratch_from_slab(size, nbytes)
            if part is not None:
                return part.view(dtype).view(tuple(int(d) for d in shape))
        # best fit, but never a block more than twice the request (and 1 MiB larger): blocks are not split,
        # so a row of 8 KiB in a free 32 MiB block would make the next 32 MiB request allocate again
        fits = [k for k, b in enumerate(self._free) if size <= b.numel() <= max(2 * size, size + SLACK)]
        if fits:
            block = self._free.pop(min(fits, key=lambda k: self._free[k].numel()))
        else:
            block = torch.empty(size, dtype=torch.uint8, device=self.device)
            self.allocated_bytes += size
        if name is None:
            self._scratch += 1
            name = f"__scratch{self._scratch}"
            end = self.step
        else:
            end = self.plan.ranges[name][1]
        self._held[name] = block
        self._until.append((end, name))
        return block[:nbytes].view(dtype).view(tuple(int(d) for d in shape))

    def _scratch_from_slab(self, size: int, nbytes: int) -> torch.Tensor | None:
        """Scratch of the current step in bytes of the slab that no storage live at this step occupies (nor
        other scratch of this step): scratch lives for its own step only, so the gaps the plan leaves at a
        step are free for it.  A densified operand of a library convolution at batch 16 no longer adds blocks
        of its own beside the slab.  None: no gap fits (the caller allocates a block)."""
        p, k = self.plan, self.step
        at = _gap([(p.offsets[s], p.offsets[s] + p.sizes[s]) for s, (lo, hi) in p.ranges.items() if lo <= k <= hi]
                  + self._step_scratch, size)
        if at + size > p.slab_bytes:
            return None
        part = carve(self._slab_memory(), at, nbytes)
        if part is not None:
            self._step_scratch.append((at, at + size))
            self.scratch_in_slab += 1
        return part

    def _slab_memory(self) -> torch.Tensor:
        """The slab, allocated at first use."""
        if self._slab is None:
            self._slab = torch.empty(self.plan.slab_bytes, dtype=torch.uint8, device=self.device)
            self.allocated_bytes += self.plan.slab_bytes
        return self._slab

    def _placed(self, name: str, nbytes: int, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        if nbytes > self.plan.sizes[name]:
            raise RuntimeError(f"memory plan: storage {name} needs {nbytes} bytes, planned {self.plan.sizes[name]}")
        part = carve(self._slab_memory(), self.plan.offsets[name], nbytes)
        if part is None:   # correct, only larger: the storage's own memory for the whole call
            part = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
            self.allocated_bytes += nbytes
        return part.view(dtype).view(tuple(int(d) for d in shape))

    def touched(self, storages: Iterable[str]) -> None:
        """The current step binds ``storages`` (recorded for :meth:`check`)."""
        for s in storages:
            if s in self.plan.ranges:
                self._used.setdefault(s, []).append(self.step)

    def check(self) -> None:
        """Every recorded binding lies inside its storage's planned live range."""
        for s, steps in self._used.items():
            lo, hi = self.plan.ranges[s]
            bad = [k for k in steps if not lo <= k <= hi]
            if bad:
                raise RuntimeError(f"memory plan: storage {s} is bound at step {bad[0]} outside its planned "
                                   f"live range [{lo}, {hi}]; realize with reuse_memory=False")

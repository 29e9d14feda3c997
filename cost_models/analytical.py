"""Analytical oracle: a roofline per kernel from a hardware profile.

For one unit in one configuration::

    t_mem     = dram_bytes / bandwidth + l2_bytes / l2_bandwidth
    t_compute = flops / peak(dtype, tensor cores?) + index_ops / int_ops
    t         = max(t_mem, t_compute) + launch

Bytes come from the resolved maps of the unit's operands
(:class:`~cost_models.accounting.TrafficModel`):

* **distinct elements go to DRAM**: a virtual input read through an Expand map
  moves the bytes of the physical elements it touches once; the repeated reads
  of the same element (GQA: four query heads reading one KV head) are charged
  at L2 bandwidth, not free and not at DRAM cost.  This is the paper's "4x
  fewer global reads" for attention over an un-expanded KV cache;
* **short runs cost more**: each contiguous run is rounded up to whole DRAM
  sectors, and a run shorter than the coalescing width pays
  ``1 + short_run_penalty * (1 - run / coalesce)`` on top;
* **index arithmetic** of non-affine maps (div/mod from reshapes, lookups of
  index tensors, piece predicates of Concat-like maps) is charged on the
  integer pipes per element.

Residual copies are one copy kernel each: read bytes plus write bytes, no FLOPs.
"""
from __future__ import annotations

from typing import Any, Sequence

from vtcsearch.core.implementation import INDUCTOR, dense_operands, library_operands, needs_copy, \
    strided_view_strides

from .accounting import Traffic, TrafficModel, UnitSpec, op_flops
from .base import CostOracle, Objective, UnitCost
from .hardware import Hardware


class AnalyticalOracle(CostOracle):
    """Roofline latency from a :class:`~cost_models.hardware.Hardware` profile (no GPU needed)."""

    name = "analytical"

    def __init__(self, hardware: Hardware | str = "H200", objective: Objective | None = None,
                 implementations: Sequence[str] | None = None):
        super().__init__(objective, implementations)
        self.hw = Hardware.preset(hardware) if isinstance(hardware, str) else hardware
        self.traffic = TrafficModel(self.hw.sector_bytes, self.hw.coalesce_bytes, self.hw.short_run_penalty)

    def measure(self, spec: UnitSpec) -> UnitCost:
        if spec.impl == "library":
            return self._library(spec)
        if spec.impl == INDUCTOR:
            return self._inductor(spec)
        strides = {s: v[1] for s, v in spec.storages.items()}
        read, write = Traffic(), Traffic()
        for o in spec.operands:
            t = self.traffic.access(o.map, o.itemsize, strides)
            if o.role == "r":
                read += t
            else:
                write += t
        hw = self.hw
        dram = read.dram_bytes + write.dram_bytes
        t_mem = dram / hw.bandwidth + (read.l2_bytes + write.l2_bytes) / hw.l2_bandwidth
        t_flops = spec.flops / hw.peak(spec.compute_dtype, spec.tensor_core) if spec.flops else 0.0
        if spec.tensor_core and t_flops:   # Triton templates against the library's peak, worse through maps
            kind = _kind(spec)
            through_maps = any(strided_view_strides(o.map, strides) is None for o in spec.operands)
            t_flops /= hw.eff("triton", kind) * (hw.eff("triton", "maps") if through_maps else 1.0)
        t_idx = (read.index_ops + write.index_ops) / hw.int_ops
        seconds = max(t_mem, t_flops + t_idx) + hw.launch_s
        detail: dict[str, Any] = {"t_mem": t_mem, "t_compute": t_flops + t_idx, "dram_bytes": dram,
                                  "l2_bytes": read.l2_bytes + write.l2_bytes,
                                  "min_run_bytes": min([x for x in (read.min_run_bytes, write.min_run_bytes) if x],
                                                       default=0)}
        return UnitCost(seconds, bytes=read.bytes + write.bytes, flops=spec.flops, detail=detail)

    def _library(self, spec: UnitSpec) -> UnitCost:
        """A library kernel on dense operands: residual copies (gather/scatter) for operands whose maps it
        cannot read in place, the call at the library's efficiency, then the epilogue as an elementwise kernel."""
        hw, g = self.hw, spec.graph
        group = g.groups[spec.unit.kernel]
        kind = group.kind
        ins, outs = library_operands(g, group)
        strides = {s: v[1] for s, v in spec.storages.items()}
        by = {o.tensor: o for o in spec.operands}
        t_copy, copies, dense = 0.0, 0, 0
        for t in ins + outs:
            nbytes = g.tensors[t].nbytes
            dense += nbytes
            o = by.get(t)
            if o is not None and needs_copy(kind, o.map, strides):
                tr = self.traffic.access(o.map, o.itemsize, strides)
                t_copy += (tr.dram_bytes + nbytes) / hw.bandwidth + tr.l2_bytes / hw.l2_bandwidth + hw.launch_s
                copies += 1
        prod = [g.ops[group.ops[0]]] if kind != "attention" else [g.ops[o] for o in group.ops]
        flops = sum(op_flops(g, op.name) for op in prod)
        t_call = max(dense / hw.bandwidth, flops / (hw.peak(spec.compute_dtype, True) * hw.eff("library", kind))) \
            + hw.launch_s
        t_ep, ep_bytes = 0.0, 0.0
        if kind != "attention" and len(group.ops) > 1:   # the epilogue: reads the product, writes the outputs
            ep = Traffic()
            for o in spec.operands:
                if o.tensor not in ins:
                    ep += self.traffic.access(o.map, o.itemsize, strides)
            prod_bytes = sum(g.tensors[t].nbytes for t in outs)
            ep_bytes = ep.bytes + prod_bytes
            t_ep = (ep.dram_bytes + prod_bytes) / hw.bandwidth + ep.l2_bytes / hw.l2_bandwidth + hw.launch_s
        seconds = t_copy + t_call + t_ep
        return UnitCost(seconds, bytes=dense + ep_bytes, flops=spec.flops,
                        detail={"impl": "library", "t_copy": t_copy, "library_copies": copies,
                                "t_call": t_call, "t_epilogue": t_ep})

    def _inductor(self, spec: UnitSpec) -> UnitCost:
        """The group compiled by Inductor on strided operands: residual copies for operands that are not strided
        views, then one kernel at Inductor's efficiency for the group's kind (its epilogue fused)."""
        hw, g = self.hw, spec.graph
        group = g.groups[spec.unit.kernel]
        ins, outs = dense_operands(g, group, INDUCTOR)
        strides = {s: v[1] for s, v in spec.storages.items()}
        by = {o.tensor: o for o in spec.operands}
        t_copy, copies, dense = 0.0, 0, 0
        for t in ins + outs:
            nbytes = g.tensors[t].nbytes
            dense += nbytes
            o = by.get(t)
            if o is not None and needs_copy(INDUCTOR, o.map, strides):
                tr = self.traffic.access(o.map, o.itemsize, strides)
                t_copy += (tr.dram_bytes + nbytes) / hw.bandwidth + tr.l2_bytes / hw.l2_bandwidth + hw.launch_s
                copies += 1
        t_flops = 0.0
        if spec.flops:
            t_flops = spec.flops / (hw.peak(spec.compute_dtype, spec.tensor_core)
                                    * (hw.eff(INDUCTOR, group.kind) if spec.tensor_core else 1.0))
        t_call = max(dense / hw.bandwidth, t_flops) + hw.launch_s
        return UnitCost(t_copy + t_call, bytes=dense, flops=spec.flops,
                        detail={"impl": INDUCTOR, "t_copy": t_copy, "library_copies": copies, "t_call": t_call})

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "hardware": self.hw.name, "source": self.hw.source}


def _kind(spec: UnitSpec) -> str:
    """The kernel group's kind (matmul, conv, attention...), for the efficiency table."""
    g = spec.graph
    if g is not None and spec.unit.kernel in getattr(g, "groups", {}):
        return g.groups[spec.unit.kernel].kind
    return next((o.category for o in spec.ops if o.category in ("matmul", "conv", "attention")), "matmul")

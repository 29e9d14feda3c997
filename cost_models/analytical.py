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

from typing import Any

from .accounting import Traffic, TrafficModel, UnitSpec
from .base import CostOracle, Objective, UnitCost
from .hardware import Hardware


class AnalyticalOracle(CostOracle):
    """Roofline latency from a :class:`~cost_models.hardware.Hardware` profile (no GPU needed)."""

    name = "analytical"

    def __init__(self, hardware: Hardware | str = "H200", objective: Objective | None = None):
        super().__init__(objective)
        self.hw = Hardware.preset(hardware) if isinstance(hardware, str) else hardware
        self.traffic = TrafficModel(self.hw.sector_bytes, self.hw.coalesce_bytes, self.hw.short_run_penalty)

    def measure(self, spec: UnitSpec) -> UnitCost:
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
        t_idx = (read.index_ops + write.index_ops) / hw.int_ops
        seconds = max(t_mem, t_flops + t_idx) + hw.launch_s
        detail: dict[str, Any] = {"t_mem": t_mem, "t_compute": t_flops + t_idx, "dram_bytes": dram,
                                  "l2_bytes": read.l2_bytes + write.l2_bytes,
                                  "min_run_bytes": min([x for x in (read.min_run_bytes, write.min_run_bytes) if x],
                                                       default=0)}
        return UnitCost(seconds, bytes=read.bytes + write.bytes, flops=spec.flops, detail=detail)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "hardware": self.hw.name, "source": self.hw.source}

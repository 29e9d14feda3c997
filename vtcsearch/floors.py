"""HBM / compute floors: the least time a kernel or a whole case can take on the GPU that measures it.

A kernel's floor is ``max(distinct DRAM bytes / bandwidth, FLOPs / peak)``: the bytes are the
analytical oracle's ``dram_bytes`` (what HBM must deliver; a re-read that hits L2 is not
counted), the FLOPs its ``flops``.  A case's floor reads every graph input once and writes
every output once (a mutated buffer such as a KV cache: read once, and only the rows written
into it are written).  Bandwidth and peak are the hardware preset's *measured* numbers where
it has them (H200: 4.3 TB/s copy bandwidth, 790 TFLOP/s bf16), so a floor is reachable.
Measured-over-floor ratios say how far each kernel and each variant is from the hardware.
"""
from __future__ import annotations

from typing import Any

import torch


def hardware(name: str) -> Any:
    """The preset with its measured numbers (cost_models.Hardware)."""
    from cost_models.hardware import Hardware
    return Hardware.preset(name, measured=True)


def floor_us(nbytes: float, flops: float, hw: Any, dtype: Any) -> float:
    """``max(bytes / bandwidth, FLOPs / peak)`` on ``hw``, in microseconds."""
    return max(nbytes / hw.bandwidth, flops / hw.peak(dtype, True)) * 1e6


def kernel_floor_us(row: dict[str, Any], hw: Any, dtype: torch.dtype) -> float | None:
    """Floor of one oracle row (its ``dram_bytes`` or ``bytes``, and ``flops``); None if it has neither."""
    t = floor_us(row.get("dram_bytes", row.get("bytes")) or 0.0, row.get("flops") or 0.0, hw, dtype)
    return t if t > 0 else None


def preset_of(machine: str | None, default: str) -> str:
    """The hardware preset of the GPU named in a row's ``machine`` ("NVIDIA H100 80GB HBM3 (torch ...)"), or
    ``default`` (a modelled row, or a GPU without a preset): a latency is set against the floor of the GPU
    that measured it (an H100's copy bandwidth is 2.83 TB/s, the H200's 4.3)."""
    gpu = (machine or "").split(" (")[0]
    for key, name in (("H200", "H200"), ("H100 NVL", "H100-NVL"), ("H100", "H100"), ("A100", "A100")):
        if key in gpu:
            return name
    return default


def floor_us_on(floor: dict[str, Any] | None, preset: str, dtype: Any) -> float | None:
    """The floor of a case (:func:`case_floor`'s bytes and FLOPs) on another preset's measured numbers."""
    if not floor or floor.get("floor_bytes") is None:
        return None
    t = floor_us(floor["floor_bytes"], floor.get("floor_flops") or 0.0, hardware(preset), dtype)
    return t if t > 0 else None


def row_floor_us(case: dict[str, Any], row: dict[str, Any]) -> float | None:
    """The floor a result row is set against: its case's floor on the GPU that measured the row (the preset
    the floor was computed for when the row names none)."""
    floor = case.get("floor") or {}
    preset = preset_of(row.get("machine"), floor.get("hardware") or "")
    if not preset or preset == floor.get("hardware"):
        return floor.get("floor_us")
    return floor_us_on(floor, preset, case.get("dtype"))


def case_floor(graph: Any, hw: Any, dtype: torch.dtype) -> dict[str, float]:
    """``{"floor_bytes", "floor_flops", "floor_us", "hardware"}`` of a captured graph."""
    from cost_models.accounting import op_flops
    nbytes = sum(t.nbytes for t in graph.tensors.values()
                 if t.is_graph_input or (t.is_output and t.storage_name == t.name))
    for op in graph.movement_ops():
        if op.movement.updates and any(graph.tensors[o].storage_name != o or o in graph.mutations
                                       for o in op.outputs):
            nbytes += sum(graph.tensors[op.inputs[u.source]].nbytes for u in op.movement.updates)
    flops = sum(op_flops(graph, o.name) for o in graph.compute_ops())
    return {"floor_bytes": float(nbytes), "floor_flops": float(flops), "floor_us": floor_us(nbytes, flops, hw, dtype),
            "hardware": hw.name}


def ratio(us: float | None, floor_us: float | None) -> float | None:
    """``us / floor_us`` where both are known."""
    return us / floor_us if us and floor_us else None

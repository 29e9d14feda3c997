"""Per-step and per-conv-layer times of a realized executable (GPU only): where a strategy wins or loses.

``steps``: every step (kernel or residual copy) of an executable timed alone with
:func:`vtcsearch.codegen.timing.bench`, with its floor (:mod:`vtcsearch.floors`) from
the oracle's row of the same unit -> ``steps.csv``.
``conv_layers``: each conv kernel as the strategy realized it (Triton, operands read
through maps for a strategy with virtual tensors, dense for ``vtc_none``) against cuDNN's
conv on dense operands of the same shapes (conv only: eager runs the epilogue as
separate kernels) -> ``conv_layers.csv``.
A measurement that fails is a row with the reason, never a crash of the run.
"""
from __future__ import annotations

from typing import Any

import torch

from .codegen.timing import bench
from .floors import ratio


def _why(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"


def step_rows(exe: Any, floors_by_unit: dict[str, float | None]) -> list[dict[str, Any]]:
    """One row per step of ``exe``: its time alone (us), its floor and the ratio."""
    rows = []
    for st in exe.steps:
        row: dict[str, Any] = {"step": st.name, "step_kind": st.kind, "lowering": st.lowering,
                               "modes": "; ".join(f"{p.name} {p.modes} {p.config}" for p, _ in st.launch.plans)}
        try:
            row["measured_us"] = bench(st.launch).median_us
        except Exception as e:   # reported in the row
            row.update(measured_us=None, error=_why(e))
        row["floor_us"] = floors_by_unit.get(st.name)
        row["x_floor"] = ratio(row["measured_us"], row["floor_us"])
        rows.append(row)
    return rows


def conv_layer_rows(graph: Any, exe: Any) -> list[dict[str, Any]]:
    """One row per conv kernel of ``graph``: the Triton conv of ``exe`` and cuDNN's, in us."""
    aten = torch.ops.aten
    steps = {st.name: st for st in exe.steps}
    rows = []
    for gname, gr in graph.groups.items():
        if gr.kind != "conv":
            continue
        op = graph.ops[gr.ops[0]]
        a = op.node.args
        x_info, w_info = graph.tensors[op.inputs[0]], graph.tensors[op.inputs[1]]
        row: dict[str, Any] = {"kernel": gname, "x": list(x_info.shape), "w": list(w_info.shape),
                               "stride": list(a[3]), "padding": list(a[4]), "groups": a[8],
                               "epilogue_ops": len(gr.ops) - 1, "triton_us": None, "cudnn_us": None, "error": None}
        st = steps.get(gname)
        try:
            if st is not None and st.lowering == "conv":
                row["triton_us"] = bench(st.launch).median_us
        except Exception as e:
            row["error"] = f"triton: {_why(e)}"
        try:
            w = exe.storages[op.inputs[1]]
            b = exe.storages[op.inputs[2]] if len(op.inputs) > 2 else None
            x = torch.randn(x_info.shape, dtype=x_info.dtype, device=w.device)
            row["cudnn_us"] = bench(lambda: aten.convolution(x, w, b, a[3], a[4], a[5], a[6], a[7], a[8])).median_us
        except Exception as e:
            row["error"] = ((row["error"] + "; ") if row["error"] else "") + f"cudnn: {_why(e)}"
        row["x_cudnn"] = ratio(row["triton_us"], row["cudnn_us"])
        rows.append(row)
    return rows

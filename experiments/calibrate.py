"""Calibrate the analytical model's per-implementation efficiencies on the GPU (issue 12).

For every kernel group with a library implementation in a config's workloads
(every case and batch size), the kernel timer of the profiling oracle times it
as realize runs it, three ways:

* ``triton-dense``: vtcsearch's template, every tensor physical;
* ``triton-maps``: the template with the group's operands as virtual as a
  maximal valid strategy makes them (only where that changes its maps);
* ``library``: the library kernel on the physical operands.

The efficiency of each (implementation, kind) is the median, over the
compute-bound groups, of ``flops / (peak * seconds)`` with the hardware
preset's (measured) peak; ``triton/maps`` is the median of triton-dense /
triton-maps.  Writes ``cost_models/calibration/<preset>.json`` (which
:meth:`cost_models.hardware.Hardware.preset` then uses) and a CSV of every
timing beside it::

    python -m experiments.calibrate configs/vision.yaml configs/llama.yaml --hardware H200
"""
from __future__ import annotations

import argparse
import csv
import datetime as _dt
import json
import os
import platform
import statistics
import sys
from typing import Any

import torch

from cost_models.accounting import op_flops
from cost_models.hardware import Hardware
from cost_models.profiling import KernelTimer

CALIBRATION_DIR = os.path.join(os.path.dirname(__file__), "calibration")


def _maximal(v):
    from vtcsearch.core.strategy import Strategy
    edges: set[int] = set()
    for o in v.options:
        if Strategy(v, edges | set(o.edges)).is_valid():
            edges |= set(o.edges)
    return Strategy(v, edges)


def time_groups(graph, vtog, timer: KernelTimer, hw: Hardware, label: str) -> list[dict[str, Any]]:
    """One row per library-capable group: seconds as triton-dense, triton-maps and library."""
    from vtcsearch.core import implementation as im
    from cost_models import AnalyticalOracle
    from cost_models.base import choice_of
    oracle = AnalyticalOracle(hw, implementations=(im.TRITON, im.LIBRARY))
    acc = oracle.accounting(vtog)
    trees = acc.trees_of_choice(choice_of(_maximal(vtog)))
    rows = []
    for u in acc.units:
        if u.kind != "kernel" or len(oracle.unit_implementations(acc, u)) < 2:
            continue
        group = graph.groups[u.kernel]
        phys = oracle.unit_keys(acc, u, {})
        virt = oracle.unit_keys(acc, u, trees)
        flops = sum(op_flops(graph, o) for o in group.ops if graph.ops[o].category in ("matmul", "conv", "attention")) \
            if group.kind != "attention" else acc.kernel_flops[u.kernel]
        dt = next((graph.tensors[t].dtype for t in acc.kernel_io[u.kernel][0]
                   if graph.tensors[t].dtype.is_floating_point), None)
        row: dict[str, Any] = {"case": label, "group": u.kernel, "kind": group.kind, "flops": flops,
                               "dtype": str(dt).replace("torch.", ""),
                               "bytes": sum(graph.tensors[t].nbytes for t in u.tensors)}
        for name, keys, impl in (("triton_dense", phys, "triton"), ("library", phys, "library"),
                                 ("triton_maps", virt if virt != phys else None, "triton")):
            if keys is None:
                row[name] = None
                continue
            try:
                row[name] = timer(acc.spec(u, keys, impl))
            except Exception as e:   # a group the template cannot run: recorded, not fatal
                row[name] = None
                row[f"{name}_error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        rows.append(row)
    return rows


def efficiencies(rows: list[dict[str, Any]], hw: Hardware) -> dict[str, float]:
    """Median efficiency per (implementation, kind) over compute-bound groups, and the maps factor."""
    out: dict[str, list[float]] = {}
    for r in rows:
        if not r["flops"]:
            continue
        peak = hw.peak(getattr(torch, r["dtype"], None), True)
        t_flops, t_mem = r["flops"] / peak, r["bytes"] / hw.bandwidth
        if t_flops < t_mem:
            continue   # memory-bound: says nothing about compute efficiency
        for impl, col in (("triton", "triton_dense"), ("library", "library")):
            if r.get(col):
                out.setdefault(f"{impl}/{r['kind']}", []).append(t_flops / max(r[col] - hw.launch_s, 1e-9))
        if r.get("triton_maps") and r.get("triton_dense"):
            out.setdefault("triton/maps", []).append(r["triton_dense"] / r["triton_maps"])
    return {k: round(min(1.0, statistics.median(v)), 4) for k, v in sorted(out.items())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", nargs="+")
    ap.add_argument("--hardware", default="H200")
    ap.add_argument("--out", default=None, help="JSON path (default cost_models/calibration/<hardware>.json)")
    ap.add_argument("--repeats", type=int, default=20)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("calibration times kernels on a GPU; no CUDA device here", file=sys.stderr)
        return 2
    from experiments.workloads import build_workload
    from vtcsearch.config import load_config, torch_dtype
    from vtcsearch.core.capture import capture
    from vtcsearch.core.vtog import build_vtog
    hw = Hardware.preset(a.hardware)
    timer = KernelTimer("cuda", repeats=a.repeats, warmup=3)
    rows: list[dict[str, Any]] = []
    for path in a.configs:
        cfg = load_config(path)
        for case in cfg.workload.cases:
            for batch in cfg.batch_sizes:
                params = {**cfg.workload.params, **case}
                torch.manual_seed(cfg.seed)
                w = build_workload(cfg.workload.name, size=cfg.workload.size, batch=batch, device="cuda",
                                   dtype=torch_dtype(cfg.dtype), **params)
                g = capture(w.model, w.example_inputs)
                label = f"{cfg.workload.name}:{json.dumps(case, sort_keys=True)}:bs{batch}"
                print(f"== {label}: {len(g.groups)} groups", flush=True)
                rows += time_groups(g, build_vtog(g), timer, hw, label)
    eff = efficiencies(rows, hw)
    out = a.out or os.path.join(CALIBRATION_DIR, f"{hw.name}.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    written_by = {"command": " ".join(["python -m experiments.calibrate"] + (argv or sys.argv[1:])),
                  "machine": f"{platform.node()} {torch.cuda.get_device_name()}",
                  "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    with open(out, "w") as f:
        json.dump({"hardware": hw.name, "efficiency": eff, "groups": len(rows), "written_by": written_by}, f, indent=1)
    keys = sorted({k for r in rows for k in r})
    with open(os.path.splitext(out)[0] + ".csv", "w", newline="") as f:
        wr = csv.DictWriter(f, keys)
        wr.writeheader()
        wr.writerows(rows)
    print(json.dumps(eff, indent=1))
    print(f"wrote {out} ({len(rows)} groups)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

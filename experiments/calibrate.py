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

``--from-db FILE`` needs no GPU: it rebuilds the configs' VTOGs on the meta
device, enumerates every (unit, configuration, implementation) a search may
ask about (the ILP's configuration space, keyed as the profiling oracle keys
its measurements), joins them with the committed measurements in ``FILE`` and
fits the analytical model's constants (:data:`FIT`: the Hardware fields and
efficiencies beyond the roofline) by least squares on ``log(pred / measured)``.
It writes ``cost_models/calibration/<preset>.json`` and, beside it, a CSV of
predicted (before and after) against measured per unit::

    python -m experiments.calibrate --from-db results/vision_blocks/measurements.sqlite \
        configs/vision_blocks.yaml --cases litemla --batch 1 --hardware H200

``--no-split-k`` fits the model without split-K GEMM pricing
(``AnalyticalOracle(split_k=False)``): for measurements taken before the GEMM
autotuner timed split-K kernels, whose times a split-K price would not fit.
"""
from __future__ import annotations

import argparse
import csv
import datetime as _dt
import json
import math
import os
import platform
import statistics
import sys
from typing import Any

import torch

from cost_models.accounting import op_flops
from cost_models.hardware import Hardware
from cost_models.profiling import KernelTimer

CALIBRATION_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cost_models", "calibration")


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


# ---------------------------------------------------------------------------
# calibration from committed measurements (no GPU)
# ---------------------------------------------------------------------------

# (where, name, lower, upper): Hardware fields and EFFICIENCY keys the fit moves, in log space within bounds.
# Not fitted: k_step_s (no committed measurement separates it from program_bandwidth) and the matmul
# efficiencies (LiteMLA's GEMMs are fp32 with M, N <= 17: bandwidth- and grid-bound, they say nothing about
# a compute-bound GEMM's efficiency, which Llama prefill and ViTs depend on), nor triton/maps (a factor on
# the FLOP rate: no compute-bound kernel through a single-piece map was measured).
FIT: tuple[tuple[str, str, float, float], ...] = (
    ("hw", "launch_s", 0.5e-6, 5e-6),
    ("hw", "program_bandwidth", 1e9, 2e11),
    ("hw", "resident_bandwidth", 4e12, 3e13),
    ("hw", "resident_bytes", 1e6, 6e7),
    ("hw", "swap_read_penalty", 1.0, 30.0),
    ("hw", "swap_write_penalty", 1.0, 30.0),
    ("eff", "triton/conv", 1e-4, 1.0),
    ("eff", "library/conv", 1e-4, 1.0),
    ("eff", "triton/conv_grouped", 1e-4, 1.0),
    ("eff", "library/conv_grouped", 1e-4, 1.0),
    ("eff", "triton/conv_depthwise", 1e-4, 1.0),
    ("eff", "library/conv_depthwise", 1e-4, 1.0),
    ("eff", "triton/pieces", 0.02, 1.0),
    ("eff", "library/program", 0.05, 1.0),
    ("eff", "library/gather", 0.02, 1.0),
    # Inductor's convolutions and GEMMs (a profiling search with implementations including inductor measures
    # them); without such measurements they are unconstrained and not written
    ("eff", "inductor/conv", 1e-4, 1.0),
    ("eff", "inductor/conv_grouped", 1e-4, 1.0),
    ("eff", "inductor/conv_depthwise", 1e-4, 1.0),
    ("eff", "inductor/matmul", 1e-3, 1.0),
)


def joined_rows(config_paths: list[str], db: str, cases: list[str] | None = None,
                batches: list[int] | None = None, max_trees: int = 128,
                max_configs: int = 1024, device: str = "") -> tuple[list[dict[str, Any]], int]:
    """Every (unit, configuration, implementation) of the configs' searches that ``db`` measured on a device
    whose key starts with ``device`` (``"cuda:NVIDIA H200"``), as ``{case, unit, kind, impl, spec, seconds}``
    (one row per measurement key), and how many were missing."""
    import sqlite3

    from cost_models import AnalyticalOracle
    from cost_models.profiling import key_hash
    from experiments.workloads import build_workload
    from vtcsearch.config import load_config, torch_dtype
    from vtcsearch.core.capture import capture
    from vtcsearch.core.vtog import build_vtog
    from vtcsearch.run import case_label

    conn = sqlite3.connect(db)
    table = {k: s for k, s, f, d in conn.execute("SELECT key, seconds, feasible, device FROM measurements")
             if f and s and d.startswith(device)}
    conn.close()
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    missing = 0
    for path in config_paths:
        cfg = load_config(path)
        impls = tuple(cfg.oracle_options.get("implementations", ("triton",)))
        for params in cfg.workload.cases:
            label = case_label(params, cfg.workload.name)
            if cases and label not in cases:
                continue
            for batch in (batches or cfg.batch_sizes):
                w = build_workload(cfg.workload.name, size=cfg.workload.size, batch=batch, device="meta",
                                   dtype=torch_dtype(cfg.dtype), **{**cfg.workload.params, **params})
                g = capture(w.model, w.example_inputs)
                v = build_vtog(g)
                oracle = AnalyticalOracle("H200", implementations=impls)
                acc = oracle.accounting(v)
                for spec in oracle.unit_specs(acc, max_trees, max_configs):
                    h = key_hash(spec.key())
                    if h in seen:
                        continue
                    seen.add(h)
                    if h not in table:
                        missing += 1
                        continue
                    u = spec.unit
                    kind = g.groups[u.kernel].kind if u.kind == "kernel" else "copy"
                    rows.append({"case": f"{label}:bs{batch}", "unit": u.name, "kind": kind, "impl": spec.impl,
                                 "spec": spec, "seconds": float(table[h])})
    return rows, missing


def _apply(hw: Hardware, x: dict[str, float]) -> Hardware:
    fields = {n: v for (w, n, _, _), v in zip(FIT, x.values()) if w == "hw"}
    eff = {n: v for (w, n, _, _), v in zip(FIT, x.values()) if w == "eff"}
    return hw.with_(**fields, efficiency={**hw.efficiency, **eff})


def predict(rows: list[dict[str, Any]], hw: Hardware, split_k: bool = True) -> list[float]:
    """The analytical model's seconds for every row under ``hw`` (``split_k``: price split-K GEMMs)."""
    from cost_models import AnalyticalOracle
    oracle = AnalyticalOracle(hw, split_k=split_k)
    return [oracle.measure(r["spec"]).seconds for r in rows]


def log_errors(pred: list[float], meas: list[float]) -> dict[str, float]:
    """Median and 90th percentile of |log(pred / measured)| (and the factors they mean)."""
    import numpy as np
    e = np.abs(np.log(np.asarray(pred) / np.asarray(meas)))
    med, p90 = float(np.median(e)), float(np.percentile(e, 90))
    return {"median_abs_log": round(med, 4), "p90_abs_log": round(p90, 4),
            "median_factor": round(float(np.exp(med)), 3), "p90_factor": round(float(np.exp(p90)), 3),
            "max_factor": round(float(np.exp(e.max())), 2), "n": int(e.size)}


def fit(rows: list[dict[str, Any]], hw: Hardware, sweeps: int = 6, split_k: bool = True
        ) -> tuple[Hardware, dict[str, Any]]:
    """Least squares on log(pred / measured) over :data:`FIT` (coordinate descent on a log grid, then a
    golden-section refinement per parameter; ~2,000 model evaluations, ~1 minute), both settings of
    ``tile2d_pieces`` tried.  Returns the fitted hardware and, per parameter, its value and whether the
    measurements constrain it (the loss moves when it is halved or doubled)."""
    import numpy as np
    meas = np.log(np.asarray([r["seconds"] for r in rows]))
    # each (unit, implementation) weighs one in total: its many configurations (LiteMLA's bmm has 70)
    # must not drown the units measured in one or two
    count: dict[tuple[str, str], int] = {}
    for r in rows:
        count[(r["unit"], r["impl"])] = count.get((r["unit"], r["impl"]), 0) + 1
    weight = np.asarray([1.0 / count[(r["unit"], r["impl"])] for r in rows])

    def loss(h: Hardware) -> float:
        return float(np.sum(weight * (np.log(np.asarray(predict(rows, h, split_k))) - meas) ** 2))

    def start(h: Hardware) -> dict[str, float]:
        return {f"{w}:{n}": (getattr(h, n) if w == "hw" else _efficiency(h, n)) or (lo * hi) ** 0.5
                for w, n, lo, hi in FIT}

    best: tuple[float, Hardware] | None = None
    for pieces in (True, False):
        h0 = hw.with_(tile2d_pieces=pieces)
        x = {k: min(max(v, FIT[i][2]), FIT[i][3]) for i, (k, v) in enumerate(start(h0).items())}
        cur = loss(_apply(h0, x))
        for sweep in range(sweeps):
            span = 2.0 ** (3 - sweep) if sweep < 4 else 1.2
            improved = False
            for i, (k, v) in enumerate(list(x.items())):
                lo, hi = FIT[i][2], FIT[i][3]
                for c in np.exp(np.linspace(-np.log(span), np.log(span), 9)) * v:
                    c = float(min(max(c, lo), hi))
                    trial = {**x, k: c}
                    val = loss(_apply(h0, trial))
                    if val < cur - 1e-12:
                        cur, x, improved = val, trial, True
            if not improved and sweep >= 3:
                break
        try:   # polish: Powell on the log parameters, within the bounds
            from scipy.optimize import minimize
            keys = list(x)
            bounds = [(math.log(FIT[i][2]), math.log(FIT[i][3])) for i in range(len(keys))]
            res = minimize(lambda z: loss(_apply(h0, dict(zip(keys, np.exp(z))))),
                           np.log([x[k] for k in keys]), method="Powell", bounds=bounds,
                           options={"maxfev": 1500, "xtol": 1e-3, "ftol": 1e-6})
            if res.fun < cur:
                cur, x = float(res.fun), dict(zip(keys, map(float, np.exp(res.x))))
        except ImportError:
            pass
        h = _apply(h0, x)
        if best is None or cur < best[0]:
            best = (cur, h)
    assert best is not None
    h = best[1]
    base = loss(h)
    info: dict[str, Any] = {}
    xs = start(h)
    for i, (k, v) in enumerate(xs.items()):
        moved = max(abs(loss(_apply(h, {**xs, k: v * f})) - base) for f in (0.5, 2.0))
        info[k] = {"value": v, "constrained": bool(moved > 1e-3 * max(base, 1e-9))}
    info["tile2d_pieces"] = {"value": h.tile2d_pieces, "constrained": True}
    return h, info


def _efficiency(h: Hardware, key: str) -> float:
    """The efficiency the analytical model uses for ``key`` ("impl/kind"), an uncalibrated Inductor kind
    included (``AnalyticalOracle.inductor_eff``: the better of the library's and the template's)."""
    from cost_models import AnalyticalOracle
    impl, kind = key.split("/")
    if impl == "inductor":
        return AnalyticalOracle(h).inductor_eff(kind)
    return h.eff(impl, kind)


def from_db(a: argparse.Namespace, argv: list[str] | None) -> int:
    """``--from-db``: fit the analytical model to committed measurements (no GPU)."""
    hw0 = Hardware.preset(a.hardware, calibrated=False)
    cases = [c.strip() for c in a.cases.split(",")] if a.cases else None
    rows, missing = joined_rows(a.configs, a.from_db, cases, a.batch, device=f"cuda:NVIDIA {a.hardware}")
    if not rows:
        print(f"no measurement of {a.from_db} matches the configs' candidate kernels", file=sys.stderr)
        return 2
    print(f"{len(rows)} measured (unit, configuration, implementation) rows joined ({missing} not measured)")
    meas = [r["seconds"] for r in rows]
    before = predict(rows, hw0, a.split_k)
    hw, info = fit(rows, hw0, split_k=a.split_k)
    after = predict(rows, hw, a.split_k)
    err = {"before": log_errors(before, meas), "after": log_errors(after, meas)}
    print(json.dumps(err, indent=1))
    out = a.out or os.path.join(CALIBRATION_DIR, f"{hw.name}.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    written_by = {"command": " ".join(["python -m experiments.calibrate"] + list(argv if argv is not None
                                                                                   else sys.argv[1:])),
                  "machine": f"{platform.node()} ({platform.machine()}, no GPU: fitted to {a.from_db})",
                  "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    constrained = {k: v for k, v in info.items() if v["constrained"]}
    hw_fields = {k.split(":", 1)[1]: _round(v["value"]) for k, v in constrained.items() if k.startswith("hw:")}
    hw_fields["tile2d_pieces"] = hw.tile2d_pieces
    eff = {k.split(":", 1)[1]: _round(v["value"]) for k, v in constrained.items() if k.startswith("eff:")}
    doc = {"preset": hw.name, "source": f"fitted to {a.from_db} ({len(rows)} measured units)",
           "hardware": hw_fields, "efficiency": eff, "errors": err, "split_k": a.split_k,
           "unconstrained": sorted(k for k, v in info.items() if not v["constrained"]),
           "written_by": written_by}
    keep_graph_gap(out, doc)
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    with open(os.path.splitext(out)[0] + ".csv", "w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["# " + written_by["command"], written_by["machine"], written_by["date"]])
        wr.writerow(["case", "unit", "kind", "impl", "measured_us", "pred_before_us", "pred_after_us",
                     "after_over_measured"])
        for r, b, p in sorted(zip(rows, before, after), key=lambda z: (z[0]["case"], z[0]["unit"], z[0]["impl"])):
            wr.writerow([r["case"], r["unit"], r["kind"], r["impl"], f"{r['seconds'] * 1e6:.2f}", f"{b * 1e6:.2f}",
                         f"{p * 1e6:.2f}", f"{p / r['seconds']:.3f}"])
    print(json.dumps({"hardware": hw_fields, "efficiency": eff}, indent=1))
    print(f"wrote {out} and {os.path.splitext(out)[0]}.csv")
    return 0


def keep_graph_gap(path: str, doc: dict[str, Any]) -> None:
    """Keep the graph gap of the calibration file being replaced: units timed alone do not show it (the fit
    above runs without it), so it comes from another fit, to whole graphs (experiments.oracle_accuracy
    --fit-gap)."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        old = json.load(f)
    if "graph_gap_s" in old.get("hardware", {}):
        doc["hardware"]["graph_gap_s"] = old["hardware"]["graph_gap_s"]
        doc["graph_gap"] = old.get("graph_gap")


def _round(v: Any) -> Any:
    return float(f"{v:.4g}") if isinstance(v, float) else v


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", nargs="+")
    ap.add_argument("--hardware", default="H200")
    ap.add_argument("--out", default=None, help="JSON path (default cost_models/calibration/<hardware>.json)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--from-db", default=None, metavar="SQLITE",
                    help="fit to a committed profiling measurements file instead of timing (no GPU)")
    ap.add_argument("--cases", default=None, help="with --from-db: comma-separated case labels of the configs")
    ap.add_argument("--batch", type=int, action="append", default=None, help="with --from-db: batch size(s)")
    ap.add_argument("--no-split-k", dest="split_k", action="store_false",
                    help="with --from-db: price GEMMs without split-K (measurements from before split-K)")
    a = ap.parse_args(argv)
    if a.from_db:
        return from_db(a, argv)
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

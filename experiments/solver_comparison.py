"""The solver comparison study: which VTOGs, oracles and solvers, run into one table.

Used by ``notebooks/solver_comparison.ipynb`` and by the recording run that
fills a measurements file on a GPU, so both see exactly the same VTOGs::

    python -m experiments.solver_comparison record --db results/solver_measurements/h100.sqlite [--full]

``record`` runs the ILP (which asks for every configuration any solver can
reach) and the greedy search with the profiling oracle on every case; the
notebook then replays the file with the recorded oracle on a CPU.
"""
from __future__ import annotations

import argparse
import math
import platform
import time
import traceback
import warnings
from typing import Any, Callable, Iterable, Sequence

from cost_models import CostOracle
from vtcsearch.core.vtog import VTOG, build_vtog

from solvers import get_solver
from solvers.base import SolveResult, SolverRefused

# (case name, workload, builder parameters)
WORKLOADS: list[tuple[str, str, dict[str, Any]]] = [
    ("llama3-attention", "llama3", dict(part="attention")),
    ("llama3-layer", "llama3", dict(part="layer")),
    ("gemma2-attention", "gemma2", dict(part="attention")),
    ("shufflenet", "shufflenet", {}),
    ("yolo11n", "yolo11", dict(variant="n")),
    ("efficientvit", "efficientvit", dict(head="seg")),
]
SOLVER_ORDER = ["none", "all", "greedy", "optuna", "ilp", "exhaustive"]


def workload_vtogs(size: str = "full", names: Iterable[str] | None = None) -> tuple[list[tuple[str, VTOG]], dict]:
    """VTOGs of the workloads that exist and capture (meta device); and why the others did not."""
    out, failed = [], {}
    try:
        from experiments.workloads import build_workload
    except ImportError as e:
        return [], {"workloads": f"experiments.workloads not importable: {e}"}
    from vtcsearch.core.capture import capture
    want = set(names) if names is not None else None
    for case, name, kw in WORKLOADS:
        if want is not None and case not in want:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                w = build_workload(name, size=size, **kw)
                out.append((case, build_vtog(capture(w.model, w.example_inputs))))
        except Exception as e:  # a workload or a core stage not ready yet: reported, not fatal
            failed[case] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return out, failed


def synthetic_vtogs(nodes: Sequence[int] = (10, 20, 40, 80), seed: int = 0, **cfg: Any) -> list[tuple[str, VTOG]]:
    """Random VTOGs of growing size (``experiments.synthetic``), meta-device shapes where bytes matter."""
    from experiments.synthetic import random_vtog
    cfg = {"batch": 2, "seq": 128, "dims": (128, 256, 512), **cfg}
    return [(f"synthetic-{n}", random_vtog(target_nodes=n, seed=seed + k, **cfg)) for k, n in enumerate(nodes)]


CI_WORKLOADS = ("llama3-attention", "gemma2-attention")
BUDGETS: dict[str, Any] = {"optuna": 60, "ilp": 60}


def cases(full: bool = False) -> tuple[list[tuple[str, VTOG]], dict]:
    """The study's VTOGs: workloads (full sizes on meta), small synthetic VTOGs that exhaustive search
    can settle, and synthetic ones of growing size.  ``full`` adds the CNNs and larger VTOGs."""
    from experiments.synthetic import small_vtogs
    wl, failed = workload_vtogs("full", None if full else CI_WORKLOADS)
    if not full:
        failed = {k: v for k, v in failed.items() if k in CI_WORKLOADS}
    small = [(f"small-{k}", v) for k, v in enumerate(small_vtogs(4, max_points=8192, seed=1, motifs=(3, 5),
                                                                  batch=2, seq=128, dims=(128, 256, 512)))]
    syn = synthetic_vtogs((20, 40, 80, 160, 500, 1000) if full else (20, 40, 80))
    return wl + small + syn, failed


def run_study(cases_: Sequence[tuple[str, VTOG]], oracles: dict[str, Callable[[], CostOracle]],
              solvers: Sequence[str] = SOLVER_ORDER, budgets: dict[str, Any] | None = None,
              seed: int = 0, log: Callable[[str], None] | None = None) -> tuple[Any, dict]:
    """Every solver on every case with every oracle: a DataFrame of results and the traces.

    ``quality`` columns: ``reference`` is the exhaustive optimum where exhaustive
    ran, else the ILP's (exact when it says optimal); ``gap`` is relative to it.
    """
    import pandas as pd
    budgets = {**BUDGETS, **(budgets or {})}
    rows: list[dict[str, Any]] = []
    traces: dict[tuple[str, str, str], Any] = {}
    for case, v in cases_:
        for oname, make in oracles.items():
            oracle = make()
            for s in solvers:
                t0 = time.perf_counter()
                try:
                    r: SolveResult = get_solver(s)(v, oracle, budget=budgets.get(s), seed=seed)
                    r.strategy.validate()
                    row = r.summary()
                    traces[case, oname, s] = r.trace_frame()
                except SolverRefused:
                    row = {"solver": s, "status": "refused"}
                except Exception as e:  # a solver failing on one case is a result, not a crash
                    row = {"solver": s, "status": f"error: {type(e).__name__}: {e}"[:200]}
                    if log:
                        log(traceback.format_exc())
                row.update(case=case, oracle=oname, nodes=v.nx.number_of_nodes(), options=len(v.options),
                           wall_total_s=time.perf_counter() - t0)
                rows.append(row)
                if log:
                    log(f"{case:20s} {oname:10s} {s:10s} {row.get('objective', float('nan')) * 1e6:12.3f} "
                        f"{row['status']}")
    df = pd.DataFrame(rows)
    ref = {}
    for (case, oname), g in df.groupby(["case", "oracle"]):
        ok = g[g.status.isin(["optimal"]) & g.objective.notna()] if "objective" in g else g.iloc[0:0]
        ex = ok[ok.solver == "exhaustive"]
        il = ok[ok.solver == "ilp"]
        ref[case, oname] = (ex.objective.iloc[0] if len(ex) else il.objective.iloc[0] if len(il) else math.nan,
                            "exhaustive" if len(ex) else "ilp" if len(il) else "none")
    df["reference"] = [ref[c, o][0] for c, o in zip(df.case, df.oracle)]
    df["reference_from"] = [ref[c, o][1] for c, o in zip(df.case, df.oracle)]
    df["gap"] = (df.objective - df.reference) / df.reference
    return df, traces


def record(db: str, full: bool = False, repeats: int = 10, warmup: int = 3, log=print) -> dict[str, Any]:
    """Fill ``db`` with profiling measurements of every configuration the study's solvers ask for.

    Measures the ILP's whole configuration space (which contains every
    configuration the other solvers can reach when no cap binds) without
    needing OR-Tools, then runs the solvers that are importable here with the
    notebook's budgets and seed, so the recorded oracle can answer all of them.
    """
    import torch

    from cost_models.hardware import measure
    from cost_models.profiling import ProfilingOracle
    from solvers.ilp import configuration_space
    t0 = time.perf_counter()
    cs, failed = cases(full)
    out: dict[str, Any] = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else platform.node(),
                           "failed_cases": failed, "cases": {}}
    for case, v in cs:
        t1 = time.perf_counter()
        oracle = ProfilingOracle(db, repeats=repeats, warmup=warmup)
        space = configuration_space(v, oracle)
        acc = oracle.accounting(v)
        # configurations no acyclic strategy realizes are never measured (cost inf, never chosen)
        inf = sum(not math.isfinite(oracle.unit_cost(acc, u, keys).seconds) for u, keys in space)
        row: dict[str, Any] = {"configurations": len(space), "impossible_or_infeasible": inf,
                               "space_s": time.perf_counter() - t1, "stats": oracle.stats.snapshot()}
        runnable = []
        for s in SOLVER_ORDER:
            try:
                get_solver(s)
                runnable.append(s)
            except ImportError:
                row.setdefault("skipped", []).append(s)
        df, _ = run_study([(case, v)], {"profiling": lambda: ProfilingOracle(db, repeats=repeats, warmup=warmup)},
                          solvers=runnable)
        row["rows"] = df[[c for c in ("solver", "objective", "measurements", "status") if c in df]].to_dict("records")
        row["wall_s"] = time.perf_counter() - t1
        out["cases"][case] = row
        log(f"{case}: {len(space)} configurations, {inf} impossible/infeasible, {row['wall_s']:.1f}s; "
            + ", ".join(f"{r['solver']}={r.get('objective', float('nan')) * 1e6:.1f}us" for r in row["rows"]))
    try:
        out["hardware"] = measure()
    except Exception as e:
        out["hardware"] = {"error": str(e)}
    out["wall_s"] = time.perf_counter() - t0
    return out


def main(argv: Sequence[str] | None = None) -> None:
    import json
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="fill a measurements file with the profiling oracle")
    r.add_argument("--db", required=True)
    r.add_argument("--full", action="store_true")
    r.add_argument("--repeats", type=int, default=10)
    r.add_argument("--summary", default=None, help="write a JSON summary here")
    a = ap.parse_args(argv)
    if a.cmd == "record":
        res = record(a.db, a.full, a.repeats)
        if a.summary:
            with open(a.summary, "w") as f:
                json.dump(res, f, indent=1, default=str)


if __name__ == "__main__":
    main()

"""How each solver's time grows with VTOG size: writes ``results/solver_scaling/`` (CSV, PNG, README).

    python -m experiments.solver_scaling                 # 25 .. 2,000 VTOG nodes
    python -m experiments.solver_scaling --full          # up to 4,000
    python -m experiments.solver_scaling --sizes 50 100  # custom

Synthetic VTOGs (:mod:`experiments.synthetic`), the analytical oracle (H200),
one CPU core for CP-SAT.  Each row carries the machine and the date.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import time
import warnings
from typing import Any, Sequence

from cost_models import AnalyticalOracle

from solvers import get_solver
from solvers.base import SolverRefused

SOLVERS = ["none", "all", "greedy", "ilp", "optuna", "exhaustive"]
BUDGETS: dict[str, Any] = {"optuna": 50, "ilp": 120}


def machine() -> dict[str, Any]:
    import optuna
    import ortools
    import torch
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    return {"machine": platform.node(), "cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "ortools": ortools.__version__, "optuna": optuna.__version__,
            "date": dt.datetime.now().isoformat(timespec="seconds")}


def run(sizes: Sequence[int], out: str = "results/solver_scaling", seed: int = 0,
        solvers: Sequence[str] = SOLVERS, log=print):
    import pandas as pd

    from experiments.synthetic import random_vtog
    env = machine()
    rows = []
    for n in sizes:
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            v = random_vtog(target_nodes=n, seed=seed, batch=2, seq=64, dims=(128, 256, 512))
        gen = time.perf_counter() - t0
        for s in solvers:
            oracle = AnalyticalOracle("H200")
            kw = {"workers": 1} if s == "ilp" else {}
            t0 = time.perf_counter()
            try:
                r = get_solver(s)(v, oracle, budget=BUDGETS.get(s), seed=seed, **kw)
                row = r.summary()
            except SolverRefused:
                row = {"solver": s, "status": "refused"}
            row.update(target=n, nodes=v.nx.number_of_nodes(), options=len(v.options),
                       tensors=len(v.graph.tensors), capture_s=gen, total_s=time.perf_counter() - t0, **env)
            rows.append(row)
            log(f"{n:6d} nodes={row['nodes']:6d} {s:10s} {row.get('wall_s', float('nan')):8.2f}s "
                f"{row.get('objective', float('nan')) * 1e6:10.2f}us {row['status']}")
    df = pd.DataFrame(rows)
    ilp = df[df.solver == "ilp"].set_index("target").objective
    df["gap_to_ilp"] = [(o - ilp.get(t, float("nan"))) / ilp.get(t, float("nan")) for o, t in
                        zip(df.get("objective", pd.Series([float("nan")] * len(df))), df.target)]
    os.makedirs(out, exist_ok=True)
    df.to_csv(os.path.join(out, "scaling.csv"), index=False)
    _plot(df, os.path.join(out, "scaling.png"), env)
    _readme(df, os.path.join(out, "README.md"), env)
    return df


def _plot(df, path: str, env: dict[str, Any]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ok = df[df.status != "refused"]
    fig, ax = plt.subplots(1, 3, figsize=(15, 4.2))
    for s, g in ok.groupby("solver"):
        g = g.sort_values("nodes")
        ax[0].plot(g.nodes, g.wall_s, "o-", label=s)
        ax[1].plot(g.nodes, g.unit_queries, "o-", label=s)
        ax[2].plot(g.nodes, 100 * g.gap_to_ilp, "o-", label=s)
    for a, t in zip(ax, ["solver wall time [s]", "oracle configuration queries", "gap to ILP [%]"]):
        a.set_xscale("log")
        a.set_xlabel("VTOG nodes")
        a.set_title(t)
        a.grid(alpha=0.3)
    ax[0].set_yscale("log")
    ax[1].set_yscale("log")
    ax[2].set_yscale("symlog", linthresh=1)
    ax[0].axhline(60, color="grey", ls="--", lw=0.8)
    ax[0].legend(fontsize=8)
    fig.suptitle(f"solver scaling, analytical oracle (H200), 1 core: {env['cpu']} ({env['date'][:10]})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _readme(df, path: str, env: dict[str, Any]) -> None:
    piv = df.pivot_table(index="nodes", columns="solver", values="wall_s")
    lines = ["# Solver scaling", "",
             "Synthetic VTOGs (`experiments.synthetic.random_vtog`, meta shapes batch 2, seq 64, widths 128-512), "
             "analytical oracle (H200 preset), CP-SAT on one worker; `python -m experiments.solver_scaling`.", "",
             f"Machine: {env['machine']}, {env['cpu']}, {env['cores']} cores; python {env['python']}, "
             f"torch {env['torch']}, ortools {env['ortools']}, optuna {env['optuna']}; date {env['date']}.", "",
             "Wall time per solver [s] (exhaustive: only where its space is at most 65,536 points):", "",
             "| nodes | " + " | ".join(piv.columns) + " |", "|---" * (len(piv.columns) + 1) + "|"]
    for n, r in piv.iterrows():
        lines.append(f"| {n} | " + " | ".join("" if r[c] != r[c] else f"{r[c]:.2f}" for c in piv.columns) + " |")
    lines += ["", "Full table: `scaling.csv`; plot: `scaling.png`."]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="*", default=None)
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--out", default="results/solver_scaling")
    ap.add_argument("--solvers", nargs="*", default=SOLVERS)
    a = ap.parse_args(argv)
    sizes = a.sizes or ([25, 50, 100, 200, 500, 1000, 2000, 4000] if a.full else [25, 50, 100, 200, 500, 1000, 2000])
    run(sizes, a.out, solvers=a.solvers)


if __name__ == "__main__":
    main()

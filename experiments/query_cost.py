"""Time to price every option of a whole model with the analytical oracle (issue 13, fast cost queries).

    python3 -m experiments.query_cost shufflenet                  # whole ShuffleNetV2 x1.0 at 224
    python3 -m experiments.query_cost yolo11 variant=s
    python3 -m experiments.query_cost efficientvit
    python3 -m experiments.query_cost llama3 part=model n_layers=32 phase=decode
    python3 -m experiments.query_cost tv_shufflenet_v2_x0_5 resolution=32     # torchvision, held out
    python3 -m experiments.query_cost shufflenet --profile        # cProfile of the pricing

Prices the ILP's configuration space (:meth:`cost_models.Accounting.configuration_space`): every
(unit, configuration) once, and prints the per-query cost (wall and CPU seconds: the machine may be
shared).  Most configurations of a copy unit are impossible (no acyclic strategy gives both maps
together) and cheap to answer; ``possible`` counts the others.
"""
from __future__ import annotations

import sys
import time


def _build(name: str, params: dict):
    import torch
    if name.startswith("tv_"):
        import torchvision
        res = int(params.pop("resolution", 32))
        model = getattr(torchvision.models, name[3:])().eval()
        return model, (torch.randn(1, 3, res, res),)
    from experiments.workloads import build_workload
    w = build_workload(name, device="meta", **params)
    return w.model, w.example_inputs


def model_params(argv: list[str]) -> dict:
    """The model's ``key=value`` arguments (numbers as ints)."""
    params = dict(a.split("=", 1) for a in argv[1:] if "=" in a and not a.startswith("--"))
    return {k: int(v) if v.isdigit() else v for k, v in params.items()}


def main(argv: list[str]) -> None:
    from cost_models import get_oracle, paused_gc
    from vtcsearch.core.capture import capture
    from vtcsearch.core.vtog import build_vtog

    name = argv[0]
    params = model_params(argv)
    t0 = time.perf_counter()
    model, inputs = _build(name, params)
    graph = capture(model, inputs)
    vtog = build_vtog(graph)
    t1 = time.perf_counter()
    oracle = get_oracle("analytical")
    acc = oracle.accounting(vtog)
    space = acc.configuration_space()
    t2 = time.perf_counter()
    c2 = time.process_time()
    prof = None
    if "--profile" in argv:
        import cProfile
        prof = cProfile.Profile()
        prof.enable()
    possible = 0
    with paused_gc():     # as the ILP prices them
        for u, keys in space:
            possible += oracle.unit_cost(acc, u, keys).feasible
    t3 = time.perf_counter()
    c3 = time.process_time()
    if prof is not None:
        import pstats
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(30)
    q = max(1, oracle.stats.unit_queries)
    print(f"{name} {params}: tensors={len(graph.tensors)} options={len(vtog.options)} units={len(acc.units)} "
          f"queries={oracle.stats.unit_queries} possible={possible} capture+vtog={t1 - t0:.1f}s "
          f"enumerate={t2 - t1:.1f}s price={t3 - t2:.1f}s (cpu {c3 - c2:.1f}s) "
          f"per_query={(t3 - t2) / q * 1e3:.3f}ms (cpu {(c3 - c2) / q * 1e3:.3f}ms) "
          f"max_query={oracle.stats.max_query_seconds * 1e3:.1f}ms errors={oracle.stats.errors}")


if __name__ == "__main__":
    main(sys.argv[1:])

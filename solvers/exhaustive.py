"""Exhaustive search: every points-to graph of a small VTOG (the ground truth).

Every candidate tensor is physical or takes one of its options; assignments
that close a cycle are pruned during the depth-first enumeration, the rest are
costed incrementally.  Points are then validated by the core in order of
objective, and the first valid one is the optimum, so the answer is exact for
the oracle and the core's rules.  ``budget`` is the largest number of points
(default 65,536); a larger VTOG is refused with :class:`SolverRefused`.
"""
from __future__ import annotations

import math

from cost_models import CostOracle
from cost_models.accounting import LocalStrategy
from cost_models.state import SearchState
from vtcsearch.core.strategy import StrategyError
from vtcsearch.core.vtog import VTOG

from .base import Run, SolveResult, SolverRefused, SolverStatus, usable_options

NAME = "exhaustive"
DECOMPOSABLE = True   # solved part by part through solvers.decompose: an exponential search gains most
DECOMPOSE = True
DEFAULT_LIMIT = 1 << 16


def space_size(vtog: VTOG, oracle: CostOracle) -> int:
    """Number of assignments (tensor -> physical or one option) before pruning cycles."""
    state = SearchState(oracle, vtog)
    return math.prod(1 + len(v) for v in usable_options(state).values())


def solve(vtog: VTOG, oracle: CostOracle, budget: int | None = None, seed: int = 0,
          keep_points: bool = False) -> SolveResult:
    limit = DEFAULT_LIMIT if budget is None else int(budget)
    run = Run(NAME, vtog, oracle)
    state = SearchState(oracle, vtog)
    opts = usable_options(state)
    size = math.prod(1 + len(v) for v in opts.values())
    if size > limit:
        raise SolverRefused(f"exhaustive: this VTOG has {size:,} assignments over {len(opts)} candidate tensors, "
                            f"more than the limit {limit:,}; use the 'ilp' solver (exact) or raise budget")
    cands = list(opts)
    points: list[tuple[float, tuple[int, ...]]] = []

    def rec(i: int) -> None:
        if i == len(cands):
            points.append((state.objective(), tuple(sorted(state.choice.values()))))
            run.best = min(run.best, points[-1][0])
            return
        t = cands[i]
        rec(i + 1)
        for o in opts[t]:
            mv = state.propose(t, o)
            if mv.cycle:
                continue
            state.apply(mv)
            rec(i + 1)
            state.apply(state.propose(t, None))

    rec(0)
    points.sort(key=lambda p: (p[0], len(p[1]), p[1]))
    checked = 0
    best = None
    for val, options in points:
        if not math.isfinite(val):
            break
        checked += 1
        s = LocalStrategy(vtog, [e for o in options for e in vtog.options[o].edges], state.acc)
        try:
            s.validate()
        except StrategyError:
            continue
        best = (val, options, s)
        break
    run.record(best[0] if best else math.inf, points=len(points), validated=checked)
    info = {"points": len(points), "space": size, "validated": checked}
    if keep_points:
        info["objectives"] = [p[0] for p in points]
    if best is None:  # nothing finite and valid: all physical is always valid
        return run.finish([], SolverStatus.OPTIMAL, info)
    return run.finish(list(best[1]), SolverStatus.OPTIMAL, info, validated=best[2])

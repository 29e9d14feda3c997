"""What every solver returns, and the bookkeeping they share.

A solver is ``solve(vtog, oracle, budget=None, seed=0, **options) -> SolveResult``.
Its strategy is always validated by the core (``Strategy.validate``); its
objective is the oracle's prediction for that strategy; ``oracle_calls`` counts
strategy-level queries l(C), ``unit_queries`` the (unit, configuration) costs
asked for, ``measurements`` the real timings they caused (profiling oracle).
"""
from __future__ import annotations

import enum
import math
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from cost_models import CostOracle
from cost_models.accounting import LocalStrategy
from cost_models.state import SearchState
from vtcsearch.core.strategy import Strategy, StrategyError
from vtcsearch.core.vtog import VTOG


class SolverStatus(enum.StrEnum):
    """What a solver's answer is known to be (a ``str``: JSON and CSV files keep the plain value)."""

    OPTIMAL = "optimal"                    # proven optimal for the oracle (exhaustive, or CP-SAT with a proof)
    FEASIBLE = "feasible"                  # valid, not proven optimal: the ILP's info has its bound and gap
    GREEDY_INCUMBENT = "greedy_incumbent"  # the ILP found nothing better than greedy's (valid) solution
    HEURISTIC = "heuristic"                # greedy, Optuna: no claim
    REFERENCE = "reference"                # none / all: fixed strategies to compare against


class SolverRefused(ValueError):
    """The solver will not run on this input (too large for exhaustive search, say)."""


@dataclass
class SolveResult:
    solver: str
    strategy: Strategy
    options: list[int]
    objective: float
    latency_s: float
    peak_bytes: int | None
    oracle_calls: int
    unit_queries: int
    measurements: int
    cache_hits: int
    wall_s: float
    status: SolverStatus
    trace: list[dict[str, Any]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    oracle_errors: int = 0                       # exceptions inside the oracle, answered as infeasible

    def summary(self) -> dict[str, Any]:
        """One flat row (for a DataFrame)."""
        return {"solver": self.solver, "objective": self.objective, "latency_us": self.latency_s * 1e6,
                "peak_mib": (self.peak_bytes or 0) / 2 ** 20, "virtual": len(self.strategy.virtual),
                "eliminated": len(self.strategy.eliminated_ops()), "oracle_calls": self.oracle_calls,
                "unit_queries": self.unit_queries, "measurements": self.measurements,
                "cache_hits": self.cache_hits, "wall_s": self.wall_s, "status": self.status,
                "oracle_errors": self.oracle_errors}

    def trace_frame(self):
        import pandas as pd
        return pd.DataFrame(self.trace)


class Run:
    """Counts oracle statistics and wall time from the start of a solve; records the trace."""

    def __init__(self, name: str, vtog: VTOG, oracle: CostOracle):
        self.name, self.vtog, self.oracle = name, vtog, oracle
        self.t0 = time.perf_counter()
        self.s0 = oracle.stats.snapshot()
        self.trace: list[dict[str, Any]] = []
        self.best = math.inf

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def delta(self, key: str) -> int:
        return int(self.oracle.stats.snapshot()[key] - self.s0[key])

    def record(self, objective: float, **extra: Any) -> None:
        self.best = min(self.best, objective)
        self.trace.append({"step": len(self.trace), "wall_s": self.elapsed(), "oracle_calls": self.delta("calls"),
                           "unit_queries": self.delta("unit_queries"), "measurements": self.delta("measurements"),
                           "objective": objective, "best": self.best, **extra})

    def finish(self, options: Iterable[int], status: SolverStatus, info: Mapping[str, Any] | None = None,
               validated: Strategy | None = None, impl: Mapping[str, str] | None = None) -> SolveResult:
        """Validate with the core (dropping the latest options until valid) and evaluate the result;
        ``impl``: kernel group -> implementation (default: each group's cheapest for the final maps)."""
        opts = list(options)
        dropped = 0
        strategy = validated
        if strategy is None and getattr(self.vtog, "parent", None) is not None:
            # a part of a decomposed search: solvers.decompose validates the union of the parts (and solves
            # the whole when a seam fails), so a whole-graph validation per part would only repeat it
            strategy = self.oracle.accounting(self.vtog).strategy(
                [e for o in opts for e in self.vtog.options[o].edges])
        while strategy is None:
            s = LocalStrategy(self.vtog, [e for o in opts for e in self.vtog.options[o].edges],
                              self.oracle.accounting(self.vtog))
            try:
                s.validate()
                strategy = s
            except StrategyError as e:
                if not opts:
                    raise
                info = {**(info or {}), "last_rejection": str(e)}
                opts.pop()
                dropped += 1
        if impl is None or dropped:   # the implementations that suit the final maps
            impl = best_implementations(self.oracle, strategy)
        strategy.set_implementations(impl)
        ev = self.oracle.evaluate(strategy, rows=False)
        info = {**(info or {}), "dropped_by_final_validation": dropped} if dropped else dict(info or {})
        return SolveResult(self.name, strategy.detached(), sorted(opts), ev.objective, ev.latency_s, ev.peak_bytes,
                           self.delta("calls"), self.delta("unit_queries"), self.delta("measurements"),
                           self.delta("cache_hits"), self.elapsed(), SolverStatus(status), self.trace, info,
                           oracle_errors=self.delta("errors"))


def best_implementations(oracle: CostOracle, strategy: Strategy) -> dict[str, str]:
    """Kernel group -> its cheapest implementation (of the oracle's) under ``strategy``'s maps; only
    non-default entries.  Each group's cheapest alone, then Inductor for a pointwise group wherever Inductor
    inlining it into a neighbour already on Inductor makes that cheaper (``Accounting.region_fusions``; each
    switch only adds savings, so a few passes settle it)."""
    if len(oracle.implementations) == 1:
        return {}
    from cost_models.base import all_physical, choice_of
    from vtcsearch.core.implementation import INDUCTOR
    acc = oracle.accounting(strategy.vtog)
    trees = acc.trees_of_choice(choice_of(strategy))
    out, best = {}, {}
    for u in acc.units:
        if u.kind == "kernel":
            im, c = oracle.best_implementation(acc, u, oracle.unit_keys(acc, u, trees))
            best[u.kernel] = c.seconds
            if im != "triton":
                out[u.kernel] = im
    changed = bool(acc.region_fusions)
    while changed:
        changed = False
        for f in acc.region_fusions:
            if out.get(f.kernel) == INDUCTOR or out.get(f.into) != INDUCTOR or \
                    not all_physical(acc, f.via, trees):
                continue
            u = acc.kernel_unit(f.kernel)
            if INDUCTOR not in oracle.unit_implementations(acc, u):
                continue
            c = oracle.unit_cost(acc, u, oracle.unit_keys(acc, u, trees), INDUCTOR).seconds \
                - oracle.region_fusion_saving(acc, f)
            if c < best[f.kernel]:
                out[f.kernel], best[f.kernel], changed = INDUCTOR, c, True
    return out


def usable_options(state: SearchState) -> dict[str, list[int]]:
    """Candidate tensor -> its options that are not internally conflicting."""
    acc = state.acc
    out: dict[str, list[int]] = {}
    for t in acc.candidates:
        opts = [o for o in acc.options_of.get(t, []) if o not in acc.option_bad]
        if opts:
            out[t] = opts
    return out


def penalized(state: SearchState, value: float, latency: float, peak: int | None) -> float:
    """A finite score for ranking: infeasible (over the memory cap) ranks after every feasible point."""
    if math.isfinite(value):
        return value
    cap = state.oracle.objective.memory_cap
    if cap is not None and peak is not None and math.isfinite(latency):
        return 1e6 + (peak - cap) / 2 ** 30
    return math.inf

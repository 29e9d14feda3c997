"""Reference: every tensor physical (what a compiler without virtual tensors runs)."""
from __future__ import annotations

from cost_models import CostOracle
from vtcsearch.core.vtog import VTOG

from .base import Run, SolveResult, SolverStatus

NAME = "none"


def solve(vtog: VTOG, oracle: CostOracle, budget: int | None = None, seed: int = 0) -> SolveResult:
    run = Run(NAME, vtog, oracle)
    res = run.finish([], SolverStatus.REFERENCE)
    run.record(res.objective)
    res.trace = run.trace
    return res

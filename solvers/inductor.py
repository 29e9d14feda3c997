"""Reference: every tensor physical and every kernel group Inductor's, wherever Inductor can run it.

What torch.compile runs, realized by vtcsearch: with nothing virtual no region is cut, so consecutive groups
form one Inductor region and Inductor fuses, lays out and autotunes them as it does the whole model.  The
guard times it beside the search's pick (and ``none``) and keeps the fastest, which is what makes "never slower
than torch.compile" a measured guarantee where the oracle misprices a kernel: ``none`` takes each group's
cheapest implementation by the oracle, and an analytical model that prices a Triton template or a library call
below Inductor can lose to torch.compile with no virtual tensor at all.
"""
from __future__ import annotations

from cost_models import CostOracle
from vtcsearch.core.implementation import INDUCTOR, inductor_can_run
from vtcsearch.core.vtog import VTOG

from .base import Run, SolveResult, SolverRefused, SolverStatus

NAME = "inductor"


def solve(vtog: VTOG, oracle: CostOracle, budget: int | None = None, seed: int = 0) -> SolveResult:
    if INDUCTOR not in oracle.implementations:
        raise SolverRefused(f"the oracle's implementations ({', '.join(oracle.implementations)}) leave out "
                            f"inductor")
    g = vtog.graph
    impl = {name: INDUCTOR for name, group in g.groups.items() if inductor_can_run(g, group)}
    run = Run(NAME, vtog, oracle)
    res = run.finish([], SolverStatus.REFERENCE, impl=impl)
    run.record(res.objective)
    res.trace = run.trace
    return res

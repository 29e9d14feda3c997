"""Reference: every Type I option (the "always profitable" class), conflicts resolved greedily.

Options whose edges are all Type I are taken in graph order of their tensors;
one that conflicts with those already taken, closes a cycle or breaks a
validity rule is skipped.  No oracle guides the choice, so this is what a
rule-based pass without profiling would do.
"""
from __future__ import annotations

from cost_models import CostOracle
from cost_models.state import SearchState, greedy_repair
from vtcsearch.core.vtog import VTOG, EdgeClass

from .base import Run, SolveResult, SolverStatus, usable_options

NAME = "all"


def solve(vtog: VTOG, oracle: CostOracle, budget: int | None = None, seed: int = 0,
          classes: tuple[EdgeClass, ...] = (EdgeClass.TYPE_I,)) -> SolveResult:
    run = Run(NAME, vtog, oracle)
    state = SearchState(oracle, vtog)
    order = {t: k for k, t in enumerate(vtog.graph.tensors)}
    wanted = [o for t, os_ in sorted(usable_options(state).items(), key=lambda kv: order[kv[0]]) for o in os_
              if all(e.cls in classes for e in state.acc.option_edges[o])]
    kept = greedy_repair(state, wanted)
    run.record(state.objective(), taken=len(kept), skipped=len(wanted) - len(kept))
    return run.finish(kept, SolverStatus.REFERENCE, {"type_i_options": len(wanted), "taken": len(kept)})

"""Solvers: which tensors to make virtual.  One interface, one file each.

    from solvers import get_solver
    res = get_solver("ilp")(vtog, oracle, budget=60, seed=0)
    res.strategy.validate(); res.objective; res.trace_frame()

``greedy`` (the paper's global greedy), ``ilp`` (CP-SAT, exact for the
oracle), ``optuna`` (TPE or random sampling, SQLite-resumable), ``exhaustive``
(ground truth for small VTOGs), ``none`` (all physical), ``inductor`` (all
physical, every group Inductor's: torch.compile's program, the guard's second
reference) and ``all`` (every Type I option).  The searching solvers run through
:mod:`solvers.decompose` (independent parts separately, repeated parts once;
``decompose=False`` turns it off).
"""
from __future__ import annotations

import functools
import importlib
from typing import Callable

from .base import SolveResult, SolverRefused, SolverStatus

_MODULES = {"none": "none", "inductor": "inductor", "all": "all", "greedy": "greedy", "ilp": "ilp",
            "optuna": "optuna_search", "exhaustive": "exhaustive"}


# the strategies without virtual tensors that a search's pick is timed against (vtcsearch.compile's guard, the
# runner's): ``none`` (each group in its cheapest implementation), ``inductor`` (torch.compile's program)
GUARD_REFERENCES = ("none", "inductor")


class _Registry(dict):
    """name -> solve function, imported on first use (so a missing OR-Tools or Optuna only affects its solver)."""

    def __missing__(self, name: str) -> Callable[..., SolveResult]:
        if name not in _MODULES:
            raise KeyError(name)
        mod = importlib.import_module(f".{_MODULES[name]}", __name__)
        fn = mod.solve
        if getattr(mod, "DECOMPOSABLE", False):   # searching solvers: independent parts, repeated ones once
            from .decompose import solve_decomposed
            fn = functools.partial(solve_decomposed, name, mod.solve, decompose=mod.DECOMPOSE)
        fn = self[name] = _paused_gc(fn)
        return fn

    def __iter__(self):
        return iter(_MODULES)

    def __contains__(self, name: object) -> bool:
        return name in _MODULES

    def __len__(self) -> int:
        return len(_MODULES)

    def keys(self):  # type: ignore[override]
        return _MODULES.keys()


def _paused_gc(fn: Callable[..., SolveResult]) -> Callable[..., SolveResult]:
    """``fn`` run with the garbage collector paused (:func:`cost_models.paused_gc`): a search asks the oracle
    for thousands of costs and builds millions of small memo objects that the collector would walk again and
    again (the ILP's whole-model builds, greedy's queries: pauses of up to ~1 s each)."""
    @functools.wraps(fn)
    def run(*args, **kwargs) -> SolveResult:
        from cost_models import paused_gc
        with paused_gc():
            return fn(*args, **kwargs)
    return run


SOLVERS: dict[str, Callable[..., SolveResult]] = _Registry()


def get_solver(name: str) -> Callable[..., SolveResult]:
    """``solve(vtog, oracle, budget=None, seed=0, **options) -> SolveResult`` of the named solver."""
    try:
        return SOLVERS[name]
    except KeyError:
        raise ValueError(f"unknown solver {name!r}; choices: {', '.join(SOLVERS)}") from None


__all__ = ["SOLVERS", "SolveResult", "SolverRefused", "SolverStatus", "get_solver"]

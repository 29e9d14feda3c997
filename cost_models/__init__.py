"""Cost oracles: what a strategy costs (latency, peak memory, or a mix), kernel by kernel.

    from cost_models import get_oracle, Objective
    oracle = get_oracle("analytical", hardware="H200")
    ev = oracle.evaluate(strategy)          # Evaluation(objective, latency_s, peak_bytes, rows)
    ev.breakdown()                          # one row per kernel / residual copy

Oracles: ``analytical`` (roofline from a hardware preset), ``profiling``
(times the kernels a strategy changes, SQLite-cached), ``recorded`` (replays a
profiling measurements file).  All share :class:`CostOracle`.
"""
from __future__ import annotations

from typing import Any

from .accounting import PHYS, Accounting, LocalStrategy, Unit, UnitSpec
from .analytical import AnalyticalOracle
from .base import CostOracle, Evaluation, Objective, OracleStats, UnitCost, choice_of, paused_gc, strategy_of
from .hardware import PRESETS, Hardware

ORACLES = ("analytical", "profiling", "recorded")


def get_oracle(name: str, **kwargs: Any) -> CostOracle:
    """Build an oracle by name: ``analytical``, ``profiling`` or ``recorded``."""
    if name == "analytical":
        return AnalyticalOracle(**kwargs)
    if name == "profiling":
        from .profiling import ProfilingOracle
        return ProfilingOracle(**kwargs)
    if name == "recorded":
        from .recorded import RecordedOracle
        return RecordedOracle(**kwargs)
    raise ValueError(f"unknown oracle {name!r}; choices: {', '.join(ORACLES)}")


__all__ = ["PHYS", "Accounting", "AnalyticalOracle", "CostOracle", "Evaluation", "Hardware", "LocalStrategy",
           "Objective", "OracleStats", "PRESETS", "Unit", "UnitCost", "UnitSpec", "choice_of", "get_oracle",
           "strategy_of", "ORACLES"]

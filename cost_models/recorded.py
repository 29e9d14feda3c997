"""Recorded oracle: replays the measurements a profiling oracle wrote, so studies reproduce without a GPU.

It reads the SQLite file of :class:`~cost_models.profiling.ProfilingOracle`
(one (timer, device) pair, picked automatically when the file holds just one)
and answers each unit's configuration from it.  A configuration that was never
measured is an error by default (``on_missing="error"``); ``"analytical"``
falls back to the roofline model and ``"inf"`` treats it as infeasible.
"""
from __future__ import annotations

import math
import os
import sqlite3
from typing import Any, Sequence

from .accounting import UnitSpec
from .analytical import AnalyticalOracle
from .base import CostOracle, Objective, OracleError, UnitCost
from .profiling import key_hash


class MissingMeasurement(OracleError, KeyError):
    """The recorded file has no measurement for a configuration the search asked about."""


class RecordedOracle(CostOracle):
    name = "recorded"

    def __init__(self, path: str | os.PathLike, device: str | None = None, timer: str | None = None,
                 on_missing: str = "error", objective: Objective | None = None, hardware: str = "H200",
                 implementations: Sequence[str] | None = None):
        super().__init__(objective, implementations)
        if on_missing not in ("error", "analytical", "inf"):
            raise ValueError("on_missing must be 'error', 'analytical' or 'inf'")
        if not os.path.exists(path):
            raise FileNotFoundError(f"no measurements file {path}")
        self.path, self.on_missing = str(path), on_missing
        conn = sqlite3.connect(self.path)
        pairs = conn.execute("SELECT DISTINCT timer, device FROM measurements").fetchall()
        # device: the stored environment key, or its start ('cuda:NVIDIA H200': that GPU, any versions)
        want = [(t, d) for t, d in pairs if (timer is None or t == timer) and (device is None or d.startswith(device))]
        if len(want) != 1:
            raise ValueError(f"{path} holds measurements for {pairs}; pass timer= and device= to pick one"
                             if want else f"{path} has no measurements for timer={timer} device={device}: {pairs}")
        self.timer, self.device = want[0]
        self.table: dict[str, tuple[float, bool]] = {
            k: (math.inf if s is None else float(s), bool(f))
            for k, s, f in conn.execute("SELECT key, seconds, feasible FROM measurements WHERE timer=? AND device=?",
                                        (self.timer, self.device))}
        conn.close()
        self.misses = 0
        self._fallback = AnalyticalOracle(hardware) if on_missing == "analytical" else None

    def measure(self, spec: UnitSpec) -> UnitCost:
        hit = self.table.get(key_hash(spec.key()))
        if hit is None:
            self.misses += 1
            if self.on_missing == "analytical":
                return self._fallback.measure(spec)
            if self.on_missing == "inf":
                return UnitCost(math.inf, feasible=False, detail={"error": "not recorded"})
            raise MissingMeasurement(f"{self.path} has no measurement of {spec.unit.name} in this configuration "
                                     f"(key {spec.key()[:120]}...); rerun the profiling oracle on it")
        self.stats.cache_hits += 1
        sec, ok = hit
        return UnitCost(sec if ok else math.inf, feasible=ok)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "file": self.path, "timer": self.timer, "device": self.device,
                "entries": len(self.table)}

"""The oracle protocol: objective, per-unit costs, evaluation of a strategy, and call statistics.

Every oracle is a :class:`CostOracle`: subclasses implement :meth:`CostOracle.measure`
(the seconds of one unit in one configuration); the base class turns those into
a strategy's latency (the sum over units), its peak memory (liveness over the
realized allocation) and the objective, and memoizes per (unit, configuration)
so a solver can ask as often as it likes.
"""
from __future__ import annotations

import contextlib
import gc
import math
import time
import weakref
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Iterator, Mapping, Sequence

from vtcsearch.core.graph import folded, step_outputs
from vtcsearch.core.strategy import Strategy
from vtcsearch.core.vtog import VTOG

from .accounting import PHYS, Accounting, ImpossibleConfig, RegionFusion, Unit, UnitSpec, is_view


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Cyclic garbage collection paused (restored on exit) while a search asks many queries: pricing a
    whole model's configurations creates millions of small acyclic memo objects, and Python's collector
    walks all of them again and again (~30% of the pricing time of ShuffleNetV2 at 224x224, in pauses of
    up to ~1 s); reference counting still frees everything that is not in a cycle."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class OracleError(RuntimeError):
    """A failure of the oracle itself (not of one configuration): always raised to the caller."""


@dataclass(frozen=True)
class Objective:
    """``latency_weight * seconds + memory_weight * peak_bytes``, optionally under a memory cap.

    ``Objective.latency()`` (the default), ``Objective.memory()`` and
    ``Objective.mix(seconds_per_gib)`` cover the usual cases; a cap makes every
    strategy above it infeasible (objective ``inf``).
    """

    latency_weight: float = 1.0
    memory_weight: float = 0.0
    memory_cap: int | None = None

    @staticmethod
    def latency(memory_cap: int | None = None) -> "Objective":
        return Objective(1.0, 0.0, memory_cap)

    @staticmethod
    def memory() -> "Objective":
        return Objective(0.0, 1.0)

    @staticmethod
    def mix(seconds_per_gib: float = 1e-4, memory_cap: int | None = None) -> "Objective":
        """Latency plus memory priced at ``seconds_per_gib`` per GiB of peak."""
        return Objective(1.0, seconds_per_gib / 2 ** 30, memory_cap)

    @property
    def needs_memory(self) -> bool:
        return self.memory_weight != 0 or self.memory_cap is not None

    @property
    def needs_latency(self) -> bool:
        return self.latency_weight != 0

    @property
    def name(self) -> str:
        if self.memory_weight == 0:
            return "latency" + (f"@cap{self.memory_cap}" if self.memory_cap else "")
        if self.latency_weight == 0:
            return "memory"
        return f"mix({self.memory_weight * 2 ** 30:g}s/GiB)"

    def value(self, latency_s: float, peak_bytes: float | None) -> float:
        if self.memory_cap is not None and peak_bytes is not None and peak_bytes > self.memory_cap:
            return math.inf
        v = self.latency_weight * latency_s if self.latency_weight else 0.0
        if self.memory_weight:
            v += self.memory_weight * (peak_bytes or 0.0)
        return v


@dataclass
class UnitCost:
    """The cost of one unit in one configuration."""

    seconds: float
    bytes: float = 0.0
    flops: float = 0.0
    feasible: bool = True
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class OracleStats:
    calls: int = 0            # strategy-level queries l(C) (full or incremental)
    unit_queries: int = 0     # distinct (unit, configuration) costs asked for
    measurements: int = 0     # real timings taken (profiling oracle)
    cache_hits: int = 0       # answers served from a persistent cache or a recorded file
    seconds_measuring: float = 0.0
    query_seconds: float = 0.0      # wall time answering the distinct (unit, configuration) queries
    max_query_seconds: float = 0.0  # the slowest of them
    errors: int = 0           # exceptions inside the oracle, answered as an infeasible cost
    transient_errors: int = 0  # of which transient (out of memory, timeout): answered, never cached

    def snapshot(self) -> dict[str, float]:
        return {k: v for k, v in self.__dict__.items() if isinstance(v, (int, float))}


def is_transient(e: BaseException) -> bool:
    """A failure that says nothing about the configuration (out of memory, a timeout): never cached."""
    import subprocess
    if isinstance(e, (TimeoutError, subprocess.TimeoutExpired)):
        return True
    oom = getattr(__import__("torch"), "OutOfMemoryError", None)
    if oom is not None and isinstance(e, oom):
        return True
    return isinstance(e, RuntimeError) and "out of memory" in str(e).lower()


@dataclass
class Evaluation:
    """A strategy's predicted objective, latency and peak memory, with a per-unit breakdown."""

    objective: float
    latency_s: float
    peak_bytes: int | None
    rows: list[dict[str, Any]]

    @property
    def feasible(self) -> bool:
        return math.isfinite(self.objective)

    def breakdown(self):
        """One row per kernel and per residual copy that runs (a pandas DataFrame)."""
        import pandas as pd
        return pd.DataFrame(self.rows)


class CostOracle:
    """Base of every oracle: memoized unit costs and strategy evaluation."""

    name = "base"

    def __init__(self, objective: Objective | None = None, implementations: Sequence[str] | None = None):
        """``implementations``: what solvers may choose per kernel group (default ``triton`` only)."""
        from vtcsearch.core.implementation import DEFAULT, check_name
        self.objective = objective or Objective.latency()
        self.implementations: tuple[str, ...] = tuple(check_name(i) for i in (implementations or (DEFAULT,)))
        self.stats = OracleStats()
        self.error_log: list[str] = []   # the first messages of the exceptions counted in stats.errors
        self._acc: dict[int, tuple[weakref.ref, Accounting]] = {}   # VTOGs are unhashable dataclasses
        self._costs: "weakref.WeakKeyDictionary[Accounting, dict]" = weakref.WeakKeyDictionary()

    # -- to implement ----------------------------------------------------------
    def measure(self, spec: UnitSpec) -> UnitCost:
        """Seconds of one unit in one configuration (subclasses)."""
        raise NotImplementedError

    # -- protocol ----------------------------------------------------------------
    def accounting(self, vtog: VTOG) -> Accounting:
        hit = self._acc.get(id(vtog))
        if hit is not None and hit[0]() is vtog:
            return hit[1]
        from vtcsearch.core.implementation import INDUCTOR
        acc = Accounting(vtog, fuse=INDUCTOR in self.implementations)
        self._acc = {k: v for k, v in self._acc.items() if v[0]() is not None}
        self._acc[id(vtog)] = (weakref.ref(vtog), acc)
        return acc

    def unit_cost(self, acc: Accounting, u: Unit, keys: tuple[str, ...], impl: str = "triton") -> UnitCost:
        """Cost of unit ``u`` when its tensors have the maps named by ``keys`` (memoized); a kernel unit
        run by implementation ``impl``."""
        by_unit = self._costs.get(acc)
        if by_unit is None:
            by_unit = self._costs[acc] = {}
        # by name (a decomposed search's parts renumber their units), one dict per unit: one dict over a whole
        # model's queries rehashes its ~10^5 entries inside whichever query crosses its next size
        memo = by_unit.get(u.name)
        if memo is None:
            memo = by_unit[u.name] = {}
        ck = keys if impl == "triton" else (keys, impl)
        c = memo.get(ck)
        if c is None and u.fuses:
            memo[ck] = c = self._fused_cost(acc, u, keys, impl)
        if c is None:
            t_query = time.perf_counter()
            self.stats.unit_queries += 1
            try:
                spec = acc.spec(u, keys, impl)
            except ImpossibleConfig as e:  # no strategy has these maps together: never chosen
                spec, c = None, UnitCost(math.inf, feasible=False, detail={"error": str(e)})
            if spec is None:
                pass
            elif spec.empty:
                c = UnitCost(0.0)
            else:
                t0 = time.perf_counter()
                try:
                    c = self.measure(spec)
                except OracleError:
                    raise
                except Exception as e:  # counted and reported; the configuration is answered infeasible
                    msg = self.record_error(u, e)
                    c = UnitCost(math.inf, feasible=False, detail={"error": msg})
                    if is_transient(e):   # asked again next time, not remembered as infeasible
                        self.stats.seconds_measuring += time.perf_counter() - t0
                        self.stats.unit_queries -= 1
                        return c
                self.stats.seconds_measuring += time.perf_counter() - t0
            memo[ck] = c
            dt = time.perf_counter() - t_query
            self.stats.query_seconds += dt
            self.stats.max_query_seconds = max(self.stats.max_query_seconds, dt)
        return c

    def _fused_cost(self, acc: Accounting, u: Unit, keys: tuple[str, ...], impl: str) -> UnitCost:
        """A kernel unit with fusible copies (:func:`cost_models.accounting.fuse_copies`): its own cost, and
        run by Inductor, less what each copy it performs as it reads or writes saves (both sides physical)."""
        from vtcsearch.core.implementation import INDUCTOR
        n = len(u.own_tensors)
        c = self.unit_cost(acc, u.without_fusion(), keys[:n], impl)
        if impl != INDUCTOR or not math.isfinite(c.seconds):
            return c
        key = dict(zip(u.tensors, keys))
        saved, fused = [], []
        for cu in u.fuses:
            if all(key[t] == acc.key_of(t, PHYS) for t in cu.tensors + cu.via):
                s = self.fused_copy_saving(acc, u, cu)
                if s > 0:
                    saved.append(s)
                    fused.append(cu.name)
        if not fused:
            return c
        return replace(c, seconds=c.seconds - sum(saved), detail={
            **c.detail, "fused_copies": len(fused), "t_fused_copies": sum(saved), "fused": tuple(fused),
            "fused_saved": tuple(saved)})

    def fused_copy_saving(self, acc: Accounting, u: Unit, cu: Unit) -> float:
        """Seconds Inductor kernel ``u`` saves by running copy unit ``cu`` in its own loads and stores (both of
        the copy's sides physical).

        The copy's launch is saved, but its bytes only as far as the kernel's own tensors reach: a BN + ReLU
        that writes the channel shuffle's layout takes over the whole shuffle, while RoPE writing 8 KiB of keys
        next to a 32 MiB copy of the KV cache still has to read and write the rest of the cache."""
        c = self.unit_cost(acc, cu, tuple(acc.key_of(t, PHYS) for t in cu.tensors))
        if not math.isfinite(c.seconds) or c.seconds <= 0:
            return 0.0
        g = acc.graph
        op = g.ops[cu.op]
        if is_view(op):     # read through its strides by the kernel it is fused into: nothing moves
            return c.seconds
        out = g.tensors[op.outputs[cu.out]].nbytes
        moved = min(g.tensors[op.inputs[cu.src]].nbytes, out) if cu.src is not None else out
        own = max((g.tensors[t].nbytes for t in u.own_tensors), default=0)
        return max(0.0, c.seconds - self.traffic_seconds(2 * max(0, moved - own)))

    def traffic_seconds(self, nbytes: float) -> float:
        """Seconds to stream ``nbytes`` through DRAM at the H200 preset's bandwidth (an oracle that models its
        hardware uses its own)."""
        from .hardware import PRESETS   # hardware imports profiling, which imports this module
        return nbytes / PRESETS["H200"].bandwidth

    def launch_seconds(self) -> float:
        """Seconds one more kernel of a CUDA-graph replay costs (launch and gap) at the H200 preset (an oracle
        that models its hardware uses its own)."""
        from .hardware import PRESETS
        return PRESETS["H200"].kernel_s

    def region_fusion_saving(self, acc: Accounting, f: RegionFusion) -> float:
        """Seconds saved when Inductor inlines pointwise kernel ``f.kernel`` into ``f.into``: its launch, and the
        bytes between them written and read once less; never more than the kernel costs alone."""
        from vtcsearch.core.implementation import INDUCTOR
        u = acc.kernel_unit(f.kernel).without_fusion()
        c = self.unit_cost(acc, u, tuple(acc.key_of(t, PHYS) for t in u.tensors), INDUCTOR)
        if not math.isfinite(c.seconds) or c.seconds <= 0:
            return 0.0
        return min(c.seconds, self.launch_seconds() + self.traffic_seconds(2 * f.nbytes))

    def region_fusions_taken(self, acc: Accounting, trees: Mapping[str, int], impl: Mapping[str, str],
                             fusions: Iterable[RegionFusion] | None = None) -> dict[str, tuple[str, float]]:
        """kernel -> (the kernel Inductor inlines it into, seconds saved) under a strategy: both kernels run as
        Inductor's code and the tensors between them are physical; the larger saving where there are two.
        ``fusions``: only these (default: all of ``acc.region_fusions``)."""
        from vtcsearch.core.implementation import INDUCTOR
        out: dict[str, tuple[str, float]] = {}
        for f in acc.region_fusions if fusions is None else fusions:
            if impl.get(f.kernel) != INDUCTOR or impl.get(f.into) != INDUCTOR or \
                    not all_physical(acc, f.via, trees):
                continue
            saved = self.region_fusion_saving(acc, f)
            if saved > out.get(f.kernel, ("", 0.0))[1]:
                out[f.kernel] = (f.into, saved)
        return out

    def region_view_candidates(self, acc: Accounting) -> list[tuple[str, str, tuple[str, ...]]]:
        """(tensor, kernel, tensors) for each output of a view op that only kernel ``kernel`` reads, in its
        region: the tensor is not allocated when that kernel runs on Inductor and ``tensors`` are all physical
        (:meth:`region_views` for one strategy; the ILP's memory model as constraints)."""
        g, out = acc.graph, []
        for u in acc.units:
            if u.kind != "kernel" or not u.fuses:
                continue
            ops = set(acc.kernel_ops.get(u.kernel, ()))
            for cu in u.fuses:
                op = g.ops[cu.op]
                if is_view(op):
                    out += [(t, u.kernel, tuple(cu.tensors + cu.via)) for t in op.outputs
                            if set(g.tensors[t].consumers) <= ops]
        # a step over constants that realization would fold joins its one reader's region instead, when that
        # reader runs on Inductor: none of what it makes is held (codegen.inductor.constant_reader)
        from vtcsearch.codegen.inductor import constant_reader
        for st in g.steps:
            if folded(g, st, acc.constants) and (reader := constant_reader(g, st, acc.constants)) is not None:
                out += [(t, reader, ()) for t in step_outputs(g, st)]
        return out

    def region_views(self, acc: Accounting, trees: Mapping[str, int], impl: Mapping[str, str]) -> set[str]:
        """Outputs of physical view ops that only an Inductor kernel reads, through the view, in its region: a
        weight's transpose read by Inductor's GEMM is a view there, not a buffer (realization puts the view into
        the reader's region), so the memory model must not count it (a whole Gemma 2 9B decode pick that left the
        LM head's 1.8 GB transpose to Inductor was predicted to hold it)."""
        from vtcsearch.core.implementation import INDUCTOR
        return {t for t, kernel, tensors in self.region_view_candidates(acc)
                if impl.get(kernel) == INDUCTOR and all_physical(acc, tensors, trees)}

    def record_error(self, u: Unit, e: BaseException) -> str:
        """Count an exception raised while costing unit ``u`` (``stats.errors``) and keep its first lines."""
        msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        self.stats.errors += 1
        if is_transient(e):
            self.stats.transient_errors += 1
        if len(self.error_log) < 20:
            self.error_log.append(f"{u.name}: {msg}")
        return msg

    def note_errors(self, notes: list[str]) -> None:
        """Put (or refresh) one line in a run's ``notes`` saying how many oracle exceptions were answered
        as infeasible costs; nothing when there were none."""
        head = f"The {self.name} oracle raised "
        notes[:] = [n for n in notes if not n.startswith(head)]
        st = self.stats
        if st.errors:
            notes.append(f"{head}{st.errors} exception(s) while costing configurations ({st.transient_errors} "
                         f"transient, not cached); those configurations were treated as infeasible. First: "
                         f"{self.error_log[0] if self.error_log else '?'}")

    def unit_specs(self, acc: Accounting, max_trees: int = 128, max_configs: int = 1024) -> Iterator[UnitSpec]:
        """Every (unit, configuration, implementation) a search over ``acc`` may price, as a spec (the
        configurations no strategy gives, and copies with nothing left to copy, left out)."""
        for u, keys in acc.configuration_space(max_trees, max_configs):
            for impl in self.unit_implementations(acc, u):
                try:
                    spec = acc.spec(u, keys, impl)
                except ImpossibleConfig:
                    break
                if spec.empty:
                    break
                yield spec

    def unit_implementations(self, acc: Accounting, u: Unit) -> tuple[str, ...]:
        """The implementations a solver may give kernel unit ``u`` (``("triton",)`` for copy units)."""
        if u.kind != "kernel" or len(self.implementations) == 1:
            return ("triton",)
        from vtcsearch.core.implementation import choices
        return choices(acc.graph, acc.graph.groups[u.kernel], self.implementations) \
            if u.kernel in acc.graph.groups else ("triton",)

    def best_implementation(self, acc: Accounting, u: Unit, keys: tuple[str, ...]) -> tuple[str, UnitCost]:
        """The cheapest of :meth:`unit_implementations` for ``u`` in configuration ``keys`` (ties: the first)."""
        best: tuple[str, UnitCost] | None = None
        for impl in self.unit_implementations(acc, u):
            c = self.unit_cost(acc, u, keys, impl)
            if best is None or c.seconds < best[1].seconds:
                best = (impl, c)
        assert best is not None
        return best

    def unit_keys(self, acc: Accounting, u: Unit, trees: Mapping[str, int]) -> tuple[str, ...]:
        return tuple(acc.key_of(t, trees.get(t, PHYS)) for t in u.tensors)

    def evaluate(self, strategy: Strategy | None = None, *, vtog: VTOG | None = None,
                 choice: Mapping[str, int] | None = None, rows: bool = True, peak: bool = True,
                 impl: Mapping[str, str] | None = None) -> Evaluation:
        """Objective of a strategy (or of ``choice``: tensor -> option id, and ``impl``: kernel group ->
        implementation) with a per-unit breakdown."""
        if strategy is not None:
            vtog = strategy.vtog
            choice = choice_of(strategy)
            impl = strategy.impl
        assert vtog is not None and choice is not None
        self.stats.calls += 1
        acc = self.accounting(vtog)
        trees = acc.trees_of_choice(choice)
        return self._evaluate_trees(acc, trees, rows, peak, impl)

    def _evaluate_trees(self, acc: Accounting, trees: Mapping[str, int], rows: bool = True,
                        want_peak: bool = True, impl: Mapping[str, str] | None = None) -> Evaluation:
        total = 0.0
        impl = impl or {}
        out_rows: list[dict[str, Any]] = []
        inlined: dict[str, tuple[str, float]] | None = None    # kernel -> (where Inductor inlines it, saving)
        if self.objective.needs_latency or rows:
            fused_into: dict[str, tuple[str, float]] = {}   # copy unit -> (Inductor kernel running it, saved s)
            for u in acc.units:
                keys = self.unit_keys(acc, u, trees)
                c = self.unit_cost(acc, u, keys, impl.get(u.kernel, "triton") if u.kind == "kernel" else "triton")
                total += c.seconds
                if rows and (u.kind == "kernel" or c.seconds > 0):
                    out_rows.append({"unit": u.name, "kind": u.kind, "seconds": c.seconds, "bytes": c.bytes,
                                     "flops": c.flops, **{k: v for k, v in c.detail.items()
                                                          if isinstance(v, (int, float, str))}})
                    if u.kind == "kernel" and impl.get(u.kernel, "triton") != "triton":
                        out_rows[-1]["impl"] = impl[u.kernel]
                    fused_into.update({cu: (u.name, sv) for cu, sv in zip(c.detail.get("fused", ()),
                                                                           c.detail.get("fused_saved", ()))})
            inlined = self.region_fusions_taken(acc, trees, impl) if self.objective.needs_latency else {}
            total -= sum(saved for _, saved in inlined.values())
            # the solver's arithmetic credits a fused copy to its kernel; a row shows the kernel at its own cost
            # and the copy at what it still costs inside it: free, or the share the kernel cannot take over
            # (the total is the same)
            for r in out_rows:
                if r["kind"] == "kernel" and r["unit"] in inlined:   # a pointwise kernel inlined by Inductor
                    into, saved = inlined[r["unit"]]
                    r.update(seconds=max(0.0, r["seconds"] - saved), inlined_into=into)
                if r["unit"] in fused_into:
                    kernel, saved = fused_into[r["unit"]]
                    r.update(seconds=max(0.0, r["seconds"] - saved), fused_into=kernel)
                elif r.get("t_fused_copies"):
                    r["seconds"] += r["t_fused_copies"]
        peak = None
        if self.objective.needs_memory or rows or want_peak:
            if inlined is None or not self.objective.needs_latency:
                inlined = self.region_fusions_taken(acc, trees, impl)
            # what Inductor computes inside one generated kernel is never stored: the time model's inlined
            # kernels are the memory model's too (EfficientViT's hardswish: three 32 MiB fp32 temporaries)
            unstored = acc.fused_in_registers((k, into) for k, (into, _) in inlined.items())
            peak = acc.peak_bytes({t: acc.map_of(t, trees.get(t, PHYS)).targets() for t in acc.graph.tensors},
                                  self.region_views(acc, trees, impl), unstored)
        return Evaluation(self.objective.value(total, peak), total, peak, out_rows)

    def describe(self) -> dict[str, Any]:
        out = {"oracle": self.name, "objective": self.objective.name}
        if self.implementations != ("triton",):
            out["implementations"] = list(self.implementations)
        return out


def all_physical(acc: Accounting, tensors: Iterable[str], trees: Mapping[str, int]) -> bool:
    """Whether every one of ``tensors`` resolves to its own storage, as laid out physically, under ``trees``."""
    return all(acc.key_of(t, trees.get(t, PHYS)) == acc.key_of(t, PHYS) for t in tensors)


def choice_of(strategy: Strategy) -> dict[str, int]:
    """tensor -> option id of a strategy whose edges are whole options (raises otherwise)."""
    v = strategy.vtog
    by_edges = {frozenset(o.edges): o.id for o in v.options}
    out: dict[str, int] = {}
    for t, es in strategy.chosen.items():
        o = by_edges.get(frozenset(e.id for e in es))
        if o is None:
            raise ValueError(f"the chosen edges of {t} are not one option of the VTOG")
        out[t] = o
    return out


def options_of_choice(choice: Mapping[str, int]) -> list[int]:
    return sorted(choice.values())


def strategy_of(vtog: VTOG, options: Iterable[int]) -> Strategy:
    """A plain core strategy taking whole options."""
    return Strategy(vtog, [e for o in options for e in vtog.options[o].edges])

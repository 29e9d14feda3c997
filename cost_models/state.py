"""Incremental evaluation of a strategy under construction (what makes large searches fast).

Changing one tensor's option changes the resolved maps of that tensor and of
every tensor pointing to it (transitively), and therefore only the units that
touch those tensors.  :class:`SearchState` keeps each tensor's resolution tree
and each unit's configuration and cost, so a move is costed by re-asking the
oracle about the few units it touches: O(affected) instead of O(graph).

Validity of a move is checked locally for the rules that are local (cycles,
conflicting edges of one option, writes through non-injective or read-only
maps by compute kernels and residual copies).  Hazards need tensors of
different *value classes* sharing a storage, which only in-place (not
value-preserving) edges and buffers the program mutates create; a move that
touches such a storage, or a scatter op, is validated by the core's own
``Strategy.validate`` on the whole strategy.  Solvers still validate their
final answer with the core.
"""
from __future__ import annotations

import math
from collections import ChainMap
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from vtcsearch.core.strategy import Strategy, StrategyError


from .accounting import PHYS, Accounting
from .base import CostOracle, Evaluation
from vtcsearch.core.vtog import VTOG


@dataclass
class Move:
    """A proposed change of one tensor's option, with its consequences."""

    tensor: str
    option: int | None
    trees: dict[str, int] = field(default_factory=dict)                   # affected tensor -> new tree
    units: dict[int, tuple[tuple[str, ...], float]] = field(default_factory=dict)  # unit -> (keys, seconds)
    latency: float = 0.0
    impls: dict[int, str] = field(default_factory=dict)                   # kernel unit -> implementation
    inlined: dict[str, float] = field(default_factory=dict)   # pointwise kernel -> Inductor's inlining saving
    cycle: bool = False
    _objective: float | None = None
    _peak: int | None = None


class SearchState:
    """Current choice (tensor -> option), trees, unit configurations and costs."""

    def __init__(self, oracle: CostOracle, vtog: VTOG, choice: Mapping[str, int] | None = None,
                 impl: Mapping[str, str] | None = None):
        """``impl``: kernel group -> implementation, fixed; None: every kernel unit takes its cheapest of
        the oracle's implementations for its current maps (with ``triton`` only: today's costs)."""
        self.oracle, self.vtog = oracle, vtog
        self.fixed_impl = dict(impl) if impl is not None else None
        self.impl_of: dict[int, str] = {}
        self.acc: Accounting = oracle.accounting(vtog)
        acc = self.acc
        self.choice: dict[str, int] = {}
        self.trees: dict[str, int] = {}
        self.pointers: dict[str, set[str]] = {}
        self.keys: list[tuple[str, ...]] = []
        self.seconds: list[float] = []
        for u in acc.units:
            keys = oracle.unit_keys(acc, u, {})
            self.keys.append(keys)
            sec, im = self._cost(u, keys) if oracle.objective.needs_latency else (0.0, "triton")
            self.seconds.append(sec)
            self.impl_of[u.id] = im
        # Inductor's region fusions (CostOracle.region_fusions_taken), kept per inlined kernel: a move re-prices
        # those whose kernels change implementation or whose tensors between them change trees
        self._fusions_by: dict[str, list] = {}
        for f in acc.region_fusions:
            for key in {f.kernel, f.into, *f.via}:
                self._fusions_by.setdefault(key, []).append(f)
        self.inlined: dict[str, float] = {} if not oracle.objective.needs_latency else {
            k: saved for k, (_, saved) in oracle.region_fusions_taken(acc, self.trees, self.implementations()).items()}
        self.latency = math.fsum(self.seconds) - math.fsum(self.inlined.values())
        self._peak: int | None = None
        self._written = acc.compute_written()
        self._sensitive = _sensitive_storages(acc)
        self._update_ops = {o.name for o in acc.graph.movement_ops() if o.movement.updates}
        self.core_validations = 0
        self._validity = None   # cost_models.validation.Validity, built at the first core check
        for t, o in (choice or {}).items():
            self.apply(self.propose(t, o))

    # -- queries -------------------------------------------------------------------
    def tree(self, t: str) -> int:
        return self.trees.get(t, PHYS)

    @property
    def peak(self) -> int:
        if self._peak is None:
            self._peak = self._peak_of(self.trees)
        return self._peak

    def objective(self) -> float:
        obj = self.oracle.objective
        return obj.value(self.latency, self.peak if obj.needs_memory else None)

    def options(self) -> list[int]:
        return sorted(self.choice.values())

    def implementations(self) -> dict[str, str]:
        """Kernel group -> implementation where it is not the default (what the strategy stores)."""
        acc = self.acc
        return {acc.units[uid].kernel: im for uid, im in self.impl_of.items() if im != "triton"}

    def strategy(self) -> Strategy:
        return self.acc.strategy([e.id for o in self.choice.values() for e in self.acc.option_edges[o]],
                                 self.implementations())

    def evaluation(self) -> Evaluation:
        return self.oracle._evaluate_trees(self.acc, self.trees, rows=True, impl=self.implementations())

    def _cost(self, u, keys: tuple[str, ...]) -> tuple[float, str]:
        """(seconds, implementation) of unit ``u`` in configuration ``keys``."""
        if u.kind != "kernel" or (self.fixed_impl is None and len(self.oracle.implementations) == 1):
            return self.oracle.unit_cost(self.acc, u, keys).seconds, "triton"
        if self.fixed_impl is not None:
            im = self.fixed_impl.get(u.kernel, "triton")
            return self.oracle.unit_cost(self.acc, u, keys, im).seconds, im
        im, c = self.oracle.best_implementation(self.acc, u, keys)
        return c.seconds, im

    # -- moves ---------------------------------------------------------------------
    def ancestors(self, t: str) -> set[str]:
        """Tensors whose resolution passes through ``t`` (they point to it, transitively)."""
        out: set[str] = set()
        stack = [t]
        while stack:
            x = stack.pop()
            for y in self.pointers.get(x, ()):
                if y not in out:
                    out.add(y)
                    stack.append(y)
        return out

    def propose(self, t: str, option: int | None) -> Move:
        """Cost of setting ``t``'s option (None: physical), without changing the state."""
        self.oracle.stats.calls += 1
        acc = self.acc
        mv = Move(t, option)
        if option is not None:
            for d in acc.option_targets[option]:
                if d == t or t in acc.tree_nodes(self.tree(d)):
                    mv.cycle = True
                    mv._objective = math.inf
                    return mv
        affected = self.ancestors(t) | {t}
        new: dict[str, int] = {}

        def tree_of(x: str) -> int:
            if x not in affected:
                return self.tree(x)
            if x in new:
                return new[x]
            o = option if x == t else self.choice.get(x)
            tid = PHYS if o is None else acc.intern(o, tuple(tree_of(d) for d in acc.option_targets[o]))
            new[x] = tid
            return tid

        for x in affected:
            tree_of(x)
        mv.trees = new
        units = {uid for x in affected for uid in acc.units_of.get(x, ())}
        delta = 0.0
        need_lat = self.oracle.objective.needs_latency
        for uid in units:
            u = acc.units[uid]
            keys = tuple(acc.key_of(x, new[x] if x in new else self.tree(x)) for x in u.tensors)
            if keys == self.keys[uid]:
                continue
            sec, im = self._cost(u, keys) if need_lat else (0.0, "triton")
            mv.units[uid] = (keys, sec)
            mv.impls[uid] = im
            delta += sec - self.seconds[uid]
        if need_lat and self._fusions_by:
            mv.inlined = self._inlined_after(affected, new, mv.impls)
            delta -= math.fsum(mv.inlined.values()) - math.fsum(self.inlined.get(k, 0.0) for k in mv.inlined)
        mv.latency = self.latency + delta
        return mv

    def _inlined_after(self, affected: set[str], trees: Mapping[str, int], impls: Mapping[int, str]
                       ) -> dict[str, float]:
        """The inlining saving, after a move, of every pointwise kernel with a region fusion the move touches: its
        kernels' implementations (``impls``, unit -> implementation) or the trees of the tensors between them."""
        acc = self.acc
        changed = set(affected) | {acc.units[uid].kernel for uid, im in impls.items() if im != self.impl_of[uid]}
        kernels = {f.kernel for key in changed for f in self._fusions_by.get(key, ())}
        fusions = [f for k in kernels for f in self._fusions_by[k] if f.kernel == k]
        impl = {}
        for f in fusions:
            for k in (f.kernel, f.into):
                uid = acc.kernel_unit(k).id
                impl[k] = impls.get(uid, self.impl_of[uid])
        taken = self.oracle.region_fusions_taken(acc, ChainMap(trees, self.trees), impl, fusions)
        return {k: taken[k][1] if k in taken else 0.0 for k in kernels}

    def objective_of(self, mv: Move) -> float:
        if mv._objective is None:
            obj = self.oracle.objective
            if mv.cycle or not math.isfinite(mv.latency):
                mv._objective = math.inf
            else:
                peak = None
                if obj.needs_memory:
                    trees = dict(self.trees)
                    for x, tid in mv.trees.items():
                        if tid == PHYS:
                            trees.pop(x, None)
                        else:
                            trees[x] = tid
                    peak = mv._peak = self._peak_of(trees)
                mv._objective = obj.value(mv.latency, peak)
        return mv._objective

    def apply(self, mv: Move) -> None:
        if mv.cycle:
            raise StrategyError("cycle", mv.tensor, "this option closes a points-to cycle")
        acc = self.acc
        old = self.choice.get(mv.tensor)
        if old is not None:
            for d in acc.option_targets[old]:
                self.pointers.get(d, set()).discard(mv.tensor)
        if mv.option is None:
            self.choice.pop(mv.tensor, None)
        else:
            self.choice[mv.tensor] = mv.option
            for d in acc.option_targets[mv.option]:
                self.pointers.setdefault(d, set()).add(mv.tensor)
        for x, tid in mv.trees.items():
            if tid == PHYS:
                self.trees.pop(x, None)
            else:
                self.trees[x] = tid
        for uid, (keys, sec) in mv.units.items():
            self.keys[uid] = keys
            self.seconds[uid] = sec
        self.impl_of.update(mv.impls)
        self.inlined.update(mv.inlined)
        self.latency = math.fsum(self.seconds) - math.fsum(self.inlined.values())
        self._peak = mv._peak

    # -- validity -----------------------------------------------------------------
    def check_local(self, mv: Move) -> tuple[str | None, bool]:
        """(reason the move is invalid by the local rules or None, whether hazards need the core's check)."""
        acc = self.acc
        if mv.cycle:
            return "cycle", False
        if mv.option is not None and mv.option in acc.option_bad:
            return "overlap", False
        sensitive = False
        for x, tid in mv.trees.items():
            if tid != PHYS and x in self._written and not acc.writable(acc.map_of(x, tid), acc.key_of(x, tid)):
                return "non-injective-write", False
            if not sensitive:
                for m in (acc.map_of(x, tid), acc.map_of(x, self.tree(x))):
                    if m.targets() & self._sensitive:
                        sensitive = True
                        break
        for uid, (keys, _) in mv.units.items():
            u = acc.units[uid]
            if u.kind != "copy":
                continue
            if u.op in self._update_ops:
                sensitive = True
            copies = acc.copies(u, keys)
            if copies is None:
                return "cycle", False
            for domain, pairs in copies:
                dm = acc.copy_maps(domain, pairs)[0]
                if not acc.writable(dm):
                    return "non-injective-write", False
        return None, sensitive

    def check(self, mv: Move, core: bool = True) -> str | None:
        """None when the state after ``mv`` is valid (locally, plus the core where hazards may arise)."""
        reason, sensitive = self.check_local(mv)
        if reason is not None or not (sensitive and core):
            return reason
        choice = dict(self.choice)
        if mv.option is None:
            choice.pop(mv.tensor, None)
        else:
            choice[mv.tensor] = mv.option
        return self.core_check(choice)

    def core_check(self, choice: Mapping[str, int] | None = None) -> str | None:
        """The core's verdict on ``choice`` (default: the current state): None or the broken rule."""
        choice = self.choice if choice is None else choice
        self.core_validations += 1
        edges = [e.id for o in choice.values() for e in self.acc.option_edges[o]]
        if self._validity is None:
            from .validation import Validity
            try:
                self._validity = Validity(self.acc)     # baseline: all physical
            except StrategyError:
                self._validity = False                  # no valid baseline: whole validations
        if self._validity:
            # incremental: only what differs from the last strategy found valid (same verdicts)
            return self._validity.check(edges)
        s = self.acc.strategy(edges)
        try:
            s.validate()
        except StrategyError as e:
            return e.rule
        return None

    def is_valid(self) -> bool:
        try:
            self.strategy().validate()
        except StrategyError:
            return False
        return True

    # -- helpers --------------------------------------------------------------------
    def _peak_of(self, trees: Mapping[str, int]) -> int:
        acc = self.acc
        return acc.peak_bytes({t: acc.map_of(t, trees.get(t, PHYS)).targets() for t in acc.graph.tensors})


def _sensitive_storages(acc: Accounting) -> set[str]:
    """Storages where tensors of different value classes may meet (so hazards are possible)."""
    import networkx as nx
    g = acc.graph
    out = {i.storage_name for t, i in g.tensors.items() if i.mutable or i.storage_name != t}
    for e in acc.vtog.edges:
        if not e.value_preserving:
            out.add(e.dst)
            out |= nx.descendants(acc.vtog.nx, e.dst)
    return out


def greedy_repair(state: SearchState, options: Iterable[int]) -> list[int]:
    """Add ``options`` in order, dropping any that makes the state invalid; returns those kept.

    Local rules are checked per option; the core's whole-strategy check (needed
    only for options near in-place edges and mutated buffers) runs once for
    all of those together, and a failing set is bisected to find the culprits.
    """
    kept: list[int] = []
    sensitive: list[int] = []
    for o in options:
        t = state.acc.option_tensor[o]
        if t in state.choice:
            continue
        mv = state.propose(t, o)
        reason, sens = state.check_local(mv)
        if reason is None and math.isfinite(state.objective_of(mv)):
            state.apply(mv)
            kept.append(o)
            if sens:
                sensitive.append(o)
    if sensitive and state.core_check() is not None:
        bad = _bisect_bad(state, sensitive)
        kept = [o for o in kept if o not in bad]
    return kept


def _bisect_bad(state: SearchState, group: list[int]) -> set[int]:
    """Remove ``group`` (applied last), then re-add it by halves; returns the options the core rejects."""
    acc = state.acc
    for o in reversed(group):
        state.apply(state.propose(acc.option_tensor[o], None))
    bad: set[int] = set()

    def place(opts: list[int]) -> None:
        applied = []
        for o in opts:
            mv = state.propose(acc.option_tensor[o], o)
            if state.check_local(mv)[0] is None:
                state.apply(mv)
                applied.append(o)
            else:
                bad.add(o)
        if not applied or state.core_check() is None:
            return
        for o in reversed(applied):
            state.apply(state.propose(acc.option_tensor[o], None))
        if len(applied) == 1:
            bad.add(applied[0])
            return
        half = len(applied) // 2
        place(applied[:half])
        place(applied[half:])

    place(group)
    return bad

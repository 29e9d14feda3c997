"""Incremental validation: a strategy's verdict from the few tensors and storages a change touches.

``Strategy.validate`` checks the whole graph: it resolves every tensor, computes every movement op's
residual copies and replays every storage's read/write events for hazards.  A search changes a
handful of options at a time, and on a whole model (Llama 3 8B decode: 4,000 tensors) a whole
validation costs ~0.5 s, which made greedy's hazard checks dominate.

:class:`Validity` keeps a *valid* baseline strategy with indexes (resolved maps, residual copies,
which tensors and copies touch each storage, value classes) and checks a candidate edge set by
redoing only what can differ from the baseline:

* the structure rules (overlap, coverage, cycles, inputs/outputs physical) on the candidate: cheap;
* writes through the maps of the tensors whose resolution changed (the changed tensors and every
  tensor pointing to them), and the residual copies of the movement ops touching those tensors;
* the hazard rule on the storages those maps and copies touch (before or after), and on the storages
  of tensors whose value class changed (hazards compare classes only within a storage);
* the clobbered-base-copy rule for the changed ops.

Every other storage has the same events and the same class relation as in the valid baseline, so
its verdict is unchanged; the rules run are the core's own functions, in the core's order, so the
verdict (valid, or the broken rule) is the one ``Strategy.validate`` gives (property-tested).
A candidate found valid becomes the new baseline.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Iterable

from vtcsearch.core.mapping import IndexMap
from vtcsearch.core.strategy import ResidualCopy, Strategy, StrategyError, piece_footprint, storage_hazard

from .accounting import Accounting


def _targets(m: IndexMap) -> set[str]:
    return {p.target for p in m.pieces if p.target is not None}


def _copy_targets(rs: list[ResidualCopy]) -> set[str]:
    out: set[str] = set()
    for r in rs:
        for d, q in r.pairs:
            if d.target is not None:
                out.add(d.target)
            if q.target is not None and r.src_tensor is not None:
                out.add(q.target)
    return out


def _groups(comp: dict[str, int]) -> dict[str, frozenset[str]]:
    """Tensor -> its value class, for the tensors in classes of two or more."""
    by: dict[int, set[str]] = {}
    for t, k in comp.items():
        by.setdefault(k, set()).add(t)
    return {t: fs for c in by.values() if len(c) > 1 for fs in (frozenset(c),) for t in c}


class _Classes(dict):
    """``Strategy._value_classes`` as the hazard rule reads it (equal ids = one class), built from the chosen
    value-preserving edges only (union-find): tensors on no such edge are classes of their own."""

    def __missing__(self, t: str):
        return ("own", t)


def _value_classes(s: Strategy) -> tuple[_Classes, dict[str, frozenset[str]]]:
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for es in s.chosen.values():
        for e in es:
            if e.value_preserving:
                a, b = find(e.src), find(e.dst)
                if a != b:
                    parent[a] = b
    comp = _Classes({t: find(t) for t in parent})
    by: dict[str, set[str]] = {}
    for t, r in comp.items():
        by.setdefault(r, set()).add(t)
    return comp, {t: fs for c in by.values() if len(c) > 1 for fs in (frozenset(c),) for t in c}


class Validity:
    """The core's verdict on strategies near a valid baseline, checked on what changed only."""

    def __init__(self, acc: Accounting, edges: Iterable[int] = ()):
        """``edges``: the baseline (must be valid: ``Strategy.validate`` raises otherwise)."""
        self.acc = acc
        g = acc.graph
        self.graph = g
        self.order = g.order()
        self.full_checks = 0       # baselines built by a whole validation
        self.checks = 0            # incremental checks
        self.storages_checked = 0  # storages whose hazard rule ran, over all checks
        self.movement = {op.name for op in g.movement_ops()}
        edges = frozenset(edges)
        shared = acc.shared.validity if not edges else None    # every accounting of a graph shares it
        if shared is not None:
            # the all-physical baseline of this graph, indexed once (copies: commits change them)
            self._base = acc.strategy(())
            self.res = dict(shared.res)
            self.resid = dict(shared.resid)
            self.tensors_on = {k: set(v) for k, v in shared.tensors_on.items()}
            self.ops_on = {k: set(v) for k, v in shared.ops_on.items()}
            self.groups = dict(shared.groups)
            return
        base = acc.strategy(edges)
        base.validate()
        self.full_checks += 1
        self._base = base
        self.res: dict[str, IndexMap] = base.resolve()
        self.resid: dict[str, list[ResidualCopy]] = {op.name: base.residuals_of(op.name) for op in g.movement_ops()}
        self.tensors_on: dict[str, set[str]] = {}
        for t, m in self.res.items():
            for s in _targets(m):
                self.tensors_on.setdefault(s, set()).add(t)
        self.ops_on: dict[str, set[str]] = {}
        for op, rs in self.resid.items():
            for s in _copy_targets(rs):
                self.ops_on.setdefault(s, set()).add(op)
        self.groups = _groups(base._value_classes())
        if not edges:     # a snapshot for the graph's other accountings (this object's indexes will change)
            acc.shared.validity = SimpleNamespace(
                res=dict(self.res), resid=dict(self.resid), groups=dict(self.groups),
                tensors_on={k: set(v) for k, v in self.tensors_on.items()},
                ops_on={k: set(v) for k, v in self.ops_on.items()})

    @property
    def edges(self) -> frozenset[int]:
        """The baseline's edges (the last strategy found valid)."""
        return self._base.edges

    def check(self, edges: Iterable[int], commit: bool = True) -> str | None:
        """None when the strategy of ``edges`` is valid, else the rule it breaks (as ``Strategy.validate``).

        ``commit``: a valid strategy becomes the baseline (later checks are relative to it)."""
        self.checks += 1
        acc, g = self.acc, self.graph
        s = acc.strategy(edges)
        try:
            s._ensure_structure()
        except StrategyError as e:
            return e.rule
        base = self._base
        old_c, new_c = base.chosen, s.chosen
        diff = {t for t in set(old_c) | set(new_c)
                if [e.id for e in old_c.get(t, ())] != [e.id for e in new_c.get(t, ())]}
        rev: dict[str, set[str]] = {}
        for ch in (old_c, new_c):
            for u, es in ch.items():
                for e in es:
                    rev.setdefault(e.dst, set()).add(u)
        changed = set(diff)
        stack = list(diff)
        while stack:
            for y in rev.get(stack.pop(), ()):
                if y not in changed:
                    changed.add(y)
                    stack.append(y)
        new_res = {t: s.resolve(t) for t in changed}
        ops = set()
        for t in changed:
            info = g.tensors[t]
            ops.update(o for o in (info.producer, *info.consumers) if o in self.movement)
        strides = s.strides()
        try:
            # the core's order: compute writes, residual writes, hazards, clobbered base copies
            for op in g.compute_ops():
                for t in op.outputs:
                    if t in changed and s.is_virtual(t):
                        s._check_write(t, new_res[t], strides, f"written by {op.name}")
            new_resid = {op: s.residuals_of(op) for op in sorted(ops, key=self.order.__getitem__)}
            for op, rs in new_resid.items():
                for r in rs:
                    dst = new_res.get(r.dst_tensor) or self.res[r.dst_tensor]
                    m = IndexMap(r.domain, [d for d, _ in r.pairs], dst.target_shapes)
                    s._check_write(r.dst_tensor, m, strides, f"residual copy of {r.op}")
            comp, groups = _value_classes(s)
            reclassed = {t for t in set(groups) | set(self.groups) if groups.get(t) != self.groups.get(t)}
            storages: set[str] = set()
            for t in changed:
                storages |= _targets(self.res[t]) | _targets(new_res[t])
            for op, rs in new_resid.items():
                storages |= _copy_targets(self.resid[op]) | _copy_targets(rs)
            for t in reclassed:
                storages |= _targets(new_res.get(t) or self.res[t])
                info = g.tensors[t]
                for o in (info.producer, *info.consumers):
                    if o in self.movement:
                        storages |= _copy_targets(new_resid[o] if o in new_resid else self.resid[o])
            for st in sorted(storages):
                self.storages_checked += 1
                storage_hazard(st, self._events(st, s, changed, new_res, new_resid), comp)
            for op in new_resid:
                s.residuals_of(op)
            for t, op_name in s._clobbers:
                op = g.ops[op_name]
                early = [op.inputs[u.source] for u in op.movement.updates
                         if not any(r.src_tensor == op.inputs[u.source] for r in s.residuals_of(op_name))]
                if early:
                    raise StrategyError("hazard", t, f"{op_name} must copy its base data over elements that "
                                                     f"{', '.join(early)} already wrote through it")
        except StrategyError as e:
            return e.rule
        if commit:
            self._commit(s, changed, new_res, new_resid, groups)
        return None

    def _events(self, storage: str, s: Strategy, changed: set[str], new_res: dict[str, IndexMap],
                new_resid: dict[str, list[ResidualCopy]]) -> list[tuple[int, str, str, tuple]]:
        """The hazard rule's events on one storage under the candidate (as ``Strategy._check_hazards``)."""
        g, order = self.graph, self.order
        tensors = {t for t in self.tensors_on.get(storage, ()) if t not in changed}
        tensors |= {t for t in changed if storage in _targets(new_res[t])}
        evs: list[tuple[int, str, str, tuple]] = []

        def add(time: int, kind: str, tensor: str, pieces) -> None:
            for p in pieces:
                if p.target == storage:
                    evs.append((time, kind, tensor, piece_footprint(p)))

        for t in tensors:
            info = g.tensors[t]
            pieces = (new_res.get(t) or self.res[t]).pieces
            if info.is_graph_input:
                add(-1, "w", t, pieces)
            for o in dict.fromkeys(info.consumers):
                op = g.ops[o]
                if op.kind == "compute":
                    for x in op.inputs:
                        if x == t:
                            add(order[o], "r", t, pieces)
            if info.producer is not None and g.ops[info.producer].kind == "compute":
                op = g.ops[info.producer]
                for x in op.outputs:
                    if x == t:
                        add(order[op.name], "w", t, pieces)
        ops = {o for o in self.ops_on.get(storage, ()) if o not in new_resid}
        ops |= {o for o, rs in new_resid.items() if storage in _copy_targets(rs)}
        for o in ops:
            for r in (new_resid[o] if o in new_resid else self.resid[o]):
                k = order[r.op]
                if r.src_tensor is not None:
                    add(k, "r", r.src_tensor, [q for _, q in r.pairs])
                add(k, "w", r.dst_tensor, [d for d, _ in r.pairs])
        return evs

    def _commit(self, s: Strategy, changed: set[str], new_res: dict[str, IndexMap],
                new_resid: dict[str, list[ResidualCopy]], groups: dict[str, frozenset[str]]) -> None:
        for t in changed:
            for st in _targets(self.res[t]):
                self.tensors_on.get(st, set()).discard(t)
            self.res[t] = new_res[t]
            for st in _targets(new_res[t]):
                self.tensors_on.setdefault(st, set()).add(t)
        for op, rs in new_resid.items():
            for st in _copy_targets(self.resid[op]):
                self.ops_on.get(st, set()).discard(op)
            self.resid[op] = rs
            for st in _copy_targets(rs):
                self.ops_on.setdefault(st, set()).add(op)
        self.groups = groups
        self._base = s

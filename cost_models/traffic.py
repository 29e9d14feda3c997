"""The analytical oracle's traffic model: :class:`~cost_models.accounting.TrafficModel` with memos of the
numeric work that a first query repeats (issue 13, fast cost queries).

A residual copy between two maps composed through a chain of channel shuffles pairs every piece of one map
with every piece of the other, and each pair carries the predicates of both.  Each pair is a new piece, but
its predicates and the groups of its offset are not: the same predicate (simplified over the same box) recurs
in nearly nine of ten pairs.  Here the values that the base model computes from them are memoized by what
they read, so a new piece evaluates only what is new in it:

* the mask of each predicate over the grid of the predicates' variables (:meth:`TrafficModel._sample_fraction`),
* the distinct values of each group of an offset's variables (:meth:`TrafficModel._estimate_distinct`),
* the index arithmetic of an offset, per its simplified form (:meth:`TrafficModel._piece_stats`).

Values over a box come from :func:`~vtcsearch.core.expr.evaluate_grid`, which memoizes each div/mod atom's
values per the axes of its variables: the pairs' predicates and offsets nest the same atoms.

Every answer equals the base model's (``tests/test_query_speed.py`` compares them on random maps); nothing
here knows of shuffles or models.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from vtcsearch.core.expr import Expr, FloorDiv, Lookup, Mod, Var, bounds, evaluate_grid, simplify
from vtcsearch.core.mapping import Piece, _remember, region_size

from .accounting import TrafficModel as _BaseTrafficModel
from .accounting import _atom_ops, _for_eval, _unlook, count_distinct, tile_frequency

Region = Sequence[tuple[int, int]]


class TrafficModel(_BaseTrafficModel):
    """:class:`~cost_models.accounting.TrafficModel` with the numeric memos of this module (same answers)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._masks: dict[tuple, np.ndarray] = {}     # (predicate, lo, hi, grid) -> its mask over the grid
        self._groups: dict[tuple, int] = {}           # (group's expression, its variables' box) -> distinct
        self._ops: dict[tuple, float] = {}            # (simplified offset, tile frequencies) -> index ops

    def _piece_stats(self, p: Piece, run: int, st: tuple[int, ...]) -> tuple[int, int, int, float]:
        """The base model's (count, distinct, run, index ops), with the ops of an offset memoized per its
        simplified form and the box's tile frequencies (offsets of new pieces mostly simplify to ones priced
        before) and the small pieces' predicates and offset evaluated by
        :func:`~vtcsearch.core.expr.evaluate_grid`."""
        key = (p, st)
        hit = self._piece.get(key)
        if hit is not None:
            return hit[0], hit[1], run, hit[3]
        n = region_size(p.region)
        off = p.offset(st)
        freq = tile_frequency(p.region)
        ranges = {f"i{k}": (lo, hi - 1) for k, (lo, hi) in enumerate(p.region)}
        ops = self._offset_ops(simplify(off, ranges, divisors=True), freq)
        ops += sum(2.0 * max((freq.get(v, 0.0) for v in c.free_var_set()), default=0.0) for c, _, _ in p.conds)
        flat = _unlook(off)
        if not p.conds and flat.is_affine():
            # affine: each variable with a non-zero stride multiplies the distinct count
            ext = {f"i{k}": hi - lo for k, (lo, hi) in enumerate(p.region)}
            distinct = math.prod(e for v, e in ext.items() if flat.coef(Var(v)) != 0)
            res = (n, min(n, max(distinct, 1 if n else 0)), run, ops)
            self._piece[key] = res
            return res
        if n <= self.exact_limit:
            grid = tuple((f"i{k}", lo, hi) for k, (lo, hi) in enumerate(p.region))
            syms = {s.name: s.lo for s in off.syms() | {s for c, _, _ in p.conds for s in c.syms()}}
            mask = np.ones([hi - lo for lo, hi in p.region], dtype=bool)
            for ce, lo, hi in p.conds:
                v = evaluate_grid(_for_eval(ce, ranges), grid, syms)
                mask &= (v >= lo) & (v < hi)
            vals = np.broadcast_to(np.asarray(evaluate_grid(_for_eval(off, ranges), grid, syms)), mask.shape)[mask]
            count = int(mask.sum())
            distinct = count_distinct(vals)
        else:
            frac = self._cond_fraction(p) if p.conds else 1.0
            count = int(round(n * frac))
            distinct = min(count, int(round(self._distinct_estimate(flat, p.region) * frac)))
        res = (count, max(distinct, 1 if count else 0), run, ops)
        self._piece[key] = res
        return res

    def _offset_ops(self, off: Expr, freq: dict[str, float]) -> float:
        """:func:`~cost_models.accounting._atom_ops` of a simplified offset, memoized."""
        key = (off, tuple(freq.items()))
        hit = self._ops.get(key)
        if hit is None:
            hit = _remember(self._ops, key, _atom_ops(off, freq), 1 << 16)
        return hit

    def _sample_fraction(self, p: Piece, sample: int) -> float:
        """The base model's share, each predicate's mask over the grid of the predicates' variables memoized
        per (predicate as evaluated, bounds, grid), its values by :func:`~vtcsearch.core.expr.evaluate_grid`;
        the sampled branch (a grid over ``sample`` points) is the base's."""
        ranges = p.ranges()
        conds = [(_for_eval(ce, ranges), lo, hi) for ce, lo, hi in p.conds]
        ext = {f"i{k}": hi - lo for k, (lo, hi) in enumerate(p.region)}
        used = sorted({v for c, _, _ in conds for v in c.free_var_set()} & set(ext))
        if math.prod(ext[v] for v in used) > sample:
            return super()._sample_fraction(p, sample)
        grid = tuple((v, *p.region[int(v[1:])]) for v in used)
        syms = None
        mask = np.ones([ext[v] for v in used], dtype=bool)
        for ce, lo, hi in conds:
            key = (ce, lo, hi, grid)
            m = self._masks.get(key)
            if m is None:
                if syms is None:
                    syms = {s.name: s.lo for c, _, _ in conds for s in c.syms()}
                v = evaluate_grid(ce, grid, syms)
                m = (v >= lo) & (v < hi)
                if isinstance(m, np.ndarray):
                    m.flags.writeable = False   # shared by the pieces with this predicate
                m = _remember(self._masks, key, m, 1 << 14)   # at most 64 MiB of masks
            mask &= m
        return float(mask.mean()) if mask.size else 1.0

    def _estimate_distinct(self, off: Expr, region: Region) -> int:
        """The base model's estimate, each group's exact count memoized per (group's expression, the box of
        its variables): the groups of a new piece's offset are mostly those of pieces priced before."""
        ext = {f"i{k}": hi - lo for k, (lo, hi) in enumerate(region)}
        # variables coupled through one non-linear atom form a group
        parent = {v: v for v in ext}

        def find(v: str) -> str:
            while parent[v] != v:
                parent[v] = parent[parent[v]]
                v = parent[v]
            return v

        terms = []
        for a, c in off.terms:
            fv = sorted(_atom_vars(a) & ext.keys())
            terms.append((a, c, fv))
            for u in fv[1:]:
                parent[find(u)] = find(fv[0])
        groups: dict[str, list] = {}
        members: dict[str, set] = {}
        for a, c, fv in terms:
            if fv:
                root = find(fv[0])
                groups.setdefault(root, []).append((a, c))
                members.setdefault(root, set()).update(fv)
        total = 1
        for root, ts in groups.items():
            vars_ = sorted(members[root])
            size = math.prod(ext[v] for v in vars_)
            e = Expr(dict(ts))
            if size <= self.exact_limit:
                sub = tuple(region[int(v[1:])] for v in vars_)
                key = (e, tuple(vars_), sub)
                n = self._groups.get(key)
                if n is None:
                    vals = evaluate_grid(e, tuple((v, lo, hi) for v, (lo, hi) in zip(vars_, sub)),
                                         {s.name: s.lo for s in e.syms()})
                    vals = np.broadcast_to(np.asarray(vals), [hi - lo for lo, hi in sub])
                    n = _remember(self._groups, key, count_distinct(vals), 1 << 16)
                total *= n
            elif e.is_affine():
                total *= math.prod(ext[v] for v in vars_ if e.coef(Var(v)) != 0)
            else:
                lo, hi = bounds(e, {f"i{k}": (a, b - 1) for k, (a, b) in enumerate(region)})
                total *= min(size, hi - lo + 1)
        return total


def _atom_vars(a: Any) -> frozenset[str]:
    """``Expr({a: 1}).free_vars()`` without building the expression."""
    if isinstance(a, Var):
        return frozenset((a.name,))
    if isinstance(a, (FloorDiv, Mod)):
        return a.arg.free_var_set()
    if isinstance(a, Lookup):
        return frozenset().union(*(e.free_var_set() for e in a.index))
    return frozenset()

"""Strategy: a points-to graph over the VTOG, its validation, resolution and residual copies.

A strategy is a set of chosen VTOG edges.  A tensor with chosen out-edges is
virtual; every other tensor is physical and owns its storage.  *Resolution*
composes each virtual tensor's maps down to physical storages.  The residual
copies of every movement op then follow: an op needs a copy only where its
output's resolved location differs from its input's.  Elimination is simply
"no residual", with no op-specific flag.

:meth:`Strategy.validate` rejects, naming the tensor and the rule:

=====================  ===================================================
``overlap``            two chosen out-edges of a tensor cover one index
``uncovered``          a virtual tensor's chosen edges miss part of it
``cycle``              the chosen edges contain a cycle
``non-injective-write`` a kernel writes through a map that sends two indices
                       to one element
``read-only-write``    a write lands in a parameter, user input or constant
``hazard``             an element is overwritten while a tensor that still
                       needs its old value is read later
=====================  ===================================================

A :class:`Resolver` may be attached to a strategy: it answers the same
questions (resolved maps, storage strides, residual copies, write checks) from
its owner's memos.  It is how a search asks thousands of strategies cheaply
without subclassing the core; a strategy handed to realization has none.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, Callable, Iterable, Mapping, Sequence

import networkx as nx

from .expr import Expr, Lookup, Var, bounds, simplify
from .graph import TensorGraph
from .mapping import IndexMap, Piece, contiguous_strides, region_intersect, region_size, register_memo
from .vtog import VTOG, Edge


class StrategyError(ValueError):
    """A strategy breaks a rule; ``rule`` and ``tensor`` say which and where."""

    def __init__(self, rule: str, tensor: str, message: str):
        super().__init__(f"[{rule}] {tensor}: {message}")
        self.rule, self.tensor = rule, tensor


@dataclass
class ResidualCopy:
    """What a movement op still has to copy: ``dst`` and ``src`` maps over one domain, piece by piece."""

    op: str
    dst_tensor: str
    src_tensor: str | None        # None for a constant fill
    domain: tuple[int, ...]
    pairs: list[tuple[Piece, Piece]]   # (where to write, what to read), regions equal

    @property
    def elements(self) -> int:
        return sum(region_size(d.region) for d, _ in self.pairs)


class Resolver:
    """Extension point: serve a :class:`Strategy`'s answers from memos, without changing them.

    Every method may return the core's own answer by calling ``compute`` (or
    returning ``None`` where documented); an implementation must return exactly
    what the core would (tests compare).  The base class is the core's behaviour.
    """

    def strides(self, strategy: "Strategy") -> Mapping[str, tuple[int, ...]] | None:
        """Element strides of every storage, or None for the core's dict."""
        return None

    def resolve(self, strategy: "Strategy", tensor: str) -> IndexMap | None:
        """The resolved map of ``tensor`` (virtual or physical), or None to compose it the core's way."""
        return None

    def residuals(self, strategy: "Strategy", op_name: str,
                  compute: Callable[[], tuple[list["ResidualCopy"], list[tuple[str, str]]]]
                  ) -> tuple[list["ResidualCopy"], list[tuple[str, str]]]:
        """(residual copies of ``op_name``, base copies they clobber): ``compute()`` or a memo of it."""
        return compute()

    def check_write(self, strategy: "Strategy", m: IndexMap, check: Callable[[], None]) -> None:
        """Run ``check()`` (raises :class:`StrategyError`) unless ``m`` is known writable."""
        check()


class Strategy:
    """A set of chosen VTOG edges (a points-to graph when valid).

    ``resolver``: an optional :class:`Resolver` (a search's memos); derived
    strategies (``with_edges``) do not inherit it.
    """

    def __init__(self, vtog: VTOG, edges: Iterable[int] = (), impl: Mapping[str, str] | None = None,
                 resolver: Resolver | None = None):
        self.vtog = vtog
        self.edges = frozenset(int(e) for e in edges)
        self.resolver = resolver
        self.impl: dict[str, str] = {}   # kernel group -> implementation, when not the default
        if impl:
            self.set_implementations(impl)
        self._memo: dict[str, IndexMap] = {}
        self._res_memo: dict[str, list[ResidualCopy]] = {}
        self._structure_checked = False
        self._strides: dict[str, tuple[int, ...]] | None = None
        self._clobbers: list[tuple[str, str]] = []   # (tensor, op): a base copy over runtime-indexed updates
        for e in self.edges:
            if not 0 <= e < len(vtog.edges):
                raise StrategyError("unknown-edge", str(e), f"the VTOG has no edge {e}")

    @classmethod
    def from_options(cls, vtog: VTOG, options: Iterable[int]) -> "Strategy":
        return cls(vtog, [e for o in options for e in vtog.options[o].edges])

    @property
    def graph(self) -> TensorGraph:
        return self.vtog.graph

    @cached_property
    def chosen(self) -> dict[str, list[Edge]]:
        out: dict[str, list[Edge]] = {}
        for k in sorted(self.edges):
            e = self.vtog.edges[k]
            out.setdefault(e.src, []).append(e)
        return out

    @property
    def virtual(self) -> set[str]:
        return set(self.chosen)

    def is_virtual(self, t: str) -> bool:
        return t in self.chosen

    def with_edges(self, add: Iterable[int] = (), remove: Iterable[int] = ()) -> "Strategy":
        return Strategy(self.vtog, (self.edges | set(add)) - set(remove), self.impl)

    # -- implementations (vtcsearch.core.implementation) ----------------------
    def set_implementations(self, impl: Mapping[str, str]) -> "Strategy":
        """Choose how kernel groups run (group -> implementation); the default entries are dropped."""
        from . import implementation as im
        for g, i in im.parse(impl).items():
            grp = self.graph.groups.get(g)
            if grp is None:
                raise StrategyError("unknown-group", g, "the graph has no kernel group of this name")
            if i not in im.choices(self.graph, grp):
                raise StrategyError("implementation", g, f"a {grp.kind} group has no {i} implementation")
            if i == im.DEFAULT:
                self.impl.pop(g, None)
            else:
                self.impl[g] = i
        return self

    def implementation(self, group: str) -> str:
        """How kernel group ``group`` runs (``triton`` unless the strategy chose otherwise)."""
        from .implementation import DEFAULT
        return self.impl.get(group, DEFAULT)

    def __eq__(self, other) -> bool:
        return isinstance(other, Strategy) and other.edges == self.edges and other.vtog is self.vtog \
            and other.impl == self.impl

    def __hash__(self) -> int:
        return hash(self.edges)

    def __repr__(self) -> str:
        extra = f", impl={dict(sorted(self.impl.items()))}" if self.impl else ""
        return f"Strategy({len(self.virtual)} virtual tensors, edges={sorted(self.edges)}{extra})"

    # -- structure ----------------------------------------------------------
    def _check_structure(self) -> None:
        for u, es in self.chosen.items():
            check_tensor_edges(self.vtog, u, es)
        if acyclic({u: {e.dst for e in es} for u, es in self.chosen.items()}):
            return
        g = nx.DiGraph()
        g.add_edges_from((e.src, e.dst) for es in self.chosen.values() for e in es)
        try:
            cyc = nx.find_cycle(g)
        except nx.NetworkXNoCycle:
            return
        raise StrategyError("cycle", cyc[0][0], "points-to chain " + " -> ".join(a for a, _ in cyc) + f" -> {cyc[0][0]}")

    def mark_structure_checked(self) -> None:
        """Skip the structure check: the caller already made it for these edges (the cost accounting checks each
        option once and every combination's cycles, :meth:`cost_models.Accounting.structure_ok`)."""
        self._structure_checked = True

    def _ensure_structure(self) -> None:
        if not self._structure_checked:
            self._check_structure()
            self._structure_checked = True

    # -- resolution ---------------------------------------------------------
    def storage_shape(self, storage: str) -> tuple[int, ...]:
        return self.graph.tensors[storage].shape

    def storage_strides(self, storage: str) -> tuple[int, ...]:
        t = self.graph.tensors[storage]
        return t.strides if t.is_graph_input else contiguous_strides(t.shape)

    def strides(self) -> Mapping[str, tuple[int, ...]]:
        """Element strides of every storage (graph inputs keep theirs; the rest are allocated contiguous)."""
        got = self.resolver.strides(self) if self.resolver is not None else None
        if got is not None:
            return got
        if self._strides is None:   # once per strategy: every movement op's residuals ask (quadratic otherwise)
            self._strides = {s: self.storage_strides(s) for s in self.storages()}
        return self._strides

    def detached(self) -> "Strategy":
        """The same edges with no resolver (what realization and persistence should hold)."""
        return Strategy(self.vtog, self.edges, self.impl)

    def storages(self) -> set[str]:
        return {self.graph.tensors[t].storage_name for t in self.graph.tensors if not self.is_virtual(t)}

    def resolve(self, tensor: str | None = None) -> dict[str, IndexMap] | IndexMap:
        """Where every tensor (or one) lives: a map into physical storages.  Computed lazily."""
        self._ensure_structure()
        if tensor is None:
            return {t: self.resolve(t) for t in self.graph.tensors}
        if tensor not in self._memo:
            info = self.graph.tensors[tensor]
            # a search's memo answers physical tensors too (their identity maps are shared, not rebuilt)
            m = self.resolver.resolve(self, tensor) if self.resolver is not None else None
            if m is None and not self.is_virtual(tensor):
                m = IndexMap.identity(info.shape, info.storage_name)
            if m is None:
                m = IndexMap.union(info.shape, [e.map.compose({e.dst: self.resolve(e.dst)})
                                                for e in self.chosen[tensor]])
            self._memo[tensor] = m
        return self._memo[tensor]

    # -- residual copies ----------------------------------------------------
    def residuals_of(self, op_name: str) -> list[ResidualCopy]:
        """The copies one movement op still has to make under this strategy."""
        if op_name in self._res_memo:
            return self._res_memo[op_name]
        self._ensure_structure()
        compute = lambda: self._compute_residuals(op_name)  # noqa: E731
        out, clobbers = (self.resolver.residuals(self, op_name, compute) if self.resolver is not None
                         else compute())
        self._clobbers.extend(clobbers)
        self._res_memo[op_name] = out
        return out

    def _compute_residuals(self, op_name: str) -> tuple[list[ResidualCopy], list[tuple[str, str]]]:
        """(residual copies of one op, the base copies among them that clobber runtime-indexed updates)."""
        op = self.graph.ops[op_name]
        clobbers: list[tuple[str, str]] = []
        mv = op.movement
        out_maps, update_maps = _op_maps(op)
        out: list[ResidualCopy] = []
        for j, m in enumerate(out_maps):
            dst_t = op.outputs[j]
            src_map = m.compose({t: self.resolve(t) for t in op.inputs})
            # a scatter's base copy leaves out the elements its updates overwrite, when that set is a box
            images = [_image_boxes(u.map) for u in mv.updates if u.output == j]
            for src_t, pairs in _differences(self.resolve(dst_t), src_map, self, op.inputs).items():
                if images and all(b is not None for b in images):
                    pairs = [(replace(d, region=r), replace(q, region=r)) for d, q in pairs
                             for r in _subtract(d.region, [box for bs in images for box in bs])]
                    if not pairs:
                        continue
                elif images:
                    clobbers.append((dst_t, op.name))
                out.append(ResidualCopy(op.name, dst_t, src_t, self.resolve(dst_t).shape, pairs))
        for u, um in zip(mv.updates, update_maps):
            dst_t, src_t = op.outputs[u.output], op.inputs[u.source]
            dst_map = um.compose({dst_t: self.resolve(dst_t)})
            for _, ps in _differences(dst_map, self.resolve(src_t), self, op.inputs).items():
                out.append(ResidualCopy(op.name, dst_t, src_t, u.map.shape, ps))
        return out, clobbers

    @property
    def residuals(self) -> list[ResidualCopy]:
        return [r for op in self.graph.movement_ops() for r in self.residuals_of(op.name)]

    def residual_copies(self) -> list[ResidualCopy]:
        return self.residuals

    def eliminated_ops(self) -> list[str]:
        """Movement ops left with nothing to copy."""
        return [o.name for o in self.graph.movement_ops() if not self.residuals_of(o.name)]

    def physical_intermediates(self) -> list[str]:
        """Tensors that need an allocation of their own."""
        return [t for t, i in self.graph.tensors.items()
                if not self.is_virtual(t) and not i.is_graph_input and i.storage_name == t]

    # -- validation ---------------------------------------------------------
    def validate(self) -> "Strategy":
        """Raise :class:`StrategyError` unless the strategy is a safe points-to graph."""
        res = self.resolve()
        strides = self.strides()
        # writes by compute kernels through virtual tensors
        for op in self.graph.compute_ops():
            for t in op.outputs:
                if self.is_virtual(t):
                    self._check_write(t, res[t], strides, f"written by {op.name}")
        for r in self.residuals:
            m = IndexMap(r.domain, [d for d, _ in r.pairs], res[r.dst_tensor].target_shapes)
            self._check_write(r.dst_tensor, m, strides, f"residual copy of {r.op}")
        self._check_hazards()
        for op in self.graph.movement_ops():
            self.residuals_of(op.name)
        for t, op_name in self._clobbers:
            op = self.graph.ops[op_name]
            early = [op.inputs[u.source] for u in op.movement.updates
                     if not any(r.src_tensor == op.inputs[u.source] for r in self.residuals_of(op_name))]
            if early:
                raise StrategyError("hazard", t, f"{op_name} must copy its base data over elements that "
                                                 f"{', '.join(early)} already wrote through it (indices known "
                                                 f"only at run time)")
        return self

    def is_valid(self) -> bool:
        try:
            self.validate()
        except StrategyError:
            return False
        return True

    def _check_write(self, t: str, m: IndexMap, strides, who: str) -> None:
        check = lambda: self._check_write_core(t, m, strides, who)  # noqa: E731
        if self.resolver is not None:
            self.resolver.check_write(self, m, check)
        else:
            check()

    def _check_write_core(self, t: str, m: IndexMap, strides, who: str) -> None:
        for p in m.pieces:
            if p.target is None:
                raise StrategyError("non-injective-write", t, f"{who}: part of it is a constant")
            st = self.graph.tensors[p.target]
            if st.read_only:
                raise StrategyError("read-only-write", t, f"{who}: writes into {p.target} "
                                                          f"({st.kind}), which the program must not modify")
        if not _injective_assuming_unique_indices(m, strides):
            raise StrategyError("non-injective-write", t, f"{who}: two of its indices land on one element of "
                                                          f"{', '.join(sorted(m.targets()))}")

    def _check_hazards(self) -> None:
        """No element is overwritten while a tensor holding a different value still reads it later."""
        res = self.resolve()
        comp = self._value_classes()
        order = self.graph.order()
        events: dict[str, list[tuple[int, str, str, tuple]]] = {}  # storage -> (time, r|w, tensor, box)

        def add(time: int, kind: str, tensor: str, pieces: Iterable[Piece], ranges_from=None) -> None:
            for p in pieces:
                if p.target is None:
                    continue
                events.setdefault(p.target, []).append((time, kind, tensor, _footprint(p)))

        for t, info in self.graph.tensors.items():
            if info.is_graph_input:
                add(-1, "w", t, res[t].pieces)
        for op in self.graph.ops.values():
            k = order[op.name]
            if op.kind == "compute":
                for t in op.inputs:
                    add(k, "r", t, res[t].pieces)
                for t in op.outputs:
                    add(k, "w", t, res[t].pieces)
        for r in self.residuals:
            k = order[r.op]
            if r.src_tensor is not None:
                add(k, "r", r.src_tensor, [s for _, s in r.pairs])
            add(k, "w", r.dst_tensor, [d for d, _ in r.pairs])
        for storage, evs in events.items():
            storage_hazard(storage, evs, comp)

    def _value_classes(self) -> dict[str, int]:
        """Tensors that hold equal values wherever they share storage (joined by value-preserving edges)."""
        g = nx.Graph()
        g.add_nodes_from(self.graph.tensors)
        for es in self.chosen.values():
            for e in es:
                if e.value_preserving:
                    g.add_edge(e.src, e.dst)
        return {t: k for k, c in enumerate(nx.connected_components(g)) for t in c}

    # -- persistence --------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {"edges": sorted(self.edges),
                "virtual": {u: [{"edge": e.id, "over": e.dst, "op": e.op, "kind": e.kind, "class": e.cls}
                                for e in es] for u, es in self.chosen.items()},
                "eliminated_ops": self.eliminated_ops(),
                "residual_copies": [{"op": r.op, "dst": r.dst_tensor, "src": r.src_tensor,
                                     "elements": r.elements} for r in self.residuals],
                # every group's, the template's too, once any differs: a reader of the file (or a rebuilt graph
                # whose groups are renamed, experiments.oracle_accuracy) never has to guess a default
                **({"implementations": {g: self.implementation(g) for g in sorted(self.graph.groups)}}
                   if self.impl else {})}

    def write_json(self, path: str, run: dict[str, Any] | None = None) -> None:
        """``run``: the command, machine and date of the run that wrote it, stored beside the data."""
        with open(path, "w") as f:
            json.dump({**self.to_json(), **({"written_by": run} if run else {})}, f, indent=1)

    @classmethod
    def from_json(cls, vtog: VTOG, data: dict[str, Any] | str) -> "Strategy":
        if isinstance(data, str):
            with open(data) as f:
                data = json.load(f)
        return cls(vtog, data["edges"], data.get("implementations"))


def storage_hazard(storage: str, evs: list[tuple[int, str, str, tuple]], comp: Mapping[str, int]) -> None:
    """The hazard rule on one storage's events ((step, "r"|"w", tensor, footprint box)); raises
    :class:`StrategyError`.  Storages are independent, so an incremental check may run it on a few."""
    if len({comp[t] for _, _, t, _ in evs}) <= 1:
        return  # every tensor here holds the same values
    writes = [e for e in evs if e[1] == "w"]
    for tr, kind, t, box in evs:
        if kind != "r":
            continue
        related = [tw for tw, _, w, wb in writes if tw <= tr and comp[w] == comp[t] and _overlap(box, wb)]
        est = max(related, default=-2)
        for tw, _, w, wb in writes:
            if comp[w] != comp[t] and est < tw <= tr and _overlap(box, wb):
                raise StrategyError("hazard", t, f"read by step {tr} after {w} overwrote part of "
                                                 f"{storage} at step {tw}")


def piece_footprint(p: Piece) -> tuple[tuple[int, int], ...]:
    """Public name of the footprint the hazard rule compares (bounding box of a piece in its storage)."""
    return _footprint(p)


def check_tensor_edges(vtog: VTOG, u: str, es: Sequence[Edge]) -> None:
    """Raise :class:`StrategyError` unless edges ``es`` (all the chosen edges out of ``u``) can make ``u``
    virtual on their own: ``u`` may be virtual, the edges do not overlap and they cover it.  With
    acyclicity, the whole structure check (a search checks each of its options once)."""
    info = vtog.graph.tensors[u]
    if info.physical_only:
        raise StrategyError("read-only-write" if info.read_only else "overlap", u,
                            "graph inputs and outputs must stay physical")
    for a in range(len(es)):
        for b in range(a + 1, len(es)):
            if frozenset((es[a].id, es[b].id)) in vtog.conflicts:
                raise StrategyError("overlap", u, f"edges {es[a].id} ({es[a].op}) and {es[b].id} "
                                                  f"({es[b].op}) both cover some of its indices")
    covered = sum(e.map.covered_size() or 0 for e in es)
    if covered != info.numel:
        raise StrategyError("uncovered", u, f"chosen edges cover {covered} of {info.numel} elements")


def acyclic(succ: dict[str, set[str]]) -> bool:
    """No cycle in a small points-to graph (Kahn's algorithm; networkx only names a cycle once found)."""
    indeg: dict[str, int] = {}
    for u, vs in succ.items():
        indeg.setdefault(u, 0)
        for v in vs:
            indeg[v] = indeg.get(v, 0) + 1
    ready = [u for u, d in indeg.items() if d == 0]
    seen = 0
    while ready:
        u = ready.pop()
        seen += 1
        for v in succ.get(u, ()):
            indeg[v] -= 1
            if indeg[v] == 0:
                ready.append(v)
    return seen == len(indeg)


def _image_boxes(m: IndexMap) -> list[tuple[tuple[int, int], ...]] | None:
    """The exact set of target elements a map writes, as boxes, when each index is ``var + const``."""
    boxes = []
    for p in m.pieces:
        if p.conds or p.target is None:
            return None
        box, used = [], set()
        for e in p.index:
            if e.is_const():
                box.append((e.const, e.const + 1))
                continue
            if len(e.terms) != 1 or e.terms[0][1] != 1 or not isinstance(e.terms[0][0], Var):
                return None
            name = e.terms[0][0].name
            if name in used:
                return None
            used.add(name)
            lo, hi = p.region[int(name[1:])]
            box.append((lo + e.const, hi + e.const))
        if any(hi - lo > 1 and f"i{k}" not in used for k, (lo, hi) in enumerate(p.region)):
            return None  # a dropped variable folds several sources onto one element
        boxes.append(tuple(box))
    return boxes


def _subtract(region: tuple, boxes: list[tuple]) -> list[tuple]:
    """Boxes covering ``region`` minus ``boxes``."""
    parts = [region]
    for b in boxes:
        nxt = []
        for r in parts:
            if region_intersect(r, b) is None:
                nxt.append(r)
                continue
            rest = list(r)
            for d, ((lo, hi), (blo, bhi)) in enumerate(zip(r, b)):
                if lo < blo:
                    nxt.append(tuple(rest[:d] + [(lo, blo)] + rest[d + 1:]))
                if bhi < hi:
                    nxt.append(tuple(rest[:d] + [(bhi, hi)] + rest[d + 1:]))
                rest[d] = (max(lo, blo), min(hi, bhi))
        parts = nxt
    return parts


def _footprint(p: Piece) -> tuple[tuple[int, int], ...]:
    """Bounding box, in the storage's index space, of the elements a piece touches."""
    r = p.ranges()
    return tuple(bounds(e, r) for e in p.index)


_OP_MAPS: dict[int, tuple[Any, tuple, list[IndexMap], list[IndexMap]]] = register_memo({})


def _op_maps(op) -> tuple[list[IndexMap], list[IndexMap]]:
    """A movement op's output and update maps in its graph's tensor names ("in0" -> the input's name).

    They do not depend on the strategy, and retargeting rebuilds every expression: computed once per op
    (the residuals of every op under every strategy the search tries asked again: ~3 s of the ILP's
    build on the 2,000-node synthetic VTOG).  Keyed by the op object (kept alive in the entry)."""
    io = (op.movement, tuple(op.inputs), tuple(op.outputs))
    hit = _OP_MAPS.get(id(op))
    if hit is None or hit[0] is not op or hit[1] != io:
        names = {f"in{k}": t for k, t in enumerate(op.inputs)} | {f"out{j}": t for j, t in enumerate(op.outputs)}
        if len(_OP_MAPS) > 1 << 16:   # a bound on memory
            _OP_MAPS.clear()
        hit = _OP_MAPS[id(op)] = (op, io, [m.retarget(names) for m in op.movement.outputs],
                                  [u.map.retarget(names) for u in op.movement.updates])
    return hit[2], hit[3]


def _overlap(a: tuple, b: tuple) -> bool:
    return all(alo <= bhi and blo <= ahi for (alo, ahi), (blo, bhi) in zip(a, b))


def _injective_assuming_unique_indices(m: IndexMap, strides) -> bool:
    """Injectivity, with each single-argument index-tensor read taken as one-to-one.

    A KV-cache write at runtime positions is injective when the positions are
    distinct, which the program promises (duplicate indices make torch's own
    index_put nondeterministic).
    """
    if not m.has_lookup():
        return m.is_injective(strides)
    pieces = []
    for p in m.pieces:
        def unlook(e: Expr) -> Expr:
            return e.map_atoms(lambda a: a.index[0] if isinstance(a, Lookup) and len(a.index) == 1
                               else Expr({a: 1}))
        idx = tuple(unlook(e) for e in p.index)
        if any(e.has_lookup() for e in idx):
            return False
        pieces.append(Piece(p.target, p.region, idx, p.conds, p.fill))
    return IndexMap(m.shape, pieces, m.target_shapes).is_injective(strides)


def _differences(dst: IndexMap, src: IndexMap, s: Strategy, inputs) -> dict[str | None, list]:
    """Pieces of the domain where ``dst`` and ``src`` resolve to different elements, by source tensor.

    Both maps are over the same domain.  A pair whose storage and offset agree
    symbolically needs no copy; anything not provably equal is copied (correct,
    maybe slower).
    """
    strides = s.strides()
    out: dict[str | None, list] = {}
    for p in dst.pieces:
        for q in src.pieces:
            reg = region_intersect(p.region, q.region)
            if reg is None or _contradictory(p.conds + q.conds):
                continue
            pp = Piece(p.target, reg, p.index, p.conds + q.conds, p.fill)
            qq = Piece(q.target, reg, q.index, q.conds + p.conds, q.fill)
            if _same(pp, qq, strides):
                continue
            # name the source by the input tensor whose storage it reads (for reporting)
            src_name = None
            if q.target is not None:
                src_name = next((t for t in inputs if q.target == s.graph.tensors[t].storage_name
                                 or q.target in s.resolve(t).targets()), q.target)
            out.setdefault(src_name, []).append((pp, qq))
    return out


def _contradictory(conds) -> bool:
    """Predicates ``lo <= e < hi`` that no index satisfies together (two pieces of one Concat-like split)."""
    box: dict[str, tuple[int, int]] = {}
    for e, lo, hi in conds:
        a, b = box.get(repr(e), (lo, hi))
        a, b = max(a, lo), min(b, hi)
        if a >= b:
            return True
        box[repr(e)] = (a, b)
    return False


def _same(p: Piece, q: Piece, strides) -> bool:
    if p.target is None or q.target is None:
        return p.target is None and q.target is None and p.fill == q.fill
    if p.target != q.target:
        return False
    ranges = p.ranges()
    diff = simplify(p.offset(strides[p.target]) - q.offset(strides[q.target]), ranges)
    return diff == 0

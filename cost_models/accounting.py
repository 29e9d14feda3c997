"""Kernel accounting of a strategy: what runs, what it touches, and what its cost depends on.

A strategy's cost is a sum over *units*:

* one **kernel unit** per compute kernel of ``graph.kernels()``; it reads its
  input tensors and writes its output tensors through their resolved maps;
* one **copy unit** per (movement op, output ``j``, source) where the source is
  input ``k`` (the part of ``out_j`` that ``out_j`` reads from ``in_k``) or the
  constant fill of a Pad; a scatter op (base copy plus updates, which
  interact) is one unit over all its tensors.  A copy unit runs (one copy
  kernel per residual copy) only when that part still needs one.  Its pieces
  come from the core's ``Strategy.residuals_of`` on a strategy realizing just
  the unit's maps, so residual semantics stay the core's.

A unit's cost is a function of its **configuration**: the resolved
:class:`~vtcsearch.core.mapping.IndexMap` of each tensor in ``unit.tensors``, nothing
else.  A kernel unit's tensors are its I/O tensors; a copy unit's are ``out_j``
and its source, because the residual pieces of that part depend only on where
those two tensors live (a scatter unit's: all the op's tensors).  This is what makes the ILP exact and polynomial: a
kernel is measured once per combination of its operands' maps, and a copy once
per pair of maps on both sides of its op.

A tensor's resolved map is a function of its **resolution tree**: the option it
takes and, recursively, the trees of the option's targets (``PHYS`` for a
physical tensor).  Trees are interned as small integers.  Maps are composed
exactly as :meth:`vtcsearch.core.strategy.Strategy.resolve` composes them (tests
check they are equal), so every oracle answers for the core's semantics.
"""
from __future__ import annotations

import itertools
import math
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Container, Iterable, Iterator, Sequence

import networkx as nx
import numpy as np
import torch

from vtcsearch.core.expr import Expr, FloorDiv, Lookup, Mod, Sym, Var, bounds, evaluate, evaluate_grid, remember, \
    simplify
from vtcsearch.core.graph import TensorGraph, constant_tensors, folded, kernel_io
from vtcsearch.core.mapping import RUN_SAMPLE, IndexMap, Piece, contiguous_strides, region_size, register_memo, \
    sample_box
from vtcsearch.core.strategy import Resolver, Strategy, StrategyError, acyclic, check_tensor_edges

try:  # the core's per-piece run length (IndexMap.piece_runs without building a map per piece)
    from vtcsearch.core.mapping import _run_length
except ImportError:  # pragma: no cover
    _run_length = None
from vtcsearch.core.vtog import VTOG, Edge

PHYS = 0  # tree id of a physical tensor


# ---------------------------------------------------------------------------
# units
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Unit:
    """One cost term: a compute kernel, or one part of a movement op's residual copies."""

    id: int
    kind: str                       # "kernel" | "copy"
    name: str
    tensors: tuple[str, ...]        # tensors whose maps form the configuration
    kernel: str | None = None       # kernel units
    op: str | None = None           # copy units: the movement op
    out: int | None = None          # copy units: output index j (None: the whole op)
    src: int | None = None          # copy units: input index k (None with out set: the constant fill)
    # kernel units: copy units that Inductor's code for this kernel performs as it reads or writes (fuse_copies);
    # the copies' tensors that are not the kernel's own follow them in ``tensors``, as the fusion depends on
    # their maps too
    fuses: tuple["Unit", ...] = ()
    n_fused_tensors: int = 0
    # a fused copy unit: the tensors of the movement ops between it and the kernel that runs it, which must stay
    # physical too (the region reaches the copy through them)
    via: tuple[str, ...] = ()

    @property
    def own_tensors(self) -> tuple[str, ...]:
        """The kernel's I/O (``tensors`` less those of the copies it fuses)."""
        return self.tensors[:len(self.tensors) - self.n_fused_tensors]

    def without_fusion(self) -> "Unit":
        """The kernel unit alone, over its own I/O: what its implementations cost before any fused copy."""
        return replace(self, tensors=self.own_tensors, fuses=(), n_fused_tensors=0) if self.fuses else self


@dataclass(frozen=True)
class RegionFusion:
    """Pointwise kernel ``kernel`` inlined by Inductor into the adjacent kernel ``into`` of its region: both run as
    Inductor's code and the tensors ``via`` between them stay physical (:func:`region_fusions`)."""

    kernel: str
    into: str
    via: tuple[str, ...]
    nbytes: int                     # the bytes between them, written once and read once less


class StorageStrides(Mapping):
    """Element strides of every storage, computed on demand.

    The same values as ``Strategy.strides()`` (graph inputs keep theirs, the rest
    are contiguous) without building the whole dict each time a residual is
    computed, which is quadratic on large graphs.
    """

    def __init__(self, graph: TensorGraph):
        self.graph = graph
        self._memo: dict[str, tuple[int, ...]] = {}

    def __getitem__(self, s: str) -> tuple[int, ...]:
        v = self._memo.get(s)
        if v is None:
            t = self.graph.tensors[s]
            v = tuple(t.strides) if t.is_graph_input else contiguous_strides(t.shape)
            self._memo[s] = v
        return v

    def __contains__(self, s: object) -> bool:
        return s in self.graph.tensors

    def __len__(self) -> int:
        return len(self.graph.tensors)

    def __iter__(self) -> Iterator[str]:
        return iter(self.graph.tensors)


class SharedMemo:
    """Per-graph memos shared by every strategy an accounting hands out."""

    def __init__(self, graph: TensorGraph):
        self.strides = StorageStrides(graph)
        self.write_ok: set[str] = set()          # reprs of maps a kernel may write through
        self.residuals: dict[tuple, tuple[list, list]] = {}
        self.copies: dict[tuple, tuple[list, list[str]] | None] = {}   # Accounting.copy_signature -> (pieces,
        #                                                                 their storages in the signature's order)
        self.phys_maps: dict[str, IndexMap] = {}      # tensor -> its identity map (physical)
        self.validity: Any = None                     # cost_models.validation: the all-physical baseline


_SHARED: dict[int, tuple[Any, SharedMemo]] = {}


def shared_memo(graph: TensorGraph) -> SharedMemo:
    """The graph's :class:`SharedMemo` (its answers depend on the graph only: every accounting over it,
    e.g. each part of a decomposed search, shares one instead of recomputing residual copies)."""
    hit = _SHARED.get(id(graph))
    if hit is not None and hit[0]() is graph:
        return hit[1]
    for k in [k for k, (ref, _) in _SHARED.items() if ref() is None]:
        del _SHARED[k]
    memo = SharedMemo(graph)
    _SHARED[id(graph)] = (weakref.ref(graph), memo)
    return memo


def clear_shared_memos() -> None:
    """Forget every graph's shared memo (cold-start measurements)."""
    _SHARED.clear()


class AccountingResolver(Resolver):
    """Answers a core :class:`Strategy`'s questions from an accounting's memos (same answers).

    The core recomputes everything per strategy object, which makes
    ``validate()`` cost seconds on a 2,000-tensor graph.  Here, per graph:

    * ``strides()`` is built once (the core rebuilds a dict over every storage,
      once per movement op, from ``residuals_of``: quadratic);
    * ``resolve(t)`` comes from the accounting's map of ``t``'s resolution tree
      (the same composition; tests check equality), when the chosen edges are
      whole options;
    * ``residuals_of(op)`` is remembered per (op, maps of its I/O tensors): the
      core computes it from exactly those maps (its side effect, the list of
      clobbered base copies, is replayed);
    * a write check that passed is remembered per map (``IndexMap.is_injective``
      evaluates reshape maps numerically: np.unique over up to 2^20 elements).

    One resolver per strategy (it holds that strategy's resolution trees).
    """

    def __init__(self, acc: "Accounting | None", shared: SharedMemo):
        self._acc = acc
        self._shared = shared
        self._tree_ids: dict[str, int] | None = None

    def strides(self, strategy: Strategy) -> Mapping[str, tuple[int, ...]]:
        return self._shared.strides

    def _trees(self, strategy: Strategy) -> dict[str, int] | None:
        if self._tree_ids is None and self._acc is not None:
            choice = {}
            for t, es in strategy.chosen.items():
                o = self._acc.option_by_edges.get(frozenset(e.id for e in es))
                if o is None:
                    self._acc = None     # not whole options: resolve the core's way
                    return None
                choice[t] = o
            self._tree_ids = self._acc.trees_of_choice(choice)
        return self._tree_ids

    def resolve(self, strategy: Strategy, tensor: str) -> IndexMap | None:
        trees = self._trees(strategy) if self._acc is not None else None
        if trees is None:
            return None
        return self._acc.map_of(tensor, trees.get(tensor, PHYS))

    def residuals(self, strategy: Strategy, op_name: str, compute):
        trees = self._trees(strategy) if self._acc is not None else None
        if trees is None:
            return compute()
        op = strategy.graph.ops[op_name]
        key = (op_name,) + tuple(self._acc.key_of(t, trees.get(t, PHYS)) for t in op.inputs + op.outputs)
        hit = self._shared.residuals.get(key)
        if hit is None:
            hit = self._shared.residuals[key] = compute()
        return hit[0], list(hit[1])

    def check_write(self, strategy: Strategy, m: IndexMap, check) -> None:
        key = repr(m)
        if key in self._shared.write_ok:
            return
        check()
        self._shared.write_ok.add(key)


def LocalStrategy(vtog: VTOG, edges: Iterable[int] = (), acc: "Accounting | None" = None,
                  impl: Mapping[str, str] | None = None) -> Strategy:
    """A core :class:`Strategy` answering from ``acc``'s memos (see :class:`AccountingResolver`).

    Kept under its old name for callers; prefer :meth:`Accounting.strategy`.
    Hand ``strategy.detached()`` to realization.
    """
    shared = acc.shared if acc is not None else SharedMemo(vtog.graph)
    return Strategy(vtog, edges, impl, resolver=AccountingResolver(acc, shared))


# ---------------------------------------------------------------------------
# traffic of one access through a map
# ---------------------------------------------------------------------------

@dataclass
class Traffic:
    """What reading or writing a tensor through its map costs in memory operations."""

    elements: int = 0          # elements accessed (virtual index space)
    distinct: int = 0          # distinct physical elements touched
    bytes: float = 0.0         # elements * itemsize
    dram_bytes: float = 0.0    # distinct bytes, rounded up to sectors and penalized for short runs
    l2_bytes: float = 0.0      # repeated reads of the same elements (served by L2)
    index_ops: float = 0.0     # extra integer ops for the map (div/mod, lookups, piece predicates)
    min_run_bytes: int = 0     # shortest contiguous run over the pieces
    swapped_dram: float = 0.0  # the part of dram_bytes coalesced only in the swapped 2-D orientation

    def copy(self) -> "Traffic":
        return Traffic(self.elements, self.distinct, self.bytes, self.dram_bytes, self.l2_bytes, self.index_ops,
                       self.min_run_bytes, self.swapped_dram)

    def __iadd__(self, o: "Traffic") -> "Traffic":
        self.elements += o.elements
        self.distinct += o.distinct
        self.bytes += o.bytes
        self.dram_bytes += o.dram_bytes
        self.l2_bytes += o.l2_bytes
        self.index_ops += o.index_ops
        self.swapped_dram += o.swapped_dram
        runs = [r for r in (self.min_run_bytes, o.min_run_bytes) if r > 0]
        self.min_run_bytes = min(runs) if runs else 0
        return self


def _swapped_run(m: IndexMap, p: Piece, strides) -> int:
    """Contiguous run when a kernel tiles the last two dims and walks the second-last fastest.

    GEMMs load [BM, BK] tiles either way round, and tiled copies/pointwise
    kernels coalesce through shared memory, so a transposed operand keeps its
    bandwidth; what matters is the better of the two orientations.
    """
    n = len(p.region)
    if n < 2 or p.region[-1][1] - p.region[-1][0] <= 1 or p.region[-2][1] - p.region[-2][0] <= 1:
        return 0
    a, b = f"i{n - 1}", f"i{n - 2}"
    env = {a: Expr({Var(b): 1}), b: Expr({Var(a): 1})}
    region = p.region[:-2] + (p.region[-1], p.region[-2])
    memo = _SWAPS.get(n)   # the swap of an atom, shared by every piece of this rank (Expr.subs)
    if memo is None or len(memo) > 1 << 16:
        memo = _SWAPS[n] = {}
    q = Piece(p.target, region, tuple(e.subs(env, memo) for e in p.index),
              tuple((c.subs(env, memo), lo, hi) for c, lo, hi in p.conds), p.fill)
    shape = m.shape[:-2] + (m.shape[-1], m.shape[-2])
    try:
        return IndexMap(shape, [q], m.target_shapes).piece_runs(strides)[0][0]
    except Exception:
        return 0


_SWAPS: dict[int, dict] = register_memo({})   # rank -> {atom: the atom with its last two dims swapped}


def affine_coefs(p: Piece, strides: Sequence[int]) -> tuple[int, ...] | None:
    """Coefficient of each index variable in ``p``'s flat offset, computed numerically.

    ``None`` unless every index expression is affine (index variables and runtime scalars only: no
    div/mod, no lookups), where :meth:`Piece.offset`'s simplification cannot change a coefficient
    that matters (it only folds variables of extent one into constants).  The fast path of the
    traffic model: no expression is built or simplified.
    """
    n = len(p.region)
    coefs = [0] * n
    for e, st in zip(p.index, strides):
        for a, c in e.terms:
            if type(a) is Var:
                nm = a.name
                if nm[:1] != "i" or not nm[1:].isdigit() or int(nm[1:]) >= n:
                    return None
                coefs[int(nm[1:])] += c * int(st)
            elif type(a) is not Sym:
                return None
    return tuple(coefs)


def affine_run(coefs: Sequence[int], region, shape: Sequence[int] | None) -> int:
    """Contiguous run (elements) of an affine piece without predicates: what ``_run_length`` returns
    for it, from the offset's coefficients (dims of extent one skipped, a partial dim ends the run).

    ``shape`` None: the first break of the offset's values in the row-major order of the box ``region``
    itself (a partial dim does not end the run), what ``_run_length``'s evaluation finds for a piece with
    predicates over its sample box (:func:`~vtcsearch.core.mapping.sample_box`)."""
    run, expected = 1, 1
    for d in reversed(range(len(region))):
        lo, hi = region[d]
        ext = hi - lo
        if ext == 1:
            continue
        if coefs[d] != expected:
            break
        run *= ext
        expected *= ext
        if shape is not None and (lo, hi) != (0, shape[d]):
            break
    return run


def affine_distinct(coefs: Sequence[int], region) -> int:
    """Distinct offsets of an affine offset over the box ``region``, as the traffic model counts them for a large
    box: each variable with a non-zero coefficient multiplies the count by its extent (no two collide)."""
    return math.prod(hi - lo for c, (lo, hi) in zip(coefs, region) if c != 0)


def _atom_ops(e: Expr, per_element: Mapping[str, float] | None = None) -> float:
    """Integer ops per element an index expression costs beyond plain strided addressing.

    ``per_element``: how often per element a term over each variable is computed.  Kernels tile the last two
    dims (pointwise and copy tiles, GEMM and attention tiles), so a term over the last dim is computed per
    element, one over the second-to-last once per tile row, and one over outer dims once per program: a GQA
    map's ``head // 4`` costs nothing per element.  A term counts at the most frequent of its variables
    (every term at 1 when ``per_element`` is None)."""
    ops = 0.0
    for a, _ in e.terms:
        if isinstance(a, (FloorDiv, Mod, Lookup)):
            w = 1.0 if per_element is None else max((per_element.get(v, 0.0) for v in _atom_vars(a)), default=0.0)
            if isinstance(a, Lookup):
                ops += w * 4 + sum(_atom_ops(i, per_element) for i in a.index)
            else:
                ops += w * 8 + _atom_ops(a.arg, per_element)   # a division by a constant: a mul-hi plus fix-ups
    return ops


def _atom_vars(a) -> frozenset[str]:
    """``Expr({a: 1}).free_var_set()`` without building the expression."""
    if isinstance(a, Var):
        return frozenset((a.name,))
    if isinstance(a, (FloorDiv, Mod)):
        return a.arg.free_var_set()
    if isinstance(a, Lookup):
        return frozenset().union(*(e.free_var_set() for e in a.index))
    return frozenset()


def tile_frequency(region: Sequence[tuple[int, int]]) -> dict[str, float]:
    """Variable -> how often per element a term over it is computed in a kernel tiling the last two dims of
    ``region`` (:func:`_atom_ops`)."""
    n = len(region)
    last = region[-1][1] - region[-1][0] if n else 1
    out = {f"i{k}": 0.0 for k in range(n)}
    if n:
        out[f"i{n - 1}"] = 1.0
    if n >= 2:
        out[f"i{n - 2}"] = 1.0 / max(1, last)
    return out


def _unlook(e: Expr) -> Expr:
    """Replace ``table[i]`` by ``2*i``: index tensors taken as one-to-one (as the core's write check does),
    and the rows they pick as distinct but not adjacent (a gather's contiguous run is one row).

    Memoized per expression (immutable): rebuilding one goes through the simplifying arithmetic of div and
    mod even without a lookup, and the traffic model asks again for every piece's predicates and offset."""
    got = _UNLOOKED.get(e)
    if got is None:
        if len(_UNLOOKED) > 1 << 18:   # a bound on memory
            _UNLOOKED.clear()
        got = _UNLOOKED[e] = _unlook_expr(e)
    return got


_UNLOOKED: dict[Expr, Expr] = register_memo({})


def _unlook_expr(e: Expr) -> Expr:
    def f(a):
        if isinstance(a, Lookup):
            return _unlook(a.index[0]) * 2 if len(a.index) == 1 else Expr({Var("_lk"): 1})
        if isinstance(a, FloorDiv):
            return _unlook(a.arg) // a.div
        if isinstance(a, Mod):
            return _unlook(a.arg) % a.div
        return Expr({a: 1})
    return e.map_atoms(f)


def _for_eval(e: Expr, ranges: Mapping[str, tuple[int, int]]) -> Expr:
    """``e`` (lookups as :func:`_unlook` takes them) in its simplest form over ``ranges``, to be evaluated there:
    the same values at every point in them, and far fewer array operations for the nested div/mod of a
    channel shuffle (``(196*i1 + 14*i2 + i3) // 392`` over a 14x14 plane is ``i1 // 2``)."""
    return simplify(_unlook(e), ranges, divisors=True)


def count_distinct(vals: np.ndarray) -> int:
    """How many distinct values an integer array holds (``np.unique(vals).size``): by counting when they
    span little (linear, where np.unique sorts), else by sorting.  np.unique's first call imports numpy.ma,
    ~10 ms inside whichever query comes first."""
    v = np.asarray(vals).ravel()
    if v.size <= 1:
        return int(v.size)
    lo, hi = int(v.min()), int(v.max())
    if hi - lo < 4 * v.size + 1024:
        return int(np.count_nonzero(np.bincount(v - lo)))
    v = np.sort(v)
    return int(np.count_nonzero(v[1:] != v[:-1])) + 1


_UNSET = object()   # a memo miss (None is a valid memoized answer)


class TrafficModel:
    """Counts elements, distinct elements and contiguous runs of accesses through maps.

    Distinct elements (what DRAM must deliver) are exact for pieces of up to
    ``exact_limit`` elements (by evaluation) and otherwise computed per group of
    index variables that share a div/mod atom, assuming the groups are
    independent (true for maps built from movement ops over dense storages).
    """

    def __init__(self, sector: int = 32, coalesce: int = 128,
                 short_run_penalty: float = 0.25, exact_limit: int = 1 << 12, tile2d: bool = True,
                 fast: bool = True, swap_read_penalty: float = 1.0, swap_write_penalty: float = 1.0,
                 tile2d_pieces: bool = True):
        """``fast``: affine pieces without predicates take the numeric path (:func:`affine_coefs`);
        ``False`` computes everything symbolically (the reference the tests compare with).

        ``swap_read_penalty`` / ``swap_write_penalty``: the DRAM-bytes factor of an access (read / write)
        whose runs exist only in the swapped orientation of a 2-D tile (a transpose absorbed by tiling is
        not free on the GPU: measured ~2-3x for reads, ~10x for stores on the H200).  ``tile2d_pieces``:
        whether a map of several pieces gets the swapped orientation at all (Triton loses the contiguity
        of a predicated multi-piece load).  The defaults (1.0, 1.0, True) are the old, neutral model."""
        self.tile2d = tile2d
        self.fast = fast
        self.swap_penalty = {False: swap_read_penalty, True: swap_write_penalty}
        self.tile2d_pieces = tile2d_pieces
        self.sector, self.coalesce = sector, coalesce
        self.short_run_penalty = short_run_penalty
        self.exact_limit = exact_limit
        self._piece: dict[tuple, tuple[int, int, int, float]] = {}
        # a first query's numeric work, memoized by what it reads (issue 13): pair pieces of a residual copy through
        # a chain of shuffles repeat their predicates, offset groups and offsets (tests/test_query_speed.py)
        self._masks: dict[tuple, np.ndarray] = {}     # (predicate, lo, hi, grid) -> its mask over the grid
        self._groups: dict[tuple, int] = {}           # (group's expression, its variables' box) -> distinct
        self._ops: dict[tuple, float] = {}            # (simplified offset, tile frequencies) -> index ops
        self._maps: dict[tuple[int, int], tuple[IndexMap, Traffic]] = {}
        self._runs: dict[tuple, int] = {}
        self._affine: dict[tuple, tuple[int, float, int]] = {}
        self._by_pieces: dict[tuple, Traffic] = {}               # map signature -> traffic
        self._by_piece: dict[tuple, Traffic | None] = {}         # piece signature -> traffic
        self._fractions: dict[tuple, float] = {}                 # (region, predicates) -> share kept
        self._distinct: dict[tuple, int] = {}                    # (offset, region) -> distinct offsets

    def access(self, m: IndexMap, itemsize: int, strides: Mapping[str, Sequence[int]],
               write: bool = False) -> Traffic:
        """Traffic of accessing every element of ``m``'s domain once, in row-major order (``write``: a
        store, which pays ``swap_write_penalty`` instead of ``swap_read_penalty``).

        Memoized per map object and per *signature* (:meth:`signature`: shape, pieces without their
        storage names, the storages' strides, itemsize), so the same access in another layer, or a map
        rebuilt per query (residual copies), is priced once."""
        write = bool(write) and self.swap_penalty[True] != self.swap_penalty[False]
        hit = self._maps.get((id(m), itemsize, write))
        if hit is not None and hit[0] is m:
            return hit[1].copy()
        sig = (self.signature(m, itemsize, strides), write)
        out = self._by_pieces.get(sig)
        if out is None:
            out = self._by_pieces[sig] = self._access(m, itemsize, strides, write)
        if len(self._maps) > 1 << 16:   # ids of dead maps can be reused: keep this memo small
            self._maps.clear()
        self._maps[(id(m), itemsize, write)] = (m, out)
        return out.copy()

    @staticmethod
    def signature(m: IndexMap, itemsize: int, strides: Mapping[str, Sequence[int]]) -> tuple:
        """What the traffic of an access through ``m`` depends on, as a hashable key without storage names:
        the domain's shape, the itemsize, and per piece its region, index, predicates and the strides of
        the storage it lands in (``None``: a constant piece).  Two layers with the same shapes share it."""
        return (m.shape, itemsize, tuple((p.region, p.index, p.conds, None if p.target is None
                                          else tuple(strides[p.target])) for p in m.pieces))

    def _access(self, m: IndexMap, itemsize: int, strides: Mapping[str, Sequence[int]],
                write: bool = False) -> Traffic:
        out = Traffic()
        tile2d = self.tile2d and (self.tile2d_pieces or len(m.pieces) == 1)
        penalty = self.swap_penalty[write]
        for p in m.pieces:
            if p.target is None or not region_size(p.region):
                continue
            st = tuple(strides[p.target])
            key = (p.region, p.index, p.conds, st, m.shape, itemsize, tile2d, penalty)
            t = self._by_piece.get(key, _UNSET)
            if t is _UNSET:
                t = self._by_piece[key] = self._piece_traffic(p, st, m, itemsize, tile2d, penalty)
            if t is not None:
                out += t
        if len([p for p in m.pieces if p.target is not None]) > 1:
            out.index_ops += 2.0 * (len(m.pieces) - 1) * out.elements  # piece predicates and selects
        return out

    def _piece_traffic(self, p: Piece, st: tuple[int, ...], m: IndexMap, itemsize: int, tile2d: bool,
                       penalty: float) -> Traffic | None:
        """Traffic of one piece landing in a storage with strides ``st`` (None: it touches nothing)."""
        n = region_size(p.region)
        coefs = affine_coefs(p, st) if self.fast else None
        if coefs is not None and not p.conds:
            return self._affine_piece(p, coefs, m.shape, n, itemsize, tile2d, penalty)
        strides = {p.target: st}
        if coefs is None:
            run = self._run(p, strides, m)
        else:   # predicates send _run_length to the offset's first break over the sample box: its coefficients'
            run = affine_run(coefs, sample_box(p.region, RUN_SAMPLE), None)
        swapped = False
        if tile2d and run * itemsize < self.coalesce:
            sw = _swapped_run(m, p, strides)
            swapped = sw > run
            run = max(run, sw)
        count, distinct, run_el, ops = self._piece_stats(p, run, st, coefs)
        if count == 0:
            return None
        rb = max(1, run_el) * itemsize
        factor = self.run_factor(rb, penalty if swapped else 1.0)
        return Traffic(elements=count, distinct=distinct, bytes=count * itemsize,
                       dram_bytes=distinct * itemsize * factor,
                       l2_bytes=(count - distinct) * itemsize, index_ops=ops * count, min_run_bytes=rb,
                       swapped_dram=distinct * itemsize * factor if swapped else 0.0)

    def run_factor(self, run_bytes: int, penalty: float = 1.0) -> float:
        """DRAM bytes moved per useful byte for contiguous runs of ``run_bytes``: whole sectors, a short-run
        penalty under the coalescing width, and ``penalty`` for an access coalesced only when swapped."""
        factor = math.ceil(run_bytes / self.sector) * self.sector / run_bytes
        if run_bytes < self.coalesce:
            factor *= 1.0 + self.short_run_penalty * (1.0 - run_bytes / self.coalesce)
        return factor * penalty

    def _affine_piece(self, p: Piece, coefs: tuple[int, ...], shape: tuple[int, ...], n: int,
                      itemsize: int, tile2d: bool = True, penalty: float = 1.0) -> Traffic:
        """The traffic of an affine piece without predicates, numerically (same numbers as the symbolic
        path: ``_run`` / ``_swapped_run`` / ``_piece_stats``; tests compare on random maps)."""
        key = (coefs, p.region, shape, itemsize, tile2d, penalty)
        hit = self._affine.get(key)
        if hit is None:
            region = p.region
            run = affine_run(coefs, region, shape)
            swapped = False
            if tile2d and self.tile2d and run * itemsize < self.coalesce and len(region) >= 2 \
                    and region[-1][1] - region[-1][0] > 1 and region[-2][1] - region[-2][0] > 1:
                sw = affine_run(coefs[:-2] + (coefs[-1], coefs[-2]),
                                region[:-2] + (region[-1], region[-2]), shape[:-2] + (shape[-1], shape[-2]))
                swapped = sw > run
                run = max(run, sw)
            distinct = min(n, max(affine_distinct(coefs, region), 1))
            rb = max(1, run) * itemsize
            factor = self.run_factor(rb, penalty if swapped else 1.0)
            hit = self._affine[key] = (distinct, factor, rb, swapped)
        distinct, factor, rb, swapped = hit
        return Traffic(elements=n, distinct=distinct, bytes=n * itemsize, dram_bytes=distinct * itemsize * factor,
                       l2_bytes=(n - distinct) * itemsize, index_ops=0.0, min_run_bytes=rb,
                       swapped_dram=distinct * itemsize * factor if swapped else 0.0)

    def _run(self, p: Piece, strides, m: IndexMap) -> int:
        if p.target is None:
            return region_size(p.region)
        st = tuple(strides[p.target])
        key = (p, st, m.shape)
        r = self._runs.get(key)
        if r is None:
            q = p
            if any(e.has_lookup() for e in p.index) or any(c.has_lookup() for c, _, _ in p.conds):
                # runs of a gather: index-tensor reads taken as identity rows (the core's numeric
                # fallback would need the index tensor's values)
                q = Piece(p.target, p.region, tuple(_unlook(e) for e in p.index),
                          tuple((_unlook(c), lo, hi) for c, lo, hi in p.conds), p.fill)
            try:
                r = _run_length(q, st, m.shape) if _run_length else \
                    IndexMap(m.shape, [q], m.target_shapes).piece_runs(strides)[0][0]
            except (KeyError, ValueError):
                r = 1
            self._runs[key] = r
        return r

    def _piece_stats(self, p: Piece, run: int, st: tuple[int, ...], coefs: tuple[int, ...] | None = None
                     ) -> tuple[int, int, int, float]:
        """(count, distinct, run, index ops) of piece ``p`` (memoized without the run: the run is the caller's,
        it depends on the domain's shape too), the ops of an offset memoized per its simplified form and the
        box's tile frequencies (offsets of new pieces mostly simplify to ones priced before) and the small
        pieces' predicates and offset evaluated by :func:`~vtcsearch.core.expr.evaluate_grid`.

        ``coefs``: the offset's coefficients (:func:`affine_coefs`) of an affine piece, whose offset is then
        neither built nor simplified: it costs no index arithmetic, and its distinct offsets are counted from
        the coefficients (a shift does not change a count)."""
        key = (p, st)
        hit = self._piece.get(key)
        if hit is not None:
            return hit[0], hit[1], run, hit[3]
        n = region_size(p.region)
        freq = tile_frequency(p.region)
        ranges = {f"i{k}": (lo, hi - 1) for k, (lo, hi) in enumerate(p.region)}
        if coefs is None:
            off = p.offset(st)
            ops = self._offset_ops(simplify(off, ranges, divisors=True), freq)
            flat = _unlook(off)
        else:   # affine: no index arithmetic; its values up to a shift, which changes no count
            off = flat = Expr({Var(f"i{k}"): c for k, c in enumerate(coefs)})
            ops = 0.0
        ops += sum(2.0 * max((freq.get(v, 0.0) for v in c.free_var_set()), default=0.0) for c, _, _ in p.conds)
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
            vals = evaluate_grid(_for_eval(off, ranges) if coefs is None else off, grid, syms)
            vals = np.broadcast_to(np.asarray(vals), mask.shape)[mask]
            count = int(mask.sum())
            distinct = count_distinct(vals)
        else:
            frac = self._cond_fraction(p) if p.conds else 1.0
            count = int(round(n * frac))
            total = self._distinct_estimate(flat, p.region) if coefs is None else affine_distinct(coefs, p.region)
            distinct = min(count, int(round(total * frac)))
        res = (count, max(distinct, 1 if count else 0), run, ops)
        self._piece[key] = res
        return res


    def _offset_ops(self, off: Expr, freq: dict[str, float]) -> float:
        """:func:`~cost_models.accounting._atom_ops` of a simplified offset, memoized."""
        key = (off, tuple(freq.items()))
        hit = self._ops.get(key)
        if hit is None:
            hit = remember(self._ops, key, _atom_ops(off, freq), 1 << 16)
        return hit

    def _cond_fraction(self, p: Piece, sample: int = 4096) -> float:
        """The share of ``p``'s region its predicates keep, from a fixed sample (memoized per region and
        predicates: the pieces of one concat or pad share them, whatever their index; in any order, as the
        two sides of a residual copy's pair hold them, since their masks are and-ed)."""
        key = (p.region, frozenset(p.conds), sample)
        hit = self._fractions.get(key)
        if hit is None:
            hit = self._fractions[key] = self._sample_fraction(p, sample)
        return hit

    def _sample_fraction(self, p: Piece, sample: int) -> float:
        """The share of ``p``'s region its predicates keep.  Where they read few of the region's variables (a
        channel shuffle's: the channel, not the pixel), exactly over the grid of those, which the other
        variables do not change, each predicate's mask memoized per (predicate as evaluated, bounds, grid)
        and its values by :func:`~vtcsearch.core.expr.evaluate_grid`; else over ``sample`` random points."""
        ranges = p.ranges()
        conds = [(_for_eval(ce, ranges), lo, hi) for ce, lo, hi in p.conds]
        ext = {f"i{k}": hi - lo for k, (lo, hi) in enumerate(p.region)}
        used = sorted({v for c, _, _ in conds for v in c.free_var_set()} & set(ext))
        if math.prod(ext[v] for v in used) > sample:
            rng = np.random.default_rng(0)
            env: dict[str, Any] = {f"i{k}": rng.integers(lo, hi, sample) for k, (lo, hi) in enumerate(p.region)}
            env.update({s.name: s.lo for c, _, _ in conds for s in c.syms()})
            picked = np.ones(sample, dtype=bool)
            for ce, lo, hi in conds:
                v = evaluate(ce, env)
                picked &= (v >= lo) & (v < hi)
            return float(picked.mean()) if picked.size else 1.0
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
                m = remember(self._masks, key, m, 1 << 14)   # at most 64 MiB of masks
            mask &= m
        return float(mask.mean()) if mask.size else 1.0

    def _distinct_estimate(self, off: Expr, region) -> int:
        """How many distinct offsets ``off`` takes over ``region`` (memoized: pieces of other storages or
        predicates share it)."""
        key = (off, region)
        hit = self._distinct.get(key)
        if hit is None:
            hit = self._distinct[key] = self._estimate_distinct(off, region)
        return hit

    def _estimate_distinct(self, off: Expr, region: Sequence[tuple[int, int]]) -> int:
        """How many distinct offsets ``off`` takes over ``region``: the product over groups of variables coupled
        through one non-linear atom (assumed independent), each group's exact count memoized per (group's
        expression, the box of its variables): the groups of a new piece's offset are mostly those of pieces
        priced before."""
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
                    n = remember(self._groups, key, count_distinct(vals), 1 << 16)
                total *= n
            elif e.is_affine():
                total *= math.prod(ext[v] for v in vars_ if e.coef(Var(v)) != 0)
            else:
                lo, hi = bounds(e, {f"i{k}": (a, b - 1) for k, (a, b) in enumerate(region)})
                total *= min(size, hi - lo + 1)
        return total


# ---------------------------------------------------------------------------
# FLOPs of compute ops
# ---------------------------------------------------------------------------

_PER_ELEMENT = {"pointwise": 1.0, "reduction": 2.0, "other": 1.0}


def op_flops(graph: TensorGraph, op_name: str) -> float:
    """FLOPs of one compute op: 2MNK for matmuls, 2*out*(Cin/g)*k for convs, 4*B*H*L*S*D for attention,
    a few per element for pointwise ops and reductions."""
    op = graph.ops[op_name]
    shp = [graph.tensors[t].shape for t in op.inputs]
    out = [graph.tensors[t].shape for t in op.outputs]
    tname = op.target_name
    if op.category == "matmul":
        if tname.startswith("addmm") or tname.startswith("baddbmm"):
            shp = shp[1:]
        a, b = shp[0], shp[1]
        batch = math.prod(a[:-2]) if len(a) > 2 else 1
        return 2.0 * batch * a[-2] * a[-1] * b[-1] + (math.prod(out[0]) if len(op.inputs) > 2 else 0)
    if op.category == "conv":
        w = shp[1]
        return 2.0 * math.prod(out[0]) * math.prod(w[1:])
    if op.category == "attention":
        q, k = shp[0], shp[1]
        b_h = math.prod(q[:-2])
        return 4.0 * b_h * q[-2] * k[-2] * q[-1] + 5.0 * b_h * q[-2] * k[-2]
    per = _PER_ELEMENT.get(op.category, 1.0)
    if op.category == "reduction":
        return per * (math.prod(shp[0]) if shp else 0)
    return per * sum(math.prod(o) for o in out)


TENSOR_CORE = {"matmul", "conv", "attention"}

ATTN_TILE = 64      # the attention template's query rows and keys per tile at prefill sizes


def attention_density(graph: TensorGraph, kernel: str, tile: int = ATTN_TILE) -> float:
    """The fraction of an attention kernel's (query tile, key tile) pairs it computes: about 1/2 when causal
    (FlashAttention skips the tiles above the diagonal), about ``window / Skv`` with a sliding window; 1 for
    any other kernel.  Query row ``i`` sits at position ``i + Skv - Sq`` (bottom-right, as the template)."""
    group = getattr(graph, "groups", {}).get(kernel)
    if group is None or group.kind != "attention":
        return 1.0
    info = group.info
    causal, window = bool(info.get("causal")), info.get("window")
    if not causal and window is None or "q" not in info or "v" not in info:
        return 1.0
    sq, skv = graph.tensors[info["q"]].shape[-2], graph.tensors[info["v"]].shape[-2]
    if sq <= 16 or not skv:          # decode-shaped: one row tile over every key (split over programs)
        return 1.0
    kblocks = -(-skv // tile)
    done = 0
    rblocks = -(-sq // tile)
    for r in range(rblocks):
        first, last = r * tile + skv - sq, min((r + 1) * tile, sq) - 1 + skv - sq
        hi = min(skv, last + 1) if causal else skv
        lo = max(0, first - int(window) + 1) // tile * tile if window is not None else 0
        done += max(0, -(-hi // tile) - lo // tile)
    return done / (rblocks * kblocks)


# ---------------------------------------------------------------------------
# the accounting of one VTOG
# ---------------------------------------------------------------------------

@dataclass
class Operand:
    """One tensor a unit reads ('r') or writes ('w'), and where it lives."""

    tensor: str
    role: str
    map: IndexMap
    dtype: torch.dtype
    itemsize: int


@dataclass
class UnitSpec:
    """Everything needed to cost or run one unit in one configuration.

    Kernel units: ``ops`` (the kernel's ATen ops, in order) and ``operands``
    (its I/O through their maps).  Copy units: ``operands`` is [dst (w), src (r)],
    two maps over one domain whose pieces correspond one to one.
    ``launch`` carries a kernel back end's launch configuration (block sizes,
    warps); it is part of the cache key.
    """

    unit: Unit
    config: tuple[str, ...]                 # map keys of unit.tensors
    operands: list[Operand]
    ops: list[Any] = field(default_factory=list)
    storages: dict[str, tuple[tuple[int, ...], tuple[int, ...], torch.dtype]] = field(default_factory=dict)
    tables: dict[str, tuple[tuple[int, ...], torch.dtype]] = field(default_factory=dict)
    flops: float = 0.0
    tensor_core: bool = False
    compute_dtype: torch.dtype | None = None
    launch: dict[str, Any] = field(default_factory=dict)
    elements: int = 0                       # copy units: elements copied
    graph: Any = field(default=None, repr=False, compare=False)   # the TensorGraph (for timers that lower)
    impl: str = "triton"                    # kernel units: the implementation (vtcsearch.core.implementation)
    _key: str | None = None

    @property
    def kind(self) -> str:
        return self.unit.kind

    @property
    def empty(self) -> bool:
        """A copy unit with nothing left to copy costs nothing."""
        return self.kind == "copy" and self.elements == 0

    def key(self) -> str:
        """Canonical text of what is measured: ops, shapes, dtypes, I/O maps and launch config.

        Storage and tensor names are replaced by positional placeholders, so two
        identical kernels (the same layer twice) share one measurement.
        """
        if self._key is None:
            self._key = _canonical_key(self)
        return self._key


def _canonical_key(spec: UnitSpec) -> str:
    import re
    names: dict[str, str] = {}

    def ph(n: str) -> str:
        if n not in names:
            names[n] = f"S{len(names)}"
        return names[n]

    parts = [spec.kind]
    for o in spec.operands:
        for p in o.map.pieces:
            if p.target is not None:
                ph(p.target)
        for tb in o.map.tables():
            ph(tb)
    for o in spec.operands:
        ph(o.tensor)
    local: dict[str, str] = {}
    if spec.ops:
        for op in spec.ops:
            for t in list(op.inputs) + list(op.outputs):
                if t not in names and t not in local:
                    local[t] = f"L{len(local)}"
    allnames = {**names, **local}
    pat = re.compile(r"(?<![\w$])(" + "|".join(re.escape(n) for n in sorted(allnames, key=len, reverse=True))
                     + r")(?!\w)") if allnames else None

    def canon(text: str) -> str:
        return pat.sub(lambda m: allnames[m.group(1)], text) if pat else text

    for o in spec.operands:
        parts.append(f"{o.role}:{names[o.tensor]}:{str(o.dtype).replace('torch.', '')}:{canon(repr(o.map))}")
    for s in sorted(spec.storages, key=lambda s: names.get(s, s)):
        shape, strides, dt = spec.storages[s]
        parts.append(f"{names.get(s, s)}={list(shape)}/{list(strides)}/{str(dt).replace('torch.', '')}")
    for op in spec.ops:
        node = op.node
        args = canon(_args_text(node.args if node is not None else (), node.kwargs if node is not None else {}))
        ins = ",".join(allnames[t] for t in op.inputs)
        outs = ",".join(allnames[t] for t in op.outputs)
        parts.append(f"{op.target_name}({ins})->{outs}{args}")
    if spec.launch:
        parts.append("launch=" + ",".join(f"{k}={spec.launch[k]}" for k in sorted(spec.launch)))
    if spec.impl != "triton":   # the default's keys stay as they were (recorded measurements still match)
        parts.append(f"impl={spec.impl}")
    return " | ".join(parts)


def _args_text(args, kwargs) -> str:
    def f(a):
        if isinstance(a, torch.fx.Node):
            return a.name
        if isinstance(a, (list, tuple)):
            return "[" + ",".join(f(x) for x in a) + "]"
        if isinstance(a, torch.device):
            return "dev"
        return repr(a)
    return f(list(args)) + ("{" + ",".join(f"{k}={f(v)}" for k, v in sorted(kwargs.items())) + "}" if kwargs else "")


class Accounting:
    """Units, resolution trees, maps and residual pieces of one VTOG (shared by oracles and solvers)."""

    def __init__(self, vtog: VTOG, fuse: bool = False):
        """``fuse``: attach to each kernel unit the copies Inductor would run inside it (:func:`fuse_copies`;
        for an oracle that may choose Inductor)."""
        g = vtog.graph
        self.fuse = fuse
        self.vtog, self.graph = vtog, g
        self.order = g.order()
        self.n_steps = len(g.ops)
        self.nodes: set[str] = set(vtog.nx.nodes)
        self.shared = shared_memo(g)   # one per graph: the parts of a decomposed search share it
        self.strides = self.shared.strides
        # options, in the order the core resolves their edges (by edge id)
        self.options_of: dict[str, list[int]] = {}
        self.option_edges: list[tuple[Edge, ...]] = []
        self.option_tensor: list[str] = []
        self.option_targets: list[tuple[str, ...]] = []
        self.option_bad: set[int] = set()
        for o in vtog.options:
            es = tuple(sorted((vtog.edges[e] for e in o.edges), key=lambda e: e.id))
            self.option_edges.append(es)
            self.option_tensor.append(o.tensor)
            self.option_targets.append(tuple(dict.fromkeys(e.dst for e in es)))
            self.options_of.setdefault(o.tensor, []).append(o.id)
            if any(frozenset((a.id, b.id)) in vtog.conflicts for a, b in itertools.combinations(es, 2)):
                self.option_bad.add(o.id)
        self.candidates = [t for t in vtog.candidates()]
        self.option_by_edges = {frozenset(e.id for e in es): o for o, es in enumerate(self.option_edges)}
        self._build_units()
        # interned resolution trees: id -> (option, child tree ids); 0 is PHYS
        self._trees: list[tuple[int, tuple[int, ...]] | None] = [None]
        self._tree_id: dict[tuple[int, tuple[int, ...]], int] = {}
        self._tree_nodes: dict[int, frozenset[str]] = {}
        self._tree_size: dict[int, int] = {}
        self._map: dict[tuple[str, int], IndexMap] = {}
        self._key: dict[tuple[str, int], str] = {}
        self._copies: dict[str, dict[tuple[str, ...], list | None]] = {}   # unit name -> keys -> copies
        self._movement_sig: dict[str, tuple] = {}
        self._option_ok: dict[int, bool] = {}
        self._map_sigs: dict[tuple[str, str], tuple] = {}
        self._maps_by_key: dict[str, IndexMap] = {}
        self._trees_by_key: dict[tuple[str, str], list[int]] = {}
        self._write_ok: dict[str | tuple, bool] = {}
        self._copy_maps: dict[tuple, tuple[IndexMap, IndexMap]] = {}
        self._assign: dict[tuple[str, int], dict[str, int | None]] = {}
        self.kernel_flops = {k: sum(op_flops(g, o) for o in ops) * attention_density(g, k)
                             for k, ops in self.kernel_ops.items()}
        # tensors a kernel group makes and consumes itself (an attention's scores, a fused chain's temporaries):
        # they live in registers, never in memory, so they take no part in the peak
        owner = self.op_kernel = {o: k for k, ops in self.kernel_ops.items() for o in ops}
        self.internal = {t for t, info in g.tensors.items() if info.producer in owner and not info.is_output
                         and t not in self.kernel_io[owner[info.producer]][1]}
        # inputs of a kernel group that its template never reads (a mask proven causal: masked by index)
        self.unread = {k: set(g.groups[k].info.get("unread", ())) for k in self.kernel_ops if k in g.groups}
        # liveness
        self.span: dict[str, tuple[int, int]] = {}
        for t, info in g.tensors.items():
            start = self.order[info.producer] if info.producer in self.order else -1
            ends = [self.order[c] for c in info.consumers if c in self.order]
            end = max(ends) if ends else start
            if info.is_output:
                end = self.n_steps
            self.span[t] = (start, max(start, end))
        for t in self.constants:   # what a step folded at build makes is held for good (memory.plan keeps it)
            if not g.tensors[t].is_graph_input:
                self.span[t] = (-1, self.n_steps)
        self.const_bytes = sum(i.nbytes for t, i in g.tensors.items() if i.is_graph_input and i.storage_name == t)
        self.intermediate = {t for t, i in g.tensors.items() if not i.is_graph_input and i.storage_name == t}

    def strategy(self, edges: Iterable[int] = (), impl: Mapping[str, str] | None = None) -> Strategy:
        """A core strategy over this VTOG (``impl``: its implementation choices) answering from this
        accounting's memos."""
        return Strategy(self.vtog, edges, impl, resolver=AccountingResolver(self, self.shared))

    # -- units ----------------------------------------------------------------
    def _build_units(self) -> None:
        g = self.graph
        units: list[Unit] = []
        # TensorGraph.kernels() is O(ops) per call (and kernel_io calls it twice): compute once
        self.kernel_ops = g.kernels()
        self.kernel_io = {k: kernel_io(g, ops) for k, ops in self.kernel_ops.items()}
        self.constants = const = constant_tensors(g)
        # kernels over constants run once at build (a resize's index arithmetic): no unit, nothing per call
        self.folded_kernels = {k for k in self.kernel_ops if folded(g, k, const)}
        live = {k: ops for k, ops in self.kernel_ops.items() if k not in self.folded_kernels}
        for k in live:
            ins, outs = self.kernel_io[k]
            ts = tuple(dict.fromkeys(list(ins) + list(outs)))
            units.append(Unit(len(units), "kernel", k, ts, kernel=k))
        for op in g.movement_ops():
            if folded(g, op.name, const):
                continue    # folded at build (or read as a view by an Inductor region): no copy per call
            mv = op.movement
            if mv.updates:
                # a scatter's base copy and its updates interact: one unit over all its tensors
                units.append(Unit(len(units), "copy", op.name, tuple(dict.fromkeys(op.inputs + op.outputs)),
                                  op=op.name))
                continue
            for j, m in enumerate(mv.outputs):
                srcs = sorted({int(p.target[2:]) for p in m.pieces if p.target is not None})
                for k in srcs:
                    units.append(Unit(len(units), "copy", f"{op.name}[{j}<-{k}]",
                                      tuple(dict.fromkeys((op.outputs[j], op.inputs[k]))), op=op.name, out=j, src=k))
                if any(p.target is None for p in m.pieces):
                    units.append(Unit(len(units), "copy", f"{op.name}[{j}<-fill]", (op.outputs[j],),
                                      op=op.name, out=j))
        if self.fuse:
            units = fuse_copies(g, live, units)
        fusions = region_fusions(g, live) if self.fuse else []
        if getattr(self.vtog, "parent", None) is not None:
            # a part of a larger VTOG (solvers.decompose.sub_vtog): only the units whose maps its options can
            # change; every other unit's cost is the same under every strategy of the part (a constant the
            # search need not see), so a part's search costs O(part), not O(graph)
            movable = set(self.options_of)
            units = [replace(u, id=k) for k, u in enumerate(u for u in units if movable.intersection(u.tensors))]
        self.part = getattr(self.vtog, "parent", None) is not None
        self.units = units
        self._kernel_units = {u.kernel: u for u in units if u.kind == "kernel"}
        # a part's search sees the fusions between kernels it prices (both touch a tensor its options move)
        self.region_fusions = [f for f in fusions if f.kernel in self._kernel_units and f.into in self._kernel_units]
        self.units_of: dict[str, list[int]] = {}
        for u in units:
            for t in u.tensors:
                self.units_of.setdefault(t, []).append(u.id)

    def kernel_unit(self, kernel: str) -> Unit:
        """The unit of kernel group ``kernel``."""
        return self._kernel_units[kernel]

    # -- trees ----------------------------------------------------------------
    def intern(self, option: int, children: tuple[int, ...]) -> int:
        key = (option, children)
        tid = self._tree_id.get(key)
        if tid is None:
            tid = len(self._trees)
            self._trees.append(key)
            self._tree_id[key] = tid
        return tid

    def tree_option(self, tid: int) -> int | None:
        node = self._trees[tid]
        return None if node is None else node[0]

    def tree_nodes(self, tid: int) -> frozenset[str]:
        """Tensors a tree passes through: its root, the virtual tensors below it and its physical leaves."""
        if tid == PHYS:
            return frozenset()
        got = self._tree_nodes.get(tid)
        if got is None:
            o, ch = self._trees[tid]
            got = frozenset({self.option_tensor[o], *self.option_targets[o]}).union(*(self.tree_nodes(c) for c in ch))
            self._tree_nodes[tid] = got
        return got

    def tree_choices(self, tid: int) -> dict[str, int]:
        """tensor -> option along a tree (for building a strategy that realizes it)."""
        out: dict[str, int] = {}
        stack = [tid]
        while stack:
            x = stack.pop()
            if x == PHYS:
                continue
            o, ch = self._trees[x]
            out[self.option_tensor[o]] = o
            stack.extend(ch)
        return out

    def trees_of_choice(self, choice: Mapping[str, int]) -> dict[str, int]:
        """Tree id of every virtual tensor under ``choice`` (tensor -> option); raises on a cycle."""
        out: dict[str, int] = {}
        onpath: set[str] = set()

        def visit(t: str) -> int:
            if t in out:
                return out[t]
            o = choice.get(t)
            if o is None:
                return PHYS
            if t in onpath:
                raise ValueError(f"cycle through {t}")
            onpath.add(t)
            tid = self.intern(o, tuple(visit(d) for d in self.option_targets[o]))
            onpath.discard(t)
            out[t] = tid
            return tid

        for t in choice:
            visit(t)
        return out

    def tree_size(self, tid: int) -> int:
        """Options in a tree (0 for PHYS)."""
        if tid == PHYS:
            return 0
        got = self._tree_size.get(tid)
        if got is None:
            o, ch = self._trees[tid]
            got = 1 + sum(self.tree_size(c) for c in ch)
            self._tree_size[tid] = got
        return got

    def enumerate_trees(self, t: str, cap: int = 256) -> tuple[list[int], bool]:
        """The resolution trees ``t`` can have in an acyclic strategy, PHYS first then smallest first.

        At most ``cap`` per tensor (the smallest are kept); the flag says whether none was dropped.
        """
        memo: dict[tuple[str, frozenset], list[int]] = {}
        complete = [True]

        def rec(x: str, avoid: frozenset) -> list[int]:
            key = (x, avoid)
            if key in memo:
                return memo[key]
            found: list[int] = []
            av = avoid | {x}
            for o in self.options_of.get(x, []):
                if o in self.option_bad:
                    continue
                tg = self.option_targets[o]
                if any(d in av for d in tg):
                    continue
                subs = [rec(d, av) for d in tg]
                if math.prod(len(sb) for sb in subs) > cap:
                    per = max(1, int(cap ** (1.0 / len(subs))))
                    complete[0] = False
                    subs = [sb[:per] for sb in subs]
                found.extend(self.intern(o, tuple(c)) for c in itertools.product(*subs))
            found.sort(key=lambda tid: (self.tree_size(tid), tid))
            if len(found) >= cap:
                complete[0] = False
                found = found[:cap - 1]
            out = [PHYS] + found
            memo[key] = out
            return out

        return rec(t, frozenset()), complete[0]

    def configuration_space(self, max_trees: int = 128, max_configs: int = 1024) -> list[tuple[Unit, tuple[str, ...]]]:
        """Every (unit, configuration) a search over this VTOG may ask about, the enumeration the ILP prices:
        each kernel's own tensors' maps over their resolution trees (at most ``max_trees`` per tensor,
        ``max_configs`` per unit, capped as :func:`cap_configurations` does), and each copy a kernel may
        fuse on physical maps (what :meth:`CostOracle._fused_cost` asks)."""
        keys: dict[str, list[str]] = {}
        for t in sorted(self.nodes):
            trees, _ = self.enumerate_trees(t, max_trees)
            keys[t] = list(dict.fromkeys(self.key_of(t, tid) for tid in trees))
        out: list[tuple[Unit, tuple[str, ...]]] = []
        for unit in self.units:
            u = unit.without_fusion()
            ks, _ = cap_configurations([keys.get(t, [self.key_of(t, PHYS)]) for t in u.tensors], max_configs)
            out.extend((u, tuple(c)) for c in itertools.product(*ks))
            out.extend((cu, tuple(self.key_of(t, PHYS) for t in cu.tensors)) for cu in unit.fuses)
        return out

    # -- maps -----------------------------------------------------------------
    def map_of(self, t: str, tid: int) -> IndexMap:
        """The resolved map of ``t`` under tree ``tid`` (as Strategy.resolve composes it)."""
        key = (t, tid)
        m = self._map.get(key)
        if m is None:
            info = self.graph.tensors[t]
            if tid == PHYS:
                m = self.shared.phys_maps.get(t)
                if m is None:
                    m = self.shared.phys_maps[t] = IndexMap.identity(info.shape, info.storage_name)
            else:
                o, ch = self._trees[tid]
                sub = dict(zip(self.option_targets[o], ch))
                m = IndexMap.union(info.shape, [e.map.compose({e.dst: self.map_of(e.dst, sub[e.dst])})
                                                for e in self.option_edges[o]])
            self._map[key] = m
        return m

    def key_of(self, t: str, tid: int) -> str:
        """Stable text of a resolved map (configuration keys)."""
        key = (t, tid)
        k = self._key.get(key)
        if k is None:
            if tid == PHYS:
                k = f"phys:{self.graph.tensors[t].storage_name}"
            else:
                k = repr(self.map_of(t, tid))
            self._key[key] = k
            self._maps_by_key.setdefault(k, self.map_of(t, tid))
            self._trees_by_key.setdefault((t, k), []).append(tid)
        return k

    def map_by_key(self, t: str, key: str) -> IndexMap:
        if key.startswith("phys:"):
            return self.map_of(t, PHYS)
        return self._maps_by_key[key]

    def maps_of_trees(self, trees: Mapping[str, int]) -> dict[str, IndexMap]:
        return {t: self.map_of(t, trees.get(t, PHYS)) for t in self.graph.tensors}

    # -- residual copies of a copy unit -------------------------------------
    def tree_assign(self, t: str, tid: int) -> dict[str, int | None]:
        """Every placement a tree fixes: tensor -> option, or None for its physical leaves (memoized: read only)."""
        got = self._assign.get((t, tid))
        if got is not None:
            return got
        out: dict[str, int | None] = {}
        stack = [(t, tid)]
        while stack:
            x, y = stack.pop()
            if y == PHYS:
                out[x] = None
                continue
            o, ch = self._trees[y]
            out[x] = o
            stack.extend(zip(self.option_targets[o], ch))
        self._assign[(t, tid)] = out
        return out

    def realize(self, tensors: Sequence[str], keys: Sequence[str]) -> dict[str, int] | None:
        """tensor -> option of a strategy giving each tensor the map named by its key (None: impossible)."""
        cands = []
        for t, k in zip(tensors, keys):
            trees = [PHYS] if k.startswith("phys:") else self._trees_by_key.get((t, k), [])
            if not trees:
                return None
            cands.append(trees)
        assigns = [[self.tree_assign(t, tid) for tid in trees] for t, trees in zip(tensors, cands)]
        choice: dict[str, int | None] = {}

        def rec(i: int) -> bool:   # backtracking over consistent trees (consistent unions are acyclic)
            if i == len(assigns):
                return True
            for a in assigns[i]:
                if any(x in choice and choice[x] != o for x, o in a.items()):
                    continue
                added = [x for x in a if x not in choice]
                choice.update({x: a[x] for x in added})
                if rec(i + 1):
                    return True
                for x in added:
                    del choice[x]
            return False

        if not rec(0):
            return None
        return {x: o for x, o in choice.items() if o is not None}

    def copies(self, u: Unit, keys: tuple[str, ...]) -> list[tuple[tuple[int, ...], list[tuple[Piece, Piece]]]] | None:
        """The residual copies (domain, [(dst piece, src piece)]) unit ``u`` makes, from the core.

        A strategy realizing just the unit's tensors' maps is built and asked
        ``residuals_of``; the pieces of a (j, k) unit are those of output ``j``
        whose region lies in the part of ``out_j`` read from ``in_k``.  ``None``:
        no acyclic strategy gives these maps together.  The pieces are a function of the op's
        movement maps and the unit's maps only, so they are computed once per :meth:`copy_signature`
        (the same copy in another layer is renamed, not recomputed).
        """
        memo = self._copies.get(u.name)   # one dict per unit, as CostOracle.unit_cost's memo (no big rehash)
        if memo is None:
            memo = self._copies[u.name] = {}
        if keys in memo:
            return memo[keys]
        choice = self.realize(u.tensors, keys)
        got: list[tuple[tuple[int, ...], list[tuple[Piece, Piece]]]] | None = None
        if choice is not None and self.structure_ok(choice):
            sig, names = self.copy_signature(u, keys)
            canon = self.shared.copies.get(sig, _UNSET)
            if canon is _UNSET:
                got = self._residual_pieces(self._checked_strategy(choice), u)
                self.shared.copies[sig] = None if got is None else (got, names)   # renamed when asked again
            elif canon is not None:
                to = dict(zip(canon[1], names))
                got = [(d, [(_retarget(a, to), _retarget(b, to)) for a, b in pairs]) for d, pairs in canon[0]]
        memo[keys] = got
        return got

    def _checked_strategy(self, choice: Mapping[str, int]) -> Strategy:
        """:meth:`strategy` taking ``choice`` (tensor -> option), which passed :meth:`structure_ok`: the core's
        structure check of these edges is that one, so it is not run again (every tensor of a shuffle chain's
        trees, per first query of a copy), and the resolver's trees come from ``choice``, not from the edges
        mapped back to options."""
        s = self.strategy([e.id for o in choice.values() for e in self.option_edges[o]])
        s.mark_structure_checked()
        s.resolver._tree_ids = self.trees_of_choice(choice)
        return s

    def structure_ok(self, choice: Mapping[str, int]) -> bool:
        """Whether a strategy taking ``choice`` (tensor -> option) passes the core's structure check: each
        option on its own (checked once per option) and no cycle."""
        for o in choice.values():
            ok = self._option_ok.get(o)
            if ok is None:
                try:
                    check_tensor_edges(self.vtog, self.option_tensor[o], self.option_edges[o])
                    ok = True
                except StrategyError:
                    ok = False
                self._option_ok[o] = ok
            if not ok:
                return False
        return acyclic({t: set(self.option_targets[o]) for t, o in choice.items()})

    def _residual_pieces(self, s: Strategy, u: Unit) -> list[tuple[tuple[int, ...], list[tuple[Piece, Piece]]]] | None:
        """:meth:`copies` of unit ``u`` under strategy ``s`` (which realizes its maps), from the core."""
        try:
            res = s.residuals_of(u.op)
        except StrategyError:
            return None
        if u.out is None:
            return [(tuple(r.domain), list(r.pairs)) for r in res if r.pairs]
        op = self.graph.ops[u.op]
        want = None if u.src is None else f"in{u.src}"
        boxes = [p.region for p in op.movement.outputs[u.out].pieces if p.target == want]
        pairs = [(d, q) for r in res if r.dst_tensor == op.outputs[u.out] for d, q in r.pairs
                 if any(_inside(d.region, b) for b in boxes)]
        return [(tuple(self.graph.tensors[op.outputs[u.out]].shape), pairs)] if pairs else []

    def copy_signature(self, u: Unit, keys: tuple[str, ...]) -> tuple[tuple, list[str]]:
        """(what copy unit ``u``'s residual pieces depend on, without storage names; the storages in
        first-occurrence order): the op's movement maps, which of its tensors the unit's are, and the
        unit's maps with their storages numbered, with each storage's shape and strides.  Index tables and
        runtime scalars stay named (an op whose own maps index a table keeps its tensor names)."""
        op = self.graph.ops[u.op]
        mv = self._movement_sig.get(u.op)
        if mv is None:
            m = op.movement
            mv = (tuple((x.shape, x.pieces) for x in m.outputs),
                  tuple((x.output, x.source, x.map.shape, x.map.pieces) for x in m.updates))
            if any(x.tables() for x in m.outputs) or any(x.map.tables() for x in m.updates):
                mv += (tuple(op.inputs), tuple(op.outputs))
            self._movement_sig[u.op] = mv
        ids: dict[str, int] = {}
        maps = []
        for t, k in zip(u.tensors, keys):
            shape, pieces, targets = self._map_sig(t, k)
            maps.append((shape, pieces, tuple(ids.setdefault(x, len(ids)) for x in targets)))
        names = list(ids)
        storages = tuple((self.graph.tensors[x].shape, tuple(self.strides[x])) for x in names)
        where = tuple(u.tensors.index(t) for t in op.inputs + op.outputs if t in u.tensors)
        return (mv, u.out, u.src, where, tuple(maps), storages), names

    def _map_sig(self, t: str, key: str) -> tuple[tuple[int, ...], tuple, tuple[str, ...]]:
        """(shape, pieces with their targets numbered locally, the targets in that order) of a map by key."""
        hit = self._map_sigs.get((t, key))
        if hit is None:
            m = self.map_by_key(t, key)
            local: dict[str, int] = {}
            pieces = tuple(p if p.target is None else _retarget(p, local.setdefault(p.target, len(local)))
                           for p in m.pieces)
            hit = self._map_sigs[t, key] = (m.shape, pieces, tuple(local))
        return hit

    def copy_maps(self, domain: tuple[int, ...], pairs: Sequence[tuple[Piece, Piece]]) -> tuple[IndexMap, IndexMap]:
        """(destination map, source map) of one residual copy; memoized by content, as configurations that
        differ elsewhere leave the same copies (building a map normalizes its pieces: not free)."""
        key = (tuple(domain), tuple(pairs))
        hit = self._copy_maps.get(key)
        if hit is None:
            g = self.graph
            dshapes = {p.target: g.tensors[p.target].shape for p, _ in pairs if p.target}
            sshapes = {q.target: g.tensors[q.target].shape for _, q in pairs if q.target}
            hit = self._copy_maps[key] = (IndexMap(domain, [p for p, _ in pairs], dshapes),
                                          IndexMap(domain, [q for _, q in pairs], sshapes))
        return hit

    # -- writes ----------------------------------------------------------------
    def writable(self, m: IndexMap, key: str | None = None) -> bool:
        """A kernel may write through ``m``: no constant piece, no read-only target, injective (the core's rule).

        Memoized per map text and per :meth:`write_signature` (the same write in another layer is checked
        once: injectivity of non-affine maps is checked by evaluation)."""
        k = key or repr(m)
        if k in self.shared.write_ok:
            return True
        ok = self._write_ok.get(k)
        if ok is None:
            sig = self.write_signature(m)
            ok = self._write_ok.get(sig)
            if ok is None:
                probe = self.strategy(())
                try:
                    probe._check_write("?", m, self.strides, "probe")
                    ok = True
                except StrategyError:
                    ok = False
                self._write_ok[sig] = ok
            self._write_ok[k] = ok
        return ok

    def write_signature(self, m: IndexMap) -> tuple:
        """What the core's write check of ``m`` depends on, without storage names: per piece its region,
        index, predicates, and the storage's first-occurrence number, read-only flag, strides and shape."""
        names: dict[str, int] = {}
        out = []
        for p in m.pieces:
            t = p.target
            if t is None:
                out.append((p.region, p.index, p.conds, None))
                continue
            info = self.graph.tensors[t]
            out.append((p.region, p.index, p.conds, names.setdefault(t, len(names)), info.read_only,
                        tuple(self.strides[t]), tuple(info.shape)))
        return (m.shape, tuple(out))

    def compute_written(self) -> set[str]:
        """Tensors some compute op writes (their maps must be writable when virtual)."""
        return {t for o in self.graph.compute_ops() for t in o.outputs}

    # -- specs -------------------------------------------------------------
    def spec(self, u: Unit, keys: tuple[str, ...], impl: str = "triton") -> UnitSpec:
        """The description of unit ``u`` when its tensors have the maps named by ``keys`` (a kernel unit
        run by implementation ``impl``)."""
        g = self.graph
        maps = [self.map_by_key(t, k) for t, k in zip(u.tensors, keys)]
        if u.kind == "kernel":
            ins, outs = self.kernel_io[u.kernel]
            mp = dict(zip(u.tensors, maps))
            unread = self.unread.get(u.kernel, ())
            operands = [Operand(t, "r", mp[t], g.tensors[t].dtype, g.tensors[t].itemsize) for t in ins
                        if t not in unread]
            operands += [Operand(t, "w", mp[t], g.tensors[t].dtype, g.tensors[t].itemsize) for t in outs]
            ops = [g.ops[o] for o in self.kernel_ops[u.kernel]]
            tc = any(o.category in TENSOR_CORE for o in ops)
            dts = [g.tensors[t].dtype for o in ops for t in o.inputs if g.tensors[t].dtype.is_floating_point]
            spec = UnitSpec(u, keys, operands, ops=ops, flops=self.kernel_flops[u.kernel], tensor_core=tc,
                            compute_dtype=dts[0] if dts else None)
        else:
            copies = self.copies(u, keys)
            if copies is None:
                raise ImpossibleConfig(f"{u.name}: no strategy gives {dict(zip(u.tensors, keys))}")
            operands = []
            for domain, pairs in copies:
                dt = next((p.target for p, _ in pairs if p.target), None)
                info = g.tensors[dt] if dt else g.tensors[u.tensors[0]]
                dmap, smap = self.copy_maps(domain, pairs)
                operands.append(Operand(dt or "", "w", dmap, info.dtype, info.itemsize))
                operands.append(Operand(dt or "", "r", smap, info.dtype, info.itemsize))
            spec = UnitSpec(u, keys, operands,
                            elements=sum(region_size(p.region) for _, c in copies for p, _ in c))
        spec.graph = g
        if impl != "triton":
            if u.kind != "kernel":
                raise ValueError(f"{u.name}: only kernel units have implementations")
            spec.impl = impl
        for o in spec.operands:
            for p in o.map.pieces:
                if p.target is not None and p.target not in spec.storages:
                    ti = g.tensors[p.target]
                    spec.storages[p.target] = (ti.shape, tuple(self.strides[p.target]), ti.dtype)
            for tb in o.map.tables():
                if tb in g.tensors:
                    spec.tables[tb] = (g.tensors[tb].shape, g.tensors[tb].dtype)
        return spec

    # -- memory ----------------------------------------------------------------
    def fused_in_registers(self, inlined: Iterable[tuple[str, str]]) -> set[str]:
        """The tensors Inductor never stores under ``inlined`` ((kernel, the kernel it is inlined into) pairs,
        :meth:`CostOracle.region_fusions_taken`): each chain of inlined kernels is one generated kernel, and a
        tensor made and read only inside it stays in registers (Inductor's scheduler drops such a buffer).
        Not a graph output, and every reader a kernel of the chain (a movement op reading it: kept)."""
        chains = nx.Graph(list(inlined))
        g, out = self.graph, set()
        for chain in nx.connected_components(chains):
            for k in chain:
                for t in self.kernel_io[k][1]:
                    info = g.tensors[t]
                    if not info.is_output and info.consumers and \
                            all(self.op_kernel.get(c) in chain for c in info.consumers):
                        out.add(t)
        return out

    def peak_bytes(self, maps_targets: Mapping[str, Iterable[str]], in_regions: Iterable[str] = (),
                   unstored: Container[str] = ()) -> int:
        """Peak bytes: constant storages plus the max over steps of live intermediate storages.

        ``maps_targets``: tensor -> storages its map lands in (every graph tensor).
        A storage lives from the first write to the last read of any tensor that
        resolves into it: a virtual tensor's consumers extend its storage's life.
        ``in_regions``: views a strategy leaves inside an Inductor region (:meth:`CostOracle.region_views`),
        never allocated: their reader reads the view's source through the view's strides, so they land where
        their source does, as a virtual view would, and keep the source alive until that read.  (Left out
        altogether, Llama 3 8B prefill's none strategy freed the LM head's 1 GB output before the cast that
        reads it, and was predicted 1 GB under the ILP's pick.)
        ``unstored``: tensors never allocated (:meth:`fused_in_registers`).
        """
        lo: dict[str, int] = {}
        hi: dict[str, int] = {}
        skip = set(in_regions)
        for t, targets in maps_targets.items():
            if t in self.internal or t in unstored:
                continue
            if t in skip:
                src = self.region_view_source(t, skip)
                targets = maps_targets[src] if src is not None else ()
            a, b = self.span[t]
            for s in targets:
                if s in self.intermediate:
                    if s not in lo or a < lo[s]:
                        lo[s] = a
                    if s not in hi or b > hi[s]:
                        hi[s] = b
        if not lo:
            return self.const_bytes
        diff = np.zeros(self.n_steps + 3, dtype=np.int64)
        for s, a in lo.items():
            size = self.graph.tensors[s].nbytes
            diff[a + 1] += size
            diff[hi[s] + 2] -= size
        return int(self.const_bytes + np.cumsum(diff).max())

    def region_view_source(self, t: str, views: Container[str]) -> str | None:
        """The tensor a region view ``t`` reads, through the chain of ``views`` above it: where it lands (None:
        nothing, a constant made from no tensor, such as an ``arange``)."""
        while t in views:
            ins = self.graph.ops[self.graph.tensors[t].producer].inputs
            if not ins:
                return None
            t = ins[0]
        return t


def cap_configurations(ks: Sequence[Sequence[str]], max_configs: int,
                       keep: Sequence[Iterable[str]] = ()) -> tuple[list[list[str]], list[tuple[int, str]]]:
    """A unit's maps per tensor (``ks``, smallest tree first) cut to at most ``max_configs`` combinations, and
    the (position, map) pairs dropped.

    Maps go from the largest tensor's list, last first; each tensor keeps its physical map (the first), its
    largest tree (every movement op around it eliminated: a repeat_kv chain read by attention straight from
    the cache, which dropping first lost for a Llama decoder) and the maps in ``keep[i]``."""
    ks = [list(k) for k in ks]
    dropped: list[tuple[int, str]] = []
    if math.prod(len(k) for k in ks) <= max_configs:
        return ks, dropped
    kept = [{k[0], k[-1], *(keep[i] if i < len(keep) else ())} for i, k in enumerate(ks)]
    while math.prod(len(k) for k in ks) > max_configs:
        i = max(range(len(ks)), key=lambda j: len(ks[j]))
        drop = next((k for k in reversed(ks[i]) if k not in kept[i]), None)
        if drop is None:
            break
        ks[i].remove(drop)
        dropped.append((i, drop))
    return ks, dropped


def matrix_vector(g: TensorGraph, op: str) -> bool:
    """Whether ``op`` is a matrix-vector product that Inductor decomposes into a multiply and a sum (its ``mm`` /
    ``bmm`` decompositions under coordinate-descent tuning, which max-autotune turns on, for one row of A or one
    column of B): generated reduction code, which inlines the copies around it (a decode step's GQA ``expand`` +
    ``clone`` of the KV cache, read by the attention scores' bmm, launches no copy kernel)."""
    o = g.ops[op]
    if o.category != "matmul" or len(o.inputs) < 2:
        return False
    a, b = (g.tensors[t].shape for t in o.inputs[-2:])   # addmm / baddbmm: the bias comes first
    if len(a) != len(b) or len(a) not in (2, 3):
        return False
    return a[-2] == 1 or b[-1] == 1


def _next_to(g: TensorGraph, kernels: Container[str], unscheduled: bool) -> Callable[[str, str], bool]:
    """Whether two steps can share an Inductor region: none of ``kernels`` (the groups that run per call; one
    folded at build does not cut a region) runs between them in the schedule (realization's regions are runs
    of consecutive steps); ``unscheduled``: the answer for a step that is not in the schedule (a graph built
    by hand)."""
    pos = {st: k for k, st in enumerate(g.steps)}
    groups_before = np.cumsum([0] + [st in kernels for st in g.steps])

    def next_to(a: str, b: str) -> bool:
        if a not in pos or b not in pos:
            return unscheduled
        i, j = sorted((pos[a], pos[b]))
        return groups_before[j] - groups_before[i + 1] == 0
    return next_to


def region_fusions(g: TensorGraph, kernel_ops: Mapping[str, Sequence[str]]) -> list[RegionFusion]:
    """Where Inductor would inline a pointwise kernel into a neighbour of its region.

    Inductor's scheduler fuses pointwise code into the generated kernel that produces its input (an epilogue)
    or reads its output (a prologue): Gemma 2 9B's decode step, all Inductor, ran 21 distinct kernels where the
    graph has 1,017 groups, 720 of them pointwise.  A pointwise group ``u`` fuses into kernel ``v`` when the two
    run next to each other in the schedule, a tensor of ``u`` reaches ``v`` directly or through view ops, and
    ``v`` runs generated code (pointwise, reduction or matrix-vector; not an extern GEMM or convolution).
    Into another pointwise kernel only forward (``v`` reads ``u``): each kernel is inlined at most once
    (:meth:`CostOracle.region_fusion_saving`), so the fusions form a forest and save one launch per kernel
    that disappears, never the last one of a region."""
    from vtcsearch.core.fusion import ELEMENTWISE
    owner = {o: k for k, ops in kernel_ops.items() for o in ops}
    adjacent = _next_to(g, kernel_ops, unscheduled=False)

    def generated(k: str) -> bool:
        return all(g.ops[o].category in ("pointwise", "reduction") or matrix_vector(g, o)
                   for o in kernel_ops[k] if g.ops[o].kind == "compute")

    def pointwise(k: str) -> bool:
        gr = g.groups.get(k)
        return gr is not None and gr.kind == ELEMENTWISE

    def reached(t: str, forward: bool, limit: int = 16) -> Iterator[tuple[str, tuple[str, ...]]]:
        """(kernel, tensors on the way) for each kernel that reads (forward) or writes tensor ``t``, through
        view ops."""
        queue, seen = [(t, (t,))], {t}
        while queue and len(seen) <= limit:
            x, via = queue.pop(0)
            info = g.tensors[x]
            for o in (info.consumers if forward else [info.producer] if info.producer else []):
                if o in owner:
                    yield owner[o], via
                elif o in g.ops and g.ops[o].kind == "movement" and is_view(g.ops[o]):
                    for y in (g.ops[o].outputs if forward else g.ops[o].inputs):
                        if y not in seen:
                            seen.add(y)
                            queue.append((y, via + (y,)))

    out: list[RegionFusion] = []
    for u, ops in kernel_ops.items():
        if not pointwise(u) or not generated(u):
            continue
        ins, outs = kernel_io(g, ops)
        found: dict[str, RegionFusion] = {}
        for forward, tensors in ((True, outs), (False, ins)):
            for t in tensors:
                if g.tensors[t].mutable:
                    continue
                for v, via in reached(t, forward):
                    if v == u or v in found or not generated(v) or not adjacent(u, v) or \
                            (pointwise(v) and not forward):
                        continue
                    found[v] = RegionFusion(u, v, via, g.tensors[t].nbytes)
        out.extend(found.values())
    return out


def fuse_copies(g: TensorGraph, kernel_ops: Mapping[str, Sequence[str]], units: list[Unit]) -> list[Unit]:
    """``units`` with each kernel unit's fusible copies attached (``Unit.fuses``).

    Inductor inlines pointwise code into its consumers and index arithmetic into its loads and stores: a
    movement op's copy runs inside the generated code (a pointwise or reduction op, not an extern GEMM,
    convolution or attention) that produces or reads the values it moves, directly or through other movement
    ops (a channel shuffle and concatenation between BN + ReLUs, a head transpose read by RoPE): torch.compile
    runs a whole ShuffleNetV2 with 2 copy kernels.  The copy is given to the nearest such kernel around its
    movement ops (none: it stays a copy kernel, as between two extern GEMMs).  Whether the fusion happens
    depends on that kernel's implementation and on the copy's tensors staying physical, so the kernel unit's
    configuration includes them, and its Inductor cost is less the copy's (``CostOracle.unit_cost``): every
    solver sees the fusion that the realization's Inductor regions get.  A view op (:func:`is_view`) goes to the
    kernel that reads it instead, of whatever kind: in that kernel's region it is a view, not a copy.
    """
    owner = {o: k for k, ops in kernel_ops.items() for o in ops}
    # a copy joins a kernel's region only if no other kernel group (maybe a template, which cuts the region) runs
    # between them; in a graph without a schedule (built by hand) every kernel is next to it
    next_to = _next_to(g, kernel_ops, unscheduled=True)

    def generated(op: str) -> bool:
        """Whether Inductor runs kernel op ``op`` as generated code (not an extern call)."""
        return owner[op] in g.groups and (g.ops[op].category in ("pointwise", "reduction")
                                          or matrix_vector(g, op))

    def extent(o: str) -> int:
        """Elements kernel op ``o``'s loops run over: its largest input or output."""
        return max((g.tensors[t].numel for t in list(g.ops[o].inputs) + list(g.ops[o].outputs)), default=0)

    def written(cu: Unit) -> int:
        """Elements copy unit ``cu`` writes: its output's pieces that read its source (a concat's slice)."""
        m = g.ops[cu.op].movement
        pieces = m.outputs[cu.out].pieces if m is not None and cu.out < len(m.outputs) else ()
        n = sum(region_size(p.region) for p in pieces if p.target == f"in{cu.src}")
        return n or g.tensors[g.ops[cu.op].outputs[cu.out]].numel

    def adjacent_kernel(op: str, limit: int = 64, size: int = 0) -> tuple[str | None, tuple[str, ...]]:
        """The nearest kernel with generated code around ``op``'s connected movement ops (producers first) that
        runs next to ``op`` in the schedule and loops over at least as many elements as ``op`` writes (a kernel
        that writes one new row of a KV cache cannot run the copy of the whole cache next to it; the kernel
        that reads that copy does), and the tensors of the movement ops on the way (``Unit.via``).  ``size``:
        the elements the copy writes."""
        seen, queue = {op: ()}, [op]
        while queue and len(seen) <= limit:
            name = queue.pop(0)
            m = g.ops[name]
            via = seen[name] + (tuple(m.inputs) + tuple(m.outputs) if name != op else ())
            near = [g.tensors[t].producer for t in m.inputs] + [c for t in m.outputs for c in g.tensors[t].consumers]
            for o in near:
                if o in owner:
                    if generated(o) and next_to(op, owner[o]) and extent(o) >= size:
                        return owner[o], via
                elif o in g.ops and g.ops[o].kind == "movement" and o not in seen:
                    seen[o] = via
                    queue.append(o)
        return None, ()

    def reading_kernel(op: str, limit: int = 64) -> tuple[str | None, tuple[str, ...]]:
        """The kernel whose code reads view op ``op``'s output: the nearest kernel after it through other views
        (any kind of kernel: Inductor reads a view through its strides, generated code or extern call alike),
        or, where a copying movement op reads it (repeat_kv's clone), the kernel that runs that copy (if any
        kernel runs it), with the tensors from ``op`` to that copy and on to its kernel (``Unit.via``)."""
        seen, queue = {op: ()}, [op]
        while queue and len(seen) <= limit:
            name = queue.pop(0)
            m = g.ops[name]
            for o in (c for t in m.outputs for c in g.tensors[t].consumers):
                if o in owner:
                    return (owner[o], ()) if owner[o] in g.groups else (None, ())
                if o in g.ops and g.ops[o].kind == "movement" and o not in seen:
                    via = seen[name] + tuple(m.outputs)
                    runs_copy, after = (None, ()) if is_view(g.ops[o]) else adjacent_kernel(o)
                    if runs_copy is not None:
                        return runs_copy, via + tuple(g.ops[o].outputs) + after
                    seen[o] = via
                    queue.append(o)
        return None, ()

    fused: dict[str, list[Unit]] = {}
    for cu in units:
        if cu.kind != "copy" or cu.src is None or cu.out is None:
            continue
        op = g.ops[cu.op]
        if any(g.tensors[t].mutable for t in (op.inputs[cu.src], op.outputs[cu.out])):
            continue
        k, via = reading_kernel(cu.op) if is_view(op) else (None, ())
        if k is None or not next_to(cu.op, k):
            k, via = adjacent_kernel(cu.op, size=written(cu))
        if k is not None:
            # the op's other tensors too, unless ``k`` computes them: read through a map into a storage that the
            # region writes, an input would be read before the region's call writes it (YOLO11's C3k2 ``cat``
            # of a split that aliases the cat's own buffer)
            own = tuple(t for t in op.inputs + op.outputs if owner.get(g.tensors[t].producer or "") != k)
            via = tuple(dict.fromkeys(t for t in via + own if t not in cu.tensors))
            fused.setdefault(k, []).append(replace(cu, via=via))
    out = []
    for u in units:
        cus = fused.get(u.kernel or "") if u.kind == "kernel" else None
        if cus:
            extra = tuple(dict.fromkeys(t for c in cus for t in c.tensors + c.via if t not in u.tensors))
            u = replace(u, tensors=u.tensors + extra, fuses=tuple(cus), n_fused_tensors=len(extra))
        out.append(u)
    return out


def is_view(op: Any) -> bool:
    """Whether movement op ``op`` is an ATen view (transpose, expand, view, slice, ...): inside an Inductor region
    it moves nothing, as its reader reads its input through the view's strides."""
    return bool(getattr(op.target, "is_view", False)) or op.target_name.split(".")[0] == "_unsafe_view"


class ImpossibleConfig(ValueError):
    """No acyclic strategy gives a unit's tensors this combination of maps."""


def _retarget(p: Piece, target) -> Piece:
    """``p`` landing in ``target`` (or in ``target[p.target]`` when a mapping is given)."""
    if p.target is None:
        return p
    return Piece(target[p.target] if isinstance(target, (dict, list)) else target, p.region, p.index, p.conds,
                 p.fill)


def _inside(a, b) -> bool:
    return all(blo <= alo and ahi <= bhi for (alo, ahi), (blo, bhi) in zip(a, b))


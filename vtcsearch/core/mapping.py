"""IndexMap: the mapping function of a virtual tensor.

A virtual tensor of shape ``S`` owns no memory.  Its :class:`IndexMap` sends
each index ``i`` of ``S`` to an element of another tensor: ``(target, j(i))``.
The map is *piecewise*: a Concat output sends one slab of its index space to
each input.  A piece is a box ``region`` of the virtual index space (optionally
narrowed by extra predicates ``conds``), the name of the tensor it lands in, and
one index expression per dimension of that tensor.  A piece may instead hold a
constant (the border of a Pad).

Maps compose (``F_outer ∘ F_base``) by substituting the base map's variables,
so a chain of data movement ops collapses into one map straight into physical
memory.  Everything the compiler asks of a map is answered here: is it affine,
how long are its contiguous runs, is it injective (required for writes).  The
Triton code that loads or stores through a map is written by one emitter,
:class:`vtcsearch.codegen.kernels.emit.IO`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import torch

from .expr import Expr, Sym, Var, bounds, evaluate, evaluate_grid, grid_terms, remember, rename_tables, simplify, var

Region = tuple[tuple[int, int], ...]
Cond = tuple[Expr, int, int]  # lo <= expr < hi


def index_vars(ndim: int) -> list[Expr]:
    """The variables a map over an ``ndim``-dimensional tensor is written in."""
    return [var(f"i{k}") for k in range(ndim)]


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(strides))


def reshape_index(src_shape: Sequence[int], dst_shape: Sequence[int], v: Sequence[Expr]) -> list[Expr]:
    """Index into ``dst_shape`` of the element at index ``v`` of ``src_shape`` (same row-major order)."""
    flat = Expr()
    for e, s in zip(v, contiguous_strides(src_shape)):
        flat = flat + e * s
    out = []
    for m, (size, stride) in enumerate(zip(dst_shape, contiguous_strides(dst_shape))):
        e = flat // stride
        out.append(e if m == 0 else e % size)
    return out


def full_region(shape: Sequence[int]) -> Region:
    return tuple((0, int(s)) for s in shape)


def region_size(region: Region) -> int:
    return math.prod(max(hi - lo, 0) for lo, hi in region)


def region_intersect(a: Region, b: Region) -> Region | None:
    out = tuple((max(al, bl), min(ah, bh)) for (al, ah), (bl, bh) in zip(a, b))
    return None if any(lo >= hi for lo, hi in out) else out


@dataclass(frozen=True)
class Piece:
    """One region of a virtual tensor and where it lands."""

    target: str | None                 # tensor the region maps into; None for a constant piece
    region: Region                     # box [lo, hi) per virtual dimension
    index: tuple[Expr, ...]            # the target's index, written in i0..i{n-1}
    conds: tuple[Cond, ...] = ()       # extra predicates narrowing the box
    fill: float | None = None          # value of a constant piece

    def __hash__(self) -> int:   # cached: pieces key the memos of maps and copies (immutable)
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.target, self.region, self.index, self.conds, self.fill))
            object.__setattr__(self, "_hash", h)
        return h

    def __reduce__(self):   # rebuilt in another process, whose string hashes differ: no cached hash travels
        return (Piece, (self.target, self.region, self.index, self.conds, self.fill))

    def ranges(self) -> dict[str, tuple[int, int]]:
        return {f"i{k}": (lo, hi - 1) for k, (lo, hi) in enumerate(self.region)}

    def offset(self, strides: Sequence[int], storage_offset: int = 0) -> Expr:
        """Flat element offset into a target laid out with ``strides`` (memoized per piece: the cost model
        asks it of the same piece for its run, its distinct elements and its index arithmetic)."""
        key = (tuple(int(s) for s in strides), storage_offset)
        memo = self.__dict__.get("_offsets")
        if memo is None:
            memo = {}
            object.__setattr__(self, "_offsets", memo)
        off = memo.get(key)
        if off is None:
            # then per (index, region): the same offset object for equal pieces (other storages, a residual
            # copy's pairs), so the memos keyed by it answer by identity instead of comparing deep expressions
            shared = (self.index, self.region, key)
            off = _OFFSETS.get(shared)
            if off is None:
                off = Expr(const=storage_offset)
                for e, s in zip(self.index, key[0]):
                    off = off + e * s
                off = simplify(off, self.ranges())
                remember(_OFFSETS, shared, off)
            memo[key] = off
        return off


_OFFSETS: dict[tuple, Expr] = {}   # (index, region, (strides, storage offset)) -> Piece.offset


class IndexMap:
    """Piecewise map from a virtual tensor's index space into other tensors."""

    def __init__(self, shape: Sequence[int], pieces: Iterable[Piece],
                 target_shapes: Mapping[str, Sequence[int]]):
        self.shape = tuple(int(s) for s in shape)
        self.target_shapes = {k: tuple(int(x) for x in v) for k, v in target_shapes.items()}
        self.pieces = tuple(p for p in (_normalize(p) for p in pieces) if p is not None)

    # -- construction -------------------------------------------------------
    @staticmethod
    def identity(shape: Sequence[int], target: str) -> "IndexMap":
        return IndexMap(shape, [Piece(target, full_region(shape), tuple(index_vars(len(shape))))],
                        {target: shape})

    @staticmethod
    def single(shape: Sequence[int], target: str, target_shape: Sequence[int],
               index: Sequence[Expr], region: Region | None = None) -> "IndexMap":
        return IndexMap(shape, [Piece(target, region or full_region(shape), tuple(index))],
                        {target: target_shape})

    # -- movement: the one definition of each view (ops.py's rules and the kernels' Operand use these) ----
    # Each returns the map of ``target.<movement>(...)``: over the view's index space into ``target``,
    # a tensor of shape ``src``.  Composed onto a map into memory, it is that view of a virtual tensor.
    @staticmethod
    def permute(src: Sequence[int], dims: Sequence[int], target: str) -> "IndexMap":
        """``target.permute(dims)``: view dim ``k`` is the source's dim ``dims[k]``."""
        n = len(src)
        dims = [d % n if n else d for d in dims]
        if sorted(dims) != list(range(n)):
            raise ValueError(f"permute: {list(dims)} is not a permutation of {n} dims")
        v = index_vars(n)
        j: list[Expr] = [Expr()] * n
        for k, d in enumerate(dims):
            j[d] = v[k]
        return IndexMap.single([src[d] for d in dims], target, src, j)

    @staticmethod
    def reshape(src: Sequence[int], shape: Sequence[int], target: str) -> "IndexMap":
        """``target.reshape(shape)``: the same elements in the same row-major order (one ``-1`` allowed)."""
        shape = list(shape)
        numel = math.prod(src)
        if shape.count(-1) == 1:
            rest = math.prod(s for s in shape if s != -1)
            shape[shape.index(-1)] = numel // max(rest, 1)
        if math.prod(shape) != numel or any(s < 0 for s in shape):
            raise ValueError(f"cannot reshape {tuple(src)} to {tuple(shape)}")
        return IndexMap.single(shape, target, src, reshape_index(shape, src, index_vars(len(shape))))

    @staticmethod
    def broadcast(src: Sequence[int], shape: Sequence[int], target: str) -> "IndexMap":
        """``target.expand(shape)``: size-1 dims repeat (index 0), leading dims are added; read-only."""
        shape = tuple(int(s) for s in shape)
        off = len(shape) - len(src)
        if off < 0 or any(s != 1 and s != shape[k + off] for k, s in enumerate(src)):
            raise ValueError(f"cannot broadcast {tuple(src)} to {shape}")
        v = index_vars(len(shape))
        return IndexMap.single(shape, target, src, [v[k + off] if s != 1 else Expr() for k, s in enumerate(src)])

    @staticmethod
    def narrow(src: Sequence[int], dim: int, start: int, length: int, target: str, step: int = 1) -> "IndexMap":
        """``target[..., start:start + length * step:step, ...]`` along ``dim`` (``slice`` / ``narrow``)."""
        dim %= len(src)
        if start < 0 or length < 0 or step < 1 or (length and start + (length - 1) * step >= src[dim]):
            raise ValueError(f"narrow: {length} elements from {start} by {step} do not fit dim {dim} of "
                             f"{tuple(src)}")
        v = index_vars(len(src))
        shape = [length if k == dim else s for k, s in enumerate(src)]
        return IndexMap.single(shape, target, src, [(v[k] * step if step != 1 else v[k]) + start if k == dim
                                                    else v[k] for k in range(len(src))])

    @staticmethod
    def cat(parts: Sequence[tuple[str, Sequence[int]]], dim: int) -> "IndexMap":
        """``cat([t0, t1, ...], dim)`` of ``parts`` = ``(target, shape)``: one piece per part, side by side."""
        if not parts:
            raise ValueError("cat of no tensors")
        base = parts[0][1]
        dim %= len(base)
        shape = [sum(s[dim] for _, s in parts) if k == dim else n for k, n in enumerate(base)]
        v = index_vars(len(shape))
        pieces, shapes, off = [], {}, 0
        for t, s in parts:
            if len(s) != len(shape) or any(a != b for k, (a, b) in enumerate(zip(s, shape)) if k != dim):
                raise ValueError(f"cat along {dim}: {tuple(s)} does not match {tuple(base)}")
            region = tuple((off, off + s[dim]) if m == dim else (0, n) for m, n in enumerate(shape))
            pieces.append(Piece(t, region, tuple(v[m] - off if m == dim else v[m] for m in range(len(shape)))))
            shapes[t] = s
            off += s[dim]
        return IndexMap(shape, pieces, shapes)

    def restrict(self, region: Region) -> "IndexMap":
        pieces = []
        for p in self.pieces:
            r = region_intersect(p.region, region)
            if r is not None:
                pieces.append(replace(p, region=r))
        return IndexMap(self.shape, pieces, self.target_shapes)

    def retarget(self, names: Mapping[str, str]) -> "IndexMap":
        """Rename targets and index tensors (a rule's "in0"/"out0" -> graph tensor names)."""
        pieces = [Piece(names.get(p.target, p.target) if p.target else None, p.region,
                        tuple(rename_tables(e, names) for e in p.index),
                        tuple((rename_tables(c, names), lo, hi) for c, lo, hi in p.conds), p.fill)
                  for p in self.pieces]
        shapes = {names.get(k, k): v for k, v in self.target_shapes.items()}
        return IndexMap(self.shape, pieces, shapes)

    @staticmethod
    def union(shape: Sequence[int], maps: Iterable["IndexMap"]) -> "IndexMap":
        pieces, shapes = [], {}
        for m in maps:
            pieces.extend(m.pieces)
            shapes.update(m.target_shapes)
        return IndexMap(shape, pieces, shapes)

    def compose(self, base: Mapping[str, "IndexMap"]) -> "IndexMap":
        """``F_base ∘ self``: pieces landing in a tensor that ``base`` maps onward follow that map."""
        pieces: list[Piece] = []
        shapes = {k: v for k, v in self.target_shapes.items() if k not in base}
        for p in self.pieces:
            if p.target is None or p.target not in base:
                pieces.append(p)
                continue
            bm = base[p.target]
            shapes.update(bm.target_shapes)
            env = None
            for q in bm.pieces:
                got = _COMPOSED.get((p, q))
                if got is None:
                    if env is None:
                        env = {f"i{k}": e for k, e in enumerate(p.index)}
                        memo: dict = {}   # one substitution per atom for all of bm's pieces (Expr.subs)
                    conds = list(p.conds)
                    for k, (lo, hi) in enumerate(q.region):
                        conds.append((p.index[k], lo, hi))
                    for ce, lo, hi in q.conds:
                        conds.append((ce.subs(env, memo), lo, hi))
                    index = tuple(e.subs(env, memo) for e in q.index) if q.target is not None else ()
                    got = Piece(q.target, p.region, index, tuple(conds), q.fill)
                    remember(_COMPOSED, (p, q), got)
                pieces.append(got)
        return IndexMap(self.shape, pieces, shapes)

    # -- structure queries --------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def targets(self) -> set[str]:
        return {p.target for p in self.pieces if p.target is not None}

    def is_affine(self, strides: Mapping[str, Sequence[int]] | None = None) -> bool:
        """Every piece's flat offset (in the targets' layouts) is linear in the indices: no div/mod/lookup."""
        return all((p.target is None or p.offset(self._strides(strides, p.target)).is_affine())
                   and all(c.is_affine() for c, _, _ in p.conds) for p in self.pieces)

    def has_lookup(self) -> bool:
        return any(any(e.has_lookup() for e in p.index) for p in self.pieces)

    def cached(self, key: tuple, compute: Callable[[], Any]) -> Any:
        """``compute()``, kept on the map under ``key`` (maps are not changed after construction, and a search
        asks the same question of the same map many times; ``key`` names the question and its arguments)."""
        memo = self.__dict__.setdefault("_cache", {})
        try:
            return memo[key]
        except KeyError:
            got = memo[key] = compute()
            return got

    def syms(self) -> set:
        return set(self.cached(("syms",), self._syms))

    def _syms(self) -> frozenset:
        out = set()
        for p in self.pieces:
            for e in p.index:
                out |= e.syms()
            for c, _, _ in p.conds:
                out |= c.syms()
        return frozenset(out)

    def tables(self) -> set[str]:
        return set(self.cached(("tables",), lambda: frozenset(lk.table for p in self.pieces for e in p.index
                                                              for lk in e.lookups())))

    def is_box_piecewise(self) -> bool:
        """Every piece is a plain box (no predicate), so pieces can be chosen per block."""
        return all(not p.conds for p in self.pieces)

    def covered_size(self) -> int | None:
        """Elements covered by box pieces (None when predicates make it unknown statically)."""
        got = self.__dict__.get("_covered", -1)   # maps are not changed after construction: computed once
        if got == -1:
            got = None if not self.is_box_piecewise() else sum(region_size(p.region) for p in self.pieces)
            self._covered = got
        return got

    def _strides(self, strides: Mapping[str, Sequence[int]] | None, target: str) -> Sequence[int]:
        if strides and target in strides:
            return strides[target]
        return contiguous_strides(self.target_shapes[target])

    def piece_runs(self, strides: Mapping[str, Sequence[int]] | None = None) -> list[tuple[int, int]]:
        """(contiguous run length in elements, elements in the piece) for each piece."""
        return [(_run_length(p, self._strides(strides, p.target), self.shape) if p.target else region_size(p.region),
                 region_size(p.region)) for p in self.pieces]

    def run_length(self, strides: Mapping[str, Sequence[int]] | None = None) -> int:
        """Shortest contiguous run (elements) over all pieces: what coalescing can rely on."""
        runs = [r for r, n in self.piece_runs(strides) if n > 0]
        return min(runs) if runs else 0

    def is_identity_layout(self, strides: Mapping[str, Sequence[int]] | None = None) -> bool:
        """One piece whose offsets equal the virtual tensor's own contiguous offsets plus a constant."""
        if len(self.pieces) != 1 or self.pieces[0].target is None or self.pieces[0].conds:
            return False
        p = self.pieces[0]
        off = p.offset(self._strides(strides, p.target))
        mine = sum((v * s for v, s in zip(index_vars(self.ndim), contiguous_strides(self.shape))), Expr())
        diff = simplify(off - mine, p.ranges())
        return diff.is_affine() and not diff.free_vars()

    def is_injective(self, strides: Mapping[str, Sequence[int]] | None = None,
                     numeric_limit: int = 1 << 20) -> bool:
        """No two indices land on the same element (required to write through the map).

        Affine pieces are checked symbolically; the rest by evaluation when small.
        Unknown is answered False: refusing a write is slower, never wrong.  Memoized per
        (pieces, target strides): the search asks again for the same map (evaluation is costly).
        """
        key = (tuple(self.shape), tuple(self.pieces), numeric_limit,
               tuple(None if p.target is None else tuple(self._strides(strides, p.target)) for p in self.pieces))
        hit = _INJECTIVE.get(key)
        if hit is None:
            hit = _INJECTIVE[key] = self._is_injective(strides, numeric_limit)
        return hit

    def _is_injective(self, strides: Mapping[str, Sequence[int]] | None, numeric_limit: int) -> bool:
        offs = []
        for p in self.pieces:
            if p.target is None:
                return False  # a constant cannot be written
            st = self._strides(strides, p.target)
            off = p.offset(st)
            if off.has_lookup():
                return False
            if not _piece_injective(p, off):
                if region_size(p.region) > numeric_limit:
                    return False
                key = (p.region, p.index, p.conds, tuple(st))   # the same piece recurs in many maps
                ok = _PIECE_INJECTIVE.get(key)
                if ok is None:
                    ok = _PIECE_INJECTIVE[key] = self._numeric_injective([p], strides)
                if not ok:
                    return False
            offs.append((p, off))
        by_target: dict[str, list] = {}
        for p, off in offs:
            by_target.setdefault(p.target, []).append((p, off))
        for group in by_target.values():
            intervals = sorted((bounds(off, p.ranges()), i) for i, (p, off) in enumerate(group))
            for (a, _), (b, _) in zip(intervals, intervals[1:]):
                if b[0] <= a[1]:
                    if sum(region_size(p.region) for p, _ in group) > numeric_limit:
                        return False
                    return self._numeric_injective([p for p, _ in group], strides)
        return True

    def _numeric_injective(self, pieces, strides) -> bool:
        seen: list[np.ndarray] = []
        for p in pieces:
            mask, idx = _eval_box(p, {}, {})
            if not mask.any():
                continue
            flat = sum(idx[k] * s for k, s in enumerate(self._strides(strides, p.target)))
            seen.append(np.broadcast_to(flat, mask.shape)[mask])
        allv = np.concatenate(seen) if seen else np.empty(0, dtype=np.int64)
        if not len(allv):
            return True
        lo, hi = int(allv.min()), int(allv.max())
        if hi - lo < 4 * len(allv) + 1024:      # dense offsets: counting is linear (np.unique sorts)
            return int(np.bincount(allv - lo).max()) <= 1
        return len(np.unique(allv)) == len(allv)

    # -- evaluation ---------------------------------------------------------
    def evaluate(self, syms: Mapping[str, int] | None = None,
                 tables: Mapping[str, np.ndarray] | None = None) -> tuple[np.ndarray, list[np.ndarray]]:
        """For every virtual index: which piece covers it (-1: none) and the target index.

        Raises if an index is covered twice: a map is a function.
        """
        owner = np.full(self.shape, -1, dtype=np.int64)
        width = max((len(p.index) for p in self.pieces), default=0)
        out_idx = [np.zeros(self.shape, dtype=np.int64) for _ in range(width)]
        for n, p in enumerate(self.pieces):
            mask, idx = _eval_piece(p, self.shape, syms or {}, tables or {})
            if (owner[mask] >= 0).any():
                raise ValueError(f"pieces {int(owner[mask][owner[mask] >= 0][0])} and {n} overlap")
            owner[mask] = n
            for k, v in enumerate(idx):
                out_idx[k][mask] = np.broadcast_to(v, self.shape)[mask]
        return owner, out_idx

    def gather(self, tensors: Mapping[str, torch.Tensor], syms: Mapping[str, int] | None = None,
               tables: Mapping[str, torch.Tensor] | None = None, dtype: torch.dtype | None = None,
               check: bool = True) -> torch.Tensor:
        """Materialize the virtual tensor by reading through the map (reference semantics).

        Works piece by piece on the piece's box with torch indexing, so it runs on any
        device.  With ``check``, an index covered by no piece or by two is an error.
        """
        sample = next(iter(tensors.values())) if tensors else torch.empty(0)
        out = torch.empty(self.shape, dtype=dtype or sample.dtype, device=sample.device)
        count = torch.zeros(self.shape, dtype=torch.int32, device=sample.device) if check else None
        for p in self.pieces:
            sl, mask, idx = _piece_indices(p, syms or {}, tables or {}, sample.device)
            if p.target is None:
                vals = torch.full(mask.shape, p.fill, dtype=out.dtype, device=out.device)
            else:
                vals = tensors[p.target][idx].to(out.dtype)
            view = out[sl]
            view[mask] = vals[mask]
            if count is not None:
                count[sl] += mask.to(torch.int32)
        if count is not None and not bool((count == 1).all()):
            bad = tuple(int(x) for x in torch.nonzero(count != 1)[0])
            n = int(count[bad])
            raise ValueError(f"index {bad} of the virtual tensor is covered by {n} pieces, expected 1")
        return out

    def scatter(self, value: torch.Tensor, tensors: Mapping[str, torch.Tensor],
                syms: Mapping[str, int] | None = None, tables: Mapping[str, torch.Tensor] | None = None) -> None:
        """Write ``value`` (the virtual tensor's contents) through the map into ``tensors``."""
        for p in self.pieces:
            if p.target is None:
                raise ValueError("cannot write into a constant piece")
            sl, mask, idx = _piece_indices(p, syms or {}, tables or {}, value.device)
            dst = tensors[p.target]
            vals = value[sl][mask].to(dst.dtype)
            dst[tuple(i[mask] for i in idx)] = vals

    # -- tiling ----------------------------------------------------------------
    def blocks_aligned(self, blocks: Mapping[int, int]) -> bool:
        """True when no block of the given sizes (per virtual dim) straddles two pieces."""
        if not self.is_box_piecewise():
            return len(self.pieces) <= 1 and not any(p.conds for p in self.pieces)
        if len(self.pieces) <= 1:
            return True
        for p in self.pieces:
            for d, b in blocks.items():
                lo, hi = p.region[d]
                if lo % b or (hi % b and hi != self.shape[d]):
                    return False
        return True

    # -- printing -----------------------------------------------------------
    def __repr__(self) -> str:
        body = "; ".join(_piece_repr(p) for p in self.pieces)
        return f"IndexMap{list(self.shape)}[{body}]"

    def to_json(self) -> dict:
        return {"shape": list(self.shape),
                "pieces": [{"target": p.target, "region": [list(r) for r in p.region],
                            "index": [repr(e) for e in p.index],
                            "conds": [[repr(c), lo, hi] for c, lo, hi in p.conds],
                            "fill": p.fill} for p in self.pieces]}


def _piece_repr(p: Piece) -> str:
    reg = ",".join(f"{lo}:{hi}" for lo, hi in p.region)
    conds = "".join(f" if {lo}<={c!r}<{hi}" for c, lo, hi in p.conds)
    if p.target is None:
        return f"[{reg}] -> {p.fill}{conds}"
    return f"[{reg}] -> {p.target}[{', '.join(map(repr, p.index))}]{conds}"


def _normalize(p: Piece) -> Piece | None:
    """Fold predicates on a single variable into the box; drop pieces that are empty.

    Memoized per piece (pieces are immutable): searches build the same pieces in many maps."""
    try:
        return _NORMALIZED[p]
    except KeyError:
        pass
    return remember(_NORMALIZED, p, _normalize_piece(p))


_NORMALIZED: dict[Piece, Piece | None] = {}
_INJECTIVE: dict[tuple, bool] = {}    # (shape, pieces, limit, target strides) -> IndexMap.is_injective
_PIECE_INJECTIVE: dict[tuple, bool] = {}   # (region, index, conds, target strides) -> one piece, numerically


_MEMOS: list[dict] = []   # memos of modules above this one that clear_memos forgets too (register_memo)


def register_memo(memo: dict) -> dict:
    """Let :func:`clear_memos` forget ``memo`` too (a module above this one keeps maps per op)."""
    _MEMOS.append(memo)
    return memo


def clear_memos() -> None:
    """Forget the process-wide memos of maps and expressions (timings from a cold start; tests)."""
    from .expr import _ATOMS, _BOUNDS, _GRID_AXES, _GRID_VALUES, _INTERNED, _MERGED, _SIMPLIFIED
    _INTERNED.clear()
    _MERGED.clear()
    _GRID_AXES.clear()
    _GRID_VALUES.clear()
    _SIMPLIFIED.clear()
    _ATOMS.clear()
    _BOUNDS.clear()
    _NORMALIZED.clear()
    _RUNS.clear()
    _NUMERIC_RUNS.clear()
    _VERDICTS.clear()
    _OFFSETS.clear()
    _COMPOSED.clear()
    _INJECTIVE.clear()
    _PIECE_INJECTIVE.clear()
    for memo in _MEMOS:
        memo.clear()

_COMPOSED: dict[tuple[Piece, Piece], Piece] = {}   # (outer piece, inner piece) -> composed piece (compose)


def _normalize_piece(p: Piece) -> Piece | None:
    region = list(p.region)
    if any(lo >= hi for lo, hi in region):
        return None
    conds = []
    ranges = None
    for ce, lo, hi in p.conds:
        if ranges is None:   # the box's ranges, again after a predicate narrowed it
            ranges = {f"i{k}": (a, b - 1) for k, (a, b) in enumerate(region)}
        v = _cond_verdict(ce, lo, hi, ranges)
        if v is _ALWAYS:
            continue
        if v is _NEVER:
            return None
        if v[0] == "solve":
            _, k, a, b = v
            nlo, nhi = max(region[k][0], a), min(region[k][1], b + 1)
            if nlo >= nhi:
                return None
            region[k] = (nlo, nhi)
            ranges = None
            continue
        conds.append((v[1], lo, hi))
    ranges = {f"i{k}": (a, b - 1) for k, (a, b) in enumerate(region)}
    index = tuple(simplify(e, ranges) for e in p.index)
    return Piece(p.target, tuple(region), index, tuple(conds), p.fill)


_ALWAYS, _NEVER = ("always",), ("never",)
_VERDICTS: dict[tuple, tuple] = {}   # (predicate, lo, hi, ranges of its variables) -> _cond_verdict


def _cond_verdict(ce: Expr, lo: int, hi: int, ranges: Mapping[str, tuple[int, int]]) -> tuple:
    """What normalizing a piece does with the predicate ``lo <= ce < hi`` over ``ranges``: drop it (``_ALWAYS``),
    drop the piece (``_NEVER``), narrow dim ``k`` to ``[a, b]`` (``("solve", k, a, b)``) or keep its simplified
    form (``("keep", ce)``).

    Memoized per predicate and the ranges of its variables (all that simplify and bounds read of them: neither
    brings in a variable): the pieces of a residual copy pair each piece of one map with each of the other's,
    and each pair repeats both pieces' predicates (seven nested ones per piece for a ShuffleNet shuffle chain)."""
    key = (ce, lo, hi, tuple(ranges.get(v) for v in ce.sorted_vars()))
    hit = _VERDICTS.get(key)
    if hit is None:
        hit = remember(_VERDICTS, key, _compute_cond_verdict(ce, lo, hi, ranges))
    return hit


def _compute_cond_verdict(ce: Expr, lo: int, hi: int, ranges: Mapping[str, tuple[int, int]]) -> tuple:
    ce = simplify(ce, ranges)
    blo, bhi = bounds(ce, ranges)
    if blo >= lo and bhi < hi:
        return _ALWAYS
    if bhi < lo or blo >= hi:
        return _NEVER
    fv = ce.free_vars()
    if ce.is_affine() and len(ce.terms) == 1 and len(fv) == 1 and not ce.syms():
        (atom, c), = ce.terms
        k = int(atom.name[1:])
        # lo <= c*i + k0 < hi, solved for i
        if c > 0:
            a, b = -((ce.const - lo) // c), (hi - 1 - ce.const) // c
        else:
            a, b = (ce.const - hi) // -c + 1, (ce.const - lo) // -c
        return ("solve", k, a, b)
    return ("keep", ce)


def _piece_injective(p: Piece, off: Expr) -> bool:
    if p.conds or not off.is_affine():
        return False
    dims = []
    for k, (lo, hi) in enumerate(p.region):
        ext = hi - lo
        if ext <= 1:
            continue
        c = abs(off.coef(var(f"i{k}").terms[0][0]))
        if c == 0:
            return False
        dims.append((c, ext))
    dims.sort()
    span = 0  # largest offset reachable by the smaller strides
    for c, ext in dims:
        if c <= span:
            return False
        span += c * (ext - 1)
    return True


def _run_length(p: Piece, strides: Sequence[int], shape: Sequence[int]) -> int:
    """Length (elements) of the first contiguous run of ``p`` in a target with ``strides``, over a domain of
    ``shape``.

    Memoized per (region, index, whether there are predicates, strides, shape): all the answer reads (the
    predicates only send it to :func:`_numeric_run`, which evaluates the offset over the box without them).
    The pieces of a residual copy pair one piece's index with each of the other map's predicates, and the
    same index recurs with other predicates in other copies."""
    key = (p.region, p.index, bool(p.conds), tuple(int(s) for s in strides), tuple(shape))
    hit = _RUNS.get(key)
    if hit is None:
        hit = remember(_RUNS, key, _compute_run_length(p, strides, shape))
    return hit


_RUNS: dict[tuple, int] = {}   # (region, index, has predicates, strides, shape) -> _run_length


def _compute_run_length(p: Piece, strides: Sequence[int], shape: Sequence[int]) -> int:
    off = p.offset(strides)
    nonlinear = set()
    for a in off.atoms():
        if not isinstance(a, (Var, Sym)):
            nonlinear |= Expr({a: 1}).free_vars()
    run, expected = 1, 1
    for d in reversed(range(len(p.region))):
        lo, hi = p.region[d]
        ext = hi - lo
        if ext == 1:
            continue
        if f"i{d}" in nonlinear or p.conds:
            return _numeric_run(p, off) if run == 1 else run
        if off.coef(var(f"i{d}").terms[0][0]) != expected:
            break
        run *= ext
        expected *= ext
        if (lo, hi) != (0, shape[d]):
            break
    return run


def _without_lookups(e: Expr) -> Expr:
    """``table[j]`` replaced by ``j`` times a large stride: rows a gather picks are far apart, but what
    varies inside a row (the contiguous run) is kept, without needing the index tensor's values.

    Index component ``k`` gets the stride ``1_000_003 * (k + 1)``: a change of the index moves by a multiple
    of a large prime (never by 1, so a run always breaks there), and the values stay far inside int64 (a
    power per component overflowed it for 4-d index tensors: transformers' causal masks)."""
    from .expr import Lookup

    def f(a):
        if isinstance(a, Lookup):
            out = Expr()
            for k, i in enumerate(a.index):
                out = out + _without_lookups(i) * (1_000_003 * (k + 1))
            return out
        return Expr({a: 1}) if not hasattr(a, "arg") else Expr({type(a)(_without_lookups(a.arg), a.div): 1})
    return e.map_atoms(f)


RUN_SAMPLE = 8192   # elements of a piece's box (the first, row-major) in which _numeric_run looks for a break


def _numeric_run(p: Piece, off: Expr, sample: int = RUN_SAMPLE) -> int:
    """Length of the first contiguous run of a non-affine piece, by evaluation on a sample.

    Memoized per (offset simplified over the piece, region, sample): all the evaluation reads.  Pieces whose raw
    offsets differ (a channel shuffle composed through another chain of layers, or into another storage) often
    simplify to one offset over the same box, and its evaluation is most of a first query's run."""
    if off.has_lookup():
        off = _without_lookups(off)
    # the same values over the piece, with far fewer array operations for nested div/mod (a channel shuffle)
    off = simplify(off, p.ranges(), divisors=True)
    key = (off, p.region, sample)
    hit = _NUMERIC_RUNS.get(key)
    if hit is None:
        hit = remember(_NUMERIC_RUNS, key, _evaluate_run(off, p.region, sample))
    return hit


_NUMERIC_RUNS: dict[tuple, int] = {}   # (simplified offset, region, sample) -> _numeric_run


def _evaluate_run(off: Expr, region: Region, sample: int, min_prefix: int = 256) -> int:
    """:func:`_numeric_run` of the simplified offset ``off`` over ``region``: the first break (a step other
    than +1) in the row-major order of a sample box of ``region``.

    Sought over growing prefixes of that order (the first two indices of one dim, the dims inside it whole,
    the ones outside at their first index), each summed from the terms' values over the box, which are
    small sparse arrays (:func:`~vtcsearch.core.expr.grid_terms`): a run that ends after a plane of a
    channel-major tensor is found in two planes, not in all of the sample's.  ``min_prefix``: the fewest
    elements worth a sum of their own (tests lower it to check every prefix)."""
    region = sample_box(region, sample)
    grid = tuple((f"i{k}", lo, hi) for k, (lo, hi) in enumerate(region))
    syms = {s.name: s.lo for s in off.syms()}
    shape = tuple(hi - lo for lo, hi in region)
    size = math.prod(shape)
    if size <= 1 or off.has_lookup():
        vals = np.broadcast_to(np.asarray(evaluate_grid(off, grid, syms)), shape).reshape(-1)
        return _first_break(vals)
    terms = grid_terms(off, grid, syms)

    def first_break(box: tuple[int, ...]) -> int | None:
        """The run if it ends inside the prefix ``box`` (its elements summed from the terms), else None."""
        out: Any = off.const
        for c, v in terms:
            if isinstance(v, np.ndarray):
                v = v[tuple(slice(None) if v.shape[k] == 1 else slice(0, box[k]) for k in range(len(box)))]
            out = out + c * v
        vals = np.broadcast_to(np.asarray(out), box).reshape(-1)
        run = _first_break(vals)
        return run if run < vals.size else None

    inner = 1   # elements of the dims inside d
    for d in reversed(range(len(shape))):
        if shape[d] == 1:
            continue
        prefix = inner * 2
        inner *= shape[d]
        if prefix < min_prefix:   # too small for a sum of its own: a longer prefix holds it
            continue
        run = first_break(tuple(1 if k < d else 2 if k == d else shape[k] for k in range(len(shape))))
        if run is not None:
            return run
        if prefix == size:
            return size
    run = first_break(shape)
    return size if run is None else run


def sample_box(region: Sequence[tuple[int, int]], sample: int) -> list[tuple[int, int]]:
    """The first ``sample`` elements of ``region`` in row-major order, as a box: the innermost dims whole, the
    one that crosses ``sample`` cut, the outer ones at their first index."""
    region = list(region)
    count = 1
    for d in reversed(range(len(region))):
        lo, hi = region[d]
        if count * (hi - lo) > sample:
            region[d] = (lo, lo + max(1, sample // count))
            for e in range(d):
                region[e] = (region[e][0], region[e][0] + 1)
            break
        count *= hi - lo
    return region


def _first_break(vals: np.ndarray) -> int:
    """Elements before the first step other than +1 in ``vals`` (all of them where there is none)."""
    if vals.size <= 1:
        return int(vals.size)
    breaks = np.nonzero(np.diff(vals) != 1)[0]
    return int(breaks[0] + 1) if breaks.size else int(vals.size)


def _piece_indices(p: Piece, syms: Mapping[str, int], tables, device) -> tuple[tuple[slice, ...], torch.Tensor,
                                                                         tuple[torch.Tensor, ...]]:
    """(box slices, mask over the box, target index tensors over the box) of one piece, in torch."""
    sl = tuple(slice(lo, hi) for lo, hi in p.region)
    ar = [torch.arange(lo, hi, device=device) for lo, hi in p.region]
    grids = torch.meshgrid(*ar, indexing="ij") if ar else []
    env: dict = {f"i{k}": g for k, g in enumerate(grids)}
    env.update(syms)
    box = tuple(hi - lo for lo, hi in p.region)
    mask = torch.ones(box, dtype=torch.bool, device=device)
    for ce, lo, hi in p.conds:
        v = evaluate(ce, env, tables)
        mask &= (v >= lo) & (v < hi)
    idx = tuple(torch.as_tensor(evaluate(e, env, tables), device=device).expand(box) for e in p.index)
    if p.target is not None:
        # lanes outside the predicate may compute out-of-range indices: park them at 0
        idx = tuple(torch.where(mask, i, torch.zeros_like(i)) for i in idx)
    return sl, mask, idx


def _eval_box(p: Piece, syms: Mapping[str, int], tables):
    """(mask over the piece's box, target index arrays broadcast over it): :func:`_eval_piece` on the box
    only, on sparse grids (the indices outside the box are masked out there anyway; a small piece of a large
    map costs its own size, not the map's)."""
    box = tuple(hi - lo for lo, hi in p.region)
    axes = [np.arange(lo, hi, dtype=np.int64) for lo, hi in p.region]
    grids = np.meshgrid(*axes, indexing="ij", sparse=True) if axes else []
    env: dict = {f"i{k}": g for k, g in enumerate(grids)}
    env.update(syms)
    mask = np.ones(box, dtype=bool)
    for ce, lo, hi in p.conds:
        v = evaluate(ce, env, tables)
        mask &= (v >= lo) & (v < hi)
    idx = [np.broadcast_to(np.asarray(evaluate(e, env, tables)), box) for e in p.index]
    return mask, idx


def _eval_piece(p: Piece, shape: Sequence[int], syms: Mapping[str, int], tables):
    """(mask over the full virtual shape, target index arrays over it, zero outside the mask):
    :func:`_eval_box` placed at the piece's box."""
    box_mask, box_idx = _eval_box(p, syms, tables)
    at = tuple(slice(lo, hi) for lo, hi in p.region)
    mask = np.zeros(tuple(shape), dtype=bool)
    mask[at] = box_mask
    idx = []
    for v in box_idx:
        full = np.zeros(tuple(shape), dtype=v.dtype)
        full[at] = v
        idx.append(full)
    return mask, idx

"""Virtual-tensor I/O: the one layer every kernel template loads and stores through.

An :class:`Operand` is what a template receives for each of its tensors: a
*resolved* :class:`~vtcsearch.core.mapping.IndexMap` (its targets are physical
storages), the storage tensors by name, and the runtime values the map needs
(scalars such as a decode position, index tensors for indirect maps).  A plain
tensor is ``Operand.dense(t)``; views (``permute``, ``reshape``, ``broadcast_to``,
``narrow``, ``cat``, ``view``) compose maps without touching memory.

Inside a kernel an operand is bound to a name prefix by :class:`IO`, which
emits Triton source lines:

* :meth:`IO.load` — stage 1, reading a tile of the virtual tensor at index
  tensors ``idx`` (one code string per virtual dim, already broadcast to the
  tile, scalars allowed);
* :meth:`IO.store` — stage 3, writing a tile through the map.

With ``block=[(start, size), ...]`` (the tile's box: first index and extent per
dim) and a piecewise map whose piece boundaries are multiples of the block
sizes, the piece is chosen **once per block** by a scalar ``if/elif`` branch;
otherwise every piece is read or written under its own per-element predicate.
Single-piece maps need neither.  Index tensors (``Lookup``) are read under the
piece's predicate, so lanes of other pieces never read an index table out of
bounds.  Offsets are computed in int64 when a storage spans 2**31 elements or more.

Kernels are generated as source text (:func:`render`), written to a cache
directory as a ``.py`` module and imported (:func:`compile_source`: Triton's JIT
needs real source files), and their launch plans cached by key
(:func:`plan_cache`).  :func:`autotune` picks a tile configuration per key by
timing a few on the GPU; in the interpreter the first (small) one is used.
"""
from __future__ import annotations

import hashlib
import importlib.util
import math
import os
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch

from ...core.expr import Expr, FloorDiv, Lookup, Mod, TritonNames, to_triton
from ...core.mapping import IndexMap, Piece, contiguous_strides, full_region, index_vars

__all__ = [
    "Operand", "IO", "Plan", "render", "compile_source", "plan_cache", "autotune",
    "interpreting", "tl_dtype", "next_pow2", "const_code", "elementwise_tiling",
]


# ---------------------------------------------------------------------------
# environment
# ---------------------------------------------------------------------------

def interpreting() -> bool:
    """Kernels run on the CPU through Triton's interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def on_gpu(t: torch.Tensor | None = None) -> bool:
    if interpreting():
        return False
    if t is not None:
        return t.is_cuda
    return torch.cuda.is_available()


def next_pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


_TL = {
    torch.float32: "tl.float32", torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16",
    torch.float64: "tl.float64", torch.int64: "tl.int64", torch.int32: "tl.int32",
    torch.int16: "tl.int16", torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
}


def tl_dtype(dt: torch.dtype) -> str:
    if dt not in _TL:
        raise TypeError(f"no Triton dtype for {dt}")
    return _TL[dt]


def downcast(code: str, dt: str) -> str:
    """``code`` converted to ``dt`` as the GPU does it (round to nearest even, also in the interpreter)."""
    if dt == "tl.bfloat16" and interpreting():
        return f"vtc_rtne_bf16({code})"
    return f"{code}.to({dt})"


def is_float_tl(dt: str) -> bool:
    return dt.startswith("tl.float") or dt == "tl.bfloat16"


def const_code(v: float | int, dt: str = "tl.float32") -> str:
    """A constant spelled as Triton source (``inf``/``nan`` included)."""
    if is_float_tl(dt):
        v = float(v)
        if math.isnan(v):
            return 'float("nan")'
        if math.isinf(v):
            return 'float("inf")' if v > 0 else '-float("inf")'
        return repr(v)
    return str(int(v))


def _as_mask(m: str) -> str:
    """A load/store mask as bool: Triton's interpreter (3.9) gives ``scalar_cond & tile_cond`` an int8 value
    that ``tl.load`` rejects (``mask has unsupported dtype``); compiled Triton needs nothing."""
    return f"(({m}) != 0)" if interpreting() and "&" in m else m


def _and(*terms: str | None) -> str | None:
    ts = [t for t in terms if t]
    if not ts:
        return None
    return ts[0] if len(ts) == 1 else " & ".join(f"({t})" if not t.startswith("(") else t for t in ts)


# ---------------------------------------------------------------------------
# Operand
# ---------------------------------------------------------------------------

def _expr_tables(e: Expr, out: set[str]) -> None:
    for lk in e.lookups():
        out.add(lk.table)


class Operand:
    """A (possibly virtual) tensor as a kernel sees it.

    ``map``: an IndexMap over the operand's index space whose targets are keys of
    ``tensors`` (physical storages).  ``syms``: runtime scalar name -> Python int or a
    one-element integer tensor (read on the device, so a CUDA graph can replay with a
    new value).  ``tables``: index tensor name -> integer tensor, for ``Lookup`` atoms.
    ``dtype``: the element type the operand stands for (default: its storages').
    """

    def __init__(self, map: IndexMap, tensors: Mapping[str, torch.Tensor],
                 syms: Mapping[str, int | torch.Tensor] | None = None,
                 tables: Mapping[str, torch.Tensor] | None = None,
                 dtype: torch.dtype | None = None):
        self.map = map
        targets = map.targets()
        missing = targets - set(tensors)
        if missing:
            raise KeyError(f"no storage tensor for {sorted(missing)} of {map!r}")
        self.tensors = {k: tensors[k] for k in sorted(targets)}
        need_syms = {s.name for s in map.syms()}
        syms = dict(syms or {})
        if need_syms - set(syms):
            raise KeyError(f"no value for runtime scalars {sorted(need_syms - set(syms))}")
        self.syms = {k: syms[k] for k in sorted(need_syms)}
        self.sym_bounds = {s.name: (s.lo, s.hi) for s in map.syms()}
        need_tables: set[str] = set()
        for p in map.pieces:
            for e in p.index:
                _expr_tables(e, need_tables)
            for c, _, _ in p.conds:
                _expr_tables(c, need_tables)
        tables = dict(tables or {})
        if need_tables - set(tables):
            raise KeyError(f"no index tensor for {sorted(need_tables - set(tables))}")
        self.tables = {k: tables[k] for k in sorted(need_tables)}
        if dtype is None:
            dtype = next(iter(self.tensors.values())).dtype if self.tensors else torch.float32
        self.dtype = dtype
        for name in self.tensors:
            self.storage_strides(name)  # validates shapes
        self._sig: str | None = None
        self._views: dict = {}   # memoized broadcast_to / reshape results (maps are immutable)

    # -- construction -------------------------------------------------------
    @staticmethod
    def dense(t: torch.Tensor, name: str = "x") -> "Operand":
        """A physical tensor (any strides) as an operand."""
        return Operand(IndexMap.identity(tuple(t.shape), name), {name: t})

    def with_map(self, m: IndexMap, syms: Mapping | None = None, tables: Mapping | None = None,
                 tensors: Mapping | None = None) -> "Operand":
        return Operand(m, {**self.tensors, **(tensors or {})}, {**self.syms, **(syms or {})},
                       {**self.tables, **(tables or {})}, self.dtype)

    def view(self, shape: Sequence[int], index: Sequence[Expr | int],
             syms: Mapping | None = None, tables: Mapping | None = None,
             region: Sequence[tuple[int, int]] | None = None) -> "Operand":
        """A new operand over ``shape`` whose element ``i`` is ``self[index(i)]``.

        ``index`` is written in ``i0..i{n-1}`` (see :func:`vtcsearch.core.mapping.index_vars`);
        with ``region``, only that box of the new index space is mapped (a partial map).
        """
        shape = tuple(int(s) for s in shape)
        idx = tuple(Expr.lift(e) for e in index)
        outer = IndexMap(shape, [Piece("__base", tuple(region) if region else full_region(shape), idx)],
                         {"__base": self.shape})
        return self.with_map(outer.compose({"__base": self.map}), syms, tables)

    def permute(self, dims: Sequence[int]) -> "Operand":
        n = self.ndim
        dims = [d % n for d in dims]
        v = index_vars(n)
        j: list[Expr] = [Expr()] * n
        for k, d in enumerate(dims):
            j[d] = v[k]
        return self.view([self.shape[d] for d in dims], j)

    def transpose(self, a: int, b: int) -> "Operand":
        perm = list(range(self.ndim))
        perm[a], perm[b] = perm[b], perm[a]
        return self.permute(perm)

    def reshape(self, shape: Sequence[int]) -> "Operand":
        key = ("reshape", tuple(shape))
        if key not in self._views:
            self._views[key] = self._reshape(shape)
        return self._views[key]

    def _reshape(self, shape: Sequence[int]) -> "Operand":
        from ...core.ops import reshape_index
        shape = list(shape)
        if -1 in shape:
            k = shape.index(-1)
            rest = math.prod(s for s in shape if s != -1)
            shape[k] = self.numel // max(rest, 1)
        if math.prod(shape) != self.numel:
            raise ValueError(f"cannot reshape {self.shape} to {tuple(shape)}")
        return self.view(shape, reshape_index(shape, self.shape, index_vars(len(shape))))

    def broadcast_to(self, shape: Sequence[int]) -> "Operand":
        shape = tuple(int(s) for s in shape)
        if shape == self.shape:
            return self
        key = ("broadcast", shape)
        if key not in self._views:
            self._views[key] = self._broadcast(shape)
        return self._views[key]

    def _broadcast(self, shape: tuple[int, ...]) -> "Operand":
        off = len(shape) - self.ndim
        if off < 0:
            raise ValueError(f"cannot broadcast {self.shape} to {shape}")
        v = index_vars(len(shape))
        idx = []
        for k, s in enumerate(self.shape):
            if s == shape[k + off]:
                idx.append(v[k + off])
            elif s == 1:
                idx.append(Expr())
            else:
                raise ValueError(f"cannot broadcast {self.shape} to {shape}")
        return self.view(shape, idx)

    def narrow(self, dim: int, start: int, length: int, step: int = 1) -> "Operand":
        dim %= self.ndim
        v = index_vars(self.ndim)
        shape = list(self.shape)
        shape[dim] = length
        return self.view(shape, [v[k] * step + start if k == dim else v[k] for k in range(self.ndim)])

    def sub(self, region: Sequence[tuple[int, int]]) -> "Operand":
        """The box ``region`` of this operand as an operand of its own (index 0 at ``lo``)."""
        v = index_vars(self.ndim)
        return self.view([hi - lo for lo, hi in region], [v[k] + lo for k, (lo, _) in enumerate(region)])

    @staticmethod
    def cat(ops: Sequence["Operand"], dim: int) -> "Operand":
        """The concatenation along ``dim`` (a piecewise map; also a split-form write target)."""
        base = ops[0]
        dim %= base.ndim
        shape = list(base.shape)
        shape[dim] = sum(o.shape[dim] for o in ops)
        v = index_vars(len(shape))
        maps, tensors, syms, tables = [], {}, {}, {}
        off = 0
        for k, o in enumerate(ops):
            m = o.map
            rename = {}
            for name, t in o.tensors.items():
                new = name
                n = 1
                while new in tensors and tensors[new] is not t:
                    new = f"{name}_{n}"
                    n += 1
                rename[name] = new
            m = m.retarget(rename)
            for name, t in o.tensors.items():
                tensors[rename[name]] = t
            region = tuple((off, off + o.shape[dim]) if d == dim else (0, s) for d, s in enumerate(shape))
            piece = Piece(f"__c{k}", region, tuple(v[d] - off if d == dim else v[d] for d in range(len(shape))))
            maps.append(IndexMap(shape, [piece], {f"__c{k}": o.shape}).compose({f"__c{k}": m}))
            syms.update(o.syms)
            tables.update(o.tables)
            off += o.shape[dim]
        return Operand(IndexMap.union(shape, maps), tensors, syms, tables, base.dtype)

    # -- queries ------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self.map.shape

    @property
    def ndim(self) -> int:
        return len(self.map.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.map.shape)

    @property
    def device(self) -> torch.device:
        for t in self.tensors.values():
            return t.device
        return torch.device("cpu")

    def storage_strides(self, name: str) -> tuple[int, ...]:
        """Element strides of storage ``name`` in the shape the map indexes it with."""
        t = self.tensors[name]
        ts = self.map.target_shapes[name]
        if tuple(t.shape) == tuple(ts):
            return tuple(int(s) for s in t.stride())
        if t.numel() == math.prod(ts) and t.is_contiguous():
            return contiguous_strides(ts)
        raise ValueError(f"storage {name!r}: tensor of shape {tuple(t.shape)} (strides {t.stride()}) "
                         f"cannot be indexed as {tuple(ts)}")

    def max_offset(self, name: str) -> int:
        t = self.tensors[name]
        return sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride()) if s > 0)

    def layout(self) -> tuple[list[str], list[str], list[str]]:
        """Kernel argument order: storages, runtime scalars, index tensors (all sorted by name)."""
        return list(self.tensors), list(self.syms), list(self.tables)

    def kernel_args(self) -> list:
        s, y, t = self.layout()
        return [self.tensors[k] for k in s] + [self.syms[k] for k in y] + [self.tables[k] for k in t]

    def signature(self) -> str:
        """Everything the generated code depends on (not the values); computed once per operand."""
        if self._sig is None:
            self._sig = self._signature()
        return self._sig

    def _signature(self) -> str:
        parts = [repr(self.map), str(self.dtype)]
        for k, t in self.tensors.items():
            parts.append(f"{k}:{tuple(t.shape)}:{tuple(t.stride())}:{t.dtype}:{self.map.target_shapes[k]}")
        for k, v in self.syms.items():
            parts.append(f"${k}:{'t' if isinstance(v, torch.Tensor) else 'i'}:{self.sym_bounds[k]}")
        for k, t in self.tables.items():
            parts.append(f"#{k}:{tuple(t.shape)}:{tuple(t.stride())}:{t.dtype}")
        return "|".join(parts)

    def __repr__(self) -> str:
        return f"Operand({self.map!r}, dtype={self.dtype})"

    # -- reference semantics (CPU, for tests) -----------------------------
    def _ref_env(self):
        syms = {k: int(v.reshape(-1)[0].item()) if isinstance(v, torch.Tensor) else int(v)
                for k, v in self.syms.items()}
        tables = {k: t.detach().cpu().numpy() for k, t in self.tables.items()}
        return syms, tables

    def gather(self) -> torch.Tensor:
        """Materialize the virtual tensor (reference semantics, via IndexMap.gather)."""
        syms, tables = self._ref_env()
        cpu = {k: t.detach().cpu() for k, t in self.tensors.items()}
        if not cpu:
            cpu = {"__none": torch.empty(0, dtype=self.dtype)}
        return self.map.gather(cpu, syms, tables).to(self.device)

    def scatter(self, value: torch.Tensor) -> None:
        """Write ``value`` through the map (reference semantics, via IndexMap.scatter)."""
        syms, tables = self._ref_env()
        cpu = {k: t.detach().cpu().clone() for k, t in self.tensors.items()}
        self.map.scatter(value.detach().cpu(), cpu, syms, tables)
        for k, t in self.tensors.items():
            t.copy_(cpu[k])


# ---------------------------------------------------------------------------
# IO: an operand bound into one kernel
# ---------------------------------------------------------------------------

class IO:
    """Emits the load and store code of one operand inside one kernel."""

    def __init__(self, op: Operand, prefix: str):
        self.op, self.prefix = op, prefix
        storages, syms, tables = op.layout()
        self.ptr = {s: f"{prefix}_p{k}" for k, s in enumerate(storages)}
        self.sym_is_ptr = {s: isinstance(op.syms[s], torch.Tensor) for s in syms}
        self.sym_arg = {s: f"{prefix}_s{k}" for k, s in enumerate(syms)}
        self.tab = {t: (f"{prefix}_t{k}", tuple(int(x) for x in op.tables[t].stride())) for k, t in enumerate(tables)}
        self.strides = {s: op.storage_strides(s) for s in storages}
        self.dtypes = {s: tl_dtype(op.tensors[s].dtype) for s in storages}
        self.wide = any(op.max_offset(s) >= 2 ** 31 - 1 for s in storages) or \
            any(t.numel() >= 2 ** 31 - 1 for t in op.tables.values())
        self.modes: list[str] = []   # which code path each load/store took (for tests and reports)
        self._offsets: dict[int, Expr] = {}

    # -- kernel signature ---------------------------------------------------
    def params(self) -> list[str]:
        out = [self.ptr[s] for s in self.ptr]
        out += [self.sym_arg[s] + ("_ptr" if self.sym_is_ptr[s] else "") for s in self.sym_arg]
        out += [self.tab[t][0] for t in self.tab]
        return out

    def prologue(self) -> list[str]:
        """Lines to put at the top of the kernel (device-resident runtime scalars)."""
        lines = []
        for s, a in self.sym_arg.items():
            if self.sym_is_ptr[s]:
                lines.append(f"{a} = tl.load({a}_ptr)" + (".to(tl.int64)" if self.wide else ""))
            elif self.wide:
                lines.append(f"{a} = {a}.to(tl.int64)")
        return lines

    # -- code of one piece --------------------------------------------------
    def _names(self, idx: Sequence[str], mask: str | None) -> TritonNames:
        if self.wide:
            idx = [f"({c}).to(tl.int64)" for c in idx]
        return TritonNames({f"i{k}": c for k, c in enumerate(idx)}, self.sym_arg, self.tab, mask)

    def _code(self, e: Expr, names: TritonNames) -> str:
        """Like :func:`vtcsearch.core.expr.to_triton`, but index-tensor reads are unmasked with clamped
        indices: always in bounds (lanes outside the piece read some valid entry and are masked
        later), and a read at a per-program scalar position stays a scalar load."""
        parts = []
        for a, c in e.terms:
            sc = self._atom(a, names)
            parts.append(sc if c == 1 else f"({c}) * {sc}")
        if e.const or not parts:
            parts.append(f"({e.const})")
        return "(" + " + ".join(parts) + ")"

    def _atom(self, a, names: TritonNames) -> str:
        if isinstance(a, Lookup):
            ptr, strides = self.tab[a.table]
            shape = self.op.tables[a.table].shape
            terms = []
            for i, st, n in zip(a.index, strides, shape):
                ic = self._code(i, names)
                if not i.is_const():
                    ic = f"tl.minimum(tl.maximum({ic}, 0), {int(n) - 1})"
                terms.append(f"{ic} * {st}")
            return f"tl.load({ptr} + ({' + '.join(terms) or '0'})).to(tl.int64)"
        if isinstance(a, FloorDiv):
            return f"({self._code(a.arg, names)} // {a.div})"
        if isinstance(a, Mod):
            return f"({self._code(a.arg, names)} % {a.div})"
        return to_triton(Expr({a: 1}), names)

    def _offset(self, n: int, p: Piece) -> Expr:
        if n not in self._offsets:
            self._offsets[n] = p.offset(self.strides[p.target])
        return self._offsets[n]

    def _offset_code(self, n: int, p: Piece, idx: Sequence[str], mask: str | None) -> str:
        off = self._offset(n, p)
        code = self._code(off, self._names(idx, mask))
        # index dims the offset does not use still give the pointer tile its shape (a broadcast read)
        used = off.free_vars()
        unused = [c for k, c in enumerate(idx) if f"i{k}" not in used and _is_vector_code(c)]
        if unused:
            code = f"({code} + {' + '.join(f'0 * {c}' for c in unused)})"
        return code

    def _pred(self, p: Piece, idx: Sequence[str], mask: str | None) -> str | None:
        """Per-element predicate of a piece (region box and extra conditions)."""
        shape = self.op.shape
        pred = []
        for k, (lo, hi) in enumerate(p.region):
            if lo > 0:
                pred.append(f"({idx[k]} >= {lo})")
            if hi < shape[k]:
                pred.append(f"({idx[k]} < {hi})")
        if p.conds:
            tn = self._names(idx, mask)
            for ce, lo, hi in p.conds:
                c = self._code(ce, tn)
                pred.append(f"({c} >= {lo})")
                pred.append(f"({c} < {hi})")
        return " & ".join(pred) if pred else None

    def _block_pred(self, p: Piece, block: Sequence[tuple[str, int]]) -> str | None:
        """Scalar test that the block whose first index is ``block`` lies in piece ``p``."""
        shape = self.op.shape
        pred = []
        for k, ((lo, hi), (start, _)) in enumerate(zip(p.region, block)):
            if lo > 0:
                pred.append(f"({start} >= {lo})")
            if hi < shape[k]:
                pred.append(f"({start} < {hi})")
        return " & ".join(pred) if pred else None

    def block_select(self, block: Sequence[tuple[str, int]] | None) -> bool:
        """Whether a tile with box ``block`` can pick its piece by one scalar branch."""
        m = self.op.map
        if block is None or len(m.pieces) <= 1 or not m.is_box_piecewise():
            return False
        if len(block) != m.ndim:
            raise ValueError(f"block has {len(block)} dims, operand {m.ndim}")
        return m.blocks_aligned({d: max(int(b), 1) for d, (_, b) in enumerate(block)})

    def _covers_all(self) -> bool:
        m = self.op.map
        return m.is_box_piecewise() and m.covered_size() == m.numel

    def _full_piece(self, p: Piece) -> bool:
        return not p.conds and all((lo, hi) == (0, s) for (lo, hi), s in zip(p.region, self.op.shape))

    # -- stage 1 --------------------------------------------------------------
    def load(self, out: str, idx: Sequence[str], *, shape: str, mask: str | None = None,
             block: Sequence[tuple[str, int]] | None = None, dtype: str | None = "tl.float32",
             other: float | int = 0.0) -> list[str]:
        """Lines that set ``out`` to the tile of this operand at index tensors ``idx``.

        ``shape``: the tile's shape as Triton source (for constant pieces and
        uncovered lanes); ``mask``: lanes to read; ``block``: the tile's box, enabling the
        per-block piece branch; ``dtype``: result dtype (``None`` keeps the operand's dtype,
        bit-exact); ``other``: the value of masked-off and uncovered lanes.
        """
        dt = dtype or tl_dtype(self.op.dtype)
        oth = const_code(other, dt)
        pieces = self.op.map.pieces
        if len(idx) != self.op.ndim:
            raise ValueError(f"{len(idx)} index codes for a {self.op.ndim}-d operand")

        def value(n: int, p: Piece, m: str | None) -> str:
            if p.target is None:
                return f"tl.full({shape}, {const_code(p.fill, dt)}, {dt})"
            off = self._offset_code(n, p, idx, m)
            mk = f", mask={_as_mask(m)}, other={oth}" if m else ""
            cast = "" if self.dtypes[p.target] == dt else f".to({dt})"
            return f"tl.load({self.ptr[p.target]} + {off}{mk}){cast}"

        if not pieces:
            self.modes.append("empty")
            return [f"{out} = tl.full({shape}, {oth}, {dt})"]
        if len(pieces) == 1 and self._full_piece(pieces[0]):
            self.modes.append("single")
            return [f"{out} = {value(0, pieces[0], mask)}"]
        lines: list[str] = []
        if self.block_select(block):
            self.modes.append("block")
            full = self._covers_all()
            for n, p in enumerate(pieces):
                bp = self._block_pred(p, block)
                if n == len(pieces) - 1 and full:
                    lines.append("else:" if n else "if True:")
                else:
                    lines.append(f"{'if' if n == 0 else 'elif'} {bp or 'True'}:")
                lines.append(f"    {out} = {value(n, p, mask)}")
            if not full:
                lines.append("else:")
                lines.append(f"    {out} = tl.full({shape}, {oth}, {dt})")
            return lines
        self.modes.append("element")
        first = True
        for n, p in enumerate(pieces):
            pred = self._pred(p, idx, mask)
            m = _and(mask, pred)
            if first:
                if p.target is None:
                    v = f"tl.full({shape}, {const_code(p.fill, dt)}, {dt})"
                    lines.append(f"{out} = tl.where({pred}, {v}, {oth})" if pred else f"{out} = {v}")
                else:
                    lines.append(f"{out} = {value(n, p, m)}")
                first = False
            else:
                v = value(n, p, m) if p.target is not None else const_code(p.fill, dt)
                lines.append(f"{out} = tl.where({pred}, {v}, {out})" if pred else f"{out} = {v}")
        return lines

    # -- stage 3 --------------------------------------------------------------
    def store(self, value: str, idx: Sequence[str], *, mask: str | None = None,
              block: Sequence[tuple[str, int]] | None = None) -> list[str]:
        """Lines that write the tile ``value`` through the map (lanes outside every piece: nowhere)."""
        pieces = self.op.map.pieces
        if len(idx) != self.op.ndim:
            raise ValueError(f"{len(idx)} index codes for a {self.op.ndim}-d operand")
        for p in pieces:
            if p.target is None:
                raise ValueError(f"cannot store into a constant piece of {self.op.map!r}")

        def put(n: int, p: Piece, m: str | None) -> str:
            off = self._offset_code(n, p, idx, m)
            mk = f", mask={_as_mask(m)}" if m else ""
            return f"tl.store({self.ptr[p.target]} + {off}, {downcast(value, self.dtypes[p.target])}{mk})"

        if not pieces:
            self.modes.append("empty")
            return []
        if len(pieces) == 1 and self._full_piece(pieces[0]):
            self.modes.append("single")
            return [put(0, pieces[0], mask)]
        lines: list[str] = []
        if self.block_select(block):
            self.modes.append("block")
            full = self._covers_all()
            for n, p in enumerate(pieces):
                bp = self._block_pred(p, block)
                if n == len(pieces) - 1 and full:
                    lines.append("else:")
                else:
                    lines.append(f"{'if' if n == 0 else 'elif'} {bp or 'True'}:")
                lines.append(f"    {put(n, p, mask)}")
            return lines
        self.modes.append("element")
        for n, p in enumerate(pieces):
            lines.append(put(n, p, _and(mask, self._pred(p, idx, mask))))
        return lines


def _is_vector_code(code: str) -> bool:
    # constants need no broadcast; anything else (a tile index or a scalar) is added as 0 * code
    try:
        int(code)
        return False
    except ValueError:
        return True


# ---------------------------------------------------------------------------
# source generation and compilation
# ---------------------------------------------------------------------------

HEADER = """\
# Generated by vtcsearch.codegen.kernels ({name}); do not edit.
import triton
import triton.language as tl
from vtcsearch.codegen.kernels._lib import *  # noqa: F401,F403
"""


def render(template: str, **blocks: Sequence[str] | str) -> str:
    """Fill a template: a line ``@@name`` becomes the lines of ``blocks[name]`` at its indentation;
    ``@name@`` inside a line is replaced by ``blocks[name]`` (a string)."""
    out: list[str] = []
    for line in template.splitlines():
        s = line.strip()
        if s.startswith("@@"):
            key = s[2:]
            ind = line[: len(line) - len(line.lstrip())]
            body = blocks[key]
            if isinstance(body, str):
                body = body.splitlines()
            out.extend(ind + b for b in body)
            continue
        for k, v in blocks.items():
            tok = f"@{k}@"
            if tok in line:
                line = line.replace(tok, v if isinstance(v, str) else ", ".join(v))
        out.append(line)
    return "\n".join(out) + "\n"


def cache_dir() -> Path:
    d = os.environ.get("VTC_KERNEL_CACHE")
    path = Path(d) if d else Path(tempfile.gettempdir()) / f"vtcsearch-kernels-{os.getuid() if hasattr(os, 'getuid') else 0}"
    path.mkdir(parents=True, exist_ok=True)
    return path


_MODULES: dict[str, Any] = {}
_LOCK = threading.RLock()


def compile_source(name: str, source: str) -> Any:
    """Write ``source`` (a module defining the jit function ``name``) to the cache and import it."""
    source = HEADER.format(name=name) + source
    h = hashlib.sha256(source.encode()).hexdigest()[:24]
    modname = f"_vtc_{name}_{h}"
    with _LOCK:
        if modname in _MODULES:
            return getattr(_MODULES[modname], name)
        path = cache_dir() / f"{modname}.py"
        if not path.exists() or path.read_text() != source:
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(source)
            os.replace(tmp, path)
        spec = importlib.util.spec_from_file_location(modname, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[modname] = mod
        spec.loader.exec_module(mod)
        _MODULES[modname] = mod
        return getattr(mod, name)


@dataclass
class Plan:
    """One compiled kernel and how to launch it."""

    name: str
    kernel: Any
    grid: tuple[int, ...]
    constexprs: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    modes: dict[str, list[str]] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    last_args: list = field(default_factory=list, repr=False)

    def launch(self, args: Sequence) -> None:
        opts = {} if interpreting() else self.options
        self.last_args = list(args)
        self.kernel[self.grid](*args, **self.constexprs, **opts)

    def replay(self) -> None:
        """Launch again with the last call's arguments (same tensors, new contents): no re-planning."""
        self.launch(self.last_args)


_PLANS: dict[str, Plan] = {}


def plan_cache(key: str, build: Callable[[], Plan]) -> Plan:
    """The plan cached under ``key``, built once."""
    with _LOCK:
        p = _PLANS.get(key)
    if p is None:
        p = build()
        with _LOCK:
            _PLANS[key] = p
    return p


def clear_caches() -> None:
    with _LOCK:
        _PLANS.clear()
        _TUNED.clear()


def key_of(*parts: Any) -> str:
    return hashlib.sha256("\x1f".join(map(str, parts)).encode()).hexdigest()


_TUNED: dict[str, int] = {}


def autotune(key: str, configs: Sequence[dict], run: Callable[[dict], Callable[[], None]],
             written: Iterable[torch.Tensor] = (), device: torch.device | None = None) -> dict:
    """The best of ``configs`` for ``key``: timed on the GPU once (cached), the first otherwise.

    ``run(cfg)`` compiles and returns a function launching the kernel(s) with this call's
    arguments.  ``written`` are the storages the kernels write; they are restored after
    timing, so in-place updates (a KV cache, a residual) are applied exactly once.
    """
    configs = list(configs)
    if len(configs) == 1 or interpreting() or (device is not None and device.type != "cuda") \
            or os.environ.get("VTC_AUTOTUNE", "1") == "0":
        return configs[0]
    with _LOCK:
        if key in _TUNED:
            return configs[_TUNED[key]]
    if torch.cuda.is_current_stream_capturing():
        return configs[0]
    from triton.testing import do_bench
    written = list({id(t): t for t in written}.values())
    saved = [t.clone() for t in written]
    best, best_ms = 0, float("inf")
    for i, cfg in enumerate(configs):
        try:
            fn = run(cfg)
            ms = do_bench(fn, warmup=5, rep=25)
        except Exception:  # a config that does not compile or fit (shared memory) is skipped
            ms = float("inf")
        if ms < best_ms:
            best, best_ms = i, ms
    for t, s in zip(written, saved):
        t.copy_(s)
    with _LOCK:
        _TUNED[key] = best
    return configs[best]


# ---------------------------------------------------------------------------
# tilings shared by the elementwise templates
# ---------------------------------------------------------------------------

@dataclass
class Tiling:
    """A [BR, BC] tile over the last two dims of a shape; outer dims are scalars per program."""

    shape: tuple[int, ...]
    BR: int
    BC: int
    pid_lines: list[str]
    idx: list[str]          # index code per dim, broadcast to the tile
    block: list[tuple[str, int]]
    mask: str | None
    tile: str               # tile shape code
    grid: tuple[int, ...]
    row_vec: str | None     # the row index vector (1-d), None for 1-d shapes
    col_vec: str            # the column index vector


def elementwise_tiling(shape: Sequence[int], BR: int, BC: int, col_start: str | None = None) -> Tiling:
    """Tile ``shape`` (ndim >= 1) by [BR, BC] over its last two dims, 1-d grid.

    ``col_start``: when given, the column block start is this code (a loop variable) and
    the grid does not cover columns (reductions loop over them).
    """
    shape = tuple(int(s) for s in shape)
    nd = len(shape)
    C = shape[-1]
    R = shape[-2] if nd >= 2 else 1
    outer = shape[:-2] if nd >= 2 else ()
    nc = 1 if col_start is not None else -(-C // BC)
    nr = -(-R // BR)
    lines = ["pid = tl.program_id(0)"]
    if col_start is None:
        lines.append(f"pid_c = pid % {nc}")
        lines.append(f"pid = pid // {nc}")
        c0 = f"pid_c * {BC}"
    else:
        c0 = col_start
    if nd >= 2:
        lines.append(f"pid_r = pid % {nr}")
        lines.append(f"pid = pid // {nr}")
    for k in reversed(range(len(outer))):
        lines.append(f"o{k} = pid % {outer[k]}")
        lines.append(f"pid = pid // {outer[k]}")
    idx, block = [], []
    for k in range(len(outer)):
        idx.append(f"o{k}")
        block.append((f"o{k}", 1))
    masks = []
    if nd >= 2:
        lines.append(f"rr = pid_r * {BR} + tl.arange(0, {BR})")
        idx.append("rr[:, None]")
        block.append((f"pid_r * {BR}", BR))
        if R % BR:
            masks.append(f"(rr[:, None] < {R})")
        tile = f"({BR}, {BC})"
        ccode = "rc[None, :]"
    else:
        tile = f"({BC},)"
        ccode = "rc"
    if col_start is None:
        lines.append(f"rc = {c0} + tl.arange(0, {BC})")
        if C % BC:
            masks.append(f"({ccode} < {C})")
    idx.append(ccode)
    block.append((c0, BC))
    grid = (max(1, math.prod(outer) * nr * nc),)
    return Tiling(shape, BR, BC, lines, idx, block, " & ".join(masks) if masks else None, tile, grid,
                  "rr" if nd >= 2 else None, "rc")

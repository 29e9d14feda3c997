"""Operands: a (possibly virtual) tensor as a kernel template receives it.

An :class:`Operand` is a *resolved* :class:`~vtcsearch.core.mapping.IndexMap` (its targets are physical
storages), the storage tensors by name, and the runtime values the map needs (scalars such as a decode
position, index tensors for indirect maps).  A plain tensor is ``Operand.dense(t)``; views (``permute``,
``reshape``, ``broadcast_to``, ``narrow``, ``cat``, ``view``) compose maps without touching memory.  How
an operand is read and written inside a kernel is :mod:`.emit`'s job.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import torch

from ...core.expr import Expr
from ...core.mapping import IndexMap, Piece, contiguous_strides, full_region

__all__ = ["Operand"]


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

    # Views: the movement maps are :class:`IndexMap`'s (the one definition the op registry also uses),
    # composed onto this operand's map.
    def _moved(self, m: IndexMap) -> "Operand":
        """This operand seen through movement map ``m`` (whose one target, ``__base``, is this operand)."""
        return self.with_map(m.compose({"__base": self.map}))

    def permute(self, dims: Sequence[int]) -> "Operand":
        return self._moved(IndexMap.permute(self.shape, dims, "__base"))

    def transpose(self, a: int, b: int) -> "Operand":
        perm = list(range(self.ndim))
        perm[a], perm[b] = perm[b], perm[a]
        return self.permute(perm)

    def reshape(self, shape: Sequence[int]) -> "Operand":
        key = ("reshape", tuple(shape))
        if key not in self._views:
            self._views[key] = self._moved(IndexMap.reshape(self.shape, shape, "__base"))
        return self._views[key]

    def broadcast_to(self, shape: Sequence[int]) -> "Operand":
        shape = tuple(int(s) for s in shape)
        if shape == self.shape:
            return self
        key = ("broadcast", shape)
        if key not in self._views:
            self._views[key] = self._moved(IndexMap.broadcast(self.shape, shape, "__base"))
        return self._views[key]

    def narrow(self, dim: int, start: int, length: int, step: int = 1) -> "Operand":
        return self._moved(IndexMap.narrow(self.shape, dim, start, length, "__base", step))

    def sub(self, region: Sequence[tuple[int, int]]) -> "Operand":
        """The box ``region`` of this operand as an operand of its own (index 0 at ``lo``)."""
        op = self
        for d, (lo, hi) in enumerate(region):
            if (lo, hi) != (0, self.shape[d]):
                op = op.narrow(d, lo, hi - lo)
        return op

    @staticmethod
    def cat(ops: Sequence["Operand"], dim: int) -> "Operand":
        """The concatenation along ``dim`` (a piecewise map; also a split-form write target)."""
        tensors, syms, tables, maps = {}, {}, {}, {}
        for k, o in enumerate(ops):
            rename = {}
            for name, t in o.tensors.items():   # storages of the same name but another tensor get new names
                new, n = name, 1
                while new in tensors and tensors[new] is not t:
                    new = f"{name}_{n}"
                    n += 1
                rename[name] = new
                tensors[new] = t
            maps[f"__c{k}"] = o.map.retarget(rename)
            syms.update(o.syms)
            tables.update(o.tables)
        m = IndexMap.cat([(f"__c{k}", o.shape) for k, o in enumerate(ops)], dim).compose(maps)
        return Operand(m, tensors, syms, tables, ops[0].dtype)

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

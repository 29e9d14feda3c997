"""The Virtual Tensor Opportunity Graph (VTOG).

Nodes are the tensors that data movement ops touch; an edge ``u -> v`` says
"``u`` may be virtual over ``v``": reading or writing ``u`` at index ``i`` goes
to ``v`` at ``edge.map(i)``.  Edges come from one pass over the movement ops,
by the registry's rules:

* ``output_over_input``: an op's output reads its input through the op's map
  (a Split piece, a Reshape, an Expand);
* ``input_over_output``: the producer of an op's input writes straight into
  the op's output (a Concat input, the new K row of a KV cache);
* ``inplace``: a scatter's output takes over its ``data`` input's storage.

Edges of one node that leave it from the same op and cover disjoint parts of
it (the slabs of a Concat output) form an *option*: a virtual tensor takes
exactly one option.  Two out-edges of a node whose regions overlap conflict
(one index would land in two places); an edge and its reverse conflict (a
cycle).  The class of an edge (Type I / partially contiguous / Type II) is
read off its map, as in the paper's profitability analysis.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import networkx as nx

from .graph import TensorGraph
from .mapping import IndexMap, contiguous_strides, region_intersect

COALESCE_BYTES = 128  # one warp's coalesced transaction: runs this long keep full bandwidth



class EdgeClass(StrEnum):
    """How an edge's map accesses its target (its profitability class; the JSON spells the value)."""

    TYPE_I = "I"             # the target's own row-major layout shifted: accesses stay as coalesced
    PARTIAL = "partial"      # contiguous runs of at least one coalesced transaction
    TYPE_II = "II"           # anything else: needs measuring


@dataclass(frozen=True)
class Edge:
    id: int
    src: str                 # the tensor that may become virtual
    dst: str                 # the tensor it maps into
    op: str                  # the movement op that justifies the edge
    kind: str                # output_over_input | input_over_output | inplace
    map: IndexMap            # over src's index space; pieces land in dst (or are constants)
    cls: EdgeClass
    run: int                 # shortest contiguous run, elements (in dst's contiguous layout)
    run_bytes: int
    value_preserving: bool   # src equals dst at the mapped elements (False for in-place reuse)

    @property
    def region(self) -> tuple[tuple[int, int], ...]:
        """Bounding box of the part of src this edge covers."""
        regs = [p.region for p in self.map.pieces]
        return tuple((min(r[d][0] for r in regs), max(r[d][1] for r in regs)) for d in range(self.map.ndim))

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "src": self.src, "dst": self.dst, "op": self.op, "kind": self.kind,
                "class": self.cls, "run": self.run, "run_bytes": self.run_bytes,
                "value_preserving": self.value_preserving, "map": self.map.to_json()}


@dataclass(frozen=True)
class Option:
    """One way to make ``tensor`` virtual: all of ``edges`` together cover it."""

    id: int
    tensor: str
    edges: tuple[int, ...]
    op: str


@dataclass
class VTOG:
    graph: TensorGraph
    edges: list[Edge] = field(default_factory=list)
    options: list[Option] = field(default_factory=list)
    conflicts: set[frozenset[int]] = field(default_factory=set)   # pairs of edge ids
    nx: nx.MultiDiGraph = field(default_factory=nx.MultiDiGraph)

    # -- queries ------------------------------------------------------------
    def out_edges(self, u: str) -> list[Edge]:
        return [self.edges[k] for _, _, k in self.nx.out_edges(u, keys=True)]

    def in_edges(self, v: str) -> list[Edge]:
        return [self.edges[k] for _, _, k in self.nx.in_edges(v, keys=True)]

    def options_of(self, u: str) -> list[Option]:
        return [o for o in self.options if o.tensor == u]

    def candidates(self) -> list[str]:
        """Tensors that have at least one way to become virtual."""
        return sorted({o.tensor for o in self.options}, key=list(self.graph.tensors).index)

    def conflict_sets(self) -> dict[str, list[tuple[int, int]]]:
        """Per node, its conflicting out-edge pairs (the paper's conflict sets)."""
        out: dict[str, list[tuple[int, int]]] = {}
        for pair in self.conflicts:
            a, b = sorted(pair)
            out.setdefault(self.edges[a].src, []).append((a, b))
        return out

    def summary(self) -> dict[str, Any]:
        from collections import Counter
        return {"nodes": self.nx.number_of_nodes(), "edges": len(self.edges), "options": len(self.options),
                "candidates": len(self.candidates()), "conflicts": len(self.conflicts),
                "edges_by_class": dict(Counter(e.cls for e in self.edges)),
                "edges_by_kind": dict(Counter(e.kind for e in self.edges))}

    # -- export -------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {"nodes": [{"name": n, "shape": list(self.graph.tensors[n].shape),
                           "dtype": str(self.graph.tensors[n].dtype).replace("torch.", ""),
                           "bytes": self.graph.tensors[n].nbytes,
                           "physical_only": self.graph.tensors[n].physical_only} for n in self.nx.nodes],
                "edges": [e.to_json() for e in self.edges],
                "options": [{"id": o.id, "tensor": o.tensor, "edges": list(o.edges), "op": o.op}
                            for o in self.options],
                "conflicts": sorted([sorted(c) for c in self.conflicts])}

    def write_json(self, path: str, run: dict[str, Any] | None = None) -> None:
        """``run``: the command, machine and date of the run that wrote it, stored beside the data."""
        with open(path, "w") as f:
            json.dump({**self.to_json(), **({"written_by": run} if run else {})}, f, indent=1)

    def write_graphml(self, path: str) -> None:
        g = nx.MultiDiGraph()
        for n in self.nx.nodes:
            t = self.graph.tensors[n]
            g.add_node(n, shape=str(list(t.shape)), dtype=str(t.dtype), bytes=t.nbytes,
                       physical_only=t.physical_only)
        for e in self.edges:
            g.add_edge(e.src, e.dst, key=e.id, op=e.op, kind=e.kind, cls=e.cls.value, run_bytes=e.run_bytes,
                       map=repr(e.map))
        nx.write_graphml(g, path)


def classify(m: IndexMap, dst_shape: tuple[int, ...], itemsize: int) -> tuple[EdgeClass, int]:
    """(profitability class, shortest contiguous run in elements) of an edge's map.

    Type I: every piece is the tensor's own row-major layout shifted by a constant,
    so accesses stay exactly as coalesced as before.  Partially contiguous: runs of at
    least one coalesced transaction.  Anything else is Type II and needs measuring.
    """
    strides = {p.target: contiguous_strides(dst_shape) for p in m.pieces if p.target}
    run = m.run_length(strides)
    if not m.has_lookup() and all(
            p.target is None or IndexMap(m.shape, [p], m.target_shapes).is_identity_layout(strides)
            for p in m.pieces):
        return EdgeClass.TYPE_I, run
    if run * itemsize >= COALESCE_BYTES:
        return EdgeClass.PARTIAL, run
    return EdgeClass.TYPE_II, run


def build_vtog(graph: TensorGraph) -> VTOG:
    """One pass over the movement ops, adding each op's edges by its registry rules."""
    v = VTOG(graph)
    index_tables = _index_tables(graph)
    for op in graph.movement_ops():
        mv = op.movement
        names = {f"in{k}": t for k, t in enumerate(op.inputs)} | {f"out{j}": t for j, t in enumerate(op.outputs)}
        updated = {u.output for u in mv.updates}
        # outputs read their inputs
        for j, out_map in enumerate(mv.outputs):
            if j in updated:
                continue
            by_input: dict[str, list] = {}
            fills = [p for p in out_map.pieces if p.target is None]
            for p in out_map.pieces:
                if p.target is not None:
                    by_input.setdefault(p.target, []).append(p)
            group = []
            for k, (tgt, pieces) in enumerate(by_input.items()):
                if _is_index_input(op, tgt, out_map):
                    continue
                extra = fills if k == 0 else []
                m = IndexMap(out_map.shape, pieces + extra, {tgt: out_map.target_shapes[tgt]}).retarget(names)
                group.append(_add_edge(v, op.outputs[j], names[tgt], op.name, "output_over_input", m, True))
            _add_option(v, op.outputs[j], group, op.name, index_tables)
        # inputs write their outputs
        by_input_edges: dict[int, list] = {}
        for k, j, m in mv.inverse:
            e = _add_edge(v, op.inputs[k], op.outputs[j], op.name, "input_over_output", m.retarget(names), True)
            by_input_edges.setdefault(k, []).append(e)
        for k, group in by_input_edges.items():
            _add_option(v, op.inputs[k], group, op.name, index_tables)
        for j, k in mv.inplace:
            out = graph.tensors[op.outputs[j]]
            m = IndexMap.identity(out.shape, op.inputs[k])
            e = _add_edge(v, op.outputs[j], op.inputs[k], op.name, "inplace", m, False)
            _add_option(v, op.outputs[j], [e], op.name, index_tables)
    _find_conflicts(v)
    return v


def _index_tables(graph: TensorGraph) -> set[str]:
    """Tensors that a gather reads as indices: kernels read them as plain arrays, so they stay physical."""
    out: set[str] = set()
    for op in graph.movement_ops():
        names = {f"in{k}": t for k, t in enumerate(op.inputs)} | {f"out{j}": t for j, t in enumerate(op.outputs)}
        for m in op.movement.outputs:
            out.update(names.get(t, t) for t in m.tables())
    return out


def _is_index_input(op, tgt: str, m: IndexMap) -> bool:
    # an index tensor of a gather is read by the map, never a place values live
    return any(tgt == lk.table for p in m.pieces for e in p.index for lk in e.lookups()) and \
        not any(p.target == tgt for p in m.pieces)


def _add_edge(v: VTOG, src: str, dst: str, op: str, kind: str, m: IndexMap, value: bool) -> Edge | None:
    g = v.graph
    s, d = g.tensors[src], g.tensors[dst]
    if s.physical_only:
        return None  # graph inputs and outputs are the caller's tensors
    cls, run = classify(m, d.shape, d.itemsize)
    e = Edge(len(v.edges), src, dst, op, kind, m, cls, run, run * d.itemsize, value)
    v.edges.append(e)
    v.nx.add_node(src)
    v.nx.add_node(dst)
    v.nx.add_edge(src, dst, key=e.id, cls=cls.value, op=op, kind=kind)
    return e


def _add_option(v: VTOG, tensor: str, group: list, op: str, index_tables: set[str]) -> None:
    edges = [e for e in group if e is not None]
    if not edges or len(edges) != len(group) or tensor in index_tables:
        return
    t = v.graph.tensors[tensor]
    covered = sum((e.map.covered_size() or 0) for e in edges)
    if covered != t.numel:
        return  # these edges leave part of the tensor without a home
    v.options.append(Option(len(v.options), tensor, tuple(e.id for e in edges), op))


def _find_conflicts(v: VTOG) -> None:
    for u in v.nx.nodes:
        outs = v.out_edges(u)
        for a in range(len(outs)):
            for b in range(a + 1, len(outs)):
                ea, eb = outs[a], outs[b]
                if _edges_overlap(ea, eb):
                    v.conflicts.add(frozenset((ea.id, eb.id)))
        for e in outs:
            for back in v.out_edges(e.dst):
                if back.dst == u:
                    v.conflicts.add(frozenset((e.id, back.id)))


def _edges_overlap(a: Edge, b: Edge) -> bool:
    for p in a.map.pieces:
        for q in b.map.pieces:
            if region_intersect(p.region, q.region) is not None:
                return True
    return False

"""Capture on meta tensors, op classification, and the VTOG of the Llama 3 8B decode attention block."""
import json

import pytest
import torch
from torch import nn

from experiments.workloads import build_workload
from vtcsearch.core.capture import CaptureError, capture
from vtcsearch.core.vtog import EdgeClass, build_vtog
from vtcsearch.plotting import draw_vtog


@pytest.fixture(scope="module")
def llama_block():
    w = build_workload("llama3", part="attention", phase="decode", batch=1)   # 8B sizes, meta device
    g = capture(w.model, w.example_inputs)
    return g, build_vtog(g)


def _chain_ops(g, start, names):
    """Follow single-consumer movement ops from ``start`` while their registry name is in ``names``."""
    t, seen = start, [start]
    while True:
        nxt = [c for c in g.tensors[t].consumers if g.ops[c].kind == "movement" and
               g.ops[c].movement_op is not None and g.ops[c].movement_op.name in names]
        if not nxt:
            return seen
        t = g.ops[nxt[0]].outputs[0]
        seen.append(t)


def test_capture_classifies_the_block(llama_block):
    g, _ = llama_block
    cats = {o.category for o in g.compute_ops()}
    assert {"matmul", "reduction", "pointwise"} <= cats
    mv = {o.movement_op.onnx for o in g.movement_ops() if o.movement_op}
    assert {"Split", "Reshape", "ScatterND", "Slice", "Unsqueeze", "Expand", "Transpose"} <= mv
    assert not g.unclassified
    # the KV caches are buffers the program mutates: written back, and their storage is writable
    assert len(g.mutations) == 2
    for new, buf in g.mutations.items():
        assert g.tensors[buf].kind == "buffer" and g.tensors[buf].mutable and not g.tensors[buf].read_only
    params = [t for t in g.tensors.values() if t.kind == "parameter"]
    assert all(t.read_only for t in params)
    assert sum(t.nbytes for t in params) == (4096 * 6144 + 4096 * 4096) * 2   # wqkv + wo, bf16, never allocated
    assert g.tensors[g.outputs[0]].shape == (1, 1, 4096)


def test_vtog_holds_the_papers_edges(llama_block):
    g, v = llama_block
    split = next(o for o in g.movement_ops() if o.movement_op.onnx == "Split")
    qkv = split.inputs[0]
    # Q, K and V (the Split's outputs) may be virtual over the GEMM output, and it over them
    for out in split.outputs:
        e = [e for e in v.out_edges(out) if e.dst == qkv and e.kind == "output_over_input"]
        # at batch 1 each piece is one contiguous slab of the GEMM output (its own layout
        # shifted): Type I; with more rows it is 1024-wide runs of bf16 (partially contiguous)
        assert len(e) == 1 and e[0].cls == EdgeClass.TYPE_I
        assert any(e.src == qkv and e.dst == out for e in v.in_edges(out))
    # the new K/V rows may be virtual over the cache: updates -> scatter output -> cache (in place)
    scatters = [o for o in g.movement_ops() if o.movement_op.onnx == "ScatterND"]
    assert len(scatters) == 2
    for sc in scatters:
        out, data, updates = sc.outputs[0], sc.inputs[0], sc.inputs[1]
        assert g.tensors[data].kind == "buffer"
        assert any(e.dst == out and e.kind == "input_over_output" for e in v.out_edges(updates))
        inplace = [e for e in v.out_edges(out) if e.dst == data and e.kind == "inplace"]
        assert len(inplace) == 1 and inplace[0].cls == EdgeClass.TYPE_I
        # the expanded keys/values (GQA repeat_kv) reach the cache through Slice/Unsqueeze/Expand edges
        chain = _chain_ops(g, out, {"slice_", "alias", "identity", "unsqueeze", "expand"})
        expanded = chain[-1]
        assert g.tensors[expanded].shape[-2:] == (4, 128)   # 8 kv heads x 4 query heads each
        for a, b in zip(chain[1:], chain):
            assert any(e.dst == b for e in v.out_edges(a)), f"no edge {a} -> {b}"


def test_conflict_sets_are_nonempty_where_they_must_be(llama_block):
    g, v = llama_block
    sets = v.conflict_sets()
    split = next(o for o in g.movement_ops() if o.movement_op.onnx == "Split")
    qkv = split.inputs[0]
    # the GEMM output's reshape may be virtual over the Split outputs or over the GEMM: not both
    assert any(v.edges[a].src == qkv or v.edges[b].src == qkv for pairs in sets.values() for a, b in pairs)
    for pairs in sets.values():
        for a, b in pairs:
            ea, eb = v.edges[a], v.edges[b]
            assert ea.src == eb.src or (ea.dst == eb.src and eb.dst == ea.src)
    # every tensor with two ways to be virtual has those ways in conflict
    for t in v.candidates():
        edges = [e.id for e in v.out_edges(t)]
        if len(v.options_of(t)) > 1:
            assert any(frozenset((a, b)) in v.conflicts for a in edges for b in edges if a < b)


def test_exports(llama_block, tmp_path):
    g, v = llama_block
    v.write_json(tmp_path / "vtog.json")
    data = json.loads((tmp_path / "vtog.json").read_text())
    assert len(data["edges"]) == len(v.edges) and data["conflicts"]
    # the edge class is an enum in memory and its plain value in the JSON
    assert all(type(e.cls) is EdgeClass for e in v.edges)
    assert {d["class"] for d in data["edges"]} <= {"I", "partial", "II"}
    v.write_graphml(str(tmp_path / "vtog.graphml"))
    assert (tmp_path / "vtog.graphml").stat().st_size > 1000
    draw_vtog(v, str(tmp_path / "vtog.png"), chosen=[o for o in v.options[0].edges], title="llama block")
    assert (tmp_path / "vtog.png").stat().st_size > 10_000


class _Unknown(nn.Module):
    def forward(self, x):
        return torch.linalg.qr(x)[0] + 1


def test_unknown_ops_are_compute_and_reported():
    g = capture(_Unknown(), (torch.randn(4, 4),))
    assert g.unclassified, "an op outside the registry and the compute lists must be reported"
    name = next(iter(g.unclassified))
    op = next(o for o in g.ops.values() if o.target_name == name)
    assert op.kind == "compute"


class _DataDependent(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x
        return -x


def test_untraceable_model_gets_a_clear_error():
    with pytest.raises(CaptureError, match="torch.export could not trace _DataDependent"):
        capture(_DataDependent(), (torch.randn(3),))


def test_find_cycle_is_networkx_s():
    """fusion._find_cycle (linear) returns the cycle nx.find_cycle does, so fusion splits the same groups."""
    import random

    import networkx as nx

    from vtcsearch.core.fusion import _find_cycle
    for seed in range(500):
        r = random.Random(seed)
        n = r.randint(1, 20)
        q = nx.DiGraph()
        q.add_nodes_from(r.sample(range(n), n))
        q.add_edges_from((a, b) for a, b in ((r.randrange(n), r.randrange(n)) for _ in range(r.randint(0, 3 * n)))
                         if a != b)
        try:
            ref = nx.find_cycle(q)
        except nx.NetworkXNoCycle:
            ref = None
        assert _find_cycle(q) == ref, seed


def test_ops_over_constants_are_not_fused_with_per_call_code():
    """Per-call pointwise code that reads a table made from ``arange`` (a resize's lerp weights) is one kernel:
    the table's ops (over constants only, folded at build) form kernels of their own.  Fused together, the
    region's outputs had two sizes, and it went back to one kernel per op."""
    from vtcsearch.core.graph import constant_tensors, folded

    class M(nn.Module):
        def forward(self, x):
            w = (torch.arange(16) * 0.5).sin()
            return ((x.relu() * w) + 1).exp()

    g = capture(M(), (torch.randn(2, 4, 16),))
    per_call = {o.kernel for o in g.ops.values() if o.target_name in ("relu.default", "exp.default")}
    assert len(per_call) == 1, per_call
    table = {o.kernel for o in g.ops.values() if o.target_name == "sin.default"}
    assert not table & per_call
    const = constant_tensors(g)
    assert all(folded(g, k, const) for k in table) and not any(folded(g, k, const) for k in per_call)


def test_a_copy_is_scheduled_next_to_the_kernel_that_reads_it():
    """Gathers exported together (a bicubic resize's taps) each run just before the kernel that reads them, so
    the cost model fuses each into its reader's Inductor region, as realization's regions do: exported order
    left three of four gathers a kernel away from their readers, priced as copy kernels."""
    from cost_models import AnalyticalOracle

    class M(nn.Module):
        def forward(self, x):
            y = x.relu()
            i0, i1 = torch.arange(8) // 2, (torch.arange(8) + 1) // 2 % 4
            g0, g1 = y[:, :, i0], y[:, :, i1]          # gathers, exported before both readers
            return g0.sum(-1) * g1.sum(-1)

    g = capture(M(), (torch.randn(2, 3, 4),))
    gathers = [o.name for o in g.movement_ops() if o.target_name.startswith("index")]
    assert len(gathers) == 2
    for gather in gathers:
        k = g.steps.index(gather)
        reader = g.tensors[g.ops[gather].outputs[0]].consumers[0]
        assert g.steps[k + 1] == g.ops[reader].kernel, (gather, g.steps)
    acc = AnalyticalOracle("H200", implementations=("inductor", "triton")).accounting(build_vtog(g))
    fused = {cu.op for u in acc.units if u.kind == "kernel" for cu in u.fuses}
    assert set(gathers) <= fused

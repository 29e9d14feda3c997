"""Memory planning (vtcsearch.codegen.memory): storages with disjoint lifetimes share blocks.

Sharing must never change a result: an executable that reuses memory equals one that does not, bit for
bit, on consecutive calls with new inputs (a storage whose contents must outlive a call, such as a folded
constant or a KV cache, must not be handed to another tensor), for the all-physical, random and maximal
strategies.  And it must allocate less.
"""
from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from chains import maximal, random_valid_strategy

from experiments.workloads import build_workload
from vtcsearch.codegen import memory
from vtcsearch.codegen.realize import constant_tensors, realize
from vtcsearch.core.capture import capture
from vtcsearch.core.strategy import Strategy
from vtcsearch.core.vtog import build_vtog

pytest.importorskip("triton")
pytestmark = [pytest.mark.filterwarnings("ignore::RuntimeWarning"), pytest.mark.filterwarnings("ignore::UserWarning")]


@pytest.fixture(scope="module")
def layer():
    torch.manual_seed(0)
    w = build_workload("llama3", size="tiny", part="layer", device="cpu", dtype=torch.float32)
    g = capture(w.model, w.example_inputs)
    return w, g, build_vtog(g)



def two_calls(w, g, strategy, reuse: bool):
    """Outputs and final buffers of two consecutive calls with different inputs (buffers restored after)."""
    model = w.model
    saved = {n: b.clone() for n, b in model.named_buffers()}
    exe = realize(g, strategy, model) if reuse else \
        realize(g, strategy, model, reuse_memory=False)
    results = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        inputs = [torch.randn_like(x) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                  for x in w.example_inputs]
        outs = [o.clone() for o in exe(*inputs)]
        results.append(outs + [b.clone() for _, b in sorted(model.named_buffers())])
    for n, b in model.named_buffers():
        b.copy_(saved[n])
    return exe, results


def test_only_small_constants_fold_a_big_weight_is_read_in_place():
    """A movement op of constants is copied once at build only up to ``FOLD_LIMIT_BYTES``: a transposed copy of
    every QKV weight held 1.5 GiB beside Llama 3 8B's weights.  A big weight's transpose is an ordinary movement
    op: eliminated, the GEMM reads the weight through its map and nothing of the weight's size is allocated; kept
    physical, it is a copy per call (a copy unit the cost model prices).  Both equal eager."""
    import torch.nn as nn
    from cost_models import AnalyticalOracle
    from vtcsearch.core.graph import FOLD_LIMIT_BYTES

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.small = nn.Parameter(torch.randn(8, 32), requires_grad=False)       # 1 KiB
            self.big = nn.Parameter(torch.randn(1024, 32), requires_grad=False)      # 128 KiB

        def forward(self, x):
            return (x @ self.small.t()).relu(), (x @ self.big.t()).relu()

    assert M().small.nbytes <= FOLD_LIMIT_BYTES < M().big.nbytes
    torch.manual_seed(0)
    model, x = M().eval(), torch.randn(4, 32)
    g = capture(model, (x,))
    v = build_vtog(g)
    const = constant_tensors(g)
    t_small, t_big = (next(o for o in g.ops.values() if o.kind == "movement" and o.inputs == [p]).outputs[0]
                      for p in ("p_small", "p_big"))
    assert t_small in const and t_big not in const
    copied = {u.tensors for u in AnalyticalOracle("H200").accounting(v).units if u.kind == "copy"}
    assert any(t_big in ts for ts in copied) and not any(t_small in ts for ts in copied)

    want = model(x)
    physical = realize(g, Strategy(v, set()), model)
    assert physical.folded == [g.tensors[t_small].producer]
    # the folded weight is a contiguous copy of the transpose: the library GEMM may take another kernel for it
    # than eager's on the transposed view (this machine's MKL does, torch 2.13 and 2.14), so equal up to fp32
    # rounding, not in bits
    same = lambda got: all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(got, want))  # noqa: E731
    assert same(physical(x))
    big_edges = {e.id for e in v.edges if e.src == t_big}
    assert big_edges
    virtual = realize(g, Strategy(v, big_edges).validate(), model)
    assert same(virtual(x))
    assert virtual.allocated_bytes <= physical.allocated_bytes - model.big.nbytes


def test_kernels_over_constants_fold_at_build_and_cost_nothing_per_call():
    """A bilinear resize computes its gather indices from ``arange`` (``mul``, ``floor``, ``clamp``, ...): kernels
    over constants only.  They run once at build, as a compiler folds constants (EfficientViT's 24 resizes had
    116 such kernels, each priced as a launch per call); random numbers never fold.  Every strategy's
    realization equals eager, as built and on later calls with new inputs."""
    import torch.nn as nn
    from cost_models import AnalyticalOracle
    from vtcsearch.codegen.inductor import region_ops, regions
    from vtcsearch.core.graph import folded, kernel_io

    class M(nn.Module):
        def forward(self, x):   # a 2x resize as its decomposition reads: gathers at indices made from arange
            y = (x * 3).relu()  # opens an Inductor region before the index arithmetic runs
            h, w = x.shape[-2:]
            iy = ((torch.arange(2 * h) + 0.5) / 2 - 0.5).clamp(min=0).floor().long().clamp(max=h - 1)
            ix = ((torch.arange(2 * w) + 0.5) / 2 - 0.5).clamp(min=0).floor().long().clamp(max=w - 1)
            return y[:, :, iy[:, None], ix] * 2, x.sum() + torch.rand(3)

    torch.manual_seed(0)
    model, x = M().eval(), torch.randn(1, 4, 6, 8)
    g = capture(model, (x,))
    v = build_vtog(g)
    const = constant_tensors(g)
    folds = [k for k in g.kernels() if folded(g, k, const)]
    targets = {g.ops[o].target_name for k in folds for o in g.kernels()[k]}
    assert "arange.start_step" in targets and "clamp.default" in targets, targets
    assert not any("rand" in g.ops[o].target_name for k in folds for o in g.kernels()[k])
    acc = AnalyticalOracle("H200", implementations=("triton", "inductor")).accounting(v)
    assert acc.folded_kernels == set(folds)
    assert not {u.kernel for u in acc.units if u.kind == "kernel"} & set(folds)

    made_by_folds = {t for k in folds for o in g.kernels()[k] for t in g.ops[o].outputs}
    for strategy in (Strategy(v, set()), maximal(v)):
        for impl in ({}, {k: "inductor" for k in g.groups}):
            s = Strategy(v, strategy.edges, impl).validate()
            # realization builds the runs in order, running each once: a folded kernel runs before any run that
            # reads what it makes (an open Inductor region would otherwise read its indices unwritten)
            made: set[str] = set()
            for run in regions(g, s, g.steps, const):
                reads = set(kernel_io(g, region_ops(g, run))[0])
                assert not (reads & made_by_folds) - made, run
                made |= {t for o in region_ops(g, run) for t in g.ops[o].outputs}
            exe = realize(g, s, model)
            assert set(folds) <= set(exe.folded)
            assert not {st.name for st in exe.steps} & set(folds)
            for seed in (1, 2):
                torch.manual_seed(seed)
                x = torch.randn_like(x)
                got, want = exe(x)[0], model(x)[0]
                assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), (impl, (got - want).abs().max())


def test_a_kernel_over_constants_read_by_inductor_joins_its_region_instead_of_folding():
    """Gemma 2's RMSNorm scales by ``1 + w.float()``: a kernel over constants only, folded at build, held for the
    executable's life (169 fp32 vectors, 2.4 MiB beside torch.compile's activations for whole Gemma 2 9B at bs 16,
    where torch.compile computes it in the norm's loop).  Read by a group Inductor runs, it joins that group's
    region and holds nothing; read by vtcsearch's template, it folds as before.  Both equal eager, and the memory
    model predicts the difference."""
    import torch.nn as nn
    from cost_models import AnalyticalOracle, Objective
    from solvers import get_solver
    from vtcsearch.core.graph import folded

    class Norm(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(4096) * 0.1)    # 16 KiB in fp32: under the fold limit

        def forward(self, x):
            y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
            return y * (1.0 + self.w.float())

    torch.manual_seed(0)
    model, x = Norm().eval(), torch.randn(2, 4096)
    g = capture(model, (x,))
    v = build_vtog(g)
    const = constant_tensors(g)
    (scale,) = [k for k in g.groups if folded(g, k, const)]
    held = sum(g.tensors[t].nbytes for o in g.groups[scale].ops for t in g.ops[o].outputs)
    oracle = AnalyticalOracle("H200", implementations=("triton", "inductor"))
    allocated, predicted = {}, {}
    for impl, folds in (("inductor", False), ("triton", True)):
        s = Strategy(v, set(), {k: impl for k in g.groups if k != scale}).validate()
        exe = realize(g, s, model)
        assert (scale in exe.folded) == folds, (impl, exe.folded)
        assert torch.allclose(exe(x)[0], model(x), rtol=1e-5, atol=1e-5)
        allocated[impl], predicted[impl] = exe.allocated_bytes, oracle.evaluate(s).peak_bytes
    assert allocated["inductor"] <= allocated["triton"] - held, (allocated, held)
    assert predicted["inductor"] == predicted["triton"] - held, (predicted, held)   # the memory model agrees
    # and so does the ILP's, which minimising memory puts the norm on Inductor (it counted the norm's values
    # inside its one kernel, never stored, as buffers: 64 KiB here)
    res = get_solver("ilp")(v, AnalyticalOracle("H200", implementations=("triton", "inductor"),
                                                objective=Objective.memory()))
    assert res.peak_bytes == predicted["inductor"] == oracle.accounting(v).const_bytes + res.info["model_objective"]


@pytest.mark.parametrize("which", ["none", "random", "maximal"])
def test_reuse_is_bit_identical_and_smaller(layer, which):
    w, g, v = layer
    s = {"none": lambda: Strategy(v, set()), "random": lambda: random_valid_strategy(v, random.Random(3)),
         "maximal": lambda: maximal(v)}[which]()
    shared, got = two_calls(w, g, s, reuse=True)
    own, want = two_calls(w, g, s, reuse=False)
    for call_got, call_want in zip(got, want):
        assert all(torch.equal(a, b) for a, b in zip(call_got, call_want))
    assert shared.arena.plan.ranges, "nothing was planned"
    assert shared.allocated_bytes < own.allocated_bytes


@pytest.mark.parametrize("which", ["none", "maximal"])
def test_a_dropped_executable_frees_its_memory(layer, which):
    """Kernel plans are cached for the process and shared by every executable; none may keep a dropped
    executable's storages alive (its slab, its own blocks).  Plans that kept their last launch's arguments and
    workspaces held 125 MiB of a whole Llama 3 8B decode step on the H100."""
    import gc
    import weakref
    w, g, v = layer
    s = Strategy(v, set()) if which == "none" else maximal(v)
    saved = {n: b.clone() for n, b in w.model.named_buffers()}
    exe = realize(g, s, w.model)
    exe(*w.example_inputs)
    for n, b in w.model.named_buffers():
        b.copy_(saved[n])
    state = {id(t) for t in list(w.model.parameters()) + list(w.model.buffers())}
    mine = [t for name, t in exe.storages.items() if id(t) not in state and name not in g.inputs]
    mine += [exe.arena._slab] if exe.arena._slab is not None else []
    refs = [weakref.ref(t) for t in mine]
    assert len(refs) > 3
    del exe, mine
    gc.collect()
    assert not [r for r in refs if r() is not None]


def test_plan_keeps_what_outlives_a_call(layer):
    """Parameters, the KV cache, outputs and folded constants never share; the call's inputs share from the
    first step on (the call copies them in)."""
    _, g, v = layer
    s = maximal(v)
    from vtcsearch.codegen.inductor import regions
    runs = regions(g, s, g.steps, constant_tensors(g))
    p = memory.plan(g, s, runs, ())
    copied = memory.copied_inputs(g)
    assert copied, "the layer's hidden states are a dense input"
    for t, info in g.tensors.items():
        if t in copied:
            assert p.ranges[t][0] == 0, t
        elif info.is_graph_input or info.mutable:
            assert t not in p.ranges, t   # read before this call writes it, or never written
    keep = set()
    for t in list(g.outputs) + sorted(constant_tensors(g)):
        keep |= set(s.resolve(t).targets())
    p = memory.plan(g, s, runs, keep)
    assert not keep & set(p.ranges)
    for lo, hi in p.ranges.values():
        assert 0 <= lo <= hi < len(runs)
    outs = {u for t in g.outputs for u in s.resolve(t).targets()}
    consts = {u for t in constant_tensors(g) for u in s.resolve(t).targets()}
    p = memory.plan(g, s, runs, consts, outputs=outs)
    shared = outs & set(p.ranges)
    assert shared, "the layer's output shares"
    assert all(p.ranges[u][1] == len(runs) - 1 for u in shared), "outputs live to the end of the call"


def test_a_binding_outside_the_plan_is_refused(layer, monkeypatch):
    """A planner that frees a storage too early is caught at build, not left to corrupt a result."""
    w, g, v = layer
    real = memory.plan

    def short(*a, **k):
        p = real(*a, **k)
        p.ranges = {s: (lo, lo) for s, (lo, hi) in p.ranges.items()}
        return p

    monkeypatch.setattr(memory, "plan", short)
    with pytest.raises(RuntimeError, match="memory plan"):
        realize(g, Strategy(v, set()), w.model)


def test_a_small_storage_does_not_take_a_large_free_block():
    """Blocks are not split: a small request in the only free (large) block would make the next large request
    allocate a second one.  Scratch of 4 MiB at step 0, 8 KiB at step 1, 4 MiB at step 2: one large block, and
    a small one that step 3 reuses."""
    arena = memory.Arena(torch.device("cpu"))
    for step, nbytes in enumerate((4 << 20, 8 << 10, 4 << 20, 8 << 10)):
        arena.begin(step)
        arena.take(None, (nbytes // 2,), torch.float16)
    assert arena.allocated_bytes == (4 << 20) + (8 << 10)


def test_scratch_takes_slab_bytes_no_storage_live_at_its_step_holds():
    """Scratch lives for its own step: it takes a gap of the slab that the storages live at that step (and the
    step's other scratch) leave, and only where none fits a block of its own."""
    plan = memory.Plan(ranges={"a": (0, 1), "b": (1, 2)}, sizes={"a": 4096, "b": 4096},
                       offsets={"a": 0, "b": 4096}, slab_bytes=8192)
    arena = memory.Arena(torch.device("cpu"), plan)
    arena.begin(0)
    a = arena.take("a", (1024,), torch.float32)
    s0 = arena.take(None, (1024,), torch.float32)       # b is not live yet: its bytes
    base = a.data_ptr()
    assert s0.data_ptr() == base + 4096 and arena.allocated_bytes == 8192
    s1 = arena.take(None, (1024,), torch.float32)       # the step's first scratch holds them now: a block
    assert not base <= s1.data_ptr() < base + 8192 and arena.allocated_bytes == 8192 + 4096
    arena.begin(1)
    arena.take("b", (1024,), torch.float32)
    assert arena.take(None, (16,), torch.float32).data_ptr() not in range(base, base + 8192)   # a and b live
    arena.begin(2)
    assert arena.take(None, (1024,), torch.float32).data_ptr() == base   # a is dead: its bytes
    assert arena.scratch_in_slab == 2


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 12), st.integers(0, 6), st.integers(1, 40)), min_size=1, max_size=25))
def test_placed_storages_live_together_never_overlap(items):
    """The slab's offsets: two storages whose live ranges meet never share a byte, and the slab is no larger
    than all of them side by side, nor smaller than the bytes live at the busiest step."""
    ranges = {f"s{k}": (lo, lo + span) for k, (lo, span, _) in enumerate(items)}
    sizes = {f"s{k}": 128 * n for k, (_, _, n) in enumerate(items)}
    offsets, slab = memory.place(ranges, sizes)
    names = sorted(ranges)
    for i, a in enumerate(names):
        assert 0 <= offsets[a] and offsets[a] + sizes[a] <= slab
        for b in names[i + 1:]:
            if ranges[a][0] <= ranges[b][1] and ranges[b][0] <= ranges[a][1]:
                assert offsets[a] + sizes[a] <= offsets[b] or offsets[b] + sizes[b] <= offsets[a], (a, b)
    busiest = max(sum(sizes[s] for s in names if ranges[s][0] <= k <= ranges[s][1]) for k in range(19))
    assert busiest <= slab <= sum(sizes.values())


def test_a_chain_fits_in_its_busiest_step():
    """A chain of activations, each live from its producer to its consumer, needs only the bytes of its busiest
    step."""
    sizes = {"a": 4 << 20, "b": 2 << 20, "c": 3 << 20, "d": 1 << 20}
    ranges = {"a": (0, 1), "b": (1, 2), "c": (2, 3), "d": (3, 4)}
    _, slab = memory.place(ranges, sizes)
    assert slab == max(sizes["a"] + sizes["b"], sizes["b"] + sizes["c"], sizes["c"] + sizes["d"])


def test_storages_live_together_are_separate_tensors_over_one_slab(layer):
    """Planned storages are carved from one slab, but each has a PyTorch storage of its own (Inductor treats
    arguments sharing one as aliases), and two that are live at the same step never share a byte."""
    w, g, v = layer
    exe = realize(g, Strategy(v, set()), w.model)
    p = exe.arena.plan
    live = [t for t in p.ranges if t in exe.storages]
    assert len(live) > 2
    slab = exe.arena._slab
    spans = {}
    for t in live:
        x = exe.storages[t]
        nbytes = x.numel() * x.element_size()
        assert x.untyped_storage().nbytes() == nbytes < slab.numel(), t   # its own storage, not the slab's
        spans[t] = (x.data_ptr(), x.data_ptr() + nbytes)
        assert slab.data_ptr() <= spans[t][0] and spans[t][1] <= slab.data_ptr() + slab.numel()
    for a in live:
        for b in live:
            (a0, a1), (b0, b1) = p.ranges[a], p.ranges[b]
            if a < b and a0 <= b1 and b0 <= a1:
                assert spans[a][1] <= spans[b][0] or spans[b][1] <= spans[a][0], (a, b)


def test_without_carving_each_storage_gets_its_own_memory(layer, monkeypatch):
    """Where no tensor can be carved from the slab (``carve`` gives None), each storage gets memory of its own:
    more bytes, the same answers."""
    w, g, v = layer
    s = random_valid_strategy(v, random.Random(3))
    _, want = two_calls(w, g, s, reuse=True)
    monkeypatch.setattr(memory, "carve", lambda *a: None)
    exe, got = two_calls(w, g, s, reuse=True)
    for call_got, call_want in zip(got, want):
        assert all(torch.equal(a, b) for a, b in zip(call_got, call_want))
    assert exe.allocated_bytes > exe.arena.plan.slab_bytes


@pytest.mark.gpu
def test_gpu_carved_parts_alias_the_slab_and_survive_a_cuda_graph():
    """On CUDA a carved part is a tensor over the slab's memory (through ``__cuda_array_interface__``) with its
    own storage; writes through it land in the slab, also when replayed from a CUDA graph."""
    slab = torch.zeros(1 << 20, dtype=torch.uint8, device="cuda")
    a, b = memory.carve(slab, 0, 4096), memory.carve(slab, 8192, 4096)
    assert a is not None and b is not None
    assert a.untyped_storage().nbytes() == 4096 and a.data_ptr() == slab.data_ptr()
    x = b.view(torch.float32)
    x.fill_(1.5)
    assert torch.equal(slab[8192:8192 + 4096].view(torch.float32), x)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        a.view(torch.float32).copy_(x * 2)
    g.replay()
    torch.cuda.synchronize()
    assert bool((slab[:4096].view(torch.float32) == 3.0).all())


@pytest.fixture(scope="module")
def decode_step():
    """The tiny whole decode step (its token ids are read by the embedding only), all physical, realized without
    inputs; its outputs; and a function restoring the KV cache it writes."""
    torch.manual_seed(0)
    w = build_workload("llama3", size="tiny", part="model", device="cpu", dtype=torch.float32)
    g = capture(w.model, w.example_inputs)
    s = Strategy(build_vtog(g), set())
    saved = {n: b.clone() for n, b in w.model.named_buffers()}

    def restore():
        for n, b in w.model.named_buffers():
            b.copy_(saved[n])

    exe = realize(g, s, w.model)
    want = [o.clone() for o in exe(*w.example_inputs)]
    restore()
    return w, g, s, exe, want, restore


def test_a_bound_call_copies_its_inputs_in_every_time(decode_step):
    """A dense input's bytes go to other storages after its last reader, so repeating only the steps (what a
    bare CUDA graph replay repeats) computes on overwritten inputs; :meth:`Executable.bound` (what
    ``cuda_graph(*inputs)`` captures) copies them in each time and repeats the call exactly.  The whole
    decode step: its token ids are read by the embedding only (garbage ids crashed it on the GPU)."""
    w, g, _, exe, want, restore = decode_step
    plan = exe.arena.plan
    x = memory.copied_inputs(g)[0]
    x_in = [a for a in w.example_inputs if isinstance(a, torch.Tensor)][g.inputs.index(x)]
    lo, hi = plan.offsets[x], plan.offsets[x] + plan.sizes[x]
    later = [t for t in plan.ranges if t != x and plan.ranges[t][0] > plan.ranges[x][1]
             and plan.offsets[t] < hi and lo < plan.offsets[t] + plan.sizes[t]]
    assert later, "the input's bytes are not reused here: this test would not guard anything"
    call = exe.bound(*w.example_inputs)
    for _ in range(2):
        call()
        assert all(torch.equal(a, b) for a, b in zip(exe.outputs(), want))
        restore()
    # the steps alone would read this (on the CPU, garbage token ids crash the process in the embedding)
    assert not torch.equal(exe.storages[x], x_in), "the call left its input's bytes alone"


@pytest.mark.gpu
def test_gpu_a_replay_of_a_graph_with_inputs_is_a_whole_call():
    """``cuda_graph(*inputs).replay`` (what the runner times) copies the inputs in inside the graph: replayed
    twice, the whole tiny decode step gives the call's outputs."""
    torch.manual_seed(0)
    w = build_workload("llama3", size="tiny", part="model", device="cuda", dtype=torch.float32)
    g = capture(w.model, w.example_inputs)
    saved = {n: b.clone() for n, b in w.model.named_buffers()}
    exe = realize(g, Strategy(build_vtog(g), set()), w.model)
    want = [o.clone() for o in exe(*w.example_inputs)]
    replay = exe.cuda_graph(*w.example_inputs).replay
    for _ in range(2):
        for n, b in w.model.named_buffers():
            b.copy_(saved[n])
        replay()
        torch.cuda.synchronize()
        assert all(torch.equal(a, b) for a, b in zip(exe.outputs(), want))


class _EarlyOutput(torch.nn.Module):
    """Returns a tensor computed early, next to one computed from it much later."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 32, 32) / 6)

    def forward(self, x):
        h = torch.relu(x @ self.w[0])
        y = torch.tanh(h @ self.w[1])
        y = torch.sigmoid(y @ self.w[2])
        return h, torch.relu(y @ self.w[3])


def test_an_early_output_shares_before_it_is_written_and_survives_the_call():
    """An output's storage joins the slab (live from its first write to the last step): the call still returns
    it intact although later intermediates of its size are placed after its last reader."""
    torch.manual_seed(0)
    model = _EarlyOutput()
    x = torch.randn(16, 32)
    g = capture(model, (x,))
    s = Strategy(build_vtog(g), set())
    exe = realize(g, s, model)
    h = next(iter(s.resolve(g.outputs[0]).targets()))
    assert h in exe.arena.plan.ranges, "the early output does not share: this test guards nothing"
    assert exe.arena.plan.ranges[h][1] == max(hi for _, hi in exe.arena.plan.ranges.values())
    want = model(x)
    for _ in range(2):
        got = exe(x)
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(got, want))


def test_inputs_given_at_build_are_read_in_place(decode_step):
    """``realize(inputs=...)`` (the runner's side-by-side timing) binds the caller's tensors as the input
    storages: no slab bytes and no copy for them, the steps alone repeat the call, and a call with other
    tensors is refused rather than written over the caller's."""
    w, g, s, _, want, restore = decode_step
    exe = realize(g, s, w.model, inputs=w.example_inputs)
    tensors = [a for a in w.example_inputs if isinstance(a, torch.Tensor)]
    assert exe.in_place == set(memory.copied_inputs(g)) and exe.in_place
    for t in exe.in_place:
        assert exe.storages[t] is tensors[g.inputs.index(t)] and t not in exe.arena.plan.ranges
    for _ in range(2):
        exe.run()
        assert all(torch.equal(a, b) for a, b in zip(exe.outputs(), want))
        restore()
    with pytest.raises(ValueError, match="bound"):
        exe(*[a.clone() if isinstance(a, torch.Tensor) else a for a in w.example_inputs])


def test_an_output_outlives_its_executable():
    """Storages carved from the executable's slab do not own their memory: an output the caller kept read freed
    memory once the executable was gone (new allocations overwrote it).  Each carved part now holds the slab."""
    import gc

    import torch.nn as nn

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)

        def forward(self, x):
            y = self.conv(x).relu()
            return y + y.mean(dim=1, keepdim=True)

    torch.manual_seed(0)
    m, x = M().eval(), torch.randn(2, 3, 8, 8)
    g = capture(m, (x,))
    exe = realize(g, Strategy(build_vtog(g), set()), m)
    out = exe(x)[0]
    kept = out.clone()
    assert exe.arena.plan.offsets, "the test needs storages placed in the slab"
    del exe
    gc.collect()
    junk = [torch.full((1 << 12,), 1e13) for _ in range(256)]     # what reuses freed memory writes there
    assert torch.equal(out, kept) and len(junk) == 256


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_an_inductor_region_returns_the_output_it_computes_whole(device):
    """A graph output that an Inductor region computes and nothing reads is the region's own tensor, not copied
    into the slab: an extern GEMM's product and the slab's copy of the soft-capped logits lived side by side
    (Gemma 2 9B's prefill: 4,028 MiB of activations against torch.compile's 2,028).  An output a later step
    reads still has its storage; the values equal eager's, call after call (on a GPU also replayed from the
    executable's CUDA graph), and an output kept from one call is not overwritten by the next."""
    import torch.nn as nn

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.head = nn.LayerNorm(32), nn.Linear(32, 64, bias=False)

        def forward(self, x):
            h = self.norm(x)
            logits = torch.tanh(self.head(h) / 30.0) * 30.0
            return logits, h

    torch.manual_seed(0)
    m, x = M().eval().to(device), torch.randn(8, 32, device=device)
    g = capture(m, (x,))
    logits, h = g.outputs
    # the norm on vtcsearch's template, the LM head on Inductor: the head's region reads h from its storage
    impl = {k: "triton" if any("layer_norm" in g.ops[o].target_name for o in gr.ops) else "inductor"
            for k, gr in g.groups.items()}
    assert sorted(impl.values()) == ["inductor", "triton"], impl
    exe = realize(g, Strategy(build_vtog(g), set(), impl), m)
    assert exe.returned == {logits}, exe.returned
    assert logits not in exe.arena.plan.ranges and h in exe.arena.plan.ranges
    first = exe(x)
    kept = first[0].clone()
    second = exe(x + 1)
    assert torch.allclose(first[0], kept) and first[0] is not second[0]
    for got, want in ((second, m(x + 1)), (exe(x), m(x))):
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(got, want))
    if device == "cuda":
        replay = exe.cuda_graph()
        for y in (x, x - 1):
            assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(replay(y), m(y)))
    # the same graph on vtcsearch's templates: nothing is returned, every output has its storage
    assert realize(g, Strategy(build_vtog(g), set()), m).returned == frozenset()


class _CacheWrites(torch.nn.Module):
    """Two "layers", each computing a value it writes into a buffer of its own, as a prefill writes K and V;
    the second also reads its buffer's old contents after its new value is computed."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 32, 32) / 6)
        self.register_buffer("c0", torch.randn(16, 32))
        self.register_buffer("c1", torch.randn(16, 32))

    def forward(self, x):
        k0 = x @ self.w[0]
        self.c0.copy_(k0)
        h = torch.tanh(torch.relu(k0) @ self.w[1])
        k1 = h @ self.w[2]
        old = (self.c1 * k1).sum(0)   # the old contents, read after k1 exists
        self.c1.copy_(k1)
        return torch.sigmoid((h + old) @ self.w[3])


def test_a_buffer_is_written_as_soon_as_its_value_and_its_old_readers_are_done():
    """Export puts every buffer write at the end; run there, each new value would live to the last step (a
    prefill's K and V, 16 MiB per layer of Gemma 2 9B).  The schedule runs each writeback once its value exists
    and every step that reads the old contents has run; the call still matches eager, outputs and buffers."""
    torch.manual_seed(0)
    model = _CacheWrites()
    x = torch.randn(16, 32)
    g = capture(model, (x,))
    at = {name: k for k, name in enumerate(g.steps)}
    step_of = {o: (g.ops[o].kernel or o) for o in g.ops}
    writes = {buf: next(o for o in g.ops if g.ops[o].target == "writeback" and g.mutations.get(g.ops[o].inputs[0])
                         == "b_" + buf) for buf in ("c0", "c1")}
    k0 = g.ops[writes["c0"]].inputs[0]
    assert at[writes["c0"]] == at[step_of[g.tensors[k0].producer]] + 1, "c0's write waits for no reason"
    assert at[writes["c0"]] < len(g.steps) - 3, "this test guards nothing: the write is near the end anyway"
    old_readers = [at[step_of[o]] for o in g.tensors["b_c1"].consumers if o != writes["c1"]]
    assert old_readers and at[writes["c1"]] > max(old_readers), "c1 is written before its old contents are read"
    s = Strategy(build_vtog(g), set())
    exe = realize(g, s, model)
    k0_storage = next(iter(s.resolve(k0).targets()))
    assert exe.arena.plan.ranges[k0_storage][1] < max(hi for _, hi in exe.arena.plan.ranges.values())
    saved = {n: b.clone() for n, b in model.named_buffers()}
    want = model(x)
    want_bufs = [b.clone() for _, b in sorted(model.named_buffers())]
    for n, b in model.named_buffers():
        b.copy_(saved[n])
    got = exe(x)
    got = got[0] if isinstance(got, (list, tuple)) else got
    assert torch.allclose(got, want, atol=1e-5)
    got_bufs = [b for _, b in sorted(model.named_buffers())]
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(want_bufs, got_bufs))

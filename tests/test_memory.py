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


def test_plan_keeps_what_outlives_a_call(layer):
    """Inputs, parameters, the KV cache, outputs and folded constants never share."""
    _, g, v = layer
    s = maximal(v)
    from vtcsearch.codegen.inductor import regions
    runs = regions(g, s, g.steps, constant_tensors(g))
    p = memory.plan(g, s, runs, ())
    for t, info in g.tensors.items():
        if info.is_graph_input or info.mutable:
            assert t not in p.ranges, t   # read before this call writes it, or never written
    keep = set()
    for t in list(g.outputs) + sorted(constant_tensors(g)):
        keep |= set(s.resolve(t).targets())
    p = memory.plan(g, s, runs, keep)
    assert not keep & set(p.ranges)
    for lo, hi in p.ranges.values():
        assert 0 <= lo <= hi < len(runs)


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

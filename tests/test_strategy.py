"""Strategies: planted unsafe ones are rejected by rule and tensor; sound ones run and equal eager exactly."""
import copy
import random

import pytest
import torch
from torch import nn

from chains import random_valid_strategy

from experiments.workloads import build_workload
from vtcsearch.core.capture import capture
from vtcsearch.core.interpret import StrategyInterpreter
from vtcsearch.core.mapping import IndexMap, index_vars
from vtcsearch.core.strategy import Strategy, StrategyError
from vtcsearch.core.vtog import _add_edge, build_vtog


def _option(v, tensor, op=None, kind=None):
    for o in v.options_of(tensor):
        e = v.edges[o.edges[0]]
        if (op is None or o.op == op) and (kind is None or e.kind == kind):
            return o
    raise AssertionError(f"no option for {tensor} ({op}, {kind})")


class Concat(nn.Module):
    def forward(self, a, b):
        x = a @ b
        y = a @ (b * 2)
        return torch.cat([x, y], 1) + 1


@pytest.fixture(scope="module")
def concat():
    torch.manual_seed(0)
    args = (torch.randn(4, 3), torch.randn(3, 5))
    g = capture(Concat(), args)
    return g, build_vtog(g), args


def _run(g, s, args):
    return StrategyInterpreter.for_exported(g, s)(*args)


def test_uncovered(concat):
    g, v, _ = concat
    cat = next(o for o in g.movement_ops() if o.movement_op.name == "cat")
    out_opt = _option(v, cat.outputs[0], kind="output_over_input")
    assert len(out_opt.edges) == 2
    with pytest.raises(StrategyError, match=rf"\[uncovered\] {cat.outputs[0]}"):
        Strategy(v, out_opt.edges[:1]).validate()


def test_overlap_and_cycle(concat):
    g, v, _ = concat
    cat = next(o for o in g.movement_ops() if o.movement_op.name == "cat")
    x = cat.inputs[0]
    into_out = _option(v, x, kind="input_over_output")
    out_over_in = _option(v, cat.outputs[0], kind="output_over_input")
    with pytest.raises(StrategyError, match=r"\[cycle\]"):
        Strategy.from_options(v, [into_out.id, out_over_in.id]).validate()
    # plant a second way for x to be virtual that covers the same indices
    i0, i1 = index_vars(2)
    e = _add_edge(v, x, cat.inputs[1], "planted", "input_over_output",
                  IndexMap.single(g.tensors[x].shape, cat.inputs[1], g.tensors[cat.inputs[1]].shape, [i0, i1]), True)
    v.conflicts.add(frozenset((e.id, into_out.edges[0])))
    try:
        with pytest.raises(StrategyError, match=rf"\[overlap\] {x}"):
            Strategy(v, [e.id, into_out.edges[0]]).validate()
    finally:
        _remove_edge(v, e)


def _remove_edge(v, e):
    v.nx.remove_edge(e.src, e.dst, key=e.id)
    v.conflicts = {c for c in v.conflicts if e.id not in c}
    v.edges.pop()


def test_non_injective_write(concat):
    g, v, _ = concat
    cat = next(o for o in g.movement_ops() if o.movement_op.name == "cat")
    x, out = cat.inputs[0], cat.outputs[0]
    i0, i1 = index_vars(2)
    # a buggy rule that folds two columns of x onto one column of the output
    e = _add_edge(v, x, out, "planted", "input_over_output",
                  IndexMap.single(g.tensors[x].shape, out, g.tensors[out].shape, [i0, i1 // 2]), True)
    try:
        with pytest.raises(StrategyError, match=rf"\[non-injective-write\] {x}"):
            Strategy(v, [e.id]).validate()
    finally:
        _remove_edge(v, e)


class ScatterIntoParameter(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(6, 4), requires_grad=False)

    def forward(self, a, b):
        k = a @ b
        return torch.slice_scatter(self.w, k, 0, 2, 3).sum(0)


def test_read_only_write():
    args = (torch.randn(1, 3), torch.randn(3, 4))
    g = capture(ScatterIntoParameter(), args)
    v = build_vtog(g)
    sc = next(o for o in g.movement_ops() if o.movement_op.name == "slice_scatter")
    inplace = _option(v, sc.outputs[0], kind="inplace")
    with pytest.raises(StrategyError, match=r"\[read-only-write\]"):
        Strategy.from_options(v, [inplace.id]).validate()
    # without the in-place edge the scatter is a copy into fresh storage: fine, and exact
    s = Strategy.from_options(v, [_option(v, sc.inputs[1], kind="input_over_output").id]).validate()
    assert torch.equal(_run(g, s, args)[0], g.exported.module()(*args))


class OldValueReadLater(nn.Module):
    def forward(self, a, b, c):
        data = a @ b                                  # [6, 4]
        k = c @ b                                     # [1, 4]
        new = torch.slice_scatter(data, k, 0, 2, 3)   # out-of-place update
        return new.sum(0) * data.sum(0)               # the old data is still read after the update


def test_hazard_is_rejected_and_would_really_corrupt():
    torch.manual_seed(1)
    args = (torch.randn(6, 3), torch.randn(3, 4), torch.randn(1, 3))
    g = capture(OldValueReadLater(), args)
    v = build_vtog(g)
    sc = next(o for o in g.movement_ops() if o.movement_op.name == "slice_scatter")
    new, data, k = sc.outputs[0], sc.inputs[0], sc.inputs[1]
    bad = Strategy.from_options(v, [_option(v, new, kind="inplace").id,
                                    _option(v, k, kind="input_over_output").id])
    with pytest.raises(StrategyError, match=rf"\[hazard\] {data}"):
        bad.validate()
    # executed anyway, the hazard gives a wrong answer: the rule protects something real
    interp = StrategyInterpreter.__new__(StrategyInterpreter)
    interp.graph, interp.strategy = g, bad
    interp.state = {}
    ref = g.exported.module()(*args)
    assert not torch.allclose(interp(*args)[0], ref)
    # writing the new row into fresh storage is sound
    good = Strategy.from_options(v, [_option(v, k, kind="input_over_output").id]).validate()
    assert torch.equal(_run(g, good, args)[0], ref)


def test_resolution_and_residual_copies_of_a_concat(concat):
    g, v, args = concat
    cat = next(o for o in g.movement_ops() if o.movement_op.name == "cat")
    x, y, out = cat.inputs[0], cat.inputs[1], cat.outputs[0]
    s = Strategy.from_options(v, [_option(v, x, kind="input_over_output").id]).validate()
    assert s.resolve(x).targets() == {out}
    # only the other input is still copied: partial strategies run
    (r,) = s.residuals_of(cat.name)
    assert r.src_tensor == y and r.elements == g.tensors[y].numel
    both = Strategy.from_options(v, [_option(v, x, kind="input_over_output").id,
                                     _option(v, y, kind="input_over_output").id]).validate()
    assert cat.name in both.eliminated_ops()
    for strat in (s, both):
        assert torch.equal(_run(g, strat, args)[0], g.exported.module()(*args))


def test_random_sound_strategies_on_llama_equal_eager_bit_for_bit():
    torch.manual_seed(0)
    w = build_workload("llama3", size="tiny", device="cpu", part="attention")
    g = capture(w.model, w.example_inputs)
    v = build_vtog(g)
    state0 = {k: t.clone() for k, t in g.exported.state_dict.items()}
    eager = g.exported.module()(*w.example_inputs)
    for k, t in g.exported.state_dict.items():
        t.copy_(state0[k])
    # the interpreter hands every kernel contiguous inputs, so its all-physical run is the bit-exact
    # reference; eager's BLAS on strided views rounds differently in the last bit
    ref = StrategyInterpreter.for_exported(g, Strategy(v, []))(*w.example_inputs)[0]
    torch.testing.assert_close(ref, eager, rtol=1e-5, atol=1e-6)
    ref_cache = {k: t.clone() for k, t in g.exported.state_dict.items() if "cache" in k}
    rng = random.Random(0)
    tried = valid = 0
    while valid < 6 and tried < 20:
        tried += 1
        s = random_valid_strategy(v, rng)
        if len(s.virtual) < 5:
            continue
        valid += 1
        for k, t in g.exported.state_dict.items():
            t.copy_(state0[k])
        out = StrategyInterpreter.for_exported(g, s)(*w.example_inputs)
        assert torch.equal(out[0], ref), f"strategy {sorted(s.edges)} changed the output"
        for k, t in ref_cache.items():
            assert torch.equal(g.exported.state_dict[k], t), f"KV cache {k} differs"
    assert valid >= 6


class ReadAndWriteInOneStep(nn.Module):
    def forward(self, a, b):
        data = a @ b                                  # [6, 4]
        k = data.sum(0, keepdim=True)                 # [1, 4]: one kernel reads every row of data...
        new = torch.slice_scatter(data, k, 0, 2, 3)   # ...and its result lands in row 2
        return new * 2


def test_same_step_read_and_write_is_a_hazard():
    """A kernel that writes into storage it is still reading (same step) races with itself: rejected."""
    torch.manual_seed(2)
    args = (torch.randn(6, 3), torch.randn(3, 4))
    g = capture(ReadAndWriteInOneStep(), args)
    v = build_vtog(g)
    sc = next(o for o in g.movement_ops() if o.movement_op.name == "slice_scatter")
    new, data, k = sc.outputs[0], sc.inputs[0], sc.inputs[1]
    order = g.order()
    producer = g.tensors[k].producer
    assert producer in g.tensors[data].consumers and order[producer] > order[g.tensors[data].producer]
    bad = Strategy.from_options(v, [_option(v, new, kind="inplace").id,
                                    _option(v, k, kind="input_over_output").id])
    with pytest.raises(StrategyError, match=rf"\[hazard\] {data}: read by step {order[producer]} after {k} "
                                            rf"overwrote part of {data} at step {order[producer]}"):
        bad.validate()
    # either half alone is sound
    for o in (_option(v, new, kind="inplace"), _option(v, k, kind="input_over_output")):
        s = Strategy.from_options(v, [o.id]).validate()
        assert torch.equal(_run(g, s, args)[0], g.exported.module()(*args))

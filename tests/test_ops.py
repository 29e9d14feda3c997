"""Every registry entry against eager torch: forward maps, scatter updates, inverse maps."""
import pytest
import torch

from chains import call_rule
from vtcsearch.core import ops as registry

aten = torch.ops.aten
torch.manual_seed(0)
X = torch.randn(2, 6, 4, 4)
V = torch.randn(5, 7)
IDX = torch.tensor([3, 0, 3, 1])
KV = torch.randn(1, 9, 2, 4)      # [batch, seq, kv heads, head dim]
NEW = torch.randn(1, 1, 2, 4)


def _cases():
    yield "view", aten.view.default, (X, [12, 16])
    yield "_unsafe_view", aten._unsafe_view.default, (X, [2, 96])
    yield "reshape", aten.reshape.default, (X, [4, 3, 16])
    yield "flatten", aten.flatten.using_ints, (X, 1, 2)
    yield "squeeze", aten.squeeze.dims, (X[:, :1], [1])
    yield "unsqueeze", aten.unsqueeze.default, (X, 2)
    yield "permute", aten.permute.default, (X, [3, 1, 0, 2])
    yield "transpose", aten.transpose.int, (X, 1, 3)
    yield "t", aten.t.default, (V,)
    yield "expand", aten.expand.default, (X[:, :1], [3, 2, 5, 4, 4])
    yield "repeat", aten.repeat.default, (V, [2, 1, 3])
    yield "slice", aten.slice.Tensor, (X, 1, 1, 6, 2)
    yield "narrow", aten.narrow.default, (X, 2, 1, 2)
    yield "select", aten.select.int, (X, 1, -2)
    yield "split", aten.split.Tensor, (X, 4, 1)
    yield "split_with_sizes", aten.split_with_sizes.default, (X, [1, 3, 2], 1)
    yield "chunk", aten.chunk.default, (X, 2, 3)
    yield "unbind", aten.unbind.int, (V, 1)
    yield "cat", aten.cat.default, ([X, X[:, :2] * 2, X[:, :1] + 1], 1)
    yield "stack", aten.stack.default, ([V, V * 2], 1)
    yield "index_select", aten.index_select.default, (V, 0, IDX)
    yield "embedding", aten.embedding.default, (V, IDX.view(2, 2))
    yield "gather", aten.gather.default, (V, 1, torch.randint(0, 7, (5, 3)))
    yield "index", aten.index.Tensor, (X, [None, torch.tensor([5, 0])])
    yield "index_2d", aten.index.Tensor, (X, [torch.tensor([[1], [0]]), torch.tensor([2, 3, 0])])
    yield "clone", aten.clone.default, (X,)
    yield "alias", aten.alias.default, (X,)
    yield "copy", aten.copy.default, (X, X * 3)
    yield "copy_broadcast", aten.copy.default, (X, X[:1, :1] * 3)
    yield "to_copy", aten._to_copy.default, (X,)
    yield "pad", aten.constant_pad_nd.default, (X, [1, 2, 0, 1], 0.5)
    yield "pad_crop", aten.constant_pad_nd.default, (X, [-1, 2, 1, -2], -1.0)
    yield "pixel_shuffle", aten.pixel_shuffle.default, (torch.randn(1, 8, 3, 2), 2)
    yield "pixel_unshuffle", aten.pixel_unshuffle.default, (torch.randn(1, 2, 4, 6), 2)
    yield "channel_shuffle", aten.channel_shuffle.default, (X, 3)
    yield "flip", aten.flip.default, (X, [0, 3])
    yield "upsample_nearest2d", aten.upsample_nearest2d.vec, (X, None, [2.0, 3.0])
    yield "upsample_nearest2d_size", aten.upsample_nearest2d.default, (X, [12, 4])
    yield "roll", aten.roll.default, (X, [1, -3], [1, 3])
    yield "roll_flat", aten.roll.default, (V, [4], [])
    yield "slice_scatter", aten.slice_scatter.default, (KV, NEW, 1, 6, 7)
    yield "select_scatter", aten.select_scatter.default, (KV, NEW[:, 0], 1, 3)
    yield "index_put", aten.index_put.default, (KV, [None, torch.tensor([4])], NEW)
    yield "scatter", aten.scatter.src, (V, 1, torch.tensor([[0, 3], [6, 2]]), torch.randn(2, 2))


CASES = list(_cases())


@pytest.mark.parametrize("name,target,args", CASES, ids=[c[0] for c in CASES])
def test_rule_matches_torch(name, target, args):
    out = target(*args)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    mv = call_rule(target, args, outs)
    inputs = [a for a in _flat(args) if isinstance(a, torch.Tensor)]
    named = {f"in{k}": t for k, t in enumerate(inputs)}
    for j, m in enumerate(mv.outputs):
        got = m.gather(named, tables=named)
        for u in mv.updates:
            if u.output == j:
                u.map.scatter(inputs[u.source], {f"out{j}": got}, tables=named)
        assert torch.equal(got, outs[j]), f"output {j} of {name}"
    for k, j, m in mv.inverse:
        back = m.gather({f"out{j}": outs[j]}, tables=named, check=False)
        for p in m.pieces:  # an inverse edge may cover one slab of the input (a Split's piece)
            sl = tuple(slice(lo, hi) for lo, hi in p.region)
            assert torch.equal(back[sl], inputs[k][sl]), f"inverse map of input {k} of {name}"
        assert m.is_injective() or m.has_lookup(), "an input written through an inverse map must be injective"
    for j, k in mv.inplace:
        assert outs[j].shape == inputs[k].shape


def test_rules_decline_what_is_not_data_movement():
    assert call_rule_or_none(aten._to_copy.default, (X,), X.half(), dtype=torch.float16) is None
    assert call_rule_or_none(aten.index_put.default, (KV, [None, torch.tensor([4])], NEW, True),
                             aten.index_put.default(KV, [None, torch.tensor([4])], NEW, True)) is None


def call_rule_or_none(target, args, out, **kwargs):
    from vtcsearch.core.capture import _bind
    from vtcsearch.core.ops import OpCall, TensorArg
    inputs = []

    def conv(a):
        if isinstance(a, torch.Tensor):
            inputs.append(a)
            return TensorArg(len(inputs) - 1)
        if isinstance(a, (list, tuple)):
            return type(a)(conv(x) for x in a)
        return a
    bound = _bind(target, tuple(conv(a) for a in args), kwargs)
    call = OpCall(target, bound, [tuple(t.shape) for t in inputs], [tuple(out.shape)],
                  [t.dtype for t in inputs], [out.dtype])
    return registry.lookup_op(target).rule(call)


ONNX_DATA_MOVEMENT = ["Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Expand", "Tile", "Slice", "Split",
                      "Concat", "Gather", "GatherElements", "GatherND", "ScatterND", "ScatterElements", "Pad",
                      "DepthToSpace", "SpaceToDepth", "Identity"]


def test_every_onnx_data_movement_operator_is_covered():
    covered = registry.onnx_coverage()
    assert [op for op in ONNX_DATA_MOVEMENT if op not in covered] == []


def test_every_entry_is_exercised_here():
    tested = {registry.lookup_op(t).name for _, t, _ in CASES}
    assert set(registry.REGISTRY) - tested == {"writeback"}   # capture's own op: tests/test_capture_vtog.py


def _flat(a):
    if isinstance(a, (list, tuple)):
        for x in a:
            yield from _flat(x)
    else:
        yield a


def test_nearest_upsample_is_movement_only_for_exact_integer_factors():
    """A fractional factor reads ``floor(o * r)``, not a floor-div: compute, not a registry map."""
    up = aten.upsample_nearest2d.vec
    assert call_rule_or_none(up, (X, None, [1.5, 1.5]), up(X, None, [1.5, 1.5])) is None
    assert call_rule_or_none(up, (X, [6, 6], None), up(X, [6, 6], None)) is None
    assert call_rule_or_none(up, (X, None, [7.0, 1.0]), up(X, None, [7.0, 1.0])) is not None

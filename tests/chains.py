"""Random chains of data movement ops, built through the registry, with torch's answer beside them.

Each step applies one ATen op to the current tensor in eager torch, and builds
the registry's map for the same call; composing the maps must reproduce
torch's result element for element.  Extra operands (the other inputs of a
Concat, index tensors of a Gather) become leaves of their own.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import torch

from vtcsearch.core import ops as registry
from vtcsearch.core.capture import _bind
from vtcsearch.core.mapping import IndexMap
from vtcsearch.core.ops import Movement, OpCall, TensorArg

aten = torch.ops.aten
MAX_NUMEL = 2048


@dataclass
class Chain:
    leaves: dict[str, torch.Tensor]              # physical tensors the map lands in
    tables: dict[str, torch.Tensor]              # index tensors indirect maps read
    map: IndexMap                                # the current virtual tensor -> leaves
    value: torch.Tensor                          # what torch computed for it
    steps: list[str] = field(default_factory=list)


def call_rule(target, args: tuple, out: torch.Tensor | list[torch.Tensor]) -> Movement:
    """Run the registry rule of ``target`` for this call (tensor args become TensorArg)."""
    inputs: list[torch.Tensor] = []

    def conv(a):
        if isinstance(a, torch.Tensor):
            inputs.append(a)
            return TensorArg(len(inputs) - 1)
        if isinstance(a, (list, tuple)):
            return type(a)(conv(x) for x in a)
        return a

    bound = _bind(target, tuple(conv(a) for a in args), {})
    outs = out if isinstance(out, (list, tuple)) else [out]
    call = OpCall(target, bound, [tuple(t.shape) for t in inputs], [tuple(t.shape) for t in outs],
                  [t.dtype for t in inputs], [t.dtype for t in outs])
    op = registry.lookup_op(target)
    assert op is not None, f"{target} is not registered"
    mv = op.rule(call)
    assert mv is not None, f"{target} rule declined {args!r}"
    return mv


def _rand_shape(rng: random.Random, ndim: int) -> tuple[int, ...]:
    while True:
        s = tuple(rng.randint(1, 5) for _ in range(ndim))
        if math.prod(s) <= 256:
            return s


def _factor(rng: random.Random, n: int) -> tuple[int, ...]:
    dims = []
    while n > 1 and len(dims) < 4:
        divs = [d for d in range(2, n + 1) if n % d == 0]
        d = rng.choice(divs)
        dims.append(d)
        n //= d
    if n > 1:
        dims.append(n)
    rng.shuffle(dims)
    if rng.random() < 0.3:
        dims.insert(rng.randint(0, len(dims)), 1)
    return tuple(dims) or (1,)


def random_step(rng: random.Random, x: torch.Tensor, leaf_id: int):
    """(name, torch result, target, args, output index, extra leaves, extra tables)."""
    s = tuple(x.shape)
    n = len(s)
    choices = ["reshape", "permute", "transpose", "unsqueeze", "slice", "split", "cat", "flip", "roll",
               "expand", "pad", "clone", "index_select", "gather", "index", "stack", "chunk", "repeat"]
    if n >= 1:
        choices += ["select", "narrow", "unbind"]
    if 1 in s:
        choices += ["squeeze"]
    if n == 4:
        choices += ["channel_shuffle", "pixel_shuffle", "pixel_unshuffle"]
    kind = rng.choice(choices)
    d = rng.randrange(n) if n else 0
    new = {}
    tab = {}
    if kind == "reshape" or n == 0:
        shape = _factor(rng, x.numel())
        return "reshape", x.reshape(shape), aten.view.default, (x, list(shape)), 0, new, tab
    if kind == "permute":
        perm = list(range(n))
        rng.shuffle(perm)
        return "permute", x.permute(perm), aten.permute.default, (x, perm), 0, new, tab
    if kind == "transpose":
        a, b = rng.randrange(n), rng.randrange(n)
        return "transpose", x.transpose(a, b), aten.transpose.int, (x, a, b), 0, new, tab
    if kind == "unsqueeze":
        k = rng.randint(-n - 1, n)
        return "unsqueeze", x.unsqueeze(k), aten.unsqueeze.default, (x, k), 0, new, tab
    if kind == "squeeze":
        dims = [k for k in range(n) if s[k] == 1]
        return "squeeze", x.squeeze(dims), aten.squeeze.dims, (x, dims), 0, new, tab
    if kind == "slice":
        start = rng.randint(0, s[d] - 1) if s[d] else 0
        end = rng.randint(start + 1, s[d]) if s[d] else 0
        step = rng.randint(1, 2)
        return "slice", aten.slice.Tensor(x, d, start, end, step), aten.slice.Tensor, (x, d, start, end, step), 0, \
            new, tab
    if kind == "select":
        i = rng.randint(-s[d], s[d] - 1)
        return "select", x.select(d, i), aten.select.int, (x, d, i), 0, new, tab
    if kind == "narrow":
        start = rng.randint(0, s[d] - 1)
        length = rng.randint(1, s[d] - start)
        return "narrow", x.narrow(d, start, length), aten.narrow.default, (x, d, start, length), 0, new, tab
    if kind == "split":
        sizes, left = [], s[d]
        while left:
            k = rng.randint(1, left)
            sizes.append(k)
            left -= k
        outs = list(torch.split(x, sizes, d))
        j = rng.randrange(len(outs))
        return "split", outs, aten.split_with_sizes.default, (x, sizes, d), j, new, tab
    if kind == "chunk":
        c = rng.randint(1, 3)
        outs = list(aten.chunk.default(x, c, d))
        return "chunk", outs, aten.chunk.default, (x, c, d), rng.randrange(len(outs)), new, tab
    if kind == "unbind":
        outs = list(x.unbind(d))
        return "unbind", outs, aten.unbind.int, (x, d), rng.randrange(len(outs)), new, tab
    if kind == "cat":
        other_shape = list(s)
        other_shape[d] = rng.randint(1, 3)
        if x.numel() + math.prod(other_shape) > MAX_NUMEL:
            return random_step(rng, x, leaf_id)
        o = torch.randn(other_shape)
        name = f"leaf{leaf_id}"
        new[name] = o
        parts = [x, o] if rng.random() < 0.5 else [o, x]
        return "cat", torch.cat(parts, d), aten.cat.default, (parts, d), 0, new, tab
    if kind == "stack":
        if 2 * x.numel() > MAX_NUMEL:
            return random_step(rng, x, leaf_id)
        o = torch.randn(s)
        new[f"leaf{leaf_id}"] = o
        k = rng.randint(0, n)
        parts = [x, o] if rng.random() < 0.5 else [o, x]
        return "stack", torch.stack(parts, k), aten.stack.default, (parts, k), 0, new, tab
    if kind == "flip":
        dims = rng.sample(range(n), rng.randint(1, n))
        return "flip", x.flip(dims), aten.flip.default, (x, dims), 0, new, tab
    if kind == "roll":
        if rng.random() < 0.3:
            k = rng.randint(-5, 5)
            return "roll", torch.roll(x, k), aten.roll.default, (x, [k], []), 0, new, tab
        k = rng.randint(-5, 5)
        return "roll", torch.roll(x, k, d), aten.roll.default, (x, [k], [d]), 0, new, tab
    if kind == "expand":
        shape = list(s)
        ones = [k for k in range(n) if s[k] == 1]
        if ones:
            shape[rng.choice(ones)] = rng.randint(2, 3)
        if rng.random() < 0.4:
            shape = [2] + shape
        if math.prod(shape) > MAX_NUMEL:
            return random_step(rng, x, leaf_id)
        return "expand", x.expand(shape), aten.expand.default, (x, shape), 0, new, tab
    if kind == "repeat":
        reps = [rng.randint(1, 2) for _ in range(n)] + ([2] if rng.random() < 0.3 else [])
        if x.numel() * math.prod(reps) > MAX_NUMEL:
            return random_step(rng, x, leaf_id)
        return "repeat", x.repeat(reps), aten.repeat.default, (x, reps), 0, new, tab
    if kind == "pad":
        pads = []
        for k in range(rng.randint(1, n)):
            dim = n - 1 - k
            lo = rng.randint(-(s[dim] // 2), 2)
            hi = rng.randint(-(s[dim] - max(-lo, 0) - 1) // 2 if s[dim] > 1 else 0, 2)
            pads += [lo, hi]
        out = aten.constant_pad_nd.default(x, pads, 1.5)
        if out.numel() == 0 or out.numel() > MAX_NUMEL or min(out.shape) <= 0:
            return random_step(rng, x, leaf_id)
        return "pad", out, aten.constant_pad_nd.default, (x, pads, 1.5), 0, new, tab
    if kind == "clone":
        t = rng.choice([aten.clone.default, aten.alias.default])
        return "clone", x.clone(), t, (x,), 0, new, tab
    if kind == "index_select":
        k = rng.randint(1, 4)
        idx = torch.randint(0, s[d], (k,))
        tab["in1"] = idx
        return "index_select", x.index_select(d, idx), aten.index_select.default, (x, d, idx), 0, new, tab
    if kind == "gather":
        shape = [rng.randint(1, s[k]) for k in range(n)]
        idx = torch.randint(0, s[d], shape)
        tab["in1"] = idx
        return "gather", torch.gather(x, d, idx), aten.gather.default, (x, d, idx), 0, new, tab
    if kind == "index":
        idx = torch.randint(0, s[d], (rng.randint(1, 3),))
        indices = [None] * d + [idx]
        tab["in1"] = idx
        return "index", aten.index.Tensor(x, indices), aten.index.Tensor, (x, indices), 0, new, tab
    if kind == "channel_shuffle":
        gs = [g for g in range(1, s[1] + 1) if s[1] % g == 0]
        g = rng.choice(gs)
        return "channel_shuffle", aten.channel_shuffle.default(x, g), aten.channel_shuffle.default, (x, g), 0, \
            new, tab
    if kind == "pixel_shuffle":
        r = 2
        if s[1] % (r * r):
            return random_step(rng, x, leaf_id)
        return "pixel_shuffle", aten.pixel_shuffle.default(x, r), aten.pixel_shuffle.default, (x, r), 0, new, tab
    if kind == "pixel_unshuffle":
        r = 2
        if s[2] % r or s[3] % r:
            return random_step(rng, x, leaf_id)
        return "pixel_unshuffle", aten.pixel_unshuffle.default(x, r), aten.pixel_unshuffle.default, (x, r), 0, \
            new, tab
    raise AssertionError(kind)


def random_chain(seed: int, length: int, ndim: int | None = None) -> Chain:
    rng = random.Random(seed)
    torch.manual_seed(seed)
    shape = _rand_shape(rng, ndim if ndim is not None else rng.randint(1, 4))
    x = torch.randn(shape)
    chain = Chain({"x": x}, {}, IndexMap.identity(shape, "x"), x)
    for k in range(length):
        name, out, target, args, j, new, tab = random_step(rng, chain.value, k)
        outs = out if isinstance(out, list) else [out]
        if outs[j].numel() == 0:
            break
        mv = call_rule(target, args, outs)
        tensor_args = [a for a in _flatten(args) if isinstance(a, torch.Tensor)]
        names = {}
        for pos, t in enumerate(tensor_args):
            if t is chain.value:
                names[f"in{pos}"] = "cur"
            else:
                leaf = next((n for n, v in new.items() if v is t), None)
                if leaf is None:  # an index tensor
                    leaf = f"idx{k}_{pos}"
                    chain.tables[leaf] = t
                names[f"in{pos}"] = leaf
        chain.leaves.update(new)
        m = mv.outputs[j].retarget(names).compose({"cur": chain.map})
        chain.map, chain.value = m, outs[j]
        chain.steps.append(name)
    return chain


def _flatten(a):
    if isinstance(a, (list, tuple)):
        for x in a:
            yield from _flatten(x)
    else:
        yield a


def random_valid_strategy(vtog, rng: random.Random, p: float = 0.4):
    """A random valid strategy: options taken one at a time in random order, each kept only if still valid."""
    from vtcsearch.core.strategy import Strategy
    opts: list[int] = []
    for o in rng.sample(vtog.options, len(vtog.options)):
        if rng.random() < p and all(vtog.options[k].tensor != o.tensor for k in opts) and \
                Strategy.from_options(vtog, opts + [o.id]).is_valid():
            opts.append(o.id)
    return Strategy.from_options(vtog, opts)


def maximal(v) -> "Strategy":
    """Every option taken in VTOG order, where it keeps the strategy valid: the most virtual tensors greedily."""
    from vtcsearch.core.strategy import Strategy
    edges: set[int] = set()
    for o in v.options:
        if Strategy(v, edges | set(o.edges)).is_valid():
            edges |= set(o.edges)
    return Strategy(v, edges)

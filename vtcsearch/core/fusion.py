"""Fusion: which ops one compute kernel runs, and in which order kernels run.

A compiler launches one kernel per *group* of ops, not one per ATen op.  The
groups here are the ones the kernel templates of :mod:`vtcsearch.codegen.kernels` can
run, found in this order:

``attention``
    ``bmm -> (scale, soft-cap, casts) -> [+ additive mask] -> softmax -> (casts) -> bmm`` with
    the reshapes and broadcasts between them: one FlashAttention / FlashDecoding kernel.
    A mask the graph computes from constants (a prefill's causal or sliding-window mask)
    is evaluated once at compile time; when it is provably causal / banded the kernel
    masks by index and skips fully-masked KV tiles, otherwise it reads the mask.
    Or one ``scaled_dot_product_attention`` op (kept whole by capture): its
    mask, causal flag, scale and GQA are read off the call.
``rmsnorm``
    ``x * rsqrt(mean(x^2) + eps) * w`` (with its dtype casts): one row kernel.
``layernorm``
    ``native_layer_norm`` over the last dim whose statistics nobody reads: one row kernel.
``elementwise``
    connected pointwise ops and the pure reshapes, selects, slices and stacks
    *between* them: one fused elementwise kernel (what Inductor does by inlining views).
``matmul`` / ``conv``
    the product, plus the elementwise group that reads nothing but its result
    at the same index (the epilogue).
anything else
    alone (``reduction``, ``other``).

With ``prologues=True`` (off by default) a row norm (RMSNorm or LayerNorm) then joins
the decode GEMM that reads it (:func:`merge_prologues`): a ``matmul`` group whose
``info["prologue"]`` holds the norm; the GEMM template recomputes each row's statistics
and normalises its A tiles while loading them, so the norm's output never exists in
memory.  A norm read by several GEMMs (Llama's gate and up projections) stays apart:
it is not recomputed per consumer -- unless capture merged those GEMMs first
(``capture(..., hfuse=True)``, :mod:`vtcsearch.core.hfuse`): GEMMs reading the same A with
constant weights become one GEMM over the concatenated weights, split into the original
outputs, so the norm then has one GEMM consumer and folds into it.  That rewrite happens on
the exported program, before fusion; here the merged GEMM is an ordinary ``matmul`` group
and its split an ordinary movement op (a VTOG opportunity).

Movement ops inside a group are *absorbed*: the kernel does their index
arithmetic, so they are not VTOG opportunities and never copy.  Only a movement
op whose every producer and consumer is in the same group is absorbed, so the
search keeps every choice that changes memory traffic between kernels.

Groups do not keep the export's op order (a fused group may need an op that
export placed between two of its members), so :func:`schedule` sorts them
topologically; every op of a group shares the group's step.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

import networkx as nx
import torch

from .graph import OpNode, TensorGraph, constant_tensors, kernel_io

aten = torch.ops.aten

ELEMENTWISE, ATTENTION, RMSNORM, MATMUL, CONV = "elementwise", "attention", "rmsnorm", "matmul", "conv"
LAYERNORM = "layernorm"


@dataclass
class Group:
    """One compute kernel: its kind and its ops (compute and absorbed movement), in export order."""

    name: str
    kind: str
    ops: list[str]
    info: dict[str, Any] = field(default_factory=dict)   # what the pattern found (attention: q/k/v, scale...)


# ---------------------------------------------------------------------------
# helpers over the graph
# ---------------------------------------------------------------------------

def is_pure_movement(g: "TensorGraph", op: "OpNode") -> bool:
    """A movement op a kernel can absorb: every output a plain gather of its inputs, no runtime indices."""
    if op.kind != "movement" or op.node is None or op.movement is None:
        return False
    mv = op.movement
    if mv.updates or mv.inplace or len(mv.outputs) != len(op.outputs):
        return False
    read = set()
    for m in mv.outputs:
        if m.has_lookup() or m.syms():
            return False
        read |= m.targets()
    # every tensor input is read (``copy(self, src)`` only takes self's shape: not absorbed)
    return read == {f"in{k}" for k in range(len(op.inputs))}


def _producer(g: "TensorGraph", t: str) -> "OpNode | None":
    p = g.tensors[t].producer
    return g.ops[p] if p is not None else None


def _sole_consumer(g: "TensorGraph", t: str) -> "OpNode | None":
    info = g.tensors[t]
    if len(info.consumers) != 1 or info.is_output or t in g.mutations:
        return None
    return g.ops[info.consumers[0]]


def _scalar_args(op: "OpNode") -> list[Any]:
    """The non-tensor positional arguments of an op's fx node."""
    return [a for a in op.node.args if not isinstance(a, torch.fx.Node)] if op.node is not None else []


def _is_cast(op: "OpNode") -> bool:
    return op.node is not None and op.node.target is aten._to_copy.default


def _is_identity_move(op: "OpNode") -> bool:
    return op.kind == "movement" and op.movement_op is not None and op.movement_op.name in ("identity", "to_copy")


# ---------------------------------------------------------------------------
# patterns
# ---------------------------------------------------------------------------

_SCALE_OPS = {aten.div.Tensor, aten.div.Scalar, aten.mul.Tensor, aten.mul.Scalar}


def match_attention(g: "TensorGraph", softmax: "OpNode", masks: dict | None = None) -> Group | None:
    """``bmm(q, kT) -> [view] -> [scale | softcap | cast]* -> [+ mask] -> [cast] -> softmax -> [cast] ->
    [expand/view] -> bmm(., v)``.

    An additive mask (after scale and soft-cap, as the template applies it) is an operand read through its
    map, unless :func:`classify_mask` proves the graph computes a causal / sliding-window mask from constants:
    then the kernel masks by index and skips fully-masked KV tiles, and never reads it (``info["unread"]``).
    ``masks`` caches that proof per mask tensor (one mask is shared by every layer).
    """
    if softmax.node is None or softmax.node.target is not aten._softmax.default:
        return None
    x_shape = g.tensors[softmax.inputs[0]].shape
    dim = softmax.node.args[1]
    if dim not in (-1, len(x_shape) - 1):
        return None
    pre: list["OpNode"] = []
    mask: str | None = None
    mask_shape: tuple[int, ...] = ()
    # backward to the first bmm
    t = softmax.inputs[0]
    while True:
        if _sole_consumer(g, t) is None:
            return None
        p = _producer(g, t)
        if p is None:
            return None
        if p.node is not None and p.node.target is aten.bmm.default:
            bmm1 = p
            break
        if mask is None and _is_mask_add(g, p):
            # the additive mask: the scores are the input that leads back to the first bmm
            ins = [i for i in p.inputs if _leads_to_bmm(g, i)]
            if len(ins) != 1 or g.tensors[ins[0]].shape != g.tensors[p.outputs[0]].shape:
                return None
            mask = next(i for i in p.inputs if i != ins[0])
            mask_shape = g.tensors[p.outputs[0]].shape
            pre.append(p)
            t = ins[0]
            continue
        if len(p.inputs) != 1 or not (is_pure_movement(g, p) or p.category == "pointwise"):
            return None
        if p.category == "pointwise" and not (_is_cast(p) or p.node.target in _SCALE_OPS
                                              or p.node.target is aten.tanh.default):
            return None
        pre.append(p)
        t = p.inputs[0]
    # forward to the second bmm
    t = softmax.outputs[0]
    post: list["OpNode"] = []
    while True:
        c = _sole_consumer(g, t)
        if c is None:
            return None
        if c.node is not None and c.node.target is aten.bmm.default:
            if c.inputs[0] != t or len(c.inputs) != 2:
                return None
            bmm2 = c
            break
        if len(c.inputs) != 1 or not (is_pure_movement(g, c) or _is_cast(c)):
            return None
        post.append(c)
        t = c.outputs[0]
    if len(bmm1.inputs) != 2 or bmm1.inputs[0] == bmm1.inputs[1]:
        return None
    # scale and soft-cap, read off the pointwise ops before the softmax (applied in order)
    scale, softcap, stage = 1.0, None, []
    after_mask = False
    for p in reversed(pre):
        if p.category != "pointwise" or _is_cast(p):
            continue
        if after_mask:
            return None      # the template adds the mask after scale and soft-cap: nothing may follow it
        if _is_mask_add(g, p):
            after_mask = True
            continue
        args = _scalar_args(p)
        tgt = p.node.target
        if tgt is aten.tanh.default:
            stage.append(("tanh", None))
            continue
        if len(args) != 1 or not isinstance(args[0], (int, float)):
            return None
        stage.append(("div" if tgt in (aten.div.Tensor, aten.div.Scalar) else "mul", float(args[0])))
    # accepted forms: [scale] or [scale] div(c) tanh mul(c) (Gemma 2's soft-capping)
    if len(stage) >= 3 and [s[0] for s in stage[-3:]] == ["div", "tanh", "mul"] and stage[-3][1] == stage[-1][1]:
        softcap = stage[-1][1]
        stage = stage[:-3]
    for kind, v in stage:
        if kind == "tanh":
            return None
        scale = scale / v if kind == "div" else scale * v
    # batch and heads: the scores' view right after the first bmm, when there is one
    q, kt, v, out = bmm1.inputs[0], bmm1.inputs[1], bmm2.inputs[1], bmm2.outputs[0]
    bh = g.tensors[q].shape[0]
    B, H = bh, 1
    for p in reversed(pre):
        s = g.tensors[p.outputs[0]].shape
        if len(s) == 4 and s[0] * s[1] == bh:
            B, H = s[0], s[1]
            break
    members = [bmm1] + list(reversed(pre)) + [softmax] + post + [bmm2]
    ops = [o.name for o in members]
    info = {"q": q, "kt": kt, "v": v, "out": out, "scale": scale, "softcap": softcap, "batch": B, "heads": H,
            "mask": None, "causal": False, "window": None, "unread": []}
    if mask is not None:
        if not g.tensors[mask].dtype.is_floating_point or not _broadcasts(g.tensors[mask].shape, mask_shape):
            return None
        sq, skv = g.tensors[q].shape[-2], g.tensors[v].shape[-2]
        pattern = _mask_pattern(g, mask, sq, skv, masks if masks is not None else {})
        info["mask_scores_shape"] = tuple(mask_shape)
        if pattern is None:
            info["mask"] = mask                  # read tile by tile through its map
        else:                                    # provably causal / banded: the kernel skips masked tiles
            info["causal"], info["window"] = pattern
            info["unread"] = [mask]
    return Group(bmm2.name, ATTENTION, ops, info)


def _is_mask_add(g: "TensorGraph", op: "OpNode") -> bool:
    """``add(scores, mask)`` of two tensors (alpha 1): a candidate additive attention mask."""
    n = op.node
    return n is not None and n.target is aten.add.Tensor and len(op.inputs) == 2 and op.inputs[0] != op.inputs[1] \
        and n.kwargs.get("alpha", 1) == 1 and all(isinstance(a, torch.fx.Node) for a in n.args[:2])


def _leads_to_bmm(g: "TensorGraph", t: str, depth: int = 16) -> bool:
    """Whether ``t`` is a bmm's result through single-input pointwise / pure movement ops only it reads."""
    for _ in range(depth):
        if _sole_consumer(g, t) is None:
            return False
        p = _producer(g, t)
        if p is None or p.node is None:
            return False
        if p.node.target is aten.bmm.default:
            return True
        if len(p.inputs) != 1 or not (is_pure_movement(g, p) or p.category == "pointwise"):
            return False
        t = p.inputs[0]
    return False


def _broadcasts(shape: tuple[int, ...], to: tuple[int, ...]) -> bool:
    if len(shape) > len(to):
        return False
    return all(a in (1, b) for a, b in zip(shape[::-1], to[::-1]))


_MASK_OPS = 64              # the largest in-graph mask computation evaluated at compile time
_MASK_NUMEL = 1 << 27


def constant_value(g: "TensorGraph", t: str) -> torch.Tensor | None:
    """``t``'s value when the graph computes it from nothing but constants (``full``, ``arange``, comparisons,
    ``where``, ``cat``...): evaluated once, at compile time.  None when it reads an input, a parameter or a
    buffer (its value may change between calls), or is random or too large."""
    need: set[str] = set()
    stack = [t]
    while stack:
        x = stack.pop()
        p = g.tensors[x].producer
        if p is None:
            return None
        if p in need:
            continue
        op = g.ops[p]
        n = op.node
        if n is None or len(op.outputs) != 1 or not callable(n.target) or len(need) >= _MASK_OPS \
                or torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ()) \
                or g.tensors[op.outputs[0]].numel > _MASK_NUMEL:
            return None
        need.add(p)
        stack.extend(op.inputs)
    env: dict[str, Any] = {}
    for name, op in g.ops.items():     # export order is a topological order
        if name not in need:
            continue
        missing = []

        def arg(n: torch.fx.Node) -> Any:
            if n.name not in env:
                missing.append(n.name)
                return None
            return env[n.name]

        args = torch.fx.node.map_arg(op.node.args, arg)
        kwargs = dict(torch.fx.node.map_arg(dict(op.node.kwargs), arg))
        if "device" in kwargs:      # evaluated on the CPU (a graph captured on the meta device has values too)
            kwargs["device"] = torch.device("cpu")
        if missing:
            return None
        try:
            env[op.outputs[0]] = env[op.node.name] = op.node.target(*args, **kwargs)
        except Exception:       # noqa: BLE001 - an op that cannot run here is simply not constant
            return None
    val = env.get(t)
    return val if isinstance(val, torch.Tensor) else None


def _mask_pattern(g: "TensorGraph", mask: str, sq: int, skv: int, cache: dict) -> tuple[bool, int | None] | None:
    """(causal, window) when the additive mask is provably 0 where key ``j`` is visible to query row ``i``
    (at position ``i + skv - sq``: bottom-right aligned, as with a KV cache) and ``-inf`` elsewhere, with
    ``j <= pos`` (causal) and ``pos - j < window`` (sliding window); (False, None) for an all-zero mask;
    None when it is not constant or not of that form (it is then read)."""
    if mask not in cache:
        cache[mask] = classify_mask(constant_value(g, mask), sq, skv)
    return cache[mask]


def classify_mask(m: torch.Tensor | None, sq: int, skv: int) -> tuple[bool, int | None] | None:
    """The (causal, window) pattern of a constant additive mask broadcast to [.., sq, skv] (see _mask_pattern)."""
    if m is None or sq > skv or m.dim() < 1:
        return None
    m = m.detach()
    while m.dim() > 2:
        if m.shape[0] != 1:
            return None
        m = m[0]
    if m.dim() == 1:
        m = m[None]
    if not (m.shape[0] in (1, sq) and m.shape[1] in (1, skv)):
        return None
    m = m.float().expand(sq, skv)
    vis, hid = m == 0, m == float("-inf")
    if not bool((vis | hid).all()):
        return None
    if bool(vis.all()):
        return False, None
    pos = torch.arange(sq, device=m.device)[:, None] + (skv - sq)
    j = torch.arange(skv, device=m.device)[None, :]
    window = int(vis.sum(1).max())
    window = None if window >= skv else window
    want = j <= pos
    if window is not None:
        want = want & (pos - j < window)
    return (True, window) if bool((want == vis).all()) else None


def match_sdpa(g: "TensorGraph", op: "OpNode") -> Group | None:
    """One ``aten.scaled_dot_product_attention`` call: (q, k, v[, mask]) with its scalar arguments."""
    if op.node is None or op.node.target is not aten.scaled_dot_product_attention.default:
        return None
    n = op.node
    names = ["query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale"]
    a = {k: (n.args[i] if len(n.args) > i else n.kwargs.get(k)) for i, k in enumerate(names)}
    tensors = dict(zip(["q", "k", "v"], op.inputs[:3]))
    mask = op.inputs[3] if isinstance(a["attn_mask"], torch.fx.Node) else None
    info = {"sdpa": True, **tensors, "out": op.outputs[0], "mask": mask, "dropout": float(a["dropout_p"] or 0.0),
            "causal": bool(a["is_causal"] or False), "scale": a["scale"],
            "enable_gqa": bool(n.kwargs.get("enable_gqa", n.args[7] if len(n.args) > 7 else False))}
    return Group(op.name, ATTENTION, [op.name], info)


def match_layernorm(g: "TensorGraph", op: "OpNode") -> Group | None:
    """``native_layer_norm(x, [C], w, b, eps)`` whose mean and rstd outputs are unused."""
    if op.node is None or op.node.target is not aten.native_layer_norm.default:
        return None
    n = op.node
    shape = g.tensors[op.inputs[0]].shape
    if list(n.args[1]) != [shape[-1]] or len(op.outputs) < 1:
        return None
    if any(g.tensors[t].consumers or g.tensors[t].is_output for t in op.outputs[1:]):
        return None
    w, b = n.args[2] if len(n.args) > 2 else None, n.args[3] if len(n.args) > 3 else None
    k = 1
    wt = bt = None
    if isinstance(w, torch.fx.Node):
        wt, k = op.inputs[k], k + 1
    if isinstance(b, torch.fx.Node):
        bt = op.inputs[k]
    info = {"x": op.inputs[0], "weight": wt, "bias": bt, "eps": float(n.args[4]), "out": op.outputs[0]}
    return Group(op.name, LAYERNORM, [op.name], info)


def match_rmsnorm(g: "TensorGraph", mean: "OpNode") -> Group | None:
    """``[cast] pow(x, 2) -> mean(-1, keepdim) -> add(eps) -> rsqrt -> mul(x, .) -> [cast] -> mul(., w)``."""
    if mean.node is None or mean.node.target is not aten.mean.dim:
        return None
    args = mean.node.args
    dims = args[1] if len(args) > 1 else None
    keep = args[2] if len(args) > 2 else mean.node.kwargs.get("keepdim", False)
    shape = g.tensors[mean.inputs[0]].shape
    if not keep or list(dims or []) not in ([-1], [len(shape) - 1]):
        return None
    pw = _producer(g, mean.inputs[0])
    if pw is None or pw.node is None or pw.node.target is not aten.pow.Tensor_Scalar or _scalar_args(pw) != [2]:
        return None
    if _sole_consumer(g, pw.outputs[0]) is not mean:
        return None
    x = pw.inputs[0]
    chain = [pw, mean]
    t = mean.outputs[0]
    add = _sole_consumer(g, t)
    if add is None or add.node is None or add.node.target is not aten.add.Tensor or len(add.inputs) != 1:
        return None
    eps = [a for a in _scalar_args(add) if isinstance(a, (int, float))]
    if len(eps) != 1:
        return None
    rs = _sole_consumer(g, add.outputs[0])
    if rs is None or rs.node is None or rs.node.target is not aten.rsqrt.default:
        return None
    mul = _sole_consumer(g, rs.outputs[0])
    if mul is None or mul.node is None or mul.node.target is not aten.mul.Tensor or sorted(mul.inputs) != \
            sorted([x, rs.outputs[0]]):
        return None
    chain += [add, rs, mul]
    t = mul.outputs[0]
    cast = _sole_consumer(g, t)
    if cast is not None and (_is_cast(cast) or _is_identity_move(cast)):
        chain.append(cast)
        t = cast.outputs[0]
    wmul = _sole_consumer(g, t)
    weight = None
    if wmul is not None and wmul.node is not None and wmul.node.target is aten.mul.Tensor and len(wmul.inputs) == 2:
        w = [i for i in wmul.inputs if i != t]
        if len(w) == 1 and g.tensors[w[0]].shape == (shape[-1],):
            weight = w[0]
            chain.append(wmul)
            t = wmul.outputs[0]
    # x itself may be a cast of the real input, read by nothing else; x may be read by other kernels too
    # (the residual add of a pre-norm block reads the norm's input)
    src = x
    p = _producer(g, x)
    if p is not None and (_is_cast(p) or _is_identity_move(p)) and \
            set(g.tensors[x].consumers) == {pw.name, mul.name} and not g.tensors[x].is_output:
        chain.insert(0, p)
        src = p.inputs[0]
    info = {"x": src, "weight": weight, "eps": float(eps[0]), "out": t}
    return Group(chain[-1].name, RMSNORM, [o.name for o in chain], info)


# ---------------------------------------------------------------------------
# elementwise regions
# ---------------------------------------------------------------------------

class _UF:
    def __init__(self, items: Iterable[str]):
        self.p = {x: x for x in items}

    def find(self, x: str) -> str:
        while self.p[x] != x:
            self.p[x] = self.p[self.p[x]]
            x = self.p[x]
        return x

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.p[rb] = ra


def _regions(g: "TensorGraph", free: set[str]) -> list[list[str]]:
    """Connected pointwise ops of ``free`` and the pure movement ops strictly between them."""
    pw = {o for o in free if g.ops[o].kind == "compute" and g.ops[o].category == "pointwise"
          and g.ops[o].node is not None}
    mv = {o for o in free if is_pure_movement(g, g.ops[o])
          and not any(g.tensors[t].is_output or t in g.mutations for t in g.ops[o].outputs)}
    while True:
        members = pw | mv
        uf = _UF(members)
        for o in members:
            for t in g.ops[o].inputs:
                p = g.tensors[t].producer
                if p in members:
                    uf.union(o, p)
        drop = set()
        for m in mv:
            op = g.ops[m]
            root = uf.find(m)
            for t in op.inputs:
                p = g.tensors[t].producer
                if p not in members or uf.find(p) != root:
                    drop.add(m)
            for t in op.outputs:
                if any(c not in members or uf.find(c) != root for c in g.tensors[t].consumers):
                    drop.add(m)
        if not drop:
            break
        mv -= drop
    comps: dict[str, list[str]] = {}
    for o in g.ops:          # export order inside each region
        if o in pw or o in mv:
            comps.setdefault(uf.find(o), []).append(o)
    return [c for c in comps.values() if any(o in pw for o in c)]


def region_outputs(g: "TensorGraph", ops: Iterable[str]) -> list[str]:
    """What a group of ops must write to memory (:func:`vtcsearch.core.graph.kernel_io`'s outputs)."""
    return kernel_io(g, list(ops))[1]


# ---------------------------------------------------------------------------
# the pass
# ---------------------------------------------------------------------------

def fuse_graph(g: TensorGraph, prologues: bool = False) -> None:
    """Group ``g``'s ops into kernels and order the kernels (the graph records both).

    ``prologues``: fold a row norm into the decode GEMM that consumes it (:func:`merge_prologues`)."""
    groups = fuse(g, prologues=prologues)
    g.set_kernels(groups, schedule(g, groups))


def fuse(g: "TensorGraph", prologues: bool = False) -> dict[str, Group]:
    """Group ``g``'s ops into kernels; sets ``op.kernel`` and returns the groups by name."""
    groups: dict[str, Group] = {}
    claimed: set[str] = set()
    masks: dict = {}

    def claim(gr: Group) -> None:
        groups[gr.name] = gr
        claimed.update(gr.ops)

    for op in list(g.ops.values()):
        if op.name in claimed or op.kind != "compute":
            continue
        gr = match_attention(g, op, masks) or match_rmsnorm(g, op) or match_sdpa(g, op) or match_layernorm(g, op)
        if gr is not None and not (set(gr.ops) & claimed):
            claim(gr)

    free = {o for o in g.ops if o not in claimed}
    # ops over constants only (a resize's index arithmetic) fold at build: they form regions of their own, so
    # the per-call pointwise code they feed (the resize's lerp) stays one kernel of one iteration space
    const = constant_tensors(g, by_op=True)
    folds = {o for o in free if g.ops[o].outputs and all(t in const for t in g.ops[o].outputs)}
    for ops in _regions(g, free - folds) + _regions(g, folds):
        outs = region_outputs(g, ops)
        if len({g.tensors[t].numel for t in outs}) > 1:
            # outputs of different sizes have no common iteration space: one kernel per pointwise op
            for o in ops:
                if g.ops[o].kind == "compute":
                    claim(single(g.ops[o]))
            continue
        claim(Group(ops[-1], ELEMENTWISE, ops))

    for op in g.ops.values():
        if op.name not in claimed and op.kind == "compute":
            claim(single(op))

    _merge_epilogues(g, groups)
    if prologues:
        merge_prologues(g, groups)
    _break_cycles(g, groups)
    return groups


def single(op: "OpNode") -> Group:
    """A kernel of one compute op (its kind is its category; pointwise ops are elementwise kernels)."""
    return Group(op.name, ELEMENTWISE if op.category == "pointwise" else op.category, [op.name])


def _merge_epilogues(g: "TensorGraph", groups: dict[str, Group]) -> None:
    """A matmul / conv takes the elementwise group that reads only its result, at the same index."""
    owner = {o: gr.name for gr in groups.values() for o in gr.ops}
    for gr in list(groups.values()):
        if gr.kind not in (MATMUL, CONV) or len(gr.ops) != 1:
            continue
        op = g.ops[gr.ops[0]]
        if len(op.outputs) != 1:
            continue
        t = op.outputs[0]
        info = g.tensors[t]
        if info.is_output or t in g.mutations or not info.consumers:
            continue
        homes = {owner.get(c) for c in info.consumers}
        if len(homes) != 1:
            continue
        ep = groups.get(homes.pop())
        if ep is None or ep.kind != ELEMENTWISE:
            continue
        # read at the identity index: by pointwise ops, and the region's iteration space is t's shape
        if any(g.ops[c].kind != "compute" for c in info.consumers):
            continue
        outs = region_outputs(g, ep.ops)
        if not outs or any(g.tensors[o].shape != info.shape for o in outs):
            continue
        merged = Group(ep.name, gr.kind, gr.ops + ep.ops, {"epilogue": True})
        del groups[gr.name]
        del groups[ep.name]
        groups[merged.name] = merged
        for o in merged.ops:
            owner[o] = merged.name


# ---------------------------------------------------------------------------
# prologue fusion: a row norm computed inside the decode GEMM that reads it
# ---------------------------------------------------------------------------

PROLOGUE_MAX_M = 16      # GEMM rows up to which each program recomputes the row statistics (decode)
_PROLOGUE_NORMS = (RMSNORM, LAYERNORM)
_PROLOGUE_GEMMS = {aten.mm.default: 0, aten.addmm.default: 1}      # product op -> position of A


def prologue_target(g: "TensorGraph", groups: dict[str, Group], norm: Group
                    ) -> tuple[Group | None, list[str], str]:
    """(the GEMM group that can compute ``norm`` in its prologue, the movement ops between them, why not).

    Allowed when the norm's output is read by nothing but one row-preserving chain of reshapes
    ending in the A operand [M, K] of an ``mm`` / ``addmm`` group with K the normalised dim and
    M <= :data:`PROLOGUE_MAX_M`: the norm is then not recomputed anywhere else, and its output
    never exists in memory.  Otherwise the reason is returned and the groups stay separate.
    """
    if norm.kind not in _PROLOGUE_NORMS:
        return None, [], f"no prologue for {norm.kind} kernels"
    C = g.tensors[norm.info["x"]].shape[-1]
    owner = {o: gr.name for gr in groups.values() for o in gr.ops}
    t, chain = norm.info["out"], []
    while True:
        info = g.tensors[t]
        if info.is_output or t in g.mutations:
            return None, [], f"the norm output {t} is a graph output (it must exist in memory)"
        if len(info.consumers) != 1:
            return None, [], f"the norm output {t} has {len(info.consumers)} consumers (they need it in memory)"
        c = g.ops[info.consumers[0]]
        if c.kind == "compute":
            break
        if not is_pure_movement(g, c) or c.name in owner or len(c.outputs) != 1 or \
                c.movement_op is None or c.movement_op.name not in ("reshape", "identity"):
            return None, [], f"the GEMM reads the norm output through {c.name} " \
                f"({c.movement_op.name if c.movement_op else c.kind}), not a row-preserving reshape"
        chain.append(c.name)
        t = c.outputs[0]
    gr = groups.get(owner.get(c.name, ""))
    pos = _PROLOGUE_GEMMS.get(c.node.target) if c.node is not None else None
    if gr is None or gr.kind != MATMUL or pos is None or gr.ops[0] != c.name or "prologue" in gr.info:
        return None, [], f"the norm output is read by {c.name} ({c.target_name}), not a GEMM's A operand"
    if c.inputs[pos] != t or t in c.inputs[pos + 1:]:
        return None, [], f"the norm output is not (only) {c.name}'s A operand"
    M, K = g.tensors[t].shape[-2:] if len(g.tensors[t].shape) == 2 else (None, None)
    if K != C:
        return None, [], f"the GEMM's A {g.tensors[t].shape} does not read the normalised rows along K"
    if M > PROLOGUE_MAX_M:
        return None, [], f"M = {M} > {PROLOGUE_MAX_M}: recomputing the statistics per program would not pay"
    return gr, chain, ""


def merge_prologues(g: "TensorGraph", groups: dict[str, Group]) -> dict[str, str]:
    """Fold each row norm into the GEMM group that reads it, where :func:`prologue_target` allows.

    The merged group is a ``matmul`` group (named as the GEMM group) whose ``info["prologue"]``
    holds the norm's parameters and ops; returns why each norm that was not folded stays apart."""
    refused: dict[str, str] = {}
    order = {o: k for k, o in enumerate(g.ops)}
    for norm in [gr for gr in groups.values() if gr.kind in (RMSNORM, LAYERNORM)]:
        gemm, chain, why = prologue_target(g, groups, norm)
        if gemm is None:
            refused[norm.name] = why
            continue
        a = g.ops[gemm.ops[0]].inputs[_PROLOGUE_GEMMS[g.ops[gemm.ops[0]].node.target]]
        pro = {"kind": norm.kind, **norm.info, "a": a, "ops": list(norm.ops) + chain, "product": gemm.ops[0]}
        ops = sorted(norm.ops + chain + gemm.ops, key=order.__getitem__)
        del groups[norm.name]
        groups[gemm.name] = Group(gemm.name, MATMUL, ops, {**gemm.info, "prologue": pro})
    return refused


def without_prologue(group: Group) -> Group:
    """The GEMM (+ epilogue) part of a group with a fused prologue: its product op first, as unfused."""
    pro = group.info.get("prologue")
    if pro is None:
        return group
    ops = [o for o in group.ops if o not in pro["ops"]]
    k = ops.index(pro["product"])
    return Group(group.name, group.kind, [ops[k]] + ops[:k] + ops[k + 1:],
                 {k2: v for k2, v in group.info.items() if k2 != "prologue"})


def _quotient(g: "TensorGraph", groups: dict[str, Group]) -> tuple[nx.DiGraph, dict[str, str]]:
    """Steps (groups and unabsorbed movement ops) and their data dependences."""
    owner = {o: name for name, gr in groups.items() for o in gr.ops}
    for o in g.ops:
        owner.setdefault(o, o)
    q = nx.DiGraph()
    q.add_nodes_from(dict.fromkeys(owner[o] for o in g.ops))
    for o, op in g.ops.items():
        for t in op.inputs:
            p = g.tensors[t].producer
            if p is not None and owner[p] != owner[o]:
                q.add_edge(owner[p], owner[o])
    return q, owner


def _break_cycles(g: "TensorGraph", groups: dict[str, Group]) -> None:
    """Split any elementwise group that would make the kernel graph cyclic (it reads its own result
    through another kernel) back into one kernel per pointwise op."""
    while True:
        q, owner = _quotient(g, groups)
        cyc = _find_cycle(q)
        if cyc is None:
            return
        bad = next((n for n, _ in cyc if n in groups and len(groups[n].ops) > 1), None)
        if bad is None:  # pragma: no cover - single-op steps cannot form a cycle in an exported graph
            raise RuntimeError(f"cyclic kernel graph: {cyc}")
        for o in groups.pop(bad).ops:
            if g.ops[o].kind == "compute":
                groups[o] = single(g.ops[o])


def _find_cycle(q: nx.DiGraph) -> list[tuple[str, str]] | None:
    """The cycle ``nx.find_cycle(q)`` returns (None when acyclic), in linear time.

    networkx restarts its edge DFS from every node and walks again into nodes
    already explored (only to skip their edges), which is quadratic: 43 calls
    took ~4 s on the 2,000-node synthetic VTOG.  This is the same DFS (nodes
    and successors in insertion order, the same active path) pruned at
    explored nodes, so it finds the same cycle and splits the same groups.
    """
    if nx.is_directed_acyclic_graph(q):
        return None
    explored: set = set()
    succ = q._succ
    for start in q:
        if start in explored:
            continue
        path: list[tuple[str, str]] = []        # edges of the active path
        active = {start}
        seen = {start}
        stack = [(start, iter(succ[start]))]
        while stack:
            node, it = stack[-1]
            head = next(it, None)
            if head is None:
                stack.pop()
                if path:
                    active.discard(path.pop()[1])
                continue
            if head in explored:
                continue
            path.append((node, head))
            if head in active:
                k = next(i for i, (t, _) in enumerate(path) if t == head)
                return path[k:]
            if head in seen:                     # reached before in this DFS, not on the path: no new cycle
                path.pop()
                continue
            seen.add(head)
            active.add(head)
            stack.append((head, iter(succ[head])))
        explored |= seen
    return None  # pragma: no cover - not a DAG, so the DFS finds a cycle


def schedule(g: "TensorGraph", groups: dict[str, Group]) -> list[str]:
    """Steps in an order that respects every dependence, as close to export order as possible, except that a
    movement op that does not shrink what it reads runs just before the first step that reads it.  The copy then
    sits next to the kernel that reads it, so an Inductor region holds both (a bicubic resize's gathers, exported
    together, each beside its own lerp term), and its output lives no longer than it must.  A slice stays where
    it was exported: run late, it would keep the larger tensor it reads alive until then.  A buffer's writeback
    runs as soon as its value and the readers of the buffer's old contents allow
    (:func:`_writebacks_after_old_readers`)."""
    q, owner = _quotient(g, groups)
    first = {}
    for k, o in enumerate(g.ops):
        first.setdefault(owner[o], k)

    def sinks(n: str) -> bool:
        op = g.ops[n]
        return n not in groups and sum(g.tensors[t].nbytes for t in op.outputs) >= \
            sum(g.tensors[t].nbytes for t in op.inputs)

    early = _writebacks_after_old_readers(g, q, owner)
    key: dict[str, tuple[int, int]] = {}
    for n in reversed(list(nx.topological_sort(q))):
        later = [key[c] for c in q.successors(n)]
        key[n] = (-1, 0) if n in early else \
            (min(later)[0], min(later)[1] - 1) if later and sinks(n) else (first[n], 0)
    return list(nx.lexicographical_topological_sort(q, key=lambda n: key[n]))


def _writebacks_after_old_readers(g: "TensorGraph", q: nx.DiGraph, owner: dict[str, str]) -> set[str]:
    """Each buffer's writeback, as a step of its own, made to follow every step that reads the buffer's old
    contents, directly or through any movement op's output (whether that is a copy is the strategy's choice):
    an edge in ``q`` for each.  Returned: those writebacks, which the schedule then runs as soon as they may.
    A writeback is a sink (what it writes is read by no step), so no such edge closes a cycle.

    Export puts every buffer mutation at the end of the program, so a new value (a prefill's K and V) lived
    from its producer to the last step (each layer's V, 16 MiB, in a Gemma 2 9B prefill of 4096 tokens), where
    torch.compile writes each as soon as it is computed."""
    out: set[str] = set()
    for new_value, buffer in g.mutations.items():
        w = next((o for o in g.tensors[new_value].consumers if g.ops[o].target == "writeback"), None)
        if w is None or owner[w] != w:
            continue
        seen, todo = {buffer}, [buffer]
        while todo:
            for r in g.tensors[todo.pop()].consumers:
                if r == w:
                    continue
                q.add_edge(owner[r], w)
                if g.ops[r].kind == "movement" and owner[r] == r:
                    todo += [t for t in g.ops[r].outputs if t not in seen]
                    seen.update(g.ops[r].outputs)
        out.add(w)
    return out

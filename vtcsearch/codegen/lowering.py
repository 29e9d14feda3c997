"""Lowering: one kernel group of the graph -> launches of kernel templates, every operand through its map.

One decorated function per group kind (as TorchInductor registers one lowering
per op).  A lowering receives a :class:`Context` that turns any graph tensor
into a :class:`~vtcsearch.codegen.kernels.Operand` (its resolved map over the
strategy's physical storages) and calls templates of :mod:`vtcsearch.codegen.kernels`;
it never writes address arithmetic itself.  Calling a template compiles,
autotunes and launches it once; the lowering returns the :class:`Launch` that
replays exactly those kernels with the same arguments.

A lowering that cannot express a group raises :class:`Unsupported`; the group
then runs as its ATen ops (:func:`lower_aten`) on inputs read through the maps:
slower, never wrong.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from .elementwise import Unsupported, compile_region, round_to
from ..core import implementation as im
from ..core.fusion import (ATTENTION, CONV, ELEMENTWISE, LAYERNORM, MATMUL, RMSNORM, Group, region_outputs,
                           without_prologue)
from ..core.graph import kernel_io
from .kernels import (ConvEpilogue, Epilogue, Operand, RowNorm, attention, avg_pool2d, conv2d, copy, gemm,
                      global_avg_pool2d, layernorm, max_pool2d, pointwise, rmsnorm, softmax)
from .kernels.conv import out_size
from .kernels.codecache import Plan

if TYPE_CHECKING:
    from ..core.graph import OpNode, TensorGraph
    from ..core.mapping import IndexMap

aten = torch.ops.aten

__all__ = ["LOWERINGS", "Context", "Launch", "Unsupported", "lower", "lower_aten", "lowering"]


@dataclass
class Launch:
    """What one step runs: kernel plans with their bound arguments, or a Python function (fallbacks)."""

    name: str
    kind: str                                   # the lowering that made it ("gemm", "attention", "aten", ...)
    plans: list[tuple[Plan, list]] = field(default_factory=list)
    fn: Callable[[], None] | None = None
    note: str = ""                              # why a fallback was taken

    def __call__(self) -> None:
        for plan, args in self.plans:
            plan.run(args)
        if self.fn is not None:
            self.fn()

    @property
    def kernels(self) -> int:
        """Kernels launched per call (a fallback's are counted by the profiler, not here)."""
        return sum(p.kernels for p, _ in self.plans)

    @staticmethod
    def of(name: str, kind: str, plans: Plan | Sequence[Plan] | None) -> "Launch":
        """Bind the plans' last arguments now, taking them from the plans (a cached plan is shared by identical
        kernels, and must not keep this step's storages alive)."""
        if plans is None:
            plans = []
        elif isinstance(plans, Plan):
            plans = [plans]
        taken: dict[int, list] = {}
        for p in plans:
            if id(p) not in taken:
                taken[id(p)] = p.take_args()
        return Launch(name, kind, [(p, taken[id(p)]) for p in plans])


class Context:
    """What a lowering may ask: the graph, operands over the storages, scratch memory, and a tensor's resolved
    map without its storages (``operand`` allocates every storage the map reads; ``resolve`` allocates nothing,
    for a question about a tensor that may never be materialised)."""

    def __init__(self, graph: "TensorGraph", operand: Callable[[str], Operand],
                 scratch: Callable[[Sequence[int], torch.dtype], torch.Tensor], device: torch.device,
                 resolve: Callable[[str], "IndexMap"], returned: frozenset[str] = frozenset(),
                 bind: Callable[[str, torch.Tensor], None] | None = None):
        """``returned``: graph outputs an Inductor region returns as its own tensors (no storage of the
        executable's; :func:`vtcsearch.codegen.inductor.returned_outputs`), handed to ``bind`` at each call."""
        self.graph, self.operand, self.scratch, self.device = graph, operand, scratch, device
        self.resolve = resolve
        self.returned, self.bind = returned, bind

    def dense(self, shape: Sequence[int], dtype: torch.dtype, name: str = "tmp") -> Operand:
        return Operand.dense(self.scratch(shape, dtype), name)


Lowering = Callable[[Context, Group], Launch]
LOWERINGS: dict[str, Lowering] = {}


def lowering(*kinds: str) -> Callable[[Lowering], Lowering]:
    """Register ``fn(ctx, group) -> Launch`` for group kinds."""
    def deco(fn: Lowering) -> Lowering:
        for k in kinds:
            LOWERINGS[k] = fn
        return fn
    return deco


def lower(ctx: Context, group: Group) -> Launch:
    """The group's kernels, or its ATen ops when no template can run it."""
    fn = LOWERINGS.get(group.kind)
    if fn is not None:
        try:
            return fn(ctx, group)
        except Unsupported as e:
            return lower_aten(ctx, group, note=str(e))
    return lower_aten(ctx, group, note=f"no lowering for {group.kind!r} kernels")


# ---------------------------------------------------------------------------
# elementwise regions
# ---------------------------------------------------------------------------

def _region_operands(ctx: Context, rc) -> tuple[list[Operand], list[Operand]]:
    ins = [ctx.operand(leaf.tensor).view(rc.shape, leaf.index) for leaf in rc.leaves]
    outs = []
    for t, _ in rc.outputs:
        op = ctx.operand(t)
        outs.append(op if op.shape == rc.shape else op.reshape(rc.shape))
    return ins, outs


@lowering(ELEMENTWISE)
def lower_elementwise(ctx: Context, group: Group) -> Launch:
    g = ctx.graph
    rc = compile_region(g, group.ops, region_outputs(g, group.ops))
    ins, outs = _region_operands(ctx, rc)
    return Launch.of(group.name, "pointwise", pointwise(rc.results, ins, outs, prelude=rc.lines))


# ---------------------------------------------------------------------------
# matmul (+ epilogue)
# ---------------------------------------------------------------------------

def _scalar(node: torch.fx.Node, name: str, pos: int, default: float) -> float:
    v = node.kwargs.get(name, node.args[pos] if len(node.args) > pos else default)
    return float(v)


def _epilogue_region(ctx: Context, group: Group, t: str) -> tuple[str, list[str], str | None, list[Operand]]:
    """The elementwise ops after a product ``t`` as epilogue code: (tensor stored, lines, expr, operands).

    ``y`` is the fp32 result of the product; it is rounded to ``t``'s dtype first (``y_r``),
    as eager stores ``t`` before the next op reads it.
    """
    g = ctx.graph
    if len(group.ops) == 1:
        return t, [], None, []
    ep_ops = group.ops[1:]
    outs = region_outputs(g, ep_ops)
    if len(outs) != 1:
        raise Unsupported("an epilogue with several outputs")
    rc = compile_region(g, ep_ops, outs, prefix="ep", special={t: "y_r"}, shape=g.tensors[t].shape)
    ins, _ = _region_operands(ctx, rc)
    return outs[0], [f"y_r = {round_to(g.tensors[t].dtype, 'y')}"] + rc.lines, rc.results[0], ins


def _prologue(ctx: Context, pro: dict, a: str) -> tuple[Operand, RowNorm]:
    """A fused row norm (:func:`vtcsearch.core.fusion.merge_prologues`): the GEMM reads the norm's input
    as A (its rows reshaped to A's [M, K]) and normalises each tile as the unfused kernel stores it."""
    g = ctx.graph
    if pro["kind"] not in (RMSNORM, LAYERNORM):
        raise Unsupported(f"no GEMM prologue for {pro['kind']}")
    x = ctx.operand(pro["x"])
    shape = g.tensors[a].shape
    x = x if x.shape == shape else x.reshape(shape)
    w = ctx.operand(pro["weight"]) if pro["weight"] is not None else None
    dt = g.tensors[pro["out"]].dtype
    rnd = f"a = {round_to(dt, 'a')}" if dt != torch.float32 else ""
    b = ctx.operand(pro["bias"]) if pro.get("bias") is not None else None
    return x, RowNorm(w, float(pro["eps"]), rnd, kind=pro["kind"], bias=b)


@lowering(MATMUL)
def lower_matmul(ctx: Context, group: Group) -> Launch:
    g = ctx.graph
    pro = group.info.get("prologue")
    group = without_prologue(group)
    op = g.ops[group.ops[0]]
    node = op.node
    tgt = node.target
    ep = Epilogue()
    if tgt in (aten.mm.default, aten.bmm.default):
        a, b = op.inputs[0], op.inputs[1]
    elif tgt is aten.addmm.default:
        if _scalar(node, "beta", 3, 1.0) != 1.0 or _scalar(node, "alpha", 4, 1.0) != 1.0:
            raise Unsupported("addmm with beta/alpha")
        bias, a, b = op.inputs
        ep.bias = ctx.operand(bias)
    else:
        raise Unsupported(f"no GEMM template for {op.target_name}")
    t = op.outputs[0]
    if ep.bias is not None and len(group.ops) > 1 and g.tensors[t].dtype != torch.float32:
        raise Unsupported("addmm with a low-precision epilogue")  # its bias is added before rounding
    out_t, ep.lines, ep.expr, ep.operands = _epilogue_region(ctx, group, t)
    out = ctx.operand(out_t)
    tshape = g.tensors[t].shape
    if out.shape != tshape:
        out = out.reshape(tshape)
    if pro is not None:
        a_op, rn = _prologue(ctx, pro, a)
        return Launch.of(group.name, "gemm", gemm(a_op, ctx.operand(b), out, ep, prologue=rn))
    return Launch.of(group.name, "gemm", gemm(ctx.operand(a), ctx.operand(b), out, ep))


# ---------------------------------------------------------------------------
# attention, norms, softmax
# ---------------------------------------------------------------------------

def _lower_sdpa(ctx: Context, group: Group) -> Launch:
    """One ``scaled_dot_product_attention`` op: q/k/v [B, H, S, D]; GQA when K/V have fewer heads."""
    info = group.info
    if info["dropout"]:
        raise Unsupported("scaled_dot_product_attention with dropout")
    q, k, v, out = (ctx.operand(info[n]) for n in ("q", "k", "v", "out"))
    if any(len(o.shape) != 4 for o in (q, k, v, out)):
        raise Unsupported(f"scaled_dot_product_attention on {len(q.shape)}-d operands (the template is 4-d)")
    if k.shape[1] != q.shape[1] and not info["enable_gqa"]:
        raise Unsupported("scaled_dot_product_attention with fewer KV heads and enable_gqa=False")
    if k.shape[0] != q.shape[0]:
        raise Unsupported("scaled_dot_product_attention with a broadcast batch")
    sq, skv = q.shape[2], k.shape[2]
    if info["causal"] and sq != skv:
        # SDPA's is_causal is top-left aligned; the template's bottom-right (a KV cache): equal only when square
        raise Unsupported("scaled_dot_product_attention is_causal with Sq != Skv")
    mask = ctx.operand(info["mask"]) if info["mask"] is not None else None
    if mask is not None and (mask.ndim > 4 or mask.shape[-1] != skv):
        raise Unsupported(f"scaled_dot_product_attention with an attn_mask of shape {mask.shape}")
    if mask is not None and mask.ndim < 4:
        mask = mask.reshape((1,) * (4 - mask.ndim) + tuple(mask.shape))
    return Launch.of(group.name, "attention", attention(q, k, v, out, scale=info["scale"], causal=info["causal"],
                                                        mask=mask))


@lowering(ATTENTION)
def lower_attention(ctx: Context, group: Group) -> Launch:
    info = group.info
    if info.get("sdpa"):
        return _lower_sdpa(ctx, group)
    if "batch" not in info:
        raise Unsupported(f"no attention template for {ctx.graph.ops[group.ops[0]].target_name}")
    B, H = info["batch"], info["heads"]
    q = ctx.operand(info["q"])          # [B*H, Sq, D]
    kt = ctx.operand(info["kt"])        # [B*H, D, Skv]
    v = ctx.operand(info["v"])          # [B*H, Skv, Dv]
    out = ctx.operand(info["out"])      # [B*H, Sq, Dv]
    BH, SQ, D = q.shape
    SKV, DV = v.shape[1], v.shape[2]
    mask = None
    if info.get("mask") is not None:    # an additive mask, read through its map at the scores' index
        mask = ctx.operand(info["mask"])
        shape = tuple(info["mask_scores_shape"])
        if mask.ndim < len(shape):
            mask = mask.reshape((1,) * (len(shape) - mask.ndim) + tuple(mask.shape))
        if len(shape) == 4 and shape[:2] == (B, H):
            pass
        elif len(shape) == 3 and all(s == 1 for s in mask.shape[:1]):
            mask = mask.reshape((1,) + tuple(mask.shape))
        elif len(shape) == 3:
            mask = mask.broadcast_to(shape).reshape((B, H) + shape[1:])
        else:
            raise Unsupported(f"attention mask added to scores of shape {shape}")
    plans = attention(q.reshape((B, H, SQ, D)), kt.permute((0, 2, 1)).reshape((B, H, SKV, D)),
                      v.reshape((B, H, SKV, DV)), out.reshape((B, H, SQ, DV)),
                      scale=info["scale"], softcap=info["softcap"], causal=info.get("causal", False),
                      window=info.get("window"), mask=mask)
    return Launch.of(group.name, "attention", plans)


@lowering(RMSNORM)
def lower_rmsnorm(ctx: Context, group: Group) -> Launch:
    info = group.info
    w = ctx.operand(info["weight"]) if info["weight"] is not None else None
    return Launch.of(group.name, "rmsnorm", rmsnorm(ctx.operand(info["x"]), w, ctx.operand(info["out"]),
                                                    eps=info["eps"]))


@lowering(LAYERNORM)
def lower_layernorm(ctx: Context, group: Group) -> Launch:
    info = group.info
    w = ctx.operand(info["weight"]) if info["weight"] is not None else None
    b = ctx.operand(info["bias"]) if info["bias"] is not None else None
    return Launch.of(group.name, "layernorm", layernorm(ctx.operand(info["x"]), w, b, ctx.operand(info["out"]),
                                                       eps=info["eps"]))


@lowering("reduction")
def lower_reduction(ctx: Context, group: Group) -> Launch:
    g = ctx.graph
    op = g.ops[group.ops[0]]
    if len(group.ops) == 1 and _is_spatial_mean(g, op):   # a CNN's global pool, x.mean([2, 3])
        return Launch.of(group.name, "global_avg_pool2d",
                         global_avg_pool2d(ctx.operand(op.inputs[0]), ctx.operand(op.outputs[0])))
    if len(group.ops) != 1 or op.node.target is not aten._softmax.default:
        raise Unsupported(f"no template for {op.target_name}")
    x = op.inputs[0]
    if op.node.args[1] not in (-1, len(g.tensors[x].shape) - 1):
        raise Unsupported("softmax over a dim other than the last")
    return Launch.of(group.name, "softmax", softmax(ctx.operand(x), ctx.operand(op.outputs[0])))


# ---------------------------------------------------------------------------
# the fallback: ATen ops on inputs read through their maps
# ---------------------------------------------------------------------------

def strided_view(op: Operand) -> torch.Tensor | None:
    """The operand as a plain strided view of its storage, when its map is one (else None)."""
    if op.syms or op.tables or len(op.map.pieces) != 1 or op.map.pieces[0].target is None:
        return None
    target = op.map.pieces[0].target
    layout = im.strided_layout(op.map, {target: tuple(op.storage_strides(target))})
    if layout is None:
        return None
    strides, offset = layout
    base = op.tensors[target]
    return base.as_strided(op.map.shape, strides, base.storage_offset() + offset)


def lower_aten(ctx: Context, group: Group, note: str = "") -> Launch:
    """Run the group's ATen ops: inputs read through their maps, outputs written through theirs."""
    g = ctx.graph
    ins, outs = kernel_io(g, group.ops)
    reads: list[tuple[str, Callable[[], torch.Tensor]]] = []
    for t in ins:
        op = ctx.operand(t)
        view = strided_view(op)
        if view is not None:
            reads.append((t, lambda v=view: v))
        else:
            tmp = ctx.scratch(op.shape, g.tensors[t].dtype)
            gather = Launch.of(t, "copy", copy(Operand.dense(tmp, "tmp"), op))
            reads.append((t, lambda gather=gather, tmp=tmp: (gather(), tmp)[1]))
    writes: list[tuple[str, Callable[[torch.Tensor], None]]] = []
    for t in outs:
        op = ctx.operand(t)
        view = strided_view(op)
        if view is not None:
            writes.append((t, lambda val, v=view: v.copy_(val)))
        else:
            tmp = ctx.scratch(op.shape, g.tensors[t].dtype)
            scatter = Launch.of(t, "copy", copy(op, Operand.dense(tmp, "tmp")))   # run later writes over it

            def write(val, tmp=tmp, scatter=scatter):
                tmp.copy_(val)
                scatter()
            writes.append((t, write))
    nodes = [(g.ops[o].node, g.ops[o].outputs) for o in group.ops]
    if any(n is None for n, _ in nodes):
        raise RuntimeError(f"kernel {group.name} has an op without an fx node")

    def run() -> None:
        env = {t: r() for t, r in reads}
        for node, outs_ in nodes:
            args = substitute(node.args, env, ctx.device)
            kwargs = substitute(dict(node.kwargs), env, ctx.device)
            res = node.target(*args, **kwargs)
            vals = [r for r in res if isinstance(r, torch.Tensor)] if isinstance(res, (tuple, list)) else [res]
            for name, val in zip(outs_, vals):
                env[name] = val
        for t, w in writes:
            w(env[t])

    return Launch(group.name, "aten", [], run, note)


def substitute(a: Any, env: dict[str, torch.Tensor], dev: torch.device) -> Any:
    """An fx node's argument with tensor nodes replaced by values from ``env`` and devices by ``dev``."""
    if isinstance(a, torch.fx.Node):
        if a.name not in env:
            raise KeyError(f"kernel input {a.name} not available")
        return env[a.name]
    if isinstance(a, torch.device):
        return dev
    if isinstance(a, tuple):
        return tuple(substitute(x, env, dev) for x in a)
    if isinstance(a, list):
        return [substitute(x, env, dev) for x in a]
    if isinstance(a, dict):
        return {k: substitute(v, env, dev) for k, v in a.items()}
    return a


# ---------------------------------------------------------------------------
# convolution (+ epilogue)
# ---------------------------------------------------------------------------

def _arg(node: torch.fx.Node, pos: int, name: str, default: Any) -> Any:
    """An fx node's argument by position, else by keyword, else the schema default."""
    return node.args[pos] if len(node.args) > pos else node.kwargs.get(name, default)


@lowering(CONV)
def lower_conv(ctx: Context, group: Group) -> Launch:
    """``aten.convolution`` (2-d, not transposed) as the implicit-GEMM / direct template; the
    bias is the epilogue's per-channel shift, the fused elementwise region (BatchNorm, SiLU,
    a residual add...) its general part."""
    g = ctx.graph
    op = g.ops[group.ops[0]]
    node = op.node
    if node.target is not aten.convolution.default:
        raise Unsupported(f"no conv template for {op.target_name}")
    if _arg(node, 6, "transposed", False):
        raise Unsupported("transposed convolution")
    x, w = op.inputs[0], op.inputs[1]
    if len(g.tensors[x].shape) != 4:
        raise Unsupported(f"a {len(g.tensors[x].shape) - 2}-d convolution (the template is 2-d)")
    ep = ConvEpilogue()
    if isinstance(node.args[2], torch.fx.Node):
        ep.shift = ctx.operand(op.inputs[2])
    t = op.outputs[0]
    out_t, ep.lines, ep.expr, ep.operands = _epilogue_region(ctx, group, t)
    out = ctx.operand(out_t)
    tshape = g.tensors[t].shape
    if out.shape != tshape:
        out = out.reshape(tshape)
    plan = conv2d(ctx.operand(x), ctx.operand(w), out, stride=_arg(node, 3, "stride", 1),
                  padding=_arg(node, 4, "padding", 0), dilation=_arg(node, 5, "dilation", 1),
                  groups=int(_arg(node, 8, "groups", 1)), epilogue=ep)
    return Launch.of(group.name, "conv", plan)


# ---------------------------------------------------------------------------
# other kernels, one template call per ATen op: pooling
# ---------------------------------------------------------------------------

def _is_spatial_mean(g: "TensorGraph", op: "OpNode") -> bool:
    """``mean.dim`` over the last two dims of a 4-d tensor (what ``adaptive_avg_pool2d(x, 1)`` exports to)."""
    if op.node is None or op.node.target is not aten.mean.dim or len(g.tensors[op.inputs[0]].shape) != 4:
        return False
    dims = _arg(op.node, 1, "dim", None) or ()
    return sorted(d % 4 for d in dims) == [2, 3] and _arg(op.node, 3, "dtype", None) is None


def _two(v: Any, default: Sequence[int] | None = None) -> tuple[int, int] | None:
    """A pooling size argument as a pair (PyTorch allows one number, or an empty list for the default)."""
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
        return tuple(default) if default is not None else None
    if isinstance(v, int):
        return (v, v)
    v = tuple(int(a) for a in v)
    return v * 2 if len(v) == 1 else v


def _window_args(ctx: Context, op: "OpNode", kernel: Any, stride: Any, padding: Any, dilation: Any,
                 ceil: bool) -> tuple[tuple[int, int], ...]:
    """Kernel, stride, padding, dilation as pairs; in ceil mode only where it gives floor mode's size."""
    k = _two(kernel)
    s, p, d = _two(stride, k), _two(padding), _two(dilation, (1, 1))
    if len(ctx.graph.tensors[op.inputs[0]].shape) != 4:
        raise Unsupported(f"{op.target_name} on a non-4-d input")
    H, W = ctx.graph.tensors[op.inputs[0]].shape[2:]
    if ceil and ctx.graph.tensors[op.outputs[0]].shape[2:] != (out_size(H, k[0], s[0], p[0], d[0]),
                                                                 out_size(W, k[1], s[1], p[1], d[1])):
        raise Unsupported(f"{op.target_name} in ceil mode")
    return k, s, p, d


def _max_pool(ctx: Context, op: "OpNode") -> Plan:
    """The values output only: the template computes no argmax."""
    info = ctx.graph.tensors[op.outputs[1]]
    if info.consumers or info.is_output:
        raise Unsupported("max_pool2d's indices are used")
    n = op.node
    k, s, p, d = _window_args(ctx, op, n.args[1], _arg(n, 2, "stride", ()), _arg(n, 3, "padding", 0),
                              _arg(n, 4, "dilation", 1), _arg(n, 5, "ceil_mode", False))
    return max_pool2d(ctx.operand(op.inputs[0]), ctx.operand(op.outputs[0]), k, s, p, d)


def _avg_pool(ctx: Context, op: "OpNode") -> Plan:
    """PyTorch's divisor rules (``count_include_pad``, ``divisor_override``) are the template's."""
    n = op.node
    k, s, p, _ = _window_args(ctx, op, n.args[1], _arg(n, 2, "stride", ()), _arg(n, 3, "padding", 0), 1,
                              _arg(n, 4, "ceil_mode", False))
    return avg_pool2d(ctx.operand(op.inputs[0]), ctx.operand(op.outputs[0]), k, s, p,
                      bool(_arg(n, 5, "count_include_pad", True)), _arg(n, 6, "divisor_override", None))


def _adaptive_avg_pool(ctx: Context, op: "OpNode") -> Plan:
    """To 1x1: a global mean; to a size dividing the input: an average pool with kernel = stride."""
    x = ctx.graph.tensors[op.inputs[0]]
    if len(x.shape) != 4:
        raise Unsupported("adaptive_avg_pool2d on a non-4-d input")
    (H, W), (OH, OW) = x.shape[2:], _two(op.node.args[1])
    if (OH, OW) == (1, 1):
        return global_avg_pool2d(ctx.operand(op.inputs[0]), ctx.operand(op.outputs[0]))
    if H % OH or W % OW:
        raise Unsupported(f"adaptive_avg_pool2d from {(H, W)} to {(OH, OW)}: uneven windows")
    return avg_pool2d(ctx.operand(op.inputs[0]), ctx.operand(op.outputs[0]), (H // OH, W // OW))


# ATen op -> fn(ctx, op) -> Plan: kernels of kind "other" that are one template call
# (nearest upsampling is a movement op of the registry: its consumer reads through it)
OTHER_OPS: dict[Any, Callable[[Context, "OpNode"], Plan]] = {
    aten.max_pool2d_with_indices.default: _max_pool,
    aten.avg_pool2d.default: _avg_pool,
    aten._adaptive_avg_pool2d.default: _adaptive_avg_pool,
    aten.adaptive_avg_pool2d.default: _adaptive_avg_pool,
}


@lowering("other")
def lower_other(ctx: Context, group: Group) -> Launch:
    """One op with a template in :data:`OTHER_OPS` (pooling); anything else runs as ATen."""
    op = ctx.graph.ops[group.ops[0]]
    fn = OTHER_OPS.get(op.node.target) if len(group.ops) == 1 and op.node is not None else None
    if fn is None:
        raise Unsupported(f"no template for {op.target_name}")
    return Launch.of(group.name, op.target_name.split(".")[0], fn(ctx, op))

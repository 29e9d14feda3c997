"""Library lowering: a kernel group as a vendor kernel on dense operands, then its epilogue.

The ``library`` implementation of :mod:`vtcsearch.core.implementation`:

* matmul groups call ``aten.mm`` / ``addmm`` / ``bmm`` (cuBLAS on a GPU) through
  their ``out=`` variants;
* conv groups call ``aten.convolution`` (cuDNN) exactly as the graph does;
* attention groups call ``scaled_dot_product_attention`` (Flash / memory-efficient
  backends) with the group's scale.

Each operand of the library call is passed in place when its resolved map is a
strided view the kernel accepts (:func:`vtcsearch.core.implementation.needs_copy`);
otherwise it is gathered into a dense buffer first (inputs) or scattered from
one afterwards (outputs), with the copy kernel: the residual copy the oracles
price.  The rest of the group (its fused elementwise epilogue) then runs as one
elementwise kernel that reads the product from its buffer and writes through
the maps, as :func:`~vtcsearch.codegen.lowering.lower` would lower it.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from ..core import implementation as im
from ..core.fusion import ATTENTION, ELEMENTWISE, Group
from .kernels import Operand, copy
from .lowering import Context, Launch, lower, strided_view, substitute

__all__ = ["has_epilogue", "lower_as", "lower_library"]


def lower_as(ctx: Context, group: Group, impl: str) -> Launch:
    """The group's launch in implementation ``impl`` (what realization and the profiling timer both run)."""
    if im.check_name(impl) == im.LIBRARY:
        return lower_library(ctx, group)
    if impl == im.INDUCTOR:
        from .inductor import lower_inductor
        return lower_inductor(ctx, [group.name])
    return lower(ctx, group)


def _storage_strides(op: Operand) -> dict[str, tuple[int, ...]]:
    return {s: tuple(op.storage_strides(s)) for s in op.map.targets()}


def _dense_input(ctx: Context, t: str, kind: str) -> tuple[torch.Tensor, Launch | None]:
    """``t`` as a tensor the library reads: a view of its storage, or a buffer a gather fills first (K^T of an
    attention: K's buffer, transposed, so that SDPA reads K with a unit stride on its last dim)."""
    op = ctx.operand(t)
    if not im.needs_copy(kind, op.map, _storage_strides(op)):
        return strided_view(op), None
    if kind == im.ATTENTION_KT:
        *batch, d, n = op.shape
        tmp = ctx.scratch((*batch, n, d), ctx.graph.tensors[t].dtype).transpose(-1, -2)
    else:
        tmp = ctx.scratch(op.shape, ctx.graph.tensors[t].dtype)
    return tmp, Launch.of(t, "copy", copy(Operand.dense(tmp, "tmp"), op))


def _dense_output(ctx: Context, t: str, kind: str) -> tuple[torch.Tensor, Launch | None]:
    """Where the library writes ``t``: a view of its storage, or a buffer scattered through the map after."""
    op = ctx.operand(t)
    if not im.needs_copy(kind, op.map, _storage_strides(op)):
        return strided_view(op), None
    tmp = ctx.scratch(op.shape, ctx.graph.tensors[t].dtype)
    return tmp, Launch.of(t, "copy", copy(op, Operand.dense(tmp, "tmp")))


def _product(ctx: Context, group: Group, env: dict[str, torch.Tensor], out: torch.Tensor) -> Callable[[], None]:
    """The library call writing the product into ``out`` (a captured SDPA call runs as it is)."""
    if group.kind == ATTENTION and not group.info.get("sdpa"):   # the matched math form: q, k^T, v as 3-d
        i = group.info
        B, H, scale, causal = i["batch"], i["heads"], i["scale"], bool(i.get("causal"))
        q, kt, v = env[i["q"]], env[i["kt"]], env[i["v"]]
        BH, SQ, D = q.shape
        SKV, DV = v.shape[1], v.shape[2]
        # views (splitting the batch dim), never reshapes: a copy made here would be stale at the next call
        q4 = q.view(B, H, SQ, D)
        k4 = kt.transpose(1, 2).view(B, H, SKV, D)
        v4 = v.view(B, H, SKV, DV)
        o3 = out

        def run_attention() -> None:
            o3.copy_(F.scaled_dot_product_attention(q4, k4, v4, scale=scale, is_causal=causal).reshape(BH, SQ, DV))
        return run_attention
    op = im.library_op(ctx.graph, group)
    node = op.node
    args = substitute(node.args, env, ctx.device)
    kwargs = substitute(dict(node.kwargs), env, ctx.device)
    out_fn = getattr(node.target.overloadpacket, "out", None)
    if out_fn is not None:
        return lambda: out_fn(*args, **kwargs, out=out)
    return lambda: out.copy_(node.target(*args, **kwargs))   # pragma: no cover - every library op has out=


def has_epilogue(group: Group) -> bool:
    """The group's ops after the library product run as an elementwise kernel of their own (the product then
    lives in a dense buffer between the two)."""
    return group.kind != ATTENTION and len(group.ops) > 1


def lower_library(ctx: Context, group: Group) -> Launch:
    """The group as a library call on dense operands (gathers and scatters where its maps need them),
    then its epilogue as an elementwise kernel."""
    g = ctx.graph
    if im.library_op(g, group) is None:
        raise ValueError(f"group {group.name} ({group.kind}) has no library implementation")
    ins, outs = im.library_operands(g, group)
    pre: list[Launch] = []
    post: list[Launch] = []
    env: dict[str, torch.Tensor] = {}
    for t in ins:
        env[t], gather = _dense_input(ctx, t, im.operand_kind(group, t))
        if gather is not None:
            pre.append(gather)
    (t_out,) = outs
    ep_ctx = ctx
    if has_epilogue(group):   # the product lives only between the call and the epilogue: a dense buffer of its own
        out = ctx.scratch(g.tensors[t_out].shape, g.tensors[t_out].dtype)
        prod = Operand.dense(out, t_out)
        ep_ctx = Context(g, lambda t: prod if t == t_out else ctx.operand(t), ctx.scratch, ctx.device,
                         lambda t: prod.map if t == t_out else ctx.resolve(t))
    else:
        out, scatter = _dense_output(ctx, t_out, group.kind)
        if scatter is not None:
            post.append(scatter)
    call = _product(ctx, group, env, out)
    call()
    for s in post:
        s()
    epilogue = lower(ep_ctx, Group(group.name, ELEMENTWISE, group.ops[1:])) if has_epilogue(group) else None

    def run() -> None:
        for p in pre:
            p()
        call()
        for s in post:
            s()
        if epilogue is not None:
            epilogue()

    copies = sum(x.kernels for x in pre + post)
    note = f"{len(pre)} gathers, {len(post)} scatters" if pre or post else ""
    launch = Launch(group.name, "library", [], run, note)
    launch.library_copies = copies          # type: ignore[attr-defined]
    launch.epilogue = epilogue              # type: ignore[attr-defined]
    return launch

"""Inductor lowering: kernel groups compiled by TorchInductor and called from the executable.

The ``inductor`` implementation of :mod:`vtcsearch.core.implementation`.  A
*region* (one group, or consecutive groups that realization merges) becomes
an FX graph of the captured ATen ops: a placeholder per input, the ops, and one
``aten.copy_`` per output into the storage the executable gives it.  That graph
is compiled by ``torch.compile`` (Inductor, ``max-autotune-no-cudagraphs`` by
default: its fusion, its autotuned Triton templates and the vendor libraries,
whichever it measures fastest) once, when the executable is built; the copies
into the outputs are fused into Inductor's last kernels, so the region writes
straight into vtcsearch's buffers and the executable's one CUDA graph captures
it like any other step.

Operands are plain strided tensors: an input whose resolved map is a strided
view of its storage is passed as that view (Inductor compiles for its
strides); any other is gathered into a dense buffer first, and an output that
is not a strided view is written to a dense buffer and scattered after: the
residual copies the oracles price, the same rule as the library kernels.

:func:`regions` decides which consecutive inductor groups form one region: each
tensor they produce must be one Inductor can write in place (physical, or a
strided view of one storage), and no group may read, through a map, a storage
that an earlier group of the region writes (the region's outputs are written
when it ends).  A movement op the strategy eliminates joins as a value op, so a
reshape between a GEMM and its residual add does not cut Inductor's fusion.
"""
from __future__ import annotations

import json
import math
import operator
import os
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

import torch

from ..core import implementation as im
from ..core.graph import NOT_FOLDABLE, TensorGraph, folded, kernel_io, step_outputs, written_back_within
from ..core.mapping import contiguous_strides
from .kernels import Operand, copy
from .lowering import Context, Launch, strided_view, substitute
from .memory import step_access, storages_of

if TYPE_CHECKING:
    from ..core.mapping import IndexMap
    from ..core.strategy import Strategy

__all__ = ["MODE", "clear_compiled_regions", "compiled_region", "generated_inputs", "is_region_step", "lower_inductor",
           "region_graph", "region_io", "region_ops", "regions"]

aten = torch.ops.aten

MODE = "max-autotune-no-cudagraphs"   # the executable captures one CUDA graph of its own


def inductor_options() -> dict:
    """Inductor settings over ``MODE`` for vtcsearch's regions, from ``VTC_INDUCTOR_CONFIG`` (JSON, keys as in
    ``torch._inductor.config``, e.g. ``{"combo_kernels": true, "triton.enable_pdl": true}``): settings whose
    worth only a measurement on the GPU shows, tried without touching the baselines' torch.compile."""
    raw = os.environ.get("VTC_INDUCTOR_CONFIG", "")
    try:
        opts = json.loads(raw) if raw else {}
    except json.JSONDecodeError as e:
        raise ValueError(f"VTC_INDUCTOR_CONFIG is not JSON ({e}): {raw!r}") from None
    if not isinstance(opts, dict):
        raise ValueError(f"VTC_INDUCTOR_CONFIG must be a JSON object of torch._inductor.config keys: {raw!r}")
    return opts


_VIEWS = (aten.view.default, aten._unsafe_view.default)


def _storage_strides(op: Operand) -> dict[str, tuple[int, ...]]:
    return {s: tuple(op.storage_strides(s)) for s in op.map.targets()}


def region_graph(graph: TensorGraph, ops: Sequence[str], ins: Sequence[str], outs: Sequence[str],
                 device: torch.device, aliases: Mapping[int, int] | None = None,
                 returns: Sequence[str] = ()) -> torch.fx.GraphModule:
    """``ops`` as an FX graph ``(*ins, *outs) -> returns`` that copies each output value into its argument and
    returns the values of ``returns`` (:func:`returned_outputs`; None when there are none).

    ``aliases``: output position -> input position of the same view of one storage (a buffer the region
    reads and writes back, a KV cache).  Such an output gets no placeholder of its own: its value is copied
    into the input's, so Inductor sees the in-place update torch.compile sees in the model (and makes
    ``index_put`` into the cache an in-place row write instead of a copy of the cache)."""
    aliases = dict(aliases or {})
    fx = torch.fx.Graph()
    placeholders = [fx.placeholder(f"in_{k}") for k in range(len(ins))]
    env: dict[str, torch.fx.Node] = dict(zip(ins, placeholders))
    dst = [placeholders[aliases[k]] if k in aliases else fx.placeholder(f"out_{k}") for k in range(len(outs))]

    for name in ops:
        op = graph.ops[name]
        node = op.node
        if node is None:   # a writeback (added by capture, no ATen op): the buffer's new value is its input's
            env[op.outputs[0]] = env[op.inputs[0]]
            continue
        if node.target is aten.copy.default and op.inputs[0] not in env:
            env[node.name] = _copy_value(fx, env[op.inputs[1]], node)
            continue
        # the region's values need not have eager's strides (an input laid out as the strategy places it, an
        # eliminated transpose read as a value), so a view is a reshape: the same values, and a copy where
        # the strides allow no view (a physical view of an eliminated transpose failed in Dynamo otherwise)
        target = aten.reshape.default if node.target in _VIEWS else node.target
        new = fx.call_function(target, substitute(node.args, env, device), substitute(dict(node.kwargs), env, device))
        if list(op.outputs) == [node.name]:
            env[node.name] = new
            continue
        # a tuple-valued op: its tensor outputs are the getitem users of the captured node
        index = {u.name: u.args[1] for u in node.users if u.target is operator.getitem}
        tensor_positions = [i for i, v in enumerate(_values(node)) if v]
        for k, t in enumerate(op.outputs):
            i = index.get(t, tensor_positions[k] if k < len(tensor_positions) else k)
            env[t] = fx.call_function(operator.getitem, (new, i))
    for t, d in zip(outs, dst):
        fx.call_function(aten.copy_.default, (d, env[t]))
    fx.output(tuple(env[t] for t in returns) if returns else None)
    return torch.fx.GraphModule(torch.nn.Module(), fx)


def _copy_value(fx: torch.fx.Graph, src: torch.fx.Node, node: torch.fx.Node) -> torch.fx.Node:
    """``aten.copy(dst, src)`` without ``dst``: its value is ``src`` cast to ``dst``'s dtype and broadcast to its
    shape (only ``dst``'s metadata is used, taken from the captured node)."""
    val = node.meta["val"]
    out = fx.call_function(aten._to_copy.default, (src,), {"dtype": val.dtype})
    return fx.call_function(aten.expand.default, (out, list(val.shape)))


def copy_destination(graph: TensorGraph, name: str) -> str | None:
    """The destination of a captured ``aten.copy``: an input whose values the op does not read."""
    op = graph.ops[name]
    return op.inputs[0] if op.node is not None and op.node.target is aten.copy.default else None


def _values(node: torch.fx.Node) -> list[bool]:
    """Which positions of a tuple-valued node's result are tensors (from its fake value)."""
    val = node.meta.get("val")
    if isinstance(val, (tuple, list)):
        return [isinstance(v, torch.Tensor) for v in val]
    return [True]


def _read(ctx: Context, t: str) -> tuple[torch.Tensor, Launch | None]:
    op = ctx.operand(t)
    if not im.needs_copy(im.INDUCTOR, op.map, _storage_strides(op)):
        return strided_view(op), None
    tmp = ctx.scratch(op.shape, ctx.graph.tensors[t].dtype)
    return tmp, Launch.of(t, "copy", copy(Operand.dense(tmp, "tmp"), op))


def _write(ctx: Context, t: str) -> tuple[torch.Tensor, Launch | None]:
    op = ctx.operand(t)
    if not im.needs_copy(im.INDUCTOR, op.map, _storage_strides(op)):
        return strided_view(op), None
    tmp = ctx.scratch(op.shape, ctx.graph.tensors[t].dtype)
    return tmp, Launch.of(t, "copy", copy(op, Operand.dense(tmp, "tmp")))


def _same_view(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Two arguments that are the same elements of one storage (one placeholder serves both)."""
    return (x.untyped_storage().data_ptr() == y.untyped_storage().data_ptr() and x.dtype == y.dtype and
            x.shape == y.shape and x.stride() == y.stride() and x.storage_offset() == y.storage_offset())


def region_ops(graph: TensorGraph, steps: Sequence[str]) -> list[str]:
    """The ops of a region's steps: a group's ops, or a movement op itself."""
    return [o for st in steps for o in (graph.groups[st].ops if st in graph.groups else [st])]


def _touched(ctx: Context, t: str) -> set[str]:
    """The storages ``t``'s map reads: its targets and the storages of its index tables (a gather's indices)."""
    m = ctx.resolve(t)
    return set(m.targets()).union(*(ctx.resolve(tb).targets() for tb in m.tables()))


def region_io(ctx: Context, steps: Sequence[str]) -> tuple[list[str], list[str]]:
    """(inputs, outputs) of a region.  An eliminated movement op inside it writes nothing: where a reader
    outside needs its (virtual) result, the region writes the tensors of the region that own the storages
    that result's map reads (its index tables too), or the result through its map where no tensor of the
    region owns them, unless that map scatters and another output already rewrites the whole storage
    (:func:`_written_whole`).  The destination of an ``aten.copy`` is not an input (:func:`copy_destination`)."""
    g = ctx.graph
    ops = region_ops(g, steps)
    ins, outs = kernel_io(g, ops)
    ins = [t for t in ins if not all(c in steps and copy_destination(g, c) == t
                                     for c in g.tensors[t].consumers if c in ops)]
    produced = {t for o in ops for t in g.ops[o].outputs}
    # a buffer's new value whose writeback runs inside the region: the writeback's output is written instead
    inside = set(ops)
    outs = [t for t in outs if not written_back_within(g, t, inside)]
    eliminated = {t for st in steps if st not in g.groups for t in g.ops[st].outputs   # (a copy's is its own)
                  if ctx.resolve(t).targets() != {t}}
    kept: list[str] = []
    through: list[str] = []   # eliminated results written through their own scattering maps, if still needed
    for t in outs:
        # the tensor owning a storage holds all of it: writing its value writes what ``t`` maps to; a storage
        # nothing in the region owns (a later tensor's, a cache buffer) is written through ``t``'s own map
        for u in (sorted(_touched(ctx, t)) if t in eliminated else [t]):
            w = u if u == t or u in produced else t
            if w == t and t in eliminated and not _writes_in_place(ctx.resolve(t)):
                through.append(t)
            elif w not in kept:
                kept.append(w)
    for t in dict.fromkeys(through):
        if not all(u in produced or _written_whole(ctx, kept, u) for u in _touched(ctx, t)):
            kept.append(t)
    return ins, kept


def _written_whole(ctx: Context, kept: Sequence[str], u: str) -> bool:
    """One of ``kept`` is all of storage ``u``, laid out as itself: writing it writes every element a view of
    ``u`` reads, so the view needs no write of its own.  (A KV cache's new value is such a tensor; the cache
    broadcast over GQA heads is such a view: written through its map, it would rewrite the cache once per
    head, through a dense buffer.)"""
    for k in kept:
        m = ctx.resolve(k)
        if m.targets() == {u} and m.numel == math.prod(m.target_shapes[u]) and m.is_identity_layout():
            return True
    return False


GENERATED_OPS_LIMIT = 64   # ops recomputed per generated input: index arithmetic, not a whole table's program


def generated_inputs(graph: TensorGraph, ins: Sequence[str]) -> dict[str, set[str]]:
    """The inputs of a region that are computed from nothing, each with the ops that compute it: every op upstream
    of it is a captured, pure ATen op and the chain starts at ops without tensor inputs (``arange``, ``full``),
    at most :data:`GENERATED_OPS_LIMIT` ops.  A resize's index arithmetic and its cubic weights are such tensors.
    They fold at build (they are constants), so the region would read them as index tensors; torch.compile
    computes them in the kernel that reads them, and the region then does too (EfficientViT-B1's bicubic
    resize on an H100: 132.5 us reading the folded indices, 83.7 us in torch.compile's kernel)."""
    return {t: ops for t in ins if (ops := _upstream(graph, t)) is not None}


def _upstream(graph: TensorGraph, t: str) -> set[str] | None:
    """The ops ``t`` is computed by, back to ops without tensor inputs; None where anything upstream reads an
    input, a parameter or a buffer, is not a captured ATen op, is random, or there are over
    :data:`GENERATED_OPS_LIMIT` of them."""
    seen: set[str] = set()
    stack = [t]
    while stack:
        p = graph.tensors[stack.pop()].producer
        if p is None:
            return None           # a graph input, parameter, buffer or constant: read, not generated
        if p in seen:
            continue
        op = graph.ops[p]
        if op.node is None or any(w in op.target_name for w in NOT_FOLDABLE) or len(seen) >= GENERATED_OPS_LIMIT:
            return None
        seen.add(p)
        stack.extend(op.inputs)
    return seen


def lower_inductor(ctx: Context, steps: Sequence[str], mode: str = MODE, eager: bool = False) -> Launch:
    """``steps`` (one group, or a region :func:`regions` formed) as one Inductor-compiled call on strided
    operands.  ``eager``: run the region's FX graph as ATen ops instead (a group folded at build runs once, so
    compiling it costs more than it saves: a bicubic resize's index arithmetic was 48 Inductor compiles)."""
    g = ctx.graph
    for st in steps:
        if st in g.groups and not im.inductor_can_run(g, g.groups[st]):
            raise ValueError(f"group {st} ({g.groups[st].kind}) has an op Inductor cannot compile")
    ops = region_ops(g, steps)
    ins, outs = region_io(ctx, steps)
    generated = generated_inputs(g, ins) if any(_upstream(g, t) is None for t in outs) else {}
    if generated:    # computed in the region from nothing, as torch.compile computes them, not read
        # (a region that is itself index arithmetic, folded at build, reads the last step's result as before)
        ins = [t for t in ins if t not in generated]
        need = set().union(*generated.values()) - set(ops)
        ops = [*[o for o in g.ops if o in need], *ops]      # in the graph's order
    returns = [t for t in outs if t in ctx.returned]   # returned whole, not copied into the executable's storage
    outs = [t for t in outs if t not in ctx.returned]
    pre, post, args = [], [], []
    for t in ins:
        x, gather = _read(ctx, t)
        args.append(x)
        if gather is not None:
            pre.append(gather)
    aliases: dict[int, int] = {}
    for k, t in enumerate(outs):
        y, scatter = _write(ctx, t)
        if scatter is not None:
            post.append(scatter)
        j = next((j for j, x in enumerate(args[:len(ins)]) if _same_view(x, y)), None)
        if j is None:
            args.append(y)
        else:
            aliases[k] = j
    gm = region_graph(g, ops, ins, outs, ctx.device, aliases, returns)
    name = steps[0] if len(steps) == 1 else f"{steps[0]}..{steps[-1]}"
    if eager:
        for p in pre:
            p()
        values = gm(*args)
        compiled, retried = gm, ""
    else:
        compiled, retried, values = _compile_and_run(gm, args, mode, pre, name)

    arg_storages = {a.untyped_storage().data_ptr() for a in args}

    def bind(values) -> None:
        for t, v in zip(returns, values or ()):
            if v.untyped_storage().data_ptr() in arg_storages:
                v = v.clone()    # a view of an argument (an input's bytes, which later steps may reuse)
            ctx.bind(t, v)

    def run() -> None:
        for p in pre:
            p()
        bind(compiled(*args))
        for s in post:
            s()

    bind(values)
    for s in post:
        s()
    note = (f"{len(steps)} steps" + (f", {len(pre)} gathers, {len(post)} scatters" if pre or post else "")
            + (f", returns {', '.join(returns)}" if returns else "")
            + (f", {len(generated)} inputs computed in the region" if generated else "") + retried)
    launch = Launch(name, "inductor", [], run, note)
    launch.library_copies = sum(x.kernels for x in pre + post)   # type: ignore[attr-defined]
    launch.steps = list(steps)                                   # type: ignore[attr-defined]
    launch.aliases = {outs[k]: ins[j] for k, j in aliases.items()}   # type: ignore[attr-defined]
    return launch


# settings that work around an Inductor failure on one region, tried in order: the fusions of its templates
# (torch 2.13 asserts "wrong ndim" fusing a bmm template with a batch norm over its reshaped output, timm LeViT)
RETRIES = ({"epilogue_fusion": False, "prologue_fusion": False},)


def _compile_and_run(gm: torch.fx.GraphModule, args: Sequence[torch.Tensor], mode: str, pre: Sequence,
                     name: str) -> tuple[torch.nn.Module, str, Any]:
    """Compile region ``name`` and run it once (the build pass: the first call compiles and autotunes), under
    :func:`inductor_options`; returns the compiled region, the note of a retry and what the run returned.
    Where Inductor itself fails on the region, retry under each of :data:`RETRIES` (the region still runs as
    Inductor's code, without the fusion that failed), and say so in the step's note; when none compiles, one
    line names the region and Inductor's error."""
    from torch._dynamo.exc import BackendCompilerFailed
    from torch._inductor import config as inductor_config
    base = inductor_options()
    first: BaseException | None = None
    for extra in ({}, *RETRIES):
        opts = {**base, **extra}
        compiled = compiled_region(gm, args, mode, opts)
        for p in pre:
            p()
        try:
            with inductor_config.patch(opts):
                values = compiled(*args)
        except BackendCompilerFailed as e:
            first = first or e
            continue
        why = f"; compiled with {extra} (Inductor failed: {_first_line(first)})" if first is not None else ""
        return compiled, why, values
    raise RuntimeError(f"Inductor cannot compile region {name}: {_first_line(first)}") from first


def _first_line(e: BaseException | None) -> str:
    """``Type: first line`` of the error Inductor raised (Dynamo's wrapper names only the backend)."""
    e = getattr(e, "inner_exception", None) or e
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}"[:200]


# (region code, argument layouts, mode) -> its torch.compile: the same layer 32 times is compiled once
_COMPILED: dict[tuple, torch.nn.Module] = {}


def compiled_region(gm: torch.fx.GraphModule, args: Sequence[torch.Tensor], mode: str,
                    options: Mapping | None = None) -> torch.nn.Module:
    """``torch.compile(gm)``, shared with every earlier region of the same code on arguments of the same shapes,
    strides, dtypes, devices, 16-byte alignment (Inductor compiles its kernels for the alignment it sees) and
    sharing of storages: repeated layers reuse one compiled program instead of each tracing and loading it
    again.  Dynamo's guards still check every call, so a reuse outside what the first compile assumed
    recompiles rather than runs wrong code."""
    if any(n.op == "get_attr" for n in gm.graph.nodes):   # constants of its own: not shared
        return torch.compile(gm, mode=mode, dynamic=False, fullgraph=True)
    first: dict[int, int] = {}
    layout = tuple((tuple(a.shape), tuple(a.stride()), a.dtype, str(a.device), a.data_ptr() % 16 == 0,
                    first.setdefault(a.untyped_storage().data_ptr(), k)) for k, a in enumerate(args))
    key = (gm.code, layout, mode, json.dumps(options or {}, sort_keys=True))
    if key not in _COMPILED:
        _COMPILED[key] = torch.compile(gm, mode=mode, dynamic=False, fullgraph=True)
    return _COMPILED[key]


def clear_compiled_regions() -> None:
    """Forget the shared compiled regions (with ``torch._dynamo.reset()``, between the cases of a run)."""
    _COMPILED.clear()


def _in_place(strategy: "Strategy", t: str) -> bool:
    """Inductor writes ``t`` straight into memory: it lives in its own storage, laid out as itself, or its map
    is a strided view of one storage (a reshape, a transpose, a slice of a concatenation)."""
    m = strategy.resolve(t)
    if m.targets() == {t} and m.is_identity_layout():
        return True
    return _writes_in_place(m)


def _writes_in_place(m: "IndexMap") -> bool:
    """Inductor writes a tensor of map ``m`` straight into its storages: ``m`` is a strided view of one."""
    if math.prod(m.shape) == 0:   # nothing to write (an eval batch norm's empty saved statistics)
        return True
    strides = {s: contiguous_strides(m.target_shapes[s]) for s in m.targets()}
    return not m.tables() and not im.needs_copy(im.INDUCTOR, m, strides)


def regions(graph: TensorGraph, strategy: "Strategy", steps: Iterable[str],
            constants: Iterable[str] = ()) -> list[list[str]]:
    """The schedule ``steps`` cut into runs: consecutive inductor groups (and the copying movement ops between
    them) form one region; every other step is a run of its own.

    A step joins the open region when Inductor can write every tensor it produces in place (physical, or
    virtual with a map that is a strided view of one storage: a scattered one is written through a dense buffer
    after the call, so it ends the region), and none of its inputs is a tensor other than the region's own
    values that lives in a storage the region writes: the region's outputs are written when its call ends, so a
    later step must not read them through a map.  A movement op joins when it copies (the strategy keeps its
    output physical), under the same rule for what it reads: Inductor then makes the copy, usually fused away
    (a KV cache broadcast over GQA heads becomes an indexed read, not a copy of the cache).  An eliminated
    movement op emits nothing; it joins as a value op when it reads only the region's values (the destination
    of an ``aten.copy``, such as a view of a KV cache, is not read: the copy's value is its source's).  A later
    group then reads its result from the region, not through the storage, and the region writes whatever
    storage its result maps into where a later step reads it (:func:`region_io`).  A movement op over
    ``constants`` only (a weight's transpose), or a kernel group over constants only (a resize's index
    arithmetic), runs once, folded at build, and does not cut a region; a view of constants, or a kernel group of
    constants, whose one reader is an inductor group joins that group's region instead (:func:`_for_inductor`).

    A copying movement op may also open a region (a later group then fuses it; a region that no group joins
    goes back to copy kernels), and a copying *writeback* (a mutated buffer's new value, stored back) joins
    like any copy: the region then writes the buffer itself, through the placeholder it reads the buffer
    from, so Inductor turns a KV cache's ``index_put`` + writeback into an in-place row write.
    """
    constants = set(constants)
    out: list[list[str]] = []
    region: list[str] | None = None   # the open region (a list in ``out``)
    writes: set[str] = set()          # storages it writes
    values: set[str] = set()          # tensors it computes
    pending: list[str] = []           # views of constants waiting for the inductor group that reads them
    for name in steps:
        gr = graph.groups.get(name)
        is_inductor = gr is not None and strategy.implementation(name) == im.INDUCTOR
        if gr is None and not strategy.residuals_of(name):
            # an eliminated movement op: nothing runs.  Inside a region that computes its inputs it joins as a
            # value op (a view in the FX graph), so a later group reads its result from the region instead of
            # through a storage the region writes: Linear's reshapes no longer cut a GEMM from its epilogue
            if region is not None and graph.ops[name].node is not None and \
                    all(t in values for t in graph.ops[name].inputs if t != copy_destination(graph, name)):
                region.append(name)
                values |= set(graph.ops[name].outputs)
            continue
        if folded(graph, name, constants):
            if _for_inductor(graph, strategy, name, constants):
                pending.append(name)                   # joins its consumer's region (below)
            else:
                # folded once at build: no step at run time.  It reads only constants, so it goes before the open
                # region, which may read what it makes: realization builds (runs) the runs in this order
                out.insert(out.index(region) if region is not None else len(out), [name])
            continue
        ops = gr.ops if gr is not None else [name]
        ins, produced = kernel_io(graph, ops)
        views = [v for v in pending if set(step_outputs(graph, v)) & set(ins)] if is_inductor else []
        pending = [v for v in pending if v not in views]
        inner = values | {t for v in views for t in step_outputs(graph, v)}
        in_place = all(_in_place(strategy, t) for o in ops for t in graph.ops[o].outputs)
        foreign = {s for t in ins if t not in inner for s in storages_of(strategy, t)}
        copies = gr is None and _emittable(graph.ops[name])
        if region is not None and in_place and not (foreign & writes) and (is_inductor or copies):
            region.extend([*views, name])
        elif not (is_inductor or (copies and in_place)):
            out.append([name])
            region = None
            continue
        else:
            region = [*views, name]
            out.append(region)
            writes, values = set(), set()
        values |= {t for v in views for t in step_outputs(graph, v)}
        writes |= {s for t in produced for s in strategy.resolve(t).targets()}
        values |= {t for o in ops for t in graph.ops[o].outputs}
        if not in_place:
            region = None
    # a run of copies that no inductor group joined stays the copy kernels it was
    return [run for r in out for run in
            ([r] if any(is_region_step(graph, strategy, st) for st in r) else [[st] for st in r])]


def returned_outputs(graph: TensorGraph, strategy: "Strategy", runs: Sequence[Sequence[str]],
                     constants: Iterable[str] = ()) -> frozenset[str]:
    """Graph outputs an Inductor region returns as its own tensors instead of copying them into a storage of
    the executable: each a physical tensor that is all of its storage, written by one region that runs per
    call, read by no step (its own region included, as an input), and neither a graph input nor a buffer.

    A region writes its outputs through an ``aten.copy_`` into the storage the executable gives it, so a value
    Inductor computes into a buffer of its own and cannot write in place (an extern GEMM's product, then a
    pointwise epilogue) lives twice at the region's end: Gemma 2 9B's prefill held its 2,000 MiB of logits in
    the slab beside the LM head's product (4,028 MiB of activations where torch.compile's program holds
    2,028 MiB).  Returned, the value is the call's output as torch.compile's is, and takes no slab bytes."""
    constants = set(constants)
    writers: dict[str, list[int]] = {}
    readers: dict[str, list[int]] = {}
    for k, run in enumerate(runs):
        reads, writes = step_access(graph, strategy, run)
        for u in writes:
            writers.setdefault(u, []).append(k)
        for u in reads:
            readers.setdefault(u, []).append(k)
    out = set()
    for t in dict.fromkeys(graph.outputs):
        info = graph.tensors[t]
        m = strategy.resolve(t)
        if graph.outputs.count(t) > 1 or info.is_graph_input or info.mutable or m.targets() != {t} or \
                not m.is_identity_layout() or m.numel != math.prod(m.target_shapes[t]):
            continue
        if len(writers.get(t, [])) != 1 or readers.get(t):
            continue
        run = runs[writers[t][0]]
        if not any(is_region_step(graph, strategy, st) for st in run) or \
                (len(run) == 1 and folded(graph, run[0], constants)):
            continue
        if any(u != t and t in strategy.resolve(u).targets() for u in graph.outputs):   # another output's view
            continue
        out.add(t)
    return frozenset(out)


def is_region_step(graph: TensorGraph, strategy: "Strategy", step: str) -> bool:
    """Whether ``step`` is a kernel group Inductor runs (a run of :func:`regions` holding one is a region)."""
    return step in graph.groups and strategy.implementation(step) == im.INDUCTOR


# movement ops that are strided views of a contiguous input: Inductor reads through them, it copies nothing
VIEWS = frozenset({"Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Slice", "Expand", "Split"})


def _for_inductor(graph: TensorGraph, strategy: "Strategy", name: str, constants: set[str]) -> bool:
    """A step over constants whose one reader is a group Inductor runs (:func:`constant_reader`): it joins that
    group's region, so Inductor computes it as it reads it, as torch.compile does, instead of a result folded at
    build and held for the executable's life."""
    reader = constant_reader(graph, name, constants)
    return reader is not None and is_region_step(graph, strategy, reader)


def constant_reader(graph: TensorGraph, name: str, constants: set[str]) -> str | None:
    """The one kernel group (not folded itself) that reads folded step ``name``, where Inductor may compute the
    step in that group's region: a view of a weight (its transpose: a folded copy doubled the weights' memory,
    +15 GB for Llama 3 8B), or a kernel group (Gemma 2's RMSNorm scale ``1 + w.float()``: 169 folded fp32
    vectors, 2.4 MiB beside torch.compile's activations for the whole model at bs 16).  None: it folds."""
    if name in graph.groups:
        ops = graph.groups[name].ops
        if any(graph.ops[o].node is None for o in ops):
            return None
    else:
        op = graph.ops[name]
        if op.node is None or op.movement_op is None or op.movement_op.onnx not in VIEWS:
            return None
        ops = [name]
    outs = step_outputs(graph, name)
    readers = {graph.ops[c].kernel for t in outs for c in graph.tensors[t].consumers if c not in ops}
    if len(readers) != 1 or any(graph.tensors[t].is_output for t in outs):
        return None
    reader = next(iter(readers))
    return reader if reader in graph.groups and not folded(graph, reader, constants) else None


def _emittable(op) -> bool:
    """An op a region's FX graph can hold: a captured ATen op, or a writeback (an identity into a buffer)."""
    return op.node is not None or op.target == "writeback"

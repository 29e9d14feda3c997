"""Horizontal GEMM fusion: GEMMs that read the same A with constant weights become one GEMM.

A transformer layer runs several GEMMs on one activation (Q, K and V projections; the MLP's gate
and up projections).  At decode each streams its weight with a few rows of A: several launches where
one would do, small GEMMs that underuse the GPU, and a norm with several GEMM consumers that cannot be
computed in a GEMM prologue (:func:`vtcsearch.core.fusion.prologue_target`).

:func:`horizontal_fuse` rewrites the exported program (before :func:`vtcsearch.core.capture.from_exported`
builds the :class:`~vtcsearch.core.graph.TensorGraph`, so everything downstream sees an ordinary graph):

    mm(view(x), t(Wq)), mm(view(x), t(Wk)), mm(view(x), t(Wv))
      -> q, k, v = split_with_sizes(mm(view(x), t(Wqkv)), [Nq, Nk, Nv], -1)

``Wqkv`` (and the biases of ``addmm``, concatenated the same way) is a new *constant* input of the
program: concatenated once, at capture, from the weights' values (for a model on the meta device, a meta
tensor), never per call; the original weights leave the program when nothing else reads them.  The split
is an ordinary movement op, so the VTOG and the search choose for it like any other: each piece virtual
over the product (consumers read through the slice map), or the product virtual over the pieces (the GEMM
writes each piece where it goes, V straight into a KV cache).  A split rather than separate slices: slices
give only the first choice, and V's cache write then costs a copy.

Nothing is model-specific: any ``mm`` / ``addmm`` / ``bmm`` group that reads the same A (the same tensor
through the same views) with constant B operands of the same K, dtype and layout fuses; every GEMM of a
shared A left apart gets a one-line reason.

The concatenated weight is a snapshot: changing the module's weights after compiling is not seen (as
with any folded constant).
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.export.graph_signature import InputKind, InputSpec, OutputKind, TensorArgument

aten = torch.ops.aten

# product op -> (position of the bias or None, position of A, position of B)
GEMMS = {aten.mm.default: (None, 0, 1), aten.addmm.default: (0, 1, 2), aten.bmm.default: (None, 0, 1)}
RESHAPES = {aten.view.default, aten.reshape.default, aten._unsafe_view.default}   # view-like ops: one tensor, new shape
PLAIN, TRANSPOSED = "plain", "transposed"


@dataclass
class HFuseReport:
    """What :func:`horizontal_fuse` did: the GEMMs fused into each new one, and why the others were not."""

    fused: dict[str, list[str]] = field(default_factory=dict)     # new product node -> the fused products
    refused: dict[str, str] = field(default_factory=dict)         # product node -> why it stays apart


@dataclass
class _Member:
    node: torch.fx.Node
    a: torch.fx.Node
    weight: str                     # the constant placeholder B reads
    form: str                       # PLAIN: B is the constant; TRANSPOSED: B is its last-two-dims transpose
    bias: str | None                # the constant placeholder of an addmm's bias
    n: int                          # columns of the product


def _constants(ep: torch.export.ExportedProgram) -> dict[str, torch.Tensor]:
    """Placeholder name -> value of every input fixed for the program's life: parameters, constant tensors
    and buffers the program does not write."""
    sig = ep.graph_signature
    written = {s.target for s in sig.output_specs if s.kind == OutputKind.BUFFER_MUTATION}
    out: dict[str, torch.Tensor] = {}
    for s in sig.input_specs:
        ok = s.kind in (InputKind.PARAMETER, InputKind.CONSTANT_TENSOR) or \
            (s.kind == InputKind.BUFFER and s.target not in written)
        if not ok or s.target is None:
            continue
        v = ep.state_dict.get(s.target)
        if v is None:
            v = ep.constants.get(s.target)
        if isinstance(v, torch.Tensor):
            out[s.arg.name] = v
    return out


def _a_key(a: torch.fx.Node) -> tuple:
    """Equal for two A operands that are the same tensor through the same views (each export'd linear
    views the shared activation on its own)."""
    views = []
    while a.op == "call_function" and a.target in RESHAPES:
        views.append(tuple(a.args[1]))
        a = a.args[0]
    return (a, tuple(reversed(views)))


def _is_transpose(b: torch.fx.Node) -> bool:
    """``b`` swaps the last two dims of its input and nothing else."""
    nd = len(b.meta["val"].shape)
    if b.target is aten.t.default:
        return True
    if b.target is aten.transpose.int:
        return sorted(d % nd for d in b.args[1:3]) == [nd - 2, nd - 1]
    if b.target is aten.permute.default:
        dims = [d % nd for d in b.args[1]]
        return dims == list(range(nd - 2)) + [nd - 1, nd - 2]
    return False


def _member(n: torch.fx.Node, consts: dict[str, torch.Tensor]) -> tuple[_Member | None, str]:
    """The fusable description of product ``n``, or why it cannot join a horizontal fusion."""
    bpos, apos, wpos = GEMMS[n.target]
    if any(n.kwargs.get(k, 1) != 1 for k in ("beta", "alpha")):
        return None, f"{n.name}: addmm with beta/alpha != 1"
    b = n.args[wpos]
    if b.op == "placeholder":
        form, w = PLAIN, b
    elif b.op == "call_function" and _is_transpose(b) and b.args[0].op == "placeholder":
        form, w = TRANSPOSED, b.args[0]
    else:
        return None, f"{n.name}: B reaches its value through {getattr(b.target, '__name__', b.target)}, " \
                     "not a constant weight or its transpose"
    if w.name not in consts:
        return None, f"{n.name}: non-constant B ({w.name} is a user input or a buffer the program writes)"
    bias = None
    if bpos is not None:
        bn = n.args[bpos]
        if not isinstance(bn, torch.fx.Node) or bn.op != "placeholder" or bn.name not in consts or \
                len(bn.meta["val"].shape) != 1:
            return None, f"{n.name}: the bias is not a constant vector"
        bias = bn.name
    return _Member(n, n.args[apos], w.name, form, bias, int(n.meta["val"].shape[-1])), ""


def _signature(m: _Member, consts: dict[str, torch.Tensor]) -> tuple:
    w = consts[m.weight]
    k = w.shape[-1] if m.form == TRANSPOSED else w.shape[-2]
    return (m.node.target, int(k), w.dtype, m.form, tuple(w.shape[:-2]),
            None if m.bias is None else consts[m.bias].dtype)


def _why_apart(sig: tuple, want: tuple, name: str) -> str:
    what = ["product op", "K", "dtype", "layout", "batch dims", "bias"]
    for label, a, b in zip(what, sig, want):
        if a != b:
            if label == "layout":
                return f"{name}: transposed map ({a} B) differs from the group's ({b} B)"
            if label == "product op":
                why = " (a bias in one only)" if aten.addmm.default in (a, b) else ""
                return f"{name}: {getattr(a, '__name__', a)} beside {getattr(b, '__name__', b)}{why}"
            return f"{name}: {label} {a} differs from the group's {b}"
    return f"{name}: not fused"   # pragma: no cover - equal signatures share a bucket


def horizontal_fuse(ep: torch.export.ExportedProgram) -> HFuseReport:
    """Rewrite ``ep`` in place: each set of >= 2 GEMMs reading the same A with constant B of the same K,
    dtype and layout becomes one GEMM over the B operands concatenated along N, split into the original
    outputs.  Returns what was fused and why each other GEMM of a shared A was not."""
    report = HFuseReport()
    consts = _constants(ep)
    graph = ep.graph
    by_a: dict[tuple, list[torch.fx.Node]] = {}
    for n in graph.nodes:
        if n.op == "call_function" and n.target in GEMMS:
            by_a.setdefault(_a_key(n.args[GEMMS[n.target][1]]), []).append(n)
    count = 0
    for nodes in by_a.values():
        if len(nodes) < 2:
            continue
        buckets: dict[tuple, list[_Member]] = {}
        for n in nodes:
            m, why = _member(n, consts)
            if m is None:
                report.refused[n.name] = why
            else:
                buckets.setdefault(_signature(m, consts), []).append(m)
        if not buckets:
            continue
        want, group = max(buckets.items(), key=lambda kv: len(kv[1]))   # the first largest: export order
        for sig, ms in buckets.items():
            if ms is not group or len(ms) < 2:
                for m in ms:
                    report.refused[m.node.name] = _why_apart(sig, want, m.node.name) if ms is not group else \
                        f"{m.node.name}: no other GEMM of its A has a constant B of the same K, dtype and layout"
        if len(group) >= 2:
            new = _rewrite(ep, group, consts, count)
            report.fused[new] = [m.node.name for m in group]
            count += 1
    if count:
        graph.lint()
        ep.graph_module.recompile()
    return report


def _fake(ep: torch.export.ExportedProgram):
    from torch._guards import detect_fake_mode
    return detect_fake_mode([n.meta.get("val") for n in ep.graph.nodes if n.op == "placeholder"])


def _add_constant(ep: torch.export.ExportedProgram, name: str, value: torch.Tensor) -> torch.fx.Node:
    """A new constant input of the program (a placeholder before the user inputs, its spec and its value)."""
    sig = ep.graph_signature
    k = next((i for i, s in enumerate(sig.input_specs) if s.kind == InputKind.USER_INPUT), len(sig.input_specs))
    phs = [n for n in ep.graph.nodes if n.op == "placeholder"]
    where = phs[k] if k < len(phs) else next(n for n in ep.graph.nodes if n.op != "placeholder")
    with ep.graph.inserting_before(where):
        ph = ep.graph.placeholder(name)
    fake = _fake(ep)
    ph.meta["val"] = fake.from_tensor(value, static_shapes=True) if fake is not None else value.to("meta")
    target = f"_vtc_hfuse.{name}"
    sig.input_specs.insert(k, InputSpec(InputKind.CONSTANT_TENSOR, TensorArgument(name), target, None))
    ep.constants[target] = value
    return ph


def call_node(ep: torch.export.ExportedProgram, target: Any, args: tuple, kwargs: dict | None = None) -> torch.fx.Node:
    """A new ``target(*args)`` node at the graph's insertion point, with its value computed on the program's fake
    tensors (what :func:`vtcsearch.core.capture.from_exported` reads shapes and dtypes from)."""
    node = ep.graph.call_function(target, args, kwargs or {})
    vals = torch.fx.node.map_arg(args, lambda a: a.meta["val"])
    fake = _fake(ep)
    if fake is not None:
        with fake:
            node.meta["val"] = target(*vals, **(kwargs or {}))
    else:
        node.meta["val"] = target(*vals, **(kwargs or {}))
    return node


def _drop_if_dead(ep: torch.export.ExportedProgram, n: torch.fx.Node) -> None:
    """Erase ``n`` and its now-unused views / transposes / weight placeholders (and their input specs)."""
    todo = [n]
    while todo:
        x = todo.pop()
        if x.users or x.op not in ("call_function", "placeholder"):
            continue
        if x.op == "call_function" and not (x.target in RESHAPES or x.target in GEMMS or _is_transpose(x)):
            continue
        ins = [a for a in x.all_input_nodes]
        if x.op == "placeholder":
            sig = ep.graph_signature
            spec = next((s for s in sig.input_specs if s.arg.name == x.name), None)
            if spec is None or spec.kind == InputKind.USER_INPUT:
                continue
            sig.input_specs.remove(spec)
        ep.graph.erase_node(x)
        todo.extend(ins)


def _rewrite(ep: torch.export.ExportedProgram, group: list[_Member], consts: dict[str, torch.Tensor],
             k: int) -> str:
    """One GEMM for ``group`` (in export order) and a split into the original products; returns its name."""
    first = group[0]
    dim = -2 if first.form == TRANSPOSED else -1          # N of the stored weight
    w = torch.cat([consts[m.weight] for m in group], dim=dim)
    w_ph = _add_constant(ep, f"hfuse_w{k}", w)
    b_ph = _add_constant(ep, f"hfuse_b{k}", torch.cat([consts[m.bias] for m in group])) \
        if first.bias is not None else None
    bpos, apos, wpos = GEMMS[first.node.target]
    with ep.graph.inserting_before(first.node):
        b = w_ph
        if first.form == TRANSPOSED:
            b0 = first.node.args[wpos]
            b = call_node(ep, b0.target, (w_ph,) + tuple(b0.args[1:]))
        args = list(first.node.args)
        args[wpos] = b
        if bpos is not None:
            args[bpos] = b_ph
        prod = call_node(ep, first.node.target, tuple(args), dict(first.node.kwargs))
        nd = len(prod.meta["val"].shape)
        split = call_node(ep, aten.split_with_sizes.default, (prod, [m.n for m in group], nd - 1))
        for j, m in enumerate(group):
            piece = ep.graph.call_function(operator.getitem, (split, j))
            piece.meta["val"] = split.meta["val"][j]
            m.node.replace_all_uses_with(piece)
    for m in group:
        _drop_if_dead(ep, m.node)
    return prod.name

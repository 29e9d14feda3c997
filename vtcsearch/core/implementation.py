"""Implementation choice: how each compute group runs, and which of its operands must then be dense.

A strategy decides two things: which tensors are virtual (its VTOG edges) and,
per kernel group of :mod:`vtcsearch.core.fusion`, which *implementation* runs it:

``triton``
    vtcsearch's own template, reading and writing every operand through its
    resolved map (the default; what every group ran before implementations
    existed).
``library``
    a vendor kernel on plain strided operands: ``mm`` / ``addmm`` / ``bmm``
    (cuBLAS) for a matmul group, ``aten.convolution`` (cuDNN) for a conv group,
    ``scaled_dot_product_attention`` for an attention group; a fused epilogue
    then runs as one elementwise kernel on the product.
``inductor``
    the group's ATen ops compiled by TorchInductor (max-autotune: its own
    fusion, Triton templates and the vendor libraries, whichever it measures
    fastest), on plain strided operands.  Realization merges consecutive
    inductor groups whose tensors between them are physical into one region, so
    a stretch of the graph that no virtual tensor touches is one Inductor
    program, as torch.compile would build it (:mod:`vtcsearch.codegen.inductor`).

A library kernel cannot read through an arbitrary map.  It reads an operand in
place only when the operand's resolved map is a plain strided view of one
storage (:func:`strided_view_strides`) of a layout the kernel accepts
(:func:`reads_in_place`); otherwise it pays a *residual copy*: a gather into a
dense buffer before the call (inputs), or a scatter after it (outputs).  The
copy is priced by the oracles and done by realization with the same rule, so
a virtual operand is allowed but never free.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Mapping, Sequence

import torch

from .fusion import ATTENTION, CONV, MATMUL, Group

if TYPE_CHECKING:
    from .graph import TensorGraph
    from .mapping import IndexMap

aten = torch.ops.aten

TRITON, LIBRARY, INDUCTOR = "triton", "library", "inductor"
IMPLEMENTATIONS: tuple[str, ...] = (TRITON, LIBRARY, INDUCTOR)
DEFAULT = TRITON
# what a search on a GPU may choose from unless told otherwise (``vtcsearch.compile`` and every runner config):
# Inductor's code and the vendor libraries beside the templates, so what virtual tensors do not improve runs as
# torch.compile would run it; ties go to Inductor, then the library (the order the configs give)
ON_GPU: tuple[str, ...] = (INDUCTOR, LIBRARY, TRITON)

_LIBRARY_MATMULS = {aten.mm.default, aten.bmm.default, aten.addmm.default}


def check_name(impl: str) -> str:
    """``impl`` if it names an implementation (clear error otherwise)."""
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"unknown implementation {impl!r}; choices: {', '.join(IMPLEMENTATIONS)}")
    return impl


def library_op(graph: "TensorGraph", group: Group):
    """The group's product op that a library kernel replaces (None: no library kernel for this group)."""
    if group.kind == ATTENTION:
        i = group.info
        if i.get("softcap") is not None or i.get("window") is not None or i.get("mask") is not None:
            return None          # SDPA has no soft-capping, no sliding window; a matched mask is not passed to it
        if i.get("causal") and not i.get("sdpa") and graph.tensors[i["q"]].shape[-2] != graph.tensors[i["v"]].shape[-2]:
            return None          # SDPA's is_causal is top-left aligned, the matched mask's bottom-right
        return graph.ops[group.ops[0]]
    if group.kind not in (MATMUL, CONV):
        return None
    op = graph.ops[group.ops[0]]
    node = op.node
    if node is None:
        return None
    if group.kind == MATMUL:
        if node.target not in _LIBRARY_MATMULS:
            return None
        if node.target is aten.addmm.default and (node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1
                                                  or len(node.args) > 3):
            return None
        return op
    return op if node.target is aten.convolution.default else None


def inductor_can_run(graph: "TensorGraph", group: Group) -> bool:
    """Inductor compiles any group whose ops are all ATen calls of the captured graph."""
    return all(graph.ops[o].node is not None for o in group.ops)


def choices(graph: "TensorGraph", group: Group, allowed: Sequence[str] = IMPLEMENTATIONS) -> tuple[str, ...]:
    """Implementations that can run ``group`` (``triton`` always), in ``allowed`` order: the order of
    preference, which decides ties (``triton`` last when ``allowed`` leaves it out)."""
    out = []
    for impl in allowed:
        check_name(impl)
        if impl == TRITON or (impl == LIBRARY and library_op(graph, group) is not None) \
                or (impl == INDUCTOR and inductor_can_run(graph, group)):
            out.append(impl)
    if TRITON not in out:
        out.append(TRITON)
    return tuple(out)


def dense_operands(graph: "TensorGraph", group: Group, impl: str) -> tuple[list[str], list[str]]:
    """(inputs, outputs) that implementation ``impl`` of ``group`` reads and writes as plain strided tensors
    (gathered / scattered through a dense buffer when their maps are not): the library call's operands,
    or every operand of the group for Inductor; none for the Triton template."""
    if impl == LIBRARY:
        return library_operands(graph, group)
    if impl == INDUCTOR:
        from .graph import kernel_io
        return kernel_io(graph, group.ops)
    return [], []


def library_operands(graph: "TensorGraph", group: Group) -> tuple[list[str], list[str]]:
    """(inputs, outputs) the library kernel reads and writes: the product's operands, which must be dense.

    The epilogue (the rest of the group) runs after it as an elementwise kernel
    through the maps, so its own operands need nothing.
    """
    if group.kind == ATTENTION and not group.info.get("sdpa"):
        i = group.info
        return [i["q"], i["kt"], i["v"]], [i["out"]]
    op = library_op(graph, group)
    if op is None:
        raise ValueError(f"group {group.name} ({group.kind}) has no library implementation")
    return list(op.inputs), list(op.outputs)


def strided_layout(m: "IndexMap", storage_strides: Mapping[str, Sequence[int]]) -> tuple[tuple[int, ...], int] | None:
    """(element strides, element offset) of ``m`` as a plain strided view of one storage (None: not a view).

    A dim of size 1 gets the stride a contiguous tensor would have there: its index
    never moves, so any stride addresses the same elements, and vendor libraries
    reject a leading dimension of 0 (cuBLAS: ``CUBLAS_STATUS_INVALID_VALUE``).
    """
    if len(m.pieces) != 1 or m.syms() or m.tables():
        return None
    p = m.pieces[0]
    if p.target is None or p.conds or any((lo, hi) != (0, s) for (lo, hi), s in zip(p.region, m.shape)):
        return None
    st = tuple(storage_strides[p.target])
    return m.cached(("strided_layout", st), lambda: _strided_layout(m, p, st))


def _strided_layout(m: "IndexMap", p: "Piece", st: tuple[int, ...]) -> tuple[tuple[int, ...], int] | None:
    off = p.offset(st)
    if not off.is_affine() or off.syms() or off.const < 0:
        return None
    if any(not getattr(a, "name", "").startswith("i") for a, _ in off.terms):
        return None
    strides = [0] * m.ndim
    for a, c in off.terms:
        strides[int(a.name[1:])] += c
    if any(c < 0 for c in strides):
        return None
    for k in reversed(range(m.ndim)):
        if m.shape[k] == 1:
            strides[k] = strides[k + 1] * max(m.shape[k + 1], 1) if k + 1 < m.ndim else 1
    return tuple(strides), off.const


def strided_view_strides(m: "IndexMap", storage_strides: Mapping[str, Sequence[int]]) -> tuple[int, ...] | None:
    """Element strides of ``m`` as a plain strided view of one storage (None: not a view, must be copied)."""
    layout = strided_layout(m, storage_strides)
    return None if layout is None else layout[0]


def _contiguous(shape: Sequence[int], strides: Sequence[int]) -> bool:
    expect = 1
    for s, st in zip(reversed(shape), reversed(strides)):
        if s != 1 and st != expect:
            return False
        expect *= s
    return True


# what SDPA needs of the K^T operand of a matched math-form attention (:func:`operand_kind`)
ATTENTION_KT = "attention_kt"


def operand_kind(group: Group, t: str) -> str:
    """What a library kernel needs of operand ``t`` of ``group`` (:func:`reads_in_place`'s ``kind``): the group's
    kind, except for the K^T operand of a matched math-form attention, which SDPA reads as K: a unit stride on
    K^T's dim -2.  With the unit stride on its last dim instead, every fused backend refuses K and SDPA runs its
    math backend, in fp32 for half inputs (Llama 3 8B's 4096-token prefill pick on an H100: 64 fp32 GEMMs and 32
    softmax kernels, 554 ms against Inductor's 125 ms)."""
    if group.kind == ATTENTION and not group.info.get("sdpa") and t == group.info.get("kt"):
        return ATTENTION_KT
    return group.kind


def reads_in_place(kind: str, shape: Sequence[int], strides: Sequence[int] | None) -> bool:
    """Whether a library kernel of group ``kind`` uses an operand with these strides without a copy.

    Matmuls (cuBLAS) take any batch strides and either of the last two dims
    contiguous (a transposed operand is free); convolutions and attention take
    dense operands (attention: a unit stride on the last dim, on the one before
    it for K^T: :func:`operand_kind`); Inductor
    (``kind="inductor"``) compiles for whatever strides it is given, but never
    writes an output with a broadcast (0) stride.
    """
    if strides is None:
        return False
    if math.prod(shape) <= 1:
        return True
    if kind == INDUCTOR:
        return all(st != 0 or s == 1 for s, st in zip(shape, strides))
    if kind == MATMUL:
        if len(shape) < 2:
            return _contiguous(shape, strides)
        r, c = shape[-2], shape[-1]
        sr, sc = strides[-2], strides[-1]
        return (sc == 1 or c == 1) and sr >= c or (sr == 1 or r == 1) and sc >= r
    if kind == ATTENTION:
        return shape[-1] == 1 or strides[-1] == 1
    if kind == ATTENTION_KT:
        return shape[-2] == 1 or strides[-2] == 1
    return _contiguous(shape, strides)


def needs_copy(kind: str, m: "IndexMap", storage_strides: Mapping[str, Sequence[int]]) -> bool:
    """A library operand with map ``m`` must be gathered (input) or scattered (output) through a dense buffer."""
    return not reads_in_place(kind, m.shape, strided_view_strides(m, storage_strides))


def parse(spec: "str | Mapping[str, str] | None") -> dict[str, str]:
    """A JSON implementation map, checked (group -> implementation)."""
    return {str(g): check_name(i) for g, i in (spec or {}).items()}

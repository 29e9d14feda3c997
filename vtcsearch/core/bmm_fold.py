"""Batch folding: a ``bmm`` whose B operand is one matrix broadcast over the batch becomes one ``mm``.

``x @ W`` on a 3-D ``x`` that is not contiguous (a transposed activation: torchvision's ``nn.MultiheadAttention``
projects its sequence-first input) is exported as

    bmm(view(expand(x)), view(expand(t(W), [B, K, N])))   ->  [B, M, N]

B small GEMMs of M rows each that read the same weight: at M = 16 (ViT-B/16 at batch 16, B = 197 tokens) a
GEMM template's tiles of 64 rows run a quarter full, 102 us per call on an H100 where torch.compile's one cuBLAS
GEMM took 72 us.  :func:`fold_broadcast_bmm` rewrites it as the GEMM torch.compile runs,

    view(mm(reshape(x, [B * M, K]), W), [B, M, N])

The reshape is an ordinary movement op: virtual (the GEMM reads ``x`` through its map, rows in any order) or a
copy, as the search decides.  The product's values are those of the bmm up to the GEMM's summation order.
"""
from __future__ import annotations

import torch

from .hfuse import RESHAPES, call_node

aten = torch.ops.aten

__all__ = ["fold_broadcast_bmm"]


def _shape(n: torch.fx.Node) -> tuple[int, ...]:
    return tuple(n.meta["val"].shape)


def broadcast_matrix(b: torch.fx.Node) -> torch.fx.Node | None:
    """The 2-D node that bmm operand ``b`` ([B, K, N]) is broadcast from over its batch, or None: ``b`` is
    ``expand(W, [B, K, N])`` of a [K, N] ``W``, through views that keep its shape."""
    while b.op == "call_function" and b.target in RESHAPES and isinstance(b.args[0], torch.fx.Node) \
            and _shape(b) == _shape(b.args[0]):
        b = b.args[0]
    if b.op != "call_function" or b.target is not aten.expand.default or not isinstance(b.args[0], torch.fx.Node):
        return None
    w = b.args[0]
    return w if len(_shape(w)) == 2 and _shape(b)[1:] == _shape(w) else None


def fold_broadcast_bmm(ep: torch.export.ExportedProgram) -> list[str]:
    """Rewrite ``ep`` in place: every ``bmm(x, expand(W))`` of a [K, N] ``W`` becomes
    ``view(mm(reshape(x, [B * M, K]), W), [B, M, N])``.  Returns the names of the new ``mm`` nodes."""
    graph = ep.graph
    folded: list[str] = []
    for n in list(graph.nodes):
        if n.op != "call_function" or n.target is not aten.bmm.default:
            continue
        x, b = n.args
        w = broadcast_matrix(b)
        if w is None:
            continue
        batch, m, k = _shape(x)
        with graph.inserting_before(n):
            rows = call_node(ep, aten.reshape.default, (x, [batch * m, k]))
            prod = call_node(ep, aten.mm.default, (rows, w))
            out = call_node(ep, aten.view.default, (prod, [batch, m, _shape(w)[1]]))
        n.replace_all_uses_with(out)
        graph.erase_node(n)
        folded.append(prod.name)
    if folded:
        graph.eliminate_dead_code()     # the expands and views that fed the bmm
        graph.lint()
        ep.graph_module.recompile()
    return folded

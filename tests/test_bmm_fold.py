"""Batch folding (issue 12): a bmm of one matrix broadcast over the batch is captured as one mm.

A linear layer on a transposed 3-D activation (``nn.MultiheadAttention`` on its sequence-first input) exports
as ``bmm(x, expand(W))``: B GEMMs of a few rows each.  Capture folds it into ``mm(reshape(x), W)``, which equals
eager through vtcsearch with and without virtual tensors; a bmm of two batched operands stays a bmm.
"""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

pytest.importorskip("triton")

from vtcsearch.core.bmm_fold import broadcast_matrix  # noqa: E402
from vtcsearch.core.capture import capture, export  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore::RuntimeWarning"), pytest.mark.filterwarnings("ignore::UserWarning")]
warnings.filterwarnings("ignore")


class SeqFirstProjection(nn.Module):
    """A linear layer on a batch-first activation transposed to sequence-first (as ``nn.MultiheadAttention``
    projects), then a product of two batched operands."""

    def __init__(self):
        super().__init__()
        self.w, self.b = nn.Parameter(torch.randn(12, 8)), nn.Parameter(torch.randn(12))

    def forward(self, x, y):
        p = F.linear(x.transpose(0, 1), self.w, self.b)   # [S, B, 12]: a bmm over the broadcast weight
        return torch.bmm(p, y) + 1                         # two batched operands: stays a bmm


def _targets(g) -> list[str]:
    return sorted(o.target_name for o in g.ops.values() if o.category == "matmul")


def test_broadcast_weight_bmm_is_captured_as_one_mm():
    torch.manual_seed(0)
    m, x, y = SeqFirstProjection(), torch.randn(3, 5, 8), torch.randn(5, 12, 4)
    ep = export(m, (x, y))
    bmms = [n for n in ep.graph.nodes if n.target is torch.ops.aten.bmm.default]
    assert [broadcast_matrix(n.args[1]) is not None for n in bmms] == [True, False]   # as exported
    assert _targets(capture(m, (x, y))) == ["bmm.default", "mm.default"]


@pytest.mark.parametrize("solver", ["none", "ilp"])
def test_folded_bmm_equals_eager(solver):
    import vtcsearch
    torch.manual_seed(0)
    m, x, y = SeqFirstProjection(), torch.randn(3, 5, 8), torch.randn(5, 12, 4)
    with torch.no_grad():
        ref = m(x, y)
    c = vtcsearch.compile(m, (x, y), solver=solver)
    got = c(x, y)
    torch.testing.assert_close(got[0] if isinstance(got, (list, tuple)) else got, ref, rtol=1e-5, atol=1e-5)

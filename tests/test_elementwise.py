"""Fused elementwise regions round like eager: fp16/bf16 results are bit-identical to PyTorch's.

``vtcsearch.codegen.elementwise`` keeps values in fp32 registers and rounds to the
tensor's dtype after every op (``round_to``); without that rounding a fused chain
keeps extra precision and differs from eager in the last bits.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

from vtcsearch.codegen.realize import realize
from vtcsearch.core.capture import capture
from vtcsearch.core.strategy import Strategy
from vtcsearch.core.vtog import build_vtog

pytest.importorskip("triton")


class Chain(nn.Module):
    """Correctly rounded arithmetic only (no transcendentals, no division): every step's bits are defined by IEEE.

    (Adding or subtracting a Python scalar is left out: eager on the CPU rounds ``x - 0.1`` differently
    from ``x * 0.3``, a separate question from the per-op rounding this test guards.)
    """

    def forward(self, x, y, z):
        a = x * y + z
        b = a * 0.3 - y
        c = (b + x) * (a - z)
        d = c * (y * y + z)
        return torch.relu(d - x) + a * 1.7


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_fused_region_bit_identical_to_eager(dtype, monkeypatch):
    monkeypatch.setenv("VTC_AUTOTUNE", "0")
    torch.manual_seed(0)
    m = Chain().eval()
    xs = tuple(torch.randn(4, 64, 33, dtype=dtype) for _ in range(3))
    g = capture(m, xs)
    assert [gr.kind for gr in g.groups.values()] == ["elementwise"]      # one fused region
    with torch.no_grad():
        ref = m(*xs)
    exe = realize(g, Strategy(build_vtog(g), []), m)
    assert exe.summary()["by_lowering"] == {"pointwise": 1} and not exe.summary()["fallbacks"]
    out = exe(*xs)[0]
    assert out.dtype == dtype
    assert torch.equal(out, ref), f"{(out != ref).sum().item()} of {ref.numel()} elements differ from eager"
    # the check has teeth: the same chain kept in fp32 differs from eager's rounding after every op
    with torch.no_grad():
        wide = m(*(x.float() for x in xs)).to(dtype)
    assert not torch.equal(wide, ref)

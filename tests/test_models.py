"""Real model code through ``vtcsearch.compile`` (issue 14): attention and norm forms, call semantics, crashes.

Tiny sizes on the CPU (Triton's interpreter); the full-size attention path is a GPU test.
Every compiled call is compared with eager.
"""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import vtcsearch
from vtcsearch.core.capture import CaptureError, capture

pytest.importorskip("triton")
pytestmark = [pytest.mark.filterwarnings("ignore::RuntimeWarning"), pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]

GPU = torch.cuda.is_available() and __import__("os").environ.get("TRITON_INTERPRET") != "1"


@pytest.fixture(autouse=True)
def _one_config(monkeypatch):
    monkeypatch.setenv("VTC_AUTOTUNE", "0")


def compiled(model: nn.Module, args, solver: str = "greedy") -> vtcsearch.api.Compiled:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return vtcsearch.compile(model, args, solver=solver)


def lowerings(fast) -> dict[str, int]:
    return fast.executable.summary()["by_lowering"]


# ---------------------------------------------------------------------------
# attention forms
# ---------------------------------------------------------------------------

class SDPA(nn.Module):
    def __init__(self, causal: bool = False, gqa: bool = False, masked: bool = False):
        super().__init__()
        self.causal, self.gqa, self.masked = causal, gqa, masked

    def forward(self, q, k, v, mask=None):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal, enable_gqa=self.gqa)


@pytest.mark.parametrize("causal,gqa", [(False, False), (True, False), (False, True)])
def test_sdpa_runs_in_the_attention_template(causal, gqa):
    torch.manual_seed(0)
    q = torch.randn(1, 4, 8, 16)
    k, v = torch.randn(1, 2 if gqa else 4, 8, 16), torch.randn(1, 2 if gqa else 4, 8, 16)
    m = SDPA(causal, gqa)
    fast = compiled(m, (q, k, v))
    assert lowerings(fast).get("attention") == 1 and not fast.executable.summary()["fallbacks"]
    torch.testing.assert_close(fast(q, k, v), m(q, k, v), rtol=1e-4, atol=1e-4)


def test_sdpa_with_a_mask_is_one_op_not_its_math():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 4, 2, 16), torch.randn(1, 4, 8, 16), torch.randn(1, 4, 8, 16)
    mask = torch.zeros(1, 1, 2, 8)
    mask[..., 6:] = float("-inf")
    m = SDPA()
    g = capture(m, (q, k, v, mask))
    assert [o.target_name for o in g.ops.values() if o.kind == "compute"] == ["scaled_dot_product_attention.default"]
    fast = compiled(m, (q, k, v, mask))
    torch.testing.assert_close(fast(q, k, v, mask), m(q, k, v, mask), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------
# norms
# ---------------------------------------------------------------------------

class PreNorm(nn.Module):
    """A pre-norm residual block: the norm's input is also read by the residual add."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.norm, self.lin = norm, nn.Linear(32, 32)

    def forward(self, x):
        return x + self.lin(self.norm(x))


class LlamaStyleRMSNorm(nn.Module):
    """transformers' ``LlamaRMSNorm`` (same code)."""

    def __init__(self, n: int, eps: float = 1e-6):
        super().__init__()
        self.weight, self.variance_epsilon = nn.Parameter(torch.randn(n)), eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm"])
def test_norm_of_a_prenorm_block_is_matched(kind):
    torch.manual_seed(0)
    norm = LlamaStyleRMSNorm(32) if kind == "rmsnorm" else nn.LayerNorm(32)
    if kind == "layernorm":
        with torch.no_grad():
            norm.weight.normal_(), norm.bias.normal_()
    m = PreNorm(norm).eval()
    x = torch.randn(2, 5, 32)
    fast = compiled(m, (x,))
    summ = fast.executable.summary()
    assert summ["by_lowering"].get(kind) == 1 and not summ["fallbacks"], summ
    torch.testing.assert_close(fast(x), m(x), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------
# call semantics and crashes
# ---------------------------------------------------------------------------

class PositionEmbedding(nn.Module):
    """Token ids made by an ATen fallback (cumsum), then an int64 embedding lookup through them."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(600, 16)

    def forward(self, mask):
        return self.emb(torch.cumsum(mask, -1) * 100 + 7)


def test_indices_made_by_a_fallback_are_valid_when_building():
    torch.manual_seed(0)
    m = PositionEmbedding()
    a = torch.ones(2, 5, dtype=torch.int64)
    fast = compiled(m, (a,))   # crashed (segfault) or read garbage indices before
    assert fast.executable.summary()["fallbacks"]
    torch.testing.assert_close(fast(a), m(a))
    assert fast.executable._scratch((4,), torch.int64).eq(0).all()


class AddInPlace(nn.Module):
    def forward(self, x, y):
        x.add_(1)
        return x * y


def test_in_place_op_on_an_input_is_applied():
    torch.manual_seed(0)
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    fast = compiled(AddInPlace(), (x.clone(), y))
    x_eager, x_fast = x.clone(), x.clone()
    ref = AddInPlace()(x_eager, y)
    out = fast(x_fast, y)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(x_fast, x_eager)


class Scaled(nn.Module):
    def forward(self, x, alpha: float):
        return x * alpha


def test_a_python_scalar_argument_is_not_silently_specialised():
    x = torch.randn(8)
    fast = compiled(Scaled(), (x, 2.0))
    torch.testing.assert_close(fast(x, 2.0), x * 2.0)
    with pytest.raises(ValueError, match="argument 1 was compiled as the constant 2.0, got 3.0"):
        fast(x, 3.0)


def test_zero_size_input_is_refused_in_one_line():
    with pytest.raises(CaptureError, match="zero size") as e:
        compiled(nn.Linear(8, 8), (torch.randn(0, 8),))
    assert "\n" not in str(e.value)

"""Prefill attention in the attention template (issue 15): the reference-style chain of the project's Llama 3
and Gemma 2 workloads (``Q @ K^T``, scale, soft-cap, ``+ mask``, softmax, ``@ V``) runs as one attention
kernel, its in-graph causal / sliding-window mask proven at compile time (masked by index, fully-masked KV
tiles skipped), any other mask read through its map.  Tiny sizes on the CPU (Triton's interpreter); the
Llama 3 8B-size layer is a GPU test.
"""
from __future__ import annotations

import math
import os
import warnings

import pytest
import torch
from torch import nn

import vtcsearch
from experiments.workloads import build_workload
from vtcsearch.core.capture import capture
from vtcsearch.core.fusion import classify_mask

pytest.importorskip("triton")
pytestmark = [pytest.mark.filterwarnings("ignore::RuntimeWarning"), pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]

GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"


@pytest.fixture(autouse=True)
def _one_config(monkeypatch):
    monkeypatch.setenv("VTC_AUTOTUNE", "0")


def compiled(model: nn.Module, args) -> vtcsearch.api.Compiled:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return vtcsearch.compile(model, args, solver="greedy", implementations=("triton",))


def attention_groups(g) -> list:
    return [gr for gr in g.groups.values() if gr.kind == "attention"]


def assert_attention_in_template(fast, n_layers: int) -> None:
    """One attention kernel per layer, and no ATen fallback runs any op of an attention chain."""
    summ = fast.executable.summary()
    assert summ["by_lowering"].get("attention") == n_layers
    groups = attention_groups(fast.graph)
    assert len(groups) == n_layers
    chain_ops = {o for gr in groups for o in gr.ops}
    fallback_ops = {o for f in summ["fallbacks"] for o in fast.graph.groups[f].ops}
    assert not chain_ops & fallback_ops
    assert not any(fast.graph.ops[o].target_name.startswith("_softmax") for o in fallback_ops)


# ---------------------------------------------------------------------------
# the workloads' prefill: layer and whole model, fp32 and bf16
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("part", ["layer", "model"])
@pytest.mark.parametrize("name", ["llama3", "gemma2"])
def test_prefill_runs_attention_in_the_template_and_equals_eager(name, part, dtype):
    torch.manual_seed(0)
    w = build_workload(name, size="tiny", device="cpu", part=part, phase="prefill", dtype=dtype,
                       n_layers=2, context=32)
    ref = w.model(*w.example_inputs)
    fast = compiled(w.model, w.example_inputs)
    assert_attention_in_template(fast, 2)
    groups = attention_groups(fast.graph)
    # the in-graph masks are proven: causal everywhere, Gemma 2's even (local) layer banded by its window of 16
    assert all(gr.info["causal"] and gr.info["mask"] is None and gr.info["unread"] for gr in groups)
    windows = sorted((gr.info["window"] or 0) for gr in groups)
    assert windows == ([0, 16] if name == "gemma2" else [0, 0])
    if name == "gemma2":
        assert all(gr.info["softcap"] == 50.0 for gr in groups)
    got = fast(*w.example_inputs)
    if dtype == torch.float32:
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    else:   # eager rounds every step (scale, soft-cap, mask add) to bf16, the template keeps them in fp32
        err = ((got.float() - ref.float()).norm() / ref.float().norm()).item()
        assert err < 1e-2, err


def test_dropping_the_mask_is_caught():
    """Compiled without the mask's causal / window flags, the Gemma 2 prefill differs from eager: the
    numerical comparison above does see the mask."""
    from vtcsearch.codegen.realize import realize
    torch.manual_seed(0)
    w = build_workload("gemma2", size="tiny", device="cpu", part="layer", phase="prefill", n_layers=2, context=32)
    ref = w.model(*w.example_inputs)
    fast = compiled(w.model, w.example_inputs)
    for gr in attention_groups(fast.graph):
        gr.info.update(causal=False, window=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exe = realize(fast.graph, fast.strategy, w.model)
    (got,) = exe(*[a for a in w.example_inputs if isinstance(a, torch.Tensor)])[:1]
    assert (got - ref).abs().max() > 1e-2


# ---------------------------------------------------------------------------
# masks that are not provably causal are read; the proof itself
# ---------------------------------------------------------------------------

class RefAttention(nn.Module):
    """Reference-style attention over [B, H, S, D] with an additive mask: a buffer, or an argument."""

    def __init__(self, mask: torch.Tensor | None = None, softcap: float | None = None):
        super().__init__()
        self.softcap = softcap
        if mask is not None:
            self.register_buffer("mask", mask)
        else:
            self.mask = None

    def forward(self, q, k, v, mask=None):
        mask = self.mask if mask is None else mask
        s = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(q.shape[-1])
        if self.softcap:
            s = torch.tanh(s / self.softcap) * self.softcap
        s = s + mask
        return torch.matmul(torch.softmax(s.float(), dim=-1).type_as(q), v)


def _qkv(sq: int = 24, skv: int = 40):
    torch.manual_seed(0)
    return torch.randn(1, 4, sq, 16), torch.randn(1, 4, skv, 16), torch.randn(1, 4, skv, 16)


@pytest.mark.parametrize("where", ["buffer", "argument", "per_head"])
def test_a_mask_that_is_not_constant_is_read_through_its_map(where):
    q, k, v = _qkv()
    mask = torch.randn(1, 4 if where == "per_head" else 1, 24, 40)
    mask[..., 30:] = float("-inf")
    m = RefAttention(None if where == "argument" else mask)
    args = (q, k, v, mask) if where == "argument" else (q, k, v)
    fast = compiled(m, args)
    assert_attention_in_template(fast, 1)
    (gr,) = attention_groups(fast.graph)
    assert gr.info["mask"] is not None and not gr.info["causal"] and not gr.info["unread"]
    torch.testing.assert_close(fast(*args), m(*args), rtol=1e-4, atol=1e-4)


class InGraphMask(nn.Module):
    """The mask made in the graph, as the workloads make it; ``kind`` picks its pattern."""

    def __init__(self, kind: str, softcap: float | None = None):
        super().__init__()
        self.kind, self.softcap = kind, softcap

    def forward(self, q, k, v):
        sq, skv = q.shape[2], k.shape[2]
        i = torch.arange(skv - sq, skv)[:, None]
        j = torch.arange(skv)[None, :]
        visible = {"causal": j <= i, "window": (j <= i) & (i - j < 7), "stripes": (j % 3) != 1}[self.kind]
        mask = torch.zeros(sq, skv).masked_fill(~visible, float("-inf"))
        s = torch.matmul(q, k.transpose(2, 3)) * (q.shape[-1] ** -0.5)
        if self.softcap:
            s = torch.tanh(s / self.softcap) * self.softcap
        return torch.matmul(torch.softmax(s + mask, dim=-1), v)


@pytest.mark.parametrize("kind,softcap", [("causal", None), ("window", None), ("window", 5.0), ("stripes", None)])
def test_in_graph_masks_chunked_prefill(kind, softcap):
    """Sq < Skv (a chunk against a cache): causal and banded masks proven bottom-right; others read."""
    q, k, v = _qkv()
    m = InGraphMask(kind, softcap)
    fast = compiled(m, (q, k, v))
    assert_attention_in_template(fast, 1)
    (gr,) = attention_groups(fast.graph)
    assert (gr.info["causal"], gr.info["window"]) == {"causal": (True, None), "window": (True, 7),
                                                      "stripes": (False, None)}[kind]
    assert (gr.info["mask"] is None) == (kind != "stripes")
    torch.testing.assert_close(fast(q, k, v), m(q, k, v), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind,sq,library", [("causal", 40, True), ("causal", 24, False), ("window", 40, False),
                                             ("stripes", 40, False)])
def test_library_sdpa_only_for_masks_it_can_express(kind, sq, library):
    """The SDPA library implementation of a masked chain: is_causal for a square causal mask (top-left ==
    bottom-right), never for a window, a read mask, or a non-square causal one (a silent wrong answer)."""
    from vtcsearch.codegen.realize import realize
    from vtcsearch.core import implementation as im
    from vtcsearch.core.strategy import Strategy
    from vtcsearch.core.vtog import build_vtog
    q, k, v = _qkv(sq, 40)
    m = InGraphMask(kind)
    g = capture(m, (q, k, v))
    (gr,) = attention_groups(g)
    assert (im.LIBRARY in im.choices(g, gr)) == library
    if library:
        exe = realize(g, Strategy(build_vtog(g), (), {gr.name: im.LIBRARY}), m)
        assert [st.lowering for st in exe.steps if st.name == gr.name] == ["library"]
        torch.testing.assert_close(exe(q, k, v)[0], m(q, k, v), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("causal", [False, True])
def test_causal_prefill_launches_the_longest_row_blocks_first(causal):
    """Causal row blocks see more keys the later they are: the grid starts from the last (FlashAttention 2's
    order), so the short blocks fill the tail; the result is the same."""
    from vtcsearch.codegen.kernels import Operand, attention
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 160, 16) for _ in range(3))     # 3 row blocks of 64
    out = torch.empty(1, 2, 160, 16)
    plans = attention(*(Operand.dense(t, n) for t, n in ((q, "q"), (k, "k"), (v, "v"), (out, "o"))), causal=causal)
    assert plans[0].grid[0] == 3 and ("2 - tl.program_id(0)" in plans[0].source) == causal
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


def test_mask_added_before_the_scale_is_not_matched():
    """The template adds the mask after scale and soft-cap: another order is not its chain."""
    class Early(nn.Module):
        def forward(self, q, k, v, mask):
            s = (torch.matmul(q, k.transpose(2, 3)) + mask) * 0.25
            return torch.matmul(torch.softmax(s, dim=-1), v)
    q, k, v = _qkv(8, 8)
    g = capture(Early(), (q, k, v, torch.zeros(8, 8)))
    assert not attention_groups(g)


def test_classify_mask():
    inf = float("-inf")
    causal = torch.zeros(4, 6).masked_fill(torch.arange(6)[None] > torch.arange(2, 6)[:, None], inf)
    assert classify_mask(causal, 4, 6) == (True, None)
    assert classify_mask(causal[None, None], 4, 6) == (True, None)
    assert classify_mask(torch.zeros(1, 6), 4, 6) == (False, None)
    assert classify_mask(causal.T.contiguous(), 6, 4) is None            # Sq > Skv: never elided
    assert classify_mask(causal.masked_fill(causal == 0, 1.0), 4, 6) is None   # not 0 / -inf
    top_left = torch.zeros(4, 6).masked_fill(torch.arange(6)[None] > torch.arange(4)[:, None], inf)
    assert classify_mask(top_left, 4, 6) is None                         # the template's causal is bottom-right
    assert classify_mask(torch.zeros(2, 4, 6), 4, 6) is None             # differs per batch: read instead


def test_prefill_pricing_halves_causal_attention():
    """The analytical model prices the causal prefill attention at about half the FLOPs of the full one."""
    from cost_models.accounting import attention_density
    w = build_workload("llama3", size="tiny", device="cpu", part="layer", phase="prefill", context=256)
    g = capture(w.model, w.example_inputs)
    (gr,) = attention_groups(g)
    assert gr.info["causal"]
    assert 0.5 < attention_density(g, gr.name) < 0.7     # 4x4 tiles of 64: 10 of 16
    gr.info["causal"] = False
    assert attention_density(g, gr.name) == 1.0


def test_prefill_attention_priced_at_tensor_core_rate_and_causal_half():
    """Llama 3 8B's 4096-token prefill attention (captured on the meta device): the analytical H200 model
    prices the template compute-bound, at about half the full attention's time when causal, without
    reading the proven mask."""
    from cost_models import get_oracle
    from vtcsearch.core.strategy import Strategy
    from vtcsearch.core.vtog import build_vtog
    w = build_workload("llama3", size="full", device="meta", part="attention", phase="prefill")
    g = capture(w.model, w.example_inputs)
    (gr,) = attention_groups(g)
    assert gr.info["causal"] and gr.info["window"] is None and gr.info["unread"]

    def row() -> dict:
        ev = get_oracle("analytical", hardware="H200").evaluate(Strategy(build_vtog(g), []))
        return next(r for r in ev.rows if r["unit"] == gr.name)

    ev = get_oracle("analytical", hardware="H200").evaluate(Strategy(build_vtog(g), []))
    assert ev.peak_bytes < 32 * 4096 * 4096 * 2     # the scores stay in the kernel: never counted in the peak
    causal = row()
    assert causal["t_compute"] > causal["t_mem"]                     # compute-bound at 4096 tokens
    assert causal["bytes"] <= 4 * 32 * 4096 * 128 * 2                # q, k, v, out: the mask is not read
    full_flops = 4.0 * 32 * 4096 * 4096 * 128
    assert 0.5 * full_flops <= causal["flops"] < 0.53 * full_flops
    gr.info.update(causal=False, unread=[])
    full = row()
    assert 1.9 < full["t_compute"] / causal["t_compute"] < 2.0
    assert full["bytes"] - causal["bytes"] >= 4096 * 4096 * 2       # a read mask is priced


# ---------------------------------------------------------------------------
# Llama 3 8B size (someone with a GPU runs this)
# ---------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
def test_gpu_llama3_8b_prefill_layer_matches_eager():
    torch.manual_seed(0)
    w = build_workload("llama3", size="full", device="cuda", part="layer", phase="prefill", n_layers=1,
                       context=4096)
    with torch.no_grad():
        ref = w.model(*w.example_inputs)
    fast = compiled(w.model, w.example_inputs)
    assert_attention_in_template(fast, 1)
    (gr,) = attention_groups(fast.graph)
    assert gr.info["causal"] and gr.info["mask"] is None
    got = fast(*w.example_inputs)
    err = ((got.float() - ref.float()).norm() / ref.float().norm()).item()
    assert err < 2e-2, err

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
# these tests read vtcsearch's own lowerings: on a GPU, compile's default would hand groups to Inductor and cuDNN
TEMPLATES = ("triton",)


@pytest.fixture(autouse=True)
def _one_config(monkeypatch):
    monkeypatch.setenv("VTC_AUTOTUNE", "0")


def compiled(model: nn.Module, args, solver: str = "greedy") -> vtcsearch.api.Compiled:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return vtcsearch.compile(model, args, solver=solver, implementations=TEMPLATES)


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


@pytest.mark.parametrize("kind", ["additive", "bool", "per_head", "gqa"])
def test_sdpa_with_a_mask_runs_in_the_attention_template(kind):
    """SDPA with an explicit attn_mask (additive -inf, boolean, one per head, with GQA) is one op, lowered to
    the attention template with the mask read tile by tile through its map (no fallback)."""
    torch.manual_seed(0)
    hk = 2 if kind == "gqa" else 4
    q, k, v = torch.randn(1, 4, 2, 16), torch.randn(1, hk, 40, 16), torch.randn(1, hk, 40, 16)
    if kind == "bool":
        mask = torch.rand(1, 1, 2, 40) > 0.3
        mask[..., 0] = True
    else:
        mask = torch.randn(1, 4 if kind == "per_head" else 1, 2, 40)
        mask[..., 33:] = float("-inf")
    m = SDPA(gqa=kind == "gqa")
    g = capture(m, (q, k, v, mask))
    assert [o.target_name for o in g.ops.values() if o.kind == "compute"] == ["scaled_dot_product_attention.default"]
    fast = compiled(m, (q, k, v, mask))
    assert lowerings(fast).get("attention") == 1 and not fast.executable.summary()["fallbacks"]
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


def test_relu6_conv_block_runs_without_fallbacks():
    """MobileNet's Conv-BN-ReLU6 (``hardtanh``): one fused conv kernel, no ATen fallback (issue 14's zoo)."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU6(), nn.Hardtanh(-0.5, 0.25)).eval()
    x = torch.randn(1, 4, 8, 8) * 4
    fast = compiled(m, (x,))
    assert not fast.executable.summary()["fallbacks"], fast.executable.summary()
    torch.testing.assert_close(fast(x), m(x), rtol=1e-4, atol=1e-4)


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


# ---------------------------------------------------------------------------
# attention ops without a pattern, transformers' Llama decoder layer, StaticCache
# ---------------------------------------------------------------------------

def test_an_attention_kernel_without_a_pattern_falls_back_instead_of_crashing():
    """On the GPU, export leaves ``_scaled_dot_product_efficient_attention`` ops: kernels of kind attention
    that no pattern described (KeyError: 'batch' in lower_attention before).  Same kernel on the CPU."""
    from vtcsearch.codegen.realize import realize
    from vtcsearch.core.strategy import Strategy
    from vtcsearch.core.vtog import build_vtog
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 16) for _ in range(3))
    g = capture(SDPA(), (q, k, v))
    (gr,) = [gr for gr in g.groups.values() if gr.kind == "attention"]
    gr.info = {}
    exe = realize(g, Strategy(build_vtog(g), []), SDPA())
    assert list(exe.summary()["fallbacks"]) == [gr.name]
    torch.testing.assert_close(exe(q, k, v)[0], F.scaled_dot_product_attention(q, k, v), rtol=1e-4, atol=1e-4)


def _llama_config(hidden: int, inter: int, heads: int, kv_heads: int, max_pos: int):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=hidden, intermediate_size=inter, num_attention_heads=heads,
                                   num_key_value_heads=kv_heads, num_hidden_layers=1, max_position_embeddings=max_pos)
    cfg._attn_implementation = "sdpa"
    return cfg


class LlamaDecodeStep(nn.Module):
    """transformers' ``LlamaDecoderLayer`` in decode: KV cache in module buffers written by ``index_copy_``,
    SDPA attention with an explicit mask (the issue-14 crash's structure)."""

    def __init__(self, cfg, batch: int, max_len: int):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding
        self.layer, self.rope = LlamaDecoderLayer(cfg, layer_idx=0), LlamaRotaryEmbedding(cfg)
        hd = cfg.hidden_size // cfg.num_attention_heads
        self.register_buffer("k_cache", torch.zeros(batch, cfg.num_key_value_heads, max_len, hd))
        self.register_buffer("v_cache", torch.zeros(batch, cfg.num_key_value_heads, max_len, hd))

    def forward(self, x, pos, mask):
        step = self

        class Cache:
            def update(self, k, v, layer_idx, *args, **kwargs):
                step.k_cache.index_copy_(2, pos, k.to(step.k_cache.dtype))
                step.v_cache.index_copy_(2, pos, v.to(step.v_cache.dtype))
                return step.k_cache, step.v_cache

        pe = self.rope(x, pos[None].expand(x.shape[0], -1))
        out = self.layer(x, attention_mask=mask, position_ids=pos[None], past_key_values=Cache(),
                         position_embeddings=pe)
        return out[0] if isinstance(out, tuple) else out


def _decode_inputs(cfg, batch: int, max_len: int, at: int, device="cpu", dtype=torch.float32):
    x = torch.randn(batch, 1, cfg.hidden_size, device=device, dtype=dtype)
    pos = torch.tensor([at], device=device)
    mask = torch.full((batch, 1, 1, max_len), float("-inf"), device=device, dtype=dtype)
    mask[..., :at + 1] = 0
    return x, pos, mask


def _check_decode(m: nn.Module, args, rtol: float, atol: float):
    fast = compiled(m, args)
    caches = {n: b.clone() for n, b in m.named_buffers() if "cache" in n}
    ref = m(*args)
    ref_caches = {n: b.clone() for n, b in m.named_buffers() if "cache" in n}
    for n, b in m.named_buffers():
        if n in caches:
            b.copy_(caches[n])
    out = fast(*args)
    torch.testing.assert_close(out, ref, rtol=rtol, atol=atol)
    for n, b in m.named_buffers():
        if n in ref_caches:
            torch.testing.assert_close(b, ref_caches[n], rtol=rtol, atol=atol)
    return fast


def test_transformers_llama_decoder_layer_decode_tiny():
    cfg = _llama_config(64, 128, 4, 2, 16)
    torch.manual_seed(0)
    m = LlamaDecodeStep(cfg, 1, 16).eval()
    with torch.no_grad():
        m.k_cache.normal_(), m.v_cache.normal_()
    fast = _check_decode(m, _decode_inputs(cfg, 1, 16, 5), 1e-4, 1e-4)
    assert fast.executable.summary()["by_lowering"].get("rmsnorm") == 2


def test_transformers_static_cache_is_a_capture_error_then_works_as_buffers():
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding
    from vtcsearch.core.capture import static_cache_as_buffers
    cfg = _llama_config(64, 128, 4, 2, 16)

    class Step(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer, self.rope = LlamaDecoderLayer(cfg, 0), LlamaRotaryEmbedding(cfg)
            self.cache = transformers.StaticCache(cfg, max_cache_len=16)
            self.cache.early_initialization(1, 2, 16, torch.float32, torch.device("cpu"))

        def forward(self, x, pos, mask):
            out = self.layer(x, attention_mask=mask, position_ids=pos[None], past_key_values=self.cache,
                             position_embeddings=self.rope(x, pos[None]))
            return out[0] if isinstance(out, tuple) else out

    torch.manual_seed(0)
    m = Step().eval()
    x, pos = torch.randn(1, 1, 64), torch.tensor([0])
    mask = torch.zeros(1, 1, 1, 16, dtype=torch.bool)
    mask[..., 0] = True
    with pytest.raises(CaptureError, match="static_cache_as_buffers") as e:
        compiled(m, (x, pos, mask))
    assert "\n" not in str(e.value)
    static_cache_as_buffers(m, m.cache)
    _check_decode(m, (x, pos, mask), 1e-4, 1e-4)
    assert m.cache.layers[0].keys.abs().sum() > 0     # eager sees the cache the compiled call wrote


def test_a_transformers_model_returning_its_dynamic_cache_says_what_to_do_then_compiles_without():
    """transformers' decoder models return a DynamicCache unless ``use_cache`` is off (found held-out with OPT,
    GPT-NeoX, Falcon and StableLM: export's own message asked to register a pytree)."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.OPTConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, ffn_dim=64,
                                 num_attention_heads=2, max_position_embeddings=64, word_embed_proj_dim=32)
    torch.manual_seed(0)
    m = transformers.OPTModel(cfg).eval()
    ids = torch.randint(0, 100, (1, 8))
    with pytest.raises(CaptureError, match="use_cache = False") as e:
        compiled(m, (ids,))
    assert "\n" not in str(e.value)
    m.config.use_cache = False
    with torch.no_grad():
        want = m(ids).last_hidden_state
        got = compiled(m, (ids,))(ids).last_hidden_state
    assert torch.allclose(got, want, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
def test_transformers_llama_decoder_layer_decode_8b_size():
    """Llama 3 8B's layer (4096 / 14336, 32 heads, 8 KV heads) in bf16, decode at batch 1 and 16."""
    cfg = _llama_config(4096, 14336, 32, 8, 2048)
    for batch in (1, 16):
        torch.manual_seed(0)
        m = LlamaDecodeStep(cfg, batch, 2048).to("cuda", torch.bfloat16).eval()
        with torch.no_grad():
            m.k_cache.normal_(), m.v_cache.normal_()
        fast = _check_decode(m, _decode_inputs(cfg, batch, 2048, 1000, "cuda", torch.bfloat16), 2e-2, 2e-2)
        print(f"batch {batch}:", fast.report())


def test_greedy_strategy_of_shufflenet_realizes():
    """Greedy's ShuffleNetV2 strategy has a copy whose piece test mixes a scalar program index with tile
    indices; Triton's interpreter made that mask int8 (``mask has unsupported dtype``)."""
    from cost_models import get_oracle
    from experiments.workloads import build_workload
    from solvers import get_solver
    from vtcsearch.codegen.realize import realize
    from vtcsearch.core.vtog import build_vtog
    w = build_workload("shufflenet", size="tiny", batch=1, device="cpu")
    m, args = w.model.eval(), w.example_inputs
    g = capture(m, args)
    res = get_solver("greedy")(build_vtog(g), get_oracle("analytical", hardware="H200"), budget=None, seed=0)
    exe = realize(g, res.strategy, m)
    with torch.no_grad():
        torch.testing.assert_close(exe(*args)[0], m(*args), rtol=1e-3, atol=1e-3)


class TokenTypeEmbedding(nn.Module):
    """BertEmbeddings' token-type path: an int64 buffer of ids, expanded, looked up, added."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(2, 8)
        self.register_buffer("ids", torch.tensor([[0, 1] * 8]))

    def forward(self, x):
        return x + self.emb(self.ids.expand(2, 16))


def test_an_index_tensor_is_never_made_virtual():
    """The index tensor of a gather stays physical (kernels read it as a plain array): BERT's expanded
    token-type ids were made virtual by the ILP and realize refused the strategy."""
    from vtcsearch.core.vtog import build_vtog
    torch.manual_seed(0)
    m = TokenTypeEmbedding().eval()
    x = torch.randn(2, 16, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        v = build_vtog(capture(m, (x,)))
    tables = {t for e in v.edges for t in e.map.tables()}
    assert tables and not any(o.tensor in tables for o in v.options)
    fast = compiled(m, (x,), solver="ilp")
    torch.testing.assert_close(fast(x), m(x))


def test_triton_imported_before_the_interpreter_is_one_line_that_says_when_to_set_it():
    """On a CPU, Triton's interpreter must be on before triton.language is imported (transformers, timm and
    torchvision import it): ``vtcsearch.compile`` refuses in one line instead of failing inside a kernel."""
    import os
    import subprocess
    import sys
    code = ("import torch, triton.language, vtcsearch\n"
            "try:\n"
            "    vtcsearch.compile(torch.nn.Linear(4, 4), (torch.randn(2, 4),))\n"
            "except RuntimeError as e:\n"
            "    print('REFUSED', e)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    line = next((x for x in r.stdout.splitlines() if x.startswith("REFUSED")), "")
    assert "set TRITON_INTERPRET=1 in the environment before Python starts" in line, r.stdout + r.stderr[-500:]

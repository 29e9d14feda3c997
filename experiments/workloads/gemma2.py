"""Gemma 2 9B, in the style of Google's reference ``gemma_pytorch`` (gemma/model.py, Gemma2 path).

Hyper-parameters (HF ``google/gemma-2-9b`` config.json / ``Gemma2Config``, identical to
gemma_pytorch ``get_config_for_9b``): hidden_size 3584, num_hidden_layers 42,
num_attention_heads 16, num_key_value_heads 8, head_dim 256 (so q is 4096 wide, not 3584),
intermediate_size 14336, vocab_size 256000, rms_norm_eps 1e-6, rope_theta 10000,
query_pre_attn_scalar 256 (q scaled by 256**-0.5), attn_logit_softcapping 50.0,
final_logit_softcapping 30.0, sliding_window 4096 on the even layers (0, 2, ...: "local",
odd layers global), hidden_activation gelu_pytorch_tanh (GeGLU), tied LM head.

Structure (as gemma_pytorch; HF ``modeling_gemma2`` is numerically the same):
  * merged ``qkv_proj`` Linear (q|k|v = 4096|2048|2048) + ``split`` (HF uses separate
    q/k/v projections with the same total parameter count), ``view`` to heads;
  * RoPE on the two halves of head_dim (gemma's ``chunk(2)`` complex form == HF rotate_half),
    applied real-valued in fp32 from fp32 cos/sin buffers;
  * KV cache buffers [max_batch, max_seq_len, n_kv_heads, head_dim] written by slice assignment
    and read back as ``cache[:bsz, :start_pos+seqlen]`` (same as the Llama 3 workload; gemma_pytorch
    uses index_copy_ into the same layout), pre-filled with random values;
  * ``repeat_kv`` by expand/reshape (== gemma_pytorch's repeat_interleave), transpose,
    q * query_pre_attn_scalar**-0.5, ``matmul``, soft-cap ``tanh(s/50)*50``, + mask,
    softmax in fp32 (cast back), ``matmul``, ``o_proj``;
  * sliding-window layers use a full-length cache and a banded mask (gemma_pytorch style: key j
    visible to query i iff i - 4096 < j <= i), global layers the causal mask. In decode with
    context 4096, the sliding layers mask out position 0 (HF's HybridCache would instead keep a
    4096-entry rolling cache: same result);
  * RMSNorm ``x * rsqrt(mean(x^2)+eps) * (1 + w)`` in fp32, pre- and post- norms around both
    attention and MLP; embedding scaled by sqrt(3584) (rounded to the model dtype, as upstream);
    final norm, tied LM head, final soft-cap ``tanh(logits/30)*30``.

Parameter counts: attention 44,040,192 per layer, decoder layer 198,195,200, full model
(42 layers, tied embedding 917,504,000) 9,241,705,984 = the published 9.24B
(HF model card "9.24B params").

Parts / phases / start_pos exactly as the Llama 3 workload: ``part`` in {"attention", "layer",
"model"}, ``phase`` in {"decode", "prefill"}, ``context`` (default 4096), ``n_layers`` (default 1,
42 for the model), plus ``first_layer`` (index of the first layer built; default 0, a sliding
layer; pass 1 for a global one). Outputs: [b, t, 3584] for attention/layer, logits
[b, t, 256000] in the model dtype for the model part.

``size="tiny"``: hidden 64, 4 heads x head_dim 32 (q wider than hidden, as in 9B), 2 KV heads,
intermediate 128, vocab 512, sliding window 16, context 32 (so the window actually masks),
query_pre_attn_scalar 32, 2 layers for the model part (one local, one global).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ._common import (
    Workload,
    check_choice,
    check_common,
    check_int,
    check_unknown,
    resolve_device,
    resolve_dtype,
)
from .llama3 import repeat_kv

PARTS = ("attention", "layer", "model")
PHASES = ("decode", "prefill")

# 9,241,705,984 = 256000*3584 + 42*(3584*8192 + 4096*3584 + 3*3584*14336 + 4*3584) + 3584
OFFICIAL_PARAMS_9B = 9_241_705_984


@dataclass
class GemmaConfig:
    vocab_size: int = 256000
    max_position_embeddings: int = 8192
    num_hidden_layers: int = 42
    num_attention_heads: int = 16
    num_key_value_heads: int = 8
    hidden_size: int = 3584
    intermediate_size: int = 14336
    head_dim: int = 256
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    attn_logit_softcapping: Optional[float] = 50.0
    final_logit_softcapping: Optional[float] = 30.0
    query_pre_attn_scalar: Optional[int] = 256
    sliding_window_size: Optional[int] = 4096
    max_batch_size: int = 1
    max_seq_len: int = 8192


GEMMA2_9B = GemmaConfig()
GEMMA2_TINY = GemmaConfig(
    vocab_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    hidden_size=64,
    intermediate_size=128,
    head_dim=32,
    query_pre_attn_scalar=32,
    sliding_window_size=16,
    max_seq_len=64,
)


def is_sliding(layer_idx: int) -> bool:
    """Gemma 2 alternates [LOCAL_SLIDING, GLOBAL]: even layers use the sliding window."""
    return layer_idx % 2 == 0


def precompute_freqs(dim: int, end: int, theta: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Real-valued ``precompute_freqs_cis``: (cos, sin), each [end, dim//2], fp32."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device, dtype=torch.float32)
    freqs = torch.outer(t, freqs)
    return torch.cos(freqs), torch.sin(freqs)


def apply_rotary_emb(x: torch.Tensor, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor) -> torch.Tensor:
    """gemma_pytorch RoPE: complex number = (first half, second half) of head_dim, times e^{i theta}."""
    bsz, seqlen, n_heads, head_dim = x.shape
    x1, x2 = torch.chunk(x.float(), 2, dim=-1)
    cos = freqs_cos.view(1, seqlen, 1, head_dim // 2)
    sin = freqs_sin.view(1, seqlen, 1, head_dim // 2)
    out = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return out.type_as(x)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6, add_unit_offset: bool = True, dtype=None):
        super().__init__()
        self.eps = eps
        self.add_unit_offset = add_unit_offset
        self.weight = nn.Parameter(torch.zeros(dim, dtype=dtype))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        # Gemma2 is (x * (1 + w)).to(dtype), computed in fp32
        output = self._norm(x.float())
        if self.add_unit_offset:
            output = output * (1 + self.weight.float())
        else:
            output = output * self.weight.float()
        return output.type_as(x)


class GemmaMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, dtype=None):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False, dtype=dtype)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False, dtype=dtype)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False, dtype=dtype)

    def forward(self, x):
        gate = self.gate_proj(x)
        gate = F.gelu(gate, approximate="tanh")
        up = self.up_proj(x)
        fuse = gate * up
        outputs = self.down_proj(fuse)
        return outputs


class GemmaAttention(nn.Module):
    def __init__(self, config: GemmaConfig, sliding: bool, dtype=None):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        assert self.num_heads % self.num_kv_heads == 0
        self.num_queries_per_kv = self.num_heads // self.num_kv_heads
        self.hidden_size = config.hidden_size
        self.head_dim = config.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        if config.query_pre_attn_scalar is not None:
            self.scaling = config.query_pre_attn_scalar**-0.5
        else:
            self.scaling = self.head_dim**-0.5

        self.qkv_proj = nn.Linear(
            self.hidden_size, (self.num_heads + 2 * self.num_kv_heads) * self.head_dim, bias=False, dtype=dtype
        )
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, self.hidden_size, bias=False, dtype=dtype)
        self.sliding = sliding
        self.sliding_window_size = config.sliding_window_size
        self.attn_logit_softcapping = config.attn_logit_softcapping

        cache_shape = (config.max_batch_size, config.max_seq_len, self.num_kv_heads, self.head_dim)
        self.register_buffer("cache_k", torch.randn(cache_shape, dtype=dtype))
        self.register_buffer("cache_v", torch.randn(cache_shape, dtype=dtype))

    def forward(
        self,
        hidden_states: torch.Tensor,
        start_pos: int,
        freqs_cos: torch.Tensor,
        freqs_sin: torch.Tensor,
        mask: Optional[torch.Tensor],
        local_mask: Optional[torch.Tensor],
    ) -> torch.Tensor:
        batch_size, input_len, _ = hidden_states.shape

        qkv = self.qkv_proj(hidden_states)
        xq, xk, xv = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)

        xq = xq.view(batch_size, -1, self.num_heads, self.head_dim)
        xk = xk.view(batch_size, -1, self.num_kv_heads, self.head_dim)
        xv = xv.view(batch_size, -1, self.num_kv_heads, self.head_dim)

        # Positional embedding.
        xq = apply_rotary_emb(xq, freqs_cos, freqs_sin)
        xk = apply_rotary_emb(xk, freqs_cos, freqs_sin)

        # Write new kv cache: [batch_size, input_len, n_local_kv_heads, head_dim]
        self.cache_k[:batch_size, start_pos : start_pos + input_len] = xk
        self.cache_v[:batch_size, start_pos : start_pos + input_len] = xv
        key = self.cache_k[:batch_size, : start_pos + input_len]
        value = self.cache_v[:batch_size, : start_pos + input_len]

        # [batch_size, kv_len, n_local_heads, head_dim]
        key = repeat_kv(key, self.num_queries_per_kv)
        value = repeat_kv(value, self.num_queries_per_kv)

        q = xq.transpose(1, 2)  # [batch_size, n_local_heads, input_len, head_dim]
        k = key.transpose(1, 2)  # [batch_size, n_local_heads, kv_len, head_dim]
        v = value.transpose(1, 2)

        q = q * self.scaling
        scores = torch.matmul(q, k.transpose(2, 3))  # [batch_size, n_local_heads, input_len, kv_len]
        if self.sliding and self.sliding_window_size is not None:
            mask = local_mask

        if self.attn_logit_softcapping is not None:
            scores = scores / self.attn_logit_softcapping
            scores = torch.tanh(scores)
            scores = scores * self.attn_logit_softcapping

        if mask is not None:
            scores = scores + mask
        scores = F.softmax(scores.float(), dim=-1).type_as(q)

        output = torch.matmul(scores, v)  # [batch_size, n_local_heads, input_len, head_dim]
        output = output.transpose(1, 2).contiguous().view(batch_size, input_len, -1)
        output = self.o_proj(output)
        return output


class Gemma2DecoderLayer(nn.Module):
    def __init__(self, config: GemmaConfig, sliding: bool, dtype=None):
        super().__init__()
        self.sliding = sliding
        self.self_attn = GemmaAttention(config, sliding, dtype=dtype)
        self.mlp = GemmaMLP(config.hidden_size, config.intermediate_size, dtype=dtype)
        eps = config.rms_norm_eps
        self.input_layernorm = RMSNorm(config.hidden_size, eps=eps, dtype=dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=eps, dtype=dtype)
        self.pre_feedforward_layernorm = RMSNorm(config.hidden_size, eps=eps, dtype=dtype)
        self.post_feedforward_layernorm = RMSNorm(config.hidden_size, eps=eps, dtype=dtype)

    def forward(self, hidden_states, start_pos: int, freqs_cos, freqs_sin, mask, local_mask):
        # Self Attention
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states = self.self_attn(hidden_states, start_pos, freqs_cos, freqs_sin, mask, local_mask)
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = residual + hidden_states

        # MLP
        residual = hidden_states
        hidden_states = self.pre_feedforward_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        hidden_states = self.post_feedforward_layernorm(hidden_states)
        hidden_states = residual + hidden_states
        return hidden_states


class _RopeMaskMixin(nn.Module):
    def _init_rope(self, config: GemmaConfig) -> None:
        cos, sin = precompute_freqs(config.head_dim, config.max_seq_len, config.rope_theta)
        self.register_buffer("freqs_cos", cos, persistent=False)
        self.register_buffer("freqs_sin", sin, persistent=False)
        self.sliding_window_size = config.sliding_window_size

    def _rope_and_masks(self, h: torch.Tensor, start_pos: int):
        """RoPE rows for the new tokens, the global causal mask and the sliding-window mask.

        Masks are [seqlen, start_pos + seqlen] (0 / -inf, model dtype); None where nothing is masked
        (decode on global layers, or decode within the window), exactly like the reference decode path.
        """
        seqlen = h.shape[1]
        total = start_pos + seqlen
        freqs_cos = self.freqs_cos[start_pos:total]
        freqs_sin = self.freqs_sin[start_pos:total]
        q_pos = torch.arange(start_pos, total, device=h.device)[:, None]
        k_pos = torch.arange(total, device=h.device)[None, :]
        mask = local_mask = None
        if seqlen > 1:
            causal = k_pos <= q_pos
            mask = torch.zeros((seqlen, total), device=h.device).masked_fill(~causal, float("-inf")).type_as(h)
        window = self.sliding_window_size
        if window is not None and (seqlen > 1 or total > window):
            visible = (k_pos <= q_pos) & (q_pos - k_pos < window)
            local_mask = torch.zeros((seqlen, total), device=h.device).masked_fill(~visible, float("-inf")).type_as(h)
        return freqs_cos, freqs_sin, mask, local_mask


def _layer_range(config: GemmaConfig, first_layer: int):
    return range(first_layer, first_layer + config.num_hidden_layers)


class GemmaForCausalLM(_RopeMaskMixin):
    """part="model": embedder (x sqrt(hidden)) + layers + norm + tied LM head + final soft-cap."""

    def __init__(self, config: GemmaConfig, first_layer: int = 0, dtype=None):
        super().__init__()
        self.config = config
        self.embedder = nn.Embedding(config.vocab_size, config.hidden_size, dtype=dtype)
        self.layers = nn.ModuleList(
            Gemma2DecoderLayer(config, is_sliding(i), dtype=dtype) for i in _layer_range(config, first_layer)
        )
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps, dtype=dtype)
        self._init_rope(config)

    def forward(self, input_token_ids: torch.Tensor, start_pos: int) -> torch.Tensor:
        hidden_states = self.embedder(input_token_ids)
        # Gemma normalizes the embedding by sqrt(hidden_size), rounded to the model dtype.
        normalizer = torch.tensor(self.config.hidden_size**0.5, dtype=hidden_states.dtype, device=hidden_states.device)
        hidden_states = hidden_states * normalizer
        freqs_cos, freqs_sin, mask, local_mask = self._rope_and_masks(hidden_states, start_pos)
        for layer in self.layers:
            hidden_states = layer(hidden_states, start_pos, freqs_cos, freqs_sin, mask, local_mask)
        hidden_states = self.norm(hidden_states)
        logits = torch.matmul(hidden_states, self.embedder.weight.t())  # tied LM head
        if self.config.final_logit_softcapping is not None:
            logits = logits / self.config.final_logit_softcapping
            logits = torch.tanh(logits)
            logits = logits * self.config.final_logit_softcapping
        return logits


class DecoderLayers(_RopeMaskMixin):
    """part="layer": n_layers ``Gemma2DecoderLayer``s on hidden states [b, t, hidden]."""

    def __init__(self, config: GemmaConfig, first_layer: int = 0, dtype=None):
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList(
            Gemma2DecoderLayer(config, is_sliding(i), dtype=dtype) for i in _layer_range(config, first_layer)
        )
        self._init_rope(config)

    def forward(self, h: torch.Tensor, start_pos: int) -> torch.Tensor:
        freqs_cos, freqs_sin, mask, local_mask = self._rope_and_masks(h, start_pos)
        for layer in self.layers:
            h = layer(h, start_pos, freqs_cos, freqs_sin, mask, local_mask)
        return h


class AttentionBlocks(_RopeMaskMixin):
    """part="attention": n_layers chained ``GemmaAttention`` modules (qkv_proj .. o_proj)."""

    def __init__(self, config: GemmaConfig, first_layer: int = 0, dtype=None):
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList(
            GemmaAttention(config, is_sliding(i), dtype=dtype) for i in _layer_range(config, first_layer)
        )
        self._init_rope(config)

    def forward(self, h: torch.Tensor, start_pos: int) -> torch.Tensor:
        freqs_cos, freqs_sin, mask, local_mask = self._rope_and_masks(h, start_pos)
        for attn in self.layers:
            h = attn(h, start_pos, freqs_cos, freqs_sin, mask, local_mask)
        return h


_VALID = ("part", "phase", "n_layers", "context", "max_seq_len", "first_layer")


def build(
    *,
    size: str = "full",
    batch: int = 1,
    device="meta",
    dtype=None,
    part: str = "attention",
    phase: str = "decode",
    n_layers: Optional[int] = None,
    context: Optional[int] = None,
    max_seq_len: Optional[int] = None,
    first_layer: int = 0,
    **unknown,
) -> Workload:
    """Gemma 2 9B workload. params: part, phase, n_layers, context, max_seq_len, first_layer."""
    check_unknown("gemma2", unknown, _VALID)
    check_common(size, batch)
    check_choice("part", part, PARTS)
    check_choice("phase", phase, PHASES)
    base = GEMMA2_9B if size == "full" else GEMMA2_TINY
    if n_layers is None:
        n_layers = base.num_hidden_layers if part == "model" else 1
    check_int("n_layers", n_layers)
    check_int("first_layer", first_layer, minimum=0)
    if context is None:
        context = 4096 if size == "full" else 32
    check_int("context", context)
    seqlen, start_pos = (1, context) if phase == "decode" else (context, 0)
    if max_seq_len is None:
        max_seq_len = start_pos + seqlen
    check_int("max_seq_len", max_seq_len, minimum=start_pos + seqlen)
    dev = resolve_device(device)
    dtype = resolve_dtype(dtype, torch.bfloat16, dev)

    config = replace(base, num_hidden_layers=n_layers, max_batch_size=batch, max_seq_len=max_seq_len)
    cls = {"attention": AttentionBlocks, "layer": DecoderLayers, "model": GemmaForCausalLM}[part]
    with torch.device(dev):
        model = cls(config, first_layer=first_layer, dtype=dtype)
        if part == "model":
            x = torch.randint(0, config.vocab_size, (batch, seqlen))
        else:
            x = torch.randn(batch, seqlen, config.hidden_size, dtype=dtype)
    model.eval()
    model.requires_grad_(False)

    tag = "9b" if size == "full" else "tiny"
    layers = [("local" if is_sliding(i) else "global") for i in _layer_range(config, first_layer)]
    out = f"[{batch}, {seqlen}, {config.vocab_size}] logits" if part == "model" else f"[{batch}, {seqlen}, {config.hidden_size}]"
    description = (
        f"Gemma 2 {'9B' if size == 'full' else 'tiny'} {part} ({n_layers} layer(s) from #{first_layer}: "
        f"{layers[0]}{'...' if n_layers > 1 else ''}), {phase}: {seqlen} token(s) at start_pos={start_pos}, "
        f"window {config.sliding_window_size}, KV cache {max_seq_len}; output {out}"
    )
    return Workload(
        name=f"gemma2-{tag}/{phase}-{part}",
        model=model,
        example_inputs=(x, start_pos),
        dtype=dtype,
        description=description,
        params=dict(size=size, batch=batch, part=part, phase=phase, n_layers=n_layers, context=context,
                    max_seq_len=max_seq_len, first_layer=first_layer, start_pos=start_pos, seqlen=seqlen),
    )

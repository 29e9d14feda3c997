"""Llama 3 8B, written in the style of Meta's reference ``llama/model.py`` (meta-llama/llama3).

Hyper-parameters (Meta ``Meta-Llama-3-8B/params.json``): dim 4096, n_layers 32, n_heads 32,
n_kv_heads 8 (head_dim 128, 4 query heads per KV head), vocab_size 128256, multiple_of 1024,
ffn_dim_multiplier 1.3 (-> FFN hidden 14336 by the reference formula), norm_eps 1e-5,
rope_theta 500000 (Llama 3, i.e. no Llama-3.1 RoPE scaling).

Differences from the reference code, all semantics-preserving:
  * q/k/v come from one merged ``wqkv`` Linear (output q|k|v = 4096|1024|1024) followed by
    ``split``, instead of three Linears (same parameter count).
  * RoPE is applied real-valued on interleaved pairs: ``x.view(..., hd//2, 2)`` -> rotate ->
    ``flatten``, identical to the reference ``view_as_complex`` form (the tests check this).
    The cos/sin tables are fp32 non-persistent buffers of length ``max_seq_len``.
  * The KV cache is a pair of module buffers [max_batch, max_seq_len, n_kv_heads, head_dim] in the
    model dtype, pre-filled with random values standing in for the keys/values of the
    ``start_pos`` tokens already in context (the reference zero-initialises them).
  * Fairscale model-parallel layers are plain ``nn.Linear`` / ``nn.Embedding``.

Parts (``part=``):
  * ``"attention"``: n_layers chained attention blocks (wqkv .. wo), input hidden states
    [b, t, 4096] (+ ``start_pos``), output [b, t, 4096]. 41,943,040 params per layer.
  * ``"layer"``: n_layers full decoder layers (RMSNorm, attention, residual, RMSNorm, SwiGLU FFN,
    residual); input/output [b, t, 4096]. 218,112,000 params per layer.
  * ``"model"``: token embedding + n_layers layers + final RMSNorm + untied LM head; input token
    ids [b, t] (int64), output float32 logits [b, t, 128256]. With 32 layers this is
    8,030,261,248 parameters, the published 8.03B of Llama 3 8B (untied embeddings:
    2 x 525,336,576 + 32 x 218,112,000 + 4096).

Phases: ``"decode"`` = one new token (t = 1) at ``start_pos = context`` (cache holds context + 1
tokens, no mask, as in the reference); ``"prefill"`` = ``context`` tokens at ``start_pos = 0`` with the
reference causal mask. ``start_pos`` is a Python int passed as the last positional input so that
``torch.export`` specialises on it.

``size="tiny"``: dim 64, 4 heads, 2 KV heads (head_dim 16), multiple_of 32 (FFN hidden 224),
vocab 512, context 32, 2 layers for the model part; every op of the full model is present.
"""

from __future__ import annotations

import math
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

PARTS = ("attention", "layer", "model")
PHASES = ("decode", "prefill")

# 8,030,261,248 = 2*128256*4096 + 32*(4096*6144 + 4096*4096 + 3*4096*14336 + 2*4096) + 4096
OFFICIAL_PARAMS_8B = 8_030_261_248


@dataclass
class ModelArgs:
    dim: int = 4096
    n_layers: int = 32
    n_heads: int = 32
    n_kv_heads: Optional[int] = 8
    vocab_size: int = 128256
    multiple_of: int = 1024
    ffn_dim_multiplier: Optional[float] = 1.3
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    max_batch_size: int = 1
    max_seq_len: int = 8192


LLAMA3_8B = ModelArgs()
LLAMA3_TINY = ModelArgs(
    dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=512, multiple_of=32, max_seq_len=64
)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        output = self._norm(x.float()).type_as(x)
        return output * self.weight


def precompute_freqs(dim: int, end: int, theta: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Real-valued version of the reference ``precompute_freqs_cis``: (cos, sin), each [end, dim//2] fp32."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device, dtype=torch.float32)
    freqs = torch.outer(t, freqs)
    return torch.cos(freqs), torch.sin(freqs)


def apply_rotary_emb(
    xq: torch.Tensor, xk: torch.Tensor, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x0 + i x1) * (cos + i sin) on interleaved pairs, exactly as the reference complex form."""

    def rotate(x: torch.Tensor) -> torch.Tensor:
        bsz, seqlen, n_heads, head_dim = x.shape
        x_ = x.float().view(bsz, seqlen, n_heads, head_dim // 2, 2)
        x_r, x_i = x_[..., 0], x_[..., 1]
        cos = freqs_cos.view(1, seqlen, 1, head_dim // 2)
        sin = freqs_sin.view(1, seqlen, 1, head_dim // 2)
        out_r = x_r * cos - x_i * sin
        out_i = x_r * sin + x_i * cos
        return torch.stack([out_r, out_i], dim=-1).flatten(3).type_as(x)

    return rotate(xq), rotate(xk)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """torch.repeat_interleave(x, dim=2, repeats=n_rep)"""
    bs, slen, n_kv_heads, head_dim = x.shape
    if n_rep == 1:
        return x
    return (
        x[:, :, :, None, :]
        .expand(bs, slen, n_kv_heads, n_rep, head_dim)
        .reshape(bs, slen, n_kv_heads * n_rep, head_dim)
    )


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, dtype=None):
        super().__init__()
        self.n_kv_heads = args.n_heads if args.n_kv_heads is None else args.n_kv_heads
        self.n_local_heads = args.n_heads
        self.n_local_kv_heads = self.n_kv_heads
        self.n_rep = self.n_local_heads // self.n_local_kv_heads
        self.head_dim = args.dim // args.n_heads
        self.q_size = args.n_heads * self.head_dim
        self.kv_size = self.n_kv_heads * self.head_dim

        # merged q|k|v projection
        self.wqkv = nn.Linear(args.dim, self.q_size + 2 * self.kv_size, bias=False, dtype=dtype)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False, dtype=dtype)

        cache_shape = (args.max_batch_size, args.max_seq_len, self.n_local_kv_heads, self.head_dim)
        self.register_buffer("cache_k", torch.randn(cache_shape, dtype=dtype))
        self.register_buffer("cache_v", torch.randn(cache_shape, dtype=dtype))

    def forward(
        self,
        x: torch.Tensor,
        start_pos: int,
        freqs_cos: torch.Tensor,
        freqs_sin: torch.Tensor,
        mask: Optional[torch.Tensor],
    ):
        bsz, seqlen, _ = x.shape
        xq, xk, xv = self.wqkv(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)

        xq = xq.view(bsz, seqlen, self.n_local_heads, self.head_dim)
        xk = xk.view(bsz, seqlen, self.n_local_kv_heads, self.head_dim)
        xv = xv.view(bsz, seqlen, self.n_local_kv_heads, self.head_dim)

        xq, xk = apply_rotary_emb(xq, xk, freqs_cos, freqs_sin)

        self.cache_k[:bsz, start_pos : start_pos + seqlen] = xk
        self.cache_v[:bsz, start_pos : start_pos + seqlen] = xv

        keys = self.cache_k[:bsz, : start_pos + seqlen]
        values = self.cache_v[:bsz, : start_pos + seqlen]

        # repeat k/v heads if n_kv_heads < n_heads
        keys = repeat_kv(keys, self.n_rep)  # (bs, cache_len + seqlen, n_local_heads, head_dim)
        values = repeat_kv(values, self.n_rep)

        xq = xq.transpose(1, 2)  # (bs, n_local_heads, seqlen, head_dim)
        keys = keys.transpose(1, 2)  # (bs, n_local_heads, cache_len + seqlen, head_dim)
        values = values.transpose(1, 2)
        scores = torch.matmul(xq, keys.transpose(2, 3)) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores + mask  # (bs, n_local_heads, seqlen, cache_len + seqlen)
        scores = F.softmax(scores.float(), dim=-1).type_as(xq)
        output = torch.matmul(scores, values)  # (bs, n_local_heads, seqlen, head_dim)
        output = output.transpose(1, 2).contiguous().view(bsz, seqlen, -1)
        return self.wo(output)


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden_dim: int, multiple_of: int, ffn_dim_multiplier: Optional[float], dtype=None):
        super().__init__()
        hidden_dim = int(2 * hidden_dim / 3)
        # custom dim factor multiplier
        if ffn_dim_multiplier is not None:
            hidden_dim = int(ffn_dim_multiplier * hidden_dim)
        hidden_dim = multiple_of * ((hidden_dim + multiple_of - 1) // multiple_of)

        self.w1 = nn.Linear(dim, hidden_dim, bias=False, dtype=dtype)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False, dtype=dtype)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False, dtype=dtype)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, args: ModelArgs, dtype=None):
        super().__init__()
        self.n_heads = args.n_heads
        self.dim = args.dim
        self.head_dim = args.dim // args.n_heads
        self.attention = Attention(args, dtype=dtype)
        self.feed_forward = FeedForward(
            dim=args.dim,
            hidden_dim=4 * args.dim,
            multiple_of=args.multiple_of,
            ffn_dim_multiplier=args.ffn_dim_multiplier,
            dtype=dtype,
        )
        self.layer_id = layer_id
        self.attention_norm = RMSNorm(args.dim, eps=args.norm_eps, dtype=dtype)
        self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps, dtype=dtype)

    def forward(self, x, start_pos: int, freqs_cos, freqs_sin, mask: Optional[torch.Tensor]):
        h = x + self.attention(self.attention_norm(x), start_pos, freqs_cos, freqs_sin, mask)
        out = h + self.feed_forward(self.ffn_norm(h))
        return out


class _RopeMaskMixin(nn.Module):
    """Owns the RoPE tables and builds the reference causal mask (shared by all three parts)."""

    def _init_rope(self, params: ModelArgs) -> None:
        cos, sin = precompute_freqs(params.dim // params.n_heads, params.max_seq_len, params.rope_theta)
        self.register_buffer("freqs_cos", cos, persistent=False)
        self.register_buffer("freqs_sin", sin, persistent=False)

    def _rope_and_mask(self, h: torch.Tensor, start_pos: int):
        seqlen = h.shape[1]
        freqs_cos = self.freqs_cos[start_pos : start_pos + seqlen]
        freqs_sin = self.freqs_sin[start_pos : start_pos + seqlen]
        mask = None
        if seqlen > 1:
            mask = torch.full((seqlen, seqlen), float("-inf"), device=h.device)
            mask = torch.triu(mask, diagonal=1)
            # When performing key-value caching, we compute the attention scores
            # only for the new sequence. Thus, the matrix of scores is of size
            # (seqlen, cache_len + seqlen), and the only masked entries are (i, j) for
            # j > cache_len + i, since row i corresponds to token cache_len + i.
            mask = torch.hstack([torch.zeros((seqlen, start_pos), device=h.device), mask]).type_as(h)
        return freqs_cos, freqs_sin, mask


class Transformer(_RopeMaskMixin):
    """part="model": embedding + layers + norm + LM head (reference ``Transformer``)."""

    def __init__(self, params: ModelArgs, dtype=None):
        super().__init__()
        self.params = params
        self.vocab_size = params.vocab_size
        self.n_layers = params.n_layers
        self.tok_embeddings = nn.Embedding(params.vocab_size, params.dim, dtype=dtype)
        self.layers = nn.ModuleList(TransformerBlock(i, params, dtype=dtype) for i in range(params.n_layers))
        self.norm = RMSNorm(params.dim, eps=params.norm_eps, dtype=dtype)
        self.output = nn.Linear(params.dim, params.vocab_size, bias=False, dtype=dtype)
        self._init_rope(params)

    def forward(self, tokens: torch.Tensor, start_pos: int):
        h = self.tok_embeddings(tokens)
        freqs_cos, freqs_sin, mask = self._rope_and_mask(h, start_pos)
        for layer in self.layers:
            h = layer(h, start_pos, freqs_cos, freqs_sin, mask)
        h = self.norm(h)
        output = self.output(h).float()
        return output


class DecoderLayers(_RopeMaskMixin):
    """part="layer": n_layers ``TransformerBlock``s on hidden states [b, t, dim]."""

    def __init__(self, params: ModelArgs, dtype=None):
        super().__init__()
        self.params = params
        self.layers = nn.ModuleList(TransformerBlock(i, params, dtype=dtype) for i in range(params.n_layers))
        self._init_rope(params)

    def forward(self, h: torch.Tensor, start_pos: int):
        freqs_cos, freqs_sin, mask = self._rope_and_mask(h, start_pos)
        for layer in self.layers:
            h = layer(h, start_pos, freqs_cos, freqs_sin, mask)
        return h


class AttentionBlocks(_RopeMaskMixin):
    """part="attention": n_layers chained ``Attention`` modules (wqkv .. wo) on hidden states."""

    def __init__(self, params: ModelArgs, dtype=None):
        super().__init__()
        self.params = params
        self.layers = nn.ModuleList(Attention(params, dtype=dtype) for _ in range(params.n_layers))
        self._init_rope(params)

    def forward(self, h: torch.Tensor, start_pos: int):
        freqs_cos, freqs_sin, mask = self._rope_and_mask(h, start_pos)
        for attn in self.layers:
            h = attn(h, start_pos, freqs_cos, freqs_sin, mask)
        return h


_VALID = ("part", "phase", "n_layers", "context", "max_seq_len")


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
    **unknown,
) -> Workload:
    """Llama 3 8B workload. params: part, phase, n_layers, context, max_seq_len (see module doc)."""
    check_unknown("llama3", unknown, _VALID)
    check_common(size, batch)
    check_choice("part", part, PARTS)
    check_choice("phase", phase, PHASES)
    base = LLAMA3_8B if size == "full" else LLAMA3_TINY
    if n_layers is None:
        n_layers = base.n_layers if part == "model" else 1
    check_int("n_layers", n_layers)
    if context is None:
        context = 4096 if size == "full" else 32
    check_int("context", context)
    seqlen, start_pos = (1, context) if phase == "decode" else (context, 0)
    if max_seq_len is None:
        max_seq_len = start_pos + seqlen
    check_int("max_seq_len", max_seq_len, minimum=start_pos + seqlen)
    dev = resolve_device(device)
    dtype = resolve_dtype(dtype, torch.bfloat16, dev)

    args = replace(base, n_layers=n_layers, max_batch_size=batch, max_seq_len=max_seq_len)
    cls = {"attention": AttentionBlocks, "layer": DecoderLayers, "model": Transformer}[part]
    with torch.device(dev):
        model = cls(args, dtype=dtype)
        if part == "model":
            x = torch.randint(0, args.vocab_size, (batch, seqlen))
        else:
            x = torch.randn(batch, seqlen, args.dim, dtype=dtype)
    model.eval()
    model.requires_grad_(False)

    tag = "8b" if size == "full" else "tiny"
    name = f"llama3-{tag}/{phase}-{part}"
    out = f"[{batch}, {seqlen}, {args.vocab_size}] fp32 logits" if part == "model" else f"[{batch}, {seqlen}, {args.dim}]"
    description = (
        f"Llama 3 {'8B' if size == 'full' else 'tiny'} {part} ({n_layers} layer(s)), {phase}: "
        f"{seqlen} token(s) at start_pos={start_pos}, KV cache {max_seq_len} x {args.n_kv_heads} x "
        f"{args.dim // args.n_heads}; output {out}"
    )
    return Workload(
        name=name,
        model=model,
        example_inputs=(x, start_pos),
        dtype=dtype,
        description=description,
        params=dict(size=size, batch=batch, part=part, phase=phase, n_layers=n_layers, context=context,
                    max_seq_len=max_seq_len, start_pos=start_pos, seqlen=seqlen),
    )

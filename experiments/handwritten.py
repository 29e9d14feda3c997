"""What an expert writes by hand for Llama decode: the reference baseline to reach automatically.

The workloads follow Meta's reference code ([b, seq, kv_heads, d] cache, slice
assignment, ``repeat_kv`` before a matmul-softmax-matmul).  gpt-fast style code
removes that data movement by hand: a head-major cache [b, kv_heads, seq, d]
updated in place and ``scaled_dot_product_attention(..., enable_gqa=True)``
reading it directly.  :func:`handwritten` returns such a model sharing the
workload's weights (its own caches, filled with the same values), so both
compute the same function and can be timed side by side.
"""
from __future__ import annotations

import copy
import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from experiments.workloads.llama3 import Attention, apply_rotary_emb


class HeadMajorAttention(nn.Module):
    """``Attention`` with a head-major KV cache updated in place and fused GQA attention."""

    def __init__(self, src: Attention):
        super().__init__()
        self.wqkv, self.wo = src.wqkv, src.wo
        self.n_heads, self.n_kv_heads, self.head_dim = src.n_local_heads, src.n_local_kv_heads, src.head_dim
        self.q_size, self.kv_size = src.q_size, src.kv_size
        self.register_buffer("cache_k", src.cache_k.transpose(1, 2).contiguous())
        self.register_buffer("cache_v", src.cache_v.transpose(1, 2).contiguous())

    def forward(self, x: torch.Tensor, start_pos: int, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor,
                mask: Optional[torch.Tensor]) -> torch.Tensor:
        bsz, seqlen, _ = x.shape
        q, k, v = self.wqkv(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(bsz, seqlen, self.n_heads, self.head_dim)
        k = k.view(bsz, seqlen, self.n_kv_heads, self.head_dim)
        v = v.view(bsz, seqlen, self.n_kv_heads, self.head_dim)
        q, k = apply_rotary_emb(q, k, freqs_cos, freqs_sin)
        self.cache_k[:bsz, :, start_pos:start_pos + seqlen] = k.transpose(1, 2)
        self.cache_v[:bsz, :, start_pos:start_pos + seqlen] = v.transpose(1, 2)
        keys = self.cache_k[:bsz, :, :start_pos + seqlen]
        values = self.cache_v[:bsz, :, :start_pos + seqlen]
        y = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=mask,
                                           scale=1.0 / math.sqrt(self.head_dim), enable_gqa=True)
        return self.wo(y.transpose(1, 2).reshape(bsz, seqlen, -1))


def _swap(module: nn.Module) -> nn.Module:
    if isinstance(module, Attention):
        return HeadMajorAttention(module)
    clone = copy.copy(module)
    clone._modules = {k: (_swap(v) if v is not None else None) for k, v in module._modules.items()}
    clone._parameters = dict(module._parameters)
    clone._buffers = dict(module._buffers)
    return clone


def handwritten(model: nn.Module) -> nn.Module:
    """The workload model with every ``Attention`` replaced by :class:`HeadMajorAttention` (weights shared)."""
    return _swap(model)

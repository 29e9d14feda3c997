"""The model zoo: real model code from torchvision, timm and transformers (random weights, no downloads).

Issue 14: users bring model code that nobody here wrote.  Each case builds a model through the
library's own constructors (``torchvision.models.*``, ``timm.create_model(..., pretrained=False)``,
``transformers.*Config`` + ``*ForCausalLM`` / ``*Model``), so the graph that reaches
``vtcsearch.compile`` is exactly what a user's code produces.

    from experiments.workloads import build_workload
    w = build_workload("zoo", model="tv_resnet18", size="tiny", device="cpu")
    python3 -m experiments.workloads.zoo --size tiny           # compile every case on the CPU, print the table

``size="full"``: the model's real configuration, resolution and context (224x224 for the ImageNet
models, 1024-token prefill for the LLMs, 512 for BERT, a 4096-token KV cache for the decode layers);
``size="tiny"``: the same classes with a scaled-down configuration (few channels and blocks, 32-64 px
images, 16 tokens) that compiles through Triton's interpreter on a CPU.

dtype: an explicit dtype wins; otherwise float32 on a CPU and the family's half type elsewhere (fp16 for
the vision models, bf16 for the LLMs).  ``native_dtype=True`` uses the family's half type on a non-CPU
device even when a dtype is given (a runner config has one dtype for all cases).

LLM cases: ``hf_<arch>`` is the whole model in prefill (token ids -> logits; BERT: -> hidden states),
``hf_<arch>_decode`` one decoder layer in a decode step with its KV cache held in module buffers and
written by ``index_copy_`` (inputs: hidden state [b, 1, hidden] and the position, an int64 [1]).
"""
from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import nn

from ._common import Workload, check_choice, check_common, check_unknown, finalize, randomize_batchnorm_, \
    resolve_device



def importable(library: str) -> bool:
    """Whether ``library`` imports here (a CUDA torchvision next to a CPU torch raises, not ImportError)."""
    try:
        __import__(library)
        return True
    except Exception:
        return False

@dataclass(frozen=True)
class ZooCase:
    """One zoo model: where it comes from and how to build it at each size."""

    library: str                          # "torchvision" | "timm" | "transformers"
    real: str                             # the real model it stands for, e.g. "resnet18", "Llama-3.2-1B"
    family: str                           # "vision" (fp16, images) | "llm" (bf16, token ids or hidden states)
    build: Callable[[str], tuple[nn.Module, Callable[[int], tuple]]]   # size -> (model, batch -> inputs)


# ---------------------------------------------------------------------------
# vision models
# ---------------------------------------------------------------------------
def _images(res: int) -> Callable[[int], tuple]:
    return lambda b: (torch.randn(b, 3, res, res),)


def _tv(full: Callable[[], nn.Module], tiny: Callable[[], nn.Module], res_full: int = 224, res_tiny: int = 32):
    def build(size: str):
        if size == "full":
            return full(), _images(res_full)
        return tiny(), _images(res_tiny)
    return build


def _timm(name: str, tiny_kw: dict[str, Any], res_full: int = 224, res_tiny: int = 32, full_kw=None):
    def build(size: str):
        import timm
        if size == "full":
            return timm.create_model(name, pretrained=False, **(full_kw or {})), _images(res_full)
        if callable(tiny_kw):       # a model whose registered config does not take overrides
            return tiny_kw(), _images(res_tiny)
        return timm.create_model(name, pretrained=False, **tiny_kw), _images(res_tiny)
    return build


def _tvm():
    import torchvision.models as tvm
    return tvm


def _resnet_tiny(block: str):
    from torchvision.models.resnet import BasicBlock, Bottleneck, ResNet
    return ResNet(BasicBlock if block == "basic" else Bottleneck, [1, 1, 1, 1], num_classes=10)


def _efficientnet_tiny():
    from torchvision.models.efficientnet import EfficientNet, _efficientnet_conf
    setting, last = _efficientnet_conf("efficientnet_b0", width_mult=0.25, depth_mult=0.25)
    return EfficientNet(setting, 0.2, last_channel=last, num_classes=10)


def _regnet_tiny():
    from torchvision.models.regnet import BlockParams, RegNet
    params = BlockParams.from_init_params(depth=4, w_0=16, w_a=8.0, w_m=2.0, group_width=8, se_ratio=0.25)
    return RegNet(params, num_classes=10, stem_width=8)


def _convnext_tiny():
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt
    return ConvNeXt([CNBlockConfig(16, 32, 1), CNBlockConfig(32, None, 1)], num_classes=10)


def _vit_tiny():
    from torchvision.models.vision_transformer import VisionTransformer
    return VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64,
                             num_classes=10)


def _swin_tiny():
    from torchvision.models.swin_transformer import SwinTransformer
    return SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[2, 2], num_heads=[1, 2], window_size=[4, 4],
                           num_classes=10)


def _maxvit_tiny():
    from torchvision.models.maxvit import MaxVit
    return MaxVit(input_size=(32, 32), stem_channels=8, partition_size=2, block_channels=[16, 32],
                  block_layers=[1, 1], head_dim=8, stochastic_depth_prob=0.0, num_classes=10)


def _mixer_tiny():
    from timm.models.mlp_mixer import MlpMixer
    return MlpMixer(img_size=64, patch_size=16, num_blocks=2, embed_dim=32, num_classes=10)


# ---------------------------------------------------------------------------
# transformers
# ---------------------------------------------------------------------------
# Real configurations (from each model's config.json) and the tiny copies' overrides.
_LLM_FULL: dict[str, dict[str, Any]] = {
    "llama": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                  num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0, max_position_embeddings=131072,
                  tie_word_embeddings=True),                                     # Llama-3.2-1B
    "qwen2": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, vocab_size=151936, rope_theta=1000000.0, max_position_embeddings=32768,
                  tie_word_embeddings=True),                                     # Qwen2.5-0.5B
    "mistral": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                    num_key_value_heads=8, vocab_size=32000, sliding_window=4096),   # Mistral-7B-v0.1
    "gemma2": dict(hidden_size=2304, intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8,
                   num_key_value_heads=4, head_dim=256, vocab_size=256000, sliding_window=4096,
                   attn_logit_softcapping=50.0, final_logit_softcapping=30.0),   # gemma-2-2b
    "phi3": dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=32, num_attention_heads=32,
                 num_key_value_heads=32, vocab_size=32064),                      # Phi-3-mini-4k
    "gpt2": dict(),                                                              # gpt2 (124M)
    "bert": dict(),                                                              # bert-base-uncased
}
# decode-layer cases at the size of the targets: Llama 3 8B and Gemma 2 9B
_DECODE_FULL: dict[str, dict[str, Any]] = {
    "llama": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=1, num_attention_heads=32,
                  num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0),   # Llama-3-8B
    "gemma2": dict(hidden_size=3584, intermediate_size=14336, num_hidden_layers=1, num_attention_heads=16,
                   num_key_value_heads=8, head_dim=256, vocab_size=256000, sliding_window=4096,
                   attn_logit_softcapping=50.0, final_logit_softcapping=30.0),     # gemma-2-9b (layer 0: local)
}
_LLM_TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=256, max_position_embeddings=256)
_TINY_EXTRA = {"mistral": dict(sliding_window=8), "gemma2": dict(head_dim=16, sliding_window=8),
               "phi3": dict(num_key_value_heads=4, pad_token_id=0)}
_GPT2_TINY = dict(n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=64)
_BERT_TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  vocab_size=256, max_position_embeddings=64)
_CLASSES = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
            "mistral": ("MistralConfig", "MistralForCausalLM"), "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),
            "phi3": ("Phi3Config", "Phi3ForCausalLM"), "gpt2": ("GPT2Config", "GPT2LMHeadModel"),
            "bert": ("BertConfig", "BertModel")}


def _hf_config(arch: str, size: str, decode: bool = False):
    import transformers
    cfg_cls = getattr(transformers, _CLASSES[arch][0])
    if arch == "gpt2":
        kw = {} if size == "full" else dict(_GPT2_TINY)
    elif arch == "bert":
        kw = {} if size == "full" else dict(_BERT_TINY)
    elif size == "full":
        kw = dict((_DECODE_FULL if decode else _LLM_FULL)[arch])
    else:
        kw = {**_LLM_TINY, **_TINY_EXTRA.get(arch, {})}
    cfg = cfg_cls(**kw)
    # transformers' default attention (SDPA; Gemma 2 has only the eager math form, for its softcapping),
    # set explicitly so that every transformers version takes the same path
    cfg._attn_implementation = "eager" if arch == "gemma2" else "sdpa"
    return cfg


class _Output(nn.Module):
    """A transformers model called as users do (``model(input_ids)``), returning one tensor."""

    def __init__(self, model: nn.Module, field: str):
        super().__init__()
        self.model, self.field = model, field

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(input_ids=input_ids, use_cache=False), self.field)


def _hf_model(arch: str):
    def build(size: str):
        import transformers
        cfg = _hf_config(arch, size)
        model = getattr(transformers, _CLASSES[arch][1])(cfg)
        field = "last_hidden_state" if arch == "bert" else "logits"
        seq = (512 if arch == "bert" else 1024) if size == "full" else 16
        vocab = cfg.vocab_size
        return _Output(model, field), lambda b: (torch.randint(0, vocab, (b, seq)),)
    return build


class _BufferCache:
    """The KV-cache protocol transformers' attention calls (``update``), backed by module buffers.

    ``update`` writes this step's keys and values at ``position`` with ``index_copy_`` and returns the
    whole cache, so the write is a buffer mutation that ``torch.export`` sees.
    """

    def __init__(self, owner: "_DecodeLayer"):
        self.owner, self.position = owner, None

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        o = self.owner
        o.k_cache.index_copy_(2, self.position, key_states.to(o.k_cache.dtype))
        o.v_cache.index_copy_(2, self.position, value_states.to(o.v_cache.dtype))
        return o.k_cache, o.v_cache


class _DecodeLayer(nn.Module):
    """One transformers decoder layer in a decode step over a ``context``-long KV cache in module buffers.

    The mask is additive (0 up to ``position``, -inf after, and outside the sliding window if the config
    has one), the rotary embedding is the model's own ``rotary_emb``.
    """

    def __init__(self, arch: str, size: str, batch: int, context: int):
        super().__init__()
        import transformers
        cfg = _hf_config(arch, size, decode=True)
        cfg.num_hidden_layers = 1
        model_cls = getattr(transformers, _CLASSES[arch][1].replace("ForCausalLM", "Model"))
        inner = model_cls(cfg)
        self.layer, self.rotary_emb = inner.layers[0], inner.rotary_emb
        self.context = context
        self.window = getattr(cfg, "sliding_window", None)
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        shape = (batch, cfg.num_key_value_heads, context, head_dim)
        self.register_buffer("k_cache", torch.zeros(shape))
        self.register_buffer("v_cache", torch.zeros(shape))
        self.cache = _BufferCache(self)
        params = inspect.signature(type(self.layer).forward).parameters
        self.cache_arg = "cache" if "cache" in params else "past_key_values"   # renamed in transformers 5.2x

    def forward(self, hidden: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        self.cache.position = position
        pos_ids = position.view(1, 1).expand(hidden.shape[0], 1)
        cos, sin = self.rotary_emb(hidden, pos_ids)
        idx = torch.arange(self.context, device=hidden.device)
        visible = idx <= position
        if self.window is not None:
            visible = visible & (idx > position - self.window)
        mask = torch.zeros(self.context, dtype=hidden.dtype, device=hidden.device)
        mask = mask.masked_fill(~visible, float("-inf")).view(1, 1, 1, self.context)
        out = self.layer(hidden, attention_mask=mask, position_ids=pos_ids, position_embeddings=(cos, sin),
                         **{self.cache_arg: self.cache})
        return out[0] if isinstance(out, tuple) else out


def _hf_decode(arch: str):
    def build(size: str):
        context = 4096 if size == "full" else 32
        cfg = _hf_config(arch, size, decode=True)

        def make(batch: int) -> tuple:
            return (torch.randn(batch, 1, cfg.hidden_size), torch.tensor([context // 2], dtype=torch.int64))

        # the cache's batch is part of the module: build() calls the factory with the batch
        return (lambda batch: _DecodeLayer(arch, size, batch, context)), make
    return build


# ---------------------------------------------------------------------------
# the registry
# ---------------------------------------------------------------------------
CASES: dict[str, ZooCase] = {
    # torchvision
    "tv_resnet18": ZooCase("torchvision", "resnet18", "vision",
                           _tv(lambda: _tvm().resnet18(), lambda: _resnet_tiny("basic"))),
    "tv_resnet50": ZooCase("torchvision", "resnet50", "vision",
                           _tv(lambda: _tvm().resnet50(), lambda: _resnet_tiny("bottleneck"))),
    "tv_mobilenet_v2": ZooCase("torchvision", "mobilenet_v2", "vision",
                               _tv(lambda: _tvm().mobilenet_v2(),
                                   lambda: _tvm().mobilenet_v2(width_mult=0.25, num_classes=10))),
    "tv_mobilenet_v3_large": ZooCase("torchvision", "mobilenet_v3_large", "vision",
                                     _tv(lambda: _tvm().mobilenet_v3_large(),
                                         lambda: _tvm().mobilenet_v3_large(width_mult=0.25, num_classes=10))),
    "tv_efficientnet_b0": ZooCase("torchvision", "efficientnet_b0", "vision",
                                  _tv(lambda: _tvm().efficientnet_b0(), _efficientnet_tiny)),
    "tv_shufflenet_v2": ZooCase("torchvision", "shufflenet_v2_x1_0", "vision",
                                _tv(lambda: _tvm().shufflenet_v2_x1_0(),
                                    lambda: _tvm().ShuffleNetV2([1, 1, 1], [8, 16, 32, 64, 64], num_classes=10))),
    "tv_regnet_y_400mf": ZooCase("torchvision", "regnet_y_400mf", "vision",
                                 _tv(lambda: _tvm().regnet_y_400mf(), _regnet_tiny)),
    "tv_convnext_tiny": ZooCase("torchvision", "convnext_tiny", "vision",
                                _tv(lambda: _tvm().convnext_tiny(), _convnext_tiny)),
    "tv_vit_b_16": ZooCase("torchvision", "vit_b_16", "vision", _tv(lambda: _tvm().vit_b_16(), _vit_tiny)),
    "tv_swin_t": ZooCase("torchvision", "swin_t", "vision", _tv(lambda: _tvm().swin_t(), _swin_tiny)),
    "tv_maxvit_t": ZooCase("torchvision", "maxvit_t", "vision", _tv(lambda: _tvm().maxvit_t(), _maxvit_tiny)),
    # DenseNet concatenates every layer's features with all earlier ones: the concats virtual tensors remove
    "tv_densenet121": ZooCase("torchvision", "densenet121", "vision",
                              _tv(lambda: _tvm().densenet121(),
                                  lambda: _tvm().DenseNet(growth_rate=8, block_config=(2, 2, 2, 2),
                                                          num_init_features=16, bn_size=2, num_classes=10))),
    # timm
    "timm_efficientvit_b1": ZooCase("timm", "efficientvit_b1", "vision", _timm(
        "efficientvit_b1", dict(widths=(8, 16, 32, 64, 128), depths=(1, 1, 1, 1, 1), head_dim=8,
                                head_widths=(128, 160), num_classes=10), res_tiny=64)),
    "timm_deit_tiny": ZooCase("timm", "deit_tiny_patch16_224", "vision", _timm(
        "deit_tiny_patch16_224", dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2,
                                      num_classes=10))),
    "timm_mobilevit_xxs": ZooCase("timm", "mobilevit_xxs", "vision", _timm(
        "mobilevit_xxs", dict(num_classes=10), res_full=256, res_tiny=64)),
    "timm_levit_128s": ZooCase("timm", "levit_128s", "vision", _timm(
        "levit_128s", dict(img_size=64, embed_dim=(32, 48, 64), key_dim=8, num_heads=(2, 2, 2), depth=(1, 1, 1),
                           num_classes=10), res_tiny=64)),
    "timm_convnext_atto": ZooCase("timm", "convnext_atto", "vision", _timm(
        "convnext_atto", dict(dims=(8, 16, 32, 64), depths=(1, 1, 1, 1), num_classes=10))),
    "timm_mixer_b16": ZooCase("timm", "mixer_b16_224", "vision", _timm(
        "mixer_b16_224", _mixer_tiny, res_tiny=64)),
    # transformers, whole models in prefill
    "hf_llama": ZooCase("transformers", "Llama-3.2-1B", "llm", _hf_model("llama")),
    "hf_qwen2": ZooCase("transformers", "Qwen2.5-0.5B", "llm", _hf_model("qwen2")),
    "hf_mistral": ZooCase("transformers", "Mistral-7B-v0.1", "llm", _hf_model("mistral")),
    "hf_gemma2": ZooCase("transformers", "gemma-2-2b", "llm", _hf_model("gemma2")),
    "hf_phi3": ZooCase("transformers", "Phi-3-mini-4k", "llm", _hf_model("phi3")),
    "hf_gpt2": ZooCase("transformers", "gpt2", "llm", _hf_model("gpt2")),
    "hf_bert": ZooCase("transformers", "bert-base-uncased", "llm", _hf_model("bert")),
    # transformers, one decoder layer in decode with a module-buffer KV cache
    "hf_llama_decode": ZooCase("transformers", "Llama-3-8B layer", "llm", _hf_decode("llama")),
    "hf_gemma2_decode": ZooCase("transformers", "gemma-2-9b layer", "llm", _hf_decode("gemma2")),
}

_HALF = {"vision": torch.float16, "llm": torch.bfloat16}


def build(*, size: str = "full", batch: int = 1, device="meta", dtype=None, model: str = "tv_resnet18",
          native_dtype: bool = False, **unknown) -> Workload:
    """Build zoo case ``model`` (a key of CASES) at ``size`` with random weights."""
    check_unknown("zoo", unknown, ("model", "native_dtype"))
    check_common(size, batch)
    check_choice("zoo model", model, CASES)
    case = CASES[model]
    dev = resolve_device(device)
    half = _HALF[case.family]
    if dev.type != "cpu" and (dtype is None or native_dtype):
        dtype = half
    elif dtype is None:
        dtype = torch.float32
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"invalid dtype {dtype!r}; must be a floating torch.dtype such as torch.bfloat16")
    with torch.device(dev):
        made, inputs = case.build(size)
        net = made(batch) if not isinstance(made, nn.Module) else made
        if dev.type != "meta":
            randomize_batchnorm_(net)
        example = inputs(batch)
    net = finalize(net, dtype)
    example = tuple(x.to(dtype) if x.is_floating_point() else x for x in example)
    return Workload(name=f"zoo/{model}", model=net, example_inputs=example, dtype=dtype,
                    description=f"{case.library} {case.real} ({size}), random weights",
                    params={"model": model, "size": size, "batch": batch, "native_dtype": native_dtype})


# ---------------------------------------------------------------------------
# the CPU check: vtcsearch.compile(model, inputs) against eager, one case at a time
# ---------------------------------------------------------------------------
TOLERANCES = {torch.float32: (1e-3, 1e-3), torch.float16: (2e-2, 2e-2), torch.bfloat16: (5e-2, 5e-2)}


def first_line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}"[:300]


def check_case(model: str, *, size: str = "tiny", batch: int = 1, device: str = "cpu", dtype=None,
               solver: str = "ilp", implementations: Sequence[str] | None = None) -> dict[str, Any]:
    """Compile zoo case ``model`` with ``vtcsearch.compile`` and compare one call with eager.

    Returns a record: ok (outputs and mutated buffers within the dtype's tolerance), error (first line,
    naming where it failed: build, eager, compile or call), compile_s, kernels (vtcsearch's per call), regions
    (Inductor regions, each running Inductor's own kernels), fallbacks (ATen ops run
    as fallbacks), residual copies made per call (not those folded at build), max_abs_err.
    """
    import vtcsearch
    rec: dict[str, Any] = {"model": model, "library": CASES[model].library, "ok": False, "error": None,
                           "compile_s": None, "kernels": None, "regions": None, "fallbacks": None,
                           "residual_copies": None, "max_abs_err": None}
    stage = "build"
    try:
        torch.manual_seed(0)
        w = build(model=model, size=size, batch=batch, device=device, dtype=dtype)
        stage = "eager"
        saved = {n: b.clone() for n, b in w.model.named_buffers()}
        with torch.no_grad():
            ref = w.model(*w.example_inputs)
        ref_bufs = {n: b.clone() for n, b in w.model.named_buffers()}
        for n, b in w.model.named_buffers():
            b.copy_(saved[n])
        stage = "compile"
        t0 = time.perf_counter()
        fast = vtcsearch.compile(w.model, w.example_inputs, solver=solver, implementations=implementations)
        rec["compile_s"] = round(time.perf_counter() - t0, 2)
        summ = fast.executable.summary()
        # the copies each call makes: a movement op folded at build (a mask's expand) copies once, not per call
        once = set(summ["folded"])
        # an Inductor region launches kernels of Inductor's own, which the executable does not count
        rec.update(kernels=summ["kernels"], regions=summ.get("by_lowering", {}).get("inductor", 0),
                   fallbacks=sorted(set(map(str, summ["fallbacks"]))),
                   residual_copies=sum(r.op not in once for r in fast.strategy.residuals))
        stage = "call"
        out = fast(*w.example_inputs)
        got, want = _leaves(out), _leaves(ref)
        if len(got) != len(want):
            raise AssertionError(f"{len(got)} outputs, eager returns {len(want)}")
        rtol, atol = TOLERANCES[w.dtype]
        err, ok = 0.0, True
        pairs = list(zip(got, want)) + [(b, ref_bufs[n]) for n, b in w.model.named_buffers()]
        for g, r in pairs:
            if g.shape != r.shape:
                raise AssertionError(f"output shape {tuple(g.shape)}, eager {tuple(r.shape)}")
            d = (g.float() - r.float()).abs()
            finite = torch.isfinite(r.float())
            err = max(err, float(d[finite].max()) if finite.any() else 0.0)
            ok &= bool(torch.allclose(g.float(), r.float(), rtol=rtol, atol=atol, equal_nan=True))
        rec["max_abs_err"] = err
        rec["ok"] = ok
        if not ok:
            rec["error"] = f"numerics: max abs error {err:.3g} vs eager (rtol {rtol}, atol {atol})"
    except Exception as e:   # the table records every failure as one line
        rec["error"] = f"{stage}: {first_line(e)}"
    return rec


def _leaves(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _leaves(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _leaves(v)]
    return []


def check_isolated(model: str, *, size: str = "tiny", timeout_s: float = 900.0, solver: str = "ilp",
                   batch: int = 1, implementations: Sequence[str] | None = None) -> dict[str, Any]:
    """``check_case`` in a fresh Python process, so a crash (segfault) or a hang is a failed row, not a lost run."""
    cmd = [sys.executable, "-m", "experiments.workloads.zoo", "--one", model, "--size", size, "--solver", solver,
           "--batch", str(batch)] + (["--implementations", ",".join(implementations)] if implementations else [])
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=root)
    except subprocess.TimeoutExpired:
        return {"model": model, "library": CASES[model].library, "ok": False,
                "error": f"timeout: no result within {timeout_s:.0f} s"}
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("ZOO-RESULT "):
            return json.loads(line[len("ZOO-RESULT "):])
    tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
    how = f"signal {-p.returncode}" if p.returncode < 0 else f"exit {p.returncode}"
    return {"model": model, "library": CASES[model].library, "ok": False,
            "error": f"crash: process died ({how}) after {time.perf_counter() - t0:.0f} s: {tail[:200]}"}


def _kernels(r: dict[str, Any]) -> str:
    """vtcsearch's kernels per call, and the Inductor regions beside them (each of Inductor's own kernels)."""
    if r.get("kernels") is None:
        return ""
    return f"{r['kernels']} + {r['regions']}" if r.get("regions") else str(r["kernels"])


def table(records: list[dict[str, Any]]) -> str:
    """The zoo table in Markdown: every model, pass or FAIL, with its first error line."""
    lines = ["| model | library | result | compile s | kernels (+ Inductor regions) | fallbacks | residual copies | "
             "max abs err | error |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        fb = r.get("fallbacks")
        fbs = "" if fb is None else (f"{len(fb)}: {', '.join(fb)}" if fb else "0")
        err = r.get("max_abs_err")
        lines.append(f"| {r['model']} | {r.get('library', '')} | {'pass' if r.get('ok') else 'FAIL'} | "
                     f"{r.get('compile_s') if r.get('compile_s') is not None else ''} | {_kernels(r)} | "
                     f"{fbs} | {'' if r.get('residual_copies') is None else r['residual_copies']} | "
                     f"{'' if err is None or (isinstance(err, float) and math.isnan(err)) else f'{err:.2g}'} | "
                     f"{(r.get('error') or '').replace('|', '/')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Compile every zoo model with vtcsearch.compile and compare with eager")
    ap.add_argument("--size", default="tiny", choices=("tiny", "full"))
    ap.add_argument("--models", default="", help="comma-separated case names (default: all)")
    ap.add_argument("--solver", default="ilp")
    ap.add_argument("--implementations", default="", help="comma-separated kernel implementations the search "
                    "may choose (triton,library,inductor); default: triton")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per model")
    ap.add_argument("--jobs", type=int, default=1, help="models checked at once (each in its own process)")
    ap.add_argument("--json", default="", help="also write the records to this JSON file")
    ap.add_argument("--one", default="", help=argparse.SUPPRESS)   # used by check_isolated
    a = ap.parse_args(argv)
    impls = tuple(i for i in a.implementations.split(",") if i) or None
    if a.one:
        device = "cuda" if a.size == "full" and torch.cuda.is_available() else "cpu"
        rec = check_case(a.one, size=a.size, batch=a.batch, device=device, solver=a.solver, implementations=impls)
        print("ZOO-RESULT " + json.dumps(rec), flush=True)
        return 0
    names = [n for n in a.models.split(",") if n] or list(CASES)
    from concurrent.futures import ThreadPoolExecutor
    done: dict[str, dict[str, Any]] = {}

    def one(n: str) -> None:
        rec = done[n] = check_isolated(n, size=a.size, timeout_s=a.timeout, solver=a.solver, batch=a.batch,
                                       implementations=impls)
        print(f"{n:24s} {'pass' if rec.get('ok') else 'FAIL'} {rec.get('compile_s')} s  {rec.get('error') or ''}",
              flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump([done[m] for m in names if m in done], f, indent=1)

    with ThreadPoolExecutor(max(1, a.jobs)) as pool:
        list(pool.map(one, names))
    records = [done[n] for n in names]
    print(table(records))
    return 0 if all(r.get("ok") for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())

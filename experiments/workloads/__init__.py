"""PyTorch definitions of the paper's five workloads (random weights, official hyper-parameters).

    from experiments.workloads import build_workload
    w = build_workload("llama3", part="attention", phase="decode")     # 8B sizes, meta device
    out = w.model(*w.example_inputs)
    ep = torch.export.export(w.model, w.example_inputs)

Registered names and their parameters (all builders also take size / batch / device / dtype):

  "llama3"        Llama 3 8B.     part {"attention","layer","model"}, phase {"decode","prefill"},
                                  n_layers, context (4096), max_seq_len
  "gemma2"        Gemma 2 9B.     same as llama3, plus first_layer (0 = sliding-window layer)
  "efficientvit"  EfficientViT-B1 (Cityscapes seg model).  head {"seg","none"}, resolution (1024, 2048)
  "yolo11"        YOLO11 detect.  variant {"n","s"}, imgsz (640)
  "shufflenet"    ShuffleNetV2 x1.0.  resolution (224)
  "vision_block"  one block of a vision workload.  block {yolo11n_c3k2, yolo11s_c3k2, shufflenet_s2,
                                  shufflenet_s1, litemla}
  "zoo"           torchvision / timm / transformers models (zoo.CASES).  model, native_dtype

size="full" uses the official hyper-parameters; size="tiny" a scaled-down copy with the same
structure that runs on CPU in milliseconds. device="meta" (default) builds without allocating
weights. dtype=None means: float32 on CPU, otherwise bf16 (LLMs) / fp16 (CNNs, EfficientViT).
Every model is in eval mode, has requires_grad=False parameters and is capturable with
``torch.export.export(model, example_inputs)``. See each module's docstring for the parameter
counts, output shapes and their sources.
"""

from __future__ import annotations

from typing import Callable

from . import efficientvit, gemma2, llama3, shufflenet, vision_block, yolo11, zoo
from ._common import Workload, count_params

WORKLOADS: dict[str, Callable[..., Workload]] = {
    "llama3": llama3.build,
    "gemma2": gemma2.build,
    "efficientvit": efficientvit.build,
    "yolo11": yolo11.build,
    "shufflenet": shufflenet.build,
    "vision_block": vision_block.build,
    "zoo": zoo.build,
}


def build_workload(name: str, *, size: str = "full", batch: int = 1, device="meta", dtype=None, **params) -> Workload:
    """Build the registered workload ``name`` (one of WORKLOADS) with the given parameters."""
    try:
        builder = WORKLOADS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown workload {name!r}; valid choices: {', '.join(WORKLOADS)}") from None
    return builder(size=size, batch=batch, device=device, dtype=dtype, **params)


__all__ = ["WORKLOADS", "Workload", "build_workload", "count_params"]

"""One block of a vision workload at its real position and input shape (the paper's vision blocks).

Cases (``block``), each a submodule of its workload fed the activation the whole
model feeds it there (found by running the model up to the block):

``yolo11n_c3k2`` / ``yolo11s_c3k2``
    YOLO11 n / s at 640x640, layer 2 (the first C3k2: cv1 -> chunk -> Bottleneck -> cat -> cv2).
``shufflenet_s2`` / ``shufflenet_s1``
    ShuffleNetV2 x1.0 at 224x224, stage 2's first (stride 2) and second (stride 1) unit.
``litemla``
    EfficientViT-B1 at 1024x2048 (no head), the first LiteMLA of stage 3.

Built exactly as ``experiments/vision_blocks.py`` built them (that script is now this
workload plus ``configs/vision_blocks.yaml``).  On the meta device the run up to the
block is a shape computation only.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from ._common import Workload, check_choice

BLOCKS = ("yolo11n_c3k2", "yolo11s_c3k2", "shufflenet_s2", "shufflenet_s1", "litemla")


class _Reached(Exception):
    pass


def block_input(model: torch.nn.Module, block: torch.nn.Module, inputs: Sequence[Any]) -> tuple[torch.Tensor, ...]:
    """The positional tensors ``block`` receives when ``model`` runs on ``inputs`` (the run stops there)."""
    seen: dict[str, tuple] = {}

    def hook(_mod: torch.nn.Module, args: tuple) -> None:
        seen["args"] = args
        raise _Reached

    handle = block.register_forward_pre_hook(hook)
    try:
        with torch.no_grad():
            model(*inputs)
    except _Reached:
        pass
    finally:
        handle.remove()
    if "args" not in seen:
        raise RuntimeError(f"{type(block).__name__} is not called by {type(model).__name__}")
    return tuple(a.detach().clone() for a in seen["args"])


def _parent(block: str, **kw: Any) -> tuple[Workload, torch.nn.Module, str]:
    from . import efficientvit, shufflenet, yolo11
    if block.startswith("yolo11"):
        w = yolo11.build(variant=block[6], **kw)
        return w, w.model.model[2], "layer 2 (C3k2)"
    if block.startswith("shufflenet"):
        w = shufflenet.build(**kw)
        unit = 0 if block == "shufflenet_s2" else 1
        blk = w.model.stage2[unit]
        return w, blk, f"stage 2 unit {unit} (stride {blk.stride})"
    w = efficientvit.build(head="none", **kw)
    return w, w.model.backbone.stages[2].op_list[1].context_module.main, "stage 3 LiteMLA"


def build(*, block: str = "yolo11n_c3k2", size: str = "full", batch: int = 1, device: Any = "meta",
          dtype: torch.dtype | None = None) -> Workload:
    """The block ``block`` of its workload, with the input the workload feeds it."""
    check_choice("block", block, BLOCKS)
    w, blk, where = _parent(block, size=size, batch=batch, device=device, dtype=dtype)
    x = block_input(w.model, blk, w.example_inputs)
    return Workload(name=f"{w.name}/{block}", model=blk, example_inputs=x, dtype=w.dtype,
                    description=f"{w.name} {where}, input {list(x[0].shape)}",
                    params=dict(size=size, batch=batch, block=block))



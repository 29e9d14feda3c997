"""Storage layouts: which physical storages the executable lays out channels-last.

A storage is indexed in its tensor's shape (NCHW for an image activation) whatever the order of its bytes; its
strides give the order, and every lowering takes them from the storage tensor (the templates through
:meth:`Operand.storage_strides`, Inductor regions through the views they are passed, library calls as any
strided tensor), so a layout changes where bytes lie, never a value.

torch.compile keeps a convolution network's activations channels-last (NHWC in memory): cuDNN's and Inductor's
convolutions run faster there.  vtcsearch's storages are contiguous (NCHW), so an Inductor region with a
convolution converts its input to NHWC first, and every cut between regions (a virtual tensor, a template, a
library call) costs such a conversion: whole EfficientViT-B1 ran one ``triton_poi_fused_convolution_0`` per
region on an H100.  With ``VTC_CHANNELS_LAST=1`` every storage a convolution reads or writes (4-D, floating,
not a graph input, output or module state) is laid out channels-last instead.  Off by default until a GPU
measures it: the analytical model still prices every storage as contiguous.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..core.capture import CONV
from .memory import storages_of

if TYPE_CHECKING:
    from ..core.graph import TensorGraph
    from ..core.strategy import Strategy

__all__ = ["channels_last_storages", "channels_last_strides", "enabled"]


def enabled() -> bool:
    """Whether ``VTC_CHANNELS_LAST`` asks for channels-last convolution storages."""
    return os.environ.get("VTC_CHANNELS_LAST", "0") not in ("", "0")


def channels_last_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Element strides of an NCHW-indexed tensor whose bytes are in NHWC order."""
    n, c, h, w = shape
    return (h * w * c, 1, w * c, c)


def channels_last_storages(graph: "TensorGraph", strategy: "Strategy") -> set[str]:
    """The storages that convolutions read their input from or write their output to (through whatever map the
    strategy gives the tensor), where the executable owns them and they are 4-D and floating."""
    out: set[str] = set()
    for op in graph.ops.values():
        if op.node is None or op.node.target not in CONV:
            continue
        for t in (op.inputs[0], *op.outputs):
            for s in storages_of(strategy, t):
                info = graph.tensors[s]
                if len(info.shape) == 4 and info.dtype.is_floating_point and not info.physical_only \
                        and not info.mutable:
                    out.add(s)
    return out

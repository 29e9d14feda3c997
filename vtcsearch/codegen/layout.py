"""Storage layouts: which physical storages the executable lays out channels-last.

A storage is indexed in its tensor's shape (NCHW for an image activation) whatever the order of its bytes; its
strides give the order, and every lowering takes them from the storage tensor (the templates through
:meth:`Operand.storage_strides`, Inductor regions through the views they are passed, library calls as any
strided tensor), so a layout changes where bytes lie, never a value.

torch.compile keeps a convolution network's activations channels-last (NHWC in memory): cuDNN's and Inductor's
convolutions run faster there.  vtcsearch's storages are contiguous (NCHW), so an Inductor region with a
convolution converts its input to NHWC first, and every cut between regions (a virtual tensor, a template, a
library call) costs such a conversion: whole EfficientViT-B1's search pick ran one
``triton_poi_fused_convolution_0`` per region on an H100 (20 calls, 204 us).  With ``VTC_CHANNELS_LAST=1`` the
storages that only Inductor regions read and write, and that a region's convolution reads or writes, are laid
out channels-last: both regions then meet in NHWC.  Every storage a convolution touches (templates and library
calls included) was measured worse: 2418.7 -> 3706.3 us for that pick, from ATen copies into NHWC outputs of
cuDNN calls and cuDNN NCHW kernels.  Off by default until a GPU measures it: the analytical model still prices
every storage as contiguous.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Sequence

from ..core.capture import CONV
from ..core.graph import kernel_io
from .inductor import is_region_step
from .memory import step_access, storages_of

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


def channels_last_storages(graph: "TensorGraph", strategy: "Strategy", runs: Sequence[Sequence[str]]) -> set[str]:
    """The storages that a convolution in an Inductor region reads its input from or writes its output to
    (through whatever map the strategy gives the tensor), where no step of ``runs`` but Inductor regions reads
    or writes them, and the executable owns them, 4-D and floating."""
    conv_io: set[str] = set()
    elsewhere: set[str] = set()
    for run in runs:
        reads, writes = step_access(graph, strategy, run)
        if not any(is_region_step(graph, strategy, st) for st in run):
            elsewhere |= reads | writes
            continue
        for st in run:
            ops = graph.groups[st].ops if st in graph.groups else []
            convs = [graph.ops[o] for o in ops if graph.ops[o].node is not None and graph.ops[o].node.target in CONV]
            if convs:   # the image a conv reads, and what its group writes (the conv's product, or its epilogue's)
                for t in [c.inputs[0] for c in convs] + list(kernel_io(graph, ops)[1]):
                    conv_io |= storages_of(strategy, t)
    out: set[str] = set()
    for s in conv_io - elsewhere:
        info = graph.tensors[s]
        if len(info.shape) == 4 and info.dtype.is_floating_point and not info.physical_only and not info.mutable:
            out.add(s)
    return out

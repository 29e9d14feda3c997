"""The residual copy kernel: what a strategy leaves of a data movement op.

``copy(dst, src)`` writes ``src`` (read through its map) to ``dst`` (written through
its map) over their common index space, keeping the dtype (bit-exact for equal
dtypes, int64 included); ``src`` may be a number (a constant fill).  Lanes that
``dst``'s map does not cover are not written, so a partial ``dst`` map copies only
its pieces.  :func:`copy_pieces` runs the ``(dst piece, src piece)`` pairs of a
:class:`vtcsearch.core.strategy.ResidualCopy` directly.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import torch

from ...core.mapping import IndexMap, Piece
from .pointwise import _as_nd, tile_config
from .codecache import Plan, compile_source, interpreting, key_of, plan_cache
from .emit import IO, const_code, elementwise_tiling, render, tl_dtype
from .operand import Operand

_TEMPLATE = """
@triton.jit
def copy_kernel(@params@):
    @@prologue
    @@pid
    # stage 1: read the source through its map (or a constant), in its own dtype
    @@load
    # stage 3: write through the destination map
    @@store
"""


def copy(dst: Operand, src: Operand | float | int) -> Plan:
    """``dst[i] = src[i]`` for every index ``i`` that ``dst``'s map covers."""
    dst = _as_nd(dst)
    if isinstance(src, Operand):
        src = _as_nd(src)
        if src.shape != dst.shape:
            src = src.broadcast_to(dst.shape)
    shape = dst.shape
    gpu = not interpreting() and dst.device.type == "cuda"
    BR, BC = tile_config(shape, gpu)
    ssig = src.signature() if isinstance(src, Operand) else repr(src)
    key = key_of("copy", dst.signature(), ssig, BR, BC)

    def build() -> Plan:
        t = elementwise_tiling(shape, BR, BC)
        dio = IO(dst, "dst")
        params, prologue = dio.params(), dio.prologue()
        if isinstance(src, Operand):
            sio = IO(src, "src")
            params += sio.params()
            prologue += sio.prologue()
            load = sio.load("v", t.idx, shape=t.tile, mask=t.mask, block=t.block, dtype=None)
        else:
            sio = None
            dt = tl_dtype(dst.dtype)
            load = [f"v = tl.full({t.tile}, {const_code(src, dt)}, {dt})"]
        store = dio.store("v", t.idx, mask=t.mask, block=t.block)
        srcs = render(_TEMPLATE, params=params, prologue=prologue, pid=t.pid_lines, load=load, store=store)
        kern = compile_source("copy_kernel", srcs)
        modes = {"dst": dio.modes, **({"src": sio.modes} if sio else {})}
        return Plan("copy", kern, t.grid, {}, {"num_warps": 4}, srcs, modes, {"BR": BR, "BC": BC})

    plan = plan_cache(key, build)
    args = dst.kernel_args() + (src.kernel_args() if isinstance(src, Operand) else [])
    plan.launch(args)
    return plan


def copy_pieces(domain: Sequence[int], pairs: Sequence[tuple[Piece, Piece]],
                tensors: Mapping[str, torch.Tensor], syms: Mapping | None = None,
                tables: Mapping | None = None) -> Plan | None:
    """Run the copy of ``(dst piece, src piece)`` pairs over ``domain`` (a ResidualCopy's ``pairs``).

    Pieces target storages named in ``tensors``; a source piece may be a constant.
    Only the bounding box of the pairs' regions is iterated.
    """
    if not pairs:
        return None
    shapes = {k: tuple(t.shape) for k, t in tensors.items()}
    dmap = IndexMap(domain, [d for d, _ in pairs], {d.target: shapes[d.target] for d, _ in pairs})
    smap = IndexMap(domain, [s for _, s in pairs], {s.target: shapes[s.target] for _, s in pairs if s.target})
    dst = Operand(dmap, tensors, syms, tables)
    src = Operand(smap, tensors, syms, tables, dtype=dst.dtype)
    lo = [min(d.region[k][0] for d, _ in pairs) for k in range(len(domain))]
    hi = [max(d.region[k][1] for d, _ in pairs) for k in range(len(domain))]
    box = list(zip(lo, hi))
    if box != [(0, s) for s in domain]:
        dst, src = dst.sub(box), src.sub(box)
    return copy(dst, src)

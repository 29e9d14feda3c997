"""2-d convolution with a fused epilogue, every operand through its map.

``conv2d(x, w, out, stride=, padding=, dilation=, groups=, epilogue=)`` computes
``out = epilogue(conv2d(x, w))`` for ``x`` [N, Cin, H, W], ``w`` [Cout, Cin/groups, KH, KW]
and ``out`` [N, Cout, OH, OW] (PyTorch's semantics, no ceil mode).  Any of them may be
virtual: ``x`` a Split piece, a Concat of several storages or a channel-shuffled view,
``out`` a channel slab of a Concat's storage or an NHWC layout.  Accumulation is fp32;
the epilogue is, in this order::

    y = acc * scale + shift      scale, shift: per-output-channel operands [Cout]
                                 (a conv bias, or BatchNorm folded into scale/shift)
    y = activation(y)            relu | silu | hardswish | sigmoid | tanh | gelu | gelu_tanh
    y = y + residual             residual: broadcastable to out
    y = expr(y, x0, x1, ...)     any elementwise code (a fused region, e.g. BatchNorm + SiLU + add)

Three algorithms, all with the loads (stage 1) and stores (stage 3) in
:class:`~vtcsearch.codegen.kernels.emit.IO`:

* ``gemm`` (the default) — an implicit GEMM per group: rows ``M = N*OH*OW`` output
  pixels, columns the group's ``Cout/groups`` output channels, reduction
  ``K = KH*KW*Cin/groups`` ordered (tap, input channel), so that when ``Cin/groups``
  is a multiple of the K tile a K tile is one tap and a box of channels (a
  channel-Concat input is then read with one piece branch per tile); on the GPU the
  (input channel, tap) order, contiguous in OIHW weights, is timed too (weights kept
  [Cout, KH, KW, Cin/groups] and passed permuted suit the first order).  The index of
  ``x`` at a tile lane is computed from ``rm``/``rk`` with ``//`` and ``%``; padding
  lanes are masked (read as zero).  The grid has a group axis.
* ``mm`` (the default for 1x1, unpadded, ungrouped convs, any stride) — a plain
  batched GEMM over the map, no im2col index arithmetic: for each image,
  ``W[Cout, Cin] @ X[Cin, OH*OW]`` into ``out[Cout, OH*OW]`` (NCHW), with ``x`` a
  strided view (``narrow`` with a step) for stride > 1.  It runs
  :func:`~vtcsearch.codegen.kernels.gemm.gemm` (its tiles, split-K and autotuning), the
  same epilogue mapped onto it (scale -> ``mul``, shift -> ``bias``; ``{i2}``/``{i3}``
  of a general epilogue decoded from the flat pixel index).
* ``direct`` — few channels per group (depthwise, ``groups == Cin``): a
  [channels, pixels] tile accumulates ``x * w`` elementwise over the taps and the
  group's input channels, no tensor cores (a GEMM of width 1 would waste them).  The
  KxK taps (and up to 8 input channels per group) are unrolled with
  ``tl.static_range``, so that each tap's offsets are constants; channel tiles are
  small (4-16) and pixel tiles long, the contiguous dim of NCHW.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Sequence

from ._lib import ACTIVATIONS
from .pointwise import index_codes
from .autotune import autotune
from .codecache import Plan, compile_source, interpreting, key_of, plan_cache
from .emit import IO, next_pow2, render, tl_dtype
from .operand import Operand

__all__ = ["ConvEpilogue", "conv2d", "mm_eligible"]


@dataclass
class ConvEpilogue:
    """What a conv kernel applies to its fp32 accumulator before storing (see the module docstring).

    ``lines`` / ``expr`` / ``operands``: a general elementwise epilogue, as in
    :class:`~vtcsearch.codegen.kernels.gemm.Epilogue` (what :func:`vtcsearch.codegen.elementwise.compile_region`
    produces): ``lines`` set temporaries, then ``y = expr``; operand ``k`` (broadcastable to
    ``out``) is loaded as ``x<k>`` at the output tile, and ``{iK}`` is the index of output dim ``K``.
    """

    scale: Operand | None = None
    shift: Operand | None = None
    activation: str | None = None
    residual: Operand | None = None
    lines: Sequence[str] = ()
    expr: str | None = None
    operands: Sequence[Operand] = ()

    def signature(self) -> str:
        sig = lambda o: o.signature() if o is not None else None  # noqa: E731
        return repr((sig(self.scale), sig(self.shift), self.activation, sig(self.residual), tuple(self.lines),
                     self.expr, tuple(o.signature() for o in self.operands)))


def pair(v: int | Sequence[int]) -> tuple[int, int]:
    """``3`` -> ``(3, 3)``; ``(3, 1)`` stays."""
    if isinstance(v, int):
        return (v, v)
    a, b = v
    return (int(a), int(b))


def out_size(size: int, k: int, s: int, p: int, d: int) -> int:
    """Output extent of a window op (PyTorch's formula, floor mode)."""
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def pixel_lines(rm: str, OH: int, OW: int) -> list[str]:
    """Lines decoding the flat output-pixel vector ``rm`` into ``on``, ``oh``, ``ow``."""
    return [f"ow = {rm} % {OW}", f"oh = ({rm} // {OW}) % {OH}", f"on = {rm} // {OH * OW}"]


def join(*masks: str | None) -> str | None:
    return " & ".join(m for m in masks if m) or None


def _channel_op(op: Operand | None, C: int, what: str) -> Operand | None:
    """A per-channel operand as a 1-d [C] operand ([C], [1, C, 1, 1], ... accepted)."""
    if op is None:
        return None
    if op.shape == (C,):
        return op
    if op.numel == C:
        return op.reshape((C,))
    raise ValueError(f"{what} has shape {op.shape}, expected [{C}]")


def _per_channel(op: Operand) -> bool:
    """The [N, C, H, W] operand depends on the channel index only (a broadcast [C] vector)."""
    return len(op.map.pieces) == 1 and not op.map.pieces[0].conds and \
        all(e.free_vars() <= {"i1"} for e in op.map.pieces[0].index)


def _epilogue_lines(ep: ConvEpilogue, scale, shift, res, extra, ios: dict, *, chan: str, chan_shape: str,
                    chan_mask: str | None, chan_block, oidx: list[str], tile: str, omask: str | None,
                    oblk) -> list[str]:
    """Epilogue lines over the fp32 tile ``y`` (``chan``: the output-channel index code of the tile)."""
    lines: list[str] = []
    if scale is not None:
        ios["scale"] = IO(scale, "scale")
        lines += ios["scale"].load("sc", [chan], shape=chan_shape, mask=chan_mask, block=chan_block)
        lines.append("y = y * sc")
    if shift is not None:
        ios["shift"] = IO(shift, "shift")
        lines += ios["shift"].load("sh", [chan], shape=chan_shape, mask=chan_mask, block=chan_block)
        lines.append("y = y + sh")
    if ep.activation not in (None, "none"):
        lines.append("y = " + ACTIVATIONS[ep.activation].format(x="y"))
    if res is not None:
        ios["res"] = IO(res, "res")
        lines += ios["res"].load("res", oidx, shape=tile, mask=omask, block=oblk)
        lines.append("y = y + res")
    if ep.expr is not None:
        for k, x in enumerate(extra):
            ios[f"x{k}"] = IO(x, f"x{k}")
            if _per_channel(x):   # a BatchNorm parameter: one vector per tile, not one value per lane
                cidx = ["0", chan, "0", "0"]
                lines += ios[f"x{k}"].load(f"x{k}", cidx, shape=chan_shape, mask=chan_mask)
            else:
                lines += ios[f"x{k}"].load(f"x{k}", oidx, shape=tile, mask=omask, block=oblk)
        lines += [index_codes(line, oidx) for line in ep.lines]
        lines.append(f"y = ({index_codes(ep.expr, oidx)}) + tl.zeros({tile}, tl.float32)")
    return lines


# ---------------------------------------------------------------------------
# implicit GEMM
# ---------------------------------------------------------------------------

_GEMM_TEMPLATE = """
@triton.jit
def conv_gemm_kernel(@params@, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
    @@prologue
    pid = tl.program_id(0)
    g = tl.program_id(1)
    num_pid_m = tl.cdiv(@M@, BM)
    num_pid_n = tl.cdiv(@COG@, BN)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    # rows: output pixels (n, oh, ow) flattened; columns: output channels of group g
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    @@pixels
    ih0 = oh * @SH@ - @PH@
    iw0 = ow * @SW@ - @PW@
    co = g * @COG@ + rn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, @K@, BK):
        rk = k0 + tl.arange(0, BK)
        # the input pixel and channel each (row, k) lane reads; padding lanes are masked
        @@kidx
        # stage 1: load the x and w tiles through their maps
        @@load_x
        @@load_w
        # stage 2: multiply-accumulate in fp32
        acc = tl.dot(a, b, acc@dot_opts@)
    # stage 2: fused epilogue
    y = acc
    @@epilogue
    # stage 3: store through the output map
    @@store
"""


def _gemm_configs(M: int, COG: int, K: int, taps: int, gpu: bool) -> list[dict]:
    """Tile configs per shape class.  ``ORDER``: how K is laid out — 0: (tap, channel), a K
    tile is one tap and a channel box; 1: (channel, tap), contiguous in OIHW weights.  Both
    are timed on the GPU for KxK kernels."""
    if not gpu:
        raw = [(64, 16, 16, 4, 1)]   # BN = BK = 16: channel cuts at 16 are block-aligned
    elif M <= 1024:   # deep layers at batch 1: small tiles so that enough programs run
        raw = [(32, 32, 64, 4, 4), (32, 64, 64, 4, 3), (64, 32, 64, 4, 3), (64, 64, 32, 4, 4),
               (16, 64, 128, 4, 3)]
    elif M <= 8192:
        raw = [(64, 64, 32, 4, 4), (64, 128, 32, 4, 3), (128, 64, 32, 4, 3), (32, 64, 64, 4, 4),
               (64, 32, 64, 4, 4)]
    else:
        raw = [(128, 64, 32, 4, 3), (128, 128, 32, 8, 3), (64, 128, 32, 4, 4), (64, 64, 32, 4, 4),
               (128, 32, 32, 4, 4)]
    orders = [0, 1] if gpu and taps > 1 else [0]
    out, seen = [], set()
    for order in orders:
        for bm, bn, bk, w, s in (raw if order == 0 else raw[:2]):
            bm = min(bm, max(16, next_pow2(M)))
            bn = min(bn, max(16, next_pow2(COG)))
            bk = min(bk, max(16, next_pow2(K)))
            if (bm, bn, bk, order) in seen:
                continue
            seen.add((bm, bn, bk, order))
            out.append({"BM": bm, "BN": bn, "BK": bk, "GROUP_M": 8, "ORDER": order, "num_warps": w,
                        "num_stages": s})
    return out


def _conv_gemm(x, w, out, geo, ep, scale, shift, res, extra) -> tuple[list[dict], Callable[[dict], Plan]]:
    (N, CIN, H, W), (COUT, CG, KH, KW), (OH, OW), (SH, SW), (PH, PW), (DH, DW), G = geo
    COG = COUT // G
    M, K, TAPS = N * OH * OW, CG * KH * KW, KH * KW
    gpu = not interpreting() and out.device.type == "cuda"
    dot_dt = tl_dtype(x.dtype) if x.dtype == w.dtype and x.dtype.is_floating_point else "tl.float32"
    if not gpu:  # Triton's interpreter multiplies bf16 tiles wrongly (3.9): feed it fp32
        dot_dt = "tl.float32"
    dot_opts = ', input_precision="ieee"' if dot_dt == "tl.float32" and gpu else ""

    def build(cfg: dict) -> Plan:
        BM, BN, BK = cfg["BM"], cfg["BN"], cfg["BK"]
        ios = {"x": IO(x, "x"), "w": IO(w, "w"), "out": IO(out, "out")}
        mrow = f"(rm[:, None] < {M})" if M % BM else None
        ncol = f"(rn[None, :] < {COG})" if COG % BN else None
        # K index -> (tap, input channel): k = tap * CG + ci (ORDER 0) or ci * TAPS + tap (ORDER 1)
        if TAPS == 1:
            kidx = ["ci = rk"]
            xh, xw, kh, kw = "ih0[:, None]", "iw0[:, None]", "0", "0"
        else:
            kidx = [f"tap = rk // {CG}", f"ci = rk % {CG}"] if cfg.get("ORDER", 0) == 0 else \
                [f"ci = rk // {TAPS}", f"tap = rk % {TAPS}"]
            kidx += [f"kh = tap // {KW}", f"kw = tap % {KW}",
                     f"xh = ih0[:, None] + (kh * {DH})[None, :]", f"xw = iw0[:, None] + (kw * {DW})[None, :]"]
            xh, xw, kh, kw = "xh", "xw", "kh[:, None]", "kw[:, None]"
        kidx.append(f"xc = g * {CG} + ci")
        kmask = f"(rk[None, :] < {K})" if K % BK else None
        hmask = f"({xh} >= 0) & ({xh} < {H})" if PH else None
        wmask = f"({xw} >= 0) & ({xw} < {W})" if PW else None
        # tile boxes, where a tile is one: a channel box of BK (x) / BN (w, out) channels
        xc_blk = None
        if TAPS == 1 and (G == 1 or CG % BK == 0):
            xc_blk = (f"g * {CG} + k0", BK)
        elif CG % BK == 0 and cfg.get("ORDER", 0) == 0:
            xc_blk = (f"g * {CG} + k0 % {CG}", BK)
        co_blk = (f"g * {COG} + pid_n * BN", BN) if G == 1 or COG % BN == 0 else None
        x_blk = [("0", N), xc_blk, ("0", H), ("0", W)] if xc_blk else None
        o_blk = [("0", N), co_blk, ("0", OH), ("0", OW)] if co_blk else None
        w_blk = [co_blk, ("0", CG), ("0", KH), ("0", KW)] if co_blk else None
        load_x = ios["x"].load("a", ["on[:, None]", "xc[None, :]", xh, xw], shape="(BM, BK)",
                               mask=join(mrow, kmask, hmask, wmask), block=x_blk, dtype=dot_dt)
        load_w = ios["w"].load("b", ["co[None, :]", "ci[:, None]", kh, kw], shape="(BK, BN)",
                               mask=join(f"(rk[:, None] < {K})" if K % BK else None, ncol), block=w_blk,
                               dtype=dot_dt)
        oidx = ["on[:, None]", "co[None, :]", "oh[:, None]", "ow[:, None]"]
        omask = join(mrow, ncol)
        epi = _epilogue_lines(ep, scale, shift, res, extra, ios, chan="co[None, :]", chan_shape="(1, BN)",
                              chan_mask=ncol, chan_block=[co_blk] if co_blk else None, oidx=oidx,
                              tile="(BM, BN)", omask=omask, oblk=o_blk)
        store = ios["out"].store("y", oidx, mask=omask, block=o_blk)
        params, prologue = [], []
        for io in ios.values():
            params += io.params()
            prologue += io.prologue()
        src = render(_GEMM_TEMPLATE, params=params, prologue=prologue, pixels=pixel_lines("rm", OH, OW),
                     M=str(M), COG=str(COG), K=str(K), SH=str(SH), SW=str(SW), PH=str(PH), PW=str(PW),
                     kidx=kidx, load_x=load_x, load_w=load_w, epilogue=epi, store=store, dot_opts=dot_opts)
        kern = compile_source("conv_gemm_kernel", src)
        grid = (-(-M // BM) * -(-COG // BN), G)
        constexprs = {k: cfg[k] for k in ("BM", "BN", "BK", "GROUP_M")}
        options = {k: cfg[k] for k in ("num_warps", "num_stages")}
        if any(m != "single" for k in ("x", "w") for m in ios[k].modes):
            # Triton 3.6 on the H200 pipelined a K loop reading x through a piecewise map wrongly
            # (YOLO11s C3k2: ~0.1% of outputs off by up to 0.1 with num_stages 3-4, exact with 1)
            options["num_stages"] = 1
        return Plan("conv2d_gemm", kern, grid, constexprs, options, src, {k: io.modes for k, io in ios.items()},
                    {**cfg, **options})

    return _gemm_configs(M, COG, K, TAPS, gpu), build


# ---------------------------------------------------------------------------
# direct (depthwise and other few-channels-per-group convolutions)
# ---------------------------------------------------------------------------

_DIRECT_TEMPLATE = """
@triton.jit
def conv_direct_kernel(@params@, BC: tl.constexpr, BM: tl.constexpr):
    @@prologue
    pid_m = tl.program_id(0)
    pid_c = tl.program_id(1)
    # a [channels, pixels] tile: pixels last, the contiguous dim of NCHW
    rm = pid_m * BM + tl.arange(0, BM)
    co = pid_c * BC + tl.arange(0, BC)
    @@pixels
    ih0 = oh * @SH@ - @PH@
    iw0 = ow * @SW@ - @PW@
    xg = (co // @COG@) * @CG@
    acc = tl.zeros((BC, BM), dtype=tl.float32)
    for tap in @TAP_RANGE@(@TAPS@):
        kh = tap // @KW@
        kw = tap % @KW@
        xh = ih0 + kh * @DH@
        xw = iw0 + kw * @DW@
        for ci in @CI_RANGE@(@CG@):
            xc = xg + ci
            # stage 1: one tap of the input and its weight per channel
            @@load_x
            @@load_w
            # stage 2: multiply-accumulate in fp32
            acc += xv * wv
    y = acc
    @@epilogue
    # stage 3: store through the output map
    @@store
"""


def _direct_configs(M: int, COUT: int, gpu: bool, depthwise: bool = False) -> list[dict]:
    """[channels, pixels] tiles: for depthwise convs small channel tiles and long pixel runs (each
    channel's taps are its own; a wide channel tile only adds registers), else wider channel tiles."""
    if not gpu:
        raw = [(4, 64, 4)] if depthwise else [(16, 64, 4)]
    elif depthwise:
        raw = [(4, 256, 4), (8, 128, 4), (8, 256, 4), (16, 128, 4), (4, 512, 4), (16, 64, 4)]
    else:
        raw = [(16, 128, 4), (32, 64, 4), (32, 128, 4), (64, 64, 4)]
    out, seen = [], set()
    for bc, bm, w in raw:
        bc = min(bc, max(4 if depthwise else 16, next_pow2(COUT)))
        bm = min(bm, max(16, next_pow2(M)))
        if (bc, bm) not in seen:
            seen.add((bc, bm))
            out.append({"BC": bc, "BM": bm, "num_warps": w})
    return out


def _conv_direct(x, w, out, geo, ep, scale, shift, res, extra) -> tuple[list[dict], Callable[[dict], Plan]]:
    (N, CIN, H, W), (COUT, CG, KH, KW), (OH, OW), (SH, SW), (PH, PW), (DH, DW), G = geo
    COG = COUT // G
    M = N * OH * OW
    gpu = not interpreting() and out.device.type == "cuda"

    def build(cfg: dict) -> Plan:
        BC, BM = cfg["BC"], cfg["BM"]
        ios = {"x": IO(x, "x"), "w": IO(w, "w"), "out": IO(out, "out")}
        cmask = f"(co[:, None] < {COUT})" if COUT % BC else None
        mmask = f"(rm[None, :] < {M})" if M % BM else None
        hmask = f"(xh[None, :] >= 0) & (xh[None, :] < {H})" if PH else None
        wmask = f"(xw[None, :] >= 0) & (xw[None, :] < {W})" if PW else None
        c_blk = ("pid_c * BC", BC)
        # the input channel box equals the output channel box only when both are one per group
        x_blk = [("0", N), c_blk, ("0", H), ("0", W)] if CG == 1 and COG == 1 else None
        o_blk = [("0", N), c_blk, ("0", OH), ("0", OW)]
        load_x = ios["x"].load("xv", ["on[None, :]", "xc[:, None]", "xh[None, :]", "xw[None, :]"],
                               shape="(BC, BM)", mask=join(cmask, mmask, hmask, wmask), block=x_blk)
        load_w = ios["w"].load("wv", ["co[:, None]", "ci", "kh", "kw"], shape="(BC, 1)", mask=cmask,
                               block=[c_blk, ("0", CG), ("0", KH), ("0", KW)])
        oidx = ["on[None, :]", "co[:, None]", "oh[None, :]", "ow[None, :]"]
        omask = join(cmask, mmask)
        epi = _epilogue_lines(ep, scale, shift, res, extra, ios, chan="co[:, None]", chan_shape="(BC, 1)",
                              chan_mask=cmask, chan_block=[c_blk], oidx=oidx, tile="(BC, BM)", omask=omask,
                              oblk=o_blk)
        store = ios["out"].store("y", oidx, mask=omask, block=o_blk)
        params, prologue = [], []
        for io in ios.values():
            params += io.params()
            prologue += io.prologue()
        src = render(_DIRECT_TEMPLATE, params=params, prologue=prologue, pixels=pixel_lines("rm", OH, OW),
                     SH=str(SH), SW=str(SW), PH=str(PH), PW=str(PW), DH=str(DH), DW=str(DW), KW=str(KW),
                     TAPS=str(KH * KW), CG=str(CG), COG=str(COG), load_x=load_x, load_w=load_w,
                     TAP_RANGE="tl.static_range" if KH * KW <= 49 else "range",
                     CI_RANGE="tl.static_range" if CG <= 8 else "range",
                     epilogue=epi, store=store)
        kern = compile_source("conv_direct_kernel", src)
        grid = (-(-M // BM), -(-COUT // BC))
        return Plan("conv2d_direct", kern, grid, {"BC": BC, "BM": BM}, {"num_warps": cfg["num_warps"]}, src,
                    {k: io.modes for k, io in ios.items()}, cfg)

    return _direct_configs(M, COUT, gpu, depthwise=CG == 1 and COG == 1), build


# ---------------------------------------------------------------------------
# mm: a 1x1 conv as a batched GEMM over the map
# ---------------------------------------------------------------------------

def mm_eligible(w_shape: Sequence[int], padding: int | Sequence[int], groups: int) -> bool:
    """A conv that is a plain GEMM per image: 1x1 kernel, no padding, one group (any stride/dilation)."""
    return tuple(w_shape[2:]) == (1, 1) and pair(padding) == (0, 0) and groups == 1


def _conv_mm(x: Operand, w: Operand, out: Operand, geo, ep: ConvEpilogue, scale, shift, res,
             extra) -> Plan:
    """``out[n] = epilogue(W[Cout, Cin] @ X[n][Cin, OH*OW])`` through the maps, as :func:`gemm`."""
    from .gemm import Epilogue, gemm
    (N, CIN, H, W), (COUT, CG, KH, KW), (OH, OW), (SH, SW), (PH, PW), (DH, DW), G = geo
    if (KH, KW) != (1, 1) or (PH, PW) != (0, 0) or G != 1:
        raise ValueError("conv2d algo='mm' needs a 1x1 kernel, no padding and groups=1")
    P = OH * OW
    if (SH, SW) != (1, 1):   # the pixels a strided 1x1 conv reads: a strided view of x
        x = x.narrow(2, 0, OH, SH).narrow(3, 0, OW, SW)
    a = w.reshape((COUT, CIN))
    b = x.reshape((N, CIN, P))
    o3 = out.reshape((N, COUT, P))
    chan = lambda op: op.reshape((COUT, 1)).broadcast_to((N, COUT, P))  # noqa: E731
    flat = lambda op: op.reshape((N, COUT, P))  # noqa: E731
    # {i2}/{i3} (output row/column) of a general epilogue, decoded from the flat pixel dim of the GEMM view
    pix2 = lambda code: re.sub(r"\{i([23])\}", lambda m: f"({{i2}} // {OW})" if m.group(1) == "2"  # noqa: E731
                               else f"({{i2}} % {OW})", code)
    gep = Epilogue(mul=chan(scale) if scale is not None else None,
                   bias=chan(shift) if shift is not None else None, activation=ep.activation,
                   residual=flat(res) if res is not None else None,
                   lines=[pix2(ln) for ln in ep.lines], expr=pix2(ep.expr) if ep.expr is not None else None,
                   operands=[flat(o) for o in extra])
    return gemm(a, b, o3, gep, serial_pieces=True)


# ---------------------------------------------------------------------------
# entry point
# ---------------------------------------------------------------------------

def conv2d(x: Operand, w: Operand, out: Operand, *, stride: int | Sequence[int] = (1, 1),
           padding: int | Sequence[int] = (0, 0), dilation: int | Sequence[int] = (1, 1), groups: int = 1,
           epilogue: ConvEpilogue | None = None, algo: str | None = None) -> Plan:
    """``out = epilogue(conv2d(x, w))`` through the operands' maps; see the module docstring.

    ``algo``: ``"mm"``, ``"gemm"`` or ``"direct"`` forces an algorithm (default: ``direct`` when a
    group has fewer than 8 output channels or a reduction shorter than 8, ``mm`` for a 1x1 unpadded
    ungrouped conv, else ``gemm``).
    """
    ep = epilogue or ConvEpilogue()
    if x.ndim != 4 or w.ndim != 4 or out.ndim != 4:
        raise ValueError("conv2d takes 4-d x [N, Cin, H, W], w [Cout, Cin/groups, KH, KW], out [N, Cout, OH, OW]")
    (SH, SW), (PH, PW), (DH, DW) = pair(stride), pair(padding), pair(dilation)
    N, CIN, H, W = x.shape
    COUT, CG, KH, KW = w.shape
    G = int(groups)
    if G < 1 or CIN % G or COUT % G or CG != CIN // G:
        raise ValueError(f"conv2d: x {x.shape}, w {w.shape} do not fit groups={G}")
    OH, OW = out_size(H, KH, SH, PH, DH), out_size(W, KW, SW, PW, DW)
    if out.shape != (N, COUT, OH, OW):
        raise ValueError(f"conv2d: out has shape {out.shape}, expected {(N, COUT, OH, OW)}")
    if min(SH, SW, DH, DW) < 1 or min(PH, PW) < 0 or min(OH, OW) < 1:
        raise ValueError("conv2d: bad stride / padding / dilation")
    if ep.activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {ep.activation!r}")
    scale = _channel_op(ep.scale, COUT, "scale")
    shift = _channel_op(ep.shift, COUT, "shift")
    res = ep.residual.broadcast_to(out.shape) if ep.residual is not None else None
    COG = COUT // G
    if algo is None:
        algo = "direct" if COG < 8 or CG * KH * KW < 8 else \
            "mm" if mm_eligible(w.shape, (PH, PW), G) else "gemm"
    if algo not in ("gemm", "direct", "mm"):
        raise ValueError(f"unknown conv algorithm {algo!r}")
    geo = ((N, CIN, H, W), (COUT, CG, KH, KW), (OH, OW), (SH, SW), (PH, PW), (DH, DW), G)
    if algo == "mm":
        extra = [o if o.shape == out.shape else o.broadcast_to(out.shape) for o in ep.operands] \
            if ep.expr is not None else []
        return _conv_mm(x, w, out, geo, ep, scale, shift, res, extra)
    base_key = key_of("conv2d", algo, geo, x.signature(), w.signature(), out.signature(), ep.signature())
    make = _conv_gemm if algo == "gemm" else _conv_direct
    extra = [o if o.shape == out.shape else o.broadcast_to(out.shape) for o in ep.operands] \
        if ep.expr is not None else []
    configs, build = make(x, w, out, geo, ep, scale, shift, res, extra)
    args = x.kernel_args() + w.kernel_args() + out.kernel_args() + \
        [v for o in [scale, shift, res, *extra] if o is not None for v in o.kernel_args()]

    def runner(cfg: dict):
        plan = plan_cache(key_of(base_key, sorted(cfg.items())), lambda: build(cfg))
        return lambda: plan.launch(args)

    cfg = autotune(base_key, configs, runner, written=out.tensors.values(), device=out.device)
    plan = plan_cache(key_of(base_key, sorted(cfg.items())), lambda: build(cfg))
    plan.launch(args)
    return plan

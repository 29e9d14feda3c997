"""2-d pooling and nearest upsampling, every operand through its map.

* ``max_pool2d(x, out, kernel, stride=None, padding=0, dilation=1)`` — padding lanes
  are ``-inf``; compares in fp32 (fp64 for fp64), exact for every float storage, so the
  result is bit-exact.  YOLO's SPPF (three chained ``k=5, s=1, p=2`` pools whose inputs
  and outputs are channel slabs of one Concat storage) is three calls reading and
  writing those slabs in place.
* ``avg_pool2d(x, out, kernel, stride=None, padding=0, count_include_pad=True,
  divisor_override=None)`` — fp32 sums.
* ``global_avg_pool2d(x, out)`` — mean over H, W (``adaptive_avg_pool2d(x, 1)``);
  ``out`` is [N, C, 1, 1] or [N, C].
* ``upsample_nearest2d(x, out, scale)`` — integer scale factors; a pure data movement
  op, so it is the residual copy kernel reading ``x`` through the map
  ``x[n, c, h // sh, w // sw]`` (bit-exact).

``x`` is [N, C, H, W] and ``out`` [N, C, OH, OW] (floor mode, no ``ceil_mode``).  The
window kernels use a [channels, pixels] tile (pixels last: the contiguous dim of
NCHW storages) and loop over the window's taps.
"""
from __future__ import annotations

from typing import Sequence

import torch

from ...core.mapping import index_vars
from .conv import join, out_size, pair, pixel_lines
from .copy import copy
from .codecache import Plan, compile_source, interpreting, key_of, plan_cache
from .emit import IO, const_code, next_pow2, render
from .operand import Operand

__all__ = ["max_pool2d", "avg_pool2d", "global_avg_pool2d", "upsample_nearest2d"]

_WINDOW_TEMPLATE = """
@triton.jit
def @NAME@(@params@, BC: tl.constexpr, BM: tl.constexpr):
    @@prologue
    pid_m = tl.program_id(0)
    pid_c = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rc = pid_c * BC + tl.arange(0, BC)
    @@pixels
    ih0 = oh * @SH@ - @PH@
    iw0 = ow * @SW@ - @PW@
    @@init
    for tap in range(@TAPS@):
        xh = ih0 + (tap // @KW@) * @DH@
        xw = iw0 + (tap % @KW@) * @DW@
        # stage 1: one tap of the window through the map (padding lanes: the identity of the reduction)
        @@load
        # stage 2
        @@accumulate
    @@finish
    # stage 3: store through the output map
    @@store
"""


def _window_tile(M: int, C: int, gpu: bool) -> tuple[int, int]:
    BM = min(128 if gpu else 64, max(16, next_pow2(M)))
    BC = min(32 if gpu else 16, max(1, next_pow2(C)), max(1, 4096 // BM))
    return BC, BM


def _window(kind: str, x: Operand, out: Operand, kernel, stride, padding, dilation,
            count_include_pad: bool = True, divisor_override: int | None = None) -> Plan:
    """The shared window-reduction kernel of max and average pooling."""
    if x.ndim != 4 or out.ndim != 4:
        raise ValueError(f"{kind}_pool2d takes 4-d x [N, C, H, W] and out [N, C, OH, OW]")
    (KH, KW) = pair(kernel)
    (SH, SW) = pair(stride) if stride is not None else (KH, KW)
    (PH, PW), (DH, DW) = pair(padding), pair(dilation)
    N, C, H, W = x.shape
    if 2 * PH > KH or 2 * PW > KW:
        raise ValueError("pad should be at most half of the kernel size (as in PyTorch)")
    OH, OW = out_size(H, KH, SH, PH, DH), out_size(W, KW, SW, PW, DW)
    if out.shape != (N, C, OH, OW):
        raise ValueError(f"{kind}_pool2d: out has shape {out.shape}, expected {(N, C, OH, OW)}")
    M = N * OH * OW
    gpu = not interpreting() and out.device.type == "cuda"
    BC, BM = _window_tile(M, C, gpu)
    opts = (KH, KW, SH, SW, PH, PW, DH, DW, count_include_pad, divisor_override)
    key = key_of(f"{kind}_pool2d", x.signature(), out.signature(), opts, BC, BM)

    def build() -> Plan:
        xio, oio = IO(x, "x"), IO(out, "out")
        cmask = f"(rc[:, None] < {C})" if C % BC else None
        mmask = f"(rm[None, :] < {M})" if M % BM else None
        inside = f"(xh[None, :] >= 0) & (xh[None, :] < {H}) & (xw[None, :] >= 0) & (xw[None, :] < {W})"
        pad = inside if PH or PW else None
        c_blk = ("pid_c * BC", BC)
        xidx = ["on[None, :]", "rc[:, None]", "xh[None, :]", "xw[None, :]"]
        x_blk = [("0", N), c_blk, ("0", H), ("0", W)]
        if kind == "max":
            # 16-bit floats compare in fp32 (exact both ways; Triton's interpreter mis-orders bf16)
            dt = "tl.float64" if x.dtype == torch.float64 else "tl.float32"
            init = [f"acc = tl.full((BC, BM), {const_code(float('-inf'), dt)}, {dt})"]
            load = xio.load("v", xidx, shape="(BC, BM)", mask=join(cmask, mmask, pad), block=x_blk, dtype=dt,
                            other=float("-inf"))
            accumulate = ["acc = tl.maximum(acc, v)"]
            finish = ["y = acc"]
        else:
            init = ["acc = tl.zeros((BC, BM), dtype=tl.float32)"]
            load = xio.load("v", xidx, shape="(BC, BM)", mask=join(cmask, mmask, pad), block=x_blk)
            accumulate = ["acc += v"]
            if divisor_override:
                finish = [f"y = acc / {float(divisor_override)!r}"]
            elif count_include_pad or not pad:
                finish = [f"y = acc / {float(KH * KW)!r}"]
            else:  # count the taps inside the image, per output pixel
                init.append("cnt = tl.zeros((1, BM), dtype=tl.float32)")
                accumulate.append(f"cnt += tl.where({inside}, 1.0, 0.0)")
                finish = ["y = acc / cnt"]
        oblk = [("0", N), c_blk, ("0", OH), ("0", OW)]
        store = oio.store("y", ["on[None, :]", "rc[:, None]", "oh[None, :]", "ow[None, :]"], mask=join(cmask, mmask),
                          block=oblk)
        name = f"{kind}_pool2d_kernel"
        src = render(_WINDOW_TEMPLATE, NAME=name, params=xio.params() + oio.params(),
                     prologue=xio.prologue() + oio.prologue(), pixels=pixel_lines("rm", OH, OW),
                     SH=str(SH), SW=str(SW), PH=str(PH), PW=str(PW), DH=str(DH), DW=str(DW), KW=str(KW),
                     TAPS=str(KH * KW), init=init, load=load, accumulate=accumulate, finish=finish, store=store)
        kern = compile_source(name, src)
        grid = (-(-M // BM), -(-C // BC))
        return Plan(f"{kind}_pool2d", kern, grid, {"BC": BC, "BM": BM}, {"num_warps": 4}, src,
                    {"x": xio.modes, "out": oio.modes}, {"BC": BC, "BM": BM})

    plan = plan_cache(key, build)
    plan.launch(x.kernel_args() + out.kernel_args())
    return plan


def max_pool2d(x: Operand, out: Operand, kernel: int | Sequence[int], stride: int | Sequence[int] | None = None,
               padding: int | Sequence[int] = 0, dilation: int | Sequence[int] = 1) -> Plan:
    """``out = max_pool2d(x)`` (``stride`` defaults to ``kernel``, as in PyTorch), bit-exact."""
    return _window("max", x, out, kernel, stride, padding, dilation)


def avg_pool2d(x: Operand, out: Operand, kernel: int | Sequence[int], stride: int | Sequence[int] | None = None,
               padding: int | Sequence[int] = 0, count_include_pad: bool = True,
               divisor_override: int | None = None) -> Plan:
    """``out = avg_pool2d(x)`` with PyTorch's divisor rules (floor mode)."""
    return _window("avg", x, out, kernel, stride, padding, 1, count_include_pad, divisor_override)


_GLOBAL_TEMPLATE = """
@triton.jit
def global_avg_pool2d_kernel(@params@, BC: tl.constexpr, BL: tl.constexpr):
    @@prologue
    n = tl.program_id(0)
    rc = tl.program_id(1) * BC + tl.arange(0, BC)
    acc = tl.zeros((BC, BL), dtype=tl.float32)
    for l0 in range(0, @HW@, BL):
        rl = l0 + tl.arange(0, BL)
        xh = rl // @W@
        xw = rl % @W@
        # stage 1
        @@load
        acc += v
    # stage 2: fp32 mean
    y = tl.sum(acc, axis=1) / @HWF@
    # stage 3
    @@store
"""


def global_avg_pool2d(x: Operand, out: Operand) -> Plan:
    """``out = x.mean((2, 3))``: ``adaptive_avg_pool2d(x, 1)`` ([N, C, 1, 1]) or its flat [N, C] form."""
    if x.ndim != 4:
        raise ValueError("global_avg_pool2d takes a 4-d x [N, C, H, W]")
    N, C, H, W = x.shape
    if out.shape not in ((N, C, 1, 1), (N, C)):
        raise ValueError(f"global_avg_pool2d: out has shape {out.shape}, expected {(N, C, 1, 1)} or {(N, C)}")
    HW = H * W
    gpu = not interpreting() and out.device.type == "cuda"
    BL = min(256 if gpu else 64, max(16, next_pow2(HW)))
    BC = min(32 if gpu else 16, max(1, next_pow2(C)))
    key = key_of("global_avg_pool2d", x.signature(), out.signature(), BC, BL)

    def build() -> Plan:
        xio, oio = IO(x, "x"), IO(out, "out")
        cmask = f"(rc[:, None] < {C})" if C % BC else None
        lmask = f"(rl[None, :] < {HW})" if HW % BL else None
        load = xio.load("v", ["n", "rc[:, None]", "xh[None, :]", "xw[None, :]"], shape="(BC, BL)",
                        mask=join(cmask, lmask), block=[("n", 1), ("tl.program_id(1) * BC", BC), ("0", H), ("0", W)])
        oidx = ["n", "rc"] + (["0", "0"] if out.ndim == 4 else [])
        oblk = [("n", 1), ("tl.program_id(1) * BC", BC)] + ([("0", 1), ("0", 1)] if out.ndim == 4 else [])
        store = oio.store("y", oidx, mask=f"(rc < {C})" if C % BC else None, block=oblk)
        src = render(_GLOBAL_TEMPLATE, params=xio.params() + oio.params(), prologue=xio.prologue() + oio.prologue(),
                     HW=str(HW), HWF=repr(float(HW)), W=str(W), load=load, store=store)
        kern = compile_source("global_avg_pool2d_kernel", src)
        return Plan("global_avg_pool2d", kern, (N, -(-C // BC)), {"BC": BC, "BL": BL}, {"num_warps": 4}, src,
                    {"x": xio.modes, "out": oio.modes}, {"BC": BC, "BL": BL})

    plan = plan_cache(key, build)
    plan.launch(x.kernel_args() + out.kernel_args())
    return plan


def upsample_nearest2d(x: Operand, out: Operand, scale: int | Sequence[int]) -> Plan:
    """``out = interpolate(x, scale_factor=scale, mode="nearest")`` for integer scales, bit-exact.

    Nearest upsampling moves data only: it is :func:`~vtcsearch.codegen.kernels.copy.copy` from
    the virtual tensor ``x[n, c, h // sh, w // sw]`` (which a consumer could equally read
    directly, eliminating the op).
    """
    SH, SW = pair(scale)
    if x.ndim != 4 or min(SH, SW) < 1:
        raise ValueError("upsample_nearest2d takes a 4-d x and integer scales >= 1")
    N, C, H, W = x.shape
    if out.shape != (N, C, H * SH, W * SW):
        raise ValueError(f"upsample_nearest2d: out has shape {out.shape}, expected {(N, C, H * SH, W * SW)}")
    v = index_vars(4)
    up = x.view(out.shape, [v[0], v[1], v[2] // SH, v[3] // SW])
    return copy(out, up)

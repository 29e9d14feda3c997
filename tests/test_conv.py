"""Convolution and pooling templates with virtual-tensor I/O, against torch.nn.functional.

Every kernel writes into NaN-poisoned storages; each storage is compared with the
reference scatter (``IndexMap.scatter``) of the eager result through the output's map,
so unwritten elements and stray writes both fail.  Inputs are read under the map kinds
a CNN produces: a Split piece (channel slice), a channel Concat of two storages (cut
block-aligned or not), a channel shuffle (reshape-transpose-reshape), NHWC layouts.
The reference is computed on the CPU in float64.  On the CPU the kernels run in
Triton's interpreter (small shapes); the ``gpu`` tests run YOLO11n and ShuffleNetV2
shapes in fp16.
"""
from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F

triton = pytest.importorskip("triton")
pytestmark = [pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]

from vtcsearch.codegen.kernels import (ConvEpilogue, Operand, avg_pool2d, conv2d, global_avg_pool2d,  # noqa: E402
                               max_pool2d, upsample_nearest2d)

from conftest import DEVICE as DEV, GPU  # noqa: E402
gpu = pytest.mark.gpu
NAN = float("nan")

_gen = torch.Generator().manual_seed(4321)


def rnd(*shape, dtype=torch.float32, device=None):
    return torch.randn(shape, generator=_gen).to(device or DEV, dtype)


def poison(*shape, dtype=torch.float32, device=None):
    return torch.full(shape, NAN, dtype=dtype, device=device or DEV)


def expected_storages(op: Operand, value: torch.Tensor) -> dict[str, torch.Tensor]:
    """Poisoned copies of ``op``'s storages with ``value`` written through its map (reference semantics)."""
    exp = {k: torch.full(t.shape, NAN, dtype=t.dtype) for k, t in op.tensors.items()}
    Operand(op.map, exp, op.syms, op.tables).scatter(value.cpu().to(op.dtype))
    return exp


def assert_written(op: Operand, value: torch.Tensor, exact: bool = False, rtol=1e-4, atol=1e-4):
    """Every storage of ``op`` equals the reference scatter of ``value`` (NaN where nothing is written)."""
    exp = expected_storages(op, value)
    for k, t in op.tensors.items():
        got, want = t.cpu(), exp[k]
        if exact:
            same = (got == want) | (got.isnan() & want.isnan())
            assert bool(same.all()), f"storage {k}: {int((~same).sum())} elements differ"
        else:
            torch.testing.assert_close(got.double(), want.double(), rtol=rtol, atol=atol, equal_nan=True,
                                       msg=lambda m: f"storage {k}: {m}")


def conv_ref(x, w, stride=1, padding=0, dilation=1, groups=1, scale=None, shift=None, act=None, residual=None):
    """Eager conv2d and epilogue in float64 on the CPU."""
    d = lambda t: t.detach().cpu().double()  # noqa: E731
    y = F.conv2d(d(x), d(w), None, stride, padding, dilation, groups)
    if scale is not None:
        y = y * d(scale).reshape(1, -1, 1, 1)
    if shift is not None:
        y = y + d(shift).reshape(1, -1, 1, 1)
    if act is not None:
        y = {"relu": F.relu, "silu": F.silu, "hardswish": F.hardswish, "sigmoid": torch.sigmoid}[act](y)
    if residual is not None:
        y = y + d(residual)
    return y


# ---------------------------------------------------------------------------
# operands under each map kind
# ---------------------------------------------------------------------------

def read_x(kind: str, N, C, H, W, dtype=torch.float32):
    """(operand [N, C, H, W] under map ``kind``, the same values as a plain tensor)."""
    if kind == "identity":
        t = rnd(N, C, H, W, dtype=dtype)
        op, ref = Operand.dense(t, "x"), t
    elif kind == "split":          # a Split piece: channels [3, 3 + C) of a bigger tensor
        big = rnd(N, C + 5, H, W, dtype=dtype)
        op, ref = Operand.dense(big, "x").narrow(1, 3, C), big[:, 3:3 + C]
    elif kind in ("concat_aligned", "concat_unaligned"):
        cut = 16 if kind == "concat_aligned" else 5
        a, b = rnd(N, cut, H, W, dtype=dtype), rnd(N, C - cut, H, W, dtype=dtype)
        op, ref = Operand.cat([Operand.dense(a, "xa"), Operand.dense(b, "xb")], 1), torch.cat([a, b], 1)
    elif kind == "shuffle":        # ShuffleNet's channel shuffle with 2 groups
        t = rnd(N, C, H, W, dtype=dtype)
        op = Operand.dense(t, "x").reshape((N, 2, C // 2, H, W)).permute([0, 2, 1, 3, 4]).reshape((N, C, H, W))
        ref = t.view(N, 2, C // 2, H, W).transpose(1, 2).reshape(N, C, H, W)
    elif kind == "concat_shuffle":  # cat(x1, branch) then shuffle: one map over two storages
        a, b = rnd(N, C // 2, H, W, dtype=dtype), rnd(N, C // 2, H, W, dtype=dtype)
        cat = Operand.cat([Operand.dense(a, "xa"), Operand.dense(b, "xb")], 1)
        op = cat.reshape((N, 2, C // 2, H, W)).permute([0, 2, 1, 3, 4]).reshape((N, C, H, W))
        ref = torch.cat([a, b], 1).view(N, 2, C // 2, H, W).transpose(1, 2).reshape(N, C, H, W)
    elif kind == "nhwc":
        t = rnd(N, H, W, C, dtype=dtype)
        op, ref = Operand.dense(t, "x").permute([0, 3, 1, 2]), t.permute(0, 3, 1, 2)
    else:
        raise KeyError(kind)
    assert torch.equal(op.gather().cpu(), ref.cpu()), f"map of kind {kind} builds the wrong tensor"
    return op, ref


def write_out(kind: str, N, C, H, W, dtype=torch.float32) -> Operand:
    """An operand [N, C, H, W] under map ``kind`` whose storages are all poisoned."""
    if kind == "identity":
        return Operand.dense(poison(N, C, H, W, dtype=dtype), "y")
    if kind == "concat_slice":     # a Concat input written in place: channels [4, 4 + C) of the output
        return Operand.dense(poison(N, C + 7, H, W, dtype=dtype), "y").narrow(1, 4, C)
    if kind == "nhwc":             # written transposed
        return Operand.dense(poison(N, H, W, C, dtype=dtype), "y").permute([0, 3, 1, 2])
    if kind in ("split_aligned", "split_unaligned"):   # a Split's outputs (YOLO's C2f chunk) written directly
        cut = 16 if kind == "split_aligned" else 5
        return Operand.cat([Operand.dense(poison(N, cut, H, W, dtype=dtype), "ya"),
                            Operand.dense(poison(N, C - cut, H, W, dtype=dtype), "yb")], 1)
    raise KeyError(kind)


# ---------------------------------------------------------------------------
# conv2d: geometry
# ---------------------------------------------------------------------------

# (Cin, Cout, kernel, stride, padding, dilation, groups)
GEOMETRIES = [
    (8, 16, 1, 1, 0, 1, 1),
    (8, 16, 3, 1, 1, 1, 1),
    (8, 16, 3, 2, 1, 1, 1),
    (3, 16, 3, 2, 1, 1, 1),              # a stem: 3 input channels
    (8, 16, 5, 1, 2, 1, 1),
    (4, 16, 7, 2, 3, 1, 1),
    (8, 16, 3, 1, 2, 2, 1),              # dilation 2
    (8, 16, 3, 2, 0, 1, 1),              # no padding
    (8, 16, (1, 3), (2, 1), (0, 1), 1, 1),
    (32, 32, 3, 1, 1, 1, 2),             # groups 2, 16 channels per group: implicit GEMM per group
    (8, 8, 3, 1, 1, 1, 4),               # groups 4, 2 channels per group: direct
    (16, 16, 3, 1, 1, 1, 16),            # depthwise
    (16, 16, 3, 2, 1, 1, 16),
    (16, 16, 5, 2, 2, 1, 16),
    (16, 16, 3, 1, 2, 2, 16),
    (8, 16, 3, 1, 1, 1, 8),              # depthwise with channel multiplier 2
]


@pytest.mark.parametrize("geo", GEOMETRIES, ids=lambda g: "-".join(map(str, g)))
def test_conv_geometry(geo):
    cin, cout, k, s, p, d, g = geo
    kh, kw = (k, k) if isinstance(k, int) else k
    x = rnd(2, cin, 9, 7)
    w = rnd(cout, cin // g, kh, kw)
    want = conv_ref(x, w, s, p, d, g)
    out = write_out("identity", *want.shape)
    plan = conv2d(Operand.dense(x, "x"), Operand.dense(w, "w"), out, stride=s, padding=p, dilation=d, groups=g)
    mm = (kh, kw) == (1, 1) and p == 0 and g == 1
    assert plan.name == ("conv2d_direct" if cout // g < 8 else "gemm" if mm else "conv2d_gemm")
    assert_written(out, want)


@pytest.mark.parametrize("algo,geo", [("direct", (8, 16, 3, 2, 1, 1, 1)), ("gemm", (16, 16, 3, 1, 1, 1, 16)),
                                      ("direct", (32, 32, 3, 1, 1, 1, 2))])
def test_conv_forced_algorithm(algo, geo):
    cin, cout, k, s, p, d, g = geo
    x, w = rnd(1, cin, 7, 6), rnd(cout, cin // g, k, k)
    want = conv_ref(x, w, s, p, d, g)
    out = write_out("identity", *want.shape)
    plan = conv2d(Operand.dense(x, "x"), Operand.dense(w, "w"), out, stride=s, padding=p, groups=g, algo=algo)
    assert plan.name == f"conv2d_{algo}"
    assert_written(out, want)


@pytest.mark.parametrize("geo", [(8, 16, 3, 2, 1, 1, 1), (32, 32, 3, 1, 2, 2, 2), (4, 16, 5, 1, 2, 1, 1)],
                         ids=lambda g: "-".join(map(str, g)))
def test_conv_channel_major_k_order(geo, monkeypatch):
    """The GPU also times K laid out (channel, tap), contiguous in OIHW weights: check it here."""
    from vtcsearch.codegen.kernels import conv as conv_mod
    cfg = {"BM": 32, "BN": 16, "BK": 16, "GROUP_M": 8, "ORDER": 1, "num_warps": 4, "num_stages": 1}
    monkeypatch.setattr(conv_mod, "_gemm_configs", lambda *a: [cfg])
    cin, cout, k, s, p, d, g = geo
    x, xr = read_x("concat_aligned", 1, cin, 7, 6) if cin == 32 else read_x("identity", 1, cin, 7, 6)
    w = rnd(cout, cin // g, k, k)
    want = conv_ref(xr, w, s, p, d, g)
    out = write_out("identity", *want.shape)
    plan = conv2d(x, Operand.dense(w, "w"), out, stride=s, padding=p, dilation=d, groups=g)
    assert plan.config["ORDER"] == 1 and "ci = rk // " in plan.source
    assert_written(out, want)


# ---------------------------------------------------------------------------
# conv2d: fused epilogue
# ---------------------------------------------------------------------------

EPILOGUES = ["scale", "shift", "relu", "silu", "hardswish", "sigmoid", "residual", "bn_silu_residual_virtual"]


@pytest.mark.parametrize("algo", ["gemm", "direct"])
@pytest.mark.parametrize("piece", EPILOGUES)
def test_conv_epilogue(piece, algo):
    groups = 1 if algo == "gemm" else 16
    x, w = rnd(2, 16, 6, 5), rnd(24 if algo == "gemm" else 16, 16 // groups, 3, 3)
    cout = w.shape[0]
    sc, sh = rnd(cout), rnd(cout)
    res = rnd(2, cout, 6, 5)
    kw = dict(scale=None, shift=None, act=None, residual=None)
    ep = ConvEpilogue()
    if piece == "scale":
        kw["scale"], ep.scale = sc, Operand.dense(sc, "sc")
    elif piece == "shift":   # given as [1, C, 1, 1], as a bias would be
        kw["shift"], ep.shift = sh, Operand.dense(sh.view(1, cout, 1, 1), "sh")
    elif piece in ("relu", "silu", "hardswish", "sigmoid"):
        kw["act"] = ep.activation = piece
    elif piece == "residual":
        kw["residual"], ep.residual = res, Operand.dense(res, "r")
    else:  # folded BatchNorm + SiLU + a residual read from a channel slab of a bigger storage
        big = rnd(2, cout + 8, 6, 5)
        kw.update(scale=sc, shift=sh, act="silu", residual=big[:, 8:])
        ep = ConvEpilogue(Operand.dense(sc, "sc"), Operand.dense(sh, "sh"), "silu",
                          Operand.dense(big, "r").narrow(1, 8, cout))
    want = conv_ref(x, w, 1, 1, 1, groups, **kw)
    out = write_out("concat_slice", *want.shape)
    plan = conv2d(Operand.dense(x, "x"), Operand.dense(w, "w"), out, padding=1, groups=groups, epilogue=ep,
                  algo=algo)
    assert plan.name == f"conv2d_{algo}"
    assert_written(out, want)


# ---------------------------------------------------------------------------
# conv2d: 1x1 as a GEMM over the map; depthwise with unrolled taps (issue 12 item 4)
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("kind", ["split", "concat_unaligned", "shuffle", "nhwc"])
def test_conv_1x1_as_mm_through_map(kind, stride):
    """A 1x1 ungrouped conv is W[Cout, Cin] @ X[Cin, OH*OW] per image (``algo="mm"``, the default): through
    the input's map (a channel Split piece, a Concat, a shuffle, NHWC), stride 2 as a strided view, with the
    whole epilogue (folded BatchNorm, SiLU, a residual, a general expression using the output row/column),
    written into a channel slab of a Concat's storage."""
    x, xr = read_x(kind, 2, 32, 6, 5)
    w = rnd(24, 32, 1, 1)
    sc, sh = rnd(24), rnd(24)
    want = conv_ref(xr, w, stride, scale=sc, shift=sh, act="silu")
    res = rnd(*want.shape)
    want = want + res.double()
    want = want * 2.0 + (torch.arange(want.shape[2]).view(1, 1, -1, 1) * 10
                         + torch.arange(want.shape[3]).view(1, 1, 1, -1)).double()
    ep = ConvEpilogue(Operand.dense(sc, "sc"), Operand.dense(sh, "sh"), "silu", Operand.dense(res, "r"),
                      lines=["t = {i2} * 10 + {i3}"], expr="y * 2.0 + t")
    out = write_out("concat_slice", *want.shape)
    plan = conv2d(x, Operand.dense(w, "w"), out, stride=stride, epilogue=ep)
    assert plan.name == "gemm" and "SPLIT" not in plan.config
    assert_written(out, want)


def test_conv_mm_refuses_what_is_not_a_gemm():
    x, w = Operand.dense(rnd(1, 8, 4, 4), "x"), Operand.dense(rnd(16, 8, 3, 3), "w")
    out = Operand.dense(poison(1, 16, 2, 2), "y")
    with pytest.raises(ValueError, match="1x1"):
        conv2d(x, w, out, algo="mm")
    plan = conv2d(x, Operand.dense(rnd(16, 8, 1, 1), "w1"), Operand.dense(poison(1, 16, 6, 6), "y1"),
                  padding=1)
    assert plan.name == "conv2d_gemm"   # padded 1x1: the implicit GEMM masks the border


@pytest.mark.parametrize("k,stride", [(3, 1), (5, 1), (5, 2), (3, 2)])
@pytest.mark.parametrize("kind", ["split", "concat_unaligned"])
def test_depthwise_unrolled_taps_small_channel_tiles(k, stride, kind):
    """Depthwise KxK (EfficientViT's 5x5, MobileNet's stride 2) through a channel Split / Concat: the taps
    are unrolled (tl.static_range), the channel tile is small, the result equals torch's conv."""
    C = 24
    x, xr = read_x(kind, 2, C, 9, 7)
    w = rnd(C, 1, k, k)
    want = conv_ref(xr, w, stride, k // 2, 1, C, act="hardswish")
    out = write_out("identity", *want.shape)
    plan = conv2d(x, Operand.dense(w, "w"), out, stride=stride, padding=k // 2, groups=C,
                  epilogue=ConvEpilogue(activation="hardswish"))
    assert plan.name == "conv2d_direct" and plan.config["BC"] <= 16
    assert "tl.static_range(" + str(k * k) + ")" in plan.source
    assert_written(out, want)


def test_conv_residual_broadcast_over_pixels():
    x, w, r = rnd(1, 8, 5, 5), rnd(16, 8, 1, 1), rnd(1, 16, 1, 1)
    want = conv_ref(x, w, residual=r)
    out = write_out("identity", *want.shape)
    conv2d(Operand.dense(x, "x"), Operand.dense(w, "w"), out, epilogue=ConvEpilogue(residual=Operand.dense(r, "r")))
    assert_written(out, want)


# ---------------------------------------------------------------------------
# conv2d: operands under map kinds
# ---------------------------------------------------------------------------

READ_KINDS = ["identity", "split", "concat_aligned", "concat_unaligned", "shuffle", "concat_shuffle", "nhwc"]
WRITE_KINDS = ["identity", "concat_slice", "nhwc", "split_aligned", "split_unaligned"]


@pytest.mark.parametrize("algo", ["gemm", "direct"])
@pytest.mark.parametrize("kind", READ_KINDS)
def test_conv_reads_x_through_map(kind, algo):
    C = 32
    groups = 1 if algo == "gemm" else C
    x, xr = read_x(kind, 2, C, 6, 5)
    w = rnd(16 if algo == "gemm" else C, C // groups, 3, 3)
    want = conv_ref(xr, w, 1, 1, 1, groups)
    out = write_out("identity", *want.shape)
    plan = conv2d(x, Operand.dense(w, "w"), out, padding=1, groups=groups)
    assert plan.name == f"conv2d_{algo}"
    assert_written(out, want)
    if kind == "concat_aligned" and not GPU:   # a tile of 16 channels lies in one storage: one branch per tile
        assert plan.modes["x"] == ["block"], plan.modes
    if kind == "concat_unaligned":
        assert plan.modes["x"] == ["element"], plan.modes


@pytest.mark.parametrize("algo", ["gemm", "mm"])
def test_conv_1x1_reads_channel_concat_per_block(algo, monkeypatch):
    """The common case: a 1x1 conv over a Concat (YOLO's C2f / SPPF cv2) reads each storage per K tile,
    as the implicit GEMM (x) and as the plain GEMM over the map (its b operand, X[Cin, HW]; a K tile of
    16 channels, the cut's alignment)."""
    monkeypatch.setattr(sys.modules["vtcsearch.codegen.kernels.gemm"], "_configs", lambda *a: [
        {"BM": 16, "BN": 16, "BK": 16, "GROUP_M": 8, "num_warps": 4, "num_stages": 3}])
    x, xr = read_x("concat_aligned", 1, 48, 4, 5)
    w = rnd(16, 48, 1, 1)
    want = conv_ref(xr, w)
    out = write_out("identity", *want.shape)
    plan = conv2d(x, Operand.dense(w, "w"), out, algo=algo)
    assert_written(out, want)
    if not GPU:
        assert plan.modes["x" if algo == "gemm" else "b"] == ["block"], plan.modes


@pytest.mark.parametrize("algo", ["gemm", "mm"])
@pytest.mark.parametrize("kind", ["identity", "concat_aligned", "concat_unaligned"])
def test_conv_k_loop_through_pieces_is_not_pipelined(kind, algo, monkeypatch):
    """A K loop reading x through a piecewise map runs with num_stages=1 (pipelined, Triton 3.6 on the
    H200 got ~0.1% of YOLO11s C3k2 outputs wrong); dense operands keep their pipelined configurations.
    The same for a 1x1 conv lowered as a plain GEMM."""
    conv_mod, gemm_mod = (sys.modules[f"vtcsearch.codegen.kernels.{m}"] for m in ("conv", "gemm"))
    monkeypatch.setattr(conv_mod, "_gemm_configs", lambda *a: [
        {"BM": 64, "BN": 16, "BK": 16, "GROUP_M": 8, "ORDER": 0, "num_warps": 4, "num_stages": 3}])
    monkeypatch.setattr(gemm_mod, "_configs", lambda *a: [
        {"BM": 16, "BN": 16, "BK": 16, "GROUP_M": 8, "num_warps": 4, "num_stages": 3}])
    x, xr = read_x(kind, 1, 48, 4, 5)
    w = rnd(16, 48, 1, 1)
    want = conv_ref(xr, w)
    out = write_out("identity", *want.shape)
    plan = conv2d(x, Operand.dense(w, "w"), out, algo=algo)
    assert_written(out, want)
    piecewise = kind != "identity"
    assert plan.options["num_stages"] == (1 if piecewise else 3), (kind, plan.modes)
    assert plan.config["num_stages"] == plan.options["num_stages"]


@pytest.mark.parametrize("algo", ["gemm", "direct"])
@pytest.mark.parametrize("kind", WRITE_KINDS)
def test_conv_writes_out_through_map(kind, algo):
    C = 32
    groups = 1 if algo == "gemm" else C
    x, w = rnd(2, C if algo == "direct" else 8, 5, 6), rnd(C, 8 if algo == "gemm" else 1, 3, 3)
    sh = rnd(C)
    want = conv_ref(x, w, 2, 1, 1, groups, shift=sh, act="relu")
    out = write_out(kind, *want.shape)
    plan = conv2d(Operand.dense(x, "x"), Operand.dense(w, "w"), out, stride=2, padding=1, groups=groups,
                  epilogue=ConvEpilogue(shift=Operand.dense(sh, "sh"), activation="relu"))
    assert plan.name == f"conv2d_{algo}"
    assert_written(out, want)
    if kind == "split_aligned" and not GPU:
        assert plan.modes["out"] == ["block"], plan.modes
    if kind == "split_unaligned":
        assert plan.modes["out"] == ["element"], plan.modes


def test_conv_weight_through_map():
    """Weights stored [KH, KW, Cin, Cout] (a transposed layout) read through a permute."""
    x = rnd(1, 8, 5, 5)
    wt = rnd(3, 3, 8, 16)
    w = Operand.dense(wt, "w").permute([3, 2, 0, 1])
    want = conv_ref(x, wt.permute(3, 2, 0, 1), padding=1)
    out = write_out("identity", *want.shape)
    conv2d(Operand.dense(x, "x"), w, out, padding=1)
    assert_written(out, want)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("algo", ["gemm", "direct"])
def test_conv_half_precision(dtype, algo):
    groups = 1 if algo == "gemm" else 16
    x, w = rnd(1, 16, 6, 6, dtype=dtype), rnd(16, 16 // groups, 3, 3, dtype=dtype)
    sc, sh = rnd(16, dtype=dtype), rnd(16, dtype=dtype)
    want = conv_ref(x, w, 1, 1, 1, groups, scale=sc, shift=sh, act="silu")
    out = write_out("concat_slice", *want.shape, dtype=dtype)
    conv2d(Operand.dense(x, "x"), Operand.dense(w, "w"), out, padding=1, groups=groups,
           epilogue=ConvEpilogue(Operand.dense(sc, "sc"), Operand.dense(sh, "sh"), "silu"))
    tol = 1e-2 if dtype == torch.float16 else 3e-2
    assert_written(out, want, rtol=tol, atol=tol)


def test_conv_rejects_bad_shapes():
    x, w = Operand.dense(rnd(1, 8, 5, 5), "x"), Operand.dense(rnd(16, 8, 3, 3), "w")
    with pytest.raises(ValueError):
        conv2d(x, w, Operand.dense(poison(1, 16, 5, 5), "y"))          # needs padding=1 for 5x5
    with pytest.raises(ValueError):
        conv2d(x, w, Operand.dense(poison(1, 16, 3, 3), "y"), groups=3)
    with pytest.raises(ValueError):
        conv2d(x, w, Operand.dense(poison(1, 16, 3, 3), "y"), epilogue=ConvEpilogue(activation="swish2"))


# ---------------------------------------------------------------------------
# pooling and upsampling
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("k,s,p,d", [(3, 2, 1, 1), (2, 2, 0, 1), (5, 1, 2, 1), (3, 1, 1, 2),
                                     ((3, 2), (2, 1), (1, 0), 1)], ids=str)
def test_max_pool_bit_exact(k, s, p, d):
    x = rnd(2, 5, 9, 7)
    want = F.max_pool2d(x.cpu(), k, s, p, d)
    out = write_out("identity", *want.shape)
    max_pool2d(Operand.dense(x, "x"), out, k, s, p, d)
    assert_written(out, want, exact=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_max_pool_half_through_maps_bit_exact(dtype):
    x, xr = read_x("concat_unaligned", 1, 20, 6, 6, dtype=dtype)
    want = F.max_pool2d(xr.cpu().float(), 3, 2, 1).to(dtype)
    out = write_out("nhwc", *want.shape, dtype=dtype)
    max_pool2d(x, out, 3, 2, 1)
    assert_written(out, want, exact=True)


def test_sppf_three_chained_pools_in_one_concat_storage():
    """YOLO's SPPF: y1 = pool(x), y2 = pool(y1), y3 = pool(y2), all slabs of cat([x, y1, y2, y3])."""
    N, C, H, W = 1, 8, 7, 7
    cat = poison(N, 4 * C, H, W)
    x = rnd(N, C, H, W)
    cat[:, :C] = x                       # the producer (cv1) wrote x in place
    slab = lambda j: Operand.dense(cat, "cat").narrow(1, j * C, C)  # noqa: E731
    for j in range(3):
        max_pool2d(slab(j), slab(j + 1), 5, 1, 2)
    y1 = F.max_pool2d(x.cpu(), 5, 1, 2)
    y2 = F.max_pool2d(y1, 5, 1, 2)
    y3 = F.max_pool2d(y2, 5, 1, 2)
    assert torch.equal(cat.cpu(), torch.cat([x.cpu(), y1, y2, y3], 1))


@pytest.mark.parametrize("k,s,p,cip,div", [(3, 2, 1, True, None), (3, 2, 1, False, None), (2, 2, 0, True, None),
                                           (3, 1, 1, False, 4), ((3, 5), (1, 2), (1, 2), False, None)], ids=str)
def test_avg_pool(k, s, p, cip, div):
    x, xr = read_x("split", 2, 6, 8, 9)
    want = F.avg_pool2d(xr.cpu().double(), k, s, p, count_include_pad=cip, divisor_override=div)
    out = write_out("concat_slice", *want.shape)
    avg_pool2d(x, out, k, s, p, count_include_pad=cip, divisor_override=div)
    assert_written(out, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("flat", [False, True])
def test_global_avg_pool(flat):
    x, xr = read_x("concat_unaligned", 2, 20, 9, 11)
    want = xr.cpu().double().mean((2, 3), keepdim=not flat)
    if flat:
        out = Operand.dense(poison(2, 20), "y")
    else:
        out = write_out("concat_slice", 2, 20, 1, 1)
    global_avg_pool2d(x, out)
    assert_written(out, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("scale", [2, (1, 3)], ids=str)
def test_upsample_nearest_into_concat_slab(scale):
    """YOLO's neck: upsample x2 then Concat; the upsample writes its slab of the Concat directly."""
    x, xr = read_x("nhwc", 1, 6, 4, 5)
    want = F.interpolate(xr.cpu(), scale_factor=scale, mode="nearest")
    out = write_out("concat_slice", *want.shape)
    upsample_nearest2d(x, out, scale)
    assert_written(out, want, exact=True)


# ---------------------------------------------------------------------------
# GPU: YOLO11n and ShuffleNetV2 shapes in fp16 at batch 1
# ---------------------------------------------------------------------------

def rel_err(got, want):
    got, want = got.double().cpu(), want.double().cpu()
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-6))


@gpu
def test_gpu_yolo11n_downsample_conv_and_sppf():
    h, dev = torch.float16, "cuda"
    # backbone Conv(64, 128, 3, 2) + BN + SiLU at 80x80 (640 input)
    x = rnd(1, 64, 80, 80, dtype=h, device=dev)
    w = rnd(128, 64, 3, 3, dtype=h, device=dev) / 24
    sc, sh = rnd(128, dtype=h, device=dev).abs() + 0.5, rnd(128, dtype=h, device=dev)
    y = torch.empty(1, 128, 40, 40, dtype=h, device=dev)
    conv2d(Operand.dense(x, "x"), Operand.dense(w, "w"), Operand.dense(y, "y"), stride=2, padding=1,
           epilogue=ConvEpilogue(Operand.dense(sc, "sc"), Operand.dense(sh, "sh"), "silu"))
    assert rel_err(y, conv_ref(x, w, 2, 1, scale=sc, shift=sh, act="silu")) < 1e-2
    # SPPF(256, 256, k=5) at 20x20: cv1 writes slab 0 of the Concat, three pools fill the others, cv2 reads it all
    x = rnd(1, 256, 20, 20, dtype=h, device=dev)
    w1, w2 = rnd(128, 256, 1, 1, dtype=h, device=dev) / 16, rnd(256, 512, 1, 1, dtype=h, device=dev) / 22
    cat = torch.empty(1, 512, 20, 20, dtype=h, device=dev)
    out = torch.empty(1, 256, 20, 20, dtype=h, device=dev)
    slab = lambda j: Operand.dense(cat, "cat").narrow(1, 128 * j, 128)  # noqa: E731
    conv2d(Operand.dense(x, "x"), Operand.dense(w1, "w1"), slab(0), epilogue=ConvEpilogue(activation="silu"))
    for j in range(3):
        max_pool2d(slab(j), slab(j + 1), 5, 1, 2)
    conv2d(Operand.dense(cat, "cat"), Operand.dense(w2, "w2"), Operand.dense(out, "out"),
           epilogue=ConvEpilogue(activation="silu"))
    torch.cuda.synchronize()
    c0 = conv_ref(x, w1, act="silu")
    p1 = F.max_pool2d(c0, 5, 1, 2)
    p2 = F.max_pool2d(p1, 5, 1, 2)
    p3 = F.max_pool2d(p2, 5, 1, 2)
    assert rel_err(cat, torch.cat([c0, p1, p2, p3], 1)) < 1e-2
    assert rel_err(out, conv_ref(cat, w2, act="silu")) < 1e-2


@gpu
def test_gpu_shufflenet_v2_unit_through_shuffle_and_concat():
    """A stride-1 ShuffleNetV2 unit (116 channels, 28x28): the input is shuffle(cat(x1, branch)) of the
    previous unit, read as a view; branch2 = 1x1 conv-BN-ReLU, depthwise 3x3-BN, 1x1 conv-BN-ReLU, the
    last writing its half of the next Concat in place."""
    h, dev = torch.float16, "cuda"
    C, S = 116, 28
    a, b = rnd(1, C // 2, S, S, dtype=h, device=dev), rnd(1, C // 2, S, S, dtype=h, device=dev)
    cat = Operand.cat([Operand.dense(a, "a"), Operand.dense(b, "b")], 1)
    x = cat.reshape((1, 2, C // 2, S, S)).permute([0, 2, 1, 3, 4]).reshape((1, C, S, S))
    xr = torch.cat([a, b], 1).view(1, 2, C // 2, S, S).transpose(1, 2).reshape(1, C, S, S)
    x2, x2r = x.narrow(1, C // 2, C // 2), xr[:, C // 2:]
    w1 = rnd(58, 58, 1, 1, dtype=h, device=dev) / 8
    wd = rnd(58, 1, 3, 3, dtype=h, device=dev) / 3
    w3 = rnd(58, 58, 1, 1, dtype=h, device=dev) / 8
    bn = [(rnd(58, dtype=h, device=dev).abs() + 0.5, rnd(58, dtype=h, device=dev)) for _ in range(3)]
    t1 = torch.empty(1, 58, S, S, dtype=h, device=dev)
    t2 = torch.empty_like(t1)
    nxt = torch.empty(1, C, S, S, dtype=h, device=dev)
    ep = lambda k, act: ConvEpilogue(Operand.dense(bn[k][0], "s"), Operand.dense(bn[k][1], "t"), act)  # noqa: E731
    conv2d(x2, Operand.dense(w1, "w1"), Operand.dense(t1, "t1"), epilogue=ep(0, "relu"))
    plan = conv2d(Operand.dense(t1, "t1"), Operand.dense(wd, "wd"), Operand.dense(t2, "t2"), padding=1, groups=58,
                  epilogue=ep(1, None))
    assert plan.name == "conv2d_direct"
    conv2d(Operand.dense(t2, "t2"), Operand.dense(w3, "w3"), Operand.dense(nxt, "n").narrow(1, C // 2, C // 2),
           epilogue=ep(2, "relu"))
    torch.cuda.synchronize()
    r1 = conv_ref(x2r, w1, scale=bn[0][0], shift=bn[0][1], act="relu")
    r2 = conv_ref(r1, wd, padding=1, groups=58, scale=bn[1][0], shift=bn[1][1])
    r3 = conv_ref(r2, w3, scale=bn[2][0], shift=bn[2][1], act="relu")
    assert rel_err(t1, r1) < 1e-2
    assert rel_err(t2, r2) < 1e-2
    assert rel_err(nxt[:, C // 2:], r3) < 1e-2

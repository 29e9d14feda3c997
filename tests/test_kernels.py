"""Kernel templates with virtual-tensor I/O, against eager torch.

Every template is run with its operands under each kind of map (identity, transpose,
slice, split piece, concat piece block-aligned and not, expand, KV-cache scatter at a
runtime position, reshape with div/mod, indirect gather/scatter).  Outputs are
written into NaN-poisoned storages and compared, storage by storage, with the
reference scatter (``IndexMap.scatter``) of the eager result: unwritten elements and
stray writes both fail.  On the CPU the kernels run in Triton's interpreter (small
shapes); with a GPU the same tests run compiled, and the ``gpu`` tests check Llama 3 8B
decode sizes in bf16.
"""
from __future__ import annotations

import gc
import math

import pytest
import torch

from vtcsearch.core.expr import lookup, sym
from vtcsearch.core.mapping import IndexMap, Piece, index_vars

triton = pytest.importorskip("triton")
# the interpreter evaluates sigmoid/exp in NumPy, which warns on overflow to inf (the right answer)
# (and 0/0 in masked-off padding lanes)
pytestmark = [pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]

from vtcsearch.codegen.kernels import (Epilogue, Operand, Rope, attention, copy, copy_pieces, gemm,  # noqa: E402
                               kv_group, layernorm, pointwise, rmsnorm, softmax)
from vtcsearch.codegen.kernels.emit import IO  # noqa: E402

from conftest import DEVICE as DEV, GPU  # noqa: E402
gpu = pytest.mark.gpu
NAN = float("nan")

_gen = torch.Generator().manual_seed(1234)


def rnd(*shape, dtype=torch.float32, device=None):
    return torch.randn(shape, generator=_gen).to(device or DEV, dtype)


def poison(*shape, dtype=torch.float32, device=None):
    if dtype.is_floating_point:
        return torch.full(shape, NAN, dtype=dtype, device=device or DEV)
    return torch.full(shape, torch.iinfo(dtype).min, dtype=dtype, device=device or DEV)


def perm(n, k):
    return torch.randperm(n, generator=_gen)[:k].to(DEV)


# ---------------------------------------------------------------------------
# operands under each map kind
# ---------------------------------------------------------------------------

READ_KINDS = ["identity", "transpose", "slice", "split", "concat_aligned", "concat_unaligned", "expand",
              "reshape_divmod", "gather"]
WRITE_KINDS = ["identity", "transpose", "slice", "split_aligned", "split_unaligned", "kv_scatter",
               "kv_scatter_device_pos", "reshape_divmod", "scatter_rows"]


def read_op(kind: str, shape, align: int, name: str = "x", dtype=torch.float32):
    """(operand over ``shape`` under map ``kind``, the same values as a plain tensor).

    ``align``: where a dim-0 concatenation is cut (a multiple of the template's block
    along dim 0 makes it block-aligned).  The other concatenation is cut at 3 along
    the last dim.
    """
    shape = tuple(shape)
    R, C = shape[0], shape[-1]
    v = index_vars(len(shape))
    r = lambda *s: rnd(*s, dtype=dtype)  # noqa: E731
    if kind == "identity":
        t = r(*shape)
        op, ref = Operand.dense(t, name), t
    elif kind == "transpose":
        p = r(*shape[:-2], shape[-1], shape[-2])
        op, ref = Operand.dense(p, name).transpose(-1, -2), p.transpose(-1, -2)
    elif kind == "slice":
        p = r(*[s + 3 for s in shape])
        win = [(2, 2 + s) if k % 2 == 0 else (1, 1 + s) for k, s in enumerate(shape)]
        op, ref = Operand.dense(p, name).sub(win), p[tuple(slice(a, b) for a, b in win)]
    elif kind == "split":
        p = r(*shape[:-1], 3 * C)
        op, ref = Operand.dense(p, name).narrow(-1, C, C), p[..., C:2 * C]
    elif kind == "concat_aligned":
        a, b = r(align, *shape[1:]), r(R - align, *shape[1:])
        op, ref = Operand.cat([Operand.dense(a, name + "a"), Operand.dense(b, name + "b")], 0), torch.cat([a, b])
    elif kind == "concat_unaligned":
        a, b = r(*shape[:-1], 3), r(*shape[:-1], C - 3)
        op, ref = Operand.cat([Operand.dense(a, name + "a"), Operand.dense(b, name + "b")], -1), torch.cat([a, b], -1)
    elif kind == "expand":
        p = r(1, *shape[1:])
        op, ref = Operand.dense(p, name).broadcast_to(shape), p.expand(shape)
    elif kind == "reshape_divmod":
        L = math.prod(shape[:-1])
        p = r(C // 4, L, 4)
        op, ref = Operand.dense(p, name).permute([1, 0, 2]).reshape(shape), p.permute(1, 0, 2).reshape(shape)
    elif kind == "gather":
        tab = r(R + 7, *shape[1:])
        ids = perm(R + 7, R)
        op = Operand.dense(tab, name).view(shape, [lookup(name + "_ids", [v[0]], 0, R + 6)] + v[1:],
                                           tables={name + "_ids": ids})
        ref = tab[ids]
    else:
        raise KeyError(kind)
    assert torch.equal(op.gather().cpu(), ref.cpu()), f"map of kind {kind} builds the wrong tensor"
    return op, ref


def write_op(kind: str, shape, align: int, name: str = "y", dtype=torch.float32):
    """An operand over ``shape`` under map ``kind`` whose storages are all poisoned."""
    shape = tuple(shape)
    R, C = shape[0], shape[-1]
    v = index_vars(len(shape))
    pz = lambda *s: poison(*s, dtype=dtype)  # noqa: E731
    if kind == "identity":
        return Operand.dense(pz(*shape), name)
    if kind == "transpose":
        return Operand.dense(pz(*shape[:-2], shape[-1], shape[-2]), name).transpose(-1, -2)
    if kind == "slice":
        return Operand.dense(pz(*[s + 3 for s in shape]), name).sub([(1, 1 + s) for s in shape])
    if kind == "split_aligned":
        return Operand.cat([Operand.dense(pz(align, *shape[1:]), name + "a"),
                            Operand.dense(pz(R - align, *shape[1:]), name + "b")], 0)
    if kind == "split_unaligned":
        return Operand.cat([Operand.dense(pz(*shape[:-1], 3), name + "a"),
                            Operand.dense(pz(*shape[:-1], C - 3), name + "b")], -1)
    if kind in ("kv_scatter", "kv_scatter_device_pos"):
        S, pos = 6, 4
        cache = pz(R, S, *shape[1:-1], 2, C // 2)
        P = sym("pos", 0, S - 1)
        val = torch.tensor([pos], device=DEV) if kind == "kv_scatter_device_pos" else pos
        return Operand.dense(cache, name).view(shape, [v[0], P] + v[1:-1] + [v[-1] // (C // 2), v[-1] % (C // 2)],
                                               syms={"pos": val})
    if kind == "reshape_divmod":
        L = math.prod(shape[:-1])
        return Operand.dense(pz(C // 4, L, 4), name).permute([1, 0, 2]).reshape(shape)
    if kind == "scatter_rows":
        ids = perm(R + 5, R)
        return Operand.dense(pz(R + 5, *shape[1:]), name).view(
            shape, [lookup(name + "_ids", [v[0]], 0, R + 4)] + v[1:], tables={name + "_ids": ids})
    raise KeyError(kind)


def expected_storages(op: Operand, value: torch.Tensor) -> dict[str, torch.Tensor]:
    """Poisoned storages with ``value`` written through ``op``'s map (reference semantics)."""
    exp = {}
    for k, t in op.tensors.items():
        exp[k] = poison(*t.shape, dtype=t.dtype) if t.dtype.is_floating_point else \
            torch.full_like(t, torch.iinfo(t.dtype).min)
        if t.stride() != exp[k].stride():  # keep the layout the map was built on
            exp[k] = exp[k].as_strided(t.shape, t.stride()) if t.is_contiguous() else t.clone().fill_(NAN)
    Operand(op.map, exp, op.syms, op.tables).scatter(value)
    return exp


def assert_written(op: Operand, value: torch.Tensor, exact: bool = False, rtol=1e-4, atol=1e-4):
    exp = expected_storages(op, value)
    for k, t in op.tensors.items():
        got, want = t.cpu(), exp[k].cpu()
        if exact:
            same = (got == want) | (got.isnan() & want.isnan()) if got.is_floating_point() else got == want
            assert bool(same.all()), f"storage {k}: {int((~same).sum())} elements differ"
        else:
            torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=atol, equal_nan=True,
                                       msg=lambda m: f"storage {k}: {m}")


def expect_mode(plan, prefix: str, kind: str, aligned: bool = True):
    """Block-aligned concat maps pick the piece per block; unaligned ones per element.

    ``aligned``: whether the cut is a multiple of the block the chosen config uses
    (the interpreter's configs are fixed; a GPU's are tuned)."""
    if kind in ("concat_aligned", "split_aligned"):
        assert ("block" if aligned else "element") in plan.modes[prefix], plan.modes
    if kind in ("concat_unaligned", "split_unaligned"):
        assert "element" in plan.modes[prefix], plan.modes


# ---------------------------------------------------------------------------
# the I/O layer itself
# ---------------------------------------------------------------------------

def test_io_block_branch_is_scalar_and_lookups_stay_in_bounds():
    a, b = torch.zeros(16, 8), torch.zeros(16, 8)
    cat = Operand.cat([Operand.dense(a, "a"), Operand.dense(b, "b")], 0)
    io = IO(cat, "x")
    lines = io.load("t", ["rr[:, None]", "rc[None, :]"], shape="(16, 8)", block=[("pid_r * 16", 16), ("0", 8)])
    assert io.modes == ["block"] and lines[0].startswith("if (pid_r * 16 < 16)") and lines[2] == "else:"
    # an indirect piece next to a direct one: lanes of the other piece read a clamped, valid table entry
    tab, ids = torch.zeros(10, 8), torch.arange(5)
    v = index_vars(2)
    g = Operand.dense(tab, "t").view([5, 8], [lookup("ids", [v[0]], 0, 9), v[1]], tables={"ids": ids})
    mixed = Operand.cat([Operand.dense(torch.zeros(3, 8), "a"), g], 0)
    io = IO(mixed, "x")
    code = "\n".join(io.load("t", ["rr[:, None]", "rc[None, :]"], shape="(8, 8)", mask="m"))
    assert "tl.load(x_t0 + (tl.minimum(tl.maximum(((rr[:, None]) + (-3)), 0), 4) * 1)).to(tl.int64)" in code


def test_io_wide_offsets_use_int64():
    big = torch.empty(2 ** 31 + 8, device="meta")
    io = IO(Operand.dense(big, "big"), "x")
    assert io.wide
    code = "\n".join(io.load("t", ["rc"], shape="(16,)"))
    assert "tl.int64" in code
    assert not IO(Operand.dense(torch.empty(64, device="meta"), "s"), "x").wide


def test_io_special_fills_are_valid_source():
    x = torch.zeros(4, 4)
    v = index_vars(2)
    pad = IndexMap((4, 6), [Piece("x", ((0, 4), (1, 5)), (v[0], v[1] - 1)),
                            Piece(None, ((0, 4), (0, 1)), (), fill=float("-inf")),
                            Piece(None, ((0, 4), (5, 6)), (), fill=float("nan"))], {"x": (4, 4)})
    code = "\n".join(IO(Operand(pad, {"x": x}), "p").load("t", ["rr[:, None]", "rc[None, :]"], shape="(4, 8)"))
    assert '-float("inf")' in code and 'float("nan")' in code
    compile(code, "<io>", "exec")


# ---------------------------------------------------------------------------
# residual copy
# ---------------------------------------------------------------------------

SHAPE3 = (4, 6, 24)  # outer dim 0 is a per-program scalar: a cut at 2 is block-aligned


@pytest.mark.parametrize("kind", READ_KINDS)
def test_copy_reads_through_every_map_kind(kind):
    src, ref = read_op(kind, SHAPE3, align=2)
    dst = write_op("identity", SHAPE3, 2)
    plan = copy(dst, src)
    assert_written(dst, ref, exact=True)
    expect_mode(plan, "src", kind)


@pytest.mark.parametrize("kind", WRITE_KINDS)
def test_copy_writes_through_every_map_kind(kind):
    src, ref = read_op("identity", SHAPE3, 2)
    dst = write_op(kind, SHAPE3, 2)
    plan = copy(dst, src)
    assert_written(dst, ref, exact=True)
    expect_mode(plan, "dst", kind)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", ["transpose", "concat_unaligned", "gather"])
def test_copy_is_bit_exact_in_any_dtype(dtype, kind):
    src, ref = read_op(kind, SHAPE3, 2, dtype=torch.float32)
    if dtype == torch.int64:
        src = Operand(src.map, {k: (t * 1e6).to(torch.int64) * 4099 for k, t in src.tensors.items()},
                      src.syms, src.tables)
        ref = src.gather()
    else:
        src = Operand(src.map, {k: t.to(dtype) for k, t in src.tensors.items()}, src.syms, src.tables)
        ref = ref.to(dtype)
    dst = write_op("split_unaligned", SHAPE3, 2, dtype=dtype)
    copy(dst, src)
    assert_written(dst, ref, exact=True)


def test_copy_constant_fill_and_pad_map():
    dst = write_op("slice", SHAPE3, 2)
    copy(dst, -2.5)
    assert_written(dst, torch.full(SHAPE3, -2.5), exact=True)
    # a Pad: interior from x, border constant
    x = rnd(5, 7)
    v = index_vars(2)
    pieces = [Piece("x", ((1, 6), (2, 9)), (v[0] - 1, v[1] - 2))]
    pieces += [Piece(None, ((0, 1), (0, 10)), (), fill=0.25), Piece(None, ((6, 7), (0, 10)), (), fill=0.25),
               Piece(None, ((1, 6), (0, 2)), (), fill=0.25), Piece(None, ((1, 6), (9, 10)), (), fill=0.25)]
    src = Operand(IndexMap((7, 10), pieces, {"x": (5, 7)}), {"x": x})
    out = write_op("identity", (7, 10), 1)
    copy(out, src)
    assert_written(out, torch.nn.functional.pad(x, (2, 1, 1, 1), value=0.25), exact=True)


def test_copy_through_pieces_chosen_by_the_outer_index():
    """A channel shuffle's cat: each piece's predicate reads only the outer (program) indices, a scalar per
    tile, which the interpreter must broadcast over the tile (it raised 'mask has unsupported dtype')."""
    a, b = rnd(1, 4, 2, 8, 8), rnd(1, 4, 2, 8, 8)
    v = index_vars(5)
    c = v[1] + v[2] * 4     # the channel of the concatenation, 0..7
    pieces = [Piece("a", ((0, 1), (0, 4), (0, 2), (0, 8), (0, 8)), (v[0], v[1], v[2], v[3], v[4]), ((c, 0, 4),)),
              Piece("b", ((0, 1), (0, 4), (0, 2), (0, 8), (0, 8)), (v[0], v[1], v[2], v[3], v[4]), ((c, 4, 8),))]
    src = Operand(IndexMap((1, 4, 2, 8, 8), pieces, {"a": a.shape, "b": b.shape}), {"a": a, "b": b})
    out = write_op("identity", (1, 4, 2, 8, 8), 1)
    copy(out, src)
    mask = (torch.arange(4)[:, None] + 4 * torch.arange(2)[None, :]) < 4
    assert_written(out, torch.where(mask[None, :, :, None, None], a, b), exact=True)


def test_copy_pieces_runs_only_the_residual_pairs():
    # a Concat with its first input already in place: only the second input is copied
    out = poison(8, 6)
    b = rnd(5, 6)
    v = index_vars(2)
    dst_piece = Piece("out", ((3, 8), (0, 6)), (v[0], v[1]))
    src_piece = Piece("b", ((3, 8), (0, 6)), (v[0] - 3, v[1]))
    copy_pieces((8, 6), [(dst_piece, src_piece)], {"out": out, "b": b})
    assert out[:3].isnan().all() and torch.equal(out[3:], b)


# ---------------------------------------------------------------------------
# fused pointwise
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("kind", READ_KINDS)
def test_pointwise_inputs_through_every_map_kind(kind):
    x, xr = read_op(kind, SHAPE3, 2)
    bias = rnd(24)
    out = write_op("identity", SHAPE3, 2)
    plan = pointwise("x0 * vtc_sigmoid(x1) + 0.5 * x0 - x2", [x, Operand.dense(bias, "bias"), 1.5], out)
    assert_written(out, xr * torch.sigmoid(bias) + 0.5 * xr - 1.5)
    expect_mode(plan, "x0", kind)


@pytest.mark.parametrize("kind", WRITE_KINDS)
def test_pointwise_outputs_through_every_map_kind(kind):
    a, ar = read_op("transpose", SHAPE3, 2)
    b, br = read_op("identity", SHAPE3, 2)
    out = write_op(kind, SHAPE3, 2)
    out2 = write_op("identity", SHAPE3, 2, name="z")
    plan = pointwise(["vtc_silu(x0) * x1", "x0 + x1"], [a, b], [out, out2])
    assert_written(out, torch.nn.functional.silu(ar) * br)
    assert_written(out2, ar + br)
    expect_mode(plan, "y0", kind)


def test_pointwise_activations():
    x, xr = read_op("identity", (5, 33), 1)
    fns = {"vtc_gelu(x0)": torch.nn.functional.gelu(xr),
           "vtc_gelu_tanh(x0)": torch.nn.functional.gelu(xr, approximate="tanh"),
           "vtc_tanh(x0)": torch.tanh(xr), "vtc_relu(x0)": torch.relu(xr)}
    outs = [write_op("identity", (5, 33), 1, name=f"o{k}") for k in range(len(fns))]
    pointwise(list(fns), [x], outs)
    for o, ref in zip(outs, fns.values()):
        assert_written(o, ref, atol=2e-6)


# ---------------------------------------------------------------------------
# GEMM
# ---------------------------------------------------------------------------

M, K, N = 32, 40, 48   # interpreter tiles: BM 16, BN 32, BK 32 (K and N leave partial tiles)


def linear_weight(n, k, name="w"):
    w = rnd(n, k)
    return Operand.dense(w, name).transpose(0, 1), w.t()


@pytest.mark.parametrize("kind", READ_KINDS)
def test_gemm_a_through_every_map_kind(kind):
    a, ar = read_op(kind, (M, K), align=16)
    b, br = linear_weight(N, K)
    out = write_op("identity", (M, N), 16)
    plan = gemm(a, b, out)
    assert_written(out, ar @ br)
    expect_mode(plan, "a", kind, aligned=16 % plan.config["BM"] == 0)


@pytest.mark.parametrize("kind", ["identity", "slice", "concat_aligned", "concat_unaligned", "expand",
                                  "reshape_divmod", "gather"])
def test_gemm_b_through_map_kinds(kind):
    a, ar = read_op("identity", (M, K), 16)
    b, br = read_op(kind, (K, N), align=32, name="w")
    out = write_op("identity", (M, N), 16)
    plan = gemm(a, b, out)
    assert_written(out, ar @ br)
    expect_mode(plan, "b", kind, aligned=32 % plan.config["BK"] == 0)


@pytest.mark.parametrize("split", [2, 3])
@pytest.mark.parametrize("kind", ["identity", "split_unaligned", "reshape_divmod"])
def test_gemm_split_k_equals_the_tiled_kernel(split, kind):
    """Split-K (partials over disjoint K ranges, then reduce + epilogue): the same result through the maps,
    the last split ragged (K=40 in BK=32 steps; split 3 has an empty range)."""
    a, ar = read_op("concat_unaligned", (M, K), 16)
    b, br = linear_weight(N, K)
    bias, res = rnd(N), rnd(M, N)
    out = write_op(kind, (M, N), 16)
    ep = Epilogue(scale=0.5, bias=Operand.dense(bias, "bias"), activation="silu", residual=Operand.dense(res, "res"))
    plan = gemm(a, b, out, ep, split_k=split)
    assert plan.config["SPLIT"] == split and plan.kernels == 2
    assert_written(out, torch.nn.functional.silu((ar @ br) * 0.5 + bias) + res)
    # the fp32 partials live for one launch: a cached plan (every autotuned candidate is one) holds none, nor
    # do its parts (in their attributes or their last arguments)
    def held(obj) -> list:
        values = list(vars(obj).values())
        values += [x for v in values if isinstance(v, (list, tuple)) for x in v]
        return [v for v in values if isinstance(v, torch.Tensor) and v.numel() == split * M * N]
    assert plan.workspaces == (split * M * N,)
    assert not held(plan) and not any(held(p) for p in plan.parts)


@pytest.mark.parametrize("m", [1, 5, 16])
def test_gemm_decode_split_k_configs(m):
    """The decode (M <= 16) weight-streaming split-K configs: wide BN/BK tiles, enough splits for 2x the SMs
    where K allows (8 SMs here, tiny sizes for the interpreter); the chosen config runs and equals torch,
    epilogue included."""
    from vtcsearch.codegen.kernels.gemm import decode_split_configs, split_configs
    n, k = 256, 1024
    cfgs = decode_split_configs(m, n, k, sms=8)
    assert cfgs and all(c in split_configs(m, n, k, sms=8) for c in cfgs)
    assert all(c["BM"] == 16 and c["BN"] >= 32 and c["BK"] >= 128 for c in cfgs)
    assert all(-(-n // c["BN"]) * c["SPLIT"] >= 16 or k // (2 * c["SPLIT"]) < c["BK"] for c in cfgs)
    assert not decode_split_configs(32, n, k, sms=8) and not decode_split_configs(m, 4096, k, sms=8)
    cfg = cfgs[0]
    x, w, bias = rnd(m, k), linear_weight(n, k), rnd(n)
    o = torch.empty(m, n)
    plan = gemm(Operand.dense(x, "a"), w[0], Operand.dense(o, "out"),
                Epilogue(bias=Operand.dense(bias, "bias"), activation="silu"), config=cfg)
    assert plan.config["SPLIT"] == cfg["SPLIT"] > 1 and plan.kernels == 2
    torch.testing.assert_close(o, torch.nn.functional.silu(x @ w[1] + bias), rtol=1e-4, atol=1e-4)


def test_gemm_split_k_batched():
    x = rnd(3, M, K)
    y = rnd(3, K, N)
    o = torch.empty(3, M, N)
    gemm(Operand.dense(x, "a"), Operand.dense(y, "b"), Operand.dense(o, "out"), split_k=2)
    torch.testing.assert_close(o, x @ y, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", WRITE_KINDS)
def test_gemm_epilogue_writes_through_every_map_kind(kind):
    a, ar = read_op("identity", (M, K), 16)
    b, br = linear_weight(N, K)
    bias, res = rnd(N), rnd(M, N)
    out = write_op(kind, (M, N), 16)
    ep = Epilogue(scale=0.5, bias=Operand.dense(bias, "bias"), activation="gelu_tanh",
                  residual=Operand.dense(res, "res"))
    plan = gemm(a, b, out, ep)
    assert_written(out, torch.nn.functional.gelu((ar @ br) * 0.5 + bias, approximate="tanh") + res)
    expect_mode(plan, "out", kind, aligned=16 % plan.config["BM"] == 0)


def test_gemm_bf16_storages():
    a, ar = read_op("concat_unaligned", (16, 32), 16, dtype=torch.bfloat16)
    b, br = linear_weight(48, 32)
    b = Operand(b.map, {k: t.to(torch.bfloat16) for k, t in b.tensors.items()})
    out = write_op("split_unaligned", (16, 48), 16, dtype=torch.bfloat16)
    gemm(a, b, out, Epilogue(activation="silu"))
    assert_written(out, torch.nn.functional.silu(ar.float() @ br.to(torch.bfloat16).float()), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("act", ["relu", "silu", "sigmoid", "tanh", "gelu"])
def test_gemm_activations(act):
    a, ar = read_op("identity", (16, 32), 16)
    b, br = linear_weight(32, 32)
    out = write_op("identity", (16, 32), 16)
    gemm(a, b, out, Epilogue(activation=act))
    f = {"relu": torch.relu, "silu": torch.nn.functional.silu, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
         "gelu": torch.nn.functional.gelu}[act]
    assert_written(out, f(ar @ br), atol=2e-5)


def rope_ref(y, cos, sin):
    """Interleaved-pair rotation of the last dim (Meta Llama's complex form); cos/sin broadcast."""
    z = y.float().reshape(*y.shape[:-1], y.shape[-1] // 2, 2)
    zr, zi = z[..., 0], z[..., 1]
    return torch.stack([zr * cos - zi * sin, zr * sin + zi * cos], -1).flatten(-2)


def qkv_case(B, HQ, HKV, D, S, Kdim, pos, device_pos=False, dtype=torch.float32, device=None):
    """The merged QKV projection of one decode step: Q to a tensor, K/V rows into the caches at ``pos``."""
    dev = device or DEV
    N = (HQ + 2 * HKV) * D
    x = rnd(B, Kdim, dtype=dtype, device=dev)
    w = rnd(N, Kdim, dtype=dtype, device=dev) / math.sqrt(Kdim)
    q = poison(B, 1, HQ, D, dtype=dtype, device=dev)
    kc, vc = rnd(B, S, HKV, D, dtype=dtype, device=dev), rnd(B, S, HKV, D, dtype=dtype, device=dev)
    cos_t, sin_t = rnd(S, D // 2, device=dev), rnd(S, D // 2, device=dev)
    v = index_vars(2)
    P = sym("pos", 0, S - 1)
    pv = torch.tensor([pos], device=dev) if device_pos else pos
    qop = Operand.dense(q, "q").view([B, HQ * D], [v[0], 0, v[1] // D, v[1] % D])
    kop = Operand.dense(kc, "kc").view([B, HKV * D], [v[0], P, v[1] // D, v[1] % D], syms={"pos": pv})
    vop = Operand.dense(vc, "vc").view([B, HKV * D], [v[0], P, v[1] // D, v[1] % D], syms={"pos": pv})
    out = Operand.cat([qop, kop, vop], 1)
    cos = Operand.dense(cos_t, "cos").view([B, D // 2], [P, v[1]], syms={"pos": pv})
    sin = Operand.dense(sin_t, "sin").view([B, D // 2], [P, v[1]], syms={"pos": pv})
    ep = Epilogue(rope=Rope(cos, sin, D, (0, (HQ + HKV) * D)))
    y = x.float() @ w.float().t()
    qr = rope_ref(y[:, :HQ * D].reshape(B, HQ, D), cos_t[pos], sin_t[pos])
    kr = rope_ref(y[:, HQ * D:(HQ + HKV) * D].reshape(B, HKV, D), cos_t[pos], sin_t[pos])
    vr = y[:, (HQ + HKV) * D:].reshape(B, HKV, D)
    kexp, vexp = kc.clone().float(), vc.clone().float()
    kexp[:, pos], vexp[:, pos] = kr, vr
    a = Operand.dense(x, "x")
    b = Operand.dense(w, "w").transpose(0, 1)
    return a, b, out, ep, (q, kc, vc), (qr[:, None], kexp, vexp)


@pytest.mark.parametrize("D,device_pos", [(16, False), (16, True), (8, False)])
def test_gemm_qkv_rope_writes_kv_cache_at_runtime_position(D, device_pos):
    # D=16: Q|K|V boundaries (64, 96) are multiples of BN=32 -> one branch per block; D=8: per element
    a, b, out, ep, got, want = qkv_case(B=3, HQ=4, HKV=2, D=D, S=10, Kdim=32, pos=6, device_pos=device_pos)
    plan = gemm(a, b, out, ep)
    aligned = all(c % plan.config["BN"] == 0 for c in (4 * D, 6 * D))
    assert plan.modes["out"] == (["block"] if aligned else ["element"])
    if not GPU:  # BN = 32 in the interpreter
        assert aligned == (D == 16)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.float(), w, rtol=1e-4, atol=1e-4)


def test_gemm_prefill_rope_positions_from_the_map():
    # rows are (batch, token); the cos/sin map picks position start + token
    Bb, S, D, H, start = 2, 8, 16, 2, 3
    x, xr = read_op("identity", (Bb * S, 32), 16)
    b, br = linear_weight(H * D, 32)
    cos_t, sin_t = rnd(S + start, D // 2), rnd(S + start, D // 2)
    v = index_vars(2)
    cos = Operand.dense(cos_t, "cos").view([Bb * S, D // 2], [v[0] % S + start, v[1]])
    sin = Operand.dense(sin_t, "sin").view([Bb * S, D // 2], [v[0] % S + start, v[1]])
    out = write_op("transpose", (Bb * S, H * D), 16)
    gemm(x, b, out, Epilogue(rope=Rope(cos, sin, D)))
    y = (xr @ br).reshape(Bb, S, H, D)
    ref = rope_ref(y, cos_t[start:start + S][None, :, None], sin_t[start:start + S][None, :, None])
    assert_written(out, ref.reshape(Bb * S, H * D))


@pytest.mark.parametrize("kind", ["transpose", "concat_aligned"])
def test_bmm_with_broadcast_weight_and_batched_output(kind):
    Bb = 3
    a, ar = read_op(kind, (Bb, 16, 24), align=1)
    w, wr = read_op("identity", (24, 32), 16, name="w")
    out = write_op("transpose", (Bb, 16, 32), 1)
    plan = gemm(a, w, out)
    assert_written(out, ar @ wr)
    expect_mode(plan, "a", kind)
    b3, b3r = read_op("transpose", (Bb, 24, 32), 1, name="b")
    bias = rnd(32)
    out3 = write_op("identity", (Bb, 16, 32), 1)
    gemm(a, b3, out3, Epilogue(bias=Operand.dense(bias, "bias")))
    assert_written(out3, ar @ b3r + bias)


# ---------------------------------------------------------------------------
# attention
# ---------------------------------------------------------------------------

def attn_ref(q, k, v, scale, causal=False, window=None, softcap=None, kv_len=None):
    """Eager attention in float64; q [B, H, Sq, D], k/v [B, H, S, D]; kv_len per batch."""
    B, H, SQ, D = q.shape
    outs = []
    for bi in range(B):
        L = k.shape[2] if kv_len is None else int(kv_len[bi])
        s = q[bi].double() @ k[bi, :, :L].double().transpose(-1, -2) * scale
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        qp = torch.arange(SQ, device=q.device)[:, None] + (L - SQ)
        kp = torch.arange(L, device=q.device)[None, :]
        ok = torch.ones(SQ, L, dtype=torch.bool, device=q.device)
        if causal:
            ok &= kp <= qp
        if window:
            ok &= (qp - kp) < window
        s = s.masked_fill(~ok, float("-inf"))
        outs.append(torch.softmax(s, -1) @ v[bi, :, :L].double())
    return torch.stack(outs).float()


KV_KINDS = ["kv_heads", "cache_expand", "concat_aligned", "concat_unaligned", "paged", "repeat_mod"]


def kv_ops(kind, B, HQ, HKV, S, D, dtype=torch.float32, device=None):
    """(k operand, v operand, k and v as [B, HQ, S, D] tensors, expected group)."""
    dev = device or DEV
    g = HQ // HKV
    v4 = index_vars(4)
    r = lambda *s: rnd(*s, dtype=dtype, device=dev)  # noqa: E731
    if kind == "kv_heads":  # physical KV heads, [B, HKV, S, D]
        kc, vc = r(B, HKV, S, D), r(B, HKV, S, D)
        return (Operand.dense(kc, "kc"), Operand.dense(vc, "vc"), kc.repeat_interleave(g, 1),
                vc.repeat_interleave(g, 1), g)
    if kind == "cache_expand":  # repeat_kv + transpose over a [B, S, HKV, D] cache: k[b, h, s, d] = kc[b, s, h // g, d]
        kc, vc = r(B, S, HKV, D), r(B, S, HKV, D)
        idx = [v4[0], v4[2], v4[1] // g, v4[3]]
        return (Operand.dense(kc, "kc").view([B, HQ, S, D], idx), Operand.dense(vc, "vc").view([B, HQ, S, D], idx),
                kc.repeat_interleave(g, 2).transpose(1, 2), vc.repeat_interleave(g, 2).transpose(1, 2), g)
    if kind in ("concat_aligned", "concat_unaligned"):  # past cache ++ new tokens along the sequence, expanded
        S0 = 32 if kind == "concat_aligned" else 29
        parts = []
        for nm in ("k", "v"):
            old, new = r(B, S0, HKV, D), r(B, S - S0, HKV, D)
            idx = [v4[0], v4[2], v4[1] // g, v4[3]]
            op = Operand.cat([Operand.dense(old, nm + "old").view([B, HQ, S0, D], idx),
                              Operand.dense(new, nm + "new").view([B, HQ, S - S0, D], idx)], 2)
            parts.append((op, torch.cat([old, new], 1).repeat_interleave(g, 2).transpose(1, 2)))
        return parts[0][0], parts[1][0], parts[0][1], parts[1][1], g
    if kind == "paged":  # pages [NP, P, HKV, D] and a block table [B, S // P]
        P = 8
        NP = B * S // P + 3
        table = perm(NP, B * S // P).reshape(B, S // P).to(torch.int32)
        outs = []
        for nm in ("k", "v"):
            pages = r(NP, P, HKV, D)
            op = Operand.dense(pages, nm + "pages").view(
                [B, HQ, S, D], [lookup("blocks", [v4[0], v4[2] // P], 0, NP - 1), v4[2] % P, v4[1] // g, v4[3]],
                tables={"blocks": table})
            dense = pages[table.long()].reshape(B, S, HKV, D)
            outs.append((op, dense.repeat_interleave(g, 2).transpose(1, 2)))
        return outs[0][0], outs[1][0], outs[0][1], outs[1][1], g
    if kind == "repeat_mod":  # heads tiled (h % HKV), not interleaved: no group shares a KV head
        kc, vc = r(B, S, HKV, D), r(B, S, HKV, D)
        idx = [v4[0], v4[2], v4[1] % HKV, v4[3]]
        return (Operand.dense(kc, "kc").view([B, HQ, S, D], idx), Operand.dense(vc, "vc").view([B, HQ, S, D], idx),
                kc.repeat(1, 1, g, 1).transpose(1, 2), vc.repeat(1, 1, g, 1).transpose(1, 2), 1)
    raise KeyError(kind)


def q_out_ops(B, HQ, SQ, D, dtype=torch.float32, device=None):
    """q read from a [B, Sq, HQ, D] tensor; out written as [B, Sq, HQ * D] (what the o-projection reads)."""
    dev = device or DEV
    q = rnd(B, SQ, HQ, D, dtype=dtype, device=dev)
    o = poison(B, SQ, HQ * D, dtype=dtype, device=dev)
    v4 = index_vars(4)
    oop = Operand.dense(o, "o").view([B, HQ, SQ, D], [v4[0], v4[2], v4[1] * D + v4[3]])
    return Operand.dense(q, "q").permute([0, 2, 1, 3]), q.transpose(1, 2), oop


@pytest.mark.parametrize("kind", KV_KINDS)
def test_decode_attention_reads_kv_once_per_group(kind):
    B, HQ, HKV, S, D = 2, 4, 2, 40, 16
    k, v, kr, vr, g = kv_ops(kind, B, HQ, HKV, S, D)
    q, qr, out = q_out_ops(B, HQ, 1, D)
    assert kv_group(q, k, v)[0] == g
    plan, = attention(q, k, v, out, num_splits=2)
    assert plan.kernels == 2  # split over the sequence, then the combine kernel
    ref = attn_ref(qr, kr, vr, 1 / math.sqrt(D))
    assert_written(out, ref)
    main = plan.parts[0]
    if kind == "concat_aligned":  # the past ends at 32: a multiple of BLOCK_N = 16 or 32, not 64
        assert main.modes["k"] == (["block"] if 32 % main.config["BLOCK_N"] == 0 else ["element"])
    if kind == "concat_unaligned":
        assert main.modes["k"] == ["element"]


@pytest.mark.parametrize("causal,window,softcap", [(True, None, None), (True, 7, None), (True, None, 5.0),
                                                   (False, None, 20.0), (False, 9, None)])
def test_prefill_attention_masks_and_softcap(causal, window, softcap):
    B, HQ, HKV, S, D = 1, 4, 2, 40, 16
    SQ = 20  # the last 20 of 40 positions: a chunked prefill against a cache
    k, v, kr, vr, _ = kv_ops("cache_expand", B, HQ, HKV, S, D)
    q, qr, out = q_out_ops(B, HQ, SQ, D)
    attention(q, k, v, out, causal=causal, window=window, softcap=softcap, scale=0.3)
    assert_written(out, attn_ref(qr, kr, vr, 0.3, causal, window, softcap))


@pytest.mark.parametrize("as_tensor", [False, True])
def test_attention_runtime_kv_len(as_tensor):
    B, HQ, HKV, S, D = 2, 4, 1, 48, 16
    k, v, kr, vr, _ = kv_ops("cache_expand", B, HQ, HKV, S, D)
    q, qr, out = q_out_ops(B, HQ, 1, D)
    lens = [37, 20] if as_tensor else [37, 37]
    kv_len = torch.tensor(lens, device=DEV, dtype=torch.int32) if as_tensor else 37
    attention(q, k, v, out, kv_len=kv_len, num_splits=3, causal=True)
    assert_written(out, attn_ref(qr, kr, vr, 1 / math.sqrt(D), causal=True, kv_len=lens))


def test_attention_plain_layouts_no_split():
    B, H, SQ, S, D = 2, 2, 3, 24, 16
    q, qr = read_op("identity", (B, H, SQ, D), 1, name="q")
    k, kr = read_op("identity", (B, H, S, D), 1, name="k")
    v, vr = read_op("identity", (B, H, S, D), 1, name="v")
    out = write_op("identity", (B, H, SQ, D), 1)
    plans = attention(q, k, v, out, num_splits=1)
    assert len(plans) == 1 and plans[0].kernels == 1
    assert_written(out, attn_ref(qr, kr, vr, 1 / math.sqrt(D)))


@pytest.mark.parametrize("config", [{"BLOCK_N": 16, "num_warps": 4, "num_stages": 1, "splits": 3},
                                    {"BLOCK_N": 32, "num_warps": 4, "num_stages": 1, "splits": 1},
                                    {"BLOCK_N": 16, "num_warps": 4, "num_stages": 1, "splits": 3, "fused": True}])
def test_attention_forced_config(config):
    """A forced configuration (what the bench's sweep times) is the one launched, and still right."""
    B, HQ, HKV, S, D = 1, 4, 2, 40, 16
    k, v, kr, vr, _ = kv_ops("cache_expand", B, HQ, HKV, S, D)
    q, qr, out = q_out_ops(B, HQ, 1, D)
    plan, = attention(q, k, v, out, config=config)
    assert plan.config == config
    assert plan.kernels == (2 if config["splits"] > 1 and not config.get("fused") else 1)
    assert_written(out, attn_ref(qr, kr, vr, 1 / math.sqrt(D)))
    with pytest.raises(ValueError, match="lacks"):
        attention(q, k, v, out, config={"BLOCK_N": 16})


@pytest.mark.parametrize("as_tensor", [False, True])
def test_fused_split_attention_merges_and_resets(as_tensor):
    """The fused split-KV kernel: the last program of each group merges (a masked-out split included), and puts
    its semaphore back to zero, so a second run (a CUDA-graph replay) merges again."""
    B, HQ, HKV, S, D = 2, 4, 2, 48, 16
    k, v, kr, vr, _ = kv_ops("cache_expand", B, HQ, HKV, S, D)
    q, qr, out = q_out_ops(B, HQ, 1, D)
    lens = [37, 5] if as_tensor else [37, 37]   # batch 1's length leaves its last splits empty
    kv_len = torch.tensor(lens, device=DEV, dtype=torch.int32) if as_tensor else 37
    cfg = {"BLOCK_N": 16, "num_warps": 4, "num_stages": 1, "splits": 3, "fused": True}
    plan, = attention(q, k, v, out, kv_len=kv_len, config=cfg)
    sems = plan.take_args()[-1]
    assert sems.dtype == torch.int32 and sems.numel() == B * HKV and not sems.any()
    ref = attn_ref(qr, kr, vr, 1 / math.sqrt(D), kv_len=lens)
    assert_written(out, ref)
    out.tensors["o"].fill_(float("nan"))
    plan.run([*q.kernel_args(), *k.kernel_args(), *v.kernel_args(), *out.kernel_args(),
              kv_len if as_tensor else 0, sems])
    assert_written(out, ref)


def test_attention_bf16():
    B, HQ, HKV, S, D = 1, 8, 2, 40, 16
    k, v, kr, vr, _ = kv_ops("cache_expand", B, HQ, HKV, S, D, dtype=torch.bfloat16)
    q, qr, out = q_out_ops(B, HQ, 1, D, dtype=torch.bfloat16)
    attention(q, k, v, out)
    ref = attn_ref(qr.float(), kr.float(), vr.float(), 1 / math.sqrt(D))
    assert_written(out, ref, rtol=2e-2, atol=2e-2)


# ---------------------------------------------------------------------------
# row reductions
# ---------------------------------------------------------------------------

RED_SHAPE = (6, 8, 40)


@pytest.mark.parametrize("kind", ["identity", "transpose", "concat_aligned", "concat_unaligned", "expand",
                                  "reshape_divmod", "gather"])
@pytest.mark.parametrize("block_c", [None, 16])
def test_rmsnorm_read_kinds_and_fused_residual(kind, block_c):
    x, xr = read_op(kind, RED_SHAPE, align=2)
    res, rr = read_op("identity", RED_SHAPE, 2, name="r")
    w = rnd(40)
    out = write_op("identity", RED_SHAPE, 2)
    ro = write_op("identity", RED_SHAPE, 2, name="ro")
    plan = rmsnorm(x, Operand.dense(w, "w"), out, 1e-5, residual=res, residual_out=ro, block_c=block_c)
    h = xr + rr
    assert_written(ro, h)
    assert_written(out, h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5) * w)
    expect_mode(plan, "x", kind)


@pytest.mark.parametrize("kind", ["transpose", "split_unaligned", "kv_scatter", "scatter_rows"])
def test_norms_write_kinds(kind):
    x, xr = read_op("identity", RED_SHAPE, 2)
    w, b = rnd(40), rnd(40)
    out = write_op(kind, RED_SHAPE, 2)
    rmsnorm(x, Operand.dense(w, "w"), out, 1e-6, weight_offset=1.0)
    assert_written(out, xr * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + 1e-6) * (w + 1))
    out = write_op(kind, RED_SHAPE, 2, name="ln")
    layernorm(x, Operand.dense(w, "w"), Operand.dense(b, "b"), out, 1e-5)
    assert_written(out, torch.nn.functional.layer_norm(xr, (40,), w, b, 1e-5))


@pytest.mark.parametrize("block_c", [None, 16])
@pytest.mark.parametrize("kind", ["concat_unaligned", "gather"])
def test_layernorm_and_softmax(kind, block_c):
    x, xr = read_op(kind, RED_SHAPE, 2)
    w, b = rnd(40), rnd(40)
    out = write_op("slice", RED_SHAPE, 2)
    layernorm(x, Operand.dense(w, "w"), None if block_c else Operand.dense(b, "b"), out, 1e-5, block_c=block_c)
    assert_written(out, torch.nn.functional.layer_norm(xr, (40,), w, None if block_c else b, 1e-5))
    out = write_op("transpose", RED_SHAPE, 2, name="sm")
    softmax(x, out, scale=0.7, block_c=block_c)
    assert_written(out, torch.softmax(xr * 0.7, -1))


def test_softmax_through_a_pad_map_with_minus_inf_border_and_1d():
    # scores padded with -inf (masked positions): the border is a constant piece of the map
    x = rnd(5, 13)
    v = index_vars(2)
    ninf = float("-inf")
    src = Operand(IndexMap((5, 16), [Piece("x", ((0, 5), (0, 13)), (v[0], v[1])),
                                     Piece(None, ((0, 5), (13, 16)), (), fill=ninf)], {"x": (5, 13)}), {"x": x})
    out = write_op("identity", (5, 16), 1)
    softmax(src, out)
    assert_written(out, torch.softmax(torch.nn.functional.pad(x, (0, 3), value=ninf), -1))
    y = rnd(37)
    out = write_op("identity", (37,), 1)
    softmax(Operand.dense(y, "y"), out)
    assert_written(out, torch.softmax(y, 0))


def test_plans_are_cached():
    """Identical kernels share one cached plan; a step's Launch takes the plan's arguments (the plan keeps no
    reference to them: it would keep an executable's storages alive) and launches on them again."""
    import weakref

    from vtcsearch.codegen.kernels import codecache
    from vtcsearch.codegen.lowering import Launch
    a, _ = read_op("identity", (16, 32), 16)
    b, _ = linear_weight(32, 32)
    p1 = gemm(a, b, write_op("identity", (16, 32), 16))
    p1.take_args()
    n = len(codecache._PLANS)
    a2, ar2 = read_op("identity", (16, 32), 16)  # new tensors, same signature
    out = write_op("identity", (16, 32), 16)
    p2 = gemm(a2, b, out)
    assert p2 is p1 and len(codecache._PLANS) == n
    assert_written(out, ar2 @ b.gather())
    step = Launch.of("mm", "gemm", p2)
    assert p2.last_args == [] and step.plans[0][1]
    # the launch again: the same tensors with new contents, no re-planning
    before = ar2 @ b.gather()
    next(iter(a2.tensors.values())).mul_(-2.0)  # (ar2 is that storage)
    step()
    assert_written(out, -2.0 * before)
    # nothing but the launch holds the output's storage
    ref = weakref.ref(next(iter(out.tensors.values())))
    del step, out
    gc.collect()
    assert ref() is None


# ---------------------------------------------------------------------------
# GPU: Llama 3 8B decode sizes in bf16 (hidden 4096, 32 q heads, 8 kv heads, head dim 128,
# KV cache of 4096 + 1 tokens, batch 1 and 16)
# ---------------------------------------------------------------------------

def rel_err(got, want):
    got, want = got.float(), want.float()
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-6))


@gpu
@pytest.mark.parametrize("batch", [1, 16])
def test_gpu_llama_qkv_projection_into_kv_cache(batch):
    S, pos = 4097, 4096
    a, b, out, ep, got, want = qkv_case(batch, 32, 8, 128, S, 4096, pos, device_pos=True, dtype=torch.bfloat16,
                                        device="cuda")
    kc0 = got[1].clone()
    plan = gemm(a, b, out, ep)
    torch.cuda.synchronize()
    assert plan.modes["out"] == ["block"]
    for g, w in zip(got, want):
        assert rel_err(g, w) < 1e-2
    assert torch.equal(got[1][:, :pos], kc0[:, :pos])  # the rest of the cache untouched, bit for bit


@gpu
@pytest.mark.parametrize("batch", [1, 16])
def test_gpu_llama_decode_attention_from_cache(batch):
    HQ, HKV, S, D = 32, 8, 4097, 128
    k, v, kr, vr, g = kv_ops("cache_expand", batch, HQ, HKV, S, D, dtype=torch.bfloat16, device="cuda")
    q, qr, out = q_out_ops(batch, HQ, 1, D, dtype=torch.bfloat16, device="cuda")
    assert kv_group(q, k, v) == (4, True)
    attention(q, k, v, out, kv_len=torch.tensor([S], device="cuda"))
    torch.cuda.synchronize()
    ref = attn_ref(qr.float(), kr.float(), vr.float(), 1 / math.sqrt(D))
    got = next(iter(out.tensors.values())).view(batch, 1, HQ, D).transpose(1, 2)
    assert rel_err(got, ref) < 1e-2


@gpu
@pytest.mark.parametrize("splits", [8, 33, 66])
def test_gpu_fused_split_attention_under_concurrency(splits):
    """The fused combine on the GPU, where a group's programs really race for its semaphore: each of several
    CUDA-graph replays (the semaphores must be back at zero after each) equals the separate combine kernel."""
    HQ, HKV, S, D = 32, 8, 4097, 128
    k, v, kr, vr, _ = kv_ops("cache_expand", 2, HQ, HKV, S, D, dtype=torch.bfloat16, device="cuda")
    q, qr, out = q_out_ops(2, HQ, 1, D, dtype=torch.bfloat16, device="cuda")
    kvl = torch.tensor([S - 5], device="cuda")
    cfg = {"BLOCK_N": 64, "num_warps": 4, "num_stages": 2, "splits": splits}
    o = next(iter(out.tensors.values()))
    attention(q, k, v, out, kv_len=kvl, config=cfg)
    want = o.clone()
    o.fill_(float("nan"))
    plan, = attention(q, k, v, out, kv_len=kvl, config=dict(cfg, fused=True))   # built and recorded outside
    args = plan.take_args()          # what an executable replays: its own semaphores, zeroed once, here
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.run(args)
    for _ in range(5):
        o.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(o, want, rtol=2e-2, atol=2e-2)


@gpu
def test_gpu_llama_prefill_attention_causal():
    B, HQ, HKV, S, D = 1, 32, 8, 512, 128
    k, v, kr, vr, _ = kv_ops("cache_expand", B, HQ, HKV, S, D, dtype=torch.bfloat16, device="cuda")
    q, qr, out = q_out_ops(B, HQ, S, D, dtype=torch.bfloat16, device="cuda")
    attention(q, k, v, out, causal=True)
    ref = attn_ref(qr.float(), kr.float(), vr.float(), 1 / math.sqrt(D), causal=True)
    got = next(iter(out.tensors.values())).view(B, S, HQ, D).transpose(1, 2)
    assert rel_err(got, ref) < 1e-2


@gpu
@pytest.mark.parametrize("batch", [1, 16])
def test_gpu_llama_o_projection_norm_ffn_and_copy(batch):
    bf = torch.bfloat16
    dev = "cuda"
    # o-projection with the residual add fused
    attn_o = rnd(batch, 4096, dtype=bf, device=dev)
    wo = rnd(4096, 4096, dtype=bf, device=dev) / 64
    h0 = rnd(batch, 4096, dtype=bf, device=dev)
    h = torch.empty(batch, 4096, dtype=bf, device=dev)
    gemm(Operand.dense(attn_o, "o"), Operand.dense(wo, "wo").transpose(0, 1), Operand.dense(h, "h"),
         Epilogue(residual=Operand.dense(h0, "h0")))
    assert rel_err(h, attn_o.float() @ wo.float().t() + h0.float()) < 1e-2
    # RMSNorm
    w = rnd(4096, dtype=bf, device=dev)
    n = torch.empty_like(h)
    rmsnorm(Operand.dense(h, "h"), Operand.dense(w, "w"), Operand.dense(n, "n"), 1e-5)
    hf = h.float()
    assert rel_err(n, hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-5) * w.float()) < 1e-2
    # SwiGLU gate: w1 | w3 merged, the pointwise reads both halves of one GEMM output
    g13 = rnd(batch, 2 * 14336, dtype=bf, device=dev)
    act = torch.empty(batch, 14336, dtype=bf, device=dev)
    gop = Operand.dense(g13, "g")
    pointwise("vtc_silu(x0) * x1", [gop.narrow(1, 0, 14336), gop.narrow(1, 14336, 14336)], Operand.dense(act, "a"))
    gf = g13.float()
    assert rel_err(act, torch.nn.functional.silu(gf[:, :14336]) * gf[:, 14336:]) < 1e-2
    # residual copy: a KV slab into a [b, kv_heads, seq, d] cache, bit-exact
    cache = rnd(batch, 8, 4097, 128, dtype=bf, device=dev)
    new = rnd(batch, 1, 8 * 128, dtype=bf, device=dev)
    v = index_vars(3)
    dst = Operand.dense(cache, "c").view([batch, 1, 1024], [v[0], v[2] // 128, sym("pos", 0, 4096) + v[1],
                                                             v[2] % 128], syms={"pos": 4096})
    before = cache.clone()
    copy(dst, Operand.dense(new, "n"))
    before[:, :, 4096] = new[:, 0].view(batch, 8, 128)
    assert torch.equal(cache, before)


# ---------------------------------------------------------------------------
# the side-by-side bench (issue 12 item 4): GPU only, refuses on the CPU
# ---------------------------------------------------------------------------

def test_bench_refuses_without_gpu_in_one_line(monkeypatch, capsys, tmp_path):
    from vtcsearch.codegen.kernels import bench
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    rc = bench.main(["--conv-csv", str(tmp_path / "c.csv"), "--gemm-csv", str(tmp_path / "g.csv")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "no CUDA device" in err
    assert not list(tmp_path.iterdir())


@pytest.mark.gpu
def test_bench_one_conv_and_one_gemm(tmp_path):
    """One conv layer (depthwise 5x5 through a Split map) and one decode GEMM through the bench's CSV path:
    every implementation timed, provenance columns, numerics against torch."""
    import csv
    from vtcsearch.codegen.kernels import bench
    rc = bench.main(["--conv-csv", str(tmp_path / "conv.csv"), "--gemm-csv", str(tmp_path / "gemm.csv"),
                     "--layers", "litemla_dw5x5", "--gemms", "o_proj", "--m", "1", "--rep-ms", "20"])
    assert rc == 0
    conv = list(csv.DictReader(open(tmp_path / "conv.csv")))
    gemm_ = list(csv.DictReader(open(tmp_path / "gemm.csv")))
    assert len(conv) == 1 and len(gemm_) == 1
    for r, cols in ((conv[0], ("triton_map_us", "triton_dense_us", "cudnn_us", "cudnn_nhwc_us")),
                    (gemm_[0], ("triton_us", "triton_tiled_us", "cublas_us", "floor_us"))):
        assert not r.get("error"), r
        assert all(float(r[c]) > 0 for c in cols), r
        assert r["command"].startswith("python -m vtcsearch.codegen.kernels.bench") and r["machine"] and r["date"]
        assert float(r["max_abs_err"]) < 5e-2


def test_tuning_choices_come_back_from_the_tuning_file(tmp_path, monkeypatch):
    """With ``VTC_TUNING_FILE``, a later process takes the choice made before (no candidate compiled or timed
    again: what a device call carries to the next), only on the same GPU, torch, Triton and template source."""
    import triton.testing

    from vtcsearch.codegen.kernels import autotune as at
    monkeypatch.setattr(at, "interpreting", lambda: False)
    monkeypatch.setattr(at, "_system", lambda: "a gpu | torch | triton | templates 1")
    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, warmup, rep: fn())
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setenv("VTC_TUNING_FILE", str(tmp_path / "tuning.json"))
    timed: list[int] = []
    configs = [{"BLOCK": 16}, {"BLOCK": 32}, {"BLOCK": 64}]

    def run(cfg):
        def launch():
            timed.append(cfg["BLOCK"])
            return abs(cfg["BLOCK"] - 32) + 1.0      # "milliseconds": 32 is fastest
        return launch

    at.clear_tuning()
    assert at.autotune("k", configs, run) == {"BLOCK": 32} and timed == [16, 32, 64]
    at.clear_tuning()                                  # as a new process: the file answers
    assert at.autotune("k", configs, run) == {"BLOCK": 32} and timed == [16, 32, 64]
    assert at.autotune("k2", configs[:2], run) == {"BLOCK": 32} and timed[3:] == [16, 32]
    monkeypatch.setattr(at, "_system", lambda: "another gpu | torch | triton | templates 1")
    at.clear_tuning()
    assert at.autotune("k", configs, run) == {"BLOCK": 32} and timed[5:] == [16, 32, 64]
    at.clear_tuning()

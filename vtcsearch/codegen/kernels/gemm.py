"""GEMM (mm / addmm / bmm) with a fused pointwise epilogue, every operand through its map.

``gemm(a, b, out, epilogue)`` computes ``out = epilogue(a @ b)`` for ``a`` [B?, M, K],
``b`` [B?, K, N] and ``out`` [B?, M, N] (a 2-d operand next to 3-d ones is broadcast
over the batch).  Accumulation is fp32; the epilogue is, in this order::

    y = acc * scale (* mul) (+ bias)  mul, bias: any operands broadcastable to out
    y = activation(y)                 relu | silu | sigmoid | tanh | gelu | gelu_tanh
    y = rope(y)                       interleaved pairs (2i, 2i+1) within each head
    y = y + residual                  residual: broadcastable to out
    y = expr(y, x0, x1, ...)          any elementwise code (a fused region), operands x_k

and ``y`` is written through ``out``'s map: e.g. the merged QKV projection writing Q
to one tensor and K/V rows straight into the KV caches at a runtime position, the
RoPE already applied.  A ``Rope`` holds cos/sin operands over [M, head_dim // 2]
(one row per output row: the map picks the position, e.g. ``cos_table[$pos, i1]`` at
decode or ``cos_table[i0 % S, i1]`` at prefill) and the column range it applies to.

**Split-K.**  When the output has few tiles (small M and N: LiteMLA's K=8192
``v @ k^T``, decode GEMMs) the tiled kernel runs on a few SMs, each streaming a
long K loop.  A split-K configuration (``SPLIT`` > 1) runs ``SPLIT`` programs per
tile over disjoint K ranges, each storing its fp32 partial sum to a workspace;
a second kernel adds the partials in a fixed order (deterministic), applies the
epilogue and stores through the output map.  The autotuner times these next to
the tiled configurations on a GPU; ``gemm(..., split_k=n)`` forces one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ._lib import ACTIVATIONS
from .pointwise import index_codes
from .autotune import autotune
from .codecache import PartsPlan, Plan, compile_source, interpreting, key_of, plan_cache
from .emit import IO, next_pow2, render, tl_dtype
from .operand import Operand
from ..split_k import decode_split_configs, split_configs  # noqa: F401  (the one split decision)


@dataclass
class Rope:
    """Rotary embedding on interleaved column pairs, applied in the GEMM epilogue.

    For output column ``c`` in ``cols`` (default: all) with ``j = (c % head_dim) // 2``:
    ``out[2j] = x[2j] cos - x[2j+1] sin`` and ``out[2j+1] = x[2j] sin + x[2j+1] cos``
    with ``cos = cos_op[row, j]`` (Meta Llama's ``view_as_complex`` form).
    """

    cos: Operand
    sin: Operand
    head_dim: int
    cols: tuple[int, int] | None = None


@dataclass
class Epilogue:
    """What happens to the fp32 accumulator ``y`` before the store (see the module docstring).

    ``lines`` / ``expr`` / ``operands``: a general elementwise epilogue (what
    :func:`vtcsearch.codegen.elementwise.compile_region` produces): ``lines`` set temporaries,
    then ``y = expr``; operand ``k`` is loaded as ``x<k>`` at the output tile, and
    ``{iK}`` is the index of output dim ``K``.
    """

    scale: float = 1.0
    bias: Operand | None = None
    mul: Operand | None = None      # a per-element factor before the bias (a conv's folded BatchNorm scale)
    activation: str | None = None
    rope: Rope | None = None
    residual: Operand | None = None
    lines: Sequence[str] = ()
    expr: str | None = None
    operands: Sequence[Operand] = ()

    def signature(self) -> str:
        r = self.rope
        rs = None if r is None else (r.cos.signature(), r.sin.signature(), r.head_dim, r.cols)
        return repr((self.scale, self.bias.signature() if self.bias else None, self.activation, rs,
                     self.residual.signature() if self.residual else None, tuple(self.lines), self.expr,
                     tuple(o.signature() for o in self.operands),
                     self.mul.signature() if self.mul is not None else None))


@dataclass
class RowNorm:
    """A row-wise normalisation of ``a`` computed inside the GEMM (prologue fusion, decode GEMMs).

    ``rmsnorm``: each program first sums ``a[m, :]**2`` over the whole K (fp32, one extra pass
    over its A rows, cheap when M is small), then every A tile is loaded as
    ``round(a * rstd[m] * weight[k])`` with ``rstd = rsqrt(mean(a^2) + eps)``.  ``layernorm``:
    two passes (the mean, then the centred variance, as the LayerNorm template), then
    ``round((a - mean[m]) * rstd[m] * weight[k] + bias[k])``.  Either is what the unfused norm
    kernel stores, so the product reads the same values.  ``round``: a line of code that sets
    ``a`` to its value as the unfused norm stored it (its output dtype; empty: fp32).
    """

    weight: Operand | None = None     # [K], or None (1)
    eps: float = 1e-6
    round: str = ""
    kind: str = "rmsnorm"             # "rmsnorm" | "layernorm"
    bias: Operand | None = None       # layernorm: [K], or None (0)

    def signature(self) -> str:
        return repr((self.kind, self.weight.signature() if self.weight is not None else None, self.eps, self.round,
                     self.bias.signature() if self.bias is not None else None))


_TEMPLATE = """
@triton.jit
def gemm_kernel(@params@, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
    @@prologue
    pid = tl.program_id(0)
    pid_b = tl.program_id(1)
    num_pid_m = tl.cdiv(@M@, BM)
    num_pid_n = tl.cdiv(@N@, BN)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    @@norm_stats
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, @K@, BK):
        rk = k0 + tl.arange(0, BK)
        # stage 1: load the A and B tiles through their maps
        @@load_a
        @@norm_apply
        @@load_b
        # stage 2: multiply-accumulate in fp32
        acc = tl.dot(a, b, acc@dot_opts@)
    # stage 2: fused epilogue
    y = acc
    @@epilogue
    # stage 3: store through the output map
    @@store
"""


_PARTIAL = """
@triton.jit
def gemm_partial_kernel(@params@, ws, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, KS: tl.constexpr):
    @@prologue
    pid_k = tl.program_id(2)
    @@tile
    @@norm_stats
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(pid_k * KS, pid_k * KS + KS, BK):
        rk = k0 + tl.arange(0, BK)
        @@load_a
        @@norm_apply
        @@load_b
        acc = tl.dot(a, b, acc@dot_opts@)
    wrow = (pid_k * @B@ + pid_b) * @M@ + rm[:, None]
    tl.store(ws + wrow * @N@ + rn[None, :], acc, mask=(rm[:, None] < @M@) & (rn[None, :] < @N@))
"""

_REDUCE = """
@triton.jit
def gemm_reduce_kernel(@params@, ws, BM: tl.constexpr, BN: tl.constexpr, SPLIT: tl.constexpr):
    @@prologue
    @@tile
    wmask = (rm[:, None] < @M@) & (rn[None, :] < @N@)
    y = tl.zeros((BM, BN), dtype=tl.float32)
    for s in tl.static_range(SPLIT):
        wrow = (s * @B@ + pid_b) * @M@ + rm[:, None]
        y += tl.load(ws + wrow * @N@ + rn[None, :], mask=wmask, other=0.0)
    @@epilogue
    @@store
"""


# the output tile of a split-K program (both kernels): row-major over N tiles, batch on grid axis 1
_SPLIT_TILE = ["pid = tl.program_id(0)", "pid_b = tl.program_id(1)", "num_pid_n = tl.cdiv(@N@, BN)",
               "pid_m = pid // num_pid_n", "pid_n = pid % num_pid_n", "rm = pid_m * BM + tl.arange(0, BM)",
               "rn = pid_n * BN + tl.arange(0, BN)"]


@dataclass
class SplitPlan(PartsPlan):
    """Split-K: the partial-sum kernel, then the reduce + epilogue kernel, sharing an fp32 workspace (allocated
    per run: :class:`~vtcsearch.codegen.kernels.codecache.PartsPlan`)."""


def _configs(M: int, N: int, K: int, gpu: bool) -> list[dict]:
    if not gpu:
        raw = [(16, 32, 32, 4, 1)]
    elif M <= 16:  # weight-bandwidth bound: enough programs to fill the SMs, long K steps
        raw = [(16, 32, 256, 4, 3), (16, 16, 256, 2, 4), (16, 16, 512, 4, 3), (16, 32, 512, 4, 3),
               (16, 64, 128, 4, 4), (16, 64, 256, 4, 3), (16, 16, 128, 2, 6), (16, 32, 128, 4, 6)]
    elif M <= 64:
        raw = [(32, 64, 128, 4, 3), (64, 64, 64, 4, 4), (32, 128, 64, 4, 4), (64, 128, 64, 4, 3)]
    else:
        raw = [(128, 128, 64, 8, 3), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4), (128, 256, 64, 8, 3),
               (64, 64, 64, 4, 4)]
    out, seen = [], set()
    for bm, bn, bk, w, s in raw:
        bm = min(bm, max(16, next_pow2(M)))
        bn = min(bn, max(16, next_pow2(N)))
        bk = min(bk, max(16, next_pow2(K)))
        if (bm, bn, bk) in seen:
            continue
        seen.add((bm, bn, bk))
        out.append({"BM": bm, "BN": bn, "BK": bk, "GROUP_M": 8, "num_warps": w, "num_stages": s})
    return out


def _row_norm(pro: RowNorm | None, ios: dict, bidx: list[str], ablk: list, M: int, K: int, BK: int,
              mrow: str | None, mk_a: str | None, dot_dt: str, join) -> tuple[list[str], list[str]]:
    """The prologue's code: (the statistics pass before the K loop, the lines that normalise each A tile)."""
    if pro is None:
        return [], []
    mk = f"(rk[None, :] < {K})" if K % BK else None
    stats = ios["a"].load("a", bidx + ["rm[:, None]", "rk[None, :]"], shape="(BM, BK)", mask=join(mrow, mk),
                          block=ablk, dtype="tl.float32")
    loop = [f"for k0 in range(0, {K}, BK):", "    rk = k0 + tl.arange(0, BK)"] + ["    " + ln for ln in stats]
    eps = float(pro.eps)
    if pro.kind == "rmsnorm":
        lines = ["# prologue: each row's statistic, one pass over K in fp32",
                 "ss = tl.zeros((BM,), dtype=tl.float32)"] + loop + \
            ["    ss += tl.sum(a * a, 1)", f"rstd = tl.rsqrt(ss / {K} + {eps!r})"]
    else:
        centred = ["    a = a - mean[:, None]"] + ([f"    a = tl.where(rk[None, :] < {K}, a, 0.0)"] if mk else [])
        lines = ["# prologue: each row's mean, then its centred variance, over K in fp32",
                 "s1 = tl.zeros((BM,), dtype=tl.float32)"] + loop + ["    s1 += tl.sum(a, 1)",
                                                                      f"mean = s1 / {K}",
                                                                      "s2 = tl.zeros((BM,), dtype=tl.float32)"] + \
            loop + centred + ["    s2 += tl.sum(a * a, 1)", f"rstd = tl.rsqrt(s2 / {K} + {eps!r})"]
    apply = ["a = a - mean[:, None]"] if pro.kind == "layernorm" else []
    kmask = f"(rk < {K})" if mk_a else None
    for name, op in (("nw", pro.weight), ("nb", pro.bias if pro.kind == "layernorm" else None)):
        if op is None:
            continue
        if tuple(op.shape) != (K,):
            raise ValueError(f"a row-norm prologue's {name} must be [K] = [{K}], got {tuple(op.shape)}")
        ios[name] = IO(op, name)
        apply += ios[name].load(name, ["rk"], shape="(BK,)", mask=kmask, dtype="tl.float32")
    apply.append("a = a * rstd[:, None]" + (" * nw[None, :]" if "nw" in ios else "")
                 + (" + nb[None, :]" if "nb" in ios else ""))
    if pro.kind == "layernorm" and mk_a:        # K lanes past the end: 0, as the unnormalised load
        apply.append(f"a = tl.where(rk[None, :] < {K}, a, 0.0)")
    if pro.round:
        apply.append(pro.round)
    if dot_dt != "tl.float32":
        apply.append(f"a = a.to({dot_dt})")
    return lines, apply


def _batched(op: Operand, shape: Sequence[int]) -> Operand:
    return op if op.shape == tuple(shape) else op.broadcast_to(shape)


def gemm(a: Operand, b: Operand, out: Operand, epilogue: Epilogue | None = None, split_k: int | None = None,
         config: dict | None = None, serial_pieces: bool = False, prologue: RowNorm | None = None) -> Plan:
    """``out = epilogue(a @ b)``; see the module docstring (``split_k``: force that many K splits;
    ``config``: force one whole configuration, e.g. one of :func:`split_configs`, for tests and benches;
    ``serial_pieces``: no software pipelining of a K loop that reads ``a`` or ``b`` through a piecewise
    map, the convolution template's guard against Triton 3.6 miscompiling it on the H200;
    ``prologue``: normalise ``a``'s rows while loading them, see :class:`RowNorm`)."""
    ep = epilogue or Epilogue()
    pro = prologue
    if pro is not None and pro.kind not in ("rmsnorm", "layernorm"):
        raise ValueError(f"unknown GEMM prologue {pro.kind!r}")
    if a.ndim not in (2, 3) or b.ndim not in (2, 3) or out.ndim not in (2, 3):
        raise ValueError("gemm takes 2-d or 3-d operands")
    batched = max(a.ndim, b.ndim, out.ndim) == 3
    M, K = a.shape[-2:]
    K2, N = b.shape[-2:]
    if K != K2 or tuple(out.shape[-2:]) != (M, N):
        raise ValueError(f"gemm shapes {a.shape} @ {b.shape} -> {out.shape}")
    B = max(x.shape[0] if x.ndim == 3 else 1 for x in (a, b, out))
    if batched:
        if out.ndim != 3:
            raise ValueError("a batched gemm needs a 3-d output")
        a, b = _batched(a, (B, M, K)), _batched(b, (B, K, N))
    oshape = out.shape
    bias = _batched(ep.bias, oshape) if ep.bias is not None else None
    mul = _batched(ep.mul, oshape) if ep.mul is not None else None
    res = _batched(ep.residual, oshape) if ep.residual is not None else None
    rope = ep.rope
    if rope is not None:
        hd = rope.head_dim
        if hd % 2:
            raise ValueError("RoPE needs an even head_dim")
        tshape = oshape[:-1] + (hd // 2,)
        cos, sin = _batched(rope.cos, tshape), _batched(rope.sin, tshape)
        lo, hi = rope.cols or (0, N)
        if lo % 2 or hi % 2:
            raise ValueError("RoPE column range must start and end on a pair")
    extra_ops = [_batched(x, oshape) for x in ep.operands]
    if ep.activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {ep.activation!r}")
    gpu = not interpreting() and out.device.type == "cuda"
    configs = _configs(M, N, K, gpu)
    if config is not None:
        missing = {"BM", "BN", "BK", "GROUP_M", "num_warps", "num_stages"} - set(config)
        if missing:
            raise ValueError(f"gemm config lacks {sorted(missing)}")
        configs = [dict(config)]
    elif split_k is not None and split_k > 1:
        configs = [dict(configs[0], GROUP_M=1, SPLIT=split_k)]
    elif gpu:
        configs += split_configs(M, N, K, B, torch.cuda.get_device_properties(out.device).multi_processor_count)
    base_key = key_of("gemm", a.signature(), b.signature(), out.signature(), ep.signature(),
                      *(("serial_pieces",) if serial_pieces else ()), *((pro.signature(),) if pro else ()))
    dot_dt = tl_dtype(a.dtype) if a.dtype == b.dtype and a.dtype.is_floating_point else "tl.float32"
    if not gpu:  # Triton's interpreter multiplies bf16 tiles wrongly (3.9): feed it fp32
        dot_dt = "tl.float32"
    dot_opts = ', input_precision="ieee"' if dot_dt == "tl.float32" and gpu else ""

    def unpipelined(ios: dict) -> bool:
        return serial_pieces and any(m != "single" for k in ("a", "b") for m in ios[k].modes)

    def build(cfg: dict) -> Plan:
        BM, BN, BK = cfg["BM"], cfg["BN"], cfg["BK"]
        split = cfg.get("SPLIT", 1)
        KS = -(-(-(-K // split)) // BK) * BK          # each split's K range: whole BK steps
        ragged_k = K % BK or (split > 1 and KS * split != K)
        bidx = ["pid_b"] if batched else []
        bblk = [("pid_b", 1)] if batched else []
        ios = {"a": IO(a, "a"), "b": IO(b, "b"), "out": IO(out, "out")}
        mrow = f"(rm[:, None] < {M})" if M % BM else None
        mk_a = f"(rk[None, :] < {K})" if ragged_k else None
        mk_b = f"(rk[:, None] < {K})" if ragged_k else None
        ncol = f"(rn[None, :] < {N})" if N % BN else None
        join = lambda *ms: " & ".join(m for m in ms if m) or None  # noqa: E731
        ablk = bblk + [("pid_m * BM", BM), ("k0", BK)]
        load_a = ios["a"].load("a", bidx + ["rm[:, None]", "rk[None, :]"], shape="(BM, BK)",
                               mask=join(mrow, mk_a), block=ablk, dtype="tl.float32" if pro else dot_dt)
        norm_stats, norm_apply = _row_norm(pro, ios, bidx, ablk, M, K, BK, mrow, mk_a, dot_dt, join)
        load_b = ios["b"].load("b", bidx + ["rk[:, None]", "rn[None, :]"], shape="(BK, BN)",
                               mask=join(mk_b, ncol), block=bblk + [("k0", BK), ("pid_n * BN", BN)], dtype=dot_dt)
        oidx = bidx + ["rm[:, None]", "rn[None, :]"]
        oblk = bblk + [("pid_m * BM", BM), ("pid_n * BN", BN)]
        omask = join(mrow, ncol)
        epi: list[str] = []
        if ep.scale != 1.0:
            epi.append(f"y = y * {float(ep.scale)!r}")
        if mul is not None:
            ios["mul"] = IO(mul, "mul")
            epi += ios["mul"].load("mul", oidx, shape="(BM, BN)", mask=omask, block=oblk)
            epi.append("y = y * mul")
        if bias is not None:
            ios["bias"] = IO(bias, "bias")
            epi += ios["bias"].load("bias", oidx, shape="(BM, BN)", mask=omask, block=oblk)
            epi.append("y = y + bias")
        if ep.activation not in (None, "none"):
            epi.append("y = " + ACTIVATIONS[ep.activation].format(x="y"))
        if rope is not None:
            ios["cos"], ios["sin"] = IO(cos, "cos"), IO(sin, "sin")
            half = hd // 2
            epi.append("ye, yo = tl.split(tl.reshape(y, (BM, BN // 2, 2)))")
            epi.append("rp = pid_n * (BN // 2) + tl.arange(0, BN // 2)")
            epi.append(f"hp = rp % {half}")
            tidx = bidx + ["rm[:, None]", "hp[None, :]"]
            epi += ios["cos"].load("rc", tidx, shape="(BM, BN // 2)", mask=mrow)
            epi += ios["sin"].load("rs", tidx, shape="(BM, BN // 2)", mask=mrow)
            epi.append("re = ye * rc - yo * rs")
            epi.append("ro = ye * rs + yo * rc")
            if (lo, hi) != (0, N):
                epi.append(f"rot = ((2 * rp >= {lo}) & (2 * rp < {hi}))[None, :]")
                epi.append("re = tl.where(rot, re, ye)")
                epi.append("ro = tl.where(rot, ro, yo)")
            epi.append("y = tl.reshape(tl.join(re, ro), (BM, BN))")
        if res is not None:
            ios["res"] = IO(res, "res")
            epi += ios["res"].load("res", oidx, shape="(BM, BN)", mask=omask, block=oblk)
            epi.append("y = y + res")
        if ep.expr is not None:
            for k, x in enumerate(extra_ops):
                ios[f"x{k}"] = IO(x, f"x{k}")
                epi += ios[f"x{k}"].load(f"x{k}", oidx, shape="(BM, BN)", mask=omask, block=oblk)
            epi += [index_codes(line, oidx) for line in ep.lines]
            epi.append(f"y = ({index_codes(ep.expr, oidx)}) + tl.zeros((BM, BN), tl.float32)")
        store = ios["out"].store("y", oidx, mask=omask, block=oblk)
        for k in ("nw", "nb"):      # the prologue's weight and bias are the last kernel arguments
            if k in ios:
                ios[k] = ios.pop(k)
        params, prologue = [], []
        for io in ios.values():
            params += io.params()
            prologue += io.prologue()
        tiles = -(-M // BM) * -(-N // BN)
        modes = {k: io.modes for k, io in ios.items()}
        if split > 1:
            dims = dict(params=params, prologue=prologue, tile=[ln.replace("@N@", str(N)) for ln in _SPLIT_TILE],
                        M=str(M), N=str(N), B=str(B))
            psrc = render(_PARTIAL, **dims, load_a=load_a, load_b=load_b, dot_opts=dot_opts,
                          norm_stats=norm_stats, norm_apply=norm_apply)
            rsrc = render(_REDUCE, **dims, epilogue=epi, store=store)
            opts = {k: cfg[k] for k in ("num_warps", "num_stages")}
            if unpipelined(ios):
                opts["num_stages"] = 1
            part = Plan("gemm_partial", compile_source("gemm_partial_kernel", psrc), (tiles, B, split),
                        {"BM": BM, "BN": BN, "BK": BK, "KS": KS}, opts, psrc, modes, cfg)
            red = Plan("gemm_reduce", compile_source("gemm_reduce_kernel", rsrc), (tiles, B),
                       {"BM": BM, "BN": BN, "SPLIT": split}, {"num_warps": 4}, rsrc, modes, cfg)
            return SplitPlan("gemm", None, (tiles, B, split), {}, {}, psrc + rsrc, modes, cfg,
                             parts=[part, red], workspaces=(split * B * M * N,))
        src = render(_TEMPLATE, params=params, prologue=prologue, M=str(M), N=str(N), K=str(K),
                     load_a=load_a, load_b=load_b, epilogue=epi, store=store, dot_opts=dot_opts,
                     norm_stats=norm_stats, norm_apply=norm_apply)
        kern = compile_source("gemm_kernel", src)
        grid = (tiles, B if batched else 1)
        constexprs = {k: cfg[k] for k in ("BM", "BN", "BK", "GROUP_M")}
        options = {k: cfg[k] for k in ("num_warps", "num_stages")}
        if unpipelined(ios):
            options["num_stages"] = 1
        return Plan("gemm", kern, grid, constexprs, options, src, modes, {**cfg, **options})

    extra = [x for x in (mul, bias) if x is not None]
    if rope is not None:
        extra += [cos, sin]
    if res is not None:
        extra.append(res)
    extra += extra_ops
    if pro is not None:
        extra += [x for x in (pro.weight, pro.bias if pro.kind == "layernorm" else None) if x is not None]
    args = a.kernel_args() + b.kernel_args() + out.kernel_args() + [v for x in extra for v in x.kernel_args()]

    def runner(cfg: dict):
        plan = plan_cache(key_of(base_key, sorted(cfg.items())), lambda: build(cfg))
        return lambda: plan.launch(args)

    cfg = autotune(base_key, configs, runner, written=out.tensors.values(), device=out.device)
    plan = plan_cache(key_of(base_key, sorted(cfg.items())), lambda: build(cfg))
    plan.launch(args)
    return plan

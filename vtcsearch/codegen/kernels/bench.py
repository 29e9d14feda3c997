"""Micro-benchmarks of the templates against the vendor libraries (GPU only).

``python -m vtcsearch.codegen.kernels.bench [--batch 1 16]`` prints, per kernel at Llama 3 8B
decode sizes, the median time (``triton.testing.do_bench``), the bytes it must move and the
bandwidth that implies, next to a plain PyTorch baseline of the same math on physical tensors.

``python -m vtcsearch.codegen.kernels.bench --conv-csv results/kernels/conv.csv
--gemm-csv results/kernels/decode_gemm.csv`` (issue 12 item 4, issue 16) times side by side,
with CUDA-graph replays (:func:`vtcsearch.codegen.timing.bench`), in fp16:

* conv layers (:data:`CONV_LAYERS`: EfficientViT's LiteMLA convs from
  ``results/vision_blocks/conv_layers.csv``, depthwise 5x5 and 3x3/s2, 1x1 with large C,
  stride-2 3x3 and 1x1): vtcsearch's template reading ``x`` through a channel Split map and
  writing a channel slab of a Concat storage (``triton_map``), the template on dense
  tensors (``triton_dense``), cuDNN in NCHW and channels-last;
* decode attention (``--attention-csv``; Llama 3 8B and Gemma 2 9B heads at context 4096, batch 1 and 16):
  the autotuned choice and a sweep of tiles, stages and key splits, each against the floor of the cache read;
* decode GEMMs (M = 1, 16; K, N of Llama 3 8B's projections, :data:`GEMM_SHAPES`): the
  autotuned template (tiled and split-K configs; its choice in ``config``), the best tiled
  configuration alone, cuBLAS (``x @ w.t()``), and the HBM floor of the weight stream.

Each CSV row carries ``command``, ``machine`` and ``date``.  About 2-3 minutes on an H200.
On a machine without a CUDA GPU it refuses in one line (exit 2).
"""
from __future__ import annotations

import argparse
import csv
import datetime as _dt
import os
import sys
from typing import Any, Sequence

import torch


def _bench(fn) -> float:
    """GPU time of ``fn`` in microseconds: captured in a CUDA graph (no Python launch cost in the
    number), replayed under ``triton.testing.do_bench`` (which flushes L2 between replays)."""
    from triton.testing import do_bench
    fn()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return do_bench(g.replay, warmup=25, rep=100) * 1e3


def run(batch: int) -> list[tuple]:
    from ...core.expr import sym
    from ...core.mapping import index_vars
    from . import Epilogue, Operand, Rope, attention, gemm, rmsnorm
    dev, bf = "cuda", torch.bfloat16
    HQ, HKV, D, S, H = 32, 8, 128, 4097, 4096
    pos = S - 1
    rows = []
    # merged QKV GEMM: RoPE in the epilogue, Q to a tensor, K/V straight into the caches at $pos
    x = torch.randn(batch, H, device=dev, dtype=bf)
    w = torch.randn((HQ + 2 * HKV) * D, H, device=dev, dtype=bf) / 64
    q = torch.empty(batch, 1, HQ, D, device=dev, dtype=bf)
    kc = torch.randn(batch, S, HKV, D, device=dev, dtype=bf)
    vc = torch.randn(batch, S, HKV, D, device=dev, dtype=bf)
    cos_t = torch.randn(S, D // 2, device=dev)
    sin_t = torch.randn(S, D // 2, device=dev)
    pv = torch.tensor([pos], device=dev)
    v = index_vars(2)
    P = sym("pos", 0, S - 1)
    out = Operand.cat([Operand.dense(q, "q").view([batch, HQ * D], [v[0], 0, v[1] // D, v[1] % D]),
                       Operand.dense(kc, "kc").view([batch, HKV * D], [v[0], P, v[1] // D, v[1] % D], syms={"pos": pv}),
                       Operand.dense(vc, "vc").view([batch, HKV * D], [v[0], P, v[1] // D, v[1] % D], syms={"pos": pv})], 1)
    cos = Operand.dense(cos_t, "cos").view([batch, D // 2], [P, v[1]], syms={"pos": pv})
    sin = Operand.dense(sin_t, "sin").view([batch, D // 2], [P, v[1]], syms={"pos": pv})
    a, b = Operand.dense(x, "x"), Operand.dense(w, "w").transpose(0, 1)
    ep = Epilogue(rope=Rope(cos, sin, D, (0, (HQ + HKV) * D)))
    plan = gemm(a, b, out, ep)
    t = _bench(lambda: gemm(a, b, out, ep))
    y = torch.empty(batch, w.shape[0], device=dev, dtype=bf)
    tb = _bench(lambda: torch.mm(x, w.t(), out=y))
    nbytes = w.numel() * 2 + x.numel() * 2 + y.numel() * 2
    rows.append(("qkv_gemm+rope+cache", batch, t, tb, nbytes, plan.config))
    yop = Operand.dense(y, "y")
    plan = gemm(a, b, yop)
    rows.append(("qkv_gemm plain", batch, _bench(lambda: gemm(a, b, yop)), tb, nbytes, plan.config))
    # decode attention over the cache, GQA through the repeat_kv map
    v4 = index_vars(4)
    idx = [v4[0], v4[2], v4[1] // (HQ // HKV), v4[3]]
    k_op = Operand.dense(kc, "kc").view([batch, HQ, S, D], idx)
    v_op = Operand.dense(vc, "vc").view([batch, HQ, S, D], idx)
    q_op = Operand.dense(q, "q").permute([0, 2, 1, 3])
    o = torch.empty(batch, 1, HQ * D, device=dev, dtype=bf)
    o_op = Operand.dense(o, "o").view([batch, HQ, 1, D], [v4[0], v4[2], v4[1] * D + v4[3]])
    kvl = torch.tensor([S], device=dev)
    plans = attention(q_op, k_op, v_op, o_op, kv_len=kvl)
    t = _bench(lambda: attention(q_op, k_op, v_op, o_op, kv_len=kvl))
    qt, kt, vt = q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2)
    try:
        sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)  # noqa: E731
        sdpa()
    except TypeError:
        sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(  # noqa: E731
            qt, kt.repeat_interleave(4, 1), vt.repeat_interleave(4, 1))
    tb = _bench(sdpa)
    nbytes = 2 * kc.numel() * 2 + q.numel() * 4
    rows.append(("decode_attention", batch, t, tb, nbytes, plans[0].config))
    # prefill attention, causal, 1024 tokens (batch 1 only: it is the compute-bound case)
    if batch == 1:
        SP = 1024
        kp = torch.randn(1, SP, HKV, D, device=dev, dtype=bf)
        vp = torch.randn(1, SP, HKV, D, device=dev, dtype=bf)
        qp = torch.randn(1, SP, HQ, D, device=dev, dtype=bf)
        op_ = torch.empty(1, SP, HQ * D, device=dev, dtype=bf)
        kpo = Operand.dense(kp, "kc").view([1, HQ, SP, D], idx)
        vpo = Operand.dense(vp, "vc").view([1, HQ, SP, D], idx)
        qpo = Operand.dense(qp, "q").permute([0, 2, 1, 3])
        opo = Operand.dense(op_, "o").view([1, HQ, SP, D], [v4[0], v4[2], v4[1] * D + v4[3]])
        plans = attention(qpo, kpo, vpo, opo, causal=True)
        t = _bench(lambda: attention(qpo, kpo, vpo, opo, causal=True))
        qt2, kt2, vt2 = qp.transpose(1, 2), kp.transpose(1, 2), vp.transpose(1, 2)
        try:
            tb = _bench(lambda: torch.nn.functional.scaled_dot_product_attention(qt2, kt2, vt2, is_causal=True,
                                                                                 enable_gqa=True))
        except TypeError:
            tb = float("nan")
        flops = 4 * HQ * SP * SP * D / 2
        rows.append(("prefill_attn (MFLOP)", batch, t, tb, flops, plans[0].config))  # columns: MFLOP, GFLOP/s
    # o-projection with the residual fused
    wo = torch.randn(H, H, device=dev, dtype=bf) / 64
    h0 = torch.randn(batch, H, device=dev, dtype=bf)
    h = torch.empty_like(h0)
    ao = Operand.dense(o.view(batch, H), "o")
    wo_op = Operand.dense(wo, "wo").transpose(0, 1)
    ep2 = Epilogue(residual=Operand.dense(h0, "h0"))
    hop = Operand.dense(h, "h")
    plan = gemm(ao, wo_op, hop, ep2)
    t = _bench(lambda: gemm(ao, wo_op, hop, ep2))
    tb = _bench(lambda: torch.addmm(h0, o.view(batch, H), wo.t()))
    rows.append(("o_proj+residual", batch, t, tb, wo.numel() * 2, plan.config))
    # RMSNorm
    nw = torch.randn(H, device=dev, dtype=bf)
    n = torch.empty_like(h)
    ops = (Operand.dense(h, "h"), Operand.dense(nw, "w"), Operand.dense(n, "n"))
    rmsnorm(*ops, 1e-5)
    t = _bench(lambda: rmsnorm(*ops, 1e-5))
    tb = _bench(lambda: (h.float() * torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + 1e-5)).to(bf) * nw)
    rows.append(("rmsnorm", batch, t, tb, h.numel() * 4 + nw.numel() * 2, {}))
    return rows


# (name, x [N, C, H, W], w [Cout, Cin/groups, KH, KW], stride, padding, groups)
CONV_LAYERS: list[tuple[str, tuple, tuple, int, int, int]] = [
    ("litemla_qkv_1x1", (1, 128, 64, 128), (384, 128, 1, 1), 1, 0, 1),
    ("litemla_dw5x5", (1, 384, 64, 128), (384, 1, 5, 5), 1, 2, 384),
    ("litemla_grouped_1x1", (1, 384, 64, 128), (384, 16, 1, 1), 1, 0, 24),
    ("litemla_proj_1x1", (1, 256, 64, 128), (128, 256, 1, 1), 1, 0, 1),
    ("dw5x5_bs16", (16, 256, 32, 32), (256, 1, 5, 5), 1, 2, 256),
    ("dw3x3_s2", (1, 96, 112, 112), (96, 1, 3, 3), 2, 1, 96),
    ("1x1_largeC", (1, 1024, 14, 14), (256, 1024, 1, 1), 1, 0, 1),
    ("1x1_largeC_bs16", (16, 2048, 7, 7), (512, 2048, 1, 1), 1, 0, 1),
    ("1x1_s2", (1, 512, 28, 28), (1024, 512, 1, 1), 2, 0, 1),
    ("3x3_s2", (1, 128, 56, 56), (256, 128, 3, 3), 2, 1, 1),
    ("3x3_s1", (16, 64, 56, 56), (64, 64, 3, 3), 1, 1, 1),
]

# (name, K, N) of Llama 3 8B's decode projections (hidden 4096, 32 + 2x8 heads of 128, FFN 14336)
GEMM_SHAPES: list[tuple[str, int, int]] = [
    ("qkv", 4096, 6144), ("o_proj", 4096, 4096), ("gate_up", 4096, 28672), ("down", 14336, 4096),
]


def refuse_without_gpu() -> str | None:
    """The one-line reason this bench cannot run here (None on a CUDA machine)."""
    if not torch.cuda.is_available():
        return "vtcsearch.codegen.kernels.bench times GPU kernels: no CUDA device here"
    return None


def provenance(argv: Sequence[str]) -> dict[str, str]:
    """command / machine / date columns, in the form of vtcsearch.report.with_provenance (which lives above
    codegen, so it is not imported here)."""
    import triton
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return {"command": " ".join(["python -m vtcsearch.codegen.kernels.bench", *argv]),
            "machine": f"{dev} (torch {torch.__version__}, triton {triton.__version__})",
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}


def _time_us(fn, rep_ms: float) -> float:
    from ..timing import bench
    return bench(fn, device="cuda", rep_ms=rep_ms).median_us


def conv_rows(layers: Sequence[tuple] = tuple(CONV_LAYERS), rep_ms: float = 100.0) -> list[dict[str, Any]]:
    """Per layer: Triton through maps, Triton dense, cuDNN NCHW and channels-last (microseconds)."""
    import torch.nn.functional as F
    from . import Operand, conv2d
    from .conv import out_size
    dev, dt = "cuda", torch.float16
    rows = []
    for name, xs, ws, s, p, g in layers:
        N, C, H, W = xs
        x = torch.randn(xs, device=dev, dtype=dt)
        w = torch.randn(ws, device=dev, dtype=dt) / (ws[1] * ws[2] * ws[3]) ** 0.5
        OH, OW = out_size(H, ws[2], s, p, 1), out_size(W, ws[3], s, p, 1)
        y = torch.empty(N, ws[0], OH, OW, device=dev, dtype=dt)
        # through maps: x a channel Split piece of a bigger storage, out a channel slab of a Concat storage
        xbig = torch.randn(N, C + 16, H, W, device=dev, dtype=dt)
        xbig[:, 8:8 + C] = x
        ybig = torch.empty(N, ws[0] + 16, OH, OW, device=dev, dtype=dt)
        xm, ym = Operand.dense(xbig, "x").narrow(1, 8, C), Operand.dense(ybig, "y").narrow(1, 8, ws[0])
        xd, yd, wd = Operand.dense(x, "x"), Operand.dense(y, "y"), Operand.dense(w, "w")
        row: dict[str, Any] = {"layer": name, "x": list(xs), "w": list(ws), "stride": s, "padding": p, "groups": g}
        try:
            plan = conv2d(xm, wd, ym, stride=s, padding=p, groups=g)
            row["algo"], row["config"] = plan.name, dict(plan.config)
            row["triton_map_us"] = _time_us(lambda: conv2d(xm, wd, ym, stride=s, padding=p, groups=g), rep_ms)
            row["triton_dense_us"] = _time_us(lambda: conv2d(xd, wd, yd, stride=s, padding=p, groups=g), rep_ms)
            want = F.conv2d(x, w, None, s, p, 1, g)
            row["max_abs_err"] = float(max((ybig[:, 8:8 + ws[0]] - want).abs().max(), (y - want).abs().max()))
        except Exception as e:   # one failing layer must not lose the others' numbers
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        row["cudnn_us"] = _time_us(lambda: F.conv2d(x, w, None, s, p, 1, g), rep_ms)
        xc, wc = x.to(memory_format=torch.channels_last), w.to(memory_format=torch.channels_last)
        row["cudnn_nhwc_us"] = _time_us(lambda: F.conv2d(xc, wc, None, s, p, 1, g), rep_ms)
        best = min(row["cudnn_us"], row["cudnn_nhwc_us"])
        for k in ("triton_map", "triton_dense"):
            if f"{k}_us" in row:
                row[f"{k}_x_cudnn"] = best / row[f"{k}_us"]
        rows.append(row)
        print(f"conv {name:22s} " + " ".join(f"{k}={v:.1f}" for k, v in row.items()
                                               if k.endswith("_us")) + f" {row.get('algo', row.get('error'))}",
              flush=True)
    return rows


def gemm_rows(ms: Sequence[int] = (1, 16), shapes: Sequence[tuple] = tuple(GEMM_SHAPES), rep_ms: float = 100.0,
              bandwidth: float = 4.3e12) -> list[dict[str, Any]]:
    """Per (M, projection): the autotuned template (tiled + split-K), the best tiled config, cuBLAS, the
    weight-stream floor (bytes / ``bandwidth``, the H200's measured copy bandwidth)."""
    from . import Operand, gemm
    from .gemm import _configs
    dev, dt = "cuda", torch.float16
    rows = []
    for name, K, N in shapes:
        wt = torch.randn(N, K, device=dev, dtype=dt) / K ** 0.5
        for M in ms:
            x = torch.randn(M, K, device=dev, dtype=dt)
            y = torch.empty(M, N, device=dev, dtype=dt)
            a, b, o = Operand.dense(x, "x"), Operand.dense(wt, "w").transpose(0, 1), Operand.dense(y, "y")
            nbytes = (N * K + M * K + M * N) * 2
            row: dict[str, Any] = {"gemm": name, "M": M, "K": K, "N": N, "bytes": nbytes,
                                   "floor_us": nbytes / bandwidth * 1e6}
            try:
                plan = gemm(a, b, o)
                row["config"] = dict(plan.config)
                row["triton_us"] = _time_us(lambda: gemm(a, b, o), rep_ms)
                row["max_abs_err"] = float((y - x @ wt.t()).abs().max())
                tiled = []
                for cfg in _configs(M, N, K, True):
                    tiled.append(_time_us(lambda: gemm(a, b, o, config=cfg), rep_ms / 4))
                row["triton_tiled_us"] = min(tiled)
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            row["cublas_us"] = _time_us(lambda: torch.mm(x, wt.t(), out=y), rep_ms)
            for k in ("triton", "triton_tiled", "cublas"):
                if f"{k}_us" in row:
                    row[f"{k}_x_floor"] = row[f"{k}_us"] / row["floor_us"]
            rows.append(row)
            print(f"gemm {name:8s} M={M:<3d} " + " ".join(f"{k}={v:.1f}" for k, v in row.items()
                                                         if k.endswith("_us")) + f" {row.get('config')}", flush=True)
    return rows


# (name, query heads, KV heads, head dim, soft-cap) of the decode attentions of the whole-model configs
ATTENTION_SHAPES: list[tuple[str, int, int, int, float | None]] = [
    ("llama3_8b", 32, 8, 128, None), ("gemma2_9b", 16, 8, 256, 50.0),
]


def attention_rows(batches: Sequence[int] = (1, 16), shapes: Sequence[tuple] = tuple(ATTENTION_SHAPES),
                   context: int = 4096, rep_ms: float = 30.0, sweep: bool = True,
                   bandwidth: float = 4.3e12) -> list[dict[str, Any]]:
    """Decode attention (one query token, ``context`` + 1 keys) as the whole models run it: the KV cache
    [B, S, Hkv, D] read through the repeat_kv map, the length a device tensor, the output written into the
    [B, 1, Hq * D] activation.  Per shape and batch: the autotuned choice, then (``sweep``) every
    configuration of a grid of tiles, stages and key splits, and the five best of them with the combine fused,
    each against the HBM floor of the cache read."""
    from ...core.mapping import index_vars
    from . import Operand, attention
    from .attention import attention_configs
    dev, bf = "cuda", torch.bfloat16
    S = context + 1
    v4 = index_vars(4)
    rows = []
    for name, HQ, HKV, D, softcap in shapes:
        for B in batches:
            q = torch.randn(B, 1, HQ, D, device=dev, dtype=bf)
            kc = torch.randn(B, S, HKV, D, device=dev, dtype=bf)
            vc = torch.randn(B, S, HKV, D, device=dev, dtype=bf)
            o = torch.empty(B, 1, HQ * D, device=dev, dtype=bf)
            idx = [v4[0], v4[2], v4[1] // (HQ // HKV), v4[3]]
            k_op = Operand.dense(kc, "kc").view([B, HQ, S, D], idx)
            v_op = Operand.dense(vc, "vc").view([B, HQ, S, D], idx)
            q_op = Operand.dense(q, "q").permute([0, 2, 1, 3])
            o_op = Operand.dense(o, "o").view([B, HQ, 1, D], [v4[0], v4[2], v4[1] * D + v4[3]])
            kvl = torch.tensor([S], device=dev)
            nbytes = 2 * kc.numel() * 2 + q.numel() * 2 + o.numel() * 2
            floor = nbytes / bandwidth * 1e6
            g = HQ // HKV   # the fp32 reference, [B, HQ, D]
            scores = torch.einsum("bhd,bshd->bhs", q[:, 0].float(), kc.float().repeat_interleave(g, 2)) / D ** 0.5
            if softcap is not None:
                scores = softcap * torch.tanh(scores / softcap)
            ref = torch.einsum("bhs,bshd->bhd", scores.softmax(-1), vc.float().repeat_interleave(g, 2))
            del scores

            def one(config: dict | None, label: str) -> None:
                row: dict[str, Any] = {"attention": name, "batch": B, "choice": label, "bytes": nbytes,
                                       "floor_us": floor}
                try:
                    run = lambda: attention(q_op, k_op, v_op, o_op, kv_len=kvl, softcap=softcap,  # noqa: E731
                                            config=config)
                    plans = run()
                    row["config"] = dict(plans[0].config)
                    row["us"] = _time_us(run, rep_ms)
                    row["x_floor"] = row["us"] / floor
                    row["max_abs_err"] = float((o.view(B, HQ, D).float() - ref).abs().max())
                except Exception as e:   # a tile that does not fit (shared memory) is that row's error
                    row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
                rows.append(row)
                print(f"attn {name} bs{B} {label:8s} {row.get('us', float('nan')):8.1f} us "
                      f"x{row.get('x_floor', float('nan')):.2f} floor {row.get('config', row.get('error'))}",
                      flush=True)

            one(None, "autotune")
            if sweep:
                n_prog = B * HKV
                base = attention_configs(1, S, 16, n_prog, True)[0]["splits"]
                for bn in (16, 32, 64):
                    for w in (4, 8):
                        for st in (2, 3):
                            for sp in sorted({max(1, min(round(base * m), -(-S // bn))) for m in (0.25, 0.5, 1, 2)}):
                                one({"BLOCK_N": bn, "num_warps": w, "num_stages": st, "splits": sp}, "sweep")
                # the five best again with the combine fused into the main kernel
                timed = [r for r in rows if r["attention"] == name and r["batch"] == B and r["choice"] == "sweep"
                         and "us" in r and r["config"]["splits"] > 1]
                for r in sorted(timed, key=lambda r: r["us"])[:5]:
                    one(dict(r["config"], fused=True), "fused")
    return rows


def write_csv(path: str, rows: list[dict[str, Any]], prov: dict[str, str]) -> None:
    """``rows`` with the provenance columns, every key a column (the union, in first-seen order)."""
    rows = [{**r, **prov} for r in rows]
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="") as f:
        wr = csv.DictWriter(f, keys)
        wr.writeheader()
        wr.writerows(rows)
    print(f"wrote {path} ({len(rows)} rows)")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--conv-csv", default=None, help="time the conv layers, write this CSV")
    ap.add_argument("--gemm-csv", default=None, help="time the decode GEMMs, write this CSV")
    ap.add_argument("--attention-csv", default=None, help="time and sweep the decode attentions, write this CSV")
    ap.add_argument("--layers", default=None, help="comma-separated conv layer names (default: all)")
    ap.add_argument("--gemms", default=None, help="comma-separated GEMM names (default: all)")
    ap.add_argument("--m", type=int, nargs="+", default=[1, 16], help="decode GEMM row counts")
    ap.add_argument("--rep-ms", type=float, default=100.0, help="timing budget per measurement")
    args = ap.parse_args(argv)
    why = refuse_without_gpu()
    if why:
        print(why, file=sys.stderr)
        return 2
    print(f"device: {torch.cuda.get_device_name()}")
    if args.conv_csv or args.gemm_csv or args.attention_csv:
        prov = provenance(argv)
        pick = lambda table, names: [t for t in table if not names or t[0] in names.split(",")]  # noqa: E731
        if args.conv_csv:
            write_csv(args.conv_csv, conv_rows(pick(CONV_LAYERS, args.layers), args.rep_ms), prov)
        if args.gemm_csv:
            write_csv(args.gemm_csv, gemm_rows(args.m, pick(GEMM_SHAPES, args.gemms), args.rep_ms), prov)
        if args.attention_csv:   # written after each shape, so a call cut short keeps what it timed
            rows: list[dict[str, Any]] = []
            for shape in ATTENTION_SHAPES:
                rows += attention_rows(args.batch, [shape], rep_ms=min(args.rep_ms, 30.0))
                write_csv(args.attention_csv, rows, prov)
        return 0
    print(f"{'kernel':24s} {'batch':>5s} {'vtc us':>9s} {'torch us':>9s} {'MB':>8s} {'vtc GB/s':>9s}  config")
    for b in args.batch:
        for name, bb, t, tb, nbytes, cfg in run(b):
            print(f"{name:24s} {bb:5d} {t:9.1f} {tb:9.1f} {nbytes / 1e6:8.1f} {nbytes / t / 1e3:9.0f}  {cfg}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

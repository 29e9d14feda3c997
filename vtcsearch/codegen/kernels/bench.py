"""Micro-benchmarks of the templates at Llama 3 8B decode sizes (GPU only).

``python -m vtcsearch.codegen.kernels.bench [--batch 1 16]`` prints, per kernel, the median
time (``triton.testing.do_bench``), the bytes it must move and the bandwidth that
implies, next to a plain PyTorch baseline of the same math on physical tensors.
"""
from __future__ import annotations

import argparse

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


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    args = ap.parse_args(argv)
    print(f"device: {torch.cuda.get_device_name()}")
    print(f"{'kernel':24s} {'batch':>5s} {'vtc us':>9s} {'torch us':>9s} {'MB':>8s} {'vtc GB/s':>9s}  config")
    for b in args.batch:
        for name, bb, t, tb, nbytes, cfg in run(b):
            print(f"{name:24s} {bb:5d} {t:9.1f} {tb:9.1f} {nbytes / 1e6:8.1f} {nbytes / t / 1e3:9.0f}  {cfg}")


if __name__ == "__main__":
    main()

"""Attention for prefill and decode (FlashAttention / FlashDecoding), operands through their maps.

``attention(q, k, v, out, ...)`` computes ``out = softmax(mask(cap(scale * q k^T))) v`` with
``q`` [B, Hq, Sq, D], ``k``/``v`` [B, Hk, Skv, D(v)], ``out`` [B, Hq, Sq, Dv], fp32
softmax and accumulation.

Grouped-query heads are read straight from the KV cache.  Either ``Hk`` divides ``Hq``
(the KV operands are over the KV heads), or ``Hk == Hq`` and the KV operands' maps
read head ``i1 // g`` (repeat_kv / an Expand of the KV heads, resolved into the cache):
the group ``g`` is detected from the map.  One program handles the ``g`` query heads
sharing a KV head, stacking their rows into one tile, so every KV element is loaded
once per KV head.

* ``causal``: query row ``m`` sits at position ``m + kv_len - Sq`` (bottom-right
  aligned, as with a KV cache) and sees keys ``j <= pos``;
* ``window``: additionally ``pos - j < window`` (sliding-window attention);
* ``softcap``: ``s = softcap * tanh(s / softcap)`` after scaling (Gemma 2);
* ``kv_len``: valid keys ``[0, kv_len)``: an int, or an integer tensor of one
  element or of ``B`` elements (read on the device, so a CUDA graph can replay
  with a new length); default ``Skv``;
* ``mask``: an explicit mask operand broadcastable to [B, Hq, Sq, Skv] (SDPA's
  ``attn_mask``: boolean, True = attend; or additive, added to the scaled
  scores), read through its map tile by tile like the keys.

Decode-shaped problems (few query rows) split the key sequence over programs
(FlashDecoding).  The partial results are merged through ``out``'s map either by a small
combine kernel, or (``fused``) by the last program of each split group to finish: every
program counts itself in on a per-group semaphore and the last one merges, as CUDA's
threadFenceReduction sample does, which saves the combine kernel's launch.  The
autotuner times both.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..heads import shares_heads
from .autotune import autotune
from .codecache import PartsPlan, Plan, compile_source, interpreting, key_of, plan_cache, recording
from .emit import IO, next_pow2, render, tl_dtype
from .operand import Operand


_MAIN = """
@triton.jit
def attn_kernel(@params@, ws_o, ws_m, ws_l, kvlen_ptr, sem_ptr,
                BLOCK_N: tl.constexpr, BLOCK_MQ: tl.constexpr, ROWS: tl.constexpr,
                BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    @@prologue
    pid_m = @PIDM@
    pid_bh = tl.program_id(1)
    pid_s = tl.program_id(2)
    b = pid_bh // @HG@
    kvh = pid_bh % @HG@
    t = tl.arange(0, ROWS)
    r = t // BLOCK_MQ
    mq = pid_m * BLOCK_MQ + t % BLOCK_MQ
    qh = kvh * @G@ + r
    row_ok = (r < @G@) & (mq < @SQ@)
    d = tl.arange(0, BLOCK_D)
    dv = tl.arange(0, BLOCK_DV)
    @@kvlen
    q_pos = mq + (L - @SQ@)
    lo = pid_s * @CHUNK@
    hi = tl.minimum(lo + @CHUNK@, L)
    @@bounds
    # stage 1: the query tile (the group's heads stacked as rows)
    @@load_q
    m_i = tl.full((ROWS,), -float("inf"), tl.float32)
    l_i = tl.zeros((ROWS,), tl.float32)
    acc = tl.zeros((ROWS, BLOCK_DV), tl.float32)
    for n0 in range(lo, hi, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_ok = n < hi
        # stage 1: keys through their map (once per KV head)
        @@load_k
        # stage 2: scores, masks, online softmax in fp32
        s = tl.dot(q, tl.trans(k)@DOT@) * @SCALE@
        @@softcap
        valid = n_ok[None, :]
        @@mask
        s = tl.where(valid, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == -float("inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_use)
        p = tl.exp(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        # stage 1: values through their map
        @@load_v
        acc = acc * alpha[:, None] + tl.dot(p.to(@PDT@), v@DOTV@)
        m_i = m_new
    o = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    # stage 3: the output through its map, or this split's partial result
    @@store
"""

_COMBINE = """
@triton.jit
def attn_combine(@params@, ws_o, ws_m, ws_l, SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr,
                 BLOCK_DV: tl.constexpr):
    @@prologue
    pid = tl.program_id(0)
    mq = pid % @SQ@
    bh = pid // @SQ@
    h = bh % @HQ@
    b = bh // @HQ@
    sp = tl.arange(0, SPLITS_P2)
    sp_ok = sp < SPLITS
    dv = tl.arange(0, BLOCK_DV)
    base = pid * SPLITS
    # stage 1: the splits' partial results
    m = tl.load(ws_m + base + sp, mask=sp_ok, other=-float("inf"))
    l = tl.load(ws_l + base + sp, mask=sp_ok, other=0.0)
    part = tl.load(ws_o + (base + sp[:, None]) * BLOCK_DV + dv[None, :], mask=sp_ok[:, None], other=0.0)
    # stage 2: merge
    m_max = tl.max(m, 0)
    m_use = tl.where(m_max == -float("inf"), 0.0, m_max)
    w = tl.exp(m - m_use) * l
    w_sum = tl.sum(w, 0)
    o = tl.sum(part * w[:, None], 0) / tl.where(w_sum == 0.0, 1.0, w_sum)
    # stage 3: through the output map
    @@store
"""


@dataclass
class SplitKVPlan(PartsPlan):
    """Split-KV attention: the main kernel writes each split's partial output, max and sum to fp32 workspaces
    (allocated per run); the combine kernel merges them into the output, or (``fused``: one part) the main
    kernel's last program per group does.  A step's arguments are q, k, v (and mask) arguments, then the
    output's, then the KV length and (fused) the semaphores."""

    n_qkv: int = 0
    fused: bool = False

    def part_args(self, k: int, args, ws: list) -> list:
        n = self.n_qkv
        if self.fused:
            return list(args[:-2]) + ws + list(args[-2:])
        # the separate main kernel neither writes the output nor counts (a workspace fills the semaphore slot)
        return list(args[:n]) + ws + [args[-1], ws[0]] if k == 0 else list(args[n:-1]) + ws


_SHARED_SEMS: dict = {}


def _semaphores(n: int, device: torch.device) -> torch.Tensor:
    """``n`` zeroed int32 counters for a fused split-KV launch.  The last program of a group puts its counter
    back to zero, so they are reused by every run.  A recorded launch (a step of an executable) owns its own,
    so that two executables never share one; autotuning's unrecorded trials share one per size."""
    if recording():
        return torch.zeros(n, dtype=torch.int32, device=device)
    key = (n, str(device))
    if key not in _SHARED_SEMS:
        _SHARED_SEMS[key] = torch.zeros(n, dtype=torch.int32, device=device)
    return _SHARED_SEMS[key]


def _shares_kv(op: Operand, g: int) -> bool:
    """Whether ``op`` (over [B, H, S, D]) reads one element for the heads ``g*h .. g*h+g-1``."""
    return shares_heads(op.map, op.storage_strides, g)


_GROUPS: dict = {}


def kv_group(q: Operand, k: Operand, v: Operand, group: int | None = None) -> tuple[int, bool]:
    """(query heads per program, whether the KV operands are indexed by query head)."""
    key = (q.shape, k.signature(), v.signature(), group)
    if key not in _GROUPS:
        _GROUPS[key] = _kv_group(q, k, v, group)
    return _GROUPS[key]


def _kv_group(q: Operand, k: Operand, v: Operand, group: int | None) -> tuple[int, bool]:
    hq, hk = q.shape[1], k.shape[1]
    if hk != hq:
        if hq % hk or v.shape[1] != hk:
            raise ValueError(f"{hq} query heads cannot share {hk} KV heads")
        if group not in (None, hq // hk):
            raise ValueError(f"group {group} does not match {hq} query / {hk} KV heads")
        return hq // hk, False
    cands = [group] if group else [g for g in range(min(hq, 32), 1, -1) if hq % g == 0]
    for g in cands:
        if hq % g == 0 and _shares_kv(k, g) and _shares_kv(v, g):
            return g, True
    return 1, True


def _splits(n_prog: int, skv: int, block_n: int, sq: int, gpu: bool) -> int:
    blocks = -(-skv // block_n)
    if not gpu:
        return 2 if sq == 1 and blocks >= 2 else 1
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    if n_prog >= sms or blocks < 4:
        return 1
    return max(1, min(-(-2 * sms // n_prog), blocks // 2, 64))


def _fused_merge(splits: int, n_mblk: int, out_store: list[str]) -> list[str]:
    """The end of a fused split-KV program: count in on the group's semaphore; the last to arrive merges every
    split's partial result (read from L2, past L1) and stores through the output map, then resets the count.
    The barrier orders all of the program's partial stores before the (acq_rel, GPU-scope) count.  The splits'
    maxima and sums are read as one tile and weighed at once, so the loop over the partial outputs only
    accumulates: its loads do not wait on each other's results."""
    return ["tl.debug_barrier()",
            f"count = tl.atomic_add(sem_ptr + pid_bh * {n_mblk} + pid_m, 1)",
            f"if count == {splits - 1}:",
            f"    sp = tl.arange(0, {next_pow2(splits)})",
            f"    sp_ok = row_ok[:, None] & (sp[None, :] < {splits})",
            "    m_s = tl.load(ws_m + wbase[:, None] + sp[None, :], mask=sp_ok, other=-float('inf'),"
            " cache_modifier='.cg')",
            "    l_s = tl.load(ws_l + wbase[:, None] + sp[None, :], mask=sp_ok, other=0.0, cache_modifier='.cg')",
            "    m_t = tl.max(m_s, 1)",
            "    w_s = tl.exp(m_s - tl.where(m_t == -float('inf'), 0.0, m_t)[:, None]) * l_s",
            "    l_t = tl.sum(w_s, 1)",
            "    o_t = tl.zeros((ROWS, BLOCK_DV), tl.float32)",
            f"    for j in range(0, {splits}):",
            "        w_j = tl.sum(tl.where(sp[None, :] == j, w_s, 0.0), 1)",
            "        o_j = tl.load(ws_o + (wbase + j)[:, None] * BLOCK_DV + dv[None, :], mask=row_ok[:, None],",
            "                      other=0.0, cache_modifier='.cg')",
            "        o_t += o_j * w_j[:, None]",
            "    o = o_t / tl.where(l_t == 0.0, 1.0, l_t)[:, None]",
            *("    " + line for line in out_store),
            f"    tl.store(sem_ptr + pid_bh * {n_mblk} + pid_m, 0)"]


def attention_configs(sq: int, skv: int, rows: int, n_prog: int, gpu: bool,
                      num_splits: int | None = None) -> list[dict]:
    """The configurations the autotuner times: (BLOCK_N, warps, stages) tiles, each with the key splits that
    fill the GPU for ``n_prog`` programs per split (times a multiplier), or ``num_splits``; ``rows`` query rows
    per tile."""
    if gpu:  # (BLOCK_N, warps, stages, split multiplier)
        # fewer splits (0.5) with deeper pipelines: longer loops per program hide more of the load latency
        cands = [(64, 4, 2, 1), (128, 4, 2, 1), (32, 4, 3, 1), (64, 4, 3, 2), (128, 8, 3, 1), (32, 4, 4, 2),
                 (64, 4, 3, 0.5), (32, 4, 3, 0.5)] \
            if sq <= 16 else [(64, 4 if rows <= 64 else 8, 2, 1), (32, 4, 3, 1), (128, 8, 2, 1), (64, 8, 3, 1)]
    else:
        cands = [(16, 4, 1, 1)]
    configs: list[dict] = []
    for bn, w, st, mult in cands:
        bn = min(bn, max(16, next_pow2(skv)))
        sp = num_splits or max(1, min(round(_splits(n_prog, skv, bn, sq, gpu) * mult), -(-skv // bn)))
        cfg = {"BLOCK_N": bn, "num_warps": w, "num_stages": st, "splits": sp}
        if cfg not in configs:
            configs.append(cfg)
    if gpu and sq <= 16:   # each split configuration again with the combine fused into the main kernel
        configs += [dict(c, fused=True) for c in configs if c["splits"] > 1]
    return configs


def _whole(config: dict) -> dict:
    missing = {"BLOCK_N", "num_warps", "num_stages", "splits"} - set(config)
    if missing:
        raise ValueError(f"attention config lacks {sorted(missing)}")
    return dict(config)


def attention(q: Operand, k: Operand, v: Operand, out: Operand, *, scale: float | None = None,
              causal: bool = False, window: int | None = None, softcap: float | None = None,
              kv_len: int | torch.Tensor | None = None, group: int | None = None,
              num_splits: int | None = None, mask: Operand | None = None, config: dict | None = None) -> list[Plan]:
    """Scaled dot-product attention; see the module docstring.  Returns the plans launched.

    ``num_splits`` forces the number of key splits of every candidate configuration; ``config`` forces one
    whole configuration (``BLOCK_N``, ``num_warps``, ``num_stages``, ``splits``, optionally ``fused``), for tests
    and benches."""
    B, HQ, SQ, D = q.shape
    Bk, HK, SKV, Dk = k.shape
    DV = v.shape[-1]
    if Dk != D or tuple(v.shape[:3]) != (Bk, HK, SKV) or Bk != B or tuple(out.shape) != (B, HQ, SQ, DV):
        raise ValueError(f"attention shapes q {q.shape} k {k.shape} v {v.shape} out {out.shape}")
    if mask is not None:
        mask = mask.broadcast_to((B, HQ, SQ, SKV))
    G, by_qhead = kv_group(q, k, v, group)
    HG = HQ // G
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    gpu = not interpreting() and out.device.type == "cuda"
    GP = next_pow2(G)
    BLOCK_D, BLOCK_DV = max(16, next_pow2(D)), max(16, next_pow2(DV))
    if SQ <= 16:  # decode-shaped: every query row of the group in one tile
        BLOCK_MQ = next_pow2(SQ)
        target_rows = 16
    else:
        target_rows = 64 if (gpu and BLOCK_D > 64) or not gpu else 128
        BLOCK_MQ = max(1, min(next_pow2(SQ), target_rows // GP))
    ROWS = max(16, GP * BLOCK_MQ)
    n_mblk = -(-SQ // BLOCK_MQ)
    configs = attention_configs(SQ, SKV, ROWS, n_mblk * B * HG, gpu, num_splits) if config is None else [_whole(config)]
    if isinstance(kv_len, torch.Tensor):
        if kv_len.numel() not in (1, B):
            raise ValueError("kv_len tensor needs 1 or B elements")
        kvlen_arg, kvlen_code = kv_len, f"L = tl.load(kvlen_ptr + b * {1 if kv_len.numel() == B else 0}).to(tl.int32)"
    else:
        L = SKV if kv_len is None else int(kv_len)
        if not 0 <= L <= SKV:
            raise ValueError(f"kv_len {L} outside [0, {SKV}]")
        kvlen_arg, kvlen_code = 0, f"L = {L}"
    kvkind = "t%d" % kv_len.numel() if isinstance(kv_len, torch.Tensor) else repr(kv_len)
    opts = (scale, causal, window, softcap, kvkind, G, by_qhead)
    base_key = key_of("attention", q.signature(), k.signature(), v.signature(), out.signature(), opts,
                      mask.signature() if mask is not None else None)
    pdt = tl_dtype(v.dtype) if v.dtype.is_floating_point else "tl.float32"
    qdt = tl_dtype(q.dtype) if q.dtype == k.dtype and q.dtype.is_floating_point else "tl.float32"
    ieee = ', input_precision="ieee"' if gpu else ""
    if not gpu:  # Triton's interpreter multiplies bf16 tiles wrongly (3.9): feed it fp32
        pdt = qdt = "tl.float32"

    def build_main(cfg: dict) -> Plan:
        BN, SPL, fused = cfg["BLOCK_N"], cfg["splits"], cfg.get("fused", False) and cfg["splits"] > 1
        chunk = -(-(-(-SKV // SPL)) // BN) * BN
        ios = {"q": IO(q, "q"), "k": IO(k, "k"), "v": IO(v, "v")}
        if mask is not None:
            ios["am"] = IO(mask, "am")
        if SPL == 1 or fused:
            ios["out"] = IO(out, "out")
        kh = "kvh * %d" % G if by_qhead else "kvh"
        dmask = f"(d[None, :] < {D})" if BLOCK_D != D else None
        dvmask = f"(dv[None, :] < {DV})" if BLOCK_DV != DV else None
        qmask = " & ".join(x for x in ("row_ok[:, None]", dmask) if x)
        load_q = ios["q"].load("q", ["b", "qh[:, None]", "mq[:, None]", "d[None, :]"], shape="(ROWS, BLOCK_D)",
                               mask=qmask, block=[("b", 1), (f"kvh * {G}", G), ("pid_m * BLOCK_MQ", BLOCK_MQ),
                                                  ("0", BLOCK_D)], dtype=qdt)
        kv_block = [("b", 1), (kh, 1), ("n0", BN), ("0", BLOCK_D)]
        load_k = ios["k"].load("k", ["b", kh, "n[:, None]", "d[None, :]"], shape="(BLOCK_N, BLOCK_D)",
                               mask=" & ".join(x for x in ("n_ok[:, None]", dmask) if x), block=kv_block, dtype=qdt)
        load_v = ios["v"].load("v", ["b", kh, "n[:, None]", "dv[None, :]"], shape="(BLOCK_N, BLOCK_DV)",
                               mask=" & ".join(x for x in ("n_ok[:, None]", dvmask) if x),
                               block=[("b", 1), (kh, 1), ("n0", BN), ("0", BLOCK_DV)], dtype=pdt)
        bounds, mlines = [], []
        if causal:
            bounds.append(f"hi = tl.minimum(hi, pid_m * BLOCK_MQ + BLOCK_MQ + (L - {SQ}))")
            mlines.append("valid = valid & (n[None, :] <= q_pos[:, None])")
        if window is not None:
            bounds.append(f"lo = tl.maximum(lo, (tl.maximum(pid_m * BLOCK_MQ + (L - {SQ}) - {int(window) - 1}, 0)"
                          f" // BLOCK_N) * BLOCK_N)")
            mlines.append(f"valid = valid & ((q_pos[:, None] - n[None, :]) < {int(window)})")
        if mask is not None:   # SDPA's attn_mask for this tile of rows (query heads x positions) and keys
            mlines += ios["am"].load("am", ["b", "qh[:, None]", "mq[:, None]", "n[None, :]"], shape="(ROWS, BLOCK_N)",
                                   mask="row_ok[:, None] & n_ok[None, :]",
                                   dtype=None if mask.dtype == torch.bool else "tl.float32")
            mlines.append("valid = valid & (am != 0)" if mask.dtype == torch.bool else "s = s + am")
        soft = [f"s = vtc_softcap(s, {float(softcap)!r})"] if softcap else []
        omask = " & ".join(x for x in ("row_ok[:, None]", dvmask) if x)
        store = [] if SPL == 1 else [
            f"wbase = ((b * {HQ} + qh) * {SQ} + mq) * {SPL}",
            "tl.store(ws_o + (wbase + pid_s)[:, None] * BLOCK_DV + dv[None, :], o, mask=row_ok[:, None])",
            "tl.store(ws_m + wbase + pid_s, m_i, mask=row_ok)",
            "tl.store(ws_l + wbase + pid_s, l_i, mask=row_ok)"]
        if SPL == 1 or fused:
            out_store = ios["out"].store("o", ["b", "qh[:, None]", "mq[:, None]", "dv[None, :]"], mask=omask,
                                         block=[("b", 1), (f"kvh * {G}", G), ("pid_m * BLOCK_MQ", BLOCK_MQ),
                                                ("0", BLOCK_DV)])
            store += out_store if SPL == 1 else _fused_merge(SPL, n_mblk, out_store)
        params, prologue = [], []
        for io in ios.values():
            params += io.params()
            prologue += io.prologue()
        # causal: the longest row blocks (the last, which see the most keys) first, so that the short ones
        # fill the tail of the grid instead of leaving SMs idle behind a long one (FlashAttention 2's order)
        pidm = f"{n_mblk - 1} - tl.program_id(0)" if causal and n_mblk > 1 else "tl.program_id(0)"
        src = render(_MAIN, params=params, prologue=prologue, PIDM=pidm, HG=str(HG), G=str(G), SQ=str(SQ),
                     CHUNK=str(chunk), kvlen=[kvlen_code], bounds=bounds, load_q=load_q, load_k=load_k,
                     load_v=load_v, SCALE=repr(scale), softcap=soft, mask=mlines, PDT=pdt, store=store,
                     DOT=ieee if qdt == "tl.float32" else "", DOTV=ieee if pdt == "tl.float32" else "")
        kern = compile_source("attn_kernel", src)
        constexprs = {"BLOCK_N": BN, "BLOCK_MQ": BLOCK_MQ, "ROWS": ROWS, "BLOCK_D": BLOCK_D, "BLOCK_DV": BLOCK_DV}
        return Plan("attention", kern, (n_mblk, B * HG, SPL), constexprs,
                    {"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]}, src,
                    {k_: io.modes for k_, io in ios.items()}, cfg)

    def build_combine(cfg: dict) -> Plan:
        SPL = cfg["splits"]
        io = IO(out, "out")
        dvm = f"(dv < {DV})" if BLOCK_DV != DV else None
        store = io.store("o", ["b", "h", "mq", "dv"], mask=dvm, block=[("b", 1), ("h", 1), ("mq", 1), ("0", BLOCK_DV)])
        src = render(_COMBINE, params=io.params(), prologue=io.prologue(), SQ=str(SQ), HQ=str(HQ), store=store)
        kern = compile_source("attn_combine", src)
        return Plan("attention_combine", kern, (B * HQ * SQ,),
                    {"SPLITS": SPL, "SPLITS_P2": next_pow2(SPL), "BLOCK_DV": BLOCK_DV}, {"num_warps": 4}, src,
                    {"out": io.modes}, cfg)

    dev = out.device

    def plans(cfg: dict) -> list[Plan]:
        ck = key_of(base_key, sorted(cfg.items()))
        ps = [plan_cache(ck + ":main", lambda: build_main(cfg))]
        if cfg["splits"] > 1 and not cfg.get("fused"):
            ps.append(plan_cache(ck + ":combine", lambda: build_combine(cfg)))
        return ps

    qkv_args = q.kernel_args() + k.kernel_args() + v.kernel_args() + (mask.kernel_args() if mask is not None else [])

    def launch(cfg: dict) -> list[Plan]:
        ps = plans(cfg)
        SPL = cfg["splits"]
        if SPL == 1:
            dummy = torch.empty(1, device=dev, dtype=torch.float32)
            ps[0].launch(qkv_args + out.kernel_args() + [dummy, dummy, dummy, kvlen_arg, dummy])
            return ps
        rows = B * HQ * SQ * SPL
        fused = bool(cfg.get("fused"))
        both = plan_cache(key_of(base_key, sorted(cfg.items()), "split"), lambda: SplitKVPlan(
            "attention", None, ps[0].grid, source="".join(p.source for p in ps), modes=ps[0].modes, config=cfg,
            parts=ps, workspaces=(rows * BLOCK_DV, rows, rows), n_qkv=len(qkv_args), fused=fused))
        sems = [_semaphores(B * HG * n_mblk, dev)] if fused else []
        both.launch(qkv_args + out.kernel_args() + [kvlen_arg] + sems)
        return [both]

    cfg = autotune(base_key, configs, lambda c: (lambda: launch(c)), written=out.tensors.values(), device=dev)
    return launch(cfg)

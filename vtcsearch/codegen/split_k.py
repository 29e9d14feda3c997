"""Which split-K configurations a GEMM may run: one decision for the autotuner and the cost models.

Pure Python (no Triton import), so the analytical model can ask it on a machine where the kernels run
through Triton's interpreter, which must be switched on before :mod:`vtcsearch.codegen.kernels` loads.
"""
from __future__ import annotations

__all__ = ["decode_split_configs", "split_configs"]


def next_pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def split_configs(M: int, N: int, K: int, B: int = 1, sms: int = 132) -> list[dict]:
    """Split-K configurations for an output with too few tiles to fill ``sms`` SMs and a long K.

    The one place that decides when and how a GEMM is split: the autotuner times these next to the
    tiled configurations, and the analytical model (:mod:`cost_models.analytical`) prices the same
    list, so a CPU search and a GPU run consider the same kernels.  Empty when splitting cannot pay
    (enough tiles already, or a short K loop).  For M <= 16 (decode) the weights are streamed once
    whatever the tiling: wide BLOCK_N / BLOCK_K tiles with enough splits that the grid has at least
    ``2 * sms`` programs (:func:`decode_split_configs`)."""
    out = []
    for bm, bn, bk, w, st in ((16, 32, 128, 4, 3), (32, 32, 64, 4, 4), (16, 16, 256, 2, 3)):
        bm, bn, bk = min(bm, max(16, next_pow2(M))), min(bn, max(16, next_pow2(N))), min(bk, max(16, next_pow2(K)))
        tiles = -(-M // bm) * -(-N // bn) * B
        if tiles * 2 > sms or K < 8 * bk:
            continue
        for split in (2, 4, 8, 16, 32):
            if tiles * split > 4 * sms or K // split < 2 * bk:
                break
            out.append({"BM": bm, "BN": bn, "BK": bk, "GROUP_M": 1, "SPLIT": split, "num_warps": w,
                        "num_stages": st})
    if M <= 16:
        seen = {(c["BM"], c["BN"], c["BK"], c["SPLIT"]) for c in out}
        out += [c for c in decode_split_configs(M, N, K, B, sms) if (c["BM"], c["BN"], c["BK"], c["SPLIT"]) not in seen]
    return out


def decode_split_configs(M: int, N: int, K: int, B: int = 1, sms: int = 132) -> list[dict]:
    """Split-K for weight streaming (M <= 16): BLOCK_M 16, BLOCK_N 32-128 and BLOCK_K 128-256 (long
    vectorised loads of the weight rows), and the fewest power-of-two splits that give the grid
    ``>= 2 * sms`` programs (and that split once more), each split keeping at least one BK step."""
    if M > 16:
        return []
    out = []
    for bn, bk, w, st in ((64, 256, 4, 3), (128, 128, 4, 4), (32, 256, 4, 4), (128, 256, 8, 2)):
        bn, bk = min(bn, max(16, next_pow2(N))), min(bk, max(16, next_pow2(K)))
        tiles = -(-N // bn) * B
        if tiles >= 2 * sms:        # the grid fills the SMs unsplit (an LM head): splitting only adds traffic
            continue
        split = 2
        while tiles * split < 2 * sms and K // (2 * split) >= bk:
            split *= 2
        for s in (split, 2 * split):
            if K // s >= bk and K >= 4 * bk:
                out.append({"BM": 16, "BN": bn, "BK": bk, "GROUP_M": 1, "SPLIT": s, "num_warps": w,
                            "num_stages": st})
    return out

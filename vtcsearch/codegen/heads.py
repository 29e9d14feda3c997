"""Which query heads of an attention read the same KV element: one question, asked by two layers.

The attention template (:mod:`vtcsearch.codegen.kernels.attention`) stacks the query heads that share a KV
element into one tile and loads it once; the analytical model (:mod:`cost_models.analytical`) asks the same
question of a map to price those repeats as loaded once.  Kept apart from the kernels so that asking it does not
load Triton (the runner switches Triton's interpreter on before any kernel module loads).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

from ..core.expr import simplify, var

if TYPE_CHECKING:
    from ..core.mapping import IndexMap

__all__ = ["head_group", "shares_heads"]


def shares_heads(m: "IndexMap", strides: Callable[[str], Sequence[int]], g: int, dim: int = 1) -> bool:
    """Whether map ``m`` (over [B, H, S, D]; ``strides``: a target's storage strides) reads one element for the
    heads ``g*h .. g*h+g-1`` (of dim ``dim``: 0 for a [B*H, S, D] operand): then one program loads it once for
    its ``g`` query heads (the analytical model asks too, to price those reads as loaded once)."""
    v = f"i{dim}"
    for p in m.pieces:
        lo, hi = p.region[dim]
        if lo % g or hi % g:
            return False
        ranges = {f"i{k}": (a, b - 1) for k, (a, b) in enumerate(p.region)}
        ranges[v] = (lo // g, hi // g - 1)
        ranges["__r"] = (0, g - 1)
        env = {v: var(v) * g + var("__r")}
        exprs = [c for c, _, _ in p.conds]
        if p.target is not None:
            exprs.append(p.offset(strides(p.target)))
        for e in exprs:
            if "__r" in simplify(e.subs(env), ranges, divisors=True).free_vars():
                return False
    return True


def head_group(m: "IndexMap", strides: Callable[[str], Sequence[int]]) -> int:
    """The most query heads (at most 32) that read each element of ``m`` (over [B, H, S, D], or [B*H, S, D] as
    a decomposed attention's batched GEMMs see it) together: what the template's ``kv_group`` finds for a KV
    operand indexed by query head."""
    dim = 1 if len(m.shape) == 4 else 0
    h = m.shape[dim] if len(m.shape) in (3, 4) else 1
    return next((g for g in range(min(h, 32), 1, -1) if h % g == 0 and shares_heads(m, strides, g, dim)), 1)

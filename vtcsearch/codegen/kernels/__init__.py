"""Triton kernel templates with virtual-tensor I/O.

Every template takes :class:`Operand` s — a resolved :class:`~vtcsearch.core.mapping.IndexMap`
plus the physical storages it lands in (and runtime scalars / index tensors) — and
launches a kernel whose stage 1 (loads) and stage 3 (stores) go through the maps,
via the one I/O emitter :mod:`vtcsearch.codegen.kernels.emit`; stage 2 (the math) is the usual
kernel.  A physical tensor is ``Operand.dense(t)``; views compose maps
(``op.permute``, ``op.transpose``, ``op.reshape``, ``op.broadcast_to``, ``op.narrow``,
``op.sub``, ``Operand.cat``, ``op.view(shape, index_exprs, syms=, tables=)``).

Entry points (all write into ``out`` and return the launched :class:`~codecache.Plan` (s),
whose ``source``, ``config`` and ``modes`` — the I/O path each operand took:
``single`` / ``block`` (one scalar piece branch per block) / ``element`` (per-element
predicates) — are there for inspection):

``gemm(a, b, out, epilogue=None)``
    ``out = epilogue(a @ b)``; ``a`` [B?, M, K], ``b`` [B?, K, N], ``out`` [B?, M, N].
    ``Epilogue(scale=1.0, bias=None, activation=None, rope=None, residual=None, lines=(),
    expr=None, operands=())`` with ``Rope(cos, sin, head_dim, cols=None)`` (interleaved
    pairs, cos/sin operands over [M, head_dim // 2]); ``lines``/``expr``/``operands`` are a
    general elementwise epilogue (a fused region from :mod:`vtcsearch.codegen.elementwise`).
``attention(q, k, v, out, *, scale=None, causal=False, window=None, softcap=None, kv_len=None, group=None, num_splits=None)``
    ``q`` [B, Hq, Sq, D], ``k``/``v`` [B, Hk, Skv, D] (Hk | Hq, or Hk == Hq with a
    repeat_kv map whose group is detected), ``out`` [B, Hq, Sq, Dv].  FlashDecoding
    split-K plus a combine kernel for few query rows.
``conv2d(x, w, out, *, stride=1, padding=0, dilation=1, groups=1, epilogue=None, algo=None)``
    ``x`` [N, Cin, H, W], ``w`` [Cout, Cin/groups, KH, KW], ``out`` [N, Cout, OH, OW]: an
    implicit GEMM per group (a group grid axis), or a direct [channels, pixels] kernel for
    depthwise / few channels per group.  ``ConvEpilogue(scale=None, shift=None,
    activation=None, residual=None, lines=(), expr=None, operands=())``:
    ``y = act(acc * scale + shift) + residual`` with per-channel ``scale``/``shift``
    (bias, folded BatchNorm), then the general epilogue as in ``Epilogue``.
``max_pool2d(x, out, kernel, stride=None, padding=0, dilation=1)`` (bit-exact),
``avg_pool2d(x, out, kernel, stride=None, padding=0, count_include_pad=True, divisor_override=None)``,
``global_avg_pool2d(x, out)``, ``upsample_nearest2d(x, out, scale)``
    NCHW window ops over operands; nearest upsampling is a ``copy`` through a ``// scale`` map.
``pointwise(fn, inputs, out, prelude=())``
    ``fn``: a Triton expression over ``x0, x1, ...`` (fp32; helpers ``vtc_silu``,
    ``vtc_gelu``, ``vtc_gelu_tanh``, ``vtc_tanh``, ``vtc_sigmoid``, ``vtc_relu``, ``vtc_hardswish``) or a
    list of them for several outputs; inputs broadcast to the output shape; numbers
    are constants.
``rmsnorm(x, weight, out, eps=1e-6, *, weight_offset=0.0, residual=None, residual_out=None)``,
``layernorm(x, weight, bias, out, eps=1e-5)``, ``softmax(x, out, *, scale=1.0)``
    over the last dim, fp32 statistics.
``copy(dst, src)``
    the residual copy of a data movement op: ``dst[i] = src[i]`` over ``dst``'s
    coverage, dtype kept (bit-exact); ``src`` may be a number (a fill).
    ``copy_pieces(domain, pairs, tensors, syms=None, tables=None)`` runs a
    :class:`~vtcsearch.core.strategy.ResidualCopy`'s ``(dst piece, src piece)`` pairs.

Modules by job: :mod:`.operand` (operand views), :mod:`.emit` (I/O code emission, templates, tilings),
:mod:`.codecache` (source cache, compilation, launch plans), :mod:`.autotune` (tile configurations).

Tile configurations: on a GPU a few per template are timed once per key (operand
signatures + options) and the best cached (``VTC_AUTOTUNE=0`` disables this and
takes the first); in the interpreter (``TRITON_INTERPRET=1``, CPU tensors) one small
config.  Generated kernel modules are written to ``$VTC_KERNEL_CACHE`` (default: a
``vtcsearch-kernels-<uid>`` folder in the temp dir).
"""
from .attention import attention, kv_group
from .conv import ConvEpilogue, conv2d
from .copy import copy, copy_pieces
from .gemm import Epilogue, Rope, RowNorm, gemm
from .pointwise import pointwise
from .pool import avg_pool2d, global_avg_pool2d, max_pool2d, upsample_nearest2d
from .reduction import layernorm, rmsnorm, softmax
from .autotune import clear_tuning
from .codecache import Plan, clear_plans, interpreting
from .emit import IO
from .operand import Operand

__all__ = [
    "Operand", "IO", "Plan", "gemm", "Epilogue", "Rope", "RowNorm", "attention", "kv_group", "pointwise",
    "rmsnorm", "layernorm", "softmax", "copy", "copy_pieces", "clear_caches", "interpreting",
    "conv2d", "ConvEpilogue", "max_pool2d", "avg_pool2d", "global_avg_pool2d", "upsample_nearest2d",
]


def clear_caches() -> None:
    """Forget cached launch plans and tuning decisions (tests; a changed environment)."""
    clear_plans()
    clear_tuning()

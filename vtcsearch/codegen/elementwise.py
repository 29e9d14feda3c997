"""Elementwise regions as Triton code: pointwise ATen ops and the views between them, in one expression DAG.

An elementwise kernel iterates over one index space (its output's shape) and
computes every output element from its inputs.  Pulling an index back through
the region is exactly composing mapping functions: a pointwise op reads its
inputs at the same (broadcast) index, an absorbed movement op reads its inputs
through its registry map, piece by piece (a ``stack`` reads its first input
where ``i4 == 0`` and its second where ``i4 == 1``).  What reaches a tensor from
outside the region is a *leaf*: that tensor read at an index expression of the
iteration variables, which a kernel loads through the tensor's own (possibly
virtual) map.

Values are fp32 in registers; after every op whose result is fp16/bf16 the
value is rounded to that type, as eager PyTorch stores it, so a fused region
gives eager's bits wherever Triton's arithmetic is correctly rounded.

:func:`compile_region` returns the code as text with ``{iK}`` placeholders for
the index of iteration dim ``K`` and ``x<n>`` for leaf ``n``; the templates
(:func:`vtcsearch.codegen.kernels.pointwise`, the GEMM epilogue) substitute their own names.
Adding an op is one entry in :data:`POINTWISE` (and, for arguments that do not
broadcast along the trailing dims, such as BatchNorm's per-channel parameters,
one in :data:`ARG_DIMS`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

import torch

from ..core.expr import Expr, TritonNames, bounds, simplify, to_triton
from .kernels.emit import const_code, downcast
from ..core.mapping import index_vars
from ..core.ops import reshape_index

if TYPE_CHECKING:
    from ..core.graph import TensorGraph

aten = torch.ops.aten


class Unsupported(NotImplementedError):
    """This region cannot be one Triton expression (the caller falls back to ordinary kernels)."""


# ---------------------------------------------------------------------------
# the op table: ATen pointwise op -> Triton expression over argument codes
# ---------------------------------------------------------------------------

Code = str


def _c(v: Any) -> Code:
    if isinstance(v, bool):
        return "1.0" if v else "0.0"
    if isinstance(v, (int, float)):
        return const_code(v)            # a float constant, inf and nan included
    return v


def _alpha(args: list, kw: dict) -> float:
    return float(kw.get("alpha", args[2] if len(args) > 2 else 1))


def _pow(args: list, kw: dict) -> Code:
    x, p = args[0], args[1]
    if isinstance(p, (int, float)):
        if p == 2:
            return f"({x} * {x})"
        if p == 3:
            return f"({x} * {x} * {x})"
        if p == 1:
            return x
        if p == 0.5:
            return f"tl.sqrt({x})"
        if p == -1:
            return f"(1.0 / {x})"
    raise Unsupported(f"pow with exponent {p!r}")


def _gelu(args: list, kw: dict) -> Code:
    approx = kw.get("approximate", args[1] if len(args) > 1 else "none")
    return f"vtc_gelu_tanh({args[0]})" if approx == "tanh" else f"vtc_gelu({args[0]})"


def _clamp(args: list, kw: dict) -> Code:
    x = args[0]
    lo = kw.get("min", args[1] if len(args) > 1 else None)
    hi = kw.get("max", args[2] if len(args) > 2 else None)
    if lo is not None:
        x = f"tl.maximum({x}, {_c(lo)})"
    if hi is not None:
        x = f"tl.minimum({x}, {_c(hi)})"
    return x


def _bool(x: Code) -> Code:
    return f"({x} != 0)"


def _batch_norm(args: list, kw: dict) -> Code:
    """Inference BatchNorm, ``(x - mean) * rsqrt(var + eps) * weight + bias`` (weight, bias optional)."""
    x, w, b, mean, var = args[:5]
    eps = kw.get("eps", args[6] if len(args) > 6 else 1e-5)
    y = f"(({x} - {mean}) * tl.rsqrt({var} + {_c(eps)}))"
    if w is not None:
        y = f"({y} * {w})"
    return f"({y} + {b})" if b is not None else y


POINTWISE: dict[Any, Callable[[list, dict], Code]] = {
    aten.add.Tensor: lambda a, k: f"({a[0]} + {_c(_alpha(a, k))} * {a[1]})" if _alpha(a, k) != 1 else f"({a[0]} + {a[1]})",
    aten.add.Scalar: lambda a, k: f"({a[0]} + {_c(_alpha(a, k) * float(a[1]))})",
    aten.sub.Tensor: lambda a, k: f"({a[0]} - {_c(_alpha(a, k))} * {a[1]})" if _alpha(a, k) != 1 else f"({a[0]} - {a[1]})",
    aten.sub.Scalar: lambda a, k: f"({a[0]} - {_c(_alpha(a, k) * float(a[1]))})",
    aten.rsub.Scalar: lambda a, k: f"({_c(a[1])} - {_c(_alpha(a, k))} * {a[0]})",
    aten.mul.Tensor: lambda a, k: f"({a[0]} * {a[1]})",
    aten.mul.Scalar: lambda a, k: f"({a[0]} * {_c(a[1])})",
    aten.div.Tensor: lambda a, k: f"({a[0]} / {a[1]})",
    aten.div.Scalar: lambda a, k: f"({a[0]} / {_c(a[1])})",
    aten.neg.default: lambda a, k: f"(-{a[0]})",
    aten.exp.default: lambda a, k: f"tl.exp({a[0]})",
    aten.log.default: lambda a, k: f"tl.log({a[0]})",
    aten.sqrt.default: lambda a, k: f"tl.sqrt({a[0]})",
    aten.rsqrt.default: lambda a, k: f"tl.rsqrt({a[0]})",
    aten.reciprocal.default: lambda a, k: f"(1.0 / {a[0]})",
    aten.abs.default: lambda a, k: f"tl.abs({a[0]})",
    aten.erf.default: lambda a, k: f"tl.erf({a[0]})",
    aten.sin.default: lambda a, k: f"tl.sin({a[0]})",
    aten.cos.default: lambda a, k: f"tl.cos({a[0]})",
    aten.pow.Tensor_Scalar: _pow,
    aten.sigmoid.default: lambda a, k: f"vtc_sigmoid({a[0]})",
    aten.tanh.default: lambda a, k: f"vtc_tanh({a[0]})",
    aten.relu.default: lambda a, k: f"vtc_relu({a[0]})",
    aten.silu.default: lambda a, k: f"vtc_silu({a[0]})",
    aten.gelu.default: _gelu,
    aten.hardswish.default: lambda a, k: f"({a[0]} * tl.minimum(tl.maximum({a[0]} + 3.0, 0.0), 6.0) / 6.0)",
    aten.hardsigmoid.default: lambda a, k: f"(tl.minimum(tl.maximum({a[0]} + 3.0, 0.0), 6.0) / 6.0)",
    aten.leaky_relu.default: lambda a, k: f"tl.where({a[0]} > 0, {a[0]}, {a[0]} * {_c(a[1] if len(a) > 1 else 0.01)})",
    aten.clamp.default: _clamp,
    aten.hardtanh.default: lambda a, k: _clamp([a[0], a[1] if len(a) > 1 else -1.0, a[2] if len(a) > 2 else 1.0],
                                             {"min": k.get("min_val"), "max": k.get("max_val")} if k else {}),
    aten.clamp_min.default: lambda a, k: f"tl.maximum({a[0]}, {_c(a[1])})",
    aten.clamp_max.default: lambda a, k: f"tl.minimum({a[0]}, {_c(a[1])})",
    aten.maximum.default: lambda a, k: f"tl.maximum({a[0]}, {a[1]})",
    aten.minimum.default: lambda a, k: f"tl.minimum({a[0]}, {a[1]})",
    aten.where.self: lambda a, k: f"tl.where({_bool(a[0])}, {a[1]}, {a[2]})",
    aten.eq.Tensor: lambda a, k: f"({a[0]} == {a[1]})", aten.eq.Scalar: lambda a, k: f"({a[0]} == {_c(a[1])})",
    aten.ne.Tensor: lambda a, k: f"({a[0]} != {a[1]})", aten.ne.Scalar: lambda a, k: f"({a[0]} != {_c(a[1])})",
    aten.lt.Tensor: lambda a, k: f"({a[0]} < {a[1]})", aten.lt.Scalar: lambda a, k: f"({a[0]} < {_c(a[1])})",
    aten.le.Tensor: lambda a, k: f"({a[0]} <= {a[1]})", aten.le.Scalar: lambda a, k: f"({a[0]} <= {_c(a[1])})",
    aten.gt.Tensor: lambda a, k: f"({a[0]} > {a[1]})", aten.gt.Scalar: lambda a, k: f"({a[0]} > {_c(a[1])})",
    aten.ge.Tensor: lambda a, k: f"({a[0]} >= {a[1]})", aten.ge.Scalar: lambda a, k: f"({a[0]} >= {_c(a[1])})",
    aten.logical_not.default: lambda a, k: f"({a[0]} == 0)",
    aten._to_copy.default: lambda a, k: a[0],
    aten._native_batch_norm_legit_no_training.default: _batch_norm,
}

# Tensor arguments that do not broadcast NumPy-style (trailing dims aligned): op -> {argument
# position: the output dim each of the argument's dims runs along}.  BatchNorm's [C] parameters
# run along dim 1 (channels) of an [N, C, *] input.
ARG_DIMS: dict[Any, dict[int, tuple[int, ...]]] = {
    aten._native_batch_norm_legit_no_training.default: {k: (1,) for k in (1, 2, 3, 4)},
}

_FLOATS = {torch.float32: None, torch.float64: None, torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16"}


def round_to(dtype: torch.dtype, code: Code) -> Code:
    """The value as eager stores it in ``dtype`` (kept in fp32 registers; bools as 0/1)."""
    if dtype == torch.bool:
        return f"({code}).to(tl.float32)"
    if dtype not in _FLOATS:
        raise Unsupported(f"{dtype} values in an elementwise region")
    low = _FLOATS[dtype]
    return f"{downcast(f'({code})', low)}.to(tl.float32)" if low else code


# ---------------------------------------------------------------------------
# the region compiler
# ---------------------------------------------------------------------------

@dataclass
class Leaf:
    """Tensor ``tensor`` (from outside the region) read at ``index`` (exprs of the iteration vars)."""

    tensor: str
    index: tuple[Expr, ...]


@dataclass
class RegionCode:
    """One elementwise region as code: ``lines`` set temporaries, ``results[j]`` is output ``j``."""

    shape: tuple[int, ...]
    leaves: list[Leaf]
    lines: list[str]
    outputs: list[tuple[str, tuple[Expr, ...]]]   # (tensor, its index over the iteration space)
    results: list[Code]
    special: dict[str, str] = field(default_factory=dict)   # leaf tensor -> fixed name (the GEMM accumulator)


class _Compiler:
    def __init__(self, g: "TensorGraph", ops: Sequence[str], shape: tuple[int, ...], prefix: str,
                 special: dict[str, str]):
        self.g, self.shape, self.prefix, self.special = g, tuple(shape), prefix, special
        self.members = set(ops)
        self.vars = index_vars(len(shape))
        self.ranges = {f"i{k}": (0, s - 1) for k, s in enumerate(shape)}
        self.names = TritonNames({f"i{k}": "{i%d}" % k for k in range(len(shape))}, {}, {})
        self.leaves: list[Leaf] = []
        self._leaf_ids: dict[tuple, int] = {}
        self.lines: list[str] = []
        self._memo: dict[tuple, Code] = {}

    def tmp(self, code: Code) -> Code:
        name = f"{self.prefix}{len(self.lines)}"
        self.lines.append(f"{name} = {code}")
        return name

    def simplify(self, idx: Iterable[Expr]) -> tuple[Expr, ...]:
        return tuple(simplify(Expr.lift(e), self.ranges) for e in idx)

    def value(self, t: str, idx: tuple[Expr, ...]) -> Code:
        idx = self.simplify(idx)
        key = (t, tuple(repr(e) for e in idx))
        if key in self._memo:
            return self._memo[key]
        info = self.g.tensors[t]
        p = info.producer
        if p is None or p not in self.members:
            code = self.leaf(t, idx)
        else:
            op = self.g.ops[p]
            code = self.movement(op, t, idx) if op.kind == "movement" else self.pointwise(op, t, idx)
        self._memo[key] = code
        return code

    def leaf(self, t: str, idx: tuple[Expr, ...]) -> Code:
        if t in self.special:
            here = self.simplify(self.vars)   # a size-1 dim's variable is 0
            if len(idx) != len(here) or any(repr(e) != repr(v) for e, v in zip(idx, here)):
                raise Unsupported(f"{t} is read at {idx}, not where the kernel computes it")
            return self.special[t]
        info = self.g.tensors[t]
        if info.dtype not in _FLOATS:
            raise Unsupported(f"{t} is {info.dtype}")
        key = (t, tuple(repr(e) for e in idx))
        if key not in self._leaf_ids:
            self._leaf_ids[key] = len(self.leaves)
            self.leaves.append(Leaf(t, idx))
        return f"x{self._leaf_ids[key]}"

    def pointwise(self, op, t: str, idx: tuple[Expr, ...]) -> Code:
        node = op.node
        fn = POINTWISE.get(node.target)
        if fn is None:
            raise Unsupported(f"no Triton form for {op.target_name}")
        if node.target is aten._to_copy.default and set(node.kwargs) - {"dtype", "layout", "device",
                                                                        "memory_format", "non_blocking"}:
            raise Unsupported(f"{op.name}: {dict(node.kwargs)}")
        if op.outputs.index(t) != 0:
            raise Unsupported(f"{op.name}: only the first output of a multi-output op is elementwise")
        out_shape = self.g.tensors[t].shape
        dims_of = ARG_DIMS.get(node.target, {})

        def arg(a: Any, pos: int | None = None) -> Any:
            if isinstance(a, torch.fx.Node):
                s = self.g.tensors[a.name].shape
                off = len(out_shape) - len(s)
                dims = dims_of.get(pos, tuple(range(off, len(out_shape))))
                if len(dims) != len(s):
                    raise Unsupported(f"{op.name}: argument {pos} has shape {s}")
                sub = tuple(idx[d] if s[k] == out_shape[d] else Expr() for k, d in enumerate(dims))
                return self.value(a.name, sub)
            if isinstance(a, (list, tuple)):
                raise Unsupported(f"{op.name}: list argument")
            if isinstance(a, float) and not math.isfinite(a):
                return _c(a)
            return a

        args = [arg(a, k) for k, a in enumerate(node.args)]
        kwargs = {k: arg(v) for k, v in node.kwargs.items() if k not in ("dtype", "layout", "device",
                                                                          "memory_format", "non_blocking")}
        return self.tmp(round_to(self.g.tensors[t].dtype, fn(args, kwargs)))

    def movement(self, op, t: str, idx: tuple[Expr, ...]) -> Code:
        j = op.outputs.index(t)
        m = op.movement.outputs[j]
        env = {f"i{k}": e for k, e in enumerate(idx)}
        code: Code | None = None
        for p in reversed(m.pieces):     # the first piece ends up outermost
            preds = []
            for k, (lo, hi) in enumerate(p.region):
                preds.append((idx[k], lo, hi))
            for ce, lo, hi in p.conds:
                preds.append((ce.subs(env), lo, hi))
            pred = self.predicate(preds)
            if pred is False:
                continue
            if p.target is None:
                val = _c(p.fill)
            else:
                src = op.inputs[int(p.target[2:])]
                val = self.value(src, tuple(e.subs(env) for e in p.index))
            code = val if (pred is True or code is None) else self.tmp(f"tl.where({pred}, {val}, {code})")
        if code is None:
            raise Unsupported(f"{op.name}: no piece covers the index {idx}")
        return code

    def predicate(self, preds: list[tuple[Expr, int, int]]) -> Code | bool:
        parts = []
        for e, lo, hi in preds:
            e = simplify(e, self.ranges)
            blo, bhi = bounds(e, self.ranges)
            if bhi < lo or blo >= hi:
                return False
            c = to_triton(e, self.names)
            if blo < lo:
                parts.append(f"({c} >= {lo})")
            if bhi >= hi:
                parts.append(f"({c} < {hi})")
        return " & ".join(parts) if parts else True


def compile_region(g: "TensorGraph", ops: Sequence[str], outputs: Sequence[str], *, prefix: str = "r",
                   special: dict[str, str] | None = None, shape: Sequence[int] | None = None) -> RegionCode:
    """Code computing ``outputs`` (tensors of ``ops``, all of one size) over ``shape`` (default: the first's).

    ``special`` names leaf tensors available as a variable at the iteration index
    (a GEMM epilogue's accumulator); reading one elsewhere raises :class:`Unsupported`.
    """
    shape = tuple(shape or g.tensors[outputs[0]].shape)
    c = _Compiler(g, ops, shape, prefix, dict(special or {}))
    outs, results = [], []
    for t in outputs:
        ts = g.tensors[t].shape
        if math.prod(ts) != math.prod(shape):
            raise Unsupported(f"outputs of different sizes: {ts} and {shape}")
        idx = tuple(c.vars) if tuple(ts) == shape else tuple(reshape_index(shape, ts, c.vars))
        results.append(c.value(t, c.simplify(idx)))
        outs.append((t, c.simplify(idx)))
    return RegionCode(shape, c.leaves, c.lines, outs, results, dict(special or {}))

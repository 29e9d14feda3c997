"""The data movement op registry: one decorated function per op.

A data movement op only moves bytes, so it is fully described by where each
output element comes from.  An entry maps one ATen call to a :class:`Movement`:

* ``outputs[j]`` — an :class:`IndexMap` over output ``j`` into the inputs
  (targets ``"in0"``, ``"in1"``, ...; constant pieces for padding): ``out[i] =
  in_k[f(i)]``.  This gives the *output virtual over input* VTOG edges.
* ``updates`` — scatter-form writes applied after ``outputs`` (ScatterND and
  friends): source input ``k`` lands in output ``j`` through a map over the source.
* ``inverse`` — maps over an input into an output (``"out{j}"``): the *input
  virtual over output* edges, where the op is invertible on that input.
* ``inplace`` — (output, input) pairs where the output may take over the input's
  storage (a KV-cache update done in place).

Profitability (Type I / partially contiguous / Type II) is computed from the
maps by :mod:`vtcsearch.core.vtog`, so an entry states semantics only.  Adding an op
is one function here plus a test; solvers and kernels never change.
A rule returns ``None`` when a particular call is not pure data movement (a
dtype-changing copy, an accumulating index_put): the op is then compute.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable, Sequence

import torch

from .expr import Expr, lookup
from .mapping import IndexMap, Piece, contiguous_strides, full_region, index_vars, reshape_index

aten = torch.ops.aten


@dataclass
class OpCall:
    """One call of an ATen op, as the rules see it: normalized arguments and shapes."""

    target: Any
    params: dict[str, Any]                 # schema argument name -> value (tensors as TensorArg)
    inputs: list[tuple[int, ...]]          # shapes of the tensor inputs, in order
    outputs: list[tuple[int, ...]]         # shapes of the outputs
    in_dtypes: list[torch.dtype] = field(default_factory=list)
    out_dtypes: list[torch.dtype] = field(default_factory=list)

    def __getitem__(self, name: str) -> Any:
        return self.params[name]

    def get(self, name: str, default: Any = None) -> Any:
        v = self.params.get(name, default)
        return default if v is None else v


@dataclass(frozen=True)
class TensorArg:
    """A tensor argument: its position among the call's tensor inputs."""

    index: int


@dataclass
class Update:
    output: int
    source: int
    map: IndexMap   # over the source's index space into "out{output}"


@dataclass
class Movement:
    outputs: list[IndexMap]
    updates: list[Update] = field(default_factory=list)
    inverse: list[tuple[int, int, IndexMap]] = field(default_factory=list)
    inplace: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class MovementOp:
    name: str                      # the registry's name of the op
    onnx: str                      # the ONNX operator it corresponds to
    aten: tuple                    # ATen overloads it covers
    rule: Callable[[OpCall], Movement | None]
    doc: str = ""


REGISTRY: dict[str, MovementOp] = {}
_BY_TARGET: dict[Any, MovementOp] = {}


def register(onnx: str, *targets) -> Callable:
    """Decorator: register ``fn(call) -> Movement | None`` for the given ATen overloads."""

    def deco(fn: Callable[[OpCall], Movement | None]) -> Callable:
        resolved = tuple(t for t in (_resolve(t) for t in targets) if t is not None)
        op = MovementOp(fn.__name__, onnx, resolved, fn, (fn.__doc__ or "").strip())
        if op.name in REGISTRY:
            raise ValueError(f"movement op {op.name!r} registered twice")
        REGISTRY[op.name] = op
        for t in resolved:
            _BY_TARGET[t] = op
        return fn

    return deco


def _resolve(path: str):
    """'view.default' -> torch.ops.aten.view.default, or None if this torch lacks it."""
    packet, _, overload = path.partition(".")
    try:
        return getattr(getattr(aten, packet), overload or "default")
    except (AttributeError, RuntimeError):
        return None


def lookup_op(target: Any) -> MovementOp | None:
    return _BY_TARGET.get(target)


def onnx_coverage() -> dict[str, list[str]]:
    """ONNX operator -> registry entries that cover it."""
    out: dict[str, list[str]] = {}
    for op in REGISTRY.values():
        out.setdefault(op.onnx, []).append(op.name)
    return out


# ---------------------------------------------------------------------------
# map builders shared by the entries
# ---------------------------------------------------------------------------

def _dim(d: int, ndim: int) -> int:
    return d + ndim if d < 0 else d


def _single(shape, target: str, target_shape, index) -> IndexMap:
    return IndexMap.single(shape, target, target_shape, index)


def _bijection(call: OpCall, fwd: Callable[[list[Expr]], list[Expr]],
               inv: Callable[[list[Expr]], list[Expr]]) -> Movement:
    """A one-input, one-output op whose map is a bijection between the two index spaces."""
    ins, outs = call.inputs[0], call.outputs[0]
    return Movement(outputs=[_single(outs, "in0", ins, fwd(index_vars(len(outs))))],
                    inverse=[(0, 0, _single(ins, "out0", outs, inv(index_vars(len(ins)))))])


def _reshape(call: OpCall) -> Movement:
    ins, outs = call.inputs[0], call.outputs[0]
    return Movement(outputs=[IndexMap.reshape(ins, outs, "in0")],
                    inverse=[(0, 0, IndexMap.reshape(outs, ins, "out0"))])


def _permute(call: OpCall, perm: Sequence[int]) -> Movement:
    inv = [0] * len(perm)
    for k, p in enumerate(perm):
        inv[p] = k
    outs = call.outputs[0]
    return Movement(outputs=[IndexMap.permute(call.inputs[0], perm, "in0")],
                    inverse=[(0, 0, IndexMap.permute(outs, inv, "out0"))])


def _gather_only(call: OpCall, index: list[Expr], source: int = 0) -> Movement:
    return Movement(outputs=[_single(call.outputs[0], f"in{source}", call.inputs[source], index)])


# ---------------------------------------------------------------------------
# entries
# ---------------------------------------------------------------------------

@register("Reshape", "view.default", "_unsafe_view.default", "reshape.default", "view_copy.default")
def reshape(call: OpCall) -> Movement:
    """Same elements in the same row-major order, new shape."""
    return _reshape(call)


@register("Flatten", "flatten.using_ints")
def flatten(call: OpCall) -> Movement:
    """Merge a range of dims."""
    return _reshape(call)


@register("Squeeze", "squeeze.default", "squeeze.dim", "squeeze.dims", "squeeze_copy.dims")
def squeeze(call: OpCall) -> Movement:
    """Drop size-1 dims."""
    return _reshape(call)


@register("Unsqueeze", "unsqueeze.default", "unsqueeze_copy.default")
def unsqueeze(call: OpCall) -> Movement:
    """Insert a size-1 dim."""
    return _reshape(call)


@register("Transpose", "permute.default", "permute_copy.default")
def permute(call: OpCall) -> Movement:
    """Reorder dims."""
    n = len(call.inputs[0])
    return _permute(call, [_dim(d, n) for d in call["dims"]])


@register("Transpose", "transpose.int", "transpose_copy.int", "t.default", "numpy_T.default")
def transpose(call: OpCall) -> Movement:
    """Swap two dims (``t`` swaps the only two)."""
    n = len(call.inputs[0])
    perm = list(range(n))
    if n >= 2:
        a, b = (_dim(call.get("dim0", 0), n), _dim(call.get("dim1", 1), n))
        perm[a], perm[b] = perm[b], perm[a]
    return _permute(call, perm)


@register("Expand", "expand.default", "expand_copy.default")
def expand(call: OpCall) -> Movement:
    """Broadcast size-1 dims (and add leading ones): a read-only, many-to-one map."""
    return Movement(outputs=[IndexMap.broadcast(call.inputs[0], call.outputs[0], "in0")])


@register("Tile", "repeat.default", "tile.default")
def repeat(call: OpCall) -> Movement:
    """Tile the input: index modulo the input's extent."""
    ins, outs = call.inputs[0], call.outputs[0]
    v = index_vars(len(outs))
    off = len(outs) - len(ins)
    return _gather_only(call, [v[k + off] % ins[k] for k in range(len(ins))])


@register("Slice", "slice.Tensor", "slice_copy.Tensor")
def slice_(call: OpCall) -> Movement:
    """A strided window along one dim."""
    ins, outs = call.inputs[0], call.outputs[0]
    d = _dim(call.get("dim", 0), len(ins))
    start = call.get("start", 0)
    start = max(0, min(ins[d], start + ins[d] if start < 0 else start))
    return Movement(outputs=[IndexMap.narrow(ins, d, start, outs[d], "in0", call.get("step", 1))])


@register("Slice", "narrow.default")
def narrow(call: OpCall) -> Movement:
    """A window of ``length`` along one dim."""
    ins, outs = call.inputs[0], call.outputs[0]
    d = _dim(call["dim"], len(ins))
    start = call["start"]
    start = start + ins[d] if start < 0 else start
    return Movement(outputs=[IndexMap.narrow(ins, d, start, outs[d], "in0")])


@register("Gather", "select.int", "select_copy.int")
def select(call: OpCall) -> Movement:
    """One index along a dim, which disappears (ONNX Gather with a scalar index)."""
    ins, outs = call.inputs[0], call.outputs[0]
    d = _dim(call["dim"], len(ins))
    idx = call["index"]
    idx = idx + ins[d] if idx < 0 else idx
    v = index_vars(len(outs))
    return _gather_only(call, v[:d] + [Expr(const=idx)] + v[d:])


def _split_sizes(call: OpCall, d: int) -> list[int]:
    return [o[d] for o in call.outputs]


@register("Split", "split.Tensor", "split_with_sizes.default", "chunk.default", "split_copy.Tensor",
          "split_with_sizes_copy.default")
def split(call: OpCall) -> Movement:
    """Consecutive pieces along one dim; the input is the concat of the outputs."""
    ins = call.inputs[0]
    d = _dim(call.get("dim", 0), len(ins))
    outputs, inverse, off = [], [], 0
    for j, (o, size) in enumerate(zip(call.outputs, _split_sizes(call, d))):
        outputs.append(IndexMap.narrow(ins, d, off, size, "in0"))
        w = index_vars(len(ins))
        region = tuple((off, off + size) if k == d else (0, s) for k, s in enumerate(ins))
        inverse.append((0, j, IndexMap(ins, [Piece(f"out{j}", region, tuple(
            w[k] - off if k == d else w[k] for k in range(len(ins))))], {f"out{j}": o})))
        off += size
    return Movement(outputs=outputs, inverse=inverse)


@register("Split", "unbind.int", "unbind_copy.int")
def unbind(call: OpCall) -> Movement:
    """Every index along a dim as its own tensor."""
    ins = call.inputs[0]
    d = _dim(call.get("dim", 0), len(ins))
    outputs, inverse = [], []
    for j, o in enumerate(call.outputs):
        v = index_vars(len(o))
        outputs.append(_single(o, "in0", ins, v[:d] + [Expr(const=j)] + v[d:]))
        w = index_vars(len(ins))
        region = tuple((j, j + 1) if k == d else (0, s) for k, s in enumerate(ins))
        inverse.append((0, j, IndexMap(ins, [Piece(f"out{j}", region, tuple(w[:d] + w[d + 1:]))],
                                       {f"out{j}": o})))
    return Movement(outputs=outputs, inverse=inverse)


@register("Concat", "cat.default")
def cat(call: OpCall) -> Movement:
    """Inputs side by side along one dim: a piecewise map."""
    outs = call.outputs[0]
    d = _dim(call.get("dim", 0), len(outs))
    parts = [(k, s) for k, s in enumerate(call.inputs)
             if not (len(s) == 1 and s[0] == 0 and len(outs) != 1)]   # legacy empty tensors: skipped by torch.cat
    inverse, off = [], 0
    for k, s in parts:
        inverse.append((k, 0, IndexMap.narrow(outs, d, off, s[d], "out0")))
        off += s[d]
    return Movement(outputs=[IndexMap.cat([(f"in{k}", s) for k, s in parts], d)], inverse=inverse)


@register("Concat", "stack.default")
def stack(call: OpCall) -> Movement:
    """Inputs along a new dim (ONNX: Unsqueeze + Concat)."""
    outs = call.outputs[0]
    d = _dim(call.get("dim", 0), len(outs))
    v = index_vars(len(outs))
    pieces, inverse, shapes = [], [], {}
    for k, s in enumerate(call.inputs):
        region = tuple((k, k + 1) if m == d else (0, n) for m, n in enumerate(outs))
        pieces.append(Piece(f"in{k}", region, tuple(v[:d] + v[d + 1:])))
        shapes[f"in{k}"] = s
        w = index_vars(len(s))
        inverse.append((k, 0, _single(s, "out0", outs, w[:d] + [Expr(const=k)] + w[d:])))
    return Movement(outputs=[IndexMap(outs, pieces, shapes)], inverse=inverse)


def _bound(shape: Sequence[int], d: int) -> int:
    return max(int(shape[d]) - 1, 0)


@register("Gather", "index_select.default")
def index_select(call: OpCall) -> Movement:
    """Rows picked by a runtime index vector: an indirect map."""
    ins, outs = call.inputs[0], call.outputs[0]
    d = _dim(call["dim"], len(ins))
    v = index_vars(len(outs))
    j = lookup("in1", [v[d]], 0, _bound(ins, d))
    return _gather_only(call, [j if k == d else v[k] for k in range(len(ins))])


@register("Gather", "embedding.default")
def embedding(call: OpCall) -> Movement:
    """Rows of a table picked by token ids (weight first, then indices)."""
    w, idx = call.inputs[0], call.inputs[1]
    outs = call.outputs[0]
    v = index_vars(len(outs))
    row = lookup("in1", v[:len(idx)], 0, _bound(w, 0))
    return _gather_only(call, [row, v[-1]])


@register("GatherElements", "gather.default")
def gather(call: OpCall) -> Movement:
    """Element-wise indirect index along one dim."""
    if call.get("sparse_grad", False):
        return None
    ins, outs = call.inputs[0], call.outputs[0]
    d = _dim(call["dim"], len(ins))
    v = index_vars(len(outs))
    j = lookup("in1", v, 0, _bound(ins, d))
    return _gather_only(call, [j if k == d else v[k] for k in range(len(ins))])


def _advanced_index(call: OpCall, shape: Sequence[int], out_shape: Sequence[int],
                    indices: Sequence, v: Sequence[Expr]) -> list[Expr] | None:
    """Index into ``shape`` for NumPy-style advanced indexing with consecutive index tensors."""
    pos = [k for k, t in enumerate(indices) if t is not None]
    if not pos or pos != list(range(pos[0], pos[-1] + 1)):
        return None  # non-consecutive index tensors move the broadcast dims to the front
    tshapes = [call.inputs[t.index] for t in indices if t is not None]
    if any(call.in_dtypes[t.index] == torch.bool for t in indices if t is not None):
        return None  # boolean masks have data-dependent shapes
    bshape = torch.broadcast_shapes(*tshapes)
    first = pos[0]
    nb = len(bshape)
    bvars = list(v[first:first + nb])
    out = list(v[:first])
    for t, ts in zip([t for t in indices if t is not None], tshapes):
        off = nb - len(ts)
        tidx = [bvars[off + m] if ts[m] != 1 else Expr() for m in range(len(ts))]
        d = len(out)
        out.append(lookup(f"in{t.index}", tidx, 0, _bound(shape, d)))
    rest = v[first + nb:]
    out.extend(rest)
    return out if len(out) == len(shape) else None


@register("GatherND", "index.Tensor")
def index_tensor(call: OpCall) -> Movement | None:
    """Advanced indexing ``x[..., idx, ...]`` with runtime index tensors."""
    ins, outs = call.inputs[0], call.outputs[0]
    j = _advanced_index(call, ins, outs, call["indices"], index_vars(len(outs)))
    return None if j is None else _gather_only(call, j)


def _scatter(call: OpCall, src: int, src_to_out: list[Expr]) -> Movement:
    outs = call.outputs[0]
    m = _single(call.inputs[src], "out0", outs, src_to_out)
    return Movement(outputs=[IndexMap.identity(outs, "in0")], updates=[Update(0, src, m)],
                    inverse=[(src, 0, m)], inplace=[(0, 0)])


@register("ScatterND", "index_put.default", "index_put_.default")
def index_put(call: OpCall) -> Movement | None:
    """``out = data.clone(); out[indices] = values`` (accumulate=False)."""
    if call.get("accumulate", False):
        return None  # an accumulation is arithmetic
    data, vals = call.inputs[0], call.inputs[-1]
    indices = call["indices"]
    pos = [k for k, t in enumerate(indices) if t is not None]
    if not pos:
        return None
    tshapes = [call.inputs[t.index] for t in indices if t is not None]
    bshape = tuple(torch.broadcast_shapes(*tshapes))
    # the values are broadcast to the indexed shape: data[:first] + bshape + data[last+1:]
    first, last = pos[0], pos[-1]
    indexed = tuple(data[:first]) + bshape + tuple(data[last + 1:])
    if tuple(vals) != indexed or pos != list(range(first, last + 1)):
        return None
    j = _advanced_index(call, data, indexed, indices, index_vars(len(indexed)))
    if j is None:
        return None
    return _scatter(call, len(call.inputs) - 1, j)


@register("ScatterND", "slice_scatter.default")
def slice_scatter(call: OpCall) -> Movement:
    """``out = data.clone(); out[..., start:end:step, ...] = src``: a KV-cache append."""
    data = call.inputs[0]
    d = _dim(call.get("dim", 0), len(data))
    start = call.get("start", 0)
    start = start + data[d] if start < 0 else start
    step = call.get("step", 1)
    w = index_vars(len(call.inputs[1]))
    return _scatter(call, 1, [w[k] * step + start if k == d else w[k] for k in range(len(data))])


@register("ScatterND", "select_scatter.default")
def select_scatter(call: OpCall) -> Movement:
    """``out = data.clone(); out[..., index, ...] = src``."""
    data = call.inputs[0]
    d = _dim(call["dim"], len(data))
    idx = call["index"]
    idx = idx + data[d] if idx < 0 else idx
    w = index_vars(len(call.inputs[1]))
    return _scatter(call, 1, w[:d] + [Expr(const=idx)] + w[d:])


@register("ScatterElements", "scatter.src")
def scatter_src(call: OpCall) -> Movement | None:
    """``out = data.clone(); out[..., index[i], ...] = src[i]`` along one dim."""
    if call.get("reduce") is not None:
        return None
    data, idx = call.inputs[0], call.inputs[1]
    if tuple(call.inputs[2]) != tuple(idx):
        return None  # torch scatters only the index's extent of a larger src; not modelled
    d = _dim(call["dim"], len(data))
    w = index_vars(len(idx))
    j = lookup("in1", w, 0, _bound(data, d))
    return _scatter(call, 2, [j if k == d else w[k] for k in range(len(data))])


@register("Identity", "clone.default", "alias.default", "detach.default", "lift_fresh_copy.default",
          "alias_copy.default", "contiguous.default")
def identity(call: OpCall) -> Movement:
    """The same tensor (a copy, an alias, a detach)."""
    return _bijection(call, list, list)


@register("Identity")
def writeback(call: OpCall) -> Movement:
    """A mutated buffer's final value, stored back into the buffer (no ATen op: added by capture)."""
    return _bijection(call, list, list)


@register("Identity", "_to_copy.default")
def to_copy(call: OpCall) -> Movement | None:
    """A copy that keeps dtype and device (only layout changes); a cast is compute."""
    if call.in_dtypes[0] != call.out_dtypes[0]:
        return None
    return _bijection(call, list, list)


@register("Identity", "copy.default")
def copy(call: OpCall) -> Movement | None:
    """``copy(self, src)``: src's values (broadcast) in self's shape; self is only a shape."""
    if call.in_dtypes[1] != call.out_dtypes[0]:
        return None
    dst, src = call.outputs[0], call.inputs[1]
    v = index_vars(len(dst))
    off = len(dst) - len(src)
    index = [v[k + off] if src[k] != 1 else Expr() for k in range(len(src))]
    mv = Movement(outputs=[_single(dst, "in1", src, index)])
    if tuple(src) == tuple(dst):
        mv.inverse.append((1, 0, _single(src, "out0", dst, index_vars(len(src)))))
    return mv


@register("Pad", "constant_pad_nd.default")
def constant_pad(call: OpCall) -> Movement:
    """Constant border around the input (negative pads crop)."""
    ins, outs = call.inputs[0], call.outputs[0]
    pad = list(call["pad"])
    value = float(call.get("value", 0.0))
    n = len(ins)
    lo = [0] * n
    for k in range(len(pad) // 2):
        lo[n - 1 - k] = pad[2 * k]
    v = index_vars(n)
    interior = tuple((max(lo[d], 0), max(lo[d], 0) + min(outs[d], ins[d] + min(lo[d], 0))) for d in range(n))
    interior = tuple((a, min(b, outs[d])) for d, (a, b) in enumerate(interior))
    pieces = [Piece("in0", interior, tuple(v[d] - lo[d] for d in range(n)))]
    # the border: one constant piece per side per padded dim, peeled so pieces do not overlap
    box = list(full_region(outs))
    for d in range(n):
        a, b = interior[d]
        if a > 0:
            pieces.append(Piece(None, tuple(box[:d] + [(0, a)] + box[d + 1:]), (), fill=value))
        if b < outs[d]:
            pieces.append(Piece(None, tuple(box[:d] + [(b, outs[d])] + box[d + 1:]), (), fill=value))
        box[d] = (a, b)
    mv = Movement(outputs=[IndexMap(outs, pieces, {"in0": ins})])
    if all(x >= 0 for x in pad):
        w = index_vars(n)
        mv.inverse.append((0, 0, _single(ins, "out0", outs, [w[d] + lo[d] for d in range(n)])))
    return mv


@register("DepthToSpace", "pixel_shuffle.default")
def pixel_shuffle(call: OpCall) -> Movement:
    """[.., C*r*r, H, W] -> [.., C, H*r, W*r]."""
    r = call["upscale_factor"]
    return _bijection(call, lambda v: _ps_index(v, r), lambda v: _pus_index(v, r))


@register("SpaceToDepth", "pixel_unshuffle.default")
def pixel_unshuffle(call: OpCall) -> Movement:
    """[.., C, H*r, W*r] -> [.., C*r*r, H, W]."""
    r = call["downscale_factor"]
    return _bijection(call, lambda v: _pus_index(v, r), lambda v: _ps_index(v, r))


def _ps_index(v: Sequence[Expr], r: int) -> list[Expr]:
    # out[c, h, w] = in[c*r*r + (h % r)*r + (w % r), h // r, w // r]
    *b, c, h, w = v
    return list(b) + [c * (r * r) + (h % r) * r + (w % r), h // r, w // r]


def _pus_index(v: Sequence[Expr], r: int) -> list[Expr]:
    # out[c', h, w] with c' = c*r*r + i*r + j  =  in[c, h*r + i, w*r + j]
    *b, c, h, w = v
    return list(b) + [c // (r * r), h * r + (c // r) % r, w * r + c % r]


@register("ChannelShuffle", "channel_shuffle.default", "native_channel_shuffle.default")
def channel_shuffle(call: OpCall) -> Movement:
    """Channels viewed as [g, C/g], transposed to [C/g, g] (ShuffleNet)."""
    g = call["groups"]
    C = call.inputs[0][1]
    n = C // g

    def shuffle(groups: int, per: int) -> Callable[[list[Expr]], list[Expr]]:
        # out[c] = in[(c % groups) * per + c // groups]
        return lambda v: [v[0], (v[1] % groups) * per + v[1] // groups] + list(v[2:])

    return _bijection(call, shuffle(g, n), shuffle(n, g))


def _nearest_scale(in_size: int, out_size: int, scale: float | None) -> int | None:
    """The integer factor of a nearest resize, when torch's float index rule is exactly ``o // factor``.

    torch reads ``min(floor(o * r), in - 1)`` with ``r`` the float32 reciprocal of the scale
    (or ``in / out``); that is ``o // factor`` when ``r`` did not round below ``1 / factor``
    (and ``o`` is small enough that the float32 product cannot round up to the next integer).
    """
    if in_size <= 0 or out_size % in_size or out_size >= 1 << 22:
        return None
    f = out_size // in_size
    if scale is not None and float(scale) != f:
        return None
    r = float(torch.tensor(1.0 / float(scale) if scale is not None else in_size / out_size, dtype=torch.float32))
    return f if Fraction(r) * f >= 1 else None


@register("Resize", "upsample_nearest2d.vec", "upsample_nearest2d.default")
def upsample_nearest2d(call: OpCall) -> Movement | None:
    """Nearest upsampling by integer factors: ``out[n, c, h, w] = in[n, c, h // sh, w // sw]`` (read-only)."""
    ins, outs = call.inputs[0], call.outputs[0]
    if len(ins) != 4:
        return None
    scales = call.get("scale_factors") or [call.get("scales_h"), call.get("scales_w")]
    f = [_nearest_scale(ins[d], outs[d], scales[d - 2]) for d in (2, 3)]
    if None in f:
        return None
    v = index_vars(4)
    return _gather_only(call, [v[0], v[1], v[2] // f[0], v[3] // f[1]])


@register("Flip", "flip.default")
def flip(call: OpCall) -> Movement:
    """Reverse along dims (self-inverse)."""
    s = call.inputs[0]
    dims = {_dim(d, len(s)) for d in call["dims"]}
    f = lambda v: [(s[k] - 1) - v[k] if k in dims else v[k] for k in range(len(s))]  # noqa: E731
    return _bijection(call, f, f)


@register("Roll", "roll.default")
def roll(call: OpCall) -> Movement | None:
    """Circular shift along dims (flattened when no dims are given)."""
    s = call.inputs[0]
    dims = list(call.get("dims", []))
    shifts = list(call["shifts"])
    if not dims:
        if len(shifts) != 1:
            return None
        n = math.prod(s)
        k = shifts[0] % max(n, 1)

        def flat_roll(shift):
            def f(v):
                flat = reshape_index(s, (n,), v)[0]
                return reshape_index((n,), s, [(flat + (n - shift)) % n])
            return f
        return _bijection(call, flat_roll(k), flat_roll((n - k) % max(n, 1)))
    sh = {_dim(d, len(s)): x % max(s[_dim(d, len(s))], 1) for d, x in zip(dims, shifts)}

    def rolled(sign):
        return lambda v: [(v[k] + (s[k] - sh[k] if sign > 0 else sh[k])) % s[k] if k in sh else v[k]
                          for k in range(len(s))]
    return _bijection(call, rolled(1), rolled(-1))

"""Capture: ``nn.Module`` + example inputs -> ATen-level FX graph -> :class:`TensorGraph`.

``torch.export`` traces the module with fake tensors, so a model built on the
``meta`` device (an 8B-parameter layer without its weights) captures in seconds.
Decompositions bring the graph to core ATen, except for the data movement ops
the registry knows, which are kept whole so each stays one VTOG op.  Buffers
the module mutates (a KV cache) come back from export as extra outputs; they
become *writeback* movement ops into the buffer's own storage, which a strategy
can make free by updating the cache in place.  A ``bmm`` of one matrix broadcast over the batch becomes one
``mm`` first (:func:`vtcsearch.core.bmm_fold.fold_broadcast_bmm`).  With ``hfuse`` the exported program is
first rewritten by :func:`vtcsearch.core.hfuse.horizontal_fuse` (GEMMs of one activation with
constant weights merged), so the graph built here is the merged one.
"""
from __future__ import annotations

import operator
from typing import Any, Sequence

import torch
from torch.export.graph_signature import InputKind, OutputKind

from . import ops as movement
from .fusion import fuse_graph
from .bmm_fold import fold_broadcast_bmm
from .hfuse import horizontal_fuse
from .graph import BUFFER, CONSTANT, INPUT, PARAMETER, OpNode, TensorGraph, TensorInfo
from .ops import OpCall, TensorArg

aten = torch.ops.aten

MATMUL = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default}
CONV = {aten.convolution.default}
# ``scaled_dot_product_attention`` is kept whole (not decomposed into its math), so every SDPA form
# (masks, GQA through ``enable_gqa``, causal) reaches the attention lowering as one op
ATTENTION = {getattr(aten, n).default for n in ("scaled_dot_product_attention",
                                                "_scaled_dot_product_flash_attention",
                                                "_scaled_dot_product_efficient_attention",
                                                "_scaled_dot_product_cudnn_attention",
                                                "_scaled_dot_product_flash_attention_for_cpu")
             if hasattr(aten, n)}
REDUCTION = {aten._softmax.default, aten._log_softmax.default, aten.sum.dim_IntList, aten.mean.dim,
             aten.amax.default, aten.amin.default, aten.var_mean.correction, aten.var.correction,
             aten.native_layer_norm.default, aten.argmax.default, aten.prod.dim_int, aten.sum.default,
             aten.mean.default, aten.max.dim, aten.min.dim}
# pointwise without ATen's pointwise tag: inference BatchNorm is (x - mean) * rsqrt(var + eps) * w + b per
# channel (a tuple whose element 0 is the value; the saved statistics are empty), so it fuses into a conv epilogue
POINTWISE_COMPUTE = {aten._native_batch_norm_legit_no_training.default}
OTHER_COMPUTE = {aten.native_batch_norm.default,
                 aten.max_pool2d_with_indices.default, aten.avg_pool2d.default,
                 aten.upsample_nearest2d.default, aten.upsample_nearest2d.vec,
                 aten._adaptive_avg_pool2d.default, aten.adaptive_avg_pool2d.default,
                 aten.cumsum.default, aten.arange.start_step, aten.arange.default, aten.full.default,
                 aten.scalar_tensor.default, aten.empty.memory_format, aten.zeros.default, aten.ones.default,
                 aten.rand.default, aten.randn.default, aten.tril.default, aten.triu.default,
                 aten.topk.default, aten.sort.default, aten.index_add.default, aten.index_put.default,
                 aten.scatter_add.default, aten.embedding_dense_backward.default, aten.linspace.default}


class CaptureError(RuntimeError):
    """The model could not be traced; the message says what to change."""


def export(model: torch.nn.Module, example_inputs: Sequence[Any]) -> torch.export.ExportedProgram:
    """Export to core ATen, keeping the registry's data movement ops whole."""
    try:
        ep = torch.export.export(model.eval(), tuple(example_inputs))
    except Exception as e:  # torch raises many kinds; keep the first line, it names the construct
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "DynamicCache" in first:   # what a transformers model returns by default: say what to do, at once
            first = ("it returns transformers' DynamicCache (use_cache is on by default), which torch.export "
                     "cannot return: set model.config.use_cache = False, or keep a StaticCache in module buffers "
                     "(vtcsearch.core.capture.static_cache_as_buffers) for decoding")
        raise CaptureError(f"torch.export could not trace {type(model).__name__}: {first}") from e
    table = torch.export.default_decompositions()
    for op in movement.REGISTRY.values():
        for t in op.aten:
            table.pop(t, None)
    table.pop(aten.scaled_dot_product_attention.default, None)
    try:
        return ep.run_decompositions(table)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        hint = ""
        if ep.constants:
            hint = (f"; the program lifted {len(ep.constants)} tensor(s) as constants "
                    f"({', '.join(list(ep.constants)[:3])}): register state the model mutates (a KV cache) "
                    "as module buffers (vtcsearch.core.capture.static_cache_as_buffers for transformers' StaticCache)")
        raise CaptureError(f"decomposing {type(model).__name__} to core ATen failed: "
                           f"{type(e).__name__}: {first}{hint}") from e


def capture(model: torch.nn.Module, example_inputs: Sequence[Any], hfuse: bool = False) -> TensorGraph:
    """Trace ``model`` and classify every op as compute or data movement.

    ``hfuse``: first merge the GEMMs that read the same A with constant weights into one GEMM over the
    concatenated weights (:func:`vtcsearch.core.hfuse.horizontal_fuse`); ``graph.hfuse`` is its report."""
    ep = export(model, example_inputs)
    fold_broadcast_bmm(ep)
    report = horizontal_fuse(ep) if hfuse else None
    g = from_exported(ep)
    g.hfuse = report
    return g


def _category(target: Any) -> str | None:
    if target in MATMUL:
        return "matmul"
    if target in CONV:
        return "conv"
    if target in ATTENTION:
        return "attention"
    if target in REDUCTION:
        return "reduction"
    tags = getattr(target, "tags", ())
    if torch.Tag.pointwise in tags or target is aten._to_copy.default or target in POINTWISE_COMPUTE:
        # a dtype cast is elementwise
        return "pointwise"
    if target in OTHER_COMPUTE:
        return "other"
    return None


def _val_info(name: str, val: Any, kind: str) -> TensorInfo:
    if not isinstance(val, torch.Tensor):
        raise CaptureError(f"graph value {name!r} is a {type(val).__name__}, expected a tensor")
    shape = tuple(int(s) for s in val.shape)
    try:
        strides = tuple(int(s) for s in val.stride())
    except Exception:
        from .mapping import contiguous_strides
        strides = contiguous_strides(shape)
    return TensorInfo(name, shape, val.dtype, strides, kind=kind)


def _bind(target: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Schema argument name -> value for an ATen call."""
    schema = getattr(target, "_schema", None)
    if schema is None:
        return {f"arg{k}": a for k, a in enumerate(args)} | dict(kwargs)
    out: dict[str, Any] = {}
    for k, arg in enumerate(schema.arguments):
        if k < len(args):
            out[arg.name] = args[k]
        elif arg.name in kwargs:
            out[arg.name] = kwargs[arg.name]
        elif arg.has_default_value():
            out[arg.name] = arg.default_value
    return out


def from_exported(ep: torch.export.ExportedProgram) -> TensorGraph:
    """Build a TensorGraph from an exported program (already decomposed)."""
    g = TensorGraph()
    g.exported = ep
    sig = ep.graph_signature
    kinds = {}
    for spec in sig.input_specs:
        if spec.kind == InputKind.PARAMETER:
            kinds[spec.arg.name] = PARAMETER
        elif spec.kind == InputKind.BUFFER:
            kinds[spec.arg.name] = BUFFER
        elif spec.kind in (InputKind.CONSTANT_TENSOR,):
            kinds[spec.arg.name] = CONSTANT
        else:
            kinds[spec.arg.name] = INPUT
    buffer_of = {spec.arg.name: spec.target for spec in sig.input_specs if spec.kind == InputKind.BUFFER}
    placeholder_of_buffer = {v: k for k, v in buffer_of.items()}

    value: dict[str, str | list[str]] = {}   # fx node name -> tensor name(s)
    mutated: list[tuple[str, int]] = []
    for node in ep.graph.nodes:
        if node.op == "placeholder":
            val = node.meta.get("val")
            if not isinstance(val, torch.Tensor):
                continue  # a specialised Python scalar
            t = g.add_tensor(_val_info(node.name, val, kinds.get(node.name, INPUT)))
            if t.kind == INPUT and 0 in t.shape:
                raise CaptureError(f"input tensor {t.name!r} has zero size {t.shape}: zero-size inputs are not "
                                   "supported (skip the call: there is nothing to compute)")
            if t.kind == INPUT:
                g.inputs.append(t.name)
            value[node.name] = t.name
        elif node.op == "call_function":
            if node.target is operator.getitem:
                continue  # multi-output ops name their outputs through getitem users below
            _add_call(g, node, value)
        elif node.op == "output":
            outs = node.args[0]
            for spec, arg in zip(sig.output_specs, outs):
                name = getattr(arg, "name", None)
                if name is None or name not in value:
                    continue
                t = value[name]
                if spec.kind == OutputKind.BUFFER_MUTATION:
                    buf = placeholder_of_buffer[spec.target]
                    _add_writeback(g, t, buf)
                elif spec.kind == OutputKind.USER_OUTPUT:
                    g.tensors[t].is_output = True
                    g.outputs.append(t)
                elif spec.kind == OutputKind.USER_INPUT_MUTATION:
                    mutated.append((t, g.inputs.index(spec.target)))
                else:
                    raise CaptureError(f"unsupported program output {spec.kind.name} ({spec.target}); "
                                       "return tensors, or mutate module buffers")
    # an input mutated in place (``x.add_(1)``): its new value is an extra output, after the user's, that
    # the compiled call copies back into the caller's tensor (``g.input_mutations``: value, input position)
    g.input_mutations = []
    for t, k in mutated:
        g.tensors[t].is_output = True
        g.outputs.append(t)
        g.input_mutations.append((t, k))
    fuse_graph(g)
    return g


def _add_call(g: TensorGraph, node: torch.fx.Node, value: dict) -> None:
    target = node.target
    val = node.meta.get("val")
    # outputs: one tensor, or a tuple whose used elements appear as getitem nodes
    if isinstance(val, (tuple, list)):
        getitems = {u.args[1]: u for u in node.users if u.target is operator.getitem}
        out_names = []
        for k, v in enumerate(val):
            if not isinstance(v, torch.Tensor):
                continue
            name = getitems[k].name if k in getitems else f"{node.name}__{k}"
            g.add_tensor(_val_info(name, v, "intermediate"))
            out_names.append(name)
            if k in getitems:
                value[getitems[k].name] = name
        outputs = out_names
    elif isinstance(val, torch.Tensor):
        g.add_tensor(_val_info(node.name, val, "intermediate"))
        value[node.name] = node.name
        outputs = [node.name]
    else:
        return  # ops with no tensor result (asserts, metadata checks)

    inputs: list[str] = []

    def to_arg(a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            if a.name not in value:
                return a.meta.get("val")  # a scalar (SymInt) argument
            inputs.append(value[a.name])
            return TensorArg(len(inputs) - 1)
        if isinstance(a, (list, tuple)):
            return type(a)(to_arg(x) for x in a)
        return a

    args = tuple(to_arg(a) for a in node.args)
    kwargs = {k: to_arg(v) for k, v in node.kwargs.items()}
    op = OpNode(node.name, target, "compute", inputs, outputs, node=node)
    entry = movement.lookup_op(target)
    if entry is not None:
        call = OpCall(target, _bind(target, args, kwargs),
                      [g.tensors[t].shape for t in inputs], [g.tensors[t].shape for t in outputs],
                      [g.tensors[t].dtype for t in inputs], [g.tensors[t].dtype for t in outputs])
        mv = entry.rule(call)
        if mv is not None:
            op.kind, op.movement, op.movement_op, op.call, op.category = "movement", mv, entry, call, "movement"
    if op.kind == "compute":
        cat = _category(target)
        if cat is None:
            g.unclassified[op.target_name] += 1
            cat = "other"
        op.category = cat
    g.add_op(op)


def _add_writeback(g: TensorGraph, new_value: str, buffer: str) -> None:
    """The program's final value of a buffer must land in the buffer's storage."""
    buf = g.tensors[buffer]
    buf.mutable = True
    after = g.add_tensor(TensorInfo(f"{buffer}__after", buf.shape, buf.dtype, buf.strides,
                                    kind="intermediate", is_output=True, storage=buffer))
    src = g.tensors[new_value]
    entry = movement.REGISTRY["writeback"]
    call = OpCall("writeback", {}, [src.shape], [buf.shape], [src.dtype], [buf.dtype])
    g.mutations[new_value] = buffer
    g.add_op(OpNode(f"writeback_{buffer}", "writeback", "movement", [new_value], [after.name],
                    category="movement", movement=entry.rule(call), movement_op=entry, call=call))


_STATE = ("keys", "values", "cumulative_length")


def _buffer_backed(cls: type) -> type:
    """A subclass of a cache layer class whose state attributes are the holder module's buffers."""
    def prop(attr: str) -> property:
        def get(self):
            return getattr(self._vtc_holder, f"{attr}_{self._vtc_index}")

        def set_(self, v):
            setattr(self._vtc_holder, f"{attr}_{self._vtc_index}", v)
        return property(get, set_)
    return type(f"BufferBacked{cls.__name__}", (cls,), {a: prop(a) for a in _STATE})


def static_cache_as_buffers(module: torch.nn.Module, cache: Any, name: str = "vtc_static_cache") -> torch.nn.Module:
    """Make the tensors of transformers' ``StaticCache`` (keys, values, lengths) buffers of ``module``.

    ``torch.export`` lifts tensors it reaches through a plain Python object as constants, and an
    in-place cache update of a constant cannot be traced.  Here each cache layer's tensors move
    into buffers of a submodule ``name`` of ``module`` and the layer reads them back through
    properties, so export traces them as mutable module state (updated in place, like any KV cache
    buffer) and eager code sees the same tensors.  The cache must be allocated first
    (``cache.early_initialization(...)``).  Returns ``module``.
    """
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise TypeError(f"expected a transformers StaticCache (with .layers), got {type(cache).__name__}")
    holder = torch.nn.Module()
    for k, layer in enumerate(layers):
        if not getattr(layer, "is_initialized", False):
            raise ValueError(f"cache layer {k} is not allocated yet: call cache.early_initialization(batch_size, "
                             "num_heads, head_dim, dtype, device) first")
        state = {a: layer.__dict__.pop(a) for a in _STATE if isinstance(layer.__dict__.get(a), torch.Tensor)}
        for a, t in state.items():
            holder.register_buffer(f"{a}_{k}", t)
        layer._vtc_holder, layer._vtc_index = holder, k
        layer.__class__ = _buffer_backed(type(layer))
    module.add_module(name, holder)
    return module

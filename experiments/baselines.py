"""Baselines measured side by side with vtcsearch: eager, CUDA graphs, torch.compile (default, max-autotune).

Every variant is timed the same way in the same process, by the project's one timer
(:func:`vtcsearch.codegen.timing.bench`): warm-up first, then the median of CUDA-event
timings of CUDA-graph replays, or of plain calls for variants that run their own graphs.  Peak memory comes from
PyTorch's memory stats, and torch.profiler splits kernel time into data
movement and compute by kernel name.  A variant that cannot run here is
returned as skipped, with the reason.
"""
from __future__ import annotations

import copy
import gc
import itertools
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

import torch

from vtcsearch.codegen.timing import bench, warm_streams

BASELINES = ("eager", "eager_cudagraphs", "compile_default", "compile_max_autotune", "compile_max_autotune_graph",
             "handwritten_compiled", "onnxruntime")
# handwritten_compiled: the gpt-fast style model of experiments/handwritten.py (Llama workloads only: head-major
# KV cache, SDPA with GQA), max-autotune-no-cudagraphs in one CUDA graph like compile_max_autotune_graph.  It is
# other code than the workload's, so it is a reference beside the baselines, not counted as the best baseline:
REFERENCE_BASELINES = ("handwritten_compiled",)
# onnxruntime: the model exported to ONNX and run by ONNX Runtime's CUDA provider with its own CUDA graph, inputs and
# outputs bound in place (one of the paper's baselines; stateless models only, see onnxruntime_builder);
# compile_max_autotune: torch.compile(mode="max-autotune"), its own CUDA graphs (cudagraph trees), timed per call;
# compile_max_autotune_graph: mode="max-autotune-no-cudagraphs" captured in one CUDA graph and timed as replays,
# exactly as the vtcsearch variants are: the same kernels without the per-call overhead of cudagraph trees

# kernel names that only move bytes (Inductor's fused clones/cats, ATen copies, cuDNN layout transforms)
MOVEMENT_KERNEL = re.compile(
    r"copy|clone|cat|transpose|permute|index|gather|scatter|expand|repeat|split|slice|pad|nchwToNhwc|nhwcToNchw|"
    r"shuffle|unfold|flip|roll|contiguous|stack|unsqueeze|squeeze|select|reshape|as_strided|narrow|alias|"
    r"elementwise_kernel.*direct_copy|CatArray", re.IGNORECASE)
# (cuBLAS on Hopper names its GEMMs nvjet_*; a split-K one ends in "splitK", its reduction is splitKreduce_kernel)
COMPUTE_HINT = re.compile(r"gemm|gemv|matmul|mm_|_mm|bmm|conv|attention|attn|flash|sdpa|softmax|norm|cutlass|cublas|"
                          r"nvjet|splitKreduce|sm90|wgmma|xmma|fmha", re.IGNORECASE)


@dataclass
class Measurement:
    name: str
    median_us: float | None = None
    p20_us: float | None = None
    p80_us: float | None = None
    peak_memory_bytes: int | None = None
    kernels: int | None = None              # kernels launched per call
    movement_kernels: int | None = None     # of which only move data
    movement_us: float | None = None        # profiled device time in data movement kernels
    compute_us: float | None = None
    skipped: str | None = None              # why this variant did not run
    build_s: float | None = None            # seconds to build it and make its first call (torch.compile compiles
                                            # lazily, on that call): the compile time beside vtcsearch's
    notes: dict[str, Any] = field(default_factory=dict)
    profile: dict[str, tuple[float, float]] = field(default_factory=dict)   # kernel -> (calls, us) per call

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# Inductor names a generated kernel after the ATen ops it fused (``triton_poi_fused__to_copy_add_mul_0``); one
# arithmetic op among them makes it a compute kernel, whatever copies were fused into it
INDUCTOR_KERNEL = re.compile(r"^triton_(?:poi|red|per|tem|for)_fused_(.*?)(?:_\d+)?$")
ARITH_OP = re.compile(
    r"(?:^|_)(?:add|sub|mul|div|neg|pow|rsqrt|sqrt|reciprocal|exp|exp2|log|log1p|tanh|sigmoid|silu|relu|gelu|"
    r"hardswish|hardsigmoid|hardtanh|erf|sin|cos|abs|sign|clamp|minimum|maximum|max|min|amax|amin|mean|sum|var|"
    r"prod|where|lt|le|gt|ge|eq|ne|logical|bitwise|remainder|fmod|floor|ceil|round|trunc|mm|addmm|bmm|baddbmm|"
    r"convolution|softmax|norm|batch_norm|layer_norm|group_norm|leaky|elu|mish|softplus|lerp|addcmul|addcdiv|"
    r"cumsum|argmax|argmin|sort|topk)(?=_|$)", re.IGNORECASE)


def is_movement_kernel(name: str) -> bool:
    """Classify a GPU kernel by name; compute hints win (a fused GEMM epilogue named '..._cat_...').

    An Inductor kernel is movement only when none of the ops it fused does arithmetic: a fused RMSNorm
    (``..._to_copy_add_mean_mul_pow_rsqrt_0``) is compute, a fused ``clone``/``cat``/``_to_copy`` alone is
    movement (a dtype cast is counted with the copies: it reads and writes every element and computes nothing
    a consumer could not)."""
    m = INDUCTOR_KERNEL.match(name)
    if m is not None:
        return not ARITH_OP.search(m.group(1)) and not COMPUTE_HINT.search(name) and bool(MOVEMENT_KERNEL.search(m.group(1)))
    return bool(MOVEMENT_KERNEL.search(name)) and not COMPUTE_HINT.search(name)


def kernel_times(fn: Callable[[], Any], iters: int = 5, trace: str | None = None) -> dict[str, tuple[float, float]]:
    """GPU kernel name -> (launches per call, us per call) over ``iters`` profiled calls of ``fn`` (after one
    untimed call); ``trace``: also write the profiler's Chrome trace to that path."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    if trace is not None:
        prof.export_chrome_trace(trace)
    acc: dict[str, list[float]] = {}
    for evt in prof.events():
        if evt.device_type != torch.autograd.DeviceType.CUDA:
            continue
        a = acc.setdefault(evt.name, [0.0, 0.0])
        a[0] += 1
        a[1] += evt.device_time if hasattr(evt, "device_time") else evt.cuda_time
    return {k: (n / iters, us / iters) for k, (n, us) in acc.items()}


def profile_kernels(fn: Callable[[], Any], iters: int = 5
                    ) -> tuple[int, int, float, float, dict[str, tuple[float, float]]]:
    """(kernels per call, movement kernels per call, movement us, compute us, :func:`kernel_times`) from
    torch.profiler."""
    n = mv = 0.0
    mv_us = comp_us = 0.0
    times = kernel_times(fn, iters)
    for name, (calls, us) in times.items():
        n += calls
        if is_movement_kernel(name):
            mv += calls
            mv_us += us
        else:
            comp_us += us
    return int(n), int(mv), mv_us, comp_us, times


def measure(name: str, fn: Callable[[], Any], *, cuda_graph: bool = False, profile: bool = True,
            timed: bool = True) -> Measurement:
    """Time and profile one ready-to-run variant (on CUDA), or time it on the CPU; ``timed=False``: profile
    only (the caller times it beside others, :func:`vtcsearch.codegen.timing.bench_side_by_side`)."""
    m = Measurement(name)
    if timed:
        m.median_us, m.p20_us, m.p80_us = bench(fn, cuda_graph=cuda_graph).quantiles()
    if not torch.cuda.is_available():
        return m
    if profile:
        m.kernels, m.movement_kernels, m.movement_us, m.compute_us, m.profile = profile_kernels(fn)
    return m


@dataclass
class Variant:
    """One way to run the workload: ``build()`` compiles it and returns the zero-argument call to time.

    ``cuda_graph``: time replays of a CUDA graph of the call (for variants that do not
    capture one themselves).  ``skipped``: why it cannot run here.
    """

    name: str
    build: Callable[[], Callable[[], Any]] | None
    cuda_graph: bool = False
    skipped: str | None = None
    own_bytes: Callable[[], int] | None = None   # what the built variant knows it holds (a vtcsearch executable)
    peak_known: bool = True     # False: it allocates outside PyTorch's allocator (ONNX Runtime): no peak reported
    # a variant whose call replays a CUDA graph it captured itself allocates nothing at replay: what its kernels
    # allocate per call (an Inductor region's buffers, a library call's output) sits in the graph's private pool,
    # outside memory_allocated.  This gives those bytes, from a plain call measured at build, so its peak counts
    # them as a baseline's plain call does (a vtcsearch executable: ``call_bytes`` at realization)
    call_bytes: Callable[[], int | None] | None = None


def call_bytes(call: Callable[[], Any]) -> int | None:
    """The bytes one plain call of ``call`` allocates over what is live before it (its transient peak, outputs
    included), from its second call (the first may compile or autotune); None without a GPU or on failure."""
    if not torch.cuda.is_available():
        return None
    try:
        with torch.no_grad():
            call()
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            out = call()
            torch.cuda.synchronize()
            del out
        return int(torch.cuda.max_memory_allocated() - base)
    except Exception:   # the variant's own build and call report a failure; this only sizes it
        return None


def run_variant(v: Variant, *, profile: bool = True, timed: bool = True
                ) -> tuple[Measurement, Callable[[], Any] | None]:
    """Build, warm up, size, time (unless ``timed`` is False) and profile one variant.  A failure becomes a
    skipped entry with the reason.

    Peak memory is what the variant needs on top of the model's own weights and
    caches: the memory it holds after building plus the transient peak of one
    call, from PyTorch's allocator statistics.  It is read before timing, whose
    L2-flushing buffer would otherwise count.
    """
    if v.skipped or v.build is None:
        return Measurement(v.name, skipped=v.skipped or "no builder"), None
    try:
        cuda = torch.cuda.is_available()
        if cuda:
            gc.collect()   # an earlier variant's garbage freed mid-build would count
            warm_streams()   # cuBLAS's per-stream workspaces are the process's, not this variant's
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
        with torch.no_grad():
            t0 = time.perf_counter()
            fn = v.build()
            fn()
            if cuda:
                torch.cuda.synchronize()
            build_s = time.perf_counter() - t0
            for _ in range(2):
                fn()
            peak = None
            if cuda:
                torch.cuda.synchronize()
                held = torch.cuda.memory_allocated() - before
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                fn()
                torch.cuda.synchronize()
                transient = torch.cuda.max_memory_allocated() - base
                if v.call_bytes is not None:
                    transient = max(transient, v.call_bytes() or 0)
                peak = int(held + transient)
                if held < 0:
                    # the build freed more than it kept (cudagraph trees' pool is not in memory_allocated, or an
                    # earlier variant's memory was freed mid-build): the variant's own count if it has one, else
                    # unknown, never a negative number
                    peak = int(v.own_bytes() + transient) if v.own_bytes else None
            m = measure(v.name, fn, cuda_graph=v.cuda_graph, profile=profile, timed=timed)
        m.peak_memory_bytes = peak if v.peak_known else None
        m.build_s = build_s
        return m, fn
    except Exception as e:  # keep the run going; the report says what failed
        return Measurement(v.name, skipped=f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"), None


def baseline_variants(model: torch.nn.Module, example_inputs: Sequence[Any],
                      names: Sequence[str] = BASELINES) -> list[Variant]:
    """The baselines as variants (torch.compile variants compile a module of their own over the model's
    tensors: :func:`shared_module`)."""
    cuda = torch.cuda.is_available()
    out: list[Variant] = []
    for name in names:
        if name not in BASELINES:
            raise ValueError(f"unknown baseline {name!r}; valid: {', '.join(BASELINES)}")
        if name == "eager":
            out.append(Variant(name, lambda: (lambda: model(*example_inputs))))
        elif name == "eager_cudagraphs":
            out.append(Variant(name, lambda: (lambda: model(*example_inputs)), cuda_graph=True) if cuda
                       else Variant(name, None, skipped="needs CUDA"))
        elif not cuda:
            out.append(Variant(name, None, skipped="needs CUDA: the comparison is GPU latency"))
        elif name == "handwritten_compiled":
            out.append(handwritten_variant(model, example_inputs))
        elif name == "onnxruntime":
            out.append(Variant(name, onnxruntime_builder(model, example_inputs), peak_known=False))
        else:
            mode = {"compile_default": None, "compile_max_autotune": "max-autotune",
                    "compile_max_autotune_graph": "max-autotune-no-cudagraphs"}[name]
            out.append(Variant(name, compiled_builder(model, example_inputs, mode),
                               cuda_graph=name == "compile_max_autotune_graph"))
    return out


def model_bytes(model: torch.nn.Module) -> int:
    """Bytes of a module's parameters and buffers (what a deep copy of it allocates)."""
    return sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))


def shared_module(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model``'s module tree over the same parameters and buffers.

    Each torch.compile variant compiles a module object of its own (Dynamo keeps its compiled code and guards
    per module), but a deep copy would also copy the weights and caches: a second 41 GB for Gemma 2 9B at
    batch 16, which left no room for the other variants.  The variants share the state as the vtcsearch
    variants do; the runner restores the buffers after each one."""
    memo = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    return copy.deepcopy(model, memo)


def compiled_builder(model: torch.nn.Module, example_inputs: Sequence[Any],
                     mode: str | None) -> Callable[[], Callable[[], Any]]:
    """A builder compiling :func:`shared_module` of ``model`` with torch.compile in ``mode``."""
    def build():
        compiled = torch.compile(shared_module(model), mode=mode, fullgraph=False)
        return lambda: compiled(*example_inputs)
    return build


def run_baselines(model: torch.nn.Module, example_inputs: Sequence[Any],
                  names: Sequence[str] = BASELINES) -> list[Measurement]:
    """Measure each baseline; failures (a compile error, out of memory) become skipped entries."""
    return [run_variant(v)[0] for v in baseline_variants(model, example_inputs, names)]


def handwritten_variant(model: torch.nn.Module, example_inputs: Sequence[Any]) -> Variant:
    """The hand-written (gpt-fast style) equivalent of a Llama workload's model, compiled like
    compile_max_autotune_graph; its head-major caches are made here, before the variant's memory is counted."""
    from experiments.handwritten import HeadMajorAttention, handwritten
    try:
        hw = handwritten(model)        # shares the weights, owns its caches (same values)
        if not any(isinstance(m, HeadMajorAttention) for m in hw.modules()):
            raise TypeError("no Llama Attention module in it")
    except Exception as e:
        return Variant("handwritten_compiled", None, skipped=f"no hand-written model for this workload "
                                                               f"({type(e).__name__}: {str(e)[:200]})")
    return Variant("handwritten_compiled", compiled_builder(hw, example_inputs, "max-autotune-no-cudagraphs"),
                   cuda_graph=True)


_ORT_DTYPES = {torch.float16: "float16", torch.float32: "float32", torch.int64: "int64", torch.int32: "int32",
               torch.bool: "bool"}


def onnxruntime_builder(model: torch.nn.Module, example_inputs: Sequence[Any], device: str = "cuda",
                        cuda_graph: bool = True) -> Callable[[], Callable[[], Any]]:
    """A builder running ``model`` in ONNX Runtime: exported by torch.onnx (the TorchScript exporter, which
    needs only the ``onnx`` package), run by the CUDA provider (``device="cpu"``: the CPU provider, for tests),
    with ONNX Runtime's own CUDA graph where it can capture one.  Inputs and outputs are bound in place
    (IOBinding over the tensors' memory), so a call copies nothing through the host.

    Refused, with the reason: a model whose call writes its own buffers (a KV cache: an ONNX graph has no state
    to write, and timing one that skips the write would time less work), bf16 inputs or outputs (no NumPy type
    to bind), a session without the CUDA provider (the ``onnxruntime`` package is CPU-only; the GPU needs
    ``onnxruntime-gpu``), and outputs that differ from eager's (a baseline that computes something else is no
    baseline)."""
    def build():
        import os
        import tempfile

        import numpy as np
        import onnxruntime as ort
        versions = {n: b._version for n, b in model.named_buffers()}
        with torch.no_grad():
            ref = model(*example_inputs)
        refs = [t for t in torch.utils._pytree.tree_leaves(ref) if isinstance(t, torch.Tensor)]  # export's order
        if any(b._version != versions[n] for n, b in model.named_buffers()):
            raise NotImplementedError("onnxruntime baseline: the call writes the model's buffers (a KV cache), "
                                      "which an exported ONNX graph cannot hold")
        inputs = [x for x in example_inputs if isinstance(x, torch.Tensor)]
        if len(inputs) != len(example_inputs):
            raise NotImplementedError("onnxruntime baseline: non-tensor arguments are not bound")
        if any(t.dtype not in _ORT_DTYPES for t in inputs + refs):
            raise NotImplementedError(f"onnxruntime baseline: dtypes {sorted({str(t.dtype) for t in inputs + refs})}"
                                      " cannot all be bound (no NumPy type for bfloat16)")
        cuda = device == "cuda"
        ort.set_default_logger_severity(3)          # errors only: its warnings are per node
        if cuda and hasattr(ort, "preload_dlls"):   # the CUDA and cuDNN libraries torch's wheels brought
            try:
                ort.preload_dlls()
            except Exception:   # the session below says what is missing
                pass
        if cuda and "CUDAExecutionProvider" not in ort.get_available_providers():
            raise RuntimeError(f"onnxruntime {ort.__version__} has no CUDA provider here "
                               f"({ort.get_available_providers()}): install onnxruntime-gpu")
        idx = (inputs[0].device.index or 0) if cuda else 0
        where = "cuda" if cuda else "cpu"
        args = [x.contiguous() for x in inputs]
        outs = [torch.empty_like(r, memory_format=torch.contiguous_format) for r in refs]

        def session(path: str, graph: bool) -> Callable[[], Any]:
            opts = ort.SessionOptions()
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            providers = [("CUDAExecutionProvider", {"device_id": idx, "enable_cuda_graph": "1" if graph else "0"})
                         ] if cuda else ["CPUExecutionProvider"]
            sess = ort.InferenceSession(path, opts, providers=providers)
            if cuda and sess.get_providers()[0] != "CUDAExecutionProvider":
                raise RuntimeError(f"onnxruntime baseline: the session runs on {sess.get_providers()}")
            names_in, names_out = sess.get_inputs(), sess.get_outputs()
            if len(names_in) != len(args) or len(names_out) != len(outs):
                raise NotImplementedError(f"onnxruntime baseline: the export has {len(names_in)} inputs and "
                                          f"{len(names_out)} outputs, the model {len(args)} and {len(outs)}")
            binding = sess.io_binding()
            for meta, x in zip(names_in, args):
                binding.bind_input(meta.name, where, idx, np.dtype(_ORT_DTYPES[x.dtype]), tuple(x.shape),
                                   x.data_ptr())
            for meta, y in zip(names_out, outs):
                binding.bind_output(meta.name, where, idx, np.dtype(_ORT_DTYPES[y.dtype]), tuple(y.shape),
                                    y.data_ptr())

            def call():
                sess.run_with_iobinding(binding)
                return outs

            if cuda:
                torch.cuda.synchronize()
            call()    # ONNX Runtime captures its CUDA graph in the first run
            return call

        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "model.onnx")
            with torch.no_grad():
                torch.onnx.export(model, tuple(inputs), path, dynamo=False, opset_version=18)
            try:
                call = session(path, graph=cuda and cuda_graph)
            except NotImplementedError:
                raise
            except Exception:   # a graph ONNX Runtime cannot capture whole (a node on the CPU): no CUDA graph
                if not (cuda and cuda_graph):
                    raise
                call = session(path, graph=False)
        for y, r in zip(outs, refs):
            err = float((y.float() - r.float()).norm() / max(float(r.float().norm()), 1e-12))
            if not err <= (2e-2 if r.dtype == torch.float16 else 1e-4):
                raise RuntimeError(f"onnxruntime baseline: its output differs from eager's (relative error {err:.2e})")
        return call
    return build

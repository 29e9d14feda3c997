"""The one timer and the one ``machine()``: every latency the project reports is taken here.

:func:`bench` follows ``triton.testing.do_bench_cudagraph`` and Inductor's
``runtime/benchmarking.py``: warm up on a side stream (compiles, autotunes, allocator
settles), capture the call in a CUDA graph, then time replays with CUDA events and
report the median and the 20th/80th percentiles.  By default the L2 cache is flushed
before each timed replay (outside the events), as ``triton.testing.do_bench`` does, so
numbers are cold-cache and comparable across variants.  ``cuda_graph=False`` times plain
calls with events instead, for callables that cannot be captured (they run their own
graphs, synchronize, or allocate).  On a CPU it falls back to ``time.perf_counter``.
:func:`bench_side_by_side` times several variants against each other in interleaved rounds, so that a
speedup is not what drifted in the process between one variant's timing and the next's.

Fresh inputs are the caller's job: ``fn`` is replayed as it is, on the same buffers.
"""
from __future__ import annotations

import contextlib
import platform
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

L2_FLUSH_BYTES = 256 * 2 ** 20      # larger than any current GPU's L2 (H200: 60 MiB)


@dataclass(frozen=True)
class Timing:
    """Per-call times of one callable, in microseconds."""

    median_us: float
    p20_us: float
    p80_us: float
    samples: int
    method: str                  # "cuda_graph" | "cuda_events" | "perf_counter"

    def quantiles(self) -> tuple[float, float, float]:
        return self.median_us, self.p20_us, self.p80_us


def _summarize(samples_us: list[float], method: str) -> Timing:
    if not samples_us:
        raise ValueError("bench: no samples (repeats must be >= 1)")
    s = sorted(samples_us)
    q = lambda f: s[min(len(s) - 1, int(f * len(s)))]   # noqa: E731
    return Timing(statistics.median(s), q(0.2), q(0.8), len(s), method)


_SIDE_STREAM: Any = None


def side_stream() -> Any:
    """The one stream every warm-up before a CUDA-graph capture, and the capture itself, runs on.

    cuBLAS keeps a workspace (32 MiB on Hopper) per stream it ever ran on, for the life of the process: a new
    stream per capture would leave one more each time and make every graphed variant look 32 MiB larger."""
    global _SIDE_STREAM
    import torch
    if _SIDE_STREAM is None:
        _SIDE_STREAM = torch.cuda.Stream()
    return _SIDE_STREAM


def warm_streams() -> None:
    """Allocate the library workspaces of the current stream and of the side stream now (a tiny cuBLAS /
    cuBLASLt call on each), so that memory measured around a variant's build counts neither: builds run on
    the current stream (Inductor's autotuning, a realization's first pass), captures on the side stream, and
    whichever variant first called cuBLAS on a stream was charged its 32 MiB workspaces."""
    import torch
    cur, s = torch.cuda.current_stream(), side_stream()
    for stream in (cur, s):
        stream.wait_stream(cur)
        with torch.cuda.stream(stream):
            for dt in (torch.float16, torch.bfloat16, torch.float32):
                a = torch.ones(8, 8, device="cuda", dtype=dt)
                torch.mm(a, a)
                torch.addmm(a[0], a, a)
                torch.bmm(a[None], a[None])
        cur.wait_stream(stream)
    torch.cuda.synchronize()


def capture_graph(fn: Callable[[], Any], calls: int = 1) -> Any:
    """``fn()`` (``calls`` times) captured in a CUDA graph on the side stream, owning its cuBLAS workspace.

    cuBLAS keeps one workspace per stream outside any graph, and a graph that captured a GEMM replays into
    it.  torch.compile's cudagraph trees free every such workspace whenever they warm up or record a path
    (``clear_cublass_cache`` in ``torch._inductor.cudagraph_trees``); the next ``torch.cuda.graph`` empties the
    allocator's cache, and the older graph then replays into unmapped memory.  Seen on an H100 as an illegal
    memory access in the runner's side-by-side timing of Llama decode (``eager_cudagraphs`` timed beside
    ``compile_default``), and it would hit a user who mixes an executable with ``mode="reduce-overhead"``.
    Clearing the workspaces before the capture makes cuBLAS allocate the one the graph uses from the graph's
    own pool, as cudagraph trees do; the process's workspaces are made again after it (:func:`warm_streams`),
    so memory counted around a build does not move."""
    import torch
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    warm_streams()   # the side stream's cuBLAS handles exist before the capture (creating one there fails it)
    if clear is not None:
        clear()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side_stream()):
        for _ in range(calls):
            fn()
    torch.cuda.synchronize()
    if clear is not None:
        clear()       # the graph's workspace goes back to its pool, where nothing else allocates
        warm_streams()
    return graph


def _device_type(device: Any) -> str:
    import torch
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device).type


def bench(fn: Callable[[], Any], *, device: Any = None, cuda_graph: bool = True, flush_l2: bool = True,
          warmup: int = 3, repeats: int | None = None, rep_ms: float = 300.0,
          max_repeats: int = 1000, calls_per_graph: int = 1) -> Timing:
    """Time ``fn()``: CUDA-graph replays (or plain calls with events) on a GPU, perf_counter on a CPU.

    ``repeats``: a fixed number of timed samples; None times for about ``rep_ms`` (at least 10
    samples, at most ``max_repeats``), estimated from the warm-up.  ``warmup``: untimed calls first.
    ``calls_per_graph``: capture that many calls in one graph and report the time per call (a kernel of a
    few microseconds is then not dominated by the replay's own launch).
    """
    if _device_type(device) != "cuda":
        return _bench_cpu(fn, warmup=warmup, repeats=repeats, rep_ms=rep_ms, max_repeats=max_repeats)
    sampler = _CudaSampler(fn, cuda_graph=cuda_graph, flush_l2=flush_l2, warmup=warmup,
                           calls_per_graph=calls_per_graph)
    return _summarize(sampler.take(_count(sampler.sample, repeats, rep_ms, max_repeats)), sampler.method)


def time_callable(fn: Callable[[], Any], device: Any, repeats: int = 10, warmup: int = 2) -> float:
    """Median seconds of ``fn()`` after warm-up, as plain calls (no CUDA graph, no L2 flush)."""
    return bench(fn, device=device, cuda_graph=False, flush_l2=False, warmup=warmup, repeats=repeats).median_us * 1e-6


def bench_side_by_side(fns: Mapping[str, tuple[Callable[[], Any], bool]], *, device: Any = None, rounds: int = 5,
                       rep_ms: float = 300.0, max_repeats: int = 1000) -> dict[str, Timing | Exception]:
    """Time several callables against each other: ``fns`` maps a name to ``(fn, cuda_graph)``.

    Each is warmed up (and captured) once; then ``rounds`` rounds visit them in turn, each taking its share
    of ``rep_ms``, so what drifts in a process (clocks, the allocator, other variants' memory) weighs on
    all of them alike instead of on whichever was timed last.  The quantiles are over all of a name's samples.
    A callable that fails to warm up or capture gets its exception instead of a timing; the others go on.
    """
    cpu = _device_type(device) != "cuda"
    samplers: dict[str, Any] = {}
    failed: dict[str, Exception] = {}
    flush = None if cpu else _flush_buffer()   # one for all: 256 MiB each would add up
    for k, (fn, graph) in fns.items():
        try:
            samplers[k] = _CpuSampler(fn) if cpu else _CudaSampler(fn, cuda_graph=graph, flush=flush)
        except Exception as e:   # one variant that cannot be captured is that variant's failure
            failed[k] = e
    counts: dict[str, int] = {}
    for k, s in samplers.items():
        with _named(k):
            counts[k] = max(1, _count(s.sample, None, rep_ms, max_repeats) // rounds)
    samples: dict[str, list[float]] = {k: [] for k in samplers}
    for _ in range(rounds):
        for k, s in samplers.items():
            with _named(k):
                samples[k] += s.take(counts[k])
    return {**failed, **{k: _summarize(samples[k], s.method) for k, s in samplers.items()}}


@contextlib.contextmanager
def _named(name: str) -> Iterator[None]:
    """Re-raise an error with the name of the callable being timed: a CUDA fault (an illegal memory access)
    ends the process's GPU work, and the report must say which variant ran into it."""
    try:
        yield
    except Exception as e:
        try:
            named = type(e)(f"while timing {name}: {e}")
        except TypeError:   # an exception type whose constructor takes more than a message
            named = RuntimeError(f"while timing {name}: {e}")
        raise named from e


def _count(sample: Callable[[], float], repeats: int | None, rep_ms: float, max_repeats: int) -> int:
    """``repeats``, or as many samples as fit in ``rep_ms`` (at least 10), from three untimed estimates."""
    if repeats is not None:
        return repeats
    estimate = statistics.median(sample() for _ in range(3))
    return int(min(max_repeats, max(10, rep_ms * 1e3 / max(estimate, 1e-3))))


class _CudaSampler:
    """One callable made ready to time on the GPU: warmed up, captured in a CUDA graph unless ``cuda_graph``
    is False, and an L2-flushing buffer; ``sample()`` is one timed call in microseconds."""

    def __init__(self, fn: Callable[[], Any], *, cuda_graph: bool = True, flush_l2: bool = True,
                 warmup: int = 3, calls_per_graph: int = 1, flush: Any = None):
        import torch
        # warm-up (compiles and autotunes outside the timing); before a capture it runs on a side stream, as
        # torch.cuda.graph requires; plain calls warm up where they are timed (cudagraph trees key on the stream)
        if cuda_graph:
            stream = side_stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(max(warmup, 1)):
                    fn()
            torch.cuda.current_stream().wait_stream(stream)
        else:
            for _ in range(warmup):
                fn()
        torch.cuda.synchronize()
        if cuda_graph:
            graph = self.graph = capture_graph(fn, calls_per_graph)
            self.run, self.method, self.per_sample = graph.replay, "cuda_graph", calls_per_graph
        else:
            self.run, self.method, self.per_sample = fn, "cuda_events", 1
        self.cache = (flush if flush is not None else _flush_buffer()) if flush_l2 else None

    def sample(self) -> float:
        import torch
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if self.cache is not None:
            self.cache.zero_()
        a.record()
        self.run()
        b.record()
        b.synchronize()
        return a.elapsed_time(b) * 1e3 / self.per_sample     # ms -> us per call

    def take(self, n: int) -> list[float]:
        return [self.sample() for _ in range(n)]


def _flush_buffer() -> Any:
    """A buffer larger than the L2 cache: zeroing it before a timed call evicts what the last call left."""
    import torch
    return torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")


class _CpuSampler:
    """The CPU's counterpart: ``sample()`` is one call timed with perf_counter."""

    method = "perf_counter"

    def __init__(self, fn: Callable[[], Any], warmup: int = 3):
        self.fn = fn
        for _ in range(warmup):
            fn()

    def sample(self) -> float:
        t0 = time.perf_counter()
        self.fn()
        return (time.perf_counter() - t0) * 1e6

    def take(self, n: int) -> list[float]:
        return [self.sample() for _ in range(n)]


def _bench_cpu(fn: Callable[[], Any], *, warmup: int, repeats: int | None, rep_ms: float,
               max_repeats: int) -> Timing:
    sampler = _CpuSampler(fn, warmup=warmup)
    return _summarize(sampler.take(_count(sampler.sample, repeats, rep_ms, max_repeats)), sampler.method)


def machine(device: str | None = None) -> dict[str, Any]:
    """What a number was measured (or modelled) on: written beside every result."""
    import torch
    try:
        import triton
        triton_version: str | None = triton.__version__
    except ImportError:  # pragma: no cover - triton is a dependency
        triton_version = None
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return {"device": device, "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
            "cpu": platform.processor() or platform.machine(), "platform": platform.platform(),
            "python": platform.python_version(), "torch": torch.__version__, "triton": triton_version}

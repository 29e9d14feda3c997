"""``vtcsearch.compile``: one call from an ``nn.Module`` to a callable that runs it with virtual tensors.

    import vtcsearch
    fast = vtcsearch.compile(model, (x,), solver="ilp")      # capture, search, validate, realize
    y = fast(x)                                              # same call signature (tensor args) as model
    print(fast.report()); fast.strategy; fast.graph; fast.executable

It is the torch.compile-style entry point, with the same contract as
``torch.compile(model)(x)``: same outputs as eager (up to the rounding of fused
kernels), and the module's mutable buffers (a KV cache) updated in place as eager
updates them.  Shapes, dtypes and non-tensor arguments are specialised to
``example_inputs`` (a call with other shapes or other non-tensor values is an
error, not a recompile); an in-place op on an input tensor is applied to the
caller's tensor, as eager applies it.
Outputs are fresh tensors (clones of the executable's storages), so results of
earlier calls stay valid.  On a CPU model the Triton kernels run through Triton's
interpreter (``TRITON_INTERPRET=1`` is set if no kernel was imported yet): slow, for
checking; on a GPU they are compiled for it.

Why there is no ``torch.compile(model, backend=vtcsearch.backend)``: a dynamo
backend receives a GraphModule whose parameters and buffers are lifted to graph
inputs (``inline_inbuilt_nn_modules``, the default since torch 2.5), so
re-exporting it would (a) make every weight a per-call user input that the
executable copies into its own storage on each call, and (b) turn an in-place
KV-cache update into a mutation of a user input, which torch 2.13's
``torch.export`` of that GraphModule does not report as an output (checked:
only ``USER_OUTPUT`` specs come back), so :mod:`vtcsearch.core.capture` could not see
the write and the cache would silently stay stale.  Add guards, graph breaks and
recompiles across torch 2.11 and 2.13, and a backend is not simple and robust;
``compile`` captures the whole module with ``torch.export`` instead, where
parameters, buffers and their mutations are first-class.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import torch

__all__ = ["Compiled", "compile", "search_fusions"]


def _device_of(model: torch.nn.Module, example_inputs: Sequence[Any]) -> torch.device:
    for t in list(model.parameters()) + list(model.buffers()) + [a for a in example_inputs
                                                                  if isinstance(a, torch.Tensor)]:
        return t.device
    return torch.device("cpu")


class Compiled:
    """A model compiled by :func:`compile`: call it like the model; inspect what the search chose."""

    def __init__(self, model: torch.nn.Module, graph, vtog, result, oracle, executable, cuda_graph: bool,
                 example_inputs: Sequence[Any] = ()):
        self.model, self.graph, self.vtog, self.result, self.oracle = model, graph, vtog, result, oracle
        # non-tensor arguments were traced as constants: a call with other values must not reuse this program
        self._constants = [(k, a) for k, a in enumerate(example_inputs) if not isinstance(a, torch.Tensor)]
        self.strategy = result.strategy
        self.executable = executable
        self.guard: dict[str, Any] | None = None   # compile(guard=...): the measured times and which was kept
        self._call = executable.cuda_graph() if cuda_graph else executable
        self._specs = [graph.tensors[n] for n in graph.inputs]
        ep = graph.exported
        self._out_spec = getattr(getattr(ep, "call_spec", None), "out_spec", None)

    def _check(self, args: Sequence[Any]) -> None:
        for k, a in self._constants:
            got = args[k] if k < len(args) else None
            if k >= len(args) or isinstance(got, torch.Tensor) or type(got) is not type(a) or got != a:
                raise ValueError(f"argument {k} was compiled as the constant {a!r}, got {got!r} (non-tensor "
                                 f"arguments are specialised: compile again, or pass it as a tensor)")
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if len(tensors) != len(self._specs):
            raise TypeError(f"expected {len(self._specs)} tensor argument(s) as at compile time, got {len(tensors)}")
        for k, (x, info) in enumerate(zip(tensors, self._specs)):
            if tuple(x.shape) != tuple(info.shape) or x.dtype != info.dtype:
                raise ValueError(f"tensor argument {k}: compiled for {tuple(info.shape)} {info.dtype}, got "
                                 f"{tuple(x.shape)} {x.dtype} (compile again for other shapes or dtypes)")
            if x.device != self.executable.device:
                raise ValueError(f"tensor argument {k} is on {x.device}, the compiled model on "
                                 f"{self.executable.device}")

    def __call__(self, *args: Any) -> Any:
        self._check(args)
        with torch.no_grad():
            res = self._call(*args)
            muts = getattr(self.graph, "input_mutations", [])
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            n = len(res) - len(muts)
            for (_, k), val in zip(muts, res[n:]):   # in-place ops on inputs, applied as eager applies them
                tensors[k].copy_(val)
            outs = [o.clone() for o in res[:n]]
        if self._out_spec is not None:
            from torch.utils._pytree import tree_unflatten
            if self._out_spec.num_leaves == len(outs):
                return tree_unflatten(outs, self._out_spec)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def report(self) -> str:
        """What the search chose and what the oracle predicts, as short text."""
        ev = self.oracle.evaluate(self.strategy)
        none = self.oracle.evaluate(type(self.strategy)(self.vtog, [])) if self.strategy.edges else ev
        s, summ = self.strategy, self.executable.summary()
        speed = none.latency_s / ev.latency_s if ev.latency_s else math.nan
        desc = self.oracle.describe()
        return "\n".join([
            f"vtcsearch: {self.graph!r}",
            f"  VTOG: {len(self.vtog.edges)} edges over {len(self.vtog.candidates())} candidate tensors",
            f"  solver {self.result.solver} ({self.result.status}, {self.result.wall_s:.2f} s): "
            f"{len(s.virtual)} virtual tensors, {len(s.eliminated_ops())} of {len(self.graph.movement_ops())} "
            f"movement ops eliminated, {len(s.residuals)} residual copies",
            f"  predicted by {desc.get('oracle')}"
            + (f" ({desc['hardware']})" if "hardware" in desc else "")
            + f": {ev.latency_s * 1e6:.1f} us vs {none.latency_s * 1e6:.1f} us all-physical ({speed:.2f}x)"
            + (f", peak {ev.peak_bytes / 2 ** 20:.2f} MiB" if ev.peak_bytes is not None else ""),
            f"  executable on {self.executable.device}: {summ['kernels']} kernels ({summ['copy_kernels']} copies), "
            f"lowerings {summ['by_lowering']}" + (f", ATen fallbacks {list(summ['fallbacks'])}" if summ["fallbacks"]
                                                  else ""),
        ])

    def __repr__(self) -> str:
        return f"<vtcsearch.Compiled {type(self.model).__name__}: {self.result.solver}, " \
               f"{len(self.strategy.virtual)} virtual tensors>"


def search_fusions(model: torch.nn.Module, example_inputs: Sequence[Any], search: Callable[..., Any], oracle: Any,
                   *, prologues: bool | str = False, hfuse: bool | str = False, budget: float | None = None,
                   seed: int = 0) -> tuple[Any, Any, Any]:
    """(graph, VTOG, search result) of ``model``: captured, fused with or without prologue fusion and
    horizontal GEMM fusion, searched.

    ``"auto"`` (for either option) searches both ways (when the option changes anything) and keeps the
    graph whose best strategy has the lower objective: the search sees the fused GEMM as an option, priced
    by the oracle (on a GPU, the profiling oracle times it as realized)."""
    from .core.capture import capture
    from .core.fusion import fuse_graph
    from .core.vtog import build_vtog
    for name, v in (("prologues", prologues), ("hfuse", hfuse)):
        if v not in (False, True, "auto"):
            raise ValueError(f"{name} must be True, False or 'auto', got {v!r}")
    best = None
    for hf in ((False, True) if hfuse == "auto" else (bool(hfuse),)):
        for pro in ((False, True) if prologues == "auto" else (bool(prologues),)):
            graph = capture(model, example_inputs, hfuse=hf)
            if hf and best is not None and not graph.hfuse.fused:
                break                      # no GEMMs to merge: the graph without is the only candidate
            if pro:
                fuse_graph(graph, prologues=True)
                if best is not None and not any("prologue" in gr.info for gr in graph.groups.values()):
                    continue               # nothing to fold: the default fusion is the only candidate
            vtog = build_vtog(graph)
            result = search(vtog, oracle, budget=budget, seed=seed)
            if best is None or result.objective < best[2].objective:
                best = (graph, vtog, result)
    return best


def compile(model: torch.nn.Module, example_inputs: Sequence[Any], *, solver: str = "ilp",
            oracle: Any = "analytical", hardware: str = "H200", objective: Any = "latency",
            cuda_graph: bool = False, budget: float | None = None, seed: int = 0,
            implementations: Sequence[str] | None = None, guard: bool | None = None,
            prologues: bool | str = False, hfuse: bool | str = False) -> Compiled:
    """Capture ``model`` on ``example_inputs``, search with ``solver`` and ``oracle``, validate, realize.

    ``oracle``: a name in ``cost_models.ORACLES`` or a ``CostOracle`` (``"profiling"`` times the
    configurations of each unit that the ``hardware`` model ranks first: ``DEFAULT_MEASURE_TOP``); ``objective``:
    ``"latency" | "memory" | "mix"`` or a ``cost_models.Objective``; ``cuda_graph``: replay
    the whole step list as one CUDA graph (GPU only); ``budget``: the solver's budget
    (its own unit); ``implementations``: what each kernel group may run as: ``"triton"`` (vtcsearch's
    templates through the maps), ``"library"`` (cuBLAS / cuDNN / SDPA), ``"inductor"`` (TorchInductor's code,
    merged into one compiled region wherever no virtual tensor separates them); default: all three for a CUDA
    model (``implementation.ON_GPU``: never slower than torch.compile where virtual tensors do not help),
    ``("triton",)`` on the CPU (the interpreter; Inductor would compile C++ for every region); ``guard``: time
    the search's executable beside those without virtual tensors (the ``none`` solver's: each group in its
    cheapest implementation; with Inductor allowed, the ``inductor`` solver's: every group Inductor's,
    torch.compile's program) and keep the fastest, so a mispriced strategy never makes the model slower than
    compiling it without virtual tensors (default: on for a CUDA model; ``Compiled.guard`` records the times);
    ``prologues``: fold a row norm into the decode GEMM that reads it
    (:func:`vtcsearch.core.fusion.merge_prologues`); ``"auto"``: search the graph both ways and keep the fusion
    whose best strategy the oracle prices lower (:func:`search_fusions`);
    ``hfuse``: merge the GEMMs that read the same activation with constant weights (Q/K/V, gate/up) into one
    GEMM over the concatenated weights (:func:`vtcsearch.core.hfuse.horizontal_fuse`), ``"auto"`` as for
    ``prologues``.
    Returns a :class:`Compiled` callable.
    """
    import warnings

    from cost_models import CostOracle, Objective, get_oracle

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    example_inputs = tuple(example_inputs) if isinstance(example_inputs, (list, tuple)) else (example_inputs,)
    dev = _device_of(model, example_inputs)
    if dev.type == "meta":
        raise ValueError("the model is on the meta device: compile needs real weights (build it on cpu or cuda)")
    if dev.type == "cpu":
        from .codegen.interpreter import ensure_interpreter
        ensure_interpreter()
    if cuda_graph and dev.type != "cuda":
        raise ValueError("cuda_graph=True needs a model on a CUDA device")
    if isinstance(objective, str):
        objectives = {"latency": Objective.latency, "memory": Objective.memory, "mix": Objective.mix}
        if objective not in objectives:
            raise ValueError(f"unknown objective {objective!r}; choices: {', '.join(objectives)}")
        objective = objectives[objective]()
    if isinstance(oracle, str):
        if implementations is None and dev.type == "cuda":
            from .core.implementation import ON_GPU
            implementations = ON_GPU
        kw: dict[str, Any] = {"objective": objective, "implementations": implementations}
        if oracle in ("analytical", "recorded"):
            kw["hardware"] = hardware
        if oracle == "profiling":   # time what the hardware model ranks first: a whole model stays practical
            from cost_models.profiling import DEFAULT_MEASURE_TOP
            kw.update(measure_top=DEFAULT_MEASURE_TOP, hardware=hardware)
        oracle = get_oracle(oracle, **kw)
    elif not isinstance(oracle, CostOracle):
        raise TypeError(f"oracle must be a name or a cost_models.CostOracle, got {type(oracle).__name__}")

    from solvers import GUARD_REFERENCES, get_solver

    from .codegen.realize import realize

    search = get_solver(solver)
    model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph, vtog, result = search_fusions(model, example_inputs, search, oracle, prologues=prologues,
                                             hfuse=hfuse, budget=budget, seed=seed)
        result.strategy.validate()
        exe = realize(graph, result.strategy, model)
        record = None
        if (dev.type == "cuda" if guard is None else guard) and solver not in GUARD_REFERENCES:
            result, exe, record = _measured_guard(graph, vtog, oracle, result, exe, model, example_inputs, seed,
                                                  cuda_graph)
    compiled = Compiled(model, graph, vtog, result, oracle, exe, cuda_graph, example_inputs)
    compiled.guard = record
    return compiled


def time_executables(exes: dict[str, Any], model: torch.nn.Module, example_inputs: Sequence[Any], *,
                     cuda_graph: bool = False) -> dict[str, float]:
    """Median microseconds of one call of each executable on ``example_inputs``, timed side by side in
    interleaved rounds, each run as the user will run it (one CUDA graph replay if ``cuda_graph``); the
    module's buffers (a KV cache the calls write) are restored afterwards."""
    from .codegen.timing import bench_side_by_side
    saved = {n: b.to("cpu", copy=True) for n, b in model.named_buffers()}   # host memory: caches can be large
    try:
        with torch.no_grad():
            calls = {k: (e.cuda_graph() if cuda_graph else e) for k, e in exes.items()}
            times = bench_side_by_side({k: ((lambda c=c: c(*example_inputs)), False) for k, c in calls.items()},
                                       device=next(iter(exes.values())).device)
    finally:
        with torch.no_grad():
            for n, b in model.named_buffers():
                b.copy_(saved[n])
    for k, t in times.items():
        if isinstance(t, Exception):
            raise t
    return {k: t.median_us for k, t in times.items()}


def _measured_guard(graph, vtog, oracle, result, exe, model, example_inputs, seed, cuda_graph):
    """(result, executable, record): the search's, or a reference's where that measures faster: ``none`` (no
    virtual tensors, each group in its cheapest implementation) and, where the oracle allows Inductor,
    ``inductor`` (no virtual tensors, every group Inductor's: torch.compile's program), so a mispriced kernel
    never makes the model slower than torch.compile either."""
    from solvers import GUARD_REFERENCES, SolverRefused, get_solver

    from .codegen.realize import realize
    refs: dict[str, Any] = {}
    for n in GUARD_REFERENCES:   # each strategy built once: one the search's pick or an earlier one repeats is not
        try:
            r = get_solver(n)(vtog, oracle, seed=seed)
        except SolverRefused:    # ``inductor`` where the oracle leaves Inductor out
            continue
        if all(r.strategy != s.strategy for s in [result, *refs.values()]):
            refs[n] = r
    if not refs:
        return result, exe, {"search_us": None, "none_us": None, "kept": "search (same as none)"}
    exes = {"search": exe, **{n: realize(graph, r.strategy, model) for n, r in refs.items()}}
    us = time_executables(exes, model, example_inputs, cuda_graph=cuda_graph)
    kept = min(us, key=lambda k: (us[k], k != "search"))      # ties: the search's pick
    record = {"search_us": us["search"], **{f"{n}_us": us[n] for n in refs}, "kept": kept}
    if kept == "search":
        return result, exe, record
    ref = refs[kept]
    ref.info["guard"] = record
    return ref, exes[kept], record

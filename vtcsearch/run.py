"""End-to-end experiment runner: ``python -m vtcsearch.run CONFIG`` (also the ``vtcsearch`` command).

    python -m vtcsearch.run configs/llama.yaml                      # GPU if there is one, else CPU
    python -m vtcsearch.run configs/tiny.yaml --device cpu --out /tmp/tiny
    python -m vtcsearch.run configs/llama.yaml --solvers none,ilp --batch 1 --quick

For every case of the config's workload and every batch size:
build (meta device on a CPU) -> capture (torch.export + fusion) -> VTOG ->
each solver with the cost oracle -> validate -> realize -> numerics against
eager -> benchmark against the baselines, then write ``<out>/``:

``summary.csv`` / ``summary.json``  one row per (case, batch, variant); schema in the README
``kernels.csv``                     per-kernel breakdown of each solver's strategy (the oracle's rows)
``numerics.csv``                    each realized strategy against eager (outputs and mutated buffers)
``vtog/``                           VTOG JSON per case, points-to pictures, chosen strategies (JSON)
``latency.png`` ``memory.png`` ``breakdown.png``    plots
``report.md``                       the Markdown report

On a GPU, vtcsearch's executables and the baselines are timed side by side in
this process (:func:`experiments.baselines.run_variant`).  Without one, nothing
can be timed: the model is a meta-device shell, the search uses the analytical
H200 profile, latencies are *modelled*, and numerics are checked on a
scaled-down copy realized through Triton's interpreter (the report says so).
Where: a GPU run writes to the config's ``output`` folder; a CPU (modelled) run to
``<output>-modelled/`` (git-ignored), and an explicit ``--out`` holding measured results is
refused unless ``--force``.  Every file is replaced atomically (:mod:`vtcsearch.atomic`).
Exit status: 0; 1 if a numerics check or a whole case failed (the other cases still run and
are reported); 2 for a bad config or arguments.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import math
import os
import re
import sys
import tempfile
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from solvers import GUARD_REFERENCES

from . import atomic, floors
from .codegen.interpreter import ensure_interpreter
from .codegen.timing import machine
from .config import Config, ConfigError, check_solvers, load_config, solver_objective, split_solver, torch_dtype
from .schema import INT_FIELDS, NUMERICS_FIELDS, ROW_FIELDS, SCHEMA_VERSION, VariantKind, solver_of, variant_name  # noqa: F401

QUICK_BUDGETS = {"ilp": 10.0, "optuna": 30.0}      # --quick caps these solver budgets
QUICK_SKIPS = {"compile_max_autotune": "skipped by --quick (autotuning takes minutes)"}


# ---------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------
def case_label(params: dict[str, Any], default: str) -> str:
    """A readable name of a case: string values as they are, others as key=value."""
    parts = [str(v) if isinstance(v, str) else f"{k}={v}" for k, v in params.items()]
    return ",".join(parts) or default


def file_id(label: str, batch: int) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", label.replace("=", "")).strip("_") + f"-bs{batch}"


def first_line(e: BaseException) -> str:
    s = str(e).strip()
    return f"{type(e).__name__}: {s.splitlines()[0][:300]}" if s else type(e).__name__


def tensors_of(x: Any) -> list:
    import torch
    from torch.utils._pytree import tree_leaves
    return [t for t in tree_leaves(x) if isinstance(t, torch.Tensor)]


def errors(a, b) -> tuple[float, float]:
    """(relative norm error, max abs error) of ``a`` against reference ``b`` (in float64)."""
    a64, b64 = a.double(), b.double()
    diff = (a64 - b64).nan_to_num(nan=math.inf)
    rel = float(diff.norm() / max(float(b64.norm()), 1e-30)) if diff.numel() else 0.0
    return rel, float(diff.abs().max()) if diff.numel() else 0.0


class Log:
    """Progress lines on stderr (rich), kept for ``log.txt``."""

    def __init__(self, quiet: bool = False):
        from rich.console import Console
        self.console = Console(stderr=True, highlight=False)
        self.quiet = quiet
        self.lines: list[str] = []

    def __call__(self, msg: str) -> None:
        self.lines.append(msg)
        if not self.quiet:
            self.console.print(msg, markup=False, soft_wrap=True)

    @contextmanager
    def progress(self, total: int, what: str) -> Iterator[Callable[[str], None]]:
        """A rich progress bar over ``total`` steps; the yielded function advances it with a note."""
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=self.console, transient=True,
                      disable=self.quiet or not self.console.is_terminal) as bar:
            task = bar.add_task(what, total=total)

            def step(note: str) -> None:
                bar.update(task, advance=1, description=f"{what}: {note}")
            yield step


@contextmanager
def quiet_warnings() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


# ---------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------
@dataclasses.dataclass
class RunContext:
    cfg: Config
    device: str                 # "cpu" | "cuda"
    out: Path
    quick: bool
    log: Log
    oracle: Any = None          # the config's oracle
    oracles: dict[str, Any] = dataclasses.field(default_factory=dict)   # others named by solver entries
    stage: str = ""             # the step of the case in progress (for failure messages)
    steps: list[dict[str, Any]] = dataclasses.field(default_factory=list)         # steps.csv rows
    conv_layers: list[dict[str, Any]] = dataclasses.field(default_factory=list)   # conv_layers.csv rows
    profile: list[dict[str, Any]] = dataclasses.field(default_factory=list)       # profile.csv rows
    notes: list[str] = dataclasses.field(default_factory=list)
    run: dict[str, Any] = dataclasses.field(default_factory=dict)   # command, date, machine of this run
    partial: tuple | None = None   # (case, rows, strategy files) of the case in progress

    @property
    def measured(self) -> bool:
        return self.device == "cuda"

    def oracle_for(self, spec: str):
        """The oracle solver entry ``spec`` searches with: the run's, or the one it names (``ilp@analytical``),
        under the objective it names (``ilp:mix``) or the config's."""
        name = split_solver(spec)[1]
        objective = solver_objective(spec)
        if objective == self.cfg.objective:
            objective = None
        if name is None and objective is None:
            return self.oracle
        if name == "profiling" and not self.measured:
            from solvers import SolverRefused
            raise SolverRefused(f"{spec}: the profiling oracle measures kernels on a GPU; this run has none")
        key = name or self.cfg.oracle
        key = f"{key}:{objective}" if objective else key
        if key not in self.oracles:
            self.oracles[key] = make_oracle(self, name, objective)
        return self.oracles[key]

    def budget(self, spec: str) -> float | None:
        solver = split_solver(spec)[0]
        b = self.cfg.budgets.get(solver)
        if self.quick and solver in QUICK_BUDGETS:
            b = QUICK_BUDGETS[solver] if b is None else min(b, QUICK_BUDGETS[solver])
        return b


def implementation_counts(strategy) -> str:
    """``"library 3, inductor 2"``: how many kernel groups run other than as the Triton template ("" if none)."""
    from collections import Counter
    return ", ".join(f"{impl} {n}" for impl, n in sorted(Counter(strategy.impl.values()).items()))


def make_objective(cfg: Config, objective: str | None = None):
    """The config's objective, or ``objective`` (a solver entry's ``:mix``) with the config's cap and price."""
    from cost_models import Objective
    cap = int(cfg.memory_cap_gib * 2 ** 30) if cfg.memory_cap_gib is not None else None
    objective = objective or cfg.objective
    if objective == "latency":
        return Objective.latency(cap)
    if objective == "memory":
        return Objective(0.0, 1.0, cap)
    return Objective.mix(cfg.seconds_per_gib, cap)


def make_oracle(ctx: RunContext, name: str | None = None, objective: str | None = None):
    """The config's oracle (or the one named, under the objective named); ``auto`` is profiling on a GPU
    (falling back to analytical if it fails)."""
    from cost_models import get_oracle
    from cost_models.profiling import DEFAULT_MEASURE_TOP
    cfg, objective = ctx.cfg, make_objective(ctx.cfg, objective)
    name = name or cfg.oracle
    if name == "auto":
        name = "profiling" if ctx.device == "cuda" else "analytical"
    opts = dict(cfg.oracle_options)
    if name != "profiling":
        opts.pop("measure_top", None)     # the profiling oracle's (an ``ilp@analytical`` entry shares the options)
    else:   # measure what the config's hardware model ranks first (``measure_top: null``: every configuration)
        opts.setdefault("measure_top", DEFAULT_MEASURE_TOP)
        if opts["measure_top"] is not None:
            opts.setdefault("hardware", cfg.hardware)
    if name == "analytical":
        return get_oracle("analytical", hardware=opts.pop("hardware", cfg.hardware), objective=objective, **opts)
    if name == "profiling":
        opts.setdefault("db", str(ctx.out / "measurements.sqlite"))
        if ctx.device == "cuda":
            opts.setdefault("device", "cuda")
        try:
            o = get_oracle("profiling", objective=objective, **opts)
            o.progress = lambda line: ctx.log(f"   search: {line}")
            return o
        except Exception as e:
            if cfg.oracle != "auto":
                raise
            ctx.notes.append(f"profiling oracle unavailable ({first_line(e)}); searched with the analytical "
                             f"{cfg.hardware} model instead")
            ctx.log("   " + ctx.notes[-1])
            return get_oracle("analytical", hardware=cfg.hardware, objective=objective)
    opts.setdefault("hardware", cfg.hardware)
    return get_oracle(name, objective=objective, **opts)


def prepare_oracles(ctx: RunContext, vtog, case: tuple[dict[str, Any], int] | None = None,
                    share: tuple[int, int] | None = None) -> dict[str, Any] | None:
    """Precompile the candidate kernels of every profiling oracle the solvers search with (its ``prepare``:
    a process pool), before any solver asks for a cost; returns its counts per oracle (None: no profiling).

    ``prepare`` forks its workers, which CUDA does not survive.  On the GPU
    path ``case`` (its params and batch) is therefore prepared in spawned
    processes instead (:func:`_prepare_elsewhere`), each compiling its ``share`` of the candidates:
    Triton's and Inductor's on-disk caches then make this process's compiles at timing hits.  Without
    ``case`` it reports ``workers: 0`` and the kernels are compiled while timing (``fallback`` says so)."""
    from cost_models.profiling import ProfilingOracle
    from solvers import SolverRefused
    out: dict[str, Any] = {}
    seen: set[int] = set()
    elsewhere: dict[str, Any] | None = None
    for name in ctx.cfg.solvers:
        try:
            o = ctx.oracle_for(name)
        except SolverRefused:          # its solver reports why (solve_all)
            continue
        if not isinstance(o, ProfilingOracle) or id(o) in seen or \
                split_solver(name)[0] in ("none", "inductor", "all"):     # references search nothing
            continue
        seen.add(id(o))
        if case is not None and _gpu_run(ctx):
            if elsewhere is None:
                elsewhere = _prepare_elsewhere(ctx, *case)
            if o.name in elsewhere:
                out[o.name] = rep = {**elsewhere[o.name], "process": "spawned"}
                _log_prepare(ctx, f"({o.name}) in spawned processes", rep)
                continue
        rep = dict(o.prepare(vtog, share=share))
        if rep.get("to_measure") and not rep.get("workers"):
            rep["fallback"] = ("a GPU oracle forks no compile workers: compiled while timing" if ctx.measured
                               else "no parallel compile (one worker or no compile step)")
        if share is None:
            _log_prepare(ctx, f"({o.name}, {o.timer.name})", rep)
        out[o.name] = rep
    return out or None


def _log_prepare(ctx: RunContext, label: str, rep: dict[str, Any]) -> None:
    ctx.log(f"   prepare {label}: {rep['candidates']} candidate kernels, {rep['cached']} cached, "
            f"{rep['compiled']} compiled, {rep['failed']} failed on {rep['workers']} workers "
            f"({rep['seconds']:.1f} s)" + (f"; {rep['fallback']}" if "fallback" in rep else "")
            + (f"; first failure: {rep['first_error']}" if "first_error" in rep else ""))


def _prepare_elsewhere(ctx: RunContext, params: dict[str, Any], batch: int) -> dict[str, Any]:
    """:func:`prepare_oracles` of one case in one spawned process per CPU core, each a fresh interpreter that
    captures the case on the meta device, lists the same candidates and compiles its share of them.  Nothing
    forks: on the H200, workers forked from the one precompile process failed on every candidate with a CUDA
    initialization error, though ``torch.cuda.is_initialized()`` was False before the fork.  Their counts are
    summed; {} (and a note) if none of them reports."""
    import multiprocessing as mp
    import os
    import signal
    spawn = mp.get_context("spawn")
    n = max(1, min(os.cpu_count() or 1, 16))
    t0 = time.perf_counter()
    procs, pipes = [], []
    for k in range(n):
        recv, send = spawn.Pipe(duplex=False)
        p = spawn.Process(target=_prepare_case, args=(ctx.cfg, ctx.device, str(ctx.out), params, batch, (k, n),
                                                      send))
        p.start()
        send.close()
        procs.append(p)
        pipes.append(recv)
    results: list[Any] = []
    try:
        for p, recv in zip(procs, pipes):
            try:
                results.append(recv.recv())
            except EOFError:
                results.append(f"a compile process exited with code {p.exitcode}")
    finally:   # 5 s for all of them, not each: a deadline's SIGKILL follows its SIGTERM 20 s later
        until = time.monotonic() + 5
        for p in procs:
            p.join(timeout=max(0.0, until - time.monotonic()))
        for p in procs:
            if p.is_alive():      # stopped mid-way (a deadline): the process and anything it started
                try:
                    os.killpg(p.pid, signal.SIGKILL)   # its own process group (_prepare_case)
                except OSError:
                    p.kill()
                p.join(timeout=5)
    reports = [r for r in results if isinstance(r, dict)]
    if not reports:
        ctx.notes.append(f"precompiling in spawned processes failed ({results[0]}); kernels were compiled while "
                         f"timing")
        ctx.log("   " + ctx.notes[-1])
        return {}
    out: dict[str, Any] = {}
    for name in reports[0]:
        parts = [r[name] for r in reports if name in r]
        rep = {**parts[0], "seconds": time.perf_counter() - t0, "processes": len(parts)}
        for key in ("compiled", "failed", "workers"):
            rep[key] = sum(p[key] for p in parts)
        errors = [p["first_error"] for p in parts if "first_error" in p] + [r for r in results if isinstance(r, str)]
        if errors:                   # a process that failed outright compiled nothing of its share
            rep["first_error"] = errors[0]
        out[name] = rep
    return out


def _prepare_case(cfg: Config, device: str, out: str, params: dict[str, Any], batch: int,
                  share: tuple[int, int], send) -> None:
    """One spawned process of :func:`_prepare_elsewhere`: the case captured on the meta device, its profiling
    oracles' candidates listed and its ``share`` of them compiled; sends the counts (or the error, as one
    line).  It leads a process group of its own, so that a runner stopped mid-way can end it with whatever
    it started (Inductor's compile pool)."""
    import os
    try:
        os.setsid()
    except OSError:
        pass
    end_with_parent()
    try:
        import torch
        import torch._inductor.config as inductor_config

        from experiments.workloads import build_workload
        from vtcsearch.core.vtog import build_vtog
        inductor_config.compile_threads = 1   # the processes are the parallelism: no pool of its own in each
        ctx = RunContext(cfg, device, Path(out), False, Log(quiet=True))
        ctx.oracle = make_oracle(ctx)
        torch.manual_seed(cfg.seed)
        w = build_workload(cfg.workload.name, size=cfg.workload.size, batch=batch, device="meta",
                           dtype=torch_dtype(cfg.dtype), **{**cfg.workload.params, **params})
        send.send(prepare_oracles(ctx, build_vtog(capture_graph(cfg, w)), share=share) or {})
    except BaseException as e:   # one line back to the runner, which compiles while timing instead
        send.send(first_line(e))
    finally:
        send.close()


def end_with_parent(poll_s: float = 0.5) -> None:
    """End this process, and the process group it leads with whatever it started, once its parent is gone.

    A spawned compile process leads a group of its own, so a runner killed outright (the SIGKILL that follows
    a deadline's SIGTERM) cannot take it along: on the H200 16 such orphans kept 30 GB of GPU memory and their
    host memory into the next run, which was then killed (most likely for memory)."""
    import signal
    import threading
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        if os.getpgid(0) == os.getpid():
            os.killpg(0, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="end-with-parent", daemon=True).start()


def _gpu_run(ctx: RunContext) -> bool:
    """Whether this run times on the GPU (its oracles then fork no compile workers: CUDA does not survive a fork)."""
    return ctx.measured


def solve_all(ctx: RunContext, vtog, what: str) -> dict[str, Any]:
    """solver name -> SolveResult (validated), or an error string (refused / failed)."""
    from solvers import SolverRefused, get_solver
    out: dict[str, Any] = {}
    with ctx.log.progress(len(ctx.cfg.solvers), f"solve {what}") as step:
        for name in ctx.cfg.solvers:
            try:
                res = get_solver(split_solver(name)[0])(vtog, ctx.oracle_for(name), budget=ctx.budget(name),
                                                        seed=ctx.cfg.seed)
                res.strategy.validate()
                out[name] = res
            except SolverRefused as e:
                out[name] = ("skipped", str(e).splitlines()[0])
            except Exception as e:  # a solver bug must not hide the others' results; the report lists it
                out[name] = ("failed", first_line(e))
            step(name)
    return out


def unpriced_copies(graph, strategy, rows: list[dict[str, Any]]) -> list[Any]:
    """The copy kernels realization will launch (:func:`vtcsearch.codegen.realize.planned_copies`) that the
    oracle's rows do not price: a movement op's copy the model counted as fused or free, or a gather or scatter
    of a kernel's operand where the kernel's row has no operand copies.  (A copying movement op inside an
    Inductor region that gathers an input read through a map is its priced copy, run as a gather.)  Any means
    the model is wrong about what this strategy runs."""
    from vtcsearch.codegen.realize import planned_copies
    copies = {r["unit"].split("[")[0] for r in rows if r["kind"] == "copy" and not r.get("fused_into")
              and r["seconds"] > 0}
    operands = {r["unit"] for r in rows if r["kind"] == "kernel" and (r.get("library_copies") or 0) > 0}
    return [p for p in planned_copies(graph, strategy)
            if p.step not in (copies if p.kind == "copy" or p.step not in graph.groups else operands)]


def capture_graph(cfg: Config, w) -> Any:
    """The config's capture of workload ``w``: torch.export on fake tensors, then fusion (``hfuse``,
    ``prologues``), as the search, the numerics copy and the spawned precompile all see it."""
    from vtcsearch.core.capture import capture
    from vtcsearch.core.fusion import fuse_graph
    with quiet_warnings():
        graph = capture(w.model, w.example_inputs, hfuse=cfg.hfuse)
    if cfg.prologues:
        fuse_graph(graph, prologues=True)
    return graph


def host_copy(t):
    """A copy of tensor ``t`` in host memory (a reference kept for later comparison)."""
    return t.detach().to("cpu", copy=True)


class NumericsCopy:
    """A real (CPU or GPU) copy of a case, its eager reference, and each solver's realized strategy on it."""

    def __init__(self, ctx: RunContext, params: dict[str, Any], batch: int, *, size: str, dtype, device: str,
                 workload=None, graph=None, vtog=None):
        import torch
        from experiments.workloads import build_workload
        from vtcsearch.core.vtog import build_vtog
        from .api import _device_of
        self.ctx, self.size, self.batch, self.dtype = ctx, size, batch, dtype
        if workload is None:
            torch.manual_seed(ctx.cfg.seed)
            workload = build_workload(ctx.cfg.workload.name, size=size, batch=batch, device=device, dtype=dtype,
                                      **params)
            graph = capture_graph(ctx.cfg, workload)
            vtog = build_vtog(graph)
        self.w, self.graph, self.vtog = workload, graph, vtog
        self.device = _device_of(workload.model, workload.example_inputs)
        # the references live in host memory: the GPU's is the model's and the variants' (Gemma 2 9B at batch 16
        # holds 22 GB of KV caches, and three copies of them on the device left no room for the variants)
        self.saved = {n: host_copy(b) for n, b in self.w.model.named_buffers()}
        with torch.no_grad():
            out = self.w.model(*self.w.example_inputs)
        self.ref = [host_copy(t) for t in tensors_of(out)]
        self.ref_bufs = {n: host_copy(b) for n, b in self.w.model.named_buffers()}
        self.restore()
        self.ref32, self.ref32_bufs = self._fp32_reference()
        self.by_strategy: dict[tuple, dict[str, Any]] = {}   # (edges, implementations) -> its check
        self.none_outs: list | None = None
        self.solved: dict[str, Any] = {}

    def _fp32_reference(self) -> tuple[list | None, dict[str, Any]]:
        """Outputs and buffers of an fp32 run of a half-precision model (None otherwise): the yardstick that
        tells rounding differences from wrong answers when kernels round differently from eager.

        The model is converted in place and back (half -> fp32 -> half is exact; the buffers the run wrote are
        restored), so the GPU needs room for the fp32 version only, not for a copy beside it: Gemma 2 9B at
        batch 16 (41 GB) then fits an H200, where a deep copy and its fp32 version (123 GB) did not.  Where the
        GPU has no room for it (the same case on an 80 GB H100), the fp32 model runs on the host instead."""
        import torch
        if self.dtype not in (torch.float16, torch.bfloat16):
            return None, {}
        from experiments.baselines import model_bytes
        model = self.w.model
        grow = model_bytes(model)      # fp32 is twice half; the half tensors are freed as they convert
        where = self.device
        if self.device.type == "cuda" and 1.1 * grow > torch.cuda.mem_get_info(self.device)[0]:
            # the fp32 model, and the copy of its fp32 buffers kept as the reference
            host = 2 * grow + 2 * sum(b.nbytes for b in model.buffers() if b.is_floating_point())
            if 1.1 * host > os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"):
                self.ctx.log(f"   no fp32 reference: it needs {grow / 2**30:.1f} GiB more than the GPU has free, "
                             f"or {host / 2**30:.1f} GiB of host memory; numerics are judged against eager alone")
                return None, {}
            where = torch.device("cpu")
            self.ctx.log(f"   fp32 reference on the host: it needs {grow / 2**30:.1f} GiB more than the GPU has free")
        inputs = [x.to(where, torch.float32 if x.is_floating_point() else x.dtype) if isinstance(x, torch.Tensor)
                  else x for x in self.w.example_inputs]
        state = [(t, t.dtype, t.device) for t in [*model.parameters(), *model.buffers()]]
        try:
            with torch.no_grad():
                for t, _, _ in state:       # tensor by tensor: each half tensor is freed as its fp32 one lands
                    t.data = t.data.to(where, torch.float32 if t.is_floating_point() else t.dtype)
                ref = [host_copy(t) for t in tensors_of(model(*inputs))]
                bufs = {n: host_copy(b) for n, b in model.named_buffers()}
        except torch.OutOfMemoryError as e:
            self.ctx.log(f"   no fp32 reference: {first_line(e)}; numerics are judged against eager alone")
            ref, bufs = None, {}
        except Exception as e:              # on the host: a model that keeps device tensors of its own
            if where == self.device:
                raise
            self.ctx.log(f"   no fp32 reference on the host: {first_line(e)}; numerics are judged against eager alone")
            ref, bufs = None, {}
        finally:
            for t, dtype, dev in state:
                t.data = t.data.to(dev, dtype)
            self.restore()                  # the buffers the fp32 run wrote
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        return ref, bufs

    def _close(self, got, eager, ref32) -> bool:
        """Within rtol/atol of eager, or (half precision) no further from fp32 than eager's own rounding."""
        import torch
        cfgn = self.ctx.cfg.numerics
        if got.shape != eager.shape:
            return False
        got, eager = got.to(self.device), eager.to(self.device)   # host copies, compared on the model's device
        if bool(torch.allclose(got.float(), eager.float(), rtol=cfgn.rtol, atol=cfgn.atol)):
            return True
        if ref32 is None or ref32.shape != got.shape:
            return False
        ref32 = ref32.to(self.device)
        mine, base = errors(got, ref32)[0], errors(eager, ref32)[0]
        return mine <= cfgn.fp32_factor * base + 1e-6

    def errors(self, a, b) -> tuple[float, float]:
        """:func:`errors` of two host copies, computed on the model's device."""
        return errors(a.to(self.device), b.to(self.device))

    def restore(self) -> None:
        for n, b in self.w.model.named_buffers():
            b.copy_(self.saved[n])

    def check_exe(self, solver: str, strategy, exe=None) -> dict[str, Any]:
        """Run ``strategy`` (realizing it unless ``exe`` is given) and compare with eager."""
        import torch
        from vtcsearch.codegen.realize import realize
        rec: dict[str, Any] = {"solver": solver, "size": self.size, "batch": self.batch,
                               "dtype": str(self.dtype).replace("torch.", "")}
        # the implementations are part of it: ``inductor`` has ``none``'s edges and other kernels
        key = (frozenset(strategy.edges), frozenset(strategy.impl.items()))
        if exe is None and key in self.by_strategy:
            prev = self.by_strategy[key]
            return {**prev, **rec, "same_strategy_as": prev["solver"]}
        try:
            with quiet_warnings():   # the interpreter warns about the NaN poison of unwritten scratch
                if exe is None:
                    exe = realize(self.graph, strategy, self.w.model)
                outs = [host_copy(o) for o in exe(*self.w.example_inputs)]
            bufs = {n: host_copy(b) for n, b in self.w.model.named_buffers()}
        except Exception as e:
            rec.update(ok=False, error=first_line(e))
            self.restore()
            return rec
        finally:
            self.restore()
        summ = exe.summary()
        rec.update(kernels=summ["kernels"], copy_kernels=summ["copy_kernels"], fallbacks=len(summ["fallbacks"]))
        if len(outs) != len(self.ref):
            rec.update(ok=False, error=f"{len(outs)} outputs, eager returns {len(self.ref)}")
            return rec
        ok, rel, mx, nan = True, 0.0, 0.0, False
        rel32 = eager32 = None
        for k, (o, r) in enumerate(zip(outs, self.ref)):
            nan |= bool(torch.isnan(o).any()) and not bool(torch.isnan(r).any())
            e_rel, e_max = self.errors(o, r)
            rel, mx = max(rel, e_rel), max(mx, e_max)
            r32 = self.ref32[k] if self.ref32 is not None else None
            ok &= self._close(o, r, r32)
            if r32 is not None and r32.shape == o.shape:
                rel32 = max(rel32 or 0.0, self.errors(o, r32)[0])
                eager32 = max(eager32 or 0.0, self.errors(r, r32)[0])
        brel = bmax = 0.0
        for n, r in self.ref_bufs.items():
            e_rel, e_max = self.errors(bufs[n], r)
            brel, bmax = max(brel, e_rel), max(bmax, e_max)
            ok &= self._close(bufs[n], r, self.ref32_bufs.get(n))
        rec.update(ok=bool(ok and not nan), rel_err=rel, max_abs_err=mx, buffers_rel_err=brel,
                   buffers_max_abs_err=bmax, has_nan=nan, rel_err_fp32=rel32, eager_rel_err_fp32=eager32,
                   error=None)
        if solver == "none":
            self.none_outs = outs + [bufs[n] for n in sorted(bufs)]
        if self.none_outs is not None:
            mine = outs + [bufs[n] for n in sorted(bufs)]
            rec["bitwise_equal_none"] = all(torch.equal(a, b) for a, b in zip(mine, self.none_outs))
        self.by_strategy[key] = rec
        return rec

    def check_solver(self, solver: str) -> dict[str, Any]:
        """Solve this copy's VTOG with ``solver`` (same oracle and budget) and check the realized result."""
        from solvers import SolverRefused, get_solver
        try:
            res = get_solver(split_solver(solver)[0])(self.vtog, self.ctx.oracle_for(solver),
                                                      budget=self.ctx.budget(solver), seed=self.ctx.cfg.seed)
            res.strategy.validate()
        except SolverRefused as e:
            return {"solver": solver, "size": self.size, "batch": self.batch, "ok": None,
                    "error": f"refused on the {self.size} copy: {str(e).splitlines()[0]}"}
        except Exception as e:
            return {"solver": solver, "size": self.size, "batch": self.batch, "ok": False, "error": first_line(e)}
        return self.check_exe(solver, res.strategy)


def run_case(ctx: RunContext, params: dict[str, Any], batch: int, numerics_cache: dict,
             kernel_rows: list, numerics_rows: list) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One (case, batch): returns the case record and its summary rows."""
    import torch
    from experiments.baselines import model_bytes
    from experiments.workloads import build_workload
    from vtcsearch.core.vtog import build_vtog

    cfg, log = ctx.cfg, ctx.log
    label = case_label(params, cfg.workload.name)
    fid = file_id(label, batch)
    dtype = torch_dtype(cfg.dtype)
    full_params = {**cfg.workload.params, **params}
    log(f"== {label}, batch {batch}")

    ctx.stage = "build"
    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    device = "cuda" if ctx.measured else "meta"
    w = build_workload(cfg.workload.name, size=cfg.workload.size, batch=batch, device=device, dtype=dtype,
                       **full_params)
    t_build = time.perf_counter() - t0
    ctx.stage = "capture"
    t0 = time.perf_counter()
    graph = capture_graph(cfg, w)
    t_capture = time.perf_counter() - t0
    ctx.stage = "VTOG construction"
    t0 = time.perf_counter()
    vtog = build_vtog(graph)
    t_vtog = time.perf_counter() - t0
    gs, vs = graph.summary(), vtog.summary()
    log(f"   {w.name}: {gs['kernels']} kernels, {gs['movement_ops']} movement ops; VTOG {vs['nodes']} nodes, "
        f"{vs['edges']} edges, {vs['candidates']} candidates (capture {t_capture:.1f} s)")
    (ctx.out / "vtog").mkdir(exist_ok=True)
    atomic.write_json_records(ctx.out / "vtog" / f"{fid}.json", {**vtog.to_json(), "written_by": ctx.run})
    case = {"case": label, "batch": batch, "id": fid, "workload": w.name, "description": w.description,
            "params": {**full_params, "size": cfg.workload.size}, "dtype": cfg.dtype,
            "graph": {k: gs[k] for k in ("tensors", "ops", "movement_ops", "compute_ops", "kernels",
                                         "movement_by_onnx", "parameter_bytes")},
            "vtog": {k: vs[k] for k in ("nodes", "edges", "options", "candidates", "conflicts", "edges_by_class")},
            "build_s": t_build, "capture_s": t_capture, "vtog_s": t_vtog, "best_solver": None,
            "error": None, "floor": None, "prepare": None,
            # parameters + buffers (weights, KV caches): the measured peaks are on top of it (run_variant)
            "model_bytes": model_bytes(w.model)}
    hw = hw_dev = None
    if cfg.breakdown.floors:
        # measured latencies are set against the floor of the GPU that measures them, the model's predictions
        # against its own hardware's
        hw = floors.hardware(cfg.hardware)
        hw_dev = floors.hardware(floors.preset_of(torch.cuda.get_device_name(), cfg.hardware)) if ctx.measured \
            else hw
        case["floor"] = floors.case_floor(graph, hw_dev, dtype)
        log(f"   floor {case['floor']['floor_us']:.1f} us ({case['floor']['floor_bytes'] / 1e6:.1f} MB, "
            f"{hw_dev.name} at {hw_dev.bandwidth / 1e12:.2f} TB/s)")

    # search
    ctx.stage = "search"
    rows: list[dict[str, Any]] = []
    strategy_files: dict[str, tuple[Path, dict[str, Any]]] = {}   # variant -> (path, strategy JSON)
    ctx.partial = (case, rows, strategy_files)      # what a stopped run keeps of this case (run_config)
    case["prepare"] = prepare_oracles(ctx, vtog, (params, batch))
    results = solve_all(ctx, vtog, f"{label} bs{batch}")
    acc = ctx.oracle.accounting(vtog)
    evals: dict[str, Any] = {}
    unit_floors: dict[str, dict[str, float | None]] = {}     # solver -> unit -> floor us
    for name, res in results.items():
        row = {"case": label, "batch": batch, "workload": w.name, "variant": variant_name(name), "kind": VariantKind.VTCSEARCH,
               "solver": name}
        if isinstance(res, tuple):
            row.update(status=res[0], reason=res[1])
            log(f"   {name:10s} {res[0]}: {res[1]}")
            rows.append(row)
            continue
        ev = ctx.oracle_for(name).evaluate(res.strategy)     # predicted by the oracle that searched
        why = unpriceable(ev)
        if why:     # no finite price: the search had nothing to choose from, and its pick is no result
            results[name] = ("failed", why)
            row.update(status="failed", reason=why)
            log(f"   {name:10s} failed: {why}")
            rows.append(row)
            continue
        evals[name] = ev
        s = res.strategy
        kern = [r for r in ev.rows if r["seconds"] > 0]
        row.update(status="ok", reason=None, predicted_latency_us=ev.latency_s * 1e6, objective=ev.objective,
                   predicted_peak_bytes=ev.peak_bytes,
                   predicted_activation_peak_bytes=(ev.peak_bytes - acc.const_bytes) if ev.peak_bytes is not None
                   else None,
                   kernels=len(kern), movement_kernels=sum(r["kind"] == "copy" for r in kern),
                   movement_us=sum(r["seconds"] for r in kern if r["kind"] == "copy") * 1e6,
                   compute_us=sum(r["seconds"] for r in kern if r["kind"] != "copy") * 1e6,
                   virtual_tensors=len(s.virtual), eliminated_ops=len(s.eliminated_ops()),
                   implementations=implementation_counts(s),
                   residual_copies=len(s.residuals), solver_status=res.status, solve_wall_s=res.wall_s,
                   oracle_calls=res.oracle_calls, unit_queries=res.unit_queries, measurements=res.measurements)
        unpriced = unpriced_copies(vtog.graph, s, ev.rows)
        if unpriced:
            log(f"   {name}: realization launches {len(unpriced)} copies the model did not price "
                f"({sum(p.bytes for p in unpriced) / 2**20:.1f} MiB), e.g. {unpriced[0]}")
        for r in ev.rows:
            krow = {"case": label, "batch": batch, "variant": variant_name(name), "solver": name,
                    "source": ctx.oracle_for(name).name, "us": r["seconds"] * 1e6, **r}
            if hw is not None:   # a prediction against its model's hardware; steps timed here against this GPU's
                on_dev = floors.kernel_floor_us(r, hw_dev, dtype)
                krow["floor_us"] = floors.kernel_floor_us(r, hw, dtype) if krow["source"] == "analytical" else on_dev
                krow["x_floor"] = floors.ratio(krow["us"], krow["floor_us"])
                unit_floors.setdefault(name, {})[r["unit"]] = on_dev
            kernel_rows.append(krow)
        # written with the case's rows (below), so a stopped run never leaves a strategy nobody measured
        strategy_files[variant_name(name)] = (ctx.out / "strategies" / f"{fid}_{name}.json",
                                              {**s.to_json(), "written_by": ctx.run})
        log(f"   {name:10s} predicted {ev.latency_s * 1e6:10.1f} us, {len(s.virtual)} virtual, "
            f"{len(s.eliminated_ops())} ops eliminated, {row['movement_kernels']} copies "
            f"({res.status}, {res.wall_s:.1f} s)")
        rows.append(row)

    # pictures of the chosen points-to graphs
    ok_names = [n for n in results if n in evals]
    if ok_names:
        # the objectives of entries searching another objective (``ilp:mix``) or with another oracle
        # (``ilp@analytical`` beside a profiling search, which predicts other times) are not comparable
        same = [n for n in ok_names if ctx.oracle_for(n) is ctx.oracle] or ok_names
        case["best_solver"] = min(same, key=lambda n: evals[n].objective)
    if ok_names and cfg.draw != "none":
        best = case["best_solver"]
        for name in (ok_names if cfg.draw == "all" else [best]):
            try:
                from .plotting import draw_vtog
                draw_vtog(vtog, str(ctx.out / "vtog" / f"{fid}_{name}.png"), chosen=set(results[name].strategy.edges),
                          title=f"{w.name} bs{batch}: points-to graph of {name}")
            except Exception as e:   # a picture must not sink the run
                ctx.notes.append(f"could not draw the {name} points-to graph of {label} bs{batch}: {first_line(e)}")

    # numerics and benchmark
    ctx.stage = "benchmark" if ctx.measured else "numerics"
    if ctx.measured:
        guard = case["guard"] = gpu_benchmark(ctx, w, graph, results, rows, label, batch, numerics_rows,
                                              unit_floors, case["best_solver"])
        if guard is None and case["best_solver"] not in (None, *GUARD_REFERENCES) and \
                not any(r in results for r in GUARD_REFERENCES):
            ctx.notes.append(f"case {label} bs{batch}: unguarded, neither none nor inductor was among the solvers: "
                             f"{variant_name(case['best_solver'])} is the search's pick as it measured")
        if guard and guard["kept"] != guard["solver"]:
            kept = variant_name(guard["kept"])
            ctx.notes.append(f"case {label} bs{batch}: the guard kept {kept} ({guard[guard['kept'] + '_us']:.1f} us) "
                             f"over {variant_name(guard['solver'])} ({guard['search_us']:.1f} us), as "
                             f"vtcsearch.compile would; the evaluation reports {kept} for it")
    else:
        cpu_numerics(ctx, params, full_params, batch, label, results, rows, numerics_cache, numerics_rows)
        for name in cfg.baselines:
            reason = ("needs CUDA: on this machine the model is a meta-device shell and nothing is timed "
                      "(vtcsearch latencies are modelled)")
            rows.append({"case": label, "batch": batch, "workload": w.name, "variant": name, "kind": VariantKind.BASELINE,
                         "status": "skipped", "reason": reason})
    finish_rows(rows, ctx.measured, case)
    write_strategies(strategy_files)
    return case, rows


def unpriceable(ev) -> str | None:
    """Why an evaluated strategy has no finite latency (None when it has one): the units the oracle could not
    price in it, and the first one's error (a reference timer's size cap on an LM head, a kernel that fails)."""
    if math.isfinite(ev.latency_s):
        return None
    bad = [r for r in ev.rows if not math.isfinite(r["seconds"])]
    err = next((r.get("error") for r in bad if r.get("error")), None)
    return (f"no finite-cost strategy: the oracle cannot price {len(bad)} unit(s) of the search's pick, e.g. "
            f"{bad[0]['unit'] if bad else '?'}" + (f" ({err})" if err else ""))


def write_strategies(files: dict[str, tuple[Path, dict[str, Any]]], variants: set[str] | None = None) -> None:
    """The chosen strategies (of ``variants`` only, when given) as JSON under ``strategies/``."""
    for variant, (path, data) in files.items():
        if variants is None or variant in variants:
            path.parent.mkdir(exist_ok=True)
            atomic.write_json(path, data, indent=1)


def cpu_numerics(ctx: RunContext, params, full_params, batch, label, results, rows, cache, numerics_rows) -> None:
    """Each solver's strategy of a scaled-down CPU copy, realized through the interpreter, against eager."""
    n = ctx.cfg.numerics
    if not n.enabled:
        return
    nb = n.batch or batch
    dtype = torch_dtype(n.dtype or ctx.cfg.dtype)
    copy_params = {**full_params, **n.params}
    key = (json.dumps(copy_params, sort_keys=True, default=str), n.size, nb, str(dtype))
    copy = cache.get(key)
    if copy is None:
        ensure_interpreter()
        t0 = time.perf_counter()
        copy = cache[key] = NumericsCopy(ctx, copy_params, nb, size=n.size, dtype=dtype, device="cpu")
        ctx.log(f"   numerics copy ({n.size}, batch {nb}, {str(dtype).replace('torch.', '')}, CPU interpreter) "
                f"built in {time.perf_counter() - t0:.1f} s")
    names = [nm for nm, r in results.items() if not isinstance(r, tuple)]
    with ctx.log.progress(len(names), f"numerics {label}") as step:
        for name in names:
            rec = copy.solved.get(name)
            if rec is None:
                rec = copy.solved[name] = copy.check_solver(name)
                numerics_rows.append({"case": label, **rec})
                ctx.log(f"   numerics {name:10s} " + (
                    f"ok={rec['ok']} rel err {rec.get('rel_err', math.nan):.2e} "
                    f"max abs {rec.get('max_abs_err', math.nan):.2e}"
                    + (f" (same strategy as {rec['same_strategy_as']})" if rec.get("same_strategy_as") else "")
                    if rec.get("error") is None else f"{'skipped' if rec['ok'] is None else 'FAILED'}: {rec['error']}"))
            step(name)
            for row in rows:
                if row.get("solver") == name:
                    row.update(numerics_ok=rec.get("ok"), numerics_size=f"{n.size}/bs{nb}",
                               numerics_rel_err=rec.get("rel_err"), numerics_max_abs_err=rec.get("max_abs_err"),
                               fallbacks=rec.get("fallbacks"))


def gpu_benchmark(ctx: RunContext, w, graph, results, rows, label, batch, numerics_rows,
                  unit_floors: dict[str, dict[str, float | None]], best: str | None = None) -> dict[str, Any] | None:
    """Realize each strategy at full size and time it beside the baselines, in this process; check numerics;
    with ``breakdown.steps`` / ``conv_layers``, time each step / conv kernel of each executable alone.
    Every variant is built, sized, profiled and checked first (its row lands in ``rows`` then); then all of
    them are timed side by side, in interleaved rounds.  Returns :func:`measured_guard`'s record for the
    search's pick ``best``."""
    import torch

    from .breakdown import conv_layer_rows, step_rows
    from experiments.baselines import Variant, baseline_variants, call_bytes, is_movement_kernel, run_variant
    from vtcsearch.codegen.inductor import clear_compiled_regions
    from vtcsearch.codegen.realize import realize

    cfg, log = ctx.cfg, ctx.log
    copy = NumericsCopy(ctx, {}, batch, size=cfg.workload.size, dtype=w.dtype, device="cuda",
                        workload=w, graph=graph, vtog=None) if cfg.numerics.enabled else None
    model, inputs = w.model, w.example_inputs
    saved = copy.saved if copy is not None else {n: host_copy(b) for n, b in model.named_buffers()}

    def restore() -> None:
        for n, b in model.named_buffers():
            b.copy_(saved[n])

    exes: dict[str, Any] = {}
    build_s: dict[str, float] = {}      # solver -> seconds to realize (compile and autotune every kernel)
    plain_bytes: dict[str, int | None] = {}  # solver -> bytes a plain call allocates (graph replays allocate none)
    variants: list[Variant] = []
    base_names = list(cfg.baselines)
    for name in base_names:
        if ctx.quick and name in QUICK_SKIPS:
            variants.append(Variant(name, None, skipped=QUICK_SKIPS[name]))
        else:
            variants += baseline_variants(model, inputs, [name])
    twins: dict[str, str] = {}          # solver -> the earlier one with the same strategy, built and timed once
    built: list[str] = []
    for name, res in results.items():
        if isinstance(res, tuple):
            continue
        twin = next((n for n in built if results[n].strategy == res.strategy), None)
        if twin is not None:    # ``inductor`` is often ``none`` (an LLM's groups all priced cheapest on Inductor)
            twins[name] = twin
            continue
        built.append(name)

        def build(name=name, s=res.strategy):
            # realized inside build, so the variant's peak memory counts its own storages
            t0 = time.perf_counter()
            # the inputs read in place, as the baselines read them (no copy in, no slab bytes for them); a bare
            # replay is then a whole call
            exes[name] = realize(graph, s, model, inputs=inputs)
            build_s[name] = time.perf_counter() - t0
            plain_bytes[name] = call_bytes(lambda: exes[name](*inputs))   # buffers: restored after the build
            return exes[name].cuda_graph(*inputs).replay
        variants.append(Variant(variant_name(name), build,
                                own_bytes=lambda name=name: exes[name].allocated_bytes,
                                call_bytes=lambda name=name: plain_bytes.get(name)))
    by_variant = {r["variant"]: r for r in rows}
    ready: dict[str, tuple[Any, bool]] = {}      # variant -> (call, capture it in a CUDA graph), timed together below
    try:   # build, size, profile and check each variant; its call waits in ready
        with log.progress(len(variants), f"benchmark {label} bs{batch}") as step:
            for var in variants:
                m, fn = run_variant(var, timed=False)
                torch.cuda.synchronize()
                restore()
                row = by_variant.get(var.name)
                if row is None:
                    row = {"case": label, "batch": batch, "workload": w.name, "variant": var.name,
                           "kind": VariantKind.BASELINE}
                    rows.append(row)
                    by_variant[var.name] = row
                if m.skipped:
                    not_run(ctx, row, m.skipped)
                else:
                    ready[var.name] = (fn, var.cuda_graph)
                    row.update(status="ok", measured_peak_bytes=m.peak_memory_bytes, kernels=m.kernels,
                               movement_kernels=m.movement_kernels, movement_us=m.movement_us, compute_us=m.compute_us,
                               build_s=m.build_s)     # a baseline's compile time (build + first call); vtc: below
                    ctx.profile += [{"case": label, "batch": batch, "variant": var.name, "kernel": k, "calls": c,
                                     "us": us, "movement": is_movement_kernel(k)}
                                    for k, (c, us) in sorted(m.profile.items(), key=lambda kv: -kv[1][1])]
                    log(f"   {var.name:22s} built: peak {(m.peak_memory_bytes or 0) / 2 ** 20:.1f} MiB, "
                        f"{m.kernels} kernels ({m.movement_kernels} movement)")
                name = solver_of(var.name)
                if name in exes:
                    ex = exes[name]
                    row.update(fallbacks=len(ex.summary()["fallbacks"]), build_s=build_s.get(name),
                               executable_bytes=ex.allocated_bytes)
                    # what of the peak the executable's own memory explains (the rest: Inductor's buffers, the
                    # CUDA graph's pool, library workspaces)
                    log(f"   {'':22s} executable holds {ex.allocated_bytes / 2 ** 20:.1f} MiB (slab "
                        f"{ex.arena.plan.slab_bytes / 2 ** 20:.1f} MiB, {ex.arena.scratch_in_slab} scratch in it); "
                        f"built in " + ", ".join(f"{k} {v:.1f} s" for k, v in
                                                 sorted(ex.build_seconds.items(), key=lambda kv: -kv[1])))
                where = {"case": label, "batch": batch, "variant": var.name}
                if name in exes and cfg.breakdown.steps:
                    ctx.steps += [{**where, **r} for r in step_rows(exes[name], unit_floors.get(name, {}))]
                    restore()
                if name in exes and cfg.breakdown.conv_layers:
                    ctx.conv_layers += [{**where, **r} for r in conv_layer_rows(graph, exes[name])]
                    restore()
                if copy is not None and name in exes:
                    rec = copy.check_exe(name, results[name].strategy, exe=exes[name])
                    numerics_rows.append({"case": label, **rec})
                    row.update(numerics_ok=rec.get("ok"), numerics_size=f"{cfg.workload.size}/bs{batch}",
                               numerics_rel_err=rec.get("rel_err"), numerics_max_abs_err=rec.get("max_abs_err"))
                    log(f"   {'':22s} numerics vs eager: ok={rec.get('ok')} rel err {rec.get('rel_err', math.nan):.2e}"
                        + (f" {rec['error']}" if rec.get("error") else ""))
                step(var.name)
    except RunInterrupted:      # stopped mid-case (a deadline): what was built is still timed, and kept
        time_side_by_side(ctx, ready, by_variant, restore, twins)
        raise
    same = [r for r in GUARD_REFERENCES if best in results and r in results and not isinstance(results[r], tuple)
            and results[best].strategy == results[r].strategy]
    as_built = dict(ready)      # a pick whose strategy an earlier solver's repeats is guarded as that one's build
    if best in twins and variant_name(twins[best]) in ready:
        as_built[variant_name(best)] = ready[variant_name(twins[best])]
    try:
        guard = measured_guard(ctx, as_built, best, restore, same)
    except RunInterrupted:      # the deadline came while guarding: the report's timing still runs
        time_side_by_side(ctx, ready, by_variant, restore, twins)
        raise
    time_side_by_side(ctx, ready, by_variant, restore, twins)
    exes.clear()
    ready.clear()
    torch.cuda.empty_cache()
    torch._dynamo.reset()      # drop the compiled baselines and regions of this case before the next one
    clear_compiled_regions()
    return guard


# what a solver's row takes from the row of the earlier solver whose strategy it repeats (gpu_benchmark)
TWIN_FIELDS = ("status", "measured_latency_us", "measured_p20_us", "measured_p80_us", "timing_rounds",
               "measured_peak_bytes", "executable_bytes", "kernels", "movement_kernels", "movement_us", "compute_us",
               "fallbacks", "build_s", "numerics_ok", "numerics_size", "numerics_rel_err", "numerics_max_abs_err")


def measured_guard(ctx: RunContext, ready: dict[str, tuple[Any, bool]], best: str | None,
                   restore: Callable[[], None], same: Sequence[str] = ()) -> dict[str, Any] | None:
    """``vtcsearch.compile``'s guard, in the runner: the search's pick ``best`` and the references built (``none``:
    no virtual tensors, each group in its cheapest implementation; ``inductor``: no virtual tensors, every group
    Inductor's, torch.compile's program) timed against each other, apart from the side-by-side timing that the
    report shows; the fastest is the case's vtcsearch result (the case's ``guard``).  A mispriced strategy then
    costs what compiling without virtual tensors costs, as it does for a user.  ``same``: the references whose
    strategy is the pick's (nothing to time).  None: nothing to guard (the pick is a reference, or none was
    built)."""
    from vtcsearch.codegen.timing import bench_side_by_side
    a = variant_name(best) if best else None
    built = [r for r in GUARD_REFERENCES if variant_name(r) in ready]
    if best in (None, *GUARD_REFERENCES) or a not in ready or not built:
        return None
    refs = [r for r in built if r not in same]
    if not refs:
        return guard_record(best, None)
    times = bench_side_by_side({v: ready[v] for v in [a, *map(variant_name, refs)]}, rounds=ctx.cfg.timing_rounds)
    restore()
    us = {v: None if isinstance(t, Exception) else t.median_us for v, t in times.items()}
    rec = guard_record(best, us[a], **{f"{r}_us": us[variant_name(r)] for r in refs})
    shown = ", ".join(f"{variant_name(k)} {'-' if us[variant_name(k)] is None else f'{us[variant_name(k)]:.1f}'} us"
                      for k in [best, *refs])
    ctx.log(f"   guard: {shown}: kept {variant_name(rec['kept'])}")
    return rec


def guard_record(best: str, search_us: float | None, none_us: float | None = None,
                 inductor_us: float | None = None) -> dict[str, Any]:
    """Which of the search's pick and the references the guard keeps: the fastest reference only where it measured
    faster than the pick (``inductor_us`` is recorded where that reference was timed)."""
    rec: dict[str, Any] = {"solver": best, "search_us": search_us, "none_us": none_us}
    if inductor_us is not None:
        rec["inductor_us"] = inductor_us
    timed = {r: t for r, t in (("none", none_us), ("inductor", inductor_us)) if t is not None}
    kept = best
    if search_us is not None and timed:
        fastest = min(timed, key=timed.__getitem__)
        kept = fastest if timed[fastest] < search_us else best
    return {**rec, "kept": kept}


def time_side_by_side(ctx: RunContext, ready: dict[str, tuple[Any, bool]], by_variant: dict[str, dict[str, Any]],
                      restore: Callable[[], None], twins: dict[str, str] | None = None) -> None:
    """Time every built variant of a case in interleaved rounds (:func:`bench_side_by_side`), so no variant's
    ratio is what drifted in the process between its timing and another's; the latencies land in the rows.
    ``twins``: solver -> the earlier solver whose strategy it repeats, not built again: its row takes that one's."""
    from vtcsearch.codegen.timing import bench_side_by_side
    times = bench_side_by_side(ready, rounds=ctx.cfg.timing_rounds) if ready else {}
    if ready:
        restore()
    for name, t in times.items():
        row = by_variant[name]
        if isinstance(t, Exception):
            not_run(ctx, row, f"timing: {first_line(t)}")
            continue
        row.update(measured_latency_us=t.median_us, measured_p20_us=t.p20_us, measured_p80_us=t.p80_us,
                   timing_rounds=ctx.cfg.timing_rounds)
        ctx.log(f"   {name:22s} {t.median_us:10.1f} us (p20 {t.p20_us:.1f}, p80 {t.p80_us:.1f}, {t.samples} samples)")
    for name, twin in (twins or {}).items():
        src, row = by_variant.get(variant_name(twin)), by_variant.get(variant_name(name))
        if src is not None and row is not None and src.get("status"):
            row.update({k: src[k] for k in TWIN_FIELDS if k in src},
                       reason=f"the strategy of {variant_name(twin)}: built and timed once, as that row")


def not_run(ctx: RunContext, row: dict[str, Any], reason: str) -> None:
    """A variant that could not be built or timed: a baseline is skipped, a vtcsearch variant failed."""
    row.update(status="skipped" if row["kind"] == VariantKind.BASELINE else "failed", reason=reason)
    ctx.log(f"   {row['variant']:22s} {row['status']}: {reason}")


def failed_case(ctx: RunContext, params: dict[str, Any], batch: int, e: Exception
                ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The record of a case that could not be built, captured or searched: every variant failed, with why."""
    import traceback
    cfg = ctx.cfg
    label = case_label(params, cfg.workload.name)
    where = traceback.extract_tb(e.__traceback__)[-1]
    reason = f"{ctx.stage}: {first_line(e)} (raised at {Path(where.filename).name}:{where.lineno} in {where.name})"
    ctx.log(f"   CASE FAILED: {reason}")
    ctx.notes.append(f"case {label} bs{batch} failed: {reason}")
    case = {"case": label, "batch": batch, "id": file_id(label, batch), "workload": cfg.workload.name,
            "description": "", "params": {**cfg.workload.params, **params, "size": cfg.workload.size},
            "dtype": cfg.dtype, "graph": {}, "vtog": {}, "build_s": 0.0, "capture_s": 0.0, "vtog_s": 0.0,
            "best_solver": None, "error": reason, "floor": None, "prepare": None, "model_bytes": None}
    rows = [{"case": label, "batch": batch, "workload": cfg.workload.name, "variant": variant_name(s),
             "kind": VariantKind.VTCSEARCH, "solver": s, "status": "failed", "reason": reason} for s in cfg.solvers]
    rows += [{"case": label, "batch": batch, "workload": cfg.workload.name, "variant": b, "kind": VariantKind.BASELINE,
              "status": "failed", "reason": "the case failed before benchmarking"} for b in cfg.baselines]
    finish_rows(rows, ctx.measured)
    return case, rows


def finish_rows(rows: list[dict[str, Any]], measured: bool, case: dict[str, Any] | None = None) -> None:
    """Headline latency (measured where there is one), speedups, floor ratios, and every field present.

    The best baseline is the best run of the same model code: reference baselines (other code, such as
    the hand-written model) are reported beside it, not counted.
    """
    from experiments.baselines import REFERENCE_BASELINES
    for r in rows:
        for f in ROW_FIELDS:
            r.setdefault(f, None)
        if r["measured_latency_us"] is not None:
            r["latency_us"], r["latency_source"] = r["measured_latency_us"], "measured"
        elif r["predicted_latency_us"] is not None and not measured:
            r["latency_us"], r["latency_source"] = r["predicted_latency_us"], "modelled"
    none = next((r for r in rows if r["variant"] == variant_name("none") and r["latency_us"]), None)
    base = [r for r in rows if r["kind"] == VariantKind.BASELINE and r["measured_latency_us"]
            and r["variant"] not in REFERENCE_BASELINES]
    # a speedup is a ratio measured side by side in one process: against the best baseline as the row's own run
    # measured it (rows of one run share command and date; this run's have neither yet); against another run's
    # (a case run in pieces) only where the row's run did not measure that baseline, and the row says so
    top = min(base, key=lambda b: b["measured_latency_us"], default=None)
    for r in rows:
        if r["latency_us"]:
            if none is not None:
                r["speedup_vs_none"] = none["latency_us"] / r["latency_us"]
            mine = [b for b in base if _run_of(b) == _run_of(r)]
            same = top is not None and any(b["variant"] == top["variant"] for b in mine)
            best = min(b["measured_latency_us"] for b in mine) if same else top and top["measured_latency_us"]
            if best and r["measured_latency_us"]:
                r["speedup_vs_best_baseline"] = best / r["measured_latency_us"]
                r["baseline_same_process"] = same
            set_floor(r, case)


def _run_of(row: dict[str, Any]) -> tuple[Any, Any]:
    """The run (process) a row was measured in."""
    return row.get("command"), row.get("date")


def run_config(cfg: Config, *, device: str, out: Path, quick: bool = False, command: str = "",
               log: Log | None = None, append: bool = False) -> dict[str, Any]:
    """Run every case and batch of ``cfg`` and write the results under ``out``; returns summary.json's content.

    The folder is rewritten after every case, so a run cut short keeps what it finished.  ``append``
    keeps the cases of an earlier run in ``out`` that this one does not redo (a config run in pieces,
    e.g. one batch size per call); every run's command, machine and date are listed under ``runs``.
    """
    import torch
    log = log or Log()
    out.mkdir(parents=True, exist_ok=True)
    if device == "cpu":
        ensure_interpreter()
    ctx = RunContext(cfg, device, out, quick, log)
    t_start = time.perf_counter()
    torch.manual_seed(cfg.seed)
    ctx.oracle = make_oracle(ctx)
    if not ctx.measured:
        ctx.notes.append(f"No GPU was used: every latency is modelled by the {ctx.oracle.name} cost model "
                         f"({ctx.oracle.describe().get('hardware', cfg.hardware)} profile), not measured; numerics "
                         f"were checked on a {cfg.numerics.size} copy through Triton's CPU interpreter.")
    if os.environ.get("VTC_REUSED_AUTOTUNE"):   # set by experiments/h200.sh when it restored carried autotuning
        ctx.notes.append(f"Autotuning reused the choices of {os.environ['VTC_REUSED_AUTOTUNE']}: Inductor's GEMM "
                         "and convolution timings (its local autotune cache, keyed by GPU name, Triton and CUDA; "
                         "the same for vtcsearch's regions and the torch.compile baselines) and vtcsearch's "
                         "template choices (same GPU, torch, Triton and template source): build times leave out "
                         "that compiling and benchmarking.")
    log(f"vtcsearch run {cfg.name}: {cfg.description or cfg.workload.name} | device {device} | oracle "
        f"{ctx.oracle.name} | objective {cfg.objective}" + (" | quick" if quick else ""))
    ctx.run = this_run = {"command": command, "machine": machine(device),
                          "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    summary = {
        "schema_version": SCHEMA_VERSION, "name": cfg.name, "description": cfg.description,
        "config_path": cfg.path, **this_run, "wall_s": None, "measured": ctx.measured,
        "oracle": ctx.oracle.describe(), "objective": cfg.objective, "config": cfg.to_dict(),
        "cases": [], "rows": [], "numerics": [], "notes": ctx.notes, "files": {}, "runs": [this_run],
        "steps": ctx.steps, "conv_layers": ctx.conv_layers,      # breakdown.steps / conv_layers (GPU)
        "profile": ctx.profile,                                  # every measured variant's kernels (GPU)
    }
    kernel_rows: list[dict[str, Any]] = []
    plan = [(i, p, b) for i, p in enumerate(cfg.workload.cases)
            for b in cfg.workload.batches_of(i, cfg.batch_sizes)]
    if not plan:
        raise ConfigError(f"no case runs at batch size(s) {cfg.batch_sizes}: every case's own batch_sizes "
                          f"exclude them")
    earlier = None          # what the folder held before this run (--append): a failed case keeps its rows
    if append:
        earlier = Earlier.read(out)
        kernel_rows = keep_earlier(earlier, summary, {(case_label(p, cfg.workload.name), b) for _, p, b in plan},
                                   redo=variants_of(cfg))
    numerics_cache: dict = {}
    lost: str | None = None   # a CUDA fault ends the process's GPU work: the cases after it are not run
    for _, params, b in plan:
        ctx.partial = None
        try:
            if lost is not None:
                ctx.stage = "not run"
                raise GpuLost(f"{lost}; run it in a new process (--cases ... --append)")
            case, r = run_case(ctx, params, b, numerics_cache, kernel_rows, summary["numerics"])
        except Exception as e:   # one broken case (a capture the core cannot handle) must not sink the others
            case, r = failed_case(ctx, params, b, e)
            if lost is None and is_cuda_fault(e):
                lost = f"the GPU faulted in {case['case']} bs{b} ({first_line(e)})"
            if earlier is not None and earlier.restore(summary, kernel_rows, (case["case"], b), variants_of(cfg)):
                ctx.notes.append(f"case {case['case']} bs{b} failed in this run: the folder keeps its earlier rows")
                write_summary(out, summary, kernel_rows, log, time.perf_counter() - t_start)
                continue
        except RunInterrupted:   # told to stop (a timeout): keep what this case measured, then stop
            kept = {r["variant"] for r in measured_rows(ctx)}
            # what this run would have redone but did not measure: the folder's earlier rows of it stay
            if earlier is not None:
                earlier.restore(summary, kernel_rows, (case_label(params, cfg.workload.name), b),
                                variants_of(cfg) - kept)
            if ctx.partial is not None:
                keep_measured(ctx, summary, kernel_rows, append, log, time.perf_counter() - t_start)
            else:
                write_summary(out, summary, kernel_rows, log, time.perf_counter() - t_start)
            raise
        for o in [ctx.oracle, *ctx.oracles.values()]:
            o.note_errors(ctx.notes)       # exceptions inside the oracle: counted, reported (issue 11)
        if append:
            merge_case(summary, case, r)
        else:
            summary["cases"].append(case)
            summary["rows"] += r
        write_summary(out, summary, kernel_rows, log, time.perf_counter() - t_start)
    numerics_cache.clear()
    return summary


class RunInterrupted(BaseException):
    """The run was told to stop (SIGTERM, as ``timeout`` sends it): not an error of a case, so ``except
    Exception`` does not catch it."""


def _interrupt(signum: int, frame: Any) -> None:
    raise RunInterrupted(f"signal {signum}")


def measured_rows(ctx: RunContext) -> list[dict[str, Any]]:
    """The rows of the case in progress that were measured on the GPU (none before its benchmark)."""
    if ctx.partial is None or not ctx.measured:
        return []
    return [r for r in ctx.partial[1] if r.get("measured_latency_us") is not None]


def keep_measured(ctx: RunContext, summary: dict[str, Any], kernel_rows: list[dict[str, Any]], append: bool,
                  log: Log, wall_s: float) -> None:
    """Write the variants of the case in progress that were measured before the run was stopped, as a finished
    case's are; the others are dropped (an appended run has put the folder's earlier rows of them back), with a
    note."""
    case, rows, strategy_files = ctx.partial
    kept = measured_rows(ctx)
    dropped = sorted({r["variant"] for r in rows} - {r["variant"] for r in kept})
    ctx.notes.append(f"the run was stopped during the {ctx.stage} of {case['case']} bs{case['batch']}: "
                     f"{len(kept)} measured variant(s) kept" + (f", {', '.join(dropped)} not measured" if dropped
                                                                else ""))
    log(f"   STOPPED during {ctx.stage}: kept {', '.join(r['variant'] for r in kept) or 'nothing'}")
    if not kept:
        write_summary(ctx.out, summary, kernel_rows, log, wall_s)
        return
    names = {r["variant"] for r in kept}
    write_strategies(strategy_files, names)
    kernel_rows[:] = [k for k in kernel_rows if (k["case"], k["batch"]) != (case["case"], case["batch"])
                      or k["variant"] in names]
    finish_rows(kept, ctx.measured, case)
    if append:
        merge_case(summary, case, kept)
    else:
        summary["cases"].append(case)
        summary["rows"] += kept
    write_summary(ctx.out, summary, kernel_rows, log, wall_s)


def set_floor(row: dict[str, Any], case: dict[str, Any] | None) -> None:
    """``row``'s floor and its latency over it, on the GPU that measured the row (:func:`floors.row_floor_us`)."""
    floor_us = floors.row_floor_us(case, row) if case and row.get("latency_us") else None
    if floor_us:
        row["floor_us"], row["x_floor"] = floor_us, row["latency_us"] / floor_us


def refresh_floors(summary: dict[str, Any]) -> None:
    """Every row against its case's floor, as :func:`finish_rows` sets a case's rows: a case an appended run did
    not redo keeps rows an older run wrote, which may predate floors per GPU (an H100 row set against the
    H200's floor)."""
    cases = {(c.get("case"), c.get("batch")): c for c in summary.get("cases", [])}
    for r in summary.get("rows", []):
        set_floor(r, cases.get((r.get("case"), r.get("batch"))))


def write_summary(out: Path, summary: dict[str, Any], kernel_rows: list[dict[str, Any]], log: Log,
                  wall_s: float) -> None:
    """Every output file of the run so far (summary.json last: it lists the others)."""
    from . import report
    summary["wall_s"] = wall_s
    refresh_floors(summary)
    settle_notes(summary)
    labels = [case_label(p, summary["config"]["workload"]["name"]) for p in summary["config"]["workload"]["cases"]]
    order = lambda r: (labels.index(r["case"]) if r["case"] in labels else len(labels), r["batch"])  # noqa: E731
    for key in ("cases", "rows", "numerics", "steps", "conv_layers", "profile"):   # config order, whatever order
        summary.setdefault(key, []).sort(key=order)                      # pieces ran in (in place: ctx fills them)
    summary["rows"] = [{f: r.get(f) for f in ROW_FIELDS} for r in report.with_provenance(summary["rows"], summary)]
    latest = {(r.get("case"), r.get("batch"), r.get("size"), r.get("solver")): r for r in summary["numerics"]}
    summary["numerics"] = [{f: r.get(f) for f in NUMERICS_FIELDS}   # appended runs: last wins
                           for r in report.with_provenance(list(latest.values()), summary)]
    report.write_all(out, summary, kernel_rows, log)
    atomic.write_json(out / "summary.json", summary if _finite(summary) else _clean(summary), indent=1, default=str,
                      allow_nan=False)
    atomic.write_text(out / "log.txt", "\n".join(log.lines) + "\n")


class OutputError(Exception):
    """The output folder cannot be used (a file, read-only, corrupt, or holding measured results): exit 2."""


def modelled_folder(output: str | Path) -> Path:
    """Where a run without a GPU writes by default: ``<output>-modelled`` (git-ignored), never ``output``."""
    p = Path(output)
    return p.parent / f"{p.name}-modelled"


def read_summary(path: Path) -> dict[str, Any]:
    """An earlier run's summary.json; a truncated or corrupt one is a one-line :class:`OutputError`."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:     # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise OutputError(f"{path} is truncated or corrupt ({first_line(e)}): move it away or choose another "
                          f"--out") from None
    if not isinstance(data, dict) or not isinstance(data.get("rows", []), list):
        raise OutputError(f"{path} is not a vtcsearch summary.json: move it away or choose another --out")
    return data


def prepare_out(out: Path, *, measured: bool, force: bool, append: bool = False) -> None:
    """Check and create the output folder before anything runs; every refusal is one line (OutputError).

    A run without a GPU never replaces measured results: a folder whose summary.json says
    ``measured`` is refused unless ``force``.
    """
    if out.exists() and not out.is_dir():
        raise OutputError(f"--out {out}: is a file, not a folder")
    above = next((p for p in out.parents if p.exists() and not p.is_dir()), None)
    if above is not None:
        raise OutputError(f"--out {out}: {above} is a file, not a folder")
    summary = out / "summary.json"
    if append and summary.exists():
        read_summary(summary)          # a corrupt one is refused before anything runs
    if not measured and not force and summary.exists() and read_summary(summary).get("measured"):
        raise OutputError(f"--out {out}: holds measured (GPU) results ({summary}); this run has no GPU and would "
                          f"replace them with modelled ones: choose another --out, or add --force")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as e:
        raise OutputError(f"--out {out}: cannot write there ({e.strerror or first_line(e)})") from None


def variants_of(cfg: Config) -> set[str]:
    """The variant names (rows) a run of ``cfg`` produces for each of its cases."""
    return {variant_name(s) for s in cfg.solvers} | set(cfg.baselines)


def keep_earlier(earlier: "Earlier | None", summary: dict[str, Any], plan: set[tuple[str, int]],
                 redo: set[str] | None = None) -> list[dict[str, Any]]:
    """Move what an earlier run in the output folder holds and this run does not redo into ``summary``;
    returns the earlier kernel rows kept.

    Cases outside ``plan`` are kept whole.  Of a planned case, the rows of variants outside ``redo`` are kept
    too (with their kernel and numerics rows), so a case can be run in pieces: the solvers in one call, the
    baselines (``--solvers -``) in another.  :func:`merge_case` then merges the new case record into the old.
    """
    from . import report
    if earlier is None:
        return []
    old, path = earlier.summary, earlier.path
    if old.get("name") != summary["name"] or old.get("measured") != summary["measured"]:
        raise ConfigError(f"--append: {path} holds {old.get('name')!r} "
                          f"({'measured' if old.get('measured') else 'modelled'}), not this run's "
                          f"{summary['name']!r} ({'measured' if summary['measured'] else 'modelled'})")
    redo = set() if redo is None else redo
    keep = lambda r: (r["case"], r["batch"]) not in plan   # noqa: E731
    keep_row = lambda r: keep(r) or r.get("variant") not in redo   # noqa: E731
    solver_redo = {solver_of(v) for v in redo if solver_of(v) is not None}
    summary["cases"] = list(old["cases"])                 # planned ones are merged as they finish
    summary["rows"] = report.with_provenance([r for r in old["rows"] if keep_row(r)], old)   # the old run's,
    summary["numerics"] = report.with_provenance(                                         # where a row has none
        [r for r in old["numerics"] if keep(r) or r.get("solver") not in solver_redo], old)
    measured_by = {(r["case"], r["batch"], r["variant"]): r for r in summary["rows"]}   # each with its run's
    for key in ("steps", "conv_layers", "profile"):   # in place: the run context appends to these lists
        summary[key][:0] = [report.with_provenance([r], measured_by.get((r["case"], r["batch"], r.get("variant")),
                                                                        old))[0]
                            for r in old.get(key, []) if keep_row(r)]
    summary["notes"][:0] = [n for n in old.get("notes", []) if n not in summary["notes"]]
    summary["runs"][:0] = old.get("runs") or [{k: old[k] for k in ("command", "date", "machine")}]
    return [r for r in earlier.kernels if keep_row(r)]


class GpuLost(RuntimeError):
    """A case not run because an earlier case's CUDA fault ended the process's GPU work."""


def is_cuda_fault(e: BaseException) -> bool:
    """A sticky CUDA error (an illegal memory access, a device-side assert, a launch failure): the context is
    unusable for the rest of the process, so every later case would fail the same way."""
    text = str(e)
    return any(s in text for s in ("illegal memory access", "device-side assert", "unspecified launch failure",
                                   "illegal instruction", "misaligned address"))


@dataclasses.dataclass
class Earlier:
    """What an output folder held before an ``--append`` run: the rows of a planned case that fails in this
    run are put back, so a failed piece never replaces measurements (a fault, a machine taken back)."""
    path: Path                       # its summary.json
    summary: dict[str, Any]
    kernels: list[dict[str, Any]]    # its kernels.csv
    vtogs: dict[str, bytes] = dataclasses.field(default_factory=dict)   # vtog/*.json, which its strategies index

    @classmethod
    def read(cls, out: Path) -> "Earlier | None":
        """The folder's summary and kernel rows; None for a folder with no summary.json."""
        import pandas as pd
        path = out / "summary.json"
        if not path.exists():
            return None
        old = read_summary(path)
        vtogs = {p.name: p.read_bytes() for p in sorted((out / "vtog").glob("*.json"))}
        kpath = out / "kernels.csv"
        if not kpath.exists() or kpath.stat().st_size == 0:
            return cls(path, old, [], vtogs)
        try:
            kdf = pd.read_csv(kpath)
        except (OSError, ValueError) as e:       # pandas' parser errors are ValueErrors
            raise OutputError(f"--append: {kpath} is unreadable or corrupt ({first_line(e)})") from None
        return cls(path, old, kdf.to_dict("records"), vtogs)

    def restore(self, summary: dict[str, Any], kernel_rows: list[dict[str, Any]], key: tuple[str, int],
                redo: set[str]) -> bool:
        """Put back the earlier rows of case ``key`` that this run dropped (its ``redo`` variants, with their
        numerics, steps, profile and kernel rows); False where the folder had no measured row of it."""
        from . import report
        old = self.summary
        mine = lambda r: (r.get("case"), r.get("batch")) == key and r.get("variant") in redo   # noqa: E731
        rows = [r for r in old["rows"] if mine(r)]
        if not any(r.get("measured_latency_us") is not None or r.get("predicted_latency_us") is not None
                   for r in rows):
            return False
        solvers = {solver_of(v) for v in redo if solver_of(v) is not None}
        summary["rows"] += report.with_provenance(rows, old)
        summary["numerics"] += report.with_provenance(
            [r for r in old["numerics"] if (r.get("case"), r.get("batch")) == key and r.get("solver") in solvers], old)
        for k in ("steps", "conv_layers", "profile"):
            summary[k] += [r for r in old.get(k, []) if mine(r)]
        kernel_rows += [r for r in self.kernels if mine(r)]
        # the case's VTOG as the restored strategies index it (this run may have written its own capture's)
        name = f"{file_id(*key)}.json"
        if name in self.vtogs:
            atomic.write_bytes(self.path.parent / "vtog" / name, self.vtogs[name])
        return True


def merge_case(summary: dict[str, Any], case: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """Add one finished (case, batch) to an appended ``summary``: its rows replace the same variants' earlier
    rows (the others stay), its record is merged over the earlier one (an earlier ``best_solver``, search or
    compile times survive a baselines-only piece), and speedups are recomputed over all the case's rows."""
    same = lambda r: (r["case"], r["batch"]) == (case["case"], case["batch"])   # noqa: E731
    mine = {r["variant"] for r in rows}
    old_rows = [r for r in summary["rows"] if same(r) and r["variant"] not in mine]
    summary["rows"] = [r for r in summary["rows"] if not same(r)]
    merged = old_rows + rows
    for r in merged:                       # recomputed below from the merged rows
        r["speedup_vs_none"] = r["speedup_vs_best_baseline"] = r["baseline_same_process"] = None
    finish_rows(merged, bool(summary.get("measured")), case)
    summary["rows"] += merged
    old = next((c for c in summary["cases"] if same(c)), None)
    if old is not None:
        summary["cases"].remove(old)
        if not case.get("error"):
            forget_failure(summary, case)
            keep = {k: v for k, v in old.items() if v is not None and case.get(k) is None and k != "error"}
            if not any(r["kind"] == VariantKind.VTCSEARCH and r.get("status") == "ok" for r in rows):
                keep["best_solver"] = old.get("best_solver")     # a baselines-only piece chose no solver
            else:
                keep.pop("guard", None)          # it guarded the earlier pick, not this piece's
            case = {**case, **keep}
    summary["cases"].append(case)


def forget_failure(summary: dict[str, Any], case: dict[str, Any]) -> None:
    """An earlier failure of ``case`` is over (a later piece measured it): its error and its note go.  A failed
    H200 run's OOM stayed on Gemma 2 9B bs 16 after an H100 piece measured the case."""
    case["error"] = None
    failed = f"case {case['case']} bs{case['batch']} failed: "
    summary["notes"] = [n for n in summary.get("notes", []) if not n.startswith(failed)]


STOPPED_NOTE = re.compile(r"the run was stopped during the .+? of (?P<case>\S+) bs(?P<batch>\d+): \d+ measured "
                          r"variant\(s\) kept, (?P<missing>.+) not measured$")
GUARD_NOTE = re.compile(r"case (?P<case>\S+) bs(?P<batch>\d+): (the guard kept|unguarded)")


def settle_notes(summary: dict[str, Any]) -> None:
    """Notes that later pieces made wrong go: a stopped run's note that variants of a case went unmeasured once
    they are all measured (Swin-T's stayed beside the rows a later call measured), and a guard's verdict on a
    case once a later piece guarded it again (only the last one stays, and none where the case's guard now
    kept the search's pick)."""
    measured = {(r.get("case"), r.get("batch"), r.get("variant")) for r in summary.get("rows", [])
                if r.get("status") == "ok" and r.get("measured_latency_us") is not None}
    pick_kept = {(c.get("case"), str(c.get("batch"))) for c in summary.get("cases", [])
                 if isinstance(c.get("guard"), dict) and c["guard"].get("kept") == c["guard"].get("solver")}
    notes = summary.setdefault("notes", [])
    last_guard = {(m["case"], m["batch"]): i for i, n in enumerate(notes) if (m := GUARD_NOTE.match(n))}

    def settled(i: int, note: str) -> bool:
        if (m := GUARD_NOTE.match(note)) is not None:
            key = (m["case"], m["batch"])
            return last_guard[key] != i or (m.group(3) == "the guard kept" and key in pick_kept)
        m = STOPPED_NOTE.match(note)
        return m is not None and all((m["case"], int(m["batch"]), v) in measured for v in m["missing"].split(", "))
    notes[:] = [n for i, n in enumerate(notes) if not settled(i, n)]   # in place: a run's context appends to it


def settle_failures(summary: dict[str, Any]) -> None:
    """``--rewrite``: a case recorded as failed whose rows all ran (none failed) was measured by a later piece."""
    for c in summary.get("cases", []):
        rows = [r for r in summary.get("rows", []) if (r.get("case"), r.get("batch")) == (c["case"], c["batch"])]
        if c.get("error") and rows and all(r.get("status") != "failed" for r in rows):
            forget_failure(summary, c)


def _finite(x: Any) -> bool:
    try:
        json.dumps(x, default=str, allow_nan=False)
        return True
    except ValueError:
        return False


def _clean(x: Any) -> Any:
    """inf/nan -> null, so summary.json is strict JSON."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


# ---------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m vtcsearch.run",
                                 description="Run an experiment config end to end: search, realize, check numerics, "
                                             "benchmark, and write CSV/JSON/plots/report.md to the output folder.")
    ap.add_argument("config", help="experiment config (configs/*.yaml)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default=None,
                    help="cuda: measure on the GPU; cpu: model latencies, check numerics in the interpreter "
                         "(default: cuda when there is one)")
    ap.add_argument("--out", default=None, help="output folder (default: the config's output)")
    ap.add_argument("--solvers", default=None, help="comma-separated solvers, replacing the config's ('-': none, "
                                                     "baselines only; with --append the solvers' rows stay)")
    ap.add_argument("--cases", default=None,
                    help="comma-separated case labels to run (as report.md names them), a subset of the config's")
    ap.add_argument("--batch", nargs="+", type=int, default=None, metavar="N",
                    help="batch sizes, replacing the config's")
    ap.add_argument("--oracle", default=None, help="cost oracle (auto, analytical, profiling, recorded), "
                                                     "replacing the config's")
    ap.add_argument("--baselines", default=None, help="comma-separated baselines, replacing the config's ('-': none)")
    ap.add_argument("--implementations", default=None,
                    help="comma-separated kernel implementations the search may choose (triton,library,inductor); "
                         "sets oracle_options.implementations")
    ap.add_argument("--hfuse", action="store_true",
                    help="merge GEMMs that read the same activation with constant weights (sets the config's hfuse)")
    ap.add_argument("--prologues", action="store_true",
                    help="fold a row norm into the decode GEMM that reads it (sets the config's prologues)")
    ap.add_argument("--quick", action="store_true",
                    help=f"cap solver budgets ({', '.join(f'{k} {v:g}' for k, v in QUICK_BUDGETS.items())}) and "
                         f"skip {', '.join(QUICK_SKIPS)}")
    ap.add_argument("--append", action="store_true",
                    help="keep what the output folder already holds that this run does not redo: other cases, "
                         "and of a case it runs, the variants it does not run (a config in pieces: one --batch "
                         "per call, or --solvers - for the baselines and --baselines - for the solvers)")
    ap.add_argument("--force", action="store_true",
                    help="let a run without a GPU write into a folder holding measured results")
    ap.add_argument("--quiet", action="store_true", help="no progress lines (the summary table is still printed)")
    ap.add_argument("--rewrite", action="store_true",
                    help="run nothing: write the output folder's report, CSVs and plots again from its summary.json "
                         "and kernels.csv with this code (derived fields such as floors per GPU); the "
                         "measurements, commands and dates stay as they are")
    return ap.parse_args(argv)


def rewrite(out: Path) -> int:
    """``--rewrite``: the folder's files written again from what it holds; nothing is run or measured."""
    try:
        earlier = Earlier.read(out)
    except OutputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if earlier is None:
        print(f"error: --rewrite: {out}/summary.json does not exist", file=sys.stderr)
        return 2

    class KeptLog(Log):      # log.txt is the runs' own: the rewrite adds nothing to it
        def __call__(self, msg: str) -> None:
            pass
    log = KeptLog(quiet=True)
    path = out / "log.txt"
    log.lines = path.read_text().splitlines() if path.exists() else []
    summary = earlier.summary
    settle_failures(summary)
    write_summary(out, summary, earlier.kernels, log, summary.get("wall_s") or 0.0)
    print(f"rewrote {out}/ from its summary.json ({len(summary.get('rows', []))} rows)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The ``vtcsearch`` command."""
    args = parse_args(argv)
    try:
        cfg = load_config(args.config)
        if args.solvers is not None:
            cfg.solvers = [] if args.solvers.strip() == "-" else [s.strip() for s in args.solvers.split(",")
                                                                   if s.strip()]
            check_solvers(cfg.solvers, "--solvers", allow_empty=args.solvers.strip() == "-")
        if args.oracle is not None:
            from cost_models import ORACLES
            if args.oracle != "auto" and args.oracle not in ORACLES:
                raise ConfigError(f"--oracle: unknown oracle {args.oracle!r}; choices: auto, {', '.join(ORACLES)}")
            cfg.oracle = args.oracle
        if args.implementations is not None:
            from vtcsearch.core.implementation import check_name
            try:
                impls = [check_name(i.strip()) for i in args.implementations.split(",") if i.strip()]
            except ValueError as e:
                raise ConfigError(f"--implementations: {e}") from None
            cfg.oracle_options = {**cfg.oracle_options, "implementations": impls}
        if args.baselines is not None:
            from experiments.baselines import BASELINES
            cfg.baselines = [] if args.baselines.strip() == "-" else [b.strip() for b in args.baselines.split(",")
                                                                       if b.strip()]
            bad = [b for b in cfg.baselines if b not in BASELINES]
            if bad:
                raise ConfigError(f"--baselines: unknown {bad}; choices: {', '.join(BASELINES)}")
        if args.cases is not None:
            want = [c.strip() for c in args.cases.split(",") if c.strip()]
            w = cfg.workload
            labels = {case_label(p, w.name): i for i, p in enumerate(w.cases)}
            bad = [c for c in want if c not in labels]
            if bad or not want:
                raise ConfigError(f"--cases: unknown {bad}; choices: {', '.join(labels)}")
            keep = [labels[c] for c in dict.fromkeys(want)]
            own = [w.case_batch_sizes[i] if i < len(w.case_batch_sizes) else None for i in keep]
            w.cases, w.case_batch_sizes = [w.cases[i] for i in keep], own
        cfg.hfuse = cfg.hfuse or args.hfuse
        cfg.prologues = cfg.prologues or args.prologues
        if args.batch is not None:
            if any(b < 1 for b in args.batch):
                raise ConfigError("--batch: batch sizes must be >= 1")
            cfg.batch_sizes = list(dict.fromkeys(args.batch))
    except ConfigError as e:
        print(f"ConfigError: {e}", file=sys.stderr)
        return 2
    import torch
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda: no CUDA device here (use --device cpu for modelled latencies)", file=sys.stderr)
        return 2
    if device == "cpu":
        try:
            ensure_interpreter()    # before anything imports vtcsearch.codegen.kernels
        except RuntimeError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    # a modelled run never lands in the config's folder of committed (measured) results
    out = Path(args.out) if args.out else Path(cfg.output) if device == "cuda" else modelled_folder(cfg.output)
    if args.rewrite:
        return rewrite(Path(args.out) if args.out else Path(cfg.output))
    try:
        prepare_out(out, measured=device == "cuda", force=args.force, append=args.append)
    except OutputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    command = "python -m vtcsearch.run " + " ".join(sys.argv[1:] if argv is None else list(argv))
    if os.environ.get("VTC_INDUCTOR_CONFIG"):   # it changes vtcsearch's kernels: part of the command
        command = f"VTC_INDUCTOR_CONFIG='{os.environ['VTC_INDUCTOR_CONFIG']}' {command}"
    from vtcsearch.codegen import layout
    if layout.enabled():   # the executables' storage layouts: likewise
        command = f"VTC_CHANNELS_LAST={os.environ['VTC_CHANNELS_LAST']} {command}"
    log = Log(quiet=args.quiet)
    import signal
    previous = signal.signal(signal.SIGTERM, _interrupt)   # a timeout stops the run after writing what it measured
    try:
        summary = run_config(cfg, device=device, out=out, quick=args.quick, command=command, log=log,
                             append=args.append)
    except RunInterrupted:
        print(f"stopped (SIGTERM): {out}/ holds what was measured before", file=sys.stderr)
        return 124
    except ConfigError as e:
        print(f"ConfigError: {e}", file=sys.stderr)
        return 2
    except OutputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        signal.signal(signal.SIGTERM, previous)
    from .report import print_table
    print_table(summary)
    print(f"results: {out}/ (report.md, summary.json, summary.csv) in {summary['wall_s']:.0f} s")
    bad = [r for r in summary["numerics"] if r.get("ok") is False]
    broken = [c for c in summary["cases"] if c.get("error")]
    if broken:
        print(f"FAILED cases: {', '.join(c['id'] for c in broken)} (see report.md)", file=sys.stderr)
    if bad:
        print(f"NUMERICS FAILED for {len(bad)} realized strateg{'y' if len(bad) == 1 else 'ies'}: "
              + ", ".join(f"{r['case']}/{r['solver']}" for r in bad), file=sys.stderr)
    return 1 if bad or broken else 0


if __name__ == "__main__":
    sys.exit(main())

"""Profiling oracle: times the kernels a strategy changes, caching every measurement in SQLite.

A measurement is one unit (a compute kernel, or a residual copy) in one
configuration, described by a :class:`~cost_models.accounting.UnitSpec`.  The
oracle asks a pluggable **timer** ``timer(spec) -> seconds``; the cache key is
``spec.key()`` (ops, shapes, dtypes, I/O maps with storages renamed
positionally, launch configuration) plus the timer's name and the device, so
the same kernel in two layers, or in a second search, is measured once.  A
timer that raises (a kernel that fails to compile or launch) records the
configuration as infeasible (``inf``) rather than failing the search, and counts it in
``stats.errors``; a transient failure (out of memory, a timeout) is counted and never stored.

``measure_top=k`` makes a whole model's search practical (the runner and ``vtcsearch.compile`` default to
:data:`DEFAULT_MEASURE_TOP`; ``measure_top: null`` in a config measures every configuration): of each unit's
configurations only the ``k`` the analytical model ranks cheapest (and the all-physical one) are measured; every
other is the model's price
times the largest measured/modelled ratio among the unit's measured ones, so it never undercuts a measured
configuration of its unit (:meth:`ProfilingOracle.unit_cost`).  The attention unit of a Llama 3 8B decode
step alone has 906 configurations (1,761 distinct kernels for the whole model, 2026-12-05).

Two timers, both real:

* :class:`KernelTimer` (the default on a GPU) runs the unit exactly as
  :func:`vtcsearch.codegen.realize.realize` would: the kernel group through its
  lowering (the Triton templates reading and writing through the unit's maps,
  autotuned), a residual copy through the copy kernel; timed as CUDA-graph
  replays, so launch overhead is what a captured executable pays.
* :class:`ReferenceTimer` runs the kernel's ATen ops on random non-zero data,
  gathering each virtual input through its resolved map with torch indexing (a
  strided view when the map is one non-negative affine piece) and scattering
  each virtual output through its map; a residual copy is a real indexed copy.
  It needs no Triton, so it is the default on a CPU.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
import platform
import sqlite3
import time
import warnings
import weakref
from dataclasses import replace
from typing import Any, Callable, Mapping, Protocol, Sequence

import torch

from vtcsearch.core.expr import evaluate
from vtcsearch.codegen.lowering import substitute as _subst
from vtcsearch.codegen.timing import time_callable
from vtcsearch.core.mapping import IndexMap, Piece

from .accounting import PHYS, Accounting, Unit, UnitSpec
from .base import CostOracle, Objective, UnitCost, is_transient


# Configurations measured per unit unless a config says otherwise: whole ShuffleNetV2 (224x224) lists 4,571
# distinct candidate kernels when every configuration is timed, 314 with the top 8 (2026-12-06).
DEFAULT_MEASURE_TOP = 8


class Timer(Protocol):
    """Anything that times one unit: ``timer(spec) -> seconds`` with a stable ``name``."""

    name: str

    def __call__(self, spec: UnitSpec) -> float: ...


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        if not torch.cuda.is_initialized():   # ask NVML: forked compile workers need a parent without CUDA
            try:
                import subprocess
                idx = device.index or 0
                names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                       capture_output=True, text=True, timeout=20).stdout.splitlines()
                if len(names) > idx and names[idx].strip():
                    return f"cuda:{names[idx].strip()}"
            except (OSError, subprocess.SubprocessError):
                pass
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return f"cpu:{platform.processor() or platform.machine()}"


def _triton_version() -> str:
    try:
        import triton
        return triton.__version__
    except Exception:   # no Triton: the reference timer does not need it
        return "none"


def codegen_source_hash() -> str:
    """Digest of the code that generates the timed kernels (vtcsearch/codegen): a change re-measures."""
    import vtcsearch.codegen as cg
    root = os.path.dirname(os.path.abspath(cg.__file__))
    h = hashlib.sha256()
    for dirpath, dirnames, files in sorted(os.walk(root)):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for f in sorted(files):
            if f.endswith(".py"):
                with open(os.path.join(dirpath, f), "rb") as fh:
                    h.update(f.encode() + b"\0" + fh.read())
    return h.hexdigest()[:12]


def environment_key(device: torch.device, timer: Any) -> str:
    """What a measurement is valid for: GPU (or CPU) name, torch, triton and the kernel source hash.

    Stored in the ``device`` column, so one cache file holds every environment side by side and a new
    torch, triton or kernel template measures afresh instead of replaying stale timings.
    """
    src = timer.source_hash() if hasattr(timer, "source_hash") else "-"
    return f"{device_name(device)}|torch={torch.__version__}|triton={_triton_version()}|src={src}"


# ---------------------------------------------------------------------------
# the reference timer
# ---------------------------------------------------------------------------

def _random_flat(n: int, dtype: torch.dtype, device: torch.device, gen: torch.Generator) -> torch.Tensor:
    if dtype.is_floating_point:
        return (torch.rand(n, generator=gen, device="cpu") + 0.5).to(device=device, dtype=dtype)
    if dtype == torch.bool:
        return torch.ones(n, dtype=torch.bool, device=device)
    return torch.randint(1, 8, (n,), generator=gen, device="cpu").to(device=device, dtype=dtype)


class _Access:
    """How one operand is read or written: a strided view, or per-piece index tensors."""

    def __init__(self, m: IndexMap, flats: Mapping[str, torch.Tensor], strides: Mapping[str, Sequence[int]],
                 tables: Mapping[str, torch.Tensor], device: torch.device, dtype: torch.dtype):
        self.shape, self.dtype, self.device = tuple(m.shape), dtype, device
        self.view = None
        self.pieces: list[tuple[tuple[slice, ...], torch.Tensor | None, torch.Tensor | None, str | None, float]] = []
        if len(m.pieces) == 1 and self._try_view(m.pieces[0], flats, strides):
            return
        for p in m.pieces:
            sl = tuple(slice(lo, hi) for lo, hi in p.region)
            env = self._env(p, device)
            mask = None
            for ce, lo, hi in p.conds:
                v = torch.as_tensor(evaluate(ce, env, tables), device=device)
                c = (v >= lo) & (v < hi)
                mask = c if mask is None else mask & c
            if mask is not None:
                mask = torch.broadcast_to(mask, [hi - lo for lo, hi in p.region]).contiguous()
            if p.target is None:
                self.pieces.append((sl, None, mask, None, float(p.fill or 0.0)))
                continue
            off = p.offset(strides[p.target])
            idx = torch.as_tensor(evaluate(off, env, tables), device=device, dtype=torch.long)
            idx = torch.broadcast_to(idx, [hi - lo for lo, hi in p.region]).contiguous()
            self.pieces.append((sl, idx, mask, p.target, 0.0))

    @staticmethod
    def _env(p: Piece, device: torch.device) -> dict[str, Any]:
        n = len(p.region)
        env: dict[str, Any] = {}
        for k, (lo, hi) in enumerate(p.region):
            shape = [1] * n
            shape[k] = hi - lo
            env[f"i{k}"] = torch.arange(lo, hi, device=device).view(shape)
        syms = {s for e in p.index for s in e.syms()} | {s for c, _, _ in p.conds for s in c.syms()}
        env.update({s.name: s.lo for s in syms})
        return env

    def _try_view(self, p: Piece, flats, strides) -> bool:
        if p.target is None or p.conds or any((lo, hi) != (0, s) for (lo, hi), s in zip(p.region, self.shape)):
            return False
        off = p.offset(strides[p.target])
        if not off.is_affine() or off.syms():
            return False
        st = []
        for k in range(len(self.shape)):
            c = sum(cf for a, cf in off.terms if getattr(a, "name", None) == f"i{k}")
            if c < 0:
                return False
            st.append(c)
        self.view = (p.target, tuple(st), off.const)
        return True

    def read(self, flats: Mapping[str, torch.Tensor]) -> torch.Tensor:
        if self.view is not None:
            s, st, c = self.view
            return flats[s].as_strided(self.shape, st, c)
        out = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        for sl, idx, mask, target, fill in self.pieces:
            if target is None:
                vals = torch.full([x.stop - x.start for x in sl], fill, dtype=self.dtype, device=self.device)
            else:
                vals = flats[target][idx].to(self.dtype)
            if mask is None:
                out[sl] = vals
            else:
                out[sl] = torch.where(mask, vals, out[sl])
        return out

    def write(self, value: torch.Tensor, flats: Mapping[str, torch.Tensor]) -> None:
        if self.view is not None:
            s, st, c = self.view
            flats[s].as_strided(self.shape, st, c).copy_(value)
            return
        for sl, idx, mask, target, _ in self.pieces:
            if target is None:
                continue
            v = value[sl]
            if mask is None:
                flats[target][idx.reshape(-1)] = v.reshape(-1).to(flats[target].dtype)
            else:
                flats[target][idx[mask]] = v[mask].to(flats[target].dtype)


class ReferenceTimer:
    """Times a unit's reference implementation (ATen ops + indexed gathers/scatters) on a real device."""

    name = "ref-torch"

    def __init__(self, device: str | torch.device | None = None, repeats: int = 10, warmup: int = 2,
                 max_elements: int = 1 << 28, seed: int = 0):
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.repeats, self.warmup, self.max_elements, self.seed = repeats, warmup, max_elements, seed

    def launch(self, spec: UnitSpec) -> dict[str, Any]:
        return {}

    def prepare(self, spec: UnitSpec) -> Callable[[], Any]:
        """Allocate storages and index tensors; return the callable to time."""
        dev = self.device
        gen = torch.Generator().manual_seed(self.seed)
        flats: dict[str, torch.Tensor] = {}
        strides = {s: st for s, (_, st, _) in spec.storages.items()}
        for s, (shape, st, dt) in spec.storages.items():
            n = 1 + sum((d - 1) * x for d, x in zip(shape, st)) if shape else 1
            if n > self.max_elements:
                raise MemoryError(f"storage {s} has {n} elements (> {self.max_elements})")
            flats[s] = _random_flat(max(n, 1), dt, dev, gen)
        tables = random_tables(spec, dev, gen)
        accesses = [(o, _Access(o.map, flats, strides, tables, dev, o.dtype)) for o in spec.operands]
        if spec.kind == "copy":
            pairs = []
            for i in range(0, len(accesses), 2):
                dst, src = accesses[i][1], accesses[i + 1][1]
                shared = {p[3] for p in dst.pieces} | ({dst.view[0]} if dst.view else set())
                srcs = {p[3] for p in src.pieces} | ({src.view[0]} if src.view else set())
                pairs.append((dst, src, bool(shared & srcs)))   # overlapping views need a staging copy

            def run_copy() -> None:
                for dst, src, stage in pairs:
                    v = src.read(flats)
                    dst.write(v.clone() if stage and src.view is not None else v, flats)
            return run_copy
        ops = spec.ops
        reads = [(o.tensor, a) for o, a in accesses if o.role == "r"]
        writes = [(o.tensor, a) for o, a in accesses if o.role == "w"]

        def run_kernel() -> None:
            env = {t: a.read(flats) for t, a in reads}
            for op in ops:
                node = op.node
                args = _subst(node.args, env, dev)
                kwargs = _subst(dict(node.kwargs), env, dev)
                res = node.target(*args, **kwargs)
                vals = [r for r in res if isinstance(r, torch.Tensor)] if isinstance(res, (tuple, list)) else [res]
                for name, val in zip(op.outputs, vals):
                    env[name] = val
            for t, a in writes:
                a.write(env[t], flats)
        return run_kernel

    def __call__(self, spec: UnitSpec) -> float:
        fn = self.prepare(spec)
        with torch.no_grad():
            return time_callable(fn, self.device, self.repeats, self.warmup)


def random_tables(spec: UnitSpec, dev: torch.device, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Index tensors for a spec's indirect maps: random entries within the bounds the maps promise."""
    bounds: dict[str, tuple[int, int]] = {}
    for o in spec.operands:
        for p in o.map.pieces:
            for e in list(p.index) + [c for c, _, _ in p.conds]:
                for lk in e.lookups():
                    lo, hi = bounds.get(lk.table, (lk.lo, lk.hi))
                    bounds[lk.table] = (max(lo, lk.lo), min(hi, lk.hi))
    out = {}
    for name, (lo, hi) in bounds.items():
        shape = spec.tables.get(name, ((1,), torch.long))[0]
        out[name] = torch.randint(lo, max(lo, hi) + 1, tuple(shape), generator=gen).to(dev)
    return out


# ---------------------------------------------------------------------------
# the kernel timer: the unit as realize runs it
# ---------------------------------------------------------------------------

class KernelTimer:
    """Times a unit through :mod:`vtcsearch.codegen.lowering` (kernels) or the copy kernel (residual copies)."""

    name = "vtc-kernels"

    def __init__(self, device: str | torch.device | None = None, repeats: int = 10, warmup: int = 2,
                 launches_per_graph: int = 10, max_elements: int = 1 << 30, seed: int = 0):
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.repeats, self.warmup, self.per_graph = repeats, warmup, launches_per_graph
        self.max_elements, self.seed = max_elements, seed

    def launch(self, spec: UnitSpec) -> dict[str, Any]:
        return {}

    def source_hash(self) -> str:
        return codegen_source_hash()

    def compile(self, spec: UnitSpec) -> None:
        """Lower (compile and autotune) the unit once without timing it: fills Triton's on-disk cache."""
        fn = self.prepare(spec)
        fn()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def prepare(self, spec: UnitSpec) -> Callable[[], Any]:
        """Storages with random data, the unit lowered onto them (compiled and autotuned): its launch."""
        from vtcsearch.codegen.kernels import Operand, copy_pieces
        from vtcsearch.codegen.library import lower_as
        from vtcsearch.codegen.lowering import Context

        if spec.graph is None:
            raise ValueError("the kernel timer needs UnitSpec.graph (specs come from Accounting.spec)")
        dev = self.device
        gen = torch.Generator().manual_seed(self.seed)
        tensors: dict[str, torch.Tensor] = {}
        for s, (shape, st, dt) in spec.storages.items():
            n = 1 + sum((d - 1) * x for d, x in zip(shape, st)) if shape else 1
            if n > self.max_elements:
                raise MemoryError(f"storage {s} has {n} elements (> {self.max_elements})")
            tensors[s] = _random_flat(max(n, 1), dt, dev, gen).as_strided(shape, st)
        tables = random_tables(spec, dev, gen)
        by_tensor = {}
        for o in spec.operands:
            op = Operand(o.map, {t: tensors[t] for t in o.map.targets()},
                         tables={t: tables[t] for t in o.map.tables()}, dtype=o.dtype)
            by_tensor.setdefault(o.tensor, op)
        if spec.kind == "copy":   # [dst, src] map pairs whose pieces correspond one to one
            bound = []
            for w, r in zip(spec.operands[0::2], spec.operands[1::2]):
                plan = copy_pieces(w.map.shape, list(zip(w.map.pieces, r.map.pieces)), tensors, tables=tables)
                if plan is not None:
                    bound.append((plan, plan.take_args()))
            return lambda: [p.run(a) for p, a in bound]
        g = spec.graph

        def scratch(shape, dtype):
            return torch.empty(tuple(shape), dtype=dtype, device=dev)

        ctx = Context(g, lambda t: by_tensor[t], scratch, dev, lambda t: by_tensor[t].map)
        with torch.no_grad():
            return lower_as(ctx, g.groups[spec.unit.kernel], spec.impl)   # as realize runs it

    def __call__(self, spec: UnitSpec) -> float:
        from vtcsearch.codegen.timing import bench
        fn = self.prepare(spec)
        # CUDA-graph replays of per_graph calls each (warm, not L2-flushed: a kernel inside a model runs warm)
        return bench(fn, device=self.device, cuda_graph=True, flush_l2=False, warmup=self.warmup,
                     repeats=self.repeats, calls_per_graph=self.per_graph).median_us * 1e-6


# ---------------------------------------------------------------------------
# the measurement store
# ---------------------------------------------------------------------------

SCHEMA = """
CREATE TABLE IF NOT EXISTS measurements (
    key TEXT NOT NULL, timer TEXT NOT NULL, device TEXT NOT NULL,
    seconds REAL, feasible INTEGER NOT NULL, error TEXT, kind TEXT, name TEXT,
    repeats INTEGER, created TEXT, spec TEXT,
    PRIMARY KEY (key, timer, device));
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT);
"""


def key_hash(key: str) -> str:
    """The stored key: a digest of ``UnitSpec.key()`` (keys are long; files stay small)."""
    return hashlib.sha256(key.encode()).hexdigest()[:32]


class MeasurementStore:
    """SQLite table of unit timings keyed by (hash of the spec key, timer, device); safe for several processes.

    ``keep_specs=True`` also stores each key's full text (for debugging; files grow ~1 KB a row).
    """

    def __init__(self, path: str | os.PathLike = ":memory:", keep_specs: bool = False):
        self.keep_specs = keep_specs
        self.path = str(path)
        if self.path != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        try:
            self._open()
        except sqlite3.DatabaseError as e:   # not a database, truncated, malformed: start a new one
            if self.path == ":memory:":
                raise
            aside = f"{self.path}.corrupt-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"
            os.replace(self.path, aside)
            warnings.warn(f"measurement cache {self.path} is unreadable ({e}); moved aside to {aside}, "
                          f"starting a new one", RuntimeWarning, stacklevel=2)
            self._open()

    def _open(self) -> None:
        self.conn = sqlite3.connect(self.path, timeout=60, isolation_level=None)
        try:
            self.conn.executescript(SCHEMA)
            ok = self.conn.execute("PRAGMA quick_check").fetchone()
            if not ok or ok[0] != "ok":
                raise sqlite3.DatabaseError(f"integrity check: {ok[0] if ok else 'no answer'}")
            self.conn.execute("SELECT COUNT(*) FROM measurements").fetchone()
        except sqlite3.DatabaseError:
            self.conn.close()
            raise

    def get(self, key: str, timer: str, device: str) -> tuple[float, bool, str | None] | None:
        row = self.conn.execute("SELECT seconds, feasible, error FROM measurements WHERE key=? AND timer=? AND device=?",
                                (key_hash(key), timer, device)).fetchone()
        if row is None:
            return None
        sec = row[0] if row[0] is not None else math.inf
        return float(sec), bool(row[1]), row[2]

    def put(self, key: str, timer: str, device: str, seconds: float, feasible: bool, error: str | None,
            kind: str, name: str, repeats: int) -> None:
        self.conn.execute("INSERT OR REPLACE INTO measurements VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                          (key_hash(key), timer, device, seconds if math.isfinite(seconds) else None, int(feasible),
                           error, kind, name, repeats,
                           _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                           key if self.keep_specs else None))

    def set_meta(self, **kv: Any) -> None:
        for k, v in kv.items():
            self.conn.execute("INSERT OR REPLACE INTO meta VALUES (?,?)", (k, json.dumps(v)))

    def meta(self) -> dict[str, Any]:
        return {k: json.loads(v) for k, v in self.conn.execute("SELECT k, v FROM meta")}

    def rows(self) -> list[tuple]:
        return self.conn.execute("SELECT key, timer, device, seconds, feasible, error, kind, name, spec "
                                 "FROM measurements").fetchall()

    def __len__(self) -> int:
        return self.conn.execute("SELECT COUNT(*) FROM measurements").fetchone()[0]

    def close(self) -> None:
        self.conn.close()


class ProfilingOracle(CostOracle):
    """Measures each (unit, configuration) once with ``timer`` and caches it in ``db`` (SQLite)."""

    name = "profiling"

    def __init__(self, db: str | os.PathLike = ":memory:", timer: Timer | str | None = None,
                 device: str | torch.device | None = None, objective: Objective | None = None,
                 repeats: int = 10, warmup: int = 2, keep_specs: bool = False,
                 implementations: Sequence[str] | None = None, measure_top: int | None = None,
                 hardware: str = "H200"):
        """``timer``: a :class:`Timer`, or ``"kernels"`` / ``"reference"``; default: kernels on a GPU.
        ``measure_top``: measure only that many configurations per unit, ranked by the analytical model of
        ``hardware`` (module docstring); None measures every one."""
        super().__init__(objective, implementations)
        if measure_top is not None and measure_top < 1:
            raise ValueError(f"measure_top must be at least 1, got {measure_top}")
        self.measure_top = measure_top
        self._model = None
        if measure_top is not None:
            from .analytical import AnalyticalOracle
            self._model = AnalyticalOracle(hardware, objective=objective, implementations=implementations)
        # per accounting (weakly: a run's cases come and go): "configs" unit -> its configurations, "top"
        # (unit, impl) -> measured_configs, "ratio" (unit, impl) -> largest measured / modelled
        self._ranked: "weakref.WeakKeyDictionary[Accounting, dict[str, dict]]" = weakref.WeakKeyDictionary()
        if timer is None:
            cuda = torch.device(device).type == "cuda" if device is not None else torch.cuda.is_available()
            timer = "kernels" if cuda else "reference"
        if timer == "kernels":
            timer = KernelTimer(device, repeats=repeats, warmup=warmup)
        elif timer == "reference":
            timer = ReferenceTimer(device, repeats=repeats, warmup=warmup)
        elif isinstance(timer, str):
            raise ValueError(f"unknown timer {timer!r}: 'kernels', 'reference' or a Timer object")
        self.timer = timer
        dev = getattr(self.timer, "device", None) or torch.device(device or "cpu")
        self.device = environment_key(torch.device(dev), self.timer)
        self.store = MeasurementStore(db, keep_specs)
        self.store.set_meta(device=self.device, timer=self.timer.name, torch=torch.__version__)
        self.repeats = repeats
        # progress(line) every ``progress_s`` of measuring (the runner logs it): where a long search spends it
        self.progress: Callable[[str], None] | None = None
        self.progress_s = 30.0
        self._since_report: tuple[float, int] | None = None   # (when, measurements) at the last line
        self._slowest = (0.0, "")

    # -- measuring the configurations the model ranks first (measure_top) ------------------------------------
    def unit_cost(self, acc: Accounting, u: Unit, keys: tuple[str, ...], impl: str = "triton") -> UnitCost:
        """Measured, or with ``measure_top`` and outside the unit's measured set: the analytical model's price
        times the largest measured/modelled ratio among the measured configurations of the unit (their own
        measurements first), so it is never cheaper than a measured configuration the model ranked above it."""
        if self._model is None or u.fuses:     # a unit with fused copies prices its parts through this method
            return super().unit_cost(acc, u, keys, impl)
        top, ranked = self.measured_configs(acc, u, impl)
        if keys in top or not top:
            return super().unit_cost(acc, u, keys, impl)
        ratios = self._state(acc)["ratio"]
        ratio = ratios.get((u.name, impl))
        if ratio is None:
            ratio = 0.0
            for k in ranked:
                c = super().unit_cost(acc, u, k, impl)
                m = self._model.unit_cost(acc, u, k, impl)
                if c.feasible and math.isfinite(c.seconds) and m.seconds > 0:
                    ratio = max(ratio, c.seconds / m.seconds)
            ratios[(u.name, impl)] = ratio
        if ratio <= 0.0:            # nothing measured runs: measure this one too
            return super().unit_cost(acc, u, keys, impl)
        m = self._model.unit_cost(acc, u, keys, impl)
        return replace(m, seconds=m.seconds * ratio, detail={**m.detail, "modelled": True, "ratio": ratio})

    def measured_configs(self, acc: Accounting, u: Unit, impl: str = "triton"
                         ) -> tuple[frozenset, list[tuple[str, ...]]]:
        """(the configurations of ``u`` this oracle measures, the same in the model's order): the
        ``measure_top`` the analytical model prices cheapest among the feasible ones, and the all-physical one.
        Empty when the unit has no configuration the model can run."""
        st = self._state(acc)
        hit = st["top"].get((u.name, impl))
        if hit is not None:
            return hit
        if not st["configs"]:
            for unit, keys in acc.configuration_space():
                st["configs"].setdefault(unit.name, []).append(keys)
        priced = []
        for keys in st["configs"].get(u.name, []):     # the model prices on this accounting (the same structure)
            c = self._model.unit_cost(acc, u, keys, impl)
            if c.feasible and math.isfinite(c.seconds):
                priced.append((c.seconds, keys))
        priced.sort(key=lambda x: x[0])
        ranked = [k for _, k in priced[:self.measure_top]]
        phys = tuple(acc.key_of(t, PHYS) for t in u.tensors)
        if any(k == phys for _, k in priced) and phys not in ranked:
            ranked.append(phys)
        hit = st["top"][(u.name, impl)] = (frozenset(ranked), ranked)
        return hit

    def _state(self, acc: Accounting) -> dict[str, dict]:
        st = self._ranked.get(acc)
        if st is None:
            st = self._ranked[acc] = {"configs": {}, "top": {}, "ratio": {}}
        return st

    def measure(self, spec: UnitSpec) -> UnitCost:
        """An Inductor unit is timed in parts (:func:`dense_parts`): its compiled kernel once per layout of its
        operands, and each gather or scatter a virtual operand needs as a copy of its own."""
        parts = dense_parts(spec)
        if len(parts) == 1:
            return self._measure_one(parts[0])
        costs = [self._measure_one(p) for p in parts]
        bad = [c for c in costs if not c.feasible]
        if bad:
            return bad[0]
        return UnitCost(sum(c.seconds for c in costs), detail={"parts": len(parts)})

    def _measure_one(self, spec: UnitSpec) -> UnitCost:
        launch = getattr(self.timer, "launch", None)
        if launch is not None:
            spec.launch = dict(launch(spec) or {})
            spec._key = None
        key = spec.key()
        hit = self.store.get(key, self.timer.name, self.device)
        if hit is not None:
            self.stats.cache_hits += 1
            sec, ok, err = hit
            return UnitCost(sec if ok else math.inf, feasible=ok, detail={"error": err} if err else {})
        self.stats.measurements += 1
        t0 = time.perf_counter()
        try:
            sec, ok, err = float(self.timer(spec)), True, None
        except Exception as e:  # a configuration that cannot run: counted, stored as infeasible
            if is_transient(e):
                raise           # out of memory, timeout: the base counts it and caches nothing
            err = self.record_error(spec.unit, e)
            sec, ok = math.inf, False
        self._report(time.perf_counter() - t0, spec)
        self.store.put(key, self.timer.name, self.device, sec, ok, err, spec.kind, spec.unit.name, self.repeats)
        return UnitCost(sec if ok else math.inf, feasible=ok, detail={"error": err} if err else {})

    def _report(self, took: float, spec: UnitSpec) -> None:
        """Count one measurement that took ``took`` seconds (compiling included); a progress line when due."""
        if took > self._slowest[0]:
            self._slowest = (took, f"{spec.kind} {spec.unit.name} ({spec.impl})")
        if self.progress is None:
            return
        now = time.perf_counter()
        if self._since_report is None:
            self._since_report = (now - took, self.stats.measurements - 1)
        when, n = self._since_report
        if now - when >= self.progress_s:
            self.progress(f"measured {self.stats.measurements - n} kernels in the last {now - when:.0f} s "
                          f"({self.stats.measurements} in all, {self.stats.cache_hits} cached); slowest so far: "
                          f"{self._slowest[1]}, {self._slowest[0]:.1f} s")
            self._since_report = (now, self.stats.measurements)

    # -- preparing a search ----------------------------------------------------------------------
    def candidate_specs(self, vtog: Any, max_trees: int = 128, max_configs: int = 1024) -> list[UnitSpec]:
        """The distinct kernels and copies a search over ``vtog`` may time, one per measurement key, in every
        implementation the oracle allows (an Inductor unit as its parts: :func:`dense_parts`).

        Identical kernels (the same layer in 32 layers, the same copy in two blocks) share a key
        (:meth:`UnitSpec.key` renames storages positionally), so each is listed, and timed, once.
        """
        acc = self.accounting(vtog)
        launch = getattr(self.timer, "launch", None)
        seen: dict[str, UnitSpec] = {}
        for spec in self.unit_specs(acc, max_trees, max_configs):   # every implementation a solver may ask for
            if self._model is not None and not spec.unit.fuses and \
                    spec.config not in self.measured_configs(acc, spec.unit, spec.impl)[0]:
                continue
            for part in dense_parts(spec):
                if launch is not None:
                    part.launch = dict(launch(part) or {})
                    part._key = None
                seen.setdefault(part.key(), part)
        return list(seen.values())

    def prepare(self, vtog: Any, workers: int | None = None, max_trees: int = 128,
                max_configs: int = 1024, share: tuple[int, int] | None = None) -> dict[str, Any]:
        """List the distinct candidate kernels of a search not yet in the cache and compile them in parallel.

        Compilation runs in a pool of ``workers`` forked processes (default: the CPU count) calling
        ``timer.compile(spec)``; Triton's and Inductor's on-disk caches then make this process's compile at
        timing a cache hit.  CUDA does not survive a fork, so for a GPU timer (or with one worker, or a timer
        without ``compile``) nothing is precompiled here and timing compiles as it goes.
        ``share=(k, n)``: compile every n-th uncached candidate from the k-th here, in this process (one of n
        processes that each list the same candidates: :func:`vtcsearch.run.prepare_oracles` on the GPU).
        Returns counts: candidates, cached, to_measure, compiled, failed, workers, seconds (and the first
        failure's message).
        """
        t0 = time.perf_counter()
        specs = self.candidate_specs(vtog, max_trees, max_configs)
        todo = [sp for sp in specs if self.store.get(sp.key(), self.timer.name, self.device) is None]
        workers = (os.cpu_count() or 1) if workers is None else workers
        compile_ = getattr(self.timer, "compile", None)
        out = {"candidates": len(specs), "cached": len(specs) - len(todo), "to_measure": len(todo),
               "compiled": 0, "failed": 0, "workers": 0}
        errs: list[str | None] = []
        if compile_ is not None and share is not None:
            errs = [_compile(compile_, sp) for sp in todo[share[0]::share[1]]]
            out["workers"] = 1
        # never forked for a GPU: on the H200 and the H100 every forked worker failed with "CUDA error:
        # initialization error", once while torch.cuda.is_initialized() was False in the parent; the runner
        # compiles a GPU search in spawned processes instead (share)
        elif compile_ is not None and todo and workers > 1 and not self._on_gpu():
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor
            global _PREPARING
            _PREPARING = (compile_, todo)
            try:
                with ProcessPoolExecutor(min(workers, len(todo)), mp_context=mp.get_context("fork")) as pool:
                    errs = list(pool.map(_compile_one, range(len(todo)), chunksize=max(1, len(todo) // (8 * workers))))
            finally:
                _PREPARING = None
            out["workers"] = min(workers, len(todo))
        out["failed"] = sum(e is not None for e in errs)
        out["compiled"] = len(errs) - out["failed"]
        if out["failed"]:   # timing measures them again (and records why they fail); the log says why here
            out["first_error"] = next(e for e in errs if e is not None).splitlines()[0][:300]
        out["seconds"] = time.perf_counter() - t0
        return out

    def _on_gpu(self) -> bool:
        """Whether this oracle times on a GPU, or CUDA is up in this process (then nothing may fork)."""
        dev = getattr(self.timer, "device", None)
        return (torch.device(dev).type if dev is not None else "cpu") == "cuda" or torch.cuda.is_initialized()

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "timer": self.timer.name, "device": self.device, "db": self.store.path}


def dense_parts(spec: UnitSpec) -> list[UnitSpec]:
    """``spec`` as realization runs it, in parts that are measured apart: an Inductor kernel unit becomes the
    compiled kernel on plain strided operands, plus one copy unit per operand whose map is not a strided view
    (the gather before the call, or the scatter after it: :func:`vtcsearch.codegen.inductor.lower_inductor`).

    The kernel's operands are keyed by what Inductor compiles for: each as its strides and offset into a flat
    storage (a gathered one as a contiguous buffer).  Configurations that differ only in how an
    operand's map is written, or in the map of a gathered one, then share the kernel's measurement key, so a
    search compiles and times each Inductor kernel (a ``torch.compile`` with max-autotune) once per layout of
    its operands, not once per configuration.  Any other unit is its own single part."""
    from vtcsearch.core.expr import Expr
    from vtcsearch.core.implementation import INDUCTOR, needs_copy, strided_layout
    from vtcsearch.core.mapping import contiguous_strides, index_vars

    from .accounting import Operand, Unit

    if spec.kind != "kernel" or spec.impl != INDUCTOR:
        return [spec]
    strides = {s: v[1] for s, v in spec.storages.items()}
    operands: list[Operand] = []
    copies: list[UnitSpec] = []
    flat: dict[str, tuple] = {}   # flat storage -> (shape, strides, dtype)
    views: list[tuple[int, Operand, str, Expr]] = []   # (position, operand, flat storage, index into it)
    for o in spec.operands:
        shape, layout = o.map.shape, strided_layout(o.map, strides)
        if needs_copy(INDUCTOR, o.map, strides):   # through a dense buffer: the kernel reads or writes that
            base = f"{o.tensor}__dense"
            layout = (contiguous_strides(shape), 0)
            mirror = IndexMap(shape, [Piece(base, p.region, tuple(index_vars(len(shape))), p.conds)
                                      for p in o.map.pieces], {base: shape})
            dense, real = Operand(base, "w", mirror, o.dtype, o.itemsize), Operand(o.tensor, "r", o.map, o.dtype,
                                                                                   o.itemsize)
            pair = [dense, real] if o.role == "r" else [replace(real, role="w"), replace(dense, role="r")]
            copies.append(_part(spec, Unit(-1, "copy", f"{spec.unit.name}:{o.tensor}", ()), pair,
                                {base: (shape, contiguous_strides(shape), o.dtype)}, elements=math.prod(shape)))
        elif layout is None:   # a one-element operand Inductor takes as it is
            operands.append(o)
            continue
        else:   # a strided view; views of one storage share one flat storage (a cache updated in place stays so)
            base = f"{o.map.pieces[0].target}__flat"
        view_strides, offset = layout
        span = offset + 1 + sum((d - 1) * st for d, st in zip(shape, view_strides))
        flat[base] = ((max(span, flat[base][0][0] if base in flat else 0),), (1,), o.dtype)
        index = Expr(const=offset)
        for v, st in zip(index_vars(len(shape)), view_strides):
            index = index + v * int(st)
        views.append((len(operands), o, base, index))
        operands.append(o)
    for k, o, base, index in views:   # once every view's span is known
        operands[k] = Operand(o.tensor, o.role, IndexMap.single(o.map.shape, base, flat[base][0], [index]), o.dtype,
                              o.itemsize)
    kernel = _part(spec, spec.unit, operands, flat, ops=spec.ops, flops=spec.flops,
                   tensor_core=spec.tensor_core, compute_dtype=spec.compute_dtype)
    kernel.impl = spec.impl
    return [kernel, *copies]


def _part(spec: UnitSpec, unit: Any, operands: list, new_storages: Mapping[str, tuple], **kw: Any) -> UnitSpec:
    """A unit spec over ``operands``, with the storages and index tables of ``spec`` that they use."""
    part = UnitSpec(unit, spec.config, operands, **kw)
    part.graph = spec.graph
    for o in operands:
        for t in o.map.targets():
            part.storages[t] = new_storages[t] if t in new_storages else spec.storages[t]
        for tb in o.map.tables():
            if tb in spec.tables:
                part.tables[tb] = spec.tables[tb]
    return part


_PREPARING: tuple[Callable[[UnitSpec], Any], list[UnitSpec]] | None = None   # inherited by forked workers


def _compile(compile_: Callable[[UnitSpec], Any], spec: UnitSpec) -> str | None:
    """Compile one candidate; the error text if it fails (timing will record it)."""
    try:
        compile_(spec)
        return None
    except Exception as e:
        return f"{type(e).__name__}: {e}"


def _compile_one(i: int) -> str | None:
    """Compile candidate ``i`` in a pool worker."""
    assert _PREPARING is not None
    return _compile(_PREPARING[0], _PREPARING[1][i])

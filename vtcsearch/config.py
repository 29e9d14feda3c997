"""Experiment configs (``configs/*.yaml``): a typed schema, validated when loaded.

A config names one workload (and optionally several *cases* of it, e.g. the
Llama attention block and the whole decoder layer), the batch sizes, the dtype,
the solvers, the cost oracle, the hardware preset, the objective, the baselines
and the output folder.  :func:`load_config` checks everything before any model
is built, so a typo costs a second, not a failed run: an unknown key, a wrong
type, a missing field or a name that is not registered is one line,

    ConfigError: configs/llama.yaml: solvers[2]: unknown solver 'gredy'; choices: none, all, ...

The schema is the dataclasses below; their field comments are the reference.
"""
from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal


class ConfigError(ValueError):
    """A config file that does not match the schema; the message is one line naming the file and the key."""


@dataclass
class WorkloadConfig:
    name: str                                           # a key of experiments.workloads.WORKLOADS
    size: Literal["full", "tiny"] = "full"              # full: official sizes; tiny: the CPU-sized copy
    params: dict[str, Any] = field(default_factory=dict)     # builder kwargs shared by every case
    # one run per entry (per batch size): each is merged over params, e.g. [{part: attention}, {part: layer}]
    cases: list[dict[str, Any]] = field(default_factory=lambda: [{}])
    # a case may restrict the batch sizes it runs at with its own key ``batch_sizes`` (a subset of the
    # config's), e.g. {phase: prefill, batch_sizes: [1]}; taken out of its parameters when loaded, kept here
    # (one entry per case; None: every batch size of the config)
    case_batch_sizes: list[list[int] | None] = field(default_factory=list, metadata={"internal": True})

    def batches_of(self, i: int, batch_sizes: list[int]) -> list[int]:
        """The batch sizes case ``i`` runs at: ``batch_sizes`` (the config's or --batch) less those it excludes."""
        own = self.case_batch_sizes[i] if i < len(self.case_batch_sizes) else None
        return list(batch_sizes) if own is None else [b for b in batch_sizes if b in own]


@dataclass
class NumericsConfig:
    """Checking realized executables against eager PyTorch.

    On a GPU the benchmarked full-size executables are checked.  On a CPU the
    model is a meta-device shell, so a copy of ``size`` is built on the CPU,
    searched with the same solvers and oracle, realized through Triton's
    interpreter and checked.
    """

    enabled: bool = True
    size: Literal["full", "tiny"] = "tiny"              # the copy checked on a CPU
    batch: int | None = 1                               # its batch size (null: the case's batch)
    dtype: Literal["float32", "bfloat16", "float16"] | None = None   # null: the config's dtype
    rtol: float = 2e-2                                  # allclose tolerances (bf16/fp16 outputs)
    atol: float = 2e-2
    # half precision: an output off eager beyond rtol/atol still passes when its error against an fp32 run of
    # the model is at most fp32_factor x eager's own (kernels that round differently, not wrong answers)
    fp32_factor: float = 2.0
    # workload parameters of the copy, over the case's; null means the builder's default for that size
    # (e.g. {context: null}: the tiny Llama's 32-token context instead of the case's 4096)
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class BreakdownConfig:
    """What the runner reports beyond each variant's latency (the old benchmark scripts' extra tables)."""

    floors: bool = False        # HBM/compute floor per kernel (kernels.csv) and per case (summary), x_floor ratios
    steps: bool = False         # GPU: each step of each realized strategy timed alone -> steps.csv
    conv_layers: bool = False   # GPU: each conv kernel, Triton (as realized) against cuDNN -> conv_layers.csv


@dataclass
class Config:
    workload: WorkloadConfig
    batch_sizes: list[int]                              # e.g. [1, 16]
    dtype: Literal["float32", "bfloat16", "float16"]
    solvers: list[str]                                  # names in solvers.SOLVERS; "ilp@analytical": with that oracle
    oracle: str                                         # "auto" (GPU: profiling, else analytical) or cost_models.ORACLES
    hardware: str                                       # analytical oracle's preset (cost_models.PRESETS), e.g. H200
    objective: Literal["latency", "memory", "mix"]
    baselines: list[str]                                # names in experiments.baselines.BASELINES (may be empty)
    output: str                                         # results folder (relative to the working directory)
    name: str | None = None                             # default: the file's stem
    description: str = ""
    budgets: dict[str, float] = field(default_factory=dict)   # solver -> budget (its own unit: s, trials, rounds)
    oracle_options: dict[str, Any] = field(default_factory=dict)  # extra kwargs for cost_models.get_oracle
    seconds_per_gib: float = 1e-4                       # price of a GiB of peak memory (objective: mix)
    memory_cap_gib: float | None = None                 # strategies above it are infeasible
    numerics: NumericsConfig = field(default_factory=NumericsConfig)
    breakdown: BreakdownConfig = field(default_factory=BreakdownConfig)
    draw: Literal["best", "all", "none"] = "best"       # points-to pictures: best solver per case, every solver, none
    timing_rounds: int = 5                              # a case's variants are timed in this many interleaved rounds
    seed: int = 0
    # fold a row norm into the decode GEMM that reads it (vtcsearch.core.fusion.merge_prologues)
    prologues: bool = False
    # merge the GEMMs that read the same activation with constant weights (vtcsearch.core.hfuse)
    hfuse: bool = False
    path: str | None = field(default=None, metadata={"internal": True})   # set by load_config

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("path", None)
        return d


# ---------------------------------------------------------------------------
# loading and validation
# ---------------------------------------------------------------------------
def load_config(path: str | Path) -> Config:
    """Read and validate a YAML config; raises :class:`ConfigError` (one line) on any problem."""
    import yaml

    path = Path(path)
    where = str(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"{where}: cannot read: {e.strerror or e}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{where}: not valid YAML{at}: {problem}") from None
    return config_from_dict(data, where)


def config_from_dict(data: Any, where: str = "<config>") -> Config:
    """Validate a parsed mapping against the schema (types first, then registered names)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: the top level must be a mapping of keys, got {_tname(data)}")
    cfg = _build(Config, data, where, "")
    _split_case_batches(cfg.workload, where)
    cfg.path = where if where != "<config>" else None
    if cfg.name is None:
        cfg.name = Path(where).stem if cfg.path else "config"
    _check_names(cfg, where)
    return cfg


def _split_case_batches(w: WorkloadConfig, where: str) -> None:
    """Move each case's ``batch_sizes`` key out of its builder parameters into ``w.case_batch_sizes``."""
    w.case_batch_sizes = []
    for i, case in enumerate(w.cases):
        if not isinstance(case, dict) or "batch_sizes" not in case:
            w.case_batch_sizes.append(None)
            continue
        own = case.pop("batch_sizes")
        key = f"workload.cases[{i}].batch_sizes"
        if not isinstance(own, list) or not own or any(isinstance(b, bool) or not isinstance(b, int) for b in own):
            raise ConfigError(f"{where}: {key}: expected a non-empty list of integers, got {_tname(own)} {own!r}")
        w.case_batch_sizes.append(own)


def _tname(v: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number", type(None): "null"}.get(type(v), type(v).__name__)


def _key(prefix: str, k: str | int) -> str:
    if isinstance(k, int):
        return f"{prefix}[{k}]"
    return f"{prefix}.{k}" if prefix else k


def _build(cls: type, data: Any, where: str, prefix: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: {prefix or 'top level'}: expected a mapping, got {_tname(data)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}
    for k in data:
        if k not in fields:
            raise ConfigError(f"{where}: unknown key {_key(prefix, str(k))!r}; valid keys"
                              f"{' of ' + prefix if prefix else ''}: {', '.join(fields)}")
    kwargs = {}
    for name, f in fields.items():
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:  # type: ignore[misc]
                raise ConfigError(f"{where}: missing required key {_key(prefix, name)!r}")
            continue
        kwargs[name] = _coerce(data[name], hints[name], where, _key(prefix, name))
    return cls(**kwargs)


def _coerce(v: Any, tp: Any, where: str, key: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return v
    if origin in (typing.Union, types.UnionType):
        if v is None and type(None) in args:
            return None
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return _coerce(v, rest[0], where, key)
        raise ConfigError(f"{where}: {key}: unsupported schema type {tp}")  # pragma: no cover
    if origin is Literal:
        if v not in args:
            raise ConfigError(f"{where}: {key}: invalid value {v!r}; choices: {', '.join(map(str, args))}")
        return v
    if dataclasses.is_dataclass(tp):
        return _build(tp, v, where, key)
    if origin is list:
        if not isinstance(v, list):
            raise ConfigError(f"{where}: {key}: expected a list, got {_tname(v)}")
        return [_coerce(x, args[0], where, _key(key, i)) for i, x in enumerate(v)]
    if origin is dict:
        if not isinstance(v, dict):
            raise ConfigError(f"{where}: {key}: expected a mapping, got {_tname(v)}")
        out = {}
        for k, x in v.items():
            if not isinstance(k, str):
                raise ConfigError(f"{where}: {key}: keys must be strings, got {k!r}")
            out[k] = _coerce(x, args[1], where, _key(key, k))
        return out
    if tp is bool:
        if not isinstance(v, bool):
            raise ConfigError(f"{where}: {key}: expected true or false, got {_tname(v)} {v!r}")
        return v
    if tp is int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigError(f"{where}: {key}: expected an integer, got {_tname(v)} {v!r}")
        return v
    if tp is float:
        if isinstance(v, str):   # PyYAML reads 1e-4 (no dot) as a string: accept a number written that way
            try:
                return float(v)
            except ValueError:
                pass
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ConfigError(f"{where}: {key}: expected a number, got {_tname(v)} {v!r}")
        return float(v)
    if tp is str:
        if not isinstance(v, str):
            raise ConfigError(f"{where}: {key}: expected a string, got {_tname(v)} {v!r}")
        return v
    raise ConfigError(f"{where}: {key}: unsupported schema type {tp}")  # pragma: no cover


def _check_names(cfg: Config, where: str) -> None:
    """Names that must be registered somewhere else in the project, and value ranges."""
    from cost_models import ORACLES, PRESETS
    from experiments.baselines import BASELINES
    from experiments.workloads import WORKLOADS
    from solvers import SOLVERS

    def fail(key: str, msg: str) -> None:
        raise ConfigError(f"{where}: {key}: {msg}")

    w = cfg.workload
    if w.name not in WORKLOADS:
        fail("workload.name", f"unknown workload {w.name!r}; choices: {', '.join(WORKLOADS)}")
    sig = inspect.signature(WORKLOADS[w.name]).parameters
    reserved = ("size", "batch", "device", "dtype")
    valid = [p for p, s in sig.items() if s.kind == s.KEYWORD_ONLY and p not in reserved]
    for key, params in [("workload.params", w.params), ("numerics.params", cfg.numerics.params)] + \
            [(f"workload.cases[{i}]", c) for i, c in enumerate(w.cases)]:
        for p in params:
            if p in reserved:
                fail(f"{key}.{p}", {"batch": "set batch sizes with the top-level key batch_sizes",
                                    "size": "set the size with workload.size",
                                    "dtype": "set the dtype with the top-level key dtype",
                                    "device": "the runner chooses the device (--device)"}[p])
            if p not in valid:
                fail(f"{key}.{p}", f"unknown parameter of workload {w.name!r}; valid: {', '.join(valid)}")
    if not w.cases:
        fail("workload.cases", "must list at least one case (use [{}] for the parameters as they are)")
    if not cfg.batch_sizes:
        fail("batch_sizes", "must list at least one batch size")
    for i, b in enumerate(cfg.batch_sizes):
        if b < 1:
            fail(f"batch_sizes[{i}]", f"must be >= 1, got {b}")
    if len(set(cfg.batch_sizes)) != len(cfg.batch_sizes):
        fail("batch_sizes", "repeats a batch size")
    for i, own in enumerate(w.case_batch_sizes):
        extra = [b for b in own or [] if b not in cfg.batch_sizes]
        if extra:
            fail(f"workload.cases[{i}].batch_sizes", f"{extra} not in the config's batch_sizes "
                                                     f"{cfg.batch_sizes}: a case only restricts them")
    check_solvers(cfg.solvers, f"{where}: solvers", SOLVERS)
    for s in cfg.budgets:
        if s not in SOLVERS:
            fail(f"budgets.{s}", f"unknown solver; choices: {', '.join(SOLVERS)}")
    if cfg.oracle != "auto" and cfg.oracle not in ORACLES:
        fail("oracle", f"unknown oracle {cfg.oracle!r}; choices: auto, {', '.join(ORACLES)}")
    if cfg.hardware.upper().replace("_", "-") not in PRESETS:
        fail("hardware", f"unknown hardware preset {cfg.hardware!r}; choices: {', '.join(PRESETS)}")
    for i, b in enumerate(cfg.baselines):
        if b not in BASELINES:
            fail(f"baselines[{i}]", f"unknown baseline {b!r}; choices: {', '.join(BASELINES)}")
    if len(set(cfg.baselines)) != len(cfg.baselines):
        fail("baselines", "repeats a baseline")
    if cfg.timing_rounds < 1:
        fail("timing_rounds", f"must be >= 1, got {cfg.timing_rounds}")
    if cfg.memory_cap_gib is not None and cfg.memory_cap_gib <= 0:
        fail("memory_cap_gib", "must be positive")
    if cfg.seconds_per_gib < 0:
        fail("seconds_per_gib", "must be >= 0")
    n = cfg.numerics
    if n.batch is not None and n.batch < 1:
        fail("numerics.batch", f"must be >= 1, got {n.batch}")
    if n.fp32_factor < 1:
        fail("numerics.fp32_factor", f"must be >= 1 (a multiple of eager's own error), got {n.fp32_factor}")
    if n.rtol < 0 or n.atol < 0:
        fail("numerics", "tolerances must be >= 0")
    if not cfg.output.strip():
        fail("output", "must not be empty")


OBJECTIVES = ("latency", "memory", "mix")


def split_solver(spec: str) -> tuple[str, str | None]:
    """``"ilp@analytical"`` -> ``("ilp", "analytical")``; ``"ilp"`` -> ``("ilp", None)`` (the run's oracle).

    A solver entry may name the oracle it searches with, so one run reports the
    same solver under two oracles side by side (issue 12: analytical and
    profiling search of one case, in one process), and after a colon the objective
    (:func:`solver_objective`); that suffix is not part of either name.
    """
    solver, _, oracle = spec.partition(":")[0].partition("@")
    return solver, (oracle or None)


def solver_objective(spec: str) -> str | None:
    """``"ilp:mix"`` / ``"ilp@analytical:mix"`` -> ``"mix"``; None: the config's objective.

    So one run reports the latency search beside a memory-aware one (issue 15's memory-objective run).
    """
    return spec.partition(":")[2] or None


def check_solvers(names: list[str], where: str, registry: Any = None, *, allow_empty: bool = False) -> None:
    """A non-empty list of registered solver names (``solver``, ``solver@oracle``, ``solver@oracle:objective``)
    without repeats (also used for ``--solvers``, where ``-``, no solver, is allowed: baselines only)."""
    from cost_models import ORACLES
    if registry is None:
        from solvers import SOLVERS as registry
    if not names and not allow_empty:
        raise ConfigError(f"{where}: must list at least one solver")
    for i, spec in enumerate(names):
        s, oracle = split_solver(spec)
        if s not in registry:
            raise ConfigError(f"{where}[{i}]: unknown solver {s!r}; choices: {', '.join(registry)}")
        if oracle is not None and oracle not in ORACLES:
            raise ConfigError(f"{where}[{i}]: unknown oracle {oracle!r} in {spec!r}; choices: {', '.join(ORACLES)}")
        objective = solver_objective(spec)
        if objective is not None and objective not in OBJECTIVES:
            raise ConfigError(f"{where}[{i}]: unknown objective {objective!r} in {spec!r}; "
                              f"choices: {', '.join(OBJECTIVES)}")
    if len(set(names)) != len(names):
        raise ConfigError(f"{where}: repeats a solver")


def torch_dtype(name: str):
    """``"bfloat16"`` -> ``torch.bfloat16``."""
    import torch
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


__all__ = ["OBJECTIVES", "Config", "ConfigError", "NumericsConfig", "WorkloadConfig", "check_solvers", "config_from_dict",
           "solver_objective", "split_solver",
           "load_config", "torch_dtype"]

"""Black-box search with Optuna: one categorical parameter per candidate tensor (physical or an option),
and one per kernel group with several implementations (``impl:<group>``, from ``oracle.implementations``).

A sampled point may be invalid (a cycle, a write through an Expand map, a
hazard).  ``infeasible="repair"`` (default) maps it to the nearest valid
strategy found greedily: the sampled options are added in graph order and any
that breaks validity is dropped; the trial's value is the repaired strategy's
objective (the repaired options are kept in the trial's user attributes).
``infeasible="prune"`` reports such trials as pruned instead.

``storage`` (an Optuna URL such as ``"sqlite:///results/optuna.db"``) makes the
study persistent: a second call with the same ``study_name`` resumes it, and
several processes calling :func:`solve` on the same storage work as parallel
workers (``budget`` is the study's total number of trials).  With one worker
and a seed, a search is reproducible.  Samplers: ``"tpe"`` (default,
multivariate TPE), ``"random"``, ``"nsga2"`` (a genetic algorithm).
"""
from __future__ import annotations

import hashlib
import math
from typing import Any

import optuna

from cost_models import CostOracle
from cost_models.state import SearchState, greedy_repair
from vtcsearch.core.vtog import VTOG

from .base import Run, SolveResult, SolverStatus, usable_options

NAME = "optuna"
DECOMPOSABLE = False  # one study (trials, storage) per search: solved whole
PHYSICAL = "phys"


def make_sampler(name: str, seed: int) -> optuna.samplers.BaseSampler:
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=10)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=20)
    raise ValueError(f"unknown sampler {name!r}; choices: tpe, random, nsga2")


def default_study_name(vtog: VTOG, oracle: CostOracle, sampler: str, seed: int) -> str:
    sig = "|".join(f"{o.tensor}:{o.edges}" for o in vtog.options)
    h = hashlib.sha1(sig.encode()).hexdigest()[:10]
    impls = "-" + "+".join(oracle.implementations) if len(oracle.implementations) > 1 else ""
    return f"vtc-{h}-{oracle.name}-{oracle.objective.name}{impls}-{sampler}-s{seed}"


def solve(vtog: VTOG, oracle: CostOracle, budget: int | None = None, seed: int = 0, sampler: str = "tpe",
          infeasible: str = "repair", storage: str | None = None, study_name: str | None = None,
          n_jobs: int = 1) -> SolveResult:
    if infeasible not in ("repair", "prune"):
        raise ValueError("infeasible must be 'repair' or 'prune'")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    n_trials = 100 if budget is None else int(budget)
    run = Run(NAME, vtog, oracle)
    base = SearchState(oracle, vtog)
    opts = usable_options(base)
    order = {t: k for k, t in enumerate(vtog.graph.tensors)}
    cands = sorted(opts, key=order.__getitem__)
    choices = {t: [PHYSICAL] + [str(o) for o in opts[t]] for t in cands}
    acc = base.acc
    impl_choices = {u.kernel: list(oracle.unit_implementations(acc, u)) for u in acc.units if u.kind == "kernel"}
    impl_choices = {k: v for k, v in impl_choices.items() if len(v) > 1}
    name = study_name or default_study_name(vtog, oracle, sampler, seed)
    study = optuna.create_study(direction="minimize", sampler=make_sampler(sampler, seed), storage=storage,
                                study_name=name, load_if_exists=storage is not None)
    done = len([t for t in study.trials if t.state.is_finished()])
    repaired = [0]

    def objective(trial: optuna.Trial) -> float:
        picks = [int(v) for t in cands if (v := trial.suggest_categorical(t, choices[t])) != PHYSICAL]
        impl = {k: trial.suggest_categorical(f"impl:{k}", v) for k, v in impl_choices.items()}
        state = SearchState(oracle, vtog, impl=impl)
        kept = greedy_repair(state, picks)
        if len(kept) < len(picks):
            repaired[0] += 1
            if infeasible == "prune":
                raise optuna.TrialPruned()
        val = state.objective()
        trial.set_user_attr("options", kept)
        trial.set_user_attr("impl", state.implementations())
        trial.set_user_attr("dropped", len(picks) - len(kept))
        run.record(val, trial=trial.number, dropped=len(picks) - len(kept))
        return val if math.isfinite(val) else 1e9

    if not cands and not impl_choices:
        return run.finish([], SolverStatus.HEURISTIC, {"trials": 0})
    remaining = max(0, n_trials - done)
    if remaining:
        # other workers on the same storage count too: stop when the study holds n_trials finished trials
        stop = optuna.study.MaxTrialsCallback(n_trials, states=(optuna.trial.TrialState.COMPLETE,
                                                                optuna.trial.TrialState.PRUNED))
        study.optimize(objective, n_trials=remaining, n_jobs=n_jobs, gc_after_trial=False, callbacks=[stop])
    finished = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    info: dict[str, Any] = {"study": name, "trials": len(study.trials), "resumed_from": done,
                            "repaired": repaired[0], "sampler": sampler, "infeasible": infeasible}
    if not finished:
        return run.finish([], SolverStatus.HEURISTIC, info)
    best = min(finished, key=lambda t: (t.value, t.number))
    return run.finish(list(best.user_attrs.get("options", [])), SolverStatus.HEURISTIC, info,
                      impl=best.user_attrs.get("impl"))

"""Exact search with OR-Tools CP-SAT over options, resolution trees and kernel configurations.

What a unit's cost depends on (see :mod:`cost_models.accounting`): a kernel's
cost is a function of the resolved maps of its I/O tensors, a residual copy's
of the maps on both sides of its op.  A tensor's map is a function of its
*resolution tree* (its option, then its targets' trees, down to physical
storages).  The model:

* ``x[o]``: option ``o`` taken; at most one per tensor (coverage: an option
  covers its tensor whole); conflicting edges of different options exclude
  each other; ``rank[src] > rank[dst]`` for every edge of a taken option
  (acyclicity).
* ``y[t, T]``: tensor ``t`` resolves through tree ``T``.  ``y[t, PHYS] = 1 -
  sum x[t, .]`` and ``y[t, (o, T1..Tk)] <=> x[o] AND y[d1, T1] AND ...``;
  exactly one per tensor.  Trees are enumerated over simple paths (an acyclic
  strategy has no others), at most ``max_trees`` per tensor.
* ``w[t, m]``: ``t``'s map is ``m`` (the sum of the ``y`` whose trees compose
  to ``m``); writes through non-injective or read-only maps are forbidden.
* ``z[u, (m1..mk)]``: unit ``u``'s configuration, exactly one per unit, each
  implying the ``w`` of its tensors; its cost is one oracle query (one
  measurement with the profiling oracle): polynomially many, as each unit
  has a bounded number of tensors.
* Objective: latency ``sum cost * z`` (integer picoseconds), peak memory
  (``AddCumulative`` over optional intervals, one per storage that may be
  physical, whose start/end are the earliest write / latest read of any tensor
  resolving into it, with the capacity as a variable), a weighted mix, or
  latency under a memory cap.

* ``p[g, i]``: kernel group ``g`` runs implementation ``i`` (``oracle.implementations``
  that can run it: :mod:`vtcsearch.core.implementation`), exactly one per group.
  A kernel with several implementations has one ``z`` per (configuration,
  implementation), whose marginals equal both its tensors' ``w`` and its ``p``:
  a library kernel whose operand is virtual pays that configuration's cost,
  the gather included (:func:`_implementation_terms`).

So the optimum equals the exhaustive one for the oracle.  Rules the model does
not state (aliasing hazards, which depend on value classes) are enforced
lazily: the solution is validated by the core, and an invalid one is cut off
and the model solved again.  The cut forbids the trees of the tensors around
the violated storage (:func:`_local_nogood`), not the whole assignment; it
assumes the violation does not depend on choices away from that storage,
which holds for the hazards the core reports (tests compare with exhaustive
search).  All violations validation finds in one rejected solution are cut
before the next solve (:func:`_nogoods`): each re-solve presolves again.
The rejected solution with the tensors around its violations made physical
is valid (the *repair*, :func:`_nogoods`): the best repair is the next solve's
hint and an incumbent, and when it is within ``gap_limit`` of CP-SAT's last
bound (a lower bound of every more-cut model) the search ends there
(``solver_status`` ``REPAIRED_AT_BOUND``).  Symmetric models need this: Swin-T's
shifted-window masks gave six equal optima that each broke one hazard, six
17-20 s solves, and the budget ended on greedy's solution; the first repair
is at the bound (20 s, 6% below greedy).

The ILP is never worse than greedy: greedy's solution is computed first, kept
inside the (possibly capped) space and given to CP-SAT as the starting hint;
when the budget ends without a *valid* solution better than greedy's (after
the lazy cuts), greedy's strategy is returned with status
``greedy_incumbent``.  The status says what was proven: ``optimal`` only with
CP-SAT's proof on an uncapped model, otherwise ``feasible`` with the bound
and relative gap CP-SAT reports in ``info`` (``bound``, ``gap``).  When the
caps (``max_trees`` per tensor, ``max_configs`` per unit) cut the space the
result is never ``optimal``.  ``budget``: time limit in seconds for CP-SAT
(default 60); ``workers``: CP-SAT threads (1); ``warm_start=False`` skips
greedy (tests of the model alone).  ``gap_limit`` (default 0, exact): CP-SAT
stops once the incumbent is proven within that relative gap of the optimum;
the status is then ``feasible`` with the gap, ``optimal`` only at gap 0.
``hint``: options (a seams solution: ``decompose="seeded"``) that replace
greedy's as the start and the incumbent when valid and better; a result no
better than such a hint is that hint, ``feasible``, ``info["incumbent"] ==
"hint"``.
"""
from __future__ import annotations

import itertools
import math
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any

from cost_models import CostOracle
from cost_models.accounting import PHYS, LocalStrategy, cap_configurations
from vtcsearch.core.implementation import INDUCTOR
from vtcsearch.core.strategy import StrategyError
from vtcsearch.core.vtog import VTOG

from .base import Run, SolveResult, SolverStatus, best_implementations

NAME = "ilp"
DECOMPOSABLE = True   # can be solved part by part through solvers.decompose (decompose=True) ...
DECOMPOSE = "auto"    # ... at the seams between layers when they are mostly repeats: Llama 3 8B decode (65 parts,
                      # 4 distinct) in 5.7 s instead of 96 s, and 1.6% better; whole elsewhere (the 2,000-node
                      # synthetic VTOG, 195 parts / 173 distinct, is faster and 0.2% better whole)
                      # (results/solver_scaling/); decompose=False / "seams" force either
PS = 1e12   # latency in integer picoseconds
GAP_LIMIT = 0.0   # default relative gap at which CP-SAT stops: exact (the ILP == exhaustive contract); at whole-model
                  # scale pass e.g. 0.005 (experiments.solver_scaling does): proving the last fraction of a percent takes
                  # most of CP-SAT's time there


def solve(vtog: VTOG, oracle: CostOracle, budget: float | None = None, seed: int = 0, workers: int = 1,
          max_trees: int = 128, max_configs: int = 1024, max_cuts: int = 50,
          hint: list[int] | None = None, warm_start: bool = True, gap_limit: float = GAP_LIMIT,
          cut_batch: int = 32) -> SolveResult:
    """The exact search (module docstring); ``gap_limit``: stop once CP-SAT proves the incumbent within
    this relative gap of the optimum (0: prove it optimal); ``hint``: options to start from (a seams
    solution, say) instead of greedy's when valid and better; ``cut_batch``: at most this many cuts from one
    rejected solution (each CP-SAT re-solve presolves again: ~3 s at 2,000 nodes)."""
    from ortools.sat.python import cp_model
    run = Run(NAME, vtog, oracle)
    acc = oracle.accounting(vtog)
    obj = oracle.objective
    m = cp_model.CpModel()
    info: dict[str, Any] = {"complete": True}

    # -- options, conflicts, acyclicity -----------------------------------------------------------
    x = {o.id: m.new_bool_var(f"x{o.id}") for o in vtog.options if o.id not in acc.option_bad}
    for t, os_ in acc.options_of.items():
        lits = [x[o] for o in os_ if o in x]
        if len(lits) > 1:
            m.add_at_most_one(lits)
    edge_opts: dict[int, list[int]] = defaultdict(list)
    for o in x:
        for e in acc.option_edges[o]:
            edge_opts[e.id].append(o)
    for pair in vtog.conflicts:
        a, b = tuple(pair)
        for oa in edge_opts.get(a, []):
            for ob in edge_opts.get(b, []):
                if oa != ob and acc.option_tensor[oa] != acc.option_tensor[ob]:
                    m.add_bool_or([x[oa].Not(), x[ob].Not()])
    nodes = sorted(acc.nodes)
    rank = {t: m.new_int_var(0, len(nodes), f"r_{i}") for i, t in enumerate(nodes)}
    for o, lit in x.items():
        t = acc.option_tensor[o]
        for d in acc.option_targets[o]:
            m.add(rank[t] >= rank[d] + 1).only_enforce_if(lit)

    # -- resolution trees ----------------------------------------------------------------------------
    trees: dict[str, list[int]] = {}
    for t in nodes:
        ts, complete = acc.enumerate_trees(t, max_trees)
        trees[t] = ts
        info["complete"] &= complete
    # a model restricted by the caps keeps the greedy solution reachable (and starts from it)
    protected: dict[str, str] = {}
    g = None
    if warm_start:
        from . import greedy
        g = greedy.solve(vtog, oracle)
        info["warm_start_objective"] = g.objective
        if hint is not None:
            g = _better_incumbent(run, g, hint, info)
        hint = list(g.options)
        gtrees = acc.trees_of_choice({acc.option_tensor[o]: o for o in g.options})
        for t, tid in gtrees.items():
            if tid not in trees[t]:
                trees[t].append(tid)
            protected[t] = acc.key_of(t, tid)
    y: dict[tuple[str, int], Any] = {}
    for t in nodes:
        for tid in trees[t]:
            y[t, tid] = m.new_bool_var("")
    for t in nodes:
        own = [x[o] for o in acc.options_of.get(t, []) if o in x]
        m.add(y[t, PHYS] + sum(own) == 1)
        keep = [y[t, PHYS]]
        by_opt: dict[int, list[int]] = defaultdict(list)
        for tid in trees[t][1:]:
            o = acc.tree_option(tid)
            ch = acc._trees[tid][1]
            subs = [y.get((d, c)) for d, c in zip(acc.option_targets[o], ch)]
            if any(s is None for s in subs):     # a child tree beyond max_trees: drop this tree
                m.add(y[t, tid] == 0)
                info["complete"] = False
                continue
            lits = [x[o]] + subs
            m.add_bool_and(lits).only_enforce_if(y[t, tid])
            m.add_bool_or([y[t, tid]] + [lt.Not() for lt in lits])
            keep.append(y[t, tid])
            by_opt[o].append(tid)
        m.add_exactly_one(keep)
        # tight linking (what makes the LP bound useful): a taken option has exactly one tree,
        # and the trees choosing child c at a position sum to at most y[child, c]
        for o, tids in by_opt.items():
            m.add(sum(y[t, tid] for tid in tids) == x[o])
            for i, d in enumerate(acc.option_targets[o]):
                by_child: dict[int, list] = defaultdict(list)
                for tid in tids:
                    by_child[acc._trees[tid][1][i]].append(y[t, tid])
                if len(acc.option_targets[o]) > 1:
                    for c, ys in by_child.items():
                        m.add(sum(ys) <= y[d, c])

    # -- map indicators ----------------------------------------------------------------------------------
    wvar: dict[tuple[str, str], Any] = {}
    keys_of: dict[str, list[str]] = {}

    def maps_of(t: str) -> list[str]:
        if t in keys_of:
            return keys_of[t]
        if t not in acc.nodes:
            keys_of[t] = [acc.key_of(t, PHYS)]
            wvar[t, keys_of[t][0]] = 1
            return keys_of[t]
        groups: dict[str, list] = {}
        for tid in trees[t]:
            groups.setdefault(acc.key_of(t, tid), []).append(y[t, tid])
        for k, ys in groups.items():
            if len(ys) == 1:
                wvar[t, k] = ys[0]
            else:
                v = m.new_bool_var("")
                m.add(v == sum(ys))
                wvar[t, k] = v
        keys_of[t] = list(groups)
        return keys_of[t]

    written = acc.compute_written()
    for t in nodes:
        if t in written:
            for k in maps_of(t):
                if not k.startswith("phys:") and not acc.writable(acc.map_by_key(t, k), k):
                    m.add(wvar[t, k] == 0)

    # -- unit configurations -------------------------------------------------------------------------------
    lat_terms: list[tuple[int, Any]] = []
    # a virtual tensor earns its place: 1 ps per option taken, so where the model prices two strategies the same
    # the one with fewer virtual tensors wins: ConvNeXt-atto's all-Inductor pick took 39 options the model saw no
    # gain in, DeiT-tiny bs 16's committed pick 102; measured, such a pick changes what Inductor compiles (DeiT's
    # cut the patch embedding's region and ran 0.92x of the same groups without them)
    lat_terms.extend((1, lit) for lit in x.values())
    const_ps = 0
    n_configs = 0
    impl_vars: dict[str, dict[str, Any]] = {}
    for unit in acc.units:
        u = unit.without_fusion()   # the copies it may absorb are terms of their own (_fusion_terms)
        ks = [maps_of(t) for t in u.tensors]
        ks = _cap_configs(u, ks, max_configs, wvar, m, info, protected)
        if len(oracle.unit_implementations(acc, u)) > 1:
            n_configs += _implementation_terms(m, oracle, acc, u, ks, wvar, impl_vars, lat_terms, obj, info)
            if unit.fuses and obj.needs_latency and INDUCTOR in impl_vars.get(u.kernel, {}):
                _fusion_terms(m, oracle, acc, unit, impl_vars[u.kernel][INDUCTOR], maps_of, wvar, lat_terms)
            continue
        varying = [i for i, k in enumerate(ks) if len(k) > 1]
        combos = list(itertools.product(*ks))
        n_configs += len(combos)
        lits_costs = []
        for combo in combos:
            keys = tuple(combo)
            c = oracle.unit_cost(acc, u, keys) if obj.needs_latency else None
            ok = c is None or math.isfinite(c.seconds)
            if ok and u.kind == "copy":
                ok = _copy_writable(acc, u, keys)
            lits_costs.append((keys, ok, 0 if c is None or not ok else int(round(c.seconds * PS))))
        if not varying:
            keys, ok, ps = lits_costs[0]
            if not ok:
                info.setdefault("infeasible_units", []).append(u.name)
            const_ps += ps
            continue
        if len(varying) == 1:
            i = varying[0]
            for keys, ok, ps in lits_costs:
                lit = wvar[u.tensors[i], keys[i]]
                if not ok:
                    m.add(lit == 0)
                elif ps:
                    lat_terms.append((ps, lit))
            continue
        zs = []
        marg: dict[tuple[int, str], list] = defaultdict(list)
        for keys, ok, ps in lits_costs:
            if not ok:        # impossible or forbidden (most pairs of a copy unit's maps): no variable at all
                continue
            z = m.new_bool_var("")
            zs.append(z)
            for i in varying:
                marg[i, keys[i]].append(z)
            if ps:
                lat_terms.append((ps, z))
        m.add_exactly_one(zs)
        for i in varying:     # a map no allowed configuration uses cannot be taken
            for k in ks[i]:
                if (i, k) not in marg:
                    m.add(wvar[u.tensors[i], k] == 0)
        # marginals: the configurations agreeing with tensor i's map sum to that map's indicator
        for (i, k), group in marg.items():
            m.add(sum(group) == wvar[u.tensors[i], k])
    if obj.needs_latency:
        _region_fusion_terms(m, oracle, acc, impl_vars, maps_of, wvar, lat_terms)
    info["configurations"] = n_configs
    lat_expr = cp_model.LinearExpr.weighted_sum([v for _, v in lat_terms], [c for c, _ in lat_terms]) + const_ps

    # -- memory ---------------------------------------------------------------------------------------------
    cap_var = None
    if obj.needs_memory:
        cap_var = _memory_model(m, acc, trees, maps_of, wvar, _region_view_lits(m, oracle, acc, impl_vars,
                                                                                maps_of, wvar))
        if obj.memory_cap is not None:
            m.add(cap_var + acc.const_bytes <= int(obj.memory_cap))
    lat_bound = sum(abs(c) for c, _ in lat_terms) + abs(const_ps)
    m.minimize(_integral_objective(obj, lat_expr, cap_var, lat_bound,
                                   sum(acc.graph.tensors[s].nbytes for s in acc.intermediate)))

    # -- solve, validate, cut ----------------------------------------------------------------------------------
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = seed
    solver.parameters.linearization_level = 2   # the LP relaxation closes the gap on these models
    solver.parameters.relative_gap_limit = gap_limit
    info["gap_limit"] = gap_limit
    limit = 60.0 if budget is None else float(budget)
    t_solve = run.elapsed()
    if hint:
        _hint(m, acc, x, y, hint)
    cuts = 0
    status_name = "unknown"
    chosen: list[int] = []
    strategy = None
    repaired = None      # the best valid solution made from a rejected one (its violating tensors physical)
    while True:
        solver.parameters.max_time_in_seconds = max(0.1, limit - (run.elapsed() - t_solve))
        st = solver.solve(m)
        status_name = solver.status_name(st)
        if st == cp_model.MODEL_INVALID:
            info["model_invalid"] = m.validate()[:300]
        if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            break
        chosen = [o for o, lit in x.items() if solver.boolean_value(lit)]
        impl = {k: i for k, p in impl_vars.items() for i, lit in p.items()
                if solver.boolean_value(lit) and i != "triton"}
        s = LocalStrategy(vtog, [e for o in chosen for e in vtog.options[o].edges], acc, impl)
        run.record(_model_objective(solver, obj, lat_expr, cap_var, acc), cut=cuts, status=status_name)
        try:
            s.validate()
            strategy = s
            break
        except StrategyError as e:
            cuts += 1
            if cuts > max_cuts or run.elapsed() - t_solve > limit:
                info.setdefault("cut_reasons", []).append(e.rule)
                break
            on = set(chosen)
            cut_list, valid_rest = _nogoods(vtog, acc, on, impl, e, y, max_batch=cut_batch)
            for lits, rule in cut_list:
                info.setdefault("cut_reasons", []).append(rule)
                m.add_bool_or(lits if lits is not None else [lit.Not() if o in on else lit for o, lit in x.items()])
            if valid_rest is not None:
                r = _priced(run, valid_rest)
                if repaired is None or r.objective < repaired.objective:
                    repaired = r
            m.clear_hints()     # start again from the best valid solution known, which the cuts leave feasible
            _hint(m, acc, x, y, repaired.options if repaired is not None else (hint or on))
            if repaired is not None and _proven_by_bound(solver, obj, acc, repaired.objective, gap_limit):
                # nothing in the model is better than the repair: CP-SAT's bound (cuts only remove solutions)
                status_name = "REPAIRED_AT_BOUND"
                break
    info.update(cuts=cuts, solver_status=status_name, build_s=t_solve, solve_s=run.elapsed() - t_solve,
                model_objective=solver.objective_value if strategy is not None else None)
    if status_name in ("OPTIMAL", "FEASIBLE"):
        info.update(_bound_and_gap(solver, obj, acc))
    # CP-SAT says OPTIMAL when it stops at gap_limit too: optimal only with no gap left
    proven = strategy is not None and status_name == "OPTIMAL" and info["complete"] and info.get("gap", 1.0) == 0.0
    if strategy is None and repaired is not None:
        # CP-SAT's last answer was rejected (no cut left, or the budget ended), or matched by a repair at the
        # bound: the best repair is the ILP's solution, its gap measured from CP-SAT's last bound
        chosen, strategy, impl = sorted(repaired.options), repaired.strategy, repaired.impl
        info.update(incumbent="repaired", repaired_objective=repaired.objective)
        if status_name == "REPAIRED_AT_BOUND":     # else the bound is already in info, or there is none
            info.update(_bound_and_gap(solver, obj, acc))
        bound = info.get("bound")
        if isinstance(bound, float) and repaired.objective > 0:
            info["gap"] = max(0.0, (repaired.objective - bound) / repaired.objective)
            proven = status_name == "REPAIRED_AT_BOUND" and info["complete"] and info["gap"] <= _ROUNDING
    if g is not None and not proven:
        mine = oracle.evaluate(strategy, rows=False).objective if strategy is not None else math.inf
        if not (mine < g.objective or (mine == g.objective and len(chosen) < len(g.options))):
            # nothing valid and better than greedy's solution when the budget ended: return greedy's
            src = "hint" if info.get("warm_start") == "hint" else "greedy"
            info.update(incumbent=src, ilp_objective=None if strategy is None else mine)
            if src != "greedy":     # a caller's (seams) solution: valid, CP-SAT's bound and gap still hold for it
                if isinstance(info.get("bound"), float) and g.objective > 0:
                    info["gap"] = max(0.0, (g.objective - info["bound"]) / g.objective)
                return run.finish(g.options, SolverStatus.FEASIBLE, info, validated=g.strategy)
            return run.finish(g.options, SolverStatus.GREEDY_INCUMBENT, info, validated=g.strategy)
    if strategy is None:
        # no valid solution within the limits and no greedy run: all physical (always valid)
        info["fallback"] = "none"
        return run.finish([], SolverStatus.FEASIBLE, info)
    return run.finish(chosen, SolverStatus.OPTIMAL if proven else SolverStatus.FEASIBLE, info, validated=strategy,
                      impl=impl)


def _better_incumbent(run: Run, g: SolveResult, hint: list[int], info: dict[str, Any]) -> SolveResult:
    """The caller's ``hint`` (a seams solution) as the incumbent when it is valid and better than greedy's
    ``g``, so the ILP is never worse than either."""
    s = LocalStrategy(run.vtog, [e for o in hint for e in run.vtog.options[o].edges], run.oracle.accounting(run.vtog))
    try:
        s.validate()
    except StrategyError:
        info["hint"] = "invalid"
        return g
    p = _priced(run, set(hint), s)      # the hint is options only: each group's best implementation
    info["hint_objective"] = p.objective
    if not p.objective < g.objective:
        return g
    info["warm_start"] = "hint"
    return replace(g, options=sorted(hint), objective=p.objective, strategy=p.strategy)


def _bound_and_gap(solver, obj, acc) -> dict[str, float]:
    """CP-SAT's best bound and relative gap, in the objective's units (what was proven about the optimum)."""
    val, bound = solver.objective_value, solver.best_objective_bound
    gap = 0.0 if val == bound else abs(val - bound) / max(abs(val), 1e-30)
    scale = 1.0 / PS if not obj.memory_weight else (1.0 if not obj.latency_weight else None)
    out = {"gap": gap}
    if scale is not None:
        out["bound"] = bound * scale + (acc.const_bytes if not obj.latency_weight else 0.0)
    return out


def _implementation_terms(m, oracle, acc, u, ks, wvar, impl_vars, lat_terms, obj, info) -> int:
    """Variables of a kernel with several implementations: ``p[g, i]`` (exactly one) and one ``z`` per
    (configuration, implementation) linked to the maps' ``w`` and to ``p``; returns the ``z`` count."""
    impls = oracle.unit_implementations(acc, u)
    rank = {im: k for k, im in enumerate(impls)}   # choices() keeps the oracle's order of preference
    combos = [tuple(c) for c in itertools.product(*ks)]
    costs = {(keys, im): oracle.unit_cost(acc, u, keys, im) if obj.needs_latency else None
             for keys in combos for im in impls}
    if all(c is not None and not math.isfinite(c.seconds) for c in costs.values()):
        info.setdefault("infeasible_units", []).append(u.name)   # as before: reported, left unconstrained
        return 0
    p = {i: m.new_bool_var(f"p_{u.kernel}_{i}") for i in impls}
    m.add_exactly_one(list(p.values()))
    impl_vars[u.kernel] = p
    varying = [i for i, k in enumerate(ks) if len(k) > 1]
    zs = []
    marg: dict[tuple[int, str], list] = defaultdict(list)
    by_impl: dict[str, list] = defaultdict(list)
    for keys in combos:
        for im in impls:
            c = costs[keys, im]
            ok = c is None or math.isfinite(c.seconds)
            z = m.new_bool_var("")
            zs.append(z)
            by_impl[im].append(z)
            for i in varying:
                marg[i, keys[i]].append(z)
            if not ok:
                m.add(z == 0)
            elif c is not None and c.seconds:
                # + the implementation's rank in picoseconds: on equal cost the oracle's order of preference wins
                # (as in best_implementation) instead of CP-SAT's arbitrary pick
                lat_terms.append((int(round(c.seconds * PS)) + rank[im], z))
    m.add_exactly_one(zs)
    for (i, k), group in marg.items():
        m.add(sum(group) == wvar[u.tensors[i], k])
    for im, group in by_impl.items():
        m.add(sum(group) == p[im])
    return len(zs)


def _fusion_terms(m, oracle, acc, unit, p_inductor, maps_of, wvar, lat_terms) -> None:
    """The copies an Inductor kernel runs itself (``Unit.fuses``): one ``f`` per copy, implying the kernel's
    Inductor ``p`` and both of the copy's tensors physical, that earns back what running the copy saves
    (``CostOracle.fused_copy_saving``).  Separable, so the kernel's ``z`` stay over its own tensors; the sum
    equals the kernel unit's cost over all its tensors, which evaluation and the other solvers use."""
    for cu in unit.fuses:
        ps = int(round(oracle.fused_copy_saving(acc, unit, cu) * PS))
        if ps <= 0:
            continue
        f = m.new_bool_var("")
        m.add_implication(f, p_inductor)
        _implies_physical(m, f, acc, cu.tensors + cu.via, maps_of, wvar)
        lat_terms.append((-ps, f))


def _implies_physical(m, lit, acc, tensors, maps_of, wvar) -> None:
    """``lit`` only where every one of ``tensors`` is physical (its physical map's indicator: the constant 1 for a
    tensor no option can make virtual; none, so ``lit`` is false, for one that is never physical)."""
    for t in tensors:
        k = acc.key_of(t, PHYS)
        w = wvar[t, k] if k in maps_of(t) else 0
        if isinstance(w, int):
            if not w:
                m.add(lit == 0)
        else:
            m.add_implication(lit, w)


def _region_fusion_terms(m, oracle, acc, impl_vars, maps_of, wvar, lat_terms) -> None:
    """The pointwise kernels Inductor inlines into a neighbour (``Accounting.region_fusions``): one ``r`` per
    fusion, implying both kernels' Inductor ``p`` and the tensors between them physical, at most one per inlined
    kernel, earning back ``CostOracle.region_fusion_saving``; evaluation subtracts the same
    (``CostOracle.region_fusions_taken``)."""
    by_kernel: dict[str, list] = defaultdict(list)
    for f in acc.region_fusions:
        p_u, p_v = impl_vars.get(f.kernel, {}).get(INDUCTOR), impl_vars.get(f.into, {}).get(INDUCTOR)
        ps = int(round(oracle.region_fusion_saving(acc, f) * PS)) if p_u is not None and p_v is not None else 0
        if ps <= 0:
            continue
        r = m.new_bool_var("")
        m.add_implication(r, p_u)
        m.add_implication(r, p_v)
        _implies_physical(m, r, acc, f.via, maps_of, wvar)
        by_kernel[f.kernel].append(r)
        lat_terms.append((-ps, r))
    for rs in by_kernel.values():
        if len(rs) > 1:
            m.add_at_most_one(rs)


def _nogoods(vtog: VTOG, acc, chosen: set[int], impl: dict[str, str], err: StrategyError, y,
             max_batch: int) -> tuple[list[tuple[list | None, str]], set[int] | None]:
    """Cuts for every violation of a rejected solution that can be found by validation alone: after a cut,
    the options around that violation are dropped (their tensors physical) and the rest validated again.

    Each cut holds under :func:`_local_nogood`'s locality assumption (the violation depends only on the
    trees around its storage), so one CP-SAT re-solve per batch instead of per violation (12 re-solves of
    ~4 s each on the 2,000-node synthetic VTOG).  ``None`` as a cut: a full no-good of ``chosen``.
    Also returns the options left when the rest validated (a valid solution near the rejected one, the
    repair), else None.
    """
    out: list[tuple[list | None, str]] = []
    rest = set(chosen)
    while len(out) < max_batch:
        lits, near = _local_nogood(acc, rest, err.tensor, y, with_near=True)
        out.append((lits, err.rule))
        if lits is None:
            break
        keep = {o for o in rest if acc.option_tensor[o] not in near}
        if keep == rest:
            break
        rest = keep
        s = LocalStrategy(vtog, [e for o in rest for e in vtog.options[o].edges], acc, impl)
        try:
            s.validate()
            return out, rest
        except StrategyError as e:
            err = e
    return out, None


_ROUNDING = 1e-9   # relative: the model sums unit costs rounded to picoseconds, the oracle sums floats


def _hint(m, acc, x, y, options) -> None:
    """Hint CP-SAT with ``options`` and their trees: it then starts from a complete solution instead of
    repairing a partial one."""
    on = set(options)
    for o, lit in x.items():
        m.add_hint(lit, o in on)
    try:
        trees = acc.trees_of_choice({acc.option_tensor[o]: o for o in on})
    except ValueError:
        return
    for (t, tid), lit in y.items():
        m.add_hint(lit, trees.get(t, PHYS) == tid)


@dataclass
class _Priced:
    options: set[int]
    strategy: LocalStrategy
    impl: dict[str, str]
    objective: float


def _priced(run: Run, options: set[int], s: LocalStrategy | None = None) -> _Priced:
    """A valid solution (``options``, or its strategy ``s``) with each group's cheapest implementation for its
    maps, and its objective: a caller's hint, or a repair (a rejected solution minus the options around each
    violation, validated by :func:`_nogoods`)."""
    if s is None:
        s = LocalStrategy(run.vtog, [e for o in options for e in run.vtog.options[o].edges],
                          run.oracle.accounting(run.vtog))
    impl = best_implementations(run.oracle, s)
    s.set_implementations(impl)
    return _Priced(options, s, impl, run.oracle.evaluate(s, rows=False).objective)


def _proven_by_bound(solver, obj, acc, objective: float, gap_limit: float) -> bool:
    """Whether a valid solution of ``objective`` is within ``gap_limit`` of CP-SAT's last bound (a lower bound
    of every later, more cut, model)."""
    bound = _bound_and_gap(solver, obj, acc).get("bound")
    if not isinstance(bound, float) or objective <= 0:
        return False
    return (objective - bound) / objective <= max(gap_limit, _ROUNDING)


def _local_nogood(acc, chosen: set[int], tensor: str, y, with_near: bool = False):
    """A cut excluding the current trees of the tensors around a violation (None: use a full no-good).

    Validity rules that the model does not state (hazards, clobbered base
    copies) depend on the events on the storages the named tensor lives in:
    the tensors resolving into those storages, and the other tensors of their
    movement ops (whose maps decide the residual copies).  The cut forbids
    that combination of trees, so unrelated choices elsewhere do not each need
    a cut of their own.
    """
    choice = {acc.option_tensor[o]: o for o in chosen}
    try:
        trees = acc.trees_of_choice(choice)
    except ValueError:
        return (None, set()) if with_near else None
    if tensor not in acc.graph.tensors:
        return (None, set()) if with_near else None
    storages = acc.map_of(tensor, trees.get(tensor, PHYS)).targets()
    near = {t for t in acc.nodes if acc.map_of(t, trees.get(t, PHYS)).targets() & storages}
    near.add(tensor) if tensor in acc.nodes else None
    for t in list(near):
        for opname in [acc.graph.tensors[t].producer, *acc.graph.tensors[t].consumers]:
            op = acc.graph.ops.get(opname)
            if op is not None and op.kind == "movement":
                near.update(x for x in op.inputs + op.outputs if x in acc.nodes)
    lits = [y[t, trees.get(t, PHYS)].Not() for t in sorted(near) if (t, trees.get(t, PHYS)) in y]
    return (lits or None, near) if with_near else lits or None


def configuration_space(vtog: VTOG, oracle: CostOracle, max_trees: int = 128,
                        max_configs: int = 1024) -> list[tuple[Any, tuple[str, ...]]]:
    """Every (unit, configuration) the ILP asks the oracle about (no solver needed: for recording runs).

    The same enumeration as :func:`solve` without its greedy-protected maps
    (identical whenever no cap binds).
    """
    return oracle.accounting(vtog).configuration_space(max_trees, max_configs)


def _cap_configs(u, ks: list[list[str]], max_configs: int, wvar, m, info,
                 protected: dict[str, str]) -> list[list[str]]:
    """Keep a unit's configurations under ``max_configs`` (:func:`cost_models.accounting.cap_configurations`,
    keeping the greedy warm start's maps, ``protected``); a dropped map is forbidden for its tensor everywhere
    (the search space shrinks, every solution stays valid), and the result is no longer proven optimal."""
    ks, dropped = cap_configurations(ks, max_configs, [[protected[t]] if t in protected else [] for t in u.tensors])
    for i, k in dropped:
        lit = wvar[u.tensors[i], k]
        if not isinstance(lit, int):
            m.add(lit == 0)
    if dropped or math.prod(len(k) for k in ks) > max_configs:
        info["complete"] = False
        info.setdefault("capped_units", []).append(u.name)
    return ks


def _copy_writable(acc, u, keys) -> bool:
    copies = acc.copies(u, keys)
    if copies is None:
        return False
    for domain, pairs in copies:
        if not acc.writable(acc.copy_maps(domain, pairs)[0]):
            return False
    return True


def _region_view_lits(m, oracle, acc, impl_vars, maps_of, wvar) -> dict[str, Any]:
    """Tensor -> a literal that may be true only when the tensor is a view in an Inductor kernel's region
    (``CostOracle.region_view_candidates``): that kernel's Inductor ``p`` and the view's tensors physical.  The
    memory model leaves such a tensor out, so minimising memory sets the literal wherever it is allowed."""
    out: dict[str, Any] = {}
    for t, kernel, tensors in oracle.region_view_candidates(acc):
        p = impl_vars.get(kernel, {}).get(INDUCTOR)
        if p is None:   # one implementation only: Inductor's, or the view is a buffer
            if tuple(oracle.unit_implementations(acc, acc.kernel_unit(kernel))) != (INDUCTOR,):
                continue
            p = 1
        r = m.new_bool_var(f"region_view_{t}")
        if not isinstance(p, int):
            m.add_implication(r, p)
        _implies_physical(m, r, acc, tensors, maps_of, wvar)
        out[t] = r
    return out


def _memory_model(m, acc, trees, maps_of, wvar, region_views=None):
    """Cumulative over storage lifetimes; returns the capacity variable (peak minus constant storages).

    A storage no candidate map lands in is left out (never allocated), as the evaluator counts it, and so is a
    view in an Inductor kernel's region (``region_views``: tensor -> literal, :func:`_region_view_lits`), which
    extends its source's life instead.
    """
    region_views = region_views or {}
    horizon = acc.n_steps + 2
    intervals, demands = [], []
    lands: dict[str, list[tuple[Any, int, int]]] = defaultdict(list)   # storage -> (lit, start, end)
    for t in acc.graph.tensors:
        if t in acc.internal:   # a value inside one kernel, never stored (as Accounting.peak_bytes counts it)
            continue
        a, b = acc.span[t]
        for k in maps_of(t):
            for s in acc.map_by_key(t, k).targets():
                if s in acc.intermediate:
                    lands[s].append((wvar[t, k], a + 1, b + 1))
    for t, rv in region_views.items():
        # a region view lands where its (physical) source does and keeps it alive until its reader
        # (Accounting.peak_bytes); a source that is itself a region view passes it on, when both are
        a, b = acc.span[t]
        lit, src = rv, acc.region_view_source(t, (t,))
        while src is not None:
            for s in acc.map_by_key(src, acc.key_of(src, PHYS)).targets():
                if s in acc.intermediate:
                    lands[s].append((lit, a + 1, b + 1))
            if src not in region_views:
                break
            both = m.new_bool_var("")
            m.add_bool_or([~lit, ~region_views[src], both])
            lit, src = both, acc.region_view_source(src, (src,))
    total = 0
    for s in acc.intermediate:
        size = acc.graph.tensors[s].nbytes
        total += size
        ls = lands.get(s, [])
        if not ls:
            # no candidate map of any tensor lands in this storage (its tensors' maps all resolve elsewhere):
            # it is never allocated, as in Accounting.peak_bytes, so it takes no room (min() of nothing before)
            continue
        rv = region_views.get(s)
        if s not in acc.nodes:
            lo = min(a for _, a, _ in ls)
            hi = max(b for _, _, b in ls)
            intervals.append(m.new_interval_var(lo, hi + 1 - lo, hi + 1, "") if rv is None else
                             m.new_optional_interval_var(lo, hi + 1 - lo, hi + 1, ~rv, ""))
            demands.append(size)
            continue
        present = wvar[s, acc.key_of(s, PHYS)]
        if rv is not None:   # allocated when physical and not a view in a region
            allocated = m.new_bool_var("")
            m.add(allocated + rv >= present)
            m.add_implication(allocated, present)
            present = allocated
        st = m.new_int_var(0, horizon, "")
        en = m.new_int_var(0, horizon, "")
        for lit, a, b in ls:
            if isinstance(lit, int):
                m.add(st <= a)
                m.add(en >= b)
            else:
                m.add(st <= a).only_enforce_if(lit)
                m.add(en >= b).only_enforce_if(lit)
        size_var = m.new_int_var(0, horizon + 1, "")
        m.add(size_var == en + 1 - st)
        intervals.append(m.new_optional_interval_var(st, size_var, en + 1, present, ""))
        demands.append(size)
    cap = m.new_int_var(0, total, "peak")
    m.add_cumulative(intervals, demands, cap)
    return cap


def _integral_objective(obj, lat_expr, cap_var, lat_bound: float = 0.0, cap_bound: float = 0.0):
    """Integer objective: CP-SAT's scaling of tiny float coefficients is not exact enough.

    Latency is in picoseconds and memory in bytes; for a mix both weights are
    scaled by one factor so the smaller becomes ~1e6 (relative error <= 1e-6), or
    less where the objective could then overflow 64 bits (``lat_bound``: the sum of
    the latency terms' magnitudes; ``cap_bound``: the largest peak): whole Llama 3
    8B under ``mix`` was MODEL_INVALID ("possible integer overflow in objective"),
    so the ILP fell back to greedy's strategy.
    """
    if not obj.memory_weight:
        return lat_expr
    if not obj.latency_weight:
        return cap_var
    wl, wm = obj.latency_weight / PS, obj.memory_weight     # seconds per picosecond, per byte
    k = 1e6 / min(wl, wm)
    span = wl * lat_bound + wm * cap_bound
    if span > 0:
        k = min(k, 2.0 ** 56 / span)
    return max(1, int(round(wl * k))) * lat_expr + max(1, int(round(wm * k))) * cap_var


def _model_objective(solver, obj, lat_expr, cap_var, acc) -> float:
    lat = solver.value(lat_expr) / PS if obj.needs_latency else 0.0
    peak = acc.const_bytes + solver.value(cap_var) if cap_var is not None else None
    return obj.value(lat, peak)

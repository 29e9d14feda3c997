"""Decomposition: solve the independent parts of a VTOG separately, and repeated parts once.

Why this is exact for a latency objective: the cost is a sum of unit costs
(:mod:`cost_models.accounting`), and a unit's cost depends only on the maps
of its tensors, which depend only on the options taken by the tensors that
resolve through them.  Two candidate tensors (tensors with options; the
others are physical, with fixed maps) *interact* when an option of one points
into the other (an edge), when they are tensors of one unit (a kernel's
I/O, a movement op's copy), or when options of both point into one storage
(their validity is coupled: a cache written through one and read through the
other is hazard-free only when both are virtual).  The connected components of that relation
(conflicting edges share a tensor or form a 2-cycle, so conflicts are inside
components too) are independent for the cost: the optimum of the whole is
the union of the optima of the parts.  Hazards are not local to a part (two
parts may write into one physical storage), so the combined strategy is
validated by the core, and when a seam fails the VTOG is solved whole
instead (said in ``info["decomposition_failed"]``).  Peak memory is not a sum over
parts, so memory and mix objectives (and a memory cap) are solved whole.

Repeated structure (the 32 identical layers of a decoder): parts whose
*signature* (ops, shapes, dtypes, maps and unit structure with tensor names
replaced by their first-occurrence index) is equal are solved once; the
copies take the corresponding options.  ``info["solves"]`` counts the parts
actually solved, ``info["parts"]`` all of them.

A part's accounting (``sub_vtog`` sets ``parent``) holds only the units its
options can change, and the parts share the graph's memos, so a part's search
costs O(part).

Cut points between repeated layers (``decompose="seams"``, :func:`seam_parts`):
the layers of a decoder are one component because every layer reads the same
rotary tables (options of every layer point into them, and the cos/sin slices
are candidates).  The seams couple validity only through hazard-prone storages
and keep the *hub* tensors (read by every layer) physical; the layers become
parts, solved once per signature.  Not exact (the hubs are not searched): the
status is never ``optimal``, the union is validated, a failing seam falls back
to the whole.  ``decompose="auto"`` (the ILP's default) cuts at the seams only
when the parts are mostly repeats (:func:`repeated`), and solves whole otherwise.

Every searching solver whose module sets ``DECOMPOSABLE`` (greedy, ILP,
exhaustive) goes through :func:`solve_decomposed` via
:func:`solvers.get_solver`; its ``DECOMPOSE`` is the default of ``decompose``
(on for exhaustive; off for greedy and the ILP: see their modules for the
measurements).
Optuna is solved whole: one study (trials, storage) belongs to one search.
"""
from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any, Callable

import networkx as nx

from cost_models import CostOracle, Objective
from vtcsearch.core.strategy import StrategyError
from vtcsearch.core.vtog import VTOG

from .base import Run, SolveResult, SolverStatus, best_implementations

Solve = Callable[..., SolveResult]


def parts(vtog: VTOG, oracle: CostOracle, seams: bool = False) -> list[list[int]]:
    """Option ids of each independent part (connected components of the interaction relation), in order.

    ``seams``: also cut between repeated layers (:func:`seam_parts`); the hub tensors' options are left out."""
    if seams:
        return seam_parts(vtog, oracle)[0]
    return _components(vtog, oracle)


def _components(vtog: VTOG, oracle: CostOracle, fixed: frozenset[str] = frozenset(),
                storages: set[str] | None = None) -> list[list[int]]:
    """Connected components of the interaction relation over the options of tensors not in ``fixed``;
    ``storages``: the storages that couple validity (None: every storage)."""
    acc = oracle.accounting(vtog)
    cands = set(acc.options_of) - fixed  # a tensor without options (or fixed physical) has a fixed map
    g = nx.Graph()
    g.add_nodes_from(cands)
    for o in range(len(vtog.options)):
        for d in acc.option_targets[o]:
            if d in cands and acc.option_tensor[o] in cands:
                g.add_edge(acc.option_tensor[o], d)
    for u in acc.units:
        ts = [t for t in u.tensors if t in cands]
        for a, b in zip(ts, ts[1:]):
            g.add_edge(a, b)
    # validity couples too: options that resolve into one storage (a KV cache written by one tensor's
    # option and read through another's) can be valid only together, so they are solved together
    for o in range(len(vtog.options)):
        if acc.option_tensor[o] not in cands:
            continue
        for e in vtog.options[o].edges:
            st = vtog.graph.tensors[vtog.edges[e].dst].storage_name
            if storages is None or st in storages:
                g.add_edge(acc.option_tensor[o], ("storage", st))
    comp = {t: k for k, c in enumerate(nx.connected_components(g)) for t in c if t in cands}
    by: dict[int, list[int]] = {}
    for o in range(len(vtog.options)):
        if acc.option_tensor[o] in cands:
            by.setdefault(comp[acc.option_tensor[o]], []).append(o)
    return sorted(by.values(), key=lambda os_: os_[0])


def seam_parts(vtog: VTOG, oracle: CostOracle, min_consumers: int = 4) -> tuple[list[list[int]], list[str]]:
    """(parts, hub tensors): cut points between repeated layers.

    Two things join the layers of a decoder into one component: storages that options of every layer point
    into (the rotary tables), and *hub* tensors every layer reads (the cos/sin slices).  Here validity
    couples only through the storages where hazards are possible (in-place edges, mutated buffers:
    ``cost_models.state``'s sensitive storages; elsewhere every tensor sharing a storage holds equal values),
    and the hubs -- the candidates read by at least ``min_consumers`` ops, when leaving them out splits more
    parts -- stay physical, their options left out.  A heuristic cut (the hubs' options are not searched): the caller
    validates the union and says the result is not proven optimal."""
    from cost_models.state import _sensitive_storages
    acc = oracle.accounting(vtog)
    sens = _sensitive_storages(acc)
    base = _components(vtog, oracle, storages=sens)
    hubs: list[str] = []
    for t in acc.options_of:
        consumers = set(vtog.graph.tensors[t].consumers)
        if len(consumers) >= min_consumers:
            hubs.append(t)
    if not hubs:
        return base, []
    cut = _components(vtog, oracle, fixed=frozenset(hubs), storages=sens)
    if len(cut) <= len(base):
        return base, []       # the hubs split nothing: keep their options
    return cut, hubs


def sub_vtog(vtog: VTOG, options: list[int]) -> VTOG:
    """The VTOG restricted to ``options`` (same graph; edges and options renumbered from 0)."""
    eids = sorted({e for o in options for e in vtog.options[o].edges})
    new_id = {e: k for k, e in enumerate(eids)}
    sub = VTOG(vtog.graph)
    for e in eids:
        ed = replace(vtog.edges[e], id=new_id[e])
        sub.edges.append(ed)
        sub.nx.add_edge(ed.src, ed.dst, key=ed.id, cls=ed.cls, op=ed.op, kind=ed.kind)
    for k, o in enumerate(options):
        op = vtog.options[o]
        sub.options.append(replace(op, id=k, edges=tuple(new_id[e] for e in op.edges)))
    sub.conflicts = {frozenset(new_id[e] for e in pair) for pair in vtog.conflicts if all(e in new_id for e in pair)}
    sub.parent = vtog  # type: ignore[attr-defined]   # its accounting covers the part's units only
    return sub


def signature(vtog: VTOG, oracle: CostOracle, options: list[int]) -> str:
    """A description of a part with tensor names replaced by first-occurrence indices (equal: same problem)."""
    acc = oracle.accounting(vtog)
    g = vtog.graph
    names: dict[str, int] = {}

    def n(t: str | None) -> str:
        if t is None:
            return "-"
        if t not in names:
            names[t] = len(names)
        info = g.tensors[t]
        return f"t{names[t]}:{tuple(info.shape)}:{info.dtype}:{info.kind}:{info.is_output}"

    def m(mp) -> str:
        return ";".join(f"{n(p.target)}<{p.region}|{p.index}|{p.cond if hasattr(p, 'cond') else ''}>"
                        for p in mp.pieces)

    out = []
    tensors: list[str] = []
    for o in options:
        op = vtog.options[o]
        tensors.append(op.tensor)
        out.append(f"O {n(op.tensor)} {g.ops[op.op].target_name}")
        for e in op.edges:
            ed = vtog.edges[e]
            tensors.append(ed.dst)
            out.append(f" E {n(ed.src)}>{n(ed.dst)} {ed.kind} {ed.cls} {ed.run} {m(ed.map)}")
    # in program order (unit ids list kernels before copies, which interleaves repeated layers differently)
    units = sorted({u for t in dict.fromkeys(tensors) for u in acc.units_of.get(t, [])},
                   key=lambda u: (min(acc.order[x] for x in (acc.kernel_ops[acc.units[u].kernel]
                                                             if acc.units[u].kernel else [acc.units[u].op])), u))

    def pre(u: int) -> str:   # the unit's line with tensors not yet named left anonymous: a canonical order
        un = acc.units[u]
        ops = acc.kernel_ops[un.kernel] if un.kernel else [un.op]
        info = [g.tensors[t] for t in un.tensors]
        return f"{un.kind} {un.out} {un.src} " + ",".join(
            f"t{names[t]}" if t in names else f"?{tuple(i.shape)}:{i.dtype}:{i.kind}:{i.is_output}"
            for t, i in zip(un.tensors, info)) + " " + ",".join(g.ops[x].target_name for x in ops)

    units = sorted(units, key=lambda u: (pre(u), u))
    for u in units:
        un = acc.units[u]
        ops = acc.kernel_ops[un.kernel] if un.kernel else [un.op]
        out.append(f"U {un.kind} {un.out} {un.src} " + ",".join(n(t) for t in un.tensors) + " "
                   + ",".join(g.ops[x].target_name for x in ops))
    return "\n".join(out)


def repeated(vtog: VTOG, oracle: CostOracle, ps: list[list[int]]) -> bool:
    """Whether the seams' parts are mostly repeats (a stack of identical layers: at most half of them distinct),
    which is where solving each distinct part once pays for leaving the hubs unsearched (``decompose="auto"``)."""
    return len(ps) >= 4 and 2 * len({signature(vtog, oracle, p) for p in ps}) <= len(ps)


def solve_decomposed(name: str, solve: Solve, vtog: VTOG, oracle: CostOracle, budget: Any = None,
                     seed: int = 0, decompose: bool = True, **options: Any) -> SolveResult:
    """``solve`` on each independent part (repeated parts once), combined; whole when that cannot be exact."""
    if decompose not in (True, False, "seams", "auto", "seeded"):
        raise ValueError(f"decompose must be True, False, 'seams', 'auto' or 'seeded', not {decompose!r}")
    if decompose == "seeded":
        return _seeded(name, solve, vtog, oracle, budget, seed, **options)
    if decompose and name == "ilp" and oracle.objective.needs_memory and options.get("hint") is None:
        return _latency_seeded(solve, vtog, oracle, budget, seed, **options)
    if not decompose or oracle.objective.needs_memory:
        return solve(vtog, oracle, budget=budget, seed=seed, **options)
    hubs: list[str] = []
    if decompose in ("seams", "auto"):
        ps, hubs = seam_parts(vtog, oracle)
        if decompose == "auto":
            if not repeated(vtog, oracle, ps):
                return solve(vtog, oracle, budget=budget, seed=seed, **options)
            decompose = "seams"
    else:
        ps = parts(vtog, oracle)
    if len(ps) <= 1 and not hubs:
        return solve(vtog, oracle, budget=budget, seed=seed, **options)
    run = Run(name, vtog, oracle)
    classes: dict[str, list[int]] = {}
    for k, os_ in enumerate(ps):
        classes.setdefault(signature(vtog, oracle, os_), []).append(k)
    chosen: list[int] = []
    first: dict[str, Any] = {}
    statuses: list[SolverStatus] = []
    sub_info: list[dict[str, Any]] = []
    total = sum(len(ps[m[0]]) for m in classes.values())
    for sig, members in classes.items():
        rep = ps[members[0]]
        per_budget = budget      # rounds, points, trials: per part; the ILP's seconds: shared by part size
        if name == "ilp":
            per_budget = max(0.5, (60.0 if budget is None else float(budget)) * len(rep) / total)
        r = solve(sub_vtog(vtog, rep), oracle, budget=per_budget, seed=seed, **options)
        statuses.append(r.status)
        first = first or dict(r.info)        # the solver's own settings (refresh, ...), as a whole solve has them
        sub_info.append({"options": len(rep), "copies": len(members), "status": str(r.status),
                         "objective": r.objective, "wall_s": r.wall_s,
                         **{k: r.info[k] for k in ("gap", "bound", "cuts", "build_s", "solve_s") if k in r.info}})
        pos = sorted(r.options)              # sub-VTOG option i is option rep[i] of the whole
        for k in members:
            chosen.extend(ps[k][i] for i in pos)
        run.trace.extend({**row, "part": len(statuses) - 1, "copies": len(members)} for row in r.trace)
    info: dict[str, Any] = {**first, "parts": len(ps), "solves": len(classes), "sub_results": sub_info}
    if decompose == "seams":
        info["seams"] = hubs        # hub tensors kept physical: the union is not proven optimal
    for k in ("cuts", "build_s", "solve_s"):     # totals over the parts solved (not the first part's)
        if any(k in s for s in sub_info):
            info[k] = sum(s.get(k, 0) for s in sub_info)
    info.pop("bound", None)     # a part's bound includes the rest of the graph: bounds do not add up
    gaps = [s["gap"] for s in sub_info if "gap" in s]
    if gaps:
        info["gap"] = max(gaps)     # every part is proven within this relative gap
    try:
        status = _combined(statuses)
        if hubs and status == SolverStatus.OPTIMAL:
            status = SolverStatus.FEASIBLE
        res = run.finish(chosen, status, info)
        if res.info.get("dropped_by_final_validation"):
            raise StrategyError("hazard", "", "a seam between parts")
        return res
    except StrategyError as e:
        whole = solve(vtog, oracle, budget=budget, seed=seed, **options)
        whole.info.update(decomposition_failed=str(e), parts=len(ps))
        return whole


def _seeded(name: str, solve: Solve, vtog: VTOG, oracle: CostOracle, budget: Any, seed: int,
            **options: Any) -> SolveResult:
    """``decompose="seeded"`` (the ILP): solve at the seams, then the whole started from that solution.

    The seams' union is cheap where layers repeat and usually better than greedy's; as the whole ILP's hint
    and incumbent it makes the whole never worse than the seams, and CP-SAT's bound says how far from
    the optimum both are.  Wall time and build/solve seconds include the seams' solve."""
    if name != "ilp" or oracle.objective.needs_memory:
        return solve(vtog, oracle, budget=budget, seed=seed, **options)
    first = solve_decomposed(name, solve, vtog, oracle, budget=budget, seed=seed, decompose="seams", **options)
    if first.info.get("decomposition_failed") or "seams" not in first.info:
        return first               # no seams, or they failed and the whole was solved already
    whole = solve(vtog, oracle, budget=budget, seed=seed, hint=list(first.options), **options)
    whole.info["seeded_by"] = {"objective": first.objective, "status": str(first.status), "wall_s": first.wall_s,
                               "parts": first.info.get("parts"), "solves": first.info.get("solves")}
    for k in ("build_s", "solve_s"):
        if k in whole.info and k in first.info:
            whole.info[k] += first.info[k]
    return replace(whole, wall_s=whole.wall_s + first.wall_s)


def _latency_seeded(solve: Solve, vtog: VTOG, oracle: CostOracle, budget: Any, seed: int,
                    **options: Any) -> SolveResult:
    """The ILP under a memory objective, whole (the peak couples every layer), started from the latency ILP's
    solution at the seams where the layers repeat: greedy alone is a poor start there (whole Llama 3 8B under
    ``mix``: CP-SAT found nothing better than greedy's 5.6 ms within its budget, while the latency ILP's
    strategy prices at 4.3 ms), and the result is never worse than that solution under the memory objective
    either.  Elsewhere (no repeated layers) it is the whole ILP from greedy, as before."""
    lat = copy.copy(oracle)           # the same memos and measurements; only the objective differs
    lat.objective = Objective.latency()
    ps, _ = seam_parts(vtog, lat)
    if not repeated(vtog, lat, ps):
        return solve(vtog, oracle, budget=budget, seed=seed, **options)
    first = solve_decomposed("ilp", solve, vtog, lat, budget=budget, seed=seed, decompose="seams", **options)
    whole = solve(vtog, oracle, budget=budget, seed=seed, hint=list(first.options), **options)
    start = copy.copy(first.strategy)       # the hint as the ILP prices it: each group's best implementation
    start.set_implementations(best_implementations(oracle, start))
    whole.info["seeded_by"] = {"objective": "latency", "latency_s": first.objective, "status": str(first.status),
                               "wall_s": first.wall_s, "start_objective": oracle.evaluate(start).objective}
    return replace(whole, wall_s=whole.wall_s + first.wall_s)


def _combined(statuses: list[SolverStatus]) -> SolverStatus:
    """What the union proves: optimal only if every part is; otherwise the weakest claim."""
    if all(s == SolverStatus.OPTIMAL for s in statuses):
        return SolverStatus.OPTIMAL
    for s in (SolverStatus.REFERENCE, SolverStatus.HEURISTIC, SolverStatus.FEASIBLE):
        if s in statuses:
            return s
    return SolverStatus.FEASIBLE

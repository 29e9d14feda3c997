"""The paper's global greedy algorithm (VTC, section 5.2), over options.

Paper: keep an anchor set A and chosen edges C, start all-physical; every
round, add to A the node whose non-conflicting edges give the largest summed
saving w(e) = l(C) - l(C ∪ {e}); then re-profile the edges pointing into that
node; stop when the best saving is negative or every node is anchored.

Mapping onto this VTOG:

* **Options, not single edges.**  A virtual tensor must be covered whole, so it
  takes one option (e.g. all the slabs of a Concat output together).  A
  node's saving is the best saving over its valid options, each option costed
  jointly: ``w(o) = l(C) - l(C ∪ o)``.  For the usual one-edge options this is
  exactly the paper's ``w(e)``.
* **Anchors are the tensors made virtual.**  Every tensor not yet anchored is
  physical and may be pointed to; an anchored tensor is never revisited.  (The
  reading where only anchors can be pointed to can never make a tensor virtual
  over a physical intermediate such as the QKV GEMM output, so it would not
  eliminate the Split of the paper's own motivating example.)
* **Re-evaluation.**  Making ``v_c`` virtual changes the maps of the tensors
  that point to it, so the savings of options with an edge into ``v_c`` are
  recomputed (``refresh="paper"``, the default).  Other cached savings may be
  stale, as in the paper; ``refresh="lazy"`` re-evaluates the best candidate
  before accepting it (lazy greedy), ``"full"`` re-evaluates every option
  every round.
* A candidate whose state is invalid (cycle, non-injective write, hazard) is
  skipped; the final strategy is validated by the core.  Local rules are
  checked per candidate; hazards (possible only around in-place edges and
  mutated buffers) need the core's whole-strategy check, so such moves are
  checked ``batch`` at a time and a failing batch is bisected to find the bad moves.

* **Implementations.**  The search state gives every kernel its cheapest
  implementation (``oracle.implementations``) for its current maps, so a move
  that makes a library kernel's operand virtual is costed with the kernel's
  best response (keep the library and pay the gather, or switch to Triton).
  Given the maps, implementations are independent per kernel, so no separate
  implementation move can improve on it.

``budget``: maximum number of rounds.  Cost: O(options) evaluations up front,
then O(in-degree) per round; each evaluation is incremental (only the units the
option touches are re-costed), so the whole search is O(|V|·d) oracle queries.
"""
from __future__ import annotations

import heapq
import math

from cost_models import CostOracle
from cost_models.state import SearchState
from vtcsearch.core.vtog import VTOG

from .base import Run, SolveResult, SolverStatus, penalized, usable_options

NAME = "greedy"
DECOMPOSABLE = True   # can be solved part by part through solvers.decompose (decompose=True) ...
DECOMPOSE = False     # ... not by default: decompose="seams" is faster on Llama 3 8B decode (3.4 vs 7.9 s) but
                      # 0.05% worse (its hub tensors stay physical), and slower and worse on the 2,000-node
                      # synthetic VTOG (results/solver_scaling/)


def solve(vtog: VTOG, oracle: CostOracle, budget: int | None = None, seed: int = 0,
          refresh: str = "paper", tol: float = 0.0, batch: int = 16) -> SolveResult:
    if refresh not in ("paper", "lazy", "full"):
        raise ValueError("refresh must be 'paper', 'lazy' or 'full'")
    run = Run(NAME, vtog, oracle)
    state = SearchState(oracle, vtog)
    acc = state.acc
    opts = usable_options(state)
    into: dict[str, list[int]] = {}            # tensor -> options with an edge into it
    for t, os_ in opts.items():
        for o in os_:
            for d in acc.option_targets[o]:
                into.setdefault(d, []).append(o)

    def score_now() -> float:
        return penalized(state, state.objective(), state.latency, state.peak if oracle.objective.needs_memory else None)

    base = score_now()
    run.record(state.objective(), round=0, tensor=None, option=None, gain=0.0)
    gain: dict[int, float] = {}
    version: dict[int, int] = {}
    heap: list[tuple[float, int, int]] = []
    rnd = 0

    def evaluate(o: int) -> None:
        t = acc.option_tensor[o]
        mv = state.propose(t, o)
        if mv.cycle:
            g = -math.inf
        else:
            val = state.objective_of(mv)
            g = base - penalized(state, val, mv.latency, mv._peak)
        gain[o], version[o] = g, rnd
        if g > -math.inf:
            heapq.heappush(heap, (-g, o, rnd))

    for t, os_ in opts.items():
        for o in os_:
            evaluate(o)
    anchored: set[str] = set()
    dead: set[int] = set()
    rejected = 0
    pending: list[tuple[str, int]] = []      # hazard-sensitive moves not yet checked by the core

    def settle() -> None:
        """Core-check the pending sensitive moves together; bisect a failing batch to find the bad ones."""
        nonlocal base, rejected
        if not pending:
            return
        batch_, pending[:] = list(pending), []
        if state.core_check() is None:
            return
        for t_, _ in reversed(batch_):
            state.apply(state.propose(t_, None))
            anchored.discard(t_)

        def place(moves: list[tuple[str, int]]) -> None:
            nonlocal rejected
            applied = []
            for t_, o_ in moves:
                mv_ = state.propose(t_, o_)
                if state.check_local(mv_)[0] is None:
                    state.apply(mv_)
                    applied.append((t_, o_))
                else:
                    dead.add(o_)
                    rejected += 1
            if not applied or state.core_check() is None:
                anchored.update(t_ for t_, _ in applied)
                return
            for t_, _ in reversed(applied):
                state.apply(state.propose(t_, None))
            if len(applied) == 1:
                dead.add(applied[0][1])
                rejected += 1
                return
            half = len(applied) // 2
            place(applied[:half])
            place(applied[half:])

        place(batch_)
        base = score_now()
        run.record(state.objective(), round=rnd, tensor=None, option=None, gain=0.0, note="bisected")

    while heap and (budget is None or rnd < budget):
        negg, o, ver = heapq.heappop(heap)
        t = acc.option_tensor[o]
        if t in anchored or o in dead or ver != version.get(o):
            continue
        g = -negg
        if refresh == "lazy" and ver < rnd:
            evaluate(o)
            continue
        if g < -tol:
            break
        mv = state.propose(t, o)
        reason, sensitive = state.check_local(mv)
        if reason is not None:
            dead.add(o)
            rejected += 1
            continue
        state.apply(mv)
        anchored.add(t)
        if sensitive:
            pending.append((t, o))
            if len(pending) >= batch:
                settle()
        rnd += 1
        new = score_now()
        run.record(state.objective(), round=rnd, tensor=t, option=o, gain=g, actual_gain=base - new)
        base = new
        if refresh == "full":
            todo = [p for x, os_ in opts.items() if x not in anchored for p in os_ if p not in dead]
        else:
            todo = [p for p in into.get(t, []) if acc.option_tensor[p] not in anchored and p not in dead]
        for p in todo:
            evaluate(p)
    settle()
    return run.finish(list(state.choice.values()), SolverStatus.HEURISTIC,
                      {"rounds": rnd, "rejected": rejected, "refresh": refresh,
                       "core_validations": state.core_validations}, impl=state.implementations())


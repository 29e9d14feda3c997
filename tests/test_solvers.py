"""Solvers: valid strategies everywhere, ILP == exhaustive, reproducible Optuna, scale smoke, cached profiling."""
from __future__ import annotations

import hashlib
import math
import os
import random
import sys
import time
import warnings

import pytest
import torch

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from cost_models import AnalyticalOracle, CostOracle, Objective, UnitCost  # noqa: E402
from cost_models.profiling import ProfilingOracle  # noqa: E402
from experiments.synthetic import random_vtog, small_vtogs  # noqa: E402
from solvers import SOLVERS, SolverRefused, get_solver  # noqa: E402
from vtcsearch.core.vtog import EdgeClass, build_vtog  # noqa: E402

warnings.filterwarnings("ignore")

# meta-device sizes where bytes, not launches, dominate (and reshape-map injectivity checks stay cheap)
SIZES = dict(batch=2, seq=128, dims=(128, 256, 512))
N_EXACT = 50


def _tol(x: float) -> float:
    return 1e-9 * max(1.0, abs(x)) + 1e-10


@pytest.fixture(scope="module")
def exact_vtogs():
    return small_vtogs(N_EXACT, max_points=2048, seed=7, motifs=(2, 5), **SIZES)


@pytest.fixture(scope="module")
def workload_vtogs():
    """Real workloads; one that fails to build fails the tests that use it (never silently dropped)."""
    from experiments.workloads import build_workload
    from vtcsearch.core.capture import capture
    out = []
    for name, kw in [("llama3", dict(part="attention")), ("gemma2", dict(part="attention")), ("shufflenet", {})]:
        w = build_workload(name, size="tiny", **kw)
        out.append((name, build_vtog(capture(w.model, w.example_inputs))))
    return out


def test_registry():
    assert set(SOLVERS) == {"none", "inductor", "all", "greedy", "ilp", "optuna", "exhaustive"} and len(SOLVERS) == 7
    with pytest.raises(ValueError):
        get_solver("annealing")


def test_ilp_equals_exhaustive(exact_vtogs, record_property):
    """The ILP is exact w.r.t. the oracle: on every VTOG small enough, it finds the exhaustive optimum."""
    oracle = AnalyticalOracle("H200")
    gaps = []
    for v in exact_vtogs:
        ex = get_solver("exhaustive")(v, oracle)
        il = get_solver("ilp")(v, oracle, budget=30)
        gr = get_solver("greedy")(v, oracle)
        for r in (ex, il, gr):
            r.strategy.validate()
        assert il.status == "optimal"
        assert abs(il.objective - ex.objective) <= _tol(ex.objective), (v.summary(), il.info, ex.info)
        assert gr.objective >= ex.objective - _tol(ex.objective)      # nobody beats the optimum
        gaps.append((gr.objective - ex.objective) / ex.objective)
    record_property("greedy_gap_mean", sum(gaps) / len(gaps))
    record_property("greedy_gap_max", max(gaps))
    print(f"\ngreedy gap to the optimum over {len(gaps)} VTOGs: mean {100 * sum(gaps) / len(gaps):.2f}%, "
          f"max {100 * max(gaps):.2f}%, optimal on {sum(g <= 1e-9 for g in gaps)}")


class RandomCosts(CostOracle):
    """Arbitrary (deterministic) costs per configuration: optima land anywhere, hazardous points included."""

    name = "random"

    def measure(self, spec):
        h = int(hashlib.sha1(spec.key().encode()).hexdigest()[:8], 16)
        return UnitCost(1e-6 * (1 + (h % 1000) / 100))


def test_ilp_exact_with_hazard_cuts():
    """KV-cache-style in-place updates: the ILP's lazily cut hazards keep it equal to exhaustive search."""
    rng = random.Random(5)
    vs, s = [], 0
    while len(vs) < 25:
        s += 1
        v = random_vtog(rng.randint(2, 4), seed=900 + s, motifs=("cache", "linear", "slice", "act", "split_cat"),
                        **SIZES)
        opts: dict[str, int] = {}
        for o in v.options:
            opts[o.tensor] = opts.get(o.tensor, 0) + 1
        if 2 <= math.prod(1 + k for k in opts.values()) <= 4096:
            vs.append(v)
    cuts = 0
    for v in vs:
        for oracle in (AnalyticalOracle("H200"), RandomCosts()):
            ex = get_solver("exhaustive")(v, oracle)
            il = get_solver("ilp")(v, oracle)
            il.strategy.validate()
            cuts += il.info.get("cuts", 0)
            assert abs(il.objective - ex.objective) <= _tol(ex.objective)
    assert cuts > 0      # the hazard path was exercised


@pytest.mark.parametrize("objective", [Objective.memory(), Objective.mix(1e-3)], ids=["memory", "mix"])
def test_ilp_equals_exhaustive_other_objectives(exact_vtogs, objective):
    oracle = AnalyticalOracle("H200", objective=objective)
    for v in exact_vtogs[:12]:
        ex = get_solver("exhaustive")(v, oracle)
        il = get_solver("ilp")(v, oracle, budget=30)
        assert abs(il.objective - ex.objective) <= max(_tol(ex.objective), 1e-6 * abs(ex.objective))


class LongLived(torch.nn.Module):
    """A slice read only at the end: virtual (no copy, fastest) it keeps the big tensor it views alive."""

    def __init__(self, width: int, tail: int):
        super().__init__()
        self.width, self.tail = width, tail

    def forward(self, a, b, c):
        x = a @ b
        y = x[:, :self.width]
        t = torch.sigmoid(x) @ c              # x dies here unless y lives in it
        u = torch.relu(t) @ c
        return u[:, :self.tail] * 2.0 + y[:, :self.tail]


@pytest.fixture(scope="module")
def tradeoff_vtogs():
    from vtcsearch.core.capture import capture
    out = []
    for width, tail, n in [(16, 16, 1024), (256, 16, 1024), (512, 64, 768)]:
        args = (torch.randn(256, 64), torch.randn(64, n), torch.randn(n, n))
        out.append(build_vtog(capture(LongLived(width, tail), args)))
    return out


@pytest.mark.parametrize("objective", [Objective.memory(), Objective.mix(3e-2)], ids=["memory", "mix"])
def test_ilp_equals_exhaustive_where_latency_and_memory_disagree(tradeoff_vtogs, objective):
    """On VTOGs whose latency optimum is not optimal for memory, the ILP still finds the exhaustive optimum.
    (The mix's price of memory, 30 ms per GiB, outweighs the copy kernel a long-lived virtual slice saves, its
    launch and graph gap included: at 10 ms per GiB the 512-wide slice was worth keeping virtual.)"""
    lat = AnalyticalOracle("H200")
    oracle = AnalyticalOracle("H200", objective=objective)
    for v in tradeoff_vtogs:
        fastest = get_solver("exhaustive")(v, lat)
        ex = get_solver("exhaustive")(v, oracle)
        worse = oracle.evaluate(fastest.strategy, rows=False).objective
        assert worse > ex.objective * (1 + 1e-6), "the latency optimum must not be optimal here"
        il = get_solver("ilp")(v, oracle, budget=30)
        il.strategy.validate()
        assert abs(il.objective - ex.objective) <= max(_tol(ex.objective), 1e-6 * abs(ex.objective)), \
            (il.options, ex.options)


def test_memory_cap(exact_vtogs):
    v = max(exact_vtogs, key=lambda v: len(v.options))
    free = get_solver("ilp")(v, AnalyticalOracle("H200", objective=Objective.latency()))
    least = get_solver("ilp")(v, AnalyticalOracle("H200", objective=Objective.memory()))
    cap = (free.peak_bytes + least.peak_bytes) // 2 if free.peak_bytes > least.peak_bytes else least.peak_bytes
    capped = get_solver("ilp")(v, AnalyticalOracle("H200", objective=Objective.latency(memory_cap=cap)))
    assert capped.peak_bytes <= cap
    assert capped.latency_s >= free.latency_s - _tol(free.latency_s)
    ex = get_solver("exhaustive")(v, AnalyticalOracle("H200", objective=Objective.latency(memory_cap=cap)))
    assert abs(ex.objective - capped.objective) <= _tol(ex.objective)


def test_every_solver_valid_everywhere(exact_vtogs, workload_vtogs):
    cases = [("synthetic", v) for v in exact_vtogs[:6]] + workload_vtogs
    oracle = AnalyticalOracle("H200")
    for label, v in cases:
        base = None
        for name in SOLVERS:
            try:
                r = get_solver(name)(v, oracle, budget=20 if name in ("optuna", "ilp") else None)
            except SolverRefused as e:      # exhaustive: too large; inductor: a Triton-only oracle
                assert (name == "exhaustive" and "ilp" in str(e)) or (name == "inductor" and "inductor" in str(e))
                continue
            r.strategy.validate()
            assert math.isfinite(r.objective) and r.wall_s >= 0 and r.trace
            if name == "none":
                base = r.objective
                assert not r.strategy.virtual
            if name == "all":
                assert all(e.cls == EdgeClass.TYPE_I for es in r.strategy.chosen.values() for e in es)
            if name in ("ilp", "exhaustive"):
                assert r.objective <= base + _tol(base), (label, name)


def test_the_inductor_reference_is_torch_compiles_program():
    """``inductor``: nothing virtual and every group Inductor's where it can run (the guard's second reference);
    refused by an oracle that leaves Inductor out."""
    from vtcsearch.core.capture import capture
    from vtcsearch.core.implementation import INDUCTOR, inductor_can_run
    v = build_vtog(capture(Branches().eval(), (torch.randn(8, 32), torch.randn(32, 16),
                                                *[torch.randn(32, 32) for _ in range(2)])))
    g = v.graph
    r = get_solver("inductor")(v, AnalyticalOracle("H200", implementations=("triton", "library", "inductor")))
    r.strategy.validate()
    assert not r.strategy.virtual and r.status == "reference"
    assert {n: r.strategy.implementation(n) for n in g.groups} == \
        {n: INDUCTOR for n, gr in g.groups.items() if inductor_can_run(g, gr)} and g.groups
    with pytest.raises(SolverRefused, match="inductor"):
        get_solver("inductor")(v, AnalyticalOracle("H200"))


def test_exhaustive_refuses_large():
    v = random_vtog(40, seed=1, **SIZES)
    with pytest.raises(SolverRefused, match="ilp"):
        get_solver("exhaustive")(v, AnalyticalOracle())


def test_greedy_variants(exact_vtogs):
    oracle = AnalyticalOracle("A100")
    v = exact_vtogs[-1]
    for refresh in ("paper", "lazy", "full"):
        r = get_solver("greedy")(v, oracle, refresh=refresh)
        r.strategy.validate()
        assert r.info["refresh"] == refresh
        assert r.trace[0]["round"] == 0
    with pytest.raises(ValueError):
        get_solver("greedy")(v, oracle, refresh="sometimes")


def test_optuna_reproducible_and_resumable(exact_vtogs, tmp_path):
    v = max(exact_vtogs, key=lambda v: len(v.options))
    oracle = AnalyticalOracle("H200")
    a = get_solver("optuna")(v, oracle, budget=25, seed=3)
    b = get_solver("optuna")(v, oracle, budget=25, seed=3)
    assert a.objective == b.objective and a.options == b.options
    assert [t["objective"] for t in a.trace] == [t["objective"] for t in b.trace]
    r = get_solver("optuna")(v, oracle, budget=10, seed=1, sampler="random")
    r.strategy.validate()
    url = f"sqlite:///{tmp_path / 'study.db'}"
    first = get_solver("optuna")(v, oracle, budget=8, seed=0, storage=url, study_name="s")
    again = get_solver("optuna")(v, oracle, budget=16, seed=0, storage=url, study_name="s")
    assert first.info["trials"] == 8 and again.info["resumed_from"] == 8 and again.info["trials"] == 16
    assert again.objective <= first.objective
    pruned = get_solver("optuna")(v, oracle, budget=10, seed=0, infeasible="prune")
    pruned.strategy.validate()


def test_second_search_makes_no_measurements(tmp_path, exact_vtogs):
    """The profiling oracle's SQLite cache: an identical second search measures nothing."""
    v = random_vtog(4, seed=11)                  # CPU-sized tensors
    db = tmp_path / "cache.sqlite"
    first = get_solver("greedy")(v, ProfilingOracle(db, repeats=3, warmup=1))
    assert first.measurements > 0
    o2 = ProfilingOracle(db, repeats=3, warmup=1)
    second = get_solver("greedy")(v, o2)
    assert second.measurements == 0 and second.cache_hits > 0
    il = get_solver("ilp")(v, ProfilingOracle(db, repeats=3, warmup=1))
    il2 = get_solver("ilp")(v, ProfilingOracle(db, repeats=3, warmup=1))
    assert il2.measurements == 0 and il2.objective == il.objective
    il.strategy.validate()


@pytest.mark.slow
def test_scale_large(record_property):
    """On a large VTOG on one core: ILP <= greedy <= all physical, every strategy valid, and the status says
    what was proven (no bound on time: the 30 s target is measured by ``python -m experiments.solver_scaling``
    on a known machine; a shared CI box would make it flaky).  1,000 nodes in CI
    (greedy alone takes ~2 minutes at 2,000 on a 2-core machine); ``VTCSEARCH_SCALE_NODES=2000`` for the
    issue's size."""
    nodes = int(os.environ.get("VTCSEARCH_SCALE_NODES", "1000"))
    v = random_vtog(target_nodes=nodes, seed=0, batch=2, seq=64, dims=(128, 256, 512))
    assert v.nx.number_of_nodes() >= nodes
    res = {}
    oracle = AnalyticalOracle("H200")     # shared: the ILP's own greedy run reuses the memoized unit costs
    for name in ("none", "greedy", "ilp"):
        t0 = time.perf_counter()
        r = get_solver(name)(v, oracle, **({"workers": 1, "budget": 30} if name == "ilp" else {}))
        dt = time.perf_counter() - t0
        r.strategy.validate()
        res[name] = r
        record_property(f"{name}_seconds", dt)
        print(f"\n{name}: {dt:.1f}s on {v.nx.number_of_nodes()} VTOG nodes, objective {r.objective * 1e6:.1f} us, "
              f"{r.status}")
    assert res["ilp"].objective <= res["greedy"].objective + _tol(res["greedy"].objective)
    assert res["greedy"].objective <= res["none"].objective + _tol(res["none"].objective)
    il = res["ilp"]
    assert il.status in ("optimal", "feasible", "greedy_incumbent") and "gap" in il.info
    if il.status == "optimal":       # a proof: no gap left (a stop at gap_limit is "feasible")
        assert il.info["gap"] == 0.0


def test_ilp_never_worse_than_greedy_without_a_valid_solution():
    """CP-SAT's first solution is cut off (a hazard) and no cut is allowed: the ILP returns greedy's
    valid solution instead of all physical, and says so."""
    v = random_vtog(3, seed=910, motifs=("cache", "linear", "slice", "act", "split_cat"), **SIZES)
    oracle = RandomCosts()
    il = get_solver("ilp")(v, oracle, max_cuts=0)
    il.strategy.validate()
    assert il.info["cuts"] == 1, "this VTOG's first CP-SAT solution is no longer invalid: pick another seed"
    gr = get_solver("greedy")(v, oracle)
    assert il.status == "greedy_incumbent" and il.info["incumbent"] == "greedy", (il.status, il.info)
    assert il.options == gr.options and abs(il.objective - gr.objective) <= _tol(gr.objective)
    none = get_solver("none")(v, oracle)
    assert il.objective < none.objective


def test_ilp_repair_worse_than_greedy_is_neither_kept_nor_called_optimal():
    """CP-SAT's last answer is rejected after the one cut allowed; the repair made from the first rejected
    answer (its tensors around the hazard physical) is valid but worse than greedy's: greedy's is returned,
    and not as a proven optimum."""
    v = random_vtog(3, seed=990, motifs=("cache", "linear", "slice", "act", "split_cat"), **SIZES)
    oracle = RandomCosts()
    il = get_solver("ilp")(v, oracle, max_cuts=1)
    il.strategy.validate()
    assert il.info["cuts"] == 2 and "repaired_objective" in il.info, \
        "this VTOG no longer takes the repair path: pick another seed"
    gr = get_solver("greedy")(v, oracle)
    assert il.info["repaired_objective"] > gr.objective
    assert il.status == "greedy_incumbent" and abs(il.objective - gr.objective) <= _tol(gr.objective)


@pytest.mark.slow
def test_ilp_repairs_symmetric_hazards_at_the_bound():
    """torchvision's Swin-T: CP-SAT's optima each break one hazard in a shifted window's mask (slice_scatter
    chains, cost-neutral and symmetric), so cuts alone re-solve for minutes (six 17-20 s solves, then the
    budget ended on greedy's 702 us); the first rejected optimum's repair is at CP-SAT's bound and ends it."""
    pytest.importorskip("torchvision")
    wl = pytest.importorskip("experiments.workloads")
    from vtcsearch.core.capture import capture
    w = wl.build_workload("zoo", model="tv_swin_t", size="full", batch=1, device="cpu", dtype=torch.float32)
    v = build_vtog(capture(w.model, w.example_inputs))
    oracle = AnalyticalOracle("H100", implementations=("inductor", "library", "triton"))
    il = get_solver("ilp")(v, oracle, budget=120)
    gr = get_solver("greedy")(v, oracle)
    il.strategy.validate()
    assert il.info.get("incumbent") == "repaired" and il.info["solver_status"] == "REPAIRED_AT_BOUND", il.info
    assert il.info["gap"] <= 1e-9 and il.objective < gr.objective
    assert il.info["solve_s"] < 60


class Branches(torch.nn.Module):
    """Independent identical branches (the shape of repeated layers without a residual stream)."""

    def forward(self, a, c, *bs):
        outs = []
        for b in bs:
            x = a @ b
            y = x[:, :16]
            t = torch.sigmoid(x) @ c
            outs.append(torch.relu(t)[:, :16] * 2.0 + y)
        return tuple(outs)


def test_decomposition_equals_the_whole_and_solves_repeats_once():
    """Independent parts solved separately give the monolithic optimum; identical parts are solved once."""
    from vtcsearch.core.capture import capture
    args = (torch.randn(64, 32), torch.randn(256, 256), *(torch.randn(32, 256) for _ in range(3)))
    v = build_vtog(capture(Branches(), args))
    oracle = AnalyticalOracle("H200")
    whole = get_solver("ilp")(v, oracle, decompose=False)
    ex = get_solver("exhaustive")(v, oracle, decompose=False)
    parted = get_solver("ilp")(v, oracle, decompose=True)
    parted.strategy.validate()
    assert parted.info["parts"] >= 3 and parted.info["solves"] < parted.info["parts"]
    assert max(s["copies"] for s in parted.info["sub_results"]) == 3          # the three branches: one solve
    assert abs(parted.objective - whole.objective) <= _tol(whole.objective)
    assert abs(parted.objective - ex.objective) <= _tol(ex.objective) and parted.status == "optimal"
    g = get_solver("greedy")(v, oracle, decompose=True)
    assert g.info["solves"] == parted.info["solves"]


@pytest.mark.parametrize("source", ["random", "shufflenet"])
def test_decomposition_equals_monolithic_ilp(source):
    from solvers.decompose import parts
    oracle = AnalyticalOracle("H200")
    if source == "random":
        vs = [random_vtog(6, seed=s, **SIZES) for s in (0, 3)]
    else:
        from experiments.workloads import build_workload
        from vtcsearch.core.capture import capture
        w = build_workload("shufflenet", size="tiny")
        vs = [build_vtog(capture(w.model, w.example_inputs))]
    for v in vs:
        assert len(parts(v, oracle)) > 1, "a multi-part VTOG is needed here"
        whole = get_solver("ilp")(v, oracle, decompose=False)
        parted = get_solver("ilp")(v, oracle, decompose=True)
        parted.strategy.validate()
        assert "decomposition_failed" not in parted.info and parted.info["parts"] > 1
        assert abs(parted.objective - whole.objective) <= _tol(whole.objective), (parted.info, whole.info)


def test_ilp_memory_model_storage_without_candidates():
    """Under a memory or mix objective, a storage no candidate map lands in (here ``dead``: its own
    tensor's map resolves elsewhere) is never allocated; the memory model once called min() on nothing."""
    from types import SimpleNamespace

    from ortools.sat.python import cp_model

    from solvers.ilp import _memory_model

    class Map:
        def __init__(self, targets):
            self._t = targets

        def targets(self):
            return self._t

    tensors = {"a": SimpleNamespace(nbytes=100), "dead": SimpleNamespace(nbytes=1000)}
    maps = {("a", "phys:a"): Map(["a"]), ("dead", "phys:dead"): Map(["a"])}
    acc = SimpleNamespace(n_steps=2, graph=SimpleNamespace(tensors=tensors), span={"a": (0, 1), "dead": (1, 2)},
                          intermediate={"a", "dead"}, nodes=set(), internal=set(),
                          map_by_key=lambda t, k: maps[t, k], key_of=lambda t, k: f"phys:{t}")
    m = cp_model.CpModel()
    wvar = {("a", "phys:a"): 1, ("dead", "phys:dead"): 1}
    cap = _memory_model(m, acc, {}, lambda t: [f"phys:{t}"], wvar)
    m.minimize(cap)
    solver = cp_model.CpSolver()
    assert solver.solve(m) == cp_model.OPTIMAL
    assert solver.value(cap) == 100


def test_capping_keeps_the_physical_the_warm_start_and_the_largest_tree():
    """A unit with too many configurations loses maps, but each tensor keeps its physical map (first), greedy's
    (protected) and its largest tree, every movement op around it eliminated: on two Llama 3 8B layers the
    ILP lost the repeat_kv chain read straight from the cache when greedy had not taken it (three 8-32 MiB
    copy kernels, a 7% worse optimum)."""
    import math
    from types import SimpleNamespace
    from ortools.sat.python import cp_model
    from solvers.ilp import _cap_configs
    u = SimpleNamespace(tensors=("a", "b"), name="u")
    ks = [[f"a{i}" for i in range(40)], [f"b{i}" for i in range(40)]]
    wvar = {(t, k): 1 for t, kk in zip(u.tensors, ks) for k in kk}
    info: dict = {}
    out = _cap_configs(u, ks, 100, wvar, cp_model.CpModel(), info, {"a": "a17"})
    assert math.prod(len(k) for k in out) <= 100 and info["complete"] is False
    assert {"a0", "a17", "a39"} <= set(out[0]) and {"b0", "b39"} <= set(out[1])


def test_mix_objective_fits_in_64_bits():
    """Under ``mix`` both weights are scaled to integers; the scale must leave the objective's range inside
    64 bits (whole Llama 3 8B under mix was MODEL_INVALID, and the ILP fell back to greedy)."""
    from ortools.sat.python import cp_model
    from cost_models import Objective
    from solvers.ilp import _integral_objective
    m = cp_model.CpModel()
    lat, cap = m.new_int_var(0, 10**13, "lat_ps"), m.new_int_var(0, 10**11, "peak_bytes")
    m.minimize(_integral_objective(Objective.mix(1e-3), lat, cap, 1e13, 1e11))
    assert m.validate() == ""
    m.add(lat == 4 * 10**12)
    m.add(cap == 10**10)
    solver = cp_model.CpSolver()
    assert solver.solve(m) == cp_model.OPTIMAL


def test_a_hint_is_priced_with_its_best_implementations():
    """A hint (the seams' solution, or the latency ILP's under a memory objective) is options only; the ILP
    prices it with each group's best implementation, as every solver's result is, not all as templates (which
    made the latency ILP's strategy look worse than greedy's under ``mix``)."""
    from cost_models.accounting import LocalStrategy
    from solvers import ilp
    from solvers.base import best_implementations
    from vtcsearch.core.capture import capture
    wl = pytest.importorskip("experiments.workloads")
    w = wl.build_workload("llama3", size="tiny", part="layer")
    v = build_vtog(capture(w.model, w.example_inputs))
    oracle = AnalyticalOracle("H200", implementations=("inductor", "library", "triton"))
    best = get_solver("ilp")(v, oracle)
    res = ilp.solve(v, oracle, hint=list(best.options))
    s = LocalStrategy(v, [e for o in best.options for e in v.options[o].edges], oracle.accounting(v))
    s.set_implementations(best_implementations(oracle, s))
    assert res.info["hint_objective"] == pytest.approx(oracle.evaluate(s).objective)
    assert res.objective <= res.info["hint_objective"] * (1 + 1e-9)


def test_the_memory_ilp_starts_from_the_latency_ilp_on_repeated_layers():
    """Under ``mix`` the peak couples all layers, so the ILP solves the whole model, started from the latency
    ILP's solution at the seams: never worse than that solution under its own objective."""
    wl = pytest.importorskip("experiments.workloads")
    from vtcsearch.core.capture import capture
    w = wl.build_workload("llama3", size="tiny", part="model", n_layers=4)
    v = build_vtog(capture(w.model, w.example_inputs))
    impls = ("inductor", "library", "triton")
    mix = AnalyticalOracle("H200", objective=Objective.mix(1e-3), implementations=impls)
    r = get_solver("ilp")(v, mix, budget=5)
    seeded = r.info["seeded_by"]
    assert seeded["objective"] == "latency"
    # never worse than its start: the seams solve's latency strategy, priced under mix (a second latency
    # solve here need not find the same strategy: CP-SAT's result depends on the machine's speed)
    assert 0 < seeded["latency_s"] <= seeded["start_objective"]
    assert r.objective <= seeded["start_objective"] * (1 + 1e-9)


def test_ilp_takes_no_virtual_tensor_the_oracle_sees_no_gain_in():
    """Where every option is priced the same as none (each kernel a constant, copies free), the ILP returns the
    all-physical strategy, not the zero-gain moves greedy takes: ConvNeXt-atto's all-Inductor pick took 39 such
    options and DeiT-tiny's 102, and a pick like that changes what Inductor compiles (DeiT's ran 0.92x)."""
    import torch.nn as nn
    from vtcsearch.core.capture import capture

    class Flat(AnalyticalOracle):
        def measure(self, spec):
            return UnitCost(0.0 if spec.unit.kind == "copy" else 1e-6)

    class Block(nn.Module):   # a ConvNeXt block: depthwise conv, channels-last MLP, residual
        def __init__(self, c: int = 32):
            super().__init__()
            self.dw, self.norm = nn.Conv2d(c, c, 7, padding=3, groups=c), nn.LayerNorm(c)
            self.fc1, self.fc2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

        def forward(self, x):
            y = self.dw(x).permute(0, 2, 3, 1)
            y = self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(y))))
            return x + y.permute(0, 3, 1, 2)

    v = build_vtog(capture(Block().eval(), (torch.randn(2, 32, 16, 16),)))
    oracle = Flat("H200")
    none, greedy, ilp = (get_solver(s)(v, oracle, budget=30) for s in ("none", "greedy", "ilp"))
    assert len(greedy.strategy.edges) > 0, "greedy takes no zero-gain move here: the test guards nothing"
    assert ilp.objective == greedy.objective == none.objective
    assert len(ilp.strategy.edges) == 0

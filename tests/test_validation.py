"""Incremental validation (cost_models.validation.Validity) gives Strategy.validate's verdicts."""
from __future__ import annotations

import os
import random
import sys
import warnings

import pytest

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from cost_models.accounting import Accounting  # noqa: E402
from cost_models.state import _sensitive_storages  # noqa: E402
from cost_models.validation import Validity  # noqa: E402
from vtcsearch.core.strategy import Strategy, StrategyError  # noqa: E402
from vtcsearch.core.vtog import build_vtog  # noqa: E402

warnings.filterwarnings("ignore")


def _workload(name: str):
    if name == "synthetic":
        from experiments.synthetic import random_vtog
        return random_vtog(n_motifs=12, seed=3, batch=2, seq=32, dims=(64, 128))
    from experiments.workloads import build_workload
    from vtcsearch.core.capture import capture
    kw = {"llama_decode": dict(name="llama3", part="layer", phase="decode"),
          "shufflenet": dict(name="shufflenet")}[name]
    w = build_workload(kw.pop("name"), size="tiny", **kw)
    return build_vtog(capture(w.model, w.example_inputs))


def _verdict(v, edges) -> str | None:
    try:
        Strategy(v, edges).validate()      # the core, no memos
    except StrategyError as e:
        return e.rule
    return None


@pytest.mark.parametrize("name", ["llama_decode", "shufflenet", "synthetic"])
def test_validity_equals_core(name):
    """A random walk over strategies near the baseline (1-3 options changed, some far jumps): every verdict
    equals the core's whole validation, and the walk sees valid and invalid strategies, hazards included.
    Half the changes are near the storages where hazards are possible (in-place edges, mutated buffers)."""
    v = _workload(name)
    acc = Accounting(v)
    val = Validity(acc)
    rng = random.Random(0)
    tensors = sorted(acc.options_of)
    sens = _sensitive_storages(acc)
    near = [t for t in tensors if t in sens or any(d in sens or v.graph.tensors[d].storage_name in sens
                                                   for o in acc.options_of[t] for d in acc.option_targets[o])]
    choice: dict[str, int] = {}
    seen: dict[str | None, int] = {}
    for step in range(200):
        cand = dict(choice) if step % 10 else {}
        for _ in range(rng.randint(1, 3) if step % 10 else rng.randint(1, max(1, len(tensors) // 2))):
            t = rng.choice(near if near and rng.random() < 0.5 else tensors)
            if t in cand and rng.random() < 0.4:
                del cand[t]
            else:
                cand[t] = rng.choice(acc.options_of[t])
        edges = [e.id for o in cand.values() for e in acc.option_edges[o]]
        want = _verdict(v, edges)
        got = val.check(edges)
        assert got == want, (step, sorted(cand.items()), got, want)
        seen[want] = seen.get(want, 0) + 1
        if want is None:
            choice = cand
            assert val.edges == frozenset(edges)
    assert seen.get(None, 0) > 5 and sum(n for r, n in seen.items() if r is not None) > 5, seen
    if name == "synthetic":
        assert seen.get("hazard", 0) > 5, seen     # its in-place motifs make hazards reachable


def test_validity_checks_only_touched_storages():
    """One option changed far from everything else: the hazard rule runs on a few storages, not all."""
    v = _workload("synthetic")
    acc = Accounting(v)
    val = Validity(acc)
    t = sorted(acc.options_of)[0]
    o = acc.options_of[t][0]
    val.check([e.id for e in acc.option_edges[o]])
    n_storages = len({i.storage_name for i in v.graph.tensors.values()})
    assert 0 < val.storages_checked <= 8 < n_storages

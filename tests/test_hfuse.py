"""Horizontal GEMM fusion (issue 16): GEMMs that read the same A with constant weights become one GEMM.

Taken wherever the data allows (same A through the same views, constant B of the same K, dtype and layout,
biases on all or none), refused with a one-line reason otherwise; the rewritten graph equals eager (transformers
style and reference style Llama decode layers), has fewer GEMM launches, lets the FFN norm fold into the
gate/up GEMM as a prologue, and is priced by the analytical model.
"""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

pytest.importorskip("triton")

from vtcsearch.core.capture import capture  # noqa: E402
from vtcsearch.core.fusion import RMSNORM, fuse, merge_prologues  # noqa: E402
from calls import compiled_output, eager_output  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore::RuntimeWarning"), pytest.mark.filterwarnings("ignore::UserWarning")]
warnings.filterwarnings("ignore")


def _hf(dtype=torch.float32, batch=1, device="cpu", size="tiny"):
    from experiments.workloads import build_workload
    torch.manual_seed(0)
    return build_workload("zoo", model="hf_llama_decode", size=size, device=device, dtype=dtype, batch=batch)


def _llama(dtype=torch.float32, batch=1, device="cpu", size="tiny"):
    from experiments.workloads import build_workload
    torch.manual_seed(0)
    return build_workload("llama3", size=size, part="layer", phase="decode", device=device, dtype=dtype, batch=batch)


def _gemms(g) -> list[str]:
    return [o.name for o in g.ops.values() if o.category == "matmul" and o.target_name in ("mm.default",
                                                                                             "addmm.default")]


class SharedA(nn.Module):
    """Three GEMMs of one activation ``x`` [.., 32], in a form the pass must take or refuse."""

    def __init__(self, form: str = "linear"):
        super().__init__()
        self.form = form
        bias = form == "bias"
        # "bias": q and k have biases (an addmm each), v has none (an mm)
        self.q, self.k, self.v = nn.Linear(32, 24, bias=bias), nn.Linear(32, 16, bias=bias), nn.Linear(32, 16, False)
        self.plain = nn.Parameter(torch.randn(32, 16) / 6, requires_grad=False)     # [K, N]: read as is
        self.register_buffer("state", torch.randn(16, 32) / 6)

    def forward(self, x, b=None):
        if self.form in ("linear", "bias"):
            return self.q(x), self.k(x), self.v(x)
        if self.form == "layout":          # the third weight is stored [K, N]: not the others' transposed map
            return self.q(x), self.k(x), x @ self.plain
        if self.form == "input":           # B is a user input
            return self.q(x), x @ b
        if self.form == "sliced":          # B is part of a weight, not a weight
            return self.q(x), self.k(x), x @ self.plain[:, :8]
        if self.form == "written":         # B is a buffer the program updates
            y = self.q(x), x @ self.state.t()
            self.state.add_(1.0)
            return y
        raise ValueError(self.form)


# ---------------------------------------------------------------------------
# taken / refused
# ---------------------------------------------------------------------------

def test_taken_on_the_transformers_llama_decode_layer():
    """q/k/v_proj become one GEMM, gate/up_proj another; o_proj and down_proj stay; nothing is refused."""
    w = _hf()
    before = capture(w.model, w.example_inputs)
    g = capture(w.model, w.example_inputs, hfuse=True)
    assert before.hfuse is None
    assert sorted(len(m) for m in g.hfuse.fused.values()) == [2, 3] and not g.hfuse.refused
    assert len(_gemms(g)) == len(_gemms(before)) - 3
    # the concatenated weights are constants of the program, the separate ones left it
    kinds = {t: i.kind for t, i in g.tensors.items()}
    assert kinds["hfuse_w0"] == kinds["hfuse_w1"] == "constant"
    assert g.tensors["hfuse_w0"].shape == (128, 64) and g.tensors["hfuse_w1"].shape == (256, 64)
    assert not any("q_proj" in t or "gate_proj" in t for t in g.tensors)
    # the original outputs are the pieces of a split of the fused product: a movement op, a VTOG opportunity
    splits = [o for o in g.movement_ops() if o.inputs and o.inputs[0] in g.hfuse.fused]
    assert sorted(len(o.outputs) for o in splits) == [2, 3] and {o.movement_op.onnx for o in splits} == {"Split"}


def test_taken_on_the_reference_llama_decode_layer():
    """The reference model already has one wqkv: only the FFN's w1/w3 merge."""
    g = capture(_llama().model, _llama().example_inputs, hfuse=True)
    assert list(g.hfuse.fused.values()) == [["mm_2", "mm_3"]] and not g.hfuse.refused


def test_the_ffn_norm_folds_into_the_gate_up_gemm_after_the_rewrite():
    """Without the rewrite the FFN norm has two GEMM consumers and stays apart; with it, both norms of the
    transformers layer are prologues of the fused GEMMs."""
    w = _hf()
    g = capture(w.model, w.example_inputs)
    refused = merge_prologues(g, fuse(g))
    assert len(refused) == 2 and all("consumers" in why for why in refused.values())
    g = capture(w.model, w.example_inputs, hfuse=True)
    groups = fuse(g)
    assert merge_prologues(g, groups) == {}
    fused = {gr.name for gr in groups.values() if "prologue" in gr.info}
    assert fused == set(g.hfuse.fused) and not any(gr.kind == RMSNORM for gr in groups.values())


def test_biases_concatenate():
    """Two ``addmm`` with biases merge (bias concatenated); the ``mm`` beside them stays, with its reason."""
    g = capture(SharedA("bias").eval(), (torch.randn(4, 32),), hfuse=True)
    (new, members), = g.hfuse.fused.items()
    assert len(members) == 2 and g.ops[new].target_name == "addmm.default"
    assert g.tensors["hfuse_b0"].shape == (40,)
    assert g.tensors["hfuse_w0"].shape == (40, 32) and g.tensors["hfuse_w0"].kind == "constant"
    (mm, why), = g.hfuse.refused.items()
    assert "a bias in one only" in why


@pytest.mark.parametrize("form,reason,fused", [
    ("layout", "transposed map", 2),
    ("sliced", "not a constant weight or its transpose", 2),
    ("input", "non-constant B", 0),
    ("written", "non-constant B", 0),
])
def test_refused_with_a_reason(form, reason, fused):
    m = SharedA(form).eval()
    args = (torch.randn(4, 32),) + ((torch.randn(32, 8),) if form == "input" else ())
    g = capture(m, args, hfuse=True)
    assert sum(len(v) for v in g.hfuse.fused.values()) == fused
    assert any(reason in why for why in g.hfuse.refused.values()), g.hfuse.refused
    if not fused:   # the constant GEMM has no partner left: it says so
        assert any("no other GEMM" in why for why in g.hfuse.refused.values()), g.hfuse.refused
    for why in g.hfuse.refused.values():
        assert "\n" not in why


# ---------------------------------------------------------------------------
# realized numerics
# ---------------------------------------------------------------------------

def _run(w, **options):
    return compiled_output(w, budget=10, implementations=("triton",), **options)


def _gemm_launches(c) -> int:
    return sum(st.kernels for st in c.executable.steps if st.lowering == "gemm")


@pytest.mark.parametrize("style,solver", [("transformers", "none"), ("transformers", "ilp"), ("reference", "ilp")])
def test_llama_decode_layer_with_hfuse_equals_eager(style, solver):
    """fp32: the rewritten layer (with prologues, so both norms fold) equals eager and the unfused executable
    within 1e-5, with fewer GEMM launches."""
    w = _hf(batch=2) if style == "transformers" else _llama(batch=2)
    ref = eager_output(w)
    fused, c = _run(w, solver=solver, hfuse=True, prologues=True)
    unfused, c0 = _run(w, solver=solver)
    assert c.graph.hfuse.fused
    assert _gemm_launches(c) == _gemm_launches(c0) - (3 if style == "transformers" else 1)
    torch.testing.assert_close(fused, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fused, unfused, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(4, 32), (2, 3, 32)])
def test_small_module_with_biases_equals_eager(shape):
    import vtcsearch
    torch.manual_seed(0)
    m, x = SharedA("bias").eval(), torch.randn(*shape)
    c = vtcsearch.compile(m, (x,), solver="ilp", budget=10, hfuse=True, implementations=("triton",))
    assert c.graph.hfuse.fused
    for got, want in zip(c(x), m(x)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


class BatchedWeights(nn.Module):
    """Two ``bmm`` of one activation with constant [b, K, N] weights: the batched form merges along N too."""

    def __init__(self):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(3, 16, 8) / 4, requires_grad=False)
        self.w2 = nn.Parameter(torch.randn(3, 16, 12) / 4, requires_grad=False)

    def forward(self, x):
        return torch.bmm(x, self.w1) * 2, torch.bmm(x, self.w2)


def test_batched_weights_merge_and_equal_eager():
    import vtcsearch
    torch.manual_seed(0)
    m, x = BatchedWeights().eval(), torch.randn(3, 4, 16)
    c = vtcsearch.compile(m, (x,), solver="ilp", budget=10, hfuse=True, implementations=("triton",))
    assert list(c.graph.hfuse.fused.values()) == [["bmm", "bmm_1"]]
    assert c.graph.tensors["hfuse_w0"].shape == (3, 16, 20)
    for got, want in zip(c(x), m(x)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------
# pricing and the options
# ---------------------------------------------------------------------------

def test_analytical_prices_the_fused_gemm():
    """At Llama 3 8B sizes the oracle has one kernel row for the fused GEMM, with N the sum of its members',
    priced below the members' rows together (one weight stream, one launch)."""
    from cost_models import AnalyticalOracle
    from vtcsearch.core.strategy import Strategy
    from vtcsearch.core.vtog import build_vtog
    w = _hf(torch.bfloat16, device="meta", size="full")
    rows = {}
    graphs = {}
    for hf in (False, True):
        g = capture(w.model, w.example_inputs, hfuse=hf)
        ev = AnalyticalOracle("H200").evaluate(Strategy(build_vtog(g), set()))
        rows[hf] = {r["unit"].split(":")[-1]: r for r in ev.rows if r["kind"] == "kernel"}
        graphs[hf] = g
    g = graphs[True]
    assert g.tensors[next(iter(g.hfuse.fused))].shape[-1] == 4096 + 2 * 1024
    for new, members in g.hfuse.fused.items():
        assert new in rows[True] and not any(m in rows[True] for m in members)
        assert rows[True][new]["seconds"] < sum(rows[False][m]["seconds"] for m in members)


def test_auto_keeps_the_graph_the_oracle_prices_lower():
    from cost_models import AnalyticalOracle
    from solvers import get_solver
    from vtcsearch.api import search_fusions
    w = _hf(torch.bfloat16, device="meta", size="full")
    search, oracle = get_solver("ilp"), AnalyticalOracle("H200")
    res = {h: search_fusions(w.model, w.example_inputs, search, oracle, hfuse=h, budget=10)
           for h in (False, True, "auto")}
    objs = {h: r[2].objective for h, r in res.items()}
    assert objs["auto"] == min(objs[False], objs[True])
    assert bool(res["auto"][0].hfuse and res["auto"][0].hfuse.fused) == (objs[True] < objs[False])
    with pytest.raises(ValueError, match="hfuse must be"):
        search_fusions(w.model, w.example_inputs, search, oracle, hfuse="yes")


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 16])
def test_llama_8b_decode_layer_hfuse_numerics_gpu(batch):
    """Fused vs unfused vs eager for the transformers Llama 3 8B decode layer, bf16, on the GPU."""
    w = _hf(torch.bfloat16, batch=batch, device="cuda", size="full")
    ref = eager_output(w)
    fused, c = _run(w, solver="ilp", hfuse=True)
    unfused, _ = _run(w, solver="ilp")
    assert c.graph.hfuse.fused
    torch.testing.assert_close(fused, ref, rtol=2e-2, atol=3e-2)
    torch.testing.assert_close(fused, unfused, rtol=2e-2, atol=3e-2)


def test_config_key_reaches_the_runner(tmp_path):
    """``hfuse: true`` merges w1/w3 of the reference layer in the runner's graph (one kernel fewer) and its CPU
    numerics copy still equals eager; a non-boolean is refused."""
    from vtcsearch.config import ConfigError, config_from_dict
    from vtcsearch.run import Log, run_config
    base = {"workload": {"name": "llama3", "size": "tiny", "params": {"part": "layer", "phase": "decode"}},
            "batch_sizes": [2], "dtype": "float32", "solvers": ["ilp"], "oracle": "analytical",
            "hardware": "H200", "objective": "latency", "baselines": [], "output": str(tmp_path),
            "budgets": {"ilp": 5}, "numerics": {"enabled": True, "size": "tiny", "batch": 2}, "draw": "none"}
    assert config_from_dict(base).hfuse is False
    with pytest.raises(ConfigError):
        config_from_dict({**base, "hfuse": "yes please"})
    kernels = {}
    for hf in (False, True):
        cfg = config_from_dict({**base, "hfuse": hf})
        s = run_config(cfg, device="cpu", out=tmp_path / str(hf), log=Log(quiet=True))
        kernels[hf] = s["cases"][0]["graph"]["kernels"]
        assert s["numerics"] and all(n["ok"] and not n["fallbacks"] for n in s["numerics"]), s["numerics"]
    assert kernels[True] == kernels[False] - 1

"""Prologue fusion (issue 16): a row norm computed inside the decode GEMM that reads it.

The fusion is taken when the maps allow it (the norm output read once, through reshapes, as a GEMM's
A [M <= 16, K = C]), refused with a reason otherwise, priced by the analytical model, and the realized
executable equals eager (fp32: equals the unfused executable to ~1e-6).
"""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

pytest.importorskip("triton")

from vtcsearch.core.capture import capture  # noqa: E402
from vtcsearch.core.fusion import MATMUL, RMSNORM, fuse, fuse_graph, merge_prologues  # noqa: E402
from calls import compiled_output, eager_output  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore::RuntimeWarning"), pytest.mark.filterwarnings("ignore::UserWarning")]
warnings.filterwarnings("ignore")


def _llama(dtype=torch.float32, batch=1, phase="decode", device="cpu", size="tiny"):
    from experiments.workloads import build_workload
    torch.manual_seed(0)
    return build_workload("llama3", size=size, part="layer", phase=phase, device=device, dtype=dtype, batch=batch)


def _kinds(g) -> dict[str, int]:
    out: dict[str, int] = {}
    for gr in g.groups.values():
        out[gr.kind] = out.get(gr.kind, 0) + 1
    return out


def _norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w


class NormGemm(nn.Module):
    """``rmsnorm(x) @ W^T`` in one of the forms the fusion must take or refuse."""

    def __init__(self, C: int = 32, N: int = 24, form: str = "a"):
        super().__init__()
        self.w = nn.Parameter(torch.randn(C) * 0.5 + 1, requires_grad=False)
        self.W = nn.Parameter(torch.randn(N, C) / C ** 0.5, requires_grad=False)
        self.form = form

    def forward(self, x):
        y = _norm(x, self.w)
        if self.form == "a":               # the normalised rows along K: fused
            return y @ self.W.t()
        if self.form == "transposed":      # y^T: K runs over the rows, not the normalised dim
            return y.t() @ self.W[: x.shape[0]]
        if self.form == "b":               # the norm output as B
            return self.W[:, : x.shape[0]] @ y
        if self.form == "output":          # the norm output is also returned
            return y, y @ self.W.t()
        raise ValueError(self.form)


def _groups(model: nn.Module, x: torch.Tensor):
    g = capture(model, (x,))
    groups = fuse(g)
    return g, groups, merge_prologues(g, groups)


# ---------------------------------------------------------------------------
# taken / refused
# ---------------------------------------------------------------------------

def test_off_by_default_and_taken_on_the_llama_decode_layer():
    """Default fusion keeps both norms apart; with prologues the attention norm (read only by the QKV GEMM)
    joins that GEMM (one group fewer), the FFN norm (read by the gate and up GEMMs) stays apart."""
    w = _llama()
    g = capture(w.model, w.example_inputs)
    before = _kinds(g)
    assert before[RMSNORM] == 2 and not any("prologue" in gr.info for gr in g.groups.values())
    fuse_graph(g, prologues=True)
    after = _kinds(g)
    assert len(g.groups) == sum(before.values()) - 1
    assert after[RMSNORM] == 1 and after[MATMUL] == before[MATMUL]
    fused = [gr for gr in g.groups.values() if "prologue" in gr.info]
    assert len(fused) == 1 and fused[0].info["prologue"]["kind"] == RMSNORM
    assert fused[0].info["prologue"]["x"] == "h"                 # the layer input: the norm output never exists
    # every op of a group belongs to it, the schedule still covers every op once
    owned = [o for gr in g.groups.values() for o in gr.ops]
    assert len(owned) == len(set(owned))


def test_refused_when_the_norm_output_has_other_consumers():
    w = _llama()
    g = capture(w.model, w.example_inputs)
    refused = merge_prologues(g, fuse(g))
    assert list(refused) == ["mul_11"] and "2 consumers" in refused["mul_11"]


def test_refused_when_m_is_large():
    w = _llama(phase="prefill")                                    # 32 rows
    g = capture(w.model, w.example_inputs)
    refused = merge_prologues(g, fuse(g))
    assert any("M = 32 > 16" in why for why in refused.values()), refused


@pytest.mark.parametrize("form,reason", [("transposed", "not a row-preserving reshape"),
                                         ("b", "A operand"), ("output", "graph output")])
def test_refused_when_the_maps_do_not_allow_it(form, reason):
    torch.manual_seed(0)
    _, groups, refused = _groups(NormGemm(form=form).eval(), torch.randn(4, 32))
    assert len(refused) == 1 and reason in next(iter(refused.values())), refused
    assert not any("prologue" in gr.info for gr in groups.values())


class LN(nn.Module):
    """``Linear(LayerNorm(x))``: an ``addmm`` (A second) with a bias, or an ``mm``; 2-d or 3-d input."""

    def __init__(self, bias: bool = True):
        super().__init__()
        self.ln = nn.LayerNorm(32)
        self.fc = nn.Linear(32, 16, bias=bias)
        with torch.no_grad():
            self.ln.weight.normal_(1.0, 0.3)
            self.ln.bias.normal_(0.0, 0.3)

    def forward(self, x):
        return self.fc(self.ln(x))


@pytest.mark.parametrize("bias,shape", [(True, (4, 32)), (False, (2, 3, 32))])
def test_layernorm_prologue_taken_and_equals_eager(bias, shape):
    """The same mechanism for LayerNorm (two statistics passes, then (a - mean) * rstd * w + b per tile)."""
    import vtcsearch
    torch.manual_seed(0)
    m, x = LN(bias).eval(), torch.randn(*shape) * 2 + 1
    _, groups, refused = _groups(m, x)
    assert not refused and any(gr.info.get("prologue", {}).get("kind") == "layernorm" for gr in groups.values())
    c = vtcsearch.compile(m, (x,), solver="none", prologues=True, implementations=("triton",))
    assert not any(st.lowering in ("layernorm", "aten") for st in c.executable.steps)
    torch.testing.assert_close(c(x), m(x), rtol=1e-5, atol=1e-5)


def test_taken_on_a_small_module():
    torch.manual_seed(0)
    g, groups, refused = _groups(NormGemm().eval(), torch.randn(4, 32))
    assert not refused and [gr.kind for gr in groups.values()] == [MATMUL]


# ---------------------------------------------------------------------------
# the kernel
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm"])
@pytest.mark.parametrize("M,K,N,split", [(3, 64, 40, None), (5, 100, 24, None), (20, 96, 16, None),
                                         (4, 256, 32, 2)])
def test_gemm_row_norm_prologue_equals_torch(M, K, N, split, kind):
    """Ragged K, two row tiles, split-K (every split recomputes the whole rows' statistics)."""
    from vtcsearch.codegen.interpreter import ensure_interpreter
    ensure_interpreter()
    from vtcsearch.codegen.kernels import Operand, RowNorm, gemm
    torch.manual_seed(0)
    x, w, b, B = torch.randn(M, K) * 3 + 1, torch.randn(K), torch.randn(K), torch.randn(K, N)
    out = torch.empty(M, N)
    if kind == "rmsnorm":
        pro, ref = RowNorm(Operand.dense(w, "w"), 1e-5), _norm(x, w) @ B
    else:
        pro = RowNorm(Operand.dense(w, "w"), 1e-5, kind="layernorm", bias=Operand.dense(b, "nb"))
        ref = nn.functional.layer_norm(x, (K,), w, b, 1e-5) @ B
    gemm(Operand.dense(x, "x"), Operand.dense(B, "b"), Operand.dense(out, "o"), prologue=pro, split_k=split)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=2e-5)


# ---------------------------------------------------------------------------
# realized numerics
# ---------------------------------------------------------------------------

def _compiled(w, prologues: bool, solver: str = "none"):
    return compiled_output(w, solver=solver, budget=10 if solver == "ilp" else None, prologues=prologues,
                           implementations=("triton",))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_llama_decode_layer_with_prologue_equals_eager(dtype):
    """The fused group runs the GEMM template with the prologue (no ATen fallback, no RMSNorm launch for the
    attention norm) and equals eager; in fp32 it equals the unfused executable to ~1e-6.  bf16 runs the ILP's
    strategy (virtual tensors around the fused group)."""
    w = _llama(dtype, batch=2)
    ref = eager_output(w)
    fused, c = _compiled(w, True, "none" if dtype == torch.float32 else "ilp")
    lowered = {st.name: st.lowering for st in c.executable.steps}
    pro = next(gr.name for gr in c.graph.groups.values() if "prologue" in gr.info)
    assert lowered[pro] == "gemm"
    assert list(lowered.values()).count("rmsnorm") == 1
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(fused, ref, **tol)
    if dtype == torch.float32:
        unfused, _ = _compiled(w, False)
        torch.testing.assert_close(fused, unfused, rtol=1e-6, atol=1e-6)


def test_small_module_with_prologue_equals_eager():
    import vtcsearch
    torch.manual_seed(0)
    m, x = NormGemm().eval(), torch.randn(4, 32) * 2
    c = vtcsearch.compile(m, (x,), solver="none", prologues=True, implementations=("triton",))
    assert [st.lowering for st in c.executable.steps if st.name in c.graph.groups] == ["gemm"]
    torch.testing.assert_close(c(x), m(x), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------
# pricing
# ---------------------------------------------------------------------------

def test_analytical_prices_the_fused_group():
    """The fused GEMM costs more than the bare GEMM (the statistics pass re-reads the A rows), and the
    norm's kernel is gone from the breakdown."""
    from cost_models import AnalyticalOracle
    from vtcsearch.core.strategy import Strategy
    from vtcsearch.core.vtog import build_vtog
    w = _llama(batch=1, device="meta", size="full")
    rows = {}
    for pro in (False, True):
        g = capture(w.model, w.example_inputs)
        if pro:
            fuse_graph(g, prologues=True)
        v = build_vtog(g)
        ev = AnalyticalOracle("H200").evaluate(Strategy(v, set()))
        rows[pro] = {r["unit"]: r for r in ev.rows if r["kind"] == "kernel"}
    name = "mm"
    assert not any("mul_1" == u.split(":")[-1] for u in rows[True])
    fused = next(r for u, r in rows[True].items() if u.endswith(name))
    bare = next(r for u, r in rows[False].items() if u.endswith(name))
    assert fused["prologue_l2_bytes"] > 0 and bare["prologue_l2_bytes"] == 0
    assert fused["seconds"] > bare["seconds"]


# ---------------------------------------------------------------------------
# GPU: Llama 3 8B decode sizes (run by someone with an H200)
# ---------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 16])
def test_llama3_8b_decode_layer_prologue_numerics_gpu(batch):
    """Fused vs unfused vs eager at Llama 3 8B decode sizes, bf16, on the GPU."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    w = _llama(torch.bfloat16, batch=batch, device="cuda", size="full")
    ref = eager_output(w)
    fused, c = _compiled(w, True, "ilp")
    assert any("prologue" in gr.info for gr in c.graph.groups.values())
    unfused, _ = _compiled(w, False, "ilp")
    torch.testing.assert_close(fused, ref, rtol=2e-2, atol=3e-2)
    torch.testing.assert_close(fused, unfused, rtol=2e-2, atol=3e-2)


# ---------------------------------------------------------------------------
# the runner's config key
# ---------------------------------------------------------------------------

def test_config_key_prologues_reaches_the_runner(tmp_path):
    """``prologues: true`` in a config fuses the norm in the runner's graph (one kernel fewer) and its CPU
    numerics copy still equals eager."""
    from vtcsearch.config import ConfigError, config_from_dict
    from vtcsearch.run import Log, run_config
    base = {"workload": {"name": "llama3", "size": "tiny", "params": {"part": "layer", "phase": "decode"}},
            "batch_sizes": [2], "dtype": "float32", "solvers": ["none"], "oracle": "analytical",
            "hardware": "H200", "objective": "latency", "baselines": [], "output": str(tmp_path),
            "numerics": {"enabled": True, "size": "tiny", "batch": 2}, "draw": "none"}
    with pytest.raises(ConfigError):
        config_from_dict({**base, "prologues": "yes please"})
    kernels = {}
    for pro in (False, True):
        cfg = config_from_dict({**base, "prologues": pro})
        assert cfg.prologues is pro
        s = run_config(cfg, device="cpu", out=tmp_path / str(pro), log=Log(quiet=True))
        case = s["cases"][0]
        kernels[pro] = case["graph"]["kernels"]
        assert s["numerics"] and all(n["ok"] and not n["fallbacks"] for n in s["numerics"]), s["numerics"]
    assert kernels[True] == kernels[False] - 1


def test_auto_keeps_the_fusion_the_oracle_prices_lower():
    """``prologues="auto"`` searches both fusions and keeps the cheaper; bad values are refused."""
    from cost_models import AnalyticalOracle
    from solvers import get_solver
    from vtcsearch.api import search_fusions
    for batch in (1, 16):
        w = _llama(batch=batch, device="meta", size="full")
        search, oracle = get_solver("ilp"), AnalyticalOracle("H200")
        res = {p: search_fusions(w.model, w.example_inputs, search, oracle, prologues=p, budget=10)
               for p in (False, True, "auto")}
        objs = {p: r[2].objective for p, r in res.items()}
        assert objs["auto"] == min(objs[False], objs[True])
        fused = any("prologue" in gr.info for gr in res["auto"][0].groups.values())
        assert fused == (objs[True] < objs[False])
    with pytest.raises(ValueError, match="prologues must be"):
        search_fusions(w.model, w.example_inputs, search, oracle, prologues="yes")


def test_layernorm_prologue_is_priced_as_two_passes():
    """LayerNorm's prologue reads the A rows twice (mean, then centred variance); RMSNorm's once."""
    from cost_models.analytical import geometry, prologue_cost
    torch.manual_seed(0)
    per_pass = {}
    for name, m in (("layernorm", LN(False).eval()), ("rmsnorm", NormGemm().eval())):
        g = capture(m, (torch.randn(4, 32),))
        fuse_graph(g, prologues=True)
        k = next(n for n, gr in g.groups.items() if "prologue" in gr.info)
        geo = geometry(g, k)
        nbytes, steps = prologue_cost(g, k, geo)
        per_pass[name] = steps / geo.k_steps()
        assert nbytes >= per_pass[name] * 4 * 32 * 4
    assert per_pass == {"layernorm": 2, "rmsnorm": 1}

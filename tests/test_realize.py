"""Realization: strategies become Triton kernels (in the interpreter here) whose outputs equal eager PyTorch.

Every realized run is compared with the eager model (outputs and mutated KV caches);
runs of different strategies of one graph use the same kernels, so they must agree
bit for bit: only data movement changed.  Storages start poisoned with NaN, so an
element no kernel wrote shows up.
"""
from __future__ import annotations

import random
import warnings

import pytest
import torch
from torch import nn

from chains import random_valid_strategy

from cost_models import get_oracle
from experiments.workloads import build_workload
from solvers import get_solver
from vtcsearch.core.capture import capture
from vtcsearch.codegen.realize import realize
from vtcsearch.core.strategy import Strategy
from vtcsearch.core.vtog import build_vtog

pytest.importorskip("triton")
pytestmark = [pytest.mark.filterwarnings("ignore::RuntimeWarning"), pytest.mark.filterwarnings("ignore::UserWarning")]

# compiled on a GPU, Triton's interpreter on the CPU (tests/conftest.py sets TRITON_INTERPRET there)
from conftest import DEVICE as DEV  # noqa: E402


@pytest.fixture(autouse=True)
def _one_config(monkeypatch):
    # strategies of one graph must run the same kernels: no per-signature autotuning here
    monkeypatch.setenv("VTC_AUTOTUNE", "0")


def eager(model: nn.Module, inputs) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """Outputs and final buffers of one eager call; the buffers are restored afterwards."""
    saved = {n: b.clone() for n, b in model.named_buffers()}
    with torch.no_grad():
        out = model(*inputs)
    outs = [o.clone() for o in (out if isinstance(out, (tuple, list)) else [out])]
    after = {n: b.clone() for n, b in model.named_buffers()}
    for n, b in model.named_buffers():
        b.copy_(saved[n])
    return outs, after


def run(graph, strategy, model, inputs):
    saved = {n: b.clone() for n, b in model.named_buffers()}
    exe = realize(graph, strategy, model)
    outs = [o.clone() for o in exe(*inputs)]
    after = {n: b.clone() for n, b in model.named_buffers()}
    for n, b in model.named_buffers():
        b.copy_(saved[n])
    return exe, outs, after


def close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> bool:
    tol = 2e-2 if dtype in (torch.bfloat16, torch.float16) else 1e-4
    return bool(torch.allclose(a.float(), b.float(), rtol=tol, atol=tol))


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def llama(request):
    torch.manual_seed(0)
    w = build_workload("llama3", size="tiny", part="attention", device=DEV, dtype=request.param)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = capture(w.model, w.example_inputs)
    return w, g, build_vtog(g)


def test_llama_block_strategies_equal_eager_and_each_other(llama):
    w, g, v = llama
    ref, ref_bufs = eager(w.model, w.example_inputs)
    oracle = get_oracle("analytical", hardware="H200")
    strategies = {"none": Strategy(v, []), "all": get_solver("all")(v, oracle).strategy,
                  "ilp": get_solver("ilp")(v, oracle).strategy}
    results = {}
    for name, s in strategies.items():
        exe, outs, bufs = run(g, s, w.model, w.example_inputs)
        assert not torch.isnan(outs[0]).any(), name
        assert close(outs[0], ref[0], w.dtype), name
        for n in ref_bufs:
            assert close(bufs[n], ref_bufs[n], w.dtype), (name, n)
        results[name] = (exe, outs, bufs)
    # same kernels, other data movement: the same bits
    for name in ("all", "ilp"):
        assert torch.equal(results[name][1][0], results["none"][1][0]), name
        for n in ref_bufs:
            assert torch.equal(results[name][2][n], results["none"][2][n]), (name, n)
    summ = results["ilp"][0].summary()
    assert not summ["fallbacks"] and summ["copy_kernels"] < results["all"][0].summary()["copy_kernels"]
    assert results["none"][0].summary()["copy_kernels"] > 20
    # build time is kept per lowering: every kind of step that was built, copies included
    none = results["none"][0].summary()
    assert set(none["build_seconds"]) == set(none["by_lowering"]) | {"copy"}, none["build_seconds"]
    assert all(t >= 0 for t in none["build_seconds"].values())
    if w.dtype == torch.bfloat16:
        # Llama's own dtype: the optimum removes every data movement kernel and leaves the QKV GEMM,
        # one RoPE kernel for Q and one for K (casts and interleaving fused), attention, the O GEMM
        assert summ["copy_kernels"] == 0
        assert [st.lowering for st in results["ilp"][0].steps] == ["gemm", "pointwise", "pointwise", "attention",
                                                                    "gemm"]


def test_random_valid_strategies_realize_bit_identically(llama):
    w, g, v = llama
    if w.dtype != torch.float32:
        pytest.skip("one dtype is enough")
    _, base, base_bufs = run(g, Strategy(v, []), w.model, w.example_inputs)
    rng = random.Random(7)
    found = 0
    for _ in range(4):
        s = random_valid_strategy(v, rng)
        if len(s.virtual) < 5:
            continue
        _, outs, bufs = run(g, s, w.model, w.example_inputs)
        assert torch.equal(outs[0], base[0]), sorted(s.edges)
        for n in base_bufs:
            assert torch.equal(bufs[n], base_bufs[n]), n
        found += 1
    assert found >= 2


class Views(nn.Module):
    """Pointwise ops with views, a stack, a cat, a pad and a select between them: one elementwise kernel."""

    def forward(self, x, y):
        a = torch.sigmoid(x).view(2, 3, 4, 2)
        b = torch.stack([a[..., 0] * 2.0, a[..., 1] - y.view(2, 3, 4)], dim=-1)
        c = torch.cat([b.reshape(2, 3, 8), torch.relu(x.view(2, 3, 8))], dim=1)
        d = torch.nn.functional.pad(c.exp(), (1, 2), value=0.5)
        return d.transpose(1, 2) + 1.0


class Epilogue(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 24)
        self.lin2 = nn.Linear(24, 24, bias=False)

    def forward(self, x, r):
        h = torch.nn.functional.gelu(self.lin(x))
        return self.lin2(h) * 0.5 + r


class Unknown(nn.Module):
    def forward(self, x):
        y = x.transpose(0, 1)
        return torch.cumsum(y, dim=0).transpose(0, 1) * 2.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_elementwise_regions_through_views(dtype):
    torch.manual_seed(1)
    m = Views().eval()
    x, y = torch.randn(2, 3, 8, dtype=dtype, device=DEV), torch.randn(2, 3, 4, dtype=dtype, device=DEV)
    g = capture(m, (x, y))
    assert [gr.kind for gr in g.groups.values()] == ["elementwise"]
    v = build_vtog(g)
    ref, _ = eager(m, (x, y))
    for s in (Strategy(v, []), get_solver("ilp")(v, get_oracle("analytical")).strategy):
        exe, outs, _ = run(g, s, m, (x, y))
        assert exe.summary()["by_lowering"].get("pointwise") == 1 and not exe.summary()["fallbacks"]
        torch.testing.assert_close(outs[0], ref[0], rtol=2e-2 if dtype != torch.float32 else 1e-5, atol=1e-5)


def test_gemm_epilogue_fuses_activation_scale_and_residual():
    torch.manual_seed(2)
    m = Epilogue().eval().to(DEV)
    x, r = torch.randn(5, 16, device=DEV), torch.randn(5, 24, device=DEV)
    g = capture(m, (x, r))
    kinds = [gr.kind for gr in g.groups.values()]
    assert kinds == ["matmul", "matmul"], kinds
    assert all(len(gr.ops) > 1 for gr in g.groups.values())   # gelu, and scale + residual, are epilogues
    v = build_vtog(g)
    ref, _ = eager(m, (x, r))
    exe, outs, _ = run(g, get_solver("ilp")(v, get_oracle("analytical")).strategy, m, (x, r))
    assert exe.summary()["by_lowering"] == {"gemm": 2}
    tol = 1e-4 if DEV == "cpu" else 2e-3       # tf32 in cuBLAS
    torch.testing.assert_close(outs[0], ref[0], rtol=tol, atol=tol)


def test_unsupported_ops_fall_back_to_aten_through_maps():
    m = Unknown().eval()
    x = torch.randn(6, 5, device=DEV)
    g = capture(m, (x,))
    v = build_vtog(g)
    ref, _ = eager(m, (x,))
    for s in (Strategy(v, []), get_solver("ilp")(v, get_oracle("analytical")).strategy):
        exe, outs, _ = run(g, s, m, (x,))
        assert exe.summary()["fallbacks"]        # cumsum has no template: run as ATen, said so
        torch.testing.assert_close(outs[0], ref[0])


def test_llama_layer_with_rmsnorm_and_ffn():
    torch.manual_seed(3)
    w = build_workload("llama3", size="tiny", part="layer", device=DEV, dtype=torch.bfloat16)
    g = capture(w.model, w.example_inputs)
    kinds = [gr.kind for gr in g.groups.values()]
    assert kinds.count("rmsnorm") == 2 and kinds.count("attention") == 1
    v = build_vtog(g)
    ref, ref_bufs = eager(w.model, w.example_inputs)
    exe, outs, bufs = run(g, get_solver("ilp")(v, get_oracle("analytical")).strategy, w.model, w.example_inputs)
    assert not exe.summary()["fallbacks"], exe.summary()["fallbacks"]
    assert close(outs[0], ref[0], torch.bfloat16)
    for n in ref_bufs:
        assert close(bufs[n], ref_bufs[n], torch.bfloat16)


def test_realize_refuses_an_invalid_strategy(llama):
    w, g, v = llama
    from vtcsearch.core.strategy import StrategyError
    cand = next(o for o in v.options if len(v.options_of(o.tensor)) > 1)
    other = next(o for o in v.options_of(cand.tensor) if o.id != cand.id)
    with pytest.raises(StrategyError):
        realize(g, Strategy.from_options(v, [cand.id, other.id]), w.model)


# ---------------------------------------------------------------------------
# on the GPU: the real Llama 3 8B decode sizes (bf16, 4096-token context)
# ---------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 16])
@pytest.mark.parametrize("part", ["attention", "layer"])
def test_gpu_llama_decode_all_virtual_equals_eager(part, batch):
    torch.manual_seed(0)
    w = build_workload("llama3", part=part, batch=batch, device="cuda", dtype=torch.bfloat16)
    g = capture(w.model, w.example_inputs)
    v = build_vtog(g)
    ref, ref_bufs = eager(w.model, w.example_inputs)
    s = get_solver("ilp")(v, get_oracle("analytical", hardware="H200")).strategy
    exe, outs, bufs = run(g, s, w.model, w.example_inputs)
    assert exe.summary()["copy_kernels"] == 0 and not exe.summary()["fallbacks"]
    rel = float((outs[0].double() - ref[0].double()).norm() / ref[0].double().norm())
    assert rel < 1e-2, rel
    for n in ref_bufs:   # the new K/V rows (cuBLAS and the Triton GEMM sum in different orders)
        assert close(bufs[n], ref_bufs[n], torch.bfloat16), n
    # the CUDA graph of the executable replays to the same answer
    call = exe.cuda_graph()
    torch.testing.assert_close(call(*w.example_inputs)[0], outs[0], rtol=0, atol=0)


class Gather(nn.Module):
    def forward(self, x, idx):
        return torch.relu(torch.index_select(x * 2.0, 0, idx)).transpose(0, 1) + 1.0


def test_indirect_maps_read_index_tensors():
    """index_select's output may be virtual over its input through an indirect map (runtime indices)."""
    torch.manual_seed(4)
    m = Gather().eval()
    x, idx = torch.randn(10, 8, device=DEV), torch.tensor([3, 0, 9, 3, 5], device=DEV)
    g = capture(m, (x, idx))
    v = build_vtog(g)
    ref, _ = eager(m, (x, idx))
    s = get_solver("ilp")(v, get_oracle("analytical")).strategy
    assert any(e.map.has_lookup() for es in s.chosen.values() for e in es)   # the gather is virtual
    for strat in (Strategy(v, []), s):
        _, outs, _ = run(g, strat, m, (x, idx))
        torch.testing.assert_close(outs[0], ref[0])

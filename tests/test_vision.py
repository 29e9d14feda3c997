"""The paper's vision patterns realized end to end (CPU, Triton interpreter, tiny shapes).

Each block is captured, its VTOG solved twice — ``none`` (every tensor physical)
and ``ilp`` (the optimum under the analytical H200 model) — and realized; the
outputs must equal eager PyTorch (fp32 1e-4, fp16 2e-2), the two strategies must
agree bit for bit (same kernels, only data movement changed), no conv /
BatchNorm / activation / cat / split may fall back to ATen, and the ILP strategy
must leave no residual copy of the data movement the paper removes.  Storages
start poisoned with NaN, so an element no kernel wrote shows up.
"""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from cost_models import get_oracle
from experiments.workloads import build_workload
from experiments.workloads.vision_block import BLOCKS, block_input
from experiments.workloads import build_workload
from solvers import get_solver
from vtcsearch.core.capture import capture
from vtcsearch.core.graph import TensorGraph
from vtcsearch.codegen.realize import Executable, realize
from vtcsearch.core.strategy import Strategy
from vtcsearch.core.vtog import VTOG, build_vtog

pytest.importorskip("triton")
pytestmark = [pytest.mark.filterwarnings("ignore::RuntimeWarning"), pytest.mark.filterwarnings("ignore::UserWarning")]

BN = torch.ops.aten._native_batch_norm_legit_no_training.default
ORACLE = get_oracle("analytical", hardware="H200")


def tol(dtype: torch.dtype) -> float:
    return 2e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-4


class Realized:
    """A block captured, solved (none and ILP) and realized, with eager's answer beside it."""

    def __init__(self, model: nn.Module, inputs: tuple[torch.Tensor, ...]):
        self.model, self.inputs = model.eval(), inputs
        with torch.no_grad():
            out = model(*inputs)
        self.ref = [o.clone() for o in (out if isinstance(out, (tuple, list)) else [out])]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.g: TensorGraph = capture(model, inputs)
        self.v: VTOG = build_vtog(self.g)
        self.strategies = {"none": Strategy(self.v, []), "ilp": get_solver("ilp")(self.v, ORACLE).strategy}
        self.exes: dict[str, Executable] = {}
        self.outs: dict[str, list[torch.Tensor]] = {}
        for name, s in self.strategies.items():
            self.run(name, s)

    def run(self, name: str, s: Strategy) -> list[torch.Tensor]:
        exe = realize(self.g, s, self.model)
        self.exes[name] = exe
        self.outs[name] = [o.clone() for o in exe(*self.inputs)]
        return self.outs[name]

    @property
    def ilp(self) -> Strategy:
        return self.strategies["ilp"]

    def movement(self, onnx: str) -> list[str]:
        """The movement ops (between kernels) of one ONNX kind."""
        return [o.name for o in self.g.movement_ops() if o.movement_op.onnx == onnx]

    def check(self) -> None:
        """Eager's outputs, none == ilp bit for bit, no fallbacks, and the ILP removes copies."""
        dt = self.ref[0].dtype
        for name, outs in self.outs.items():
            for o, r in zip(outs, self.ref):
                assert not torch.isnan(o).any(), name
                torch.testing.assert_close(o, r, rtol=tol(dt), atol=tol(dt), msg=lambda m: f"{name}: {m}")
            assert not self.exes[name].summary()["fallbacks"], (name, self.exes[name].summary()["fallbacks"])
        for a, b in zip(self.outs["none"], self.outs["ilp"]):
            assert torch.equal(a, b)
        assert self.exes["none"].summary()["copy_kernels"] > self.exes["ilp"].summary()["copy_kernels"]


def fused_conv_kinds(g: TensorGraph) -> list[tuple[str, bool]]:
    """(kind, BatchNorm fused) per kernel group, in run order."""
    return [(g.groups[s].kind, any(g.ops[o].target is BN for o in g.groups[s].ops)) for s in g.steps if s in g.groups]


# ---------------------------------------------------------------------------
# YOLO11: C3k2 (conv -> chunk -> Bottleneck -> cat -> conv), SPPF
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def yolo():
    """Tiny YOLO11n in fp32 (the fp16 path is covered by ShuffleNet, EfficientViT and the dry run)."""
    torch.manual_seed(0)
    return build_workload("yolo11", size="tiny", device="cpu", dtype=torch.float32)


def test_yolo11_c3k2_split_and_concat_are_virtual(yolo):
    """YOLO11n's first C3k2 (layer 2 of the tiny model, real input): Conv+BN+SiLU kernels, no copy left.

    The ILP's optimum (Concat output virtual over its inputs) and the paper's points-to
    graph (split input and outputs and the Concat inputs virtual over the physical Concat
    output) tie under the analytical model: they differ only in piece predicates, whose
    integer ops hide under memory time.  Both are checked: the ILP's realized, the paper's
    valid, copy-free, as cheap, and realized to the same bits.
    """
    c3k2 = yolo.model.model[2]
    r = Realized(c3k2, block_input(yolo.model, c3k2, yolo.example_inputs))
    kinds = fused_conv_kinds(r.g)
    assert kinds == [("conv", True)] * 4, kinds          # BatchNorm and SiLU in every conv's epilogue
    r.check()
    (split,), (cat,) = r.movement("Split"), r.movement("Concat")
    assert not r.ilp.residuals_of(split) and not r.ilp.residuals_of(cat)
    assert r.exes["ilp"].summary()["copy_kernels"] == 0 and r.exes["ilp"].summary()["by_lowering"] == {"conv": 4}

    into = lambda op: [o.id for o in r.v.options if o.op == op  # noqa: E731
                       and all(r.v.edges[e].kind == "input_over_output" for e in o.edges)]
    paper = Strategy.from_options(r.v, into(split) + into(cat)).validate()
    pattern = set(r.g.ops[split].inputs + r.g.ops[split].outputs + r.g.ops[cat].inputs)
    assert pattern <= paper.virtual and cat not in paper.virtual
    assert not paper.residuals
    assert ORACLE.evaluate(paper).latency_s <= ORACLE.evaluate(r.ilp).latency_s * (1 + 1e-9)
    for a, b in zip(r.run("paper", paper), r.outs["none"]):
        assert torch.equal(a, b)


def test_yolo11_sppf_pools_read_and_write_concat_slabs(yolo):
    """SPPF: three chained max-pools whose inputs and outputs are channel slabs of the Concat storage."""
    sppf = yolo.model.model[9]
    r = Realized(sppf, block_input(yolo.model, sppf, yolo.example_inputs))
    r.check()
    assert not r.ilp.residuals
    assert r.exes["ilp"].summary()["by_lowering"] == {"conv": 2, "max_pool2d_with_indices": 3}


# ---------------------------------------------------------------------------
# ShuffleNetV2: channel split, branches, concat, channel shuffle
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def shufflenet():
    torch.manual_seed(2)
    return build_workload("shufflenet", size="tiny", device="cpu", dtype=torch.float16, resolution=128)


def last_conv_input(r: Realized) -> str:
    """The input tensor of the last kernel (the conv after the unit)."""
    last = r.g.groups[[s for s in r.g.steps if s in r.g.groups][-1]]
    assert last.kind == "conv"
    return r.g.ops[last.ops[0]].inputs[0]


def _shuffle_absorbed(r: Realized, consumer_input: str) -> None:
    """Every Concat and shuffle op eliminated; the next conv reads through the shuffle's map."""
    for onnx in ("Concat", "Reshape", "Transpose", "Identity"):
        for op in r.movement(onnx):
            assert not r.ilp.residuals_of(op), op
    m = r.ilp.resolve(consumer_input)
    assert r.ilp.is_virtual(consumer_input) and not m.is_identity_layout()


def test_shufflenet_stride2_unit_shuffle_absorbed_into_next_conv(shufflenet):
    """Stage 4's stride-2 unit and the conv after the stage: both branches write into the Concat, the conv
    reads it through the reshape-transpose-reshape map: no copy at all."""
    w = shufflenet
    m = nn.Sequential(w.model.stage4[0], w.model.conv5)
    r = Realized(m, block_input(w.model, w.model.stage4[0], w.example_inputs))
    assert all(k == ("conv", True) for k in fused_conv_kinds(r.g))
    r.check()
    assert not r.ilp.residuals
    _shuffle_absorbed(r, last_conv_input(r))


def test_shufflenet_stride1_unit_split_and_shuffle_absorbed(shufflenet):
    """Stage 4's stride-1 unit between a producer conv and the next conv: the producer writes the
    pass-through half straight into the Concat, the next conv reads through the shuffle: no copy."""
    torch.manual_seed(3)
    w = shufflenet
    unit = w.model.stage4[1]
    c = unit.branch2[0].in_channels * 2
    producer = nn.Sequential(nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU()).half().eval()
    m = nn.Sequential(producer, unit, w.model.conv5)
    r = Realized(m, block_input(w.model, unit, w.example_inputs))
    r.check()
    assert not r.ilp.residuals
    (split,) = r.movement("Split")
    assert not r.ilp.residuals_of(split)
    _shuffle_absorbed(r, last_conv_input(r))


def test_shufflenet_stage_then_conv_has_no_copy(shufflenet):
    """The real subgraph stage 4 (stride 2, stride 1) -> conv5: the stride-1 unit's pass-through half of a
    shuffled tensor needs conditional pieces (pairs whose conditions contradict cover nothing)."""
    w = shufflenet
    m = nn.Sequential(w.model.stage4, w.model.conv5)
    x = block_input(w.model, w.model.stage4, w.example_inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = capture(m, x)
    s = get_solver("ilp")(build_vtog(g), ORACLE).strategy
    assert [r.op for r in s.residuals] == []


# ---------------------------------------------------------------------------
# EfficientViT: LiteMLA (multi-scale concat, QKV reshape/transpose/slices, ReLU linear attention)
# ---------------------------------------------------------------------------

def test_efficientvit_litemla_qkv_and_multiscale_concat_absorbed():
    """EfficientViT's LiteMLA (tiny model, stage 3, fp16 with the attention in fp32 as upstream).

    Kernels: the QKV 1x1 conv, the depthwise 5x5 and grouped 1x1 aggregation convs, the projection
    conv with BatchNorm; the fp16->fp32 cast, ReLU(q) and ReLU(k) and the final divide-and-cast as
    pointwise kernels; k^T v and q (k^T v) as GEMMs.  No ATen fallback: every op has a template
    (the pad of v with a column of ones is a constant piece of v's map).  Every data movement op —
    the multi-scale Concat, the QKV reshape / transpose / slices, the broadcasts of the batched
    matmuls, the output transpose / reshape — is eliminated.
    """
    torch.manual_seed(4)
    blk = build_workload("vision_block", block="litemla", size="tiny", device="cpu", dtype=torch.float16)
    r = Realized(blk.model, blk.example_inputs)
    r.check()
    assert r.g.movement_ops() and not r.ilp.residuals
    assert sorted(r.ilp.eliminated_ops()) == sorted(o.name for o in r.g.movement_ops())
    assert r.exes["ilp"].summary()["by_lowering"] == {"conv": 4, "pointwise": 4, "gemm": 2}


# ---------------------------------------------------------------------------
# BatchNorm as an elementwise op, pooling and upsampling lowerings
# ---------------------------------------------------------------------------

class NormPool(nn.Module):
    """BatchNorm (affine and not) outside a conv epilogue, pools, and an upsample read through by a conv."""

    def __init__(self):
        super().__init__()
        self.bn, self.bn_plain = nn.BatchNorm2d(8), nn.BatchNorm2d(8, affine=False)
        self.conv = nn.Conv2d(16, 8, 1)
        with torch.no_grad():
            for bn in (self.bn, self.bn_plain):
                bn.running_mean.normal_(0, 0.5)
                bn.running_var.uniform_(0.5, 2.0)
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.normal_(0, 0.2)

    def forward(self, x, y):
        a = torch.relu(self.bn(x)) + self.bn_plain(x)
        up = nn.functional.interpolate(y, scale_factor=2, mode="nearest")
        b = self.conv(torch.cat([up, a], 1))
        return (b, nn.functional.avg_pool2d(a, 3, 2, 1, count_include_pad=False),
                nn.functional.adaptive_avg_pool2d(x, 1), nn.functional.adaptive_avg_pool2d(x, 2),
                nn.functional.max_pool2d(x, 3, 2, 1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_batchnorm_pools_and_upsample_lower_to_templates(dtype):
    torch.manual_seed(5)
    m = NormPool().to(dtype)
    r = Realized(m, (torch.randn(2, 8, 8, 8, dtype=dtype), torch.randn(2, 8, 4, 4, dtype=dtype)))
    r.check()
    (up,) = [o for o in r.g.movement_ops() if o.movement_op.name == "upsample_nearest2d"]
    assert not r.ilp.residuals_of(up.name)                   # the conv reads x[n, c, h // 2, w // 2]
    lowerings = r.exes["ilp"].summary()["by_lowering"]
    lowerings.pop("copy", None)          # whether a residual copy pays is the cost model's call, not lowering's
    assert lowerings == {"pointwise": 1, "conv": 1, "avg_pool2d": 1, "global_avg_pool2d": 1,
                         "_adaptive_avg_pool2d": 1, "max_pool2d_with_indices": 1}, lowerings


# ---------------------------------------------------------------------------
# on the GPU: every benchmark block at its real shape (fp16, batch 1)
# ---------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("name", BLOCKS)
def test_gpu_vision_blocks_equal_eager(name, monkeypatch):
    """The real shapes: none and ILP equal eager (fp16) and each other, no fallback, and the CUDA graph
    of the ILP executable replays to the same bits."""
    # none and ILP must run the same kernels to agree bit for bit: one tile config each, not a
    # per-signature autotune (which may pick different ones for different operand maps)
    monkeypatch.setenv("VTC_AUTOTUNE", "0")
    torch.manual_seed(0)
    blk = build_workload("vision_block", block=name, size="full", device="cuda", dtype=torch.float16)
    r = Realized(blk.model, blk.example_inputs)
    r.check()
    call = r.exes["ilp"].cuda_graph()
    for a, b in zip(call(*blk.example_inputs), r.outs["ilp"]):
        assert torch.equal(a, b)

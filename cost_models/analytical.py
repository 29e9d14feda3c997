"""Analytical oracle: a roofline per kernel from a hardware profile.

For one unit in one configuration::

    t_mem     = dram_bytes / bandwidth + l2_bytes / l2_bandwidth
    t_compute = flops / peak(dtype, tensor cores?) + index_ops / int_ops
    t         = max(t_mem, t_compute) + launch + graph gap

Bytes come from the resolved maps of the unit's operands
(:class:`~cost_models.accounting.TrafficModel`):

* **distinct elements go to DRAM**: a virtual input read through an Expand map
  moves the bytes of the physical elements it touches once; the repeated reads
  of the same element (GQA: four query heads reading one KV head) are charged
  at L2 bandwidth, not free and not at DRAM cost.  This is the paper's "4x
  fewer global reads" for attention over an un-expanded KV cache;
* **short runs cost more**: each contiguous run is rounded up to whole DRAM
  sectors, and a run shorter than the coalescing width pays
  ``1 + short_run_penalty * (1 - run / coalesce)`` on top;
* **index arithmetic** of non-affine maps (div/mod from reshapes, lookups of
  index tensors, piece predicates of Concat-like maps) is charged on the
  integer pipes per element.

Residual copies are one copy kernel each: read bytes plus write bytes, no FLOPs.

Every kernel costs ``Hardware.kernel_s`` beyond its body: the launch a kernel timed alone shows (``launch_s``)
and the gap between dependent kernels of one CUDA-graph replay (``graph_gap_s``, fitted to whole graphs by
``python -m experiments.oracle_accuracy --fit-gap``), so a strategy of fewer kernels is worth what it is in a
whole model, not only what the kernels timed one by one show.

Beyond the roofline (issue 12 item 2, fitted on the H200 by ``python -m
experiments.calibrate --from-db``), all constants in :mod:`cost_models.hardware`:

* **parallelism**: a GEMM/conv kernel runs one program per output tile
  (:func:`geometry`); a grid of ``P`` programs moves at most
  ``P * program_bandwidth`` bytes/s and reaches ``min(1, P / sm_count)`` of the
  FLOP peak (LiteMLA's K=8192 bmm has 16-32 programs on 132 SMs);
* **serial K loop**: ``ceil(K / BK)`` steps of ``k_step_s`` each, in series;
* **kinds**: grouped and depthwise convs have their own efficiencies per
  implementation (cuDNN's NCHW grouped 1x1 conv is 14x slower than the Triton
  template on the H200);
* **orientation**: an access coalesced only in the swapped 2-D orientation pays
  ``swap_read_penalty`` / ``swap_write_penalty`` (transposed stores are the
  worst), a multi-piece map gets no swapped orientation (``tile2d_pieces``);
* **L2 residency**: the first ``resident_bytes`` of a kernel's DRAM traffic
  were just written by its producer and come from L2 at ``resident_bandwidth``;
* **library gathers**: one copy launch per piece of the operand's map, at the
  ``library/gather`` efficiency;
* **split-K** (``split_k=True``, the default): a Triton GEMM is priced at the better of
  the tiled kernel and each split-K configuration that
  :func:`vtcsearch.codegen.split_k.split_configs` offers its autotuner (``SPLIT``
  times the programs, a ``SPLIT`` times shorter K loop, the fp32 partials written and
  read back, one more launch for the reduce).  ``split_k=False`` prices the tiled
  kernel only: the model that calibration data measured before split-K was fitted to.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from vtcsearch.codegen.heads import head_group
from vtcsearch.codegen.split_k import split_configs
from vtcsearch.core.expr import Var
from vtcsearch.core.fusion import Group
from vtcsearch.core.graph import TensorGraph
from vtcsearch.core.implementation import INDUCTOR, dense_operands, library_op, library_operands, needs_copy, \
    operand_kind, strided_view_strides

from .accounting import Traffic, TrafficModel, UnitSpec, attention_density, op_flops
from .base import CostOracle, Objective, UnitCost
from .hardware import EFFICIENCY, Hardware


@dataclass(frozen=True)
class Geometry:
    """The GEMM view of a tensor-core kernel: ``batch`` independent ``m x n`` outputs over a ``k`` loop."""

    kind: str           # efficiency-table kind: matmul, attention, conv, conv_grouped, conv_depthwise
    m: int = 0
    n: int = 0
    k: int = 0
    batch: int = 1

    def programs(self, impl: str) -> int:
        """Output tiles, one program each (the Triton templates' smallest tiles for the shape class, which
        their autotuner picks when the grid is small; the same nominal tiles for the library)."""
        if not self.m:
            return 1 << 30
        bm = 16 if self.m <= 16 else 32 if self.m <= 64 else 64
        bn = 16 if self.m <= 16 else 64
        bn = min(bn, max(16, 1 << max(0, (self.n - 1).bit_length())))
        return self.batch * -(-self.m // bm) * -(-self.n // bn)

    def k_steps(self) -> int:
        """Steps of the K loop (BK 256 for the M <= 16 class, 64 else, as the templates' first configs)."""
        if not self.k:
            return 0
        return -(-self.k // (256 if self.m <= 16 else 64))


def geometry(graph: Any, kernel: str) -> Geometry:
    """The GEMM geometry of a kernel group's product op (matmul / conv); other kinds get no tiles."""
    group = graph.groups[kernel]
    kind = group.kind
    op = next((graph.ops[o] for o in group.ops if graph.ops[o].category in ("matmul", "conv")), None)
    if op is None or kind not in ("matmul", "conv"):
        return Geometry(kind)
    shp = [graph.tensors[t].shape for t in op.inputs]
    if op.category == "matmul":
        if op.target_name.startswith("addmm") or op.target_name.startswith("baddbmm"):
            shp = shp[1:]
        a, b = shp[0], shp[1]
        if len(a) < 2 or len(b) < 2:
            return Geometry(kind)
        batch = max(math.prod(a[:-2]) if len(a) > 2 else 1, math.prod(b[:-2]) if len(b) > 2 else 1)
        return Geometry("matmul", a[-2], b[-1], a[-1], batch)
    x, w = shp[0], shp[1]
    out = graph.tensors[op.outputs[0]].shape
    if len(w) < 3 or len(x) < 3:
        return Geometry("conv")
    groups = max(1, x[1] // max(1, w[1]))
    ck = "conv" if groups == 1 else "conv_depthwise" if w[1] == 1 else "conv_grouped"
    return Geometry(ck, out[0] * math.prod(out[2:]), w[0] // groups, math.prod(w[1:]), groups)


def prologue_cost(graph: Any, kernel: str, geo: Geometry) -> tuple[float, int]:
    """(L2 bytes per program, extra K steps) of a fused row-norm prologue
    (:func:`vtcsearch.core.fusion.merge_prologues`): each program reads its A rows over the whole K once more
    for the statistics, plus the norm weight; (0, 0) for a group without one."""
    group = graph.groups.get(kernel) if graph is not None else None
    pro = group.info.get("prologue") if group is not None else None
    if pro is None or not geo.m:
        return 0.0, 0
    x = graph.tensors[pro["x"]]
    w = sum(graph.tensors[pro[k]].itemsize for k in ("weight", "bias") if pro.get(k))
    bm = 16 if geo.m <= 16 else 32 if geo.m <= 64 else 64
    passes = 2 if pro["kind"] == "layernorm" else 1       # LayerNorm: the mean, then the centred variance
    return float(passes * min(bm, geo.m) * geo.k * x.itemsize + geo.k * w), passes * geo.k_steps()


class AnalyticalOracle(CostOracle):
    """Roofline latency from a :class:`~cost_models.hardware.Hardware` profile (no GPU needed)."""

    name = "analytical"

    def __init__(self, hardware: Hardware | str = "H200", objective: Objective | None = None,
                 implementations: Sequence[str] | None = None, split_k: bool = True):
        super().__init__(objective, implementations)
        self.split_k = split_k
        self.hw = Hardware.preset(hardware) if isinstance(hardware, str) else hardware
        hw = self.hw
        self.traffic = TrafficModel(hw.sector_bytes, hw.coalesce_bytes, hw.short_run_penalty,
                                    tile2d_pieces=hw.tile2d_pieces)
        self._geo: dict[tuple[int, str], tuple[Any, Geometry]] = {}
        self._groups: dict[tuple, int] = {}     # map signature -> query heads reading each element together

    def geometry(self, spec: UnitSpec) -> Geometry:
        """The kernel's :class:`Geometry` (memoized per graph and kernel)."""
        g = spec.graph
        if g is None or spec.unit.kernel not in getattr(g, "groups", {}):
            return Geometry(_kind(spec))
        key = (id(g), spec.unit.kernel)
        hit = self._geo.get(key)
        if hit is None or hit[0] is not g:
            hit = self._geo[key] = (g, geometry(g, spec.unit.kernel))
        return hit[1]

    def _t_dram(self, dram: float) -> float:
        """Seconds for ``dram`` bytes of DRAM traffic: the L2-resident part first, the rest at bandwidth."""
        hw = self.hw
        if hw.resident_bytes > 0 and hw.resident_bandwidth > 0:
            hot = min(dram, hw.resident_bytes)
            return hot / hw.resident_bandwidth + (dram - hot) / hw.bandwidth
        return dram / hw.bandwidth

    def _body(self, geo: Geometry, impl: str, dram: float, l2: float, flops: float, peak_eff: float,
              t_extra: float = 0.0, programs: int | None = None, k_steps: int | None = None
              ) -> tuple[float, float, float, float]:
        """(t_mem, t_compute, t_serial, body) of a kernel with this geometry: roofline terms limited by the
        grid's programs, and the serial K loop (``programs`` / ``k_steps``: a split-K grid's, not the
        tiled kernel's)."""
        hw = self.hw
        t_mem = self._t_dram(dram) + l2 / hw.l2_bandwidth
        t_flops = flops / peak_eff if flops and peak_eff > 0 else 0.0
        t_serial = 0.0
        if geo.m:
            p = programs or geo.programs(impl)
            pbw = hw.program_bandwidth * (hw.eff("library", "program") if impl == "library" else 1.0)
            t_mem = max(t_mem, (dram + l2) / (p * pbw))
            t_flops /= min(1.0, p / hw.sm_count)
            t_serial = (geo.k_steps() if k_steps is None else k_steps) * hw.k_step_s
        t_comp = t_flops + t_extra
        return t_mem, t_comp, t_serial, max(t_mem, t_comp, t_serial)

    def measure(self, spec: UnitSpec) -> UnitCost:
        if spec.impl == "library":
            return self._library(spec)
        if spec.impl == INDUCTOR:
            return self._inductor(spec)
        strides = {s: v[1] for s, v in spec.storages.items()}
        read, write = Traffic(), Traffic()
        attention = spec.kind == "kernel" and _kind(spec) == "attention"
        for o in spec.operands:
            if o.role == "r":
                tr = self.traffic.access(o.map, o.itemsize, strides)
                if attention:
                    tr = self._grouped_heads(tr, o.map, o.itemsize, strides)
                read += tr
            else:
                write += self.traffic.access(o.map, o.itemsize, strides, write=True)
        hw = self.hw
        dram = read.dram_bytes + write.dram_bytes
        if read.swapped_dram + write.swapped_dram and dram - read.swapped_dram - write.swapped_dram > 0:
            # operands that want opposite 2-D orientations: the swapped ones are not free (a transpose)
            dram += read.swapped_dram * (hw.swap_read_penalty - 1) + write.swapped_dram * (hw.swap_write_penalty - 1)
        l2 = read.l2_bytes + write.l2_bytes
        t_idx = (read.index_ops + write.index_ops) / hw.int_ops
        geo = Geometry("copy") if spec.kind != "kernel" else self.geometry(spec)
        peak = hw.peak(spec.compute_dtype, spec.tensor_core) if spec.flops else 0.0
        through_maps = pieces = False
        if spec.tensor_core and spec.flops:   # Triton templates against the library's peak, worse through maps
            peak *= hw.eff("triton", geo.kind if geo.kind != "copy" else _kind(spec))
            through_maps = any(strided_view_strides(o.map, strides) is None for o in spec.operands)
            if through_maps:
                peak *= hw.eff("triton", "maps")
            pieces = any(len(o.map.pieces) > 1 for o in spec.operands if o.role == "r")
        pro_l2, pro_steps = prologue_cost(spec.graph, spec.unit.kernel, geo) if geo.kind == "matmul" else (0.0, 0)
        t_mem, t_comp, t_serial, body = self._body(geo, "triton", dram, l2 + pro_l2 * geo.programs("triton"),
                                                   spec.flops, peak, t_idx,
                                                   k_steps=geo.k_steps() + pro_steps if pro_steps else None)
        split = 1
        if self.split_k and geo.kind == "matmul" and geo.m:
            for cfg, t in self._split_k(geo, dram, l2, spec.flops, peak, t_idx, pro_l2, pro_steps):
                if t < body:
                    split, body = cfg["SPLIT"], t
        if pieces:   # piece predicates inside the K loop: the whole kernel slows, not just its FLOPs
            body /= hw.eff("triton", "pieces")
        seconds = body + hw.kernel_s
        detail: dict[str, Any] = {"t_mem": t_mem, "t_compute": t_comp, "t_serial": t_serial, "dram_bytes": dram,
                                  "l2_bytes": l2, "through_maps": through_maps, "pieces": pieces, "split_k": split,
                                  "prologue_l2_bytes": pro_l2 * geo.programs("triton") if pro_l2 else 0.0,
                                  "min_run_bytes": min([x for x in (read.min_run_bytes, write.min_run_bytes) if x],
                                                       default=0)}
        return UnitCost(seconds, bytes=read.bytes + write.bytes, flops=spec.flops, detail=detail)

    def _grouped_heads(self, tr: Traffic, m: Any, itemsize: int, strides: dict[str, Any]) -> Traffic:
        """An attention operand that ``g`` query heads read element for element (a KV cache through its GQA
        broadcast) is loaded once per group of ``g`` heads: the template stacks their rows into one tile
        (:mod:`vtcsearch.codegen.kernels.attention`), so the ``g - 1`` repeats are no L2 traffic."""
        key = self.traffic.signature(m, itemsize, strides)
        g = self._groups.get(key)
        if g is None:
            g = self._groups[key] = affine_head_group(m, lambda t: strides[t])
        if g > 1:
            tr.l2_bytes = max(0.0, tr.l2_bytes - (tr.elements - tr.elements / g) * itemsize)
        return tr

    def _split_k(self, geo: Geometry, dram: float, l2: float, flops: float, peak: float, t_extra: float,
                 pro_l2: float = 0.0, pro_steps: int = 0) -> list[tuple[dict, float]]:
        """(config, seconds without the launch) of each split-K configuration the GEMM autotuner would time:
        the partial kernel over ``SPLIT`` times the tiles with a ``SPLIT`` times shorter K loop, writing
        the fp32 partials, then the reduce reading them back, with its own launch (``pro_l2`` / ``pro_steps``:
        a fused prologue's bytes per program and K steps, :func:`prologue_cost`: every split recomputes
        the whole rows' statistics)."""
        hw = self.hw
        out = []
        for cfg in split_configs(geo.m, geo.n, geo.k, geo.batch, hw.sm_count):
            s, bm, bn, bk = cfg["SPLIT"], cfg["BM"], cfg["BN"], cfg["BK"]
            programs = geo.batch * -(-geo.m // bm) * -(-geo.n // bn) * s
            steps = -(-(-(-geo.k // s)) // bk)
            ws = 4.0 * s * geo.batch * geo.m * geo.n          # fp32 partials: written once, read once
            if pro_steps:
                steps += pro_steps // max(1, geo.k_steps()) * -(-geo.k // bk)
            body = self._body(geo, "triton", dram + ws, l2 + pro_l2 * programs, flops, peak, t_extra, programs,
                              steps)[3]
            out.append((cfg, body + self._t_dram(ws) + hw.kernel_s))
        return out

    def _library(self, spec: UnitSpec) -> UnitCost:
        """A library kernel on dense operands: residual copies (gather/scatter, one launch per piece of the
        operand's map) for operands whose maps it cannot read in place, the call at the library's
        efficiency and grid, then the epilogue as an elementwise kernel."""
        hw, g = self.hw, spec.graph
        group = g.groups[spec.unit.kernel]
        kind = group.kind
        geo = self.geometry(spec)
        ins, outs = library_operands(g, group)
        strides = {s: v[1] for s, v in spec.storages.items()}
        t_copy, copies, dense = self._residual_copies(spec, kind, ins, outs, group)
        prod = [g.ops[group.ops[0]]] if kind != "attention" else [g.ops[o] for o in group.ops]
        flops = sum(op_flops(g, op.name) for op in prod)
        if kind == "attention":     # SDPA with is_causal skips the masked tiles too
            flops *= attention_density(g, spec.unit.kernel)
        ekind = geo.kind if kind == "conv" else kind
        peak = hw.peak(spec.compute_dtype, True) * hw.eff("library", ekind)
        t_mem, t_comp, t_serial, body = self._body(geo, "library", dense, 0.0, flops, peak)
        t_call = body + hw.kernel_s
        t_ep, ep_bytes = 0.0, 0.0
        if kind != "attention" and len(group.ops) > 1:   # the epilogue: reads the product, writes the outputs
            ep = Traffic()
            for o in spec.operands:
                if o.tensor not in ins:
                    ep += self.traffic.access(o.map, o.itemsize, strides, write=o.role != "r")
            prod_bytes = sum(g.tensors[t].nbytes for t in outs)
            ep_bytes = ep.bytes + prod_bytes
            t_ep = self._t_dram(ep.dram_bytes + prod_bytes) + ep.l2_bytes / hw.l2_bandwidth + hw.kernel_s
        seconds = t_copy + t_call + t_ep
        return UnitCost(seconds, bytes=dense + ep_bytes, flops=spec.flops,
                        detail={"impl": "library", "t_copy": t_copy, "library_copies": copies,
                                "t_call": t_call, "t_epilogue": t_ep, "t_serial": t_serial})

    def _residual_copies(self, spec: UnitSpec, kind: str, ins: Sequence[str], outs: Sequence[str],
                         group: Group | None = None) -> tuple[float, int, int]:
        """(seconds, copies, dense bytes) of the operands a ``kind`` kernel reads and writes as plain strided
        tensors: a gather (input) or scatter (output) for each whose map it cannot take in place, one copy
        launch per piece of the map, at the ``library/gather`` efficiency (what realization runs)."""
        hw, g = self.hw, spec.graph
        strides = {s: v[1] for s, v in spec.storages.items()}
        by = {o.tensor: o for o in spec.operands}
        t_copy, copies, dense = 0.0, 0, 0
        for t in list(ins) + list(outs):
            nbytes = g.tensors[t].nbytes
            dense += nbytes
            o = by.get(t)
            if o is not None and needs_copy(operand_kind(group, t) if group is not None else kind, o.map, strides):
                tr = self.traffic.access(o.map, o.itemsize, strides, write=t in outs)
                t_copy += (self._t_dram(tr.dram_bytes + nbytes) + tr.l2_bytes / hw.l2_bandwidth) \
                    / hw.eff("library", "gather") + hw.kernel_s * max(1, len(o.map.pieces))
                copies += 1
        return t_copy, copies, dense

    def _inductor(self, spec: UnitSpec) -> UnitCost:
        """The group compiled by Inductor on strided operands: residual copies for operands that are not strided
        views, then the group's kernel at Inductor's efficiency for its kind.  A convolution is limited by the
        same grid and serial K loop as the templates (max-autotune picks among templates and the library, which
        share them); any other group is priced at its roofline.  That is right for decode GEMMs with M = 1
        (Inductor's reduction kernels ran at 1.12-1.28x their H100 floor, `results/llama/profile.csv`) but not
        where max-autotune's GEMM template has fewer tiles than SMs: the Llama QKV projection at batch 16 (M = 16,
        N = 6144) ran at 2.1x its floor there, which the profiling oracle sees and this model does not.

        A convolution's epilogue is a kernel of its own where it holds a batch norm
        (:func:`inductor_fuses_conv_epilogue`): Inductor's conv kernel (its Triton template, cuDNN) writes the
        product and a pointwise kernel applies the rest (YOLO11n ran 249 kernels for 162 groups, ShuffleNetV2 132
        for 59); its GEMM template fuses the epilogue (Llama decode: 355 kernels for 385)."""
        hw, g = self.hw, spec.graph
        group = g.groups[spec.unit.kernel]
        ins, outs = dense_operands(g, group, INDUCTOR)
        t_copy, copies, dense = self._residual_copies(spec, INDUCTOR, ins, outs)
        geo = self.geometry(spec)
        # Inductor runs the math chain's products whole: no masked tiles skipped
        full = spec.flops / attention_density(g, spec.unit.kernel) if spec.flops else 0.0
        peak = hw.peak(spec.compute_dtype, spec.tensor_core) * (self.inductor_eff(geo.kind) if spec.tensor_core
                                                                 else 1.0)
        t_ep = 0.0
        if group.kind == "conv":
            op = library_op(g, group)
            if len(group.ops) > 1 and op is not None and not inductor_fuses_conv_epilogue(g, group):
                prod = sum(g.tensors[t].nbytes for t in op.outputs)   # written by the conv, read by the epilogue
                t_ep = self._t_dram(2 * prod) + hw.kernel_s
            _, _, t_serial, body = self._body(geo, "triton", dense, 0.0, full, peak)
        else:
            t_serial, body = 0.0, max(self._t_dram(dense), full / peak if full else 0.0)
        t_call = body + hw.kernel_s
        if library_op(g, group) is not None and group.kind != "attention":
            # max-autotune times the library's kernel (cuBLAS, cuDNN) among its choices and keeps the faster,
            # so Inductor's GEMM or convolution never costs more than the library call and its epilogue kernel
            # on the same operands (EfficientViT's depthwise convs, priced above the library, went to cuDNN
            # outside Inductor's regions: they cut them, and ran 0.84x of torch.compile on an H100)
            lib = self._library(spec).detail
            if lib["t_call"] + lib["t_epilogue"] < t_call + t_ep:
                t_call, t_ep, t_serial = lib["t_call"], lib["t_epilogue"], lib["t_serial"]
        return UnitCost(t_copy + t_call + t_ep, bytes=dense, flops=spec.flops,
                        detail={"impl": INDUCTOR, "t_copy": t_copy, "library_copies": copies, "t_call": t_call,
                                "t_epilogue": t_ep, "t_serial": t_serial})

    def inductor_eff(self, kind: str) -> float:
        """Inductor's efficiency on a ``kind`` kernel: a calibrated ``inductor/<kind>`` entry, else the better
        of the library's and the Triton template's (max-autotune times both and keeps the faster)."""
        hw = self.hw
        if f"{INDUCTOR}/{kind}" in hw.efficiency or f"{INDUCTOR}/{kind}" in EFFICIENCY:
            return hw.eff(INDUCTOR, kind)
        return max(hw.eff("library", kind), hw.eff("triton", kind))

    def traffic_seconds(self, nbytes: float) -> float:
        return nbytes / self.hw.bandwidth

    def launch_seconds(self) -> float:
        return self.hw.kernel_s

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "hardware": self.hw.name, "source": self.hw.source, "split_k": self.split_k}


def inductor_fuses_conv_epilogue(g: TensorGraph, group: Group) -> bool:
    """Whether Inductor's convolution template runs the conv group's epilogue in the same kernel: yes unless the
    epilogue holds a batch norm.  What the H100 profiles of torch.compile max-autotune (2026-12-06/07) show:
    an activation on the product fuses (ConvNeXt-atto: 12 ``triton_tem_fused_convolution_gelu_..`` calls, 3.2 us
    each, for its 12 conv + GELU groups; EfficientViT-B1: 22 ``..convolution_hardswish`` template calls beside its
    18 conv groups whose epilogue has no batch norm), while a batch norm goes to a pointwise kernel of its own
    (``triton_poi_fused__native_batch_norm_legit_no_training_..``: YOLO11n and ShuffleNetV2, every one of whose
    conv epilogues has one).  Pricing every convolution as two kernels put ConvNeXt-atto's twelve conv + GELU
    groups on vtcsearch's template, cutting Inductor's region at each: 0.87x of torch.compile; pricing every
    one as fused moved YOLO11n's all-Inductor prediction from 0.87x to 0.64x of measured."""
    return not any("batch_norm" in g.ops[o].target_name for o in group.ops)


def affine_head_group(m: Any, strides: Callable[[str], Sequence[int]]) -> int:
    """:func:`~vtcsearch.codegen.heads.head_group` of ``m``, without simplifying anything where every piece's
    offset and predicates are affine (then they ignore the head's remainder in a group of ``g`` exactly when
    they ignore the head: its coefficient is zero), so a plain strided operand is answered at once instead of
    substituting and simplifying for every divisor of the head count (most of a decode attention's first query).
    Maps with div/mod or lookups: ``head_group`` itself."""
    dim = 1 if len(m.shape) == 4 else 0
    h = m.shape[dim] if len(m.shape) in (3, 4) else 1
    sizes = [g for g in range(min(h, 32), 1, -1) if h % g == 0]
    if not sizes:
        return 1
    try:
        exprs = []
        for p in m.pieces:
            exprs.extend(c for c, _, _ in p.conds)
            if p.target is not None:
                exprs.append(p.offset(strides(p.target)))
    except (KeyError, IndexError, ValueError):   # head_group says where, or never asks (unaligned pieces)
        return head_group(m, strides)
    if not all(e.is_affine() for e in exprs):
        return head_group(m, strides)
    head = Var(f"i{dim}")
    if any(e.coef(head) != 0 for e in exprs):
        return 1
    return next((g for g in sizes if all(not (p.region[dim][0] % g or p.region[dim][1] % g) for p in m.pieces)), 1)


def _kind(spec: UnitSpec) -> str:
    """The kernel group's kind (matmul, conv, attention...), for the efficiency table."""
    g = spec.graph
    if g is not None and spec.unit.kernel in getattr(g, "groups", {}):
        return g.groups[spec.unit.kernel].kind
    return next((o.category for o in spec.ops if o.category in ("matmul", "conv", "attention")), "matmul")

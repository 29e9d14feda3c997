"""Hardware profiles for the analytical oracle: datasheet numbers, overridable by measured ones.

Datasheet values are dense (no sparsity) peaks.  ``measured`` holds numbers
measured on the project's machines; ``Hardware.preset(name)`` uses them where
present (``measured=False`` for the datasheet only).  :func:`measure` times a
large copy and a large bf16 GEMM on the current device to produce them.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch


@dataclass(frozen=True)
class Hardware:
    name: str
    bandwidth: float                  # DRAM bytes/s (read + write traffic)
    l2_bandwidth: float               # bytes/s for re-reads that hit L2
    flops: dict[str, float]           # dtype -> FLOP/s on tensor cores (matmul, conv, attention)
    simt_flops: float                 # FLOP/s of the vector units (pointwise, reductions; fp32)
    int_ops: float                    # integer ops/s (index arithmetic)
    launch_s: float = 2.0e-6          # per-kernel launch and tail overhead, as a kernel timed alone shows it
    graph_gap_s: float = 0.0          # the extra time per kernel of a chain of dependent kernels in one CUDA-graph
    #                                   replay (a whole model), which a kernel timed alone does not show; fitted
    #                                   to committed whole-graph measurements: experiments.oracle_accuracy --fit-gap
    sector_bytes: int = 32            # DRAM transaction granularity
    coalesce_bytes: int = 128         # one warp's fully coalesced access
    short_run_penalty: float = 0.25   # extra cost of runs shorter than coalesce_bytes (at zero length)
    # --- terms beyond the roofline (issue 12 item 2, issue 13 item 5); the H200's are fitted by
    # `python -m experiments.calibrate --from-db` (cost_models/calibration/H200.json), the rest are estimates
    sm_count: int = 132               # streaming multiprocessors (datasheet): a grid of fewer programs idles SMs
    program_bandwidth: float = 2.0e10  # bytes/s ONE program (thread block) streams: a grid of P programs moves
    #                                   at most P * this (few output tiles, long K loop: LiteMLA's bmm)
    k_step_s: float = 2.0e-7          # latency of one K-loop step of a GEMM/conv program that the pipeline
    #                                   cannot hide (~ one DRAM round trip / num_stages): ceil(K/BK) steps in series
    resident_bytes: float = 0.0       # a kernel's first resident_bytes of DRAM traffic hit L2 (the producer just
    resident_bandwidth: float = 0.0   # wrote them) at resident_bandwidth; 0: off
    swap_read_penalty: float = 1.0    # DRAM-bytes factor of a read coalesced only in the swapped 2-D orientation
    swap_write_penalty: float = 1.0   # the same for a store (a transposed store)
    tile2d_pieces: bool = True        # whether a multi-piece map gets the swapped orientation at all
    source: str = "datasheet"
    measured: dict[str, Any] = field(default_factory=dict)
    efficiency: dict[str, float] = field(default_factory=dict)   # overrides of EFFICIENCY (calibrated)

    def peak(self, dtype: torch.dtype | None, tensor_core: bool) -> float:
        if not tensor_core:
            return self.simt_flops
        key = str(dtype).replace("torch.", "") if dtype is not None else "float32"
        return self.flops.get(key, self.flops.get("float32", self.simt_flops))

    @property
    def kernel_s(self) -> float:
        """What one kernel of a realized graph costs beyond its body: its launch and the gap to the next."""
        return self.launch_s + self.graph_gap_s

    def eff(self, impl: str, kind: str) -> float:
        """Fraction of :meth:`peak` that ``impl`` reaches on a ``kind`` kernel (``triton/maps``: the extra
        factor of a Triton tensor-core kernel reading an operand through a non-identity map)."""
        key = f"{impl}/{kind}"
        return self.efficiency.get(key, EFFICIENCY.get(key, 1.0))

    def with_(self, **kw: Any) -> "Hardware":
        """A copy with some numbers overridden (e.g. measured bandwidth)."""
        flops = kw.pop("flops", None)
        hw = replace(self, **kw)
        if flops:
            hw = replace(hw, flops={**self.flops, **flops})
        return hw

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: dict[str, Any] | str) -> "Hardware":
        if isinstance(d, str):
            with open(d) as f:
                d = json.load(f)
        return Hardware(**d)

    @staticmethod
    def preset(name: str, measured: bool = True, calibrated: bool = True) -> "Hardware":
        """A preset by name, with its measured numbers (``measured``) and its calibration file
        (``calibrated``: cost_models/calibration/<name>.json, written by experiments.calibrate)."""
        key = name.upper().replace("_", "-")
        if key not in PRESETS:
            raise ValueError(f"unknown hardware preset {name!r}; choices: {', '.join(PRESETS)}")
        hw = PRESETS[key]
        cal = os.path.join(os.path.dirname(__file__), "calibration", f"{key}.json")
        if not os.path.exists(cal) and key in CALIBRATION_OF:
            cal = os.path.join(os.path.dirname(__file__), "calibration", f"{CALIBRATION_OF[key]}.json")
        if measured and calibrated and os.path.exists(cal):   # constants fitted by python -m experiments.calibrate
            with open(cal) as f:
                data = json.load(f)
            fields = {k: v for k, v in data.get("hardware", {}).items() if k in CALIBRATED_FIELDS}
            hw = replace(hw, efficiency={**data.get("efficiency", {}), **hw.efficiency}, **fields)
        if measured and hw.measured:
            m = dict(hw.measured)
            hw = hw.with_(bandwidth=m.get("bandwidth", hw.bandwidth),
                          flops={k[len("flops_"):]: v for k, v in m.items() if k.startswith("flops_")},
                          source="datasheet+measured")
        return hw


# Compute efficiency per implementation and kernel kind, as a fraction of the (measured) tensor-core peak,
# which is itself cuBLAS's large GEMM.  One table for every preset; ``Hardware.efficiency`` overrides it
# with calibrated numbers (``python -m experiments.calibrate`` times each group as triton-dense,
# triton-through-maps and library on the GPU and writes them).  Until calibrated: rough H100/H200 values
# (Triton GEMMs ~85% of cuBLAS, Triton convs ~half of cuDNN and half again through maps, issue 12).
#
# Kinds: matmul, attention, conv (dense), conv_grouped (1 < groups, not depthwise), conv_depthwise (one input
# channel per group); "triton/maps": the extra factor on the FLOP rate of a Triton tensor-core kernel that
# reads an operand through a map that is not a strided view (div/mod, expand); "triton/pieces": the factor
# on its whole time when an input's map has several pieces (predicates in the K loop: LiteMLA's bmm
# through the pad map ran 1.9x slower on the H200, bandwidth-bound, not compute-bound).
# "library/program": a library kernel's per-program streaming bandwidth, as a fraction of
# Hardware.program_bandwidth; "library/gather": the efficiency of the residual copies a library kernel
# needs (gathers/scatters) relative to a copy kernel of the same traffic.
# The grouped/depthwise and library/program/gather rows are first estimates; the H200 has fitted values.
EFFICIENCY: dict[str, float] = {
    "library/matmul": 1.0, "library/conv": 0.9, "library/attention": 0.9,
    "library/conv_grouped": 0.05, "library/conv_depthwise": 0.02,
    "triton/matmul": 0.85, "triton/conv": 0.5, "triton/attention": 0.8,
    "triton/conv_grouped": 0.25, "triton/conv_depthwise": 0.01,
    "triton/maps": 0.5, "triton/pieces": 0.5, "library/program": 1.0, "library/gather": 1.0,
}

# Hardware fields a calibration file may set (experiments.calibrate --from-db fits them; graph_gap_s comes from
# experiments.oracle_accuracy --fit-gap)
CALIBRATED_FIELDS = ("launch_s", "graph_gap_s", "program_bandwidth", "k_step_s", "resident_bytes",
                     "resident_bandwidth", "swap_read_penalty", "swap_write_penalty", "tile2d_pieces",
                     "short_run_penalty")


# A preset without a calibration file of its own takes another's: the fitted constants beyond the roofline
# (launch overhead, per-program bandwidth, efficiencies of each implementation) describe Hopper's SMs, which the
# H100 and the H200 share; their bandwidths and peaks stay their own.
CALIBRATION_OF = {"H100": "H200", "H100-NVL": "H200"}

# Datasheet numbers (dense).  TF32 is not PyTorch's default for fp32 matmuls, so float32 uses the SIMT peak.
PRESETS: dict[str, Hardware] = {
    "H200": Hardware("H200", bandwidth=4.8e12, l2_bandwidth=11e12,
                     flops={"bfloat16": 989e12, "float16": 989e12, "float32": 67e12},
                     simt_flops=67e12, int_ops=33.5e12, sm_count=132,
                     measured={"bandwidth": 4.3e12, "flops_bfloat16": 790e12, "flops_float16": 790e12}),
    # measured 2026-12-02 on the project's H100 80GB HBM3 (cost_models.hardware.measure: 512 MiB copy,
    # 8192^3 bf16 GEMM); results/solver_measurements/record_summary.json
    "H100": Hardware("H100", bandwidth=3.35e12, l2_bandwidth=10e12,
                     flops={"bfloat16": 989e12, "float16": 989e12, "float32": 67e12},
                     simt_flops=67e12, int_ops=33.5e12,
                     measured={"bandwidth": 2.83e12, "flops_bfloat16": 761e12, "flops_float16": 761e12}),
    "H100-NVL": Hardware("H100-NVL", bandwidth=3.9e12, l2_bandwidth=10e12,
                         flops={"bfloat16": 835e12, "float16": 835e12, "float32": 60e12},
                         simt_flops=60e12, int_ops=30e12),
    "A100": Hardware("A100", bandwidth=1.935e12, l2_bandwidth=5e12,
                     flops={"bfloat16": 312e12, "float16": 312e12, "float32": 19.5e12},
                     simt_flops=19.5e12, int_ops=19.5e12, sm_count=108),
    # a generic server CPU, for comparing the model with CPU measurements in CI
    "CPU": Hardware("CPU", bandwidth=20e9, l2_bandwidth=60e9,
                    flops={"bfloat16": 0.3e12, "float16": 0.3e12, "float32": 0.5e12},
                    simt_flops=0.2e12, int_ops=0.2e12, launch_s=5e-6, sector_bytes=64, coalesce_bytes=64,
                    sm_count=32, program_bandwidth=5e9),
}


def measure(device: str | torch.device | None = None, n_bytes: int = 1 << 30, gemm: int = 8192) -> dict[str, float]:
    """Measured copy bandwidth (read + write bytes/s) and bf16 GEMM FLOP/s on ``device``."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    from vtcsearch.codegen.timing import time_callable
    src = torch.empty(n_bytes // 2, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    t = time_callable(lambda: dst.copy_(src), dev, repeats=20, warmup=5)
    out = {"bandwidth": 2 * src.numel() / t}
    if dev.type == "cuda":
        a = torch.randn(gemm, gemm, device=dev, dtype=torch.bfloat16)
        b = torch.randn(gemm, gemm, device=dev, dtype=torch.bfloat16)
        t = time_callable(lambda: a @ b, dev, repeats=20, warmup=5)
        out["flops_bfloat16"] = 2 * gemm ** 3 / t
        out["device"] = torch.cuda.get_device_name(dev)
    return out

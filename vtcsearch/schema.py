"""The result files' schema: summary.json / summary.csv columns, variant kinds, baseline names.

Its own module so the runner (which fills rows) and the report (which reads them)
both import it, and neither imports the other.  Documented in the README, section
*summary.json*: keep these stable.
"""
from __future__ import annotations

import enum

SCHEMA_VERSION = 1


class VariantKind(str, enum.Enum):
    """What a result row measures: a vtcsearch strategy (``vtc_<solver>``) or a baseline."""

    VTCSEARCH = "vtcsearch"
    BASELINE = "baseline"

    def __str__(self) -> str:      # JSON and CSV show the bare value
        return self.value


def variant_name(solver: str) -> str:
    """The one name of a solver's strategy in every result file: ``vtc_<solver>``."""
    return f"vtc_{solver}"


def solver_of(variant: str) -> str | None:
    """The solver of a ``vtc_<solver>`` variant; None for a baseline."""
    return variant[4:] if variant.startswith("vtc_") else None


# summary.csv columns, in order
ROW_FIELDS = (
    "case", "batch", "workload", "variant", "kind", "solver", "status", "reason",
    "latency_us", "latency_source", "predicted_latency_us", "measured_latency_us", "measured_p20_us",
    "measured_p80_us", "timing_rounds", "speedup_vs_none", "speedup_vs_best_baseline", "baseline_same_process",
    "objective",
    "predicted_peak_bytes", "predicted_activation_peak_bytes", "measured_peak_bytes", "executable_bytes",
    "kernels", "movement_kernels", "movement_us", "compute_us",
    "virtual_tensors", "eliminated_ops", "residual_copies",
    "solver_status", "solve_wall_s", "oracle_calls", "unit_queries", "measurements",
    "numerics_ok", "numerics_size", "numerics_rel_err", "numerics_max_abs_err",
    "floor_us", "x_floor", "implementations", "fallbacks", "build_s",
    "command", "machine", "date",   # the run that produced the row (rows appended from earlier runs keep theirs)
)
# steps.csv and conv_layers.csv (breakdown.steps / breakdown.conv_layers, GPU only)
STEP_FIELDS = ("case", "batch", "variant", "step", "step_kind", "lowering", "measured_us", "floor_us", "x_floor",
               "modes", "error")
# profile.csv (every measured variant on a GPU): its kernels by name, from torch.profiler, per call
PROFILE_FIELDS = ("case", "batch", "variant", "kernel", "calls", "us", "movement")
CONV_FIELDS = ("case", "batch", "variant", "kernel", "x", "w", "stride", "padding", "groups", "epilogue_ops",
               "triton_us", "cudnn_us", "x_cudnn", "error")
INT_FIELDS = ("batch", "predicted_peak_bytes", "predicted_activation_peak_bytes", "measured_peak_bytes",
              "executable_bytes", "kernels",
              "movement_kernels", "virtual_tensors", "eliminated_ops", "residual_copies", "oracle_calls",
              "unit_queries", "measurements", "fallbacks", "timing_rounds")
NUMERICS_FIELDS = ("case", "batch", "size", "dtype", "solver", "ok", "rel_err", "max_abs_err",
                   "buffers_rel_err", "buffers_max_abs_err", "has_nan", "bitwise_equal_none", "kernels",
                   "copy_kernels", "fallbacks", "same_strategy_as", "rel_err_fp32", "eager_rel_err_fp32", "error",
                   "command", "machine", "date")

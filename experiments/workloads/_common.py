"""Shared helpers for the workload builders (argument checking, dtype/device handling)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

import torch
import torch.nn as nn

SIZES = ("full", "tiny")


@dataclass
class Workload:
    """One benchmark workload: an eval-mode module plus the positional inputs to call it with."""

    name: str  # e.g. "llama3-8b/decode-attention"
    model: torch.nn.Module
    example_inputs: tuple  # positional args for model(*example_inputs)
    dtype: torch.dtype
    description: str
    params: dict[str, Any] = field(default_factory=dict)  # the resolved builder parameters


def check_choice(what: str, value: Any, choices: Iterable[Any]) -> Any:
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"invalid {what} {value!r}; valid choices: {', '.join(repr(c) for c in choices)}")
    return value


def check_unknown(workload: str, unknown: dict[str, Any], valid: Iterable[str]) -> None:
    if unknown:
        bad = ", ".join(sorted(unknown))
        raise ValueError(
            f"unknown parameter(s) {bad} for workload {workload!r}; valid parameters: {', '.join(valid)}"
        )


def check_int(what: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"invalid {what} {value!r}; must be an int >= {minimum}")
    return value


def check_common(size: str, batch: int) -> None:
    check_choice("size", size, SIZES)
    check_int("batch", batch)


def resolve_device(device: Any) -> torch.device:
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"invalid device {device!r}: {e}") from None


def resolve_dtype(dtype: Any, default: torch.dtype, device: torch.device) -> torch.dtype:
    """An explicit dtype wins; otherwise float32 on CPU (real CPU runs) and the model's default elsewhere."""
    if dtype is not None:
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"invalid dtype {dtype!r}; must be a floating torch.dtype such as torch.bfloat16")
        return dtype
    return torch.float32 if device.type == "cpu" else default


def resolution(what: str, value: Any) -> tuple[int, int]:
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value, value)
    if (
        not isinstance(value, (tuple, list))
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    ):
        raise ValueError(f"invalid {what} {value!r}; must be an int or a (height, width) pair of ints")
    return int(value[0]), int(value[1])


def finalize(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Cast floating params/buffers to dtype, switch to eval mode and drop autograd."""
    model = model.to(dtype=dtype)
    model.eval()
    model.requires_grad_(False)
    return model


@torch.no_grad()
def randomize_batchnorm_(model: nn.Module) -> None:
    """Give BatchNorm layers non-trivial affine params and running stats (real devices only).

    Fresh BatchNorm layers are the identity in eval mode; random statistics make tiny CPU runs
    exercise the normalisation for real (useful when checking graph rewrites numerically).
    """
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
            if m.running_mean.device.type == "meta":
                continue
            m.weight.uniform_(0.5, 1.5)
            m.bias.normal_(0.0, 0.1)
            m.running_mean.normal_(0.0, 0.1)
            m.running_var.uniform_(0.5, 1.5)


def count_params(model: nn.Module) -> int:
    """Number of distinct parameters (tied weights counted once, as model.parameters() does)."""
    return sum(p.numel() for p in model.parameters())

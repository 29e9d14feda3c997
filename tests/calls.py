"""One call of a workload's model, eager or compiled, with the module's buffers (a KV cache) restored after it,
so several variants of one test see the same state."""
from __future__ import annotations

from typing import Any

import torch


def _first(out: Any) -> torch.Tensor:
    return (out[0] if isinstance(out, (list, tuple)) else out).float().clone()


def _restoring(m: torch.nn.Module, fn):
    saved = {n: b.clone() for n, b in m.named_buffers()}
    try:
        return fn()
    finally:
        with torch.no_grad():
            for n, b in m.named_buffers():
                b.copy_(saved[n])


def eager_output(w) -> torch.Tensor:
    """The first output of one eager call of workload ``w``."""
    def call():
        with torch.no_grad():
            return _first(w.model(*w.example_inputs))
    return _restoring(w.model, call)


def compiled_output(w, **options) -> tuple[torch.Tensor, Any]:
    """(first output, compiled) of one call of ``vtcsearch.compile(w.model, w.example_inputs, **options)``."""
    import vtcsearch

    def call():
        c = vtcsearch.compile(w.model, w.example_inputs, **options)
        return _first(c(*w.example_inputs)), c
    return _restoring(w.model, call)

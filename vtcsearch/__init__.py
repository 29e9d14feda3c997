"""vtcsearch: virtual tensors for data movement elimination, and a search over which tensors to make virtual.

``vtcsearch.compile(model, example_inputs, ...)`` is the one-call entry point
(:mod:`vtcsearch.api`); ``python -m vtcsearch.run CONFIG`` runs an experiment
(:mod:`vtcsearch.run`).  Imports are lazy: ``import vtcsearch`` loads neither
torch nor Triton, so setting ``TRITON_INTERPRET=1`` afterwards still works.
"""
from __future__ import annotations

from typing import Any

__all__ = ["Compiled", "compile", "load_config"]

_LAZY = {"compile": "api", "Compiled": "api", "load_config": "config"}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'vtcsearch' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)

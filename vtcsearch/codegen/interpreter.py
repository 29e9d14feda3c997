"""Triton's CPU interpreter: how kernels run on a machine without a GPU.

Kept in codegen (below the runner and the library facade) so both can switch it on.
"""
from __future__ import annotations

import os
import sys


def ensure_interpreter() -> None:
    """Run Triton kernels through its CPU interpreter; must happen before vtcsearch.codegen.kernels is imported."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return
    for mod in ("vtcsearch.codegen.kernels", "triton.language"):   # transformers, torchvision import triton early
        if mod in sys.modules:
            raise RuntimeError(f"{mod} was imported without TRITON_INTERPRET=1 (transformers, timm and "
                               "torchvision import triton): set TRITON_INTERPRET=1 in the environment before "
                               "Python starts to realize on the CPU")
    os.environ["TRITON_INTERPRET"] = "1"

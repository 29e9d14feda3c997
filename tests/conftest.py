"""Run Triton kernels through the interpreter when there is no GPU (must happen before triton is imported)."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

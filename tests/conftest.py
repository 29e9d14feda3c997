"""Test setup shared by every test file: the one place that decides whether a GPU is there.

Without a CUDA GPU, Triton kernels run through the interpreter (``TRITON_INTERPRET=1``, set here before
triton is imported).  ``GPU``/``DEVICE`` say where kernels run (``from conftest import DEVICE`` for module
level helpers); tests that need the GPU carry the ``gpu`` marker (skipped without one) or take the ``gpu``
fixture (the CUDA device, or a skip).  The lead runs them with ``python3 -m pytest -m gpu``.
"""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

GPU: bool = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1"
DEVICE: str = "cuda" if GPU else "cpu"
NO_GPU = "needs a CUDA GPU (and Triton compiling, not interpreting)"


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip ``@pytest.mark.gpu`` tests without a GPU that Triton compiles for."""
    if item.get_closest_marker("gpu") is not None and not GPU:
        pytest.skip(NO_GPU)


@pytest.fixture(scope="session")
def gpu() -> torch.device:
    """The CUDA device that compiled Triton kernels run on (the test is skipped without one)."""
    if not GPU:
        pytest.skip(NO_GPU)
    return torch.device("cuda")

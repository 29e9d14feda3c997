"""The solver comparison notebook executes top to bottom on the CPU (CI sizes; FULL=1 runs the big study)."""
from __future__ import annotations

import os
import re

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
NOTEBOOK = os.path.join(ROOT, "notebooks", "solver_comparison.ipynb")


def test_solver_comparison_notebook_runs():
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                                     resources={"metadata": {"path": os.path.dirname(NOTEBOOK)}})
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    m = re.search(r"ILP == exhaustive on all (\d+)", text)
    assert m and int(m.group(1)) > 0, "the exactness check ran on no (case, oracle) pair"

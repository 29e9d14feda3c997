"""The package's folders are its layers: imports point down only, and no two modules import each other.

core (``vtcsearch/core``) < codegen (``vtcsearch/codegen``) < ``cost_models`` < ``solvers`` < the application
(``vtcsearch/{run,config,report,plotting,api,schema}``, the ``vtcsearch`` facade, ``experiments/``).
Every import counts: module-level, function-level (lazy), under ``TYPE_CHECKING``, relative and absolute.
"""
from __future__ import annotations

import ast
import os
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("vtcsearch", "cost_models", "solvers", "experiments")
LAYERS = ("core", "codegen", "cost_models", "solvers", "application")

def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    """Every module of the layered packages, by dotted name."""
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            out[module_name(path)] = path
    return out


def layer(mod: str) -> int:
    """The layer index of a module (0 = core ... 4 = application)."""
    parts = mod.split(".")
    if parts[0] == "vtcsearch" and len(parts) > 1 and parts[1] in ("core", "codegen"):
        return LAYERS.index(parts[1])
    if parts[0] in ("cost_models", "solvers"):
        return LAYERS.index(parts[0])
    return LAYERS.index("application")


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The longest known module that ``name`` is or lies in (None: outside the project)."""
    parts = name.split(".")
    while parts:
        cand = ".".join(parts)
        if cand in known:
            return cand
        parts.pop()
    return None


def imports_of(mod: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules ``mod`` imports anywhere in its source."""
    is_pkg = path.name == "__init__.py"
    package = mod if is_pkg else mod.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                if node.level > 1:
                    base = base[: len(base) - (node.level - 1)]
                base_name = ".".join(base + ([node.module] if node.module else []))
            else:
                base_name = node.module or ""
            # ``from pkg import sub`` imports the submodule when there is one
            names = [f"{base_name}.{a.name}" if f"{base_name}.{a.name}" in known else base_name
                     for a in node.names]
        else:
            continue
        for n in names:
            r = _resolve(n, known)
            if r is not None and r != mod:
                out.add(r)
    return out


def import_graph() -> nx.DiGraph:
    known = modules()
    g = nx.DiGraph()
    g.add_nodes_from(known)
    for mod, path in known.items():
        for dep in imports_of(mod, path, known):
            g.add_edge(mod, dep)
    return g


def test_the_walker_sees_every_kind_of_import(tmp_path):
    """Guards the parser itself: relative, absolute, lazy and package imports all become edges."""
    known = {"vtcsearch.core.a": tmp_path / "a.py", "vtcsearch.core.b": tmp_path / "b.py",
             "vtcsearch.codegen": tmp_path / "__init__.py", "vtcsearch.codegen.k": tmp_path / "k.py",
             "solvers.s": tmp_path / "s.py"}
    src = ("from .b import x\n"
           "def f():\n    from ..codegen import k\n"
           "class C:\n    def m(self):\n        import solvers.s\n")
    known["vtcsearch.core.a"].write_text(src)
    assert imports_of("vtcsearch.core.a", known["vtcsearch.core.a"], known) == \
        {"vtcsearch.core.b", "vtcsearch.codegen.k", "solvers.s"}


def test_imports_point_down_only():
    g = import_graph()
    up = sorted((a, b) for a, b in g.edges if layer(b) > layer(a))
    assert not up, "imports pointing up a layer (importer -> imported): " + \
        ", ".join(f"{a} ({LAYERS[layer(a)]}) -> {b} ({LAYERS[layer(b)]})" for a, b in up)


def test_no_import_cycles():
    g = import_graph()
    cycles = sorted(" -> ".join(c + [c[0]]) for c in nx.simple_cycles(g))
    assert not cycles, f"{len(cycles)} import cycle(s): " + "; ".join(cycles[:10])


def test_the_library_facade_imports_no_runner():
    g = import_graph()
    reach = {"vtcsearch.api"} | nx.descendants(g, "vtcsearch.api") if "vtcsearch.api" in g else set()
    assert "vtcsearch.run" not in reach, "vtcsearch.api imports the command-line runner vtcsearch.run"


def core_subclasses() -> set[tuple[str, str]]:
    """(module, core class) for every class outside the core that subclasses ``Strategy`` or ``VTOG``.

    A subclass in a higher layer overrides the core's private members, so the core's behaviour would depend
    on code above it; the core offers hooks instead."""
    guarded = {"Strategy": "vtcsearch.core.strategy.Strategy", "VTOG": "vtcsearch.core.vtog.VTOG"}
    out = set()
    for mod, path in modules().items():
        if layer(mod) == 0:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                for b in node.bases:
                    name = b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", None)
                    if name in guarded:
                        out.add((mod, guarded[name]))
    return out


def test_no_core_class_is_subclassed_above_the_core():
    bad = sorted(core_subclasses())
    assert not bad, f"core classes subclassed above the core (use a hook on the core class): {bad}"



def test_the_runner_and_the_cost_models_leave_triton_unloaded():
    """On a CPU the runner switches Triton's interpreter on before any kernel module loads; so importing the
    runner, the cost models and the solvers must not import the kernels (or triton.language) on the way."""
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = ("import sys, vtcsearch.run, vtcsearch.api, cost_models, solvers, cost_models.analytical; "
            "bad = [m for m in ('vtcsearch.codegen.kernels', 'triton.language') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr

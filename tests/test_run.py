"""The experiment runner end to end on the CPU, config validation, summary.json's schema, vtcsearch.compile.

``python -m vtcsearch.run configs/tiny.yaml`` runs in-process (``main([...])``): capture
on meta tensors, search with the analytical H200 model, numerics on a CPU copy through
Triton's interpreter.  Every output file is checked, and summary.json against the
schema documented in the README (section "summary.json").
"""
from __future__ import annotations

import csv
import json
import math
import os
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import vtcsearch
from vtcsearch.config import ConfigError, load_config
from vtcsearch.run import NUMERICS_FIELDS, ROW_FIELDS, main

pytest.importorskip("triton")
pytestmark = [pytest.mark.filterwarnings("ignore::RuntimeWarning"), pytest.mark.filterwarnings("ignore::UserWarning")]

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.yaml"

NUM = (int, float)
OPT_NUM = (int, float, type(None))
OPT_INT = (int, type(None))
OPT_STR = (str, type(None))
OPT_BOOL = (bool, type(None))
# summary.json "rows": field -> allowed JSON types (the README's table)
ROW_TYPES = {
    "case": str, "batch": int, "workload": str, "variant": str, "kind": str, "solver": OPT_STR, "status": str,
    "reason": OPT_STR, "latency_us": OPT_NUM, "latency_source": OPT_STR, "predicted_latency_us": OPT_NUM,
    "measured_latency_us": OPT_NUM, "measured_p20_us": OPT_NUM, "measured_p80_us": OPT_NUM,
    "speedup_vs_none": OPT_NUM, "speedup_vs_best_baseline": OPT_NUM, "objective": OPT_NUM,
    "predicted_peak_bytes": OPT_INT, "predicted_activation_peak_bytes": OPT_INT, "measured_peak_bytes": OPT_INT,
    "executable_bytes": OPT_INT,
    "kernels": OPT_INT, "movement_kernels": OPT_INT, "movement_us": OPT_NUM, "compute_us": OPT_NUM,
    "virtual_tensors": OPT_INT, "eliminated_ops": OPT_INT, "residual_copies": OPT_INT, "solver_status": OPT_STR,
    "solve_wall_s": OPT_NUM, "oracle_calls": OPT_INT, "unit_queries": OPT_INT, "measurements": OPT_INT,
    "numerics_ok": OPT_BOOL, "numerics_size": OPT_STR, "numerics_rel_err": OPT_NUM, "numerics_max_abs_err": OPT_NUM,
    "floor_us": OPT_NUM, "x_floor": OPT_NUM, "implementations": OPT_STR, "fallbacks": OPT_INT, "build_s": OPT_NUM,
}
TOP_TYPES = {
    "schema_version": int, "name": str, "description": str, "config_path": OPT_STR, "command": str, "date": str,
    "wall_s": NUM, "measured": bool, "machine": dict, "oracle": dict, "objective": str, "config": dict,
    "cases": list, "rows": list, "numerics": list, "notes": list, "files": dict, "runs": list,
    "steps": list, "conv_layers": list, "profile": list,
}
CASE_TYPES = {"case": str, "batch": int, "id": str, "workload": str, "description": str, "params": dict,
              "dtype": str, "graph": dict, "vtog": dict, "build_s": NUM, "capture_s": NUM, "vtog_s": NUM,
              "best_solver": OPT_STR, "error": OPT_STR, "floor": (dict, type(None)), "prepare": (dict, type(None)),
              "model_bytes": OPT_INT}


def typed(value, types) -> bool:
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        return False
    return isinstance(value, types)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    rc = main([str(TINY), "--out", str(out), "--device", "cpu", "--quiet"])
    return rc, out


def test_tiny_run_writes_every_file(tiny_run):
    rc, out = tiny_run
    assert rc == 0
    for f in ("summary.csv", "summary.json", "kernels.csv", "numerics.csv", "report.md", "log.txt",
              "latency.png", "memory.png", "breakdown.png"):
        assert (out / f).is_file() and (out / f).stat().st_size > 0, f
    for png in list(out.glob("*.png")) + list((out / "vtog").glob("*.png")):
        data = png.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, png      # a real picture, not a blank stub
    cfg = load_config(TINY)
    for solver in cfg.solvers:                                                     # draw: all
        assert (out / "vtog" / f"llama3-bs1_{solver}.png").is_file()
        assert json.loads((out / "strategies" / f"llama3-bs1_{solver}.json").read_text())["edges"] is not None
    vt = json.loads((out / "vtog" / "llama3-bs1.json").read_text())
    assert vt["nodes"] and vt["edges"] and vt["options"]


def test_summary_csv_and_kernel_breakdown(tiny_run):
    _, out = tiny_run
    with open(out / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0].keys()) == ROW_FIELDS
    cfg = load_config(TINY)
    assert [r["variant"] for r in rows] == [f"vtc_{s}" for s in cfg.solvers] + cfg.baselines
    for r in rows:
        if r["kind"] == "vtcsearch":
            assert r["status"] == "ok" and r["latency_source"] == "modelled" and float(r["latency_us"]) > 0
            assert r["kernels"].isdigit() and r["numerics_ok"] == "True"
        else:
            assert r["status"] == "skipped" and "CUDA" in r["reason"]
    with open(out / "kernels.csv") as f:
        krows = list(csv.DictReader(f))
    assert {"case", "batch", "variant", "solver", "unit", "kind", "us", "bytes", "flops"} <= set(krows[0])
    assert {r["solver"] for r in krows} == set(cfg.solvers)
    assert {r["kind"] for r in krows} <= {"kernel", "copy"}
    with open(out / "numerics.csv") as f:
        assert tuple(next(csv.reader(f))) == NUMERICS_FIELDS
    # breakdown.floors: every kernel with bytes has a floor, and no model beats the hardware
    floored = [r for r in krows if r["floor_us"]]
    assert floored and all(float(r["x_floor"]) >= 1.0 - 1e-9 for r in floored)
    for r in rows:
        if r["kind"] == "vtcsearch":
            assert float(r["floor_us"]) > 0 and float(r["x_floor"]) >= 1.0


def test_summary_json_schema(tiny_run):
    _, out = tiny_run
    s = json.loads((out / "summary.json").read_text())
    assert set(s) == set(TOP_TYPES)
    for k, t in TOP_TYPES.items():
        assert typed(s[k], t), (k, s[k])
    assert s["schema_version"] == 1 and s["measured"] is False and s["name"] == "tiny"
    assert s["oracle"]["oracle"] == "analytical" and s["oracle"]["hardware"] == "H200"
    assert {"device", "gpu", "cpu", "python", "torch", "triton"} <= set(s["machine"])
    assert any("modelled" in n for n in s["notes"])
    for c in s["cases"]:
        assert set(c) == set(CASE_TYPES)
        for k, t in CASE_TYPES.items():
            assert typed(c[k], t), (k, c[k])
        assert c["error"] is None and c["best_solver"] in load_config(TINY).solvers
    assert s["rows"]
    for r in s["rows"]:
        assert tuple(r) == ROW_FIELDS
        for k, t in ROW_TYPES.items():
            assert typed(r[k], t), (r["variant"], k, r[k])
        assert r["kind"] in ("vtcsearch", "baseline") and r["status"] in ("ok", "skipped", "failed")
        assert r["latency_source"] in (None, "measured", "modelled")
    vtc = {r["solver"]: r for r in s["rows"] if r["kind"] == "vtcsearch"}
    assert vtc["none"]["speedup_vs_none"] == pytest.approx(1.0)
    # the search removes data movement: the ILP's strategy is modelled faster and copies less than all-physical
    assert vtc["ilp"]["predicted_latency_us"] < vtc["none"]["predicted_latency_us"]
    assert vtc["ilp"]["movement_kernels"] < vtc["none"]["movement_kernels"]
    assert vtc["ilp"]["eliminated_ops"] > 0 and vtc["none"]["eliminated_ops"] == 0
    for n in s["numerics"]:
        assert tuple(n) == NUMERICS_FIELDS
        assert n["ok"] is True and n["rel_err"] < 0.05 and n["bitwise_equal_none"] is True
    for key, rel in s["files"].items():
        for p in (rel if isinstance(rel, list) else [rel]):
            assert (out / p).exists(), (key, p)


def test_append_keeps_the_cases_it_does_not_redo(tiny_run, tmp_path):
    """A config run in pieces: batch 2 appended to the batch-1 run; both cases, both commands, one report."""
    import shutil
    _, first = tiny_run
    out = tmp_path / "pieces"
    shutil.copytree(first, out)
    assert main([str(TINY), "--out", str(out), "--device", "cpu", "--quiet", "--solvers", "none",
                 "--batch", "2", "--append"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert [(c["case"], c["batch"]) for c in s["cases"]] == [("llama3", 1), ("llama3", 2)]
    assert {r["batch"] for r in s["rows"]} == {1, 2}
    assert {r["solver"] for r in s["rows"] if r["batch"] == 1 and r["kind"] == "vtcsearch"} == {"none", "greedy", "ilp"}
    assert [r["command"].split()[-1] for r in s["runs"]] == ["--quiet", "--append"]
    with open(out / "kernels.csv") as f:
        assert {row["batch"] for row in csv.DictReader(f)} == {"1", "2"}
    report = (out / "report.md").read_text()
    assert report.count("- Command: ") == 2
    # redoing batch 1 with one solver replaces that solver's row, not duplicating it; the others stay
    before = {r["variant"]: r for r in s["rows"] if r["batch"] == 1}
    assert main([str(TINY), "--out", str(out), "--device", "cpu", "--quiet", "--solvers", "none", "--append"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert [(c["case"], c["batch"]) for c in s["cases"]] == [("llama3", 1), ("llama3", 2)]
    after = [r["variant"] for r in s["rows"] if r["batch"] == 1]
    assert sorted(after) == sorted(before) and len(after) == len(set(after))
    assert {r["solver"] for r in s["rows"] if r["batch"] == 1 and r["kind"] == "vtcsearch"} == {"none", "greedy", "ilp"}
    # a folder of another config is refused, not mixed in
    other = json.loads((out / "summary.json").read_text())
    other["name"] = "llama"
    (out / "summary.json").write_text(json.dumps(other))
    assert main([str(TINY), "--out", str(out), "--device", "cpu", "--quiet", "--append"]) == 2


def test_rewrite_sets_old_rows_against_the_floor_of_the_gpu_that_measured_them(tiny_run, tmp_path):
    """``--rewrite`` runs nothing and writes the folder again from its summary: a row an older run wrote with
    the H200's floor (its case record names no GPU) while an H100 measured it gets the H100's floor; the
    measurement itself, the command and the log stay."""
    import shutil

    from cost_models.hardware import Hardware
    from vtcsearch import floors
    from vtcsearch.config import torch_dtype
    _, first = tiny_run
    out = tmp_path / "old"
    shutil.copytree(first, out)
    s = json.loads((out / "summary.json").read_text())
    case = s["cases"][0]
    case["floor"].pop("hardware", None)                 # as written before floors were per GPU
    row = next(r for r in s["rows"] if r["variant"] == "vtc_none")
    row.update(machine="NVIDIA H100 80GB HBM3 (torch 2.11.0+cu130, triton 3.6.0)", measured_latency_us=500.0,
               latency_us=500.0, floor_us=case["floor"]["floor_us"], x_floor=500.0 / case["floor"]["floor_us"])
    (out / "summary.json").write_text(json.dumps(s))
    log = (out / "log.txt").read_text()
    assert main([str(TINY), "--out", str(out), "--rewrite"]) == 0
    s2 = json.loads((out / "summary.json").read_text())
    row2 = next(r for r in s2["rows"] if r["variant"] == "vtc_none")
    h100 = floors.floor_us(case["floor"]["floor_bytes"], case["floor"]["floor_flops"], Hardware.preset("H100"),
                           torch_dtype(case["dtype"]))
    assert row2["floor_us"] == pytest.approx(h100) and row2["x_floor"] == pytest.approx(500.0 / h100)
    assert row2["floor_us"] > case["floor"]["floor_us"]          # the H100 streams less than the H200
    assert row2["measured_latency_us"] == 500.0 and row2["command"] == row["command"]
    assert (out / "log.txt").read_text() == log
    assert main([str(TINY), "--out", str(tmp_path / "nothing"), "--rewrite"]) == 2


def test_a_failed_appended_piece_keeps_the_earlier_rows_and_a_fault_stops_the_later_cases(tiny_run, tmp_path,
                                                                                           monkeypatch):
    """An --append piece whose case fails (here a CUDA fault, as on the H100) puts the folder's earlier rows of
    that case back instead of replacing measurements by failed rows; after a fault, the later cases are not
    run (the process's GPU work is over) and say why in one line."""
    import shutil
    import vtcsearch.run as run
    _, first = tiny_run
    out = tmp_path / "pieces"
    shutil.copytree(first, out)
    before = json.loads((out / "summary.json").read_text())
    old = {r["variant"]: r["predicted_latency_us"] for r in before["rows"]}
    with open(out / "kernels.csv") as f:
        old_kernels = sum(1 for _ in csv.DictReader(f))
    calls = []

    def faulty(ctx, params, batch, *a, **k):
        calls.append(batch)
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    monkeypatch.setattr(run, "run_case", faulty)
    assert main([str(TINY), "--out", str(out), "--device", "cpu", "--quiet", "--batch", "1", "2", "--append"]) == 1
    s = json.loads((out / "summary.json").read_text())
    assert calls == [1]                                   # batch 2 was not attempted after the fault
    kept = {r["variant"]: r for r in s["rows"] if r["batch"] == 1}
    assert {v: r["predicted_latency_us"] for v, r in kept.items()} == old
    assert all(r["status"] != "failed" for r in kept.values())
    assert any("failed in this run: the folder keeps its earlier rows" in n for n in s["notes"])
    second = [r for r in s["rows"] if r["batch"] == 2]
    assert second and all(r["status"] == "failed" for r in second)
    reason = next(r["reason"] for r in second if r["kind"] == "vtcsearch")
    assert reason.startswith("not run: ") and "the GPU faulted in llama3 bs1 (RuntimeError: CUDA error" in reason
    with open(out / "kernels.csv") as f:
        assert sum(1 for _ in csv.DictReader(f)) == old_kernels


def test_an_appended_piece_that_succeeds_clears_the_case_s_earlier_failure(tmp_path, monkeypatch):
    """A case that failed in one --append piece and is measured by a later one: the folder's case record and
    notes no longer say it failed (they kept an H200 run's OOM beside the H100's measurement)."""
    import vtcsearch.run as run
    out = tmp_path / "pieces"
    base = [str(TINY), "--out", str(out), "--device", "cpu", "--quiet", "--batch", "1", "--append"]
    real = run.run_case

    def oom(ctx, params, batch, *a, **k):
        raise RuntimeError("OutOfMemoryError: CUDA out of memory")
    monkeypatch.setattr(run, "run_case", oom)
    assert main(base) == 1
    s = json.loads((out / "summary.json").read_text())
    assert s["cases"][0]["error"] and any(" failed: " in n for n in s["notes"])
    monkeypatch.setattr(run, "run_case", real)
    assert main(base) == 0
    s = json.loads((out / "summary.json").read_text())
    assert len(s["cases"]) == 1 and s["cases"][0]["error"] is None
    assert not any(" failed: " in n for n in s["notes"]) and "failed" not in (out / "report.md").read_text().split(
        "## Skipped or failed")[0]
    # a folder written before the fix: --rewrite settles it from its rows
    s["cases"][0]["error"] = "benchmark: OutOfMemoryError"
    s["notes"].append(f"case {s['cases'][0]['case']} bs1 failed: benchmark: OutOfMemoryError")
    (out / "summary.json").write_text(json.dumps(s))
    assert main([str(TINY), "--out", str(out), "--rewrite"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["cases"][0]["error"] is None and not any(" failed: " in n for n in s["notes"])


def test_report_says_modelled(tiny_run):
    _, out = tiny_run
    text = (out / "report.md").read_text()
    assert "modelled, not measured" in text
    assert "## Numerics" in text and "![latency](latency.png)" in text
    assert "## Skipped or failed" in text
    for b in load_config(TINY).baselines:
        assert f"`{b}`" in text


# ---------------------------------------------------------------------------
# config validation
# ---------------------------------------------------------------------------
def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def tiny_text() -> str:
    return TINY.read_text()


def test_every_shipped_config_loads():
    names = sorted(p.stem for p in (ROOT / "configs").glob("*.yaml"))
    assert {"llama", "gemma2", "efficientvit", "yolo11", "shufflenet", "tiny"} <= set(names)
    for n in names:
        cfg = load_config(ROOT / "configs" / f"{n}.yaml")
        assert cfg.name == n and cfg.output == f"results/{n}"
    llama = load_config(ROOT / "configs" / "llama.yaml")
    assert llama.batch_sizes == [1, 16] and llama.hardware == "H200" and llama.oracle == "analytical"


@pytest.mark.parametrize("edit,key,words", [
    (lambda t: t + "colour: blue\n", "colour", "unknown key"),
    (lambda t: t.replace("numerics:\n", "numerics:\n  speed: 3\n"), "numerics.speed", "unknown key"),
    (lambda t: t.replace("batch_sizes: [1]", "batch_sizes: 1"), "batch_sizes", "expected a list"),
    (lambda t: t.replace("batch_sizes: [1]", "batch_sizes: [one]"), "batch_sizes[0]", "expected an integer"),
    (lambda t: t.replace("dtype: bfloat16", "dtype: float64"), "dtype", "choices"),
    (lambda t: t.replace("solvers: [none, greedy, ilp]", "solvers: [none, gredy]"), "solvers[1]", "unknown solver"),
    (lambda t: t.replace("oracle: auto", "oracle: psychic"), "oracle", "unknown oracle"),
    (lambda t: t.replace("hardware: H200", "hardware: Z80"), "hardware", "unknown hardware"),
    (lambda t: t.replace("objective: latency", "objective: speed"), "objective", "choices"),
    (lambda t: t.replace("baselines: [eager,", "baselines: [tensorrt,"), "baselines[0]", "unknown baseline"),
    (lambda t: t.replace("  name: llama3\n", "  name: llama4\n"), "workload.name", "unknown workload"),
    (lambda t: t.replace("part: attention", "prat: attention"), "workload.params.prat", "unknown parameter"),
    (lambda t: t.replace("output: results/tiny\n", ""), "output", "missing required key"),
    (lambda t: t.replace("  enabled: true", "  enabled: yes please"), "numerics.enabled", "expected true or false"),
])
def test_config_errors_are_one_line_naming_file_and_key(tmp_path, edit, key, words):
    p = write(tmp_path, edit(tiny_text()))
    with pytest.raises(ConfigError) as e:
        load_config(p)
    msg = str(e.value)
    assert "\n" not in msg and str(p) in msg and key in msg and words in msg, msg


def test_bad_yaml_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match=r"c\.yaml: not valid YAML \(line 2"):
        load_config(write(tmp_path, "name: x\n  - : [\n"))
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.yaml")


def test_cli_rejects_bad_config_and_solver(tmp_path, capsys):
    assert main([str(write(tmp_path, tiny_text() + "extra: 1\n")), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ConfigError: ") and "extra" in err and err.count("\n") == 1
    assert main([str(TINY), "--solvers", "ilp,bogus", "--out", str(tmp_path / "o")]) == 2
    assert "--solvers[1]: unknown solver 'bogus'" in capsys.readouterr().err
    assert main([str(TINY), "--solvers", "ilp@oracle9", "--out", str(tmp_path / "o")]) == 2
    assert "--solvers[0]: unknown oracle 'oracle9' in 'ilp@oracle9'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_solver_entry_can_name_its_oracle(tmp_path, monkeypatch):
    """``greedy@analytical`` beside ``greedy``: the same solver searched by a second oracle in the same run,
    its own variant, predicted by the oracle that searched."""
    import vtcsearch.run as run
    made = []
    real = run.make_oracle
    monkeypatch.setattr(run, "make_oracle",
                        lambda ctx, name=None, objective=None: made.append(name) or real(ctx, name, objective))
    out = tmp_path / "o"
    assert main([str(TINY), "--out", str(out), "--device", "cpu", "--quiet", "--batch", "1",
                 "--solvers", "none,greedy,greedy@analytical,greedy@profiling"]) == 0
    assert made == [None, "analytical"]
    s = json.loads((out / "summary.json").read_text())
    rows = {r["variant"]: r for r in s["rows"] if r["kind"] == "vtcsearch"}
    assert set(rows) == {"vtc_none", "vtc_greedy", "vtc_greedy@analytical", "vtc_greedy@profiling"}
    assert rows["vtc_greedy@profiling"]["status"] == "skipped"          # profiling measures on a GPU only
    assert rows["vtc_greedy@analytical"]["predicted_latency_us"] == pytest.approx(rows["vtc_greedy"]["predicted_latency_us"])
    assert (out / "strategies" / "llama3-bs1_greedy@analytical.json").exists()


# ---------------------------------------------------------------------------
# vtcsearch.compile
# ---------------------------------------------------------------------------
class Small(nn.Module):
    """A GEMM, a split, a transpose, a concat and an expand: data movement the search can remove."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 48)

    def forward(self, x, y):
        q, k, v = self.proj(x).split(16, dim=-1)
        a = torch.cat([q.transpose(0, 1), k.transpose(0, 1)], dim=0).relu()
        return a * 2.0, (v + y.expand(4, 16)).sigmoid()


def test_compile_may_choose_inductor_and_libraries_on_a_gpu_and_templates_on_the_cpu():
    """``vtcsearch.compile`` with no ``implementations``: on a CUDA model every group may also run as Inductor's
    code or a vendor library (what virtual tensors do not improve runs as torch.compile would run it); on the CPU
    the templates alone (the interpreter; Inductor would compile C++ per region).  A choice given is kept."""
    from vtcsearch.core.implementation import ON_GPU
    torch.manual_seed(0)
    m = Small().eval()
    x, y = torch.randn(4, 16), torch.randn(1, 16)
    assert vtcsearch.compile(m, (x, y), solver="none").oracle.implementations == ("triton",)
    assert vtcsearch.compile(m, (x, y), solver="none", implementations=("triton", "library")) \
        .oracle.implementations == ("triton", "library")
    if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        mc, xc, yc = m.cuda(), x.cuda(), y.cuda()
        fast = vtcsearch.compile(mc, (xc, yc), solver="ilp")
        assert fast.oracle.implementations == ON_GPU
        for o, r in zip(fast(xc, yc), mc(xc, yc)):
            torch.testing.assert_close(o, r, rtol=1e-4, atol=1e-5)


def test_compile_small_module_equals_eager():
    torch.manual_seed(0)
    m = Small().eval()
    x, y = torch.randn(4, 16), torch.randn(1, 16)
    with torch.no_grad():
        ref = m(x, y)
    fast = vtcsearch.compile(m, (x, y), solver="ilp")
    out = fast(x, y)
    assert isinstance(out, tuple) and len(out) == 2
    for o, r in zip(out, ref):
        torch.testing.assert_close(o, r, rtol=1e-4, atol=1e-5)
    x2 = torch.randn(4, 16)                              # new values, same shapes: still eager's answer
    with torch.no_grad():
        ref2 = m(x2, y)
    out2 = fast(x2, y)
    for o, r in zip(out2, ref2):
        torch.testing.assert_close(o, r, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out[0], ref[0], rtol=1e-4, atol=1e-5)   # outputs are fresh tensors
    assert fast.strategy.edges and fast.strategy.eliminated_ops()
    assert "virtual tensors" in fast.report() and fast.graph is fast.strategy.graph
    with pytest.raises(ValueError, match="compiled for"):
        fast(torch.randn(5, 16), y)
    with pytest.raises(TypeError, match="tensor argument"):
        fast(x)


def test_compile_tiny_llama_block_equals_eager_with_kv_cache():
    from experiments.workloads import build_workload
    torch.manual_seed(0)
    w = build_workload("llama3", size="tiny", part="attention", device="cpu", dtype=torch.float32)
    saved = {n: b.clone() for n, b in w.model.named_buffers()}
    with torch.no_grad():
        ref = w.model(*w.example_inputs).clone()
    ref_bufs = {n: b.clone() for n, b in w.model.named_buffers()}
    for n, b in w.model.named_buffers():
        b.copy_(saved[n])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = vtcsearch.compile(w.model, w.example_inputs, solver="ilp", objective="latency")
    for n, b in w.model.named_buffers():          # compiling leaves the caches as they were
        assert torch.equal(b, saved[n]), n
    out = fast(*w.example_inputs)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    for n, b in w.model.named_buffers():          # the KV cache is updated in place, as eager does
        torch.testing.assert_close(b, ref_bufs[n], rtol=1e-4, atol=1e-4)
    assert len(fast.strategy.eliminated_ops()) > 20 and fast.executable.summary()["copy_kernels"] <= 2
    assert math.isfinite(fast.result.objective)


def test_a_failing_case_is_reported_not_fatal(tmp_path, monkeypatch):
    import vtcsearch.core.vtog

    def broken(graph):
        raise KeyError("no index tensor 'clamp_1' for an indirect map")
    monkeypatch.setattr(vtcsearch.core.vtog, "build_vtog", broken)
    out = tmp_path / "o"
    assert main([str(TINY), "--out", str(out), "--device", "cpu", "--quiet", "--solvers", "none"]) == 1
    s = json.loads((out / "summary.json").read_text())
    (case,) = s["cases"]
    assert case["error"].startswith("VTOG construction: KeyError") and "clamp_1" in case["error"]
    assert {r["status"] for r in s["rows"]} == {"failed"} and any("failed" in n for n in s["notes"])
    assert "case failed" in (out / "report.md").read_text()


def _stop_after_the_search(monkeypatch) -> None:
    """The runner receives SIGTERM (as ``timeout`` sends it) once its first search has finished."""
    import os
    import signal

    import vtcsearch.run as run
    real = run.solve_all

    def solve_then_stop(ctx, vtog, what):
        out = real(ctx, vtog, what)
        os.kill(os.getpid(), signal.SIGTERM)
        return out
    monkeypatch.setattr(run, "solve_all", solve_then_stop)


def test_a_stopped_run_writes_what_it_finished(tmp_path, monkeypatch):
    """SIGTERM (a timeout) during a case: exit 124, the folder written, a note saying where it stopped."""
    import signal

    import vtcsearch.run as run
    _stop_after_the_search(monkeypatch)
    out = tmp_path / "o"
    assert main([str(TINY), "--out", str(out), "--device", "cpu", "--quiet", "--solvers", "none"]) == 124
    s = json.loads((out / "summary.json").read_text())
    assert any("stopped during the search" in n for n in s["notes"]) and s["rows"] == []
    assert signal.getsignal(signal.SIGTERM) is not run._interrupt      # the handler is the runner's only


def test_settings_that_change_what_is_measured_are_recorded(tmp_path, monkeypatch):
    """Inductor settings for vtcsearch's regions go into the recorded command, and autotune timings carried from
    an earlier device call into the notes (its build times leave out that benchmarking)."""
    _stop_after_the_search(monkeypatch)
    monkeypatch.setenv("VTC_INDUCTOR_CONFIG", '{"combo_kernels": true}')
    monkeypatch.setenv("VTC_REUSED_AUTOTUNE", "an earlier device call (1 cache file(s) carried in .autotune/)")
    out = tmp_path / "o"
    main([str(TINY), "--out", str(out), "--device", "cpu", "--quiet", "--solvers", "none"])
    s = json.loads((out / "summary.json").read_text())
    assert s["command"].startswith("VTC_INDUCTOR_CONFIG='{\"combo_kernels\": true}' python -m vtcsearch.run ")
    assert any("Autotuning reused the choices of an earlier device call" in n for n in s["notes"])


def test_a_stopped_append_run_keeps_the_earlier_rows_it_did_not_measure(tmp_path, monkeypatch):
    """An --append piece stopped before it measured a case leaves that case's earlier rows in the folder (a
    cut GPU piece dropped Llama 3 8B decode bs 1's measured rows)."""
    out = tmp_path / "o"
    args = [str(TINY), "--out", str(out), "--device", "cpu", "--quiet", "--solvers", "none"]
    assert main(args) == 0
    before = json.loads((out / "summary.json").read_text())["rows"]
    vtogs = {p.name: p.read_bytes() for p in (out / "vtog").glob("*.json")}
    assert before and vtogs
    _stop_after_the_search(monkeypatch)
    assert main([*args, "--append"]) == 124
    s = json.loads((out / "summary.json").read_text())
    assert any("stopped during the search" in n for n in s["notes"])
    key = lambda r: (r["case"], r["batch"], r["variant"], r["latency_us"])   # noqa: E731
    assert sorted(map(key, s["rows"])) == sorted(map(key, before))
    # and the VTOG those rows' strategies index, not the stopped run's capture (its own command and date)
    assert {p.name: p.read_bytes() for p in (out / "vtog").glob("*.json")} == vtogs


def test_a_stopped_case_keeps_its_measured_variants(tmp_path, monkeypatch):
    """What a stopped GPU case measured is written like a finished case; unmeasured variants are left out."""
    import vtcsearch.run as run
    from vtcsearch.config import load_config
    ctx = run.RunContext(load_config(TINY), "cuda", tmp_path, False, run.Log(quiet=True))
    ctx.stage = "benchmark"
    case = {"case": "c", "batch": 1, "floor": None}
    rows = [{"case": "c", "batch": 1, "variant": "compile_default", "kind": "baseline", "status": "ok",
             "measured_latency_us": 10.0},
            {"case": "c", "batch": 1, "variant": "vtc_ilp", "kind": "vtcsearch", "status": "ok",
             "predicted_latency_us": 5.0}]
    ctx.partial = (case, rows, {"vtc_ilp": (tmp_path / "strategies" / "c_ilp.json", {"virtual": {}})})
    summary = {"cases": [], "rows": [], "numerics": [], "steps": [], "conv_layers": [], "notes": ctx.notes,
               "config": {"workload": {"name": "c", "cases": [{}]}}, "runs": [], "measured": True}
    kernel_rows = [{"case": "c", "batch": 1, "variant": "vtc_ilp", "us": 1.0}]
    written = []
    monkeypatch.setattr(run, "write_summary",
                        lambda out, summ, krows, log, wall: written.append((list(summ["rows"]), list(krows))))
    run.keep_measured(ctx, summary, kernel_rows, False, ctx.log, 1.0)
    ((rows_out, krows_out),) = written
    assert [r["variant"] for r in rows_out] == ["compile_default"] and rows_out[0]["latency_us"] == 10.0
    assert krows_out == [] and "vtc_ilp not measured" in ctx.notes[-1]
    assert not (tmp_path / "strategies" / "c_ilp.json").exists()   # no strategy file for what was not measured


def test_notes_later_pieces_made_wrong_go():
    """A note saying a stopped run left variants unmeasured is wrong once a later piece measured them all (it stays
    while one of them is still unmeasured); of a case's guard verdicts only the last stays, and none once the
    case's guard kept the search's pick."""
    from vtcsearch.run import settle_notes
    note = "the run was stopped during the benchmark of c bs1: 0 measured variant(s) kept, vtc_ilp, vtc_none not measured"
    other = "the run was stopped during the benchmark of c bs16: 0 measured variant(s) kept, vtc_ilp not measured"
    row = lambda b, v: {"case": "c", "batch": b, "variant": v, "status": "ok", "measured_latency_us": 1.0}  # noqa: E731
    summary = {"rows": [row(1, "vtc_ilp")], "notes": [note, other, "unrelated"]}
    settle_notes(summary)
    assert summary["notes"] == [note, other, "unrelated"]                   # vtc_none still unmeasured
    summary["rows"] += [row(1, "vtc_none"), {**row(16, "vtc_ilp"), "measured_latency_us": None}]
    settle_notes(summary)
    assert summary["notes"] == [other, "unrelated"]
    kept = lambda b, us: f"case c bs{b}: the guard kept vtc_none ({us} us) over vtc_ilp (9.0 us), as ..."  # noqa: E731
    summary["notes"] = [kept(1, 5.0), kept(16, 7.0), "unrelated", kept(1, 6.0)]
    settle_notes(summary)
    assert summary["notes"] == [kept(16, 7.0), "unrelated", kept(1, 6.0)]
    summary["cases"] = [{"case": "c", "batch": 16, "guard": {"solver": "ilp", "kept": "ilp"}}]   # guarded again:
    settle_notes(summary)                                                                     # the pick kept
    assert summary["notes"] == ["unrelated", kept(1, 6.0)]


# ---------------------------------------------------------------------------
# results are never lost
# ---------------------------------------------------------------------------
@pytest.fixture
def no_run(monkeypatch):
    """The refusals below must come before anything runs."""
    import vtcsearch.run

    def must_not_run(*a, **k):
        raise AssertionError("run_config was called")
    monkeypatch.setattr(vtcsearch.run, "run_config", must_not_run)


def _err_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err and "\n" not in err and "Traceback" not in err, err
    return err


def test_a_cpu_run_writes_to_its_modelled_folder_which_git_ignores():
    """The quick start on a CPU must not touch the committed results: <output>-modelled, ignored by git."""
    import subprocess
    from vtcsearch.run import modelled_folder
    cfg = load_config(ROOT / "configs" / "llama.yaml")
    assert modelled_folder(cfg.output) == Path("results/llama-modelled")
    ignored = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", "results/llama-modelled/summary.json"])
    assert ignored.returncode == 0
    tracked = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", "results/llama/summary.json"])
    assert tracked.returncode == 1


def test_a_cpu_run_refuses_a_folder_of_measured_results(tmp_path, capsys, no_run):
    out = tmp_path / "measured"
    out.mkdir()
    (out / "summary.json").write_text(json.dumps({"name": "tiny", "measured": True, "rows": []}))
    before = (out / "summary.json").read_text()
    assert main([str(TINY), "--out", str(out), "--device", "cpu", "--quiet"]) == 2
    err = _err_line(capsys)
    assert "measured" in err and "--force" in err
    assert (out / "summary.json").read_text() == before and sorted(p.name for p in out.iterdir()) == ["summary.json"]


def test_append_keeps_each_profile_row_with_the_run_that_measured_it(tiny_run, tmp_path):
    """``profile.csv`` (and steps, conv layers) rows of an earlier case keep the command and date of the run
    that measured them when another case is appended; they were stamped with the latest run's command (the
    committed ShuffleNetV2 batch-1 kernels said ``--batch 16``)."""
    import shutil
    _, first = tiny_run
    out = tmp_path / "prov"
    shutil.copytree(first, out)
    s = json.loads((out / "summary.json").read_text())
    s["profile"] = [{"case": "llama3", "batch": 1, "variant": "vtc_none", "kernel": "k", "calls": 1, "us": 2.0,
                     "movement": False}]          # as a GPU run records them (no provenance of their own)
    (out / "summary.json").write_text(json.dumps(s))
    measured = next(r for r in s["rows"] if r["variant"] == "vtc_none")
    assert main([str(TINY), "--out", str(out), "--device", "cpu", "--quiet", "--solvers", "none",
                 "--batch", "2", "--append"]) == 0
    with open(out / "profile.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["batch"], r["command"], r["date"]) for r in rows] == [("1", measured["command"], measured["date"])]
    assert "--batch 2" not in rows[0]["command"]


def test_append_on_a_corrupt_summary_is_one_line_naming_the_file(tmp_path, capsys, no_run):
    out = tmp_path / "o"
    out.mkdir()
    (out / "summary.json").write_text('{"name": "tiny", "measured": false, "rows": [{"case": "ll')   # cut short
    assert main([str(TINY), "--out", str(out), "--device", "cpu", "--quiet", "--append", "--force"]) == 2
    err = _err_line(capsys)
    assert str(out / "summary.json") in err and "corrupt" in err


@pytest.mark.parametrize("where", ["file", "under_file", "read_only"])
def test_unusable_out_is_one_line_exit_2(tmp_path, capsys, where, no_run):
    f = tmp_path / "f.txt"
    f.write_text("not a folder")
    if where == "read_only":
        out = Path("/sys/vtcsearch-out")     # read-only even for root
        try:
            out.mkdir()
            out.rmdir()
            pytest.skip("/sys is writable here")
        except OSError:
            pass
    else:
        out = f if where == "file" else f / "sub"
    assert main([str(TINY), "--out", str(out), "--device", "cpu", "--quiet"]) == 2
    assert str(out) in _err_line(capsys)
    assert f.read_text() == "not a folder"


def test_outputs_are_replaced_atomically(tiny_run, tmp_path, monkeypatch):
    """A run interrupted while writing leaves the previous complete files and no temporaries."""
    import shutil
    import vtcsearch.report
    from vtcsearch.run import Log, write_summary
    _, first = tiny_run
    out = tmp_path / "copy"
    shutil.copytree(first, out)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    summary = json.loads((out / "summary.json").read_text())

    def interrupted(s):
        raise KeyboardInterrupt
    monkeypatch.setattr(vtcsearch.report, "markdown", interrupted)
    summary["rows"][0]["latency_us"] = 1.0     # what a next case would change
    with pytest.raises(KeyboardInterrupt):
        write_summary(out, summary, [], Log(quiet=True), 1.0)
    after = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert after["report.md"] == before["report.md"] and after["summary.json"] == before["summary.json"]
    assert not [p for p in out.rglob(".*")], "temporary files left behind"


def test_atomic_writer_replaces_or_leaves_the_old_file(tmp_path):
    """A writer that fails half-way leaves the old file and no temporary; one that finishes replaces it."""
    from vtcsearch.atomic import atomic_path, write_json
    path = tmp_path / "summary.json"
    path.write_text('{"old": true}')
    with pytest.raises(RuntimeError):
        with atomic_path(path) as tmp:
            tmp.write_text('{"cut short')
            raise RuntimeError("interrupted")
    assert path.read_text() == '{"old": true}' and [p.name for p in tmp_path.iterdir()] == ["summary.json"]
    write_json(path, {"x": 1})
    assert json.loads(path.read_text()) == {"x": 1} and [p.name for p in tmp_path.iterdir()] == ["summary.json"]



def test_json_records_hold_the_data_one_record_per_line(tmp_path):
    """A VTOG's JSON: the same data back, each list item on a line of its own (empty lists and scalars too)."""
    from vtcsearch.atomic import write_json_records
    data = {"nodes": [{"name": "a", "shape": [1, 2]}, {"name": "b", "shape": []}], "conflicts": [],
            "written_by": {"command": "x"}, "n": 3}
    path = tmp_path / "v.json"
    write_json_records(path, data)
    lines = path.read_text().splitlines()
    assert json.loads(path.read_text()) == data
    assert '{"name":"a","shape":[1,2]},' in lines and '{"name":"b","shape":[]}' in lines

# ---------------------------------------------------------------------------
# one timer, one machine()
# ---------------------------------------------------------------------------
def test_bench_on_the_cpu_times_the_callable():
    import time as _time
    from vtcsearch.codegen.timing import bench
    calls = []

    def fn():
        calls.append(1)
        _time.sleep(0.002)
    t = bench(fn, device="cpu", warmup=2, repeats=5)
    assert len(calls) == 7 and t.samples == 5 and t.method == "perf_counter"
    assert 1900 <= t.p20_us <= t.median_us <= t.p80_us
    with pytest.raises(ValueError):
        bench(fn, device="cpu", repeats=0)


def test_side_by_side_timing_interleaves_the_variants():
    """Variants are timed in alternating rounds: a process that slows down as it goes (clocks, memory) slows
    every variant alike, so two identical callables come out alike instead of the later one looking slower."""
    import time as _time
    from vtcsearch.codegen.timing import bench_side_by_side
    order: list[str] = []

    def drifting(name):
        def fn():
            order.append(name)
            _time.sleep(0.0005 * (1 + len(order) / 40))   # each call a little slower than the last
        return fn
    t = bench_side_by_side({"a": (drifting("a"), True), "b": (drifting("b"), True)}, device="cpu", rounds=4,
                           rep_ms=20)
    switches = sum(x != y for x, y in zip(order, order[1:]))
    assert switches >= 2 * 4 - 1, order
    assert min(t["a"].samples, t["b"].samples) >= 4 and t["a"].method == "perf_counter"
    assert abs(t["a"].median_us - t["b"].median_us) < 0.25 * t["a"].median_us, t


def test_a_fault_while_timing_side_by_side_names_the_variant():
    """A CUDA fault ends a process's GPU work and surfaces at the next synchronize: the error says which
    variant was being timed, so the report names the culprit instead of the case."""
    from vtcsearch.codegen.timing import bench_side_by_side
    calls = []

    def faulty():
        calls.append(1)
        if len(calls) > 6:     # warms up and counts, then fails in a timing round
            raise RuntimeError("an illegal memory access was encountered")
    with pytest.raises(RuntimeError, match="while timing bad: an illegal memory access"):
        bench_side_by_side({"good": (lambda: None, True), "bad": (faulty, True)}, device="cpu", rounds=2,
                           rep_ms=1)


@pytest.mark.gpu
def test_gpu_captured_gemm_owns_its_cublas_workspace():
    """A graph captured by ``capture_graph`` keeps working after torch.compile's cudagraph trees free cuBLAS's
    workspaces and the allocator's cache is emptied (what every ``torch.cuda.graph`` does): its GEMM's workspace
    was allocated from the graph's own pool.  A graph that replayed into the process's workspace faulted here
    (an illegal memory access, Llama decode timed beside compile_default on an H100)."""
    from vtcsearch.codegen.timing import capture_graph
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    a = torch.randn(16, 8192, device="cuda", dtype=torch.bfloat16)   # small M, large K: split-K, a workspace
    b = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(16, 4096, device="cuda", dtype=torch.bfloat16)
    graph = capture_graph(lambda: torch.mm(a, b, out=out))
    torch._C._cuda_clearCublasWorkspaces()
    torch.cuda.empty_cache()
    junk = torch.full((256 << 20,), 7, dtype=torch.uint8, device="cuda")   # takes freed memory if any
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, torch.mm(a, b)) and bool((junk == 7).all())


def test_one_timer_and_one_machine_everywhere():
    """The profiling oracle, the baselines and the runner time and describe the machine through codegen.timing."""
    import cost_models.profiling as profiling
    import experiments.baselines as baselines
    import vtcsearch.codegen.timing as timing
    import vtcsearch.run as run
    assert run.machine is timing.machine and baselines.bench is timing.bench
    assert profiling.time_callable is timing.time_callable
    assert not hasattr(baselines, "machine") and not hasattr(run, "machine_info")
    m = timing.machine("cpu")
    assert m["device"] == "cpu" and m["gpu"] is None and m["torch"] == torch.__version__
    calls = []
    assert timing.time_callable(lambda: calls.append(1), "cpu", repeats=4, warmup=1) >= 0 and len(calls) == 5


@pytest.mark.gpu
def test_bench_cuda_graph_replays_on_the_gpu():
    from vtcsearch.codegen.timing import bench
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    x = torch.randn(1 << 24, device="cuda")
    y = torch.empty_like(x)
    g = bench(lambda: y.copy_(x))
    e = bench(lambda: y.copy_(x), cuda_graph=False)
    assert g.method == "cuda_graph" and e.method == "cuda_events" and g.samples >= 10
    assert 0 < g.p20_us <= g.median_us <= g.p80_us and 0 < e.median_us
    assert torch.equal(y, x)


# ---------------------------------------------------------------------------
# one pipeline: what the old benchmark scripts measured, as runner options
# ---------------------------------------------------------------------------
def test_floors_bound_the_modelled_times():
    """A kernel's floor is max(DRAM bytes / bandwidth, FLOPs / peak) at the preset's measured numbers."""
    from vtcsearch.floors import hardware, kernel_floor_us, ratio
    hw = hardware("H200")
    assert kernel_floor_us({"dram_bytes": 4.3e6, "flops": 0.0}, hw, torch.bfloat16) == pytest.approx(1.0)
    assert kernel_floor_us({"dram_bytes": 0.0, "flops": 790e6}, hw, torch.bfloat16) == pytest.approx(1.0)
    assert kernel_floor_us({"dram_bytes": 4.3e6, "flops": 2 * 790e6}, hw, torch.bfloat16) == pytest.approx(2.0)
    assert kernel_floor_us({}, hw, torch.bfloat16) is None and ratio(3.0, None) is None and ratio(3.0, 1.5) == 2.0


def test_reference_baseline_is_not_the_best_baseline():
    """handwritten_compiled is other code: reported with its latency, never the 'best baseline' others beat."""
    from experiments.baselines import BASELINES, REFERENCE_BASELINES
    from vtcsearch.run import finish_rows
    assert set(REFERENCE_BASELINES) <= set(BASELINES) and "handwritten_compiled" in BASELINES
    rows = [{"variant": "vtc_none", "kind": "vtcsearch", "measured_latency_us": 100.0},
            {"variant": "vtc_ilp", "kind": "vtcsearch", "measured_latency_us": 50.0},
            {"variant": "eager", "kind": "baseline", "measured_latency_us": 80.0},
            {"variant": "handwritten_compiled", "kind": "baseline", "measured_latency_us": 40.0},
            {"variant": "vtc_greedy", "kind": "vtcsearch", "measured_latency_us": 60.0,
             "machine": "NVIDIA H100 80GB HBM3 (torch 2.11.0+cu130, triton 3.6.0)"}]
    # a floor of 20 us on the H200 (86 MB at 4.3 TB/s): a row the H100 measured is set against the H100's
    case = {"dtype": "bfloat16",
            "floor": {"floor_bytes": 86e6, "floor_flops": 1e9, "floor_us": 20.0, "hardware": "H200"}}
    finish_rows(rows, measured=True, case=case)
    by = {r["variant"]: r for r in rows}
    assert by["vtc_ilp"]["speedup_vs_best_baseline"] == pytest.approx(80.0 / 50.0)
    assert by["handwritten_compiled"]["speedup_vs_best_baseline"] == pytest.approx(2.0)
    assert by["vtc_ilp"]["x_floor"] == pytest.approx(2.5) and by["vtc_none"]["speedup_vs_none"] == 1.0
    assert by["vtc_greedy"]["floor_us"] == pytest.approx(86e6 / 2.83e12 * 1e6)


def test_speedups_are_against_the_baseline_of_the_same_process():
    """A case run in pieces (--append) holds rows of several runs: a row's speedup is against the baseline its
    own run measured; only a run that measured none is compared across processes, and the row says so."""
    from vtcsearch.run import finish_rows
    old = {"command": "run A", "date": "2026-12-04T10:00"}
    rows = [{"variant": "vtc_ilp", "kind": "vtcsearch", "measured_latency_us": 50.0, **old},
            {"variant": "compile_max_autotune_graph", "kind": "baseline", "measured_latency_us": 100.0, **old},
            {"variant": "vtc_none", "kind": "vtcsearch", "measured_latency_us": 90.0},            # this run's rows
            {"variant": "compile_max_autotune_graph", "kind": "baseline", "measured_latency_us": 80.0},
            {"variant": "vtc_all", "kind": "vtcsearch", "measured_latency_us": 40.0, "command": "run B",
             "date": "2026-12-04T11:00"}]
    finish_rows(rows, measured=True)
    ilp, old_base, none, _, all_ = rows
    assert ilp["speedup_vs_best_baseline"] == pytest.approx(2.0) and ilp["baseline_same_process"] is True
    assert none["speedup_vs_best_baseline"] == pytest.approx(80.0 / 90.0) and none["baseline_same_process"]
    assert all_["speedup_vs_best_baseline"] == pytest.approx(2.0) and all_["baseline_same_process"] is False
    from vtcsearch import report
    assert report._dagger(all_) == " †" and report._dagger(ilp) == ""
    # an earlier run whose baselines were all slower than the best one measured since: against the best, marked
    rows[3]["variant"] = "compile_default"
    for r in rows:
        r["speedup_vs_best_baseline"] = r["baseline_same_process"] = None
    finish_rows(rows, measured=True)
    assert ilp["speedup_vs_best_baseline"] == pytest.approx(80.0 / 50.0) and ilp["baseline_same_process"] is False
    assert old_base["speedup_vs_best_baseline"] == pytest.approx(0.8) and none["baseline_same_process"] is True


def test_variant_names_and_kinds_mean_one_thing():
    from experiments.baselines import BASELINES
    from vtcsearch.schema import VariantKind, solver_of, variant_name
    assert variant_name("ilp") == "vtc_ilp" and solver_of("vtc_all") == "all" and solver_of("eager") is None
    assert not any(b.startswith("vtc_") for b in BASELINES)
    assert json.dumps({"kind": VariantKind.BASELINE}) == '{"kind": "baseline"}' and str(VariantKind.VTCSEARCH) == "vtcsearch"


def test_handwritten_baseline_only_for_llama():
    from experiments.baselines import handwritten_variant
    from experiments.workloads import build_workload
    w = build_workload("shufflenet", size="tiny", device="cpu")
    v = handwritten_variant(w.model, w.example_inputs)
    assert v.build is None and "no hand-written model" in v.skipped
    w = build_workload("llama3", size="tiny", part="attention", device="cpu")
    v = handwritten_variant(w.model, w.example_inputs)
    assert v.skipped is None and v.cuda_graph


def test_onnxruntime_baseline_runs_the_export_in_place_and_refuses_a_kv_cache():
    """The ONNX Runtime baseline (here on its CPU provider) computes what eager does, reads its inputs where they
    are (a new image written into the input tensor is what the next call sees), and refuses a model whose call
    writes a KV cache: an exported ONNX graph has no state, and would time less work."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from experiments.baselines import onnxruntime_builder
    from experiments.workloads import build_workload
    torch.manual_seed(0)
    w = build_workload("shufflenet", size="tiny", device="cpu", dtype=torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        call = onnxruntime_builder(w.model, w.example_inputs, device="cpu")()
    with torch.no_grad():
        torch.testing.assert_close(call()[0], w.model(*w.example_inputs), rtol=1e-4, atol=1e-5)
        x = w.example_inputs[0]
        x.copy_(torch.randn_like(x))
        torch.testing.assert_close(call()[0], w.model(x), rtol=1e-4, atol=1e-5)
    w = build_workload("llama3", size="tiny", part="attention", device="cpu")
    saved = {n: b.clone() for n, b in w.model.named_buffers()}
    with pytest.raises(NotImplementedError, match="buffers"):
        onnxruntime_builder(w.model, w.example_inputs, device="cpu")()
    for n, b in w.model.named_buffers():
        b.copy_(saved[n])


def test_compiled_baselines_share_the_model_state():
    """A torch.compile variant compiles a module object of its own over the model's weights and caches: a deep
    copy of Gemma 2 9B's at batch 16 (41 GB per variant) left no room on the GPU for the others."""
    from experiments.baselines import shared_module
    from experiments.workloads import build_workload
    torch.manual_seed(0)
    w = build_workload("llama3", size="tiny", part="attention", device="cpu")
    m = w.model
    c = shared_module(m)
    assert c is not m and [id(p) for p in c.parameters()] == [id(p) for p in m.parameters()]
    bufs = dict(m.named_buffers())
    assert bufs and all(b is bufs[n] for n, b in c.named_buffers())
    with torch.no_grad():
        before = {n: b.clone() for n, b in bufs.items()}
        out = c(*w.example_inputs)
        assert any(not torch.equal(before[n], b) for n, b in bufs.items())   # its cache write is the model's
        for n, b in bufs.items():
            b.copy_(before[n])
        assert torch.equal(out, m(*w.example_inputs))


def test_steps_and_conv_layers_of_a_realized_block():
    """The GPU tables' code on the CPU (interpreter, perf_counter): one row per step and per conv kernel."""
    from cost_models import get_oracle
    from experiments.workloads import build_workload
    from solvers import get_solver
    from vtcsearch.breakdown import conv_layer_rows, step_rows
    from vtcsearch.codegen.realize import realize
    from vtcsearch.core.capture import capture
    from vtcsearch.core.vtog import build_vtog
    torch.manual_seed(0)
    w = build_workload("vision_block", block="shufflenet_s1", size="tiny", device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = capture(w.model, w.example_inputs)
        s = get_solver("ilp")(build_vtog(g), get_oracle("analytical", hardware="H200")).strategy
        exe = realize(g, s, w.model)
        exe(*w.example_inputs)
        steps = step_rows(exe, {exe.steps[0].name: 1e-3})
        convs = conv_layer_rows(g, exe)
    assert [r["step"] for r in steps] == [st.name for st in exe.steps]
    assert all(r["measured_us"] > 0 and "error" not in r for r in steps)
    assert steps[0]["x_floor"] == pytest.approx(steps[0]["measured_us"] / 1e-3) and steps[-1]["floor_us"] is None
    assert convs and len(convs) == sum(gr.kind == "conv" for gr in g.groups.values())
    for r in convs:
        assert r["error"] is None and r["cudnn_us"] > 0 and r["triton_us"] > 0, r


def test_vision_blocks_config_runs_a_block_on_the_cpu(tmp_path):
    """configs/vision_blocks.yaml, one block, batch 1: none and ILP realized and equal to eager (bits equal to
    each other), the ILP without copies; steps.csv and conv_layers.csv have their headers (GPU-only rows)."""
    import yaml
    from vtcsearch.schema import CONV_FIELDS, STEP_FIELDS
    data = yaml.safe_load((ROOT / "configs" / "vision_blocks.yaml").read_text())
    data["workload"]["cases"] = [{"block": "yolo11n_c3k2"}]
    data["batch_sizes"] = [1]
    data["draw"] = "none"
    # bits equal only where the ILP changed data movement alone: the same kernels for both (an Inductor region
    # the ILP cuts in two may round differently, checked against eager's tolerance elsewhere)
    data["oracle_options"] = {"implementations": ["triton", "library"]}
    cfg = tmp_path / "vision_blocks.yaml"
    cfg.write_text(yaml.safe_dump(data))
    out = tmp_path / "o"
    assert main([str(cfg), "--out", str(out), "--device", "cpu", "--quiet"]) == 0
    s = json.loads((out / "summary.json").read_text())
    num = {n["solver"]: n for n in s["numerics"]}
    assert num["none"]["ok"] and num["ilp"]["ok"] and num["ilp"]["bitwise_equal_none"] is True
    assert num["ilp"]["copy_kernels"] == 0 < num["none"]["copy_kernels"]
    assert s["cases"][0]["floor"]["floor_us"] > 0
    with open(out / "steps.csv") as f:
        assert tuple(next(csv.reader(f)))[:len(STEP_FIELDS)] == STEP_FIELDS
    with open(out / "conv_layers.csv") as f:
        assert tuple(next(csv.reader(f)))[:len(CONV_FIELDS)] == CONV_FIELDS
    assert "yolo11n_c3k2" in (out / "report.md").read_text()


@pytest.mark.parametrize("module, forbidden", [("vtcsearch.api", "vtcsearch.run"), ("vtcsearch.report", "vtcsearch.run"),
                                               ("vtcsearch.schema", "vtcsearch.report")])
def test_layers_do_not_import_the_runner(module, forbidden):
    """The library facade and the report import nothing from the command-line runner (no run <-> report cycle)."""
    import subprocess
    import sys
    code = f"import sys, {module}; sys.exit(1 if {forbidden!r} in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0
    # and no lazy import inside a function either
    import ast
    tree = ast.parse((ROOT / (module.replace(".", "/") + ".py")).read_text())
    short = forbidden.split(".")[-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            names = [node.module or ""] + [f"{node.module or ''}.{a.name}" for a in node.names]
            assert not any(n.split(".")[-1] == short or n == forbidden for n in names if n), ast.unparse(node)
        elif isinstance(node, ast.Import):
            assert not any(a.name == forbidden for a in node.names), ast.unparse(node)


def test_cases_option_picks_a_subset_and_rejects_unknown(tmp_path, capsys, monkeypatch):
    """--cases runs a config in pieces (with --append); an unknown label is a one-line ConfigError."""
    import vtcsearch.run
    seen = {}

    def fake_run(cfg, **kw):
        seen["cases"] = cfg.workload.cases
        raise vtcsearch.run.ConfigError("stop here")
    monkeypatch.setattr(vtcsearch.run, "run_config", fake_run)
    cfg = str(ROOT / "configs" / "vision_blocks.yaml")
    assert main([cfg, "--out", str(tmp_path / "o"), "--device", "cpu", "--cases", "litemla,yolo11n_c3k2"]) == 2
    assert seen["cases"] == [{"block": "litemla"}, {"block": "yolo11n_c3k2"}]
    capsys.readouterr()
    assert main([cfg, "--out", str(tmp_path / "o"), "--device", "cpu", "--cases", "yolo"]) == 2
    err = _err_line(capsys)
    assert "--cases" in err and "yolo11s_c3k2" in err


def test_runner_prepares_the_profiling_oracle_before_searching(tmp_path, monkeypatch):
    """With a profiling oracle the runner calls its ``prepare`` (parallel precompile) once per case, before any
    solver measures, logs its counts and puts them in the case record."""
    from cost_models.profiling import ProfilingOracle
    calls = []
    original = ProfilingOracle.prepare

    def spy(self, vtog, *a, **kw):
        calls.append(self.stats.measurements)       # nothing measured yet
        return original(self, vtog, *a, max_trees=4, max_configs=16)

    monkeypatch.setattr(ProfilingOracle, "prepare", spy)
    cfg = TINY.read_text().replace("oracle: auto", "oracle: profiling\noracle_options: {repeats: 1, warmup: 0}")
    cfg = cfg.replace("solvers: [none, greedy, ilp]", "solvers: [none, greedy]").replace("enabled: true", "enabled: false")
    path = tmp_path / "tiny_profiling.yaml"
    path.write_text(cfg)
    out = tmp_path / "out"
    assert main([str(path), "--out", str(out), "--device", "cpu", "--quiet"]) == 0
    assert calls == [0]
    s = json.loads((out / "summary.json").read_text())
    rep = s["cases"][0]["prepare"]["profiling"]
    assert rep["candidates"] > 0 and rep["to_measure"] == rep["candidates"] - rep["cached"]
    assert rep["workers"] == 0 and "fallback" in rep          # the CPU reference timer has no compile step
    assert "prepare (profiling" in (out / "log.txt").read_text()


def test_compile_shufflenet_with_the_ilp_equals_eager():
    """The held-out check of issue 13 at CI size: a whole ShuffleNetV2-like model (every stage, channel split,
    concat and shuffle) through ``vtcsearch.compile`` with the default ILP.  Its configuration space is
    priced by the analytical oracle in seconds (the unmemoized cost queries took minutes on a torchvision
    x0.5 at 32x32); kept small, as pytest-timeout is not installed."""
    from experiments.workloads import build_workload
    torch.manual_seed(0)
    w = build_workload("shufflenet", size="tiny", device="cpu", resolution=32)
    c = vtcsearch.compile(w.model, w.example_inputs, solver="ilp")
    assert c.result.status in ("optimal", "feasible", "greedy_incumbent")
    assert c.result.info["configurations"] > 1000
    with torch.no_grad():
        got, ref = c(*w.example_inputs), w.model(*w.example_inputs)
    assert torch.allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_half_precision_numerics_judged_against_fp32():
    """Beyond allclose of eager, a half-precision output passes only when it is no further from an fp32 run than
    eager's own rounding allows; a wrong answer still fails."""
    import torch
    from types import SimpleNamespace

    from vtcsearch.config import NumericsConfig
    from vtcsearch.run import NumericsCopy

    copy = NumericsCopy.__new__(NumericsCopy)
    copy.ctx = SimpleNamespace(cfg=SimpleNamespace(numerics=NumericsConfig(rtol=1e-3, atol=1e-3)))
    copy.device = torch.device("cpu")
    torch.manual_seed(0)
    ref32 = torch.randn(4096) * 30
    eager = ref32.half()
    other = (ref32 + torch.randn(4096) * 0.01).half()      # rounds differently: off eager beyond 1e-3
    assert not torch.allclose(other.float(), eager.float(), rtol=1e-3, atol=1e-3)
    assert copy._close(other, eager, ref32)
    wrong = eager.clone()
    wrong[7] += 4
    assert not copy._close(wrong, eager, ref32)
    assert not copy._close(other, eager, None)              # no fp32 reference: allclose decides


def _fp32_reference_round_trip(device: str):
    """Build a tiny bf16 Llama layer on ``device``, take its fp32 reference, and check that the model is back."""
    import torch
    from types import SimpleNamespace

    from experiments.workloads import build_workload
    from vtcsearch.run import NumericsCopy, host_copy

    torch.manual_seed(0)
    w = build_workload("llama3", size="tiny", batch=1, part="layer", phase="decode", dtype=torch.bfloat16,
                       device=device)
    before = {n: (t.device, host_copy(t)) for n, t in [*w.model.named_parameters(), *w.model.named_buffers()]}
    copy = NumericsCopy.__new__(NumericsCopy)
    lines: list[str] = []
    copy.ctx = SimpleNamespace(log=lines.append)
    copy.w, copy.dtype, copy.device = w, torch.bfloat16, torch.device(device)
    copy.saved = {n: host_copy(b) for n, b in w.model.named_buffers()}
    ref32, bufs32 = copy._fp32_reference()
    after = dict([*w.model.named_parameters(), *w.model.named_buffers()])
    assert all(after[n].device == dev and after[n].dtype == t.dtype and torch.equal(after[n].cpu(), t)
               for n, (dev, t) in before.items())
    with torch.no_grad():
        eager = w.model(*w.example_inputs).cpu()
    assert ref32[0].dtype == torch.float32 and not torch.equal(ref32[0], eager.float())
    assert torch.allclose(ref32[0], eager.float(), rtol=0.05, atol=0.05)
    assert any(not torch.equal(bufs32[n].to(copy.saved[n].dtype), copy.saved[n]) for n in bufs32)  # it wrote
    return lines


def test_the_fp32_reference_runs_the_model_itself_and_puts_it_back():
    """The fp32 reference converts the model in place and back (so the GPU needs room for the fp32 version only,
    not a copy beside it): afterwards every parameter and buffer has its dtype and its bits, the KV cache the
    fp32 run wrote included, and the reference is fp32's answer, not eager's."""
    _fp32_reference_round_trip("cpu")


@pytest.mark.gpu
def test_an_fp32_reference_with_no_room_on_the_gpu_runs_on_the_host(monkeypatch):
    """A GPU without room for the fp32 model (Gemma 2 9B at batch 16 on an 80 GB H100) takes the reference on
    the host; the model comes back to the GPU in its own dtype and bits."""
    import torch
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    total = torch.cuda.mem_get_info()[1]
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (0, total))
    assert any("on the host" in line for line in _fp32_reference_round_trip("cuda"))


# ---------------------------------------------------------------------------
# issue 15: whole-model configs run in pieces
# ---------------------------------------------------------------------------
def test_append_merges_a_case_run_in_pieces(tmp_path):
    """The solvers of a case in one call (``--baselines -``), its baselines in another (``--solvers -``):
    every row of both pieces is in the folder, speedups recomputed over the merged rows, the case's record
    (best solver, model bytes) kept."""
    out = tmp_path / "pieces"
    base = [str(TINY), "--out", str(out), "--device", "cpu", "--quiet", "--append"]
    assert main(base + ["--solvers", "none,greedy", "--baselines", "-"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert {r["variant"] for r in s["rows"]} == {"vtc_none", "vtc_greedy"}
    best = s["cases"][0]["best_solver"]
    assert best in ("none", "greedy")
    assert main(base + ["--solvers", "-"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert {r["variant"] for r in s["rows"]} == {"vtc_none", "vtc_greedy", "eager", "eager_cudagraphs",
                                                 "compile_default"}
    assert len(s["cases"]) == 1 and s["cases"][0]["best_solver"] == best
    greedy = next(r for r in s["rows"] if r["variant"] == "vtc_greedy")
    assert greedy["speedup_vs_none"] is not None and greedy["predicted_latency_us"] is not None
    assert [r["command"].split("--solvers")[-1].split()[0] for r in s["runs"]] == ["none,greedy", "-"]
    with open(out / "kernels.csv") as f:
        assert {row["variant"] for row in csv.DictReader(f)} == {"vtc_none", "vtc_greedy"}


def test_case_records_model_bytes(tiny_run):
    """Each case records its parameters + buffers (weights, KV cache), the part of the peak that is not
    activations."""
    from experiments.baselines import model_bytes
    from experiments.workloads import build_workload
    _, out = tiny_run
    s = json.loads((out / "summary.json").read_text())
    w = build_workload("llama3", size="tiny", batch=1, part="attention", phase="decode", dtype=torch.bfloat16)
    assert s["cases"][0]["model_bytes"] == model_bytes(w.model) > 0


def test_a_baseline_records_its_build_time():
    """run_variant times the build and the first call (torch.compile compiles lazily, on that call)."""
    import time as _time

    from experiments.baselines import Variant, run_variant

    def build():
        _time.sleep(0.05)
        return lambda: _time.sleep(0.02)
    m, _ = run_variant(Variant("slow", build), profile=False)
    assert m.skipped is None and 0.07 <= m.build_s < 5


def test_a_case_may_restrict_its_batch_sizes(tmp_path):
    """``batch_sizes`` inside a case (prefill at batch 1 only) runs it at those, a subset of the config's."""
    text = tiny_text().replace("batch_sizes: [1]", "batch_sizes: [1, 2]").replace(
        "  params: {part: attention, phase: decode}\n",
        "  params: {part: attention}\n  cases:\n    - {phase: decode}\n    - {phase: prefill, batch_sizes: [1]}\n")
    cfg = load_config(write(tmp_path, text))
    assert cfg.workload.cases == [{"phase": "decode"}, {"phase": "prefill"}]
    assert cfg.workload.batches_of(0, cfg.batch_sizes) == [1, 2] and cfg.workload.batches_of(1, [1, 2]) == [1]
    out = tmp_path / "o"
    text = text.replace("  enabled: true", "  enabled: false")
    assert main([str(write(tmp_path, text)), "--out", str(out), "--device", "cpu", "--quiet", "--solvers", "none",
                 "--baselines", "-"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert [(c["case"], c["batch"]) for c in s["cases"]] == [("decode", 1), ("decode", 2), ("prefill", 1)]
    assert main([str(write(tmp_path, text)), "--out", str(out), "--device", "cpu", "--quiet", "--solvers", "none",
                 "--baselines", "-", "--cases", "prefill", "--batch", "2", "--append"]) == 2   # prefill: bs 1 only
    s = json.loads((out / "summary.json").read_text())
    assert len(s["cases"]) == 3          # untouched


@pytest.mark.parametrize("case,words", [
    ("{phase: prefill, batch_sizes: [4]}", "[4] not in the config's batch_sizes"),
    ("{phase: prefill, batch_sizes: 1}", "expected a non-empty list of integers"),
    ("{phase: prefill, batch_sizes: []}", "expected a non-empty list of integers"),
])
def test_bad_case_batch_sizes_are_one_line(tmp_path, case, words):
    text = tiny_text().replace("  params: {part: attention, phase: decode}\n",
                               f"  params: {{part: attention}}\n  cases:\n    - {case}\n")
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_config(p)
    msg = str(e.value)
    assert "\n" not in msg and "workload.cases[0].batch_sizes" in msg and words in msg, msg


def test_a_solver_entry_can_name_its_objective(tmp_path, capsys):
    """``greedy:mix`` beside ``greedy``: the same search under the mix objective (the memory-objective run),
    its own variant; an unknown objective is a one-line error."""
    out = tmp_path / "o"
    text = tiny_text() + "seconds_per_gib: 1.0e+6\n"
    assert main([str(write(tmp_path, text)), "--out", str(out), "--device", "cpu", "--quiet",
                 "--solvers", "none,greedy,greedy:mix", "--baselines", "-"]) == 0
    s = json.loads((out / "summary.json").read_text())
    rows = {r["variant"]: r for r in s["rows"]}
    assert rows["vtc_greedy:mix"]["status"] == "ok"
    # the mix objective prices memory: its objective is not the latency
    assert rows["vtc_greedy:mix"]["objective"] > rows["vtc_greedy:mix"]["predicted_latency_us"] * 1e-6 * 1.5
    assert rows["vtc_greedy"]["objective"] == pytest.approx(rows["vtc_greedy"]["predicted_latency_us"] * 1e-6)
    assert s["cases"][0]["best_solver"] != "greedy:mix"
    assert main([str(TINY), "--solvers", "ilp:speed", "--out", str(tmp_path / "x")]) == 2
    assert "--solvers[0]: unknown objective 'speed' in 'ilp:speed'" in capsys.readouterr().err


def test_whole_model_configs_load():
    """The five whole models: LLMs decode at batch 1 and 16, prefill at batch 1; a memory-objective entry."""
    for n in ("llama3_8b", "gemma2_9b"):
        cfg = load_config(ROOT / "configs" / f"{n}.yaml")
        assert cfg.workload.params["part"] == "model" and cfg.workload.params["context"] == 4096
        assert [cfg.workload.batches_of(i, cfg.batch_sizes) for i in range(2)] == [[1, 16], [1]]
    for n in ("llama3_8b", "gemma2_9b", "efficientvit", "yolo11", "shufflenet"):
        cfg = load_config(ROOT / "configs" / f"{n}.yaml")
        assert cfg.oracle_options["implementations"] == ["inductor", "library", "triton"]
        assert {"none", "greedy", "ilp", "ilp:mix"} <= set(cfg.solvers) and cfg.batch_sizes == [1, 16]


@pytest.mark.parametrize("none_faster", [True, False])
def test_compile_guard_keeps_the_faster_of_search_and_none(monkeypatch, none_faster):
    """compile(guard=True) times the search's executable beside the all-physical one and keeps the faster: a
    strategy the oracle mispriced never makes the model slower than compiling it without virtual tensors."""
    import vtcsearch.api as api
    torch.manual_seed(0)
    m = Small().eval()
    x, y = torch.randn(4, 16), torch.randn(1, 16)
    with torch.no_grad():
        ref = m(x, y)
    times = {"search": 200.0, "none": 100.0} if none_faster else {"search": 100.0, "none": 200.0}
    monkeypatch.setattr(api, "time_executables", lambda exes, model, inputs, cuda_graph: times)
    fast = vtcsearch.compile(m, (x, y), solver="ilp", guard=True)
    assert fast.guard is not None and fast.guard["search_us"] is not None, "the search chose none: nothing to decide"
    assert fast.guard["kept"] == ("none" if none_faster else "search")
    assert (fast.result.solver == "none") == none_faster
    assert bool(fast.strategy.edges) != none_faster
    for o, r in zip(fast(x, y), ref):
        torch.testing.assert_close(o, r, rtol=1e-4, atol=1e-5)
    monkeypatch.undo()      # the real timer: both executables, side by side
    us = api.time_executables({"kept": fast.executable, "again": fast.executable}, m, (x, y))
    assert set(us) == {"kept", "again"} and min(us.values()) > 0


def test_a_strategy_two_solvers_share_is_built_and_timed_once(monkeypatch):
    """The side-by-side timing fills the row of a solver whose strategy an earlier solver's repeats (``inductor``
    is ``none`` wherever the model prices every group cheapest on Inductor) from that row: one build, one timing."""
    from types import SimpleNamespace
    import vtcsearch.codegen.timing as timing
    from vtcsearch.run import time_side_by_side
    timed = []

    def fake_bench(ready, rounds):
        timed.append(sorted(ready))
        return {k: SimpleNamespace(median_us=100.0, p20_us=99.0, p80_us=101.0, samples=5) for k in ready}

    monkeypatch.setattr(timing, "bench_side_by_side", fake_bench)
    ctx = SimpleNamespace(cfg=SimpleNamespace(timing_rounds=3), log=lambda *a: None)
    rows = {v: {"variant": v, "kind": "vtcsearch"} for v in ("vtc_none", "vtc_inductor")}
    rows["vtc_none"].update(status="ok", kernels=12, numerics_ok=True)
    time_side_by_side(ctx, {"vtc_none": (lambda: None, True)}, rows, lambda: None, {"inductor": "none"})
    assert timed == [["vtc_none"]]
    assert rows["vtc_inductor"]["measured_latency_us"] == 100.0 and rows["vtc_inductor"]["status"] == "ok"
    assert rows["vtc_inductor"]["kernels"] == 12 and "vtc_none" in rows["vtc_inductor"]["reason"]


def test_compile_guard_keeps_torch_compiles_program_where_it_is_fastest(monkeypatch):
    """With Inductor allowed, the guard also times the all-Inductor executable (the ``inductor`` solver's, what
    torch.compile runs) and keeps it where it measures fastest: never slower than torch.compile."""
    import vtcsearch.api as api
    torch.manual_seed(0)
    m = Small().eval()
    x, y = torch.randn(4, 16), torch.randn(1, 16)
    with torch.no_grad():
        ref = m(x, y)
    timed = []

    def fake(exes, model, inputs, cuda_graph):
        timed.append(sorted(exes))
        return {k: {"search": 200.0, "none": 150.0, "inductor": 100.0}[k] for k in exes}

    import solvers
    from cost_models import get_oracle
    real = solvers.get_solver
    # ``none`` on this model is already all Inductor: made all-Triton here, so the three strategies differ
    triton_none = lambda v, o, seed=0: real("none")(v, get_oracle("analytical", hardware="H200"), seed=seed)
    monkeypatch.setattr(solvers, "get_solver", lambda n: triton_none if n == "none" else real(n))
    monkeypatch.setattr(api, "time_executables", fake)
    fast = vtcsearch.compile(m, (x, y), solver="all", guard=True, implementations=("triton", "inductor"))
    assert timed == [["inductor", "none", "search"]], timed
    assert fast.guard["kept"] == "inductor" and fast.result.solver == "inductor"
    assert not fast.strategy.edges and set(fast.strategy.impl.values()) == {"inductor"}
    for o, r in zip(fast(x, y), ref):
        torch.testing.assert_close(o, r, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name, movement", [
    ("triton_poi_fused_clone_0", True),                                  # Inductor: a fused copy only
    ("triton_poi_fused_cat_3", True),
    ("triton_poi_fused__to_copy_1", True),                               # a dtype cast alone
    ("triton_poi_fused_index_copy_5", True),
    ("triton_poi_fused_stack_6", True),
    ("triton_poi_fused_constant_pad_nd_permute_12", True),
    ("void at::native::elementwise_kernel<128, 2, direct_copy_kernel_cuda>", True),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_2", False),      # RMSNorm with its casts: compute
    ("triton_poi_fused__to_copy_add_mul_0", False),
    ("triton_poi_fused_mul_silu_9", False),
    ("triton_poi_fused_addmm_cat_2", False),
    ("triton_tem_fused_mm_0", False),
    ("triton_per_fused__softmax_4", False),
    ("sm90_xmma_gemm_bf16bf16_bf16f32", False),
    ("nvjet_tst_64x8_64x16_4x1_v_bz_splitK_TNT", False),                 # cuBLAS split-K GEMM ("split")
    ("void splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, true, false, false>", False),
    ("void gemv2T_kernel_val<int, int, __nv_bfloat16, __nv_bfloat16, float, 128, 16, 4, 4, false, false>", False),
])
def test_movement_kernel_names(name: str, movement: bool) -> None:
    """Figure 12's data-movement time comes from this classification: Inductor fuses copies into compute kernels
    and names them after every op, so a name containing 'copy' is not enough."""
    from experiments.baselines import is_movement_kernel

    assert is_movement_kernel(name) is movement


def test_profiled_kernels_are_kept_and_the_costliest_reported(monkeypatch):
    """profile_kernels hands back every kernel it profiled (profile.csv), and the report lists each variant's
    costliest, marking those that only move data: what a missed target is explained with."""
    import experiments.baselines as baselines
    from vtcsearch.report import profile_section
    times = {"triton_poi_fused_clone_0": (1.0, 9.0), "gemm_kernel": (2.0, 30.0), "attn_kernel": (1.0, 3.0)}
    monkeypatch.setattr(baselines, "kernel_times", lambda fn, iters=5: times)
    n, mv, mv_us, comp_us, got = baselines.profile_kernels(lambda: None)
    assert (n, mv, mv_us, comp_us) == (4, 1, 9.0, 33.0) and got == times
    rows = [{"case": "c", "batch": 1, "variant": "vtc_ilp", "kernel": k, "calls": c, "us": us,
             "movement": baselines.is_movement_kernel(k)} for k, (c, us) in got.items()]
    lines = profile_section({"profile": rows}, top=2)
    body = [line for line in lines if line.startswith("| c |") or line.startswith("| | |")]
    assert len(body) == 2 and "`gemm_kernel`" in body[0] and "| c | 1 | vtc_ilp | 4 |" in body[0]
    assert "`triton_poi_fused_clone_0` *movement*" in body[1] and "| 21% |" in body[1]
    assert profile_section({"profile": []}) == []


def test_a_report_built_on_several_gpus_names_them_all():
    """A folder built in pieces (``--append``) may hold rows measured on an H200 and on an H100: the report's
    first line names both, not the last piece's GPU (the zoo's said H100 for 27 H200 rows)."""
    from vtcsearch.report import markdown
    summary = json.loads((Path(__file__).parent.parent / "results" / "zoo" / "summary.json").read_text())
    gpus = {r["machine"]["gpu"] for r in summary["runs"]}
    assert len(gpus) > 1
    head = next(line for line in markdown(summary).splitlines() if line.startswith("Latencies are"))
    assert all(gpu in head for gpu in gpus), head
    one = dict(summary, runs=[r for r in summary["runs"] if r["machine"]["gpu"] == summary["machine"]["gpu"]])
    head = next(line for line in markdown(one).splitlines() if line.startswith("Latencies are"))
    assert head.startswith(f"Latencies are **measured** on {summary['machine']['gpu']} (median")


def _profiling_case(tmp_path, device: str, **oracle_options):
    """The tiny config searched with the profiling oracle on ``device``: (run context, case params, VTOG)."""
    import dataclasses as dc

    import vtcsearch.run as run
    from experiments.workloads import build_workload
    from vtcsearch.config import load_config
    from vtcsearch.core.vtog import build_vtog

    cfg = dc.replace(load_config(TINY), oracle="profiling", solvers=["none", "ilp"], oracle_options=oracle_options)
    ctx = run.RunContext(cfg, device, tmp_path, False, run.Log(quiet=True))
    ctx.oracle = run.make_oracle(ctx)
    params = dict(cfg.workload.cases[0])
    w = build_workload(cfg.workload.name, size=cfg.workload.size, batch=1, device="meta" if device == "cpu"
                       else device, **{**cfg.workload.params, **params})
    return ctx, params, build_vtog(run.capture_graph(cfg, w))


def test_a_compile_process_ends_when_its_runner_is_killed(tmp_path):
    """A spawned compile process leads its own process group, so the SIGKILL of a runner past its deadline
    does not reach it: it watches its parent and ends itself and its group (:func:`end_with_parent`)."""
    import os
    import signal
    import subprocess
    import sys
    import time
    if not os.path.isdir("/proc/self"):
        pytest.skip("needs Linux (process groups, /proc)")
    child = ("import os, time; os.setsid(); from vtcsearch.run import end_with_parent; end_with_parent(0.05); "
             "import subprocess, sys; g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
             "print(os.getpid(), g.pid, flush=True); time.sleep(60)")
    runner = ("import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', sys.argv[1]]); "
              "time.sleep(60)")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    parent = subprocess.Popen([sys.executable, "-c", runner, child], stdout=subprocess.PIPE, text=True, env=env)
    pids = [int(x) for x in parent.stdout.readline().split()]   # the compile process and what it started
    assert len(pids) == 2, "the stand-in compile process did not start"
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()

    def alive(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().split(") ")[-1][0] != "Z"
        except FileNotFoundError:
            return False
    t0 = time.monotonic()
    while any(alive(p) for p in pids) and time.monotonic() - t0 < 20:
        time.sleep(0.1)
    assert not any(alive(p) for p in pids)


def test_a_gpu_run_precompiles_in_a_spawned_process(tmp_path, monkeypatch):
    """On the GPU the profiling oracle's compile workers cannot fork; the runner then prepares
    the case in spawned processes that each capture it on the meta device, count the same candidates as
    this process would and compile a share of them (together, each once).  Processes that fail leave a note
    and the in-process fallback."""
    import vtcsearch.run as run

    ctx, params, vtog = _profiling_case(tmp_path, "cpu")
    here = run.prepare_oracles(ctx, vtog)["profiling"]
    monkeypatch.setattr(run, "_gpu_run", lambda ctx: True)     # as on the GPU path (not in the child)
    there = run.prepare_oracles(ctx, vtog, (params, 1))["profiling"]
    assert there["process"] == "spawned" and "process" not in here
    assert there["candidates"] == here["candidates"] > 0
    assert there["processes"] == min(os.cpu_count() or 1, 16)   # (the CPU reference timer compiles nothing)
    bad = run.prepare_oracles(ctx, vtog, ({**params, "part": "no such part"}, 1))["profiling"]
    assert "process" not in bad and bad["candidates"] == here["candidates"]
    assert "precompiling in spawned processes failed" in ctx.notes[-1] and "part" in ctx.notes[-1]


@pytest.mark.gpu
def test_a_gpu_run_precompiles_real_kernels_in_the_spawned_process(tmp_path):
    """On the GPU, with CUDA initialized here: the case's candidate kernels compile in the spawned processes,
    and the timing that follows finds them compiled (no oracle errors)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    import vtcsearch.run as run
    from vtcsearch.core.strategy import Strategy

    torch.zeros(1, device="cuda")   # as the runner: the workload is on the GPU before the search
    ctx, params, vtog = _profiling_case(tmp_path, "cuda")
    rep = run.prepare_oracles(ctx, vtog, (params, 1))["profiling"]
    assert rep["process"] == "spawned" and rep["workers"] > 1, rep
    assert rep["compiled"] == rep["to_measure"] > 0 and rep["failed"] == 0, rep
    ev = ctx.oracle.evaluate(Strategy(vtog, []))
    assert math.isfinite(ev.objective) and ctx.oracle.stats.errors == 0


def test_measured_guard_times_the_pick_against_none(monkeypatch):
    """The runner's guard (GPU runs only) with the timing replaced: it times exactly the pick and ``vtc_none``,
    restores the buffers after, and keeps ``none`` only where it measured faster."""
    from types import SimpleNamespace
    import vtcsearch.codegen.timing as timing
    from vtcsearch.run import measured_guard
    timed, restored = [], []

    def fake_bench(ready, rounds):
        timed.append(sorted(ready))
        return {k: SimpleNamespace(median_us={"vtc_ilp": 110.0, "vtc_none": 100.0}[k]) for k in ready}

    monkeypatch.setattr(timing, "bench_side_by_side", fake_bench)
    ctx = SimpleNamespace(cfg=SimpleNamespace(timing_rounds=3), log=lambda *a: None)
    ready = {v: (lambda: None, True) for v in ("vtc_ilp", "vtc_none", "compile_max_autotune_graph")}
    rec = measured_guard(ctx, ready, "ilp", lambda: restored.append(1))
    assert timed == [["vtc_ilp", "vtc_none"]] and restored == [1]
    assert rec == {"solver": "ilp", "search_us": 110.0, "none_us": 100.0, "kept": "none"}
    assert measured_guard(ctx, ready, "none", lambda: None) is None          # nothing to guard
    assert measured_guard(ctx, {"vtc_ilp": ready["vtc_ilp"]}, "ilp", lambda: None) is None   # none not built
    assert measured_guard(ctx, ready, "ilp", lambda: None, same=["none"])["kept"] == "ilp"
    assert len(timed) == 1
    # with the all-Inductor reference built too (torch.compile's program), the fastest of the three is kept
    ready["vtc_inductor"] = (lambda: None, True)
    monkeypatch.setattr(timing, "bench_side_by_side", lambda ready, rounds: {
        k: SimpleNamespace(median_us={"vtc_ilp": 110.0, "vtc_none": 100.0, "vtc_inductor": 90.0}[k]) for k in ready})
    rec = measured_guard(ctx, ready, "ilp", lambda: None)
    assert rec == {"solver": "ilp", "search_us": 110.0, "none_us": 100.0, "inductor_us": 90.0, "kept": "inductor"}
    assert measured_guard(ctx, ready, "ilp", lambda: None, same=["none"])["kept"] == "inductor"
    assert measured_guard(ctx, ready, "inductor", lambda: None) is None


def test_measure_top_reaches_the_profiling_oracle_and_not_an_analytical_entry(tmp_path):
    """``oracle_options.measure_top`` configures the profiling oracle (ranked by the config's hardware model);
    an ``ilp@analytical`` entry of the same run builds its analytical oracle without it."""
    ctx, _, vtog = _profiling_case(tmp_path, "cpu", measure_top=3)
    assert ctx.oracle.name == "profiling" and ctx.oracle.measure_top == 3 and ctx.oracle._model is not None
    assert 0 < len(ctx.oracle.candidate_specs(vtog))
    assert ctx.oracle_for("ilp@analytical").name == "analytical"


def test_the_profiling_oracle_measures_the_top_configurations_unless_a_config_asks_for_all(tmp_path):
    """Without ``measure_top`` the runner's profiling oracle times the model's top ``DEFAULT_MEASURE_TOP``
    configurations per unit (a whole model lists thousands of candidate kernels otherwise); ``measure_top:
    null`` times every one."""
    from cost_models.profiling import DEFAULT_MEASURE_TOP
    ctx, _, vtog = _profiling_case(tmp_path / "a", "cpu")
    assert ctx.oracle.measure_top == DEFAULT_MEASURE_TOP and ctx.oracle._model is not None
    every, _, _ = _profiling_case(tmp_path / "b", "cpu", measure_top=None)
    assert every.oracle.measure_top is None and every.oracle._model is None
    assert len(ctx.oracle.candidate_specs(vtog)) <= len(every.oracle.candidate_specs(vtog))


def test_numerics_check_runs_a_strategy_that_differs_only_in_its_implementations(monkeypatch):
    """``inductor`` has ``none``'s edges and other kernels: its numerics are checked on its own executable, not
    copied from ``none``'s row (a wrong answer of Inductor's kernels would hide behind it)."""
    import torch
    from types import SimpleNamespace

    import vtcsearch.codegen.realize as realize_mod
    from vtcsearch.config import NumericsConfig
    from vtcsearch.run import NumericsCopy

    x = torch.randn(8)
    built: list[dict] = []

    class Exe:      # Inductor's kernels give a wrong answer here
        def __init__(self, graph, strategy, model):
            built.append(dict(strategy.impl))
            self.wrong = "inductor" in strategy.impl.values()

        def __call__(self, *inputs):
            return [x + 1 if self.wrong else x.clone()]

        def summary(self):
            return {"kernels": 1, "copy_kernels": 0, "fallbacks": []}

    monkeypatch.setattr(realize_mod, "realize", Exe)
    copy = NumericsCopy.__new__(NumericsCopy)
    copy.ctx = SimpleNamespace(cfg=SimpleNamespace(numerics=NumericsConfig(rtol=1e-3, atol=1e-3)))
    copy.size, copy.batch, copy.dtype, copy.device = "tiny", 1, torch.float32, torch.device("cpu")
    copy.w = SimpleNamespace(model=torch.nn.Module(), example_inputs=())
    copy.graph, copy.ref, copy.ref_bufs, copy.ref32, copy.ref32_bufs = None, [x], {}, None, {}
    copy.saved, copy.by_strategy, copy.none_outs = {}, {}, None
    none = copy.check_exe("none", SimpleNamespace(edges=frozenset(), impl={"g0": "triton"}))
    again = copy.check_exe("greedy", SimpleNamespace(edges=frozenset(), impl={"g0": "triton"}))
    ind = copy.check_exe("inductor", SimpleNamespace(edges=frozenset(), impl={"g0": "inductor"}))
    assert none["ok"] and again["same_strategy_as"] == "none" and len(built) == 2
    assert ind["ok"] is False and not ind.get("same_strategy_as")


def test_a_variant_that_replays_its_own_graph_counts_what_a_plain_call_allocates(monkeypatch):
    """A vtcsearch executable is measured as replays of the CUDA graph it captured: a replay allocates nothing,
    and what its Inductor regions and library calls allocate per call sits in the graph's pool, outside
    ``memory_allocated``.  Its peak takes the bytes of a plain call (``call_bytes``), as a baseline's plain call
    counts its intermediates; without them it held the executable's slab alone (whole EfficientViT: 1.3 MiB)."""
    from types import SimpleNamespace

    import experiments.baselines as bl
    from experiments.baselines import Measurement, Variant, run_variant

    mem = {"now": 0, "peak": 0}

    def alloc(n):
        mem["now"] += n
        mem["peak"] = max(mem["peak"], mem["now"])

    fake = SimpleNamespace(is_available=lambda: True, synchronize=lambda: None,
                           memory_allocated=lambda: mem["now"], max_memory_allocated=lambda: mem["peak"],
                           reset_peak_memory_stats=lambda: mem.update(peak=mem["now"]))
    monkeypatch.setattr(bl.torch, "cuda", fake)
    monkeypatch.setattr(bl, "warm_streams", lambda: None)
    monkeypatch.setattr(bl, "measure", lambda name, fn, **kw: Measurement(name))
    MiB = 2 ** 20

    def build():
        alloc(3 * MiB)               # the executable's slab, held
        return lambda: None          # a graph replay: allocates nothing
    replayed, _ = run_variant(Variant("vtc_x", build, own_bytes=lambda: 3 * MiB))
    counted, _ = run_variant(Variant("vtc_y", build, own_bytes=lambda: 3 * MiB, call_bytes=lambda: 40 * MiB))
    assert replayed.peak_memory_bytes == 3 * MiB
    assert counted.peak_memory_bytes == 43 * MiB

"""vtcsearch.evaluation: the paper's tables from a fake pair of runner folders (issue 15)."""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from vtcsearch.evaluation import EXPECTED, PAPER, evaluate, main
from vtcsearch.schema import ROW_FIELDS

MIB = 2 ** 20


def row(case, batch, variant, us, peak_mib, *, kind="baseline", solver=None, mv_us=0.0, mv_k=0, build_s=None,
        status="ok", **kw):
    r = {f: None for f in ROW_FIELDS}
    r.update(case=case, batch=batch, variant=variant, kind=kind, solver=solver, status=status,
             measured_latency_us=us, latency_us=us, measured_peak_bytes=int(peak_mib * MIB), movement_us=mv_us,
             movement_kernels=mv_k, compute_us=100.0, kernels=10, build_s=build_s, **kw)
    return r


def vtc(case, batch, solver, us, peak_mib, **kw):
    return row(case, batch, f"vtc_{solver}", us, peak_mib, kind="vtcsearch", solver=solver,
               predicted_latency_us=us * 0.9, predicted_activation_peak_bytes=int(peak_mib * MIB), **kw)


def folder(tmp: Path, name: str, workload: str, cases: list[dict], rows: list[dict], measured=True) -> Path:
    d = tmp / name
    d.mkdir()
    (d / "summary.json").write_text(json.dumps({
        "schema_version": 1, "name": name, "measured": measured, "config": {"workload": {"name": workload}},
        "cases": cases, "rows": rows, "runs": []}))
    return d


def case(label, batch, best, model_mib, **kw):
    return {"case": label, "batch": batch, "best_solver": best, "model_bytes": int(model_mib * MIB),
            "capture_s": 3.0, "vtog_s": 1.0, "error": None, **kw}


@pytest.fixture
def folders(tmp_path):
    llama = folder(tmp_path, "llama3_8b", "llama3", [case("decode", 1, "ilp", 1000, floor={"floor_us": 400.0})], [
        row("decode", 1, "eager", 1500, 300),
        row("decode", 1, "compile_default", 1000, 100, mv_us=120.0, mv_k=4, build_s=40.0),
        row("decode", 1, "handwritten_compiled", 500, 80),          # a reference: never the best baseline
        vtc("decode", 1, "none", 900, 90, solve_wall_s=0.1, build_s=5.0),
        vtc("decode", 1, "ilp", 800, 50, solve_wall_s=60.0, build_s=7.0),
        vtc("decode", 1, "ilp:mix", 850, 30, solve_wall_s=61.0, build_s=7.0),
    ])
    shuffle = folder(tmp_path, "shufflenet", "shufflenet", [case("shufflenet", 1, "ilp", 10)], [
        row("shufflenet", 1, "compile_default", 200, 20, mv_us=30.0, mv_k=3, build_s=20.0),
        vtc("shufflenet", 1, "ilp", 250, 25, mv_us=5.0, mv_k=1, solve_wall_s=2.0, build_s=3.0),
    ])
    return llama, shuffle, tmp_path / "eval"


def test_tables_from_two_runner_folders(folders):
    llama, shuffle, out = folders
    res = evaluate([llama, shuffle], out)
    f11 = {(r["model"], r["batch"]): r for r in res["figure11"]}
    assert set(f11) == {("llama3_8b decode", 1), ("shufflenet", 1)}
    assert f11["llama3_8b decode", 1]["best_baseline"] == "compile_default"      # not the hand-written reference
    assert f11["llama3_8b decode", 1]["vtcsearch_solver"] == "ilp"               # the search's pick, not the fastest
    assert f11["llama3_8b decode", 1]["speedup"] == pytest.approx(1000 / 800)
    assert f11["shufflenet", 1]["speedup"] == pytest.approx(0.8)
    # the hand-written model and the floor stand beside the speedup: how far from an expert and from the hardware
    assert f11["llama3_8b decode", 1]["vs_reference"] == pytest.approx(500 / 800)
    assert f11["llama3_8b decode", 1]["over_floor"] == pytest.approx(800 / 400)
    assert f11["shufflenet", 1]["vs_reference"] is None and f11["shufflenet", 1]["over_floor"] is None
    h = res["headline"]
    assert h["speedup_mean"] == pytest.approx(math.sqrt(1.25 * 0.8)) and h["speedup_max"] == pytest.approx(1.25)
    assert h["speedup_below_1"] == 1
    t1 = {r["model"]: r for r in res["table1"]}
    assert t1["llama3_8b decode"]["vtcsearch_peak_mib"] == pytest.approx(1050)
    assert t1["llama3_8b decode"]["peak_reduction"] == pytest.approx(1 - 1050 / 1100)
    assert t1["llama3_8b decode"]["activation_reduction"] == pytest.approx(0.5)
    assert t1["shufflenet"]["peak_reduction"] == pytest.approx(1 - 35 / 30)     # more memory: negative, shown
    assert (h["movement_eliminated"], h["movement_cases"]) == (1, 2)
    f12 = [r for r in res["figure12"] if r["model"] == "llama3_8b decode"]
    assert {(r["who"], r["movement_us"]) for r in f12} == {("best baseline", 120.0), ("vtcsearch", 0.0)}
    ct = {r["model"]: r for r in res["compile_time"]}["llama3_8b decode"]
    assert (ct["capture_s"], ct["search_s"], ct["kernel_build_s"], ct["compile_default_build_s"]) == (3.0, 60.0, 7.0,
                                                                                                         40.0)
    (mo,) = res["memory_objective"]
    assert mo["solver"] == "ilp:mix" and mo["slowdown"] == pytest.approx(850 / 800)
    assert mo["activation_saving"] == pytest.approx(1 - 30 / 50)
    # missing cases are listed, never invented
    assert len(res["missing"]) == len(EXPECTED) - 2
    assert "gemma2_9b decode bs1: not in any folder given" in res["missing"]
    assert not any(m.startswith("llama3_8b decode bs1:") for m in res["missing"])
    # a speedup over a baseline weaker than max-autotune says so
    assert any(n.startswith("llama3_8b decode bs1: torch.compile max-autotune not measured") for n in res["notes"])
    for name in ("figure11", "table1", "figure12", "compile_time", "memory_objective"):
        with open(out / f"{name}.csv") as f:
            assert len(list(csv.DictReader(f))) == len(res[name])
    for png in ("figure11.png", "table1.png", "figure12.png"):
        assert (out / png).stat().st_size > 0
    report = (out / "report.md").read_text()
    assert f"{PAPER['speedup_max']:.2f}x" in report and f"{PAPER['speedup_mean']:.2f}x" in report
    assert "- llama3_8b decode bs1: the hand-written model is faster, 500.0 vs 800.0 us (0.62x)" in report
    assert "7 of 10" in report and "60%" in report and "17.5%" in report
    assert "## Missing cases" in report and "yolo11 s bs16: not in any folder given" in report
    assert "shufflenet bs1: 0.80x, 20.0% slower than compile_default (250.0 vs 200.0 us)" in report
    assert "geometric mean 1.00x < 1.30x" in report and "shufflenet bs1: peak 35 MiB > torch.compile's 30 MiB" in report


def test_the_guard_keeps_what_vtcsearch_compile_keeps(tmp_path):
    """A run that guarded its pick (``run.measured_guard``: the pick and ``none`` timed against each other, as
    ``vtcsearch.compile`` does) reports the strategy the guard kept; a guard of another pick is ignored."""
    rows = [row("n", 1, "compile_max_autotune_graph", 1000, 10), vtc("n", 1, "none", 990, 5),
            vtc("n", 1, "ilp", 1100, 5)]
    guarded = {"solver": "ilp", "search_us": 1102.0, "none_us": 991.0, "kept": "none"}
    for guard, solver, us in ((guarded, "none", 990), ({**guarded, "solver": "greedy"}, "ilp", 1100), (None, "ilp", 1100)):
        d = tmp_path / str(len(list(tmp_path.iterdir())))
        d.mkdir()
        res = evaluate([folder(d, "yolo11", "yolo11", [case("n", 1, "ilp", 5, guard=guard)], rows)], d / "eval")
        (f11,) = [r for r in res["figure11"] if r["model"] == "yolo11 n"]
        assert (f11["vtcsearch_solver"], f11["vtcsearch_us"]) == (solver, us)


def test_guard_record_keeps_none_only_where_it_measured_faster():
    from vtcsearch.run import guard_record
    assert guard_record("ilp", 1100.0, 990.0)["kept"] == "none"
    assert guard_record("ilp", 990.0, 1100.0)["kept"] == "ilp"
    assert guard_record("ilp", 1000.0, 1000.0)["kept"] == "ilp"
    assert guard_record("ilp", None, None)["kept"] == "ilp"       # the same strategy: nothing to time


def test_a_modelled_or_failed_case_is_missing_not_compared(tmp_path):
    mod = folder(tmp_path, "yolo11", "yolo11", [case("n", 1, "ilp", 5), case("s", 1, None, 10, error="capture: x")], [
        vtc("n", 1, "ilp", 100, 5), row("n", 1, "eager", None, 0, status="skipped")], measured=False)
    res = evaluate([mod], tmp_path / "eval")
    (n,) = [r for r in res["figure11"] if r["model"] == "yolo11 n"]
    assert n["speedup"] is None and n["vtcsearch_us"] is None and n["modelled_us"] == pytest.approx(90)
    assert "yolo11 n bs1: modelled only (no GPU run)" in res["missing"]
    assert "yolo11 s bs1: the case failed (capture: x)" in res["missing"]
    assert res["headline"]["speedup_cases"] == 0


def test_a_case_stopped_before_its_timing_says_so(tmp_path):
    """A run the call's deadline stopped keeps no row of the case, only the runner's note: the missing case quotes
    it rather than saying it never ran."""
    d = folder(tmp_path, "llama3_8b", "llama3", [case("decode", 1, "ilp", 1000)], [vtc("decode", 1, "ilp", 800, 50)])
    s = json.loads((d / "summary.json").read_text())
    s["notes"] = ["the run was stopped during the benchmark of prefill bs1: 0 measured variant(s) kept, vtc_ilp "
                  "not measured"]
    (d / "summary.json").write_text(json.dumps(s))
    res = evaluate([d], tmp_path / "eval")
    assert "llama3_8b prefill bs1: attempted; the run was stopped during the benchmark of prefill bs1: 0 measured " \
           "variant(s) kept, vtc_ilp not measured" in res["missing"]
    assert "gemma2_9b prefill bs1: not in any folder given" in res["missing"]


def test_cli_one_line_error_on_a_folder_without_summary(tmp_path, capsys):
    assert main([str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "nope" in err and err.count("\n") == 1


def test_kernel_time_by_class_says_which_kernels_make_a_case_slower(tmp_path):
    """profile.csv rows become kernel time per class for the best baseline and vtcsearch; a slower case names
    the classes where vtcsearch spends more."""
    from vtcsearch.evaluation import kernel_class
    assert kernel_class("sm90_xmma_fprop_implicit_gemm_f16", False) == "convolution"
    assert kernel_class("triton_tem_fused_mm_0", False) == "gemm" and kernel_class("gemm_kernel", False) == "gemm"
    assert kernel_class("attn_combine", False) == "attention"
    assert kernel_class("triton_poi_fused_add_mul_0", False) == "other"
    assert kernel_class("copy_kernel", True) == "movement"

    def prof(variant, kernel, us, movement=False, calls=1):
        return {"case": "shufflenet", "batch": 1, "variant": variant, "kernel": kernel, "calls": calls, "us": us,
                "movement": movement}

    d = folder(tmp_path, "shufflenet", "shufflenet", [case("shufflenet", 1, "ilp", 10)], [
        row("shufflenet", 1, "compile_default", 200, 20),
        vtc("shufflenet", 1, "ilp", 250, 25),
    ])
    s = json.loads((d / "summary.json").read_text())
    s["profile"] = [prof("compile_default", "sm90_xmma_fprop_implicit_gemm", 150.0, calls=2),
                    prof("compile_default", "triton_poi_fused_relu_0", 40.0),
                    prof("vtc_ilp", "sm90_xmma_fprop_implicit_gemm", 150.0, calls=2),
                    prof("vtc_ilp", "triton_poi_fused_relu_0", 41.0),
                    prof("vtc_ilp", "copy_kernel", 50.0, movement=True)]
    (d / "summary.json").write_text(json.dumps(s))
    res = evaluate([d], tmp_path / "eval")
    tc = {r["who"]: r for r in res["kernel_classes"]}
    assert tc["best baseline"]["convolution"] == 150.0 and tc["best baseline"]["kernels"] == 3
    assert tc["vtcsearch"]["movement"] == 50.0 and tc["vtcsearch"]["total"] == 241.0
    report = (tmp_path / "eval" / "report.md").read_text()
    assert "profiled kernel time over it: movement +50.0 us, other +1.0 us" in report
    assert "## Kernel time by class" in report


def test_fit_gap_recovers_the_gap_of_linear_rows():
    """``--fit-gap``: each row's model is its latency without the gap plus the gap times its kernels; the fit
    finds the gap that made the measurements, and left out one folder at a time it still does."""
    from experiments.oracle_accuracy import cross_validate, fit_gap, with_gap
    rows = [{"folder": f"f{k % 3}", "base_us": b, "kernels": n, "measured_us": b + 1.5 * n}
            for k, (b, n) in enumerate([(100.0, 10), (50.0, 60), (2000.0, 300), (30.0, 8), (400.0, 120),
                                        (900.0, 30)])]
    assert fit_gap(rows) == pytest.approx(1.5e-6)
    assert all(r["model_us"] == pytest.approx(r["measured_us"]) for r in with_gap(rows, 1.5e-6))
    cv = cross_validate(rows, 0.0)
    assert [c["gap_us"] for c in cv] == pytest.approx([1.5] * 3)
    assert all(c["within_after"] == c["rows"] for c in cv)


def test_oracle_accuracy_prices_the_committed_strategies(tmp_path):
    """experiments.oracle_accuracy loads each measured strategy of a committed folder onto the VTOG rebuilt at
    HEAD and prices it; an edge renumbered since the run (``clone_3`` -> ``clone_2``) is matched by its
    signature, and a strategy whose edges are gone is reported as drifted, not priced; each row is priced on the
    preset of the GPU that measured it."""
    import re
    import shutil
    from experiments.oracle_accuracy import predict, write
    root = Path(__file__).resolve().parents[1] / "results" / "vision_blocks"
    every = predict([root], log=lambda m: None)
    rows = [r for r in every if r["batch"] == 1]
    assert [r["variant"] for r in rows] == ["vtc_none", "vtc_ilp", "vtc_ilp@analytical"]
    assert all(r["model_us"] and r["model_us"] > 0 and not r["note"] for r in rows)
    # each row on the model of the GPU that measured it (an H100's: its bandwidth, the H200's calibration), not
    # skipped; the folder holds both (bs 1's none on the H200, the rest on an H100)
    measured = {(r["case"], r["batch"], r["variant"]): r["machine"]
                for r in json.loads((root / "summary.json").read_text())["rows"]}
    gpus = [("H100" if "H100" in measured[r["case"], r["batch"], r["variant"]] else "H200", r) for r in every]
    assert {g for g, _ in gpus} == {"H100", "H200"}
    assert all(r["hardware"] == g and r["model_us"] and r["model_us"] > 0 for g, r in gpus)
    # the same run with its VTOG's op names renumbered, then with the ILP's first edge made unknown
    folder = tmp_path / "vision_blocks"
    shutil.copytree(root, folder)
    vpath = folder / "vtog" / "litemla-bs1.json"
    vt = json.loads(vpath.read_text())
    for e in vt["edges"]:
        e["op"] = re.sub(r"_\d+$", "", e["op"]) + f"_{e['id'] + 7}"
    vpath.write_text(json.dumps(vt))
    again = [r for r in predict([folder], log=lambda m: None) if r["batch"] == 1]
    assert [r["model_us"] for r in again] == pytest.approx([r["model_us"] for r in rows])
    ilp = json.loads((folder / "strategies" / "litemla-bs1_ilp.json").read_text())
    for e in vt["edges"]:
        if e["id"] in ilp["edges"]:
            e["kind"] = "unknown"
    vpath.write_text(json.dumps(vt))
    drifted = {r["variant"]: r for r in predict([folder], log=lambda m: None) if r["batch"] == 1}
    assert drifted["vtc_ilp"]["model_us"] is None and drifted["vtc_ilp"]["note"].startswith("drifted")
    write(tmp_path / "out", list(drifted.values()), "test")
    assert "drifted" in (tmp_path / "out" / "report.md").read_text()


def test_table1_falls_back_to_the_measured_compile_variant(tmp_path):
    """Where torch.compile's default mode was not measured, Table 1 compares with the max-autotune variant that
    was (and names it), rather than leaving the peak comparison out."""
    d = folder(tmp_path, "shufflenet", "shufflenet", [case("shufflenet", 16, "ilp", 10)], [
        row("shufflenet", 16, "compile_max_autotune_graph", 500, 14),
        vtc("shufflenet", 16, "ilp", 400, 28)])
    (t,) = evaluate([d], tmp_path / "eval")["table1"]
    assert t["compile_variant"] == "compile_max_autotune_graph"
    assert t["compile_peak_mib"] == pytest.approx(24) and t["peak_reduction"] == pytest.approx(1 - 38 / 24)


def test_the_paper_baselines_say_where_onnxruntime_ran_and_why_not(tmp_path):
    """ONNX Runtime counts as a baseline where it ran (here the best one); the report names the cases it could not
    run in, with the run's reason, and why XLA and TensorRT never run here."""
    shuffle = folder(tmp_path, "shufflenet", "shufflenet", [case("shufflenet", 1, "ilp", 10)], [
        row("shufflenet", 1, "compile_default", 200, 20),
        row("shufflenet", 1, "onnxruntime", 150, 10),
        vtc("shufflenet", 1, "ilp", 140, 25)])
    why = "onnxruntime baseline: the call writes the model's buffers (a KV cache)"
    llama = folder(tmp_path, "llama3_8b", "llama3", [case("decode", 1, "ilp", 1000, floor={"floor_us": 400.0})], [
        row("decode", 1, "compile_default", 1000, 100),
        row("decode", 1, "onnxruntime", None, 0, status="skipped", reason=why),
        vtc("decode", 1, "ilp", 800, 50)])
    res = evaluate([llama, shuffle], tmp_path / "eval")
    f11 = {r["model"]: r for r in res["figure11"]}
    assert f11["shufflenet"]["best_baseline"] == "onnxruntime" and f11["shufflenet"]["speedup"] == pytest.approx(150 / 140)
    report = (tmp_path / "eval" / "report.md").read_text()
    assert ("ONNX Runtime (CUDA provider, its own CUDA graph): measured in shufflenet bs1; not run in "
            f"llama3_8b decode bs1: {why}") in report
    assert "- torch.compile (TorchInductor): measured in 2 case(s)" in report
    assert "- XLA: not run: " in report and "- TensorRT: not run: " in report


def test_a_pick_with_wrong_numerics_is_shown_and_not_counted(tmp_path):
    """A case whose pick failed its numerics check keeps its row in Figure 11, is listed as a missed target, and
    its speedup counts neither in the geometric mean nor in the maximum (a wrong answer's speed is not a result)."""
    good = folder(tmp_path, "shufflenet", "shufflenet", [case("shufflenet", 1, "ilp", 10)], [
        row("shufflenet", 1, "compile_default", 200, 20),
        vtc("shufflenet", 1, "ilp", 100, 10, numerics_ok=True, numerics_rel_err=1e-4),
    ])
    bad = folder(tmp_path, "yolo11", "yolo11", [case("n", 1, "ilp", 5)], [
        row("n", 1, "compile_default", 400, 20),
        vtc("n", 1, "ilp", 100, 10, numerics_ok=False, numerics_rel_err=0.0241),
    ])
    res = evaluate([good, bad], tmp_path / "eval")
    assert res["headline"]["speedup_cases"] == 1 and res["headline"]["speedup_max"] == pytest.approx(2.0)
    assert res["headline"]["numerics_failed"] == 1
    assert any(r["model"] == "yolo11 n" and r["speedup"] == pytest.approx(4.0) for r in res["figure11"])
    report = (tmp_path / "eval" / "report.md").read_text()
    assert "yolo11 n bs1: numerics failed (relative error 2.41e-02" in report


def test_a_speedup_across_two_runs_says_it_is_not_side_by_side(tmp_path):
    """A pick measured by one runner command and the best baseline by a later ``--append`` command (which replaced
    the baseline's row) are not side by side in one process: Figure 11 and the missed targets say so; rows of one
    command are side by side."""
    early, late = "2026-12-07T03:24:37+00:00", "2026-12-07T08:04:11+00:00"
    d = folder(tmp_path, "efficientvit", "efficientvit", [case("efficientvit", 1, "ilp", 10)], [
        row("efficientvit", 1, "compile_max_autotune_graph", 2239.6, 144, date=late),
        vtc("efficientvit", 1, "ilp", 2528.6, 136, date=early),
        vtc("efficientvit", 1, "inductor", 2284.4, 2, date=late)])
    same = folder(tmp_path, "shufflenet", "shufflenet", [case("shufflenet", 1, "ilp", 10)], [
        row("shufflenet", 1, "compile_max_autotune_graph", 200, 20, date=late),
        vtc("shufflenet", 1, "ilp", 100, 10, date=late)])
    res = evaluate([d, same], tmp_path / "eval")
    by = {r["model"]: r for r in res["figure11"]}
    assert by["efficientvit"]["side_by_side"] is False and by["shufflenet"]["side_by_side"] is True
    report = (tmp_path / "eval" / "report.md").read_text()
    assert f"(not side by side: vtcsearch's row from the run of {early}, the baseline's from {late})" in report

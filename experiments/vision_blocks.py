"""The paper's vision blocks on the GPU: vtcsearch with and without virtual tensors against PyTorch.

    python -m experiments.vision_blocks --out results/vision        # H200: every block, batch 1 and 16, fp16
    python -m experiments.vision_blocks --dry-run --out /tmp/vision # CPU: tiny sizes, interpreter, numerics only

Blocks, each taken from its workload at its real position and input shape (the
input is the activation the full model feeds the block):

``yolo11n-c3k2`` / ``yolo11s-c3k2``
    YOLO11 n / s at 640x640, layer 2 (the first C3k2: cv1 -> chunk -> Bottleneck ->
    cat -> cv2, every conv with BatchNorm + SiLU).
``shufflenet-s2`` / ``shufflenet-s1``
    ShuffleNetV2 x1.0 at 224x224, stage 2's first (stride 2) and second (stride 1)
    unit: channel split, branches, concat, channel shuffle.
``efficientvit-b1-litemla``
    EfficientViT-B1 in the high-resolution setting (Cityscapes 1024x2048), the first
    LiteMLA of stage 3: QKV conv, multi-scale aggregation, concat, ReLU linear attention,
    projection.

Variants, side by side in one process and fp16: eager, eager + CUDA graphs,
torch.compile (default), torch.compile max-autotune (CUDA graphs), and vtcsearch
with no virtual tensors (``vtc_none``) and with the ILP optimum under the
analytical H200 model (``vtc_ilp``); both vtcsearch variants replay one CUDA graph
(``Executable.cuda_graph``).  Reported: median latency, speedup over the best
baseline, peak memory, kernels and data movement kernels per call
(torch.profiler), numerics against eager, and per conv layer the Triton conv's
time (as the ILP realized it, and with dense operands) against cuDNN's.  A
variant that fails is reported as skipped with the reason; the others still run.
Results go to ``--out``: ``latency.csv``, ``conv_layers.csv``, ``steps.csv``, ``summary.json``,
``README.md`` (tables), ``speedup.png``, ``log.txt``, written after every case.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from vtcsearch.codegen.timing import machine

BATCHES = (1, 16)
DTYPE = torch.float16
TOL = 2e-2                   # fp16 / bf16 tolerance against eager


@dataclass
class Block:
    """One benchmark block: a submodule of a workload and the activation the workload feeds it."""

    name: str
    model: torch.nn.Module
    inputs: tuple[torch.Tensor, ...]
    description: str


class _Reached(Exception):
    pass


def block_input(model: torch.nn.Module, block: torch.nn.Module, inputs: Sequence[Any]) -> tuple[torch.Tensor, ...]:
    """The positional tensors ``block`` receives when ``model`` runs on ``inputs`` (the run stops there)."""
    seen: dict[str, tuple] = {}

    def hook(_mod: torch.nn.Module, args: tuple) -> None:
        seen["args"] = args
        raise _Reached

    handle = block.register_forward_pre_hook(hook)
    try:
        with torch.no_grad():
            model(*inputs)
    except _Reached:
        pass
    finally:
        handle.remove()
    if "args" not in seen:
        raise RuntimeError(f"{type(block).__name__} is not called by {type(model).__name__}")
    return tuple(a.detach().clone() for a in seen["args"])


def _yolo(variant: str) -> Callable[..., Block]:
    def build(size: str, batch: int, device: str, dtype: torch.dtype) -> Block:
        from experiments.workloads import build_workload
        w = build_workload("yolo11", variant=variant, size=size, batch=batch, device=device, dtype=dtype)
        blk = w.model.model[2]
        x = block_input(w.model, blk, w.example_inputs)
        return Block(f"yolo11{variant}-c3k2", blk, x, f"{w.name} layer 2 (C3k2), input {list(x[0].shape)}")
    return build


def _shufflenet(unit: int) -> Callable[..., Block]:
    def build(size: str, batch: int, device: str, dtype: torch.dtype) -> Block:
        from experiments.workloads import build_workload
        w = build_workload("shufflenet", size=size, batch=batch, device=device, dtype=dtype)
        blk = w.model.stage2[unit]
        x = block_input(w.model, blk, w.example_inputs)
        return Block(f"shufflenet-s{blk.stride}", blk, x,
                     f"{w.name} stage 2 unit {unit} (stride {blk.stride}), input {list(x[0].shape)}")
    return build


def _litemla(size: str, batch: int, device: str, dtype: torch.dtype) -> Block:
    from experiments.workloads import build_workload
    w = build_workload("efficientvit", head="none", size=size, batch=batch, device=device, dtype=dtype)
    blk = w.model.backbone.stages[2].op_list[1].context_module.main
    x = block_input(w.model, blk, w.example_inputs)
    return Block("efficientvit-b1-litemla", blk, x, f"{w.name} stage 3 LiteMLA, input {list(x[0].shape)}")


BLOCKS: dict[str, Callable[[str, int, str, torch.dtype], Block]] = {
    "yolo11n-c3k2": _yolo("n"),
    "yolo11s-c3k2": _yolo("s"),
    "shufflenet-s2": _shufflenet(0),
    "shufflenet-s1": _shufflenet(1),
    "efficientvit-b1-litemla": _litemla,
}


# ---------------------------------------------------------------------------
# vtcsearch: strategies, realization, numerics
# ---------------------------------------------------------------------------

def strategies(vtog) -> dict[str, Any]:
    """``vtc_none`` (every tensor physical) and ``vtc_ilp`` (the optimum under the analytical H200 model)."""
    from cost_models import get_oracle
    from solvers import get_solver
    from vtcsearch.core.strategy import Strategy
    oracle = get_oracle("analytical", hardware="H200")
    return {"vtc_none": Strategy(vtog, []), "vtc_ilp": get_solver("ilp")(vtog, oracle).strategy}


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


def realize_checked(graph, strategy, blk: Block, ref: list[torch.Tensor]) -> tuple[Any, dict[str, Any]]:
    """Realize, run once, compare with eager; the executable and what was found."""
    from vtcsearch.codegen.realize import realize
    exe = realize(graph, strategy, blk.model)
    outs = [o.clone() for o in exe(*blk.inputs)]
    errs = [max_err(o, r) for o, r in zip(outs, ref)]
    ok = all(bool(torch.allclose(o.float(), r.float(), rtol=TOL, atol=TOL)) for o, r in zip(outs, ref))
    summ = exe.summary()
    info = {"virtual": len(strategy.virtual), "eliminated_ops": sorted(strategy.eliminated_ops()),
            "residual_copies": len(strategy.residuals), "kernels": summ["kernels"],
            "copy_kernels": summ["copy_kernels"], "by_lowering": summ["by_lowering"],
            "fallbacks": summ["fallbacks"], "allocated_bytes": summ["allocated_bytes"],
            "max_abs_err": max(errs) if errs else 0.0, "numerics_ok": ok, "outputs": outs}
    return exe, info


def step_times(exes: dict[str, Any], blk: Block, batch: int) -> list[dict[str, Any]]:
    """Every step (kernel or copy) of each realized strategy timed alone: where a strategy wins or loses."""
    from vtcsearch.codegen.timing import bench
    rows = []
    for name, exe in exes.items():
        for st in exe.steps:
            rows.append({"block": blk.name, "batch": batch, "strategy": name, "step": st.name, "kind": st.kind,
                         "lowering": st.lowering, "us": bench(st.launch).median_us,
                         "modes": "; ".join(f"{p.name} {p.modes} {p.config}" for p, _ in st.launch.plans)})
    return rows


def conv_layers(graph, exes: dict[str, Any], blk: Block, batch: int) -> list[dict[str, Any]]:
    """Per conv kernel: the Triton conv (+ fused epilogue) as realized by each strategy, and cuDNN's conv
    on dense operands of the same shapes (conv only: eager runs the epilogue as separate kernels)."""
    from vtcsearch.codegen.timing import bench
    aten = torch.ops.aten
    rows = []
    steps = {name: {st.name: st for st in exe.steps} for name, exe in exes.items()}
    for gname, gr in graph.groups.items():
        if gr.kind != "conv":
            continue
        op = graph.ops[gr.ops[0]]
        a = op.node.args
        x_info, w_info = graph.tensors[op.inputs[0]], graph.tensors[op.inputs[1]]
        row: dict[str, Any] = {"block": blk.name, "batch": batch, "kernel": gname,
                               "x": list(x_info.shape), "w": list(w_info.shape), "stride": list(a[3]),
                               "padding": list(a[4]), "groups": a[8], "epilogue_ops": len(gr.ops) - 1}
        for name, st in ((n, s.get(gname)) for n, s in steps.items()):
            key = f"triton_{name.removeprefix('vtc_')}_us"
            try:
                row[key] = bench(st.launch).median_us if st is not None and st.lowering == "conv" \
                    else None
            except Exception as e:  # a failure of one measurement is reported
                row[key] = None
                row.setdefault("notes", []).append(f"{key}: {type(e).__name__}: {e}"[:200])
        try:
            exe = next(iter(exes.values()))
            w = exe.storages[op.inputs[1]]
            b = exe.storages[op.inputs[2]] if len(op.inputs) > 2 else None
            x = torch.randn(x_info.shape, dtype=x_info.dtype, device=w.device)
            row["cudnn_us"] = bench(lambda: aten.convolution(x, w, b, a[3], a[4], a[5], a[6], a[7], a[8])).median_us
        except Exception as e:
            row["cudnn_us"] = None
            row.setdefault("notes", []).append(f"cudnn: {type(e).__name__}: {e}"[:200])
        t, c = row.get("triton_ilp_us"), row.get("cudnn_us")
        row["triton_slower"] = bool(t and c and t > c)
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------
# one case: a block at one batch size
# ---------------------------------------------------------------------------

def run_case(name: str, batch: int, args: argparse.Namespace, log: Callable[[str], None],
             variants: Sequence[str]) -> tuple[list[dict], list[dict], dict]:
    from vtcsearch.core.capture import capture
    from vtcsearch.core.vtog import build_vtog

    size, device = ("tiny", "cpu") if args.dry_run else ("full", "cuda")
    torch.manual_seed(0)
    blk = BLOCKS[name](size, batch, device, DTYPE)
    with torch.no_grad():
        out = blk.model(*blk.inputs)
    ref = [o.clone() for o in (out if isinstance(out, (tuple, list)) else [out])]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = capture(blk.model, blk.inputs)
    v = build_vtog(g)
    strats = {k: s for k, s in strategies(v).items() if k in variants or args.dry_run}
    info: dict[str, Any] = {"block": name, "batch": batch, "description": blk.description, "vtog": v.summary(),
                            "kernel_groups": {gr.name: gr.kind for gr in g.groups.values()}}
    log(f"== {name} batch {batch}: {blk.description}; VTOG {v.summary()['nodes']} nodes, {len(v.edges)} edges")
    exes: dict[str, Any] = {}

    def vtc_build(sname: str) -> Callable[[], Callable[[], Any]]:
        def build() -> Callable[[], Any]:
            exe, res = realize_checked(g, strats[sname], blk, ref)
            exes[sname] = exe
            info[sname] = res
            log(f"   {sname}: {res['kernels']} kernels ({res['copy_kernels']} copies), "
                f"{res['residual_copies']} residual copies, max |err| vs eager {res['max_abs_err']:.2e}"
                f"{'' if res['numerics_ok'] else '  NUMERICS MISMATCH'}"
                f"{'; fallbacks: ' + ', '.join(res['fallbacks']) if res['fallbacks'] else ''}")
            if args.dry_run:
                return lambda: None
            exe.set_inputs(*blk.inputs)
            ins = [exe.storages[t] for t in g.inputs]   # the static buffers: no input copy per call
            call = exe.cuda_graph()
            return lambda: call(*ins)
        return build

    rows: list[dict] = []
    if args.dry_run:
        for sname in strats:
            try:
                vtc_build(sname)()
            except Exception as e:  # reported, the other strategies still run
                info[sname] = {"error": f"{type(e).__name__}: {e}"[:300], "numerics_ok": False}
                log(f"   {sname}: FAILED {info[sname]['error']}")
    else:
        from experiments.baselines import Variant, baseline_variants, run_variant
        torch._dynamo.reset()    # no recompilation limits or dynamic shapes carried over from the last case
        vs = baseline_variants(blk.model, blk.inputs, [n for n in variants if not n.startswith("vtc_")])
        vs += [Variant(s, vtc_build(s)) for s in strats]
        for var in vs:
            m, _ = run_variant(var)
            rows.append({"block": name, "batch": batch, **m.to_dict()})
            log(f"   {var.name:22s} " + (f"{m.median_us:9.1f} us  peak {(m.peak_memory_bytes or 0) / 2 ** 20:7.1f} MiB"
                                         f"  kernels {m.kernels} (movement {m.movement_kernels})"
                                         if m.median_us else f"skipped: {m.skipped}"))
            torch.cuda.empty_cache()
        base = [r["median_us"] for r in rows if not r["name"].startswith("vtc") and r["median_us"]]
        best = min(base) if base else math.nan
        for r in rows:
            r["speedup_vs_best_baseline"] = best / r["median_us"] if r["median_us"] else None
            res = info.get(r["name"], {})
            r["numerics_ok"] = res.get("numerics_ok")
            r["copy_kernels"] = res.get("copy_kernels")
    # none and ILP run the same kernels on other data movement: the same bits
    outs = {k: info[k]["outputs"] for k in strats if "outputs" in info.get(k, {})}
    if len(outs) == 2:
        a, b = outs.values()
        info["none_vs_ilp_bit_identical"] = all(torch.equal(x, y) for x, y in zip(a, b))
        log(f"   vtc_none vs vtc_ilp bit-identical: {info['none_vs_ilp_bit_identical']}")
    for k in strats:
        info.get(k, {}).pop("outputs", None)
    layers: list[dict] = []
    if not args.dry_run and exes:
        try:
            layers = conv_layers(g, exes, blk, batch)
        except Exception as e:  # the latency rows stand without the per-layer table
            log(f"   conv layers: FAILED {type(e).__name__}: {e}")
        try:
            info["steps"] = step_times(exes, blk, batch)
        except Exception as e:  # the latency rows stand without the per-step table
            log(f"   step times: FAILED {type(e).__name__}: {e}")
        for r in layers:
            if r["triton_slower"]:
                log(f"   conv {r['kernel']} x{r['x']} w{r['w']}: triton {r['triton_ilp_us']:.1f} us "
                    f"(dense {r.get('triton_none_us') or math.nan:.1f}) vs cuDNN {r['cudnn_us']:.1f} us")
    return rows, layers, info


# ---------------------------------------------------------------------------
# reporting
# ---------------------------------------------------------------------------

def _f(v: Any, fmt: str) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


def markdown(rows: list[dict], layers: list[dict], infos: list[dict], meta: dict) -> str:
    lines = ["# Vision blocks: vtcsearch against eager and torch.compile (fp16)", ""]
    for run in meta.get("runs") or [meta]:
        m = run["machine"]
        lines += [f"Command: `{run['command']}`  ", f"Machine: {m['gpu'] or m['cpu'] + ' (no GPU)'} "
                  f"(torch {m['torch']}, triton {m['triton']})  ", f"Date: {run['date']}", ""]
    if meta.get("runs"):
        lines += ["Each block and batch size was measured side by side in one process (one of the runs above); "
                  "speedups are over the best baseline of that process.", ""]
    if rows:
        lines += ["| block | batch | variant | median us | speedup vs best baseline | peak MiB | kernels "
                  "| movement kernels | vtc copy kernels | numerics |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            if r["median_us"] is None:
                lines.append(f"| {r['block']} | {r['batch']} | {r['name']} | skipped: {r['skipped']} | | | | | | |")
                continue
            num = "" if r.get("numerics_ok") is None else ("ok" if r["numerics_ok"] else "MISMATCH")
            lines.append(f"| {r['block']} | {r['batch']} | {r['name']} | {r['median_us']:.1f} | "
                         f"{_f(r['speedup_vs_best_baseline'], '.2f')}{'x' if r['speedup_vs_best_baseline'] else ''} | "
                         f"{_f((r['peak_memory_bytes'] or 0) / 2 ** 20, '.1f')} | {_f(r['kernels'], 'd')} | "
                         f"{_f(r['movement_kernels'], 'd')} | {_f(r.get('copy_kernels'), 'd')} | {num} |")
    slow = [r for r in layers if r.get("triton_slower")]
    if layers:
        lines += ["", f"## Conv layers where the Triton conv is slower than cuDNN ({len(slow)} of {len(layers)})", "",
                  "Triton: conv + fused epilogue through the operands' maps (as the ILP strategy realized it, and "
                  "with every operand dense); cuDNN: the conv alone on dense NCHW operands.", "",
                  "| block | batch | kernel | x | w | stride | groups | triton ilp us | triton dense us | cuDNN us |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in slow:
            lines.append(f"| {r['block']} | {r['batch']} | {r['kernel']} | {r['x']} | {r['w']} | {r['stride']} | "
                         f"{r['groups']} | {_f(r.get('triton_ilp_us'), '.1f')} | {_f(r.get('triton_none_us'), '.1f')} "
                         f"| {_f(r.get('cudnn_us'), '.1f')} |")
    stepped = [i for i in infos if i.get("steps")]
    if stepped:
        lines += ["", "## Steps timed alone (steps.csv)", "",
                  "Each kernel or copy of a realized strategy timed by itself (CUDA graph replays): the sum, and "
                  "the kernels that reading or writing through the ILP's maps made slower than the same kernel "
                  "on dense operands.", "",
                  "| block | batch | vtc_none sum us | vtc_ilp sum us | kernels slower under vtc_ilp (none -> ilp us) |",
                  "|---|---|---|---|---|"]
        for i in stepped:
            by = {s: {r["step"]: r["us"] for r in i["steps"] if r["strategy"] == s} for s in ("vtc_none", "vtc_ilp")}
            slower = [f"{k} {by['vtc_none'][k]:.1f} -> {t:.1f}" for k, t in by["vtc_ilp"].items()
                      if k in by["vtc_none"] and t > 1.2 * by["vtc_none"][k] and t - by["vtc_none"][k] > 2]
            lines.append(f"| {i['block']} | {i['batch']} | {sum(by['vtc_none'].values()):.1f} | "
                         f"{sum(by['vtc_ilp'].values()):.1f} | {'; '.join(slower) or '-'} |")
    lines += ["", "## Strategies", "", "| block | batch | strategy | kernels | copy kernels | residual copies "
              "| eliminated movement ops | max abs err vs eager | fallbacks |", "|---|---|---|---|---|---|---|---|---|"]
    for inf in infos:
        for s in ("vtc_none", "vtc_ilp"):
            r = inf.get(s)
            if not r:
                continue
            if "error" in r:
                lines.append(f"| {inf['block']} | {inf['batch']} | {s} | failed: {r['error']} | | | | | |")
                continue
            lines.append(f"| {inf['block']} | {inf['batch']} | {s} | {r['kernels']} | {r['copy_kernels']} | "
                         f"{r['residual_copies']} | {len(r['eliminated_ops'])} | {r['max_abs_err']:.2e} | "
                         f"{', '.join(r['fallbacks']) or '-'} |")
    return "\n".join(lines) + "\n"


def write(out: Path, rows: list[dict], layers: list[dict], infos: list[dict], meta: dict,
          log_lines: list[str]) -> None:
    import pandas as pd
    out.mkdir(parents=True, exist_ok=True)
    from vtcsearch.report import with_provenance
    rows[:] = with_provenance(rows, meta)       # in place: appended runs keep each row's own run
    layers[:] = with_provenance(layers, meta)
    pd.DataFrame(rows).to_csv(out / "latency.csv", index=False)
    pd.DataFrame(layers).to_csv(out / "conv_layers.csv", index=False)
    steps = [r for i in infos for r in i.get("steps", [])]
    pd.DataFrame(with_provenance(steps, meta) if steps else []).to_csv(out / "steps.csv", index=False)
    (out / "summary.json").write_text(json.dumps({"meta": meta, "cases": infos, "rows": rows, "conv_layers": layers},
                                                 indent=1, default=str))
    if any(r.get("speedup_vs_best_baseline") for r in rows):
        plot_speedups(rows, out / "speedup.png")
    (out / "README.md").write_text(markdown(rows, layers, infos, meta))
    (out / "log.txt").write_text("\n".join(log_lines) + "\n")


def plot_speedups(rows: list[dict], path: Path) -> None:
    """Speedup over the best baseline of each case, one group of bars per block and batch."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cases = list(dict.fromkeys((r["block"], r["batch"]) for r in rows))
    names = list(dict.fromkeys(r["name"] for r in rows))
    width = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(max(8, 1.4 * len(cases)), 4.5))
    for k, name in enumerate(names):
        ys = [next((r["speedup_vs_best_baseline"] or 0 for r in rows if (r["block"], r["batch"]) == c
                    and r["name"] == name), 0) for c in cases]
        ax.bar([i + k * width for i in range(len(cases))], ys, width, label=name)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cases))])
    ax.set_xticklabels([f"{b}\nbs{n}" for b, n in cases], fontsize=7)
    ax.set_ylabel("speedup over the best baseline (x)")
    ax.set_title("Vision blocks on the GPU (fp16); a missing bar: not run in that case's process")
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def previous_runs(path: Path, meta: dict, blocks: set[str], batches: set[int]
                  ) -> tuple[list[dict], list[dict], list[dict], dict]:
    """The rows of an earlier run that this run does not redo, and a meta listing every run."""
    old = json.loads(path.read_text())
    redo = lambda r: r["block"] in blocks and r["batch"] in batches   # noqa: E731
    runs = old["meta"].get("runs") or [{k: old["meta"][k] for k in ("command", "machine", "date")}]
    meta = {**meta, "runs": runs + [{k: meta[k] for k in ("command", "machine", "date")}]}
    return ([r for r in old["rows"] if not redo(r)], [r for r in old["conv_layers"] if not redo(r)],
            [i for i in old["cases"] if not redo(i)], meta)


VARIANTS = ("eager", "eager_cudagraphs", "compile_default", "compile_max_autotune", "compile_max_autotune_graph",
            "vtc_none", "vtc_ilp")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", nargs="+", default=list(BLOCKS), choices=list(BLOCKS))
    ap.add_argument("--batch", nargs="+", type=int, default=list(BATCHES))
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--out", default="results/vision")
    ap.add_argument("--append", action="store_true",
                    help="keep the other blocks/batches already in --out (each block and batch is still measured "
                         "side by side in one process; the runs' commands are listed)")
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny sizes on the CPU through Triton's interpreter: numerics only, no timing")
    args = ap.parse_args(argv)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"   # before anything imports triton's kernels
        args.batch = args.batch[:1]
        warnings.filterwarnings("ignore", category=RuntimeWarning)   # the interpreter's numpy overflow notes
    elif not torch.cuda.is_available():
        print("no CUDA device: use --dry-run for a CPU check", file=sys.stderr)
        return 2
    else:
        torch.backends.cudnn.benchmark = True   # cuDNN at its best algorithm, for eager and the per-layer table
    out = Path(args.out)
    log_lines: list[str] = []

    def log(s: str) -> None:
        print(s, flush=True)
        log_lines.append(s)

    meta = {"command": "python -m experiments.vision_blocks " + " ".join(argv if argv is not None else sys.argv[1:]),
            "machine": machine(), "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "dtype": str(DTYPE), "dry_run": args.dry_run}
    rows, layers, infos = [], [], []
    if args.append and (out / "summary.json").exists():
        rows, layers, infos, meta = previous_runs(out / "summary.json", meta, set(args.blocks), set(args.batch))
    ok = True
    for name in args.blocks:
        for b in args.batch:
            try:
                r, lay, info = run_case(name, b, args, log, args.variants)
            except Exception as e:  # one block failing does not stop the others
                info = {"block": name, "batch": b, "error": f"{type(e).__name__}: {e}"[:300]}
                r, lay = [], []
                log(f"== {name} batch {b}: FAILED {info['error']}")
                ok = False
            ok &= all(info.get(s, {}).get("numerics_ok", True) for s in ("vtc_none", "vtc_ilp"))
            ok &= info.get("none_vs_ilp_bit_identical", True)
            rows += r
            layers += lay
            infos.append(info)
            for lst in (rows, layers, infos):   # stable: a case's variants keep their order
                lst.sort(key=lambda r: (list(BLOCKS).index(r["block"]), r["batch"]))
            write(out, rows, layers, infos, meta, log_lines)   # after every case: a cut-short run keeps its results
            if torch.cuda.is_available() and not args.dry_run:
                torch.cuda.empty_cache()
    print(markdown(rows, layers, infos, meta))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""What a run leaves behind: CSV tables, plots (matplotlib, Agg), the Markdown report, the console table.

Kept apart from :mod:`vtcsearch.run` so a notebook can redraw the plots or the
report from a ``summary.json`` alone: :func:`write_plots` and :func:`markdown`
take the summary dictionary, nothing else.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

from .atomic import atomic_path, write_text
from .schema import CONV_FIELDS, INT_FIELDS, NUMERICS_FIELDS, PROFILE_FIELDS, ROW_FIELDS, STEP_FIELDS, VariantKind

MIB = 2 ** 20


def _fmt(x: Any, spec: str = ".1f", none: str = "-") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return none
    return format(x, spec)


def with_provenance(rows: list[dict[str, Any]], run: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows carrying the command, machine and date they were measured with (kept where a row has them:
    rows of earlier runs appended to a folder keep their own).  ``run``: a summary, or a row that has them."""
    m = run.get("machine")
    where = m if isinstance(m, str) or not m else \
        f"{m.get('gpu') or m.get('cpu')} (torch {m.get('torch')}, triton {m.get('triton')})"
    return [{**r, "command": r.get("command") or run.get("command"), "machine": r.get("machine") or where,
             "date": r.get("date") or run.get("date")} for r in rows]


def _dagger(row: dict[str, Any]) -> str:
    """† on a speedup over a baseline measured in another process (another ``--append`` run)."""
    return " †" if row.get("baseline_same_process") is False else ""


def latency_word(summary: dict[str, Any]) -> str:
    return "measured" if summary["measured"] else "modelled"


def memory_of(row: dict[str, Any], measured: bool) -> float | None:
    """Peak memory shown in plots and tables: measured on a GPU, else the model's activation peak."""
    v = row.get("measured_peak_bytes") if measured else row.get("predicted_activation_peak_bytes")
    return None if v is None else v / MIB


# ---------------------------------------------------------------------------
# files
# ---------------------------------------------------------------------------
def write_all(out: Path, summary: dict[str, Any], kernel_rows: list[dict[str, Any]],
              log: Callable[[str], None] = print) -> None:
    """summary.csv, kernels.csv, numerics.csv, the three plots and report.md; records them in summary['files']."""
    import pandas as pd

    files = summary["files"]
    df = pd.DataFrame(summary["rows"], columns=list(ROW_FIELDS))
    for c in INT_FIELDS:
        df[c] = df[c].astype("Int64")      # integers stay integers beside missing values
    with atomic_path(out / "summary.csv") as tmp:
        df.to_csv(tmp, index=False)
    files["summary_csv"] = "summary.csv"
    kcols = ["case", "batch", "variant", "solver", "source", "unit", "kind", "us", "seconds", "bytes", "flops"]
    kdf = pd.DataFrame(with_provenance(kernel_rows, summary))
    kdf = kdf[[c for c in kcols if c in kdf.columns] + [c for c in kdf.columns if c not in kcols]] if len(kdf) \
        else pd.DataFrame(columns=kcols)
    with atomic_path(out / "kernels.csv") as tmp:
        kdf.to_csv(tmp, index=False)
    files["kernels_csv"] = "kernels.csv"
    with atomic_path(out / "numerics.csv") as tmp:
        pd.DataFrame(summary["numerics"], columns=list(NUMERICS_FIELDS)).to_csv(tmp, index=False)
    files["numerics_csv"] = "numerics.csv"
    for key, fields in (("steps", STEP_FIELDS), ("conv_layers", CONV_FIELDS), ("profile", PROFILE_FIELDS)):
        if summary.get(key) or summary["config"].get("breakdown", {}).get(key):
            with atomic_path(out / f"{key}.csv") as tmp:
                prov = ("command", "machine", "date")   # a row's own, where an earlier --append run wrote it
                pd.DataFrame(with_provenance([{f: r.get(f) for f in fields + prov} for r in summary.get(key, [])],
                                             summary), columns=list(fields + prov)).to_csv(tmp, index=False)
            files[f"{key}_csv"] = f"{key}.csv"
    files.update(write_plots(out, summary))
    files["vtog"] = sorted(str(p.relative_to(out)) for p in (out / "vtog").glob("*")) if (out / "vtog").exists() else []
    files["strategies"] = sorted(str(p.relative_to(out)) for p in (out / "strategies").glob("*.json")) \
        if (out / "strategies").exists() else []
    files["summary_json"] = "summary.json"
    files["report"] = "report.md"
    files["log"] = "log.txt"
    write_text(out / "report.md", markdown(summary))
    log(f"wrote {out}/: report.md, summary.csv/json, kernels.csv, numerics.csv, plots, {len(files['vtog'])} VTOG files")


def _groups(summary: dict[str, Any]) -> list[tuple[str, list[dict[str, Any]]]]:
    """(case bsN, its rows) in run order."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in summary["rows"]:
        out.setdefault(f"{r['case']} bs{r['batch']}", []).append(r)
    return list(out.items())


def write_plots(out: Path, summary: dict[str, Any]) -> dict[str, str]:
    """latency.png, memory.png, breakdown.png: grouped bars per (case, batch)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    groups = _groups(summary)
    measured = summary["measured"]
    word = latency_word(summary)
    hw = summary.get("oracle", {}).get("hardware")
    suffix = f" ({word}{', ' + hw + ' model' if not measured and hw else ''})"
    variants = list(dict.fromkeys(r["variant"] for _, rows in groups for r in rows))
    files: dict[str, str] = {}

    def bars(values: Callable[[dict[str, Any]], float | None], ylabel: str, title: str, name: str,
             log_scale: bool) -> None:
        shown = [v for v in variants if any(values(r) and math.isfinite(values(r)) for _, rows in groups
                                            for r in rows if r["variant"] == v)]
        fig, ax = plt.subplots(figsize=(max(6.0, 1.2 + len(groups) * (0.6 + 0.35 * len(shown))), 4.2))
        width = 0.8 / max(len(shown), 1)
        x = np.arange(len(groups))
        for k, v in enumerate(shown):
            ys = []
            for _, rows in groups:
                r = next((r for r in rows if r["variant"] == v), None)
                y = values(r) if r else None
                ys.append(y if y and math.isfinite(y) else np.nan)
            ax.bar(x + (k - (len(shown) - 1) / 2) * width, ys, width, label=v)
        ax.set_xticks(x, [g for g, _ in groups], rotation=15 if len(groups) > 3 else 0)
        ax.set_ylabel(ylabel)
        ax.set_title(title + suffix)
        if log_scale and shown:
            ax.set_yscale("log")
        if not shown:
            ax.text(0.5, 0.5, "nothing to show", transform=ax.transAxes, ha="center")
        else:
            ax.legend(fontsize=7, ncol=2)
        ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        with atomic_path(out / name) as tmp:
            fig.savefig(tmp, dpi=110)
        plt.close(fig)
        files[name.split(".")[0] + "_png"] = name

    bars(lambda r: r.get("latency_us"), "latency (us)", "Latency per variant", "latency.png", True)
    bars(lambda r: memory_of(r, measured), "peak memory (MiB)" + ("" if measured else ", activations"),
         "Peak memory per variant", "memory.png", False)

    # breakdown: movement vs compute time, stacked, per solver/variant with numbers
    rows = [(g, r) for g, rs in groups for r in rs if r.get("movement_us") is not None]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.0 + 0.45 * len(rows)), 4.4))
    if rows:
        labels = [f"{g}\n{r['variant']}" for g, r in rows]
        mv = [r["movement_us"] or 0.0 for _, r in rows]
        cp = [r["compute_us"] or 0.0 for _, r in rows]
        x = np.arange(len(rows))
        ax.bar(x, cp, label="compute kernels", color="tab:blue")
        ax.bar(x, mv, bottom=cp, label="data movement kernels", color="tab:red")
        ax.set_xticks(x, labels, rotation=90, fontsize=6)
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no kernel times", transform=ax.transAxes, ha="center")
    ax.set_ylabel("kernel time (us)")
    ax.set_title("Where the time goes" + suffix)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    with atomic_path(out / "breakdown.png") as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
    files["breakdown_png"] = "breakdown.png"
    return files


# ---------------------------------------------------------------------------
# report.md
# ---------------------------------------------------------------------------
def markdown(summary: dict[str, Any]) -> str:
    m, measured = summary["machine"], summary["measured"]
    word = latency_word(summary)
    o = summary.get("oracle", {})
    lines = [f"# {summary['name']}: {summary['description'] or summary['config']['workload']['name']}", ""]
    runs = summary.get("runs") or [summary]
    if not measured:
        lines += [f"> **Latencies in this report are modelled, not measured.** No GPU was used: every latency, "
                  f"kernel time and memory figure is the `{o.get('oracle')}` cost model's prediction for "
                  f"the {o.get('hardware', '?')} profile; the baselines could not run. Numerics were checked for "
                  f"real, on a scaled-down copy through Triton's CPU interpreter.", ""]
    else:
        # a folder built in pieces may hold rows of several GPUs: name them all, not the last piece's
        gpus = list(dict.fromkeys(r["machine"]["gpu"] for r in runs if r["machine"].get("gpu"))) or [m["gpu"]]
        several = "" if len(gpus) == 1 else \
            " The rows come from several GPUs: each row's `machine` in summary.csv says which."
        lines += [f"Latencies are **measured** on {' and '.join(gpus)} (median of CUDA-event timings; vtcsearch "
                  f"variants replay one CUDA graph), side by side with the baselines in one process; a row with "
                  f"`timing_rounds` in summary.csv was timed together with its case's other variants, in that "
                  f"many interleaved rounds.{several}", ""]
    for run in runs:       # a config run in pieces (--append) lists every piece
        rm = run["machine"]
        lines += [f"- Command: `{run['command']}`",
                  f"- Machine: {rm['gpu'] or 'CPU only'} ({rm['cpu']}; {rm['platform']}); python {rm['python']}, "
                  f"torch {rm['torch']}, triton {rm['triton']}",
                  f"- Date: {run['date']}" + ("" if len(runs) > 1 else f"; wall time {_fmt(summary['wall_s'], '.0f')} s")]
    if len(runs) > 1:
        lines.append("- Each case was run whole by one of these commands (its variants side by side in one process)")
    lines += [
              f"- Oracle: {o.get('oracle')}" + (f" ({o.get('hardware')})" if o.get("hardware") else "")
              + f"; objective: {summary['objective']}; dtype {summary['config']['dtype']}", ""]
    for note in summary.get("notes", []):
        if note.startswith("No GPU was used"):   # said in the banner above
            continue
        lines.append(f"- Note: {note}")
    lines.append("")

    lines += ["## Cases", "", "| case | batch | workload | kernels | movement ops | VTOG nodes / edges / candidates "
              "| capture s |", "|---|---|---|---|---|---|---|"]
    for c in summary["cases"]:
        if c.get("error"):
            lines.append(f"| {c['case']} | {c['batch']} | {c['workload']} | **case failed**: {c['error']} | | | |")
            continue
        lines.append(f"| {c['case']} | {c['batch']} | {c['workload']} | {c['graph']['kernels']} | "
                     f"{c['graph']['movement_ops']} | {c['vtog']['nodes']} / {c['vtog']['edges']} / "
                     f"{c['vtog']['candidates']} | {c['capture_s']:.1f} |")
    lines.append("")

    lines += [f"## Results (latency {word})", "",
              f"| case | batch | variant | status | latency us ({word}) | speedup vs vtc_none | "
              + ("speedup vs best baseline | " if measured else "")
              + f"peak MiB{'' if measured else ' (activations, modelled)'} | kernels | movement kernels "
              "| movement us | eliminated ops | numerics |",
              "|---|---|---|---|---|---|" + ("---|" if measured else "") + "---|---|---|---|---|---|"]
    for r in summary["rows"]:
        num = "-" if r["numerics_ok"] is None else ("ok" if r["numerics_ok"] else "**FAILED**")
        if r["numerics_rel_err"] is not None:
            num += f" ({r['numerics_rel_err']:.1e}, {r['numerics_size']})"
        status = r["status"] if r["status"] == "ok" else f"{r['status']} (below)"
        lines.append(f"| {r['case']} | {r['batch']} | {r['variant']} | {status} | {_fmt(r['latency_us'])} | "
                     f"{_fmt(r['speedup_vs_none'], '.2f')} | "
                     + (f"{_fmt(r['speedup_vs_best_baseline'], '.2f')}{_dagger(r)} | " if measured else "")
                     + f"{_fmt(memory_of(r, measured), '.4g')} | {_fmt(r['kernels'], 'd')} | "
                     f"{_fmt(r['movement_kernels'], 'd')} | {_fmt(r['movement_us'])} | "
                     f"{_fmt(r['eliminated_ops'], 'd')} | {num} |")
    lines.append("")
    if any(r.get("baseline_same_process") is False for r in summary["rows"]):
        lines += ["† against a baseline measured in another run of the case (another `--append` command): the "
                  "row's own run did not measure the best baseline, so the ratio is not side by side in one "
                  "process.", ""]

    lines += floor_section(summary) + accuracy_section(summary) + steps_section(summary) + conv_section(summary) \
        + profile_section(summary)

    solved = [r for r in summary["rows"] if r["kind"] == VariantKind.VTCSEARCH and r["status"] == "ok"]
    if solved:
        lines += ["## Search", "", "| case | batch | solver | predicted us | objective | virtual tensors | "
                  "residual copies | implementations (not Triton) | fallbacks | status | wall s | oracle calls | "
                  "unit queries | measurements | build s |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in solved:
            lines.append(f"| {r['case']} | {r['batch']} | {r['solver']} | {_fmt(r['predicted_latency_us'])} | "
                         f"{_fmt(r['objective'], '.4g')} | {r['virtual_tensors']} | {r['residual_copies']} | "
                         f"{r.get('implementations') or '-'} | {_fmt(r.get('fallbacks'), 'd')} | "
                         f"{r['solver_status']} | {_fmt(r['solve_wall_s'], '.2f')} | {r['oracle_calls']} | "
                         f"{r['unit_queries']} | {r['measurements']} | {_fmt(r.get('build_s'), '.1f')} |")
        lines.append("")

    if summary["numerics"]:
        lines += ["## Numerics against eager PyTorch", "",
                  "Outputs and mutated buffers (KV caches) of each realized strategy, against the eager model "
                  f"(allclose rtol {summary['config']['numerics']['rtol']}, atol "
                  f"{summary['config']['numerics']['atol']}).", "",
                  "| case | solver | size / batch / dtype | ok | rel err | max abs err | buffers max abs err | "
                  "bits equal to vtc_none | kernels (copies) | note |", "|---|---|---|---|---|---|---|---|---|---|"]
        for n in summary["numerics"]:
            ok = "-" if n["ok"] is None else ("yes" if n["ok"] else "**NO**")
            note = n["error"] or (f"same strategy as {n['same_strategy_as']}" if n["same_strategy_as"] else "")
            lines.append(f"| {n['case']} | {n['solver']} | {n['size']} / {n['batch']} / {n['dtype']} | {ok} | "
                         f"{_fmt(n['rel_err'], '.1e')} | {_fmt(n['max_abs_err'], '.1e')} | "
                         f"{_fmt(n['buffers_max_abs_err'], '.1e')} | {_fmt(n['bitwise_equal_none'], '')} | "
                         f"{_fmt(n['kernels'], 'd')} ({_fmt(n['copy_kernels'], 'd')}) | {note} |")
        lines.append("")

    skipped = [r for r in summary["rows"] if r["status"] != "ok"]
    if skipped:
        lines += ["## Skipped or failed", ""]
        by_reason: dict[tuple[str, str], tuple[list[str], list[str]]] = {}
        for r in skipped:
            names, cases = by_reason.setdefault((r["status"], r["reason"] or ""), ([], []))
            c = f"{r['case']} bs{r['batch']}"
            if r["variant"] not in names:
                names.append(r["variant"])
            if c not in cases:
                cases.append(c)
        for (status, reason), (names, cases) in by_reason.items():
            lines.append(f"- {', '.join(f'`{n}`' for n in names)} {status} ({', '.join(cases)}): {reason}")
        lines.append("")

    f = summary["files"]
    lines += ["## Plots", "", f"![latency]({f.get('latency_png', 'latency.png')})", "",
              f"![memory]({f.get('memory_png', 'memory.png')})", "",
              f"![breakdown]({f.get('breakdown_png', 'breakdown.png')})", ""]
    pics = [p for p in f.get("vtog", []) if p.endswith(".png")]
    if pics:
        lines += ["## Points-to graphs", ""] + [f"![{Path(p).stem}]({p})" for p in pics] + [""]
    lines += ["## Files", "", "- `summary.json`, `summary.csv`: one row per case, batch and variant "
              "(schema: README, *summary.json*)", "- `kernels.csv`: per-kernel cost of each solver's strategy "
              f"(`{o.get('oracle')}` oracle rows)", "- `numerics.csv`: the numerics table above"]
    if summary.get("profile"):
        lines += ["- `profile.csv`: every GPU kernel of each measured variant, calls and us per call"]
    lines += ["- `vtog/`: VTOG JSON per case and points-to pictures; `strategies/`: chosen edges per solver", ""]
    return "\n".join(lines)


def floor_section(summary: dict[str, Any]) -> list[str]:
    """Each variant's latency over its case's HBM / compute floor (breakdown.floors)."""
    rows = [r for r in summary["rows"] if r.get("x_floor")]
    if not rows:
        return []
    from .floors import preset_of
    hw = summary["config"].get("hardware")
    lines = ["## Against the hardware floor", "",
             "Floor: every graph input read once and every output written once at the measured bandwidth of the "
             f"GPU that measured the row (a modelled row: the {hw} preset's), or its FLOPs at peak, whichever is "
             "longer (per kernel: `floor_us` and `x_floor` in kernels.csv).", "",
             f"| case | batch | GPU | floor us | variant | latency us ({latency_word(summary)}) | x floor |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['batch']} | {preset_of(r.get('machine'), hw)} | {_fmt(r['floor_us'])} | "
                     f"{r['variant']} | {_fmt(r['latency_us'])} | {_fmt(r['x_floor'], '.2f')} |")
    return lines + [""]


def accuracy_section(summary: dict[str, Any]) -> list[str]:
    """Each measured strategy's latency as its oracle predicted it: how far the search's model was off."""
    rows = [r for r in summary["rows"] if r.get("predicted_latency_us") and r.get("measured_latency_us")]
    if not rows:
        return []
    oracle = summary.get("oracle", {}).get("oracle", "the run's oracle")
    lines = ["## Oracle accuracy", "", f"Each strategy's predicted latency (by the oracle that searched it: {oracle}, "
             "or the one its solver entry names, `solver@oracle`) against its measured latency; the predictions "
             "sum kernels timed or modelled alone, so launch gaps and cache effects between kernels are the "
             "usual difference.", "",
             "| case | batch | variant | predicted us | measured us | predicted / measured |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['batch']} | {r['variant']} | {_fmt(r['predicted_latency_us'])} | "
                     f"{_fmt(r['measured_latency_us'])} | "
                     f"{_fmt(r['predicted_latency_us'] / r['measured_latency_us'], '.2f')} |")
    return lines + [""]


def steps_section(summary: dict[str, Any]) -> list[str]:
    """Per variant: its steps timed alone (steps.csv), their sum, and the step furthest from its floor."""
    steps = summary.get("steps") or []
    if not steps:
        return []
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in steps:
        groups.setdefault((r["case"], r["batch"], r["variant"]), []).append(r)
    lines = ["## Steps timed alone", "", "Every kernel and copy of each realized strategy timed alone "
             "(`steps.csv`).", "", "| case | batch | variant | steps | sum us | furthest from floor |",
             "|---|---|---|---|---|---|"]
    for (case, batch, variant), rs in groups.items():
        total = sum(r["measured_us"] or 0.0 for r in rs)
        worst = max((r for r in rs if r.get("x_floor")), key=lambda r: r["x_floor"], default=None)
        far = f"{worst['step']} ({worst['x_floor']:.1f}x)" if worst else "-"
        lines.append(f"| {case} | {batch} | {variant} | {len(rs)} | {total:.1f} | {far} |")
    return lines + [""]


def profile_section(summary: dict[str, Any], top: int = 6) -> list[str]:
    """Per measured variant: its kernels taking the most time per call (profile.csv), movement ones marked."""
    prof = summary.get("profile") or []
    if not prof:
        return []
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in prof:
        groups.setdefault((r["case"], r["batch"], r["variant"]), []).append(r)
    lines = ["## Kernels profiled", "", f"Each measured variant's {top} costliest GPU kernels per call (torch.profiler, "
             "outside CUDA graphs; every kernel in `profile.csv`); *movement* marks a kernel that only moves data.",
             "", "| case | batch | variant | kernels | kernel | calls | us | share |", "|---|---|---|---|---|---|---|---|"]
    for (case, batch, variant), rs in groups.items():
        total = sum(r["us"] or 0.0 for r in rs)
        for i, r in enumerate(sorted(rs, key=lambda r: -(r["us"] or 0.0))[:top]):
            name = r["kernel"] if len(r["kernel"]) <= 60 else r["kernel"][:57] + "..."
            head = f"| {case} | {batch} | {variant} | {sum(x['calls'] or 0 for x in rs):.0f} |" if i == 0 else \
                "| | | | |"
            lines.append(f"{head} `{name}`{' *movement*' if r.get('movement') else ''} | {r['calls']:.0f} | "
                         f"{r['us']:.1f} | {100 * (r['us'] or 0) / max(total, 1e-9):.0f}% |")
    return lines + [""]


def conv_section(summary: dict[str, Any]) -> list[str]:
    """Per conv kernel: the Triton conv of each strategy (through maps, dense for vtc_none) against cuDNN."""
    convs = summary.get("conv_layers") or []
    if not convs:
        return []
    variants = list(dict.fromkeys(r["variant"] for r in convs))
    by_kernel: dict[tuple, dict[str, Any]] = {}
    for r in convs:
        k = by_kernel.setdefault((r["case"], r["batch"], r["kernel"]), {"row": r, "cudnn": r["cudnn_us"]})
        k[r["variant"]] = r["triton_us"]
    lines = ["## Conv layers against cuDNN", "", "Each conv kernel (with its fused epilogue) as realized by each "
             "strategy, and cuDNN's conv alone on dense operands of the same shapes (`conv_layers.csv`), us.", "",
             "| case | batch | kernel | x | w | groups | " + " | ".join(f"Triton {v}" for v in variants)
             + " | cuDNN |", "|---|---|---|---|---|---|" + "---|" * (len(variants) + 1)]
    for (case, batch, kernel), k in by_kernel.items():
        r = k["row"]
        lines.append(f"| {case} | {batch} | {kernel} | {r['x']} | {r['w']} | {r['groups']} | "
                     + " | ".join(_fmt(k.get(v)) for v in variants) + f" | {_fmt(k['cudnn'])} |")
    return lines + [""]


# ---------------------------------------------------------------------------
# console
# ---------------------------------------------------------------------------
def print_table(summary: dict[str, Any]) -> None:
    """The results as a rich table on stdout; variants that did not run are listed under it, once per reason."""
    from rich.console import Console
    from rich.table import Table

    measured = summary["measured"]
    word = latency_word(summary)
    t = Table(title=f"{summary['name']}: latency {word}" + ("" if measured else " (not measured: no GPU)"))
    for col in ("case", "batch", "variant", f"latency us ({word})", "x vs none",
                "x vs best baseline" if measured else None, "peak MiB", "kernels (movement)", "numerics"):
        if col:
            t.add_column(col, justify="left" if col in ("case", "variant", "numerics") else "right")
    missing: dict[tuple[str, str], list[str]] = {}
    for r in summary["rows"]:
        if r["status"] != "ok":
            missing.setdefault((r["status"], r["reason"] or ""), [])
            if r["variant"] not in missing[(r["status"], r["reason"] or "")]:
                missing[(r["status"], r["reason"] or "")].append(r["variant"])
            continue
        num = "" if r["numerics_ok"] is None else ("ok" if r["numerics_ok"] else "FAILED")
        cells = [r["case"], str(r["batch"]), r["variant"], _fmt(r["latency_us"]), _fmt(r["speedup_vs_none"], ".2f")]
        if measured:
            cells.append(_fmt(r["speedup_vs_best_baseline"], ".2f") + _dagger(r))
        cells += [_fmt(memory_of(r, measured), ".4g"),
                  f"{_fmt(r['kernels'], 'd')} ({_fmt(r['movement_kernels'], 'd')})" if r["kernels"] is not None
                  else "-", num]
        t.add_row(*cells)
    con = Console()
    if not con.is_terminal:            # a pipe or a log file: do not squeeze the table into 80 columns
        con = Console(width=140)
    con.print(t)
    for (status, reason), names in missing.items():
        con.print(f"{status}: {', '.join(names)}: {reason}", markup=False, highlight=False, soft_wrap=True)

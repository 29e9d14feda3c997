"""Per-kernel profile of vtcsearch beside torch.compile on one model, to explain a latency gap (GPU only).

    python -m experiments.profile_pair zoo --params model=tv_resnet50 --batch 1 --solver none \
        --implementations inductor,library,triton --out out/

Both run as one CUDA graph replay: vtcsearch's executable, and ``torch.compile(mode=
"max-autotune-no-cudagraphs")`` captured in one graph (the runner's ``compile_max_autotune_graph``).
``torch.profiler`` records ``--iters`` replays of each; the table lists every kernel name with its
total time per call, side by side, so the kernels that account for a gap are named.
Writes ``profile_pair.csv`` (variant, kernel, calls per replay, us per replay) under ``--out``.
"""
from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path
from typing import Any


def _parse_params(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for it in items:
        k, _, v = it.partition("=")
        out[k] = int(v) if v.isdigit() else v
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workload")
    ap.add_argument("--params", nargs="*", default=[], help="workload parameters, key=value")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--solver", default="none")
    ap.add_argument("--oracle", default="analytical")
    ap.add_argument("--implementations", default="inductor,library,triton")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--out", default="out")
    ap.add_argument("--trace", action="store_true", help="write <variant>.trace.json (Chrome trace) under --out")
    a = ap.parse_args(argv)

    import torch

    import vtcsearch
    from experiments.baselines import kernel_times
    from vtcsearch.codegen.timing import bench_side_by_side
    from experiments.workloads import build_workload

    params = {"native_dtype": True, **_parse_params(a.params)} if a.workload == "zoo" else _parse_params(a.params)
    w = build_workload(a.workload, size="full", batch=a.batch, device="cuda", **params)
    model, inputs = w.model, w.example_inputs
    t0 = time.perf_counter()
    compiled = torch.compile(model, mode="max-autotune-no-cudagraphs")
    with torch.no_grad():
        for _ in range(3):
            compiled(*inputs)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            compiled(*inputs)
    print(f"torch.compile max-autotune-no-cudagraphs: {time.perf_counter() - t0:.1f} s to compile and capture")
    t0 = time.perf_counter()
    exe = vtcsearch.compile(model, inputs, solver=a.solver, oracle=a.oracle,
                            implementations=a.implementations.split(","))
    graphed = exe.executable.cuda_graph()
    replay = lambda: graphed(*inputs)   # noqa: E731  (copies the inputs in, as a call does)
    print(f"vtcsearch ({a.solver}): {time.perf_counter() - t0:.1f} s to compile; "
          f"{exe.executable.summary()}")
    runs = {"torch_compile_graph": g.replay, f"vtc_{a.solver}": replay}
    tables = {}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    times = bench_side_by_side({name: (fn, False) for name, fn in runs.items()})   # interleaved rounds
    for name, fn in runs.items():
        tables[name] = kernel_times(fn, a.iters, str(out / f"{name}.trace.json") if a.trace else None)
        total = sum(us for _, us in tables[name].values())
        print(f"{name:22s} median {times[name].median_us:9.1f} us per replay; kernel time {total:9.1f} us, "
              f"{sum(n for n, _ in tables[name].values()):.0f} launches")
    names = sorted({k for t in tables.values() for k in t}, key=lambda k: -max(t.get(k, (0, 0))[1] for t in tables.values()))
    with open(out / "profile_pair.csv", "w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["variant", "kernel", "calls", "us"])
        for v, t in tables.items():
            for k, (n, us) in sorted(t.items(), key=lambda kv: -kv[1][1]):
                wr.writerow([v, k, n, round(us, 3)])
    cols = list(tables)
    print(f"{'kernel':80s} " + " ".join(f"{c[:18]:>18s}" for c in cols))
    for k in names[:a.top]:
        print(f"{k[:80]:80s} " + " ".join(f"{tables[c].get(k, (0, 0))[1]:9.1f} ({tables[c].get(k, (0, 0))[0]:3.0f})"
                                             for c in cols))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

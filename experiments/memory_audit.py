"""Where a realized strategy's memory goes on the GPU: bytes held after building and after the CUDA-graph capture
and a replay, and the live CUDA tensors that hold them (issue 15, peak memory).

    python3 -m experiments.memory_audit configs/llama3_8b.yaml --case decode --batch 1 --solver ilp

The strategy is the one the runner chose and wrote (``<output>/strategies/<case>-bs<batch>_<solver>.json``), so
nothing is searched again.

The runner's peak (``measured_peak_bytes``) is what a variant holds after building plus one call's transient
peak; this splits the held part by owner: the executable's own storages and slab (``allocated_bytes``), and every
other live CUDA tensor found through the garbage collector, grouped by shape and dtype, with the type of the
object that refers to it.  The transient part is one plain call's: the blocks live at its peak, largest first,
with the frames (vtcsearch's, Inductor's generated code) that allocated them, from the allocator's history.
"""
from __future__ import annotations

import argparse
import collections
import gc
import sys
import warnings

import torch


def _live_cuda() -> dict[int, torch.Tensor]:
    """Live CUDA tensors by storage pointer (views of one storage counted once)."""
    gc.collect()
    out: dict[int, torch.Tensor] = {}
    warnings.filterwarnings("ignore")   # touching every object warns about deprecated ones
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.Tensor) and obj.is_cuda:
                out.setdefault(obj.untyped_storage().data_ptr(), obj)
        except Exception:   # a half-built object, a fake tensor: not device memory
            continue
    return out


def _owner(t: torch.Tensor) -> str:
    names = []
    for ref in gc.get_referrers(t):
        if isinstance(ref, dict):
            for ref2 in gc.get_referrers(ref):
                if hasattr(ref2, "__dict__") and ref2.__dict__ is ref:
                    names.append(type(ref2).__qualname__)
            names.append("dict")
        else:
            names.append(type(ref).__qualname__)
    return ",".join(sorted(set(names)))[:80]


def _frames(block: dict) -> str:
    """The frames of an allocation that say who made it: vtcsearch's and Inductor's generated code."""
    keep = [f"{f['filename'].rsplit('/', 1)[-1]}:{f['line']}:{f['name']}" for f in block.get("frames", [])
            if any(k in f["filename"] for k in ("vtcsearch", "inductor", "experiments"))]
    return " <- ".join(keep[:4])


def transient_blocks(call, top: int = 15) -> tuple[int, list[tuple[int, str]]]:
    """One plain call's transient peak (bytes over what is live before it) and the ``top`` blocks live at that
    peak as (bytes, frames), replayed from the allocator's history of the call."""
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    try:
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = call()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        snap = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    del out
    live: dict[int, dict] = {}
    now, best, at_peak = 0, -1, {}
    for trace in snap["device_traces"]:
        for ev in trace:
            if ev["action"] == "alloc":
                live[ev["addr"]] = ev
                now += ev["size"]
            elif ev["action"] == "free_requested" and ev["addr"] in live:
                now -= live.pop(ev["addr"])["size"]
            if now > best:
                best, at_peak = now, dict(live)
    blocks = sorted(at_peak.values(), key=lambda e: -e["size"])[:top]
    return int(peak), [(b["size"], _frames(b)) for b in blocks]


def main(argv: list[str]) -> None:
    import json
    from pathlib import Path

    from experiments.baselines import warm_streams
    from experiments.workloads import build_workload
    from vtcsearch.codegen.realize import realize
    from vtcsearch.config import load_config, torch_dtype
    from vtcsearch.core.strategy import Strategy
    from vtcsearch.core.vtog import build_vtog
    from vtcsearch.run import capture_graph, case_label, file_id

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("--case", default=None, help="a case label of the config (default: its first)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--solver", default="ilp")
    args = ap.parse_args(argv)
    cfg = load_config(args.config)
    wl = cfg.workload
    labels = [case_label(p, wl.name) for p in wl.cases]
    label = args.case or labels[0]
    if label not in labels:
        raise SystemExit(f"no case {label!r} in {args.config}; cases: {', '.join(labels)}")
    params = wl.cases[labels.index(label)]
    path = Path(cfg.output) / "strategies" / f"{file_id(label, args.batch)}_{args.solver}.json"
    if not path.exists():
        raise SystemExit(f"no strategy {path}: run the runner on this case with --solvers {args.solver} first")
    torch.manual_seed(cfg.seed)
    w = build_workload(wl.name, size=wl.size, batch=args.batch, device="cuda", dtype=torch_dtype(cfg.dtype),
                       **{**wl.params, **params})
    graph = capture_graph(cfg, w)
    strategy = Strategy.from_json(build_vtog(graph), json.loads(path.read_text()))
    warm_streams()
    torch.cuda.synchronize()
    before = _live_cuda()
    base = torch.cuda.memory_allocated()
    exe = realize(graph, strategy, w.model, inputs=w.example_inputs)
    torch.cuda.synchronize()
    built = torch.cuda.memory_allocated() - base
    call = exe.cuda_graph(*w.example_inputs)
    call.replay()
    torch.cuda.synchronize()
    captured = torch.cuda.memory_allocated() - base
    mib = 1 << 20
    print(f"{cfg.name} {label} bs{args.batch} {args.solver}: held after build {built / mib:.2f} MiB, after "
          f"capture {captured / mib:.2f} MiB; executable allocated_bytes {exe.allocated_bytes / mib:.2f} MiB; "
          f"folded {len(exe.folded)}")
    own = {s.untyped_storage().data_ptr() for s in exe.storages.values()}
    groups: collections.Counter = collections.Counter()
    owners: dict = {}
    for ptr, t in _live_cuda().items():
        if ptr in before or ptr in own:
            continue
        key = (tuple(t.shape), str(t.dtype).replace("torch.", ""))
        groups[key] += t.untyped_storage().nbytes()
        owners.setdefault(key, _owner(t))
    print(f"live CUDA tensors outside the executable's storages: {sum(groups.values()) / mib:.2f} MiB")
    for (shape, dtype), n in groups.most_common(20):
        print(f"  {n / mib:9.2f} MiB  {dtype:9s} {shape}  held by {owners[(shape, dtype)]}")
    with torch.no_grad():
        peak, blocks = transient_blocks(lambda: exe(*w.example_inputs))
    print(f"one plain call's transient peak: {peak / mib:.2f} MiB; the largest blocks live at it:")
    for n, where in blocks:
        print(f"  {n / mib:9.2f} MiB  {where}")


if __name__ == "__main__":
    main(sys.argv[1:])

"""Every cost query of a model's configuration space, its answer and its time (issue 13, fast cost queries).

    python3 -m experiments.query_dump shufflenet --out /tmp/q.pkl               # answers + per-query times
    python3 -m experiments.query_dump shufflenet --diff /tmp/old.pkl /tmp/new.pkl
    python3 -m experiments.query_dump shufflenet --slowest 20                   # the slowest queries, which unit
    python3 -m experiments.query_dump shufflenet --profile-slowest 10           # cProfile of those alone

A change that makes queries cheaper must not change any answer: ``--out`` writes each (unit, configuration)'s
cost as ``repr`` of its fields (byte-identical floats), ``--diff`` compares two such dumps.  Queries are asked
in :meth:`~cost_models.Accounting.configuration_space` order, as the ILP asks them, so the memos are in the
same state at query ``i`` in every fresh process: ``--profile-slowest`` runs once to time them, then again in a
new process with cProfile on only around the slowest ones (``--profile-at I,J,...``; profiling all would slow
every query, and the slowest are first touches).
Model arguments as in :mod:`experiments.query_cost`.
"""
from __future__ import annotations

import pickle
import sys
import time
from typing import Any


def _answers(name: str, params: dict, profile_at: set[int] | None = None
             ) -> tuple[list[tuple[str, tuple, str]], list[float], list[float], Any]:
    """(per query: (unit, keys, repr of the cost)), per-query wall and CPU (this thread's) seconds, the cProfile
    of ``profile_at``."""
    from cost_models import get_oracle, paused_gc
    from experiments.query_cost import _build
    from vtcsearch.core.capture import capture
    from vtcsearch.core.vtog import build_vtog

    model, inputs = _build(name, dict(params))
    vtog = build_vtog(capture(model, inputs))
    oracle = get_oracle("analytical")
    acc = oracle.accounting(vtog)
    space = acc.configuration_space()
    prof = None
    if profile_at:
        import cProfile
        prof = cProfile.Profile()
    out, times, cpu = [], [], []
    with paused_gc():
        for i, (u, keys) in enumerate(space):
            on = prof is not None and i in profile_at
            if on:
                prof.enable()
            t0, c0 = time.perf_counter(), time.thread_time()
            c = oracle.unit_cost(acc, u, keys)
            times.append(time.perf_counter() - t0)
            cpu.append(time.thread_time() - c0)
            if on:
                prof.disable()
            out.append((u.name, keys, repr((c.seconds, c.bytes, c.flops, c.feasible,
                                            sorted(c.detail.items())))))
    return out, times, cpu, prof


def main(argv: list[str]) -> None:
    from experiments.query_cost import model_params
    name = argv[0]
    params = model_params(argv)
    if "--diff" in argv:
        i = argv.index("--diff")
        a, b = (pickle.load(open(p, "rb"))["answers"] for p in argv[i + 1:i + 3])
        bad = [(x, y) for x, y in zip(a, b) if x != y]
        print(f"{len(a)} vs {len(b)} queries, {len(bad)} differ")
        for x, y in bad[:10]:
            print(" ", x, "\n  ", y)
        sys.exit(1 if bad or len(a) != len(b) else 0)
    if "--profile-at" in argv:   # a fresh process (cold memos), profiling only the queries named
        at = {int(x) for x in argv[argv.index("--profile-at") + 1].split(",")}
        _, _, _, prof = _answers(name, params, at)
        import pstats
        pstats.Stats(prof).sort_stats("tottime").print_stats(40)
        pstats.Stats(prof).sort_stats("cumulative").print_stats(60)
        return
    answers, times, cpu, _ = _answers(name, params)
    n = 20
    if "--slowest" in argv:
        n = int(argv[argv.index("--slowest") + 1])
    order = sorted(range(len(times)), key=lambda i: -times[i])
    print(f"{len(times)} queries: mean {sum(times) / len(times) * 1e3:.3f} ms, max {max(times) * 1e3:.2f} ms, "
          f"over 1 ms: {sum(t > 1e-3 for t in times)}, slowest 100: {sum(times[i] for i in order[:100]) * 1e3:.0f} ms, "
          f"total {sum(times):.2f} s; cpu: mean {sum(cpu) / len(cpu) * 1e3:.3f} ms, max {max(cpu) * 1e3:.2f} ms, "
          f"over 1 ms: {sum(t > 1e-3 for t in cpu)}")
    for i in order[:n]:
        print(f"  #{i} {times[i] * 1e3:.2f} ms {answers[i][0]} {[k[:60] for k in answers[i][1]]}")
    if "--out" in argv:
        with open(argv[argv.index("--out") + 1], "wb") as f:
            pickle.dump({"answers": answers, "times": times, "cpu": cpu}, f)
    if "--profile-slowest" in argv:   # again in a new process: this one's process-wide memos are warm now
        import subprocess
        k = int(argv[argv.index("--profile-slowest") + 1])
        model_args = [a for a in argv[1:] if "=" in a and not a.startswith("--")]
        subprocess.run([sys.executable, "-m", "experiments.query_dump", name, *model_args, "--profile-at",
                        ",".join(str(i) for i in order[:k])], check=True)


if __name__ == "__main__":
    main(sys.argv[1:])

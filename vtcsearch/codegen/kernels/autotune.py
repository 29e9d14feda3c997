"""Autotuning: the best tile configuration per key, timed once on the GPU (the first one elsewhere).

With ``VTC_TUNING_FILE`` set, the choices also go to that JSON file and come back from it in a later process on
the same GPU, torch, Triton and template source (:func:`_system`): a device call of ten minutes need not compile
and time every candidate of every template again (``experiments/h200.sh`` carries the file between calls).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Callable, Iterable, Sequence

import torch

from .codecache import _LOCK, interpreting, unrecorded, write_atomic

__all__ = ["autotune", "clear_tuning"]


_TUNED: dict[str, int] = {}
_FILED: dict[str, dict] | None = None     # the choices of VTC_TUNING_FILE, read once


@functools.lru_cache(maxsize=1)
def _system() -> str:
    """What a filed choice holds for besides its key: the GPU, torch, Triton and the templates' source (once per
    process: every choice filed asks)."""
    import triton
    src = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(Path(__file__).parent.glob("*.py"))))
    return f"{torch.cuda.get_device_name()} | torch {torch.__version__} | triton {triton.__version__} | " \
           f"templates {src.hexdigest()[:16]}"


def _filed() -> dict[str, dict]:
    """The choices in ``VTC_TUNING_FILE`` made on this system (none when unset, absent or from another)."""
    global _FILED
    if _FILED is None:
        path = os.environ.get("VTC_TUNING_FILE")
        data = json.loads(Path(path).read_text()) if path and Path(path).is_file() else {}
        _FILED = data.get("choices", {}) if data.get("system") == _system() else {}
    return _FILED


def _file(key: str, cfg: dict) -> None:
    path = os.environ.get("VTC_TUNING_FILE")
    if path:
        _filed()[key] = cfg
        write_atomic(Path(path), json.dumps({"system": _system(), "choices": _filed()}, indent=1, sort_keys=True))


def autotune(key: str, configs: Sequence[dict], run: Callable[[dict], Callable[[], None]],
             written: Iterable[torch.Tensor] = (), device: torch.device | None = None) -> dict:
    """The best of ``configs`` for ``key``: timed on the GPU once (cached), the first otherwise.

    ``run(cfg)`` compiles and returns a function launching the kernel(s) with this call's
    arguments.  ``written`` are the storages the kernels write; they are restored after
    timing, so in-place updates (a KV cache, a residual) are applied exactly once.
    """
    configs = list(configs)
    if len(configs) == 1 or interpreting() or (device is not None and device.type != "cuda") \
            or os.environ.get("VTC_AUTOTUNE", "1") == "0":
        return configs[0]
    with _LOCK:
        if key in _TUNED:
            return configs[_TUNED[key]]
        filed = _filed().get(key)
        if filed in configs:     # chosen in an earlier process: not compiled and timed again
            _TUNED[key] = configs.index(filed)
            return configs[_TUNED[key]]
    if torch.cuda.is_current_stream_capturing():
        return configs[0]
    from triton.testing import do_bench
    written = list({id(t): t for t in written}.values())
    saved = [t.clone() for t in written]
    best, best_ms = 0, float("inf")
    for i, cfg in enumerate(configs):
        try:
            with unrecorded():   # a candidate's plan keeps no arguments: the chosen one is launched again
                fn = run(cfg)
                ms = do_bench(fn, warmup=5, rep=25)
        except Exception:  # a config that does not compile or fit (shared memory) is skipped
            ms = float("inf")
        if ms < best_ms:
            best, best_ms = i, ms
    for t, s in zip(written, saved):
        t.copy_(s)
    with _LOCK:
        _TUNED[key] = best
        _file(key, configs[best])
    return configs[best]


def clear_tuning() -> None:
    """Forget every tuning decision (those of ``VTC_TUNING_FILE`` are read again when next asked)."""
    global _FILED
    with _LOCK:
        _TUNED.clear()
        _FILED = None

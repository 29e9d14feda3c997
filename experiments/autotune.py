"""Keep the autotuning choices device calls bring back, across calls and sessions.

    python -m experiments.autotune FILES_AT/autotune.tgz experiments/autotune

A device call returns what it tuned as ``$OUT/autotune.tgz`` (``experiments/h200.sh``; a folder works too): Inductor's local autotune
cache (``inductor/``, one JSON per GPU name, Triton and CUDA: its timings of every GEMM and convolution choice)
and vtcsearch's template choices (``vtc-tuning.json``).  This merges them into the tracked folder, which every
later call starts from, so a model's baseline is not autotuned again from nothing in each session (YOLO11n bs 16
spent 358 of its 452 s in Inductor's benchmarking on an H100).  The choices are measurements of the GPU named in
each key; a call on another GPU, torch or Triton misses them and tunes afresh.  The runner's report says when a
run reused them (``VTC_REUSED_AUTOTUNE``).
"""
from __future__ import annotations

import json
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any


def merged(old: Any, new: Any) -> Any:
    """``new`` over ``old``: dicts key by key (both kept), anything else the newer value."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = dict(old)
        for k, v in new.items():
            out[k] = merged(old[k], v) if k in old else v
        return out
    return new


def merge_file(src: Path, dst: Path) -> None:
    """``src`` into ``dst``: the union of two JSON files; a copy where ``dst`` is new, either is not JSON, or the
    two were made on different systems (``"system"``: vtcsearch's tuning file is valid for one GPU and software)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists():
        try:
            old, new = json.loads(dst.read_text()), json.loads(src.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            old = new = None
        same_system = isinstance(old, dict) and isinstance(new, dict) and old.get("system") == new.get("system")
        if same_system:
            dst.write_text(json.dumps(merged(old, new), indent=1, sort_keys=True) + "\n")
        else:   # not JSON, or choices made on another system (vtc-tuning.json holds one): the newer file
            dst.unlink()
            shutil.copyfile(src, dst)
    else:
        shutil.copyfile(src, dst)
    dst.chmod(0o644)       # a call's files come back read-only


def merge_tree(src: Path, dst: Path) -> int:
    """Every file under ``src`` (a folder, or a tarball holding ``autotune/``) merged into the same path under
    ``dst``; returns how many."""
    if src.is_file():
        with tempfile.TemporaryDirectory() as tmp, tarfile.open(src) as tar:
            tar.extractall(tmp, filter="data")
            return merge_tree(Path(tmp) / "autotune", dst)
    n = 0
    for f in sorted(p for p in src.rglob("*") if p.is_file()):
        merge_file(f, dst / f.relative_to(src))
        n += 1
    return n


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    print(f"merged {merge_tree(Path(sys.argv[1]), Path(sys.argv[2]))} files into {sys.argv[2]}")

"""Random VTOGs: random programs of DNN motifs, captured through the real capture -> VTOG path.

A program is a sequence of motifs over a pool of live ``[B, S, D]`` tensors,
each the shape of a pattern the paper's workloads contain: linear layers
(view + mm + view), head split/merge (view + transpose), Split -> compute ->
Concat (YOLO's C3k2), GQA's unsqueeze + expand + reshape, slices, a constant
Pad, channel-shuffle-like reshape/transpose/reshape, residual adds, and a
KV-cache-like in-place buffer update followed by a slice.  The module is built
on the ``meta`` device by default (no memory; shapes can be large) and
captured with :func:`vtcsearch.core.capture.capture`, so the VTOG carries real ops,
maps and fx nodes: every oracle, the profiling one included, works on it.

    from experiments.synthetic import random_vtog
    v = random_vtog(n_motifs=12, seed=3)            # a small one
    v = random_vtog(target_nodes=2000, seed=0)      # about 2,000 VTOG nodes
"""
from __future__ import annotations

import random
import warnings
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

MOTIFS = ("linear", "act", "softmax", "heads", "split_cat", "gqa", "slice", "cache", "pad", "shuffle",
          "residual", "stack")
# relative frequencies, roughly those of transformer and CNN blocks
WEIGHTS = {"linear": 3, "act": 2, "softmax": 1, "heads": 2, "split_cat": 2, "gqa": 1, "slice": 1, "cache": 1,
           "pad": 1, "shuffle": 1, "residual": 2, "stack": 1}
NODES_PER_MOTIF = 2.0   # average VTOG nodes a motif adds (measured on seeds 0..9; ~2,000 at 1,000 motifs)


@dataclass
class SyntheticConfig:
    n_motifs: int = 10
    seed: int = 0
    batch: int = 2
    seq: int = 8
    dims: Sequence[int] = (32, 64, 128)
    heads: int = 4
    dtype: torch.dtype = torch.float32
    motifs: Sequence[str] = MOTIFS
    outputs: int = 2


@dataclass
class Step:
    motif: str
    src: int
    other: int | None = None
    param: str | None = None
    arg: Any = None


class RandomProgram(nn.Module):
    """Interprets a list of :class:`Step` s over a pool of tensors (torch.export traces it flat)."""

    def __init__(self, cfg: SyntheticConfig):
        super().__init__()
        self.cfg = cfg
        rng = random.Random(cfg.seed)
        self.steps: list[Step] = []
        shapes: list[int] = [rng.choice(cfg.dims)]          # last-dim of each pool tensor
        names = [m for m in cfg.motifs]
        w = [WEIGHTS.get(m, 1) for m in names]
        n_param = n_cache = 0
        for _ in range(cfg.n_motifs):
            m = rng.choices(names, w)[0]
            src = len(shapes) - 1 - min(int(rng.expovariate(0.7)), len(shapes) - 1)   # recent tensors mostly
            d = shapes[src]
            step = Step(m, src)
            out = d
            if m == "linear":
                out = rng.choice(cfg.dims)
                step.param = f"w{n_param}"
                n_param += 1
                self.register_parameter(step.param, nn.Parameter(torch.randn(d, out) / d ** 0.5,
                                                                 requires_grad=False))
            elif m == "residual":
                same = [k for k, s in enumerate(shapes) if s == d and k != src]
                if not same:
                    m = step.motif = "act"
                else:
                    step.other = rng.choice(same)
            elif m == "split_cat":
                step.arg = rng.choice([k for k in range(1, 4) if d % 4 == 0]) * d // 4
            elif m == "slice":
                step.arg = d // 2
                out = d // 2 if d >= 2 * min(cfg.dims) else d
                if out == d:
                    m = step.motif = "act"
            elif m == "pad":
                step.arg = 4
            elif m == "cache":
                step.param = f"c{n_cache}"
                n_cache += 1
                t = cfg.seq * 3
                self.register_buffer(step.param, torch.zeros(cfg.batch + 1, t, d))   # room for a larger batch
                step.arg = rng.randrange(0, t - cfg.seq)
            elif m == "gqa":
                step.arg = rng.choice([2, 4])
            self.steps.append(step)
            shapes.append(out)
        self.dims = shapes

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        cfg = self.cfg
        B, S = cfg.batch, cfg.seq
        pool = [x]
        for st in self.steps:
            a = pool[st.src]
            d = a.shape[-1]
            m = st.motif
            if m == "linear":
                y = a @ getattr(self, st.param)
            elif m == "act":
                y = torch.relu(a) * 1.5
            elif m == "softmax":
                y = torch.softmax(a, dim=-1)
            elif m == "heads":
                h = cfg.heads if d % cfg.heads == 0 else 1
                t = a.view(B, S, h, d // h).transpose(1, 2)
                t = torch.softmax(t * 0.5, dim=-1)
                y = t.transpose(1, 2).reshape(B, S, d)
            elif m == "split_cat":
                p, q = a.split([st.arg, d - st.arg], dim=-1)
                y = torch.cat([torch.sigmoid(q), p * 2.0], dim=-1)
            elif m == "gqa":
                r = st.arg
                h = cfg.heads if d % cfg.heads == 0 else 1
                kv = a.view(B, S, h, d // h)
                e = kv[:, :, :, None, :].expand(B, S, h, r, d // h).reshape(B, S, h * r, d // h)
                y = e.sum(dim=2) * (1.0 / r)
                y = torch.relu(y).repeat(1, 1, h)
            elif m == "slice":
                y = torch.relu(a[..., : st.arg])
            elif m == "cache":
                # a KV-cache update as Llama writes it: nested slice-assign of a kernel's output
                c = getattr(self, st.param)
                c[:B, st.arg: st.arg + S] = a * 0.5
                win = c[:B, : st.arg + S]
                y = a + win.mean(dim=1, keepdim=True)
            elif m == "pad":
                y = F.pad(a, (0, st.arg))
                y = torch.tanh(y)[..., :d]
            elif m == "shuffle":
                g = 2 if d % 2 == 0 else 1
                y = a.view(B, S, g, d // g).transpose(2, 3).reshape(B, S, d) + 1.0
            elif m == "residual":
                y = a + pool[st.other]
            elif m == "stack":
                y = torch.stack([a, torch.relu(a)], dim=2).sum(dim=2)
            else:
                raise ValueError(m)
            pool.append(y)
        k = max(1, min(cfg.outputs, len(pool) - 1))
        return tuple(pool[-k:])


def random_program(cfg: SyntheticConfig, device: str | torch.device = "meta") -> tuple[RandomProgram, tuple]:
    """The module and its example input (``device="cpu"`` for real runs)."""
    with torch.device(device):
        m = RandomProgram(cfg).to(cfg.dtype)
        x = torch.randn(cfg.batch, cfg.seq, m.dims[0], dtype=cfg.dtype)
    return m.eval(), (x,)


def random_graph(cfg: SyntheticConfig, device: str | torch.device = "meta"):
    from vtcsearch.core.capture import capture
    m, args = random_program(cfg, device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return capture(m, args)


def random_vtog(n_motifs: int | None = None, seed: int = 0, target_nodes: int | None = None,
                device: str | torch.device = "meta", **cfg_kw: Any):
    """A VTOG of a random program: ``n_motifs`` motifs, or enough for about ``target_nodes`` VTOG nodes."""
    from vtcsearch.core.vtog import build_vtog
    if n_motifs is None:
        n_motifs = max(1, round((target_nodes or 30) / NODES_PER_MOTIF))
    cfg = SyntheticConfig(n_motifs=n_motifs, seed=seed, **cfg_kw)
    v = build_vtog(random_graph(cfg, device))
    v.synthetic = cfg  # type: ignore[attr-defined]
    return v


def small_vtogs(count: int, max_points: int = 4096, seed: int = 0, motifs: tuple[int, int] = (1, 4),
                **cfg_kw: Any) -> list:
    """``count`` random VTOGs whose exhaustive search space is at most ``max_points`` (for exactness tests)."""
    from math import prod
    rng = random.Random(seed)
    out = []
    s = seed * 1000
    while len(out) < count:
        s += 1
        v = random_vtog(rng.randint(*motifs), seed=s, **cfg_kw)
        opts: dict[str, int] = {}
        for o in v.options:
            opts[o.tensor] = opts.get(o.tensor, 0) + 1
        pts = prod(1 + k for k in opts.values())
        if 2 <= pts <= max_points:
            out.append(v)
    return out

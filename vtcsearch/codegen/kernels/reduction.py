"""Row reductions over the last dim — softmax, RMSNorm, LayerNorm — operands through their maps.

* ``softmax(x, out, scale=1.0)``: ``out = softmax(scale * x, dim=-1)``;
* ``rmsnorm(x, weight, out, eps, weight_offset=0.0, residual=None, residual_out=None)``:
  ``h = x (+ residual)``, optionally written to ``residual_out`` (the fused
  add-then-norm of a pre-norm block), ``out = h * rsqrt(mean(h^2) + eps) * (weight + weight_offset)``
  (Gemma's norm is ``weight_offset=1.0``);
* ``layernorm(x, weight, bias, out, eps)``: ``out = (x - mean) * rsqrt(var + eps) * weight + bias``.

Statistics are fp32.  ``weight``/``bias`` are any operands broadcastable to ``x``
(usually [C]); ``None`` means 1 / 0.  Rows that fit one tile are reduced in one pass
(several rows per program when they are short); longer rows loop over column blocks.
"""
from __future__ import annotations

from typing import Sequence

from .codecache import Plan, compile_source, interpreting, key_of, plan_cache
from .emit import IO, elementwise_tiling, next_pow2, render
from .operand import Operand

_TEMPLATE = """
@triton.jit
def @NAME@(@params@):
    @@prologue
    @@pid
    @@body
"""


def _config(shape: Sequence[int], gpu: bool, block_c: int | None) -> tuple[int, int, bool]:
    C, R = shape[-1], shape[-2]
    maxc = 16384 if gpu else 4096
    BC = block_c or min(next_pow2(C), maxc)
    single = BC >= C
    BR = max(1, min(next_pow2(R), (4096 if gpu else 4096) // BC)) if single else 1
    return BR, BC, single


def _prep(x: Operand, others: Sequence[Operand | None]) -> tuple[Operand, list[Operand | None]]:
    if x.ndim == 0:
        raise ValueError("row reductions need at least one dim")
    shape = x.shape
    x2 = x.reshape((1, shape[0])) if x.ndim == 1 else x
    outs = []
    for o in others:
        if o is None:
            outs.append(None)
            continue
        o = o.broadcast_to(shape) if o.shape != shape else o
        outs.append(o.reshape((1, shape[0])) if x.ndim == 1 else o)
    return x2, outs


class _Gen:
    """Code generation context of one row-reduction kernel."""

    def __init__(self, shape, BR, BC, single, ops: dict[str, Operand]):
        self.shape, self.BR, self.BC, self.single = shape, BR, BC, single
        self.C = shape[-1]
        self.t = elementwise_tiling(shape, BR, BC, col_start=None if single else "c0")
        self.ios = {k: IO(o, k) for k, o in ops.items() if o is not None}
        cm = None
        if not single and self.C % BC:
            cm = f"(rc[None, :] < {self.C})"
        self.mask = " & ".join(m for m in (self.t.mask, cm) if m) or None
        self.tile = self.t.tile

    def load(self, name: str, var: str, other: float = 0.0) -> list[str]:
        return self.ios[name].load(var, self.t.idx, shape=self.tile, mask=self.mask, block=self.t.block, other=other)

    def store(self, name: str, value: str) -> list[str]:
        return self.ios[name].store(value, self.t.idx, mask=self.mask, block=self.t.block)

    def col_loop(self, body: list[str]) -> list[str]:
        if self.single:
            return body
        return [f"for c0 in range(0, {self.C}, {self.BC}):",
                f"    rc = c0 + tl.arange(0, {self.BC})"] + ["    " + b for b in body]

    def masked(self, var: str, value: str = "0.0") -> list[str]:
        return [f"{var} = tl.where({self.mask}, {var}, {value})"] if self.mask else []

    def finish(self, name: str, body: list[str], gpu: bool) -> Plan:
        params, prologue = [], []
        for io in self.ios.values():
            params += io.params()
            prologue += io.prologue()
        src = render(_TEMPLATE, NAME=name, params=params, prologue=prologue, pid=self.t.pid_lines, body=body)
        kern = compile_source(name, src)
        warps = 4 if self.BC * self.BR <= 2048 else (8 if self.BC * self.BR <= 8192 else 16)
        return Plan(name, kern, self.t.grid, {}, {"num_warps": warps if gpu else 4}, src,
                    {k: io.modes for k, io in self.ios.items()}, {"BR": self.BR, "BC": self.BC, "single": self.single})


def _launch(name: str, ops: dict[str, Operand | None], key_extra, build) -> Plan:
    x = ops["x"]
    gpu = not interpreting() and x.device.type == "cuda"
    key = key_of(name, [(k, o.signature() if o is not None else None) for k, o in ops.items()], key_extra)
    plan = plan_cache(key, lambda: build(gpu))
    args = [a for o in ops.values() if o is not None for a in o.kernel_args()]
    plan.launch(args)
    return plan


def rmsnorm(x: Operand, weight: Operand | None, out: Operand, eps: float = 1e-6, *,
            weight_offset: float = 0.0, residual: Operand | None = None,
            residual_out: Operand | None = None, block_c: int | None = None) -> Plan:
    """RMSNorm over the last dim (optionally fused with a preceding residual add)."""
    x2, (w, o, r, ro) = _prep(x, [weight, out, residual, residual_out])
    if ro is not None and r is None:
        raise ValueError("residual_out needs a residual")
    ops = {"x": x2, "r": r, "w": w, "out": o, "ro": ro}
    shape = x2.shape
    C = shape[-1]

    def build(gpu: bool) -> Plan:
        BR, BC, single = _config(shape, gpu, block_c)
        g = _Gen(shape, BR, BC, single, ops)
        h = g.load("x", "h")
        if r is not None:
            h += g.load("r", "res") + ["h = h + res"]
        wv = (g.load("w", "w") + ([f"w = w + {float(weight_offset)!r}"] if weight_offset else [])) \
            if w is not None else [f"w = {1.0 + float(weight_offset)!r}"]
        if single:
            body = ["# stage 1: load the rows through their maps"] + h
            if ro is not None:
                body += ["# stage 3: the residual sum"] + g.store("ro", "h")
            body += ["# stage 2: statistics in fp32", f"rstd = tl.rsqrt(tl.sum(h * h, 1) / {C} + {float(eps)!r})"]
            body += wv + ["y = h * rstd[:, None] * w", "# stage 3: store through the output map"] + g.store("out", "y")
            return g.finish("rmsnorm_kernel", body, gpu)
        acc = ["acc = tl.zeros(" + g.tile + ", tl.float32)"]
        p1 = h + (g.store("ro", "h") if ro is not None else []) + ["acc += h * h"]
        p2 = h + wv + ["y = h * rstd[:, None] * w"] + g.store("out", "y")
        body = acc + g.col_loop(p1) + [f"rstd = tl.rsqrt(tl.sum(acc, 1) / {C} + {float(eps)!r})"] + g.col_loop(p2)
        return g.finish("rmsnorm_kernel", body, gpu)

    return _launch("rmsnorm", ops, (eps, weight_offset, block_c), build)


def layernorm(x: Operand, weight: Operand | None, bias: Operand | None, out: Operand, eps: float = 1e-5, *,
              block_c: int | None = None) -> Plan:
    """LayerNorm over the last dim."""
    x2, (w, bb, o) = _prep(x, [weight, bias, out])
    ops = {"x": x2, "w": w, "b": bb, "out": o}
    shape = x2.shape
    C = shape[-1]

    def build(gpu: bool) -> Plan:
        BR, BC, single = _config(shape, gpu, block_c)
        g = _Gen(shape, BR, BC, single, ops)
        wv = g.load("w", "w") if w is not None else ["w = 1.0"]
        bv = g.load("b", "bb") if bb is not None else ["bb = 0.0"]
        if single:
            body = g.load("x", "h") + [f"mean = tl.sum(h, 1) / {C}", "hc = h - mean[:, None]"] + g.masked("hc") + \
                [f"rstd = tl.rsqrt(tl.sum(hc * hc, 1) / {C} + {float(eps)!r})"] + wv + bv + \
                ["y = hc * rstd[:, None] * w + bb"] + g.store("out", "y")
            return g.finish("layernorm_kernel", body, gpu)
        body = [f"s1 = tl.zeros({g.tile}, tl.float32)"]
        body += g.col_loop(g.load("x", "h") + ["s1 += h"])
        body += [f"mean = tl.sum(s1, 1) / {C}", f"s2 = tl.zeros({g.tile}, tl.float32)"]
        body += g.col_loop(g.load("x", "h") + ["hc = h - mean[:, None]"] + g.masked("hc") + ["s2 += hc * hc"])
        body += [f"rstd = tl.rsqrt(tl.sum(s2, 1) / {C} + {float(eps)!r})"]
        body += g.col_loop(g.load("x", "h") + wv + bv + ["y = (h - mean[:, None]) * rstd[:, None] * w + bb"]
                           + g.store("out", "y"))
        return g.finish("layernorm_kernel", body, gpu)

    return _launch("layernorm", ops, (eps, block_c), build)


def softmax(x: Operand, out: Operand, *, scale: float = 1.0, block_c: int | None = None) -> Plan:
    """Softmax over the last dim (fp32), of ``scale * x``."""
    x2, (o,) = _prep(x, [out])
    ops = {"x": x2, "out": o}
    shape = x2.shape
    sc = [f"h = h * {float(scale)!r}"] if scale != 1.0 else []

    def build(gpu: bool) -> Plan:
        BR, BC, single = _config(shape, gpu, block_c)
        g = _Gen(shape, BR, BC, single, ops)
        ninf = '-float("inf")'
        h = g.load("x", "h") + sc + g.masked("h", ninf)
        if single:
            body = h + ["m = tl.max(h, 1)", f"m = tl.where(m == {ninf}, 0.0, m)", "e = tl.exp(h - m[:, None])", "y = e / tl.sum(e, 1)[:, None]"] + \
                g.store("out", "y")
            return g.finish("softmax_kernel", body, gpu)
        rows = f"({g.BR},)"
        body = [f"m_i = tl.full({rows}, {ninf}, tl.float32)", f"l_i = tl.zeros({rows}, tl.float32)"]
        body += g.col_loop(h + ["m_new = tl.maximum(m_i, tl.max(h, 1))",
                                f"m_use = tl.where(m_new == {ninf}, 0.0, m_new)",
                                "l_i = l_i * tl.exp(m_i - m_use) + tl.sum(tl.exp(h - m_use[:, None]), 1)",
                                "m_i = m_new"])
        body += [f"m_i = tl.where(m_i == {ninf}, 0.0, m_i)"]
        body += g.col_loop(h + ["y = tl.exp(h - m_i[:, None]) / l_i[:, None]"] + g.store("out", "y"))
        return g.finish("softmax_kernel", body, gpu)

    return _launch("softmax", ops, (scale, block_c), build)

"""Fused n-ary pointwise kernels with broadcasting, every operand through its map.

``pointwise("x0 * vtc_silu(x1)", [a, b], out)`` computes ``out = a * silu(b)``
elementwise over ``out``'s shape; inputs of smaller shapes broadcast (NumPy rules),
Python numbers are constants.  Several outputs: a list of expressions and a list of
output operands of one shape.  Arithmetic is in fp32; each store casts to its storage.
"""
from __future__ import annotations

import re
from typing import Sequence

from .codecache import Plan, compile_source, interpreting, key_of, plan_cache
from .emit import IO, const_code, elementwise_tiling, next_pow2, render
from .operand import Operand

_TEMPLATE = """
@triton.jit
def pointwise_kernel(@params@):
    @@prologue
    @@pid
    # stage 1: load every input through its map
    @@loads
    # stage 2: compute
    @@compute
    # stage 3: store through the output maps
    @@stores
"""


def tile_config(shape: Sequence[int], gpu: bool) -> tuple[int, int]:
    """(BR, BC) for an elementwise tile over the last two dims."""
    C = shape[-1] if shape else 1
    R = shape[-2] if len(shape) >= 2 else 1
    cap = 1024 if gpu else 4096     # on a GPU, small tensors still spread over many programs
    BC = min(next_pow2(C), 1024 if gpu else 512)
    BR = max(1, min(next_pow2(R), cap // BC)) if len(shape) >= 2 else 1
    return BR, BC


def index_codes(code: str, idx: Sequence[str]) -> str:
    """Replace ``{iK}`` in ``code`` by the tile's index code of dim ``K``."""
    return re.sub(r"\{i(\d+)\}", lambda m: f"({idx[int(m.group(1))]})", code)


def _as_nd(op: Operand) -> Operand:
    return op.reshape((1,)) if op.ndim == 0 else op


def pointwise(fn: str | Sequence[str], inputs: Sequence[Operand | float | int],
              out: Operand | Sequence[Operand], prelude: Sequence[str] = ()) -> Plan:
    """Elementwise ``out_j = fn_j(x0, x1, ...)`` with ``x_k`` the inputs (broadcast to the outputs' shape).

    ``prelude``: lines run before the expressions (temporaries they share).  In both,
    ``{iK}`` stands for the index of output dim ``K`` (e.g. ``tl.where({i3} == 0, x0, x1)``).
    """
    fns = [fn] if isinstance(fn, str) else list(fn)
    prelude = list(prelude)
    outs = [out] if isinstance(out, Operand) else list(out)
    if len(fns) != len(outs):
        raise ValueError(f"{len(fns)} expressions for {len(outs)} outputs")
    outs = [_as_nd(o) for o in outs]
    shape = outs[0].shape
    if any(o.shape != shape for o in outs):
        raise ValueError("all outputs of a pointwise kernel need one shape")
    ins: list[Operand | float] = []
    for x in inputs:
        if isinstance(x, Operand):
            x = _as_nd(x)
            ins.append(x.broadcast_to(shape) if x.shape != shape else x)
        else:
            ins.append(float(x))
    for f in fns:
        for m in re.findall(r"\bx(\d+)\b", f):
            if int(m) >= len(ins):
                raise ValueError(f"expression {f!r} uses x{m} but only {len(ins)} inputs are given")
    gpu = not interpreting() and outs[0].device.type == "cuda"
    BR, BC = tile_config(shape, gpu)
    sig = [o.signature() for o in outs] + [x.signature() if isinstance(x, Operand) else repr(x) for x in ins]
    key = key_of("pointwise", fns, prelude, sig, BR, BC)

    def build() -> Plan:
        t = elementwise_tiling(shape, BR, BC)
        in_io = {k: IO(x, f"x{k}") for k, x in enumerate(ins) if isinstance(x, Operand)}
        out_io = [IO(o, f"y{j}") for j, o in enumerate(outs)]
        params, prologue, loads, stores = [], [], [], []
        for io in out_io + list(in_io.values()):
            params += io.params()
            prologue += io.prologue()
        for k, x in enumerate(ins):
            if k in in_io:
                loads += in_io[k].load(f"x{k}", t.idx, shape=t.tile, mask=t.mask, block=t.block)
            else:
                loads.append(f"x{k} = {const_code(x)}")
        compute = [index_codes(line, t.idx) for line in prelude]
        compute += [f"v{j} = ({index_codes(f, t.idx)}) + tl.zeros({t.tile}, tl.float32)" for j, f in enumerate(fns)]
        for j, io in enumerate(out_io):
            stores += io.store(f"v{j}", t.idx, mask=t.mask, block=t.block)
        src = render(_TEMPLATE, params=params, prologue=prologue, pid=t.pid_lines, loads=loads,
                     compute=compute, stores=stores)
        kern = compile_source("pointwise_kernel", src)
        modes = {io.prefix: io.modes for io in out_io + list(in_io.values())}
        return Plan("pointwise", kern, t.grid, {}, {"num_warps": 4}, src, modes, {"BR": BR, "BC": BC})

    plan = plan_cache(key, build)
    args = [a for o in outs for a in o.kernel_args()] + \
        [a for x in ins if isinstance(x, Operand) for a in x.kernel_args()]
    plan.launch(args)
    return plan

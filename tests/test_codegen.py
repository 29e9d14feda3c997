"""The Triton code the one I/O emitter (:class:`vtcsearch.codegen.kernels.emit.IO`) writes for an IndexMap, run
through the interpreter, touches exactly the map's elements."""
import importlib.util
import itertools
import os
import tempfile

import pytest
import torch

from chains import random_chain
from vtcsearch.core.expr import sym
from vtcsearch.core.mapping import IndexMap, Piece, index_vars

triton = pytest.importorskip("triton")
from vtcsearch.codegen.kernels.emit import IO  # noqa: E402
from vtcsearch.codegen.kernels.operand import Operand  # noqa: E402

_counter = itertools.count()


def _compile(src: str, name: str):
    d = tempfile.mkdtemp(prefix="vtc_codegen_")
    path = os.path.join(d, f"k{next(_counter)}.py")
    with open(path, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, name)


def _io(m: IndexMap, leaves, tables, symvals) -> IO:
    return IO(Operand(m, leaves, symvals, tables, dtype=torch.float32), "v")


def _unflatten(shape):
    lines, rem = [], "offs"
    for k in reversed(range(len(shape))):
        lines.append(f"    i{k} = ({rem}) % {shape[k]}")
        rem = f"({rem}) // {shape[k]}"
    return lines


def _kernel(m: IndexMap, io: IO, body: list[str], name: str) -> str:
    args = ["out_ptr"] + io.params()
    lines = ["import triton", "import triton.language as tl", "from vtcsearch.codegen.kernels._lib import *",
             "", "@triton.jit",
             f"def {name}({', '.join(args)}, N, BLOCK: tl.constexpr):",
             "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)",
             "    mask = offs < N"] + _unflatten(m.shape) + ["    " + ln for ln in io.prologue() + body]
    return "\n".join(lines) + "\n"


def _launch(kernel, m, out, io: IO, block=64):
    kernel[(triton.cdiv(max(m.numel, 1), block),)](out, *io.op.kernel_args(), m.numel, BLOCK=block)


@pytest.mark.parametrize("seed", range(40))
def test_emitted_load_reads_what_the_map_reads(seed):
    c = random_chain(seed, 1 + seed % 5)
    m = c.map
    leaves = {k: v.contiguous() for k, v in c.leaves.items()}
    io = _io(m, leaves, c.tables, {})
    idx = [f"i{k}" for k in range(m.ndim)]
    # a 0-d tensor has no index to carry the block's shape: load the scalar, then broadcast
    body = io.load("val", idx, shape="(BLOCK,)", mask="mask" if idx else None) + \
        ["val = val + tl.zeros([BLOCK], tl.float32)", "tl.store(out_ptr + offs, val, mask=mask)"]
    kernel = _compile(_kernel(m, io, body, "load_kernel"), "load_kernel")
    out = torch.full((max(m.numel, 1),), float("nan"))
    _launch(kernel, m, out, io)
    assert torch.equal(out[:m.numel].view(m.shape), m.gather(leaves, tables=c.tables)), c.steps


def _write_maps():
    """Injective maps a producer could write through: a concat slab, a transposed KV row at a runtime
    position, a split piece of a reshaped tensor, a reshape that breaks contiguity."""
    i0, i1 = index_vars(2)
    j0, j1, j2 = index_vars(3)
    pos = sym("pos", 0, 6)
    yield "concat_pieces", IndexMap([3, 8], [Piece("a", ((0, 3), (0, 5)), (i0, i1)),
                                             Piece("b", ((0, 3), (5, 8)), (i1 - 5, i0))],
                                    {"a": (3, 5), "b": (3, 3)}), {"pos": 0}
    yield "kv_row", IndexMap.single([2, 4], "cache", [8, 2, 4], [pos + 0, i0, i1]), {"pos": 5}
    yield "transposed", IndexMap.single([4, 6], "y", [6, 4], [i1, i0]), {}
    yield "reshape_divmod", IndexMap.single([2, 3, 4], "y", [4, 6], [(j1 * 4 + j2) % 4, j0 * 3 + (j1 * 4 + j2) // 4]), {}


@pytest.mark.parametrize("name,m,symvals", list(_write_maps()), ids=[n for n, _, _ in _write_maps()])
def test_emitted_store_writes_what_the_map_writes(name, m, symvals):
    assert m.is_injective()
    shapes = m.target_shapes
    got = {t: torch.full(s, float("nan")) for t, s in shapes.items()}
    want = {t: torch.full(s, float("nan")) for t, s in shapes.items()}
    value = torch.randn(m.shape)
    m.scatter(value, want, syms=symvals)
    io = _io(m, got, {}, symvals)
    idx = [f"i{k}" for k in range(m.ndim)]
    body = ["val = tl.load(out_ptr + offs, mask=mask)"] + io.store("val", idx, mask="mask")
    kernel = _compile(_kernel(m, io, body, "store_kernel"), "store_kernel")
    _launch(kernel, m, value.reshape(-1), io)
    for t in shapes:
        assert torch.equal(got[t].isnan(), want[t].isnan()), f"{t}: different elements written"
        assert torch.equal(got[t].nan_to_num(), want[t].nan_to_num()), f"{t}: wrong values"


def test_block_level_piece_selection():
    """With aligned blocks the piece is picked by one scalar branch per block, with the same result."""
    i0, i1 = index_vars(2)
    m = IndexMap([4, 128], [Piece("a", ((0, 4), (0, 64)), (i0, i1)), Piece("b", ((0, 4), (64, 128)), (i1 - 64, i0))],
                 {"a": (4, 64), "b": (64, 4)})
    assert m.blocks_aligned({1: 32}) and not m.blocks_aligned({1: 48})
    leaves = {"a": torch.randn(4, 64), "b": torch.randn(64, 4)}
    io = _io(m, leaves, {}, {})
    lines = io.load("val", ["i0", "i1"], shape="(BLOCK,)", mask="mask", block=[("b0", 1), ("b1", 32)])
    assert io.modes == ["block"]
    assert lines[0].startswith("if ") and any(ln.startswith("else:") for ln in lines)
    body = ["b0 = (tl.program_id(0) * BLOCK) // 128", "b1 = (tl.program_id(0) * BLOCK) % 128"] + lines + \
           ["tl.store(out_ptr + offs, val, mask=mask)"]
    kernel = _compile(_kernel(m, io, body, "block_kernel"), "block_kernel")
    out = torch.full((m.numel,), float("nan"))
    _launch(kernel, m, out, io, block=32)
    assert torch.equal(out.view(m.shape), m.gather(leaves))

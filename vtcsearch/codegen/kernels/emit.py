"""I/O code emission: the Triton source lines every kernel template loads and stores its operands with.

Inside a kernel an :class:`~.operand.Operand` is bound to a name prefix by :class:`IO`, which emits:

* :meth:`IO.load` — stage 1, reading a tile of the virtual tensor at index tensors ``idx`` (one code
  string per virtual dim, already broadcast to the tile, scalars allowed);
* :meth:`IO.store` — stage 3, writing a tile through the map.

With ``block=[(start, size), ...]`` (the tile's box: first index and extent per dim) and a piecewise map
whose piece boundaries are multiples of the block sizes, the piece is chosen **once per block** by a
scalar ``if/elif`` branch; otherwise every piece is read or written under its own per-element predicate.
Single-piece maps need neither.  Index tensors (``Lookup``) are read under the piece's predicate, so lanes
of other pieces never read an index table out of bounds.  Offsets are computed in int64 when a storage
spans 2**31 elements or more.

Also here: Triton spellings of dtypes and constants, template filling (:func:`render`) and the tilings
the elementwise templates share (:func:`elementwise_tiling`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from ...core.expr import Expr, FloorDiv, Lookup, Mod, TritonNames, to_triton
from ...core.mapping import Piece
from .codecache import interpreting
from .operand import Operand

__all__ = ["IO", "render", "tl_dtype", "downcast", "next_pow2", "const_code", "elementwise_tiling", "Tiling"]


def next_pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


_TL = {
    torch.float32: "tl.float32", torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16",
    torch.float64: "tl.float64", torch.int64: "tl.int64", torch.int32: "tl.int32",
    torch.int16: "tl.int16", torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
}


def tl_dtype(dt: torch.dtype) -> str:
    if dt not in _TL:
        raise TypeError(f"no Triton dtype for {dt}")
    return _TL[dt]


def downcast(code: str, dt: str) -> str:
    """``code`` converted to ``dt`` as the GPU does it (round to nearest even, also in the interpreter)."""
    if dt == "tl.bfloat16" and interpreting():
        return f"vtc_rtne_bf16({code})"
    return f"{code}.to({dt})"


def is_float_tl(dt: str) -> bool:
    return dt.startswith("tl.float") or dt == "tl.bfloat16"


def const_code(v: float | int, dt: str = "tl.float32") -> str:
    """A constant spelled as Triton source (``inf``/``nan`` included)."""
    if is_float_tl(dt):
        v = float(v)
        if math.isnan(v):
            return 'float("nan")'
        if math.isinf(v):
            return 'float("inf")' if v > 0 else '-float("inf")'
        return repr(v)
    return str(int(v))


def _as_mask(m: str, idx: Sequence[str] = ()) -> str:
    """A load/store mask as a bool tile: Triton's interpreter (3.9) gives ``scalar_cond & tile_cond`` an int8
    value that ``tl.load`` rejects (``mask has unsupported dtype``), and does not broadcast a scalar mask (a
    piece's predicate on program ids only) over the tile; compiled Triton needs neither.  ``idx``: the
    operand's index codes, whose tile terms (non-negative) give the mask its shape."""
    if not interpreting():
        return m
    tiles = [i for i in idx if "[" in i]
    return f"(((({m}) != 0) & (({' + '.join(tiles)}) >= 0)) != 0)" if tiles else f"(({m}) != 0)"


def _and(*terms: str | None) -> str | None:
    ts = [t for t in terms if t]
    if not ts:
        return None
    return ts[0] if len(ts) == 1 else " & ".join(f"({t})" if not t.startswith("(") else t for t in ts)



class IO:
    """Emits the load and store code of one operand inside one kernel."""

    def __init__(self, op: Operand, prefix: str):
        self.op, self.prefix = op, prefix
        storages, syms, tables = op.layout()
        self.ptr = {s: f"{prefix}_p{k}" for k, s in enumerate(storages)}
        self.sym_is_ptr = {s: isinstance(op.syms[s], torch.Tensor) for s in syms}
        self.sym_arg = {s: f"{prefix}_s{k}" for k, s in enumerate(syms)}
        self.tab = {t: (f"{prefix}_t{k}", tuple(int(x) for x in op.tables[t].stride())) for k, t in enumerate(tables)}
        self.strides = {s: op.storage_strides(s) for s in storages}
        self.dtypes = {s: tl_dtype(op.tensors[s].dtype) for s in storages}
        self.wide = any(op.max_offset(s) >= 2 ** 31 - 1 for s in storages) or \
            any(t.numel() >= 2 ** 31 - 1 for t in op.tables.values())
        self.modes: list[str] = []   # which code path each load/store took (for tests and reports)
        self._offsets: dict[int, Expr] = {}

    # -- kernel signature ---------------------------------------------------
    def params(self) -> list[str]:
        out = [self.ptr[s] for s in self.ptr]
        out += [self.sym_arg[s] + ("_ptr" if self.sym_is_ptr[s] else "") for s in self.sym_arg]
        out += [self.tab[t][0] for t in self.tab]
        return out

    def prologue(self) -> list[str]:
        """Lines to put at the top of the kernel (device-resident runtime scalars)."""
        lines = []
        for s, a in self.sym_arg.items():
            if self.sym_is_ptr[s]:
                lines.append(f"{a} = tl.load({a}_ptr)" + (".to(tl.int64)" if self.wide else ""))
            elif self.wide:
                lines.append(f"{a} = {a}.to(tl.int64)")
        return lines

    # -- code of one piece --------------------------------------------------
    def _names(self, idx: Sequence[str], mask: str | None) -> TritonNames:
        if self.wide:
            idx = [f"({c}).to(tl.int64)" for c in idx]
        return TritonNames({f"i{k}": c for k, c in enumerate(idx)}, self.sym_arg, self.tab, mask)

    def _code(self, e: Expr, names: TritonNames) -> str:
        """Like :func:`vtcsearch.core.expr.to_triton`, but index-tensor reads are unmasked with clamped
        indices: always in bounds (lanes outside the piece read some valid entry and are masked
        later), and a read at a per-program scalar position stays a scalar load."""
        parts = []
        for a, c in e.terms:
            sc = self._atom(a, names)
            parts.append(sc if c == 1 else f"({c}) * {sc}")
        if e.const or not parts:
            parts.append(f"({e.const})")
        return "(" + " + ".join(parts) + ")"

    def _atom(self, a, names: TritonNames) -> str:
        if isinstance(a, Lookup):
            ptr, strides = self.tab[a.table]
            shape = self.op.tables[a.table].shape
            terms = []
            for i, st, n in zip(a.index, strides, shape):
                ic = self._code(i, names)
                if not i.is_const():
                    ic = f"tl.minimum(tl.maximum({ic}, 0), {int(n) - 1})"
                terms.append(f"{ic} * {st}")
            return f"tl.load({ptr} + ({' + '.join(terms) or '0'})).to(tl.int64)"
        if isinstance(a, FloorDiv):
            return f"({self._code(a.arg, names)} // {a.div})"
        if isinstance(a, Mod):
            return f"({self._code(a.arg, names)} % {a.div})"
        return to_triton(Expr({a: 1}), names)

    def _offset(self, n: int, p: Piece) -> Expr:
        if n not in self._offsets:
            self._offsets[n] = p.offset(self.strides[p.target])
        return self._offsets[n]

    def _offset_code(self, n: int, p: Piece, idx: Sequence[str], mask: str | None) -> str:
        off = self._offset(n, p)
        code = self._code(off, self._names(idx, mask))
        # index dims the offset does not use still give the pointer tile its shape (a broadcast read)
        used = off.free_vars()
        unused = [c for k, c in enumerate(idx) if f"i{k}" not in used and _is_vector_code(c)]
        if unused:
            code = f"({code} + {' + '.join(f'0 * {c}' for c in unused)})"
        return code

    def _pred(self, p: Piece, idx: Sequence[str], mask: str | None) -> str | None:
        """Per-element predicate of a piece (region box and extra conditions)."""
        shape = self.op.shape
        pred = []
        for k, (lo, hi) in enumerate(p.region):
            if lo > 0:
                pred.append(f"({idx[k]} >= {lo})")
            if hi < shape[k]:
                pred.append(f"({idx[k]} < {hi})")
        if p.conds:
            tn = self._names(idx, mask)
            for ce, lo, hi in p.conds:
                c = self._code(ce, tn)
                pred.append(f"({c} >= {lo})")
                pred.append(f"({c} < {hi})")
        return " & ".join(pred) if pred else None

    def _block_pred(self, p: Piece, block: Sequence[tuple[str, int]]) -> str | None:
        """Scalar test that the block whose first index is ``block`` lies in piece ``p``."""
        shape = self.op.shape
        pred = []
        for k, ((lo, hi), (start, _)) in enumerate(zip(p.region, block)):
            if lo > 0:
                pred.append(f"({start} >= {lo})")
            if hi < shape[k]:
                pred.append(f"({start} < {hi})")
        return " & ".join(pred) if pred else None

    def block_select(self, block: Sequence[tuple[str, int]] | None) -> bool:
        """Whether a tile with box ``block`` can pick its piece by one scalar branch."""
        m = self.op.map
        if block is None or len(m.pieces) <= 1 or not m.is_box_piecewise():
            return False
        if len(block) != m.ndim:
            raise ValueError(f"block has {len(block)} dims, operand {m.ndim}")
        return m.blocks_aligned({d: max(int(b), 1) for d, (_, b) in enumerate(block)})

    def _covers_all(self) -> bool:
        m = self.op.map
        return m.is_box_piecewise() and m.covered_size() == m.numel

    def _full_piece(self, p: Piece) -> bool:
        return not p.conds and all((lo, hi) == (0, s) for (lo, hi), s in zip(p.region, self.op.shape))

    # -- stage 1 --------------------------------------------------------------
    def load(self, out: str, idx: Sequence[str], *, shape: str, mask: str | None = None,
             block: Sequence[tuple[str, int]] | None = None, dtype: str | None = "tl.float32",
             other: float | int = 0.0) -> list[str]:
        """Lines that set ``out`` to the tile of this operand at index tensors ``idx``.

        ``shape``: the tile's shape as Triton source (for constant pieces and
        uncovered lanes); ``mask``: lanes to read; ``block``: the tile's box, enabling the
        per-block piece branch; ``dtype``: result dtype (``None`` keeps the operand's dtype,
        bit-exact); ``other``: the value of masked-off and uncovered lanes.
        """
        dt = dtype or tl_dtype(self.op.dtype)
        oth = const_code(other, dt)
        pieces = self.op.map.pieces
        if len(idx) != self.op.ndim:
            raise ValueError(f"{len(idx)} index codes for a {self.op.ndim}-d operand")

        def value(n: int, p: Piece, m: str | None) -> str:
            if p.target is None:
                return f"tl.full({shape}, {const_code(p.fill, dt)}, {dt})"
            off = self._offset_code(n, p, idx, m)
            mk = f", mask={_as_mask(m, idx)}, other={oth}" if m else ""
            cast = "" if self.dtypes[p.target] == dt else f".to({dt})"
            return f"tl.load({self.ptr[p.target]} + {off}{mk}){cast}"

        if not pieces:
            self.modes.append("empty")
            return [f"{out} = tl.full({shape}, {oth}, {dt})"]
        if len(pieces) == 1 and self._full_piece(pieces[0]):
            self.modes.append("single")
            return [f"{out} = {value(0, pieces[0], mask)}"]
        lines: list[str] = []
        if self.block_select(block):
            self.modes.append("block")
            full = self._covers_all()
            for n, p in enumerate(pieces):
                bp = self._block_pred(p, block)
                if n == len(pieces) - 1 and full:
                    lines.append("else:" if n else "if True:")
                else:
                    lines.append(f"{'if' if n == 0 else 'elif'} {bp or 'True'}:")
                lines.append(f"    {out} = {value(n, p, mask)}")
            if not full:
                lines.append("else:")
                lines.append(f"    {out} = tl.full({shape}, {oth}, {dt})")
            return lines
        self.modes.append("element")
        first = True
        for n, p in enumerate(pieces):
            pred = self._pred(p, idx, mask)
            m = _and(mask, pred)
            if first:
                if p.target is None:
                    v = f"tl.full({shape}, {const_code(p.fill, dt)}, {dt})"
                    lines.append(f"{out} = tl.where({pred}, {v}, {oth})" if pred else f"{out} = {v}")
                else:
                    lines.append(f"{out} = {value(n, p, m)}")
                first = False
            else:
                v = value(n, p, m) if p.target is not None else const_code(p.fill, dt)
                lines.append(f"{out} = tl.where({pred}, {v}, {out})" if pred else f"{out} = {v}")
        return lines

    # -- stage 3 --------------------------------------------------------------
    def store(self, value: str, idx: Sequence[str], *, mask: str | None = None,
              block: Sequence[tuple[str, int]] | None = None) -> list[str]:
        """Lines that write the tile ``value`` through the map (lanes outside every piece: nowhere)."""
        pieces = self.op.map.pieces
        if len(idx) != self.op.ndim:
            raise ValueError(f"{len(idx)} index codes for a {self.op.ndim}-d operand")
        for p in pieces:
            if p.target is None:
                raise ValueError(f"cannot store into a constant piece of {self.op.map!r}")

        def put(n: int, p: Piece, m: str | None) -> str:
            off = self._offset_code(n, p, idx, m)
            mk = f", mask={_as_mask(m, idx)}" if m else ""
            return f"tl.store({self.ptr[p.target]} + {off}, {downcast(value, self.dtypes[p.target])}{mk})"

        if not pieces:
            self.modes.append("empty")
            return []
        if len(pieces) == 1 and self._full_piece(pieces[0]):
            self.modes.append("single")
            return [put(0, pieces[0], mask)]
        lines: list[str] = []
        if self.block_select(block):
            self.modes.append("block")
            full = self._covers_all()
            for n, p in enumerate(pieces):
                bp = self._block_pred(p, block)
                if n == len(pieces) - 1 and full:
                    lines.append("else:")
                else:
                    lines.append(f"{'if' if n == 0 else 'elif'} {bp or 'True'}:")
                lines.append(f"    {put(n, p, mask)}")
            return lines
        self.modes.append("element")
        for n, p in enumerate(pieces):
            lines.append(put(n, p, _and(mask, self._pred(p, idx, mask))))
        return lines


def _is_vector_code(code: str) -> bool:
    # constants need no broadcast; anything else (a tile index or a scalar) is added as 0 * code
    try:
        int(code)
        return False
    except ValueError:
        return True


def render(template: str, **blocks: Sequence[str] | str) -> str:
    """Fill a template: a line ``@@name`` becomes the lines of ``blocks[name]`` at its indentation;
    ``@name@`` inside a line is replaced by ``blocks[name]`` (a string)."""
    out: list[str] = []
    for line in template.splitlines():
        s = line.strip()
        if s.startswith("@@"):
            key = s[2:]
            ind = line[: len(line) - len(line.lstrip())]
            body = blocks[key]
            if isinstance(body, str):
                body = body.splitlines()
            out.extend(ind + b for b in body)
            continue
        for k, v in blocks.items():
            tok = f"@{k}@"
            if tok in line:
                line = line.replace(tok, v if isinstance(v, str) else ", ".join(v))
        out.append(line)
    return "\n".join(out) + "\n"



@dataclass
class Tiling:
    """A [BR, BC] tile over the last two dims of a shape; outer dims are scalars per program."""

    shape: tuple[int, ...]
    BR: int
    BC: int
    pid_lines: list[str]
    idx: list[str]          # index code per dim, broadcast to the tile
    block: list[tuple[str, int]]
    mask: str | None
    tile: str               # tile shape code
    grid: tuple[int, ...]
    row_vec: str | None     # the row index vector (1-d), None for 1-d shapes
    col_vec: str            # the column index vector


def elementwise_tiling(shape: Sequence[int], BR: int, BC: int, col_start: str | None = None) -> Tiling:
    """Tile ``shape`` (ndim >= 1) by [BR, BC] over its last two dims, 1-d grid.

    ``col_start``: when given, the column block start is this code (a loop variable) and
    the grid does not cover columns (reductions loop over them).
    """
    shape = tuple(int(s) for s in shape)
    nd = len(shape)
    C = shape[-1]
    R = shape[-2] if nd >= 2 else 1
    outer = shape[:-2] if nd >= 2 else ()
    nc = 1 if col_start is not None else -(-C // BC)
    nr = -(-R // BR)
    lines = ["pid = tl.program_id(0)"]
    if col_start is None:
        lines.append(f"pid_c = pid % {nc}")
        lines.append(f"pid = pid // {nc}")
        c0 = f"pid_c * {BC}"
    else:
        c0 = col_start
    if nd >= 2:
        lines.append(f"pid_r = pid % {nr}")
        lines.append(f"pid = pid // {nr}")
    for k in reversed(range(len(outer))):
        lines.append(f"o{k} = pid % {outer[k]}")
        lines.append(f"pid = pid // {outer[k]}")
    idx, block = [], []
    for k in range(len(outer)):
        idx.append(f"o{k}")
        block.append((f"o{k}", 1))
    masks = []
    if nd >= 2:
        lines.append(f"rr = pid_r * {BR} + tl.arange(0, {BR})")
        idx.append("rr[:, None]")
        block.append((f"pid_r * {BR}", BR))
        if R % BR:
            masks.append(f"(rr[:, None] < {R})")
        tile = f"({BR}, {BC})"
        ccode = "rc[None, :]"
    else:
        tile = f"({BC},)"
        ccode = "rc"
    if col_start is None:
        lines.append(f"rc = {c0} + tl.arange(0, {BC})")
        if C % BC:
            masks.append(f"({ccode} < {C})")
    idx.append(ccode)
    block.append((c0, BC))
    grid = (max(1, math.prod(outer) * nr * nc),)
    return Tiling(shape, BR, BC, lines, idx, block, " & ".join(masks) if masks else None, tile, grid,
                  "rr" if nd >= 2 else None, "rc")

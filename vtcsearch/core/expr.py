"""Integer index expressions: the language mapping functions are written in.

An :class:`Expr` is a linear combination of *atoms* plus a constant.  Atoms are
index variables (:class:`Var`), runtime scalars such as a decode position
(:class:`Sym`), floor division and modulo by a positive constant (what reshapes
produce), and reads of a runtime index tensor (:class:`Lookup`, what Gather and
paged KV caches produce).  Keeping the linear part explicit makes the questions
the compiler asks cheap: is a map affine, what is the coefficient of the
innermost index, do two maps agree.

Range-dependent rewrites (``(x % n) -> x`` when ``0 <= x < n``) need the ranges
of the index variables, so they live in :func:`simplify`, not in the operators.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import numpy as np

Ranges = Mapping[str, tuple[int, int]]  # var name -> inclusive (lo, hi)


def remember(memo: dict, key: Any, value: Any, limit: int = 1 << 18) -> Any:
    """``memo[key] = value``, the memo emptied first once it holds ``limit`` entries (a bound on memory)."""
    if len(memo) > limit:
        memo.clear()
    memo[key] = value
    return value


class Atom:
    """A non-linear leaf of an expression; subclasses are frozen dataclasses."""

    def key(self) -> str:
        # atoms are immutable: their text (the sort key of every Expr holding them) is computed once
        k = self.__dict__.get("_key")
        if k is None:
            k = repr(self)
            object.__setattr__(self, "_key", k)
        return k

    def _cached_hash(self) -> int:
        """The dataclass hash of the fields, computed once (atoms key every memo of :func:`simplify` and the
        dicts of :class:`Expr`'s terms; the generated hash builds a tuple of the fields at every lookup)."""
        try:
            return self.__dict__["_hash"]
        except KeyError:
            h = hash(tuple(getattr(self, f) for f in self.__dataclass_fields__))
            object.__setattr__(self, "_hash", h)
            return h

    def __getstate__(self) -> dict:
        # a pickled atom is rebuilt in another process, whose string hashes differ: no cached hash travels
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}


@dataclass(frozen=True, repr=False)
class Var(Atom):
    name: str

    def __repr__(self) -> str:
        return self.name


@dataclass(frozen=True, repr=False)
class Sym(Atom):
    """A runtime integer scalar (kernel argument) with known bounds."""

    name: str
    lo: int
    hi: int

    def __repr__(self) -> str:
        return f"${self.name}"


@dataclass(frozen=True, repr=False)
class FloorDiv(Atom):
    arg: "Expr"
    div: int

    def __repr__(self) -> str:
        return f"({self.arg!r} // {self.div})"


@dataclass(frozen=True, repr=False)
class Mod(Atom):
    arg: "Expr"
    div: int

    def __repr__(self) -> str:
        return f"({self.arg!r} % {self.div})"


@dataclass(frozen=True, repr=False)
class Lookup(Atom):
    """``table[index...]``: an element of a runtime integer tensor, in [lo, hi]."""

    table: str
    index: tuple["Expr", ...]
    lo: int
    hi: int

    def __repr__(self) -> str:
        return f"{self.table}[{', '.join(map(repr, self.index))}]"


for _cls in (FloorDiv, Mod, Lookup):
    _cls.__hash__ = Atom._cached_hash   # type: ignore[method-assign]


def _term_key(t: tuple[Atom, int]) -> str:
    return t[0].key()


_INTERNED: dict[int, "Expr"] = {}   # hash -> the expression built first with it (Expr.__new__)


class Expr:
    """``const + sum(coef * atom)``; immutable and hashable."""

    __slots__ = ("terms", "const", "_hash", "_fv", "_sv", "_repr", "_lk", "_sy")

    def __new__(cls, terms: Mapping[Atom, int] | None = None, const: int = 0) -> "Expr":
        """An equal expression built before is given back (hash-consing, while ``_INTERNED`` keeps it): the
        memos keyed by expressions then find theirs by identity instead of comparing deep, nested ones (a
        channel shuffle composed through many layers builds the same predicates again in every layer)."""
        items = [(a, c) for a, c in terms.items() if c != 0] if terms else []
        if len(items) > 1:   # most expressions built are one atom or a constant: no sort
            items.sort(key=_term_key)
        t = tuple(items)
        const = int(const)
        h = hash((t, const))
        hit = _INTERNED.get(h)
        if hit is not None and hit.const == const and hit.terms == t:
            return hit
        self = object.__new__(cls)
        self.terms: tuple[tuple[Atom, int], ...] = t
        self.const = const
        self._hash = h
        self._fv: frozenset[str] | None = None    # free_vars, repr and lookups, computed once (immutable)
        self._repr: str | None = None
        self._lk: frozenset[Lookup] | None = None
        self._sy: frozenset[Sym] | None = None
        self._sv: tuple[str, ...] | None = None
        if hit is None:   # a hash collision keeps the first one
            if len(_INTERNED) > 1 << 20:   # a bound on memory (equality stays structural)
                _INTERNED.clear()
            _INTERNED[h] = self
        return self

    # -- construction -------------------------------------------------------
    @staticmethod
    def lift(x: "Expr | Atom | int") -> "Expr":
        if isinstance(x, Expr):
            return x
        if isinstance(x, Atom):
            return Expr({x: 1})
        if isinstance(x, (int, np.integer)):
            return Expr(const=int(x))
        raise TypeError(f"cannot use {type(x).__name__} in an index expression")

    def __add__(self, other) -> "Expr":
        o = Expr.lift(other)
        terms = dict(self.terms)
        for a, c in o.terms:
            terms[a] = terms.get(a, 0) + c
        return Expr(terms, self.const + o.const)

    __radd__ = __add__

    def __neg__(self) -> "Expr":
        return self * -1

    def __sub__(self, other) -> "Expr":
        return self + (-Expr.lift(other))

    def __rsub__(self, other) -> "Expr":
        return Expr.lift(other) - self

    def __mul__(self, k) -> "Expr":
        if isinstance(k, Expr):
            if k.is_const():
                k = k.const
            elif self.is_const():
                return k * self.const
            else:
                raise ValueError(f"index expressions are linear: cannot multiply {self} by {k}")
        k = int(k)
        return Expr({a: c * k for a, c in self.terms}, self.const * k)

    __rmul__ = __mul__

    def __floordiv__(self, d: int) -> "Expr":
        d = int(d)
        if d <= 0:
            raise ValueError("division by a non-positive constant")
        if d == 1:
            return self
        # floor((d*q + r) / d) == q + floor(r / d) for integers: pull out multiples of d.
        q_terms = {a: c // d for a, c in self.terms if c % d == 0}
        rest = Expr({a: c for a, c in self.terms if c % d != 0}, self.const % d)
        q = Expr(q_terms, self.const // d)
        if rest.is_const():
            return q + rest.const // d
        if not rest.terms and rest.const == 0:
            return q
        return q + _floordiv_atom(rest, d)

    def __mod__(self, d: int) -> "Expr":
        d = int(d)
        if d <= 0:
            raise ValueError("modulo by a non-positive constant")
        if d == 1:
            return Expr()
        rest = Expr({a: c % d for a, c in self.terms if c % d != 0}, self.const % d)
        if rest.is_const():
            return Expr(const=rest.const % d)
        return Expr({_mod_atom(rest, d): 1})

    # -- queries ------------------------------------------------------------
    def is_const(self) -> bool:
        return not self.terms

    def coef(self, atom: Atom) -> int:
        for a, c in self.terms:
            if a == atom:
                return c
        return 0

    def atoms(self) -> Iterable[Atom]:
        return (a for a, _ in self.terms)

    def free_vars(self) -> set[str]:
        return set(self.free_var_set())

    def free_var_set(self) -> frozenset[str]:
        """:meth:`free_vars` as a cached frozenset (no copy: the hot path of ``simplify``)."""
        fv = self._fv
        if fv is None:
            out: set[str] = set()
            for a in self.atoms():
                if isinstance(a, Var):
                    out.add(a.name)
                elif isinstance(a, (FloorDiv, Mod)):
                    out |= a.arg.free_var_set()
                elif isinstance(a, Lookup):
                    for e in a.index:
                        out |= e.free_var_set()
            fv = self._fv = frozenset(out)
        return fv

    def sorted_vars(self) -> tuple[str, ...]:
        """:meth:`free_var_set` sorted (cached: a memo key of ranges)."""
        sv = self._sv
        if sv is None:
            sv = self._sv = tuple(sorted(self.free_var_set()))
        return sv

    def is_affine(self) -> bool:
        """Linear in index variables and runtime scalars (no div/mod/lookup)."""
        return all(isinstance(a, (Var, Sym)) for a in self.atoms())

    def has_lookup(self) -> bool:
        return bool(self.lookups())

    def syms(self) -> frozenset[Sym]:
        """The runtime scalars in this expression, nested ones too (cached: a map composed through many
        shuffles shares its sub-expressions, and walking them uncached is exponential in the depth)."""
        sy = self._sy
        if sy is None:
            out: set[Sym] = set()
            for a in self.atoms():
                if isinstance(a, Sym):
                    out.add(a)
                elif isinstance(a, (FloorDiv, Mod)):
                    out |= a.arg.syms()
                elif isinstance(a, Lookup):
                    for e in a.index:
                        out |= e.syms()
            sy = self._sy = frozenset(out)
        return sy

    def lookups(self) -> frozenset[Lookup]:
        """The table lookups in this expression, nested ones too (cached: the cost model asks often)."""
        lk = self._lk
        if lk is None:
            out: set[Lookup] = set()
            for a in self.atoms():
                if isinstance(a, Lookup):
                    out.add(a)
                    for e in a.index:
                        out |= e.lookups()
                elif isinstance(a, (FloorDiv, Mod)):
                    out |= a.arg.lookups()
            lk = self._lk = frozenset(out)
        return lk

    def __eq__(self, other) -> bool:
        if isinstance(other, (int, np.integer)):
            return self.is_const() and self.const == other
        # the hash first: memo lookups and fixpoint checks compare deep, shared expressions, and two that
        # differ nearly always hash apart (equal ones hash alike: the hash is of the compared fields)
        return other is self or (isinstance(other, Expr) and self._hash == other._hash
                                 and self.terms == other.terms and self.const == other.const)

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self):   # rebuilt where it lands: a cached hash of names is only valid in its own process
        return (Expr, (dict(self.terms), self.const))

    def __repr__(self) -> str:
        r = self._repr
        if r is None:
            parts = []
            for a, c in self.terms:
                parts.append(a.key() if c == 1 else f"{c}*{a.key()}")
            if self.const or not parts:
                parts.append(str(self.const))
            r = self._repr = " + ".join(parts)
        return r

    # -- transformation -----------------------------------------------------
    def subs(self, env: Mapping[str, "Expr"], memo: dict | None = None) -> "Expr":
        """Replace index variables by expressions (composition of maps).

        Each distinct div/mod/lookup atom is substituted once (``memo``: atom -> its substitution under
        ``env``; pass one dict to share it between expressions with the same ``env``, as a piece's index and
        predicates): a map composed through a chain of channel shuffles nests the same atoms many times over,
        and walking every occurrence is exponential in the depth.  The same expression either way."""
        if memo is None:
            memo = {}
        return self.map_atoms(lambda a: _subs_atom(a, env, memo))

    def map_atoms(self, fn: Callable[[Atom], "Expr"]) -> "Expr":
        """The sum of ``c * fn(a)``, built once (a chain of additions sorted the terms at every step).

        ``self`` itself where ``fn`` gives back every atom unchanged (an equal expression either way): a
        rewrite that changes nothing keeps the object, so the fixpoint test of :func:`simplify` and the memos
        keyed by expressions compare it by identity, not by walking a deep, nested expression again."""
        terms: dict[Atom, int] = {}
        const = self.const
        same = True
        for a, c in self.terms:
            e = fn(a)
            if same and not (e.const == 0 and len(e.terms) == 1 and e.terms[0][1] == 1
                             and (e.terms[0][0] is a or e.terms[0][0] == a)):
                same = False
            const += e.const * c
            for b, d in e.terms:
                terms[b] = terms.get(b, 0) + d * c
        if same:
            return self
        return Expr(terms, const)


def _floordiv_atom(e: Expr, d: int) -> Expr:
    # (x // a) // b == x // (a*b)
    if e.const == 0 and len(e.terms) == 1 and e.terms[0][1] == 1 and isinstance(e.terms[0][0], FloorDiv):
        inner = e.terms[0][0]
        return Expr({FloorDiv(inner.arg, inner.div * d): 1})
    return Expr({FloorDiv(e, d): 1})


def _mod_atom(e: Expr, d: int) -> Atom:
    # (x % (a*b)) % a == x % a
    if e.const == 0 and len(e.terms) == 1 and e.terms[0][1] == 1 and isinstance(e.terms[0][0], Mod):
        inner = e.terms[0][0]
        if inner.div % d == 0:
            return Mod(inner.arg, d)
    return Mod(e, d)


def _subs_atom(a: Atom, env: Mapping[str, Expr], memo: dict | None = None) -> Expr:
    if isinstance(a, Var):
        return env[a.name] if a.name in env else Expr({a: 1})
    if not isinstance(a, (FloorDiv, Mod, Lookup)):
        return Expr({a: 1})
    if memo is None:
        memo = {}
    out = memo.get(a)
    if out is None:
        if isinstance(a, FloorDiv):
            out = a.arg.subs(env, memo) // a.div
        elif isinstance(a, Mod):
            out = a.arg.subs(env, memo) % a.div
        else:
            out = Expr({Lookup(a.table, tuple(e.subs(env, memo) for e in a.index), a.lo, a.hi): 1})
        memo[a] = out
    return out


def rename_tables(e: Expr, names: Mapping[str, str]) -> Expr:
    """Rename the index tensors an expression reads (a rule's "in1" -> the graph's tensor)."""
    def go(a: Atom) -> Expr:
        if isinstance(a, Lookup):
            return Expr({Lookup(names.get(a.table, a.table), tuple(rename_tables(i, names) for i in a.index),
                                a.lo, a.hi): 1})
        if isinstance(a, FloorDiv):
            return rename_tables(a.arg, names) // a.div
        if isinstance(a, Mod):
            return rename_tables(a.arg, names) % a.div
        return Expr({a: 1})
    return e.map_atoms(go)


def var(name: str) -> Expr:
    return Expr({Var(name): 1})


def sym(name: str, lo: int, hi: int) -> Expr:
    return Expr({Sym(name, lo, hi): 1})


def const(c: int) -> Expr:
    return Expr(const=c)


def lookup(table: str, index: Iterable[Expr], lo: int, hi: int) -> Expr:
    return Expr({Lookup(table, tuple(Expr.lift(i) for i in index), lo, hi): 1})


# ---------------------------------------------------------------------------
# bounds and range-aware simplification
# ---------------------------------------------------------------------------

def bounds(e: Expr, ranges: Ranges) -> tuple[int, int]:
    """Inclusive interval containing every value of ``e`` over ``ranges``."""
    lo = hi = e.const
    for a, c in e.terms:
        alo, ahi = atom_bounds(a, ranges)
        if c >= 0:
            lo, hi = lo + c * alo, hi + c * ahi
        else:
            lo, hi = lo + c * ahi, hi + c * alo
    return lo, hi


def atom_bounds(a: Atom, ranges: Ranges) -> tuple[int, int]:
    if isinstance(a, Var):
        if a.name not in ranges:
            raise KeyError(f"no range for index variable {a.name}")
        return ranges[a.name]
    if isinstance(a, (Sym, Lookup)):
        return a.lo, a.hi
    if isinstance(a, (FloorDiv, Mod)):
        # memoized: composed maps nest the same div/mod atoms many times (a chain of channel shuffles), and
        # walking them again is exponential in the depth
        return _by_ranges(_BOUNDS, a, ranges, (), lambda: _divmod_bounds(a, ranges))
    raise TypeError(a)


_BOUNDS: dict = {}   # (div/mod atom, ranges of its variables) -> atom_bounds


def _by_ranges(memo: dict, a: FloorDiv | Mod, ranges: Ranges, extra: tuple, compute: Callable[[], Any]) -> Any:
    """``compute()``, memoized in ``memo`` per div/mod atom ``a``, the ranges of its variables (all that an
    answer about ``a`` reads) and ``extra``; not memoized where a variable has no range (``compute`` says
    which)."""
    try:
        key = (a, tuple(tuple(ranges[v]) for v in a.arg.sorted_vars()), *extra)
    except KeyError:
        return compute()
    hit = memo.get(key)
    if hit is None:
        if len(memo) > 1 << 20:   # a bound on memory
            memo.clear()
        hit = memo[key] = compute()
    return hit


def _divmod_bounds(a: FloorDiv | Mod, ranges: Ranges) -> tuple[int, int]:
    lo, hi = bounds(a.arg, ranges)
    if isinstance(a, FloorDiv):
        return lo // a.div, hi // a.div
    if 0 <= lo and hi < a.div:
        return lo, hi
    if lo // a.div == hi // a.div:  # no wrap-around inside the interval
        return lo % a.div, hi % a.div
    return 0, a.div - 1


def simplify(e: Expr, ranges: Ranges, divisors: bool = False) -> Expr:
    """Rewrite div/mod atoms using the ranges of the index variables.

    Rules: ``i -> lo`` when ``i`` takes one value; ``x // d -> 0`` and ``x % d -> x`` when ``0 <= x < d``;
    ``x // d -> q`` when ``x = d*q + r`` with ``0 <= r < d``;
    ``c*(x % a) + c*a*((x // a) % b) -> c*(x % (a*b))`` and
    ``c*(x % a) + c*a*(x // a) -> c*x`` (re-merging dimensions a reshape split).

    ``divisors``: also ``(c*q + r) // (c*k) -> q // k`` and ``(c*q + r) % (c*k) -> c*(q % k) + r`` for
    ``0 <= r < c`` (:func:`_split_divisor`), for the questions asked of an index (which variables it depends on,
    what it costs).  Maps keep the form without it: their text keys the committed measurements.
    """
    key = (e, tuple((k, tuple(ranges[k])) for k in e.sorted_vars() if k in ranges), divisors)
    hit = _SIMPLIFIED.get(key)
    if hit is not None:
        return hit
    out, fixed = _simplify(e, ranges, divisors)
    if len(_SIMPLIFIED) > 1 << 20:   # a bound on memory; solvers on big graphs ask for many
        _SIMPLIFIED.clear()
    _SIMPLIFIED[key] = out
    if fixed and out is not e:
        # a fixpoint simplifies to itself: the next round's atoms (simplified arguments, asked again by
        # _simplify's convergence check and by callers that simplify a simplified form) hit the memo
        ofv = out.free_var_set()
        _SIMPLIFIED[(out, tuple(r for r in key[1] if r[0] in ofv), divisors)] = out
    return out


_SIMPLIFIED: dict = {}


def _simplify(e: Expr, ranges: Ranges, divisors: bool = False) -> tuple[Expr, bool]:
    """(the simplified form, whether it is a fixpoint of the rewrite rounds)."""
    prev = None
    cur = e
    for _ in range(8):
        if cur == prev:
            return cur, True
        prev = cur
        cur = cur.map_atoms(lambda a: _simplify_atom(a, ranges, divisors))
        cur = _merge_divmod(cur)
    return cur, cur == prev


def _simplify_atom(a: Atom, ranges: Ranges, divisors: bool = False) -> Expr:
    """One rewrite of ``a``; a div/mod is memoized per atom and the ranges of its variables (all it reads):
    the fixpoint rounds of :func:`_simplify` and the maps of one channel-shuffle chain rewrite the same
    atoms again and again, and each rewrite builds several expressions."""
    if not isinstance(a, (FloorDiv, Mod)):
        return _rewrite_atom(a, ranges, divisors)
    # _by_ranges(_ATOMS, a, ranges, (divisors,), ...) inlined: most calls are hits, and they are many
    try:
        key = (a, tuple(tuple(ranges[v]) for v in a.arg.sorted_vars()), divisors)
    except KeyError:
        return _rewrite_atom(a, ranges, divisors)
    hit = _ATOMS.get(key)
    if hit is None:
        hit = remember(_ATOMS, key, _rewrite_atom(a, ranges, divisors), 1 << 20)
    return hit


_ATOMS: dict = {}   # (div/mod atom, ranges of its variables, divisors) -> _simplify_atom


def _rewrite_atom(a: Atom, ranges: Ranges, divisors: bool = False) -> Expr:
    if isinstance(a, Var) and a.name in ranges and ranges[a.name][0] == ranges[a.name][1]:
        return Expr(const=ranges[a.name][0])        # a dimension of extent one: a constant
    if isinstance(a, (FloorDiv, Mod)):
        arg = simplify(a.arg, ranges, divisors)
        lo, hi = bounds(arg, ranges)
        if isinstance(a, FloorDiv):
            if lo // a.div == hi // a.div:
                return Expr(const=lo // a.div)
            # split arg into multiples of d (q) and a remainder r with 0 <= r < d
            q_terms = {x: c // a.div for x, c in arg.terms if c % a.div == 0}
            r = Expr({x: c for x, c in arg.terms if c % a.div != 0}, arg.const % a.div)
            rlo, rhi = bounds(r, ranges)
            if 0 <= rlo and rhi < a.div:
                return Expr(q_terms, arg.const // a.div)
            hit = _split_divisor(arg, a.div, ranges) if divisors else None
            if hit is not None:          # (c*q + r) // (c*k) == q // k
                q, _, k = hit
                return simplify(q // k, ranges, divisors)
            return arg // a.div
        if 0 <= lo and hi < a.div:
            return arg
        if lo // a.div == hi // a.div:
            return arg - (lo // a.div) * a.div
        hit = _split_divisor(arg, a.div, ranges) if divisors else None
        if hit is not None:              # (c*q + r) % (c*k) == c*(q % k) + r
            q, r, k = hit
            return simplify(q % k, ranges, divisors) * (a.div // k) + r
        return arg % a.div
    if isinstance(a, Lookup):
        return Expr({Lookup(a.table, tuple(simplify(i, ranges, divisors) for i in a.index), a.lo, a.hi): 1})
    return Expr({a: 1})


def _split_divisor(arg: Expr, d: int, ranges: Ranges) -> tuple[Expr, Expr, int] | None:
    """``(q, r, k)`` with ``arg == c*q + r``, ``0 <= r < c`` and ``d == c*k`` for a divisor ``1 < c < d`` of ``d``
    (the largest that works), or None: then ``arg // d == q // k`` and ``arg % d == c*(q % k) + r``.  A
    flattened index divided by a multiple of its outer stride (``(524416*i0 + 4097*i1 + i2) // 16781312``)
    becomes a division of the outer variable alone (``i0 // 32``)."""
    cands = sorted({math.gcd(abs(c), d) for _, c in arg.terms} - {1, d}, reverse=True)
    for c in cands:
        q = Expr({x: v // c for x, v in arg.terms if v % c == 0}, arg.const // c)
        r = Expr({x: v for x, v in arg.terms if v % c != 0}, arg.const % c)
        rlo, rhi = bounds(r, ranges)
        if 0 <= rlo and rhi < c:
            return q, r, d // c
    return None


def _merge_divmod(e: Expr) -> Expr:
    """``e`` with the merges of :func:`_find_merge` applied (``e`` itself where there is none).

    Memoized per expression (it reads nothing else): every fixpoint round of :func:`simplify` asks it of its
    result, and the rounds of one expression under other ranges reach the same intermediate forms."""
    if not any(isinstance(a, Mod) for a, _ in e.terms):   # every merge removes a modulo
        return e
    hit = _MERGED.get(e)
    if hit is None:
        hit = remember(_MERGED, e, _compute_merge_divmod(e), 1 << 18)
    return hit


_MERGED: dict[Expr, Expr] = {}   # expression -> _merge_divmod


def _compute_merge_divmod(e: Expr) -> Expr:
    terms, const = dict(e.terms), e.const
    if (hit := _find_merge(terms)) is None:
        return e
    while hit is not None:
        remove, add = hit
        for a in remove:
            del terms[a]
        for a, c in add.terms:
            terms[a] = terms.get(a, 0) + c
        const += add.const
        terms = {a: c for a, c in terms.items() if c}
        hit = _find_merge(terms)
    return Expr(terms, const)


def _find_merge(terms: dict[Atom, int]) -> tuple[list[Atom], Expr] | None:
    for m, cm in terms.items():
        if not isinstance(m, Mod):
            continue
        fd = FloorDiv(m.arg, m.div)
        if terms.get(fd) == cm * m.div:            # c*(x % a) + c*a*(x // a) -> c*x
            return [m, fd], m.arg * cm
        for other, co in terms.items():            # c*(x % a) + c*a*((x // a) % b) -> c*(x % ab)
            if isinstance(other, Mod) and co == cm * m.div and other.arg == Expr({fd: 1}):
                return [m, other], Expr({Mod(m.arg, m.div * other.div): cm})
    return None


# ---------------------------------------------------------------------------
# evaluation and code generation
# ---------------------------------------------------------------------------

def evaluate(e: Expr, env: Mapping[str, np.ndarray | int],
             tables: Mapping[str, np.ndarray] | None = None) -> np.ndarray | int:
    """Evaluate on (broadcastable) integer arrays; ``env`` holds vars and syms by name.

    An expression without index tensors evaluated again runs as Python code generated once per expression
    (:func:`_compiled`, the same integers as the interpreter below, each distinct div/mod once): the cost
    model evaluates the same predicates and offsets over thousands of sample points, query after query.
    Its first evaluation is interpreted: generating and compiling the code of a predicate nested by a chain
    of channel shuffles costs several interpreted runs, and most are asked once."""
    f = _COMPILED.get(e, _UNCOMPILED)
    if f is _UNCOMPILED:
        if e not in _INTERPRETED:
            if len(_INTERPRETED) > 1 << 16:   # a bound on memory
                _INTERPRETED.clear()
            _INTERPRETED.add(e)
            return interpret(e, env, tables)
        f = _compiled(e)
    if f is not None:
        try:
            return f(env)
        except KeyError:   # a missing variable: the interpreter says which
            pass
    return interpret(e, env, tables)


def interpret(e: Expr, env: Mapping[str, np.ndarray | int],
              tables: Mapping[str, np.ndarray] | None = None) -> np.ndarray | int:
    """:func:`evaluate` by walking the expression (index tensors included), each distinct div/mod atom and
    argument of one once (composed shuffles nest the same ones many times over)."""
    return _interpret(e, env, tables or {}, {})


def _interpret(e: Expr, env, tables, done: dict) -> np.ndarray | int:
    """``done``: the values of the div/mod atoms and arguments already evaluated over ``env``."""
    out = e.const
    for a, c in e.terms:
        out = out + c * _eval_atom(a, env, tables, done)
    return out


Grid = tuple[tuple[str, int, int], ...]   # (variable, lo, hi) per axis of a sparse ``ij`` grid


def evaluate_grid(e: Expr, grid: Grid, syms: Mapping[str, int] | None = None) -> np.ndarray | int:
    """:func:`evaluate` over a box: ``env`` holds, for axis ``k`` of ``grid`` = ``(var, lo, hi)``, the sparse
    ``ij`` meshgrid axis of ``np.arange(lo, hi)`` (int64), and ``syms``.  The same integers, in the same shape.

    Each div/mod atom's values are memoized per the atom and the axes of its variables (position, range; none
    with runtime scalars): the predicates and offsets of a residual copy's pairs, and of every copy between
    maps composed through one chain, nest the same atoms, which :func:`evaluate` computes again in each
    expression (the interpreter shares them only inside one).  With an index tensor: :func:`evaluate`."""
    axes = _grid_axes(grid)
    syms = syms or {}
    if e.has_lookup():
        return evaluate(e, {**{v: ax[3] for v, ax in axes.items()}, **syms})
    return _grid_eval(e, axes, len(grid), syms, {})


def grid_terms(e: Expr, grid: Grid, syms: Mapping[str, int] | None = None) -> list[tuple[int, Any]]:
    """(coefficient, values over the grid) of each of ``e``'s terms, in order, as :func:`evaluate_grid` sums
    them (``e`` without index tensors): a caller that needs the sum over part of the grid only slices them."""
    axes = _grid_axes(grid)
    done: dict = {}
    return [(c, _grid_atom(a, axes, len(grid), syms or {}, done)) for a, c in e.terms]


_GRID_AXES: dict[Grid, dict[str, tuple]] = {}    # grid -> {var: (position, lo, hi, sparse axis)}
_GRID_VALUES: dict[tuple, Any] = {}              # (div/mod atom, ndim, its variables' axes) -> its values


def _grid_axes(grid: Grid) -> dict[str, tuple]:
    got = _GRID_AXES.get(grid)
    if got is None:
        arrays = np.meshgrid(*[np.arange(lo, hi, dtype=np.int64) for _, lo, hi in grid], indexing="ij",
                             sparse=True) if grid else []
        got = {}
        for k, ((v, lo, hi), a) in enumerate(zip(grid, arrays)):
            a.flags.writeable = False   # shared by every evaluation over this grid
            got[v] = (k, lo, hi, a)
        remember(_GRID_AXES, grid, got, 1 << 12)
    return got


def _grid_eval(e: Expr, axes: dict[str, tuple], ndim: int, syms: Mapping[str, int], done: dict):
    """``e`` over the grid, as the interpreter sums it; ``done``: arguments evaluated in this call."""
    out = e.const
    for a, c in e.terms:
        out = out + c * _grid_atom(a, axes, ndim, syms, done)
    return out


def _grid_atom(a: Atom, axes: dict[str, tuple], ndim: int, syms: Mapping[str, int], done: dict):
    t = type(a)
    if t is Var:
        ax = axes.get(a.name)
        if ax is None:
            raise KeyError(f"no value for index variable {a.name!r}")
        return ax[3]
    if t is Sym:
        if a.name not in syms:
            raise KeyError(f"no value for runtime scalar {a.name!r}")
        return syms[a.name]
    if t is not FloorDiv and t is not Mod:
        raise TypeError(a)
    v = done.get(a)
    if v is not None:
        return v
    arg = a.arg
    key = None
    if not arg.syms():
        try:
            key = (a, ndim, tuple(axes[x][:3] for x in arg.sorted_vars()))
        except KeyError:
            key = None   # a variable off the grid: the evaluation below says which
        else:
            v = _GRID_VALUES.get(key)
    if v is None:
        x = done.get(arg)
        if x is None:
            x = done[arg] = _grid_eval(arg, axes, ndim, syms, done)
        v = x // a.div if t is FloorDiv else x % a.div
        if key is not None and np.size(v) <= 2048:
            if isinstance(v, np.ndarray):
                v.flags.writeable = False   # shared by every expression holding the atom
            remember(_GRID_VALUES, key, v, 1 << 13)   # at most 128 MiB of values
    done[a] = v
    return v


_INTERPRETED: set[Expr] = set()                # evaluated once: the next evaluation compiles
_COMPILED: dict[Expr, Callable | None] = {}   # None: interpreted (index tensors, or too deep to compile)
_UNCOMPILED = object()                         # not yet in _COMPILED


def _compiled(e: Expr) -> Callable | None:
    """``e`` as a Python function of ``env`` (None with an index tensor: those take the interpreter)."""
    f = _COMPILED.get(e, _UNCOMPILED)
    if f is not _UNCOMPILED:
        return f
    f = None
    if not e.has_lookup():
        try:
            ns: dict = {}
            exec(_source(e), ns)   # noqa: S102 (our own arithmetic, no input text)
            f = ns["f"]
        except (RecursionError, MemoryError, SyntaxError):   # too deeply nested to compile: interpreted
            f = None
    if len(_COMPILED) > 1 << 16:
        _COMPILED.clear()
    _COMPILED[e] = f
    return f


def _source(e: Expr) -> str:
    """``def f(env)`` computing ``e`` (the code :func:`_compiled` runs): one local per distinct div/mod atom
    and per distinct argument of one, then ``e``'s sum as the interpreter forms it.  A map composed through a
    chain of channel shuffles nests the same atoms many times over; here each costs its array operations
    once.  An argument's sum drops the interpreter's ``0 +`` and ``1 *`` (the same integers: it only feeds a
    ``//`` or ``%``, never returned, so no caller gets an ``env`` array itself)."""
    lines: list[str] = []
    names: dict[Atom | Expr, str] = {}

    def total(x: Expr, bare: bool) -> str:
        out = None if bare and x.const == 0 and x.terms else repr(x.const)
        for a, c in x.terms:
            term = atom(a) if bare and c == 1 else f"{c} * {atom(a)}"
            out = term if out is None else f"({out} + {term})"
        return out

    def local(key: Atom | Expr, code: Callable[[], str]) -> str:
        name = names.get(key)
        if name is None:
            text = code()
            name = names[key] = f"t{len(names)}"
            lines.append(f"    {name} = {text}\n")
        return name

    def atom(a: Atom) -> str:
        if isinstance(a, (Var, Sym)):
            return f"env[{a.name!r}]"
        if not isinstance(a, (FloorDiv, Mod)):
            raise TypeError(a)
        op = "//" if isinstance(a, FloorDiv) else "%"
        return local(a, lambda: f"{argument(a.arg)} {op} {a.div}")

    def argument(x: Expr) -> str:
        if x.const == 0 and len(x.terms) == 1 and x.terms[0][1] == 1:
            return atom(x.terms[0][0])
        return local(x, lambda: total(x, True))

    ret = total(e, False)
    return "def f(env):\n" + "".join(lines) + f"    return {ret}\n"


def _eval_atom(a: Atom, env, tables, done: dict):
    # written with Python operators so it runs on NumPy arrays and on torch tensors alike
    if isinstance(a, (Var, Sym)):
        if a.name not in env:
            kind = "index variable" if isinstance(a, Var) else "runtime scalar"
            raise KeyError(f"no value for {kind} {a.name!r}")
        return env[a.name]
    if isinstance(a, (FloorDiv, Mod)):
        v = done.get(a)
        if v is None:
            x = done.get(a.arg)
            if x is None:
                x = done[a.arg] = _interpret(a.arg, env, tables, done)
            v = done[a] = x // a.div if isinstance(a, FloorDiv) else x % a.div
        return v
    if isinstance(a, Lookup):
        if a.table not in tables:
            raise KeyError(f"no index tensor {a.table!r} for an indirect map")
        t = tables[a.table]
        idx = [evaluate(i, env, tables) for i in a.index]
        if isinstance(t, np.ndarray) or not hasattr(t, "clamp"):
            t = np.asarray(t)
            idx = np.broadcast_arrays(*[np.asarray(i) for i in idx]) if idx else idx
            return t[tuple(np.clip(i, 0, s - 1) for i, s in zip(idx, t.shape))].astype(np.int64)
        import torch
        idx = torch.broadcast_tensors(*[torch.as_tensor(i, device=t.device) for i in idx]) if idx else idx
        return t[tuple(i.clamp(0, s - 1) for i, s in zip(idx, t.shape))].long()
    raise TypeError(a)


@dataclass
class TritonNames:
    """How the atoms of an expression are spelled in a Triton kernel."""

    vars: Mapping[str, str]                       # index var -> code (a tl tensor or scalar)
    syms: Mapping[str, str]                       # runtime scalar -> kernel argument
    tables: Mapping[str, tuple[str, tuple[int, ...]]]  # index tensor -> (pointer arg, strides)
    mask: str | None = None                       # lanes allowed to read index tensors


def to_triton(e: Expr, names: TritonNames) -> str:
    """Spell ``e`` as Triton code; all indices are non-negative, so ``//`` and ``%`` agree with floor."""
    parts = []
    for a, c in e.terms:
        s = _atom_code(a, names)
        parts.append(s if c == 1 else f"({c}) * {s}")
    if e.const or not parts:
        parts.append(f"({e.const})")
    return "(" + " + ".join(parts) + ")"


def _atom_code(a: Atom, names: TritonNames) -> str:
    if isinstance(a, Var):
        return names.vars[a.name]
    if isinstance(a, Sym):
        return names.syms[a.name]
    if isinstance(a, FloorDiv):
        return f"({to_triton(a.arg, names)} // {a.div})"
    if isinstance(a, Mod):
        return f"({to_triton(a.arg, names)} % {a.div})"
    if isinstance(a, Lookup):
        ptr, strides = names.tables[a.table]
        off = " + ".join(f"{to_triton(i, names)} * {s}" for i, s in zip(a.index, strides)) or "0"
        # a lookup at a constant position is a scalar load, which takes no block mask
        varying = any(i.free_vars() for i in a.index)
        mask = f", mask={names.mask}, other=0" if names.mask and varying else ""
        return f"tl.load({ptr} + ({off}){mask}).to(tl.int64)"
    raise TypeError(a)

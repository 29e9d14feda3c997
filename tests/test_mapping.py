"""IndexMap: composition against eager torch (property-based), and the queries the compiler asks."""
import itertools

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from chains import random_chain
from vtcsearch.core.expr import Expr, simplify, sym, var
from vtcsearch.core.mapping import IndexMap, Piece, index_vars


@settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**31 - 1), length=st.integers(1, 6))
def test_random_chains_equal_torch(seed, length):
    c = random_chain(seed, length)
    got = c.map.gather(c.leaves, tables=c.tables)
    assert torch.equal(got, c.value), (c.steps, c.map)


def test_gather_rejects_uncovered_and_doubly_covered():
    i0, = index_vars(1)
    half = IndexMap([4], [Piece("a", ((0, 2),), (i0,))], {"a": (4,)})
    try:
        half.gather({"a": torch.arange(4.0)})
    except ValueError as e:
        assert "covered by 0" in str(e)
    else:
        raise AssertionError("uncovered index accepted")
    twice = IndexMap([4], [Piece("a", ((0, 3),), (i0,)), Piece("a", ((2, 4),), (i0,))], {"a": (4,)})
    try:
        twice.gather({"a": torch.arange(4.0)})
    except ValueError as e:
        assert "covered by 2" in str(e)
    else:
        raise AssertionError("overlapping pieces accepted")


def _concat_map():
    i0, i1 = index_vars(2)
    return IndexMap([4, 8], [Piece("a", ((0, 4), (0, 3)), (i0, i1)), Piece("b", ((0, 4), (3, 8)), (i0, i1 - 3))],
                    {"a": (4, 3), "b": (4, 5)})


def test_queries_on_a_concat_map():
    m = _concat_map()
    assert m.is_affine() and m.is_box_piecewise()
    assert m.run_length() == 3          # the 'a' slab is 3 wide
    assert [r for r, _ in m.piece_runs()] == [3, 5]
    assert m.is_injective()
    assert not m.is_identity_layout()
    assert m.blocks_aligned({0: 1}) and not m.blocks_aligned({1: 2})


def test_queries_on_expand_transpose_reshape():
    i0, i1, i2 = index_vars(3)
    expand = IndexMap.single([4, 3, 8], "x", [4, 1, 8], [i0, Expr(), i2])
    assert not expand.is_injective() and expand.run_length() == 8
    k0, k1 = index_vars(2)
    transpose = IndexMap.single([8, 4], "x", [4, 8], [k1, k0])
    assert transpose.is_injective() and transpose.run_length() == 1
    # a row-major reshape is the identity layout: Type I
    j0, j1 = index_vars(2)
    reshape = IndexMap.single([2, 16], "x", [4, 8], [(j0 * 16 + j1) // 8, (j0 * 16 + j1) % 8])
    assert reshape.is_identity_layout() and reshape.run_length() == 32 and reshape.is_affine()
    # a reshape that breaks contiguity keeps div/mod and short runs
    t = IndexMap.single([8, 4], "y", [4, 8], [k1, k0])
    r = IndexMap.single([32], "t", [8, 4], [var("i0") // 4, var("i0") % 4]).compose({"t": t})
    assert not r.is_affine() and r.run_length() == 1 and r.is_injective()


def test_runtime_scalar_offsets_stay_affine_and_symbolic():
    pos = sym("pos", 0, 15)
    i0, i1 = index_vars(2)
    row = IndexMap.single([1, 8], "cache", [16, 8], [i0 + pos, i1])
    assert row.is_affine() and row.run_length() == 8 and row.is_injective()
    cache = torch.arange(128.0).view(16, 8)
    assert torch.equal(row.gather({"cache": cache}, syms={"pos": 5}), cache[5:6])


def test_compose_collapses_a_chain_and_simplify_merges_dims():
    i = var("i")
    assert simplify((i // 8) * 8 + i % 8, {"i": (0, 63)}) == i
    assert simplify(4 * ((i // 4) % 2) + i % 4 + 8 * (i // 8), {"i": (0, 63)}) == i
    # view [2,3,4] -> [6,4] -> [24] composes back to the identity
    v1 = IndexMap.single([6, 4], "x", [2, 3, 4], [var("i0") // 3, var("i0") % 3, var("i1")])
    v2 = IndexMap.single([24], "v1", [6, 4], [var("i0") // 4, var("i0") % 4]).compose({"v1": v1})
    assert v2.is_identity_layout()


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**31 - 1), length=st.integers(1, 6))
def test_compiled_evaluation_equals_the_interpreter(seed, length):
    """``evaluate`` runs an expression as generated Python code; on every index and predicate of random
    movement chains it gives the interpreter's values (runtime scalars at their lower bound)."""
    import numpy as np
    from vtcsearch.core.expr import _compiled, evaluate, interpret
    c = random_chain(seed, length)
    for p in c.map.pieces:
        grid = np.meshgrid(*[np.arange(lo, hi) for lo, hi in p.region], indexing="ij")
        for e in list(p.index) + [ce for ce, _, _ in p.conds]:
            if e.has_lookup():
                assert _compiled(e) is None
                continue
            env = {f"i{k}": g for k, g in enumerate(grid)} | {s.name: s.lo for s in e.syms()}
            assert _compiled(e) is not None
            assert np.array_equal(np.asarray(evaluate(e, env)), np.asarray(interpret(e, env))), e


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_compiled_nested_div_mod_equals_the_interpreter(data):
    """The generated code and the interpreter compute each distinct div/mod atom and argument once, and the
    code drops ``0 +`` / ``1 *`` inside arguments: on random nested div/mod expressions sharing
    sub-expressions (as composed shuffles do), over random integer grids with negative values, both give the
    integers and the type of a plain walk of the tree, and so does ``evaluate`` (interpreted, then compiled)."""
    import numpy as np
    from vtcsearch.core.expr import FloorDiv, Var, Sym, _compiled, evaluate, interpret

    def walk(e, env):
        out = e.const
        for a, c in e.terms:
            v = env[a.name] if isinstance(a, (Var, Sym)) else \
                walk(a.arg, env) // a.div if isinstance(a, FloorDiv) else walk(a.arg, env) % a.div
            out = out + c * v
        return out

    pool = [var("i0"), var("i1"), sym("s", -5, 5), Expr(const=data.draw(st.integers(-9, 9)))]
    for _ in range(data.draw(st.integers(1, 10))):
        a, b = data.draw(st.sampled_from(pool)), data.draw(st.sampled_from(pool))
        e = a * data.draw(st.integers(-4, 4)) + b * data.draw(st.sampled_from([1, 1, 2, -3]))
        op = data.draw(st.sampled_from(["//", "%", "+"]))
        d = data.draw(st.integers(1, 13))
        pool.append(e // d if op == "//" else e % d if op == "%" else e + data.draw(st.integers(-3, 3)))
    e = sum(pool[-3:], Expr()) + pool[-1] * data.draw(st.integers(-2, 2))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    env = {"i0": rng.integers(-50, 50, (data.draw(st.integers(1, 7)), 1)), "i1": rng.integers(-50, 50, 5),
           "s": int(rng.integers(-5, 6))}
    scalars = {k: int(np.ravel(v)[0]) for k, v in env.items()}    # Python ints stay Python ints
    f = _compiled(e)
    assert f is not None
    for en in (env, scalars):
        want = walk(e, en)
        for got in (f(en), interpret(e, en), evaluate(e, en), evaluate(e, en)):
            assert type(got) is type(want) and np.asarray(got).dtype == np.asarray(want).dtype, e
            assert np.array_equal(np.asarray(got), np.asarray(want)), e


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_simplify_keeps_the_value_of_div_and_mod(data):
    """simplify rewrites ``x // d`` and ``x % d`` by the index ranges; every value stays the same.  The
    cases include a flattened index over a multiple of its outer stride, ``(c*q + r) // (c*k)``."""
    import numpy as np
    from vtcsearch.core.expr import evaluate
    n = data.draw(st.integers(1, 3))
    ext = [data.draw(st.integers(1, 9)) for _ in range(n)]
    names = [f"i{k}" for k in range(n)]
    stride = 1
    flat = Expr()
    for nm, e in zip(reversed(names), reversed(ext)):          # row-major, with an optional gap per dim
        flat = flat + var(nm) * stride
        stride *= e + data.draw(st.integers(0, 2))
    flat = flat + data.draw(st.integers(0, 3))
    d = data.draw(st.sampled_from([stride, 2 * stride, 3 * stride, stride // max(1, ext[0]), 5, 7, 12]))
    d = max(1, d)
    ranges = {nm: (0, e - 1) for nm, e in zip(names, ext)}
    grid = np.meshgrid(*[np.arange(e) for e in ext], indexing="ij")
    env = dict(zip(names, grid))
    for e, divisors in itertools.product((flat // d, flat % d, (flat // d) * d + flat % d), (False, True)):
        got = evaluate(simplify(e, ranges, divisors), env)
        assert np.array_equal(np.broadcast_to(got, grid[0].shape), np.broadcast_to(evaluate(e, env), grid[0].shape)), \
            (e, simplify(e, ranges, divisors))


def test_simplify_divides_a_flattened_index_by_its_outer_variable():
    """``(524416*i0 + 4097*i1 + i2) // 16781312`` (a GQA view of a flattened KV cache, 16781312 = 32 * 524416) is
    ``i0 // 32``: an index the cost model asks about (``divisors=True``) costs once per program, not per element.
    Maps keep their form (the committed measurements are keyed by their text)."""
    i0, i1, i2 = var("i0"), var("i1"), var("i2")
    ranges = {"i0": (0, 511), "i1": (0, 127), "i2": (0, 4096)}
    flat = i0 * 524416 + i1 * 4097 + i2
    assert simplify(flat // 16781312, ranges, divisors=True) == i0 // 32
    assert simplify(flat % 16781312, ranges, divisors=True) == (i0 % 32) * 524416 + i1 * 4097 + i2
    assert simplify(flat // 16781312, ranges) == flat // 16781312


def test_restrict_and_retarget():
    m = _concat_map().restrict(((0, 4), (2, 5)))
    assert [p.region for p in m.pieces] == [((0, 4), (2, 3)), ((0, 4), (3, 5))]
    r = m.retarget({"a": "A"})
    assert r.targets() == {"A", "b"}


def test_run_length_of_a_gather_needs_no_index_values():
    """A gather's rows (``table[i0]``) are contiguous along the row: the run is measured without the table
    (building a VTOG has no index tensor values; EfficientViT's bicubic resize gathers rows)."""
    from vtcsearch.core.expr import lookup
    i0, i1 = index_vars(2)
    m = IndexMap.single((5, 16), "x", (100, 16), [lookup("idx", [i0], 0, 99), i1])
    assert m.run_length() == 16


@pytest.mark.parametrize("case", ["permute", "reshape", "reshape_infer", "broadcast", "narrow_step", "cat"])
def test_movement_constructors_equal_torch(case):
    """The one definition of each movement (used by ops.py's rules and the kernels' Operand views) is torch's."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 4, generator=g)
    if case == "permute":
        m, want = IndexMap.permute(x.shape, [2, 0, -2], "x"), x.permute(2, 0, 1)
    elif case == "reshape":
        m, want = IndexMap.reshape(x.shape, [4, 6], "x"), x.reshape(4, 6)
    elif case == "reshape_infer":
        m, want = IndexMap.reshape(x.shape, [3, -1], "x"), x.reshape(3, -1)
    elif case == "broadcast":
        x = torch.randn(3, 1, generator=g)
        m, want = IndexMap.broadcast(x.shape, [2, 3, 5], "x"), x.expand(2, 3, 5)
    elif case == "narrow_step":
        m, want = IndexMap.narrow(x.shape, -1, 1, 2, "x", step=2), x[..., 1:4:2]
    else:
        y = torch.randn(2, 5, 4, generator=g)
        m, want = IndexMap.cat([("x", x.shape), ("y", y.shape)], 1), torch.cat([x, y], 1)
        assert m.gather({"x": x, "y": y}).equal(want) and m.shape == tuple(want.shape)
        return
    assert m.shape == tuple(want.shape)
    assert m.gather({"x": x}).equal(want)


@pytest.mark.parametrize("bad", [lambda: IndexMap.permute((2, 3), [0, 0], "x"),
                                 lambda: IndexMap.reshape((2, 3), [4, 2], "x"),
                                 lambda: IndexMap.broadcast((2, 3), [3, 3], "x"),
                                 lambda: IndexMap.narrow((2, 3), 1, 2, 2, "x"),
                                 lambda: IndexMap.cat([("x", (2, 3)), ("y", (3, 3))], 1)])
def test_movement_constructors_reject_impossible_views(bad):
    with pytest.raises(ValueError):
        bad()


def test_run_length_through_a_lookup_with_a_four_d_index():
    """A gather whose index tensor is 4-d (transformers' causal mask) is classified without int64 overflow,
    and the run inside a gathered row is still found."""
    from vtcsearch.core.expr import lookup
    v = index_vars(2)
    m = IndexMap.single((1, 16), "w", (64, 16), [lookup("ids", [v[0], v[0], v[0], v[0]], 0, 63), v[1]])
    assert m.run_length() == 16
    m = IndexMap.single((1, 16), "w", (64, 16), [lookup("ids", [v[0], v[0], v[0], v[1]], 0, 63), v[1]])
    assert m.run_length() == 1


@pytest.mark.parametrize("seed", range(60))
def test_numeric_injectivity_on_the_box_equals_the_full_grid(seed):
    """The numeric injectivity check (of pieces it is handed: one target's) evaluates each piece on its own box
    (sparse grids); the answer is the full-grid evaluation's (every element of the domain, masked to the piece)."""
    import numpy as np
    from vtcsearch.core.mapping import _eval_piece, contiguous_strides
    m = random_chain(seed, 4).map
    if m.has_lookup() or m.syms() or any(p.target is None for p in m.pieces):
        pytest.skip("evaluated only without index tensors, runtime scalars or constants")
    seen = []
    for p in m.pieces:
        mask, idx = _eval_piece(p, m.shape, {}, {})
        flat = sum(idx[k] * s for k, s in enumerate(contiguous_strides(m.target_shapes[p.target])))
        seen.append(np.broadcast_to(flat, mask.shape)[mask])
    allv = np.concatenate(seen)
    assert m._numeric_injective(list(m.pieces), None) == (len(np.unique(allv)) == len(allv))


def test_pieces_and_expressions_unpickled_in_another_process_hash_as_built_there():
    """Expressions and pieces cache their hash, which hashes names: strings hash differently in every process.
    Pickled in one (another PYTHONHASHSEED) and loaded here, they must find the equal keys built here."""
    import os
    import pickle
    import subprocess
    import sys
    code = ("import pickle, sys\n"
            "from vtcsearch.core.expr import var\n"
            "from vtcsearch.core.mapping import Piece\n"
            "e = var('i0') * 2 + var('i1') // 3\n"
            "p = Piece('x', ((0, 4), (0, 6)), (e,), ((var('i1') % 2, 0, 1),))\n"
            "hash(e); hash(p)\n"
            "sys.stdout.buffer.write(pickle.dumps((e, p)))\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    blob = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True, cwd=root,
                          env={**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": root}).stdout
    e2, p2 = pickle.loads(blob)
    e = var("i0") * 2 + var("i1") // 3
    p = Piece("x", ((0, 4), (0, 6)), (e,), ((var("i1") % 2, 0, 1),))
    assert {e: 1}[e2] == 1 and {p: 1}[p2] == 1


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_bounds_and_simplify_memos_answer_as_cold(data):
    """bounds' and simplify's memos of div/mod atoms are keyed by the ranges of their variables, and simplify's
    memo of a fixpoint is that fixpoint: warm answers under other ranges equal those computed from cleared
    memos."""
    from vtcsearch.core.expr import bounds
    from vtcsearch.core.mapping import clear_memos
    i0, i1 = var("i0"), var("i1")
    e = i0 * data.draw(st.integers(1, 30)) + i1 + data.draw(st.integers(0, 5))
    for _ in range(data.draw(st.integers(1, 3))):      # nested, as a chain of shuffles composes them
        d = data.draw(st.integers(2, 12))
        e = (e // d) * data.draw(st.integers(1, 9)) + e % d + i1
    rangess = [{"i0": (0, data.draw(st.integers(0, 20))), "i1": (0, data.draw(st.integers(0, 20)))}
               for _ in range(2)]
    warm = [(bounds(e, r), simplify(e, r), simplify(simplify(e, r, True), r, True)) for r in rangess]
    for r, got in zip(rangess, warm):
        clear_memos()
        assert got == (bounds(e, r), simplify(e, r), simplify(e, r, True))


def test_a_rewrite_that_changes_nothing_keeps_the_expression():
    """``map_atoms`` gives back the expression itself when every atom maps to itself (so simplify's fixpoint
    test and the memos compare it by identity), and the rewritten sum as soon as one atom changes, whichever
    it is; ``_merge_divmod`` gives back its argument when nothing merges, the merged sum when something does."""
    from vtcsearch.core.expr import FloorDiv, Mod, _merge_divmod
    i, j = var("i"), var("j")
    e = 3 * (i // 4) + 5 * (j % 3) + 2 * i + 7
    assert e.map_atoms(lambda a: Expr({a: 1})) is e
    for k, (atom, _) in enumerate(e.terms):
        got = e.map_atoms(lambda a: Expr({a: 1}) if a != atom else Expr({a: 1}) + 1)
        assert got is not e and got == e + e.coef(atom), k
        got = e.map_atoms(lambda a: Expr({a: 1}) if a != atom else Expr({a: 2}))
        assert got == e + e.coef(atom) * Expr({atom: 1}), k
    assert _merge_divmod(e) is e
    merged = 4 * (i // 4) + i % 4 + j
    assert _merge_divmod(merged) == i + j
    assert simplify(merged, {"i": (0, 63), "j": (0, 3)}) == i + j


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**31 - 1), length=st.integers(1, 6))
def test_run_length_memo_answers_as_cold(seed, length):
    """``_run_length`` is memoized per (region, index, whether there are predicates, strides, shape), not per
    piece: pieces of random chains and variants of them (other predicates, a smaller box, none) asked one after
    the other, warm, get what each computed from cleared memos gets."""
    from vtcsearch.core.mapping import _compute_run_length, _run_length, clear_memos, contiguous_strides
    c = random_chain(seed, length)
    variants = []
    for p in c.map.pieces:
        if p.target is None or any(e.has_lookup() for e in p.index) or any(ce.has_lookup() for ce, _, _ in p.conds):
            continue
        st_ = contiguous_strides(c.map.target_shapes[p.target])
        half = tuple((lo, max(lo + 1, (lo + hi) // 2)) if k == len(p.region) - 1 else (lo, hi)
                     for k, (lo, hi) in enumerate(p.region))
        extra = ((var(f"i{len(p.region) - 1}"), 0, max(1, p.region[-1][1] - 1)),) if p.region else ()
        for q in (p, Piece(p.target, p.region, p.index, ()), Piece(p.target, p.region, p.index, p.conds + extra),
                  Piece(p.target, half, p.index, p.conds), Piece(p.target, half, p.index, ())):
            variants.append((q, st_))
    warm = [_run_length(q, s, c.map.shape) for q, s in variants]
    for (q, s), got in zip(variants, warm):
        clear_memos()
        assert got == _compute_run_length(q, s, c.map.shape), q


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**31 - 1), length=st.integers(1, 6))
def test_normalize_and_offset_memos_answer_as_cold(seed, length):
    """A piece's predicates are normalized through a memo per predicate and the ranges of its variables, and
    ``Piece.offset`` through one per (index, region, strides): the pieces of random chains and variants that
    repeat their predicates over other boxes (as a residual copy's pairs do), asked warm, normalize and offset
    as from cleared memos."""
    from dataclasses import replace
    from vtcsearch.core.mapping import _normalize_piece, clear_memos, contiguous_strides
    c = random_chain(seed, length)
    pieces = []
    for p in c.map.pieces:
        others = [q for q in c.map.pieces if q is not p]
        for q in [p] + others[:2]:
            pieces.append(Piece(p.target, p.region, p.index, p.conds + q.conds, p.fill))
        half = tuple((lo, max(lo + 1, (lo + hi) // 2)) for lo, hi in p.region)
        pieces.append(replace(p, region=half))
        pieces.append(replace(p, region=half, target="other"))
    strides = [contiguous_strides(c.map.target_shapes[p.target]) if p.target in c.map.target_shapes else
               (1,) * len(p.index) for p in pieces]
    warm = [(_normalize_piece(p), p.offset(s) if p.target else None) for p, s in zip(pieces, strides)]
    for (p, s), got in zip(zip(pieces, strides), warm):
        clear_memos()
        fresh = Piece(p.target, p.region, p.index, p.conds, p.fill)   # no offset memo of its own
        assert got == (_normalize_piece(p), fresh.offset(s) if p.target else None)


def _walk_subs(e: Expr, env) -> Expr:
    """Substitution by a plain walk of the tree, every occurrence of an atom on its own (the reference)."""
    from vtcsearch.core.expr import FloorDiv, Lookup, Mod, Var
    out = Expr(const=e.const)
    for a, c in e.terms:
        if isinstance(a, Var):
            x = env.get(a.name, Expr({a: 1}))
        elif isinstance(a, FloorDiv):
            x = _walk_subs(a.arg, env) // a.div
        elif isinstance(a, Mod):
            x = _walk_subs(a.arg, env) % a.div
        elif isinstance(a, Lookup):
            x = Expr({Lookup(a.table, tuple(_walk_subs(i, env) for i in a.index), a.lo, a.hi): 1})
        else:
            x = Expr({a: 1})
        out = out + x * c
    return out


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**31 - 1), length=st.integers(1, 6))
def test_substitution_shares_atoms_and_equals_a_walk_of_the_tree(seed, length):
    """``Expr.subs`` substitutes each distinct atom once, in a memo its caller may share between expressions
    with the same substitution (a piece's index and predicates; compose's pieces of one base map): on the
    pieces of random chains, swapped as the traffic model swaps the last two dims, and on a shuffle chain
    nested as ShuffleNet composes it, every expression equals the plain walk's."""
    c = random_chain(seed, length)
    for p in c.map.pieces:
        n = len(p.region)
        if n < 2:
            continue
        env = {f"i{n - 1}": var(f"i{n - 2}"), f"i{n - 2}": var(f"i{n - 1}"), "i0": var(f"i{n - 1}") * 3 + 1}
        memo: dict = {}
        for e in list(p.index) + [ce for ce, _, _ in p.conds]:
            assert e.subs(env, memo) == _walk_subs(e, env), e
    i1, i2 = var("i1"), var("i2")
    e = i1
    for _ in range(4):   # nested: each level holds the previous one several times
        e = 116 * ((196 * e + 14 * i2) // 392 % 2) + (196 * e + 14 * i2) // 392 + 29 * (e % 2)
    memo = {}
    for env in ({"i1": i2 * 2, "i2": i1}, {"i1": i2 * 2, "i2": i1}, {"i2": var("i3") + 5}):
        m = memo if env.get("i2") == i1 else {}   # the first two share a substitution, the third has its own
        assert e.subs(env, m) == _walk_subs(e, env)


def test_equal_expressions_are_one_object_and_a_hash_collision_is_not_merged():
    """``Expr`` hash-conses: an expression equal to one built before is that object (so memos keyed by
    expressions compare by identity), and one that only shares another's hash is built on its own, with its
    own terms (the table keys by hash alone)."""
    from vtcsearch.core import expr as E
    i, j = var("i"), var("j")
    a = 116 * ((196 * i + 14 * j) // 392 % 2) + j
    b = 116 * ((196 * i + 14 * j) // 392 % 2) + j
    assert a is b and (a + 1 - 1) is a
    assert Expr(dict(a.terms), a.const) is a
    c = 3 * i + 5
    h = hash((c.terms, c.const))
    E._INTERNED[h] = a                      # another expression under c's hash: a collision
    try:
        d = Expr(dict(c.terms), c.const)
        assert d is not a and d.terms == c.terms and d.const == 5 and d == c and repr(d) == "3*i + 5"
    finally:
        E._INTERNED[h] = c

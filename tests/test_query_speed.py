"""Fast cost queries (issue 13): every memo and fast path of a query answers as the slow route does.

The traffic model's memos of numeric work (:class:`cost_models.accounting.TrafficModel`), the grid evaluation of expressions
(:func:`vtcsearch.core.expr.evaluate_grid`), the run of a piece sought over prefixes
(:func:`vtcsearch.core.mapping._evaluate_run`) and the memo of div/mod merges are each compared with the
route they replace (the traffic model's: a fresh model with every memo cleared), on random maps and on a channel-shuffle chain nested as ShuffleNet composes it."""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

from chains import random_chain
from vtcsearch.core.expr import Expr, evaluate, evaluate_grid, grid_terms, interpret, simplify, var
from vtcsearch.core.mapping import IndexMap, Piece, clear_memos, contiguous_strides, sample_box


def _shuffle_chain(depth: int, channels: int = 24, groups: int = 2) -> Expr:
    """A channel index composed through ``depth`` channel shuffles over a 4x4 plane (i1: channel)."""
    i1, i2, i3 = var("i1"), var("i2"), var("i3")
    e = i1
    per = channels // groups
    for _ in range(depth):
        flat = 16 * e + 4 * i2 + i3
        e = per * ((flat // (16 * groups)) % groups) + flat // (16 * per * groups) + groups * (e % per)
        e = e % channels
    return e


def _pieces(seed: int, length: int) -> list[Piece]:
    """Pieces of a random chain without index tensors, and pieces pairing each with the others' predicates
    (what a residual copy between two maps prices)."""
    c = random_chain(seed, length)
    out = []
    for p in c.map.pieces:
        if p.target is None or any(e.has_lookup() for e in p.index) or any(ce.has_lookup() for ce, _, _ in p.conds):
            continue
        out.append(p)
        for q in c.map.pieces:
            if q is not p and not any(ce.has_lookup() for ce, _, _ in q.conds):
                out.append(Piece(p.target, p.region, p.index, p.conds + q.conds))
    return out


def _reference(e: Expr, region, syms=None):
    """``e`` over the sparse grid of ``region``, by the interpreter (the slow route)."""
    grids = np.meshgrid(*[np.arange(lo, hi) for lo, hi in region], indexing="ij", sparse=True)
    env = {f"i{k}": g for k, g in enumerate(grids)}
    env.update(syms or {})
    return interpret(e, env)


def _reference_run(off: Expr, region, sample: int) -> int:
    """The run as :func:`_numeric_run` computed it before: the whole sample box, evaluated and differenced."""
    region = sample_box(region, sample)
    vals = np.broadcast_to(np.asarray(_reference(off, region, {s.name: s.lo for s in off.syms()})),
                           tuple(hi - lo for lo, hi in region)).reshape(-1)
    if vals.size <= 1:
        return int(vals.size)
    breaks = np.nonzero(np.diff(vals) != 1)[0]
    return int(breaks[0] + 1) if breaks.size else int(vals.size)


def _same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and bool((a == b).all())


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**31 - 1), length=st.integers(1, 6))
def test_grid_evaluation_equals_the_interpreter(seed, length):
    """``evaluate_grid`` (div/mod atoms memoized per their variables' axes) gives the interpreter's integers in
    the interpreter's shape, cold and warm, for the offsets and predicates of random pieces, each simplified as
    the traffic model evaluates it; ``grid_terms`` sums to the same."""
    clear_memos()
    for p in _pieces(seed, length):
        ranges = p.ranges()
        grid = tuple((f"i{k}", lo, hi) for k, (lo, hi) in enumerate(p.region))
        exprs = [p.offset(contiguous_strides([40] * len(p.index)))] + [ce for ce, _, _ in p.conds]
        exprs += [simplify(e, ranges, divisors=True) for e in exprs]
        for e in exprs:
            syms = {s.name: s.lo for s in e.syms()}
            want = _reference(e, p.region, syms)
            for _ in range(2):   # cold, then from the memo
                assert _same(evaluate_grid(e, grid, syms), want), e
            total = e.const
            for c, v in grid_terms(e, grid, syms):
                total = total + c * v
            assert _same(total, want), e


def test_grid_evaluation_of_a_shuffle_chain_shares_atoms_across_boxes():
    """Nested shuffle predicates over boxes that share some axes and not others: every value is the
    interpreter's, whichever box evaluated an atom first."""
    clear_memos()
    e = _shuffle_chain(5)
    boxes = [((0, 1), (0, 24), (0, 4), (0, 4)), ((0, 1), (12, 24), (0, 4), (0, 4)), ((0, 1), (0, 24), (1, 3), (0, 4)),
             ((0, 1), (0, 24), (0, 4), (0, 4))]
    for region in boxes:
        ranges = {f"i{k}": (lo, hi - 1) for k, (lo, hi) in enumerate(region)}
        grid = tuple((f"i{k}", lo, hi) for k, (lo, hi) in enumerate(region))
        for x in (e, simplify(e, ranges), simplify(e, ranges, divisors=True), 16 * e + 4 * var("i2") + var("i3")):
            assert _same(evaluate_grid(x, grid), _reference(x, region)), (x, region)
            assert _same(evaluate_grid(x, grid), evaluate(x, dict(zip(("i0", "i1", "i2", "i3"), np.meshgrid(
                *[np.arange(lo, hi) for lo, hi in region], indexing="ij", sparse=True))))), (x, region)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**31 - 1), length=st.integers(1, 6), sample=st.sampled_from([3, 16, 64, 8192]),
       min_prefix=st.sampled_from([1, 4, 256]))
def test_run_by_prefixes_equals_the_whole_sample(seed, length, sample, min_prefix):
    """The first contiguous run sought over growing prefixes of the sample box (every prefix with
    ``min_prefix=1``) is the whole box's, for random pieces' offsets into random strides."""
    from vtcsearch.core.mapping import _evaluate_run
    clear_memos()
    rng = np.random.default_rng(seed)
    for p in _pieces(seed, length):
        for strides in (contiguous_strides([7] * len(p.index)), tuple(int(x) for x in rng.integers(0, 9, len(p.index)))):
            off = simplify(p.offset(strides), p.ranges(), divisors=True)
            assert _evaluate_run(off, p.region, sample, min_prefix) == _reference_run(off, p.region, sample), \
                (off, p.region, sample)


def test_run_by_prefixes_of_shuffle_offsets():
    """Offsets of a channel shuffle into channel-major storage (runs of one plane, of one row, of several
    channels) and of a plain transpose, over boxes that the sample truncates or not."""
    from vtcsearch.core.mapping import _evaluate_run
    clear_memos()
    i1, i2, i3 = var("i1"), var("i2"), var("i3")
    offs = [16 * _shuffle_chain(d) + 4 * i2 + i3 for d in range(4)]
    offs += [16 * (i1 // 2) + 4 * i2 + i3, 16 * i1 + 4 * i2 + i3, 4 * i3 + i2 + 16 * i1, 16 * (i1 % 5) + i3]
    for off in offs:
        for region in (((0, 1), (0, 24), (0, 4), (0, 4)), ((0, 1), (12, 24), (0, 4), (0, 4)),
                       ((0, 1), (0, 24), (0, 4), (1, 4)), ((0, 1), (3, 4), (0, 4), (0, 4))):
            ranges = {f"i{k}": (lo, hi - 1) for k, (lo, hi) in enumerate(region)}
            s = simplify(off, ranges, divisors=True)
            for sample in (5, 40, 8192):
                for min_prefix in (1, 256):
                    assert _evaluate_run(s, region, sample, min_prefix) == _reference_run(s, region, sample), \
                        (off, region, sample, min_prefix)


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**31 - 1), length=st.integers(1, 6))
def test_numeric_run_memo_answers_as_cold(seed, length):
    """``_numeric_run`` is memoized per (offset simplified over the piece, region, sample): asked warm, for
    random pieces and their pairs, it answers as from cleared memos."""
    from vtcsearch.core.mapping import _numeric_run
    pieces = _pieces(seed, length)
    for p in list(pieces):   # the same offset over a smaller box: its own run
        half = tuple((lo, max(lo + 1, (lo + hi) // 2)) for lo, hi in p.region)
        pieces.append(Piece(p.target, half, p.index, p.conds))
    i1, i2, i3 = var("i1"), var("i2"), var("i3")
    for off in (16 * (i1 // 2) + 4 * i2 + i3, 16 * _shuffle_chain(2) + 4 * i2 + i3):
        for region in (((0, 1), (0, 24), (0, 4), (0, 4)), ((0, 1), (0, 24), (0, 4), (0, 2)), ((0, 1), (5, 6), (0, 4), (0, 4))):
            pieces.append(Piece("a", region, (var("i0"), off)))
    offs = [(p, p.offset(contiguous_strides([5] * len(p.index)) if len(p.index) > 2 else (1000, 1)))
            for p in pieces]
    warm = [_numeric_run(p, off) for p, off in offs]
    for (p, off), got in zip(offs, warm):
        clear_memos()
        assert got == _reference_run(simplify(off, p.ranges(), divisors=True), p.region, 8192), (p, off)


def test_merge_memo_answers_as_the_merge():
    """``_merge_divmod`` (memoized per expression, skipped without a modulo) equals the merge computed afresh."""
    from vtcsearch.core.expr import _compute_merge_divmod, _merge_divmod
    i, j = var("i"), var("j")
    cases = [4 * (i // 4) + i % 4 + j, 3 * (i % 4) + 12 * ((i // 4) % 5) + j, i + j, i // 3 + 2, (i % 4) + (j % 4),
             _shuffle_chain(3), 16 * _shuffle_chain(2) + 4 * var("i2") + var("i3")]
    for e in cases:
        for _ in range(2):
            assert _merge_divmod(e) == _compute_merge_divmod(e), e


def _cold(exact_limit: int, ask):
    """``ask`` answered by a fresh traffic model with every process-wide memo cleared: what no earlier
    question can change."""
    from cost_models.accounting import TrafficModel
    clear_memos()
    return ask(TrafficModel(exact_limit=exact_limit))


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**31 - 1), length=st.integers(1, 6), exact_limit=st.sampled_from([1, 8, 4096]),
       itemsize=st.sampled_from([1, 2, 4]))
def test_traffic_memos_answer_as_cold(seed, length, exact_limit, itemsize):
    """One traffic model (masks of predicates, distinct counts of offset groups and index ops memoized) prices
    every random map, and maps of each piece paired with the others' predicates, as a cold model does;
    ``exact_limit`` 1 and 8 send every piece to the estimates those memos serve."""
    from cost_models.accounting import TrafficModel
    c = random_chain(seed, length)
    if c.map.has_lookup() or any(ce.has_lookup() for p in c.map.pieces for ce, _, _ in p.conds):
        return
    strides = {t: contiguous_strides(s) for t, s in c.map.target_shapes.items()}
    maps = [c.map] + [IndexMap(c.map.shape, [p], c.map.target_shapes) for p in _pieces(seed, length)]
    cold = [[_cold(exact_limit, lambda t, m=m, w=w: t.access(m, itemsize, strides, w)) for w in (False, True)]
            for m in maps]
    clear_memos()
    warm = TrafficModel(exact_limit=exact_limit)
    for m, answers in zip(maps, cold):
        assert [warm.access(m, itemsize, strides, w) for w in (False, True)] == answers, m


def test_traffic_memos_on_shuffle_pairs():
    """Pieces of a nested channel shuffle paired with each other's predicates (a residual copy through a
    shuffle chain): one model answers as a cold one, with predicates the grid or the sample
    decides (the sample when the predicates read more than ``sample`` points)."""
    from cost_models.accounting import TrafficModel
    i0, i1, i2, i3 = (var(f"i{k}") for k in range(4))
    shape = (1, 24, 4, 4)
    pieces = []
    for depth in range(1, 4):
        ch = _shuffle_chain(depth)
        conds = ((ch, 0, 12),)
        other = ((_shuffle_chain(depth + 1), 12, 24), (ch + 4 * i2, 0, 30))
        for region in (((0, 1), (0, 24), (0, 4), (0, 4)), ((0, 1), (0, 12), (0, 4), (0, 4))):
            pieces.append(Piece("a", region, (i0, ch % 12, i2, i3), conds + other))
            pieces.append(Piece("b", region, (i0, i1, i2, i3), conds))
            pieces.append(Piece("a", region, (i0, (ch + 5) % 12, i3, i2), other))
    st_ = {"a": contiguous_strides((1, 12, 4, 4)), "b": contiguous_strides((1, 24, 4, 4))}
    maps = [IndexMap(shape, [p], {"a": (1, 12, 4, 4), "b": (1, 24, 4, 4)}) for p in pieces]

    def answers(t, p, m):      # the sampled branch (8 points) and the exact grid (4096)
        return t.access(m, 2, st_), t._sample_fraction(p, 8), t._sample_fraction(p, 4096)
    for exact_limit in (4, 4096):
        cold = [_cold(exact_limit, lambda t, p=p, m=m: answers(t, p, m)) for p, m in zip(pieces, maps)]
        clear_memos()
        warm = TrafficModel(exact_limit=exact_limit)
        for p, m, a in zip(pieces, maps, cold):
            assert answers(warm, p, m) == a, p


def test_distinct_groups_memo_answers_per_box():
    """The distinct count of an offset group is memoized per (group, its variables' box): one model asked the
    same offsets over boxes that share some groups' boxes and not others answers as a cold one."""
    from cost_models.accounting import TrafficModel
    i1, i2, i3 = (var(f"i{k}") for k in range(1, 4))
    offs = [16 * (i1 % 5) + i3, 16 * (i1 // 3) + 4 * (i2 % 2) + i3, 7 * ((i1 + i2) // 4) + i3 % 3,
            16 * _shuffle_chain(2) + 4 * i2 + i3, 16 * _shuffle_chain(3) + (4 * i2 + i3) // 2]
    regions = [((0, 1), (0, 24), (0, 4), (0, 4)), ((0, 1), (12, 24), (0, 4), (0, 4)), ((0, 1), (0, 24), (1, 4), (0, 3)),
               ((0, 1), (3, 9), (0, 4), (2, 4))]
    for exact_limit in (2, 30, 4096):
        cold = {(o, r): _cold(exact_limit, lambda t, o=o, r=r: t._estimate_distinct(o, r)) for o in offs for r in regions}
        clear_memos()
        warm = TrafficModel(exact_limit=exact_limit)
        for (off, region), n in cold.items():
            assert warm._estimate_distinct(off, region) == n, (off, region)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**31 - 1), length=st.integers(1, 6), ndim=st.sampled_from([3, 4]))
def test_affine_head_group_equals_head_group(seed, length, ndim):
    """The analytical oracle's head group of an operand (answered from coefficients where the map is affine)
    equals :func:`~vtcsearch.codegen.heads.head_group`'s, for random maps over 3 and 4 dims and for strided and
    GQA-broadcast operands with head counts of many divisors."""
    from cost_models.analytical import affine_head_group
    from vtcsearch.codegen.heads import head_group
    c = random_chain(seed, length, ndim=ndim)
    strides = {t: contiguous_strides(s) for t, s in c.map.target_shapes.items()}
    maps = [c.map]
    i0, i1, i2, i3 = (var(f"i{k}") for k in range(4))
    for h, kv in ((32, 8), (24, 6), (12, 12), (7, 1)):
        shape = (1, h, 5, 4)
        for index, tshape in (((i0, i1 // (h // kv), i2, i3), (1, kv, 5, 4)), ((i0, i2, i1, i3), (1, 5, h, 4)),
                              ((i0, i2 * 0, i2, i3), (1, 1, 5, 4)), ((i0, i3, i2), (1, 4, 5))):
            maps.append(IndexMap.single(shape, "kv", tshape, index))
            half = ((0, 1), (0, h // 2), (0, 5), (0, 4))
            maps.append(IndexMap(shape, [Piece("kv", half, index), Piece("kv", ((0, 1), (h // 2, h), (0, 5), (0, 4)),
                                                                              index, ((i2 + i1 * 0, 0, 3),))],
                                 {"kv": tshape}))
            strides["kv"] = contiguous_strides(tshape)
            for m in maps[-2:]:
                assert affine_head_group(m, lambda t: strides[t]) == head_group(m, lambda t: strides[t]), m
    assert affine_head_group(c.map, lambda t: strides[t]) == head_group(c.map, lambda t: strides[t]), c.map


def test_atom_hash_is_cached_and_does_not_travel():
    """Div/mod and lookup atoms compute their hash once, the same as the dataclass's hash of their fields, and
    leave it out of a pickle (another process hashes strings differently): the copy hashes as rebuilt."""
    import pickle
    from vtcsearch.core.expr import FloorDiv, Lookup, Mod, lookup
    i, j = var("i"), var("j")
    atoms = [((3 * i + j) // 4).terms[0][0], ((3 * i + j) % 5).terms[0][0], lookup("t", [i, j // 2], 0, 9).terms[0][0]]
    for a in atoms:
        assert isinstance(a, (FloorDiv, Mod, Lookup))
        fields = tuple(getattr(a, f) for f in a.__dataclass_fields__)
        assert hash(a) == hash(fields) and a.__dict__["_hash"] == hash(fields)
        assert "_hash" not in a.__getstate__()
        b = pickle.loads(pickle.dumps(a))
        assert "_hash" not in b.__dict__ and b == a and hash(b) == hash(a)

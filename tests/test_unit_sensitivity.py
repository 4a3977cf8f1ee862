"""The certified unit-level sensitivity (stream_dp/privacy/unit_sensitivity.py) against brute force.

For k events of one unit, b steps apart, each with the influence pattern u, the sensitivity is
``max ‖C·Σ_i S^{t_i} u‖`` over admissible placements. The certified value must be at least the
brute-force maximum over every placement of a short stream, equal it (to 1e-9) where the theorem
of docs/units.md holds (b ≥ len(u) − 1, non-negative non-increasing Toeplitz C), and be exactly
the event-level Δ for one event. The closed form for a BLT must match the dense computation.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from stream_dp.privacy.blt import BLT
from stream_dp.privacy.factorizations import BinaryTree, Independent, SqrtToeplitz
from stream_dp.privacy.influence import PairTermBounds, pair_term_bounds, window_pattern
from stream_dp.privacy.unit_sensitivity import (
    _BLTAutocorrelation,
    _DenseAutocorrelation,
    _placement_bound,
    placement_sensitivity,
    replaced_events_bound,
    unit_sensitivity,
)

N = 30
WINDOW = 4
PATTERN = window_pattern(WINDOW, WINDOW, PairTermBounds(1.0, 1.0))
FACTORIZATIONS = {
    "blt": BLT.fit(N),
    "sqrt": SqrtToeplitz(),
    "independent": Independent(),
    "tree": BinaryTree(),
}


def _placements(n: int, k: int, b: int):
    """Every placement of 1 … k events in n steps, consecutive ones ≥ b apart (0-based)."""
    for m in range(1, k + 1):
        for steps in itertools.combinations(range(n), m):
            if all(steps[i + 1] - steps[i] >= b for i in range(m - 1)):
                yield steps


def _brute_force(f, u, n: int, k: int, b: int) -> tuple[float, tuple]:
    C = f.strategy_matrix(n)
    best, where = 0.0, ()
    for steps in _placements(n, k, b):
        U = np.zeros(n)
        for t in steps:
            m = min(len(u), n - t)
            U[t : t + m] += u[:m]
        value = float(np.linalg.norm(C @ U))
        if value > best:
            best, where = value, steps
    return best, where


@pytest.mark.parametrize("name", list(FACTORIZATIONS))
def test_one_event_is_the_event_level_sensitivity_bit_for_bit(name: str) -> None:
    f = FACTORIZATIONS[name]
    for n in (N, 1000):
        for b in (1, 7):
            got = unit_sensitivity(f, PATTERN, n, max_events=1, min_separation=b)
            assert got.sensitivity == f.sensitivity(PATTERN, n) == got.event_sensitivity
            assert got.exact and got.method == "event" and got.ratio == 1.0
    if name == "blt":
        got = unit_sensitivity(f, PATTERN, None, 1, 1)
        assert got.sensitivity == f.sensitivity(PATTERN, None)


@pytest.mark.parametrize("name", ["blt", "sqrt", "independent"])
@pytest.mark.parametrize("k", [2, 3])
def test_the_certified_value_is_the_worst_placement(name: str, k: int) -> None:
    f = FACTORIZATIONS[name]
    L = len(PATTERN)
    for b in (1, 2, L - 2, L - 1, L, 2 * L + 1, N):
        got = unit_sensitivity(f, PATTERN, N, k, b)
        best, where = _brute_force(f, PATTERN, N, k, b)
        assert got.sensitivity >= best, (b, got, best)
        if b >= L - 1:  # the theorem: the placement b apart from the start is the worst
            assert got.exact
            assert where == tuple(range(0, min(k * b, N), b))[:k]
        if got.exact:
            assert got.sensitivity <= best * (1 + 2e-9), (b, got.sensitivity / best)


@pytest.mark.parametrize("seed", range(6))
def test_any_non_negative_pattern(seed: int) -> None:
    # Random patterns (not the window's shape): the bound holds for every b, and is exact from
    # b = len(u) − 1 on, for every non-increasing Toeplitz C.
    rng = np.random.default_rng(seed)
    u = rng.random(int(rng.integers(1, 6))) * rng.integers(0, 2, size=1).clip(0.2, 1)
    u[rng.random(len(u)) < 0.3] = 0.0
    u[0] = max(u[0], 0.1)
    n = 22
    f = [BLT.fit(n), SqrtToeplitz(), Independent()][seed % 3]
    for k, b in ((2, 1), (2, 3), (3, 1), (3, 2), (3, len(u) - 1 or 1), (3, len(u) + 2)):
        got = unit_sensitivity(f, u, n, k, b)
        best, _ = _brute_force(f, u, n, k, b)
        assert best <= got.sensitivity
        if b >= len(u) - 1:
            assert got.exact
        if got.exact:
            assert got.sensitivity <= best * (1 + 2e-9)


def test_an_upper_bound_where_the_worst_placement_is_not_the_closest() -> None:
    # u = [1, 0, 0, 0, 1]: two events 4 apart stack their spikes, two events 1 apart do not.
    u = np.array([1.0, 0.0, 0.0, 0.0, 1.0])
    got = unit_sensitivity(Independent(), u, 20, 2, 1)
    best, where = _brute_force(Independent(), u, 20, 2, 1)
    assert not got.exact and where[1] - where[0] == 4
    assert got.sensitivity == pytest.approx(best, rel=2e-9) and got.sensitivity >= best


def test_the_tree_gets_the_triangle_bound() -> None:
    got = unit_sensitivity(BinaryTree(), PATTERN, N, 3, 2)
    best, _ = _brute_force(BinaryTree(), PATTERN, N, 3, 2)
    assert got.method == "triangle" and not got.exact
    assert got.sensitivity >= best and got.ratio == pytest.approx(3.0)


@pytest.mark.parametrize("k,b", [(2, 1), (3, 40), (4, 129), (5, 700), (8, 10)])
def test_blt_closed_form_matches_the_dense_computation(k: int, b: int) -> None:
    n = 3000
    u = window_pattern(128, 128, pair_term_bounds("auc", 1.0, 1.0))
    f = BLT.fit(n)
    dense = _DenseAutocorrelation(np.convolve(f.coefficients(n), u)[:n])
    closed = _BLTAutocorrelation(f, u)
    a, exact_a = _placement_bound(dense, len(u), k, b, n)
    c, exact_c = _placement_bound(closed, len(u), k, b, n)
    assert c == pytest.approx(a, rel=1e-12) and exact_a == exact_c
    got = unit_sensitivity(f, u, n, k, b)
    if got.exact:
        worst = placement_sensitivity(f, u, [1 + i * b for i in range(k)], n)
        assert got.sensitivity == pytest.approx(worst * (1 + 1e-9), rel=1e-12)


def test_unbounded_sensitivity_bounds_every_horizon() -> None:
    u = window_pattern(128, 128, pair_term_bounds("auc", 1.0, 1.0))
    f = BLT.fit(35_169)
    for k, b in ((2, 1000), (4, 129), (8, 1)):
        limit = unit_sensitivity(f, u, None, k, b).sensitivity
        finite = [unit_sensitivity(f, u, n, k, b).sensitivity for n in (2_000, 35_169, 10**7)]
        assert finite == sorted(finite) and finite[-1] <= limit
        assert finite[-1] == pytest.approx(limit, rel=1e-3)


def test_more_events_cost_more_and_separation_helps() -> None:
    u = window_pattern(128, 128, pair_term_bounds("auc", 1.0, 1.0))
    n = 35_169
    f = BLT.fit(n)
    one = f.sensitivity(u, n)
    for b in (1, 129, 1000):
        values = [unit_sensitivity(f, u, n, k, b).sensitivity for k in (1, 2, 4, 8)]
        assert values == sorted(values)
        for k, v in zip((1, 2, 4, 8), values, strict=True):
            # Between the orthogonal (√k) and the aligned (k) extremes: BLT columns stay far
            # from orthogonal thousands of steps apart.
            assert math.sqrt(k) * one <= v * (1 + 1e-9) and v <= k * one * (1 + 1e-9)
    for k in (2, 4, 8):
        by_b = [unit_sensitivity(f, u, n, k, b).sensitivity for b in (1, 129, 1000, n // 4)]
        assert by_b == sorted(by_b, reverse=True)


def test_replaced_events_bound() -> None:
    assert replaced_events_bound(0.25, 1, 2.0) == 0.25
    assert replaced_events_bound(3.0, 1, 2.0) == 3.0  # k = 1 leaves the event-level bound alone
    assert replaced_events_bound(0.25, 4, 2.0) == 1.0
    assert replaced_events_bound(0.25, 100, 2.0) == 2.0
    for bad in ((-1.0, 2, 1.0), (1.0, 0, 1.0), (1.0, 2, 0.0), (math.inf, 2, 1.0)):
        with pytest.raises(ValueError):
            replaced_events_bound(*bad)


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="unknown horizon"):
        unit_sensitivity(SqrtToeplitz(), PATTERN, None, 2, 1)
    for k, b in ((0, 1), (2, 0), (True, 1), (2, 1.5)):
        with pytest.raises(ValueError):
            unit_sensitivity(FACTORIZATIONS["blt"], PATTERN, N, k, b)
    with pytest.raises(ValueError):
        placement_sensitivity(Independent(), PATTERN, [0], N)

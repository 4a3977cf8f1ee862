"""The BLT of an unbounded stream (stream_dp/privacy/unbounded_blt.py).

OnPairMF with ``horizon=None`` charges ``Δ_∞`` once and must stay close to what a learner that
knew its horizon would release: the released noise std at t = 10⁴, 10⁶ and 10⁸ within 1.4× of
``OnPairMF(horizon=t)``'s. The stored decays must be what the fit computes, and better over the
range than a BLT fitted for one horizon.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from stream_dp.online import OnPairMF
from stream_dp.privacy.blt import BLT
from stream_dp.privacy.mf import make_factorization
from stream_dp.privacy.unbounded_blt import (
    UNBOUNDED_BUFFERS,
    UNBOUNDED_DECAYS,
    UNBOUNDED_HORIZONS,
    fit_unbounded_decays,
    horizon_grid,
    unbounded_blt,
)


def _prefix_std(model: OnPairMF, t: int) -> float:
    plan = model.noise_plan([t])
    assert plan[0]["covers"] == model.horizon and plan[1]["step"] == t
    return plan[1]["prefix_std"]


@pytest.mark.parametrize("task", ["auc", "metric"])
def test_released_noise_is_near_the_known_horizon_optimum(task: str) -> None:
    common = dict(task=task, epsilon=1.0, delta=1e-5, features=5)
    unbounded = OnPairMF(horizon=None, **common)
    assert unbounded.mf.factorization.horizon is None
    for t in (10**4, 10**6, 10**8):
        known = OnPairMF(horizon=t, **common)
        assert known.window == unbounded.window  # the same influence pattern
        ratio = _prefix_std(unbounded, t) / _prefix_std(known, t)
        assert 1.0 < ratio <= 1.4, (t, ratio)


def _worst_ratio(blt: BLT, horizons) -> float:
    """max_t of the noise std at unit sensitivity, relative to ``BLT.fit(t)``."""
    worst = 0.0
    for t in horizons:
        best = BLT.fit(int(t))
        ratio = blt.limit_column_norm() ** 2 * blt.max_error(int(t)) / best.loss(int(t))
        worst = max(worst, math.sqrt(ratio))
    return worst


def test_better_over_the_range_than_any_single_horizon_fit() -> None:
    blt = unbounded_blt()
    dense = np.unique(np.round(np.logspace(3, 10, 36)).astype(np.int64))
    worst = _worst_ratio(blt, dense)
    assert worst <= 1.25
    for n in (1 << 20, 10**9, 10**10):
        assert _worst_ratio(BLT.fit(n), dense) > worst + 0.1
    # Past the range the error grows linearly again: the range is a real limit.
    assert _worst_ratio(blt, [10**11]) > 1.5


def test_the_default_is_stored_and_used_by_the_learner() -> None:
    blt = unbounded_blt()
    assert (tuple(blt.theta), tuple(blt.lam)) == UNBOUNDED_DECAYS
    assert blt.buffers == UNBOUNDED_BUFFERS and blt.horizon is None
    made = make_factorization("blt", None)
    assert made.state_dict() == blt.state_dict()
    model = OnPairMF(task="auc", epsilon=1.0, horizon=None, features=3)
    assert model.mf.factorization.state_dict() == blt.state_dict()
    assert model.mf.sensitivity == blt.sensitivity(model.mf.pattern, None)


@pytest.mark.slow
def test_the_stored_decays_are_the_fit() -> None:
    # The fit is deterministic on one machine; across CPUs its last bits may differ, so compare
    # what matters: the worst ratio over the fitted range.
    fitted = BLT(*fit_unbounded_decays(*UNBOUNDED_HORIZONS, UNBOUNDED_BUFFERS))
    grid = horizon_grid(*UNBOUNDED_HORIZONS)
    assert _worst_ratio(unbounded_blt(), grid) == pytest.approx(
        _worst_ratio(fitted, grid), rel=1e-6
    )
    np.testing.assert_allclose(1 - fitted.theta, 1 - np.array(UNBOUNDED_DECAYS[0]), rtol=1e-4)


@pytest.mark.slow
def test_another_range_is_fitted() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        short = unbounded_blt(10**3, 10**6, 4)
    assert short.buffers == 4 and short.horizon is None
    grid = horizon_grid(10**3, 10**6)
    assert _worst_ratio(short, grid) < _worst_ratio(BLT.fit(10**6, 4), grid)
    assert make_factorization("blt", None, (10**3, 10**6)).buffers == UNBOUNDED_BUFFERS


def test_bad_ranges_are_refused() -> None:
    for args in ((10, 10, 6), (1, 10, 6), (10, 100, 0), (10, 100, 9), (1.5, 100, 6)):
        with pytest.raises(ValueError):
            unbounded_blt(*args)
    assert horizon_grid(1000, 10_000).tolist() == [1000, 1778, 3162, 5623, 10_000]

"""A BLT for streams without a horizon: near every known-horizon optimum from 10³ to 10¹⁰ steps.

An unbounded stream (``OnPairMF(horizon=None)``) charges ``Δ_∞ = lim_n Δ_n`` once, before the
first step (:class:`~stream_dp.privacy.mf.MFMechanism`), and then carries the prefix-sum error
``E_t`` of its BLT at every step t. A BLT fitted for one horizon n₀ (:meth:`BLT.fit`) is near
optimal at n₀ only: past it its error grows linearly (``a²t``), before it ``Δ_∞`` is larger than the
``Δ_t`` a known horizon t would charge. Instead, :func:`unbounded_blt` minimises the worst ratio
over a range of horizons ``[t_lo, t_hi]``:

    min over interlaced (θ, λ) of  max_t  ‖C e_1‖²_∞ · E_t / L*_t ,

where ``L*_t`` is the loss (squared column norm × max error) of ``BLT.fit(t)`` at horizon t,
itself within 1 % of the square-root factorization's. The max is taken over four horizons per
decade, written as SciPy's SLSQP on the epigraph (``min z`` subject to ``f_t ≤ z``). The result has
the same k buffers — the same memory and work per step — as a fitted BLT.

For the default range ``[10³, 10¹⁰]`` and 6 buffers the fit takes ~2 s of CPU, so its decays are
stored here (:data:`UNBOUNDED_DECAYS`; ``tests/test_unbounded_blt.py`` refits them). Its noise
standard deviation is within 1.23× of the known-horizon optimum at every t in the range for one
step's gradient (the column norm), within 1.36× for OnPairMF's window pattern (B = 128); past
10¹⁰ steps its error grows linearly again (1.7× at 10¹¹).

"""

from __future__ import annotations

import functools
import math
import warnings

import numpy as np
from scipy import optimize

from stream_dp.privacy.blt import BLT, _complements, _fitted_decays, _loss_terms

__all__ = [
    "UNBOUNDED_BUFFERS",
    "UNBOUNDED_DECAYS",
    "UNBOUNDED_HORIZONS",
    "fit_unbounded_decays",
    "horizon_grid",
    "unbounded_blt",
]

#: The horizons an unbounded stream's BLT is held near the optimum for, by default.
UNBOUNDED_HORIZONS = (10**3, 10**10)
#: Its buffers: those of a BLT fitted beyond 10⁶ steps
#: (:data:`~stream_dp.privacy.blt.DEFAULT_BUFFERS`).
UNBOUNDED_BUFFERS = 6
#: ``fit_unbounded_decays(10**3, 10**10, 6)``, stored: (θ, λ). Part of the noise format — a
#: checkpoint's noise state is only valid for these decays.
UNBOUNDED_DECAYS: tuple[tuple[float, ...], tuple[float, ...]] = (
    (
        0.9115195949208965,
        0.9981284504732193,
        0.9999588354162072,
        0.9999990302548012,
        0.9999999807558816,
        0.999999999694435,
    ),
    (
        0.54124668441665,
        0.985961190346393,
        0.9998244817943466,
        0.9999942953224199,
        0.9999998811724882,
        0.9999999976389515,
    ),
)
_PER_DECADE = 4


def unbounded_blt(
    min_horizon: int = UNBOUNDED_HORIZONS[0],
    max_horizon: int = UNBOUNDED_HORIZONS[1],
    buffers: int = UNBOUNDED_BUFFERS,
) -> BLT:
    """The BLT of an unbounded stream, near the known-horizon optimum for every horizon in range.

    The default range returns the stored decays (no fit); any other range is fitted (seconds of
    CPU, then cached for the process).

    Examples
    --------
    >>> blt = unbounded_blt()
    >>> blt.buffers, blt.horizon
    (6, None)
    >>> bool(blt.limit_column_norm() < 3)
    True

    """
    lo, hi, k = _check_range(min_horizon, max_horizon, buffers)
    if (lo, hi, k) == (*UNBOUNDED_HORIZONS, UNBOUNDED_BUFFERS):
        theta, lam = UNBOUNDED_DECAYS
    else:
        theta, lam = fit_unbounded_decays(lo, hi, k)
    return BLT(theta, lam, horizon=None)


@functools.lru_cache(maxsize=8)
def fit_unbounded_decays(
    min_horizon: int, max_horizon: int, buffers: int
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(θ, λ) minimising the worst loss ratio to ``BLT.fit(t)`` over the range (see module).

    Deterministic: started from ``BLT.fit(max_horizon, buffers)``, no random restarts.
    """
    lo, hi, k = _check_range(min_horizon, max_horizon, buffers)
    grid = horizon_grid(lo, hi)
    best = np.array([math.log(BLT.fit(int(t)).loss(int(t))) for t in grid])

    def excess(p: np.ndarray) -> np.ndarray:
        theta_c, lam_c = _complements(p)
        sens2, _ = _loss_terms(theta_c, lam_c, math.inf)
        err = np.array([_loss_terms(theta_c, lam_c, float(t))[1] for t in grid])
        out = np.log(sens2) + np.log(err) - best
        return np.where(np.isfinite(out), out, 1e300)

    theta, lam = _fitted_decays(hi, k)
    merged = np.empty(2 * k)
    merged[0::2], merged[1::2] = lam, theta
    p0 = np.log(np.diff(np.concatenate([[0.0], -np.log1p(-merged)])))
    x0 = np.concatenate([p0, [float(excess(p0).max())]])
    goal = np.zeros(2 * k + 1)
    goal[-1] = 1.0
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        res = optimize.minimize(
            lambda x: x[-1],
            x0,
            jac=lambda x: goal,
            constraints=[{"type": "ineq", "fun": lambda x: x[-1] - excess(x[:-1])}],
            method="SLSQP",
            options={"maxiter": 1000, "ftol": 1e-12},
        )
    p = res.x[:-1] if excess(res.x[:-1]).max() < excess(p0).max() else p0
    theta_c, lam_c = _complements(p)
    return tuple((1.0 - theta_c).tolist()), tuple((1.0 - lam_c).tolist())


def horizon_grid(min_horizon: int, max_horizon: int) -> np.ndarray:
    """The horizons the fit holds the ratio at: four per decade, both ends included.

    Examples
    --------
    >>> horizon_grid(1000, 10_000).tolist()
    [1000, 1778, 3162, 5623, 10000]

    """
    lo, hi = math.log10(min_horizon), math.log10(max_horizon)
    count = max(2, int(math.ceil((hi - lo) * _PER_DECADE)) + 1)
    return np.unique(np.round(np.logspace(lo, hi, count)).astype(np.int64))


def _check_range(lo, hi, k) -> tuple[int, int, int]:
    for v, name in ((lo, "min_horizon"), (hi, "max_horizon"), (k, "buffers")):
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if not 2 <= lo < hi:
        raise ValueError(f"need 2 <= min_horizon < max_horizon, got {lo!r}, {hi!r}")
    if not 1 <= k <= 8:
        raise ValueError(f"buffers must be between 1 and 8, got {k!r}")
    return int(lo), int(hi), int(k)

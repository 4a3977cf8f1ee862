"""The demo's learners: the settings, the constants and rules behind each learner's parameters,
and one result record per (dataset, learner)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from stream_dp.online import OnPairC, OnPairMF, OnPairStrC, PairwiseGIGA

__all__ = ["DemoSettings", "ModelResult", "choose_alpha", "release_every_for"]

DELTA = 1e-5
DATA_RADIUS = 1.0  # R: the scaler maps the 95th percentile of calibration norms to 1
MODEL_RADIUS = 1.0  # D
BUFFER = 128  # FIFO partners per record
STRC_ALPHA = 1.0  # OnPairStrC / GIGA regulariser: T1 = ⌈16·(4+1)/1²⌉ = 80
MAX_T1_FRACTION = 0.25  # never spend more than a quarter of the stream in the random warm-up
SMOOTHING_WINDOW = 20  # releases averaged by smoothed_weights (post-processing: free)
N_CHECKPOINTS = 60  # points per curve
REGRET_MAX_PAIRS = 20_000  # comparator on a fixed sample of pairs (keeps the solve well < 1 s)
REGRET_ITERATIONS = 100
SEED_SPREAD_BELOW = 2_000  # datasets with fewer streamed records get a noise-seed spread


def release_every_for(n: int) -> int:
    """Release period: about 700 releases at most, and at least every 10 steps at most.

    Fewer releases means a larger budget share each (σ ∝ √(number of releases)); the iterate
    still learns from every record.
    """
    return int(min(50, max(10, n // 700)))


def choose_alpha(cls: type, n: int, preferred: float, max_fraction: float = MAX_T1_FRACTION):
    """The regulariser α for a stream of ``n`` records: ``preferred`` unless its T1 is too long.

    T1 (the data-independent warm-up, ``max(⌈16L/α²⌉, 7)``) falls as α grows. If the preferred α
    leaves ``T1 > max_fraction · n``, the smallest α with ``T1 ≤ max_fraction · n`` is found by
    bisection on the learner's own ``T1`` (no formula is copied here).

    Parameters
    ----------
    cls
        ``OnPairStrC`` or ``OnPairC``.
    n
        Stream length (the horizon).
    preferred
        The α to use when its warm-up fits.
    max_fraction
        Largest acceptable ``T1 / n``.

    Returns
    -------
    tuple of (float, str)
        α and a short reason.

    """

    def t1(alpha: float) -> int:
        return cls(task="auc", alpha=alpha, horizon=None, features=1).T1

    limit = max_fraction * n
    if t1(preferred) <= limit:
        return preferred, "default"
    if t1(1e6) > limit:
        raise ValueError(f"a stream of {n} records is too short for any warm-up T1 <= {limit:g}")
    lo, hi = preferred, max(preferred * 2, 1.0)
    while t1(hi) > limit:
        lo, hi = hi, hi * 2
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t1(mid) > limit else (lo, mid)
    hi = math.ceil(hi * 1e4) / 1e4  # round up: T1 only falls as α grows
    return hi, f"raised so that T1 <= {max_fraction:g}·n"


def verdict(auc: float, se: float) -> str:
    if not math.isfinite(auc):
        return "no model"
    if auc - 2 * se > 0.5:
        return "better than random"
    if auc + 2 * se < 0.5:
        return "WORSE than random"
    return "no better than random"


@dataclass
class DemoSettings:
    """What the demo was asked to do (from the command line)."""

    out: Path
    datasets: tuple[str, ...] = ("bank", "pima")
    epsilons: tuple[float, ...] = (1.0, 4.0, 16.0)
    max_records: int | None = None
    seed: int | None = None
    plot: bool = True
    #: Also compute and show the raw (non-private) regret: for the trusted operator only.
    operator_metrics: bool = False
    quiet: bool = False
    jobs: int = 2
    #: Write every release into releases.jsonl (OnPairMF's at every step), not one per period.
    all_releases: bool = False


@dataclass
class ModelResult:
    """One learner's run on one dataset."""

    dataset: str
    algorithm: str
    epsilon_target: float | None
    alpha: float
    alpha_reason: str
    release_every: int | None
    n: int = 0
    #: releases.jsonl keeps the releases at steps t with t % write_every == 0, and the last one
    #: (1: every release). OnPairMF releases at every step for free; the demo writes those at
    #: the other learners' period unless --all-releases (bank: 234 MB instead of 5 MB).
    write_every: int = 1
    steps: int = 0
    epsilon_spent: float | None = None
    T1: int = 0
    n_releases: int = 0
    test_auc: float = math.nan
    auc_se: float = math.nan
    verdict: str = ""
    average_regret: float = math.nan
    regret_exact: bool = True
    average_penalty: float = math.nan
    n_clipped: int = 0
    wall_seconds: float = 0.0
    weight_norm: float = math.nan
    last_sigma: float = math.nan
    cos_w0: float = math.nan
    describe: str = ""
    features: tuple[str, ...] = ()
    curve_t: list[int] = field(default_factory=list)
    curve_auc: list[float] = field(default_factory=list)
    curve_penalty: list[float] = field(default_factory=list)
    operator: bool = False  # compute the raw regret (operator-only, never in a default output)
    seed_spread: list[float] = field(default_factory=list)

    @property
    def label(self) -> str:
        if self.epsilon_target is None:
            return f"{self.algorithm} (non-private)"
        return f"{self.algorithm} ε={self.epsilon_target:g}"


def plan_models(
    n: int, name: str, epsilons: Sequence[float], features: tuple[str, ...]
) -> list[ModelResult]:
    """Result stubs (the learner specs): GIGA, then OnPairStrC, OnPairC and OnPairMF at each ε."""
    strc_alpha, strc_why = choose_alpha(OnPairStrC, n, STRC_ALPHA)
    c_alpha, c_why = choose_alpha(OnPairC, n, n**-0.25)
    c_why = "n^(-1/4), Huai Alg. 2" if c_why == "default" else c_why
    out = [
        ModelResult(name, "PairwiseGIGA", None, strc_alpha, strc_why, None, n=n, features=features)
    ]
    k = release_every_for(n)
    for algo, alpha, why in (("OnPairStrC", strc_alpha, strc_why), ("OnPairC", c_alpha, c_why)):
        out += [
            ModelResult(name, algo, float(e), alpha, why, k, n=n, features=features)
            for e in epsilons
        ]
    # OnPairMF has no regulariser and no warm-up: its rules depend on n, ε and the constants.
    out += [
        ModelResult(
            name, "OnPairMF", float(e), math.nan, "none", 1, n=n, features=features, write_every=k
        )  # fmt: skip
        for e in epsilons
    ]
    return out


def noise_words(seed: int | None) -> str:
    if seed is None:
        return "fresh secrets from the OS (a private run; numbers vary a little between runs)"
    return f"reproducible seed {seed} (NOT private: for tests and debugging)"


def make_learner(res: ModelResult, seed: int | None, keep_history: bool = True):
    """The learner a result stub describes (public constructors only)."""
    common = dict(
        task="auc",
        alpha=res.alpha,
        buffer=BUFFER,
        data_radius=DATA_RADIUS,
        model_radius=MODEL_RADIUS,
        seed=seed,
        reproducible=seed is not None,
        track_regret=keep_history,
        keep_history=keep_history,
        features=res.features,
    )
    if res.epsilon_target is None:
        return PairwiseGIGA(model_id=f"demo-{res.dataset}-giga", **common)
    if res.algorithm == "OnPairMF":
        # Correlated noise: one charge for the horizon, a free release (the average of the
        # iterates) at every step; the buffer, step size and radii follow its data-independent
        # rules (docs/algorithms.md, OnPairMF).
        rules = ("alpha", "buffer", "data_radius", "model_radius")
        common = {k: v for k, v in common.items() if k not in rules}
        return OnPairMF(
            epsilon=res.epsilon_target,
            delta=DELTA,
            horizon=res.n,
            model_id=f"demo-{res.dataset}-OnPairMF-eps{res.epsilon_target:g}",
            **common,
        )
    cls = {"OnPairStrC": OnPairStrC, "OnPairC": OnPairC}[res.algorithm]
    return cls(
        epsilon=res.epsilon_target,
        delta=DELTA,
        horizon=res.n,
        release_every=res.release_every,
        smoothing_window=SMOOTHING_WINDOW,
        predict_with="smoothed",
        model_id=f"demo-{res.dataset}-{res.algorithm}-eps{res.epsilon_target:g}",
        **common,
    )

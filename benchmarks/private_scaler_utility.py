"""The private running scaler on raw bank data against the demo's publicly scaled learner.

Run from the repository root (about a minute per seed pair on two busy cores)::

    python benchmarks/private_scaler_utility.py                 # seeds 1..5
    python benchmarks/private_scaler_utility.py --seeds 1,2 --epsilon 4

Both arms use the demo's split of Bank Marketing (``stream_dp.datasets.prepare("bank")``: the
same streamed records in the same order, the same test split) and the demo's OnPairStrC at
ε = 4 in total (α from ``choose_alpha``, FIFO(128), ``release_every_for(n)``, smoothing window
20, horizon n, R = D = 1):

* **public** — the demo: numeric columns standardised with a scaler fitted on the calibration
  block (never streamed) and the vector divided by the 95th percentile of its norms; the learner
  spends all of ε.
* **private** — the raw encoded columns (age in years, signed log balance, day of month, log
  counts; no standardisation) through ``ScaledLearner(PrivateScaler(bounds=BANK_BOUNDS), ...)``:
  the scaler spends ``--scaler-share`` of ρ under ``"gaussian-scaler"``, the learner the rest,
  both on one ledger; the calibration block is not used at all.

Each arm reports the test AUC of the served (smoothed) release, scored as the learner scores it
(test rows scaled by the released statistics, clipped to R). Integer noise seeds make the runs
reproducible (``reproducible=True``: measurement runs, declared non-private; the mechanism and
the noise are the deployed ones). Criterion: the private arm's mean AUC is within 0.02 of the
public arm's.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings

import numpy as np

from stream_dp.apps.demo.plan import (
    BUFFER,
    DATA_RADIUS,
    DELTA,
    MODEL_RADIUS,
    SMOOTHING_WINDOW,
    STRC_ALPHA,
    choose_alpha,
    release_every_for,
)
from stream_dp.datasets import prepare
from stream_dp.metrics import roc_auc
from stream_dp.online import OnPairStrC
from stream_dp.preprocessing import PrivateScaler, ScaledLearner

#: Public bounds of the bank numeric columns, in the units of ``load_bank``'s encoding. They come
#: from what the columns mean, not from the data: adults of working age and retirees, balances
#: from −8,000 to 100,000 euros (signed log1p), days of a month, at most 50 contacts
#: (log1p), at most ~3 years since the last contact (log1p of days). Values outside are clipped.
BANK_BOUNDS = {
    "age": (18.0, 95.0),
    "balance_slog": (-math.log1p(8_000), math.log1p(100_000)),
    "day": (1.0, 31.0),
    "campaign_log": (math.log1p(1), math.log1p(50)),
    "previous_log": (0.0, math.log1p(50)),
    "pdays_log": (0.0, math.log1p(1_000)),
}
TOLERANCE = 0.02


def learner_params(n: int, epsilon: float) -> dict:
    """The demo's OnPairStrC at ``epsilon`` for a stream of ``n`` records."""
    alpha, _ = choose_alpha(OnPairStrC, n, STRC_ALPHA)
    return dict(
        task="auc",
        epsilon=epsilon,
        delta=DELTA,
        horizon=n,
        alpha=alpha,
        buffer=BUFFER,
        data_radius=DATA_RADIUS,
        model_radius=MODEL_RADIUS,
        release_every=release_every_for(n),
        smoothing_window=SMOOTHING_WINDOW,
        predict_with="smoothed",
        track_regret=False,
    )


def run_public(data, epsilon: float, seed: int) -> tuple[float, object]:
    model = OnPairStrC(
        **learner_params(len(data.y_stream), epsilon),
        features=data.feature_names,
        seed=seed,
        reproducible=True,
    )
    model.learn_many(data.X_stream, data.y_stream.tolist())
    return roc_auc(model.score_many(data.X_test), data.y_test), model


def run_private(data, epsilon: float, seed: int, share: float) -> tuple[float, ScaledLearner]:
    ds, sp = data.dataset, data.split
    model = ScaledLearner(
        PrivateScaler(bounds=BANK_BOUNDS, budget_share=share, seed=seed, reproducible=True),
        OnPairStrC(
            **learner_params(len(data.y_stream), epsilon),
            features=data.feature_names,
            budget_share=1.0 - share,
            seed=seed,
            reproducible=True,
        ),
    )
    model.learn_many(ds.X[sp.stream], data.y_stream.tolist())
    return roc_auc(model.score_many(ds.X[sp.test]), data.y_test), model


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="1,2,3,4,5")
    ap.add_argument("--epsilon", type=float, default=4.0)
    ap.add_argument("--scaler-share", type=float, default=0.1)
    ap.add_argument("--max-records", type=int, default=None)
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    data = prepare("bank", max_records=args.max_records)
    n = len(data.y_stream)
    ds = data.dataset
    raw = ds.X[data.split.stream]
    print(
        f"bank: {n} streamed records, {len(data.y_test)} test, d = {ds.X.shape[1]}; ε = "
        f"{args.epsilon:g} in total, δ = {DELTA:g}; scaler share {args.scaler_share:g}"
    )
    print(
        "raw numeric columns (streamed): "
        + ", ".join(
            f"{name} [{raw[:, j].min():.3g}, {raw[:, j].max():.3g}]"
            for j, name in enumerate(ds.feature_names)
            if ds.numeric[j]
        )
    )
    print(
        f"{'seed':>4}  {'public AUC':>10}  {'private AUC':>11}  {'ε spent':>8}  "
        f"{'scaler ρ':>9}  {'learner ρ':>9}  {'clipped pub/priv':>16}  seconds"
    )
    pub, priv = [], []
    for seed in seeds:
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            a_pub, m_pub = run_public(data, args.epsilon, seed)
            a_priv, m_priv = run_private(data, args.epsilon, seed, args.scaler_share)
        ledger = m_priv.accountant.ledger
        rho = {
            name: sum(m_priv.accountant.cost(e) for e in ledger if e.mechanism == name)
            for name in ("gaussian-scaler", "gaussian")
        }
        pub.append(a_pub)
        priv.append(a_priv)
        print(
            f"{seed:>4}  {a_pub:>10.4f}  {a_priv:>11.4f}  {m_priv.accountant.spent()[0]:>8.4f}  "
            f"{rho['gaussian-scaler']:>9.4g}  {rho['gaussian']:>9.4g}  "
            f"{m_pub.n_clipped:>7}/{m_priv.learner.n_clipped:<8}  "
            f"{time.perf_counter() - t0:.1f}"
        )
    print("private scaler (last run): " + m_priv.scaler.describe())
    print(
        "its released statistics:",
        {k: round(v, 3) for k, v in m_priv.scaler.center.items()},
        {k: round(v, 3) for k, v in m_priv.scaler.spread.items()},
        f"norm_scale {m_priv.scaler.norm_scale:.3f}",
    )
    mp, mq = float(np.mean(pub)), float(np.mean(priv))
    se = (
        float(np.std(np.subtract(priv, pub), ddof=1) / math.sqrt(len(seeds)))
        if len(seeds) > 1
        else math.nan
    )
    ok = mq >= mp - TOLERANCE
    print(
        f"mean over seeds {seeds}: public {mp:.4f}, private {mq:.4f}, difference "
        f"{mq - mp:+.4f} (s.e. of the paired difference {se:.4f}); criterion: private >= "
        f"public − {TOLERANCE}: {'HOLDS' if ok else 'FAILS'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

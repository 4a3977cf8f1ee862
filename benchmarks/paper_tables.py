#!/usr/bin/env python
"""Reproduce the papers' offline tables and online figures on the shipped UCI data.

* Xue et al. (IJCAI 2021) **Table 2** — metric learning on Diabetes (Pima), kNN (k = 3) test
  accuracy, ε = 1, n ∈ {128, 256, 512};
* Xue et al. (IJCAI 2021) **Table 4** — AUC maximisation on Diabetes, n = 256,
  ε ∈ {0.5, 0.8, 1, 2};
* Huai et al. (AAAI 2020) **Figures 1–2** — objective value of OnPairStrC (Hepatitis, Cancer)
  and OnPairC (Diabetes) against n for ε ∈ {0.5, 1.5, 2.5}, with the online learners of
  :mod:`stream_dp.online`.

δ = 1/n, 20 random permutations (train = the first n records of the permutation, test = the
rest), mean ± std. The paper's numbers are hard-coded below, each block citing its table, and
checked against the paper's text when one is given (``--paper-text FILE``, or the environment
variable ``STREAM_DP_PAPER_TEXT``: a plain-text copy of Xue et al. 2021). Writes
``benchmarks/results/paper_tables.md`` and ``benchmarks/results/huai_figures.png``. Every model
is fitted with a fixed seed and ``reproducible=True``, so the tables reproduce bit for bit;
such runs are not private (``docs/privacy.md``, *Keyed noise*), which is fine for a benchmark
on public data.

Run from a clean clone (after ``pip install -e .``)::

    python benchmarks/paper_tables.py            # 2 worker processes, about 5 minutes
    python benchmarks/paper_tables.py --quick    # 3 permutations, a smoke run

"""

from __future__ import annotations

import os

# One BLAS thread per worker: the work is many small products, where threads only contend.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import math  # noqa: E402
import multiprocessing as mp  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from stream_dp.constraints import L2Ball, PSDFrobeniusBall  # noqa: E402
from stream_dp.datasets import data_path, load_dataset  # noqa: E402
from stream_dp.linalg import psd_sqrt  # noqa: E402
from stream_dp.metrics import roc_auc  # noqa: E402
from stream_dp.offline import DPEGD, DPGDC2, DPGDSC, OffPairC, OffPairStrC  # noqa: E402
from stream_dp.online import OnPairC, OnPairStrC, PairwiseGIGA  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"

# --------------------------------------------------------------------------------------------
# The papers' numbers (percent), Diabetes columns only.
# --------------------------------------------------------------------------------------------
# Xue, Yang, Huai, Wang (IJCAI 2021), Table 2 ("Metric learning: Experimental results on
# Diabetes and Diabetic Retinopathy dataset for different training sizes with fixed ε = 1"),
# Diabetes columns n = 128, 256, 512.
PAPER_TABLE2 = {
    ("SC, δ>0", "Non-private"): (71.40, 72.39, 72.88),
    ("SC, δ>0", "OffPairStrC"): (63.69, 64.55, 64.63),
    ("SC, δ>0", "DPGDSC"): (64.03, 64.68, 65.85),
    ("C, δ>0", "Non-private"): (71.73, 72.52, 72.97),
    ("C, δ>0", "OffPairC"): (64.20, 64.64, 65.87),
    ("C, δ>0", "DPGDC2"): (71.30, 71.91, 72.46),
    ("C, δ>0", "DPEGD"): (71.29, 72.21, 72.84),
    ("SC, δ=0", "Non-private"): (71.71, 71.99, 72.56),
    ("SC, δ=0", "OffPairStrC"): (64.37, 65.64, 66.77),
    ("SC, δ=0", "DPGDSC"): (64.51, 65.28, 67.16),
    ("C, δ=0", "Non-private"): (71.80, 72.47, 72.80),
    ("C, δ=0", "OffPairC"): (64.97, 65.58, 67.28),
    ("C, δ=0", "DPEGD"): (70.37, 71.16, 71.24),
}
# Xue et al. (IJCAI 2021), Table 4 ("AUC maximization: Experimental results on Diabetes and
# Diabetic Retinopathy dataset for different ε, where n = 256"), Diabetes rows, ε = 0.5, 0.8,
# 1.0, 2.0. (The table has no non-private row.)
PAPER_TABLE4 = {
    ("SC, δ>0", "OffPairStrC"): (53.71, 56.05, 59.52, 64.93),
    ("SC, δ>0", "DPGDSC"): (63.26, 63.92, 64.46, 65.51),
    ("C, δ>0", "OffPairC"): (52.01, 52.62, 54.51, 57.44),
    ("C, δ>0", "DPGDC2"): (52.94, 53.09, 54.61, 59.96),
    ("C, δ>0", "DPEGD"): (64.52, 64.47, 64.41, 64.37),
    ("SC, δ=0", "OffPairStrC"): (50.65, 56.45, 59.94, 64.13),
    ("SC, δ=0", "DPGDSC"): (59.16, 62.98, 62.67, 64.63),
    ("C, δ=0", "OffPairC"): (50.25, 50.90, 52.57, 60.13),
    ("C, δ=0", "DPEGD"): (59.16, 64.35, 64.50, 64.47),
}
TABLE2_N = (128, 256, 512)
TABLE4_EPS = (0.5, 0.8, 1.0, 2.0)
FIG_EPS = (0.5, 1.5, 2.5)
LAMBDA_AUC, LAMBDA_METRIC = 1e-3, 1e-2  # Xue et al. §5 "Experimental settings" (and Huai §5)
DPGDSC_T = 100  # see the results file: the release is noise-dominated for any T
R = D = 1.0


def verify_paper_numbers(paper_text: Path | None) -> str:
    """Check every hard-coded number against the paper's text, if the text is given."""
    if paper_text is None:
        return "paper text not given (--paper-text): numbers not re-checked"
    text = paper_text.read_text()
    missing = [
        f"{v:.2f}%"
        for table in (PAPER_TABLE2, PAPER_TABLE4)
        for vals in table.values()
        for v in vals
        if f"{v:.2f}%" not in text
    ]
    if missing:
        raise SystemExit(f"hard-coded paper numbers not found in {paper_text}: {missing}")
    n = sum(len(v) for t in (PAPER_TABLE2, PAPER_TABLE4) for v in t.values())
    return f"all {n} hard-coded numbers found verbatim in the paper's text (`{paper_text.name}`)"


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------
def _scale(X: np.ndarray, scaling: str = "rownorm") -> np.ndarray:
    """``"rownorm"``: z-score each feature, then scale each row to ‖x‖ = R = 1 (every record on
    the sphere, so the worst-case constants G, L are attained rather than loose).
    ``"minmax"`` (sensitivity check): each feature to [0, 1], then divided by √d."""
    if scaling == "minmax":
        span = np.where(X.max(0) > X.min(0), X.max(0) - X.min(0), 1.0)
        return (X - X.min(0)) / span / math.sqrt(X.shape[1])
    Z = (X - X.mean(0)) / np.where(X.std(0) > 0, X.std(0), 1.0)
    return Z / np.maximum(np.linalg.norm(Z, axis=1, keepdims=True), 1e-12)


def load_pima(scaling: str = "rownorm") -> tuple[np.ndarray, np.ndarray]:
    """The 8 raw Pima features (zeros kept, as in the UCI file) and the 0/1 outcome."""
    path = data_path("pima_indians_diabetes.csv")
    raw = np.genfromtxt(str(path), delimiter=",", skip_header=1)
    return _scale(raw[:, :8], scaling), raw[:, 8].astype(int)


def load_other(name: str) -> tuple[np.ndarray, np.ndarray]:
    """Hepatitis / breast cancer via :mod:`stream_dp.datasets`; missing cells → column mean."""
    ds = load_dataset(name)
    X = np.array(ds.X, dtype=float)
    means = np.nanmean(X, axis=0)
    X = np.where(np.isnan(X), means, X)
    return _scale(X), np.asarray(ds.y).astype(int)


# --------------------------------------------------------------------------------------------
# Metrics (NumPy only: scikit-learn is a test dependency)
# --------------------------------------------------------------------------------------------
def auc(scores: np.ndarray, y: np.ndarray) -> float:
    """Area under the ROC curve of 0/1 labels (ties count one half)."""
    return roc_auc(scores, y == 1)


def knn_accuracy(Ztr, ytr, Zte, yte, k: int = 3) -> float:
    d = ((Zte[:, None, :] - Ztr[None]) ** 2).sum(-1)
    idx = np.argsort(d, axis=1, kind="stable")[:, :k]
    return float(((ytr[idx].mean(1) > 0.5) == (yte == 1)).mean())


def _metric_acc(W, X, y, tr, te) -> float:
    S = psd_sqrt(W)
    return knn_accuracy(X[tr] @ S, y[tr], X[te] @ S, y[te])


def _noise_norm(est, p: int) -> float:
    """E‖noise‖ ≈ σ√p (Gaussian) or b√(2p) (Laplace)."""
    s = est.noise_scale_
    return s * math.sqrt(2 * p) if est.delta == 0 else s * math.sqrt(p)


def _diag(est, p: int) -> dict:
    out = {"scale": float(est.noise_scale_), "noise_norm": _noise_norm(est, p)}
    for attr in ("T1_", "n_iter_", "eta_", "sensitivity_"):
        if hasattr(est, attr):
            out[attr.rstrip("_")] = getattr(est, attr)
    if hasattr(est, "constants_"):
        out["G"] = est.constants_.lipschitz
    if getattr(est, "sigma_raised_", False):
        # The paper's σ did not fit the zCDP ledger's (ε, δ) budget: raised (see DPGDC2 docs).
        out["raised"] = True
    if hasattr(est, "epochs_"):
        e1 = est.epochs_[0]
        out["epoch1"] = {"n": e1["n"], "scale": e1["scale"], "eta": e1["eta"]}
        out["later_movement"] = sum(e["n"] * e["eta"] for e in est.epochs_[1:]) * out.get("G", 4)
        out["scale"] = est.epochs_[-1]["scale"]
    return out


def _fit(est, X, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return est.fit(X, y)


def _noiseless(est, X, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return est._noiseless_fit(X, y)


# --------------------------------------------------------------------------------------------
# Jobs (one permutation each; run in worker processes)
# --------------------------------------------------------------------------------------------
def _private_rows(task: str, n: int, eps: float, lam: float, seed: int):
    """The private estimators of Xue et al.'s tables: (block, row, estimator).

    The noise seed depends on (permutation, n, ε): cells of a table get independent noise.
    """
    seed = 1_000_000 * seed + 1000 * n + int(round(100 * eps))
    rows = []
    for delta, tag in ((1.0 / n, "δ>0"), (0.0, "δ=0")):
        common = dict(task=task, epsilon=eps, delta=delta, data_radius=R, model_radius=D,
                      seed=seed, reproducible=True)  # fmt: skip
        rows.append((f"SC, {tag}", "OffPairStrC", OffPairStrC(alpha=lam, **common)))
        rows.append((f"SC, {tag}", "DPGDSC", DPGDSC(alpha=lam, n_iter=DPGDSC_T, **common)))
        rows.append((f"C, {tag}", "OffPairC", OffPairC(**common)))
        if delta > 0:
            rows.append((f"C, {tag}", "DPGDC2", DPGDC2(**common)))
        rows.append((f"C, {tag}", "DPEGD", DPEGD(**common)))
    return rows


def _reference_models(task: str, lam: float, seed: int):
    """Non-private rows: the noiseless GIGA average of OffPairStrC / OffPairC without the random
    warm-up (Xue et al. §5: "variants of OffPairStrC and OffPairC which do not add any noise")."""
    common = dict(task=task, data_radius=R, model_radius=D, seed=seed, reproducible=True, warmup=1)
    return (
        ("SC", OffPairStrC(alpha=lam, sensitivity="certified", **common)),
        ("C", OffPairC(sensitivity="certified", **common)),
    )


RANDOM_DRAWS = 25


def _random_releases(task: str, d: int, seed: int, family: str) -> list[np.ndarray]:
    """Data-independent models: Π_C of huge Gaussian or Laplace noise — what a release whose
    noise dwarfs D is. ``RANDOM_DRAWS`` per permutation, from the same noise family as the
    δ > 0 (Gaussian) or δ = 0 (Laplace) rows: Laplace noise is not rotation-invariant, so its
    chance level can differ."""
    rng = np.random.default_rng((10_000 + seed) * (2 if family == "Laplace" else 1))
    C = L2Ball(D) if task == "auc" else PSDFrobeniusBall(D)
    shape = (d,) if task == "auc" else (d, d)
    draw = rng.normal if family == "Gaussian" else rng.laplace
    return [C.project(draw(size=shape) * 1e6) for _ in range(RANDOM_DRAWS)]


FAMILIES = ("Gaussian", "Laplace")


def table2_job(args):
    n, perm = args
    X, y = load_pima()
    idx = np.random.default_rng(perm).permutation(len(y))
    tr, te = idx[:n], idx[n:]
    out, diag = {}, {}
    for block, est in _reference_models("metric", LAMBDA_METRIC, perm):
        acc = _metric_acc(_noiseless(est, X[tr], y[tr]), X, y, tr, te)
        for tag in ("δ>0", "δ=0"):
            out[(f"{block}, {tag}", "Non-private")] = acc
    for fam in FAMILIES:
        out[("reference", f"Random release ({fam})")] = float(
            np.mean(
                [_metric_acc(W, X, y, tr, te) for W in _random_releases("metric", 8, perm, fam)]
            )
        )
    for block, row, est in _private_rows("metric", n, 1.0, LAMBDA_METRIC, perm):
        _fit(est, X[tr], y[tr])
        out[(block, row)] = _metric_acc(est.private_weights, X, y, tr, te)
        assert est.accountant.spent()[0] <= est.epsilon
        diag[(block, row)] = _diag(est, 64)
        _extra_diagnostics(est, block, row, X, y, tr, te, "metric", out)
    Xm, _ = load_pima("minmax")
    for block, row, est in _private_rows("metric", n, 1.0, LAMBDA_METRIC, perm):
        if row == "DPEGD":
            _fit(est, Xm[tr], y[tr])
            out[("min-max", block, row)] = _metric_acc(est.private_weights, Xm, y, tr, te)
    return ("table2", n, perm, out, diag)


def table4_job(args):
    eps, perm = args
    n = 256
    X, y = load_pima()
    idx = np.random.default_rng(perm).permutation(len(y))
    tr, te = idx[:n], idx[n:]
    out, diag = {}, {}
    if eps == TABLE4_EPS[0]:  # ε-independent references, once per permutation
        for block, est in _reference_models("auc", LAMBDA_AUC, perm):
            out[("reference", f"Non-private ({block})")] = auc(
                X[te] @ _noiseless(est, X[tr], y[tr]), y[te]
            )
        for fam in FAMILIES:
            out[("reference", f"Random release ({fam})")] = float(
                np.mean([auc(X[te] @ w, y[te]) for w in _random_releases("auc", 8, perm, fam)])
            )
    for block, row, est in _private_rows("auc", n, eps, LAMBDA_AUC, perm):
        _fit(est, X[tr], y[tr])
        out[(block, row)] = auc(est.decision_function(X[te]), y[te])
        assert est.accountant.spent()[0] <= est.epsilon
        diag[(block, row)] = _diag(est, 8)
        _extra_diagnostics(est, block, row, X, y, tr, te, "auc", out)
    Xm, _ = load_pima("minmax")
    for block, row, est in _private_rows("auc", n, eps, LAMBDA_AUC, perm):
        if row in ("DPGDC2", "DPEGD"):
            _fit(est, Xm[tr], y[tr])
            out[("min-max", block, row)] = auc(est.decision_function(Xm[te]), y[te])
            if row == "DPGDC2":
                Xc, Yc = est._prepare(Xm[tr], y[tr])
                g0 = est._query(np.zeros_like(est.private_weights), Xc, Yc)
                out[("grad0-minmax", block, row)] = float(np.linalg.norm(g0))
    return ("table4", eps, perm, out, diag)


def _extra_diagnostics(est, block, row, X, y, tr, te, task, out) -> None:
    """Evidence for the intermediate-noise algorithms (averaged over permutations).

    DPGDC2: signal-to-noise of the averaged trajectory, √T·‖∇L(0)‖/(σ√p) (the drift of T
    gradient steps against the random walk of their noise). DPEGD: the score of w_1, the
    projected noisy output of epoch 1, before the small later epochs.
    """
    if row == "DPGDC2":
        Xc, Yc = est._prepare(X[tr], y[tr])
        g0 = float(np.linalg.norm(est._query(np.zeros_like(est.private_weights), Xc, Yc)))
        p = est.private_weights.size
        out[("snr", block, row)] = math.sqrt(est.n_iter_) * g0 / (est.noise_scale_ * math.sqrt(p))
        out[("grad0", block, row)] = g0
    elif row == "DPEGD":
        out[("w1bar", block, row)] = float(np.linalg.norm(est._epoch_trace[0]["average"]))
        w1 = est._epoch_trace[1]["start"]
        if task == "auc":
            out[("w1", block, row)] = auc(X[te] @ w1, y[te])
        else:
            out[("w1", block, row)] = _metric_acc(w1, X, y, tr, te)


FIG_SETUPS = {
    # Huai et al. §5: Figure 1 = OnPairStrC on Hepatitis and Cancer, n from 40 to 90;
    # Figure 2 = OnPairC on Diabetes (and Diabetic Retinopathy, not shipped), n from 50 to 350.
    "hepatitis": ("OnPairStrC", tuple(range(40, 91, 10))),
    "breast_cancer": ("OnPairStrC", tuple(range(40, 91, 10))),
    "pima": ("OnPairC", tuple(range(50, 351, 50))),
}


def _objective(model, w, X, Y) -> float:
    """Huai et al.'s objective: the regularised empirical pairwise risk (eq. 1) of w on D_n."""
    return float(model.loss.all_pairs_value(w, X, Y))


def _run_online(model, X, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for x, label in zip(X, y, strict=True):
            model.learn_one(x, bool(label))
    return model


def figure_job(args):
    name, perm = args
    X, y = load_pima() if name == "pima" else load_other(name)
    algo, ns = FIG_SETUPS[name]
    idx = np.random.default_rng(perm).permutation(len(y))
    out = {}
    for n in ns:
        Xn, yn = X[idx[:n]], y[idx[:n]]
        Yn = np.where(yn == 1, 1.0, -1.0)
        alpha = LAMBDA_AUC if algo == "OnPairStrC" else n**-0.25  # Huai §5; OnPairC: α = n^{-1/4}
        giga = _run_online(
            PairwiseGIGA(task="auc", alpha=alpha, seed=perm, reproducible=True), Xn, yn
        )
        out[(n, "PairwiseGIGA (non-private)")] = _objective(giga, giga.weights, Xn, Yn)
        cls = OnPairStrC if algo == "OnPairStrC" else OnPairC
        for eps in FIG_EPS:
            common = dict(task="auc", epsilon=eps, delta=1.0 / n, alpha=alpha, seed=perm,
                          reproducible=True)  # fmt: skip
            # (a) the paper's constants: T1 = max(⌈16L/α²⌉, 7) > n, so horizon = n is refused
            # (no learning step would remain); the anytime schedule keeps serving the random
            # warm-up releases (Alg. 1 steps 2–7), exactly what the paper's algorithm outputs.
            paper = _run_online(cls(horizon=None, **common), Xn, yn)
            out[(n, f"{algo} paper T1, ε={eps}")] = _objective(paper, paper.private_weights, Xn, Yn)
            # (b) usable: warm-up 7 with the certified sensitivity, one release at t = n
            # carrying the whole budget (release_every = n − 7).
            single = _run_online(
                cls(horizon=n, warmup=7, release_every=n - 7, sensitivity="certified", **common),
                Xn,
                yn,
            )
            out[(n, f"{algo} warmup 7, one release, ε={eps}")] = _objective(
                single, single.private_weights, Xn, Yn
            )
            if perm == 0:
                out[(n, f"σ at t=n, ε={eps}")] = single.last_sigma
                out[(n, "T1 (paper)")] = paper.T1
    return ("figure", name, perm, out, {})


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------
def _ms(vals) -> tuple[float, float]:
    a = 100 * np.asarray(vals, dtype=float)
    return float(a.mean()), float(a.std())


def _fmt(m, s) -> str:
    return f"{m:.2f} ± {s:.2f}"


DATA_INDEPENDENT = ("OffPairStrC", "OffPairC", "DPGDSC")


def _explain(c: dict) -> str:
    """One gap's explanation, from the evidence gathered in ``c`` (see ``_gap_context``)."""
    row, d, m, paper = c["row"], c["diag"], c["ours"], c["paper"]
    lam = LAMBDA_AUC if c["task"] == "auc" else LAMBDA_METRIC
    p = 8 if c["task"] == "auc" else 64
    parts = []
    # 1. What the algorithm's own calibration implies at this n and ε.
    if row in ("OffPairStrC", "OffPairC"):
        parts.append(
            f"T1 = max(⌈16L/α²⌉, 7) = {d['T1']:,} ≥ n = {c['n']}, so all of w_1..w_n are random "
            "points of C (Alg. 3 step 3) and w̃ carries no information about the data; on top, "
            f"the formula's noise is {d['scale']:.3g} per coordinate (E‖noise‖ ≈ "
            f"{d['noise_norm']:.3g} ≫ D = 1)"
        )
    elif row == "DPGDSC":
        parts.append(
            f"the formula's noise is {d['scale']:.3g} per coordinate (sensitivity 8G/(αn) = "
            f"{d['sensitivity']:.3g}, G = {d['G']:.4g}, α = λ = {lam:g}), E‖noise‖ ≈ "
            f"{d['noise_norm']:.3g} ≫ D = 1 ≥ ‖w_T‖: Π_C(w_T + noise) is the direction of the "
            f"noise, tilted towards w_T by an angle of at most ≈ 1/{d['noise_norm']:.3g} rad"
        )
    elif row == "DPGDC2":
        parts.append(
            f"T = {d['n_iter']} steps each adding noise σ = {d['scale']:.3g} per coordinate "
            f"(E‖ζ_t‖ ≈ {d['noise_norm']:.3g}) while the data's gradient at 0 has norm "
            f"{c['grad0']:.3g} (G = 4 is the worst case): the drift of the averaged trajectory "
            f"against its noise is √T‖∇L(0)‖/(σ√p) ≈ {c['snr']:.2f}"
        )
    elif row == "DPEGD":
        e1 = d["epoch1"]
        norm1 = e1["scale"] * (math.sqrt(2 * p) if "δ=0" in c["block"] else math.sqrt(p))
        diam = 2.0 if c["task"] == "auc" else math.sqrt(2.0)
        parts.append(
            f"with the paper's η the first epoch (n_1 = {e1['n']}, η_1 = {e1['eta']:.3g}) adds "
            f"noise of norm E‖ζ_1‖ ≈ {norm1:.3g} = {norm1 / diam:.2f}·diam(C) — for small ε this "
            "is ≈ 1.4·diam(C) whatever G and n — to a noiseless epoch-1 average of norm only "
            f"{c['w1bar']:.3g}, so w_1 = Π_C(w̄_1 + ζ_1) scores {c['w1']:.2f}; the later epochs "
            f"can move w by at most Σ_(i≥2) n_i η_i G = {d['later_movement']:.3g} and end at "
            f"{m:.2f}"
        )
    # 2. Where our row sits: the chance level of a data-independent release of the same noise.
    z = (m - c["random"]) / math.hypot(c["se"], c["random_se"])
    at_chance = abs(z) < 3
    if at_chance:
        parts.append(
            f"ours, {m:.2f} ± {c['se']:.2f} (s.e.), is at the {c['family']} random-release level "
            f"{c['random']:.2f} ± {c['random_se']:.2f} (z = {z:+.1f}): a data-independent model, "
            "as these numbers predict"
        )
    else:
        parts.append(
            f"ours, {m:.2f} ± {c['se']:.2f} (s.e.), is above the random-release level "
            f"{c['random']:.2f} (z = {z:+.1f}) and below the non-private {c['nonpriv']:.2f}: the "
            "release keeps part of the signal"
        )
    # 3. Where the paper sits, and what that implies.
    gap_chance = paper - c["random"]
    if at_chance and gap_chance > 3:
        parts.append(
            f"the paper's {paper:.2f} is {gap_chance:.1f} points above chance although its own "
            "calibration makes the release (essentially) data-independent at this n and ε: its "
            "runs must have used less noise than the stated formula (e.g. a smaller G or R, a "
            "larger λ or step size, no warm-up), which its text does not let us reproduce"
        )
    elif at_chance and gap_chance < -3:
        parts.append(
            f"the paper's {paper:.2f} is {-gap_chance:.1f} points *below* our chance level: the "
            "score of a random model is set by the data and the preprocessing (unstated in the "
            "paper), not by learning"
        )
    elif at_chance:
        parts.append(
            f"the paper's {paper:.2f} is itself within 3 points of chance; a gap this size "
            f"between two chance-level rows is sampling noise (a random model's score varies by "
            f"± {c['sd']:.1f} across permutations, ± {c['se']:.1f} on a 20-permutation mean)"
        )
    elif paper > m:
        parts.append(
            f"the paper's {paper:.2f} is within {abs(paper - c['paper_nonpriv']):.1f} points of "
            f"its own non-private {c['paper_nonpriv']:.2f}, i.e. its noise cost (almost) "
            "nothing, which the noise above cannot give"
            if c.get("paper_nonpriv") is not None
            else f"the paper's {paper:.2f} implies less noise than the formula gives"
        )
    mm = c.get("minmax")
    if not at_chance and paper < m and mm is not None and abs(mm - paper) < abs(m - paper):
        g_mm = c.get("grad0-minmax")
        grad = (
            f" — records well inside the ball, so the data's gradient at 0 has norm {g_mm:.3g} "
            f"instead of {c['grad0']:.3g} against the same noise —"
            if g_mm is not None and "grad0" in c
            else ""
        )
        parts.append(
            f"the paper's {paper:.2f} is below ours: with min-max scaling{grad} the same "
            f"algorithm scores {mm:.2f}, {abs(mm - paper):.1f} points from the paper, so the "
            "gap is mostly the unstated preprocessing"
        )
    elif mm is not None and abs(mm - m) >= 1.5 and not at_chance:
        parts.append(
            f"with min-max scaling the same algorithm scores {mm:.2f} ({mm - m:+.1f}): the "
            "result depends on the unstated preprocessing"
        )
    return "; ".join(parts) + "."


def _collect(results):
    t2: dict = {}
    t2d: dict = {}
    t4: dict = {}
    t4d: dict = {}
    fig: dict = {}
    for kind, key, _perm, out, diag in results:
        if kind == "table2":
            for k, v in out.items():
                t2.setdefault((k, key), []).append(v)
            for k, v in diag.items():
                t2d.setdefault((k, key), v)
        elif kind == "table4":
            for k, v in out.items():
                kk = (k, key) if k[0] != "reference" else (k, None)
                t4.setdefault(kk, []).append(v)
            for k, v in diag.items():
                t4d.setdefault((k, key), v)
        else:
            for k, v in out.items():
                fig.setdefault((key, *k), []).append(v)
    return t2, t2d, t4, t4d, fig


def _gap_context(tab, diag, block, row, col, task, n, ref_col) -> dict:
    m, sd = _ms(tab[((block, row), col)])
    P = len(tab[((block, row), col)])
    fam = "Laplace" if "δ=0" in block else "Gaussian"
    ref = tab[(("reference", f"Random release ({fam})"), ref_col)]
    rnd, rsd = _ms(ref)  # each entry is already a mean over RANDOM_DRAWS draws
    c = dict(
        block=block, row=row, task=task, n=n, ours=m, sd=sd, se=sd / math.sqrt(P), family=fam,
        random=rnd, random_se=rsd / math.sqrt(len(ref)), diag=diag[((block, row), col)],
    )  # fmt: skip
    if task == "metric":
        c["paper_nonpriv"] = PAPER_TABLE2[(block, "Non-private")][TABLE2_N.index(col)]
    if task == "metric":
        c["nonpriv"] = _ms(tab[((block, "Non-private"), col)])[0]
    else:
        c["nonpriv"] = _ms(tab[(("reference", f"Non-private ({block[:2].strip(',')})"), None)])[0]
    for extra in ("snr", "grad0", "w1bar", "grad0-minmax"):
        if ((extra, block, row), col) in tab:
            c[extra] = float(np.mean(tab[((extra, block, row), col)]))
    for extra in ("w1", "min-max"):
        if ((extra, block, row), col) in tab:
            c["minmax" if extra == "min-max" else extra] = _ms(tab[((extra, block, row), col)])[0]
    return c


def build_report(results, elapsed, quick, jobs, verified) -> str:
    t2, t2d, t4, t4d, fig = _collect(results)
    n_perm = len({r[2] for r in results})
    L = []
    L.append(
        "# Paper tables reproduced: Xue et al. 2021 Tables 2 and 4, Huai et al. 2020 Figs 1–2\n"
    )
    L.append(
        f"Generated by `python benchmarks/paper_tables.py{' --quick' if quick else ''}` in "
        f"**{elapsed / 60:.1f} min** with {jobs} worker processes (one BLAS thread each) on "
        f"{platform.machine()} / Python {platform.python_version()} / NumPy {np.__version__}; "
        f"{n_perm} random permutations per cell; numbers are mean ± std over permutations, in "
        "percent."
    )
    L.append(f"Paper numbers: {verified}.\n")
    L.append("## Protocol and preprocessing\n")
    L.append(
        "- **Data**: Pima Indians Diabetes (`stream_dp/data`, 768 × 8, the UCI file as is — "
        "zeros kept); Hepatitis and Breast Cancer (Wisconsin) for Figure 1 via "
        "`stream_dp.datasets` (missing cells → column mean)."
    )
    L.append(
        "- **Scaling**: every feature z-scored with the whole file's mean and std, then every "
        "row scaled to unit norm, so ‖x‖₂ = **R = 1** (no record is clipped, and the constants "
        "G, L are attained rather than loose). The z-score uses statistics of all records: it "
        "reproduces the papers' protocol, it is not private preprocessing; the papers do not "
        "state their scaling. A *min-max* variant (each feature to [0, 1], ÷ √8, so most "
        "records have ‖x‖ well below R) is run for DPGDC2 and DPEGD as a sensitivity check. "
        "Models live in **D = 1** balls: ‖w‖₂ ≤ 1 (AUC), W ⪰ 0 with ‖W‖_F ≤ 1 (metric)."
    )
    L.append(
        "- **Split**: for each permutation, train on the first n records, test on the other "
        "768 − n; **δ = 1/n**. AUC: area under the ROC curve of w̃ᵀx on the test set. Metric: "
        "kNN (k = 3) accuracy on the test set with distances √((a−b)ᵀW̃(a−b))."
    )
    L.append(
        f"- **Strongly convex (SC) rows**: regulariser (λ/2)‖w‖² with **λ = {LAMBDA_AUC:g} "
        f"(AUC) and λ = {LAMBDA_METRIC:g} (metric)**, as Xue et al. §5 (and Huai et al.). "
        "**General convex (C) rows**: no regulariser (OffPairC: its own (α/2)‖w − w₀‖², "
        "α = n^(−1/2)). Logistic losses; G, L from `docs/algorithms.md` (G = 4R + λD for AUC, "
        "4R² + λD for metric)."
    )
    L.append(
        f"- **Algorithms** (`stream_dp.offline`, defaults unless stated): OffPairStrC/OffPairC "
        f"with the paper's T1; DPGDSC with η = 2/(L+α) and **T = {DPGDSC_T}** (Theorem 1's "
        "T = (L/α) ln n would be ≈ 22 000 (AUC) / 2 500 (metric) full-gradient iterations; the "
        "sensitivity 8G/(αn) holds for every T and the release is noise-dominated, see below); "
        "DPGDC2 with T = min(n, n²ε²/(p ln(1/δ))), η = diam/(G√T); DPEGD with the paper's η "
        "(capped at 2/L). p = number of model coordinates (8 for AUC, 64 for the 8 × 8 metric). "
        "The noise of every cell is keyed by (permutation, n, ε), so cells are independent. "
        "Every private model's ledger is asserted to spend ≤ ε."
    )
    L.append(
        "- **Non-private rows**: the noiseless GIGA average of OffPairStrC (SC) and OffPairC "
        "(C) with no random warm-up (warm-up 1), i.e. Xue et al.'s \"variants of OffPairStrC "
        'and OffPairC which do not add any noise". They do not depend on δ, so the δ>0 and '
        "δ=0 blocks show the same run (the paper's four rows differ by run-to-run noise)."
    )
    L.append(
        f"- **Random release** (reference, not in the papers): Π_C of huge Gaussian (the δ>0 "
        f"rows' noise) or Laplace (the δ=0 rows') noise, {RANDOM_DRAWS} draws per permutation — "
        "a data-independent model, i.e. what a release whose noise dwarfs D is. Its AUC is "
        "50 % in expectation by symmetry (w and −w are equally likely).\n"
    )

    # ---- Table 2 --------------------------------------------------------------------------
    L.append("## Xue et al. Table 2 — metric learning, kNN (k = 3) accuracy, ε = 1\n")
    L.append(
        "| block | algorithm | " + " | ".join(f"n = {n}: ours | paper" for n in TABLE2_N) + " |"
    )
    L.append("|---|---|" + "---|---|" * len(TABLE2_N))
    gaps = []
    for block, row in PAPER_TABLE2:
        cells = []
        for j, n in enumerate(TABLE2_N):
            m, sd = _ms(t2[((block, row), n)])
            paper = PAPER_TABLE2[(block, row)][j]
            flag = " ⚠" if abs(m - paper) > 3 else ""
            cells += [_fmt(m, sd) + flag, f"{paper:.2f}"]
            if abs(m - paper) > 3 and row != "Non-private":
                gaps.append(("Table 2", f"n = {n}", _gap_context(
                    t2, t2d, block, row, n, "metric", n, n), paper))  # fmt: skip
        L.append(f"| {block} | {row} | " + " | ".join(cells) + " |")
    extra_rows = [
        (("reference", "Random release (Gaussian)"), "reference", "Random release (Gaussian)"),
        (("reference", "Random release (Laplace)"), "reference", "Random release (Laplace)"),
        (("w1", "C, δ>0", "DPEGD"), "diagnostic", "DPEGD δ>0: w_1 only (after epoch 1)"),
        (("w1", "C, δ=0", "DPEGD"), "diagnostic", "DPEGD δ=0: w_1 only (after epoch 1)"),
        (("min-max", "C, δ>0", "DPEGD"), "min-max scaling", "DPEGD (δ>0)"),
        (("min-max", "C, δ=0", "DPEGD"), "min-max scaling", "DPEGD (δ=0)"),
    ]
    for key, block, label in extra_rows:
        cells = []
        for n in TABLE2_N:
            cells += [_fmt(*_ms(t2[(key, n)])), "—"]
        L.append(f"| {block} | {label} | " + " | ".join(cells) + " |")
    L.append("\n⚠ = more than 3 points from the paper; every private ⚠ is explained below.\n")

    # ---- Table 4 --------------------------------------------------------------------------
    L.append("## Xue et al. Table 4 — AUC maximisation, test AUC, n = 256\n")
    L.append(
        "| block | algorithm | " + " | ".join(f"ε = {e}: ours | paper" for e in TABLE4_EPS) + " |"
    )
    L.append("|---|---|" + "---|---|" * len(TABLE4_EPS))
    for block, row in PAPER_TABLE4:
        cells = []
        for j, e in enumerate(TABLE4_EPS):
            m, sd = _ms(t4[((block, row), e)])
            paper = PAPER_TABLE4[(block, row)][j]
            flag = " ⚠" if abs(m - paper) > 3 else ""
            cells += [_fmt(m, sd) + flag, f"{paper:.2f}"]
            if abs(m - paper) > 3:
                gaps.append(("Table 4", f"ε = {e}", _gap_context(
                    t4, t4d, block, row, e, "auc", 256, None), paper))  # fmt: skip
        L.append(f"| {block} | {row} | " + " | ".join(cells) + " |")
    for name in (
        "Non-private (SC)",
        "Non-private (C)",
        *(f"Random release ({f})" for f in FAMILIES),
    ):
        m, sd = _ms(t4[(("reference", name), None)])
        L.append(f"| reference | {name} (ε-independent) | " + f"{_fmt(m, sd)} | — | " * 4)
    extra_rows = [
        (("w1", "C, δ>0", "DPEGD"), "diagnostic", "DPEGD δ>0: w_1 only (after epoch 1)"),
        (("w1", "C, δ=0", "DPEGD"), "diagnostic", "DPEGD δ=0: w_1 only (after epoch 1)"),
        (("min-max", "C, δ>0", "DPGDC2"), "min-max scaling", "DPGDC2 (δ>0)"),
        (("min-max", "C, δ>0", "DPEGD"), "min-max scaling", "DPEGD (δ>0)"),
        (("min-max", "C, δ=0", "DPEGD"), "min-max scaling", "DPEGD (δ=0)"),
    ]
    for key, block, label in extra_rows:
        cells = []
        for e in TABLE4_EPS:
            cells += [_fmt(*_ms(t4[(key, e)])), "—"]
        L.append(f"| {block} | {label} | " + " | ".join(cells) + " |")
    L.append("\n⚠ = more than 3 points from the paper; every ⚠ is explained below.\n")

    # ---- Non-private check ----------------------------------------------------------------
    L.append("## Non-private rows against the paper\n")
    worst = 0.0
    for block, row in PAPER_TABLE2:
        if row == "Non-private":
            for j, n in enumerate(TABLE2_N):
                m, _ = _ms(t2[((block, row), n)])
                worst = max(worst, abs(m - PAPER_TABLE2[(block, row)][j]))
    L.append(
        f"Largest |ours − paper| over the twelve non-private cells of Table 2: **{worst:.2f} "
        f"points** ({'within' if worst <= 3 else 'NOT within'} the 3-point target). Table 4 "
        "has no non-private row; ours is listed as a reference.\n"
    )

    # ---- Gaps -----------------------------------------------------------------------------
    L.append("## Every private gap larger than 3 points, explained\n")
    L.append(
        "Evidence used: the noise each algorithm's *own formula* prescribes at that n and ε (read "
        "from the fitted models' ledgers) against the model scale D = 1; the random-release "
        "level (what any data-independent model scores, with its standard error); the "
        "non-private level; for DPGDC2 the signal-to-noise of its trajectory; for DPEGD the "
        "score of its noisy first epoch; and the same algorithm under min-max scaling.\n"
    )
    for table, col, c, paper in gaps:
        c["paper"] = paper
        L.append(
            f"- **{table}, {c['block']}, {c['row']}, {col}**: ours {c['ours']:.2f} vs paper "
            f"{paper:.2f} ({c['ours'] - paper:+.2f}). {_explain(c)}"
        )
    if not gaps:
        L.append("(none)")
    L.append("")
    L.append(
        "**Summary.** With R = D = 1, λ = 10⁻³ (AUC) / 10⁻² (metric) and n ≤ 512, the formulas "
        "of OffPairStrC, OffPairC and DPGDSC prescribe noise hundreds to thousands of times "
        "larger than the model (σ ∝ 1/(αn) with α = λ), and OffPairStrC/OffPairC's warm-up "
        "T1 = 16L/α² exceeds n, so their averaged iterates are data-independent: "
        "their releases are random models and our rows sit at the random-release level. "
        "DPEGD's first epoch adds noise of norm ≈ 1.4·diam(C) with the paper's own step size, "
        "so on AUC (n = 256) it is at chance too; DPGDC2 learns where its gradient drift beats "
        "its noise (metric, and AUC at larger ε). Where the paper reports more than chance for "
        "a release its own formula makes data-independent, its runs must have used less noise "
        "than the stated calibration.\n"
    )

    # ---- Diagnostics table ----------------------------------------------------------------
    L.append("## Noise diagnostics (from the fitted models' ledgers)\n")
    L.append("| table | setting | algorithm | T1 or T | noise per coordinate | E‖noise‖ |")
    L.append("|---|---|---|---|---|---|")
    for tag, dd, col in (("2", t2d, "n"), ("4", t4d, "ε")):
        for (key, v), d in sorted(dd.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            t = d.get("T1", d.get("n_iter"))
            ts = f"{t:,}" if isinstance(t, int) else "epochs: n_i"
            raised = " (raised ‡)" if d.get("raised") else ""
            L.append(
                f"| {tag} | {col} = {v}, {key[0]} | {key[1]} | {ts} | {d['scale']:.4g}{raised} | "
                f"{d['noise_norm']:.4g} |"
            )
    L.append(
        "\nDPEGD's noise column is its **last** epoch's (the first epoch's is in the "
        "explanations); DPGDC2's is per iteration. ‡ DPGDC2 at ε = 2, δ = 1/256: the paper's "
        "σ = 4G√(1.25 T ln(1/δ))/(nε) spends ρ = ε²/(2.5 ln(1/δ)) over the T steps, more than "
        "the (ε, δ) budget allows under the ledger's tight zCDP conversion, so σ is raised to "
        "the smallest value that fits (by √(ρ_paper/ρ_budget) ≈ 8 %); the paper's advanced-"
        "composition claim is not backed by our accountant there.\n"
    )

    # ---- Figures --------------------------------------------------------------------------
    L.append("## Huai et al. Figures 1–2 — objective value against n\n")
    L.append(
        "Objective = the regularised empirical pairwise risk (Huai et al. eq. 1 plus the "
        "regulariser) of the **final release** on the n training records (logistic AUC loss; "
        f"λ = {LAMBDA_AUC:g} for OnPairStrC, α = n^(−1/4) for OnPairC), ε ∈ {FIG_EPS}, δ = 1/n. "
        "Figure 1: OnPairStrC on Hepatitis and Breast Cancer (n = 40…90); Figure 2: OnPairC on "
        "Diabetes (n = 50…350; Diabetic Retinopathy is not shipped). The figures' values are "
        "not in the paper's text, so there are no side-by-side numbers. Rows:"
    )
    L.append(
        "- *paper T1*: the paper's constants. T1 = max(⌈16L/α²⌉, 7) exceeds every n here, so "
        "`horizon = n` is refused (no learning step would remain) and the learner (anytime "
        "schedule) serves the random warm-up releases of Alg. 1 steps 2–7 — what the paper's "
        "algorithm outputs. Its objective is that of a random model, the same for every ε."
    )
    L.append(
        "- *warmup 7, one release*: usable settings of the same learner — warm-up 7 with the "
        "certified sensitivity (`docs/privacy.md`) and `release_every = n − 7`, i.e. one release "
        "at t = n carrying the whole budget. Its σ at t = n is listed."
    )
    L.append("- *PairwiseGIGA*: the non-private baseline (Kar et al. 2013).\n")
    for name, (algo, ns) in FIG_SETUPS.items():
        L.append(f"### {algo} on {name}\n")
        labels = ["PairwiseGIGA (non-private)"]
        labels += [f"{algo} paper T1, ε={e}" for e in FIG_EPS]
        labels += [f"{algo} warmup 7, one release, ε={e}" for e in FIG_EPS]
        L.append("| model | " + " | ".join(f"n = {n}" for n in ns) + " |")
        L.append("|---|" + "---|" * len(ns))
        for lab in labels:
            cells = []
            for n in ns:
                v = np.asarray(fig[(name, n, lab)])
                cells.append(f"{v.mean():.4f} ± {v.std():.4f}")
            L.append(f"| {lab} | " + " | ".join(cells) + " |")
        for e in FIG_EPS:
            cells = [f"{fig[(name, n, f'σ at t=n, ε={e}')][0]:.3g}" for n in ns]
            L.append(f"| σ of the single release, ε={e} | " + " | ".join(cells) + " |")
        cells = [f"{fig[(name, n, 'T1 (paper)')][0]:,}" for n in ns]
        L.append("| T1 (paper constants) | " + " | ".join(cells) + " |")
        L.append("")
    L.append(
        "With the paper's constants nothing is learned for any n or ε (T1 > n), so curves that "
        "decrease in n and ε cannot come from the algorithm as specified. OnPairC with a short "
        "warm-up and a single release does decrease with n and ε towards the non-private GIGA. "
        "OnPairStrC with λ = 10⁻³ cannot: even its single release has σ ≈ 2–7 per coordinate "
        "(sensitivity ∝ 1/(λn)), far above D = 1, so its objective stays at the random level.\n"
    )
    L.append("![Huai et al. Figures 1–2](huai_figures.png)\n")
    return "\n".join(L)


def plot_figures(results, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig_data: dict = {}
    for kind, key, _perm, out, _ in results:
        if kind != "figure":
            continue
        for k, v in out.items():
            fig_data.setdefault((key, *k), []).append(v)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    colors = {0.5: "tab:red", 1.5: "tab:orange", 2.5: "tab:green"}
    for ax, (name, (algo, ns)) in zip(axes, FIG_SETUPS.items(), strict=True):
        ys = [np.mean(fig_data[(name, n, "PairwiseGIGA (non-private)")]) for n in ns]
        ax.plot(ns, ys, "k-o", label="PairwiseGIGA (non-private)")
        for e in FIG_EPS:
            ys = [np.mean(fig_data[(name, n, f"{algo} warmup 7, one release, ε={e}")]) for n in ns]
            ax.plot(ns, ys, "-s", color=colors[e], label=f"{algo}, warm-up 7, one release, ε={e}")
            ys = [np.mean(fig_data[(name, n, f"{algo} paper T1, ε={e}")]) for n in ns]
            ax.plot(ns, ys, ":", color=colors[e], alpha=0.7, label=f"{algo}, paper T1, ε={e}")
        ax.set_title(f"{'Fig. 1' if algo == 'OnPairStrC' else 'Fig. 2'}: {algo} on {name}")
        ax.set_xlabel("training size n")
        ax.set_ylabel("objective (regularised pairwise risk)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--perms", type=int, default=20, help="random permutations (paper: 20)")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes")
    ap.add_argument("--quick", action="store_true", help="3 permutations (smoke run)")
    ap.add_argument("--out", type=Path, default=RESULTS / "paper_tables.md")
    ap.add_argument(
        "--paper-text",
        type=Path,
        default=os.environ.get("STREAM_DP_PAPER_TEXT") or None,
        help="plain text of Xue et al. 2021, to re-check the hard-coded numbers",
    )
    args = ap.parse_args(argv)
    perms = 3 if args.quick else args.perms
    verified = verify_paper_numbers(args.paper_text)
    tasks = [(table2_job, (n, p)) for n in TABLE2_N[::-1] for p in range(perms)]
    tasks += [(table4_job, (e, p)) for e in TABLE4_EPS for p in range(perms)]
    tasks += [(figure_job, (name, p)) for name in FIG_SETUPS for p in range(perms)]
    t0 = time.perf_counter()
    ctx = mp.get_context("fork") if hasattr(os, "fork") else mp.get_context()
    with ctx.Pool(args.jobs) as pool:
        results = []
        handles = [pool.apply_async(fn, (a,)) for fn, a in tasks]
        for i, h in enumerate(handles, 1):
            results.append(h.get())
            if i % 20 == 0 or i == len(handles):
                print(f"  {i}/{len(handles)} jobs, {time.perf_counter() - t0:.0f} s", flush=True)
    elapsed = time.perf_counter() - t0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    png = args.out.parent / "huai_figures.png"
    plot_figures(results, png)
    args.out.write_text(build_report(results, elapsed, args.quick, args.jobs, verified))
    print(f"wrote {args.out} and {png} in {elapsed:.0f} s")


if __name__ == "__main__":
    main()

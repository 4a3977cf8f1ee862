"""Research prototypes for issue 20 (accuracy): a compiled OnPairMF-AUC step with knobs.

Not a learner of the package: a measurement tool. :func:`run_auc` reproduces OnPairMF's AUC
step (FIFO window, fixed divisor, correlated BLT noise from the project's own
:class:`~stream_dp.privacy.mf.MFMechanism` and keyed noise, projection on the L2 ball, the
polynomial-decay average) and exposes the knobs the research varies: model radius D, step
size, window, averaging, the accounting (zCDP or exact GDP budget), a step-size schedule and a
fixed diagonal preconditioner. Every knob is set from public facts in the experiments; none is
read from the streamed or test records.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from stream_dp.online.onpairmf import step_size_rule, window_rule
from stream_dp.privacy.conversions import rho_from_epsilon
from stream_dp.privacy.gdp import rho_budget
from stream_dp.privacy.influence import pair_term_bounds, window_pattern
from stream_dp.privacy.mf import MFMechanism, make_factorization
from stream_dp.privacy.noise import KeyedNoise

__all__ = ["run_auc", "noise_rows", "mechanism", "clip_rows"]


def clip_rows(X: np.ndarray, R: float = 1.0) -> np.ndarray:
    n = np.linalg.norm(X, axis=1)
    return X * np.minimum(1.0, R / np.maximum(n, 1e-300))[:, None]


def mechanism(
    n,
    window,
    D,
    epsilon,
    delta,
    accounting,
    size,
    task="auc",
    R=1.0,
    noise="blt",
    cap=1.0,
    ptau=None,
):
    bounds = pair_term_bounds(task, R, D)
    if task == "auc" and cap < 1.0:  # a term is 2R·2·slope at most: slope ≤ min(cap, s_max)
        from stream_dp.privacy.influence import PairTermBounds

        one = min(bounds.one_sided, 4.0 * R * cap)
        bounds = PairTermBounds(one, one)
    if task == "auc" and ptau is not None and ptau < 2.0 * R:
        # Pairs clipped to ‖δ̃‖ ≤ τ: one-sided 2·s·τ (|c| = 2). Two-sided (same pairing, z_i
        # replaced, same c): 2‖s·δ̃ − s′·δ̃′‖, convex in (s, s′), so at most its value at a
        # corner of [0, s_max]²: s_max·max(‖δ̃‖, ‖δ̃ − δ̃′‖) ≤ s_max·min(2τ, 2R) — the clip is a
        # projection (1-Lipschitz), so ‖δ̃ − δ̃′‖ ≤ ‖x_i − x′_i‖ ≤ 2R, and both lie in the τ-ball.
        from stream_dp.privacy.influence import PairTermBounds

        slope = bounds.one_sided / (4.0 * R)  # s_max (capped)
        one = 2.0 * slope * ptau
        two = 2.0 * slope * min(2.0 * ptau, 2.0 * R)
        bounds = PairTermBounds(one, two)
    pattern = window_pattern(window, window, bounds)
    if epsilon is None:
        rho = None
    elif accounting == "zcdp":
        rho = rho_from_epsilon(epsilon, delta)
    elif accounting == "gdp":
        rho = rho_budget(epsilon, delta)
    else:
        raise ValueError(accounting)
    return MFMechanism(make_factorization(noise, n), pattern, n, rho, size)


_ROW_CACHE: dict = {}


def noise_rows(mf: MFMechanism, seed: int, n: int, size: int, model_id="lab") -> np.ndarray:
    """Standard correlated rows (M·Z)_t, t = 1..n (σ = 1), keyed by (seed, model_id)."""
    key = (mf.factorization.name, str(mf.factorization.state_dict()), seed, n, size, model_id)
    if key not in _ROW_CACHE:
        if len(_ROW_CACHE) > 8:
            _ROW_CACHE.clear()
        cn = mf.noise(KeyedNoise(seed, model_id))
        _ROW_CACHE[key] = cn.next_rows(n)
    return _ROW_CACHE[key]


@njit(cache=True)
def _auc_kernel(X, Y, G, sigma, etas, B, D, kappa, precond, avg_from, cap, ptau, path, every):
    n, d = X.shape
    w = np.zeros(d)
    avg = np.zeros(d)
    g = np.zeros(d)
    navg = 0
    for t in range(n):
        for k in range(d):
            g[k] = 0.0
        lo = t - B
        if lo < 0:
            lo = 0
        y = Y[t]
        for j in range(lo, t):
            c = y - Y[j]
            if c == 0.0:
                continue
            u = 0.0
            nd = 0.0
            for k in range(d):
                dk = X[t, k] - X[j, k]
                u += w[k] * dk
                nd += dk * dk
            nd = math.sqrt(nd)
            sc = 1.0 if nd <= ptau else ptau / nd  # the pair difference clipped to ‖δ‖ ≤ τ
            u *= c * sc
            sl = 1.0 / (1.0 + math.exp(u))  # -dphi(u)
            if sl > cap:  # the capped logistic: slope at most cap (linear below its margin)
                sl = cap
            coef = -c * sl * sc
            for k in range(d):
                g[k] += coef * (X[t, k] - X[j, k])
        nrm = 0.0
        eta = etas[t]
        for k in range(d):
            gk = g[k] / B + sigma * G[t, k]
            w[k] -= eta * precond[k] * gk
            nrm += w[k] * w[k]
        nrm = math.sqrt(nrm)
        if nrm > D:
            s = D / nrm
            for k in range(d):
                w[k] *= s
        if t + 1 > avg_from:
            navg += 1
            if kappa < 0:  # last iterate
                for k in range(d):
                    avg[k] = w[k]
            else:
                a = (kappa + 1.0) / (navg + kappa)
                for k in range(d):
                    avg[k] += a * (w[k] - avg[k])
        if every > 0 and (t + 1) % every == 0 and (t + 1) // every <= path.shape[0]:
            for k in range(d):  # the iterate w_t, every `every` steps (path.shape[0] rows)
                path[(t + 1) // every - 1, k] = w[k]
    return w, avg


def run_auc(
    X,
    y,
    *,
    epsilon,
    delta=1e-5,
    seed=0,
    D=1.0,
    window=None,
    eta=None,
    eta_scale=1.0,
    kappa=1.0,
    accounting="zcdp",
    schedule="constant",
    precond=None,
    avg_from=0,
    noise="blt",
    model_id="lab",
    R=1.0,
    cap=1.0,
    ptau=None,
    path_every=0,
    noise_scale=1.0,
):
    """One private (or ``epsilon=None``) run; returns (served weights, last iterate, info).

    ``path_every=k > 0`` also records the iterates ``w_k, w_2k, …`` (``info["path"]``, one row
    each). ``noise_scale`` multiplies σ after calibration: a *counterfactual* (the run is then
    not (ε, δ)-DP unless it is ≥ 1) to measure what a smaller noise would buy, or 0 for the same
    run without noise (same D, η, window).
    """
    X = clip_rows(np.asarray(X, dtype=float), R)
    Y = np.where(np.asarray(y, dtype=bool), 1.0, -1.0)
    n, d = X.shape
    B = window_rule(n) if window is None else int(window)
    mf = mechanism(n, B, D, epsilon, delta, accounting, d, noise=noise, R=R, cap=cap, ptau=ptau)
    if mf.private:
        G = noise_rows(mf, seed, n, d, model_id)
    else:
        G = np.zeros((n, d))
    E = mf.factorization.max_error(n)
    base = (
        step_size_rule(D, mf.sigma, E, d, 4.0 * R * min(1.0, cap), n) if eta is None else float(eta)
    )
    base *= eta_scale
    t = np.arange(1, n + 1, dtype=float)
    if schedule == "constant":
        etas = np.full(n, base)
    elif schedule.startswith("decay"):  # base·√(n/t) capped at cap·base, "decay:cap"
        cap = float(schedule.split(":")[1]) if ":" in schedule else 4.0
        etas = base * np.minimum(cap, np.sqrt(n / t))
    else:
        raise ValueError(schedule)
    P = np.ones(d) if precond is None else np.asarray(precond, dtype=float)
    k = -1.0 if kappa is None else float(kappa)
    path = np.zeros((n // path_every if path_every > 0 else 0, d))
    w, avg = _auc_kernel(
        X,
        Y,
        G,
        mf.sigma * float(noise_scale),
        etas,
        B,
        float(D),
        k,
        P,
        int(avg_from),
        float(cap),
        math.inf if ptau is None else float(ptau),
        path,
        int(path_every),
    )
    info = {"sigma": mf.sigma, "sens": mf.sensitivity, "eta": base, "B": B, "D": D, "path": path}
    return avg, w, info


_DATA: dict = {}


def split(name: str, k: int, max_records=None):
    """Split k of a dataset: ``prepare(name, seed=2020 + k)`` (scaler on its calibration block);
    returns (X_stream, y_stream, X_test clipped, y_test, X_cal scaled, y_cal)."""
    from stream_dp.datasets import prepare

    key = (name, k, max_records)
    if key not in _DATA:
        p = prepare(name, seed=2020 + k, max_records=max_records)
        X_cal = p.scaler.transform(p.dataset.X[p.split.calibration])
        _DATA[key] = (
            p.X_stream,
            p.y_stream,
            clip_rows(p.X_test),
            p.y_test,
            X_cal,
            p.dataset.y[p.split.calibration],
        )
    return _DATA[key]


def auc_of(w, Xt, yt) -> float:
    from stream_dp.metrics import roc_auc

    return float(roc_auc(Xt @ w, yt))


def grid(name, epsilons, splits=5, **kw):
    """Median (and all) test AUCs over splits k = 0..splits-1, noise seed k."""
    out = {}
    for eps in epsilons:
        aucs = []
        for k in range(splits):
            Xs, ys, Xt, yt, _, _ = split(name, k)
            avg, _, _ = run_auc(Xs, ys, epsilon=eps, seed=k, **kw)
            aucs.append(auc_of(avg, Xt, yt))
        out[eps] = aucs
    return out


def show(label, res):
    cells = " ".join(f"{np.median(v):.3f}" for v in res.values())
    lows = " ".join(f"{np.min(v):.3f}" for v in res.values())
    print(f"{label:44s} med {cells} | min {lows}", flush=True)


# -- metric learning ------------------------------------------------------------------------------

IRRELEVANT_SEED = 20  # the appended columns' generator: fixed, so every split sees the same data


def with_irrelevant(name: str, extra: int = 20):
    """The shipped dataset with ``extra`` independent N(0, 1) numeric columns appended (the
    scaler then standardises them on the calibration block, like the real numeric columns)."""
    import dataclasses

    from stream_dp.datasets import load_dataset

    ds = load_dataset(name)
    rng = np.random.default_rng(IRRELEVANT_SEED)
    Z = rng.normal(size=(ds.n, extra))
    return dataclasses.replace(
        ds,
        X=np.hstack([ds.X, Z]),
        feature_names=ds.feature_names + tuple(f"noise_{i}" for i in range(extra)),
        numeric=np.concatenate([ds.numeric, np.ones(extra, dtype=bool)]),
    )


_MDATA: dict = {}


def metric_split(name: str, k: int, extra: int = 20):
    from stream_dp.datasets import prepare

    key = (name, k, extra)
    if key not in _MDATA:
        ds = with_irrelevant(name, extra) if extra else name
        p = prepare(ds, seed=2020 + k)
        _MDATA[key] = (clip_rows(p.X_stream), p.y_stream, clip_rows(p.X_test), p.y_test)
    return _MDATA[key]


def knn_accuracy(W, Xs, ys, Xt, yt, k=3) -> float:
    from sklearn.neighbors import KNeighborsClassifier

    W = np.asarray(W, dtype=float)
    if W.ndim == 1:
        L = np.sqrt(np.clip(W, 0.0, None))
        A, B = Xs * L, Xt * L
    else:
        lam, V = np.linalg.eigh((W + W.T) / 2)
        L = V * np.sqrt(np.clip(lam, 0.0, None))
        A, B = Xs @ L, Xt @ L
    knn = KNeighborsClassifier(n_neighbors=k).fit(A, ys)
    return float(np.mean(knn.predict(B) == yt))


@njit(cache=True)
def _diag_kernel(X, Y, G, sigma, eta, B, D, kappa, w0, cap, tau):
    n, d = X.shape
    w = w0.copy()
    avg = w0.copy()
    g = np.zeros(d)
    v = np.zeros(d)
    for t in range(n):
        for k in range(d):
            g[k] = 0.0
        lo = t - B
        if lo < 0:
            lo = 0
        for j in range(lo, t):
            c = 1.0 if Y[t] == Y[j] else -1.0
            nv = 0.0
            for k in range(d):
                dk = X[t, k] - X[j, k]
                v[k] = dk * dk
                nv += v[k] * v[k]
            nv = math.sqrt(nv)
            scale = 1.0 if nv <= tau else tau / nv  # the pair feature δ∘δ clipped to τ
            u = 0.0
            for k in range(d):
                v[k] *= scale
                u += w[k] * v[k]
            sl = 1.0 / (1.0 + math.exp(c * (1.0 - u)))  # -dphi(c(1 - u))
            if sl > cap:
                sl = cap
            coef = sl * c  # ∇_w φ(c(1 − wᵀv)) = −φ'·c·v
            for k in range(d):
                g[k] += coef * v[k]
        nrm = 0.0
        for k in range(d):
            w[k] -= eta * (g[k] / B + sigma * G[t, k])
            if w[k] < 0.0:  # projection on the cone w ≥ 0, then on the ball
                w[k] = 0.0
            nrm += w[k] * w[k]
        nrm = math.sqrt(nrm)
        if nrm > D:
            for k in range(d):
                w[k] *= D / nrm
        a = (kappa + 1.0) / (t + 1 + kappa)
        for k in range(d):
            avg[k] += a * (w[k] - avg[k])
    return w, avg


def metric_bounds(R, D, cap, tau=None):
    """Pair-term bounds of the (capped) logistic metric loss, full or diagonal W.

    One-sided ``‖s·δδᵀ‖_F = s‖δ‖² ≤ 4R²·s`` (diagonal: ``‖s·δ∘δ‖ ≤ s‖δ‖²``, the same bound);
    two-sided (a changed label flips c, the pairing stays) twice that; ``s ≤ min(cap, s_max)``.
    """
    from stream_dp.privacy.influence import PairTermBounds

    b = pair_term_bounds("metric", R, D)
    one = min(b.one_sided, 4.0 * R * R * cap)
    if tau is not None:  # pair features clipped to ‖v‖ ≤ τ (< 4R²)
        one = min(one, tau * min(cap, b.one_sided / (4.0 * R * R)))
    return PairTermBounds(one, 2.0 * one)


def run_diag_metric(
    Xs,
    ys,
    *,
    epsilon,
    delta=1e-5,
    seed=0,
    D=1.0,
    R=1.0,
    window=None,
    eta_scale=1.0,
    kappa=1.0,
    init="euclidean",
    cap=1.0,
    accounting="gdp",
    noise_share=0.5,
    tau=None,
):
    """Private diagonal Mahalanobis metric ``W = diag(w)``, ``w ≥ 0``, ``‖w‖ ≤ D``.

    ``init="euclidean"`` starts (and centres the noise) at ``w₀ = (D/√d)·1`` — plain
    Euclidean distance, scaled onto the sphere — ``"zero"`` at 0. η puts the final iterate's
    accumulated noise at ``noise_share·D`` in norm (the AUC rule has ½).
    """
    X = clip_rows(np.asarray(Xs, dtype=float), R)
    labels = {v: i for i, v in enumerate(sorted(set(np.asarray(ys).tolist())))}
    Y = np.array([labels[v] for v in np.asarray(ys).tolist()], dtype=np.int64)
    n, d = X.shape
    B = window_rule(n) if window is None else int(window)
    tau_v = 4.0 * R * R if tau is None else float(tau)
    pattern = window_pattern(B, B, metric_bounds(R, D, cap, tau_v))
    rho = None
    if epsilon is not None:
        rho = (
            rho_budget(epsilon, delta) if accounting == "gdp" else rho_from_epsilon(epsilon, delta)
        )
    mf = MFMechanism(make_factorization("blt", n), pattern, n, rho, d)
    G = noise_rows(mf, seed, n, d, "lab-diag") if mf.private else np.zeros((n, d))
    E = mf.factorization.max_error(n)
    if mf.private:
        eta = noise_share * D / (mf.sigma * math.sqrt(d * E))
    else:
        eta = D / (4.0 * R * R * math.sqrt(n))
    eta *= eta_scale
    w0 = np.full(d, D / math.sqrt(d)) if init == "euclidean" else np.zeros(d)
    w, avg = _diag_kernel(X, Y, G, mf.sigma, eta, B, float(D), float(kappa), w0, float(cap), tau_v)
    return avg, w, {"sigma": mf.sigma, "sens": mf.sensitivity, "eta": eta}


def fisher_diag_metric(
    Xs,
    ys,
    *,
    epsilon,
    delta=1e-5,
    seed=0,
    R=0.5,
    count_weight=None,
    floor=None,
    accounting="gdp",
    threshold=None,
    power=1.0,
):
    """A diagonal metric from privately released class-conditional sums (binary labels).

    The stream of per-record statistics ``v(z) = (λ·e_y, e_y ⊗ x, e_y ⊗ (x∘x))`` is released as
    prefix sums with BLT correlated noise (one Gaussian mechanism over the stream: each record
    enters one step, so its influence pattern is the single entry ``Δ_v``); the weights
    ``w_k = (μ₊ₖ − μ₋ₖ)² / (pooled within-class variance_k + floor)`` are post-processing of the
    sums at the horizon. Replace-one: different classes touch disjoint blocks,
    ``‖v(z) − v(z′)‖² ≤ 2(λ² + R² + R⁴)``; the same class ``≤ 4R² + 2R⁴`` (``‖x∘x‖ ≤ ‖x‖²``
    and the difference of two non-negative vectors is at most √2 times the larger norm).
    """
    X = clip_rows(np.asarray(Xs, dtype=float), R)
    y = np.asarray(ys, dtype=bool)
    n, d = X.shape
    lam = R * R if count_weight is None else float(count_weight)
    sens = math.sqrt(max(2.0 * (lam * lam + R * R + R**4), 4.0 * R * R + 2.0 * R**4))
    size = 2 * (1 + 2 * d)
    stats = np.zeros(size)
    for c, mask in ((0, ~y), (1, y)):
        off = c * (1 + 2 * d)
        stats[off] = lam * mask.sum()
        stats[off + 1 : off + 1 + d] = X[mask].sum(0)
        stats[off + 1 + d : off + 1 + 2 * d] = (X[mask] ** 2).sum(0)
    noise_sd = 0.0
    if epsilon is not None:
        rho = (
            rho_budget(epsilon, delta) if accounting == "gdp" else rho_from_epsilon(epsilon, delta)
        )
        mf = MFMechanism(make_factorization("blt", n), np.array([sens]), n, rho, size)
        noise = mf.sigma * noise_rows(mf, seed, n, size, "lab-fisher").sum(0)
        stats = stats + noise
        noise_sd = mf.prefix_noise_std(n)  # public: per-coordinate std of the released sums
    mus, vars_, cnts = [], [], []
    for c in (0, 1):
        off = c * (1 + 2 * d)
        cnt = max(stats[off] / lam, 1.0)
        mu = stats[off + 1 : off + 1 + d] / cnt
        var = np.maximum(stats[off + 1 + d : off + 1 + 2 * d] / cnt - mu * mu, 0.0)
        mus.append(mu), vars_.append(var), cnts.append(cnt)
    pooled = (cnts[0] * vars_[0] + cnts[1] * vars_[1]) / (cnts[0] + cnts[1])
    fl = (R * R / d) * 0.1 if floor is None else float(floor)
    diff2 = (mus[1] - mus[0]) ** 2
    if threshold is not None:
        # The noise's own contribution to (μ̂₊ − μ̂₋)² is ≈ noise_sd²(1/n₊² + 1/n₋²), public up
        # to the released counts: subtract `threshold` times it and keep the positive part, so
        # that under pure noise almost every feature keeps the Euclidean weight alone.
        v = noise_sd**2 * (1.0 / cnts[0] ** 2 + 1.0 / cnts[1] ** 2)
        f = np.maximum(diff2 - threshold * v, 0.0) / (pooled + fl)
        f = f**power
        tot = f.sum()
        w = np.ones(d) if tot <= 0 else 1.0 + d * f / tot
        return w, {"sens": sens, "active": int((f > 0).sum())}
    w = diff2 / (pooled + fl)
    return w, {"sens": sens}


# -- the proposed rule ----------------------------------------------------------------------------

#: Proposed defaults (issue 20): the data radius (records clipped to ‖x‖ ≤ R) and the slope cap
#: of the logistic pair loss.
PROPOSED_R = 0.5
PROPOSED_CAP = 0.5


def capacity(
    n: int,
    d: int,
    epsilon: float,
    delta: float = 1e-5,
    window: int | None = None,
    R: float = PROPOSED_R,
    cap: float = PROPOSED_CAP,
) -> float:
    """``z = n·(T/2) / (σ·√(E_n)·√d)``: the noise-free gradient sum of a stream whose every step
    carried half the largest pair term T, in units of the final prefix noise's norm. A function
    of (n, d, ε, δ) and the mechanism only — public — and scale-free (σ ∝ T ∝ R)."""
    B = window_rule(n) if window is None else int(window)
    mf = mechanism(n, B, 1.0, epsilon, delta, "gdp", d, R=R, cap=cap)
    return n * (mf.pattern[0] / 2.0) / (mf.prefix_noise_std(n) * math.sqrt(d))


def radius_rule(z: float, R: float = PROPOSED_R) -> float:
    """``R·D = max(1/8, z²/200)``: the linear regime (small R·D: every valid pair's gradient at
    the cap) while the noise is large, the logistic regime (large R·D: the loss refines the
    direction) once the stream's capacity z allows it."""
    return max(0.125, z * z / 200.0) / R


def run_proposed(X, y, *, epsilon, delta=1e-5, seed=0, model_id="lab", **knobs):
    n, d = np.asarray(X).shape
    D = 1e4 if epsilon is None else radius_rule(capacity(n, d, epsilon, delta))
    return run_auc(
        X,
        y,
        epsilon=epsilon,
        delta=delta,
        seed=seed,
        D=D,
        R=PROPOSED_R,
        cap=PROPOSED_CAP,
        accounting="gdp",
        model_id=model_id,
        **knobs,
    )

"""Sensitivity audits: on neighbouring datasets (one record replaced) with a shared seed, the
distance between the two NOISELESS outputs never exceeds the sensitivity the noise is calibrated
to — over random neighbours and adversarial ones (the differing record first, last, at extreme
norm, with its label flipped)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from stream_dp.offline import (
    DPEGD,
    DPGDC,
    DPGDC2,
    DPGDSC,
    DPPDML,
    GradPerturb,
    OffPairC,
    OffPairStrC,
    PairwiseSGD,
    random_pair_graph,
)

N, DIM, R = 14, 3, 0.6
TOL = 1e-9


def _dataset(task, seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(N, DIM)) * 0.5
    y = rng.integers(0, 2, N) if task == "auc" else rng.integers(0, 3, N)
    return X, y


def _neighbours(X, y, task, seed):
    """Random and adversarial replace-one neighbours."""
    rng = np.random.default_rng(1000 + seed)
    n_labels = 2 if task == "auc" else 3
    out = []
    for i in (0, N - 1, N // 2, *rng.integers(0, N, 8)):
        i = int(i)
        cands = []
        x = X[i]
        unit = x / max(np.linalg.norm(x), 1e-12)
        flipped = (y[i] + 1) % n_labels
        cands.append((-unit * R, flipped))  # extreme norm, opposite direction, label flipped
        cands.append((unit * 50 * R, flipped))  # far outside the ball: clipped to R
        cands.append((x, flipped))  # same features, label flipped
        cands.append((rng.normal(size=DIM), int(rng.integers(0, n_labels))))  # random
        for xn, yn in cands:
            X2, y2 = X.copy(), y.copy()
            X2[i], y2[i] = xn, yn
            out.append((i, X2, y2))
    return out


def _stat(est, X, y):
    Xc, Y = est._prepare(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        stat, sens, _ = est._statistic(Xc, Y, est._make_noise())
    return stat, sens


def _maker(cls, **params):
    """``(task, seed) -> estimator``: the same secret on both neighbours (a reproducible run)."""
    return lambda t, s: cls(**{"task": t, **params}, data_radius=R, seed=s, reproducible=True)


OUTPUT_MAKERS = {
    # R = 0.6, α = 2 ⇒ T1 = max(⌈16(4R²+α)/α²⌉, 7) = 14 = n: use α = 4 so that T1 = 7 < n.
    "OffPairStrC-paper": _maker(OffPairStrC, alpha=4.0),
    "OffPairStrC-certified": _maker(OffPairStrC, alpha=0.5, warmup=3, sensitivity="certified"),
    "OffPairC-certified": _maker(OffPairC, alpha=0.7, warmup=2, sensitivity="certified"),
    "OffPairC-paper": _maker(OffPairC, alpha=4.0),
    "DPGDSC": _maker(DPGDSC, alpha=0.3, n_iter=40),
    "DPGDC": _maker(DPGDC, n_iter=25, eta=1.0),
    "PairwiseSGD-l2": _maker(PairwiseSGD, n_iter=40, eta=0.2),
    "PairwiseSGD-nuclear": _maker(
        PairwiseSGD, task="metric", constraint="nuclear", n_iter=30, eta=0.3
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize(
    "name,task",
    [(n, t) for n in sorted(OUTPUT_MAKERS) for t in ("auc", "metric")
     if not (n == "PairwiseSGD-nuclear" and t == "auc")],  # nuclear ball: metric only
)  # fmt: skip
def test_output_perturbation_sensitivity(name, task):
    worst = 0.0
    for seed in range(5):
        X, y = _dataset(task, seed)
        est = OUTPUT_MAKERS[name](task, seed)
        w, sens = _stat(est, X, y)
        assert sens > 0
        for _, X2, y2 in _neighbours(X, y, task, seed):
            w2, sens2 = _stat(est, X2, y2)
            assert sens2 == sens  # the calibration never depends on record values
            dist = float(np.linalg.norm(w - w2))
            assert dist <= sens * (1 + TOL), (name, dist, sens)
            worst = max(worst, dist / sens)
    assert worst > 0  # the neighbours did move the output (the audit is not vacuous)


@pytest.mark.parametrize("task", ["auc", "metric"])
def test_offpair_paper_bound_with_minimal_warmup_and_strong_alpha(task):
    """Lemma 4's regime where T1 is at its floor of 7 and α dominates: the bound still holds."""
    for seed in range(2):
        X, y = _dataset(task, seed)
        est = OffPairStrC(task=task, alpha=16.0, data_radius=1.0, seed=seed, reproducible=True)
        w, sens = _stat(est, X, y)
        for _, X2, y2 in _neighbours(X, y, task, seed):
            assert np.linalg.norm(w - _stat(est, X2, y2)[0]) <= sens * (1 + TOL)


@pytest.mark.slow
@pytest.mark.parametrize("task", ["auc", "metric"])
@pytest.mark.parametrize("delta", [1e-3, 0.0])
def test_dpegd_epoch_sensitivity(task, delta):
    """Each epoch's average moves by ≤ 4Gη_i when its part holds the differing record, from the
    same (noisy, keyed) start; the other parts' averages do not move at all."""
    for seed in range(5):
        X, y = _dataset(task, seed)
        est = DPEGD(task=task, delta=delta, eta=0.9, data_radius=R, seed=seed, reproducible=True)
        Xc, Y = est._prepare(X, y)
        est.budget_ = est._new_budget()
        noise = est._make_noise()
        _, epochs, C = est._run(Xc, Y, noise, add_noise=True)
        parts = est._partition(len(Y), noise)
        loss = est._loss()
        for i, X2, y2 in _neighbours(X, y, task, seed):
            Xc2, Y2 = est._prepare(X2, y2)
            for e, part in zip(epochs, parts, strict=True):
                avg2 = est._epoch_average(loss, C, Xc2[part], Y2[part], e["start"], e["eta"])
                dist = float(np.linalg.norm(avg2 - e["average"]))
                if i in part:
                    assert dist <= e["sensitivity"] * (1 + TOL)
                else:
                    assert dist == 0.0


@pytest.mark.parametrize("task", ["auc", "metric"])
@pytest.mark.parametrize("cls", [DPGDC2, GradPerturb])
def test_gradient_query_sensitivity_along_the_trajectory(cls, task):
    """Adaptive composition: at every iterate the algorithm actually visited, the gradient it
    releases moves by at most 4G/n on any neighbour."""
    for seed in range(3):
        X, y = _dataset(task, seed)
        est = _maker(cls, epsilon=1.0, delta=1e-3, n_iter=8)(task, seed)
        est._keep_trace = True
        est.fit(X, y)
        sens = est.accountant.ledger[0].sensitivity
        Xc, Y = est._prepare(X, y)
        for _, X2, y2 in _neighbours(X, y, task, seed):
            Xc2, Y2 = est._prepare(X2, y2)
            for w in est.trace_:
                diff = np.linalg.norm(est._query(w, Xc, Y) - est._query(w, Xc2, Y2))
                assert diff <= sens * (1 + TOL)


def _batches(est, K, epoch):
    order = est._make_noise().generator(epoch, "sampling").permutation(K)
    return [order[s : s + est.batch_size] for s in range(0, K, est.batch_size)]


@pytest.mark.parametrize("seed", range(3))
def test_dppdml_node_replacement_sensitivity(seed):
    """κ = max degree: replacing one individual (features, and every label of its pairs) moves
    each batch gradient by ≤ κ·d'·2h/|B| in ℓ1, and the whole epoch by ≤ the same in total
    (the parallel-composition claim behind ε' per epoch)."""
    rng = np.random.default_rng(seed)
    n, d = 20, 3
    X, y = rng.normal(size=(n, d)), rng.integers(0, 2, n)
    pairs, labels = random_pair_graph(y, density=2.0, seed=seed)
    est = DPPDML(epsilon=1.0, n_components=2, clip=0.3, batch_size=8, margin=1.5,
                 pair_graph_public=True, seed=seed, reproducible=True)  # fmt: skip
    est.fit(X, pairs=pairs, pair_labels=labels)
    sens = est.sensitivity_
    Xc, p, yl = est._prepare_pairs(X, pairs, labels)
    W = rng.normal(size=(2, d))
    degree = np.bincount(pairs.ravel(), minlength=n)
    for s in (int(np.argmax(degree)), *rng.integers(0, n, 3)):
        for xs in (-Xc[s], rng.normal(size=d) * 3, Xc[s] * 0):
            X2 = Xc.copy()
            X2[s] = xs
            y2 = yl.copy()
            touched = (p[:, 0] == s) | (p[:, 1] == s)
            y2[touched] = 1 - y2[touched]
            X2 = est._prepare_pairs(X2, p, y2)[0]
            for epoch in (1, 2):
                total = 0.0
                for batch in _batches(est, len(p), epoch):
                    g1 = est._batch_gradient(W, Xc, p, yl, batch)[0]
                    g2 = est._batch_gradient(W, X2, p, y2, batch)[0]
                    diff = float(np.abs(g1 - g2).sum())
                    assert diff <= sens * (1 + TOL)
                    total += diff
                assert total <= degree[s] * 2 * 0.3 * 2 / 8 * (1 + TOL) <= sens * (1 + TOL)


def test_dppdml_edge_replacement_with_appendix_kappa():
    """Li's κ' (Appendix A): changing the data of κ' edges moves a batch gradient by ≤ κ'·Δg."""
    rng = np.random.default_rng(5)
    n, d = 16, 3
    X, y = rng.normal(size=(n, d)), rng.integers(0, 2, n)
    pairs, labels = random_pair_graph(y, density=1.5, seed=2)
    est = DPPDML(epsilon=1.0, n_components=3, clip=0.4, batch_size=6, kappa="appendix",
                 pair_graph_public=True, seed=1, reproducible=True)  # fmt: skip
    est.fit(X, pairs=pairs, pair_labels=labels)
    kappa, sens = est.kappa_, est.sensitivity_
    Xc, p, yl = est._prepare_pairs(X, pairs, labels)
    W = rng.normal(size=(3, d))
    from stream_dp.losses import ContrastiveLoss

    loss = ContrastiveLoss(est.margin)
    for batch in _batches(est, len(p), 1):
        D = Xc[p[batch, 0]] - Xc[p[batch, 1]]
        g1 = loss.clip_rows(loss.per_pair_gradients(W, D, yl[batch]), est.clip, norm=1)
        D2, y2 = D.copy(), yl[batch].copy()
        k = min(kappa, len(batch))
        D2[:k] = rng.normal(size=(k, d)) * 4
        y2[:k] = 1 - y2[:k]
        g2 = loss.clip_rows(loss.per_pair_gradients(W, D2, y2), est.clip, norm=1)
        diff = float(np.abs(g1.sum(0) - g2.sum(0)).sum()) / est.batch_size
        assert diff <= sens * (1 + TOL)


@pytest.mark.parametrize("seed", range(3))
def test_dppdml_record_replacement_sensitivity_with_class_labels(seed):
    """``fit(X, y)``: the model's own graph is the same on neighbouring datasets (it depends on
    n and the secret only); replacing one record — its features and its class, hence the labels
    of all its pairs — moves each batch gradient by ≤ the calibrated ℓ1 sensitivity."""
    rng = np.random.default_rng(seed)
    n, d = 24, 3
    X, y = rng.normal(size=(n, d)), rng.integers(0, 3, n)
    est = DPPDML(epsilon=1.0, n_components=2, clip=0.3, batch_size=8, margin=1.5,
                 seed=seed, reproducible=True).fit(X, y)  # fmt: skip
    sens = est.sensitivity_
    Xc, p, yl = est._pairs_from_classes(X, y, est._make_noise())
    W = rng.normal(size=(2, d))
    worst = 0.0
    for s in range(n):
        for xs, ys in ((-X[s] * 5, (y[s] + 1) % 3), (rng.normal(size=d), (y[s] + 2) % 3)):
            X2, y2 = X.copy(), y.copy()
            X2[s], y2[s] = xs, ys
            Xc2, p2, yl2 = est._pairs_from_classes(X2, y2, est._make_noise())
            np.testing.assert_array_equal(p2, p)  # the graph does not look at the data
            for batch in _batches(est, len(p), 1):
                g1 = est._batch_gradient(W, Xc, p, yl, batch)[0]
                g2 = est._batch_gradient(W, Xc2, p, yl2, batch)[0]
                diff = float(np.abs(g1 - g2).sum())
                assert diff <= sens * (1 + TOL)
                worst = max(worst, diff / sens)
    assert worst > 0

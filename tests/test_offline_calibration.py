"""Noise calibration of every offline algorithm: the ledger's σ/b is the paper's formula
(``docs/algorithms.md``), the release is Π_C(noiseless statistic + the recorded draw), and the
draws have that scale."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from conftest import PURE_OFFLINE, SUPERVISED_OFFLINE

from stream_dp.offline import (
    DPGDC2,
    DPPDML,
    random_pair_graph,
)
from stream_dp.privacy.events import ApproxDPEvent, GaussianEvent, LaplaceEvent
from stream_dp.privacy.noise import KeyedNoise

N, D_FEAT, R = 24, 3, 0.5


class RecordingNoise(KeyedNoise):
    """KeyedNoise that remembers every Gaussian/Laplace array it hands out."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.draws: list[tuple[str, str, float, np.ndarray]] = []

    def gaussian(self, step, shape, sigma, purpose="release"):
        out = super().gaussian(step, shape, sigma, purpose)
        self.draws.append(("gaussian", purpose, sigma, out))
        return out

    def laplace(self, step, shape, scale, purpose="release"):
        out = super().laplace(step, shape, scale, purpose)
        self.draws.append(("laplace", purpose, scale, out))
        return out


def _data(task, seed=0, n=N):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, D_FEAT))
    y = rng.integers(0, 2, n) if task == "auc" else rng.integers(0, 3, n)
    return X, y


def _fit_recording(est, X, y):
    rec = RecordingNoise(est.seed, est.model_id)
    est._make_noise = lambda: rec
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        est.fit(X, y)
    return rec


def _p(task):
    return D_FEAT if task == "auc" else D_FEAT**2


def _G(task, alpha=0.0, radius=1.0, center_radius=None):
    """Logistic G = 4R (AUC) or 4R² (metric), plus α·(D or diam) for a regulariser
    (``docs/algorithms.md``, *Conventions shared by all
    learners*)."""
    base = 4 * R if task == "auc" else 4 * R**2
    return base + alpha * (radius if center_radius is None else center_radius)


LN = math.log(1.25 / 1e-3)


def _expected(name, task, est, delta):
    """The paper's scale (σ for δ > 0, Laplace b for δ = 0) from the fitted hyper-parameters."""
    n, eps = N, est.epsilon
    if name == "OffPairStrC":
        G, a = _G(task, est.alpha), est.alpha
        sens = 8 * G * math.log(n) / (a * n)
        if delta:
            return math.sqrt(128 * G**2 * math.log(n) ** 2 * LN / (a**2 * n**2 * eps**2))
        return math.sqrt(_p(task)) * sens / eps
    if name == "OffPairC":
        diam = 2.0 if task == "auc" else math.sqrt(2.0)
        a = est.alpha_
        G = _G(task, a, center_radius=diam)
        if delta:
            return math.sqrt(128 * G**2 * math.log(n) ** 2 * LN / (a**2 * n**2 * eps**2))
        return math.sqrt(_p(task)) * 8 * G * math.log(n) / (a * n * eps)
    if name == "DPGDSC":
        G, a = _G(task, est.alpha), est.alpha
        if delta:
            return 8 * math.sqrt(2 * LN) * G / (a * n * eps)
        return 8 * G * math.sqrt(_p(task)) / (a * n * eps)
    if name == "DPGDC":
        G, T, eta = _G(task), est.n_iter_, est.eta_
        if delta:
            return 4 * math.sqrt(2 * LN) * G * T * eta / (n * eps)
        return 4 * G * eta * T * math.sqrt(_p(task)) / (n * eps)
    if name == "DPEGD":
        G, eta_k = _G(task), est.epochs_[-1]["eta"]
        if delta:
            return 4 * math.sqrt(2 * LN) * G * eta_k / eps
        return 4 * G * eta_k * math.sqrt(_p(task)) / eps
    if name == "DPGDC2":
        return 4 * _G(task) * math.sqrt(1.25 * est.n_iter_ * math.log(1 / delta)) / (n * eps)
    if name == "GradPerturb":
        return 8 * _G(task) * math.sqrt(est.n_iter_ * math.log(1 / delta)) / (n * eps)
    if name == "PairwiseSGD":
        T, eta = est.n_iter_, est.eta_
        G = 2 * R if task == "auc" else 4 * R**2  # hinge losses
        eq5 = (8 * eta**2 * G**2 * math.log(2.5 / delta) / eps**2) * (
            T + 3 * T**2 * math.log(math.e * T) ** 2 * math.log(2 / delta) ** 2 / n**2
        )
        return math.sqrt(math.e * eq5)  # eq. (5) with the e of eqs. (3)/(9); see offline.yang
    raise AssertionError(name)


#: The settings these tests give each supervised estimator (the rest: its defaults).
SETTINGS = {
    "OffPairStrC": dict(alpha=2.0),
    "DPGDSC": dict(alpha=0.5, n_iter=15),
    "DPGDC": dict(n_iter=6),
    "DPGDC2": dict(n_iter=5),
    "GradPerturb": dict(n_iter=4),
    "PairwiseSGD": dict(n_iter=2 * N),
}


def _make(name, task, delta, seed):
    common = dict(task=task, epsilon=0.7, delta=delta, data_radius=R, seed=seed, reproducible=True)
    return SUPERVISED_OFFLINE[name](**SETTINGS.get(name, {}), **common)


#: Where each estimator's noise enters: its output, or every gradient.
GRADIENT = ["DPGDC2", "GradPerturb"]
OUTPUT = [name for name in SUPERVISED_OFFLINE if name not in GRADIENT]
PURE = PURE_OFFLINE
CASES = [
    (name, task, delta)
    for name in OUTPUT + GRADIENT
    for task in ("auc", "metric")
    for delta in (1e-3, 0.0)
    if delta or name in PURE
]


@pytest.mark.parametrize("name,task,delta", CASES)
def test_ledger_scale_is_the_papers_formula(name, task, delta):
    X, y = _data(task)
    est = _make(name, task, delta, seed=3)
    _fit_recording(est, X, y)
    events = est.accountant.ledger
    expected = _expected(name, task, est, delta)
    if name in GRADIENT:
        assert len(events) == est.n_iter_
        assert all(isinstance(e, GaussianEvent) for e in events)
        assert all(e.sigma == pytest.approx(expected, rel=1e-12) for e in events)
        assert all(e.sensitivity == pytest.approx(4 * _G(task) / N) for e in events)
        assert not est.sigma_raised_
    else:
        assert len(events) == 1
        (ev,) = events
        if delta:
            assert isinstance(ev, ApproxDPEvent)
            assert (ev.epsilon, ev.delta) == (est.epsilon, delta)
            assert ev.scale == pytest.approx(expected, rel=1e-12)
        else:
            assert isinstance(ev, LaplaceEvent)
            assert ev.scale == pytest.approx(expected, rel=1e-12)
            assert est.accountant.cost(ev) <= est.epsilon
    eps, spent_delta = est.accountant.spent()
    assert eps <= est.epsilon and spent_delta <= delta


@pytest.mark.parametrize("name,task,delta", [c for c in CASES if c[0] in OUTPUT])
def test_release_is_projection_of_statistic_plus_recorded_draw(name, task, delta):
    X, y = _data(task, seed=1)
    est = _make(name, task, delta, seed=11)
    rec = _fit_recording(est, X, y)
    releases = [d for d in rec.draws if d[1] == "release"]
    from stream_dp.offline.base import make_constraint

    C = make_constraint(task, 1.0, getattr(est, "constraint", "default"))
    if name == "DPEGD":
        # Each epoch: next start = Π_C(epoch average + that epoch's draw); the last is released.
        trace = est._epoch_trace
        assert len(releases) == len(trace)
        for i, e in enumerate(trace):
            out = C.project(e["average"] + releases[i][3])
            nxt = trace[i + 1]["start"] if i + 1 < len(trace) else est.private_weights
            np.testing.assert_allclose(out, nxt, atol=1e-12)
        stat = trace[-1]["average"]
    else:
        stat = _make(name, task, delta, seed=11)._noiseless_fit(X, y)
    kind = "gaussian" if delta else "laplace"
    assert releases and all(d[0] == kind for d in releases)
    _, _, scale, draw = releases[-1]
    assert scale == pytest.approx(_expected(name, task, est, delta), rel=1e-12)
    np.testing.assert_allclose(est.private_weights, C.project(stat + draw), atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name,delta",
    [(n, d) for n in OUTPUT for d in (1e-3, 0.0) if d or n in PURE],
)  # fmt: skip
def test_empirical_noise_scale_over_many_seeds(name, delta):
    X, y = _data("auc", seed=2)
    z = []
    for seed in range(150):
        est = _make(name, "auc", delta, seed=seed)
        rec = _fit_recording(est, X, y)
        (_, _, scale, draw) = [d for d in rec.draws if d[1] == "release"][-1]
        assert scale == pytest.approx(_expected(name, "auc", est, delta), rel=1e-12)
        z.append(draw / scale)
    z = np.concatenate(z)
    target = 1.0 if delta else math.sqrt(2.0)  # Laplace(b) has standard deviation √2·b
    assert np.std(z) == pytest.approx(target, rel=0.08)
    assert abs(np.mean(z)) < 0.15


@pytest.mark.parametrize("name", GRADIENT)
def test_gradient_noise_enters_each_step_with_the_ledger_sigma(name):
    X, y = _data("auc", seed=4)
    z = []
    for seed in range(60):
        est = _make(name, "auc", 1e-3, seed=seed)
        est.set_params(model_radius=1e6, eta=0.01)  # no projection: w_t = w − η(g + ζ)
        est._keep_trace = True
        rec = _fit_recording(est, X, y)
        draws = [d for d in rec.draws if d[1] == "gradient"]
        assert len(draws) == est.n_iter_
        sigma = est.accountant.ledger[0].sigma
        assert all(d[2] == sigma for d in draws)
        # Reconstruct ζ_1 from the first step: w_1 = w_0 − η(∇L(w_0) + ζ_1).
        from stream_dp.offline.inputs import prepare_features

        Xc = prepare_features(X, R)
        Yc = np.where(np.asarray(y) == 1, 1.0, -1.0)
        w0 = est.trace_[0]
        w1 = est.trace_[1]
        zeta = (w0 - w1) / est.eta_ - est._query(w0, Xc, Yc)
        np.testing.assert_allclose(zeta, draws[0][3], atol=1e-8 * (1 + sigma))
        z.append(np.concatenate([d[3] for d in draws]) / sigma)
    assert np.std(np.concatenate(z)) == pytest.approx(1.0, rel=0.08)


def test_dppdml_scale_and_draws():
    rng = np.random.default_rng(0)
    X, yy = rng.normal(size=(40, 3)), rng.integers(0, 2, 40)
    pairs, labels = random_pair_graph(yy, density=2.0, seed=0)
    z = []
    for seed in range(40):
        est = DPPDML(epsilon=1.5, n_components=2, clip=0.5, batch_size=20, n_epochs=3,
                     pair_graph_public=True, seed=seed, reproducible=True)  # fmt: skip
        rec = RecordingNoise(seed, est.model_id)
        est._make_noise = lambda rec=rec: rec
        est.fit(X, pairs=pairs, pair_labels=labels)
        kappa = max(np.bincount(pairs.ravel()))  # node degree
        b = kappa * (2 * 0.5 / 20) * 2 / (1.5 / 3)  # κ·Δg_r·d'/ε', ε' = ε/T_max
        assert est.kappa_ == kappa and est.noise_scale_ == pytest.approx(b, rel=1e-12)
        events = est.accountant.ledger
        assert len(events) == 3 and all(isinstance(e, LaplaceEvent) for e in events)
        assert all(est.accountant.cost(e) == pytest.approx(0.5) for e in events)
        assert est.accountant.spent()[0] <= 1.5
        draws = [d for d in rec.draws if d[1] == "gradient"]
        assert len(draws) == 3 * math.ceil(len(pairs) / 20)
        z.append(np.concatenate([d[3].ravel() for d in draws]) / b)
    assert np.std(np.concatenate(z)) == pytest.approx(math.sqrt(2.0), rel=0.08)


def test_dpgdc2_sigma_raised_when_paper_sigma_does_not_fit():
    """ε = 2, δ = 1/256: the paper's σ costs more than the tight zCDP budget: raise, not overrun."""
    rng = np.random.default_rng(0)
    n = 256
    X, y = rng.normal(size=(n, 2)), rng.integers(0, 2, n)
    est = DPGDC2(task="auc", epsilon=2.0, delta=1 / n, n_iter=3, seed=0, reproducible=True)
    with pytest.warns(RuntimeWarning, match="raised"):
        est.fit(X, y)
    paper = 4 * 4.0 * math.sqrt(1.25 * 3 * math.log(n)) / (n * 2.0)
    assert est.sigma_raised_ and est.noise_scale_ > paper
    assert est.accountant.spent()[0] <= 2.0

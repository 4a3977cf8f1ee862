"""Private operator metrics (``docs/privacy.md``, *Operator metrics*): σ against the formula,
the noise against the factorization's covariance (a σ/2 variant is caught), Δ against brute
force, the penalty's influence pattern audited on neighbouring streams, and the learner's one
charge under ``"gaussian-metrics"`` within its share."""

from __future__ import annotations

import json
import logging
import math
import re

import numpy as np
import pytest

from stream_dp.losses import get_loss
from stream_dp.online import OnPairMF, OnPairStrC
from stream_dp.operator_metrics import (
    MECHANISM,
    penalty_pattern,
    penalty_term_range,
)
from stream_dp.privacy import continual
from stream_dp.privacy.accountant import ZCDPAccountant
from stream_dp.privacy.blt import BLT
from stream_dp.privacy.continual import ContinualSums, series_sensitivity
from stream_dp.privacy.factorizations import BinaryTree
from stream_dp.privacy.mechanisms import gaussian_sigma_zcdp
from stream_dp.privacy.noise import KeyedNoise
from stream_dp.records import clip_norm

__all__: list[str] = []

N = 16
PATTERNS = [[1.0], [2.0, 1.0, 0.5], [1.0]]


def _factorization(kind: str):
    return BLT.fit(N) if kind == "blt" else BinaryTree()


# --- σ and the noise against the formulas ------------------------------------------------------


@pytest.mark.parametrize("kind", ["blt", "tree"])
def test_sigma_is_the_gaussian_formula_for_sqrt_k(kind: str) -> None:
    rho = 0.3
    sums = ContinualSums(_factorization(kind), PATTERNS, N, rho, KeyedNoise(1, "m"))
    # Each series is scaled to sensitivity 1, so the k = 3 of them have √3: σ = √3/√(2ρ).
    assert sums.sigma == pytest.approx(math.sqrt(3) / math.sqrt(2 * rho), rel=1e-8)
    assert sums.sigma == gaussian_sigma_zcdp(math.sqrt(3), rho * (1 - 1e-9))
    event = sums.event(5, MECHANISM)
    assert rho * (1 - 1e-8) <= ZCDPAccountant(1e-5).cost(event) == sums.charged_rho <= rho


class _HalvedNoise(ContinualSums):
    """A broken variant: it claims σ but adds σ/2."""

    def noise(self, t: int) -> np.ndarray:
        return super().noise(t) / 2


def _calibration_error(cls: type, kind: str, secrets: int = 1500) -> float:
    """Relative Frobenius distance between the empirical covariance of the released noise
    (scaled by the claimed σ·Δ_j) and ``(A·M)(A·M)ᵀ`` of the factorization, all series."""
    f = _factorization(kind)
    errors = []
    samples = np.empty((secrets, N, len(PATTERNS)))
    for s in range(secrets):
        sums = cls(f, PATTERNS, N, 0.5, KeyedNoise(10_000 + s, "m"))
        for t in range(1, N + 1):
            samples[s, t - 1] = sums.noise(t) / (sums.sigma * sums.sensitivities)
    AM = np.tril(np.ones((N, N))) @ f.noise_matrix(N)
    expected = AM @ AM.T
    for j in range(len(PATTERNS)):
        emp = samples[:, :, j].T @ samples[:, :, j] / secrets
        errors.append(np.linalg.norm(emp - expected) / np.linalg.norm(expected))
    return max(errors)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["blt", "tree"])
def test_noise_has_the_factorizations_covariance_and_half_sigma_is_caught(kind: str) -> None:
    # The released running sums are S(t) + σΔ_j·(A·M·Z)_t: their noise covariance must be
    # σ²Δ_j²·(A·M)(A·M)ᵀ. Sampling error at 1500 secrets is ≈ 0.05; σ/2 gives 0.75.
    assert _calibration_error(ContinualSums, kind) < 0.15
    assert _calibration_error(_HalvedNoise, kind) > 0.5


@pytest.mark.parametrize("kind", ["blt", "tree"])
def test_std_is_the_prefix_variance(kind: str) -> None:
    sums = ContinualSums(_factorization(kind), PATTERNS, N, 0.5, KeyedNoise(3, "m"))
    f = sums.factorization
    AM = np.tril(np.ones((N, N))) @ f.noise_matrix(N)
    for t in (1, 5, 8, N):
        var = float(AM[t - 1] @ AM[t - 1])
        assert sums.std(t) == pytest.approx(sums.sigma * sums.sensitivities * math.sqrt(var))


# --- Δ against brute force ---------------------------------------------------------------------


def _brute_force_sensitivity(f, pattern, n: int) -> float:
    """max over placements of ‖C·u‖ with u placed at step i (C ≥ 0: aligned signs are worst)."""
    C = f.strategy_matrix(n)
    assert np.all(C >= -1e-15)
    u = np.asarray(pattern, dtype=float)
    best = 0.0
    for i in range(n):
        d = np.zeros(n)
        m = min(len(u), n - i)
        d[i : i + m] = u[:m]
        best = max(best, float(np.linalg.norm(C @ d)))
    return best


@pytest.mark.parametrize("kind", ["blt", "tree"])
@pytest.mark.parametrize(
    "pattern",
    [
        penalty_pattern("fifo", 4, None, 4.0),
        penalty_pattern("all", None, 32, 3.0),
        [1.0],
    ],
    ids=["fifo4", "all", "counter"],
)
def test_series_sensitivity_is_the_brute_force_supremum(kind, pattern, monkeypatch) -> None:
    n = 32
    f = BLT.fit(n) if kind == "blt" else BinaryTree()
    brute = _brute_force_sensitivity(f, pattern, n)
    exact = series_sensitivity(f, pattern, n)
    assert brute <= exact <= brute * (1 + 1e-6)
    # The head + tail bound used for long patterns is an upper bound too.
    monkeypatch.setattr(continual, "_EXACT_PATTERN", 2)
    assert series_sensitivity(f, pattern, n) >= brute * (1 - 1e-12)


# --- the penalty's influence pattern on neighbouring streams -----------------------------------


def _penalties(task: str, models, X, Y, size: int) -> np.ndarray:
    """p_t = L̂_t(w_{t−1}) of a FIFO of ``size`` at fixed served models (0 where none is served)."""
    loss = get_loss(task)
    out = np.zeros(len(Y))
    for t in range(1, len(Y)):  # step t + 1 in 1-based terms; step 1 is never scored
        lo = max(0, t - size)
        out[t] = loss.value(models[t], X[t], Y[t], X[lo:t], Y[lo:t])
    return out


def test_the_harness_penalties_are_the_learners() -> None:
    rng = np.random.default_rng(0)
    n, S = 80, 8
    model = OnPairStrC(epsilon=4.0, horizon=n, features=3, buffer=S, seed=5, reproducible=True,
                       release_every=1)  # fmt: skip
    X = rng.normal(size=(n, 3))
    y = rng.random(n) < 0.5
    recorded, served = [0.0], [None]
    rec = model.regret.record
    model.regret.record = lambda p: (recorded.append(p), rec(p))
    for t in range(n):
        if t:
            served.append(model._state.served().copy())
        model.learn_one(X[t], bool(y[t]))
    Xc = np.array([clip_norm(x, 1.0) for x in X])
    Y = np.where(y, 1.0, -1.0)
    # The learner's loss adds (α/2)‖w − w0‖², the same on neighbouring streams: compare without.
    reg = [0.0] + [0.5 * model.loss.alpha * float(np.sum(model.loss._shift(w) ** 2))
                   for w in served[1:]]  # fmt: skip
    ours = _penalties("auc", served, Xc, Y, S)
    assert np.allclose(ours, np.array(recorded) - np.array(reg), atol=1e-12)


def _adversarial_auc(n: int, i: int) -> tuple:
    """Every record is label −1 at +e1 except record i on stream A: +1 at −e1. Served models
    D·e1. On A every pairing with record i costs φ(−4RD), on B φ(0) = log 2: the same sign at
    its own step and at every later one, the largest difference a term can have. At i = 1 (step
    2) the buffers are as small as the pattern assumes (|B_{2+k}| = min(k + 1, S))."""
    e1 = np.array([1.0, 0.0])
    X, Y = np.tile(e1, (n, 1)), np.full(n, -1.0)
    X2, Y2 = X.copy(), Y.copy()
    X[i], Y[i] = -e1, 1.0
    models = [e1.copy() for _ in range(n)]
    return models, (X, Y), (X2, Y2)


@pytest.mark.parametrize("kind", ["blt", "tree"])
def test_adversarial_neighbours_stay_within_the_pattern_and_delta(kind: str) -> None:
    n, S, i = 64, 8, 1
    term = penalty_term_range("auc", 1.0, 1.0)
    u = penalty_pattern("fifo", S, None, term)
    models, (X, Y), (X2, Y2) = _adversarial_auc(n, i)
    diff = _penalties("auc", models, X, Y, S) - _penalties("auc", models, X2, Y2, S)
    assert np.all(diff[:i] == 0)
    rows = np.abs(diff[i : i + len(u)])
    assert np.all(rows <= u[: len(rows)] + 1e-12)
    assert np.all(diff[i + len(u) :] == 0), "a FIFO record is a partner of the next S steps only"
    f = BLT.fit(n) if kind == "blt" else BinaryTree()
    C = f.strategy_matrix(n)
    measured = float(np.linalg.norm(C @ diff))
    delta = series_sensitivity(f, u, n)
    assert measured <= delta
    # Power: the construction reaches most of Δ (φ(−4) − log 2 of the range 4 per term) ...
    assert measured >= 0.8 * delta
    # ... and a bound that forgets the later pairings (the own step only) is exceeded.
    assert measured > series_sensitivity(f, [term], n)


@pytest.mark.parametrize("task", ["auc", "metric"])
def test_random_neighbours_never_exceed_the_pattern(task: str) -> None:
    rng = np.random.default_rng(1)
    n, S, d = 48, 6, 3
    u = penalty_pattern("fifo", S, None, penalty_term_range(task, 1.0, 1.0))
    worst = 0.0
    for trial in range(60):
        X = np.array([clip_norm(x, 1.0) for x in rng.normal(scale=2.0, size=(n, d))])
        if task == "auc":
            Y = rng.choice([-1.0, 1.0], size=n)
            models = [clip_norm(w, 1.0) for w in rng.normal(scale=3.0, size=(n, d))]
        else:
            Y = rng.integers(0, 3, size=n).astype(float)
            models = []
            for _ in range(n):
                A = rng.normal(size=(d, d))
                W = A @ A.T
                models.append(W / np.linalg.norm(W))
        i = int(rng.integers(1, n))
        X2, Y2 = X.copy(), Y.copy()
        X2[i] = clip_norm(rng.normal(scale=2.0, size=d), 1.0)
        Y2[i] = rng.choice(np.unique(Y)) if trial % 2 else Y[i]
        diff = _penalties(task, models, X, Y, S) - _penalties(task, models, X2, Y2, S)
        assert np.all(diff[:i] == 0) and np.all(diff[i + len(u) :] == 0)
        ratio = np.abs(diff[i : i + len(u)]) / u[: n - i]
        assert np.all(ratio <= 1 + 1e-12)
        worst = max(worst, float(ratio.max()))
    assert worst > 0.2, "the random neighbours moved the penalty at all"


# --- the learners ------------------------------------------------------------------------------


def _stream(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.normal(scale=0.8, size=(n, 3))
    y = X[:, 0] + 0.5 * rng.normal(size=n) > 0
    return X, y


def test_one_charge_within_its_share_and_the_value_is_sum_plus_noise() -> None:
    n, share = 300, 0.2
    model = OnPairStrC(epsilon=2.0, horizon=n, features=3, buffer=16, metrics_share=share,
                       seed=9, reproducible=True)  # fmt: skip
    X, y = _stream(n)
    first = None
    for t in range(n):
        model.learn_one(X[t], bool(y[t]))
        if (t + 1) % 50 == 0:
            m = model.release_metrics()
            first = first or m
            sums = model._metrics.mechanism(model.budget, model._noise)
            raw = np.array([model.regret.cumulative, model.n_clipped, model.unknown_features])
            noise = sums.noise(t + 1)
            assert m["average_penalty"] == pytest.approx(
                (raw[0] + noise[0]) / model.regret.steps, rel=1e-12
            )
            assert m["clip_rate"] == pytest.approx((raw[1] + noise[1]) / (t + 1), rel=1e-12)
    ledger = model.accountant.ledger
    charges = [e for e in ledger if e.mechanism == MECHANISM]
    assert len(charges) == 1 and charges[0].step == 50
    assert charges[0].sensitivity == math.sqrt(3)
    limit = model.budget.limit
    cost = model.accountant.cost
    assert sum(map(cost, charges)) <= share * limit
    assert sum(cost(e) for e in ledger if e.mechanism == "gaussian") <= (1 - share) * limit
    assert model.accountant.rho_spent() <= limit
    assert model.metrics == m and first["step"] == 50


def test_a_checkpoint_resumes_the_same_noise_without_a_second_charge() -> None:
    n = 200
    kw = dict(epsilon=2.0, horizon=n, features=3, buffer=16, metrics_share=0.1, seed=4,
              reproducible=True)  # fmt: skip
    X, y = _stream(n, 2)
    a = OnPairStrC(**kw)
    for t in range(120):
        a.learn_one(X[t], bool(y[t]))
    a.release_metrics()
    state = a.state_dict()
    b = OnPairStrC(**kw)
    b.load_state_dict(state)
    for m in (a, b):
        for t in range(120, n):
            m.learn_one(X[t], bool(y[t]))
    assert a.release_metrics() == b.release_metrics()
    assert [e.mechanism for e in b.accountant.ledger].count(MECHANISM) == 1


def test_onpairmf_releases_metrics_under_its_own_charge() -> None:
    n = 200
    model = OnPairMF(epsilon=2.0, horizon=n, features=3, metrics_share=0.25)
    X, y = _stream(n, 3)
    model.learn_many(X, y)
    m = model.release_metrics()
    assert m["step"] == n and m["private"] is True
    names = [e.mechanism for e in model.accountant.ledger]
    assert names == ["gaussian-correlated", MECHANISM]
    assert model.accountant.rho_spent() <= model.budget.limit


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(buffer="reservoir:8"), "reservoir"),
        (dict(buffer="all"), "horizon"),
        (dict(track_regret=False, horizon=100), "track_regret"),
        (dict(budget_share=0.95, horizon=100), "exceeds the budget"),
        (dict(metrics_noise="tree", buffer=8), "needs a horizon"),
    ],
)
def test_unsupported_settings_are_refused(kw, message) -> None:
    with pytest.raises(ValueError, match=message):
        OnPairStrC(epsilon=1.0, features=3, metrics_share=0.1, **kw)


def test_without_a_share_nothing_is_released_or_charged() -> None:
    model = OnPairStrC(epsilon=1.0, horizon=50, features=3, buffer=8)
    X, y = _stream(50)
    model.learn_many(X, y)
    assert model.release_metrics() is None and model.metrics is None
    assert MECHANISM not in {e.mechanism for e in model.accountant.ledger}


# --- no raw penalty leaves the process -------------------------------------------------------

_NUMBER = re.compile(r"-?\d+\.\d+(?:[eE][-+]?\d+)?")


def _significant(token: str) -> int:
    mantissa = token.lstrip("-").split("e")[0].split("E")[0].replace(".", "").lstrip("0")
    return len(mantissa)


def _leaks(texts: dict[str, str], raw: np.ndarray, min_digits: int = 6) -> list[str]:
    """Numbers in ``texts`` equal, at their printed precision (≥ ``min_digits`` significant
    digits), to one of the ``raw`` values."""
    found = []
    for name, text in texts.items():
        for token in _NUMBER.findall(text):
            p = _significant(token)
            if p < min_digits:
                continue
            v = float(token)
            rounded = {float(f"{r:.{p}g}") for r in raw}
            if float(f"{v:.{p}g}") in rounded:
                found.append(f"{name}: {token}")
    return found


def test_the_raw_penalty_sequence_appears_in_no_engine_output(tmp_path, caplog) -> None:
    from stream_dp.checkpoint import load_checkpoint
    from stream_dp.engine import Engine, EngineConfig

    rng = np.random.default_rng(7)
    n, features = 400, ["a", "b", "c"]
    rows = []
    for _ in range(n):
        x = rng.normal(size=3)
        rows.append({"x": dict(zip(features, x.tolist(), strict=True)), "y": int(x[0] > 0)})
    rows[5]["x"]["extra"] = 1.0  # an unknown feature, counted by the private metrics
    (tmp_path / "in.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cfg = EngineConfig.model_validate({
        "model": {"buffer": 16, "horizon": n, "epsilon": 4.0, "model_id": "m",
                  "features": features, "metrics_share": 0.2, "release_every": 1},
        "source": {"kind": "jsonl", "path": str(tmp_path / "in.jsonl")},
        "releases": {"kind": "jsonl", "path": str(tmp_path / "out" / "rel.jsonl")},
        "dead_letters": {"kind": "jsonl", "path": str(tmp_path / "out" / "dead.jsonl")},
        "checkpoint": {"path": str(tmp_path / "state" / "m.ckpt"), "every_records": 50},
        "status": {"interval_seconds": 1e-9, "file": str(tmp_path / "state" / "status.json")},
    })  # fmt: skip
    engine = Engine(cfg)
    statuses = []
    write = engine.status_writer.write

    def keep(status, raw=None):
        write(status, raw)
        statuses.append((tmp_path / "state" / "status.json").read_text())

    engine.status_writer.write = keep
    with caplog.at_level(logging.INFO, logger="stream_dp.engine"):
        engine.run()
    log_text = "\n".join(r.getMessage() for r in caplog.records)

    # Reconstruct the raw penalties: the same learner, the run's secret, the same records.
    ck = load_checkpoint(cfg.checkpoint.path)
    secret = int(ck.learner_state["secret"])
    kw = cfg.model.learner_kwargs()
    twin = OnPairStrC(**{**kw, "seed": secret, "reproducible": True})
    penalties: list[float] = []
    record = twin.regret.record
    twin.regret.record = lambda p: (penalties.append(p), record(p))
    for r in rows:
        twin.learn_one({k: v for k, v in r["x"].items() if k in features}, r["y"])
    assert twin.regret.cumulative == ck.learner_state["regret"][0], "the reconstruction is exact"
    p = np.array(penalties)
    assert len(p) == n - 1 and np.ptp(p) > 0
    cumulative = np.cumsum(p)
    raw = np.concatenate([p, cumulative, cumulative / np.arange(1, len(p) + 1)])

    # What the run published or wrote: every status.json, the releases, the log.
    releases = (tmp_path / "out" / "rel.jsonl").read_text()
    texts = {f"status#{k}": s for k, s in enumerate(statuses)}
    texts.update({"releases": releases, "log": log_text})
    assert len(statuses) > 5 and releases.count("\n") > 100
    last = json.loads(statuses[-1])["dp_metrics"]
    assert last["step"] == n and last["private"] is True and last["scored_steps"] == n - 1
    assert "dp: avg_penalty=" in log_text
    # The private value is the raw one plus noise of the advertised size: close, never equal.
    assert abs(last["average_penalty"] - raw[-1]) < 6 * last["average_penalty_std"]
    assert _leaks(texts, raw) == []
    # The check has power: a raw value in status.json is found.
    assert _leaks({"planted": json.dumps({"average_penalty": float(raw[-1])})}, raw)
    assert [e.mechanism for e in engine.learner.accountant.ledger].count(MECHANISM) == 1
    # State files (the checkpoint holds raw records and the secret) 0600, their directory 0700.
    for f in (tmp_path / "state" / "status.json", tmp_path / "state" / "m.ckpt"):
        assert oct(f.stat().st_mode & 0o777) == "0o600"
    assert oct((tmp_path / "state").stat().st_mode & 0o777) == "0o700"

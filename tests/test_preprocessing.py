"""Private preprocessing (``docs/privacy.md``, *Private preprocessing*): the private scaler's
sensitivity and noise against the formulas (a σ/2 variant fails), an empirical audit on
neighbouring streams with a shared secret, one budget and one ledger per model under ``clone()``
and river pipelines, batches equal to single records, replays, bad input, the pipeline check,
and the private scaler of the utility benchmark on the bank data."""

from __future__ import annotations

import copy
import importlib.util
import itertools
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
from river import checks, compose, evaluate, metrics
from river import preprocessing as river_pre
from scipy import stats

from stream_dp.online import OnPairStrC
from stream_dp.preprocessing import (
    NonPrivatePreprocessingWarning,
    PrivateScaler,
    PublicScaler,
    ScaledLearner,
    check_pipeline,
)
from stream_dp.preprocessing.private_scaler import MECHANISM, scaler_sensitivity
from stream_dp.privacy import KeyedNoise, gaussian_sigma_zcdp, zcdp_budget
from stream_dp.privacy.schedules import HorizonSchedule
from stream_dp.records import InvalidRecord

__all__: list[str] = []

FEATURES = ("a", "b", "f0", "f1", "f2")
BOUNDS = {"a": (0.0, 10.0), "b": (-5.0, 5.0)}


def _records(seed: int, n: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [
        {"a": float(rng.uniform(-2, 12)), "b": float(rng.normal(1, 2)),
         "f0": float(rng.random() < 0.3), "f1": float(rng.random() < 0.5), "f2": 0.0}
        for _ in range(n)
    ]  # fmt: skip


def _stats(records: list[dict], scaler: PrivateScaler) -> np.ndarray:
    """The noise-free release vector, computed here from the definition (not the scaler's)."""
    u = [[(min(max(r[k], lo), hi) - (lo + hi) / 2) / ((hi - lo) / 2) for k, (lo, hi) in
          BOUNDS.items()] for r in records]  # fmt: skip
    u = np.array(u)
    others = [k for k in FEATURES if k not in BOUNDS]
    B2 = scaler.passthrough_bound**2
    q = [sum(min(r[k] ** 2, B2) for k in others) / (len(others) * B2) for r in records]
    return np.concatenate([u.sum(0), math.sqrt(2) * (u**2).sum(0), [sum(q)]])


def _scaler(seed, release_at=(50,), **kw) -> PrivateScaler:
    kw.setdefault("epsilon", 1.0)
    return PrivateScaler(bounds=BOUNDS, features=FEATURES, release_at=release_at, seed=seed,
                         reproducible=seed is not None, **kw)  # fmt: skip


def _release_vector(scaler: PrivateScaler) -> np.ndarray:
    assert scaler.release_vector is not None
    return scaler.release_vector


# --- the sensitivity -----------------------------------------------------------------------------


def test_sensitivity_is_the_maximum_over_a_fine_grid_of_record_pairs() -> None:
    # Per feature (u − u')² + 2(u² − u'²)² on u, u' ∈ [−1, 1]; the norm term q ∈ [0, 1].
    g = np.linspace(-1, 1, 401)
    U, V = np.meshgrid(g, g)
    per_feature = ((U - V) ** 2 + 2 * (U**2 - V**2) ** 2).max()
    assert per_feature == pytest.approx(4.0, abs=1e-12)
    assert scaler_sensitivity(3, with_norm=True) == pytest.approx(math.sqrt(3 * per_feature + 1))
    assert scaler_sensitivity(3, with_norm=False) == pytest.approx(math.sqrt(3 * per_feature))


def _extreme_records() -> list[dict]:
    lo_hi = [
        dict(zip(BOUNDS, v, strict=True))
        for v in itertools.product(
            *[(lo - 1, hi + 1, (lo + hi) / 2, lo + (hi - lo) / 4) for lo, hi in BOUNDS.values()]
        )
    ]
    out = []
    for base in lo_hi:
        for extra in ({"f0": 0.0, "f1": 0.0, "f2": 0.0}, {"f0": 5.0, "f1": -3.0, "f2": 1.0}):
            out.append({**base, **extra})
    return out  # fmt: skip


def test_neighbouring_streams_move_the_release_by_at_most_the_sensitivity() -> None:
    # Empirical audit: same secret, streams differing in one record; the noise cancels, so the
    # releases differ by exactly the statistics' difference. Over all pairs of extreme records
    # (bounds, beyond them, midpoints) and random ones, the largest move is Δ, and it is reached.
    shared = _records(3, 49)
    candidates = _extreme_records() + _records(4, 30)
    releases = []
    for r in candidates:
        s = _scaler(11)
        for x in [*shared[:20], r, *shared[20:]]:
            s.learn_one(x)
        releases.append(_release_vector(s))
    Y = np.array(releases)
    dists = np.sqrt(((Y[:, None, :] - Y[None, :, :]) ** 2).sum(-1))
    sens = _scaler(11).sensitivity
    assert dists.max() <= sens * (1 + 1e-12)
    assert dists.max() >= sens * (1 - 1e-9)  # tight: the bound is not loose either


# --- calibration ---------------------------------------------------------------------------------


def test_sigma_and_ledger_follow_the_formula() -> None:
    budget = zcdp_budget(4.0, 1e-5)
    s = PrivateScaler(bounds=BOUNDS, features=FEATURES, budget_share=0.2)
    s.bind_budget(budget)
    plan = s.release_plan()
    sched = HorizonSchedule(len(plan))
    rho = 0.2 * budget.limit
    for i, p in enumerate(plan):
        assert p["sensitivity"] == pytest.approx(math.sqrt(4 * 2 + 1))
        assert p["sigma"] == pytest.approx(
            gaussian_sigma_zcdp(p["sensitivity"], rho * sched.share(i + 1))
        )
    assert sum(p["rho"] for p in plan) == pytest.approx(rho, rel=1e-7)
    assert sum(p["rho"] for p in plan) <= rho * (1 + 1e-12)
    # default schedule: doubling epochs from the first step at which a mean's noise ≤ 0.1
    steps = [p["step"] for p in plan]
    assert steps == [steps[0] * 2**i for i in range(len(steps))]
    assert steps[0] == max(100, math.ceil(plan[0]["sigma"] / 0.1))
    for x in _records(1, steps[-1]):
        s.learn_one(x)
    events = [e for e in budget.accountant.ledger if e.mechanism == MECHANISM]
    assert [e.step for e in events] == steps
    assert [e.sigma for e in events] == pytest.approx([p["sigma"] for p in plan])


class _HalfNoise(KeyedNoise):
    """A deliberately broken noise source: σ/2 while the ledger is charged for σ."""

    def gaussian(self, step, shape, sigma, purpose="release"):
        return super().gaussian(step, shape, sigma / 2, purpose)


def _noise_samples(n_secrets: int, weaken: bool) -> tuple[np.ndarray, float]:
    records = _records(5, 50)
    out = []
    for _ in range(n_secrets):
        s = _scaler(None)
        if weaken:
            s._noise = _HalfNoise(s._noise.secret, s.model_id)
        for x in records:
            s.learn_one(x)
        out.append(_release_vector(s) - _stats(records, s))
    return np.array(out), s.release_plan()[0]["sigma"]


def _variance_consistent(noise: np.ndarray, sigma: float) -> bool:
    # χ² test of Σ z²/σ² with all coordinates pooled (two-sided, 1e-4 level)
    z2 = float(((noise / sigma) ** 2).sum())
    df = noise.size
    return stats.chi2.ppf(5e-5, df) < z2 < stats.chi2.ppf(1 - 5e-5, df)


@pytest.mark.slow
def test_release_noise_has_the_charged_variance_and_a_half_sigma_variant_fails() -> None:
    noise, sigma = _noise_samples(200, weaken=False)
    assert _variance_consistent(noise, sigma)
    # Gaussian, not a scaled uniform (excess kurtosis -1.2) nor a skewed law: both moments
    # within 5 standard errors of a Gaussian sample's (fresh secrets: a 1e-6 false alarm).
    z, m = noise.ravel(), noise.size
    assert abs(stats.skew(z)) < 5 * np.sqrt(6 / m)
    kurtosis_bound = 5 * np.sqrt(24 / m)
    assert kurtosis_bound < 1.0, "too few samples to tell a uniform law apart"
    assert abs(stats.kurtosis(z)) < kurtosis_bound
    assert np.abs(np.corrcoef(noise.T) - np.eye(noise.shape[1])).max() < 0.3  # independent
    weak, sigma = _noise_samples(200, weaken=True)
    assert not _variance_consistent(weak, sigma)


def test_noise_is_keyed_by_secret_and_step_and_replays_are_identical() -> None:
    records = _records(6, 50)
    a, b, c = _scaler(None), _scaler(None), None
    for x in records:
        a.learn_one(x)
        b.learn_one(x)
    assert not np.array_equal(_release_vector(a), _release_vector(b))  # fresh secrets
    state = copy.deepcopy(a.state_dict())
    c = _scaler(None)
    c.load_state_dict(state)
    assert c.release_info() == a.release_info()


# --- one budget per model ------------------------------------------------------------------------


def _composite(seed=None, share=0.2, **learner_kw) -> ScaledLearner:
    params = dict(task="auc", epsilon=2.0, horizon=600, alpha=4.0, buffer=16, features=FEATURES,
                  budget_share=1 - share, track_regret=False)  # fmt: skip
    params.update(learner_kw)
    return ScaledLearner(
        PrivateScaler(bounds=BOUNDS, release_at=(40, 80), budget_share=share, seed=seed,
                      reproducible=seed is not None),
        OnPairStrC(seed=seed, reproducible=seed is not None, **params),
    )  # fmt: skip


def _labelled(seed: int, n: int) -> list[tuple[dict, bool]]:
    recs = _records(seed, n)
    return [(r, r["a"] + 2 * r["f0"] > 6) for r in recs]


def test_the_ledger_holds_both_charges_within_their_shares() -> None:
    model = _composite()
    for x, y in _labelled(7, 600):
        model.learn_one(x, y)
    acc = model.accountant
    limit = model.budget.limit
    by = {m: sum(acc.cost(e) for e in acc.ledger if e.mechanism == m)
          for m in ("gaussian", MECHANISM)}  # fmt: skip
    assert by[MECHANISM] > 0 and by["gaussian"] > 0
    assert by[MECHANISM] <= 0.2 * limit * (1 + 1e-12)
    assert by["gaussian"] <= 0.8 * limit * (1 + 1e-12)
    assert acc.rho_spent() == pytest.approx(by[MECHANISM] + by["gaussian"])
    assert acc.spent()[0] <= 2.0
    assert model.scaler.accountant is acc  # one ledger
    msg = model.release_message()
    assert msg["scaler"]["step"] == 80 and msg["rho_spent"] == pytest.approx(acc.rho_spent())


def test_clones_and_pipeline_clones_have_their_own_budget_and_secrets() -> None:
    model = _composite()
    data = _labelled(8, 300)
    for x, y in data[:100]:
        model.learn_one(x, y)
    n_events = len(model.accountant.ledger)
    twin = model.clone()
    assert twin.budget is not model.budget and twin.scaler.budget.parent is twin.budget
    assert twin.learner.step == 0 and twin.scaler.n_seen == 0
    for x, y in data[:100]:
        twin.learn_one(x, y)
    assert len(model.accountant.ledger) == n_events  # the clone never charged the original
    assert twin.scaler.release_info() != model.scaler.release_info()  # fresh noise secrets
    pipe = compose.Pipeline(compose.Select(*FEATURES), _composite())
    other = pipe.clone()
    a, b = pipe.steps["ScaledClassifier"], other.steps["ScaledClassifier"]
    assert a.budget is not b.budget and b.scaler.budget.parent is b.budget


def test_progressive_val_score_runs_and_learn_many_equals_learn_one() -> None:
    data = _labelled(9, 400)
    model = _composite(seed=3)
    evaluate.progressive_val_score(iter(data), compose.Select(*FEATURES) | model, metrics.ROCAUC())
    assert model.learner.step == 400 and model.scaler.n_releases == 2
    one, many = _composite(seed=3), _composite(seed=3)
    for x, y in data:
        one.learn_one(x, y)
    X = np.array([[x[k] for k in FEATURES] for x, _ in data])
    many.learn_many(X[:150], [y for _, y in data[:150]])
    many.learn_many(X[150:], [y for _, y in data[150:]])
    assert many.scaler.release_info() == one.scaler.release_info()
    np.testing.assert_allclose(many.learner.private_weights, one.learner.private_weights,
                               rtol=0, atol=1e-12)  # fmt: skip
    assert [(e.step, e.sigma, e.mechanism) for e in many.accountant.ledger] == [
        (e.step, e.sigma, e.mechanism) for e in one.accountant.ledger
    ]
    p1 = one.predict_proba_one(data[0][0])
    assert p1 == pytest.approx(many.predict_proba_one(data[0][0]))
    np.testing.assert_allclose(many.score_many(X[:5]), [one.score_one(x) for x, _ in data[:5]])


def test_records_are_scaled_with_statistics_released_before_them() -> None:
    seen = []

    class Spy(OnPairStrC):
        def learn_one(self, x, y, **kw):
            seen.append(dict(x))
            super().learn_one(x, y, **kw)

    model = ScaledLearner(
        PrivateScaler(bounds=BOUNDS, release_at=(40,), budget_share=0.2),
        Spy(task="auc", epsilon=2.0, horizon=600, alpha=4.0, features=FEATURES, budget_share=0.8),
    )
    data = _labelled(10, 41)
    prior = copy.deepcopy(model.scaler)
    for x, y in data:
        model.learn_one(x, y)
    assert seen[39] == prior.transform_one(data[39][0])  # the 40th: still the prior
    assert model.scaler.release_step == 40
    assert seen[40] == model.scaler.transform_one(data[40][0]) != prior.transform_one(data[40][0])


def test_checkpoint_and_replay_republish_the_same_statistics_at_no_cost() -> None:
    data = _labelled(11, 200)
    model = _composite()
    for x, y in data[:30]:
        model.learn_one(x, y)
    state = copy.deepcopy(model.state_dict())
    for x, y in data[30:120]:
        model.learn_one(x, y)
    spent, released = model.accountant.rho_spent(), model.scaler.release_info()
    # a restart from the checkpoint replays records 31..120 with the restored ledger
    again = _composite()
    again.load_state_dict(copy.deepcopy(state))
    for x, y in data[30:120]:
        again.learn_one(x, y)
    assert again.scaler.release_info() == released
    np.testing.assert_array_equal(again.learner.private_weights, model.learner.private_weights)
    assert again.accountant.rho_spent() == pytest.approx(spent)


def test_bad_records_raise_and_change_nothing() -> None:
    model = _composite()
    for x, y in _labelled(12, 10):
        model.learn_one(x, y)
    before = (model.learner.step, model.scaler.n_seen, len(model.accountant.ledger))
    for bad in ({"a": "7", "b": 0.0}, {"a": math.nan, "b": 1.0}, {"a": 1.0, "b": math.inf}):
        with pytest.raises(InvalidRecord):
            model.learn_one(bad, True)
    with pytest.raises(InvalidRecord):
        model.learn_one({"a": 1.0, "b": 1.0}, "maybe")
    assert (model.learner.step, model.scaler.n_seen, len(model.accountant.ledger)) == before


def test_wrong_compositions_are_refused_with_the_fix() -> None:
    learner = OnPairStrC(task="auc", epsilon=1.0, horizon=500, features=FEATURES)
    with pytest.raises(ValueError, match="budget_share=0.9"):
        ScaledLearner(PrivateScaler(bounds=BOUNDS, budget_share=0.1), learner)
    with pytest.raises(TypeError, match="StandardScaler"):
        ScaledLearner(river_pre.StandardScaler(), learner)
    with pytest.raises(ValueError, match="already has a budget"):
        ScaledLearner(_scaler(None), OnPairStrC(task="auc", epsilon=1.0, horizon=500,
                                                features=FEATURES, budget_share=0.9))  # fmt: skip
    public = ScaledLearner(PublicScaler(bounds=BOUNDS), learner)  # no budget: the whole ε stays
    public.learn_one({"a": 3.0, "b": 1.0}, True)
    assert {e.mechanism for e in public.accountant.ledger} <= {"gaussian"}


# --- the pipeline check --------------------------------------------------------------------------


def _learner() -> OnPairStrC:
    return OnPairStrC(task="auc", epsilon=1.0, horizon=500, features=FEATURES)


def test_check_pipeline_flags_stateful_and_separately_charged_steps_only() -> None:
    with pytest.warns(NonPrivatePreprocessingWarning, match="StandardScaler learns"):
        check_pipeline(river_pre.StandardScaler() | _learner())
    nested = compose.Pipeline(compose.Select("a") | river_pre.MinMaxScaler(), _learner())
    assert len(check_pipeline(nested, warn=False)) == 1
    assert check_pipeline(compose.Select(*FEATURES) | PublicScaler(bounds=BOUNDS) | _learner(),
                          warn=False) == []  # fmt: skip
    assert check_pipeline(compose.Select(*FEATURES) | _composite(), warn=False) == []
    two_ledgers = check_pipeline(_scaler(None) | _learner(), warn=False)
    assert len(two_ledgers) == 1 and "ScaledLearner" in two_ledgers[0]


# --- the utility benchmark's private scaler on the bank data -------------------------------


def _benchmark():
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "private_scaler_utility.py"
    spec = importlib.util.spec_from_file_location("private_scaler_utility", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bank_raw_columns_through_the_private_scaler_charge_one_ledger() -> None:
    bench = _benchmark()
    from stream_dp.datasets import prepare

    data = prepare("bank", max_records=6000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        auc, model = bench.run_private(data, 4.0, seed=1, share=0.1)
    ledger = model.accountant.ledger
    assert {e.mechanism for e in ledger} == {"gaussian", MECHANISM}
    assert sum(e.mechanism == MECHANISM for e in ledger) == 4
    eps, _ = model.accountant.spent()
    assert 3.9 < eps <= 4.0 + 1e-9
    assert auc > 0.6  # it learns from raw columns (random ranking: 0.5)
    assert model.learner.n_clipped < 0.2 * model.learner.step


def test_a_pipeline_the_learner_composes_is_checked_as_it_is_composed() -> None:
    """River asks a learner to compose when it is the left operand, or the right one of a
    function: that pipeline is checked at once — before a private AUC learner, a private metric
    learner (a ledger of its own) and a stateful scaler are each warned about, once. A pipeline
    river builds without asking the learner is checked by ``check_pipeline``. Safe pipelines warn
    nothing, composed or run."""
    metric = OnPairStrC(task="metric", epsilon=1.0, horizon=500, features=FEATURES)
    with pytest.warns(NonPrivatePreprocessingWarning) as rec:
        metric | (river_pre.StandardScaler() | _learner())
    said = sorted(str(w.message) for w in rec if w.category is NonPrivatePreprocessingWarning)
    assert len(said) == 2
    assert said[0].startswith("OnPairStrCMetric before OnPairStrCAUC charges its own ledger")
    assert said[1].startswith("StandardScaler learns from the stream before OnPairStrCAUC")
    unsafe = compose.Select(*FEATURES) | river_pre.StandardScaler() | _learner()
    assert len(check_pipeline(unsafe, warn=False)) == 1
    data = _labelled(13, 120)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NonPrivatePreprocessingWarning)
        safe = (lambda x: {k: x[k] for k in FEATURES}) | _learner()
        assert isinstance(safe, compose.Pipeline)
        evaluate.progressive_val_score(iter(data), safe, metrics.ROCAUC())
        evaluate.progressive_val_score(iter(data), compose.Select(*FEATURES) | _composite(),
                                       metrics.ROCAUC())  # fmt: skip
        learner = _learner()
        for x, y in data:  # no pipeline: nothing to check
            learner.learn_one(x, y)


# --- the clip-rate warning -----------------------------------------------------------------------


@pytest.mark.parametrize("batch", [False, True])
def test_clip_rate_warns_once_when_most_records_are_clipped(batch: bool) -> None:
    rng = np.random.default_rng(14)
    X_raw = rng.normal(40, 10, size=(300, 5))  # unscaled: every norm ≫ R = 1
    y = (rng.random(300) < 0.5).tolist()
    learner = _learner()
    with pytest.warns(UserWarning, match="were clipped") as rec:
        if batch:
            learner.learn_many(X_raw[:150], y[:150])
            learner.learn_many(X_raw[150:], y[150:])
        else:
            for x, label in zip(X_raw, y, strict=True):
                learner.learn_one(x, label)
    assert sum("were clipped" in str(w.message) for w in rec) == 1
    assert learner.n_clipped == 300
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        scaled = _learner()
        for x, label in zip(X_raw / 200, y, strict=True):  # norms ≈ 0.45: none clipped
            scaled.learn_one(x, label)
        assert scaled.n_clipped == 0
        half = _learner()  # 40 % clipped: below the threshold
        for i, (x, label) in enumerate(zip(X_raw, y, strict=True)):
            half.learn_one(x if i % 5 < 2 else x / 200, label)
        assert 0.3 < half.n_clipped / 300 < 0.5


# --- river's own checks --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: PublicScaler(**next(PublicScaler._unit_test_params())),
        lambda: PrivateScaler(**next(PrivateScaler._unit_test_params())),
        lambda: ScaledLearner(**next(ScaledLearner._variants["classifier"]._unit_test_params())),
        lambda: ScaledLearner(**next(ScaledLearner._variants["transformer"]._unit_test_params())),
    ],
    ids=["PublicScaler", "PrivateScaler", "ScaledClassifier", "ScaledTransformer"],
)
def test_river_check_estimator(make) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        checks.check_estimator(make())


def test_the_demo_table_shows_the_clip_counter_only_to_the_operator() -> None:
    from stream_dp.apps.demo import ModelResult, format_table

    res = ModelResult("bank", "OnPairStrC", 4.0, 1.0, "default", 50, n=100, steps=100)
    res.n_clipped = 7
    table = format_table([res], markdown=True, operator=True)
    assert "clipped (RAW, operator-only)" in table and "| 7/100 |" in table
    assert "7/100" not in format_table([res], markdown=True)  # a raw count: not by default


def test_readme_river_example_runs_in_the_safe_form(capsys) -> None:
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    section = readme.split("### Scaling inside river pipelines", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert "ScaledLearner(" in code and "StandardScaler" not in code
    with warnings.catch_warnings():
        warnings.simplefilter("error", NonPrivatePreprocessingWarning)
        exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "['gaussian', 'gaussian-scaler']" in out
    auc = float(out.split("ROCAUC: ", 1)[1].split("%", 1)[0])
    assert auc > 60  # the safe form learns (random ranking: 50)

"""The compiled fast path gives the reference step's results.

The oracle is ``learn_one`` record by record with the fast path switched off: the reference step
(:mod:`stream_dp.online.reference`, as with ``STREAM_DP_NUMBA=0``). Against it we run, for the
same secret and stream: ``learn_one`` on dict records with numba (the fast path, one record per
call), ``learn_many`` in uneven batches with and without numba, and both with a checkpoint
(``state_dict`` → fresh learner → ``load_state_dict``) in the middle. Compared: the release, the
smoothed release, the internal iterate, the certified sensitivity, σ, the regret, the buffer —
to 1e-12 — and the ledger, event by event, exactly (the privacy side never depends on record
values and involves no transcendental function, so it is bit-for-bit identical on every path).

Without numba installed the "numba" runs are the reference again and the tests still hold.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from stream_dp import _jit, losses, sensitivity
from stream_dp.buffers import make_buffer
from stream_dp.constraints import L2Ball, PSDFrobeniusBall
from stream_dp.losses import Regularized, get_loss
from stream_dp.online import OnPairC, OnPairMF, OnPairStrC, PairwiseGIGA
from stream_dp.online.fast import CHUNK_ROWS
from stream_dp.privacy.events import GaussianEvent
from stream_dp.privacy.noise import KeyedNoise, rows_per_block
from stream_dp.records import InvalidRecord, clip_norm, clip_rows

__all__: list[str] = []

TOL = 1e-12
N = 120
D = 4
BATCHES = (1, 7, 30, 2, 50, 30)  # uneven, some crossing the warm-up, sum = N


def _stream(seed: int, task: str, n: int = N, d: int = D):
    rng = np.random.default_rng(seed)
    X = rng.normal(scale=0.7, size=(n, d))  # norms around 1.4: most records are clipped at R=1
    if task == "auc":
        return X, rng.random(n) < 0.5
    return X, rng.choice(np.array(["a", "b", "c"]), size=n)


def _dict(row: np.ndarray) -> dict:
    return {f"x{i}": float(v) for i, v in enumerate(row)}


def _labels(y) -> list:
    return [bool(v) if isinstance(v, np.bool_) else str(v) for v in y]


def _snapshot(m) -> dict:
    state = m.state_dict()
    buf = state["buffer"]
    out = {
        "t": m.step,
        "w": state["w"],
        "regret": state["regret"],
        "ids": buf["ids"],
        "X": buf["X"],
        "Y": buf["Y"],
        "n_rejected": m.n_rejected,
    }
    if m.accountant is not None or isinstance(m, OnPairMF):
        mech = state["mechanism"]
        out.update(
            release=m.private_weights,
            smoothed=m.smoothed_weights,
            release_step=m.release_step,
            n_releases=m.n_releases,
            tracker=mech.get("tracker"),
            sigma=m.last_sigma,
            sensitivity=m.last_sensitivity,
            ledger=None if m.accountant is None else m.accountant.ledger,
            exhausted=m.exhausted,
        )
        if isinstance(m, OnPairMF):  # the released average, and the noise state to resume at
            out.update(average=mech["average"], noise=mech["noise"])
    return out


def _assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        u, v = a[k], b[k]
        if k in ("w", "release", "smoothed", "X", "average"):
            if u is None or v is None:
                assert u is None and v is None, k
            else:
                np.testing.assert_allclose(u, v, rtol=TOL, atol=TOL, err_msg=k)
        elif k == "regret":
            assert u[1] == v[1]
            assert u[0] == pytest.approx(v[0], rel=TOL, abs=TOL)
        elif k in ("tracker", "noise") and (u is None or v is None):
            assert u is None and v is None, k
        elif k in ("tracker", "noise"):  # data-independent: bit for bit
            assert u.keys() == v.keys()
            for kk in u:
                assert np.array_equal(u[kk], v[kk]), kk
        elif isinstance(u, np.ndarray):
            assert np.array_equal(u, v), k
        else:
            assert u == v, k  # ledger (every event), bound, σ, counters: exactly


def _run(make, X, y, *, numba: bool, mode: str, checkpoint_at: int | None = None):
    """Feed the stream through one path; return the final snapshot and the model."""
    labels = _labels(y)
    with _jit.use_numba(numba), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # exhaustion warnings
        m = make()
        start = 0
        while start < len(labels):
            if mode == "one":
                stop = (
                    len(labels)
                    if checkpoint_at is None or start >= checkpoint_at
                    else (checkpoint_at)
                )
                for i in range(start, stop):
                    m.learn_one(_dict(X[i]) if numba else X[i], labels[i])
            else:
                stop = start
                for size in BATCHES:
                    if checkpoint_at is not None and start < checkpoint_at < stop + size:
                        size = checkpoint_at - stop
                    if stop >= len(labels) or size == 0:
                        break
                    m.learn_many(X[stop : stop + size], y[stop : stop + size])
                    stop += size
                    if checkpoint_at is not None and stop == checkpoint_at:
                        break
                if stop == start:
                    stop = len(labels)
                    m.learn_many(X[start:], y[start:])
            if checkpoint_at is not None and stop == checkpoint_at:
                fresh = make(seed=999)  # the secret must come from the checkpoint
                fresh.load_state_dict(m.state_dict())
                m = fresh
            start = stop
        return _snapshot(m), m


CONFIGS = {
    "auc-fifo": dict(cls=OnPairStrC, task="auc", buffer="fifo:7"),
    "auc-all": dict(cls=OnPairStrC, task="auc", buffer="all"),
    "auc-reservoir": dict(cls=OnPairStrC, task="auc", buffer="reservoir:5"),
    "metric-fifo": dict(cls=OnPairStrC, task="metric", buffer="fifo:7"),
    "metric-all": dict(cls=OnPairStrC, task="metric", buffer="all"),
    "metric-reservoir": dict(cls=OnPairStrC, task="metric", buffer="reservoir:5"),
    "onpairc-auc-smoothed": dict(
        cls=OnPairC,
        task="auc",
        buffer="fifo:9",
        alpha=0.7,
        smoothing_window=4,
        predict_with="smoothed",
    ),  # fmt: skip
    "onpairc-metric-every3": dict(
        cls=OnPairC,
        task="metric",
        buffer="fifo:6",
        alpha=0.9,
        release_every=3,
        horizon=N,
        smoothing_window=3,
    ),  # fmt: skip
    "auc-paper-sensitivity": dict(
        cls=OnPairStrC,
        task="auc",
        buffer="all",
        alpha=4.0,
        sensitivity="paper",
        warmup=None,
        horizon=N,
    ),  # fmt: skip
    "auc-horizon-exhausts": dict(cls=OnPairStrC, task="auc", buffer="fifo:5", horizon=90),
    # OnPairMF: noise rows in blocks of 16 steps (so runs and checkpoints cross blocks)
    "mf-auc-blt": dict(cls=OnPairMF, task="auc", buffer=7, horizon=200),
    "mf-metric-blt": dict(cls=OnPairMF, task="metric", buffer=6, horizon=200),
    "mf-auc-tree-last-iterate": dict(
        cls=OnPairMF, task="auc", buffer=5, horizon=N, noise="tree", averaging=None
    ),
    "mf-metric-independent-exhausts": dict(
        cls=OnPairMF, task="metric", buffer=9, horizon=90, noise="independent", averaging=3.0
    ),
    "mf-auc-unbounded": dict(cls=OnPairMF, task="auc", buffer=8, horizon=None),
    "mf-auc-noise-free": dict(cls=OnPairMF, task="auc", buffer=7, horizon=N, epsilon=None),
    # (new configurations go last: a configuration's stream is seeded by its position)
    "mf-diagonal-metric-blt": dict(
        cls=OnPairMF, task="metric", metric="diagonal", buffer=6, horizon=200
    ),
}


def _maker(cfg: dict):
    cfg = dict(cfg)
    cls = cfg.pop("cls")
    params = dict(
        epsilon=2.0, delta=1e-5, alpha=1.0, warmup=5, seed=11, reproducible=True, model_id="fast",
        features=D,
    )  # fmt: skip
    if cls is OnPairMF:
        del params["alpha"], params["warmup"]
    params.update(cfg)

    def make(seed: int = 11):
        return cls(**{**params, "seed": seed})

    return make


@pytest.fixture
def small_noise_blocks(monkeypatch):
    """Correlated noise rows in blocks of 16 steps instead of ~2 MB."""
    from stream_dp.online import correlated

    monkeypatch.setattr(correlated, "block_rows", lambda size: 16)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_path_equals_learn_one_without_numba(name: str, small_noise_blocks) -> None:
    cfg = CONFIGS[name]
    make = _maker(cfg)
    X, y = _stream(1 + list(CONFIGS).index(name), cfg["task"])
    reference, ref_model = _run(make, X, y, numba=False, mode="one")
    assert reference["t"] > 0
    if reference.get("ledger") is not None:
        assert len(reference["ledger"]) > 0
    for numba in (True, False):
        for mode in ("one", "many"):
            for checkpoint_at in (None, 53):
                if not numba and mode == "one" and checkpoint_at is None:
                    continue  # the reference itself
                got, _ = _run(make, X, y, numba=numba, mode=mode, checkpoint_at=checkpoint_at)
                _assert_same(reference, got)


@pytest.mark.parametrize("task", ["auc", "metric"])
def test_learn_many_equals_learn_one_after_every_batch(task: str) -> None:
    make = _maker(dict(cls=OnPairStrC, task=task, buffer="fifo:6", smoothing_window=2))
    X, y = _stream(21, task)
    labels = _labels(y)
    one, many = make(), make()
    stop = 0
    for size in BATCHES:
        for i in range(stop, stop + size):
            one.learn_one(X[i], labels[i])
        many.learn_many(X[stop : stop + size], y[stop : stop + size])
        stop += size
        _assert_same(_snapshot(one), _snapshot(many))


def test_giga_learn_many_equals_learn_one() -> None:
    for task in ("auc", "metric"):
        X, y = _stream(5, task)
        labels = _labels(y)
        with _jit.use_numba(False):
            ref = PairwiseGIGA(task=task, alpha=0.5, buffer="fifo:8", features=D)
            for x, lab in zip(X, labels, strict=True):
                ref.learn_one(x, lab)
        fast = PairwiseGIGA(task=task, alpha=0.5, buffer="fifo:8", features=D)
        fast.learn_many(X[:40], y[:40])
        fast.learn_many(X[40:], y[40:])
        _assert_same(_snapshot(ref), _snapshot(fast))


def test_a_refused_release_mid_batch_is_handled_as_one_record_at_a_time() -> None:
    """A foreign charge on the same budget eats most of it: the release of some step in the
    middle of a batch is refused. Every path ends like learn_one: the refused step's record was
    learned but its release never made, the rest are rejected, and the ledger is identical. The
    last affordable releases are decided exactly, one step at a time, on the fast path too."""
    X, y = _stream(7, "auc")

    def make(seed: int = 3):
        m = OnPairStrC(
            task="auc", alpha=1.0, warmup=5, horizon=N, buffer="fifo:6", seed=seed,
            reproducible=True, features=D,
        )  # fmt: skip
        sigma = 1.0 / math.sqrt(2 * 0.97 * m.budget.limit)
        m.budget.charge(GaussianEvent(step=0, sensitivity=1.0, sigma=sigma))
        return m

    reference, ref = _run(make, X, y, numba=False, mode="one")
    assert ref.exhausted and 5 < ref.step < N and ref.n_rejected == N - ref.step
    for numba in (True, False):
        got, _ = _run(make, X, y, numba=numba, mode="many")
        _assert_same(reference, got)
        got, _ = _run(make, X, y, numba=numba, mode="one")
        _assert_same(reference, got)


@pytest.mark.parametrize("task", ["auc", "metric"])
def test_an_invalid_row_stops_learn_many_where_learn_one_would(task: str) -> None:
    X, y = _stream(9, task)
    X = X.copy()
    X[37, 1] = np.nan
    make = _maker(dict(cls=OnPairStrC, task=task, buffer="fifo:5"))
    one, many = make(), make()
    labels = _labels(y)
    for i in range(37):
        one.learn_one(X[i], labels[i])
    with pytest.raises(InvalidRecord):
        one.learn_one(X[37], labels[37])
    with pytest.raises(InvalidRecord):
        many.learn_many(X, y)
    _assert_same(_snapshot(one), _snapshot(many))


def test_learn_many_takes_dataframes_with_the_dict_schema() -> None:
    pd = pytest.importorskip("pandas")
    X, y = _stream(12, "metric")
    frame = pd.DataFrame(X[:, ::-1], columns=[f"x{i}" for i in reversed(range(D))])
    make = _maker(dict(cls=OnPairStrC, task="metric", buffer="fifo:6"))
    one, many = make(), make()
    for x, lab in zip(X, _labels(y), strict=True):
        one.learn_one(_dict(x), lab)
    many.learn_many(frame, pd.Series(y))
    _assert_same(_snapshot(one), _snapshot(many))
    probs = many.predict_proba_many if hasattr(many, "predict_proba_many") else None
    assert probs is None  # the metric learner is a transformer


def test_predict_proba_many_equals_predict_proba_one() -> None:
    X, y = _stream(13, "auc")
    m = _maker(dict(cls=OnPairStrC, task="auc", buffer="fifo:6"))()
    m.learn_many(X, y)
    rows = m.predict_proba_many(X[:20] * 3)  # some rows are clipped, as at training time
    for x, row in zip(X[:20] * 3, rows, strict=True):
        p = m.predict_proba_one(x)
        assert row[1] == pytest.approx(p[True], rel=1e-12)
        assert row[0] == pytest.approx(p[False], rel=1e-12)
    np.testing.assert_array_equal(m.predict_many(X[:20]), [m.predict_one(x) for x in X[:20]])


# --- the building blocks ----------------------------------------------------------------------


@_jit.njit
def _compiled_buffer_terms(code, d, w, s, x, y, X, Y, n, g, kappa, knee):  # pragma: no cover
    """:func:`losses.buffer_terms` in compiled code, as the fast path calls it. One kernel with
    the task as an argument: compiled once (and cached) for every case below."""
    return losses.buffer_terms(code, d, w, s, x, y, X, Y, n, True, True, g, kappa, knee)


@pytest.mark.parametrize(("task", "cap"), [("auc", None), ("auc", 0.5), ("auc", 0.27),
                                            ("metric", None)])  # fmt: skip
def test_buffer_terms_are_the_regularised_loss(task: str, cap: float | None) -> None:
    """The fast path's compiled loss over a buffer is the loss classes' value and gradient (the
    capped logistic AUC loss too)."""
    if not _jit.NUMBA_INSTALLED:
        pytest.skip("numba is not installed")
    rng = np.random.default_rng(4)
    d, n = 5, 23
    X = np.stack([clip_norm(r, 1.0) for r in rng.normal(size=(n + 1, d))])
    if task == "auc":
        Y = np.where(rng.random(n + 1) < 0.5, 1.0, -1.0)
        w, s = rng.normal(size=d) / 3, rng.normal(size=d) / 3
    else:
        Y = rng.integers(0, 3, size=n + 1).astype(float)
        A, B = rng.normal(size=(d, d)), rng.normal(size=(d, d))
        w, s = PSDFrobeniusBall(1.0).project(A), PSDFrobeniusBall(1.0).project(B)
    loss = get_loss(task) if cap is None else losses.LogisticAUCLoss(slope_cap=cap)
    if cap is not None:  # misranked pairs on both sides of the knee
        w, s = 4 * w, 4 * s
    g = np.zeros(w.size)
    code = 0 if task == "auc" else 1
    kappa, knee = getattr(loss, "cap", 1.0), getattr(loss, "knee", -np.inf)

    value = _compiled_buffer_terms(code, d, w.ravel(), s.ravel(), X[n], Y[n], X, Y, n, g,
                                   float(kappa), float(knee))  # fmt: skip
    assert value / n == pytest.approx(loss.value(s, X[n], Y[n], X[:n], Y[:n]), rel=1e-13)
    np.testing.assert_allclose(
        g.reshape(w.shape) / n, loss.gradient(w, X[n], Y[n], X[:n], Y[:n]), rtol=1e-12,
        atol=1e-14,
    )  # fmt: skip
    reg = Regularized(loss, 0.3)
    assert reg.value(s, X[n], Y[n], X[:n], Y[:n]) == pytest.approx(
        value / n + 0.15 * float(np.sum(s**2)), rel=1e-13
    )


def test_psd_projection_skips_the_eigendecomposition_only_for_feasible_points() -> None:
    rng = np.random.default_rng(8)
    C = PSDFrobeniusBall(1.0)
    for _ in range(50):
        A = rng.normal(size=(6, 6))
        P = A @ A.T
        P *= rng.uniform(0.1, 2.0) / np.linalg.norm(P)  # PD, inside or outside the ball
        got = C.project(P)
        lam, V = np.linalg.eigh(P)
        lam = lam * min(1.0, 1.0 / np.linalg.norm(lam))
        np.testing.assert_allclose(got, (V * lam) @ V.T, atol=1e-13)
        if np.linalg.norm(P) <= 1.0:
            assert np.array_equal(got, 0.5 * (P + P.T))  # exactly itself: no round trip
        S = 0.5 * (A + A.T)  # indefinite: the eigen path
        lam, V = np.linalg.eigh(S)
        lam = np.maximum(lam, 0.0)
        lam = lam * min(1.0, 1.0 / np.linalg.norm(lam))
        np.testing.assert_allclose(C.project(S), (V * lam) @ V.T, atol=1e-13)
    w = np.array([3.0, 4.0])
    np.testing.assert_allclose(L2Ball(1.0).project(w), [0.6, 0.8], rtol=1e-15)
    assert np.array_equal(L2Ball(10.0).project(w), w)


@pytest.mark.parametrize("spec", ["fifo:7", "all", "reservoir:5"])
def test_planned_writes_are_the_sequential_writes(spec: str) -> None:
    noise = KeyedNoise(secret=4)
    a, b = make_buffer(spec), make_buffer(spec)
    a.bind(2)
    b.bind(2)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 2))
    t = 0
    for m in (1, 5, 64, 1, 100, 129):
        off, slots, nb = b.plan_writes(t, m, noise)
        off, slots, nb = off.copy(), slots.copy(), nb.copy()
        for j in range(m):
            assert nb[j] == len(a)
            written = a.add(X[t + j], 1.0, t + 1 + j, noise)
            assert [s for s, _ in written] == list(slots[off[j] : off[j + 1]])
            for s in slots[off[j] : off[j + 1]]:
                b.X[s], b.Y[s], b.ids[s] = X[t + j], 1.0, t + 1 + j
        b.advance(m)
        assert nb[m] == len(a) == len(b)
        np.testing.assert_array_equal(a.member_ids(), b.member_ids())
        np.testing.assert_array_equal(a.view()[0], b.view()[0])
        t += m


def test_clip_rows_is_clip_norm_row_by_row_bit_for_bit() -> None:
    rng = np.random.default_rng(2)
    X = rng.normal(size=(500, 7)) * rng.choice([0.1, 0.5, 1.0, 3.0, 1e200], size=(500, 1))
    X[0] = [1.0, 0, 0, 0, 0, 0, 0]  # exactly on the sphere
    rows = clip_rows(X, 1.0)
    for x, r in zip(X, rows, strict=True):
        assert np.array_equal(clip_norm(x.copy(), 1.0), r)


def test_blocked_noise_is_a_pure_function_of_the_step() -> None:
    a, b = KeyedNoise(secret=5, model_id="m"), KeyedNoise(secret=5, model_id="m")
    size = 16
    B = rows_per_block(size)
    assert B > 1
    steps = np.array([3, B + 2, 1, 5 * B, B - 1, 2, 7 * B + 3])
    sigmas = np.linspace(0.5, 2.0, len(steps))
    rows = a.gaussian_rows(steps, size, sigmas)
    for j, t in enumerate(steps[::-1]):  # another order, another object: the same values
        k = len(steps) - 1 - j
        assert np.array_equal(b.gaussian(int(t), (size,), float(sigmas[k])), rows[k])
        assert np.array_equal(rows[k], sigmas[k] * a.standard_row(int(t), size))
    assert not np.array_equal(rows[0], KeyedNoise(secret=6, model_id="m").gaussian(3, (16,), 0.5))
    assert not np.array_equal(rows[0], KeyedNoise(secret=5, model_id="n").gaussian(3, (16,), 0.5))
    # Many steps in one call are exactly the per-step values.
    many = a.gaussian_rows(np.arange(1, 3 * B), size, np.ones(3 * B - 1))
    for t in (1, B - 1, B, 2 * B + 5):
        assert np.array_equal(many[t - 1], b.gaussian(t, (size,), 1.0))


def test_a_noise_source_given_to_the_constructor_is_the_one_released_and_marked() -> None:
    """``noise_source=`` is a constructor collaborator: its draws are what is released (on the
    reference step, since the fast path reads only the default keyed noise), the ledger is the
    same, and the learner says its releases are not private."""

    class Doubled(KeyedNoise):
        def gaussian(self, step, shape, sigma, purpose="release"):
            return super().gaussian(step, shape, 2.0 * sigma, purpose)

    X, y = _stream(3, "auc")
    make = _maker(
        dict(cls=OnPairStrC, task="auc", buffer="fifo:5", track_regret=False, release_every=1)
    )
    plain = make()
    doubled = OnPairStrC(**{**plain._get_params(), "noise_source": Doubled})
    batch = OnPairStrC(**{**plain._get_params(), "noise_source": Doubled})
    for x, lab in zip(X[:30], _labels(y[:30]), strict=True):
        plain.learn_one(x, lab)
        doubled.learn_one(x, lab)
    batch.learn_many(X[:30], y[:30])
    w = doubled.state_dict()["w"]
    np.testing.assert_allclose(plain.state_dict()["w"], w, rtol=TOL, atol=TOL)  # fast vs reference
    assert plain.accountant.ledger == doubled.accountant.ledger
    keyed = KeyedNoise(secret=11, model_id="fast")
    sigma = doubled.accountant.ledger[-1].sigma
    expected = L2Ball(1.0).project(w + keyed.gaussian(30, (D,), 2.0 * sigma))
    np.testing.assert_array_equal(doubled.private_weights, expected)
    np.testing.assert_allclose(batch.private_weights, doubled.private_weights, atol=TOL)
    assert not doubled.private and not doubled.release_message()["private"]


# --- memory --------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", ["auc", "metric"])
def test_state_stays_constant_once_the_buffer_is_full(task: str) -> None:
    """FIFO buffer, regret without history: nothing but the ledger grows with the stream."""
    m = OnPairStrC(
        task=task, alpha=1.0, warmup=5, buffer="fifo:16", seed=1, reproducible=True,
        keep_history=False, features=D, release_every=1,
    )  # fmt: skip
    X, y = _stream(30, task, n=3000)
    m.learn_many(X[:100], y[:100])
    sizes = m.nbytes()
    for start in range(100, 3000, 250):
        m.learn_many(X[start : start + 250], y[start : start + 250])
        for x, lab in zip(X[start : start + 3], _labels(y[start : start + 3]), strict=True):
            m.learn_one(x, lab)
        now = m.nbytes()
        assert {k: v for k, v in now.items() if k != "ledger"} == {
            k: v for k, v in sizes.items() if k != "ledger"
        }
    assert m.nbytes()["regret"] == 0
    # The ledger is the one thing that grows: one charge per release, a few dozen bytes each.
    per_charge = (m.nbytes()["ledger"] - sizes["ledger"]) / (m.n_releases - (100 - 5))
    assert 0 < per_charge <= 64


def test_the_all_buffer_warns_above_its_configured_size() -> None:
    X, y = _stream(31, "auc", n=200)
    m = OnPairStrC(
        task="auc",
        alpha=1.0,
        warmup=5,
        buffer="all",
        max_buffer_warning=50,
        seed=2,
        reproducible=True,
        features=D,
    )
    with pytest.warns(ResourceWarning, match="O\\(n·d\\)"):
        m.learn_many(X[:120], y[:120])
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)  # once, not per record
        m.learn_many(X[120:], y[120:])
        m.learn_one(X[0], bool(y[0]))
    one = OnPairStrC(
        task="auc",
        alpha=1.0,
        warmup=5,
        buffer="all",
        max_buffer_warning=50,
        seed=2,
        reproducible=True,
        features=D,
    )
    with pytest.warns(ResourceWarning):
        for x, lab in zip(X[:60], _labels(y[:60]), strict=True):
            one.learn_one(x, lab)
    assert m.nbytes()["buffer"] >= 201 * (D * 8 + 16)  # O(n·d): every record is kept


def test_a_long_batch_is_cut_into_compiled_calls_without_changing_anything() -> None:
    """learn_many over more rows than one compiled call takes (CHUNK_ROWS) equals learn_one."""
    n = 2 * CHUNK_ROWS + 37
    X, y = _stream(41, "auc", n=n)
    make = _maker(dict(cls=OnPairStrC, task="auc", buffer="fifo:16", horizon=None))
    one, many = make(), make()
    for x, lab in zip(X, _labels(y), strict=True):
        one.learn_one(x, lab)
    many.learn_many(X, y)
    assert many.step == one.step == n
    _assert_same(_snapshot(one), _snapshot(many))


def test_decay_bounds_compiled_equals_numpy_bit_for_bit() -> None:
    """The certified recurrence's slot update: the numba loop gives NumPy's bits and maximum."""
    if not _jit.NUMBA_INSTALLED:
        pytest.skip("numba is not installed")
    import numba

    compiled = numba.njit(lambda b, q, e, diam: sensitivity.decay_bounds(b, q, e, diam))
    rng = np.random.default_rng(17)
    for n in (1, 2, 7, 64, 257):
        b = rng.uniform(0.0, 2.0, size=n)
        for q, e, diam in ((0.999, 1e-3, 1.5), (1.0, 0.0, 2.0), (0.5, 0.7, 0.9)):
            ref, got = b.copy(), b.copy()
            top_ref = sensitivity.decay_bounds(ref, q, e, diam)
            top_got = compiled(got, q, e, diam)
            assert got.tobytes() == ref.tobytes() and top_got == top_ref


def test_the_rings_numpy_mean_is_window_mean_bit_for_bit() -> None:
    """Python serves the smoothed release with NumPy's mean, compiled code with window_mean:
    both add the rows oldest first, so they agree to the bit."""
    from stream_dp.online.release import HEAD, ReleaseRing, window_mean

    rng = np.random.default_rng(0)
    for _ in range(100):
        k, d = int(rng.integers(1, 60)), int(rng.integers(1, 40))
        ring = ReleaseRing(window=k, shape=(d,))
        for step in range(1, int(rng.integers(1, 3 * k)) + 1):
            ring.push(rng.normal(size=d) * 10 ** rng.uniform(-4, 4), step, learned=True)
        expected = window_mean(ring.rows, ring.count, int(ring.state[HEAD]))
        assert np.array_equal(ring.smoothed, expected.reshape(d))


def test_the_ring_serves_what_its_state_says_after_pushes_it_was_not_told_of() -> None:
    """The compiled path pushes with ``ring_push`` on the ring's arrays, behind the object's
    back: the served latest release and mean follow the state at every call (never a cached,
    stale one), and a withdrawn ring serves nothing."""
    from stream_dp.online.release import ReleaseRing, ring_push

    rng = np.random.default_rng(1)
    for k in (1, 3):
        ring = ReleaseRing(window=k, shape=(2, 2))
        assert ring.latest is None and ring.smoothed is None
        pushed = []
        for step in range(1, 8):
            rel = rng.normal(size=4)
            _ = ring.smoothed  # cache the mean before the push
            ring_push(ring.rows, ring.norms, ring.state, rel, step, True, 0)
            pushed.append(rel)
            assert np.array_equal(ring.latest, rel.reshape(2, 2))
            mean = np.cumsum(np.array(pushed[-k:]), axis=0)[-1] / min(k, len(pushed))
            assert np.array_equal(ring.smoothed, mean.reshape(2, 2))
            for smoothed, model in ((False, rel), (True, mean)):
                served, norm = ring.served_and_norm(smoothed)
                assert np.array_equal(served, model.reshape(2, 2))
                assert norm == pytest.approx(np.linalg.norm(model), rel=1e-15)
            assert not ring.latest.flags.writeable and not ring.smoothed.flags.writeable
        ring.withdraw()
        assert ring.latest is None and ring.smoothed is None
        assert ring.served_and_norm(False) == (None, 0.0)


@pytest.mark.parametrize(
    "make, arrays",
    [
        (lambda: OnPairStrC(task="auc", epsilon=1.0, features=D, buffer=16, seed=1,
                            reproducible=True, warmup=3),
         lambda m: [(m.mechanism.tracker, "state"), (m.mechanism.tracker, "slot_bound")]),
        (lambda: OnPairMF(task="auc", epsilon=1.0, features=D, buffer=16, seed=1,
                          reproducible=True),
         lambda m: [(m.mechanism, "block"), (m.mechanism, "average")]),
        (lambda: PairwiseGIGA(task="auc", features=D, buffer=16), lambda m: []),
    ],
    ids=["output", "correlated", "none"],
)  # fmt: skip
def test_the_struct_is_rebuilt_when_any_source_is_replaced(make, arrays) -> None:
    """``FastPath._state``'s quick identity chain must cover every learner array of
    ``_sources_now``, and a mechanism must notice when an array its settings record holds is
    replaced (``CompiledMechanism.stale``): for each one, a struct held for another array is
    rebuilt (never served stale)."""
    if not _jit.NUMBA_INSTALLED:
        pytest.skip("numba is not installed")
    X, y = _stream(0, "auc", n=40)
    m = make()
    with _jit.use_numba(True):
        for row, label in zip(X, _labels(y), strict=True):
            m.learn_one(_dict(row), label)
    fast = m._fast
    assert fast is not None
    struct = fast._state()
    held = fast._sources
    assert fast._state() is struct  # nothing replaced: the quick chain accepts it
    for i in range(len(held)):
        fast._sources = held[:i] + (np.zeros(1),) + held[i + 1 :]  # as if its owner replaced it
        rebuilt = fast._state()
        assert rebuilt is not struct, f"source {i} of _sources_now is not checked"
        assert all(a is b for a, b in zip(fast._sources, held, strict=True))
        struct = rebuilt
    for owner, name in arrays(m):
        setattr(owner, name, getattr(owner, name).copy())  # as if its owner replaced it
        assert fast.available(m.step, 1) == 1
        rebuilt = fast._state()
        assert rebuilt is not struct, f"the mechanism's {name} is not checked"
        assert fast._state() is rebuilt
        struct = rebuilt


def test_the_struct_is_built_by_the_cached_constructor() -> None:
    """A learner's struct is built by ``_new_state`` (compiled once into numba's on-disk cache),
    not by numba's generic constructor, which every process would compile afresh (0.7 s at the
    first compiled step; docs/performance.md), and holds the learner's own arrays."""
    if not _jit.NUMBA_INSTALLED:
        pytest.skip("numba is not installed")
    from stream_dp.online import fast as fast_module

    X, y = _stream(0, "auc", n=40)
    m = OnPairStrC(task="auc", horizon=None, warmup=10, features=[f"x{i}" for i in range(D)])
    with _jit.use_numba(True), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # most records are clipped
        for row, label in zip(X, _labels(y), strict=True):
            m.learn_one(_dict(row), label)
        assert m._fast is not None and m._fast._cached
    built = []
    real = fast_module._NEW_STATE
    fast_module._NEW_STATE = lambda *fields: built.append(fields) or real(*fields)
    try:
        m._fast._struct = None  # as if an array were replaced
        with _jit.use_numba(True):
            struct = m._fast._state()
    finally:
        fast_module._NEW_STATE = real
    assert len(built) == 1 and type(struct) is fast_module.FastState
    assert built[0][fast_module.FIELDS.index("w")] is m._state.w

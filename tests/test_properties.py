"""Property-based tests of every public input path (hypothesis, ≥ 1000 examples per path).

The contract (``docs/privacy.md``, *Privacy unit and neighbouring streams*): a record that must
not be learned from raises a ``ValueError`` subclass with a reason
(:class:`stream_dp.records.InvalidRecord`, :class:`connectors.schema.RecordError`) and leaves
the learner — iterate, buffer, schema, labels, ledger, counters —
*bit-identical*; a valid record, however extreme its finite values, is accepted, clipped to
``‖x‖ ≤ R`` and never crashes. Any other exception is a bug.

Paths: ``learn_one`` of OnPairStrC, OnPairC and PairwiseGIGA for both tasks, fresh (schema not
yet fixed) and trained; ``fit`` of the offline learners; ``connectors.schema.parse_record``.
"""

from __future__ import annotations

import decimal
import fractions
import json
import math
import pickle
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from connectors.schema import REASONS, InputRecord, RecordError, parse_record
from stream_dp import records as _records
from stream_dp.audit.targets import _offline_classes
from stream_dp.online import OnPairC, OnPairStrC, PairwiseGIGA
from stream_dp.records import InvalidRecord, clip_norm

EXAMPLES = 400  # per property, CI-sized; raise it for a deeper local search
PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FEATURES = ("a", "b", "c")
R = 1.0

# -- strategies ------------------------------------------------------------------------------------
huge_floats = st.sampled_from([1e308, -1e308, 1.7976931348623157e308, 1e200, -3e154, 5e-324])
finite_floats = st.floats(allow_nan=False, allow_infinity=False) | huge_floats
any_float = st.floats(allow_nan=True, allow_infinity=True)
numpy_scalars = st.sampled_from(
    [np.float64("nan"), np.float32("nan"), np.float64("inf"), np.float32("-inf"),
     np.float32(1e38), np.float64(2.5), np.int64(3), np.int8(-1), np.bool_(True),
     np.longdouble("1e4000"), np.uint64(2**64 - 1)]
)  # fmt: skip
odd_numbers = st.sampled_from(
    [10**400, -(10**400), fractions.Fraction(10**400, 3), fractions.Fraction(1, 3),
     decimal.Decimal("1.5"), decimal.Decimal("NaN"), complex(1, 1), True, False]
)  # fmt: skip
junk = st.one_of(
    st.none(), st.text(max_size=5), st.binary(max_size=5), st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2), st.just(object()),
    st.just(float), st.just([1.0, 2.0]),
)  # fmt: skip
values = st.one_of(any_float, finite_floats, st.integers(), numpy_scalars, odd_numbers, junk)
keys = st.one_of(st.sampled_from(FEATURES), st.text(max_size=3), st.integers(-2, 2), st.none())

dict_records = st.dictionaries(keys, values, max_size=5)
valid_dicts = st.dictionaries(st.sampled_from(FEATURES), finite_floats | st.integers(-10**6, 10**6),
                              min_size=1)  # fmt: skip
list_records = st.lists(values, max_size=5)
array_records = st.one_of(
    st.lists(any_float | finite_floats, max_size=5).map(np.array),
    st.lists(any_float, min_size=1, max_size=4).map(lambda v: np.array([v, v])),  # 2-D
    st.lists(st.text(max_size=2), max_size=3).map(np.array),
    st.lists(values, max_size=3).map(lambda v: np.array(v, dtype=object)),
    st.sampled_from([np.zeros(0), np.zeros((0, 3)), np.array(1.0), np.array([1, 2], np.int8)]),
)
records = st.one_of(dict_records, valid_dicts, list_records, array_records, junk)

labels = st.one_of(
    st.booleans(), st.integers(), st.sampled_from([0, 1, -1, 2, 0.0, 1.0, -1.0, 0.5]),
    any_float, st.text(max_size=3), st.none(), numpy_scalars, odd_numbers,
    st.lists(st.integers(), max_size=2), st.tuples(st.integers()), st.just({"y": 1}),
)  # fmt: skip

# -- learners --------------------------------------------------------------------------------------
LEARNERS = {
    "OnPairStrC": lambda task: OnPairStrC(
        task=task,
        epsilon=1.0,
        horizon=10_000,
        alpha=1.0,
        warmup=3,
        buffer=8,
        seed=1,
        reproducible=True,
        release_every=1,  # the properties hold release by release
        keep_history=True,
        features=FEATURES,
    ),
    "OnPairC": lambda task: OnPairC(
        task=task,
        epsilon=1.0,
        horizon=10_000,
        alpha=1.0,
        warmup=3,
        buffer="reservoir:8",
        seed=2,
        reproducible=True,
        release_every=1,
        features=FEATURES,
    ),
    "PairwiseGIGA": lambda task: PairwiseGIGA(
        task=task, alpha=1.0, buffer="all", seed=3, reproducible=True
    ),
}


def _templates(name: str, task: str) -> tuple[bytes, bytes]:
    """Pickled learners: one that has seen nothing, one trained past its warm-up."""
    fresh = LEARNERS[name](task)
    trained = LEARNERS[name](task)
    rng = np.random.default_rng(0)
    for i in range(12):
        y = bool(i % 2) if task == "auc" else ("x", "y", 7)[i % 3]
        trained.learn_one(dict(zip(FEATURES, rng.normal(size=3), strict=True)), y)
    if hasattr(trained, "accountant"):
        assert name == "PairwiseGIGA" or len(trained.accountant.ledger) > 0
    return pickle.dumps(fresh), pickle.dumps(trained)


_CACHE: dict[tuple[str, str], tuple[bytes, bytes]] = {}


def _template(name: str, task: str, trained: bool) -> bytes:
    if (name, task) not in _CACHE:
        _CACHE[(name, task)] = _templates(name, task)
    return _CACHE[(name, task)][int(trained)]


def _snapshot(model) -> bytes:
    return pickle.dumps(model)


def _check_accepted(model, before_t: int, y) -> None:
    assert model.step == before_t + 1
    X = model.state_dict()["buffer"]["X"]
    assert np.isfinite(X).all()
    assert np.all(np.linalg.norm(X, axis=1) <= R * (1 + 1e-12))
    w = model.private_weights if not isinstance(model, PairwiseGIGA) else model.weights
    assert w is None or np.isfinite(w).all()
    if model.task == "auc":
        assert y in (True, False, 1, 0, -1) and not isinstance(y, str)
    else:  # any hashable class label, but not a missing one
        assert y is not None and not (isinstance(y, float | np.floating) and np.isnan(y))


def _learn(model, x, y):
    """learn_one with numerical warnings turned into errors: an overflow is a bug, not noise."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        model.learn_one(x, y)


PATHS = [(name, task) for name in LEARNERS for task in ("auc", "metric")]


@pytest.mark.parametrize(("name", "task"), PATHS, ids=[f"{n}-{t}" for n, t in PATHS])
@PROPERTY
@given(x=records, y=labels, trained=st.booleans())
def test_learn_one_rejects_without_a_trace_or_accepts_and_clips(name, task, x, y, trained):
    model = pickle.loads(_template(name, task, trained))
    before = _snapshot(model)
    before_t = model.step
    ledger = None if model.accountant is None else model.accountant.to_dict()
    try:
        _learn(model, x, y)
    except InvalidRecord as exc:
        event(f"rejected: {exc.reason}")
        assert isinstance(exc, ValueError) and exc.reason
        assert _snapshot(model) == before, f"state changed by a rejected record ({exc.reason})"
        if ledger is not None:
            after = model.accountant.to_dict()
            assert pickle.dumps(after) == pickle.dumps(ledger)
        return
    event("accepted")
    _check_accepted(model, before_t, y)


batch_rows = st.one_of(
    st.lists(any_float | finite_floats, min_size=3, max_size=3),
    st.lists(finite_floats, min_size=3, max_size=3),
    st.lists(finite_floats, min_size=3, max_size=3),
    st.lists(values, min_size=0, max_size=4),
)
batches = st.lists(batch_rows, max_size=5).flatmap(
    lambda rows: st.tuples(
        st.one_of(st.just(rows), st.just(rows).map(lambda r: np.array(r, dtype=object))),
        st.integers(0, 3).flatmap(
            lambda k: st.lists(labels, max_size=6) if k == 0 else st.lists(
                labels | st.sampled_from([True, False, "x", "y"]), min_size=len(rows),
                max_size=len(rows))),
    )
)  # fmt: skip


def _as_batch(X):
    """A float matrix when the rows allow it (learn_many's fast path), else as drawn."""
    try:
        A = np.array(X, dtype=float)
    except (TypeError, ValueError, OverflowError):
        return X
    return A if A.ndim == 2 else X


@pytest.mark.parametrize(("name", "task"), PATHS, ids=[f"{n}-{t}" for n, t in PATHS])
@PROPERTY
@given(batch=batches, trained=st.booleans(), fast=st.booleans())
def test_learn_many_is_learn_one_row_by_row(name, task, batch, trained, fast):
    """``learn_many`` learns exactly the rows ``learn_one`` would, stops at the first invalid
    row with the same InvalidRecord, and leaves no trace of what it rejected."""
    X, y = batch
    if fast:
        X = _as_batch(X)
    many = pickle.loads(_template(name, task, trained))
    one = pickle.loads(_template(name, task, trained))
    before = _snapshot(many)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            many.learn_many(X, y)
        raised = None
    except InvalidRecord as exc:
        raised = exc.reason
    except ValueError as exc:  # X and y of different lengths: nothing may happen
        event("rejected: length mismatch")
        assert len(X) != len(y), exc
        assert _snapshot(many) == before
        return
    expected = None
    for xi, yi in zip(X, y, strict=True):
        try:
            _learn(one, xi, yi)
        except InvalidRecord as exc:
            expected = exc.reason
            break
    event(f"stopped: {expected}" if expected else "all learned")
    assert raised == expected
    if one.step == 12 * trained:  # nothing learned: bit-identical to before
        assert _snapshot(many) == before
    assert many.step == one.step
    if many.accountant is not None:
        assert pickle.dumps(many.accountant.to_dict()) == pickle.dumps(one.accountant.to_dict())
        a, b = many.private_weights, one.private_weights
        assert (a is None) == (b is None) and (a is None or np.allclose(a, b, atol=1e-12))
    Xm, Xo = many.state_dict()["buffer"]["X"], one.state_dict()["buffer"]["X"]
    assert np.array_equal(Xm, Xo)


def _norm(v: np.ndarray) -> float:
    """‖v‖ without overflowing on the way (the norm itself may be up to √d · 1.8e308)."""
    scale = float(np.max(np.abs(v))) if v.size else 0.0
    return scale * float(np.linalg.norm(v / scale)) if scale > 0 else 0.0


def _direction_kept(raw: np.ndarray, clipped: np.ndarray) -> bool:
    """``clipped`` points along ``raw`` (cosine computed without overflow)."""
    if not raw.any():
        return not clipped.any()
    if not clipped.any():
        return False
    u, v = _unit(raw), _unit(clipped)
    return abs(float(u @ v) - 1.0) < 1e-9


def _unit(v: np.ndarray) -> np.ndarray:
    s = v / np.max(np.abs(v))  # scale down first, so nothing overflows
    return s / np.linalg.norm(s)


@PROPERTY
@given(x=st.lists(finite_floats, min_size=1, max_size=8).map(np.array),
       radius=st.sampled_from([1e-3, 1.0, 7.5, 1e150, 1.7e308]))  # fmt: skip
def test_clip_norm_keeps_the_direction_and_bounds_the_norm(x, radius):
    """The clip is part of the privacy proof: ``‖clip(x)‖ ≤ R`` for every finite x, along x's
    own direction — also when ‖x‖² overflows a double — and x itself when already inside."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        out = clip_norm(x.copy(), radius)
        clip_rows = getattr(_records, "clip_rows", None)  # the batched clip, where it exists
        rows = None if clip_rows is None else clip_rows(np.stack([x, x]), radius)
    assert np.isfinite(out).all()
    assert rows is None or (np.array_equal(rows[0], out) and np.array_equal(rows[1], out))
    norm_x, norm_out = _norm(x), _norm(out)
    assert norm_out <= radius * (1 + 1e-12)
    if norm_x <= radius:
        assert np.array_equal(out, x)
    else:
        assert _direction_kept(x, out)
        assert norm_out == pytest.approx(radius, rel=1e-12)


@PROPERTY
@given(
    path=st.sampled_from(PATHS),
    x=st.dictionaries(st.sampled_from(FEATURES), finite_floats, min_size=1),
    trained=st.booleans(),
)
def test_extreme_finite_values_are_accepted_and_learned(path, x, trained):
    """Huge finite values are valid records: accepted without a warning, clipped, and the
    models that leave the learner stay finite."""
    name, task = path
    model = pickle.loads(_template(name, task, trained))
    y = True if task == "auc" else "x"
    _learn(model, x, y)
    _check_accepted(model, 12 if trained else 0, y)


# -- offline learners ------------------------------------------------------------------------------
OFFLINE = _offline_classes()
bad_matrices = st.one_of(
    st.lists(st.lists(any_float, min_size=2, max_size=2), min_size=0, max_size=5).map(np.array),
    st.lists(any_float, max_size=5).map(np.array),  # 1-D
    st.just(np.zeros((4, 0))),
    st.just(np.zeros((2, 2, 2))),
    st.lists(st.lists(st.text(max_size=2), min_size=2, max_size=2), min_size=1, max_size=3),
    st.lists(st.lists(values, min_size=2, max_size=2), min_size=1, max_size=3),
    junk,
)
good_matrices = st.lists(st.lists(finite_floats, min_size=2, max_size=2), min_size=6, max_size=6)
good_labels = st.sampled_from([np.array([1, 0, 1, 0, 1, 0]), np.array(list("abcabc"))])
bad_labels = st.one_of(
    st.lists(labels, max_size=6),
    st.lists(any_float, max_size=6).map(np.array),
    st.just(np.zeros((6, 2))),
    junk,
)


def _offline(name: str, task: str):
    params = dict(task=task, epsilon=1.0, delta=1e-5, seed=5, reproducible=True)
    if name in ("offpairstrc", "offpairc"):
        params.update(warmup=2, sensitivity="certified", alpha=1.0)
    return OFFLINE[name](**params)


def _fitted_template(name: str, task: str) -> bytes:
    key = ("offline", name, task)
    if key not in _CACHE:
        rng = np.random.default_rng(1)
        X = rng.normal(size=(6, 2))
        y = np.array([1, 0, 1, 0, 1, 0]) if task == "auc" else np.array(list("abcabc"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = _offline(name, task).fit(X, y)
        _CACHE[key] = (pickle.dumps(model), b"")
    return _CACHE[key][0]


OFFLINE_PATHS = [(n, t) for n in sorted(OFFLINE) for t in ("auc", "metric")]


@pytest.mark.skipif(not OFFLINE, reason="no offline learners in stream_dp.offline")
@PROPERTY
@given(
    path=st.sampled_from(OFFLINE_PATHS),
    X=st.booleans().flatmap(lambda good: good_matrices if good else bad_matrices),
    y=st.booleans().flatmap(lambda good: good_labels if good else bad_labels),
)
def test_offline_fit_rejects_bad_data_with_a_value_error(path, X, y):
    """``fit`` on bad X/y raises a ValueError (never another exception) and a rejected fit
    leaves a fitted model's release and ledger bit-identical."""
    name, task = path
    try:
        model = pickle.loads(_fitted_template(name, task))
    except ValueError:  # e.g. an algorithm without the metric task
        pytest.skip(f"{name} does not support task={task}")
    before = pickle.dumps(model)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the algorithms' own advice (T1 ≥ n, σ raised, ...)
            model.fit(X, y)
    except ValueError as exc:
        event(f"rejected: {type(exc).__name__}: {str(exc)[:30]}")
        assert pickle.dumps(model) == before
        return
    event("accepted")
    # Accepted: the data was valid. The release lies in C and the ledger is within budget.
    w = model.private_weights
    assert w is not None and np.isfinite(w).all()
    assert np.linalg.norm(w) <= model.model_radius * (1 + 1e-9)
    eps, delta = model.accountant.spent()
    assert eps <= model.epsilon * (1 + 1e-12)


@pytest.mark.skipif(not OFFLINE, reason="no offline learners in stream_dp.offline")
@PROPERTY
@given(
    name=st.sampled_from(sorted(n for n in OFFLINE if n in ("offpairstrc", "offpairc", "dpgdsc",
                                                             "dpgdc", "pairwisesgd"))),
    X=st.lists(st.lists(finite_floats, min_size=3, max_size=3), min_size=4, max_size=6),
)  # fmt: skip
def test_offline_fit_accepts_extreme_finite_values(name, X):
    X = np.array(X)
    y = np.arange(len(X)) % 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("error", RuntimeWarning)
        model = _offline(name, "auc").fit(X, y)
    w = model.private_weights
    assert np.isfinite(w).all() and np.linalg.norm(w) <= model.model_radius * (1 + 1e-9)


# -- the record schema of the connectors ---------------------------------------------------------
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | any_float | st.text(max_size=4),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3),
                                                                      children, max_size=3),
    max_leaves=8,
)  # fmt: skip
record_like = st.fixed_dictionaries(
    {},
    optional={"x": st.one_of(dict_records, list_records, json_values, valid_dicts),
              "y": labels | json_values, "key": json_values, "ts": json_values | st.text()},
)  # fmt: skip

valid_like = st.fixed_dictionaries({"x": valid_dicts, "y": labels})


def _check_record(rec: InputRecord) -> None:
    xs = rec.x.values() if isinstance(rec.x, dict) else rec.x
    assert len(xs) > 0 and all(isinstance(v, float) and math.isfinite(v) for v in xs)
    assert rec.y is not None
    assert rec.ts is None or math.isfinite(rec.ts)


@PROPERTY
@given(
    raw=st.one_of(
        record_like,
        json_values,
        valid_like,
        st.binary(max_size=40),
        st.text(max_size=40),
        record_like.map(lambda d: json.dumps(d, default=str)),
        record_like.map(lambda d: json.dumps(d, default=str).encode()),
    )
)
def test_parse_record_returns_a_valid_record_or_a_record_error(raw):
    try:
        rec = parse_record(raw)
    except RecordError as exc:
        event(f"rejected: {exc.reason}")
        assert isinstance(exc, ValueError) and exc.reason in REASONS
        return
    event("accepted")
    _check_record(rec)


@PROPERTY
@given(x=st.dictionaries(st.text(min_size=1, max_size=3), finite_floats | st.integers(),
                         min_size=1, max_size=4),
       y=st.booleans() | st.integers(-5, 5) | st.text(min_size=1, max_size=3))  # fmt: skip
def test_parse_record_accepts_extreme_finite_values_on_every_path(x, y):
    """A valid record is accepted identically as a dict, as JSON text and as UTF-8 bytes;
    integers beyond a double are rejected as non-finite, never crash."""
    record = {"x": x, "y": y}
    text = json.dumps(record)
    try:
        parsed = [parse_record(record), parse_record(text), parse_record(text.encode())]
    except RecordError as exc:
        assert exc.reason == "non_finite"
        assert any(isinstance(v, int) and abs(v) > 1.8e308 for v in x.values())
        return
    assert parsed[0] == parsed[1] == parsed[2]
    _check_record(parsed[0])
    assert parsed[0].to_vector(sorted(x)).shape == (len(x),)

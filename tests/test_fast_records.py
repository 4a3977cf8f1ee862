"""The engine's fast paths for records and releases equal the validated ones they stand for.

``parse_conformed`` checks plain records without building an ``InputRecord``;
``ReleaseEncoder`` writes release messages from a template. Both must accept, reject and
produce exactly what ``parse_record`` + ``conform_features`` and ``ReleaseMessage`` do.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_connectors import BAD_RECORDS

from connectors.schema import (
    RecordError,
    ReleaseEncoder,
    ReleaseMessage,
    conform_features,
    parse_conformed,
    parse_record,
)

SCHEMA = ["a", "b", "c"]

PLAIN = [
    b'{"x": {"a": 1, "b": 2.5}, "y": 1}',
    b'{"x": {"a": -0.0, "c": 1e-300}, "y": true}',
    b'{"x": {"a": 1, "zz": 2}, "y": false, "key": "user-7"}',
    b'{"x": {"a": 3}, "y": "positive"}',
    b'{"x": {"a": 3}, "y": -0.25}',
    b'{"x": {"a": 3}, "y": 123456789012345678901234567890}',
    b'{"x": {"a": 179769313486231570000000000000000000000000000000000000000000000000000000000'
    b"000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
    b"000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
    b"000000000000000000000000000000000000000000000000000000000000000000000000000000000"
    b'}, "y": 1}',
    b'{"x": {"zz": 1}, "y": 1}',  # no declared feature
    b'{"x": {"\\ud800": 1, "a": 2}, "y": 1}',  # a lone surrogate name
    b'{"x": {"\\ud800": 1}, "y": 1}',
    b'{"x": {"a": 1}, "y": 1, "ts": 1700000000}',
    b'{"x": {"a": 1}, "y": 1, "ts": null}',
    b'{"x": {"a": 1}, "y": 1, "key": null}',
    b'{"x": {"a": 1}, "y": 1, "pad": [1, 2, {"deep": true}]}',
    b'{"x": [1, 2, 3], "y": 1}',
    b'{"x": [1, 2], "y": 1}',
    b'{"x": {"a": 1e308, "b": -1e308}, "y": 0}',
    b'{"x": {"a": 1}, "y": 0.0}',
    # every declared feature, floats only: the decoded object is kept as it is
    b'{"x": {"c": 0.5, "a": -1.5, "b": 2.0}, "y": 1}',
    b'{"x": {"a": 1e308, "b": 1e308, "c": 1.0}, "y": 1}',  # the sum overflows; each is finite
    b'{"x": {"a": NaN, "b": 1.0, "c": 2.0}, "y": 1}',
    b'{"x": {"a": Infinity, "b": -Infinity, "c": 2.0}, "y": 1}',
    b'{"x": {"a": 1, "b": 1.0, "c": 2.0}, "y": 1}',
    b'{"x": {"a": true, "b": 1.0, "c": 2.0}, "y": 1}',
    b'{"x": {"a": 1.0, "b": 1.0, "zz": 2.0}, "y": 1}',
    '{"x": {"a": 1}, "y": 1}',
]


def slow(raw, max_bytes: int = 1_000_000):
    rec = parse_record(raw, max_bytes=max_bytes)
    x, n_unknown = conform_features(rec, SCHEMA, frozenset(SCHEMA))
    return x, rec.y, n_unknown


def outcome(fn, raw, **kw):
    try:
        x, y, n = fn(raw, **kw)
    except RecordError as err:
        return ("error", err.reason)
    values = x.values() if isinstance(x, dict) else x
    return ("ok", x, [type(v) for v in values], y, type(y), n)


def fast(raw, max_bytes: int = 1_000_000):
    return parse_conformed(raw, SCHEMA, frozenset(SCHEMA), max_bytes=max_bytes)


@pytest.mark.parametrize("raw", PLAIN + [r for r, _ in BAD_RECORDS if isinstance(r, bytes | str)])
def test_parse_conformed_equals_parse_record_then_conform(raw):
    assert outcome(fast, raw) == outcome(slow, raw)


def test_parse_conformed_respects_the_size_limit():
    raw = b'{"x": {"a": 1}, "y": 1}'
    assert outcome(fast, raw, max_bytes=len(raw)) == outcome(slow, raw, max_bytes=len(raw))
    assert outcome(fast, raw, max_bytes=len(raw) - 1) == ("error", "oversize")


def test_parse_conformed_on_random_records():
    rng = np.random.default_rng(7)
    for _ in range(300):
        names = rng.choice(["a", "b", "c", "d", "e"], size=int(rng.integers(0, 5)), replace=False)
        choices = [rng.normal(), int(rng.integers(-5, 5)), True, None, "1", float("nan")]
        x = {str(n): choices[int(rng.integers(0, 6))] for n in names}
        y = [0, 1, True, "", None, 0.5][int(rng.integers(0, 6))]
        raw = json.dumps({"x": x, "y": y}).encode()
        assert outcome(fast, raw) == outcome(slow, raw), raw


FIELDS = dict(
    model_id="bank/p3",
    algorithm="OnPairStrC",
    task="auc",
    step=42,
    release_index=7,
    weights=[0.5, -1.25, 3e-17],
    shape=[3],
    feature_names=["a", "b", "é\u2603"],
    rho_spent=0.012345678901234567,
    rho_budget=0.5,
    epsilon_spent=1.0000000000000002,
    delta=1e-5,
    exhausted=False,
)


@pytest.mark.parametrize(
    "change",
    [
        {},
        {"exhausted": True, "private": False},
        {"step": 0, "release_index": 0, "rho_spent": 0.0, "epsilon_spent": 0.0},
        {
            "task": "metric",
            "weights": np.eye(2).ravel().tolist(),
            "shape": [2, 2],
            "feature_names": ["a", "b"],
        },  # fmt: skip
        {"model_id": 'quote"and\\backslash', "rho_budget": 1e300},
    ],
)
def test_release_encoder_writes_the_message_release_message_would(change):
    enc = ReleaseEncoder()
    enc.encode(FIELDS, run_id="warm", time=1.0)  # a template of other constants first
    fields = {**FIELDS, **change}
    raw = enc.encode(fields, run_id="r1", time=1700000000.123456)
    want = ReleaseMessage(**{"private": True, **fields}, run_id="r1", time=1700000000.123456)
    assert ReleaseMessage.from_json(raw) == want
    assert json.loads(raw) == json.loads(want.to_json())


@pytest.mark.parametrize(
    "bad",
    [
        {"weights": [1.0, float("nan"), 0.0]},
        {"rho_spent": float("inf")},
        {"epsilon_spent": float("nan")},
    ],  # fmt: skip
)
def test_release_encoder_refuses_non_finite_values(bad):
    with pytest.raises(ValueError):
        ReleaseEncoder().encode({**FIELDS, **bad}, run_id="r", time=0.0)


def test_a_batch_of_releases_is_written_as_one_at_a_time():
    """encode_many: the bytes encode writes for each release, one time for all; refused as
    encode refuses, and for a unit-level model (whose per-release ε it is not given)."""
    rng = np.random.default_rng(0)
    weights = rng.normal(size=(5, len(FIELDS["weights"])))
    steps, indices = [4, 5, 6, 8, 9], [1, 2, 3, 4, 5]
    rhos, epsilons = np.cumsum(rng.uniform(0, 0.1, 5)).tolist(), rng.uniform(0, 3, 5).tolist()
    enc = ReleaseEncoder()
    got = enc.encode_many(FIELDS, steps, indices, weights, rhos, epsilons, run_id="r", time=2.5)
    for k in range(5):
        one = {**FIELDS, "step": steps[k], "release_index": indices[k],
               "weights": weights[k].tolist(), "rho_spent": rhos[k], "epsilon_spent": epsilons[k],
               "exhausted": False}  # fmt: skip
        assert got[k] == ReleaseEncoder().encode(one, run_id="r", time=2.5)
    bad = weights.copy()
    bad[2, 0] = np.nan
    with pytest.raises(ValueError):
        enc.encode_many(FIELDS, steps, indices, bad, rhos, epsilons, run_id="r", time=2.5)
    with pytest.raises(ValueError):
        enc.encode_many(FIELDS, steps, indices, weights, [*rhos[:4], np.inf], epsilons, time=2.5)
    with pytest.raises(ValueError):
        unit = {**FIELDS, "epsilon_event_spent": 0.5}
        enc.encode_many(unit, steps, indices, weights, rhos, epsilons, run_id="r", time=2.5)

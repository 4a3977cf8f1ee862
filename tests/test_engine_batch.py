"""The engine's batches: ``Learning.handle_batch`` is ``Learning.handle`` message by message.

A poll's plain records go through ``learn_many_kept`` in one call, with the ledger totals and ε of
their releases computed together; everything else takes the per-record path in its place. The
two must not be told apart: the same outcome for every message, the same release bytes (the
wall-clock ``time`` aside) and dead letters, the same learner, ledger and counters after — over
streams with bad records, labels and schemas the batch does not take, unknown features, the
budget running out mid-batch, and batches of every size.
"""

from __future__ import annotations

import json
import math
import warnings
from typing import Any

import numpy as np
import pytest

from connectors.sources import SourceMessage
from stream_dp import _jit
from stream_dp.engine.config import EngineConfig
from stream_dp.engine.learning import Learning, Outcome

pytestmark = pytest.mark.skipif(not _jit.numba_active(), reason="the batch needs the fast path")

FEATURES = ["a", "b", "c", "d"]
SECRET = 0x5EED_0F_BA7C4


def config(**model: Any) -> EngineConfig:
    # OnPairMF releases at every step and chooses its own step size.
    own = {} if model.get("algorithm") == "OnPairMF" else {"alpha": 1.0, "release_every": 1}
    return EngineConfig.model_validate(
        {
            "model": {**own, "buffer": 8, "features": FEATURES, "epsilon": 2.0, **model},
            "source": {"kind": "jsonl", "path": "-"},
            "releases": {"kind": "stdout"},
            "dead_letters": {"kind": "stdout"},
            "checkpoint": {"path": "unused.ckpt"},
        }
    )  # fmt: skip


def stream(n: int, seed: int) -> list[SourceMessage]:
    """Plain records, and among them every kind the batch must leave to the per-record path."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        x = rng.normal(size=len(FEATURES)) * rng.choice([0.3, 0.6, 2.0])  # some are clipped
        rec: dict[str, Any] = {"x": dict(zip(FEATURES, x.tolist(), strict=True))}
        rec["y"] = bool(x[0] + 0.3 * rng.normal() > 0) if i % 2 else int(x[1] > 0)
        kind = rng.random()
        if kind < 0.03:
            raw = b'{"x": {"a": 1'  # invalid JSON
        elif kind < 0.06:
            rec["x"]["zz"] = 1.5  # an unknown feature, dropped
            raw = json.dumps(rec).encode()
        elif kind < 0.08:
            del rec["x"]["c"]  # a missing feature
            raw = json.dumps(rec).encode()
        elif kind < 0.10:
            rec["y"] = -1  # a label the batch leaves to learn_one
            raw = json.dumps(rec).encode()
        elif kind < 0.12:
            rec["y"] = "maybe"  # rejected by the learner
            raw = json.dumps(rec).encode()
        elif kind < 0.13:
            rec["x"]["a"] = 3  # an int feature, conformed to a float
            raw = json.dumps(rec).encode()
        else:
            raw = json.dumps(rec).encode()
        out.append(SourceMessage(raw, {"topic": "t", "partition": 0, "offset": i}, None))
    return out


def batches(messages: list, seed: int) -> list[list]:
    rng = np.random.default_rng(seed)
    out, i = [], 0
    while i < len(messages):
        k = int(rng.choice([1, 2, 7, 40, 300]))
        out.append(messages[i : i + k])
        i += k
    return out


def without_time(handled) -> tuple:
    value = handled.value
    if value is not None:  # a release or a dead letter: the wall-clock time aside
        value = json.loads(value)
        assert math.isfinite(value.pop("time"))
    return handled.outcome, handled.key, value, handled.unknown


def run_both(cfg: EngineConfig, messages: list, seed: int) -> tuple[Learning, Learning, list]:
    one, many = Learning(cfg, secret=SECRET), Learning(cfg, secret=SECRET)
    one.run_id = many.run_id = "run"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the exhausted budget's warning
        want = [one.handle(m.value, m.position, m.key) for m in messages]
        got = [h for b in batches(messages, seed) for h in many.handle_batch(b)]
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert without_time(g) == without_time(w), i
    return one, many, want


def same_learner(a: Learning, b: Learning) -> None:
    la, lb = a.learner, b.learner
    sa, sb = la.state_dict(), lb.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert _equal(sa[key], sb[key]), key
    assert la.accountant.rho_spent() == lb.accountant.rho_spent()
    assert la.accountant.storage.columns().keys() == lb.accountant.storage.columns().keys()
    for key, col in la.accountant.storage.columns().items():
        np.testing.assert_array_equal(col, lb.accountant.storage.columns()[key])
    assert la.release_message() == lb.release_message()
    assert la.n_rejected == lb.n_rejected


def _equal(x: Any, y: Any) -> bool:
    if isinstance(x, dict):
        return x.keys() == y.keys() and all(_equal(x[k], y[k]) for k in x)
    if isinstance(x, list | tuple):
        return len(x) == len(y) and all(_equal(p, q) for p, q in zip(x, y, strict=True))
    if isinstance(x, np.ndarray):
        return np.array_equal(x, y, equal_nan=True)
    if isinstance(x, float) and math.isnan(x):
        return isinstance(y, float) and math.isnan(y)
    return x == y


@pytest.mark.parametrize("seed", [0, 1])
def test_a_batch_is_its_records_one_by_one(seed: int) -> None:
    messages = stream(900, seed)
    one, many, want = run_both(config(), messages, seed)
    same_learner(one, many)
    kinds = {h.outcome for h in want}
    assert {Outcome.RELEASED, Outcome.REJECTED} <= kinds
    assert sum(h.unknown for h in want) > 0


def test_the_budget_running_out_inside_a_batch() -> None:
    messages = stream(700, 7)
    one, many, want = run_both(config(horizon=400), messages, 7)
    same_learner(one, many)
    outcomes = [h.outcome for h in want]
    assert Outcome.EXHAUSTED in outcomes
    first = outcomes.index(Outcome.EXHAUSTED)
    assert Outcome.RELEASED in outcomes[:first]
    assert many.learner.exhausted


@pytest.mark.parametrize(
    "model",
    [
        {"release_every": 3},
        {"algorithm": "OnPairC"},
        {"algorithm": "OnPairMF", "buffer": 8},
        {"smoothing_window": 5},
    ],
    ids=["every-3", "onpairc", "onpairmf", "smoothed"],
)
def test_other_models(model: dict) -> None:
    messages = stream(500, 3)
    one, many, want = run_both(config(**model), messages, 3)
    same_learner(one, many)
    assert Outcome.RELEASED in {h.outcome for h in want}


def test_the_batch_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    """The batched path runs (not only the per-record fallback): most plain records of a long
    poll go through learn_many_kept, and its releases are the ones published."""
    learning = Learning(config(), secret=SECRET)
    learning.run_id = "run"
    messages = stream(600, 11)
    learning.handle_batch(messages[:100])
    calls = []
    real = learning.learner.learn_many_kept

    def spy(X, y):
        kept = real(X, y)
        calls.append(None if kept is None else kept.learned)
        return kept

    monkeypatch.setattr(learning.learner, "learn_many_kept", spy)
    out = learning.handle_batch(messages[100:])
    assert calls and all(c is not None for c in calls)
    assert sum(calls) > 350
    released = [json.loads(h.value) for h in out if h.outcome is Outcome.RELEASED]
    steps = [r["step"] for r in released]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    assert [r["release_index"] for r in released] == list(
        range(released[0]["release_index"], released[0]["release_index"] + len(released))
    )
    rhos = [r["rho_spent"] for r in released]
    assert all(p < q for p, q in zip(rhos, rhos[1:], strict=False))  # each release is charged


def test_a_unit_level_model_takes_the_per_record_path() -> None:
    cfg = config(unit_key="user", max_events_per_unit=3, horizon=1000)
    learning = Learning(cfg, secret=SECRET)
    assert not learning._batched


def test_batches_across_sealed_ledger_chunks_in_a_journal(tmp_path) -> None:
    """The ledger totals of a batch whose charges span a sealed chunk, read back from the
    ledger's journal on disk (``checkpoint.ledger_journal``), are those said one at a time."""
    from stream_dp.privacy._chunks import CHUNK

    cfg = config()
    one, many = Learning(cfg, secret=SECRET), Learning(cfg, secret=SECRET)
    one.run_id = many.run_id = "run"
    one.learner.accountant.storage.open_journal(tmp_path / "one.ledger")
    many.learner.accountant.storage.open_journal(tmp_path / "many.ledger")
    rng = np.random.default_rng(2)
    messages = []
    for i in range(CHUNK + 900):
        x = rng.normal(size=len(FEATURES)) * 0.4
        rec = {"x": dict(zip(FEATURES, x.tolist(), strict=True)), "y": bool(x[0] > 0)}
        messages.append(SourceMessage(json.dumps(rec).encode(), {"offset": i}, None))
    want = [one.handle(m.value, m.position, m.key) for m in messages]
    got = [
        h for i in range(0, len(messages), 500) for h in many.handle_batch(messages[i : i + 500])
    ]
    assert [without_time(g) for g in got] == [without_time(w) for w in want]
    assert many.learner.accountant.storage.journal is not None
    assert len(many.learner.accountant.storage) > CHUNK  # a chunk was sealed into the journal

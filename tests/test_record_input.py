"""A learner's record input (stream_dp/online/inputs.py, stream_dp/records.py): one record-error
type with the engine's wire format, and the warning about declared features that never arrive.
"""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest

from connectors.schema import LEARNER_REASONS, REASONS, RecordError, parse_record
from stream_dp import records
from stream_dp.online import OnPairStrC
from stream_dp.online.inputs import FEATURES_WARN_AFTER, RecordInput


def test_the_library_and_the_wire_format_raise_one_record_error_type():
    assert records.InvalidRecord is RecordError
    learner = OnPairStrC(alpha=1.0, features=["a"])
    rejected = []
    for x, y in [({"a": "1"}, True), ({"a": float("nan")}, True), ({"a": 1.0}, "yes")]:
        with pytest.raises(RecordError) as info:
            learner.learn_one(x, y)
        rejected.append(info.value.reason)
    with pytest.raises(RecordError) as wire:
        parse_record(b'{"x": {"a": "1"}, "y": true}')
    assert rejected == ["wrong_type", "non_finite", "bad_label"]
    assert wire.value.reason == rejected[0], "the same defect, the same reason"
    assert set(rejected) <= set(REASONS) | set(LEARNER_REASONS)
    assert learner.step == 0


def test_record_errors_never_quote_a_value():
    learner = OnPairStrC(alpha=1.0, features=["salary"])
    for x, y in [({"salary": "secret-123"}, True), ({"salary": 1.0}, "secret-label")]:
        with pytest.raises(RecordError) as info:
            learner.learn_one(x, y)
        assert "secret" not in str(info.value), str(info.value)


def test_a_bool_is_a_number_for_a_learner_not_on_the_wire():
    learner = OnPairStrC(alpha=1.0, features=["a"])
    learner.learn_one({"a": True}, True)
    assert learner.step == 1
    with pytest.raises(RecordError, match="wrong_type"):
        parse_record(b'{"x": {"a": true}, "y": true}')


def _learn(inp: RecordInput, x, y) -> None:
    inp.validate(x, y)
    inp.accept(y)


def _features_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if "declared feature" in str(w.message)]


def test_declared_features_that_never_arrive_beside_unknown_ones_are_warned_once():
    """The schema names ``color`` but the records carry a one-hot encoder's columns."""
    inp = RecordInput("auc", ("age", "color", "size"), radius=1.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(3 * FEATURES_WARN_AFTER):
            x = {"age": i % 7 / 7, f"color_{('red', 'blue')[i % 2]}": 1.0}
            if i == 5:
                x["size"] = 0.5
            _learn(inp, x, i % 2 == 0)
    (message,) = _features_warnings(caught)
    assert f"first {FEATURES_WARN_AFTER} records" in message
    assert "('color')" in message and "'size'" not in message and "'age'" not in message
    assert "color_red" not in message and "color_blue" not in message, "names from the data"
    assert inp.features_warned and inp.n_unknown == 3 * FEATURES_WARN_AFTER


def test_no_warning_when_every_declared_feature_arrives_or_nothing_unknown_does():
    sparse = RecordInput("auc", ("a", "b", "c"), radius=1.0)
    late = RecordInput("auc", ("a", "b"), radius=1.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(2 * FEATURES_WARN_AFTER):
            _learn(sparse, {"a": 0.1}, True)  # b and c never arrive, but nothing unknown does
            x = {"a": 0.1, "z": 1.0} if i < FEATURES_WARN_AFTER - 1 else {"a": 0.1, "b": 0.2}
            _learn(late, x, True)  # b arrives in time
    assert _features_warnings(caught) == []
    assert sparse.never_seen == {1, 2} and late.never_seen is None


def test_the_features_watch_survives_a_checkpoint_and_leaves_no_trace_of_a_rejected_record():
    inp = RecordInput("auc", ("age", "color"), radius=1.0)
    for _ in range(FEATURES_WARN_AFTER - 1):
        _learn(inp, {"age": 0.3, "color_red": 1.0}, True)
    before = pickle.dumps(inp)
    with pytest.raises(RecordError):
        inp.validate({"age": 0.3, "color": "red"}, True)
    assert pickle.dumps(inp) == before
    resumed = RecordInput("auc", ("age", "color"), radius=1.0)
    resumed.load_state_dict(inp.state_dict())
    assert resumed.never_seen == {1}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _learn(resumed, {"age": 0.3, "color_red": 1.0}, True)
        _learn(resumed, {"age": 0.3, "color_red": 1.0}, True)
    assert len(_features_warnings(caught)) == 1
    again = RecordInput("auc", ("age", "color"), radius=1.0)
    again.load_state_dict(resumed.state_dict())
    assert again.features_warned and again.never_seen is None


def test_a_batch_counts_its_columns_as_arrived():
    """An array batch carries every declared feature; a DataFrame carries its columns."""
    learner = OnPairStrC(alpha=1.0, features=["a", "b"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(FEATURES_WARN_AFTER - 1):
            learner.learn_one({"a": 0.5, "zz": 1.0}, True)
        learner.learn_many(np.full((10, 2), 0.5), [True] * 10)  # b arrives here
        for _ in range(FEATURES_WARN_AFTER):
            learner.learn_one({"a": 0.5, "zz": 1.0}, True)
    assert _features_warnings(caught) == []


def test_a_dataframe_batch_counts_only_its_columns():
    pd = pytest.importorskip("pandas")
    learner = OnPairStrC(alpha=1.0, features=["a", "b"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        learner.learn_many(pd.DataFrame({"a": np.linspace(0, 1, 50)}), [True, False] * 25)
        for _ in range(FEATURES_WARN_AFTER):
            learner.learn_one({"a": 0.5, "zz": 1.0}, True)
    assert len(_features_warnings(caught)) == 1

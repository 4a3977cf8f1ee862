"""A learner's record input (stream_dp/online/inputs.py, stream_dp/records.py): one record-error
type with the engine's wire format."""

from __future__ import annotations

import pytest

from connectors.schema import LEARNER_REASONS, REASONS, RecordError, parse_record
from stream_dp import records
from stream_dp.online import OnPairStrC


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

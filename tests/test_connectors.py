"""Unit tests for connectors: schemas, file/iterable sources, sinks (no broker needed)."""

from __future__ import annotations

import io
import json
import logging
import math
import pickle
import socket
import stat
import threading
import time
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import patience
from pydantic import ValidationError

import connectors
from connectors import (
    REASONS,
    CallbackSink,
    CsvSource,
    DeadLetter,
    DeadLetterSink,
    InputRecord,
    IterableSource,
    JsonlSink,
    JsonlSource,
    KafkaSink,
    KafkaSinkError,
    KafkaSource,
    RecordError,
    ReleaseMessage,
    Sink,
    Source,
    SourceMessage,
    StdoutSink,
    parse_record,
    publish_release,
)
from connectors.schema import conform_features

# --------------------------------------------------------------------------------------------
# parse_record / InputRecord
# --------------------------------------------------------------------------------------------

BAD_RECORDS: list[tuple[Any, str]] = [
    (b"{not json", "invalid_json"),
    (b"", "invalid_json"),
    ("[1, 2", "invalid_json"),
    (b"\xff\xfe\x00garbage", "invalid_json"),
    (b"[" * 100_000 + b"]" * 100_000, "invalid_json"),  # too deeply nested to parse
    (b'{"x": [1], "y": 1, "pad": "' + b"a" * 1_000_000 + b'"}', "oversize"),
    (b'{"x": [1.0]}', "missing_label"),
    (b'{"x": [1.0], "y": null}', "missing_label"),
    (b'{"x": [1.0], "y": ""}', "missing_label"),
    (b'{"y": 1}', "missing_features"),
    (b'{"x": {}, "y": 1}', "empty_features"),
    (b'{"x": [], "y": 1}', "empty_features"),
    (b'{"x": [NaN], "y": 1}', "non_finite"),
    (b'{"x": {"a": Infinity}, "y": 1}', "non_finite"),
    (b'{"x": {"a": -Infinity}, "y": 1}', "non_finite"),
    (b'{"x": {"a": 1e999}, "y": 1}', "non_finite"),
    (b'{"x": [1], "y": NaN}', "non_finite"),
    (b'{"x": [1], "y": 1, "ts": Infinity}', "non_finite"),
    ({"x": {"a": 10**400}, "y": 1}, "non_finite"),
    (b'{"x": {"a": "1.5"}, "y": 1}', "wrong_type"),
    (b'{"x": {"a": true}, "y": 1}', "wrong_type"),
    (b'{"x": [1, false], "y": 1}', "wrong_type"),
    (b'{"x": [1, null], "y": 1}', "wrong_type"),
    (b'{"x": [[1]], "y": 1}', "wrong_type"),
    ({"x": np.ones((2, 2)), "y": 1}, "wrong_type"),
    ({"x": np.array([True]), "y": 1}, "wrong_type"),
    (b'{"x": "1,2", "y": 1}', "wrong_type"),
    (b'{"x": 3, "y": 1}', "wrong_type"),
    (b'{"x": [1], "y": [1]}', "wrong_type"),
    (b'{"x": [1], "y": {"c": 1}}', "wrong_type"),
    (b'{"x": [1], "y": 1, "key": 7}', "wrong_type"),
    (b'{"x": [1], "y": 1, "ts": true}', "wrong_type"),
    (b"[1, 2, 3]", "wrong_type"),
    (b'"just a string"', "wrong_type"),
    (b"42", "wrong_type"),
    (b'{"x": [1], "y": 1, "ts": "yesterday"}', "invalid_timestamp"),
]


@pytest.mark.parametrize(("raw", "reason"), BAD_RECORDS)
def test_parse_record_rejects_with_reason(raw: Any, reason: str) -> None:
    with pytest.raises(RecordError) as info:
        parse_record(raw)
    assert info.value.reason == reason
    assert info.value.reason in REASONS
    assert info.value.message
    assert str(info.value).startswith(reason + ":")


def test_every_parse_reason_is_exercised() -> None:
    parse_reasons = set(REASONS) - {"no_known_features", "wrong_dimension"}
    assert {reason for _, reason in BAD_RECORDS} == parse_reasons


def test_oversize_is_checked_before_decoding() -> None:
    raw = b'{"x": [1], "y": 1, "pad": "' + b"a" * 200 + b'"}'
    assert parse_record(raw, max_bytes=len(raw)).y == 1
    with pytest.raises(RecordError) as info:
        parse_record(raw, max_bytes=len(raw) - 1)
    assert info.value.reason == "oversize"
    # For text, the limit is on UTF-8 bytes, not characters.
    text = '{"x": [1], "y": "' + "é" * 10 + '"}'
    with pytest.raises(RecordError, match="oversize"):
        parse_record(text, max_bytes=len(text))
    assert parse_record(text, max_bytes=len(text.encode())).y == "é" * 10


def test_record_error_is_value_error_and_pickles() -> None:
    err = RecordError("non_finite", "feature 'a' is not finite")
    assert isinstance(err, ValueError)
    clone = pickle.loads(pickle.dumps(err))
    assert (clone.reason, clone.message) == (err.reason, err.message)
    assert RecordError("oversize").message == "oversize"


def test_messages_do_not_quote_feature_values() -> None:
    with pytest.raises(RecordError) as info:
        parse_record(b'{"x": {"salary": "secret-123"}, "y": 1}')
    assert "secret-123" not in str(info.value)
    assert "salary" in info.value.message


@pytest.mark.parametrize(
    ("raw", "x", "y"),
    [
        (b'{"x": {"a": 1, "b": 2.5}, "y": 1}', {"a": 1.0, "b": 2.5}, 1),
        (b'{"x": [0, -1.5, 3], "y": true}', [0.0, -1.5, 3.0], True),
        (b'{"x": [1], "y": "positive"}', [1.0], "positive"),
        (b'{"x": [1], "y": -0.25}', [1.0], -0.25),
        ('{"x": {"a": 1}, "y": 0}', {"a": 1.0}, 0),
        ({"x": {"a": np.float32(1.5)}, "y": np.int64(2)}, {"a": 1.5}, 2),
        ({"x": np.array([1.0, 2.0]), "y": np.bool_(True)}, [1.0, 2.0], True),
        ({"x": np.array([1, 2]), "y": 1}, [1.0, 2.0], 1),
    ],
)
def test_parse_record_accepts_valid(raw: Any, x: Any, y: Any) -> None:
    rec = parse_record(raw)
    assert rec.x == x
    assert rec.y == y
    assert type(rec.y) is type(y)
    assert all(type(v) is float for v in (rec.x.values() if isinstance(rec.x, dict) else rec.x))


def test_label_types_are_preserved() -> None:
    assert type(parse_record(b'{"x": [1], "y": 1}').y) is int
    assert type(parse_record(b'{"x": [1], "y": 1.0}').y) is float
    assert type(parse_record(b'{"x": [1], "y": false}').y) is bool


def test_key_ts_and_extra_fields() -> None:
    rec = parse_record(b'{"x": [1], "y": 1, "key": "u1", "ts": 12.5, "source": "app"}')
    assert rec.key == "u1"
    assert rec.ts == 12.5
    assert not hasattr(rec, "source")
    z = parse_record(b'{"x": [1], "y": 1, "ts": "2024-01-01T00:00:00Z"}')
    assert z.ts == 1704067200.0
    naive = parse_record(b'{"x": [1], "y": 1, "ts": "2024-01-01T00:00:00"}')
    assert naive.ts == 1704067200.0, "naive ISO timestamps are UTC"
    offset = parse_record(b'{"x": [1], "y": 1, "ts": "2024-01-01T01:00:00+01:00"}')
    assert offset.ts == 1704067200.0
    assert parse_record(b'{"x": [1], "y": 1, "ts": 5}').ts == 5.0


def test_input_record_is_frozen() -> None:
    rec = InputRecord(x=[1.0], y=1)
    with pytest.raises(ValidationError):
        rec.y = 0  # type: ignore[misc]


def test_to_vector() -> None:
    rec = InputRecord(x={"b": 2, "a": 1}, y=0)
    np.testing.assert_array_equal(rec.to_vector(["a", "b"]), [1.0, 2.0])
    assert rec.to_vector(["a", "b"]).dtype == np.float64
    assert rec.dim == 2
    # The declared schema decides: unknown names are ignored, missing ones are 0.
    np.testing.assert_array_equal(rec.to_vector(["a"]), [1.0])
    np.testing.assert_array_equal(rec.to_vector(["a", "b", "c"]), [1.0, 2.0, 0.0])
    with pytest.raises(RecordError) as info:
        rec.to_vector(["c", "d"])
    assert info.value.reason == "no_known_features"
    with pytest.raises(ValueError, match="feature_names"):
        rec.to_vector()
    listed = InputRecord(x=[1, 2, 3], y=0)
    np.testing.assert_array_equal(listed.to_vector(), [1.0, 2.0, 3.0])
    with pytest.raises(RecordError) as info:
        listed.to_vector(["a", "b"])
    assert info.value.reason == "wrong_dimension"


def test_conform_features_counts_what_it_drops() -> None:
    rec = parse_record(b'{"x": {"a": 1, "\\ud800": 2, "b": 3, "zz": 4}, "y": 1}')
    x, unknown = conform_features(rec, ["b", "a", "c"])
    assert x == {"a": 1.0, "b": 3.0} and unknown == 2
    assert conform_features(InputRecord(x=[1, 2], y=1), ["a", "b"]) == ([1.0, 2.0], 0)


# --------------------------------------------------------------------------------------------
# ReleaseMessage / DeadLetter
# --------------------------------------------------------------------------------------------


def release(**overrides: Any) -> ReleaseMessage:
    fields: dict[str, Any] = {
        "model_id": "model-a",
        "algorithm": "onpairstrc",
        "task": "auc",
        "step": 100,
        "release_index": 3,
        "weights": [0.1, -0.2, 0.3],
        "shape": [3],
        "feature_names": ["f0", "f1", "f2"],
        "rho_spent": 0.25,
        "rho_budget": 1.0,
        "epsilon_spent": 3.1,
        "delta": 1e-6,
        "exhausted": False,
        "time": 1_700_000_000.0,
    }
    fields.update(overrides)
    return ReleaseMessage(**fields)


def test_release_round_trip_and_weights_array() -> None:
    msg = release()
    assert msg.schema_version == 2
    data = msg.to_json()
    assert isinstance(data, bytes)
    assert ReleaseMessage.from_json(data) == msg
    # An event-level release leaves out the unit-level fields, so its bytes stay as they were.
    unit_fields = {"privacy_unit", "epsilon_event_spent"}
    assert set(json.loads(data)) == set(ReleaseMessage.model_fields) - unit_fields
    np.testing.assert_array_equal(msg.weights_array(), [0.1, -0.2, 0.3])
    # The wire form: base64 of little-endian float64, decodable without this package.
    wire = json.loads(data)
    assert wire["dtype"] == "<f8" and wire["shape"] == [3]
    import base64

    decoded = np.frombuffer(base64.b64decode(wire["weights"]), dtype="<f8")
    assert decoded.tolist() == [0.1, -0.2, 0.3], "exact to the bit"
    # A version 1 message (weights as a JSON list) is still read, and converted.
    v1 = {**wire, "schema_version": 1, "weights": [0.1, -0.2, 0.3]}
    del v1["dtype"]
    assert ReleaseMessage.from_json(json.dumps(v1)) == msg

    w = np.arange(6, dtype=float).reshape(2, 3)
    metric = ReleaseMessage.from_weights(
        w,
        **{k: v for k, v in release().model_dump().items() if k not in ("weights", "shape")}
        | {"task": "metric"},
    )
    assert metric.shape == [2, 3]
    np.testing.assert_array_equal(metric.weights_array(), w)
    assert ReleaseMessage.from_json(metric.to_json()).weights_array().shape == (2, 3)


def test_release_defaults_time_to_now() -> None:
    fields = release().model_dump()
    del fields["time"]
    before = time.time()
    assert before <= ReleaseMessage(**fields).time <= time.time()


@pytest.mark.parametrize(
    "overrides",
    [
        {"raw_records": [[1, 2]]},  # extra fields are forbidden: no raw data can sneak in
        {"task": "regression"},
        {"shape": [2]},
        {"shape": [-3]},
        {"weights": [0.1, math.nan, 0.3]},
        {"weights": [0.1, math.inf, 0.3]},
        {"weights": "not base64!"},
        {"weights": "AAAA"},  # 3 bytes: not 3 float64
        {"weights": "AAAAAAAA+H8AAAAAAAAAAAAAAAAAAAAA"},  # NaN, encoded
        {"dtype": "<f4"},
        {"step": -1},
        {"delta": 1.0},
        {"rho_spent": -0.1},
        {"model_id": ""},
    ],
)
def test_release_validation(overrides: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        release(**overrides)


def test_release_is_frozen_and_budget_optional() -> None:
    msg = release(rho_budget=None)
    assert msg.rho_budget is None
    with pytest.raises(ValidationError):
        msg.step = 5  # type: ignore[misc]
    with pytest.raises(ValidationError):
        ReleaseMessage.from_json(msg.to_json().replace(b'"task":"auc"', b'"task":"auc","x":1'))


def test_dead_letter_from_raw() -> None:
    letter = DeadLetter.from_raw("invalid_json", "bad", b"\xff{", {"line": 3})
    assert letter.payload == "\ufffd{"
    assert letter.payload_length == 2
    assert not letter.truncated
    assert letter.source_position == {"line": 3}
    assert DeadLetter.model_validate_json(letter.to_json()) == letter

    big = DeadLetter.from_raw("oversize", "too big", b"a" * 50_000)
    assert len(big.payload) == 10_000
    assert big.payload_length == 50_000
    assert big.truncated

    exact = DeadLetter.from_raw("oversize", "", "é" * 10_000)
    assert len(exact.payload) == 10_000 and not exact.truncated
    assert exact.payload_length == 20_000

    multibyte = DeadLetter.from_raw("oversize", "", "😀" * 10_001)
    assert multibyte.payload == "😀" * 10_000 and multibyte.truncated

    as_dict = DeadLetter.from_raw("wrong_type", "", {"x": {"a": "s"}, "y": object()})
    assert json.loads(as_dict.payload)["y"].startswith("<object")
    assert DeadLetter.from_raw("invalid_json", "", None).payload_length == 0
    with pytest.raises(ValidationError):
        DeadLetter(reason="r", message="m", payload="p", payload_length=1, extra=1)


# --------------------------------------------------------------------------------------------
# Sources
# --------------------------------------------------------------------------------------------


def values(source: Any) -> list[bytes]:
    return [m.value for m in source]


def test_sources_and_sinks_satisfy_protocols(tmp_path: Path, kafka_client: str) -> None:
    (tmp_path / "a.jsonl").write_text("")
    (tmp_path / "a.csv").write_text("f,y\n")
    for src in (
        IterableSource([]),
        JsonlSource(tmp_path / "a.jsonl"),
        CsvSource(tmp_path / "a.csv", "y"),
        KafkaSource("t", "127.0.0.1:1", "g", client=kafka_client),
    ):
        assert isinstance(src, Source)
        src.close()
    for sink in (
        JsonlSink(tmp_path / "o.jsonl"),
        StdoutSink(),
        CallbackSink(print),
        KafkaSink("t", "127.0.0.1:1", client=kafka_client),
    ):
        assert isinstance(sink, Sink)
    assert set(connectors.__all__) <= set(dir(connectors))


def test_iterable_source_encodes_items() -> None:
    items = [
        {"x": {"a": np.float64(1.0), "b": np.int32(2)}, "y": 1},
        '{"x": [1], "y": 0}',
        b'{"x": [2], "y": 1}',
        {"x": [math.nan], "y": 1},
        {"x": [1], "y": object()},
    ]
    src = IterableSource(items)
    msgs = list(src)
    assert [m.position for m in msgs] == [{"line": i} for i in range(5)]
    assert parse_record(msgs[0].value).x == {"a": 1.0, "b": 2.0}
    assert parse_record(msgs[1].value).y == 0
    assert parse_record(msgs[2].value).y == 1
    with pytest.raises(RecordError, match="non_finite"):
        parse_record(msgs[3].value)
    with pytest.raises(RecordError, match="invalid_json"):
        parse_record(msgs[4].value)
    assert src.positions() == {"line": 5}
    assert list(src) == [], "a source is a cursor: a second pass continues at the end"


def test_iterable_source_seek_rewindable_and_one_shot() -> None:
    data = [f'{{"x": [{i}], "y": 1}}' for i in range(6)]
    src = IterableSource(data)
    first = [m.position["line"] for _, m in zip(range(3), src, strict=False)]
    assert first == [0, 1, 2]
    assert src.positions() == {"line": 3}
    src.seek({"line": 1})
    assert [m.position["line"] for m in src] == [1, 2, 3, 4, 5]
    src.seek({"line": 4})
    assert [m.position["line"] for m in src] == [4, 5]

    gen = IterableSource(d for d in data)
    gen.seek({"line": 2})  # forward seeks work even on one-shot iterators
    it = iter(gen)
    assert next(it).position == {"line": 2}
    with pytest.raises(ValueError, match="one-shot"):
        gen.seek({"line": 0})
    assert [m.position["line"] for m in gen] == [3, 4, 5]


@pytest.mark.parametrize("bad", [{}, {"line": -1}, {"line": "3"}, {"line": True}, {"t:0": 3}])
def test_file_positions_are_validated(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        IterableSource([]).seek(bad)


def test_jsonl_source_lines_blank_lines_and_resume(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(
        b'{"x": [0], "y": 1}\n\n   \n{"x": [3], "y": 0}\r\nnot json\n{"x": [5], "y": 1}'
    )
    with JsonlSource(path) as src:
        msgs = list(src)
        assert [m.position["line"] for m in msgs] == [0, 3, 4, 5]
        assert msgs[1].value == b'{"x": [3], "y": 0}'
        assert msgs[2].value == b"not json"
        assert src.positions() == {"line": 6}
        assert src.commit() is True

    # Resume a new instance from a checkpoint, as after a restart.
    with JsonlSource(path) as src:
        it = iter(src)
        assert next(it).position == {"line": 0}
        checkpoint = src.positions()
    assert checkpoint == {"line": 1}
    with JsonlSource(path) as resumed:
        resumed.seek(json.loads(json.dumps(checkpoint)))
        assert [m.position["line"] for m in resumed] == [3, 4, 5]

    with pytest.raises(FileNotFoundError):
        JsonlSource(tmp_path / "missing.jsonl")
    src = JsonlSource(path)
    src.close()
    with pytest.raises(ValueError, match="closed"):
        list(src)


def test_cursor_survives_break(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text("".join(f'{{"x": [{i}], "y": 1}}\n' for i in range(5)))
    src = JsonlSource(path)
    for msg in src:
        if msg.position["line"] == 1:
            break
    assert src.positions() == {"line": 2}
    assert [m.position["line"] for m in src] == [2, 3, 4]


def test_csv_source_rows_to_records(tmp_path: Path) -> None:
    path = tmp_path / "in.csv"
    path.write_text(
        "id,a,b,label,when\n"
        "u1,1,2.5,1,2024-01-01T00:00:00Z\n"
        "u2,3,x,0,5\n"  # non-numeric feature
        "u3,4,5,,6\n"  # missing label
        "u4,nan,1,1,7\n"  # non-finite
        "u5,1,2,yes,8\n"  # string label
        "u6,1\n"  # short row
        "u7,1,2,1,9,surplus\n"  # long row
        '"u8",1,2,0.5,10\n'
    )
    src = CsvSource(path, "label", key_column="id", ts_column="when")
    assert src.feature_columns == ["a", "b"]
    outcomes = []
    for msg in src:
        try:
            rec = parse_record(msg.value)
            outcomes.append((msg.position["line"], rec.x, rec.y, rec.key, rec.ts))
        except RecordError as err:
            outcomes.append((msg.position["line"], err.reason))
    assert outcomes == [
        (0, {"a": 1.0, "b": 2.5}, 1, "u1", 1704067200.0),
        (1, "wrong_type"),
        (2, "missing_label"),
        (3, "non_finite"),
        (4, {"a": 1.0, "b": 2.0}, "yes", "u5", 8.0),
        (5, "wrong_type"),
        (6, "wrong_type"),
        (7, {"a": 1.0, "b": 2.0}, 0.5, "u8", 10.0),
    ]
    src.seek({"line": 6})
    assert [m.position["line"] for m in src] == [6, 7]
    src.close()


def test_csv_source_columns_and_quoting(tmp_path: Path) -> None:
    path = tmp_path / "in.csv"
    path.write_text('a;b;note;y\n1;2;"multi\nline";1\n3;4;plain;0\n', newline="")
    src = CsvSource(path, "y", feature_columns=["b", "a"], delimiter=";")
    msgs = list(src)
    assert [m.position for m in msgs] == [{"line": 0}, {"line": 1}]
    assert parse_record(msgs[0].value).to_vector(["a", "b"]).tolist() == [1.0, 2.0]
    with pytest.raises(ValueError, match="lacks column"):
        CsvSource(path, "label")
    with pytest.raises(ValueError, match="lacks column"):
        CsvSource(path, "y", feature_columns=["a", "zz"])
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(ValueError, match="header"):
        CsvSource(tmp_path / "empty.csv", "y")
    with pytest.raises(FileNotFoundError):
        CsvSource(tmp_path / "nope.csv", "y")


def test_csv_source_tolerates_bad_encoding(tmp_path: Path) -> None:
    path = tmp_path / "in.csv"
    path.write_bytes(b"a,y\n\xff\xfe,1\n2,0\n")
    reasons = []
    for msg in CsvSource(path, "y"):
        try:
            parse_record(msg.value)
            reasons.append("ok")
        except RecordError as err:
            reasons.append(err.reason)
    assert reasons == ["wrong_type", "ok"]


# --------------------------------------------------------------------------------------------
# Kafka source/sink configuration and outage behaviour without a broker
# --------------------------------------------------------------------------------------------


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_kafka_settings_are_validated(kafka_client: str) -> None:
    c = {"client": kafka_client}
    with pytest.raises(TypeError, match="unknown KafkaConsumer setting"):
        KafkaSource("t", "127.0.0.1:1", "g", sasl_plain_usernme="typo", **c)
    with pytest.raises(ValueError, match="manages"):
        KafkaSource("t", "127.0.0.1:1", "g", consumer_config={"enable_auto_commit": True}, **c)
    with pytest.raises(ValueError, match="group_id"):
        KafkaSource("t", "127.0.0.1:1", "", **c)
    with pytest.raises(TypeError, match="unknown KafkaProducer setting"):
        KafkaSink("t", "127.0.0.1:1", ssl_cafiel="x", **c)
    with pytest.raises(ValueError, match="manages"):
        KafkaSink("t", "127.0.0.1:1", acks=1, **c)
    # Security settings pass straight through (nothing connects until first use).
    src = KafkaSource(
        "t",
        "127.0.0.1:1",
        "g",
        security_protocol="SASL_SSL",
        sasl_mechanism="PLAIN",
        sasl_plain_username="u",
        sasl_plain_password="p",
        **c,
    )
    assert src._config["security_protocol"] == "SASL_SSL"
    assert src._config["enable_auto_commit"] is False
    # No silent offset reset: skipped records are found and reported by the source itself.
    assert src._config["auto_offset_reset"] == "none"
    assert src._config["isolation_level"] == "read_committed"
    with pytest.raises(ValueError, match="manages"):
        KafkaSource("t", "127.0.0.1:1", "g", consumer_config={"auto_offset_reset": "latest"}, **c)
    sink = KafkaSink("t", "127.0.0.1:1", ssl_cafile="/ca.pem", **c)
    assert sink._config["enable_idempotence"] is True and sink._config["acks"] == "all"
    # librdkafka's own (dotted) names are settings of confluent-kafka only.
    dotted = {"statistics.interval.ms": 0}
    if kafka_client == "confluent-kafka":
        assert (
            KafkaSink("t", "127.0.0.1:1", producer_config=dotted, **c)._config[
                "statistics.interval.ms"
            ]
            == 0
        )
    else:
        with pytest.raises(TypeError, match="unknown KafkaProducer setting"):
            KafkaSink("t", "127.0.0.1:1", producer_config=dotted, **c)


def test_librdkafka_settings_mean_what_kafka_python_ones_do() -> None:
    """The translation behind confluent-kafka: the guarantees' settings and the security ones."""
    pytest.importorskip("confluent_kafka")
    from connectors._confluent import librdkafka_config

    consumer = librdkafka_config(
        "KafkaConsumer",
        {
            "bootstrap_servers": ["a:1", "b:2"],
            "group_id": "g",
            "enable_auto_commit": False,
            "auto_offset_reset": "none",
            "isolation_level": "read_committed",
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_plain_username": "u",
            "sasl_plain_password": "p",
            "ssl_cafile": "/ca.pem",
            "ssl_check_hostname": False,
            "bootstrap_timeout_ms": 10_000,
            "max_poll_records": 500,
        },
    )
    assert consumer == {
        "bootstrap.servers": "a:1,b:2",
        "group.id": "g",
        "enable.auto.commit": False,
        "auto.offset.reset": "error",  # an offset out of range is reported, never reset
        "isolation.level": "read_committed",
        "security.protocol": "sasl_ssl",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "u",
        "sasl.password": "p",
        "ssl.ca.location": "/ca.pem",
        "ssl.endpoint.identification.algorithm": "none",
    }
    producer = librdkafka_config(
        "KafkaProducer",
        {
            "transactional_id": "stream-dp.m",
            "enable_idempotence": True,
            "acks": "all",
            "max_request_size": 8 << 20,
            "compression_type": None,
            "delivery_timeout_ms": 60_000,
            "request_timeout_ms": 30_000,
            "max_block_ms": 10_000,
        },
    )
    assert producer == {
        "transactional.id": "stream-dp.m",
        "enable.idempotence": True,
        "acks": "all",
        "message.max.bytes": 8 << 20,
        "message.timeout.ms": 60_000,
        "socket.timeout.ms": 30_000,
        "request.timeout.ms": 30_000,
    }


def test_unknown_client_is_refused() -> None:
    from connectors.clients import client

    with pytest.raises(ValueError, match="unknown Kafka client 'rdkafka'"):
        KafkaSource("t", "127.0.0.1:1", "g", client="rdkafka")
    with pytest.raises(ValueError, match="unknown Kafka client"):
        client("kafka")


def test_confluent_errors_are_the_kafka_python_ones() -> None:
    """librdkafka's errors arrive as the kafka.errors classes the connectors (and the engine)
    act on, with librdkafka's message: one error vocabulary on both clients."""
    pytest.importorskip("confluent_kafka")
    import kafka.errors as E
    from confluent_kafka import KafkaError

    from connectors._confluent import kafka_error
    from connectors._retry import is_retriable
    from connectors.transactions import (
        FENCING_ERRORS,
        GROUP_FENCING_ERRORS,
        is_authorization_error,
    )

    def as_kafka(code: int, *, fatal: bool = False, retriable: bool = False) -> BaseException:
        return kafka_error(KafkaError(code, "librdkafka says", fatal=fatal, retriable=retriable))

    fenced = as_kafka(KafkaError._FENCED, fatal=True)
    assert type(fenced).__name__ in FENCING_ERRORS and "librdkafka says" in str(fenced)
    assert type(as_kafka(KafkaError.PRODUCER_FENCED)).__name__ in FENCING_ERRORS
    assert type(as_kafka(KafkaError.INVALID_PRODUCER_EPOCH)).__name__ in FENCING_ERRORS
    assert type(as_kafka(KafkaError.ILLEGAL_GENERATION)).__name__ in GROUP_FENCING_ERRORS
    assert type(as_kafka(KafkaError.UNKNOWN_MEMBER_ID)).__name__ in GROUP_FENCING_ERRORS
    for code in (KafkaError._TIMED_OUT, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN,
                 KafkaError._MSG_TIMED_OUT, KafkaError.NOT_COORDINATOR):  # fmt: skip
        assert is_retriable(as_kafka(code)), code
    assert isinstance(as_kafka(KafkaError._TIMED_OUT), E.KafkaTimeoutError)
    assert isinstance(as_kafka(KafkaError.OFFSET_OUT_OF_RANGE), E.OffsetOutOfRangeError)
    assert "UnstableOffsetCommit" in type(as_kafka(KafkaError.UNSTABLE_OFFSET_COMMIT)).__name__
    for code in (KafkaError._AUTHENTICATION, KafkaError.TOPIC_AUTHORIZATION_FAILED,
                 KafkaError.MSG_SIZE_TOO_LARGE):  # fmt: skip
        assert not is_retriable(as_kafka(code)), code
    # A refused permission is told apart from an outage on both clients (start-up names it).
    for code in (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED,
                 KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED):  # fmt: skip
        assert is_authorization_error(as_kafka(code)), code
    assert is_authorization_error(E.TransactionalIdAuthorizationFailedError())
    assert not is_authorization_error(as_kafka(KafkaError._AUTHENTICATION))
    assert not is_authorization_error(as_kafka(KafkaError._TIMED_OUT))
    # Retriable in librdkafka's judgement stays retriable; fatal never is.
    assert is_retriable(as_kafka(KafkaError._INCONSISTENT, retriable=True))
    assert not is_retriable(as_kafka(KafkaError._INCONSISTENT, retriable=True, fatal=True))


class _StuckHandle:
    """A librdkafka producer handle whose transactional calls block until ``release``."""

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()

    def _block(self, *args: Any) -> None:
        self.entered.set()
        self.release.wait(patience(30))

    init_transactions = send_offsets_to_transaction = _block

    def list_topics(self, timeout: float) -> None:
        pass


class _ReadyHandle:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def list_topics(self, timeout: float) -> None:
        self.calls.append("list_topics")

    def init_transactions(self, *args: Any) -> None:
        self.calls.append("init_transactions")


def test_confluent_producer_waits_only_for_a_discarded_ones_init() -> None:
    """A discarded producer's call that librdkafka never ends (``send_offsets_to_transaction``
    with its group coordinator away outlives its timeout) must not stop the next producer of
    the transactional id, which fences it; one still in ``init_transactions`` could register
    after the next one and fence it, so that one is waited for (a retriable timeout)."""
    pytest.importorskip("confluent_kafka")
    from kafka.errors import KafkaTimeoutError

    from connectors._confluent import ConfluentProducer

    port = unused_port()

    def producer(handle: Any) -> ConfluentProducer:
        p = ConfluentProducer(
            {
                "bootstrap_servers": f"127.0.0.1:{port}",
                "transactional_id": "stuck-txn",
                "delivery_timeout_ms": 1000,  # the bound of each transactional call: 1 s
            }
        )
        p._p = handle
        return p

    for call in ("send_offsets_to_transaction", "init_transactions"):
        stuck = _StuckHandle()
        old = producer(stuck)
        if call == "init_transactions":
            worker = threading.Thread(target=old.init_transactions)
        else:
            worker = threading.Thread(target=old.send_offsets_to_transaction, args=({}, object()))
        worker.start()
        assert stuck.entered.wait(patience(10))
        try:
            new = producer(_ReadyHandle())
            if call == "init_transactions":
                with pytest.raises(KafkaTimeoutError, match="still in init_transactions"):
                    new.init_transactions()
            else:
                new.init_transactions()
        finally:
            stuck.release.set()
            worker.join(patience(10))
        new.init_transactions()  # nothing in flight any more


def test_confluent_producer_connects_before_it_asks_for_its_producer_id() -> None:
    """``init_transactions`` first asks for metadata, which waits for a broker connection:
    librdkafka's transactional producer that finds none up looks for its coordinator again only
    500 ms later. A failed request is no error: ``init_transactions`` still runs."""
    pytest.importorskip("confluent_kafka")
    from confluent_kafka import KafkaError, KafkaException

    from connectors._confluent import ConfluentProducer

    p = ConfluentProducer(
        {"bootstrap_servers": f"127.0.0.1:{unused_port()}", "transactional_id": "connect-txn"}
    )
    ready = _ReadyHandle()
    p._p = ready
    p.init_transactions()
    assert ready.calls == ["list_topics", "init_transactions"]

    def fails(timeout: float) -> None:
        ready.calls.append("list_topics failed")
        raise KafkaException(KafkaError(KafkaError._TRANSPORT))

    ready.list_topics = fails
    p.init_transactions()
    assert ready.calls[2:] == ["list_topics failed", "init_transactions"]


class _RdConsumer:
    """A librdkafka consumer handle: a ``stuck`` one never answers a commit (librdkafka issue
    #3740) until ``release``."""

    def __init__(self, stuck: bool) -> None:
        self.stuck = stuck
        self.release = threading.Event()
        self.landed: list[int] = []  # offsets of partition 0, in the order commits landed
        self.changed = threading.Condition()
        self.calls: list[str] = []

    def commit(self, offsets: list[Any], asynchronous: bool) -> list[Any]:
        if self.stuck:
            self.release.wait(patience(30))
        with self.changed:
            self.landed.append(offsets[0].offset)
            self.changed.notify_all()
        return offsets

    def committed(self, partitions: list[Any], timeout: float) -> list[Any]:
        if self.stuck:
            self.release.wait(patience(30))
        return partitions

    def consumer_group_metadata(self) -> str:
        return "group-metadata"

    def __getattr__(self, name: str) -> Any:  # reading calls: recorded, never expected here
        self.calls.append(name)
        return lambda *args, **kwargs: None

    def close(self) -> None:
        self.release.set()


class _RdAdmin:
    """A librdkafka handle that probes the cluster: answered unless the cluster is ``away``."""

    away = False

    def __init__(self, conf: dict) -> None:
        pass

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        from confluent_kafka import KafkaError, KafkaException

        if self.away:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))
        return types.SimpleNamespace(topics={})


def _rd_consumers(
    monkeypatch: pytest.MonkeyPatch, *handles: _RdConsumer, away: bool
) -> list[_RdConsumer]:
    """``confluent_kafka.Consumer`` handing out ``handles`` in turn (the ones handed out are
    returned), beside a cluster that is ``away`` or answers."""
    import confluent_kafka
    import confluent_kafka.admin

    made: list[_RdConsumer] = []
    monkeypatch.setattr(confluent_kafka, "Consumer", lambda conf: made.append(handles[len(made)])
                        or made[-1])  # fmt: skip
    monkeypatch.setattr(_RdAdmin, "away", away)
    monkeypatch.setattr(confluent_kafka.admin, "AdminClient", _RdAdmin)
    return made


def test_confluent_commit_that_never_ends_goes_through_a_new_consumer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A commit librdkafka never answers while the cluster answers is a failed commit (never
    a success); the next goes through a new consumer, the reading one and its positions
    untouched; the old commit landing late is followed by the newest offsets again."""
    pytest.importorskip("confluent_kafka")
    from kafka import TopicPartition
    from kafka.errors import KafkaTimeoutError

    from connectors import _confluent

    monkeypatch.setattr(_confluent, "OVERRUN_S", 0.2)
    stuck, fresh = _RdConsumer(stuck=True), _RdConsumer(stuck=False)
    made = _rd_consumers(monkeypatch, stuck, fresh, away=False)
    src = KafkaSource("t", "127.0.0.1:1", "g", commit_timeout_s=1.0, client="confluent-kafka")
    try:
        src.seek({"t:0": 5})
        assert src.commit() is False  # 1 s without an answer
        assert stuck.landed == [] and made == [stuck]
        reader = src._consumer
        assert reader.wedged
        with pytest.raises(KafkaTimeoutError):  # librdkafka's own 0.1 s overrun: bounded too
            reader.committed(TopicPartition("t", 0), timeout_ms=100)

        assert src.commit() is True
        assert made == [stuck, fresh] and fresh.landed == [5]
        assert src._consumer is reader and src.positions() == {"t:0": 5}
        assert stuck.calls == [] and fresh.calls == []  # nothing re-assigned or re-sought
        src.seek({"t:0": 9})
        assert src.commit() is True and fresh.landed == [5, 9]

        stuck.release.set()  # the first commit (offset 5) lands after the newer one
        with fresh.changed:
            assert fresh.changed.wait_for(lambda: len(fresh.landed) == 3, patience(10))
        assert stuck.landed == [5] and fresh.landed == [5, 9, 9]
    finally:
        stuck.release.set()
        src.close()


def test_confluent_commit_waits_out_an_outage_on_the_same_consumer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While the cluster is away, an unanswered commit fails and the next waits for it on the
    same consumer (librdkafka answers them in order once the cluster is back): no consumer
    is added per attempt."""
    pytest.importorskip("confluent_kafka")
    handle = _RdConsumer(stuck=True)
    made = _rd_consumers(monkeypatch, handle, away=True)
    src = KafkaSource("t", "127.0.0.1:1", "g", commit_timeout_s=1.0, client="confluent-kafka")
    try:
        assert src.commit({"t:0": 5}) is False
        assert src.commit({"t:0": 7}) is False  # the first one still has no answer
        assert made == [handle] and not src._consumer.wedged and handle.landed == []
        handle.stuck = False
        handle.release.set()  # the cluster is back: the first lands, then the newest
        assert src.commit({"t:0": 7}) is True
        with handle.changed:  # and the newest once more, after the first's late answer
            assert handle.changed.wait_for(lambda: len(handle.landed) == 3, patience(10))
        assert handle.landed == [5, 7, 7]
    finally:
        handle.release.set()
        src.close()


class _RdReader(_RdConsumer):
    """A librdkafka consumer handle that reads: a ``stale`` one fails every metadata request at
    once (seen after a broker restart) while the cluster answers others."""

    def __init__(self, stale: bool) -> None:
        super().__init__(stuck=False)
        self.stale = stale
        self.assigned: list[Any] = []
        self.sought: list[tuple[int, int]] = []
        self.closed = threading.Event()

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        from confluent_kafka import KafkaError, KafkaException

        if self.stale:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))
        part = types.SimpleNamespace(id=0)
        return types.SimpleNamespace(
            topics={"t": types.SimpleNamespace(error=None, partitions={0: part})}
        )

    def assign(self, partitions: list[Any]) -> None:
        self.assigned = [(tp.topic, tp.partition) for tp in partitions]

    def seek(self, tp: Any) -> None:
        self.sought.append((tp.partition, tp.offset))

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        return []

    def close(self) -> None:
        self.closed.set()


def test_confluent_reader_whose_metadata_fails_while_the_cluster_answers_is_replaced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reading consumer whose metadata requests fail while a new handle is answered is
    replaced: the new one resumes every partition at the source's own position (no record
    read again or skipped) and the old one is closed; while the cluster is away nothing is."""
    pytest.importorskip("confluent_kafka")
    from connectors import _confluent

    monkeypatch.setattr(_confluent, "STALE_PROBE_EVERY_S", 0.0)
    stale, fresh = _RdReader(stale=True), _RdReader(stale=False)
    made = _rd_consumers(monkeypatch, stale, fresh, away=True)
    src = KafkaSource("t", "127.0.0.1:1", "g", retry_backoff_max_s=0.01, client="confluent-kafka")
    try:
        src.seek({"t:0": 7})
        assert src.poll(timeout_s=0.01) == []  # the cluster is away too: an outage
        assert src.poll(timeout_s=0.01) == []
        assert made == [stale] and not src._consumer.stale and src.unreachable_since is not None

        monkeypatch.setattr(_RdAdmin, "away", False)  # the cluster answers; this handle not
        assert src.poll(timeout_s=0.01) == []
        assert stale.closed.wait(patience(10)) and src._consumer is None
        assert src.poll(timeout_s=0.01) == []
        assert made == [stale, fresh] and stale.assigned == []
        assert fresh.assigned == [("t", 0)] and fresh.sought == [(0, 7)]
        assert src.positions() == {"t:0": 7}
    finally:
        src.close()


class _RdMovingCoordinator(_RdConsumer):
    """A librdkafka consumer handle whose group coordinator is not ready for ``failures``
    requests (a broker that just started creates its offsets topic)."""

    def __init__(self, failures: int, code: int) -> None:
        super().__init__(stuck=False)
        self.failures, self.code = failures, code

    def committed(self, partitions: list[Any], timeout: float) -> list[Any]:
        from confluent_kafka import KafkaError, KafkaException

        if self.failures:
            self.failures -= 1
            raise KafkaException(KafkaError(self.code))
        partitions[0].offset = 41
        return partitions


@pytest.mark.parametrize("code", [14, 15, 16], ids=["loading", "not-available", "not-coordinator"])
def test_confluent_committed_asks_again_while_the_coordinator_moves(
    monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    """The group's committed offsets are asked for again while the coordinator loads or
    moves, as kafka-python does, until the timeout; other errors are raised at once."""
    pytest.importorskip("confluent_kafka")
    import kafka.errors as E
    from kafka import TopicPartition

    from connectors._confluent import ConfluentConsumer

    handles = [_RdMovingCoordinator(3, code), _RdMovingCoordinator(10**6, code)]
    handles.append(_RdMovingCoordinator(1, 87))  # 87: an error that is not the coordinator's
    _rd_consumers(monkeypatch, *handles, away=False)
    tp = TopicPartition("t", 0)
    quick, stuck, other = (ConfluentConsumer({"group_id": "g"}) for _ in handles)
    assert quick.committed(tp, timeout_ms=int(patience(10) * 1000)) == 41
    with pytest.raises(E.for_code(code)):
        stuck.committed(tp, timeout_ms=300)
    with pytest.raises(E.for_code(87)):
        other.committed(tp, timeout_ms=int(patience(10) * 1000))
    assert handles[2].failures == 0  # asked once


class _RdRefusingSeek(_RdConsumer):
    """A librdkafka consumer handle that refuses a seek with ``code`` (its partition assigned
    a moment ago) and records its assignments with their offsets."""

    def __init__(self, code: int) -> None:
        super().__init__(stuck=False)
        self.code = code
        self.assigned: list[list[tuple[int, int]]] = []

    def seek(self, tp: Any) -> None:
        from confluent_kafka import KafkaError, KafkaException

        raise KafkaException(KafkaError(self.code))

    def assign(self, partitions: list[Any]) -> None:
        self.assigned.append([(tp.partition, tp.offset) for tp in partitions])

    def assignment(self) -> list[Any]:
        from confluent_kafka import TopicPartition

        return [TopicPartition("t", 0)]


@pytest.mark.parametrize("name", ["_STATE", "_OUTDATED"])
def test_confluent_seek_refused_after_an_assignment_assigns_again_at_the_offset(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """A seek librdkafka refuses because the partition was assigned a moment ago (its fetcher
    not started, or the seek overtaken by the assignment's start) puts the partition where the
    seek would have: assigned again at that offset. Another error is raised."""
    pytest.importorskip("confluent_kafka")
    from confluent_kafka import KafkaError
    from kafka import TopicPartition

    from connectors._confluent import ConfluentConsumer

    handles = [_RdRefusingSeek(getattr(KafkaError, name)), _RdRefusingSeek(KafkaError._FAIL)]
    _rd_consumers(monkeypatch, *handles, away=False)
    refused, failing = (ConfluentConsumer({"group_id": "g"}) for _ in handles)
    refused.seek(TopicPartition("t", 0), 7)
    assert handles[0].assigned == [[(0, 7)]]
    with pytest.raises(Exception, match="Local"):
        failing.seek(TopicPartition("t", 0), 7)
    assert handles[1].assigned == []


def test_confluent_resume_asks_for_metadata_so_that_the_fetcher_wakes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Resuming asks for the topic's metadata: librdkafka's idle fetcher notices a resumed
    partition only when it next wakes (up to 1 s later), and a metadata response wakes it. The
    partitions are not assigned again (an assignment during a rebalance is not the adapter's
    to make), and a failed request is no error."""
    pytest.importorskip("confluent_kafka")
    from confluent_kafka import KafkaError, KafkaException
    from kafka import TopicPartition

    from connectors._confluent import ConfluentConsumer

    handle = _RdRefusingSeek(KafkaError._STATE)
    asked: list[tuple[str, float]] = []
    handle.pause = lambda tps: None
    handle.resume = lambda tps: asked.append(("resume", 0.0))
    handle.list_topics = lambda topic, timeout: asked.append((topic, timeout))
    _rd_consumers(monkeypatch, handle, away=False)
    consumer = ConfluentConsumer({"group_id": "g"})
    tp = TopicPartition("t", 0)
    consumer.pause(tp)
    consumer.seek(tp, 7)  # refused: assigned again at 7
    consumer.resume(tp)
    assert asked[0] == ("resume", 0.0) and asked[1][0] == "t" and 0 < asked[1][1] <= 5
    assert handle.assigned == [[(0, 7)]], "not assigned again by the resume"

    def fails(topic: str, timeout: float) -> None:
        raise KafkaException(KafkaError(KafkaError._TRANSPORT))

    handle.list_topics = fails
    consumer.resume(tp)  # no error: the fetcher wakes by itself


class _RdQueue:
    """A librdkafka consumer handle's fetch queue: ``consume(n, timeout)`` as librdkafka's, which
    waits out the timeout unless n messages are queued; ``poll`` ends at the first message."""

    def __init__(self, queued: int, arriving: int) -> None:
        self.queued, self.arriving = queued, arriving
        self.waited: list[tuple[str, float]] = []

    def consume(self, n: int, timeout: float) -> list[Any]:
        got = min(n, self.queued)
        self.queued -= got
        if got < n and timeout > 0:
            self.waited.append(("consume", timeout))
        return [_RdMessage(i) for i in range(got)]

    def poll(self, timeout: float) -> Any:
        self.waited.append(("poll", timeout))
        if not self.arriving:
            return None
        self.queued, self.arriving = self.queued + self.arriving - 1, 0
        return _RdMessage(0)


class _RdMessage:
    def __init__(self, offset: int) -> None:
        self._offset = offset

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def key(self) -> None:
        return None

    def value(self) -> bytes:
        return b"{}"

    def timestamp(self) -> tuple[int, int]:
        return (0, 0)


def test_confluent_poll_returns_what_is_queued_without_waiting_for_a_full_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kafka-python's poll returns as soon as it has records; librdkafka's ``consume(n, t)``
    waits out t unless n are queued. The adapter takes what is queued at once, and with nothing
    queued waits only for the first message to arrive."""
    pytest.importorskip("confluent_kafka")
    from connectors._confluent import ConfluentConsumer

    def polled(queued: int, arriving: int) -> tuple[int, list[tuple[str, float]]]:
        handle = _RdQueue(queued, arriving)
        _rd_consumers(monkeypatch, handle, away=False)
        consumer = ConfluentConsumer({"group_id": "g"})
        got = sum(len(r) for r in consumer.poll(timeout_ms=500, max_records=100).values())
        return got, handle.waited

    assert polled(10, 0) == (10, [])  # queued: no wait
    assert polled(0, 7) == (7, [("poll", 0.5)])  # the wait ends at the first to arrive
    assert polled(0, 0) == (0, [("poll", 0.5)])  # nothing: the whole timeout, as before
    assert polled(250, 0) == (100, [])


def test_kafka_positions_seek_and_parse(kafka_client: str) -> None:
    src = KafkaSource("events", "127.0.0.1:1", "g", client=kafka_client)
    src.seek({"events:0": 10, "events:2": 7, "other:0": 3})
    assert src.positions() == {"events:0": 10, "events:2": 7}
    for bad in ({"events": 1}, {"events:x": 1}, {"events:0": -1}, {"events:0": "5"}):
        with pytest.raises(ValueError):
            src.seek(bad)
    with pytest.raises(ValueError):
        KafkaSource("a:b", "127.0.0.1:1", "g", client=kafka_client)
    src.close()


def test_kafka_source_rides_out_unreachable_broker(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str], kafka_client: str
) -> None:
    src = KafkaSource(
        "t",
        f"127.0.0.1:{unused_port()}",
        "g",
        max_idle_seconds=2.0,
        retry_backoff_max_s=0.5,
        commit_timeout_s=1.0,
        consumer_config={"bootstrap_timeout_ms": 300},
        client=kafka_client,
    )
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="connectors"):
        assert list(src) == []
        assert src.commit({"t:0": 5}) is False
    assert time.monotonic() - start < patience(15)  # bounded retries (4 s at load 4.5)
    assert any("retry" in r.getMessage() for r in caplog.records if r.name.startswith("connectors"))
    src.close()
    # The client's own lines go through logging (quieted with the "kafka" logger), never
    # straight to the terminal.
    assert capfd.readouterr().err == ""


def test_kafka_sink_raises_rather_than_dropping(kafka_client: str) -> None:
    sink = KafkaSink(
        "t",
        f"127.0.0.1:{unused_port()}",
        delivery_timeout_s=1.5,
        retry_backoff_max_s=0.2,
        max_block_ms=300,
        client=kafka_client,
    )
    start = time.monotonic()
    with pytest.raises(KafkaSinkError, match="could not send"):
        sink.send("k", b"{}")
    assert time.monotonic() - start < patience(15)  # delivery_timeout_s (1.7 s at load 4.5)
    with pytest.raises(TypeError):
        sink.send("k", "not bytes")  # type: ignore[arg-type]
    sink.close()


def test_kafka_sink_forgets_delivered_messages_in_linear_time() -> None:
    """Sends that outrun delivery must not make every send rescan what is still in flight
    (a pass per send past 1,024 pending made 300,000 sends take over 15 minutes)."""
    looks = [0]

    class Future:
        delivered = False

        def succeeded(self) -> bool:
            looks[0] += 1
            return self.delivered

    class Producer:
        def __init__(self) -> None:
            self.sent: list[Future] = []

        def send(self, topic: str, value: bytes, key: bytes | None) -> Future:
            self.sent.append(Future())
            if len(self.sent) % 3 == 0:  # the broker acknowledges one message in three
                self.sent[-3].delivered = True
            return self.sent[-1]

    sink = KafkaSink("t", "127.0.0.1:1")
    sink._producer = producer = Producer()
    n = 50_000
    for i in range(n):
        sink.send(None, b"%d" % i)
    assert looks[0] < 6 * n  # amortised O(1) per send (the old pass: ~n × 1,024 looks)
    undelivered = [f for f in producer.sent if not f.delivered]
    assert len(sink._pending) < 2 * len(undelivered) + 1024  # delivered ones are forgotten
    assert {id(p.future) for p in sink._pending} >= {id(f) for f in undelivered}  # none lost


# --------------------------------------------------------------------------------------------
# Sinks
# --------------------------------------------------------------------------------------------


def test_jsonl_sink_appends_and_validates(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "out.jsonl"
    with JsonlSink(path) as sink:
        sink.send("m", b'{"i": 0}')
        assert path.read_bytes() == b'{"i": 0}\n', "flushed per message by default"
        with pytest.raises(ValueError, match="line breaks"):
            sink.send("m", b'{"i":\n1}')
        with pytest.raises(TypeError):
            sink.send("m", '{"i": 1}')  # type: ignore[arg-type]
    with JsonlSink(path, flush_each=False, fsync=True) as sink:
        sink.send(None, bytearray(b'{"i": 1}'))
        sink.flush()
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"i": 0}, {"i": 1}]
    sink.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        sink.send("m", b"{}")
    # Lines written by the sink read back through the source.
    assert [m.position["line"] for m in JsonlSource(path)] == [0, 1]


def test_jsonl_sink_file_mode(tmp_path: Path) -> None:
    path = tmp_path / "dead.jsonl"
    JsonlSink(path, file_mode=0o600).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_stdout_and_callback_sinks(capsys: pytest.CaptureFixture[str]) -> None:
    sink = StdoutSink()
    sink.send("k", b'{"a": 1}')
    sink.close()
    assert capsys.readouterr().out == '{"a": 1}\n'
    buf = io.StringIO()
    StdoutSink(buf).send(None, b"\xff")
    assert buf.getvalue() == "\ufffd\n"

    seen: list[tuple[str | None, bytes]] = []
    cb = CallbackSink(lambda k, v: seen.append((k, v)))
    publish_release(cb, release())
    cb.flush()
    cb.close()
    assert seen[0][0] == "model-a"
    assert ReleaseMessage.from_json(seen[0][1]) == release()


def test_dead_letter_sink_counts(tmp_path: Path) -> None:
    path = tmp_path / "dead.jsonl"
    inner = JsonlSink(path)
    dead = DeadLetterSink(inner)
    src = IterableSource([b"{bad", b'{"x": [1]}', b'{"x": [1], "y": 1}', b"[]", b"{also bad"])
    good = []
    for msg in src:
        try:
            good.append(parse_record(msg.value))
        except RecordError as err:
            dead.send_error(err, msg.value, msg.position)
    dead.send_dead("unknown_feature", "feature 'z'", {"x": {"z": 1}, "y": 0})
    dead.close()

    assert len(good) == 1
    assert dead.counts == {
        "invalid_json": 2,
        "missing_label": 1,
        "wrong_type": 1,
        "unknown_feature": 1,
    }
    assert dead.total == 5
    letters = [DeadLetter.model_validate_json(line) for line in path.read_bytes().splitlines()]
    assert [d.reason for d in letters] == [
        "invalid_json",
        "missing_label",
        "wrong_type",
        "invalid_json",
        "unknown_feature",
    ]
    assert letters[0].payload == "{bad" and letters[0].source_position == {"line": 0}
    assert letters[-1].source_position is None


def test_dead_letter_sink_counts_only_delivered() -> None:
    def boom(key: str | None, value: bytes) -> None:
        raise OSError("disk full")

    dead = DeadLetterSink(CallbackSink(boom))
    with pytest.raises(OSError):
        dead.send_dead("invalid_json", "bad", b"{")
    assert dead.total == 0


def test_source_message_is_immutable() -> None:
    msg = SourceMessage(b"{}", {"line": 0})
    with pytest.raises(AttributeError):
        msg.value = b"x"  # type: ignore[misc]
    assert msg.key is None


class _FakeTransactionalProducer:
    """A stand-in KafkaProducer: the first one hangs in init_transactions until released."""

    made: list[_FakeTransactionalProducer] = []
    release_first = None  # threading.Event, set by the test

    def __init__(self, **config: Any) -> None:
        self.index = len(self.made)
        self.made.append(self)
        self.closed = False
        self.committed: list[list[tuple[str, bytes | None, bytes]]] = []
        self.fail_commit_once = self.index == 1

    def init_transactions(self) -> None:
        if self.index == 0:
            self.release_first.wait(patience(30))  # the test releases it (at once)

    def begin_transaction(self) -> None:
        self.batch: list[tuple[str, bytes | None, bytes]] = []

    def partitions_for(self, topic: str) -> set[int]:
        return {0}

    def send(
        self, topic: str, value: bytes, key: bytes | None, partition: int | None = None
    ) -> Any:
        self.batch.append((topic, key, value))

        class Done:
            def failed(self) -> bool:
                return False

        return Done()

    def flush(self, timeout: float | None = None) -> None:
        pass

    def commit_transaction(self) -> None:
        from kafka.errors import KafkaConnectionError

        if self.fail_commit_once:
            self.fail_commit_once = False
            raise KafkaConnectionError("broker went away")
        self.committed.append(self.batch)

    def close(self, timeout: float | None = None) -> None:
        self.closed = True


def test_an_abandoned_attempt_that_finishes_late_does_not_break_the_next(
    monkeypatch: pytest.MonkeyPatch, kafka_client: str
) -> None:
    """An attempt abandoned in init_transactions finishes after the publisher moved on.

    It must neither mark the publisher ready (a later attempt would find no producer) nor touch
    the producer of a later attempt: the batch is published, once, by a live producer.
    """
    import threading

    from connectors.transactions import TransactionalPublisher

    fake = _FakeTransactionalProducer
    fake.made = []
    fake.release_first = threading.Event()
    pub = TransactionalPublisher(
        "127.0.0.1:1",
        "stream-dp.test",
        attempt_timeout_s=0.3,
        retry_backoff_max_s=0.01,
        client=kafka_client,
    )
    monkeypatch.setattr(type(pub.client), "producer", lambda self, **config: fake(**config))
    # Attempts of other tests may still be waiting in their workers (daemon threads against a
    # stopped broker): only this test's workers are waited for below.
    before = set(threading.enumerate())
    pub.start()  # the first producer hangs and is abandoned; the second one starts
    assert len(fake.made) == 2 and fake.made[0].closed
    ours = [t for t in threading.enumerate() if t.name == "stream-dp-txn" and t not in before]

    def late_finish(err: BaseException) -> None:
        # The second producer's commit failed and it was discarded: now the abandoned first
        # attempt's init_transactions returns, before the retry.
        fake.release_first.set()
        for worker in ours:
            worker.join(patience(10))  # it returns once released (at once)
            assert not worker.is_alive()

    pub.publish([("releases", b"m", b"v1")], on_retry=late_finish)
    live = [p for p in fake.made if not p.closed]
    assert len(live) == 1 and live[0].index == 2
    assert live[0].committed == [[("releases", b"m", b"v1")]]
    pub.publish([("releases", b"m", b"v2")])
    assert live[0].committed[-1] == [("releases", b"m", b"v2")]
    pub.close()


class _StallingProducer(_FakeTransactionalProducer):
    """A stand-in confluent-kafka producer: the first one's commit never ends (librdkafka
    issue #5456) until released; ``cluster_answers`` says whether a new handle is answered."""

    answers = False

    def __init__(self, **config: Any) -> None:
        super().__init__(**config)
        self.fail_commit_once = False

    def init_transactions(self) -> None:
        pass

    def commit_transaction(self) -> None:
        if self.index == 0:
            self.release_first.wait(patience(30))
            return
        super().commit_transaction()

    def cluster_answers(self) -> bool:
        return self.answers


@pytest.mark.parametrize("answers", [True, False], ids=["cluster-answers", "cluster-away"])
def test_an_attempt_stuck_while_the_cluster_answers_is_abandoned_early(
    monkeypatch: pytest.MonkeyPatch, answers: bool
) -> None:
    """A transactional call that goes on although the cluster answers is abandoned soon after
    the cluster is seen answering, not at the attempt's bound; while the cluster is away, the
    attempt is left its whole bound (an outage is waited out)."""
    import threading

    from connectors import transactions
    from connectors.transactions import TransactionalPublisher

    monkeypatch.setattr(transactions, "STALL_CHECK_S", 0.2)
    monkeypatch.setattr(transactions, "STALL_PROBE_EVERY_S", 0.1)
    monkeypatch.setattr(transactions, "STALL_GRACE_S", 0.3)
    fake = _StallingProducer
    monkeypatch.setattr(fake, "made", [])
    monkeypatch.setattr(fake, "answers", answers)
    monkeypatch.setattr(fake, "release_first", threading.Event())
    bound = patience(30) if answers else 1.5
    pub = TransactionalPublisher(
        "127.0.0.1:1", "stream-dp.test", attempt_timeout_s=bound, retry_backoff_max_s=0.01
    )
    monkeypatch.setattr(type(pub.client), "producer", lambda self, **config: fake(**config))
    errors: list[str] = []
    began = time.monotonic()
    try:
        pub.publish([("releases", b"m", b"v1")], on_retry=lambda err: errors.append(str(err)))
        took = time.monotonic() - began
    finally:
        fake.release_first.set()
        pub.close()
    assert len(errors) == 1 and fake.made[0].closed
    assert fake.made[1].committed == [[("releases", b"m", b"v1")]]
    if answers:
        assert "while the cluster answers" in errors[0] and took < bound
    else:
        assert "no answer within" in errors[0] and took >= bound


def _wrapped_fencing(form: str) -> BaseException:
    """A fencing as kafka-python reports it: itself, or wrapped by its transaction manager."""
    import kafka.errors as E

    fenced = E.ProducerFencedError()
    if form == "as-is":
        return fenced
    if form == "in-args":  # a send after the transaction failed
        return E.KafkaError(
            "Cannot perform send because at least one previous transactional or idempotent "
            "request has failed with errors.",
            fenced,
        )
    return E.KafkaError(  # a transactional call after it failed: only its message names it
        f"Cannot execute transactional method because we are in an error state: {fenced}"
    )


@pytest.mark.parametrize("form", ["as-is", "in-args", "in-message"])
@pytest.mark.parametrize("call", ["send", "commit_transaction"])
def test_a_fencing_wrapped_by_kafka_python_is_final(
    monkeypatch: pytest.MonkeyPatch, form: str, call: str
) -> None:
    """A producer fenced by another instance stops, however kafka-python reports the fencing.

    Taken for an ordinary failure, the attempt was retried with a new producer, whose
    registration fenced the instance that had fenced this one: both instances then published
    every step, each with its own noise."""
    from connectors.transactions import ProducerFenced, TransactionalPublisher

    class Producer(_FakeTransactionalProducer):
        def init_transactions(self) -> None:
            pass

        def send(self, topic: str, value: bytes, key: bytes | None, partition=None) -> Any:
            if call == "send":
                raise _wrapped_fencing(form)
            return super().send(topic, value, key, partition)

        def commit_transaction(self) -> None:
            raise _wrapped_fencing(form)

    monkeypatch.setattr(Producer, "made", [])
    pub = TransactionalPublisher("127.0.0.1:1", "stream-dp.test", retry_backoff_max_s=0.01)
    monkeypatch.setattr(type(pub.client), "producer", lambda self, **config: Producer(**config))
    with pytest.raises(ProducerFenced, match="this one is fenced"):
        pub.publish([("releases", b"m", b"v")], on_retry=pytest.fail)
    assert len(Producer.made) == 1, "no new producer registers after a fencing"
    pub.close()


def test_a_send_that_failed_is_never_committed(
    monkeypatch: pytest.MonkeyPatch, kafka_client: str
) -> None:
    """A batch kafka-python failed (delivery timed out in an outage) leaves its transaction
    committable; committing it would commit the offsets without the records. The attempt must
    end uncommitted and the retry publish the whole batch."""
    from kafka.errors import KafkaTimeoutError

    from connectors.transactions import TransactionalPublisher

    class Producer(_FakeTransactionalProducer):
        def init_transactions(self) -> None:
            pass

        def send_offsets_to_transaction(self, offsets: dict, group_metadata: Any) -> None:
            self.batch.append(("offsets", None, repr(sorted(offsets)).encode()))

        def send(self, topic: str, value: bytes, key: bytes | None, partition=None) -> Any:
            self.batch.append((topic, key, value))
            lost = self.index == 0 and value == b"v2"

            class Sent:
                exception = KafkaTimeoutError("Expiring 1 record(s): delivery timed out")

                def failed(self) -> bool:
                    return lost

            return Sent()

        def commit_transaction(self) -> None:
            self.committed.append(self.batch)

    Producer.made = []
    pub = TransactionalPublisher(
        "127.0.0.1:1", "stream-dp.test", retry_backoff_max_s=0.01, client=kafka_client
    )
    monkeypatch.setattr(type(pub.client), "producer", lambda self, **config: Producer(**config))
    retried: list[BaseException] = []
    batch = [("releases", b"m", b"v1"), ("releases", b"m", b"v2")]
    pub.publish(batch, {"in-0": 7}, "g", on_retry=retried.append)
    assert Producer.made[0].committed == [], "the attempt with a lost send committed"
    assert [type(e).__name__ for e in retried] == ["KafkaTimeoutError"]
    assert [p.committed for p in Producer.made[1:]] == [[[*batch, ("offsets", None, b"['in-0']")]]]
    pub.close()


def test_pinned_partitions_are_the_default_partitioners() -> None:
    """The publisher pins each keyed message to the partition kafka-python's own default
    partitioner gives it, so pinning moves no message; keyless messages stay unpinned."""
    from kafka.partitioner import DefaultPartitioner

    from connectors.transactions import _KeyPartitions

    class Cluster:
        def topics(self) -> set[str]:
            return {"t"}

        def partitions_for_topic(self, topic: str) -> set[int]:
            return set(range(7))

        def available_partitions_for_topic(self, topic: str) -> set[int]:
            return set(range(7))

    class Producer:
        asked = 0

        def partitions_for(self, topic: str) -> set[int]:
            Producer.asked += 1
            return set(range(7))

    where, default = _KeyPartitions(Producer()), DefaultPartitioner()
    keys = [f"model-{i}/p{i % 5}".encode() for i in range(200)]
    got = [where("t", k) for k in keys + keys]
    want = [default.partition("t", k, k, b"", b"", Cluster()) for k in keys + keys]
    assert got == want
    assert len(set(got)) == 7  # the keys spread, so a wrong rule would show
    assert Producer.asked == len(set(keys))  # worked out once per key
    assert where("t", None) is None


def test_offsets_go_with_their_consumers_group_metadata(
    monkeypatch: pytest.MonkeyPatch, kafka_client: str
) -> None:
    """KIP-447: the transaction's offset commit carries the group metadata of the consumer that
    read the offsets, on both clients; a commit the group refuses (the consumer's generation has
    passed) fences the publisher: nothing of the batch is visible, and it is not retried."""
    import kafka.errors as E
    from kafka import OffsetAndMetadata, TopicPartition

    from connectors.transactions import ProducerFenced, TransactionalPublisher
    from connectors.transport import GroupOffsets

    sent: list[tuple[dict, Any]] = []

    class Producer(_FakeTransactionalProducer):
        refuse: BaseException | None = None

        def init_transactions(self) -> None:
            pass

        def send_offsets_to_transaction(self, offsets: dict, group_metadata: Any) -> None:
            sent.append((offsets, group_metadata))
            if Producer.refuse is not None:
                raise Producer.refuse

        def commit_transaction(self) -> None:
            self.committed.append(self.batch)

    pub = TransactionalPublisher("127.0.0.1:1", "stream-dp.test", client=kafka_client)
    monkeypatch.setattr(type(pub.client), "producer", lambda self, **config: Producer(**config))
    metadata = object()  # each client's own type; the publisher passes it on untouched
    offsets = GroupOffsets(
        {TopicPartition("in", 0): OffsetAndMetadata(7, "stream-dp/1 r 1", -1)}, metadata
    )
    pub.publish([("releases", b"m", b"v")], offsets, "g")
    assert sent == [({TopicPartition("in", 0): OffsetAndMetadata(7, "stream-dp/1 r 1", -1)},
                     metadata)]  # fmt: skip
    # Plain offsets (no consumer at hand) fall back to the group id, as before KIP-447.
    pub.publish([], dict(offsets), "g")
    assert sent[-1][1] == "g"
    for refusal in (E.IllegalGenerationError("stale"), E.CommitFailedError("metadata mismatch")):
        Producer.refuse = refusal
        tries = len(sent)
        with pytest.raises(ProducerFenced, match="consumer group refused the offsets"):
            pub.publish([("releases", b"m", b"v2")], offsets, "g", on_retry=pytest.fail)
        assert len(sent) == tries + 1, "fencing is final: no retry"
    Producer.refuse = None
    pub.close()


def test_a_resumed_partition_publishes_with_its_consumers_group_metadata() -> None:
    """KIP-447 in scale-out: a partition learner that resumes from a checkpoint seeks, then
    may publish the cycle its previous owner left before it has polled anything; the offsets
    of that publication carry the consumer's group metadata of the generation that assigned
    the partition (confluent-kafka refuses a transactional offset commit without it)."""
    from kafka import OffsetAndMetadata, TopicPartition

    from connectors.partition import PartitionSource

    class Consumer:
        generation = 0

        def seek(self, tp: Any, offset: int) -> None:
            pass

        def group_metadata(self) -> Any:
            return ("g", Consumer.generation)

    consumer = Consumer()
    src = PartitionSource(consumer, "in", 3, "g")
    Consumer.generation = 4  # joined, partition 3 assigned
    src.seek({"in:3": 120, "in:1": 7})
    offsets = src.offsets(tag="r 1")
    assert dict(offsets) == {TopicPartition("in", 3): OffsetAndMetadata(120, "stream-dp/1 r 1", -1)}
    assert offsets.group_metadata == ("g", 4)


def test_a_tail_read_out_of_time_is_an_error_never_a_shorter_answer() -> None:
    """latest_with_key answers whether a fenced run released (aborted messages included): a
    read that runs out of time before the window's end must raise, not answer None or an
    older message of the key (a double release would follow)."""
    from kafka import TopicPartition
    from kafka.errors import KafkaError

    from connectors.admin import latest_with_key
    from connectors.transport import Client

    class Stalled:
        """Hands out the window's first records, then nothing (a broker that stalls)."""

        def __init__(self, first: list) -> None:
            self.first, self.at = first, 0

        def partitions_for_topic(self, topic):
            return {0}

        def end_offsets(self, tps, timeout_ms=None):
            return dict.fromkeys(tps, 100)

        def beginning_offsets(self, tps, timeout_ms=None):
            return dict.fromkeys(tps, 0)

        def assign(self, tps):
            pass

        def seek(self, tp, offset):
            self.at = offset

        def poll(self, timeout_ms=0):
            batch, self.first = self.first, []
            if batch:
                self.at = batch[-1].offset + 1
            return {TopicPartition("t", 0): batch} if batch else {}

        def position(self, tp, timeout_ms=None):
            return self.at

        def close(self, autocommit=False):
            pass

    def rec(offset: int, value: bytes) -> Any:
        return types.SimpleNamespace(key=b"m", offset=offset, timestamp=offset, value=value)

    for first in ([rec(92, b"older")], []):
        client = Client()
        client.consumer = lambda _first=first, **_: Stalled(list(_first))  # type: ignore
        with pytest.raises(KafkaError):
            latest_with_key("x:1", "t", b"m", timeout_s=0.2, client=client, committed=False)


def test_a_dropped_group_join_is_rejoined_and_nothing_else_is() -> None:
    """kafka-python 3.0's coordinator, its join task done while rebalancing and no rejoin
    wanted, is a join nobody will apply: a rejoin is requested then, and in no other state."""
    from connectors._kafka_python import rejoin_if_join_lost

    class Coordinator:
        def __init__(self, task_done: bool | None, rebalancing: bool, wanted: bool) -> None:
            self._join_task = (
                None if task_done is None else types.SimpleNamespace(is_done=task_done)
            )
            self.rebalancing, self.wanted, self.requested = rebalancing, wanted, False

        def rebalance_in_progress(self) -> bool:
            return self.rebalancing

        def need_rejoin(self) -> bool:
            return self.wanted

        def request_rejoin(self) -> None:
            self.requested = True

    for task_done in (None, False, True):
        for rebalancing in (False, True):
            for wanted in (False, True):
                c = Coordinator(task_done, rebalancing, wanted)
                lost = task_done is True and rebalancing and not wanted
                assert rejoin_if_join_lost(c) is lost and c.requested is lost
    assert rejoin_if_join_lost(types.SimpleNamespace()) is False  # another version: left alone
    assert (
        rejoin_if_join_lost(types.SimpleNamespace(_join_task=types.SimpleNamespace(is_done=True)))
        is False
    )

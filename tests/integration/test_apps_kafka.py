"""The Kafka apps (``stream-dp watch``, ``stream-dp merge``) against a real broker: what they
refuse. Their normal runs are the README's (tests/integration/test_readme_kafka.py)."""

from __future__ import annotations

import pytest

from stream_dp.cli import main as cli_main

from .kafka_broker import KafkaBroker

pytestmark = pytest.mark.kafka


@pytest.mark.parametrize(
    "argv",
    [
        ["watch", "--idle-seconds", "1"],
        ["merge", "--model", "m", "--idle-seconds", "1"],
    ],
    ids=["watch", "merge"],
)
def test_reading_a_missing_topic_is_one_line_and_exit_code_4(
    kafka_broker: KafkaBroker, unique_name, capsys, argv
):
    """Before, watch waited for the idle time on a topic that does not exist and exited 0."""
    topic = unique_name("missing")
    command = [*argv, "--bootstrap", kafka_broker.bootstrap, "--topic", topic]
    capsys.readouterr()
    assert cli_main(command) == 4
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1, captured.err
    assert f"topic {topic!r} does not exist" in captured.err
    assert "Traceback" not in captured.err and captured.out == ""

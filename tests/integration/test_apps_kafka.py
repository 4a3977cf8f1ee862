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
    kafka_broker: KafkaBroker, unique_name, capsys, argv, kafka_client
):
    """Before, watch waited for the idle time on a topic that does not exist and exited 0."""
    topic = unique_name("missing")
    command = [*argv, "--bootstrap", kafka_broker.bootstrap, "--topic", topic]
    command += ["--client", kafka_client]
    capsys.readouterr()
    assert cli_main(command) == 4
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1, captured.err
    assert f"topic {topic!r} does not exist" in captured.err
    assert "Traceback" not in captured.err and captured.out == ""


def _release(model: str, k: int, step: int) -> bytes:
    from connectors import ReleaseMessage

    return ReleaseMessage(
        model_id=f"{model}/p{k}", algorithm="OnPairStrC", task="auc", step=step,
        release_index=step, weights=[float(k), float(step)], feature_names=["a", "b"],
        rho_spent=0.1, rho_budget=1.0, epsilon_spent=1.0, delta=1e-5, exhausted=False, time=0.0,
    ).to_json()  # fmt: skip


def test_merge_waits_for_every_partition_and_says_what_it_saw(
    kafka_broker: KafkaBroker, unique_name, capsys, kafka_client
):
    """A merge that sees no release, or not every partition learner's, publishes nothing and
    exits 3 in one line naming what it saw. With --wait it waits for the missing partition;
    replaying history it publishes only merged models of every partition, taken after the
    history (never p0's first step beside p1's)."""
    import json
    import threading

    from kafka import KafkaConsumer

    from connectors import KafkaSink

    from .test_engine_kafka import create_topic

    bootstrap = kafka_broker.bootstrap
    topic, model = unique_name("releases"), "m"
    create_topic(bootstrap, topic, partitions=1)
    merge = ["merge", "--bootstrap", bootstrap, "--topic", topic, "--model", model,
             "--partitions", "2", "--idle-seconds", "2", "--client", kafka_client]  # fmt: skip

    def send(*messages: tuple[int, int]) -> None:
        with KafkaSink(topic, bootstrap) as sink:
            for k, step in messages:
                sink.send(f"{model}/p{k}", _release(model, k, step))
            sink.flush()

    capsys.readouterr()
    assert cli_main(merge) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"no release of model {model!r}" in err, err
    send((0, 1), (0, 2), (0, 3))
    assert cli_main(merge) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no release yet of p1" in err and "p0 step 3" in err, err

    later = threading.Timer(3.0, send, args=((1, 1),))
    later.start()
    try:
        assert cli_main([*merge, "--wait", "60"]) == 0
    finally:
        later.cancel()
    out = capsys.readouterr().out
    assert "merged 2 partition(s): p0 step 3, p1 step 1" in out, out

    consumer = KafkaConsumer(f"{topic}.merged", bootstrap_servers=bootstrap,
                             auto_offset_reset="earliest", consumer_timeout_ms=4000)  # fmt: skip
    try:
        merged = [json.loads(m.value) for m in consumer]
    finally:
        consumer.close()
    assert merged and all(set(m["partitions"]) == {"0", "1"} for m in merged)
    assert merged[0]["partitions"]["0"]["step"] == 3, "the replayed history is not published"

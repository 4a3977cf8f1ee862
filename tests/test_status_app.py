"""``stream-dp status`` without Kafka: the cluster view built from a consumer group's
assignment and the instances' heartbeats, its table, its exit codes, and the heartbeat
publisher. Against a real broker (a SIGKILLed instance, two machines) in
tests/integration/test_scaleout_kafka.py.
"""

from __future__ import annotations

import json
import threading

from test_scaleout import kafka_config, write_toml

from connectors.transport import GroupDescription, GroupMember
from stream_dp.apps.status import cluster_view, format_view
from stream_dp.cli import main as cli_main
from stream_dp.engine import EngineConfig
from stream_dp.engine.heartbeat import (
    StatusPublisher,
    instance_of,
    member_client_id,
    status_key,
    status_topic,
)


def member(instance: str, *partitions: int, model: str = "bank", topic: str = "in"):
    return GroupMember(
        f"{instance}-m", member_client_id(model, instance), "10.0.0.9",
        tuple((topic, k) for k in partitions),
    )  # fmt: skip


def summary(instance: str, at: float, steps: dict[int, int], stopped: bool = False) -> dict:
    """An instance's status summary as it publishes it (the fields the view reads)."""
    return {
        "model_id": "bank", "instance": instance, "heartbeat": at, "partitions": sorted(steps),
        "stopped": stopped,
        "by_partition": {str(k): {"step": s, "epsilon_spent": s / 1000, "rho_spent": s / 1e5}
                         for k, s in steps.items()},
    }  # fmt: skip


def test_after_a_take_over_the_survivor_owns_everything_and_the_dead_instance_nothing():
    """A was killed holding p0, p1; its last summary still claims them. The group gave them to
    B: the view follows the group, not the summaries."""
    group = GroupDescription("g", "Stable", (member("B", 0, 1, 2, 3),))
    beats = {
        "A": summary("A", 950.0, {0: 40, 1: 41}),
        "B": summary("B", 999.5, {0: 45, 1: 44, 2: 90, 3: 91}),
    }
    view = cluster_view("bank", 4, group, beats, now=1000.0, topic="in")
    assert [p["owner"] for p in view["partitions"]] == ["B"] * 4
    assert [p["step"] for p in view["partitions"]] == [45, 44, 90, 91], "B's steps, not A's"
    assert all(p["heartbeat_age_s"] == 0.5 for p in view["partitions"])
    assert view["partitions"][2]["epsilon_spent"] == 0.09
    by_name = {i["instance"]: i for i in view["instances"]}
    assert by_name["B"]["state"] == "member" and by_name["B"]["partitions"] == [0, 1, 2, 3]
    assert by_name["A"]["state"] == "gone" and by_name["A"]["partitions"] == []
    assert by_name["A"]["heartbeat_age_s"] == 50.0
    json.dumps(view)  # the --json output

    lines = format_view(view)
    assert "4 partition learner(s), 1 member(s)" in lines[0]
    assert (
        lines[-1] == "instance A: gone (not in the group), holds nothing, last heartbeat 50.0 s ago"
    )
    assert lines[-2] == "instance B: member, holds p0 p1 p2 p3, heartbeat 0.5 s ago"
    assert lines[2].split() == ["p0", "B", "0.5", "s", "ago", "45", "0.045"]


def test_what_the_view_shows_before_the_owner_reports_and_during_a_rebalance():
    """A new owner that has not reported its partition yet shows no step; a partition the
    group assigns to nobody (a rebalance) has no owner; a member without any heartbeat, or
    that is no instance of the model, is still named; another topic's assignment is not the
    model's; an instance that stopped cleanly says so."""
    group = GroupDescription(
        "g",
        "CompletingRebalance",
        (
            member("B", 0, 1),
            member("C", 2),
            GroupMember("x-m", "console-consumer", "h", (("in", 3), ("other", 1))),
            member("D", 1, topic="other"),
        ),
    )
    beats = {"B": summary("B", 99.0, {0: 7}), "E": summary("E", 10.0, {}, stopped=True)}
    view = cluster_view("bank", 5, group, beats, now=100.0, topic="in")
    rows = view["partitions"]
    assert [r["owner"] for r in rows] == ["B", "B", "C", "console-consumer", None]
    assert (rows[1]["step"], rows[1]["heartbeat_age_s"]) == (None, 1.0), "not reported yet"
    assert (rows[2]["heartbeat"], rows[2]["heartbeat_age_s"]) == (None, None), "no heartbeat"
    states = {i["instance"]: (i["state"], i["partitions"]) for i in view["instances"]}
    assert states == {
        "B": ("member", [0, 1]),
        "C": ("member", [2]),
        "console-consumer": ("member", [3]),
        "D": ("member", []),
        "E": ("stopped", []),
    }
    text = "\n".join(format_view(view))
    assert "(CompletingRebalance)" in text and "p4         (none)" in text
    assert "instance C: member, holds p2, heartbeat never" in text
    assert "instance E: stopped (stopped cleanly), holds nothing" in text


def test_client_ids_and_keys_name_the_instance_even_with_dots_and_slashes():
    for model, inst in (("bank", "host-1"), ("a.b/c", "node.example.org-77")):
        assert instance_of(member_client_id(model, inst), model) == inst
        assert status_key(model, inst) == f"{model}/{inst}".encode()
    assert instance_of(member_client_id("bank", "x"), "bank2") is None
    assert instance_of("stream-dp.bank/", "bank") is None


def test_the_status_topic_defaults_beside_the_release_topic(tmp_path):
    cfg = kafka_config(tmp_path)
    assert status_topic(EngineConfig.model_validate(cfg)) == "r.status"
    cfg["scale"]["status_topic"] = "hb"
    assert status_topic(EngineConfig.model_validate(cfg)) == "hb"


def test_the_status_command_is_rc_4_in_one_line_when_the_broker_is_unreachable(tmp_path, capsys):
    path = tmp_path / "e.toml"
    write_toml(path, kafka_config(tmp_path))
    assert cli_main(["status", "--config", str(path)]) == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("stream-dp status: cannot reach Kafka"), err
    assert "127.0.0.1:1" in err[0]


def test_the_status_command_needs_a_per_partition_model(tmp_path, capsys):
    cfg = kafka_config(tmp_path)
    del cfg["scale"]
    path = tmp_path / "e.toml"
    write_toml(path, cfg)
    assert cli_main(["status", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "per-partition" in err[0], err


class _Producer:
    """Records what is sent; the first send blocks until released (a broker far away)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes]] = []
        self.release = threading.Event()
        self.config: dict = {}

    def send(self, topic, value=None, key=None):
        self.release.wait(5.0)
        self.sent.append((topic, key, value))

    def flush(self, timeout=None):
        pass

    def close(self, timeout=None):
        pass


def test_the_heartbeat_never_blocks_the_caller_and_sends_the_newest_summary(tmp_path, monkeypatch):
    import connectors.clients

    producer = _Producer()

    class Client:
        def producer(self, **config):
            producer.config = config
            return producer

    monkeypatch.setattr(connectors.clients, "client", lambda name: Client())
    config = EngineConfig.model_validate(kafka_config(tmp_path))
    publisher = StatusPublisher(config, "host-1")
    publisher.publish({"model_id": "bank", "n": 1})  # taken by the thread, whose send blocks
    for n in range(2, 50):  # each replaces the one before, without waiting for the broker
        publisher.publish({"model_id": "bank", "n": n})
    producer.release.set()
    publisher.close(timeout=5.0)
    sent = [(topic, key, json.loads(value)["n"]) for topic, key, value in producer.sent]
    assert sent[-1] == ("r.status", b"bank/host-1", 49), "the newest summary is sent last"
    assert len(sent) <= 3, "summaries not sent yet are replaced, not queued"
    assert producer.config["client_id"] == "stream-dp.bank/host-1"

"""Per-partition scale-out against a real broker: instances come, go and die; nothing is lost.

Two instances of one model share a 4-partition input (8,000 records keyed by a record id, then
live input until a third instance has learned part of it) and a state directory; one is
SIGKILLed mid-run and the survivor takes its partitions over after the group's session
timeout; a third instance started afterwards takes partitions from the survivor in a
rebalance. Every step of every partition learner is published, no step with
two different contents, no record learned twice, and each partition's ledger equals an
uninterrupted run's. With a checkpoint topic, a second machine resumes from it; what the topic
holds is sealed: a reader without the master finds no record, no noise state and no model, and
a damaged, forged, unsealed or foreign checkpoint is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import patience
from kafka import KafkaConsumer, TopicPartition

from connectors import KafkaSink
from stream_dp.checkpoint import CheckpointKeyMismatch, CheckpointMismatch, load_checkpoint
from stream_dp.engine.config import EngineConfig
from stream_dp.engine.master_secret import checkpoint_key, partition_secret
from stream_dp.engine.scaleout import ScaleOut
from stream_dp.online import OnPairStrC
from stream_dp.privacy import accountant_from_dict
from stream_dp.sealing import open_sealed, sealed_context

from .kafka_broker import KafkaBroker
from .test_engine_kafka import (
    ENGINE_EXITS,
    _status,
    _wait_for,
    _write_toml,
    create_topic,
    engine_config,
    names_for,
    read_all,
    valid_record,
)

pytestmark = pytest.mark.kafka

MASTER = "3b0d8c4f1e97a26d5c08fe41b7a9362e9f41c07e2ab85d36e1f4097bc25a8d63"
OTHER_MASTER = "c6a1f0e93d27b84e5f16a0d9c83b72e4a05f9d1b6e38c27af4d0b95e1c63a872"
PARTITIONS = 4
SESSION_MS = 6000


def _config(
    tmp: Path, bootstrap: str, names: dict, instance: str, client: str = "kafka-python"
) -> dict:
    cfg = engine_config(tmp, bootstrap, names, client, seed=None)
    cfg["source"]["max_idle_seconds"] = patience(15.0)
    cfg["checkpoint"].update(every_records=500, every_seconds=2.0)
    cfg["status"]["file"] = str(tmp / f"status-{instance}.json")
    cfg["scale"] = {
        "mode": "per-partition",
        "privacy_unit_key": True,
        "session_timeout_ms": SESSION_MS,
    }
    return cfg


def _start(tmp: Path, cfg: dict, instance: str, master: str = MASTER) -> subprocess.Popen:
    path = tmp / f"engine-{instance}.toml"
    _write_toml(path, cfg)
    return subprocess.Popen(
        [sys.executable, "-m", "stream_dp.cli", "run", "--config", str(path)],
        stdout=(tmp / f"engine-{instance}.log").open("ab"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "STREAM_DP_MASTER_SECRET": master},
    )


def _partition_sizes(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> dict[int, int]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        tps = [TopicPartition(topic, k) for k in range(partitions)]
        return {tp.partition: n for tp, n in consumer.end_offsets(tps).items()}
    finally:
        consumer.close()


def _key(model: str, k: int, master: str = MASTER) -> bytes:
    """The key that seals partition ``k``'s checkpoints."""
    learner = f"{model}/p{k}"
    return checkpoint_key(partition_secret(int(master, 16), learner), learner)


def _load(path: Path, model: str, k: int, master: str = MASTER):
    return load_checkpoint(path, model_id=f"{model}/p{k}", seal_key=_key(model, k, master))


def _ledger(state: Path, model: str, k: int, master: str = MASTER):
    ckpt = _load(state / f"p{k}" / "model.ckpt", model, k, master)
    return ckpt, accountant_from_dict(OnPairStrC.ledger_state(ckpt.learner_state))


def _stop_when_learned(
    bootstrap: str, names: dict, instances: dict[str, tuple[subprocess.Popen, Path, Path]]
) -> None:
    """SIGTERM the instances once, between them, their partitions hold the whole input, and
    check each exits 0; ``instances`` maps a name to its process, status file and log.

    The run ends on an event, not on ``max_idle_seconds`` waited out: those are set to ride
    out a take-over, many seconds of idleness a finished run would wait again. A partition
    counts when an instance that lists it as held reports its step at the partition's end
    offset; SIGTERM commits and publishes what is learned.
    """
    sizes = _partition_sizes(bootstrap, names["input"])
    deadline = time.monotonic() + patience(300)  # the backlog of live input: 5 s at load 7
    steps: dict[int, int] = {}
    while True:
        steps = {}
        for proc, status, log in instances.values():
            assert proc.poll() is None, log.read_text()[-3000:]
            s = _status(status)
            for k in s.get("partitions", []):
                steps[k] = max(steps.get(k, 0), s["by_partition"][str(k)]["step"])
        if all(steps.get(k) == n for k, n in sizes.items()):
            break
        assert time.monotonic() < deadline, (steps, sizes)
        time.sleep(0.1)  # polling interval of a bounded wait
    for proc, _, _ in instances.values():
        proc.send_signal(signal.SIGTERM)
    for proc, _, log in instances.values():
        assert proc.wait(timeout=patience(ENGINE_EXITS)) == 0, log.read_text()[-3000:]


@pytest.mark.scenario
def test_two_instances_one_killed_then_a_third_joins(
    kafka_broker: KafkaBroker, unique_name, tmp_path, kafka_client
):
    bootstrap = kafka_broker.bootstrap
    names = names_for(unique_name)
    create_topic(bootstrap, names["input"], partitions=PARTITIONS)
    # The live input runs until the third instance has learned part of it (however slow the
    # machine), then stops: its size is what was produced.
    n, first, rate = 1_000_000, 8_000, 1000.0
    produced = [0]

    def produce(lo: int, hi: int, stop: threading.Event | None = None) -> None:
        with KafkaSink(names["input"], bootstrap) as sink:
            start = time.monotonic()
            for i in range(lo, hi):
                sink.send(f"record-{i}", json.dumps(valid_record(i)).encode())  # a record id
                produced[0] = i + 1
                ahead = start + (i - lo + 1) / rate - time.monotonic()
                if stop is not None and (stop.is_set() or (ahead > 0 and stop.wait(ahead))):
                    break
            sink.flush()

    cfgs = {i: _config(tmp_path, bootstrap, names, i, kafka_client) for i in "ABC"}
    status = {i: Path(cfgs[i]["status"]["file"]) for i in "ABC"}
    procs: dict[str, subprocess.Popen] = {}
    stop_producing = threading.Event()
    live = threading.Thread(target=produce, args=(first, n, stop_producing), daemon=True)
    try:
        procs["A"] = _start(tmp_path, cfgs["A"], "A")
        procs["B"] = _start(tmp_path, cfgs["B"], "B")
        # Both hold partitions before the first records exist: an instance that joined late
        # would find them all learned by the other (seen on confluent-kafka, B at 860 records/s).
        # Then A has learned some: kill it mid-run.
        holds = lambda s: len(s["partitions"]) >= 1  # noqa: E731
        _wait_for(status["B"], holds, procs["B"], 120)
        _wait_for(status["A"], holds, procs["A"], 120)
        produce(0, first)
        busy = lambda s: len(s["partitions"]) >= 1 and s["records"] > 1500  # noqa: E731
        held_by_a = _wait_for(status["A"], busy, procs["A"], 120)["partitions"]
        os.kill(procs["A"].pid, signal.SIGKILL)
        killed = time.monotonic()
        assert procs["A"].wait(timeout=patience(30)) == -signal.SIGKILL
        _wait_for(status["B"], lambda s: s["partitions"] == list(range(PARTITIONS)), procs["B"],
              timeout=4 * SESSION_MS / 1000 + 30)  # fmt: skip
        takeover = time.monotonic() - killed
        # Live input, and a third instance joins: B hands partitions over in a rebalance.
        live.start()
        procs["C"] = _start(tmp_path, cfgs["C"], "C")
        learning = lambda s: len(s["partitions"]) >= 1 and s["records"] > 0  # noqa: E731
        held_by_c = _wait_for(status["C"], learning, procs["C"], 300)["partitions"]
        assert live.is_alive(), "the third instance joined while the input was live"
        stop_producing.set()
        live.join(timeout=patience(120))
        assert not live.is_alive()
        _stop_when_learned(bootstrap, names, {
            i: (procs[i], status[i], tmp_path / f"engine-{i}.log") for i in "BC"
        })  # fmt: skip
    finally:
        stop_producing.set()
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(timeout=patience(30))
    learned_by_c = json.loads((tmp_path / "engine-C.log").read_text().splitlines()[-1])
    assert learned_by_c["records"] > 0, "the third instance learned part of the live input"
    print(f"\ntake-over after SIGKILL: {takeover:.1f} s (session timeout {SESSION_MS / 1000} s)")
    # The broker declares a SIGKILLed member dead only when its session times out; then the
    # survivor's next heartbeat (every session/4) sees the rebalance, and it starts the four
    # learners side by side (~0.6 s). Measured 7.3 s for a 6 s session timeout.
    assert takeover <= SESSION_MS / 1000 + 6

    # The survivor resumed the killed instance's learners from their checkpoints, and the
    # third instance resumed those it took from the survivor.
    model = names["model"]
    for instance, taken in (("B", held_by_a), ("C", held_by_c)):
        text = (tmp_path / f"engine-{instance}.log").read_text()
        for k in taken:
            assert f"resumed model {model}/p{k}," in text, (instance, k)

    sizes = _privacy_figures(bootstrap, names, PARTITIONS)
    assert sum(sizes.values()) == produced[0] and all(sizes.values())
    state = tmp_path / "state"
    for k in range(PARTITIONS):
        ckpt, _ = _ledger(state, model, k)
        assert ckpt.learner_state["t"] == sizes[k], f"partition {k}: every record learned once"
        assert ckpt.learner_state["secret"] is None, "the secret is never in a checkpoint"

    # Each partition's ledger equals an uninterrupted run's over the same partition.
    ref_names = {**names, "group": unique_name("group"), "model": model + "-ref",
                 "releases": unique_name("releases"), "dead": unique_name("dead")}  # fmt: skip
    ref_cfg = _config(tmp_path / "ref", bootstrap, ref_names, "ref", kafka_client)
    ref_cfg["source"]["max_idle_seconds"] = patience(4.0)
    reference = ScaleOut(EngineConfig.model_validate(ref_cfg), master_secret=int(OTHER_MASTER, 16))
    reference.run()
    for k in range(PARTITIONS):
        _, ledger = _ledger(state, model, k)
        ref_ckpt, ref_ledger = _ledger(tmp_path / "ref" / "state", model + "-ref", k, OTHER_MASTER)
        assert ref_ckpt.learner_state["t"] == sizes[k]
        assert ledger.ledger == ref_ledger.ledger
        assert ledger.rho_spent() == ref_ledger.rho_spent()


def _machine(
    tmp_path: Path, bootstrap: str, names: dict, name: str, client: str = "kafka-python"
) -> tuple[Path, dict]:
    """A second machine: its own, empty state directory; the same group and checkpoint topic."""
    home = tmp_path / name
    home.mkdir()
    cfg = _config(home, bootstrap, names, name, client)
    cfg["source"]["max_idle_seconds"] = patience(4.0)
    cfg["scale"]["checkpoint_topic"] = names["checkpoints"]
    return home, cfg


def _run_to_end(home: Path, cfg: dict, name: str, master: str = MASTER) -> tuple[int, str]:
    proc = _start(home, cfg, name, master)
    try:
        rc = proc.wait(timeout=patience(180))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=patience(30))
    return rc, (home / f"engine-{name}.log").read_text()


@pytest.mark.scenario
def test_an_empty_state_directory_resumes_from_the_checkpoint_topic_and_tampering_is_refused(
    kafka_broker: KafkaBroker, unique_name, tmp_path, kafka_client
):
    from connectors.admin import latest_with_key

    bootstrap = kafka_broker.bootstrap
    names = {**names_for(unique_name), "checkpoints": unique_name("checkpoints")}
    create_topic(bootstrap, names["input"], partitions=2)
    values = [json.dumps(valid_record(i)).encode() for i in range(5000)]

    def produce(lo: int, hi: int) -> None:
        with KafkaSink(names["input"], bootstrap) as sink:
            for i in range(lo, hi):
                sink.send(f"record-{i}", values[i])
            sink.flush()

    produce(0, 3000)
    home, cfg = _machine(tmp_path, bootstrap, names, "m1", kafka_client)
    rc, _ = _run_to_end(home, cfg, "m1")
    assert rc == 0
    before = {k: n for k, n in _partition_sizes(bootstrap, names["input"], 2).items()}

    # Machine 2 has none of machine 1's files: it resumes both learners from the topic.
    produce(3000, 5000)
    home2, cfg2 = _machine(tmp_path, bootstrap, names, "m2", kafka_client)
    rc, text = _run_to_end(home2, cfg2, "m2")
    assert rc == 0, text[-3000:]
    model = names["model"]
    for k in range(2):
        assert f"checkpoint of {model}/p{k} taken from topic" in text
        assert f"resumed model {model}/p{k}, " in text and f"at step {before[k]} " in text
    sizes = _partition_sizes(bootstrap, names["input"], 2)
    committed = [json.loads(v) for v in read_all(bootstrap, names["releases"], committed=True)]
    for k in range(2):
        steps = [m["step"] for m in committed if m["model_id"] == f"{model}/p{k}"]
        assert steps == list(range(1, sizes[k] + 1)), f"partition {k}: each step once"
        ckpt = _load(home2 / "state" / f"p{k}" / "model.ckpt", model, k)
        assert ckpt.learner_state["t"] == sizes[k] and ckpt.learner_state["secret"] is None

    # Put in the topic under p0's key: a checkpoint with a flipped bit; the same flip with the
    # checksum recomputed (a forgery); the genuine checkpoint unsealed, as an older version or
    # anyone who can write to the topic would put it there; p1's checkpoint; then the genuine
    # one, read by an instance started with another master.
    latest = {
        k: latest_with_key(
            bootstrap, names["checkpoints"], f"{model}/p{k}".encode(), client=kafka_client
        )
        for k in range(2)
    }
    flipped = bytearray(latest[0])
    flipped[len(flipped) // 2] ^= 0x01
    forged = bytes(flipped[:-32]) + hashlib.sha256(flipped[:-32]).digest()
    unsealed = open_sealed(_key(model, 0), f"{model}/p0", latest[0])
    cases = [
        (bytes(flipped), "tampered", "corrupted", MASTER),
        (forged, "forged", "does not authenticate", MASTER),
        (unsealed, "unsealed", "is not sealed", MASTER),
        (latest[1], "p1's", "belongs to model", MASTER),
        (latest[0], "another master's", "sealed under another master secret", OTHER_MASTER),
    ]
    for i, (bad, why, reason, master) in enumerate(cases):
        with KafkaSink(names["checkpoints"], bootstrap) as sink:
            sink.send(f"{model}/p0", bad)
            sink.flush()
        home3, cfg3 = _machine(tmp_path, bootstrap, names, f"m3-{i}", kafka_client)
        rc, text = _run_to_end(home3, cfg3, f"m3-{i}", master)
        assert rc == 3, (why, text[-2000:])
        last = text.strip().splitlines()[-1]
        assert "in topic" in last and "is refused" in last and reason in last, (why, last)
        assert not (home3 / "state" / "p0" / "model.ckpt").exists()


CANARY = "canary-5d1e-raw-payload"


@pytest.mark.scenario
def test_the_checkpoint_topic_shows_no_record_no_noise_state_no_model_without_the_master(
    kafka_broker: KafkaBroker, unique_name, tmp_path, kafka_client
):
    """OnPairMF on two partitions with a checkpoint topic. Every message of the topic (aborted
    transactions included) is searched for the float64 bytes of each learner's buffered records,
    un-noised iterate and BLT noise state, and for a rejected record's raw payload: none is
    found, although each is in the checkpoints inside the envelopes (the control). Without the
    master a message does not open; with another master it does not authenticate."""
    bootstrap = kafka_broker.bootstrap
    names = {**names_for(unique_name), "checkpoints": unique_name("checkpoints")}
    create_topic(bootstrap, names["input"], partitions=2)
    values = [json.dumps(valid_record(i)).encode() for i in range(2000)]
    for i in range(5):  # rejected records: dead letters, in the outbox of their cycle
        values.insert(300 * i + 7, json.dumps({"x": {"a": f"{CANARY}-{i}"}, "y": 1}).encode())
    with KafkaSink(names["input"], bootstrap) as sink:
        for i, v in enumerate(values):
            sink.send(f"record-{i}", v)
        sink.flush()
    home, cfg = _machine(tmp_path, bootstrap, names, "m1", kafka_client)
    cfg["model"] = {
        "algorithm": "OnPairMF",
        "task": "auc",
        "epsilon": 2.0,
        "delta": 1e-5,
        "buffer": 32,
        "features": cfg["model"]["features"],
        "model_id": names["model"],
    }
    rc, text = _run_to_end(home, cfg, "m1")
    assert rc == 0, text[-3000:]

    model = names["model"]
    needles: dict[str, list[bytes]] = {}
    for k in range(2):
        c = _load(home / "state" / f"p{k}" / "model.ckpt", model, k)
        state, mech = c.learner_state, c.learner_state["mechanism"]
        assert state["t"] > 500 and np.abs(mech["noise"]["buffers"]).sum() > 0
        for what, arrays in (
            ("buffered records", [state["buffer"]["X"]]),
            ("the un-noised iterate", [state["w"], mech["average"]]),
            ("the noise state", [mech["noise"]["buffers"]]),
        ):
            needles.setdefault(what, []).extend(
                np.float64(v).tobytes() for a in arrays for v in np.ravel(a)
            )
    raw = read_all(bootstrap, names["checkpoints"])  # aborted transactions included
    assert len(raw) >= 4
    inside = b"".join(open_sealed(_key(model, int(sealed_context(m)[-1])), sealed_context(m), m)
                      for m in raw)  # fmt: skip
    needles["a rejected record"] = [CANARY.encode()]
    for what, found in needles.items():
        assert all(n in inside for n in found), f"the control misses {what}"
        assert not [n for m in raw for n in found if n in m], f"the topic shows {what}"

    probe = tmp_path / "probe.ckpt"
    probe.write_bytes(raw[-1])
    k = int(sealed_context(raw[-1])[-1])
    with pytest.raises(CheckpointMismatch, match="is sealed"):
        load_checkpoint(probe)
    with pytest.raises(CheckpointKeyMismatch, match="another master secret"):
        load_checkpoint(probe, seal_key=_key(model, k, OTHER_MASTER))


def _privacy_figures(bootstrap: str, names: dict, partitions: int) -> dict[int, int]:
    """Every step of every partition learner published once, in order; no step with two
    contents (aborted transactions included); the input's size per partition."""
    sizes = _partition_sizes(bootstrap, names["input"], partitions)
    contents: dict[tuple[str, int], set[bytes]] = {}
    for value in read_all(bootstrap, names["releases"]):
        msg = json.loads(value)
        body = {k: v for k, v in msg.items() if k != "time"}
        contents.setdefault((msg["model_id"], msg["step"]), set()).add(
            json.dumps(body, sort_keys=True).encode()
        )
    twice = [key for key, c in contents.items() if len(c) > 1]
    assert not twice, f"{len(twice)} steps published with different contents: {twice[:5]}"
    committed = [json.loads(v) for v in read_all(bootstrap, names["releases"], committed=True)]
    for k in range(partitions):
        steps = [m["step"] for m in committed if m["model_id"] == f"{names['model']}/p{k}"]
        assert steps == list(range(1, sizes[k] + 1)), f"partition {k}: each step once, in order"
    return sizes


def _journaled_ledger(state: Path, model: str, k: int, master: str = MASTER):
    """A partition learner's checkpoint and ledger, its journal found beside it."""
    ckpt = _load(state / f"p{k}" / "model.ckpt", model, k, master)
    acc = OnPairStrC.ledger_state(ckpt.learner_state)
    assert acc["kind"] == "journal:zcdp", "the ledger is journaled"
    path = str(state / f"p{k}" / "model.ckpt.ledger")
    ledger = accountant_from_dict({**acc, "journal": {**acc["journal"], "path": path}})
    ledger.storage.close()
    return ckpt, ledger


@pytest.mark.scenario
def test_with_the_journal_partitions_move_x_to_y_to_x_through_the_checkpoint_topic(
    kafka_broker: KafkaBroker, unique_name, tmp_path, kafka_client
):
    """``checkpoint.ledger_journal = true``, two machines with their own state directories and
    the checkpoint topic. X learns both partitions (past a sealed journal chunk), Y then
    resumes them from the topic alone (the journal travels inside the sealed checkpoint), then
    X again: its local copies are older than the topic's, which replace them. Each step is
    published once with one content, and each partition's ledger equals an uninterrupted
    run's."""
    bootstrap = kafka_broker.bootstrap
    names = {**names_for(unique_name), "checkpoints": unique_name("checkpoints")}
    create_topic(bootstrap, names["input"], partitions=2)
    # > 8192 charges per partition before the first move; then ~1,000 records per partition a
    # turn (checkpoints every 500 records or 2 s): each move carries a learner mid-ledger.
    bounds = [0, 18_000, 20_000, 22_000]
    values = [json.dumps(valid_record(i)).encode() for i in range(bounds[-1])]

    def produce(lo: int, hi: int) -> None:
        with KafkaSink(names["input"], bootstrap) as sink:
            for i in range(lo, hi):
                sink.send(f"record-{i}", values[i])
            sink.flush()

    model = names["model"]
    homes: dict[str, tuple[Path, dict]] = {}
    for name in ("X", "Y"):
        homes[name] = _machine(tmp_path, bootstrap, names, name, kafka_client)
        homes[name][1]["checkpoint"]["ledger_journal"] = True
    for turn, name in enumerate(("X", "Y", "X")):
        produce(bounds[turn], bounds[turn + 1])
        home, cfg = homes[name]
        rc, text = _run_to_end(home, cfg, name)
        assert rc == 0, text[-3000:]
        sizes = _partition_sizes(bootstrap, names["input"], 2)
        for k in range(2):
            ckpt, ledger = _journaled_ledger(home / "state", model, k)
            assert ckpt.learner_state["t"] == sizes[k], (name, turn, k)
            assert len(ledger.storage.journal) >= 1, "sealed chunks are in the journal"
            if turn > 0:
                assert f"checkpoint of {model}/p{k} taken from topic" in text, (name, turn)
        if turn == 2:
            assert text.count("is older than the one in topic") == 2, text[-3000:]

    sizes = _privacy_figures(bootstrap, names, 2)
    ref_names = {**names, "group": unique_name("group"), "model": model + "-ref",
                 "releases": unique_name("releases"), "dead": unique_name("dead")}  # fmt: skip
    ref_cfg = _config(tmp_path / "ref", bootstrap, ref_names, "ref", kafka_client)
    ref_cfg["source"]["max_idle_seconds"] = patience(4.0)
    ref_cfg["checkpoint"]["ledger_journal"] = True
    ScaleOut(EngineConfig.model_validate(ref_cfg), master_secret=int(OTHER_MASTER, 16)).run()
    for k in range(2):
        _, ledger = _journaled_ledger(homes["X"][0] / "state", model, k)
        ref_ckpt, ref = _journaled_ledger(tmp_path / "ref" / "state", model + "-ref", k,
                                          OTHER_MASTER)  # fmt: skip
        assert ref_ckpt.learner_state["t"] == sizes[k]
        assert ledger.ledger == ref.ledger and ledger.rho_spent() == ref.rho_spent()


def _release_times(bootstrap: str, topic: str) -> list[float]:
    """The broker timestamps (s) of the committed releases, in order."""
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=4000,
        isolation_level="read_committed",
        max_partition_fetch_bytes=8 * 1024 * 1024,
    )
    try:
        return sorted(m.timestamp / 1000 for m in consumer)
    finally:
        consumer.close()


def _the_cluster_view_names_the_survivor(
    config: Path, survivor: str, dead: str, capsys: pytest.CaptureFixture
) -> None:
    """``stream-dp status`` after a take-over: the survivor owns every partition with a recent
    heartbeat; the killed instance, whose last heartbeat and status file (on its own machine)
    still claim partitions, is gone and holds nothing."""
    from stream_dp.apps.status import format_view
    from stream_dp.cli import main as cli_main

    started = time.monotonic()
    deadline = started + patience(20.0)
    while True:
        capsys.readouterr()
        assert cli_main(["status", "--config", str(config), "--json"]) == 0
        view = json.loads(capsys.readouterr().out)
        # The survivor's heartbeat may predate its status file's report by one status interval.
        if all(p["step"] is not None for p in view["partitions"]):
            break
        assert time.monotonic() < deadline, view
        time.sleep(0.2)  # polling interval of a bounded wait
    rows = view["partitions"]
    assert [p["owner"] for p in rows] == [survivor] * PARTITIONS, rows
    # Status reports every 0.5 s: the survivor's newest one is seconds old at most.
    assert all(p["heartbeat_age_s"] <= patience(10.0) for p in rows), rows
    assert all(p["epsilon_spent"] is not None for p in rows), rows
    states = {i["instance"]: (i["state"], i["partitions"]) for i in view["instances"]}
    assert states == {survivor: ("member", list(range(PARTITIONS))), dead: ("gone", [])}, states
    gone = next(i for i in view["instances"] if i["instance"] == dead)
    assert gone["heartbeat_age_s"] > rows[0]["heartbeat_age_s"]
    print("\n" + "\n".join(format_view(view)))
    print(f"stream-dp status after the take-over: {time.monotonic() - started:.1f} s")


def _status_fails(config: Path, cfg: dict, why: str, capsys: pytest.CaptureFixture) -> None:
    """``stream-dp status`` exits 4 with one line saying ``why``."""
    from stream_dp.cli import main as cli_main

    _write_toml(config, cfg)
    capsys.readouterr()
    assert cli_main(["status", "--config", str(config)]) == 4
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and why in lines[0] and "does not exist" in lines[0], lines


@pytest.mark.scenario
def test_a_take_over_and_a_rebalance_through_the_checkpoint_topic_are_quick(
    kafka_broker: KafkaBroker, unique_name, tmp_path, kafka_client, capsys
):
    """Journal on, two machines with their own state directories and the checkpoint topic,
    live input. X is SIGKILLed: Y takes its partitions over, fetching their checkpoints from
    the topic, within the session timeout + 5 s; ``stream-dp status`` then names Y as the
    owner of every partition, with a recent heartbeat, and X as gone, holding nothing. X
    restarts on an empty directory: the rebalance that gives it partitions back (Y hands over,
    X fetches from the topic) stalls the release stream at most 10 s. Nothing is published
    twice or with two contents, every record is learned once."""
    bootstrap = kafka_broker.bootstrap
    names = {**names_for(unique_name), "checkpoints": unique_name("checkpoints")}
    create_topic(bootstrap, names["input"], partitions=PARTITIONS)
    n, first, rate = 1_000_000, 4_000, 200.0  # live input until stopped (a slow machine too)
    stop_producing = threading.Event()
    produced = [0]

    def produce(lo: int, hi: int, paced: bool = False) -> None:
        with KafkaSink(names["input"], bootstrap) as sink:
            start = time.monotonic()
            for i in range(lo, hi):
                sink.send(f"record-{i}", json.dumps(valid_record(i)).encode())
                produced[0] = i + 1
                ahead = start + (i - lo + 1) / rate - time.monotonic()
                if paced and ahead > 0 and stop_producing.wait(ahead):
                    break
            sink.flush()

    homes = {}
    for name in ("X", "Y", "X2"):  # X2: machine X again, its state directory lost
        homes[name] = _machine(tmp_path, bootstrap, names, name, kafka_client)
        homes[name][1]["checkpoint"]["ledger_journal"] = True
        homes[name][1]["source"]["max_idle_seconds"] = patience(10.0)
    status = {i: Path(homes[i][1]["status"]["file"]) for i in homes}
    procs: dict[str, subprocess.Popen] = {}
    live = threading.Thread(target=produce, args=(first, n, True), daemon=True)
    # Until an instance has joined, the group does not exist.
    _status_fails(homes["Y"][0] / "engine-Y.toml", homes["Y"][1], "consumer group", capsys)
    try:
        procs["X"] = _start(homes["X"][0], homes["X"][1], "X")
        procs["Y"] = _start(homes["Y"][0], homes["Y"][1], "Y")
        # Both hold partitions before the first records exist. Produced before, they let Y,
        # when it joined first, learn all of partitions 0 and 1 (1,014 and 1,015 records) in
        # the 1.4 s before X's join was served; X took them over with nothing left to read,
        # never learned 1,000, so the live input never started, and X stopped as idle (1 CI run
        # in 7 on confluent-kafka; as in test_two_instances_one_killed_then_a_third_joins).
        holds = lambda s: len(s["partitions"]) >= 1  # noqa: E731
        _wait_for(status["Y"], holds, procs["Y"], 120)
        _wait_for(status["X"], holds, procs["X"], 120)
        produce(0, first)
        busy = lambda s: len(s["partitions"]) >= 1 and s["records"] > 1000  # noqa: E731
        x_status = _wait_for(status["X"], busy, procs["X"], 120)
        held_by_x = x_status["partitions"]
        live.start()
        os.kill(procs["X"].pid, signal.SIGKILL)
        killed = time.monotonic()
        assert procs["X"].wait(timeout=patience(30)) == -signal.SIGKILL
        everything = lambda s: s["partitions"] == list(range(PARTITIONS))  # noqa: E731
        y_status = _wait_for(
            status["Y"], everything, procs["Y"], timeout=4 * SESSION_MS / 1000 + 30
        )
        takeover = time.monotonic() - killed
        _the_cluster_view_names_the_survivor(
            homes["Y"][0] / "engine-Y.toml", y_status["instance"], x_status["instance"], capsys
        )
        joined = time.time()
        procs["X2"] = _start(homes["X2"][0], homes["X2"][1], "X2")
        mine = lambda s: len(s["partitions"]) >= 1 and s["records"] > 0  # noqa: E731
        _wait_for(status["X2"], mine, procs["X2"], 120)
        # Live input goes on past the rebalance, so a stall would show in the releases.
        assert not stop_producing.wait(10.0) and live.is_alive(), "the live input ended early"
        stop_producing.set()
        live.join(timeout=patience(60))
        rebalanced_until = time.time()
        times = [t for t in _release_times(bootstrap, names["releases"])
                 if joined <= t <= rebalanced_until]  # fmt: skip
        _stop_when_learned(bootstrap, names, {
            i: (procs[i], status[i], homes[i][0] / f"engine-{i}.log") for i in ("Y", "X2")
        })  # fmt: skip
    finally:
        stop_producing.set()
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(timeout=patience(30))

    model = names["model"]
    text_y = (homes["Y"][0] / "engine-Y.log").read_text()
    for k in held_by_x:
        assert f"checkpoint of {model}/p{k} taken from topic" in text_y, k
    stall = max(b - a for a, b in zip([joined, *times], [*times, rebalanced_until], strict=True))
    print(f"\ntake-over after SIGKILL, checkpoints from the topic: {takeover:.1f} s "
          f"(session timeout {SESSION_MS / 1000} s); longest gap in the release stream from "
          f"X's restart to the end of the live input: {stall:.1f} s")  # fmt: skip
    # The targets are session timeout + 5 s and 10 s (measured 8.1-8.8 s and 3.4-5.8 s at load
    # 20 on 2 cores, printed above); the bounds are 3x them so a busy machine passes, while the
    # whole-tail read of the checkpoint topic they guard against (~40 s each) still fails.
    assert takeover <= 3 * (SESSION_MS / 1000 + 5)
    assert stall <= 3 * 10.0

    sizes = _privacy_figures(bootstrap, names, PARTITIONS)
    assert sum(sizes.values()) == produced[0]
    for k in range(PARTITIONS):
        owner = "X2" if (homes["X2"][0] / "state" / f"p{k}" / "model.ckpt").exists() else "Y"
        ckpts = [
            _load(homes[h][0] / "state" / f"p{k}" / "model.ckpt", model, k)
            for h in ("Y", "X2")
            if (homes[h][0] / "state" / f"p{k}" / "model.ckpt").exists()
        ]
        assert max(c.learner_state["t"] for c in ckpts) == sizes[k], (k, owner)


def test_a_rebalance_hands_every_partition_over_without_waiting_on_the_broker(
    kafka_broker: KafkaBroker, unique_name, tmp_path, kafka_client
):
    """A holds the four partitions; B joins, and A hands them over in the rebalance callback.

    Inside that callback the consumer cannot answer a request (librdkafka holds it until the
    callback returns), so a hand-over that asked for the partition's lag waited out that
    request's bound: 7 s a partition on confluent-kafka, and the newcomer waited for all of
    them. Each hand-over is its checkpoint and its status, a few milliseconds apart."""
    bootstrap = kafka_broker.bootstrap
    names = names_for(unique_name)
    create_topic(bootstrap, names["input"], partitions=PARTITIONS)
    cfgs = {i: _config(tmp_path, bootstrap, names, i, kafka_client) for i in "AB"}
    status = {i: Path(cfgs[i]["status"]["file"]) for i in "AB"}
    procs: dict[str, subprocess.Popen] = {}
    try:
        procs["A"] = _start(tmp_path, cfgs["A"], "A")
        everything = lambda s: s["partitions"] == list(range(PARTITIONS))  # noqa: E731
        _wait_for(status["A"], everything, procs["A"], 120)
        procs["B"] = _start(tmp_path, cfgs["B"], "B")
        _wait_for(status["B"], lambda s: len(s["partitions"]) >= 1, procs["B"], 120)
    finally:
        for p in procs.values():
            p.kill()
            p.wait(timeout=patience(30))
    stamps = [
        time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S")) + int(line[20:23]) / 1000
        for line in (tmp_path / "engine-A.log").read_text().splitlines()
        if ": handed over at step " in line
    ]
    assert len(stamps) >= 2, "A handed partitions over"
    # Measured 0.01 s for the four on either client; the bound is far above a busy machine's
    # and far below one request's wait (2 s, or 7 s on confluent-kafka).
    assert stamps[-1] - stamps[0] < 2.0, stamps


def test_a_missing_input_topic_is_rc_4_in_one_line_and_never_created(
    kafka_broker: KafkaBroker, unique_name, tmp_path, kafka_client, capsys
):
    """The single engine's start-up checks: subscribing to a missing topic would have the
    broker create it, and the instance would idle out having learned nothing. ``stream-dp
    status`` says the same in one line."""
    bootstrap = kafka_broker.bootstrap
    names = names_for(unique_name)
    cfg = _config(tmp_path, bootstrap, names, "A", kafka_client)
    proc = _start(tmp_path, cfg, "A")
    assert proc.wait(timeout=patience(120)) == 4
    lines = (tmp_path / "engine-A.log").read_text().strip().splitlines()
    assert len(lines) == 1 and f"input topic {names['input']!r} does not exist" in lines[0], lines
    _status_fails(tmp_path / "engine-A.toml", cfg, f"input topic {names['input']!r}", capsys)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        assert names["input"] not in consumer.topics(), "the input topic was auto-created"
    finally:
        consumer.close()

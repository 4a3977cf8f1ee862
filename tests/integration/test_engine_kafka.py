"""The engine end to end against a real Apache Kafka broker (started by the tests).

What must hold: one release per learning step, each carrying its ledger; a consumer can
rebuild the model from any single message; SIGKILL at random points -- on one partition or on
three, with live input -- loses nothing, learns nothing twice and never publishes two different
releases of one step; malformed input is dead-lettered with its reason while every valid record
is learned; a broker outage is waited out (or ends in a clean stop at a configured deadline); a
second instance of a model never learns beside the first; a lost state directory is refused;
misconfiguration ends in a one-line diagnosis within 60 s.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from conftest import patience
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

from connectors import KafkaSink, ReleaseMessage
from stream_dp.checkpoint import load_checkpoint
from stream_dp.engine import Engine
from stream_dp.engine.config import EngineConfig
from stream_dp.engine.learners import learner_class
from stream_dp.online import OnPairStrC
from stream_dp.privacy import accountant_from_dict

from .kafka_broker import KafkaBroker

pytestmark = pytest.mark.kafka

# Wall-clock bounds (seconds, stretched by patience()), each >= 5 × the longest duration of what
# it bounds, measured on a 2-core VM at load 3.5-7 (more than its quiet duration):
ENGINE_EXITS = 30  # an engine process is reaped after SIGKILL (0.2 s) or stops on SIGTERM (5 s)
ENGINE_CATCHES_UP = 120  # an engine starts and reaches a step ≤ 2,000 records on (17 s)
ENGINE_FINISHES = 300  # an engine learns ≤ 18,000 records and ends on idleness (34 s)
# source.max_idle_seconds of a run that ends when its input is exhausted: the longest wait for
# a record while records remain is the first fetch (0.8 s).
IDLE_END = 5.0

FEATURES = ["a", "b", "c", "d"]


def valid_record(i: int) -> dict:
    rng = np.random.default_rng(i)
    x = rng.normal(size=4)
    y = int(x[0] + 0.5 * x[1] + 0.3 * rng.normal() > 0)
    return {"x": dict(zip(FEATURES, x.round(6).tolist(), strict=True)), "y": y}


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics({topic: {"num_partitions": partitions}}, wait_for_metadata=True)
    finally:
        admin.close()


def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    with KafkaSink(topic, bootstrap) as sink:
        for v in values:
            sink.send(None, v)
        sink.flush()


def read_all(bootstrap: str, topic: str, committed: bool = False) -> list[bytes]:
    """Every message of ``topic``, read to the end offsets it has now (read_committed: its last
    stable offsets); with ``committed=False`` also those of aborted transactions.

    Reading to the end offsets, not until the consumer has seen nothing for a while, keeps a
    slow fetch on a busy machine from ending the read early. The deadline bounds a hang only
    (the largest topic here, 20,000 releases, is read twice by a test that took 30 s in all at
    load 4, the engine's run included).
    """
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        isolation_level="read_committed" if committed else "read_uncommitted",
        max_partition_fetch_bytes=8 * 1024 * 1024,
    )
    deadline = time.monotonic() + patience(120)
    try:
        parts = consumer.partitions_for_topic(topic)
        while not parts:
            assert time.monotonic() < deadline, f"topic {topic} has no partitions"
            time.sleep(0.1)  # polling interval of a bounded wait (metadata)
            parts = consumer.partitions_for_topic(topic)
        tps = [TopicPartition(topic, k) for k in sorted(parts)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        end = consumer.end_offsets(tps)
        values: list[bytes] = []
        while any(consumer.position(tp) < end[tp] for tp in tps):
            assert time.monotonic() < deadline, f"{topic}: not read to {end} in time"
            for records in consumer.poll(timeout_ms=500).values():
                values += [r.value for r in records]
        return values
    finally:
        consumer.close()


def engine_config(
    tmp: Path, bootstrap: str, names: dict, client: str = "kafka-python", **model
) -> dict:
    """The engine's config for a test's names, talking to Kafka with ``client``."""
    return {
        "model": {
            "algorithm": "OnPairStrC",
            "task": "auc",
            "epsilon": 2.0,
            "delta": 1e-5,
            "alpha": 1.0,
            "buffer": 32,
            "release_every": 1,  # a release at every step: every step's copies are compared
            "smoothing_window": 1,
            "predict_with": "release",
            "features": FEATURES,
            "model_id": names["model"],
            **model,
        },
        "source": {
            "kind": "kafka",
            "topic": names["input"],
            "bootstrap_servers": bootstrap,
            "group_id": names["group"],
            "max_idle_seconds": patience(IDLE_END),
        },
        "releases": {"kind": "kafka", "topic": names["releases"], "bootstrap_servers": bootstrap},
        "dead_letters": {"kind": "kafka", "topic": names["dead"], "bootstrap_servers": bootstrap},
        "checkpoint": {"path": str(tmp / "state" / "model.ckpt"), "every_records": 500},
        "status": {"interval_seconds": 0.5, "file": str(tmp / "status.json")},
        "kafka": {"client": client},
    }


def names_for(unique_name) -> dict:
    return {k: unique_name(k) for k in ("input", "releases", "dead", "group", "model")}


def with_input(bootstrap: str, unique_name, n: int) -> dict:
    """Names for a test's topics, group and model, with ``n`` valid records on its input."""
    names = names_for(unique_name)
    produce(bootstrap, names["input"], [json.dumps(valid_record(i)).encode() for i in range(n)])
    return names


def parse_releases(raw: list[bytes]) -> list[ReleaseMessage]:
    return [ReleaseMessage.from_json(v) for v in raw]


def check_release_stream(releases: list[ReleaseMessage], n_steps: int, epsilon: float) -> None:
    """Every step 1..n released, duplicates identical, ledger continuous and within budget."""
    by_step: dict[int, ReleaseMessage] = {}
    for r in releases:
        prev = by_step.get(r.step)
        if prev is not None:
            # A re-publication must be the very same release.
            assert prev == r, f"two different releases of step {r.step}"
        by_step[r.step] = r
    assert sorted(by_step) == list(range(1, n_steps + 1)), "releases must have no gaps"
    rho = [by_step[t].rho_spent for t in range(1, n_steps + 1)]
    eps = [by_step[t].epsilon_spent for t in range(1, n_steps + 1)]
    assert all(b >= a for a, b in zip(rho, rho[1:], strict=False)), "ρ spent must be monotone"
    assert all(b >= a for a, b in zip(eps, eps[1:], strict=False)), "ε spent must be monotone"
    assert max(eps) <= epsilon
    assert all(r.rho_spent <= r.rho_budget for r in by_step.values())


def copies_by_step(raw: list[bytes]) -> dict[int, set[bytes]]:
    """The distinct message bytes published for each step."""
    out: dict[int, set[bytes]] = {}
    for value in raw:
        out.setdefault(json.loads(value)["step"], set()).add(value)
    return out


def test_20k_records_one_release_per_step(
    kafka_broker: KafkaBroker, unique_name, tmp_path, kafka_client
):
    bootstrap = kafka_broker.bootstrap
    n = 20_000
    names = with_input(bootstrap, unique_name, n)
    cfg = EngineConfig.model_validate(engine_config(tmp_path, bootstrap, names, kafka_client))
    engine = Engine(cfg)
    stats = engine.run()
    assert stats.learned == n and engine.learner.step == n and stats.dead_letters == 0
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["step"] == n and status["consumer_lag"] == 0
    assert status["epsilon_spent"] <= status["epsilon_budget"]
    assert status["pending_messages"] == 0 and status["broker_unreachable_since"] is None

    raw = read_all(bootstrap, names["releases"])
    releases = parse_releases(raw)
    assert len(releases) == n, "exactly one release per learning step (no crash, no replay)"
    check_release_stream(releases, n, epsilon=2.0)
    for r in releases:
        assert r.model_id == names["model"] and r.delta == 1e-5 and r.rho_budget > 0
        assert r.run_id == engine.run_id and r.private is True

    # Any single message is enough to rebuild the model: score records with it alone.
    rng = np.random.default_rng(0)
    probe = [valid_record(n + i)["x"] for i in range(20)]
    for idx in rng.choice(n, size=25, replace=False):
        msg = ReleaseMessage.from_json(raw[idx])
        w = msg.weights_array()
        assert w.shape == tuple(msg.shape) == (4,)
        scores = [sum(w[msg.feature_names.index(k)] * v for k, v in x.items()) for x in probe]
        assert all(math.isfinite(s) for s in scores)
    last = releases[-1]
    assert np.array_equal(last.weights_array(), engine.learner.private_weights)
    # ...and the rebuilt model predicts exactly as the engine's learner does.
    for x in probe:
        v = np.array([x[f] for f in last.feature_names])
        v = v * min(1.0, 1.0 / np.linalg.norm(v))  # the learner clips to R = 1 before scoring
        assert math.isclose(float(last.weights_array() @ v), engine.learner.score_one(x))


def _write_toml(path: Path, cfg: dict) -> None:
    def val(v):
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, list):
            return "[" + ", ".join(val(a) for a in v) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k} = {val(a)}" for k, a in v.items()) + "}"
        return repr(v)

    lines = []
    for section, body in cfg.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {val(v)}" for k, v in body.items() if v is not None]
        lines.append("")
    path.write_text("\n".join(lines))


def _start_engine(config_path: Path, log: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "stream_dp.cli", "run", "--config", str(config_path), *extra],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _status(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return {}


def _wait_for(
    status: Path, ok: Callable[[dict], bool], proc: subprocess.Popen, timeout: float
) -> dict:
    """Poll the engine's status file until ``ok(status)``, for at most ``patience(timeout)``."""
    limit = patience(timeout)
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"engine exited early with {proc.returncode}")
        s = _status(status)
        if s and ok(s):
            return s
        time.sleep(0.05)  # polling interval of a bounded wait, not a timing assumption
    raise AssertionError(f"engine status did not reach the condition within {limit:.0f} s")


def _wait_for_step(status: Path, above: int, proc: subprocess.Popen, timeout: float) -> int:
    return _wait_for(status, lambda s: s.get("step", -1) > above, proc, timeout)["step"]


def _ledger(cfg: dict, journal: bool = False):
    ckpt = load_checkpoint(cfg["checkpoint"]["path"], model_id=cfg["model"]["model_id"])
    learner = learner_class(cfg["model"].get("algorithm", "OnPairStrC"))
    acc_state = learner.ledger_state(ckpt.learner_state)
    if journal:  # the checkpoint names its journal relative to itself
        path = cfg["checkpoint"]["path"] + ".ledger"
        acc_state = {**acc_state, "journal": {**acc_state["journal"], "path": path}}
    return ckpt, accountant_from_dict(acc_state)


def _cli(config_path: Path, *extra: str, timeout: float = 90) -> tuple[int, str, float]:
    """``stream-dp run`` to its end, for at most ``patience(timeout)``: rc, stderr, seconds."""
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "stream_dp.cli", "run", "--config", str(config_path), *extra],
        capture_output=True,
        text=True,
        timeout=patience(timeout),
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    return proc.returncode, proc.stderr, time.monotonic() - start


def _last_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("stream-dp run:")]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


@pytest.mark.scenario
@pytest.mark.parametrize(
    ("journal", "algorithm", "kafka_client"),
    # Both learners on both clients; where the ledger lives is the engine's affair, not the
    # client's: each client runs one of the two (CI time).
    [
        (False, "OnPairStrC", "kafka-python"),
        (True, "OnPairStrC", "confluent-kafka"),
        (False, "OnPairMF", "kafka-python"),
        (False, "OnPairMF", "confluent-kafka"),
    ],
    ids=[
        "ledger-in-checkpoint-kafka-python",
        "ledger-journal-confluent-kafka",
        "onpairmf-kafka-python",
        "onpairmf-confluent-kafka",
    ],
    indirect=["kafka_client"],
)
def test_sigkill_three_times_loses_nothing(
    kafka_broker: KafkaBroker, unique_name, tmp_path, journal: bool, algorithm: str, kafka_client
):
    """Three SIGKILLs at random points: every record learned once, every release charged once.

    With ``checkpoint.ledger_journal`` the stream is long enough (> 2 chunks of 8192 charges)
    for sealed chunks to sit in the journal when the engine is killed. OnPairMF's correlated
    noise is a recurrence whose state lives in the checkpoint: replays are bit-identical too.
    """
    bootstrap = kafka_broker.bootstrap
    # The kills (seeded) land at about steps 1,350, 2,000 and 3,500, each mid-stream: the
    # records after the last one need not outnumber those before it.
    n = 18_000 if journal else 5_000
    names = with_input(bootstrap, unique_name, n)
    cfg = engine_config(tmp_path, bootstrap, names, kafka_client, seed=None)
    if algorithm == "OnPairMF":
        model = cfg["model"]
        cfg["model"] = {
            "algorithm": "OnPairMF", "epsilon": 2.0, "horizon": n,
            "features": model["features"], "model_id": model["model_id"],
        }  # fmt: skip
    cfg["checkpoint"]["every_records"] = 300
    cfg["checkpoint"]["ledger_journal"] = journal
    config_path = tmp_path / "engine.toml"
    _write_toml(config_path, cfg)
    log = tmp_path / "engine.log"
    status = tmp_path / "status.json"
    rng = np.random.default_rng(12345)
    progress = 0
    for kill in range(3):
        proc = _start_engine(config_path, log)
        # Kill somewhere in the next stretch of records, at a random point.
        target = progress + int(rng.integers(300, 1800))
        progress = _wait_for_step(status, min(target, n - 500), proc, ENGINE_CATCHES_UP)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=patience(ENGINE_EXITS))
        assert proc.returncode == -signal.SIGKILL, f"kill {kill} did not hit a running engine"
    proc = _start_engine(config_path, log)
    assert proc.wait(timeout=patience(ENGINE_FINISHES)) == 0, log.read_text()[-3000:]

    ckpt, ledger = _ledger(cfg, journal)
    assert ckpt.learner_state["t"] == n, "learning steps must equal valid records"
    raw = read_all(bootstrap, names["releases"])
    releases = parse_releases(raw)
    assert len(releases) >= n
    check_release_stream(releases, n, epsilon=2.0)
    assert all(len(c) == 1 for c in copies_by_step(raw).values()), "copies are byte-identical"
    committed = parse_releases(read_all(bootstrap, names["releases"], committed=True))
    assert sorted(r.step for r in committed) == list(range(1, n + 1)), "read_committed: once"
    # The ledger in the checkpoint is the one the releases advertise.
    final = max(releases, key=lambda r: r.step)
    if journal:
        assert OnPairStrC.ledger_state(ckpt.learner_state)["kind"] == "journal:zcdp"
    events = ledger.ledger
    assert math.fsum(ledger.cost(e) for e in events) == ledger.rho_spent() == final.rho_spent
    assert len({e.step for e in events}) == len(events), "a step was charged twice"
    if algorithm == "OnPairMF":
        assert len(events) == 1 and events[0].mechanism == "gaussian-correlated"
    assert ledger.verify()
    if journal:
        assert ledger.storage.journal is not None and ledger.storage.journal.file_nbytes() > 0
        ledger.storage.close()


@pytest.mark.scenario
def test_three_partitions_live_input_sigkill_five_times(
    kafka_broker: KafkaBroker, unique_name, tmp_path, kafka_client
):
    """The scenario that published 5,557 steps twice with different weights.

    Live input at ~60 records/s on a 3-partition topic, for as long as the kills take; the
    engine is SIGKILLed five times shortly after it has caught up, and restarted. Every copy of
    every step on the release topic -- aborted transactions included -- is byte-identical, a
    read_committed consumer sees each step exactly once, and the ledger equals an uninterrupted
    run's.
    """
    bootstrap = kafka_broker.bootstrap
    names = names_for(unique_name)
    create_topic(bootstrap, names["input"], partitions=3)
    # Slow enough that an engine on a loaded machine (a tenth of a core) still catches up.
    rate = 60.0
    stop_producing = threading.Event()
    produced: list[int] = [0]

    def live() -> None:
        # Until the fifth kill, however long the kills take (a fixed amount of input would end
        # before them on a busy machine: the restarts would find the engine idle, its
        # checkpoint current, and kill nothing in flight).
        with KafkaSink(names["input"], bootstrap) as sink:
            start = time.monotonic()
            for i in range(100_000):
                # Keyed by a user id: the three partitions interleave as in production.
                sink.send(f"user{i % 97}", json.dumps(valid_record(i)).encode())
                produced[0] = i + 1
                ahead = start + (i + 1) / rate - time.monotonic()
                if stop_producing.wait(max(ahead, 0)):
                    break
            sink.flush()

    producer = threading.Thread(target=live, daemon=True)
    cfg = engine_config(tmp_path, bootstrap, names, kafka_client, seed=None)
    cfg["source"]["max_idle_seconds"] = patience(IDLE_END)
    cfg["checkpoint"].update(every_records=400, every_seconds=3.0)
    config_path = tmp_path / "engine.toml"
    _write_toml(config_path, cfg)
    log, status = tmp_path / "engine.log", tmp_path / "status.json"
    rng = np.random.default_rng(2024)
    producer.start()
    kills, step, killed_at = 0, 0, []
    try:
        while kills < 5:
            status.unlink(missing_ok=True)  # what the wait reads must come from this process
            proc = _start_engine(config_path, log)
            # Caught up (within about a second of input) at a step past the previous kill's.
            s = _wait_for(
                status,
                lambda s, step=step: (
                    s.get("consumer_lag") is not None
                    and s["consumer_lag"] <= rate
                    and s.get("step", 0) > step + 50
                ),  # fmt: skip
                proc,
                ENGINE_CATCHES_UP,
            )
            step = s["step"]
            time.sleep(float(rng.uniform(0.2, 1.5)))  # "shortly after": a random moment
            killed_at.append(_status(status)["step"])  # learned by then (at least)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=patience(ENGINE_EXITS))
            assert proc.returncode == -signal.SIGKILL
            kills += 1
    finally:
        stop_producing.set()
        producer.join(timeout=patience(60))  # it flushes its last records
    assert not producer.is_alive()
    n = produced[0]
    proc = _start_engine(config_path, log)
    assert proc.wait(timeout=patience(ENGINE_FINISHES)) == 0, log.read_text()[-3000:]
    assert kills == 5

    ckpt, ledger = _ledger(cfg)
    assert ckpt.learner_state["t"] == n, "every record learned exactly once"
    everything = read_all(bootstrap, names["releases"])  # aborted transactions included
    copies = copies_by_step(everything)
    assert sorted(copies) == list(range(1, n + 1))
    repeated = {t: c for t, c in copies.items() if len(c) > 1}
    assert not repeated, f"{len(repeated)} steps were published with different contents"
    n_copies = len(everything)
    committed = parse_releases(read_all(bootstrap, names["releases"], committed=True))
    assert [r.step for r in committed] == list(range(1, n + 1)), "read_committed: each once"
    check_release_stream(committed, n, epsilon=2.0)
    # Each restart resumed from a checkpoint before the step it was killed at: the records in
    # between were learned again, in the interleaving of that restart's fetches.
    resumed = [int(line.rsplit("at step ", 1)[1].split(" ")[0])
               for line in log.read_text().splitlines() if "resumed model" in line]  # fmt: skip
    relearned = [k - r for k, r in zip(killed_at, resumed, strict=False)]
    assert len(resumed) == kills and sum(relearned) > 0, (killed_at, resumed)
    print(
        f"\n{kills} SIGKILLs at steps {killed_at}, resumed at {resumed}: {sum(relearned)} "
        f"records learned again; {n_copies} release messages for {n} steps on the topic "
        f"(aborted transactions included): {n_copies - n} extra copies, all byte-identical"
    )

    # The ledger equals an uninterrupted run's over the same records (in whatever order).
    ref_names = {**names, "group": unique_name("group"), "model": names["model"] + "-ref",
                 "releases": unique_name("releases"), "dead": unique_name("dead")}  # fmt: skip
    ref_cfg = engine_config(tmp_path / "ref", bootstrap, ref_names, kafka_client, seed=None)
    ref_cfg["source"]["max_idle_seconds"] = patience(IDLE_END)
    reference = Engine(EngineConfig.model_validate(ref_cfg))
    reference.run()
    assert reference.learner.step == n
    assert ledger.ledger == reference.learner.accountant.ledger
    assert ledger.rho_spent() == reference.learner.accountant.rho_spent()


BAD_KINDS = [
    "invalid_json",
    "missing_label",
    "nan",
    "infinite",
    "wrong_dimension",
    "no_known_features",
    "oversize",
    "wrong_type",
]


def bad_record(i: int) -> bytes:
    kind = BAD_KINDS[i % len(BAD_KINDS)]
    x = valid_record(i)["x"]
    if kind == "invalid_json":
        return b'{"x": {"a": 1.0,'
    if kind == "missing_label":
        return json.dumps({"x": x}).encode()
    if kind == "nan":
        return json.dumps({"x": {**x, "a": float("nan")}, "y": 1}).encode()
    if kind == "infinite":
        return json.dumps({"x": {**x, "b": float("inf")}, "y": 0}).encode()
    if kind == "wrong_dimension":
        return json.dumps({"x": [0.1, 0.2, 0.3], "y": 1}).encode()
    if kind == "no_known_features":
        return json.dumps({"x": {"zzz": 1.0}, "y": 1}).encode()
    if kind == "oversize":
        return json.dumps({"x": x, "y": 1, "pad": "p" * 1_000_100}).encode()
    return json.dumps({"x": {**x, "c": "seven"}, "y": 1}).encode()


def test_malformed_messages_dead_lettered(
    kafka_broker: KafkaBroker, unique_name, tmp_path, kafka_client
):
    bootstrap = kafka_broker.bootstrap
    names = names_for(unique_name)
    n_valid, n_bad = 3000, 1000
    values = []
    rng = np.random.default_rng(7)
    bad_at = set(rng.choice(n_valid + n_bad, size=n_bad, replace=False).tolist())
    vi = bi = 0
    for pos in range(n_valid + n_bad):
        if pos in bad_at:
            values.append(bad_record(bi))
            bi += 1
        else:
            record = valid_record(vi)
            if vi % 10 == 0:  # unknown features are ignored and counted, not dead-lettered
                record["x"]["extra"] = 1.0
            values.append(json.dumps(record).encode())
            vi += 1
    produce(bootstrap, names["input"], values)
    cfg = EngineConfig.model_validate(engine_config(tmp_path, bootstrap, names, kafka_client))
    engine = Engine(cfg)
    stats = engine.run()
    assert engine.learner.step == n_valid and stats.learned == n_valid
    assert stats.dead_letters == n_bad
    assert stats.records_with_unknown_features == n_valid // 10

    dead = [json.loads(v) for v in read_all(bootstrap, names["dead"])]
    assert len(dead) == n_bad
    assert all(d["reason"] and d["message"] for d in dead)
    got = sorted(d["reason"] for d in dead)
    # Each kind of damage maps to one stable reason code.
    assert len(set(got)) >= 7, f"reasons should tell the kinds of damage apart: {set(got)}"
    assert all(d["source_position"] is not None for d in dead)
    releases = parse_releases(read_all(bootstrap, names["releases"]))
    check_release_stream(releases, n_valid, epsilon=2.0)


class _Died(Exception):
    """Stands for the process dying at this point."""


def test_a_kill_inside_a_transaction_leaves_only_identical_copies(
    kafka_broker: KafkaBroker, unique_name, tmp_path, kafka_client
):
    """The engine dies after sending a cycle's releases into its transaction, before the commit.

    Those messages sit on the topic in a transaction nobody will commit; the restart (whose
    producer aborts it) publishes the checkpointed outbox again. A read_uncommitted consumer
    sees both copies of each of those steps -- byte for byte the same -- and a read_committed
    one sees each step once.
    """
    bootstrap = kafka_broker.bootstrap
    n = 900
    names = with_input(bootstrap, unique_name, n)
    d = engine_config(tmp_path, bootstrap, names, kafka_client)
    d["checkpoint"]["every_records"] = 300
    d["source"]["max_idle_seconds"] = patience(IDLE_END)
    cfg = EngineConfig.model_validate(d)
    engine = Engine(cfg)
    opened = engine._open
    sent: list[int] = []

    def _open() -> None:
        opened()
        publisher = engine.outputs.publisher
        publish = publisher.publish

        def dying(messages, offsets=None, group_id=None, **kw):
            if engine.seq != 2:
                return publish(messages, offsets, group_id, **kw)
            publisher.start()
            producer = publisher._producer
            producer.begin_transaction()
            for topic, key, value in messages:
                producer.send(topic, value=value, key=key)
            producer.flush()
            sent.append(len(messages))
            publisher._producer = None  # a dead process closes nothing
            raise _Died()

        publisher.publish = dying

    engine._open = _open  # type: ignore[method-assign]
    with pytest.raises(_Died):
        engine.run()
    assert sent == [300]
    again = Engine(cfg)
    again.run()
    assert again.learner.step == n
    everything = read_all(bootstrap, names["releases"])
    copies = copies_by_step(everything)
    assert all(len(c) == 1 for c in copies.values()), "every copy of a step is identical"
    assert len(everything) == n + 300, "the aborted copies of cycle 2 are on the topic"
    committed = parse_releases(read_all(bootstrap, names["releases"], committed=True))
    assert [r.step for r in committed] == list(range(1, n + 1))


def test_poison_records_and_a_240_feature_metric_model(
    kafka_broker: KafkaBroker, unique_name, tmp_path, kafka_client
):
    """First records that crash-looped the engine, and releases of 57,600 weights."""
    bootstrap = kafka_broker.bootstrap
    names = names_for(unique_name)
    d = 240
    feats = [f"f{i}" for i in range(d)]
    rng = np.random.default_rng(3)
    values = [
        b'{"x": {"\\ud800": 1.0}, "y": 1}',  # a lone surrogate, no declared feature
        b'{"x": {"f0": 0.5, "\\ud800": 1.0}, "y": 2}',  # a lone surrogate beside a known one
        json.dumps({"x": {f"g{i}": 0.1 for i in range(40_000)}, "y": 1}).encode(),
        json.dumps({"x": {f"f{i}": 0.01 for i in range(40_000)}, "y": 2}).encode(),
    ]
    for i in range(80):
        x = rng.normal(size=d) / np.sqrt(d)
        values.append(json.dumps({"x": dict(zip(feats, x.tolist(), strict=True)),
                                  "y": int(i % 3)}).encode())  # fmt: skip
    produce(bootstrap, names["input"], values)
    cfg = engine_config(tmp_path, bootstrap, names, kafka_client, task="metric", features=feats,
                        release_every=20)  # fmt: skip
    cfg["checkpoint"]["every_records"] = 30
    config_path = tmp_path / "engine.toml"
    _write_toml(config_path, cfg)
    out = subprocess.run(
        [sys.executable, "-m", "stream_dp.cli", "run", "--config", str(config_path), "--dry-run"],
        capture_output=True, text=True, timeout=patience(60),  # 8 s at load 6
    )  # fmt: skip
    assert out.returncode == 0 and "release message: at most 616," in out.stdout
    rc, err, _ = _cli(config_path, timeout=300)
    assert rc == 0, err[-3000:]
    status = _status(tmp_path / "status.json")
    assert status["learned"] == 82 and status["dead_letters"] == 2
    assert status["dead_letter_reasons"] == {"no_known_features": 2}
    assert status["unknown_features"] == 1 + (40_000 - d)
    releases = parse_releases(read_all(bootstrap, names["releases"], committed=True))
    steps = [r.step for r in releases]
    assert len(steps) == status["releases"] >= 3 and steps == sorted(set(steps))
    sizes = [len(r.to_json()) for r in releases]
    assert all(600_000 < s < 620_000 for s in sizes), sizes
    w = releases[-1].weights_array()
    assert w.shape == (d, d) and np.allclose(w, w.T)


def test_misconfiguration_is_diagnosed_within_60_seconds(
    kafka_broker: KafkaBroker, unique_name, tmp_path, kafka_client
):
    bootstrap = kafka_broker.bootstrap
    names = names_for(unique_name)
    create_topic(bootstrap, names["input"], partitions=2)
    base = engine_config(tmp_path, bootstrap, names, kafka_client)
    base["kafka"]["startup_timeout_seconds"] = 15.0
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{s.getsockname()[1]}"
    cases = {
        "unreachable": ({"bootstrap_servers": closed}, "cannot reach Kafka at"),
        "missing topic": ({"topic": unique_name("nope")}, "does not exist"),
        "missing partition": ({"partitions": [0, 5]}, "source.partitions names [5]"),
        "ssl on plaintext": (
            {"security": {"security_protocol": "SSL"}},
            "security_protocol=SSL",
        ),
    }
    for case, (source, expect) in cases.items():
        cfg = json.loads(json.dumps(base))
        cfg["source"].update(source)
        path = tmp_path / f"{case.replace(' ', '-')}.toml"
        _write_toml(path, cfg)
        rc, err, took = _cli(path)
        line = _last_line(err)
        assert rc == 4 and expect in line, (case, err[-2000:])
        assert took < patience(60), (case, took)  # the promise (≤ 23 s at load 5.6)
        assert "Traceback" not in err
    assert not (tmp_path / "state" / "model.ckpt").exists(), "nothing was started"


def test_records_skipped_by_an_offset_reset_are_reported_with_their_count(
    kafka_broker: KafkaBroker, unique_name, tmp_path, caplog, kafka_client
):
    bootstrap = kafka_broker.bootstrap
    names = names_for(unique_name)
    create_topic(bootstrap, names["input"], partitions=1)
    produce(bootstrap, names["input"], [json.dumps(valid_record(i)).encode() for i in range(100)])
    d = engine_config(tmp_path, bootstrap, names, kafka_client)
    d["source"]["max_idle_seconds"] = patience(IDLE_END)
    cfg = EngineConfig.model_validate(d)
    Engine(cfg, max_records=30).run()
    # Retention (here: deleteRecords) removes offsets 0-69 before the engine read 30-69.
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.delete_records({TopicPartition(names["input"], 0): 70})
    finally:
        admin.close()
    engine = Engine(cfg)
    with caplog.at_level("WARNING", logger="connectors"):
        engine.run()
    assert engine.learner.step == 30 + 30
    warned = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert warned and "40 record(s) skipped" in warned[0], warned
    assert _status(tmp_path / "status.json")["skipped_records"] == 40

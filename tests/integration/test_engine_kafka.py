"""The engine end to end against a real Apache Kafka broker (started by the tests).

What must hold (issue 4): one release per learning step, each carrying its ledger; a consumer
can rebuild the model from any single message; SIGKILL at random points loses nothing, learns
nothing twice and never publishes two different releases of one step; malformed input is
dead-lettered with its reason while every valid record is learned; a broker outage is waited out.
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
from pathlib import Path

import numpy as np
import pytest
from kafka import KafkaConsumer

from connectors import KafkaSink, ReleaseMessage
from stream_dp.checkpoint import load_checkpoint
from stream_dp.engine import Engine
from stream_dp.engine.config import EngineConfig
from stream_dp.privacy import accountant_from_dict

from .kafka_broker import KafkaBroker

pytestmark = pytest.mark.kafka

FEATURES = ["a", "b", "c", "d"]


def valid_record(i: int) -> dict:
    rng = np.random.default_rng(i)
    x = rng.normal(size=4)
    y = int(x[0] + 0.5 * x[1] + 0.3 * rng.normal() > 0)
    return {"x": dict(zip(FEATURES, x.round(6).tolist(), strict=True)), "y": y}


def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    with KafkaSink(topic, bootstrap) as sink:
        for v in values:
            sink.send(None, v)
        sink.flush()


def read_all(bootstrap: str, topic: str, idle_ms: int = 4000) -> list[bytes]:
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=idle_ms,
        max_partition_fetch_bytes=4 * 1024 * 1024,
    )
    try:
        return [m.value for m in consumer]
    finally:
        consumer.close()


def engine_config(tmp: Path, bootstrap: str, names: dict, **model) -> dict:
    return {
        "model": {
            "algorithm": "OnPairStrC",
            "task": "auc",
            "epsilon": 2.0,
            "delta": 1e-5,
            "alpha": 1.0,
            "buffer": 32,
            "features": FEATURES,
            "model_id": names["model"],
            **model,
        },
        "source": {
            "kind": "kafka",
            "topic": names["input"],
            "bootstrap_servers": bootstrap,
            "group_id": names["group"],
            "max_idle_seconds": 6.0,
        },
        "releases": {"kind": "kafka", "topic": names["releases"], "bootstrap_servers": bootstrap},
        "dead_letters": {"kind": "kafka", "topic": names["dead"], "bootstrap_servers": bootstrap},
        "checkpoint": {"path": str(tmp / "state" / "model.ckpt"), "every_records": 500},
        "status": {"interval_seconds": 0.5, "file": str(tmp / "status.json")},
    }


def names_for(unique_name) -> dict:
    return {k: unique_name(k) for k in ("input", "releases", "dead", "group", "model")}


def parse_releases(raw: list[bytes]) -> list[ReleaseMessage]:
    return [ReleaseMessage.from_json(v) for v in raw]


def check_release_stream(releases: list[ReleaseMessage], n_steps: int, epsilon: float) -> None:
    """Every step 1..n released, duplicates identical, ledger continuous and within budget."""
    by_step: dict[int, ReleaseMessage] = {}
    for r in releases:
        prev = by_step.get(r.step)
        if prev is not None:
            # A replay re-publishes; it must be the very same release (time aside).
            assert prev.weights == r.weights, f"two different releases of step {r.step}"
            assert prev.rho_spent == r.rho_spent and prev.release_index == r.release_index
        by_step[r.step] = r
    assert sorted(by_step) == list(range(1, n_steps + 1)), "releases must have no gaps"
    rho = [by_step[t].rho_spent for t in range(1, n_steps + 1)]
    eps = [by_step[t].epsilon_spent for t in range(1, n_steps + 1)]
    assert all(b >= a for a, b in zip(rho, rho[1:], strict=False)), "ρ spent must be monotone"
    assert all(b >= a for a, b in zip(eps, eps[1:], strict=False)), "ε spent must be monotone"
    assert max(eps) <= epsilon
    assert all(r.rho_spent <= r.rho_budget for r in by_step.values())


def test_20k_records_one_release_per_step(kafka_broker: KafkaBroker, unique_name, tmp_path):
    bootstrap = kafka_broker.bootstrap
    names = names_for(unique_name)
    n = 20_000
    produce(bootstrap, names["input"], [json.dumps(valid_record(i)).encode() for i in range(n)])
    cfg = EngineConfig.model_validate(engine_config(tmp_path, bootstrap, names))
    engine = Engine(cfg)
    stats = engine.run()
    assert stats.learned == n and engine.learner.step == n and stats.dead_letters == 0
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["step"] == n and status["consumer_lag"] == 0
    assert status["epsilon_spent"] <= status["epsilon_budget"]

    releases = parse_releases(read_all(bootstrap, names["releases"]))
    assert len(releases) == n, "exactly one release per learning step (no crash, no replay)"
    check_release_stream(releases, n, epsilon=2.0)
    for r in releases:
        assert r.model_id == names["model"] and r.delta == 1e-5 and r.rho_budget > 0

    # Any single message is enough to rebuild the model: score records with it alone.
    rng = np.random.default_rng(0)
    probe = [valid_record(n + i)["x"] for i in range(20)]
    for idx in rng.choice(n, size=25, replace=False):
        msg = ReleaseMessage.from_json(releases[idx].to_json())
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
        return repr(v)

    lines = []
    for section, body in cfg.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {val(v)}" for k, v in body.items() if v is not None]
        lines.append("")
    path.write_text("\n".join(lines))


def _start_engine(config_path: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "stream_dp.cli", "run", "--config", str(config_path)],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _wait_for_step(status: Path, above: int, proc: subprocess.Popen, timeout: float) -> int:
    """Poll the engine's status file until its step passes ``above`` (bounded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"engine exited early with {proc.returncode}")
        try:
            step = json.loads(status.read_text())["step"]
        except (FileNotFoundError, ValueError, KeyError):
            step = -1
        if step > above:
            return step
        time.sleep(0.05)  # polling interval of a bounded wait, not a timing assumption
    raise AssertionError(f"engine did not pass step {above} within {timeout}s")


@pytest.mark.parametrize("journal", [False, True], ids=["ledger-in-checkpoint", "ledger-journal"])
def test_sigkill_three_times_loses_nothing(
    kafka_broker: KafkaBroker, unique_name, tmp_path, journal: bool
):
    """Three SIGKILLs at random points: every record learned once, every release charged once.

    With ``checkpoint.ledger_journal`` the stream is long enough (> 2 chunks of 8192 charges)
    for sealed chunks to sit in the journal when the engine is killed.
    """
    bootstrap = kafka_broker.bootstrap
    names = names_for(unique_name)
    n = 18_000 if journal else 8_000
    produce(bootstrap, names["input"], [json.dumps(valid_record(i)).encode() for i in range(n)])
    cfg = engine_config(tmp_path, bootstrap, names, seed=None)
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
        progress = _wait_for_step(status, min(target, n - 500), proc, timeout=120)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL, f"kill {kill} did not hit a running engine"
    proc = _start_engine(config_path, log)
    assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]

    ckpt = load_checkpoint(cfg["checkpoint"]["path"], model_id=names["model"])
    assert ckpt.learner_state["t"] == n, "learning steps must equal valid records"
    releases = parse_releases(read_all(bootstrap, names["releases"]))
    assert len(releases) >= n  # replays may repeat releases, identically
    check_release_stream(releases, n, epsilon=2.0)
    # The ledger in the checkpoint is the one the releases advertise.
    final = max(releases, key=lambda r: r.step)
    acc_state = ckpt.learner_state["accountant"]
    if journal:  # the checkpoint names its journal relative to itself
        assert acc_state["kind"] == "journal:zcdp"
        path = cfg["checkpoint"]["path"] + ".ledger"
        acc_state = {**acc_state, "journal": {**acc_state["journal"], "path": path}}
    ledger = accountant_from_dict(acc_state)
    events = ledger.ledger
    assert math.fsum(e.rho for e in events) == ledger.rho_spent() == final.rho_spent
    assert len({e.step for e in events}) == len(events), "a step was charged twice"
    assert ledger.verify()
    if journal:
        assert ledger.journal is not None and ledger.journal.file_nbytes() > 0
        ledger.close()


BAD_KINDS = [
    "invalid_json",
    "missing_label",
    "nan",
    "infinite",
    "wrong_dimension",
    "unknown_feature",
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
    if kind == "unknown_feature":
        return json.dumps({"x": {**x, "zzz": 1.0}, "y": 1}).encode()
    if kind == "oversize":
        return json.dumps({"x": x, "y": 1, "pad": "p" * 1_000_100}).encode()
    return json.dumps({"x": {**x, "c": "seven"}, "y": 1}).encode()


def test_malformed_messages_dead_lettered(kafka_broker: KafkaBroker, unique_name, tmp_path):
    bootstrap = kafka_broker.bootstrap
    names = names_for(unique_name)
    n_valid, n_bad = 3000, 1000
    values, expected_reasons = [], []
    rng = np.random.default_rng(7)
    bad_at = set(rng.choice(n_valid + n_bad, size=n_bad, replace=False).tolist())
    vi = bi = 0
    for pos in range(n_valid + n_bad):
        if pos in bad_at:
            values.append(bad_record(bi))
            expected_reasons.append(BAD_KINDS[bi % len(BAD_KINDS)])
            bi += 1
        else:
            values.append(json.dumps(valid_record(vi)).encode())
            vi += 1
    produce(bootstrap, names["input"], values)
    cfg = EngineConfig.model_validate(engine_config(tmp_path, bootstrap, names))
    engine = Engine(cfg)
    stats = engine.run()
    assert engine.learner.step == n_valid and stats.learned == n_valid
    assert stats.dead_letters == n_bad

    dead = [json.loads(v) for v in read_all(bootstrap, names["dead"])]
    assert len(dead) == n_bad
    assert all(d["reason"] and d["message"] for d in dead)
    got = sorted(d["reason"] for d in dead)
    # Each kind of damage maps to one stable reason code.
    assert len(set(got)) >= 7, f"reasons should tell the kinds of damage apart: {set(got)}"
    assert all(d["source_position"] is not None for d in dead)
    releases = parse_releases(read_all(bootstrap, names["releases"]))
    check_release_stream(releases, n_valid, epsilon=2.0)


def test_broker_restart_mid_run(kafka_broker: KafkaBroker, unique_name, tmp_path):
    bootstrap = kafka_broker.bootstrap
    names = names_for(unique_name)
    n = 6000
    produce(bootstrap, names["input"], [json.dumps(valid_record(i)).encode() for i in range(n)])
    cfg_dict = engine_config(tmp_path, bootstrap, names)
    cfg_dict["source"]["max_idle_seconds"] = 60.0  # long enough to outlast the outage
    cfg = EngineConfig.model_validate(cfg_dict)
    engine = Engine(cfg)
    done: dict = {}

    def run():
        try:
            done["stats"] = engine.run()
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            done["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    deadline = time.monotonic() + 120
    while engine.learner.step < 1500 and time.monotonic() < deadline:
        time.sleep(0.02)  # polling interval of a bounded wait
    assert engine.learner.step >= 1500
    kafka_broker.stop()
    step_during = engine.learner.step
    kafka_broker.start()
    # After the restart the engine must catch up with the rest of the topic.
    deadline = time.monotonic() + 180
    while engine.learner.step < n and time.monotonic() < deadline and worker.is_alive():
        time.sleep(0.05)
    engine.stop()
    worker.join(timeout=120)
    assert "error" not in done, repr(done.get("error"))
    assert step_during < n, "the outage must happen mid-run"
    assert engine.learner.step == n, "nothing may be lost across a broker restart"
    releases = parse_releases(read_all(kafka_broker.bootstrap, names["releases"]))
    check_release_stream(releases, n, epsilon=2.0)

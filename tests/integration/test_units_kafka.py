"""A unit-level model on a real broker: the unit is the Kafka message key.

What must hold (issue criterion 1, through the engine): records the contribution bound drops
are committed like learned ones — consumed offsets cover them, no release, no dead letter —
and counted in status.json; a SIGKILL and restart replay to the same releases, byte for byte.
"""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest

from connectors import KafkaSink
from stream_dp.privacy.contribution import ContributionBound

from .kafka_broker import KafkaBroker
from .test_connectors_kafka import committed_offsets
from .test_engine_kafka import (
    _ledger,
    _start_engine,
    _status,
    _wait_for_step,
    _write_toml,
    check_release_stream,
    copies_by_step,
    engine_config,
    names_for,
    parse_releases,
    read_all,
    valid_record,
)

pytestmark = pytest.mark.kafka


def persons(n: int, count: int = 200, seed: int = 4) -> list[str]:
    """A skewed assignment: person p has about 1/(p+1) of the records."""
    rng = np.random.default_rng(seed)
    w = 1.0 / np.arange(1, count + 1)
    return [f"person-{p}" for p in rng.choice(count, size=n, p=w / w.sum())]


@pytest.mark.scenario
def test_dropped_records_are_committed_counted_and_replayed_alike(
    kafka_broker: KafkaBroker, unique_name, tmp_path, kafka_client
):
    bootstrap = kafka_broker.bootstrap
    n, k, b = 4000, 4, 40
    names = names_for(unique_name)
    keys = persons(n)
    with KafkaSink(names["input"], bootstrap) as sink:
        for i, key in enumerate(keys):
            sink.send(key, json.dumps(valid_record(i)).encode())
        sink.flush()
    # Admission depends on the keys and the step clock only: what the engine must admit.
    admitted = int(ContributionBound(k, b).admit_many(keys, 1).sum())
    assert 0 < admitted < n

    cfg = engine_config(tmp_path, bootstrap, names, kafka_client, seed=None)
    cfg["model"] = {
        "algorithm": "OnPairMF", "epsilon": 2.0, "horizon": n, "buffer": 32,
        "features": cfg["model"]["features"], "model_id": cfg["model"]["model_id"],
        "unit_key": "person", "max_events_per_unit": k, "min_separation": b,
    }  # fmt: skip
    cfg["units"] = {"source": "message_key"}
    cfg["checkpoint"]["every_records"] = 300
    config_path = tmp_path / "engine.toml"
    _write_toml(config_path, cfg)
    log, status = tmp_path / "engine.log", tmp_path / "status.json"
    proc = _start_engine(config_path, log)
    _wait_for_step(status, admitted // 2, proc, timeout=180)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    proc = _start_engine(config_path, log)
    assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]

    ckpt, ledger = _ledger(cfg)
    assert ckpt.learner_state["t"] == admitted, "steps must equal the admitted records"
    final = _status(status)
    assert final["dropped"] == n - admitted and final["dead_letters"] == 0
    assert sum(final["privacy"]["dropped"].values()) == n - admitted
    assert final["privacy"]["level"] == "unit" and final["privacy"]["max_events_per_unit"] == k
    assert 0 < final["privacy"]["epsilon_event"] < final["privacy"]["epsilon"]
    # Every record, dropped ones included, is committed: the group's offsets cover the input.
    assert sum(committed_offsets(bootstrap, names["group"]).values()) == n
    assert read_all(bootstrap, names["dead"]) == []
    raw = read_all(bootstrap, names["releases"])
    releases = parse_releases(raw)
    check_release_stream(releases, admitted, epsilon=2.0)
    assert all(len(c) == 1 for c in copies_by_step(raw).values()), "replays are identical"
    assert all(r.privacy_unit["unit_key"] == "person" for r in releases)
    assert len(ledger.ledger) == 1  # OnPairMF: the stream's one charge, never twice

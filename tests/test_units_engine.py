"""A unit-level model in the engine (no Kafka): the unit from a record field, dropped records
committed and counted, never published or dead-lettered, and a crash replays to the same
releases. The Kafka message key as the unit, on a real broker, is in
tests/integration/test_units_kafka.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_engine import Boom, Collect, CrashingSource, run, without_wall_clock

from connectors import ReleaseMessage
from stream_dp.engine import Engine, EngineConfig
from stream_dp.engine.cli import dry_run

FEATURES = ["a", "b", "c"]


def records(n: int, seed: int = 0, persons: int = 12) -> list[bytes]:
    """Records of a few persons, skewed (person p has about 1/(p+1) of them)."""
    rng = np.random.default_rng(seed)
    w = 1.0 / np.arange(1, persons + 1)
    who = rng.choice(persons, size=n, p=w / w.sum())
    out = []
    for p in who:
        x = rng.normal(size=3)
        rec = {"x": dict(zip(FEATURES, x.tolist(), strict=True)), "y": int(x[0] > 0)}
        out.append(json.dumps({**rec, "person": f"p{p}"}).encode())
    return out


def config(tmp: Path, **model) -> EngineConfig:
    return EngineConfig.model_validate(
        {
            "model": {
                "alpha": 1.0,
                "buffer": 16,
                "release_every": 1,
                "predict_with": "release",
                "smoothing_window": 1,
                "warmup": 10,
                "seed": 11,
                "reproducible": True,
                "model_id": "t",
                "features": FEATURES,
                "unit_key": "person",
                "max_events_per_unit": 3,
                "min_separation": 4,
                **model,
            },
            "source": {"kind": "jsonl", "path": str(tmp / "in.jsonl")},
            "releases": {"kind": "jsonl", "path": str(tmp / "rel.jsonl")},
            "dead_letters": {"kind": "jsonl", "path": str(tmp / "dead.jsonl")},
            "checkpoint": {"path": str(tmp / "state" / "m.ckpt"), "every_records": 7},
            "status": {"interval_seconds": 1000.0, "file": str(tmp / "status.json")},
        }
    )


def test_dropped_records_are_committed_counted_and_change_no_release(tmp_path):
    data = records(150, seed=1)
    out, dead = Collect(), Collect()
    engine = run(config(tmp_path), data, out, dead)
    learner, stats = engine.learner, engine.stats
    dropped = learner.units_dropped
    assert stats.dropped == sum(dropped.values()) > 0
    assert dropped["max_events"] > 0 and dropped["min_separation"] > 0
    assert stats.learned == learner.step == 150 - stats.dropped and stats.dead_letters == 0
    assert dead.items == []  # a dropped record is no dead letter
    releases = out.releases()
    assert [r["step"] for r in releases] == list(range(1, learner.step + 1))
    # Every release states the relation and the event-level ε beside the unit-level one.
    msg = ReleaseMessage.from_json(out.items[-1][1])
    assert msg.privacy_unit == learner.neighbouring()
    assert msg.privacy_unit["max_events_per_unit"] == 3
    assert 0 < msg.epsilon_event_spent < msg.epsilon_spent
    status = engine.status()
    assert status["dropped"] == stats.dropped and status["privacy"]["level"] == "unit"
    assert status["privacy"]["dropped"] == dropped
    # The stream without the dropped records publishes the very same releases.
    kept = []
    probe = Engine(config(tmp_path / "probe")).learner
    for raw in data:
        t = probe.step
        rec = json.loads(raw)
        probe.learn_one({**rec["x"], "person": rec["person"]}, rec["y"])
        if probe.step > t:
            kept.append(raw)
    assert len(kept) == stats.learned
    again = Collect()
    (tmp_path / "kept").mkdir()
    run(config(tmp_path / "kept"), kept, again)
    assert [without_wall_clock(r) for r in again.releases()] == [
        without_wall_clock(r) for r in releases
    ]


def test_a_crash_replays_to_the_same_releases_and_counts(tmp_path):
    data = records(120, seed=3)
    reference = Collect()
    (tmp_path / "ref").mkdir()
    ref = run(config(tmp_path / "ref"), data, reference)
    cfg = config(tmp_path)
    out = Collect()
    for crash_at in (25, 61, 90):  # each restart replays from the last checkpoint
        with pytest.raises(Boom):
            Engine(cfg, source=CrashingSource(data, crash_at), releases=out.sink(),
                   dead_letters=Collect().sink()).run()  # fmt: skip
    engine = run(cfg, data, out)
    assert engine.learner.step == ref.learner.step
    assert engine.learner.units_dropped == ref.learner.units_dropped
    assert engine.stats.dropped == ref.stats.dropped
    got = [without_wall_clock(r) for r in out.releases()]
    want = [without_wall_clock(r) for r in reference.releases()]
    assert got == want


def test_a_record_without_its_unit_is_dead_lettered(tmp_path):
    data = records(20, seed=2)
    bad = json.loads(data[5])
    del bad["person"]
    data[5] = json.dumps(bad).encode()
    dead = Collect()
    engine = run(config(tmp_path), data, Collect(), dead)
    assert engine.stats.dead_letters == 1
    assert json.loads(dead.items[0][1])["reason"]


def test_dry_run_states_the_relation_and_both_epsilons(tmp_path):
    text = dry_run(config(tmp_path, horizon=2000))
    assert "unit-level (ε=1.0" in text and "'person'" in text
    assert "up to 3 admitted events" in text and "event-level ε≈" in text
    event = dry_run(
        config(tmp_path, horizon=2000, unit_key=None, max_events_per_unit=1, min_separation=None)
    )
    assert "event-level: neighbouring streams differ in one event" in event


def test_the_message_key_as_unit_needs_kafka_and_a_unit_name(tmp_path):
    base = config(tmp_path).model_dump()
    with pytest.raises(ValueError, match="message_key"):
        EngineConfig.model_validate({**base, "units": {"source": "message_key"}})


def test_the_size_bound_holds_for_unit_level_releases(tmp_path):
    from stream_dp.engine.preflight import release_size

    out = Collect()
    cfg = config(tmp_path, task="metric", model_id="m" * 30)
    run(cfg, records(60, seed=5), out)
    bound, _ = release_size(cfg)
    sizes = [len(v) for _, v in out.items]
    assert sizes and max(sizes) <= bound < max(sizes) + 400
    assert all(b'"privacy_unit"' in v for _, v in out.items)

"""The engine without Kafka: config validation, refusal to reset a ledger, crash and replay.

The Kafka path is exercised against a real broker in tests/integration/test_engine_kafka.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from connectors import CallbackSink, IterableSource
from stream_dp.checkpoint import CheckpointCorrupt, load_checkpoint
from stream_dp.cli import main as cli_main
from stream_dp.engine import ConfigError, Engine, EngineConfig, EngineError, load_config
from stream_dp.engine.cli import dry_run


def records(n: int, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.normal(size=3)
        out.append(json.dumps({"x": {"a": x[0], "b": x[1], "c": x[2]}, "y": int(x[0] > 0)}))
    return [o.encode() for o in out]


def config(tmp: Path, **model) -> EngineConfig:
    return EngineConfig.model_validate(
        {
            "model": {
                "alpha": 1.0,
                "buffer": 16,
                "seed": 11,
                "reproducible": True,
                "model_id": "t",
                **model,
            },
            "source": {"kind": "jsonl", "path": str(tmp / "in.jsonl")},
            "releases": {"kind": "jsonl", "path": str(tmp / "rel.jsonl")},
            "dead_letters": {"kind": "jsonl", "path": str(tmp / "dead.jsonl")},
            "checkpoint": {"path": str(tmp / "state" / "m.ckpt"), "every_records": 7},
            "status": {"interval_seconds": 1000.0, "file": str(tmp / "status.json")},
        }
    )


class Collect:
    def __init__(self):
        self.items: list[tuple[str | None, bytes]] = []

    def sink(self) -> CallbackSink:
        return CallbackSink(lambda k, v: self.items.append((k, v)))


class Boom(RuntimeError):
    pass


class CrashingSource(IterableSource):
    """An in-memory source that dies (like a SIGKILL) after yielding ``crash_after`` records."""

    def __init__(self, items, crash_after: int):
        super().__init__(items)
        self.crash_after = crash_after

    def __iter__(self):
        for msg in super().__iter__():
            if msg.position["line"] == self.crash_after:
                raise Boom("simulated crash")
            yield msg


def test_toml_errors_name_the_field(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[model]\nepsilon = -1\nbufer = 3\n[source]\nkind = "kafka"\n'
        '[releases]\nkind = "stdout"\n[dead_letters]\nkind = "stdout"\n'
        '[checkpoint]\npath = "x"\n'
    )
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    text = str(err.value)
    assert "model.epsilon" in text and "model.bufer" in text and "source" in text
    assert cli_main(["run", "--config", str(bad)]) == 2
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.toml")
    (tmp_path / "broken.toml").write_text("[model\n")
    with pytest.raises(ConfigError, match="TOML"):
        load_config(tmp_path / "broken.toml")


def test_non_private_learner_cannot_be_run(tmp_path):
    with pytest.raises(Exception, match="algorithm"):
        EngineConfig.model_validate(
            {
                "model": {"algorithm": "PairwiseGIGA"},
                "source": {"kind": "jsonl", "path": "x"},
                "releases": {"kind": "stdout"},
                "dead_letters": {"kind": "stdout"},
                "checkpoint": {"path": "c"},
            }
        )


def test_dry_run_prints_plan(tmp_path, capsys):
    cfg = config(tmp_path, horizon=5000)
    text = dry_run(cfg)
    learner_t1 = Engine(cfg).learner.T1
    assert f"T1={learner_t1}" in text and "σ per coord" in text and "ρ budget" in text
    assert "5000" in text  # the last step of the horizon is planned too


def test_run_learns_valid_and_dead_letters_bad(tmp_path):
    good = records(40)
    items = good[:10] + [b"{", b'{"x": {"a": 1}}', b'{"x": {"a": NaN}, "y": 1}'] + good[10:]
    (tmp_path / "in.jsonl").write_bytes(b"\n".join(items) + b"\n")
    engine = Engine(config(tmp_path))
    stats = engine.run()
    assert (stats.learned, stats.dead_letters) == (40, 3)
    assert engine.learner.step == 40
    dead = [json.loads(line) for line in (tmp_path / "dead.jsonl").read_text().splitlines()]
    assert [d["reason"] for d in dead] == ["invalid_json", "missing_label", "non_finite"]
    releases = [json.loads(line) for line in (tmp_path / "rel.jsonl").read_text().splitlines()]
    assert [r["step"] for r in releases] == list(range(1, 41))
    assert oct(os.stat(tmp_path / "state" / "m.ckpt").st_mode & 0o777) == "0o600"


def test_crash_and_replay_gives_identical_releases(tmp_path):
    data = records(120, seed=3)
    reference = Collect()
    cfg = config(tmp_path / "ref")
    (tmp_path / "ref").mkdir()
    Engine(cfg, source=IterableSource(data), releases=reference.sink(),
           dead_letters=Collect().sink()).run()  # fmt: skip

    cfg = config(tmp_path)
    out = Collect()
    for crash_after in (25, 50, 90):  # each restart replays from the last checkpoint
        with pytest.raises(Boom):
            Engine(
                cfg,
                source=CrashingSource(data, crash_after),
                releases=out.sink(),
                dead_letters=Collect().sink(),
            ).run()
    engine = Engine(cfg, source=IterableSource(data), releases=out.sink(),
                    dead_letters=Collect().sink())  # fmt: skip
    engine.run()
    assert engine.learner.step == 120

    def by_step(items):
        d: dict[int, dict] = {}
        for _, v in items:
            r = json.loads(v)
            r.pop("time")
            if r["step"] in d:
                assert d[r["step"]] == r, f"step {r['step']} released twice, differently"
            d[r["step"]] = r
        return d

    ref, got = by_step(reference.items), by_step(out.items)
    assert got == ref, "after three crashes the release stream must equal an uninterrupted run"
    assert len(out.items) > len(reference.items)  # replays happened (identically)


def test_never_starts_fresh_silently(tmp_path):
    (tmp_path / "in.jsonl").write_bytes(b"\n".join(records(20)) + b"\n")
    cfg = config(tmp_path)
    Engine(cfg).run()
    ckpt = Path(cfg.checkpoint.path)
    spent = load_checkpoint(ckpt).learner_state["accountant"]

    # A corrupted checkpoint is an error, not a fresh start.
    blob = bytearray(ckpt.read_bytes())
    blob[-10] ^= 0xFF
    ckpt.write_bytes(bytes(blob))
    with pytest.raises(CheckpointCorrupt):
        Engine(cfg).run()

    # A missing checkpoint of a model that existed is an error too.
    ckpt.unlink()
    with pytest.raises(EngineError, match="--fresh"):
        Engine(cfg).run()
    assert cli_main(["run", "--config", str(_toml(tmp_path, cfg))]) == 3

    # --fresh starts a new ledger explicitly.
    engine = Engine(cfg, fresh=True)
    engine.run()
    assert engine.learner.step == 20 and spent is not None


def _toml(tmp: Path, cfg: EngineConfig) -> Path:
    d = cfg.model_dump(exclude_none=True)
    lines = []
    for section, body in d.items():
        if not isinstance(body, dict):
            continue
        lines.append(f"[{section}]")
        for k, v in body.items():
            if isinstance(v, dict):
                continue
            lines.append(f"{k} = {json.dumps(v)}")
    p = tmp / "engine.toml"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_stop_checkpoints_and_resumes(tmp_path):
    data = records(60)
    cfg = config(tmp_path)
    out = Collect()
    engine = Engine(cfg, source=IterableSource(data), releases=out.sink(),
                    dead_letters=Collect().sink(), max_records=33)  # fmt: skip
    engine.run()
    ck = load_checkpoint(cfg.checkpoint.path)
    assert ck.learner_state["t"] == 33 and ck.positions == {"line": 33}
    engine = Engine(cfg, source=IterableSource(data), releases=out.sink(),
                    dead_letters=Collect().sink())  # fmt: skip
    engine.run()
    assert engine.learner.step == 60
    steps = [json.loads(v)["step"] for _, v in out.items]
    assert steps == list(range(1, 61)), "a clean stop/resume neither repeats nor skips"


def test_ledger_journal_survives_crashes_and_refuses_a_lost_journal(tmp_path, monkeypatch):
    """checkpoint.ledger_journal: sealed chunks go to <ckpt>.ledger; crashes replay identically.

    Chunks of 4 charges (instead of 8192) make every crash leave chunks sealed after the last
    checkpoint in the journal, which the restart must truncate and the replay re-charge.
    """
    from stream_dp.privacy.accountant import JournalError

    monkeypatch.setattr("stream_dp.privacy.accountant.CHUNK", 4)
    data = records(120, seed=4)
    (tmp_path / "ref").mkdir()
    reference = Engine(config(tmp_path / "ref"), source=IterableSource(data),
                       releases=Collect().sink(), dead_letters=Collect().sink())  # fmt: skip
    reference.run()

    cfg = config(tmp_path).model_copy(
        update={"checkpoint": config(tmp_path).checkpoint.model_copy(
            update={"ledger_journal": True})}
    )  # fmt: skip
    for crash_after in (25, 50, 90):
        with pytest.raises(Boom):
            Engine(cfg, source=CrashingSource(data, crash_after), releases=Collect().sink(),
                   dead_letters=Collect().sink()).run()  # fmt: skip
    engine = Engine(cfg, source=IterableSource(data), releases=Collect().sink(),
                    dead_letters=Collect().sink())  # fmt: skip
    engine.run()
    acc = engine.learner.accountant
    assert acc.ledger == reference.learner.accountant.ledger
    assert acc.rho_spent() == reference.learner.accountant.rho_spent()
    assert len(acc.journal) == len(acc) // 4 >= 8
    stored = load_checkpoint(Path(cfg.checkpoint.path)).learner_state["accountant"]
    assert stored["kind"] == "journal:zcdp" and stored["journal"]["path"] == "m.ckpt.ledger"
    assert len(stored["columns"]["step"]) < 4  # the open chunk only

    journal = Path(cfg.checkpoint.path).with_name("m.ckpt.ledger")
    blob = journal.read_bytes()
    journal.write_bytes(blob[:-1])  # a lost byte: charges the checkpoint counts are gone
    with pytest.raises(JournalError):
        Engine(cfg, source=IterableSource(data), releases=Collect().sink(),
               dead_letters=Collect().sink()).run()  # fmt: skip
    fresh = Engine(cfg, fresh=True, source=IterableSource(data), releases=Collect().sink(),
                   dead_letters=Collect().sink())  # fmt: skip
    fresh.run()  # --fresh keeps the old journal aside and starts a new one
    assert list(journal.parent.glob("m.ckpt.ledger.abandoned-*"))
    assert fresh.learner.accountant.ledger == reference.learner.accountant.ledger

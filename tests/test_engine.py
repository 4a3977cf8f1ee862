"""The engine without Kafka: config, the commit cycle, crashes, state-directory safety, schema.

The Kafka path (transactions, fencing, partitions, outages) is exercised against a real broker
in tests/integration/test_engine_kafka.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import patience

from connectors import CallbackSink, IterableSource, ReleaseMessage
from stream_dp.checkpoint import CheckpointCorrupt, load_checkpoint
from stream_dp.cli import main as cli_main
from stream_dp.engine import ConfigError, Engine, EngineConfig, EngineError, load_config
from stream_dp.engine.cli import dry_run
from stream_dp.engine.errors import StateError
from stream_dp.engine.preflight import ReleaseTooLarge
from stream_dp.engine.state import StateDir
from stream_dp.engine.stopping import SIGNAL_GRACE_SECONDS
from stream_dp.online import OnPairStrC
from stream_dp.privacy import accountant_from_dict

FEATURES = ["a", "b", "c"]


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
                "release_every": 1,  # a release at every step: the commit cycle's test bed
                "predict_with": "release",
                "smoothing_window": 1,
                "seed": 11,
                "reproducible": True,
                "model_id": "t",
                "features": FEATURES,
                **model,
            },
            "source": {"kind": "jsonl", "path": str(tmp / "in.jsonl")},
            "releases": {"kind": "jsonl", "path": str(tmp / "rel.jsonl")},
            "dead_letters": {"kind": "jsonl", "path": str(tmp / "dead.jsonl")},
            "checkpoint": {"path": str(tmp / "state" / "m.ckpt"), "every_records": 7},
            "status": {"interval_seconds": 1000.0, "file": str(tmp / "status.json")},
        }
    )


def with_checkpoint(cfg: EngineConfig, **changes) -> EngineConfig:
    return cfg.model_copy(update={"checkpoint": cfg.checkpoint.model_copy(update=changes)})


class Collect:
    def __init__(self):
        self.items: list[tuple[str | None, bytes]] = []

    def sink(self) -> CallbackSink:
        return CallbackSink(lambda k, v: self.items.append((k, v)))

    def releases(self) -> list[dict]:
        return [json.loads(v) for _, v in self.items]


class Boom(RuntimeError):
    pass


class CrashingSource(IterableSource):
    """An in-memory source that dies (like a SIGKILL) before handing out record ``crash_at``."""

    def __init__(self, items, crash_at: int):
        super().__init__(items)
        self.crash_at = crash_at

    def poll(self, max_records=500, timeout_s=0.0):
        batch = super().poll(max_records=1, timeout_s=timeout_s)
        if batch and batch[0].position["line"] == self.crash_at:
            raise Boom("simulated crash")
        return batch


class CrashingSink:
    """A sink that dies (like a SIGKILL) at its ``crash_at``-th message, after taking some."""

    def __init__(self, into: Collect, crash_at: int):
        self.into, self.crash_at, self.n = into, crash_at, 0

    def send(self, key, value):
        self.n += 1
        if self.n == self.crash_at:
            raise Boom("simulated crash while publishing")
        self.into.items.append((key, value))

    def flush(self):
        pass

    def close(self):
        pass


def run(cfg, data, out: Collect, dead: Collect | None = None, **kw) -> Engine:
    engine = Engine(
        cfg,
        source=IterableSource(data),
        releases=out.sink(),
        dead_letters=(dead or Collect()).sink(),
        **kw,
    )
    engine.run()
    return engine


def without_wall_clock(release: dict) -> dict:
    return {k: v for k, v in release.items() if k not in ("time", "run_id")}


# -- configuration ------------------------------------------------------------------------


def test_toml_errors_name_the_field(tmp_path, capsys):
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
    capsys.readouterr()
    assert cli_main(["run", "--config", str(bad)]) == 2
    stderr = capsys.readouterr().err
    assert stderr.count("\n") == 1 and "model.epsilon" in stderr, "one line, naming the field"
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.toml")
    (tmp_path / "broken.toml").write_text("[model\n")
    with pytest.raises(ConfigError, match="TOML"):
        load_config(tmp_path / "broken.toml")


def test_the_engine_refuses_to_start_without_a_declared_schema(tmp_path, capsys):
    path = tmp_path / "engine.toml"
    path.write_text(
        '[model]\nalpha = 1.0\n[source]\nkind = "jsonl"\npath = "in.jsonl"\n'
        '[releases]\nkind = "stdout"\n[dead_letters]\nkind = "stdout"\n'
        '[checkpoint]\npath = "state/m.ckpt"\n'
    )
    assert cli_main(["run", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model.features is required" in err
    assert not (tmp_path / "state").exists(), "nothing is created before the config is valid"
    for bad in ([], ["a", "a"], [""], ["ok", "\ud800"]):
        with pytest.raises(ValueError, match="feature"):
            config(tmp_path, features=bad)


def test_relative_paths_follow_the_config_file(tmp_path):
    (tmp_path / "cfg").mkdir()
    path = tmp_path / "cfg" / "engine.toml"
    path.write_text(
        '[model]\nfeatures = ["a"]\n[source]\nkind = "jsonl"\npath = "in.jsonl"\n'
        '[releases]\nkind = "jsonl"\npath = "out/rel.jsonl"\n[dead_letters]\nkind = "stdout"\n'
        '[checkpoint]\npath = "state/m.ckpt"\n[status]\nfile = "/abs/status.json"\n'
    )
    cfg = load_config(path)
    assert cfg.checkpoint.path == str(tmp_path / "cfg" / "state" / "m.ckpt")
    assert cfg.source.path == str(tmp_path / "cfg" / "in.jsonl")
    assert cfg.releases.path == str(tmp_path / "cfg" / "out" / "rel.jsonl")
    assert cfg.status.file == "/abs/status.json"


def test_a_fixed_seed_needs_the_run_declared_non_private(tmp_path):
    with pytest.raises(ValueError, match="reproducible"):
        config(tmp_path, reproducible=False)
    (tmp_path / "in.jsonl").write_bytes(b"\n".join(records(20)) + b"\n")
    Engine(config(tmp_path)).run()
    rel = [json.loads(line) for line in (tmp_path / "rel.jsonl").read_text().splitlines()]
    assert rel and all(r["private"] is False for r in rel)
    assert "NOT PRIVATE" in dry_run(config(tmp_path))


def test_non_private_learner_cannot_be_run(tmp_path):
    with pytest.raises(ValueError, match="'OnPairStrC', 'OnPairC', 'OnPairMF'"):
        EngineConfig.model_validate(
            {
                "model": {"algorithm": "PairwiseGIGA", "features": ["a"]},
                "source": {"kind": "jsonl", "path": "x"},
                "releases": {"kind": "stdout"},
                "dead_letters": {"kind": "stdout"},
                "checkpoint": {"path": "c"},
            }
        )


def test_dry_run_prints_plan(tmp_path):
    cfg = config(tmp_path, horizon=5000)
    text = dry_run(cfg)
    learner_t1 = Engine(cfg).learner.T1
    assert f"T1={learner_t1}" in text and "σ per coord" in text and "ρ budget" in text
    assert "5000" in text  # the last step of the horizon is planned too
    assert "release message: at most" in text and "no size limit" in text


def _kafka_release_config(tmp: Path, d: int, **sink) -> EngineConfig:
    names = [f"f{i}" for i in range(d)]
    return EngineConfig.model_validate(
        {
            "model": {"task": "metric", "alpha": 1.0, "features": names, "model_id": "big"},
            "source": {"kind": "jsonl", "path": str(tmp / "in.jsonl")},
            "releases": {"kind": "kafka", "topic": "r", "bootstrap_servers": "h:1", **sink},
            "dead_letters": {"kind": "stdout"},
            "checkpoint": {"path": str(tmp / "m.ckpt")},
        }
    )


def test_release_size_is_checked_against_the_release_topic_limit(tmp_path, capsys):
    # d = 240: the compact encoding keeps a metric release under Kafka's 1 MiB default.
    text = dry_run(_kafka_release_config(tmp_path, 240))
    assert "release message: at most 616," in text and "accepts 1,048,576" in text
    # d = 400 does not fit: refused before any record, naming the size and the limit.
    too_big = r"takes up to 1,7\d\d,\d{3} bytes .* accepts 1,048,576"
    with pytest.raises(ReleaseTooLarge, match=too_big):
        dry_run(_kafka_release_config(tmp_path, 400))
    toml = tmp_path / "big.toml"
    names = ", ".join(f'"f{i}"' for i in range(400))
    toml.write_text(
        f'[model]\ntask = "metric"\nalpha = 1.0\nfeatures = [{names}]\n'
        '[source]\nkind = "jsonl"\npath = "in.jsonl"\n'
        '[releases]\nkind = "kafka"\ntopic = "r"\nbootstrap_servers = "127.0.0.1:1"\n'
        '[dead_letters]\nkind = "stdout"\n[checkpoint]\npath = "state/m.ckpt"\n'
    )
    capsys.readouterr()
    for extra in (["--dry-run"], []):
        assert cli_main(["run", "--config", str(toml), *extra]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "releases.max_request_size" in err
    # A bigger producer limit admits it.
    assert "accepts 4,194,304" in dry_run(
        _kafka_release_config(tmp_path, 400, max_request_size=4 * 1024 * 1024)
    )


def test_the_size_bound_holds_for_real_releases(tmp_path):
    from connectors.schema import release_message_bytes

    data = records(60, seed=5)
    out = Collect()
    engine = run(config(tmp_path, task="metric", model_id="m" * 30), data, out)
    bound = release_message_bytes("metric", FEATURES, "m" * 30, "OnPairStrC")
    sizes = [len(v) for _, v in out.items]
    assert sizes and max(sizes) <= bound < max(sizes) + 300
    last = ReleaseMessage.from_json(out.items[-1][1])
    assert np.array_equal(last.weights_array(), engine.learner.private_weights)


# -- the commit cycle and crashes -------------------------------------------------------------


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
    state = tmp_path / "state"
    assert oct(state.stat().st_mode & 0o777) == "0o700"
    for f in ("m.ckpt", "m.ckpt.created", "m.ckpt.published", "m.ckpt.lock"):
        assert oct((state / f).stat().st_mode & 0o777) == "0o600", f
    for f in (tmp_path / "status.json", tmp_path / "dead.jsonl"):
        assert oct(f.stat().st_mode & 0o777) == "0o600", f


def test_unknown_features_are_ignored_and_counted_missing_ones_are_zero(tmp_path):
    rows = [
        {"x": {"a": 0.5, "b": -0.2, "c": 0.1, "zz": 3.0}, "y": 1},
        {"x": {"a": -0.4, "\ud800": 1.0}, "y": 0},  # lone surrogate: unknown, so ignored
        {"x": {"\ud800": 1.0}, "y": 1},  # no declared feature at all: dead-lettered
        {"x": {f"g{i}": 0.0 for i in range(40_000)} | {"a": 0.3}, "y": 1},
        {"x": {f"g{i}": 0.0 for i in range(40_000)}, "y": 0},
    ]
    data = [json.dumps(r).encode() for r in rows] + records(20)
    out, dead = Collect(), Collect()
    engine = Engine(config(tmp_path), source=IterableSource(data), releases=out.sink(),
                    dead_letters=dead.sink())  # fmt: skip
    engine.run()
    assert engine.learner.step == 23
    assert engine.learner.feature_names == tuple(FEATURES), "the schema never changes"
    assert engine.stats.unknown_features == 1 + 1 + 40_000
    assert engine.stats.records_with_unknown_features == 3
    assert [json.loads(v)["reason"] for _, v in dead.items] == ["no_known_features"] * 2
    assert all(ReleaseMessage.from_json(v).feature_names == FEATURES for _, v in out.items)
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["unknown_features"] == 40_002


def test_a_poison_first_record_never_stops_the_engine(tmp_path):
    """The records that crash-looped the engine: a lone-surrogate name, 40,000 features."""
    for i, first in enumerate(
        [
            b'{"x": {"\\ud800": 1.0}, "y": 1}',
            json.dumps({"x": {f"f{i}": 1.0 for i in range(40_000)}, "y": 1}).encode(),
            b'{"x": {"a": 1.0, "b\\ud800": 2.0}, "y": 1}',
        ]
    ):
        tmp = tmp_path / str(i)
        tmp.mkdir()
        (tmp / "in.jsonl").write_bytes(b"\n".join([first, *records(15)]) + b"\n")
        engine = Engine(config(tmp))
        stats = engine.run()
        assert stats.learned == 15 + (i == 2)
        rel = [json.loads(v) for v in (tmp / "rel.jsonl").read_text().splitlines()]
        assert len(rel) == stats.learned and rel[-1]["feature_names"] == FEATURES
        assert Engine(config(tmp)).run().learned == stats.learned, "and it restarts"


def test_crash_and_replay_publishes_each_release_once(tmp_path):
    """Crashes while learning: each restart replays from the checkpoint, publishing nothing
    that the crashed process had not checkpointed, so the release stream equals an
    uninterrupted run's, release for release."""
    data = records(120, seed=3)
    reference = Collect()
    (tmp_path / "ref").mkdir()
    run(config(tmp_path / "ref"), data, reference)

    cfg = config(tmp_path)
    out = Collect()
    for crash_at in (25, 50, 90):  # each restart replays from the last checkpoint
        with pytest.raises(Boom):
            Engine(cfg, source=CrashingSource(data, crash_at), releases=out.sink(),
                   dead_letters=Collect().sink()).run()  # fmt: skip
    engine = run(cfg, data, out)
    assert engine.learner.step == 120
    got = [without_wall_clock(r) for r in out.releases()]
    ref = [without_wall_clock(r) for r in reference.releases()]
    assert got == ref, "after three crashes the release stream equals an uninterrupted run's"


def test_a_crash_while_publishing_republishes_the_same_bytes(tmp_path):
    """Killed between the checkpoint and the end of its publication: the restart publishes the
    checkpointed messages again, byte for byte (wall clock included), and nothing else twice."""
    data = records(100, seed=8)
    cfg = config(tmp_path)
    out = Collect()
    with pytest.raises(Boom):
        Engine(cfg, source=IterableSource(data), releases=CrashingSink(out, crash_at=40),
               dead_letters=Collect().sink()).run()  # fmt: skip
    published_before = list(out.items)
    run(cfg, data, out)
    by_step: dict[int, bytes] = {}
    repeats = 0
    for _, value in out.items:
        step = json.loads(value)["step"]
        if step in by_step:
            assert by_step[step] == value, f"step {step} published twice, differently"
            repeats += 1
        by_step[step] = value
    assert sorted(by_step) == list(range(1, 101))
    assert 0 < repeats < 7, "only the interrupted cycle is published again"
    assert len(published_before) == 39


def test_never_starts_fresh_silently(tmp_path, capsys):
    (tmp_path / "in.jsonl").write_bytes(b"\n".join(records(20)) + b"\n")
    cfg = config(tmp_path, warmup=5)  # releases (and charges) from step 6
    Engine(cfg).run()
    ckpt = Path(cfg.checkpoint.path)
    spent = OnPairStrC.ledger_state(load_checkpoint(ckpt).learner_state)

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
    capsys.readouterr()
    assert cli_main(["run", "--config", str(_toml(tmp_path, cfg))]) == 3
    assert capsys.readouterr().err.count("\n") == 1

    # (Losing the whole directory is caught by Kafka's records: tests/integration.)
    # --fresh starts a new ledger explicitly, keeping the old run's files aside.
    engine = Engine(cfg, fresh=True)
    engine.run()
    assert engine.learner.step == 20
    before = accountant_from_dict(spent).ledger
    assert len(before) > 0 and len(engine.learner.accountant.ledger) == len(before), (
        "a new ledger, holding only the new run's charges"
    )
    assert list(ckpt.parent.glob("m.ckpt.created.abandoned-*"))


def test_a_kill_during_the_first_checkpoint_leaves_a_state_that_starts(tmp_path, monkeypatch):
    (tmp_path / "in.jsonl").write_bytes(b"\n".join(records(20)) + b"\n")
    cfg = config(tmp_path)
    state = StateDir(cfg.checkpoint.path)

    def killed(path, *args, **kwargs):  # what a SIGKILL in the middle of the write leaves
        Path(path).parent.joinpath(f".{Path(path).name}.x1y2z3.tmp").write_bytes(b"STREAMDP")
        raise Boom("killed during the first checkpoint")

    monkeypatch.setattr("stream_dp.engine.commit.save_checkpoint", killed)
    with pytest.raises(Boom):
        Engine(cfg).run()
    assert not state.marker.exists(), "no run marker without its checkpoint"
    monkeypatch.undo()
    stats = Engine(cfg).run()  # no --fresh needed
    assert stats.learned == 20
    assert not list(state.dir.glob(".*.tmp")), "leftovers of interrupted writes are removed"


_KILL_AT_FIRST_CHECKPOINT = """
import os, signal, sys, tempfile

real = tempfile.mkstemp


def mkstemp(*args, **kwargs):  # SIGKILL the moment the checkpoint's temporary file exists
    fd, name = real(*args, **kwargs)
    if kwargs.get("prefix") == ".m.ckpt.":
        os.kill(os.getpid(), signal.SIGKILL)
    return fd, name


tempfile.mkstemp = mkstemp
from stream_dp.cli import main

sys.exit(main(["run", "--config", sys.argv[1]]))
"""


def test_a_sigkill_at_the_first_checkpoints_temporary_file_with_the_journal_on(tmp_path):
    """Journal on: a new run opens its journal, then creates its first checkpoint's temporary
    file; a real SIGKILL at that file event leaves the journal (holding no charge) and the file.
    The next start begins the run cleanly, without --fresh, and learns everything once."""
    (tmp_path / "in.jsonl").write_bytes(b"\n".join(records(30)) + b"\n")
    cfg = with_checkpoint(config(tmp_path), ledger_journal=True)
    state = StateDir(cfg.checkpoint.path)
    env = {**os.environ, "STREAM_DP_NUMBA": "0"}
    killed = subprocess.run(
        [sys.executable, "-c", _KILL_AT_FIRST_CHECKPOINT, str(_toml(tmp_path, cfg))],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert state.journal.exists() and list(state.dir.glob(".m.ckpt.*.tmp"))
    assert not state.checkpoint.exists() and not state.marker.exists()
    done = subprocess.run(
        [sys.executable, "-m", "stream_dp.cli", "run", "--config", str(_toml(tmp_path, cfg))],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1])["learned"] == 30
    steps = [json.loads(line)["step"] for line in (tmp_path / "rel.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 31))
    assert list(state.dir.glob("m.ckpt.ledger.orphaned-*")), "the empty journal is kept aside"
    assert not list(state.dir.glob(".*.tmp"))
    stored = load_checkpoint(state.checkpoint).learner_state
    assert stored["t"] == 30 and OnPairStrC.ledger_state(stored)["kind"] == "journal:zcdp"


def test_a_checkpoint_from_another_run_is_refused(tmp_path):
    data = records(30)
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        run(config(tmp_path / name), data, Collect())
    one, two = (Path(config(tmp_path / n).checkpoint.path) for n in ("one", "two"))
    shutil.copy(two, one)
    with pytest.raises(StateError, match="another run"):
        run(config(tmp_path / "one"), data, Collect())


def test_a_checkpoint_older_than_what_was_published_is_refused(tmp_path):
    """Restoring a backup would re-learn published steps in another order: refused."""
    data = records(60)
    cfg = config(tmp_path)
    run(cfg, data, Collect(), max_records=20)
    backup = tmp_path / "backup.ckpt"
    shutil.copy(cfg.checkpoint.path, backup)
    run(cfg, data, Collect())
    shutil.copy(backup, cfg.checkpoint.path)
    with pytest.raises(StateError, match="older than what consumers have seen"):
        run(cfg, data, Collect())


def test_a_second_engine_on_the_same_state_directory_is_refused(tmp_path, capsys):
    (tmp_path / "in.jsonl").write_bytes(b"\n".join(records(20)) + b"\n")
    cfg = config(tmp_path)
    holder = StateDir(cfg.checkpoint.path)
    holder.acquire()
    try:
        with pytest.raises(StateError, match="in use by another stream-dp engine"):
            Engine(cfg).run()
        capsys.readouterr()
        assert cli_main(["run", "--config", str(_toml(tmp_path, cfg))]) == 3
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"pid {os.getpid()}" in err
    finally:
        holder.release()
    assert Engine(cfg).run().learned == 20


def test_state_errors_are_one_line_with_exit_code_3(tmp_path, capsys):
    (tmp_path / "in.jsonl").write_bytes(b"\n".join(records(20)) + b"\n")
    cfg = with_checkpoint(config(tmp_path), ledger_journal=True)
    Engine(cfg).run()
    journal = StateDir(cfg.checkpoint.path).journal
    journal.write_bytes(journal.read_bytes()[:-1] if journal.stat().st_size else b"junk")
    capsys.readouterr()
    toml = _toml(tmp_path, cfg)
    assert cli_main(["run", "--config", str(toml)]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    # An unusable state directory (a file where the directory should be).
    blocked = config(tmp_path / "x").model_copy()
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "state").write_text("not a directory")
    with pytest.raises(StateError, match="cannot use state directory"):
        Engine(blocked).run()


def test_a_refused_resume_names_the_parameters_that_changed(tmp_path, capsys):
    (tmp_path / "in.jsonl").write_bytes(b"\n".join(records(20)) + b"\n")
    cfg = config(tmp_path)
    Engine(cfg).run()
    changed = cfg.model_copy(
        update={"model": cfg.model.model_copy(update={"alpha": 2.0, "buffer": 32})}
    )
    capsys.readouterr()
    assert cli_main(["run", "--config", str(_toml(tmp_path, changed))]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "alpha: 1.0 -> 2.0" in err and "buffer: 16 -> 32" in err, err
    assert "release_every" not in err, "only what changed is named"


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
    run(cfg, data, out, max_records=33)
    ck = load_checkpoint(cfg.checkpoint.path)
    assert ck.learner_state["t"] == 33 and ck.positions == {"line": 33}
    run(cfg, data, out)
    steps = [json.loads(v)["step"] for _, v in out.items]
    assert steps == list(range(1, 61)), "a clean stop/resume neither repeats nor skips"


def test_status_carries_no_raw_statistics_unless_asked(tmp_path):
    (tmp_path / "in.jsonl").write_bytes(b"\n".join(records(50)) + b"\n")
    cfg = config(tmp_path)
    engine = Engine(cfg)
    engine.run()
    text = (tmp_path / "status.json").read_text()
    status = json.loads(text)
    penalty = engine.learner.regret.average_penalty
    assert "penalty" not in text and repr(penalty) not in text
    assert status["dp_metrics"] == {} and status["step"] == 50
    assert status["idle_since"] is None and status["broker_unreachable_since"] is None
    raw = tmp_path / "operator" / "raw.json"
    cfg2 = config(tmp_path / "b")
    cfg2 = cfg2.model_copy(
        update={"status": cfg2.status.model_copy(update={"operator_raw_metrics": str(raw)})}
    )
    (tmp_path / "b").mkdir()
    shutil.copy(tmp_path / "in.jsonl", tmp_path / "b" / "in.jsonl")
    engine = Engine(cfg2)
    engine.run()
    got = json.loads(raw.read_text())
    assert got["average_penalty"] == engine.learner.regret.average_penalty
    assert got["clipped_records"] == engine.learner.n_clipped  # the raw clip count: here only
    assert "clipped_records" not in json.loads((tmp_path / "b" / "status.json").read_text())
    assert got["private"] is False and oct(raw.stat().st_mode & 0o777) == "0o600"


def test_ledger_journal_survives_crashes_and_refuses_a_lost_journal(tmp_path, monkeypatch):
    """checkpoint.ledger_journal: sealed chunks go to <ckpt>.ledger; crashes replay identically.

    Chunks of 4 charges (instead of 8192) make every crash leave chunks sealed after the last
    checkpoint in the journal, which the restart must truncate and the replay re-charge.
    """
    from stream_dp.privacy.accountant import JournalError

    monkeypatch.setattr("stream_dp.privacy.ledger.CHUNK", 4)
    data = records(120, seed=4)
    (tmp_path / "ref").mkdir()
    reference = run(config(tmp_path / "ref"), data, Collect())

    cfg = with_checkpoint(config(tmp_path), ledger_journal=True)
    for crash_at in (25, 50, 90):
        with pytest.raises(Boom):
            Engine(cfg, source=CrashingSource(data, crash_at), releases=Collect().sink(),
                   dead_letters=Collect().sink()).run()  # fmt: skip
    engine = run(cfg, data, Collect())
    acc = engine.learner.accountant
    assert acc.ledger == reference.learner.accountant.ledger
    assert acc.rho_spent() == reference.learner.accountant.rho_spent()
    assert len(acc.storage.journal) == len(acc) // 4 >= 8
    stored = OnPairStrC.ledger_state(load_checkpoint(Path(cfg.checkpoint.path)).learner_state)
    assert stored["kind"] == "journal:zcdp" and stored["journal"]["path"] == "m.ckpt.ledger"
    assert len(stored["columns"]["step"]) < 4  # the open chunk only

    journal = Path(cfg.checkpoint.path).with_name("m.ckpt.ledger")
    blob = journal.read_bytes()
    journal.write_bytes(blob[:-1])  # a lost byte: charges the checkpoint counts are gone
    with pytest.raises(JournalError):
        run(cfg, data, Collect())
    fresh = run(cfg, data, Collect(), fresh=True)  # keeps the old journal aside, starts anew
    assert list(journal.parent.glob("m.ckpt.ledger.abandoned-*"))
    assert fresh.learner.accountant.ledger == reference.learner.accountant.ledger


def test_bad_state_files_are_clear_errors(tmp_path):
    (tmp_path / "in.jsonl").write_bytes(b"\n".join(records(20)) + b"\n")
    cfg = config(tmp_path)
    Engine(cfg).run()
    state = StateDir(cfg.checkpoint.path)
    state.lock_path.write_bytes(b"\x00garbage")  # a lock file's content is only informative
    state.published_path.write_text("not a record")  # unreadable: the cycle is published again
    assert Engine(cfg).run().learned == 20
    state.marker.write_text("{not json")
    with pytest.raises(StateError, match="cannot read the run marker"):
        Engine(cfg).run()


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_produce_and_watch_errors_are_one_line(capsys):
    import time

    closed = f"127.0.0.1:{_closed_port()}"
    cases = [
        (["produce", "--bootstrap", closed, "--dataset", "nope"], 2, "--dataset"),
        (["produce", "--bootstrap", closed, "--max-records", "5"], 4, "cannot reach Kafka"),
        (["watch", "--bootstrap", closed], 4, "cannot reach Kafka"),
        (["watch", "--bootstrap", closed, "--dataset", "nope"], 2, "unknown dataset"),
    ]
    for argv, code, text in cases:
        capsys.readouterr()
        start = time.monotonic()
        assert cli_main(argv) == code, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and text in err and "Traceback" not in err, (argv, err)
        assert time.monotonic() - start < patience(60)  # all four: 1.5 s at load 4.5
    # --debug: the traceback, for bug reports.
    with pytest.raises(ValueError, match="unknown dataset"):
        cli_main(["produce", "--bootstrap", closed, "--dataset", "nope", "--debug"])


def test_kafka_client_chatter_is_rate_limited():
    import logging

    from stream_dp.engine.cli import _KafkaChatter

    chatter = _KafkaChatter(every=60.0)

    def record(name: str, msg: str, at: float) -> logging.LogRecord:
        r = logging.LogRecord(name, logging.ERROR, __file__, 1, msg, None, None)
        r.created = at
        return r

    passed = [
        chatter.filter(record("kafka.net.manager", "Connection failed", t)) for t in (0, 1, 30, 61)
    ]
    assert passed == [True, False, False, True]
    assert chatter.filter(record("stream_dp.engine", "ours", 2))
    assert not chatter.filter(record("kafka.producer", "ProducerFencedError", 500))


# -- one parameter list: the [model] section is generated from the learner -------------------


@pytest.mark.parametrize("algorithm", ["OnPairStrC", "OnPairC", "OnPairMF"])
def test_the_model_section_is_the_learners_parameter_list(algorithm):
    """Each learner parameter is a config field with the learner's default, except the
    documented engine departures; a typo'd or foreign parameter is refused."""
    import inspect

    from stream_dp.engine.learners import learner_class, model_section

    section = model_section(algorithm)
    params = inspect.signature(learner_class(algorithm)).parameters
    engine_defaults = {"features": None, "seed": None, "reproducible": False}
    for name, p in params.items():
        if name in ("noise_source", "keep_history"):
            assert name not in section.model_fields  # objects / unbounded memory
            continue
        field = section.model_fields[name]
        if name == "buffer" and p.default == "all":
            assert field.default == 256  # bounded memory in a long-running process
        elif name in engine_defaults:
            assert field.default == engine_defaults[name]
        else:
            assert field.default == p.default, name
    assert set(section.model_fields) - set(params) == {"algorithm"}


def mf_config(tmp: Path, **model) -> EngineConfig:
    cfg = config(tmp).model_dump()
    m = {k: v for k, v in cfg["model"].items() if k in ("features", "seed", "reproducible")}
    cfg["model"] = {**m, "algorithm": "OnPairMF", "model_id": "mf", "epsilon": 2.0, **model}
    return EngineConfig.model_validate(cfg)


def test_onpairmf_runs_in_the_engine_one_charge_a_release_every_step(tmp_path):
    data = records(150, seed=4)
    out = Collect()
    engine = run(mf_config(tmp_path, horizon=150), data, out)
    rel = out.releases()
    assert [r["step"] for r in rel] == list(range(1, 151))
    assert {r["algorithm"] for r in rel} == {"OnPairMFAUC"}
    (charge,) = engine.learner.accountant.ledger  # one charge, before step 1
    rho = engine.learner.accountant.cost(charge)
    assert {r["rho_spent"] for r in rel} == {rho}
    assert engine.learner.budget.limit * (1 - 1e-8) <= rho <= engine.learner.budget.limit
    last = ReleaseMessage.from_json(out.items[-1][1])
    assert np.array_equal(last.weights_array(), engine.learner.private_weights)
    text = dry_run(mf_config(tmp_path, horizon=150))
    assert "gaussian-correlated" in text and "noise std of iterate t" in text


def test_onpairmf_crash_and_replay_publishes_each_release_once(tmp_path):
    data = records(120, seed=3)
    reference = Collect()
    (tmp_path / "ref").mkdir()
    run(mf_config(tmp_path / "ref", horizon=200), data, reference)
    cfg = mf_config(tmp_path, horizon=200)
    out = Collect()
    for crash_at in (25, 50, 90):
        with pytest.raises(Boom):
            Engine(cfg, source=CrashingSource(data, crash_at), releases=out.sink(),
                   dead_letters=Collect().sink()).run()  # fmt: skip
    engine = run(cfg, data, out)
    assert engine.learner.step == 120
    got = [without_wall_clock(r) for r in out.releases()]
    ref = [without_wall_clock(r) for r in reference.releases()]
    assert got == ref


def test_the_learners_own_refusals_are_config_errors(tmp_path):
    path = tmp_path / "e.toml"
    path.write_text(
        '[model]\nalgorithm = "OnPairMF"\nnoise = "nope"\nhorizon = 100\nfeatures = ["a"]\n'
        '[source]\nkind = "jsonl"\npath = "in.jsonl"\n[releases]\nkind = "stdout"\n'
        '[dead_letters]\nkind = "stdout"\n[checkpoint]\npath = "c"\n'
    )
    with pytest.raises(ConfigError, match="model: .*noise"):
        load_config(path)
    path.write_text(path.read_text().replace('noise = "nope"', "alpha = 1.0"))
    with pytest.raises(ConfigError, match="model.alpha: Extra inputs"):
        load_config(path)
    path.write_text(path.read_text().replace("alpha = 1.0", "epsilon = 0.0"))
    with pytest.raises(ConfigError, match="model.epsilon"):
        load_config(path)


def test_the_kafka_client_is_a_validated_choice(tmp_path, capsys, monkeypatch):
    import connectors.clients

    path = tmp_path / "e.toml"
    base = (
        '[model]\nfeatures = ["a"]\n[source]\nkind = "jsonl"\npath = "in.jsonl"\n'
        '[releases]\nkind = "stdout"\n[dead_letters]\nkind = "stdout"\n[checkpoint]\npath = "c"\n'
    )
    path.write_text(base)
    assert load_config(path).kafka.client == "kafka-python"
    path.write_text(base + '[kafka]\nclient = "librdkafka"\n')
    with pytest.raises(ConfigError, match="kafka.client"):
        load_config(path)
    # Chosen but not installed: exit code 2, one line naming the extra.
    path.write_text(base + '[kafka]\nclient = "confluent-kafka"\n')
    monkeypatch.setitem(sys.modules, "confluent_kafka", None)
    monkeypatch.setattr(connectors.clients, "_CLIENTS", {})
    capsys.readouterr()
    assert cli_main(["run", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "kafka.client" in err and "stream-dp[confluent]" in err


def _model_toml(tmp: Path, model: str) -> Path:
    path = tmp / "e.toml"
    path.write_text(
        f"[model]\n{model}\n"
        '[source]\nkind = "jsonl"\npath = "in.jsonl"\n[releases]\nkind = "stdout"\n'
        '[dead_letters]\nkind = "stdout"\n[checkpoint]\npath = "state/m.ckpt"\n'
    )
    return path


_METRIC_600 = 'task = "metric"\nfeatures = [' + ", ".join(f'"f{i}"' for i in range(600)) + "]"


@pytest.mark.parametrize(
    ("model", "says"),
    [
        # A number written as a string is refused, not converted (so is a bool for an int).
        ('epsilon = "4.0"', "model.epsilon: Input should be a valid number"),
        ('buffer = true\nalgorithm = "OnPairMF"\nhorizon = 100', "model.buffer: Input should"),
        # δ at most 1/n for a horizon of n records; without one, at most MAX_DELTA_UNBOUNDED.
        ("delta = 0.5", "delta = 0.5 is above 1e-05"),
        ("delta = 2e-4\nhorizon = 10000", "delta = 0.0002 is above 1/horizon = 0.0001"),
        ('algorithm = "OnPairMF"\ndelta = 0.02\nhorizon = 100', "above 1/horizon = 0.01"),
        # ε so large that σ vanishes (this was a ZeroDivisionError, rc 1) against the model ...
        ("epsilon = 1e300", "epsilon = 1e+300 is too large"),
        # ... or, for OnPairMF, against the gradient stream its noise is added to ...
        ('algorithm = "OnPairMF"\nepsilon = 1e300\nhorizon = 100', "against a gradient stream"),
        # ... or a finite ρ whose noise is below the rounding of a model of norm D.
        ('epsilon = 1e31\nconversion = "paper"', "would vanish in rounding"),
        # A metric model whose step costs more than MAX_METRIC_WORK.
        (_METRIC_600 + "\nbuffer = 256", "d = 600 features pairing each record with B = 256"),
        ('task = "metric"\nbuffer = "all"', "grows without bound"),
    ],
)
def test_config_values_the_engine_cannot_run_are_refused_in_one_line(tmp_path, capsys, model, says):
    features = "" if "features" in model else '\nfeatures = ["a", "b"]'
    alpha = "" if "OnPairMF" in model else "\nalpha = 1.0"
    path = _model_toml(tmp_path, model + features + alpha)
    capsys.readouterr()
    assert cli_main(["run", "--config", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err
    assert "Traceback" not in err and not (tmp_path / "state").exists()


def test_what_the_bounds_admit_is_accepted(tmp_path):
    """The refusals above are bounds, not blanket bans: δ = 1/n, a large but representable ε,
    and a metric model of 400 features with the default buffer all load."""
    for model in (
        "delta = 1e-4\nhorizon = 10000",
        "epsilon = 1e6",
        'task = "metric"\nfeatures = [' + ", ".join(f'"f{i}"' for i in range(400)) + "]",
    ):
        features = "" if "features" in model else '\nfeatures = ["a", "b"]'
        load_config(_model_toml(tmp_path, model + features + "\nalpha = 1.0"))


@pytest.mark.parametrize("name", ["engine.example.toml", "engine.onpairmf.toml"])
def test_the_deployed_example_configs_are_valid(name):
    path = Path(__file__).resolve().parents[1] / "deploy" / name
    cfg = load_config(path)
    text = dry_run(cfg)
    assert cfg.model.algorithm in text and "release message: at most" in text


# -- stop requests: SIGINT and SIGTERM ---------------------------------------------------------


def _engine_process(tmp: Path, model: dict, n: int, d: int) -> tuple[subprocess.Popen, Path]:
    """``stream-dp run`` (NumPy path) on ``n`` records of ``d`` features, started and learning."""
    rng = np.random.default_rng(1)
    names = [f"f{i}" for i in range(d)]
    with open(tmp / "in.jsonl", "w") as f:
        for i in range(n):
            x = rng.normal(size=d) / np.sqrt(d)
            f.write(json.dumps({"x": dict(zip(names, x.tolist(), strict=True)), "y": i % 3 == 0}))
            f.write("\n")
    cfg = EngineConfig.model_validate(
        {
            "model": {"alpha": 1.0, "features": names, "model_id": "stop", **model},
            "source": {"kind": "jsonl", "path": str(tmp / "in.jsonl")},
            "releases": {"kind": "jsonl", "path": str(tmp / "rel.jsonl")},
            "dead_letters": {"kind": "jsonl", "path": str(tmp / "dead.jsonl")},
            "checkpoint": {"path": str(tmp / "state" / "m.ckpt")},
            "status": {"interval_seconds": 0.2},
        }
    )
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "STREAM_DP_NUMBA": "0"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "stream_dp.cli", "run", "--config", str(_toml(tmp, cfg))],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    return proc, Path(cfg.checkpoint.path)


def _until(proc: subprocess.Popen, text: str) -> list[str]:
    """The engine's log lines up to the first that holds ``text``."""
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if text in line:
            return lines
    pytest.fail(f"the engine ended before {text!r}: {''.join(lines)[-2000:]}")


def _interrupt(proc: subprocess.Popen) -> tuple[float, str, str]:
    start = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=patience(120))  # bounds a hang; 1.6 s measured
    return time.monotonic() - start, out, err


def test_sigint_commits_and_exits(tmp_path):
    """Ctrl-C while learning: the batch in hand is learned, checkpointed and published.

    Measured from SIGINT to the process's end: 1.0-1.6 s on 2 cores at load average 8-12;
    the bound is 5 times the slowest of those.
    """
    proc, checkpoint = _engine_process(tmp_path, {"buffer": 16, "release_every": 1}, 200_000, 3)
    try:
        _until(proc, "step=")
        took, out, err = _interrupt(proc)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert took < patience(8.0), f"SIGINT took {took:.1f} s"
    done = json.loads(out.splitlines()[-1])
    assert 0 < done["learned"] < 200_000
    held = load_checkpoint(checkpoint)
    assert held.learner_state["t"] == done["learned"]
    assert held.positions == {"line": done["records"]}
    published = (tmp_path / "rel.jsonl").read_text().splitlines()
    steps = [json.loads(line)["step"] for line in published]
    assert steps == list(range(1, done["learned"] + 1)), "everything learned is published once"


def test_sigint_does_not_wait_for_a_busy_learner(tmp_path, caplog):
    """A learner busy for longer than the stop's grace (numba compiling its kernels on a first
    start, a slow metric step) is not waited for: the run ends where it is, as a crash would,
    without a last checkpoint, and the next start resumes from the one before.

    Measured from SIGINT to run()'s return: the 3 s grace plus 0.015-0.03 s on 2 cores at load
    average 7-9; the bound is 5 times that.
    """
    import threading

    (tmp_path / "in.jsonl").write_bytes(b"\n".join(records(50)) + b"\n")
    cfg = config(tmp_path)
    engine = Engine(cfg)
    busy = threading.Event()

    def learn_for_ever(x, y):
        busy.set()
        while True:
            time.sleep(0.01)  # stands for a long computation: only a stop ends it

    engine.learner.learn_one = learn_for_ever
    took: list[float] = []

    def interrupt() -> None:
        busy.wait(patience(60))  # the engine is learning (or, failing that, the test ends anyway)
        took.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    before = signal.getsignal(signal.SIGINT)
    threading.Thread(target=interrupt, daemon=True).start()
    with caplog.at_level("WARNING", logger="stream_dp.engine"):
        stats = engine.run()
    took.append(time.monotonic())
    assert SIGNAL_GRACE_SECONDS <= took[1] - took[0] < patience(5 * (SIGNAL_GRACE_SECONDS + 0.03))
    assert "stopped without a last checkpoint" in caplog.text
    assert signal.getsignal(signal.SIGINT) is before
    assert stats.records == 0
    held = load_checkpoint(cfg.checkpoint.path)
    assert held.learner_state["t"] == 0 and held.positions == {"line": 0}
    out = Collect()
    assert run(cfg, [], out).learner.step == 0, "the next start resumes"


def test_the_engine_learner_warns_when_declared_features_never_arrive(tmp_path):
    """The engine drops unknown features before the learner sees them, and still the learner
    says which declared ones never came (here ``c``: the producer sends ``c_red``/``c_blue``)."""
    rng = np.random.default_rng(3)
    data = [
        json.dumps({"x": {"a": float(rng.normal()), "b": 0.1, f"c_{i % 2}": 1.0}, "y": i % 2})
        for i in range(150)
    ]
    (tmp_path / "in.jsonl").write_text("\n".join(data) + "\n")
    with pytest.warns(UserWarning, match=r"declared feature\(s\) never arrived .*\('c'\)"):
        stats = Engine(config(tmp_path)).run()
    assert stats.learned == 150 and stats.records_with_unknown_features == 150


def test_a_slow_learner_still_ends_a_cycle_about_every_every_seconds(tmp_path, monkeypatch):
    """A poll batch never runs far past the cycle's ``every_seconds`` without a checkpoint.

    A metric model of 240 features took 0.4-3.6 s a record, and one poll of 201 records ran
    300 s with no checkpoint, status or release: a kill then lost all of it. The engine sizes
    each poll to the learner's measured cost per record instead. Time here is a fake clock that
    the learner advances by one second a record, so the test measures nothing on this machine.
    """
    import functools

    from stream_dp.engine import commit, runner

    now = [0.0]
    monkeypatch.setattr(
        runner, "CommitCycle", functools.partial(commit.CommitCycle, clock=lambda: now[0])
    )
    checkpoints: list[float] = []
    write = commit.CommitCycle.checkpoint

    def checkpoint(self, positions):
        checkpoints.append(now[0])
        return write(self, positions)

    monkeypatch.setattr(commit.CommitCycle, "checkpoint", checkpoint)
    (tmp_path / "in.jsonl").write_bytes(b"\n".join(records(60)) + b"\n")
    cfg = with_checkpoint(config(tmp_path), every_records=5000, every_seconds=5.0)
    engine = Engine(cfg)
    learn = engine.learner.learn_one

    def slow_learn(x, y):
        now[0] += 1.0  # one second of learning per record, on the fake clock
        learn(x, y)

    engine.learner.learn_one = slow_learn
    stats = engine.run()
    assert stats.learned == 60
    gaps = np.diff([0.0, *checkpoints])
    # A cycle ends after the batch in which its time is up; a batch is sized to half the time
    # left, so at most one record (one fake second) runs past every_seconds.
    assert len(checkpoints) >= 60 / 6 and gaps.max() <= 5.0 + 1.0, gaps.tolist()
    held = load_checkpoint(cfg.checkpoint.path)
    assert held.learner_state["t"] == 60 and held.positions == {"line": 60}


def test_a_run_takes_its_start_up_out_of_the_full_gc_passes(tmp_path):
    """After start-up, the engine freezes what the process holds (gc.freeze: imports, kernels,
    clients), once per process; in a fresh process nothing is frozen before its run."""
    (tmp_path / "in.jsonl").write_bytes(b"\n".join(records(30)) + b"\n")
    cfg_file = tmp_path / "cfg.json"
    cfg_file.write_text(config(tmp_path).model_dump_json())
    code = (
        "import gc, sys\n"
        "from stream_dp.engine import Engine, EngineConfig\n"
        "cfg = EngineConfig.model_validate_json(open(sys.argv[1]).read())\n"
        "before = gc.get_freeze_count()\n"
        "Engine(cfg).run()\n"
        "after = gc.get_freeze_count()\n"
        "Engine(cfg).run()\n"
        "print(before, after > 0, gc.get_freeze_count() == after)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(cfg_file)], capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["0", "True", "True"], out.stderr[-2000:]

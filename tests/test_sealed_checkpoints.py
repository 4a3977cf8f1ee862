"""Checkpoints of a learner whose secret comes from a master are sealed, on disk and in transit.

An engine run with a derived secret (per-partition scale-out, here without Kafka) writes
checkpoints that show nothing of what they hold -- buffered records, dead letters, the
un-noised iterate, OnPairMF's correlated-noise state, the secret's fingerprint -- to a reader
without the master; the same bytes go to the checkpoint topic (tested against a real broker in
tests/integration/test_scaleout_kafka.py). A checkpoint written before sealing is read once
and sealed in place; one from the topic must be sealed.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from test_engine import Collect, CrashingSource, records, run, without_wall_clock

from stream_dp.checkpoint import (
    CheckpointKeyMismatch,
    CheckpointMismatch,
    load_checkpoint,
    save_checkpoint,
    write_private,
)
from stream_dp.engine import Engine, EngineConfig
from stream_dp.engine.master_secret import (
    checkpoint_key,
    open_checkpoint,
    partition_secret,
    secret_fingerprint,
)

MASTER = int("3b0d8c4f1e97a26d5c08fe41b7a9362e", 16)
MODEL = "bank/p0"
CANARY = "canary-7319-raw-payload"


def mf_config(tmp: Path, every_records: int = 1000) -> EngineConfig:
    cfg = EngineConfig.model_validate(
        {
            "model": {"algorithm": "OnPairMF", "buffer": 16, "features": ["a", "b", "c"]},
            "source": {"kind": "jsonl", "path": str(tmp / "in.jsonl")},
            "releases": {"kind": "jsonl", "path": str(tmp / "rel.jsonl")},
            "dead_letters": {"kind": "jsonl", "path": str(tmp / "dead.jsonl")},
            "checkpoint": {"path": str(tmp / "state" / "m.ckpt"), "every_records": every_records},
        }
    )
    # Partition model ids are generated (``<model>/p<k>``), never typed into a config.
    return cfg.model_copy(update={"model": cfg.model.model_copy(update={"model_id": MODEL})})


def _floats(*arrays) -> list[bytes]:
    """The float64 bytes of every value (as the NPZ payload stores them)."""
    return [np.float64(v).tobytes() for a in arrays for v in np.ravel(a)]


def test_a_sealed_checkpoint_shows_no_record_no_noise_state_no_model(tmp_path):
    data = records(50, seed=3)
    data.insert(25, json.dumps({"x": {"a": CANARY}, "y": 1}).encode())  # a dead letter
    secret = partition_secret(MASTER, MODEL)
    cfg = mf_config(tmp_path)  # one cycle: its checkpoint holds the whole outbox
    run(cfg, data, Collect(), secret=secret)
    raw = Path(cfg.checkpoint.path).read_bytes()
    c = load_checkpoint(cfg.checkpoint.path, model_id=MODEL, seal_key=checkpoint_key(secret, MODEL))
    state, mech = c.learner_state, c.learner_state["mechanism"]
    assert c.sealed and state["t"] == 50 and state["secret"] is None
    noise_state = mech["noise"]["buffers"]
    assert noise_state.shape[1] == 3 and np.abs(noise_state).sum() > 0
    needles = {
        "buffered records": _floats(state["buffer"]["X"]),
        "the un-noised iterate": _floats(state["w"], mech["average"]),
        "the noise state": _floats(noise_state),
        "a dead letter": [CANARY.encode()],
        "the fingerprint": [secret_fingerprint(secret).encode(), b"secret_fingerprint"],
    }
    # The control: the checkpoint inside the envelope holds each of them.
    plain = tmp_path / "plain.ckpt"
    save_checkpoint(plain, state, c.positions, c.meta)
    inside = plain.read_bytes()
    for what, found in needles.items():
        assert all(n in inside for n in found), f"the control misses {what}"
        assert not [n for n in found if n in raw], f"the sealed checkpoint shows {what}"


def test_a_checkpoint_sealed_under_another_master_is_refused_and_left_intact(tmp_path):
    cfg, data = mf_config(tmp_path, every_records=7), records(30, seed=6)
    run(cfg, data, Collect(), secret=partition_secret(MASTER, MODEL))
    before = Path(cfg.checkpoint.path).read_bytes()
    with pytest.raises(CheckpointKeyMismatch, match="another master secret"):
        run(cfg, data, Collect(), secret=partition_secret(MASTER ^ 1, MODEL))
    assert Path(cfg.checkpoint.path).read_bytes() == before


def _unseal_in_place(path: Path, secret: int) -> None:
    """Turn a sealed checkpoint into what an older stream_dp wrote: the same, unsealed."""
    from stream_dp.sealing import open_sealed

    write_private(path, open_sealed(checkpoint_key(secret, MODEL), MODEL, path.read_bytes()))


def test_an_unsealed_checkpoint_of_an_older_version_is_read_once_and_sealed(tmp_path, caplog):
    """Crash, then downgrade the checkpoint to the unsealed format: the resume accepts it once
    (its fingerprint matches), seals it, and publishes exactly an uninterrupted run's stream."""
    data, secret = records(80, seed=5), partition_secret(MASTER, MODEL)
    (tmp_path / "ref").mkdir()
    reference = Collect()
    run(mf_config(tmp_path / "ref", every_records=7), data, reference, secret=secret)

    cfg, out = mf_config(tmp_path, every_records=7), Collect()
    with pytest.raises(Exception, match="simulated crash"):
        Engine(cfg, source=CrashingSource(data, 40), releases=out.sink(),
               dead_letters=Collect().sink(), secret=secret).run()  # fmt: skip
    path = Path(cfg.checkpoint.path)
    _unseal_in_place(path, secret)
    assert not load_checkpoint(path).sealed

    # Another master: refused, and the file stays as it was for its rightful owner.
    unsealed = path.read_bytes()
    with pytest.raises(CheckpointKeyMismatch, match="another master secret"):
        run(cfg, data, Collect(), secret=partition_secret(MASTER ^ 1, MODEL))
    assert path.read_bytes() == unsealed

    with caplog.at_level(logging.WARNING, logger="stream_dp.engine"):
        engine = run(cfg, data, out, secret=secret)
    assert "was not sealed" in caplog.text
    assert engine.learner.step == 80
    assert load_checkpoint(path, seal_key=checkpoint_key(secret, MODEL)).sealed
    got = [without_wall_clock(r) for r in out.releases()]
    assert got == [without_wall_clock(r) for r in reference.releases()]


def test_an_unsealed_checkpoint_from_the_topic_is_refused(tmp_path):
    """Anyone who can write to the checkpoint topic could put an unsealed checkpoint there
    (with a ledger of their choosing): it is never accepted from the topic."""
    cfg, secret = mf_config(tmp_path, every_records=7), partition_secret(MASTER, MODEL)
    run(cfg, records(20, seed=1), Collect(), secret=secret)
    path = Path(cfg.checkpoint.path)
    _unseal_in_place(path, secret)
    with pytest.raises(CheckpointMismatch, match="is not sealed"):
        open_checkpoint(path, secret, model_id=MODEL, from_topic=True)
    assert not load_checkpoint(path).sealed, "nothing was sealed on the way"
    assert not open_checkpoint(path, secret, model_id=MODEL).sealed  # the local, one-time path
    assert load_checkpoint(path, seal_key=checkpoint_key(secret, MODEL)).sealed

"""Per-partition scale-out without Kafka: master secret, derived secrets, partition configs,
composition across partitions. The group protocol, rebalances and SIGKILLs are exercised
against a real broker in tests/integration/test_scaleout_kafka.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_engine import Collect, CrashingSource, records, run, without_wall_clock

from stream_dp.checkpoint import CheckpointKeyMismatch, load_checkpoint
from stream_dp.cli import main as cli_main
from stream_dp.engine import Engine, EngineConfig
from stream_dp.engine.master_secret import (
    MasterSecretError,
    checkpoint_key,
    load_master_secret,
    partition_secret,
    secret_fingerprint,
)
from stream_dp.engine.scaleout import composition, partition_config
from stream_dp.online.base import PairwiseLearner
from stream_dp.privacy.secrets import derive_secret

MASTER = int("7f" * 32, 16)
# Masters that pass the weakness test (16 and 20 bytes from secrets.token_hex).
GOOD_16 = "3b0d8c4f1e97a26d5c08fe41b7a9362e"
GOOD_20 = "9f41c07e2ab85d36e1f4097bc25a8d63f0e71b4c"


def file_config(tmp: Path, model_id: str = "bank/p0") -> EngineConfig:
    cfg = EngineConfig.model_validate(
        {
            "model": {"alpha": 1.0, "buffer": 16, "features": ["a", "b", "c"]},
            "source": {"kind": "jsonl", "path": str(tmp / "in.jsonl")},
            "releases": {"kind": "jsonl", "path": str(tmp / "rel.jsonl")},
            "dead_letters": {"kind": "jsonl", "path": str(tmp / "dead.jsonl")},
            "checkpoint": {"path": str(tmp / "state" / "m.ckpt"), "every_records": 7},
        }
    )
    # Partition model ids are generated (``<model>/p<k>``), never typed into a config.
    return cfg.model_copy(update={"model": cfg.model.model_copy(update={"model_id": model_id})})


def kafka_config(tmp: Path, **scale) -> dict:
    return {
        "model": {"features": ["a"], "model_id": "bank"},
        "source": {
            "kind": "kafka",
            "topic": "t",
            "bootstrap_servers": "127.0.0.1:1",
            "group_id": "g",
        },  # fmt: skip
        "releases": {"kind": "kafka", "topic": "r", "bootstrap_servers": "127.0.0.1:1"},
        "dead_letters": {"kind": "stdout"},
        "checkpoint": {"path": str(tmp / "state" / "m.ckpt")},
        "scale": {"mode": "per-partition", **scale},
    }


def write_toml(path: Path, cfg: dict) -> None:
    lines = []
    for section, body in cfg.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in body.items()]
    path.write_text("\n".join(lines) + "\n")


def test_partition_secrets_are_keyed_derivations_of_the_master():
    a, b = partition_secret(MASTER, "bank/p0"), partition_secret(MASTER, "bank/p1")
    assert a == derive_secret(MASTER, "bank/p0") and a != b
    assert a.bit_length() > 64 and a != partition_secret(MASTER ^ 1, "bank/p0")
    assert secret_fingerprint(a) != secret_fingerprint(b)
    assert str(a) not in secret_fingerprint(a) and format(a, "x") not in secret_fingerprint(a)


def test_the_master_secret_comes_from_a_file_or_the_environment(tmp_path, monkeypatch):
    f = tmp_path / "master"
    f.write_text(GOOD_16 + "\n")
    assert load_master_secret(f, "UNSET_VARIABLE_FOR_TEST") == int(GOOD_16, 16)
    monkeypatch.setenv("H8_TEST_MASTER", GOOD_20)
    assert load_master_secret(None, "H8_TEST_MASTER") == int(GOOD_20, 16)
    for bad in (GOOD_16[:30], "zz" * 16, ""):
        monkeypatch.setenv("H8_TEST_MASTER", bad)
        with pytest.raises(MasterSecretError):
            load_master_secret(None, "H8_TEST_MASTER")
    with pytest.raises(MasterSecretError, match="cannot read"):
        load_master_secret(tmp_path / "missing", "H8_TEST_MASTER")


def test_per_partition_mode_refuses_to_start_without_a_master_secret(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("STREAM_DP_MASTER_SECRET", raising=False)
    path = tmp_path / "e.toml"
    write_toml(path, kafka_config(tmp_path))
    assert cli_main(["run", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs a master secret" in err[0], err


def test_an_unreachable_bootstrap_is_rc_4_in_one_line(tmp_path, monkeypatch, capsys):
    """The single engine's start-up checks run before the instance joins the group."""
    monkeypatch.setenv("STREAM_DP_MASTER_SECRET", GOOD_16)
    cfg = kafka_config(tmp_path)
    cfg["kafka"] = {"startup_timeout_seconds": 2.0}
    path = tmp_path / "e.toml"
    write_toml(path, cfg)
    assert cli_main(["run", "--config", str(path)]) == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "127.0.0.1:1" in err[0] and "Traceback" not in err[0], err
    assert not (tmp_path / "state").exists(), "nothing started"


def test_a_take_over_retracts_the_dead_instances_claim_in_its_status_file(tmp_path):
    """Instance A was killed holding partitions 0 and 1; B takes 1 over: A's status file no
    longer names 1 as held, and says who took it."""
    from stream_dp.engine.scaleout import ScaleOut

    cfg = kafka_config(tmp_path)
    cfg["status"] = {"file": str(tmp_path / "status.json")}
    b = ScaleOut(EngineConfig.model_validate(cfg), master_secret=int(GOOD_16, 16), instance="B")
    a_file = tmp_path / "status.A.json"
    claim = {"partition": 0, "owner": "A", "heartbeat": 1.0}
    a_file.write_text(json.dumps({
        "model_id": "bank", "instance": "A", "partitions": [0, 1],
        "by_partition": {"0": claim, "1": {**claim, "partition": 1}},
    }))  # fmt: skip
    other_model = tmp_path / "status.C.json"
    other_model.write_text(json.dumps({"model_id": "other", "partitions": [1]}))
    b._retract_claims([1])
    a = json.loads(a_file.read_text())
    assert a["partitions"] == [0] and list(a["by_partition"]) == ["0"]
    assert a["taken_over"]["1"]["by"] == "B" and a["taken_over"]["1"]["at"] > 1.0
    assert json.loads(other_model.read_text())["partitions"] == [1], "another model's file"


def test_per_partition_mode_needs_kafka_on_both_sides(tmp_path):
    cfg = kafka_config(tmp_path)
    cfg["releases"] = {"kind": "stdout"}
    with pytest.raises(ValueError, match="per-partition"):
        EngineConfig.model_validate(cfg)


def test_a_partition_learner_has_its_own_model_id_state_and_transactional_id(tmp_path):
    cfg = EngineConfig.model_validate(kafka_config(tmp_path))
    p = [partition_config(cfg, k) for k in range(3)]
    assert [c.model.model_id for c in p] == ["bank/p0", "bank/p1", "bank/p2"]
    assert len({c.checkpoint.path for c in p}) == 3 and len({c.transactional_id for c in p}) == 3
    assert all(c.status.file is None for c in p)


def test_composition_is_the_max_only_when_keyed_by_the_privacy_unit():
    rho = {0: 0.05, 1: 0.1, 2: 0.02}
    keyed, unkeyed = composition(rho, True), composition(rho, False)
    assert keyed["rho"] == 0.1 and unkeyed["rho"] == pytest.approx(0.17)
    assert keyed["rho_sum"] == unkeyed["rho_sum"] and "parallel" in keyed["composition"]
    assert "sum" in unkeyed["composition"]


def test_a_derived_secret_is_never_in_the_checkpoint_and_resumes_identically(tmp_path):
    """With a secret handed in, the checkpoint is sealed and never holds it; a crash and resume
    under the same master re-derives it and publishes exactly an uninterrupted run's stream."""
    data = records(80, seed=5)
    secret = partition_secret(MASTER, "bank/p0")
    (tmp_path / "ref").mkdir()
    reference = Collect()
    run(file_config(tmp_path / "ref"), data, reference, secret=secret)

    cfg, out = file_config(tmp_path), Collect()
    with pytest.raises(Exception, match="simulated crash"):
        Engine(cfg, source=CrashingSource(data, 40), releases=out.sink(),
               dead_letters=Collect().sink(), secret=secret).run()  # fmt: skip
    key = checkpoint_key(secret, "bank/p0")
    ckpt = load_checkpoint(cfg.checkpoint.path, model_id="bank/p0", seal_key=key)
    assert ckpt.sealed and ckpt.learner_state["secret"] is None
    assert ckpt.meta["secret_fingerprint"] == secret_fingerprint(secret)
    assert str(secret).encode() not in Path(cfg.checkpoint.path).read_bytes()
    engine = run(cfg, data, out, secret=secret)
    assert engine.learner.step == 80
    got = [without_wall_clock(r) for r in out.releases()]
    assert got == [without_wall_clock(r) for r in reference.releases()]
    assert all(r["private"] for r in out.releases())


def test_a_checkpoint_written_under_another_master_is_refused(tmp_path):
    cfg, data = file_config(tmp_path), records(30, seed=6)
    run(cfg, data, Collect(), secret=partition_secret(MASTER, "bank/p0"))
    with pytest.raises(CheckpointKeyMismatch, match="another master secret"):
        run(cfg, data, Collect(), secret=partition_secret(MASTER ^ 1, "bank/p0"))


@pytest.mark.parametrize("keyed", [True, False])
def test_dry_run_prints_both_compositions_and_says_which_holds(tmp_path, keyed):
    from stream_dp.engine.cli import dry_run
    from stream_dp.privacy.conversions import epsilon_from_rho

    cfg = EngineConfig.model_validate(kafka_config(tmp_path, privacy_unit_key=keyed))
    text = dry_run(cfg)
    parallel = next(line for line in text.splitlines() if "parallel composition" in line)
    total = next(line for line in text.splitlines() if "sum over K" in line)
    assert ("<- holds" in parallel) == keyed and ("<- holds" in total) != keyed
    rho = Engine(partition_config(cfg, 0), secret=1).learner.budget.limit
    four = next(line for line in text.splitlines() if "K=4 " in line)
    conversion = cfg.model.conversion  # the learner's accountant: "exact" for Gaussian ledgers
    assert f"{epsilon_from_rho(4 * rho, 1e-5, conversion):.4g}" in four
    assert float(four.split("ε=")[1]) > cfg.model.epsilon


def test_a_poll_waits_briefly_while_no_partition_is_held(tmp_path):
    """Holding no partition, the loop polls briefly: confluent-kafka serves the group's
    assignment inside a poll without ending it, so a 500 ms poll held every start and take-over
    back by up to half a second (0.42 s measured at start-up). Holding partitions, a poll may
    wait for records as before."""
    from stream_dp.engine.scaleout import ScaleOut

    asked = []

    class Consumer:
        def poll(self, timeout_ms: int, max_records: int) -> dict:
            asked.append(timeout_ms)
            return {}

    so = ScaleOut(
        EngineConfig.model_validate(kafka_config(tmp_path)), master_secret=int(GOOD_16, 16)
    )
    so._consumer = Consumer()
    so._poll(10)
    so.engines[0] = object()  # a held partition (the poll only asks whether there is one)
    so._poll(10)
    assert asked[0] <= 100 and asked[1] == 500, asked


def test_an_instance_loads_its_kernels_before_it_joins_its_group(tmp_path, monkeypatch):
    """The first compiled step (a compile of about a minute of CPU after an install or upgrade)
    comes before the instance subscribes, not inside the group's poll loop, where it could
    hold a poll past max.poll.interval.ms."""
    from stream_dp.engine import scaleout

    calls: list[str] = []

    class Joined(Exception):
        pass

    def join(self) -> None:
        calls.append("join")
        raise Joined

    monkeypatch.setattr(scaleout.ScaleOut, "_check_kafka", lambda self: calls.append("check"))
    monkeypatch.setattr(scaleout.ScaleOut, "_ensure_topics", lambda self: None)
    monkeypatch.setattr(scaleout, "load_kernels", lambda cfg: calls.append("kernels") or 0.0)
    monkeypatch.setattr(scaleout.ScaleOut, "_open_consumer", join)
    so = scaleout.ScaleOut(
        EngineConfig.model_validate(kafka_config(tmp_path)), master_secret=int(GOOD_16, 16)
    )
    with pytest.raises(Joined):
        so.run()
    assert calls == ["check", "kernels", "join"]


@pytest.mark.parametrize(
    "model",
    [
        {"alpha": 1.0, "buffer": 8, "release_every": 1},
        {"task": "metric", "buffer": 8, "release_every": 5},
        {"algorithm": "OnPairMF", "horizon": 1_000},
        {"buffer": 8, "unit_key": "person", "max_events_per_unit": 2},
    ],
    ids=["auc", "metric", "onpairmf", "units"],
)
def test_loading_the_kernels_takes_compiled_steps_and_leaves_nothing(tmp_path, monkeypatch, model):
    """load_kernels steps a throwaway copy of the model past its warm-up on made-up records,
    through the engine's per-record path and then a batch, as the engine learns a poll (every
    record learned, compiled steps and releases made; the batch learned as one where the model
    allows it), and writes nothing: no checkpoint, no ledger journal, no release."""
    from stream_dp.engine import kernels

    monkeypatch.chdir(tmp_path)
    cfg = EngineConfig.model_validate(
        {**kafka_config(tmp_path), "model": {**model, "features": ["a", "b", "c"]}}
    )
    seen: list = []
    inside: list = []
    handle, handle_batch = kernels.Learning.handle, kernels.Learning.handle_batch

    def spy(self, value, position=None, key=None):
        done = handle(self, value, position, key)
        if not inside:  # handle_batch's own calls are counted with its results
            seen.append((self, done))
        return done

    def spy_batch(self, messages):
        inside.append(True)
        try:
            out = handle_batch(self, messages)
        finally:
            inside.pop()
        seen.extend((self, done) for done in out)
        return out

    monkeypatch.setattr(kernels.Learning, "handle", spy)
    monkeypatch.setattr(kernels.Learning, "handle_batch", spy_batch)
    kept: list = []
    learn_many_kept = PairwiseLearner.learn_many_kept

    def spy_kept(self, X, y):
        kept.append(learn_many_kept(self, X, y))
        return kept[-1]

    monkeypatch.setattr(PairwiseLearner, "learn_many_kept", spy_kept)
    kernels.load_kernels(cfg)
    learning = seen[0][0]
    learner = learning.learner
    outcomes = {done.outcome.value for _, done in seen}
    assert outcomes <= {"learned", "released"} and "released" in outcomes, outcomes
    assert learner.step == len(seen) > getattr(learner, "T1", 0) + kernels.COMPILED_STEPS
    if learning._batched:  # the batch ran learn_many's compiled steps
        assert [k.learned for k in kept] == [kernels.COMPILED_STEPS]
    assert list(tmp_path.iterdir()) == [], "the throwaway learner wrote something"


def test_a_partition_left_without_a_position_is_said_once_not_swallowed(tmp_path, caplog):
    """A gained partition has no position until its learner seeks it, and a poll meanwhile
    raises NoOffsetForPartitionError, which the loop rides out. Poll after poll, the partition
    would be read by no one: a warning says so once, and a good poll resets the count."""
    from kafka.errors import NoOffsetForPartitionError

    from stream_dp.engine.scaleout import NO_OFFSET_WARN_POLLS, ScaleOut

    results: list = []

    class Consumer:
        def poll(self, timeout_ms: int, max_records: int) -> dict:
            result = results.pop(0)
            if isinstance(result, Exception):
                raise result
            return result

    so = ScaleOut(
        EngineConfig.model_validate(kafka_config(tmp_path)), master_secret=int(GOOD_16, 16)
    )
    so._consumer = Consumer()
    missing = NoOffsetForPartitionError("t-3")
    below = [missing] * (NO_OFFSET_WARN_POLLS - 1)

    def said(polls: list) -> list[str]:
        results[:] = polls
        caplog.clear()
        with caplog.at_level("WARNING", logger="stream_dp.engine"):
            for _ in range(len(polls)):
                assert so._poll(10) == {}
        return [r.getMessage() for r in caplog.records if "without a position" in r.getMessage()]

    assert said(below + [{}] + below) == []  # a good poll in between: two short runs
    warned = said([missing] * 6)  # the second run goes on past the threshold
    assert len(warned) == 1 and "t-3" in warned[0] and f"{NO_OFFSET_WARN_POLLS} polls" in warned[0]

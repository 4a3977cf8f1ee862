"""The engine end to end against a real Apache Kafka broker: outages and second instances.

Split from test_engine_kafka.py so that the suite's workers (whole files each) share the long
Kafka scenarios. What must hold: a broker outage is waited out (or ends in a clean stop at a
configured deadline); a second instance of a model never learns beside the first, even when
both start at the same moment; a lost state directory is refused.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from conftest import patience
from kafka import TopicPartition

from connectors import ReleaseMessage
from stream_dp.engine import Engine
from stream_dp.engine.config import EngineConfig
from stream_dp.engine.errors import KafkaUnavailable

from .kafka_broker import KafkaBroker
from .test_engine_kafka import (
    ENGINE_CATCHES_UP,
    ENGINE_EXITS,
    ENGINE_FINISHES,
    FEATURES,
    IDLE_END,
    _cli,
    _last_line,
    _ledger,
    _start_engine,
    _status,
    _wait_for,
    _write_toml,
    check_release_stream,
    copies_by_step,
    create_topic,
    engine_config,
    names_for,
    parse_releases,
    produce,
    read_all,
    valid_record,
    with_input,
)

pytestmark = pytest.mark.kafka


@pytest.mark.scenario
def test_broker_restart_mid_run(kafka_broker: KafkaBroker, unique_name, tmp_path, kafka_client):
    bootstrap = kafka_broker.bootstrap
    n = 6000
    names = with_input(bootstrap, unique_name, n)
    cfg_dict = engine_config(tmp_path, bootstrap, names, kafka_client)
    # Longer than the outage (the broker is stopped and started again: ≤ 18 s at load 4-7).
    cfg_dict["source"]["max_idle_seconds"] = patience(100.0)
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
    deadline = time.monotonic() + patience(ENGINE_CATCHES_UP)
    while engine.learner.step < 1500 and time.monotonic() < deadline and worker.is_alive():
        time.sleep(0.02)  # polling interval of a bounded wait
    assert engine.learner.step >= 1500, (engine.status(), done)
    kafka_broker.stop()
    step_during = engine.learner.step
    kafka_broker.start()
    # After the restart the engine must catch up with the rest of the topic.
    deadline = time.monotonic() + patience(ENGINE_FINISHES)
    while engine.learner.step < n and time.monotonic() < deadline and worker.is_alive():
        time.sleep(0.05)  # polling interval of a bounded wait
    engine.stop()
    worker.join(timeout=patience(ENGINE_EXITS))
    assert "error" not in done, repr(done.get("error"))
    assert step_during < n, "the outage must happen mid-run"
    assert engine.learner.step == n, ("nothing may be lost across a broker restart", done)
    releases = parse_releases(read_all(kafka_broker.bootstrap, names["releases"]))
    check_release_stream(releases, n, epsilon=2.0)


class _Pause:
    """Wraps an engine's source: the first poll at or past ``step`` waits for ``go``.

    At that moment the engine holds learned, unpublished records (a cycle in progress), so
    the outage starts exactly where publication must wait for the broker.
    """

    def __init__(self, engine: Engine, step: int) -> None:
        self.engine, self.step = engine, step
        self.paused, self.go = threading.Event(), threading.Event()
        opened = engine._open

        def _open() -> None:
            opened()
            engine._source = _PausedSource(engine._source, self)

        engine._open = _open  # type: ignore[method-assign]


class _PausedSource:
    def __init__(self, inner, pause: _Pause) -> None:
        self.inner, self.pause = inner, pause

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def poll(self, max_records=500, timeout_s=0.5):
        pause = self.pause
        if pause.engine.learner.step >= pause.step and not pause.go.is_set():
            pause.paused.set()
            pause.go.wait()
        return self.inner.poll(max_records=max_records, timeout_s=timeout_s)


@pytest.mark.scenario
def test_outage_longer_than_every_timeout_is_ridden_out_or_ends_at_the_deadline(
    kafka_broker: KafkaBroker, unique_name, tmp_path, kafka_client
):
    """Broker down for 45 s, while a cycle waits to be published.

    45 s is longer than every time limit on the engine's Kafka path in this configuration
    (publication attempts are abandoned after 8 s and retried with a new producer, requests time
    out after 4 s, connections and metadata within 10 s), so it stands for an outage of any
    length: no code path has a patience of its own, only the configured deadline. (Before, the
    sink gave up after 300 s; a 6-minute outage test would prove nothing more than this one.)
    One engine rides the outage out and resumes by itself; the other, with
    ``kafka.outage_deadline_seconds = 12``, stops cleanly (exit code 4) and its restart
    continues. Nothing is lost, every step is published once, identically.
    """
    bootstrap = kafka_broker.bootstrap
    n = 4000
    engines, pauses, dicts, results, threads = {}, {}, {}, {}, {}
    for kind, deadline in (("ride", None), ("deadline", 12.0)):
        names = names_for(unique_name)
        names["input"] = unique_name(f"input-{kind}")
        produce(bootstrap, names["input"], [json.dumps(valid_record(i)).encode() for i in range(n)])
        d = engine_config(tmp_path / kind, bootstrap, names, kafka_client)
        d["source"]["max_idle_seconds"] = None
        # Cycles end only when the input goes idle: at the pause, a cycle is in progress.
        d["checkpoint"].update(every_records=100_000, every_seconds=600.0)
        d["status"]["file"] = str(tmp_path / kind / "status.json")
        d["kafka"].update(attempt_timeout_seconds=8.0, outage_deadline_seconds=deadline)
        dicts[kind] = (names, d)
        engines[kind] = Engine(EngineConfig.model_validate(d))
        pauses[kind] = _Pause(engines[kind], 1000)

        def work(kind=kind) -> None:
            try:
                results[kind] = engines[kind].run()
            except BaseException as exc:  # noqa: BLE001 - checked below
                results[kind] = exc

        threads[kind] = threading.Thread(target=work, daemon=True)
        threads[kind].start()
    for kind in engines:
        assert pauses[kind].paused.wait(patience(ENGINE_CATCHES_UP)), f"{kind}: no pause"
        assert len(engines[kind].outbox) > 0, "a cycle is waiting to be published"
    kafka_broker.stop()
    down = time.monotonic()
    try:
        for kind in engines:
            pauses[kind].go.set()
        # The deadline, then at most one publication attempt (8 s) and the clean stop: the
        # bound the test asserts (stopped 26 s after the broker went down at load 6).
        threads["deadline"].join(timeout=12 + patience(28))
        stopped_after = time.monotonic() - down
        assert not threads["deadline"].is_alive(), "the deadline must stop the engine"
        err = results["deadline"]
        assert isinstance(err, KafkaUnavailable) and err.exit_code == 4, repr(err)
        assert "outage_deadline_seconds = 12" in str(err) and "stopped cleanly" in str(err)
        assert 12 <= stopped_after < 12 + patience(23)
        status = _status(tmp_path / "ride" / "status.json")
        assert status.get("broker_unreachable_since") is not None
        while time.monotonic() - down < 45:
            assert threads["ride"].is_alive(), repr(results.get("ride"))
            time.sleep(0.5)  # the outage's length, not a timing assumption about the engine
    finally:
        kafka_broker.start()
    # The rider resumes by itself; stop it once it has learned everything.
    ride = engines["ride"]
    deadline = time.monotonic() + patience(ENGINE_CATCHES_UP)
    while ride.learner.step < n and time.monotonic() < deadline:
        time.sleep(0.1)  # polling interval of a bounded wait
    ride.stop()
    threads["ride"].join(timeout=patience(ENGINE_EXITS))
    assert not isinstance(results["ride"], BaseException), repr(results["ride"])
    # The stopped one continues where its checkpoint is, publishing what waited.
    names, d = dicts["deadline"]
    d["source"]["max_idle_seconds"] = patience(IDLE_END)
    d["kafka"]["outage_deadline_seconds"] = None
    again = Engine(EngineConfig.model_validate(d))
    again.run()
    for kind, engine in (("ride", ride), ("deadline", again)):
        names = dicts[kind][0]
        assert engine.learner.step == n, f"{kind}: nothing is lost"
        raw = read_all(bootstrap, names["releases"])
        assert all(len(c) == 1 for c in copies_by_step(raw).values())
        check_release_stream(parse_releases(raw), n, epsilon=2.0)


def test_a_second_instance_never_learns_beside_the_first(
    kafka_broker: KafkaBroker, unique_name, tmp_path, kafka_client
):
    bootstrap = kafka_broker.bootstrap
    n = 3000
    names = with_input(bootstrap, unique_name, n)
    cfg = engine_config(tmp_path / "a", bootstrap, names, kafka_client, seed=None)
    cfg["source"]["max_idle_seconds"] = None  # runs until told to stop
    cfg["checkpoint"]["every_records"] = 200
    (tmp_path / "a").mkdir()
    first = tmp_path / "a" / "engine.toml"
    _write_toml(first, cfg)
    proc = _start_engine(first, tmp_path / "a.log")
    try:
        status = tmp_path / "a" / "status.json"
        _wait_for(status, lambda s: s.get("step") == n, proc, ENGINE_CATCHES_UP)
        # Caught up and idle: status.json keeps being refreshed, saying since when.
        idle = _wait_for(
            status, lambda s: s.get("idle_since") and s.get("consumer_lag") == 0, proc, 60
        )
        later = _wait_for(status, lambda s: s["time"] > idle["time"] + 1, proc, timeout=60)
        assert later["idle_since"] == idle["idle_since"] and later["consumer_lag"] == 0
        # Same state directory: refused at once by its lock.
        rc, err, took = _cli(first)
        assert rc == 3 and "in use by another stream-dp engine" in _last_line(err), err
        assert took < patience(30)  # no wait for Kafka or a lock (8 s at load 5.6: the start)
        # Its own state directory, same model: refused by the evidence in Kafka.
        (tmp_path / "b").mkdir()
        other = tmp_path / "b" / "engine.toml"
        cfg_b = json.loads(json.dumps(cfg))
        cfg_b["checkpoint"]["path"] = str(tmp_path / "b" / "state" / "model.ckpt")
        cfg_b["status"]["file"] = str(tmp_path / "b" / "status.json")
        _write_toml(other, cfg_b)
        rc, err, _ = _cli(other)
        line = _last_line(err)
        assert rc == 3 and "existed before" in line and "--fresh" in line, err
        # The refused instances fenced nothing: the first one still runs and publishes.
        produce(bootstrap, names["input"], [json.dumps(valid_record(n)).encode()])
        _wait_for(status, lambda s: s.get("step") == n + 1, proc, timeout=60)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=patience(ENGINE_EXITS)) == 0
    committed = parse_releases(read_all(bootstrap, names["releases"], committed=True))
    assert [r.step for r in committed] == list(range(1, n + 2))
    assert len({r.run_id for r in committed}) == 1

    # Two new instances of one model started at the same moment, separate state dirs: the
    # broker's fencing lets exactly one of them learn.
    names2 = {**names_for(unique_name), "input": names["input"]}
    procs = []
    for who in ("c", "d"):
        (tmp_path / who).mkdir()
        c = engine_config(tmp_path / who, bootstrap, names2, kafka_client, seed=None)
        c["source"]["max_idle_seconds"] = patience(IDLE_END)
        c["status"]["file"] = str(tmp_path / who / "status.json")
        _write_toml(tmp_path / who / "engine.toml", c)
    for who in ("c", "d"):
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "stream_dp.cli",
                    "run",
                    "--config",
                    str(tmp_path / who / "engine.toml"),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
        )
    outs = [p.communicate(timeout=patience(ENGINE_FINISHES)) for p in procs]
    rcs = [p.returncode for p in procs]
    print(f"\ntwo new instances started together: exit codes {rcs}")
    if 0 in rcs:
        assert sorted(rcs)[1] in (3, 5), (rcs, [o[1][-2000:] for o in outs])
        reason = _last_line(outs[rcs.index(sorted(rcs)[1])][1])
        assert "fenced" in reason or "has published" in reason or "existed before" in reason
    else:
        # The narrow race: one became the writer after the other had registered and begun
        # publishing. It fenced that one, found its aborted releases, and refused; the fenced
        # instance, restarted, publishes the same releases again.
        assert sorted(rcs) == [3, 5], (rcs, [o[1][-2000:] for o in outs])
        line = _last_line(outs[rcs.index(3)][1])
        assert "had begun publishing" in line or "has published" in line, line
        fenced = ("c", "d")[rcs.index(5)]
        rc, err, _ = _cli(tmp_path / fenced / "engine.toml")
        assert rc == 0, err
    everything = read_all(bootstrap, names2["releases"])
    twice = sorted(step for step, c in copies_by_step(everything).items() if len(c) > 1)
    assert not twice, ("no step twice", twice[:5], len(twice), rcs, [o[1][-3000:] for o in outs])
    committed = parse_releases(read_all(bootstrap, names2["releases"], committed=True))
    assert [r.step for r in committed] == list(range(1, n + 2))
    assert len({r.run_id for r in committed}) == 1, "one instance published"


def _instance_c(bootstrap: str, cfg: EngineConfig, names: dict, run_id: str, *, releasing: bool):
    """Play instance c, a new run ``run_id`` of ``cfg``'s model, with a raw producer on the
    model's transactional id: register (cycle 0's offsets, tagged, in a committed transaction)
    and, if ``releasing``, begin cycle 1's transaction -- a release of step 1 and the offsets
    past its record, sent and flushed -- and leave it open (c is still publishing)."""
    from kafka import KafkaProducer, OffsetAndMetadata

    from connectors.sources import COMMIT_METADATA_PREFIX
    from stream_dp.engine.state import Published

    def offsets(offset: int, seq: int) -> dict:
        tag = COMMIT_METADATA_PREFIX + Published(run_id, seq).tag
        return {TopicPartition(names["input"], 0): OffsetAndMetadata(offset, tag, -1)}

    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=cfg.transactional_id)
    producer.init_transactions()
    producer.begin_transaction()
    producer.send_offsets_to_transaction(offsets(0, 0), names["group"])
    producer.commit_transaction()
    if releasing:
        release = ReleaseMessage(
            model_id=names["model"],
            run_id=run_id,
            algorithm="OnPairStrC",
            task="auc",
            step=1,
            release_index=1,
            weights=[0.0] * len(FEATURES),
            feature_names=FEATURES,
            rho_spent=0.01,
            rho_budget=1.0,
            epsilon_spent=0.5,
            delta=1e-5,
            exhausted=False,
        )
        producer.begin_transaction()
        producer.send(names["releases"], key=names["model"].encode(), value=release.to_json())
        producer.send_offsets_to_transaction(offsets(1, 1), names["group"])
        producer.flush()
    return producer


@pytest.mark.parametrize("releasing", [True, False], ids=["c-publishing", "c-registered"])
def test_a_run_fenced_mid_publication_is_never_released_over(
    kafka_broker: KafkaBroker, unique_name, tmp_path, caplog, monkeypatch, releasing
):
    """Two new instances of one model, c and d, started together (the race of the test above,
    made deterministic): d checks the group's record before c registers, and becomes the writer
    after c registered -- fencing c. If c's transaction of releases was open then, the broker
    aborts it but its messages stay in the log for read_uncommitted consumers: d must refuse
    (exit code 3, naming c's run) and publish nothing, or it would release the same steps under
    other noise. If c had released nothing, d continues and is the model's only publisher."""
    from kafka.errors import KafkaError

    from connectors.transactions import FENCING_ERRORS
    from stream_dp.engine.errors import StateError
    from stream_dp.engine.startup import Startup

    bootstrap = kafka_broker.bootstrap
    n = 40
    names = names_for(unique_name)
    create_topic(bootstrap, names["input"], partitions=1)
    produce(bootstrap, names["input"], [json.dumps(valid_record(i)).encode() for i in range(n)])
    cfg = EngineConfig.model_validate(engine_config(tmp_path, bootstrap, names, seed=None))
    run_c = "c" * 32
    c: list = []
    become_writer = Startup.become_writer

    def c_registers_first(startup: Startup) -> None:
        # d has checked the record (nothing there yet) and is about to become the writer.
        if not c:
            assert startup.cycle.seq == 0 and startup.cycle.prior is None
            c.append(_instance_c(bootstrap, cfg, names, run_c, releasing=releasing))
        become_writer(startup)

    monkeypatch.setattr(Startup, "become_writer", c_registers_first)
    engine = Engine(cfg, max_records=n)
    try:
        with caplog.at_level("WARNING", logger="stream_dp.engine"):
            if releasing:
                with pytest.raises(StateError) as refused:
                    engine.run()
            else:
                engine.run()
        assert len(c) == 1, "c registered before d became the writer"
        if releasing:
            # d's init_transactions aborted c's open transaction: c is fenced.
            with pytest.raises(KafkaError) as fenced:
                c[0].commit_transaction()
            assert type(fenced.value).__name__ in FENCING_ERRORS, fenced.value
    finally:
        for producer in c:
            producer.close(timeout=1)
    run_d = engine.cycle.run_id
    assert run_d not in (None, run_c)
    raw = read_all(bootstrap, names["releases"])
    everything = parse_releases(raw)
    if releasing:
        message = " ".join(str(refused.value).split())
        assert refused.value.exit_code == 3
        assert f"run {run_c}" in message and "had begun publishing" in message, message
        assert "Restart that instance from its state directory" in message, message
        # What a read_uncommitted consumer sees: c's aborted release, nothing of d's run.
        assert [(r.run_id, r.step) for r in everything] == [(run_c, 1)]
        assert read_all(bootstrap, names["releases"], committed=True) == []
        assert not (tmp_path / "state" / "model.ckpt").exists(), "d's run never began"
    else:
        warned = [r.getMessage() for r in caplog.records if "same moment" in r.getMessage()]
        assert warned and run_c in warned[0] and "published nothing" in warned[0], warned
        assert engine.learner.step == n
        assert {r.run_id for r in everything} == {run_d}
        assert [r.step for r in everything] == list(range(1, n + 1))
        assert read_all(bootstrap, names["releases"], committed=True) == raw


def test_with_releases_to_files_a_second_instance_is_fenced_all_the_same(
    kafka_broker: KafkaBroker, unique_name, tmp_path, monkeypatch
):
    """A Kafka source whose outputs are files: the offsets still commit through the model's
    transactional id, so the broker fences a second instance. Instance c starts between d's
    last reading of the group's record and d's registration: c fences d, which has released
    nothing (its releases would carry other noise), and c's is the model's only history."""
    from stream_dp.engine.errors import Fenced
    from stream_dp.engine.startup import Startup

    bootstrap = kafka_broker.bootstrap
    n = 40
    names = names_for(unique_name)
    create_topic(bootstrap, names["input"], partitions=1)
    produce(bootstrap, names["input"], [json.dumps(valid_record(i)).encode() for i in range(n)])
    cfgs = {}
    for who in ("c", "d"):
        d = engine_config(tmp_path / who, bootstrap, names, seed=None)
        d["releases"] = {"kind": "jsonl", "path": str(tmp_path / who / "releases.jsonl")}
        d["dead_letters"] = {"kind": "jsonl", "path": str(tmp_path / who / "dead.jsonl")}
        cfgs[who] = EngineConfig.model_validate(d)
    c_engine = Engine(cfgs["c"], max_records=n)
    read_record, reads = Startup._read_record, []

    def c_starts_before_d_registers(startup, *args, **kwargs):
        record = read_record(startup, *args, **kwargs)
        if startup.config is cfgs["d"]:
            reads.append(record)
            if len(reads) == 2:  # the reading in recover(), right before d registers
                c_engine.start()
        return record

    monkeypatch.setattr(Startup, "_read_record", c_starts_before_d_registers)
    d_engine = Engine(cfgs["d"], max_records=n)
    try:
        with pytest.raises(Fenced):
            d_engine.run()
        c_engine._loop()
        c_engine.finish()
    finally:
        c_engine.close()
    assert len(reads) == 2 and all(r.published is None for r in reads)
    assert (
        not (tmp_path / "d" / "releases.jsonl").exists()
        or not (tmp_path / "d" / "releases.jsonl").read_text().strip()
    ), "d released nothing"
    rows = [json.loads(x) for x in (tmp_path / "c" / "releases.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, n + 1))
    assert {r["run_id"] for r in rows} == {c_engine.cycle.run_id}


@pytest.mark.scenario
def test_a_lost_state_directory_is_refused_and_a_kill_at_start_is_harmless(
    kafka_broker: KafkaBroker, unique_name, tmp_path, kafka_client
):
    bootstrap = kafka_broker.bootstrap
    n = 1000
    names = with_input(bootstrap, unique_name, n)
    cfg = engine_config(tmp_path, bootstrap, names, kafka_client, seed=None)
    cfg["source"]["max_idle_seconds"] = patience(IDLE_END)
    config_path = tmp_path / "engine.toml"
    _write_toml(config_path, cfg)
    log = tmp_path / "engine.log"
    # SIGKILL at five moments of the first start (probing Kafka, the first checkpoint, the
    # registration, the first records): every next start works without --fresh.
    for delay in (0.4, 0.8, 1.2, 1.6, 2.0):
        proc = _start_engine(config_path, log)
        time.sleep(delay)  # a moment of the start-up to kill at, not a timing assumption
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=patience(ENGINE_EXITS))
    rc, err, _ = _cli(config_path)
    assert rc == 0, err[-3000:]
    ckpt, _ = _ledger(cfg)
    assert ckpt.learner_state["t"] == n
    # The state directory is lost: the model's records in Kafka refuse a silent fresh start.
    import shutil

    shutil.rmtree(tmp_path / "state")
    rc, err, _ = _cli(config_path)
    line = _last_line(err)
    assert rc == 3 and "existed before" in line and "--fresh" in line
    assert "consumer group" in line and "release topic" in line
    # --fresh starts a new run that continues after the input consumed so far.
    produce(bootstrap, names["input"], [json.dumps(valid_record(n + i)).encode() for i in range(5)])
    rc, err, _ = _cli(config_path, "--fresh")
    assert rc == 0, err[-3000:]
    ckpt, _ = _ledger(cfg)
    assert ckpt.learner_state["t"] == 5

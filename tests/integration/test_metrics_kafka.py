"""The Prometheus endpoint of engines on a real broker, scraped over HTTP.

A single engine on a 3-partition input, and two per-partition instances on one machine: each
serves ``/metrics`` on a port of its own; what a scrape says is what the engine learned,
rejected and spent -- records learned equal the records sent minus the dead letters, the
dead letters by reason equal the engine's, the consumer lag of each input partition is the
broker's end offset minus the learner's position, and ε and ρ equal the ledger's.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import patience

from stream_dp.engine import Engine
from stream_dp.engine.config import EngineConfig

from .kafka_broker import KafkaBroker
from .test_engine_kafka import (
    _write_toml,
    create_topic,
    engine_config,
    names_for,
    produce,
    valid_record,
)
from .test_scaleout_kafka import MASTER, _ledger

parser = pytest.importorskip("prometheus_client.parser")

pytestmark = pytest.mark.kafka

#: Deadlines: learning a few thousand records takes seconds on a quiet machine; these are
#: far above five times that, and patience() stretches them further with the load.
LEARN_S = 240.0
SCRAPE_TIMEOUT_S = 10.0

Samples = dict[tuple[str, frozenset], float]


def _scrape(url: str) -> Samples | None:
    """Every sample the endpoint serves now (None while it does not answer)."""
    try:
        with urllib.request.urlopen(url, timeout=patience(SCRAPE_TIMEOUT_S)) as response:
            text = response.read().decode()
    except (urllib.error.URLError, ConnectionError):
        return None
    out = {}
    for family in parser.text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def _values(samples: Samples, name: str, **fixed: str) -> dict[frozenset, float]:
    """The samples of ``name`` whose labels include ``fixed``, keyed by their other labels."""
    out = {}
    for (n, labels), v in samples.items():
        d = dict(labels)
        if n == name and all(d.get(k) == w for k, w in fixed.items()):
            out[frozenset((k, w) for k, w in d.items() if k not in fixed)] = v
    return out


def _scrape_until(
    url: Callable[[], str | None],
    ok: Callable[[Samples], bool],
    alive: Callable[[], bool],
    what: str,
) -> tuple[Samples, list[Samples]]:
    """Scrape until ``ok`` (bounded by LEARN_S); the last scrape and every one taken."""
    deadline = time.monotonic() + patience(LEARN_S)
    seen: list[Samples] = []
    while time.monotonic() < deadline:
        assert alive(), f"the engine stopped before {what}"
        where = url()
        got = _scrape(where) if where else None
        if got:
            seen.append(got)
            if ok(got):
                return got, seen
        time.sleep(0.1)  # polling interval of a bounded wait, not a timing assumption
    raise AssertionError(f"no scrape showed {what} within {LEARN_S} s")


def test_a_single_engine_serves_what_it_learned_and_spent(
    kafka_broker: KafkaBroker, unique_name, tmp_path, kafka_client
):
    bootstrap = kafka_broker.bootstrap
    names = names_for(unique_name)
    create_topic(bootstrap, names["input"], partitions=3)
    n = 3000
    bad = [b"not json", b'{"x": {"a": 1.0}', json.dumps({"x": {"a": "nan?"}, "y": 1}).encode()]
    values = [json.dumps(valid_record(i)).encode() for i in range(n)]
    values = values[:1000] + bad + values[1000:]
    produce(bootstrap, names["input"], values)
    total = len(values)

    cfg = engine_config(tmp_path, bootstrap, names, kafka_client)
    cfg["source"]["max_idle_seconds"] = None  # stopped by the test once it has scraped
    cfg["status"]["interval_seconds"] = 0.2
    cfg["metrics"] = {"prometheus_port": 0}
    engine = Engine(EngineConfig.model_validate(cfg))
    errors: list[BaseException] = []

    def run() -> None:
        try:
            engine.run()
        except BaseException as err:  # noqa: BLE001 - reported by the test
            errors.append(err)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    try:

        def url() -> str | None:
            m = engine.metrics
            return m.url if m.port else None  # port 0 until the engine has bound one

        def learned_all(s: Samples) -> bool:
            handled = _values(s, "stream_dp_records_total", model_id=names["model"])
            return sum(handled.values()) == total

        last, seen = _scrape_until(url, learned_all, worker.is_alive, "every record handled")
        served = url()
    finally:
        engine.stop()
        worker.join(timeout=patience(LEARN_S))
    assert not worker.is_alive() and not errors, errors

    model = {"model_id": names["model"]}
    learner = {**model, "partition": ""}
    assert _values(last, "stream_dp_up", **model) == {frozenset(): 1.0}
    assert _values(last, "stream_dp_partitions_held", **model) == {frozenset(): 3.0}
    assert _values(last, "stream_dp_broker_unreachable", **model) == {frozenset(): 0.0}

    # Learned = sent - dead letters; dead letters by reason = the engine's.
    learned = _values(last, "stream_dp_records_learned_total", **learner)[frozenset()]
    dead = {dict(k)["reason"]: v for k, v in
            _values(last, "stream_dp_dead_letters_total", **learner).items()}  # fmt: skip
    assert sum(dead.values()) == len(bad) and learned == total - len(bad) == n
    assert dead == {r: float(c) for r, c in engine.dead_counts.items()}
    assert _values(last, "stream_dp_step", **learner)[frozenset()] == engine.learner.step == n

    # The lag of each input partition: the broker's end offset minus the learner's position.
    # A snapshot's counts and lag are taken together, so in every scrape what is handled and
    # what is left add up to what was sent.
    assert _values(last, "stream_dp_consumer_lag", **model) == {
        frozenset({("partition", str(k))}): 0.0 for k in range(3)
    }
    for s in seen:
        lags = _values(s, "stream_dp_consumer_lag", **model)
        handled = _values(s, "stream_dp_records_total", **learner)
        if lags and handled:
            assert sum(lags.values()) + handled[frozenset()] == total

    # ε and ρ are the ledger's; the releases and commit cycles the engine's.
    eps, delta = engine.learner.accountant.spent()
    assert _values(last, "stream_dp_epsilon_spent", **learner)[frozenset()] == pytest.approx(
        eps, rel=1e-12
    )
    assert _values(last, "stream_dp_delta", **learner)[frozenset()] == delta
    rho = engine.learner.accountant.rho_spent()
    assert _values(last, "stream_dp_rho_spent", **learner)[frozenset()] == pytest.approx(
        rho, rel=1e-12
    )
    assert _values(last, "stream_dp_releases_total", **learner)[frozenset()] == n
    cycles = _values(last, "stream_dp_commit_cycles_total", **learner)[frozenset()]
    assert 1 <= cycles <= engine.seq
    assert _scrape(served) is None, "the port is closed once the engine returns"


def _instance(tmp: Path, cfg: dict, name: str) -> tuple[subprocess.Popen, Path]:
    """Start instance ``name`` of the per-partition model, with an ephemeral metrics port."""
    path, log = tmp / f"engine-{name}.toml", tmp / f"engine-{name}.log"
    _write_toml(path, cfg)
    argv = [sys.executable, "-m", "stream_dp.cli", "run", "--config", str(path),
            "--instance", name, "--metrics-port", "0"]  # fmt: skip
    proc = subprocess.Popen(
        argv,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "STREAM_DP_MASTER_SECRET": MASTER},
    )
    return proc, log


def _served_at(log: Path) -> str | None:
    found = re.search(r"serving metrics on (http://\S+/metrics)", log.read_text())
    return found.group(1) if found else None


@pytest.mark.scenario
def test_scale_out_instances_on_one_machine_each_serve_their_partitions(
    kafka_broker: KafkaBroker, unique_name, tmp_path, kafka_client
):
    """Two instances with one config on one machine: each binds a port of its own and
    serves the partition learners it holds; over both, every partition is served once."""
    from kafka import KafkaConsumer, TopicPartition

    from connectors import KafkaSink

    bootstrap = kafka_broker.bootstrap
    names = names_for(unique_name)
    partitions, n = 4, 4000
    create_topic(bootstrap, names["input"], partitions=partitions)
    with KafkaSink(names["input"], bootstrap) as sink:
        for i in range(n):
            sink.send(f"record-{i}", json.dumps(valid_record(i)).encode())
        for i in range(8):
            sink.send(f"bad-{i}", b"not json")
        sink.flush()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        tps = [TopicPartition(names["input"], k) for k in range(partitions)]
        sizes = {tp.partition: int(e) for tp, e in consumer.end_offsets(tps).items()}
    finally:
        consumer.close()
    assert sum(sizes.values()) == n + 8

    cfg = engine_config(tmp_path, bootstrap, names, kafka_client, seed=None)
    cfg["source"]["max_idle_seconds"] = None  # stopped by the test once it has scraped
    cfg["checkpoint"].update(every_records=500, every_seconds=1.0)
    cfg["status"] = {"interval_seconds": 0.2, "file": str(tmp_path / "status.json")}
    cfg["scale"] = {"mode": "per-partition", "privacy_unit_key": True,
                    "session_timeout_ms": 6000}  # fmt: skip
    cfg["metrics"] = {"prometheus_port": 9464}  # overridden per instance on the command line
    procs = {name: _instance(tmp_path, cfg, name) for name in "AB"}
    model = names["model"]
    try:
        urls = {}
        deadline = time.monotonic() + patience(LEARN_S)
        while len(urls) < 2:
            assert time.monotonic() < deadline, "the instances did not say where they serve"
            for name, (proc, log) in procs.items():
                assert proc.poll() is None, f"instance {name} exited with {proc.returncode}"
                if name not in urls and (url := _served_at(log)):
                    urls[name] = url
            time.sleep(0.1)  # polling interval of a bounded wait, not a timing assumption
        assert urls["A"] != urls["B"] and "9464" not in urls["A"] + urls["B"]

        last: dict[str, Samples] = {}

        def everything_learned() -> bool:
            for name, url in urls.items():
                got = _scrape(url)
                if not got:
                    return False
                last[name] = got
            held = sum(sum(_values(s, "stream_dp_partitions_held", model_id=model).values())
                       for s in last.values())  # fmt: skip
            handled = sum(sum(_values(s, "stream_dp_records_total", model_id=model).values())
                          for s in last.values())  # fmt: skip
            return held == partitions and handled == n + 8

        deadline = time.monotonic() + patience(LEARN_S)
        while not everything_learned():
            assert time.monotonic() < deadline, f"not everything learned: {last}"
            assert all(p.poll() is None for p, _ in procs.values()), "an instance exited"
            time.sleep(0.1)  # polling interval of a bounded wait, not a timing assumption
    finally:
        for proc, _ in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = {name: proc.wait(timeout=patience(LEARN_S)) for name, (proc, _) in procs.items()}
    assert codes == {"A": 0, "B": 0}, [log.read_text()[-3000:] for _, log in procs.values()]

    served: dict[int, str] = {}
    for name, s in last.items():
        assert _values(s, "stream_dp_up", model_id=model) == {frozenset(): 1.0}
        learners = _values(s, "stream_dp_learner_info", model_id=model)
        mine = {int(dict(k)["partition"]): dict(k)["learner"] for k in learners}
        held = _values(s, "stream_dp_partitions_held", model_id=model)[frozenset()]
        assert len(mine) == held >= 1, "both instances hold partitions"
        for k, learner_id in mine.items():
            assert k not in served, f"partition {k} served by two instances"
            served[k] = name
            assert learner_id == f"{model}/p{k}"
            at = {"model_id": model, "partition": str(k)}
            learned = _values(s, "stream_dp_records_learned_total", **at)[frozenset()]
            dead = _values(s, "stream_dp_dead_letters_total", **at)
            assert learned + sum(dead.values()) == sizes[k], "sent = learned + dead letters"
            assert _values(s, "stream_dp_consumer_lag", **at) == {frozenset(): 0.0}
            # ε and ρ are the partition learner's ledger (checkpointed when it stopped).
            _, ledger = _ledger(tmp_path / "state", model, k)
            assert _values(s, "stream_dp_rho_spent", **at)[frozenset()] == pytest.approx(
                ledger.rho_spent(), rel=1e-12
            )
            assert _values(s, "stream_dp_epsilon_spent", **at)[frozenset()] == pytest.approx(
                ledger.spent()[0], rel=1e-12
            )
            assert _values(s, "stream_dp_step", **at)[frozenset()] == learned
    assert sorted(served) == list(range(partitions))

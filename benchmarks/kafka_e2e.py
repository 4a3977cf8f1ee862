"""End-to-end throughput through a real Apache Kafka broker, on each Kafka client.

Starts a private broker (deploy/kafka/kafka.sh) in a temporary directory, produces N records,
then measures in the same run:

* **raw**: a plain consume → produce loop on each Kafka client (the consumer reads each record,
  an idempotent producer sends one message per record, then flush) — the floor any Kafka job in
  Python pays: kafka-python (KafkaConsumer, KafkaProducer) and, when installed (the
  ``confluent`` extra), confluent-kafka (librdkafka's Consumer and Producer);
* **engine**: ``stream_dp.engine.Engine`` on the same topic, on each client (``[kafka]
  client``) — parse and validate, clip, one private OnPairStrC step, one release message per
  record, dead-letter sink, checkpoints, one Kafka transaction per commit cycle (the engine's
  default cycle unless ``--every-records``).

* **scale-out** (``--scale``): the same records on a 4-partition topic (keyed by record id),
  learned by ``stream-dp run`` processes in per-partition mode in one consumer group: one
  process, then two, on each client. Measured from the processes' start (interpreter start,
  imports, group join and partition assignment included) until the status files show every
  record learned and published.

Each is reported start to end and in steady state (records/s between 20 % and 80 % of the
records: start-up and the final flush left out). The default of 60,000 records keeps the
engine's start-up (~0.6 s of Kafka round trips: checks, fencing, a first transaction) from
dominating a run a few seconds long. The first line says which CRC32C kafka-python uses (the
``crc32c`` package of the ``fast`` extra, or its pure-Python fallback): it moves both loops.

Prints records/s (median of repeats) and the ratios raw confluent-kafka / raw kafka-python,
each engine / raw kafka-python, engine confluent-kafka / engine kafka-python, and two / one
process. Without the ``confluent`` extra only the kafka-python lines are printed.

    python benchmarks/kafka_e2e.py [--records 60000] [--repeats 3] [--buffer 64] [--dim 8]
                                   [--every-records N] [--scale] [--raw-only]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import numpy as np
from kafka import KafkaConsumer, KafkaProducer

from connectors import KafkaSink
from connectors._settings import crc32c_in_c
from stream_dp.engine import Engine
from stream_dp.engine.config import EngineConfig
from stream_dp.engine.kernels import load_kernels

ROOT = Path(__file__).resolve().parents[1]
#: The learner's defaults release every 20th step; the benchmark measures Algorithm 1 as
#: written, a charged release (and its message) at every record.
ONE_RELEASE_PER_RECORD = {"release_every": 1, "smoothing_window": 1, "predict_with": "release"}
#: ``checkpoint`` settings of every engine run: the ledger journal, as the deployed example
#: configs have it (O(1) checkpoints when releasing at every record), and the engine's default
#: cycle unless ``--every-records``.
CYCLE: dict[str, int | bool] = {"ledger_journal": True}
#: The scale-out processes' log level (their logs stay in the run's temporary directory).
LOG_LEVEL = "WARNING"
KAFKA = ROOT / "deploy" / "kafka" / "kafka.sh"


def crc32c_kind() -> str:
    """Which CRC32C kafka-python uses: the ``crc32c`` package's C code, or its own Python."""
    return "C (crc32c package)" if crc32c_in_c() else "pure Python (no crc32c package)"


def cycle_records() -> int:
    from stream_dp.engine.config import CheckpointConfig

    return CYCLE.get("every_records", CheckpointConfig.model_fields["every_records"].default)


def produce(bootstrap: str, topic: str, n: int, dim: int, keyed: bool = False) -> None:
    rng = np.random.default_rng(0)
    with KafkaSink(topic, bootstrap) as sink:
        for i in range(n):
            # ‖x‖ ≈ 1, the learners' default radius R, as features scaled for the model are
            # (README, "Scaling inside river pipelines"); unscaled, every record was clipped,
            # with a warning.
            x = (rng.normal(size=dim) / np.sqrt(dim)).round(6)
            rec = {"x": {f"f{j}": float(v) for j, v in enumerate(x)}, "y": int(x[0] > 0)}
            sink.send(f"record-{i}" if keyed else None, json.dumps(rec).encode())
        sink.flush()


def warm_broker(bootstrap: str) -> None:
    """One transaction and one group commit outside any measurement: a fresh broker creates its
    transaction-state and consumer-offsets topics at their first use (~0.4 s), which would
    otherwise fall on whichever engine runs first (kafka-python's)."""
    topic = f"warm-{uuid.uuid4().hex[:8]}"
    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"warm-{topic}")
    producer.init_transactions()
    producer.begin_transaction()
    producer.send(topic, b"warm")
    producer.commit_transaction()
    producer.close()
    consumer = KafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=f"warm-{topic}",
        auto_offset_reset="earliest", enable_auto_commit=False,
    )  # fmt: skip
    for _ in consumer:
        break
    consumer.commit()
    consumer.close()


def scale_loop(
    bootstrap: str, topic: str, n: int, buffer: int, dim: int, processes: int, client: str
) -> tuple[float, float]:
    """Records/s of ``processes`` per-partition instances in one group: from their start to the
    last publication, and in steady state (between 20 % and 80 % of the records learned)."""
    tag = uuid.uuid4().hex[:8]
    d = Path(tempfile.mkdtemp())
    sections = {
        "model": {"alpha": 1.0, "buffer": buffer, "model_id": f"scale-{tag}",
                  "features": [f"f{j}" for j in range(dim)], **ONE_RELEASE_PER_RECORD},
        "source": {"kind": "kafka", "topic": topic, "bootstrap_servers": bootstrap,
                   "group_id": f"scale-{tag}", "max_idle_seconds": 30.0},
        "releases": {"kind": "kafka", "topic": f"rel-{tag}", "bootstrap_servers": bootstrap},
        "dead_letters": {"kind": "kafka", "topic": f"dead-{tag}", "bootstrap_servers": bootstrap},
        "checkpoint": {"path": str(d / "state" / "m.ckpt"), **CYCLE},
        "status": {"interval_seconds": 0.2, "file": str(d / "status.json")},
        "scale": {"mode": "per-partition", "session_timeout_ms": 6000},
        "kafka": {"client": client},
    }  # fmt: skip
    lines = []
    for section, body in sections.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in body.items()]
    (d / "engine.toml").write_text("\n".join(lines) + "\n")
    env = {**os.environ, "STREAM_DP_MASTER_SECRET": os.urandom(32).hex()}
    t0 = time.perf_counter()
    marks: dict[float, tuple[float, int]] = {}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "stream_dp.cli", "run", "--config", str(d / "engine.toml"),
             "--instance", str(i), "--log-level", LOG_LEVEL],
            env=env, stdout=subprocess.DEVNULL, stderr=(d / f"log{i}").open("w"),
        )
        for i in range(processes)
    ]  # fmt: skip
    try:
        while True:
            learned, pending = {}, 0
            for i in range(processes):
                try:
                    s = json.loads((d / f"status.{i}.json").read_text())
                except (FileNotFoundError, ValueError):
                    continue
                for p, v in s["by_partition"].items():
                    learned[p] = v["learned"]
                    pending += v["pending_messages"]
            now, total = time.perf_counter(), sum(learned.values())
            for share in (0.2, 0.8):
                if total >= share * n and share not in marks:
                    marks[share] = (now, total)
            if total >= n and pending == 0:
                return n / (now - t0), _steady(marks)
            if any(p.poll() is not None for p in procs):
                raise RuntimeError(f"an instance exited: {(d / 'log0').read_text()[-2000:]}")
            time.sleep(0.05)  # polling interval of the measurement
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=120)


def _steady(marks: dict[float, tuple[float, int]]) -> float:
    """Records/s between the 20 % and 80 % marks: start-up and the final flush left out."""
    (t_a, n_a), (t_b, n_b) = marks[0.2], marks[0.8]
    return (n_b - n_a) / max(t_b - t_a, 1e-9)


def raw_loop(bootstrap: str, topic: str, n: int) -> tuple[float, float]:
    """Records/s of the raw loop: start to end, and in steady state."""
    out = f"raw-out-{uuid.uuid4().hex[:8]}"
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"raw-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    producer = KafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, acks="all")
    at = {int(share * n): share for share in (0.2, 0.8)}
    marks: dict[float, tuple[float, int]] = {}
    t0 = time.perf_counter()
    seen = 0
    for msg in consumer:
        rec = json.loads(msg.value)  # a raw job still has to decode its input
        producer.send(out, key=b"raw", value=json.dumps({"y": rec["y"]}).encode())
        seen += 1
        if seen in at:
            marks[at[seen]] = (time.perf_counter(), seen)
        if seen == n:
            break
    producer.flush()
    elapsed = time.perf_counter() - t0
    consumer.commit()
    consumer.close()
    producer.close()
    return n / elapsed, _steady(marks)


def raw_loop_confluent(bootstrap: str, topic: str, n: int) -> tuple[float, float]:
    """The raw loop on confluent-kafka: records/s start to end, and in steady state."""
    from confluent_kafka import Consumer, Producer

    out = f"raw-out-{uuid.uuid4().hex[:8]}"
    quiet = {"logger": logging.getLogger("kafka.librdkafka"), "log_level": 4}
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"raw-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            **quiet,
        }
    )
    consumer.subscribe([topic])
    producer = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", **quiet}
    )
    at = {int(share * n): share for share in (0.2, 0.8)}
    marks: dict[float, tuple[float, int]] = {}
    t0 = time.perf_counter()
    seen = 0
    while seen < n:
        for msg in consumer.consume(500, 1.0):
            if msg.error() is not None:
                continue
            rec = json.loads(msg.value())  # a raw job still has to decode its input
            producer.produce(out, json.dumps({"y": rec["y"]}).encode(), b"raw")
            seen += 1
            if seen in at:
                marks[at[seen]] = (time.perf_counter(), seen)
            if seen == n:
                break
        producer.poll(0)  # serve the delivery reports
    producer.flush()
    elapsed = time.perf_counter() - t0
    consumer.commit(asynchronous=False)
    consumer.close()
    return n / elapsed, _steady(marks)


def confluent_installed() -> bool:
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        return False
    return True


def local_config(buffer: int, dim: int) -> EngineConfig:
    """The benchmark's model with no Kafka around it (stdin in, stdout out, no checkpoint
    written): for learning outside the Kafka measurements."""
    return EngineConfig.model_validate(
        {
            "model": {"alpha": 1.0, "buffer": buffer, "features": [f"f{j}" for j in range(dim)],
                      **ONE_RELEASE_PER_RECORD},
            "source": {"kind": "jsonl", "path": "-"},
            "releases": {"kind": "stdout"},
            "dead_letters": {"kind": "stdout"},
            "checkpoint": {"path": "unused"},
        }
    )  # fmt: skip


def warm_up(buffer: int, dim: int) -> None:
    """Load the compiled kernels outside any measurement, as a scale-out instance does before
    it joins (``stream_dp.engine.kernels``): once per process, so whichever engine runs first
    does not pay for it."""
    load_kernels(local_config(buffer, dim))


def engine_loop(
    bootstrap: str, topic: str, n: int, buffer: int, dim: int, client: str
) -> tuple[float, float]:
    """Records/s of the engine: start to end (start-up, final flush and checkpoint included),
    and in steady state (read off its counters by a thread that wakes every 5 ms)."""
    tag = uuid.uuid4().hex[:8]
    d = Path(tempfile.mkdtemp())
    cfg = EngineConfig.model_validate(
        {
            "model": {
                "alpha": 1.0,
                "buffer": buffer,
                "model_id": f"bench-{tag}",
                "features": [f"f{j}" for j in range(dim)],
                **ONE_RELEASE_PER_RECORD,
            },
            "source": {
                "kind": "kafka",
                "topic": topic,
                "bootstrap_servers": bootstrap,
                "group_id": f"engine-{tag}",
            },
            "releases": {"kind": "kafka", "topic": f"rel-{tag}", "bootstrap_servers": bootstrap},
            "dead_letters": {
                "kind": "kafka",
                "topic": f"dead-{tag}",
                "bootstrap_servers": bootstrap,
            },
            "checkpoint": {"path": str(d / "m.ckpt"), **CYCLE},
            "status": {"interval_seconds": 3600},
            "kafka": {"client": client},
        }
    )
    engine = Engine(cfg, max_records=n)
    marks: dict[float, tuple[float, int]] = {}
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.005):
            learned = engine.stats.learned
            for share in (0.2, 0.8):
                if learned >= share * n and share not in marks:
                    marks[share] = (time.perf_counter(), learned)

    watcher = threading.Thread(target=watch, daemon=True)
    t0 = time.perf_counter()
    watcher.start()
    stats = engine.run()  # includes the final flush and checkpoint
    elapsed = time.perf_counter() - t0
    done.set()
    watcher.join()
    assert stats.learned == n, stats
    return n / elapsed, _steady(marks)


def report(
    base: list[tuple[float, float]], other: list[tuple[float, float]], base_name: str,
    other_name: str, ratio_name: str,
) -> None:  # fmt: skip
    """Print the medians of two measurements (start to end, steady state) and their ratio."""
    for i, what in ((0, "start to end"), (1, "steady state")):
        b = statistics.median(x[i] for x in base)
        o = statistics.median(x[i] for x in other)
        print(f"{base_name} ({what}) : {b:10.0f} records/s")
        print(f"{other_name} ({what}) : {o:10.0f} records/s")
        print(f"ratio {ratio_name} ({what}) : {o / b:10.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=60_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--buffer", type=int, default=64)
    ap.add_argument("--dim", type=int, default=8)
    ap.add_argument("--scale", action="store_true", help="also measure 1 and 2 processes")
    ap.add_argument("--raw-only", action="store_true", help="only the raw loops of the clients")
    ap.add_argument(
        "--every-records",
        type=int,
        help="records per commit cycle (checkpoint.every_records; default: the engine's)",
    )
    args = ap.parse_args()
    if args.every_records is not None:
        CYCLE["every_records"] = args.every_records
    rundir = Path(tempfile.mkdtemp(prefix="kafka-bench-"))
    bootstrap = subprocess.run(
        ["bash", str(KAFKA), "start", "--dir", str(rundir)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    try:
        topic = f"bench-in-{uuid.uuid4().hex[:8]}"
        produce(bootstrap, topic, args.records, args.dim)
        warm_broker(bootstrap)
        raw, raw_c = [], []
        confluent = confluent_installed()
        if not args.raw_only:
            warm_up(args.buffer, args.dim)
        clients = ["kafka-python", *(["confluent-kafka"] if confluent else [])]
        eng: dict[str, list[tuple[float, float]]] = {c: [] for c in clients}
        for _ in range(args.repeats):
            raw.append(raw_loop(bootstrap, topic, args.records))
            if confluent:
                raw_c.append(raw_loop_confluent(bootstrap, topic, args.records))
            if not args.raw_only:
                for c in clients:
                    eng[c].append(
                        engine_loop(bootstrap, topic, args.records, args.buffer, args.dim, c)
                    )
        print(
            f"records per run: {args.records}, d={args.dim}, FIFO({args.buffer}), "
            f"{args.repeats} repeats, one release message per record, CRC32C: {crc32c_kind()}, "
            f"commit cycle: {cycle_records()} records"
        )
        if confluent:
            report(raw, raw_c, "raw kafka-python consume→produce",
                   "raw confluent-kafka consume→produce",
                   "raw confluent-kafka / raw kafka-python")  # fmt: skip
        else:
            print("raw confluent-kafka: not installed (pip install 'stream-dp[confluent]')")
        if args.raw_only:
            return
        for c in clients:
            report(raw, eng[c], "raw kafka-python consume→produce",
                   f"stream_dp engine {c}, private, e2e",
                   f"engine {c} / raw kafka-python")  # fmt: skip
        if confluent:
            report(raw_c, eng["confluent-kafka"], "raw confluent-kafka consume→produce",
                   "stream_dp engine confluent-kafka, private, e2e",
                   "engine confluent-kafka / raw confluent-kafka")  # fmt: skip
            report(eng["kafka-python"], eng["confluent-kafka"],
                   "stream_dp engine kafka-python, private, e2e",
                   "stream_dp engine confluent-kafka, private, e2e",
                   "engine confluent-kafka / engine kafka-python")  # fmt: skip
        if args.scale:
            topic4 = f"bench-in4-{uuid.uuid4().hex[:8]}"
            from kafka import KafkaAdminClient

            admin = KafkaAdminClient(bootstrap_servers=bootstrap)
            admin.create_topics({topic4: {"num_partitions": 4}}, wait_for_metadata=True)
            admin.close()
            produce(bootstrap, topic4, args.records, args.dim, keyed=True)
            for c in clients:
                one, two = [], []
                for _ in range(args.repeats):
                    run = (bootstrap, topic4, args.records, args.buffer, args.dim)
                    one.append(scale_loop(*run, 1, c))
                    two.append(scale_loop(*run, 2, c))
                report(one, two, f"per-partition {c}, 1 process",
                       f"per-partition {c}, 2 processes", f"two / one process {c}")  # fmt: skip
    finally:
        subprocess.run(["bash", str(KAFKA), "stop", "--dir", str(rundir)], check=False)


if __name__ == "__main__":
    main()

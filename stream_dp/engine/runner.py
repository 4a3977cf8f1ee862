"""The streaming engine: source → validate → schema → learner → outbox → checkpoint → publish.

One release per step, ever
--------------------------
The invariant the engine keeps (``docs/privacy.md``, "The engine: one release per step"): for
every (model, run, step), at most one release content is ever published -- across crashes,
restarts, concurrent instances and any interleaving of input partitions. It follows from the
commit cycle of :mod:`stream_dp.engine.commit`: releases wait in an outbox until the checkpoint
that covers them (learner, ledger, positions, outbox) is durable, and only then are published,
atomically with the source offsets when Kafka is on both sides. A crash before the checkpoint
leaves nothing visible, so the replay may learn in any order; a crash after it re-publishes the
checkpointed bytes. A second instance is refused by the state directory's lock (same
machine) or by the evidence of the first one's commits, and fenced by Kafka's transactional id
(any machine).

Start-up
--------
1. Lock the state directory; remove leftovers of interrupted writes.
2. Check that a release fits the release sink, reach every Kafka cluster within
   ``kafka.startup_timeout_seconds``, check the input topic, create or check output topics.
3. Resume from the checkpoint -- refusing one of another run, or older than what was published
   -- or start a new run, refusing when the model existed before (run marker, orphaned
   journal, consumer-group commits, releases of this model id on the release topic) unless
   ``fresh=True``. A new run becomes the writer, then writes its first checkpoint, then its
   marker, so a kill at any point leaves nothing of it or a checkpoint to resume.
4. Become the model's writer (fencing any older one), publish what the checkpoint holds and
   the publication record lacks, and continue from the checkpoint's positions.

Exit codes of ``stream-dp run`` follow the exceptions: :class:`StateError` 3,
:class:`KafkaUnavailable` 4, :class:`Fenced` 5 (see :mod:`stream_dp.engine.cli`).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from connectors.schema import (
    DeadLetter,
    RecordError,
    ReleaseMessage,
    conform_features,
    parse_record,
)
from stream_dp.checkpoint import load_checkpoint
from stream_dp.engine.commit import (
    DEAD_LETTERS,
    RELEASES,
    CommitCycle,
    Outbox,
    Outputs,
    PublicationRecord,
    RunRefused,
)
from stream_dp.engine.config import EngineConfig, SinkConfig, SourceConfig, same_cluster
from stream_dp.engine.state import StateDir, StateLocked
from stream_dp.engine.status import (
    StatusWriter,
    dp_metrics_summary,
    dp_operator_metrics,
    note_unknown_features,
    raw_operator_metrics,
)
from stream_dp.records import InvalidRecord

__all__ = [
    "Engine",
    "EngineError",
    "EngineStats",
    "Fenced",
    "KafkaUnavailable",
    "StateError",
    "build_learner",
    "build_sink",
    "build_source",
]

log = logging.getLogger("stream_dp.engine")

#: Seconds a stop request (SIGTERM) waits for a publication in progress before leaving it to
#: the next start (the checkpoint holds it).
STOP_GRACE_SECONDS = 10.0


class EngineError(RuntimeError):
    """The engine cannot run or continue; ``exit_code`` is what ``stream-dp run`` returns."""

    exit_code = 1


class StateError(EngineError):
    """The state directory forbids running: it would reset, fork or roll back a ledger."""

    exit_code = 3


class KafkaUnavailable(EngineError):
    """Kafka is unreachable or misconfigured (at start), or stayed away past the deadline."""

    exit_code = 4


class Fenced(EngineError):
    """Another instance of this model took over its Kafka transactional id."""

    exit_code = 5


class _Interrupted(Exception):
    """A stop request arrived while the engine waited for Kafka."""


def build_learner(config: EngineConfig):
    """The private learner described by ``config.model``."""
    return config.model.build()


def build_source(cfg: SourceConfig):
    from connectors.sources import CsvSource, JsonlSource, KafkaSource

    if cfg.kind == "kafka":
        return KafkaSource(
            cfg.topic,
            cfg.bootstrap_servers,
            cfg.group_id,
            partitions=cfg.partitions,
            max_idle_seconds=cfg.max_idle_seconds,
            **cfg.security,
        )
    if cfg.kind == "jsonl":
        return JsonlSource(cfg.path)
    return CsvSource(cfg.path, cfg.label_column, cfg.feature_columns)


def build_sink(cfg: SinkConfig, *, private: bool = False):
    """A plain sink; ``private`` files (dead letters: raw records) are created mode 0600."""
    from connectors.sinks import JsonlSink, KafkaSink, StdoutSink

    if cfg.kind == "kafka":
        return KafkaSink(cfg.topic, cfg.bootstrap_servers, **cfg.security)
    if cfg.kind == "jsonl":
        return JsonlSink(cfg.path, file_mode=0o600 if private else None)
    return StdoutSink()


@dataclass
class EngineStats:
    """Counters of the model's run (restored from the checkpoint on restart)."""

    records: int = 0
    learned: int = 0
    releases: int = 0
    dead_letters: int = 0
    exhausted_skipped: int = 0
    unknown_features: int = 0
    records_with_unknown_features: int = 0
    started: float = field(default_factory=time.time)

    def to_dict(self) -> dict:
        return {
            "records": self.records,
            "learned": self.learned,
            "releases": self.releases,
            "dead_letters": self.dead_letters,
            "exhausted_skipped": self.exhausted_skipped,
            "unknown_features": self.unknown_features,
            "records_with_unknown_features": self.records_with_unknown_features,
        }


class Engine:
    """Runs one private learner over one source.

    Parameters
    ----------
    config
        A validated :class:`stream_dp.engine.config.EngineConfig` (with a declared schema).
    fresh
        Start a new run with a new budget even though the model existed (its files are kept
        aside, renamed). Without it, the engine never discards a ledger.
    source, releases, dead_letters
        Override the configured source and sinks (tests, embedding).
    max_records
        Stop after this many input messages (then commit and return).

    Examples
    --------
    >>> import json, tempfile, pathlib
    >>> from stream_dp.engine.config import EngineConfig
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> lines = [json.dumps({"x": {"a": i % 5 / 5, "b": i % 3 / 3}, "y": i % 2}) for i in range(50)]
    >>> _ = (d / "in.jsonl").write_text("\\n".join(lines + ["not json"]) + "\\n")
    >>> cfg = EngineConfig.model_validate({
    ...     "model": {"alpha": 1.0, "buffer": 16, "features": ["a", "b"]},
    ...     "source": {"kind": "jsonl", "path": str(d / "in.jsonl")},
    ...     "releases": {"kind": "jsonl", "path": str(d / "releases.jsonl")},
    ...     "dead_letters": {"kind": "jsonl", "path": str(d / "dead.jsonl")},
    ...     "checkpoint": {"path": str(d / "state" / "model.ckpt")}})
    >>> stats = Engine(cfg).run()
    >>> stats.learned, stats.dead_letters, stats.releases
    (50, 1, 50)

    """

    def __init__(
        self,
        config: EngineConfig,
        *,
        fresh: bool = False,
        source=None,
        releases=None,
        dead_letters=None,
        max_records: int | None = None,
    ) -> None:
        if config.model.features is None:
            raise ValueError("the engine needs a declared schema (model.features)")
        self.config = config
        self.fresh = fresh
        self.max_records = max_records
        self.learner = build_learner(config)
        self.state = StateDir(config.checkpoint.path)
        self._features = tuple(config.model.features)
        self._known = frozenset(self._features)
        self._source = source
        self._given_sinks = {RELEASES: releases, DEAD_LETTERS: dead_letters}
        self.outputs: Outputs | None = None
        self.cycle: CommitCycle | None = None
        self.stats = EngineStats()
        self.dead_counts: dict[str, int] = {}
        self._stop = threading.Event()
        self._stop_time: float | None = None
        self._since_commit = 0
        self._commit_clock = time.monotonic()
        self._status_clock = time.monotonic()
        self._status_records = 0
        self._idle_since: float | None = None
        self._outage_logged: float | None = None
        self.status_writer = StatusWriter(config.status.file, config.status.operator_raw_metrics)
        self.ckpt_path = self.state.checkpoint

    # -- wiring ------------------------------------------------------------------------------
    @property
    def source(self):
        return self._source

    @property
    def run_id(self) -> str | None:
        """The run being learned (None before start-up)."""
        return None if self.cycle is None else self.cycle.run_id

    @property
    def seq(self) -> int:
        """The current commit cycle's number."""
        return 0 if self.cycle is None else self.cycle.seq

    @property
    def outbox(self) -> Outbox:
        """What the current cycle will publish."""
        return Outbox() if self.cycle is None else self.cycle.outbox

    def _kafka_parts(self) -> dict[str, bool]:
        """Which configured parts are Kafka ones the engine opens itself (not overridden)."""
        cfg = self.config
        return {
            "source": self._source is None and cfg.source.kind == "kafka",
            RELEASES: self._given_sinks[RELEASES] is None and cfg.releases.kind == "kafka",
            DEAD_LETTERS: self._given_sinks[DEAD_LETTERS] is None
            and cfg.dead_letters.kind == "kafka",
        }

    def _open(self) -> None:
        from connectors.sources import KafkaSource

        cfg = self.config
        kafka = self._kafka_parts()
        if self._source is None:
            self._source = build_source(cfg.source)
        sinks: dict[str, Any] = {}
        topic_cfg: SinkConfig | None = None
        for stream, sink_cfg in ((RELEASES, cfg.releases), (DEAD_LETTERS, cfg.dead_letters)):
            given = self._given_sinks[stream]
            if given is not None:
                sinks[stream] = given
            elif kafka[stream]:
                sinks[stream] = sink_cfg.topic
                topic_cfg = sink_cfg
            else:
                sinks[stream] = build_sink(sink_cfg, private=stream == DEAD_LETTERS)
        publisher = None
        if topic_cfg is not None:
            from connectors.transactions import TransactionalPublisher

            attempt = cfg.kafka.attempt_timeout_seconds
            publisher = TransactionalPublisher(
                topic_cfg.bootstrap_servers,
                cfg.transactional_id,
                attempt_timeout_s=attempt,
                producer_config={
                    "max_request_size": cfg.releases.max_request_size,
                    "request_timeout_ms": int(min(30.0, attempt / 2) * 1000),
                    "delivery_timeout_ms": int(attempt * 1000),
                    # Back within seconds of the broker's return, not kafka-python's 30 s.
                    "reconnect_backoff_max_ms": 5000,
                },
                **topic_cfg.security,
            )
        kafka_source = self._source if isinstance(self._source, KafkaSource) else None
        self.outputs = Outputs(
            sinks,
            publisher=publisher,
            source=kafka_source,
            offsets_in_transaction=kafka_source is not None
            and topic_cfg is not None
            and same_cluster(cfg.source, topic_cfg),
            state=self.state,
        )
        self.cycle = CommitCycle(self.state, self.outputs, cfg.model.model_id)

    # -- start-up ------------------------------------------------------------------------------
    def _restore(self) -> dict:
        """Resume the checkpoint's run, or start a new run when that cannot fork a ledger."""
        state = self.state
        if self.fresh:
            for aside in state.set_aside():
                log.warning("--fresh: %s kept aside; its run is closed", aside)
        if state.checkpoint.exists():
            return self._resume()
        evidence = self._evidence_of_a_previous_run()
        if evidence:
            if not self.fresh:
                raise StateError(
                    f"model {self.config.model.model_id!r} existed before but its checkpoint "
                    f"{state.checkpoint} is missing: {'; '.join(evidence)}. Starting again would "
                    "reset its privacy ledger: restore the state directory, or pass --fresh to "
                    "start a new run with a new budget (it continues after the input consumed "
                    "so far)"
                )
            log.warning("--fresh: starting a new run although %s", "; ".join(evidence))
        return self._start_run()

    def _evidence_of_a_previous_run(self) -> list[str]:
        state, cfg = self.state, self.config
        found = []
        try:
            marker = state.read_marker()
        except (OSError, ValueError) as err:
            raise StateError(f"cannot read the run marker {state.marker}: {err}") from None
        if marker is not None:
            found.append(f"its run marker {state.marker.name} exists")
        if state.journal.exists():
            found.append(f"a ledger journal {state.journal.name} exists")
        record = self._record_before_start()
        if record is None:
            record = PublicationRecord(
                None, f"a transaction holds commits to consumer group {cfg.source.group_id!r}"
            )
        self.cycle.prior = record.published
        if record.foreign:
            found.append(record.foreign)
        elif record.published is not None:
            p = record.published
            where = (
                f"consumer group {cfg.source.group_id!r}"
                if self.outputs.source is not None
                else state.published_path.name
            )
            found.append(f"{where} records published cycle {p.seq} of its run {p.run_id}")
        if self._kafka_parts()[RELEASES]:
            from connectors.admin import latest_with_key

            rel = cfg.releases
            try:
                value = latest_with_key(
                    rel.bootstrap_servers,
                    rel.topic,
                    cfg.model.model_id.encode(),
                    timeout_s=cfg.kafka.startup_timeout_seconds,
                    **rel.security,
                )
            except Exception as err:  # noqa: BLE001 - a diagnosis, not a traceback
                raise KafkaUnavailable(
                    f"cannot read release topic {rel.topic!r} to check for earlier releases of "
                    f"model {cfg.model.model_id!r}: {err}"
                ) from None
            if value is not None:
                try:
                    last = ReleaseMessage.from_json(value)
                    found.append(
                        f"release topic {rel.topic!r} holds releases of it (run {last.run_id}, "
                        f"step {last.step})"
                    )
                except ValueError:
                    found.append(f"release topic {rel.topic!r} holds messages keyed by it")
        return found

    def _read_record(self, timeout_s: float | None = None) -> PublicationRecord:
        try:
            return self.outputs.record(timeout_s)
        except Exception as err:  # noqa: BLE001 - a diagnosis, not a traceback
            raise KafkaUnavailable(f"cannot read the consumer group's commits: {err}") from None

    def _record_before_start(self) -> PublicationRecord | None:
        """The record before becoming the writer, or None while a transaction holds it open.

        Offsets committed in a transaction are unreadable until it ends; a transaction left by
        a killed process ends only when the next writer starts (or after its timeout). A few
        seconds of "unstable" therefore mean an abandoned transaction: becoming the writer
        settles it, and the record is checked again right after.
        """
        try:
            return self.outputs.record(timeout_s=3.0)
        except Exception as err:  # noqa: BLE001 - judged below
            if "UnstableOffsetCommit" in repr(err) or "Timeout" in type(err).__name__:
                log.info("the consumer group's commits are held by an open transaction; "
                         "checking them after taking over")  # fmt: skip
                return None
            raise KafkaUnavailable(f"cannot read the consumer group's commits: {err}") from None

    def _start_run(self) -> dict:
        cfg = self.config
        self.cycle.new_run()
        # Writer first: that settles any transaction a previous run left open (its offsets are
        # unreadable until then), and a run that is fenced now has written nothing.
        self._become_writer()
        self.cycle.verify(self._read_record(), before_start=False)
        if cfg.checkpoint.ledger_journal:
            self._open_journal()
        try:
            start = getattr(self._source, "start", None)
            positions = start() if start is not None else self._source.positions()
        except Exception as err:  # noqa: BLE001 - a diagnosis, not a traceback
            raise KafkaUnavailable(f"cannot resolve where the input starts: {err}") from None
        # The first checkpoint fixes the noise secret and the run id before anything is
        # published; the marker follows it, so a kill in between leaves no marker without a
        # checkpoint.
        self._save(positions)
        self.cycle.mark()
        log.info(
            "started model %s, run %s: %s", cfg.model.model_id, self.run_id, self.learner.describe()
        )
        return positions

    def _resume(self) -> dict:
        cfg, state = self.config, self.state
        c = load_checkpoint(
            state.checkpoint,
            model_id=cfg.model.model_id,
            learner_class=type(self.learner).__name__,
            params=self.learner._get_params(),
        )
        self.cycle.resume(c.meta)
        acc_state = self.learner.ledger_state(c.learner_state)
        if "journal" in acc_state:  # it lives beside the checkpoint, wherever that moved
            acc_state["journal"] = {**acc_state["journal"], "path": str(state.journal)}
        self.learner.load_state_dict(c.learner_state)
        if cfg.checkpoint.ledger_journal and self.learner.accountant.storage.journal is None:
            self._open_journal()
        for k, v in c.meta.get("stats", {}).items():
            setattr(self.stats, k, v)
        self.dead_counts = dict(c.meta.get("dead_counts", {}))
        record = self._record_before_start()
        if record is not None:
            self.cycle.verify(record, before_start=True)
        log.info(
            "resumed model %s, run %s, at step %d (ε spent %.4g; cycle %d)",
            cfg.model.model_id,
            self.run_id,
            self.learner.step,
            self.learner.accountant.spent()[0],
            self.seq,
        )
        return dict(c.positions)

    def _open_journal(self) -> None:
        """Start journaling the ledger; a journal no checkpoint refers to is moved aside."""
        path = self.state.journal
        if path.exists():
            aside = path.with_name(f"{path.name}.orphaned-{int(time.time())}")
            path.replace(aside)
            log.warning("ledger journal %s is not referred to by the checkpoint: kept as %s",
                        path, aside)  # fmt: skip
        self.learner.accountant.storage.open_journal(path)

    def _become_writer(self) -> None:
        """Take the model's transactional id (fencing an older writer); idempotent."""
        from connectors.transactions import ProducerFenced

        try:
            self.outputs.start(on_retry=self._on_retry, on_wait=self._on_wait)
        except ProducerFenced as err:
            raise Fenced(str(err)) from None

    def _recover(self) -> None:
        """Become the writer, re-check the record, publish what the checkpoint holds."""
        self._become_writer()
        self._fenced_as_engine_error(
            self.cycle.recover, self._source.positions(), self._read_record(), **self._hooks()
        )

    def _hooks(self) -> dict:
        return {"on_retry": self._on_retry, "on_wait": self._on_wait}

    def _fenced_as_engine_error(self, fn, *args, **kwargs) -> None:
        from connectors.transactions import ProducerFenced

        try:
            fn(*args, **kwargs)
        except ProducerFenced as err:
            raise Fenced(
                f"{err}; the {len(self.outbox)} message(s) of cycle {self.seq} were not published"
            ) from None
        finally:
            self._watch_outage()

    # -- the commit cycle --------------------------------------------------------------------
    def _learner_state(self) -> dict:
        state = self.learner.state_dict()
        acc = self.learner.ledger_state(state)
        if "journal" in acc:  # named relative to the checkpoint, so the directory can move
            acc["journal"] = {**acc["journal"], "path": self.state.journal.name}
        return state

    def _meta(self) -> dict:
        return {"stats": self.stats.to_dict(), "dead_counts": dict(self.dead_counts)}

    def _save(self, positions: dict) -> None:
        try:
            self.cycle.save(self._learner_state(), positions, self._meta())
        except OSError as err:
            raise StateError(f"cannot write checkpoint {self.state.checkpoint}: {err}") from None

    def commit(self, *, publish: bool = True) -> None:
        """End the cycle: checkpoint (learner, ledger, positions, outbox), then publish it."""
        positions = self._source.positions()
        if not self.cycle.pending(positions):
            return
        self._since_commit = 0
        self._commit_clock = time.monotonic()
        try:
            self.cycle.checkpoint(self._learner_state(), positions, self._meta())
        except OSError as err:
            raise StateError(f"cannot write checkpoint {self.state.checkpoint}: {err}") from None
        if publish:
            self._fenced_as_engine_error(self.cycle.publish, positions, **self._hooks())

    def _cycle_due(self, idle: bool) -> bool:
        ck = self.config.checkpoint
        if not len(self.outbox) and self._since_commit == 0:
            return False
        return (
            idle
            or self._since_commit >= ck.every_records
            or self.outbox.nbytes >= ck.max_pending_bytes
            or time.monotonic() - self._commit_clock >= ck.every_seconds
        )

    # -- outages, stops, deadlines ---------------------------------------------------------------
    @property
    def broker_unreachable_since(self) -> float | None:
        """Wall time since which Kafka has not answered (source or publisher), or None."""
        times = [
            getattr(self._source, "unreachable_since", None),
            getattr(self.outputs.publisher, "failing_since", None) if self.outputs else None,
        ]
        times = [t for t in times if t is not None]
        return min(times) if times else None

    def _watch_outage(self) -> None:
        since = self.broker_unreachable_since
        if since is not None and self._outage_logged is None:
            self._outage_logged = since
            log.warning(
                "Kafka unreachable since %s; riding it out%s",
                time.strftime("%H:%M:%S", time.localtime(since)),
                ""
                if self.config.kafka.outage_deadline_seconds is None
                else f" for up to {self.config.kafka.outage_deadline_seconds:.0f} s",
            )
        elif since is None and self._outage_logged is not None:
            log.warning("Kafka reachable again after %.0f s", time.time() - self._outage_logged)
            self._outage_logged = None

    def _check_deadline(self) -> None:
        limit = self.config.kafka.outage_deadline_seconds
        since = self.broker_unreachable_since
        if limit is not None and since is not None and time.time() - since >= limit:
            raise KafkaUnavailable(
                f"Kafka unreachable since {time.strftime('%H:%M:%S', time.localtime(since))} "
                f"({time.time() - since:.0f} s, kafka.outage_deadline_seconds = {limit:g}): "
                "stopped cleanly; the state is checkpointed and the next start continues"
            )

    def _on_wait(self) -> None:
        self._watch_outage()
        now = time.monotonic()
        if now - self._status_clock >= self.config.status.interval_seconds:
            self._report_status(now, probe=False)
        if self._stop_time is not None and now - self._stop_time >= STOP_GRACE_SECONDS:
            raise _Interrupted()
        self._check_deadline()

    def _on_retry(self, err: BaseException) -> None:
        self._on_wait()

    # -- loop ----------------------------------------------------------------------------
    def stop(self) -> None:
        """Finish the current batch, commit and return from :meth:`run` (thread-safe)."""
        if self._stop_time is None:
            self._stop_time = time.monotonic()
        self._stop.set()

    def run(self) -> EngineStats:
        """Process the source until it ends, ``max_records`` is reached or :meth:`stop`."""
        from connectors.admin import KafkaProblem
        from stream_dp.engine.preflight import check_kafka, release_size

        try:
            self.state.acquire()
        except StateLocked as err:
            raise StateError(str(err)) from None
        except OSError as err:
            raise StateError(f"cannot use state directory {self.state.dir}: {err}") from None
        handlers = self._install_signals()
        try:
            self.state.remove_temporaries()
            release_bytes, _ = release_size(self.config)
            kafka = self._kafka_parts()
            if any(kafka.values()):
                try:
                    check_kafka(self._checked_config(kafka), release_bytes)
                except KafkaProblem as err:
                    raise KafkaUnavailable(str(err)) from None
            self._open()
            positions = self._restore()
            self._source.seek(positions)
            self._recover()
            self._loop()
            try:
                self.commit()
            except _Interrupted:
                self._report_interrupted()
            self._report_status(time.monotonic())
        except _Interrupted:
            self._report_interrupted()
        except KafkaUnavailable:
            self._give_up_outage()
            raise
        except RunRefused as err:
            raise StateError(str(err)) from None
        finally:
            self._restore_signals(handlers)
            self.learner.accountant.storage.close()  # flushes and unlocks a journal
            if self.outputs is not None:
                self.outputs.close()
            if self._source is not None:
                try:
                    self._source.close()
                except Exception:  # noqa: BLE001 - closing must not mask the real error
                    log.exception("error while closing the source")
            self.state.release()
        return self.stats

    def _checked_config(self, kafka: dict[str, bool]) -> EngineConfig:
        """The config with the parts the caller overrode replaced by non-Kafka stand-ins."""
        cfg = self.config
        stand_in = SinkConfig(kind="stdout")
        return cfg.model_copy(
            update={
                "source": cfg.source if kafka["source"] else SourceConfig(kind="jsonl", path="-"),
                "releases": cfg.releases if kafka[RELEASES] else stand_in,
                "dead_letters": cfg.dead_letters if kafka[DEAD_LETTERS] else stand_in,
            }
        )

    def _give_up_outage(self) -> None:
        """At the outage deadline: keep what was learned (checkpoint only) for the restart."""
        cycle = self.cycle
        if cycle is None or cycle.committed_positions is None or cycle.unpublished:
            return
        try:
            self.commit(publish=False)
        except EngineError as err:
            log.error("could not checkpoint before stopping: %s", err)

    def _report_interrupted(self) -> None:
        log.warning(
            "stopped while waiting for Kafka: the %d message(s) of cycle %d are checkpointed and "
            "published at the next start",
            len(self.outbox),
            self.seq,
        )

    def _loop(self) -> None:
        source = self._source
        every = self.config.checkpoint.every_records
        while not self._stop.is_set():
            # A batch never crosses a cycle boundary: the source counts a polled batch as
            # consumed, so a cycle must end between batches.
            want = max(1, min(500, every - self._since_commit))
            if self.max_records is not None:
                want = min(want, self.max_records - self.stats.records)
                if want <= 0:
                    break
            batch = source.poll(max_records=want, timeout_s=0.5)
            if batch is None:
                break
            for msg in batch:
                self._handle(msg)
            self._since_commit += len(batch)
            if batch:
                self._idle_since = None
            elif self._idle_since is None:
                self._idle_since = time.time()
            if self._cycle_due(idle=not batch):
                self.commit()
            now = time.monotonic()
            if now - self._status_clock >= self.config.status.interval_seconds:
                self._report_status(now)
            self._watch_outage()
            self._check_deadline()

    def _dead(self, reason: str, message: str, msg) -> None:
        letter = DeadLetter.from_raw(reason, message, msg.value, msg.position)
        self.outbox.add(DEAD_LETTERS, letter.reason, letter.to_json())
        self.dead_counts[letter.reason] = self.dead_counts.get(letter.reason, 0) + 1

    def _handle(self, msg) -> None:
        self.stats.records += 1
        try:
            record = parse_record(msg.value, max_bytes=self.config.max_message_bytes)
            x, n_unknown = conform_features(record, self._features, self._known)
        except RecordError as err:
            self._dead(err.reason, err.message, msg)
            self.stats.dead_letters += 1
            return
        if n_unknown:
            self.stats.unknown_features += n_unknown
            self.stats.records_with_unknown_features += 1
        learner = self.learner
        step_before = learner.step
        try:
            learner.learn_one(x, record.y)
        except InvalidRecord as err:
            self._dead(err.reason, str(err), msg)
            self.stats.dead_letters += 1
            return
        if learner.step == step_before:
            # The budget is spent: the record is valid but can no longer be learned from.
            self._dead(
                "budget_exhausted",
                "the model's privacy budget is spent; it serves its last release",
                msg,
            )
            self.stats.exhausted_skipped += 1
            return
        self.stats.learned += 1
        if n_unknown:
            note_unknown_features(learner)
        if learner.release_step == learner.step:
            fields = learner.release_message()
            fields.setdefault("private", not self.config.model.reproducible)
            release = ReleaseMessage(**fields, run_id=self.run_id, time=time.time())
            self.outbox.add(RELEASES, release.model_id, release.to_json())
            self.stats.releases += 1

    # -- status ----------------------------------------------------------------------------
    def status(self, now: float | None = None, *, probe: bool = True) -> dict:
        """Operator status: counters, budget, lag, idleness, outages (no raw statistics)."""
        now = time.monotonic() if now is None else now
        elapsed = max(now - self._status_clock, 1e-9)
        rate = (self.stats.records - self._status_records) / elapsed
        acc = self.learner.accountant
        eps, delta = acc.spent()
        lag = None
        lag_fn = getattr(self._source, "lag", None)
        if probe and lag_fn is not None:
            try:
                lag = lag_fn(timeout_s=2.0)
            except TypeError:
                lag = lag_fn()
            except Exception:  # noqa: BLE001 - status must never stop the engine
                lag = None
        cycle, cycle_time = (0, None) if self.cycle is None else self.cycle.last_published
        return {
            "time": time.time(),
            "model_id": self.config.model.model_id,
            "run_id": self.run_id,
            "private": not self.config.model.reproducible,
            "records_per_s": round(rate, 1),
            "step": self.learner.step,
            "epsilon_spent": eps,
            "epsilon_budget": self.learner.epsilon,
            "delta": delta,
            "rho_spent": acc.rho_spent(),
            "rho_budget": self.learner.budget.limit,
            "exhausted": self.learner.exhausted,
            "dead_letter_reasons": dict(self.dead_counts),
            "consumer_lag": lag,
            "skipped_records": getattr(self._source, "skipped_records", 0),
            "idle_since": self._idle_since,
            "broker_unreachable_since": self.broker_unreachable_since,
            "last_published_cycle": cycle,
            "last_published_at": cycle_time,
            "pending_messages": len(self.outbox),
            **self.stats.to_dict(),
            "dp_metrics": dp_operator_metrics(self.learner),
        }

    def _report_status(self, now: float, *, probe: bool = True) -> None:
        s = self.status(now, probe=probe)
        log.info(
            "step=%d rec/s=%.0f ε=%.4g/%.4g dead=%d lag=%s releases=%d pending=%d%s%s",
            s["step"],
            s["records_per_s"],
            s["epsilon_spent"],
            s["epsilon_budget"],
            self.stats.dead_letters,
            s["consumer_lag"],
            self.stats.releases,
            s["pending_messages"],
            " (idle)" if s["idle_since"] else "",
            dp_metrics_summary(s["dp_metrics"]),
        )
        raw = raw_operator_metrics(self.learner) if self.status_writer.raw_path else None
        try:
            self.status_writer.write(s, raw)
        except OSError as err:
            log.warning("cannot write status: %s", err)
        self._status_clock = now
        self._status_records = self.stats.records

    # -- signals -----------------------------------------------------------------------------
    def _install_signals(self) -> dict:
        if threading.current_thread() is not threading.main_thread():
            return {}
        old = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            old[sig] = signal.signal(sig, lambda *_: self.stop())
        return old

    @staticmethod
    def _restore_signals(old: dict[Any, Any]) -> None:
        for sig, handler in old.items():
            signal.signal(sig, handler)

"""How a run starts: resumed from its checkpoint, started new, or refused.

The start-up half of :class:`stream_dp.engine.runner.Engine` (a mixin it inherits): lock the
state directory, check the sinks and reach Kafka, then resume from the checkpoint -- refusing one
of another run, or older than what was published -- or start a new run, refusing when the model
existed before (run marker, orphaned journal, consumer-group commits, releases of this model id
on the release topic) unless ``fresh=True``. A new run becomes the writer, writes its first
checkpoint, then its marker, so a kill at any point leaves nothing of it or a checkpoint to
resume (``docs/privacy.md``, *The engine: one release per step*).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from connectors.schema import ReleaseMessage
from stream_dp.engine.builders import build_sink, build_source
from stream_dp.engine.commit import (
    CHECKPOINTS,
    DEAD_LETTERS,
    RELEASES,
    CommitCycle,
    Outputs,
    PublicationRecord,
)
from stream_dp.engine.config import SinkConfig, same_cluster
from stream_dp.engine.errors import Fenced, KafkaUnavailable, StateError
from stream_dp.engine.master_secret import checkpoint_key, open_checkpoint

__all__ = ["CHECKPOINT_MESSAGE_BYTES", "RunStart"]

log = logging.getLogger("stream_dp.engine")

#: Limit on one checkpoint in the checkpoint topic (its ``max.message.bytes``).
CHECKPOINT_MESSAGE_BYTES = 8 * 1024 * 1024


class RunStart:
    """Start-up of an engine run (see the module docstring); mixed into ``Engine``."""

    def _open(self) -> None:
        from connectors.partition import PartitionSource
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
        if cfg.scale.checkpoint_topic is not None:
            sinks[CHECKPOINTS] = cfg.scale.checkpoint_topic
        publisher = None
        if topic_cfg is not None:
            from connectors._settings import release_compression
            from connectors.transactions import TransactionalPublisher

            attempt = cfg.kafka.attempt_timeout_seconds
            publisher = TransactionalPublisher(
                topic_cfg.bootstrap_servers,
                cfg.transactional_id,
                attempt_timeout_s=attempt,
                producer_config={
                    "max_request_size": max(
                        cfg.releases.max_request_size,
                        CHECKPOINT_MESSAGE_BYTES if cfg.scale.checkpoint_topic else 0,
                    ),
                    "request_timeout_ms": int(min(30.0, attempt / 2) * 1000),
                    "delivery_timeout_ms": int(attempt * 1000),
                    # Back within seconds of the broker's return, not kafka-python's 30 s.
                    "reconnect_backoff_max_ms": 5000,
                    # A cycle's messages are sent in one burst and flushed by the commit:
                    # large batches (fewer requests, fewer wake-ups of the producer's I/O
                    # thread) cost no latency (docs/performance.md, "Kafka end to end").
                    "batch_size": 256 * 1024,
                    "linger_ms": 5,
                    "compression_type": release_compression(),
                    # kafka-python waits retry_backoff_ms (default 100) before each retry of a
                    # coordinator lookup, and finding the transaction and group coordinators
                    # takes a retry or two: 20 ms (the backoff the Java client uses for a
                    # transaction still completing) cut init_transactions from ~0.2 s to
                    # ~0.05 s, and a learner's start with it. Reconnects keep their own backoff.
                    "retry_backoff_ms": 20,
                },
                **topic_cfg.security,
            )
        kafka_source = (
            self._source if isinstance(self._source, KafkaSource | PartitionSource) else None
        )
        self.outputs = Outputs(
            sinks,
            publisher=publisher,
            source=kafka_source,
            offsets_in_transaction=kafka_source is not None
            and topic_cfg is not None
            and same_cluster(cfg.source, topic_cfg),
            state=self.state,
        )
        model_id, secret = cfg.model.model_id, self._secret
        seal_key = None if secret is None else checkpoint_key(secret, model_id)
        self.cycle = CommitCycle(self.state, self.outputs, model_id, seal_key)

    # -- start-up ------------------------------------------------------------------------------
    def _restore(self) -> dict:
        """Resume the checkpoint's run, or start a new run when that cannot fork a ledger."""
        state = self.state
        if self.fresh:
            for aside in state.set_aside():
                log.warning("--fresh: %s kept aside; its run is closed", aside)
        if not state.checkpoint.exists() and not self.fresh and self.config.scale.checkpoint_topic:
            self._checkpoint_from_topic()
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

    def _checkpoint_from_topic(self) -> None:
        """Put the learner's latest published checkpoint from the checkpoint topic in place.

        The checkpoint must be sealed under the learner's key (derived from the master
        secret), for its model id (``<model>/p<k>``: model and partition); its checksums are
        checked before it is used. A damaged, unsealed or foreign one is refused.
        """
        from connectors.admin import latest_with_key
        from stream_dp.checkpoint import CheckpointError, write_private

        cfg, state = self.config, self.state
        topic, rel, model_id = cfg.scale.checkpoint_topic, cfg.releases, cfg.model.model_id
        try:
            value = latest_with_key(
                rel.bootstrap_servers,
                topic,
                model_id.encode(),
                tail=512,
                timeout_s=cfg.kafka.startup_timeout_seconds,
                **rel.security,
            )
        except Exception as err:  # noqa: BLE001 - a diagnosis, not a traceback
            raise KafkaUnavailable(f"cannot read checkpoint topic {topic!r}: {err}") from None
        if value is None:
            return
        candidate = state.checkpoint.with_name(state.checkpoint.name + ".from-topic")
        try:
            write_private(candidate, value)
            open_checkpoint(
                candidate,
                self._secret,
                model_id=model_id,
                learner_class=type(self.learner).__name__,
                params=self.learner._get_params(),
                from_topic=True,
            )
        except CheckpointError as err:
            candidate.unlink(missing_ok=True)
            raise StateError(
                f"the checkpoint of {model_id!r} in topic {topic!r} is refused: {err}"
            ) from None
        except OSError as err:
            raise StateError(f"cannot write checkpoint {state.checkpoint}: {err}") from None
        candidate.replace(state.checkpoint)
        log.info("checkpoint of %s taken from topic %s", model_id, topic)

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
        # Both Kafka readings are read-only and each costs a coordinator or fetch round trip:
        # the release topic's tail is read beside the group's record.
        tail = None
        if self._kafka_parts()[RELEASES]:
            with ThreadPoolExecutor(1, thread_name_prefix="stream-dp-startup") as pool:
                tail = pool.submit(self._latest_release)
                record = self._record_before_start()
        else:
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
        value = None if tail is None else tail.result()
        if value is not None:
            rel = cfg.releases
            try:
                last = ReleaseMessage.from_json(value)
                found.append(
                    f"release topic {rel.topic!r} holds releases of it (run {last.run_id}, "
                    f"step {last.step})"
                )
            except ValueError:
                found.append(f"release topic {rel.topic!r} holds messages keyed by it")
        return found

    def _latest_release(self) -> bytes | None:
        """The latest message keyed by the model on the release topic, or None."""
        from connectors.admin import latest_with_key

        cfg = self.config
        rel = cfg.releases
        try:
            return latest_with_key(
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
        c = open_checkpoint(
            state.checkpoint,
            self._secret,
            model_id=cfg.model.model_id,
            learner_class=type(self.learner).__name__,
            params=self.learner._get_params(),
        )
        self.cycle.resume(c.meta)
        if self._secret is not None:
            c.learner_state["secret"] = self._secret
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

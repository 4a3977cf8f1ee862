"""Per-partition scale-out: one learner per input partition, partitions assigned by Kafka.

With ``scale.mode = "per-partition"`` every instance of a model joins the source's consumer
group with ``subscribe()``; Kafka's group protocol decides which instance reads which
partition. Partition ``k`` feeds its own learner ``<model_id>/p<k>`` -- its own noise key,
ledger, buffer, checkpoint (``<checkpoint dir>/p<k>/``), commit cycle and transactional id
(``stream-dp.<model_id>/p<k>``) -- run by an :class:`stream_dp.engine.runner.Engine` fed by a
:class:`connectors.partition.PartitionSource`.

Exactly once across rebalances
------------------------------
Both clients rebalance eagerly (kafka-python always, confluent-kafka with librdkafka's default
assignors): every member gives up its partitions before any member gets new ones. On
``on_partitions_revoked`` an instance ends the cycle of each partition it loses (checkpoint,
then one transaction with the releases and the partition's offset, carrying the consumer's
group metadata: KIP-447) and unlocks its state; on ``on_partitions_assigned`` the instance that
gains a partition resumes that learner from its checkpoint exactly as a restarted
single-learner engine does: it takes the partition's transactional id (fencing a zombie that
still believes it owns it), publishes the checkpoint's outbox unless the group's commit tag
shows it published, and continues at the checkpoint's position. Records within one partition
come in Kafka's order, so a replay after a crash learns them in the same order and re-derives
the same releases; and a release is only ever published from a durable checkpoint
(:mod:`stream_dp.engine.commit`). Hence, per partition learner, one release content per step.

Secrets
-------
Each partition learner's secret is derived from the instances' shared master secret
(:mod:`stream_dp.engine.master_secret`); checkpoints never hold the secret and are sealed
under a key derived from it (:mod:`stream_dp.sealing`).

Status
------
Each instance writes its own status file (a local view) and publishes the same summary to the
status topic; ``stream-dp status`` joins those heartbeats with the consumer group's current
assignment into the cluster's view (:mod:`stream_dp.engine.heartbeat`).

Accounting
----------
A person's records are all in one partition only if the producer keys records by the person
(``scale.privacy_unit_key = true``): then the partition learners see disjoint people and
compose in parallel -- a person's guarantee is the largest partition's. Otherwise a person may
be in every partition and the guarantees add up (``docs/privacy.md``, "Scale-out").
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from connectors._retry import Backoff
from stream_dp.engine.commit import MAX_BATCH
from stream_dp.engine.config import EngineConfig
from stream_dp.engine.errors import StateError
from stream_dp.engine.heap import freeze_start_up
from stream_dp.engine.heartbeat import (
    StatusPublisher,
    member_client_id,
    status_topic,
    status_topic_configs,
)
from stream_dp.engine.kernels import load_kernels
from stream_dp.engine.master_secret import check_master_secret, partition_secret
from stream_dp.engine.metrics_snapshot import EngineSnapshot, LearnerSnapshot
from stream_dp.engine.prometheus import MetricsServer, metrics_server
from stream_dp.engine.runner import Engine
from stream_dp.engine.state import StateLocked
from stream_dp.engine.status import StatusWriter
from stream_dp.engine.stopping import Abandoned, StopRequest

__all__ = ["ScaleOut", "composition", "partition_config"]

log = logging.getLogger("stream_dp.engine")

#: Polls in a row that meet a partition without a position before the instance says so (a
#: gained partition has one from its learner within a poll or two; at most 500 ms each).
NO_OFFSET_WARN_POLLS = 20


def partition_config(config: EngineConfig, partition: int) -> EngineConfig:
    """The config of partition ``partition``'s learner: its model id, state directory, no
    status and no metrics endpoint (the instance serves one for all its learners).

    Examples
    --------
    >>> from stream_dp.engine.config import EngineConfig
    >>> cfg = EngineConfig.model_validate({
    ...     "model": {"features": ["a"], "model_id": "bank"},
    ...     "source": {"kind": "kafka", "topic": "t", "bootstrap_servers": "b", "group_id": "g"},
    ...     "releases": {"kind": "kafka", "topic": "r", "bootstrap_servers": "b"},
    ...     "dead_letters": {"kind": "stdout"},
    ...     "checkpoint": {"path": "state/model.ckpt"}, "scale": {"mode": "per-partition"}})
    >>> p = partition_config(cfg, 3)
    >>> p.model.model_id, p.checkpoint.path, p.transactional_id
    ('bank/p3', 'state/p3/model.ckpt', 'stream-dp.bank/p3')
    >>> p.metrics.prometheus_port is None
    True
    """
    ckpt = Path(config.checkpoint.path)
    return config.model_copy(
        update={
            "model": config.model.model_copy(
                update={"model_id": f"{config.model.model_id}/p{partition}"}
            ),
            "checkpoint": config.checkpoint.model_copy(
                update={"path": str(ckpt.parent / f"p{partition}" / ckpt.name)}
            ),
            "status": config.status.model_copy(update={"file": None, "operator_raw_metrics": None}),
            "metrics": config.metrics.model_copy(update={"prometheus_port": None}),
        }
    )


def composition(rho_by_partition: dict[int, float], privacy_unit_key: bool) -> dict[str, Any]:
    """What a person's guarantee is across partition learners, in zCDP's ρ.

    Parallel composition (records keyed by the privacy unit: one person, one partition) gives
    the maximum over partitions; otherwise a person may be in every partition and the ρ add up.

    Examples
    --------
    >>> composition({0: 0.1, 1: 0.3}, privacy_unit_key=True)["rho"]
    0.3
    >>> round(composition({0: 0.1, 1: 0.3}, privacy_unit_key=False)["rho"], 6)
    0.4
    """
    values = list(rho_by_partition.values())
    parallel, total = max(values, default=0.0), sum(values)
    return {
        "composition": "parallel (max over partitions)"
        if privacy_unit_key
        else "sequential (sum over partitions)",
        "rho": parallel if privacy_unit_key else total,
        "rho_parallel": parallel,
        "rho_sum": total,
    }


class _ListenerError(Exception):
    """Carries an error out of a rebalance callback (kafka-python would only log it)."""


class ScaleOut:
    """One instance of a per-partition model: a group consumer and a learner per partition.

    Parameters
    ----------
    config : EngineConfig
        With ``scale.mode = "per-partition"``.
    master_secret : int
        The model's master secret (the same on every instance); a weak one is refused
        (:func:`~stream_dp.engine.master_secret.check_master_secret`).
    fresh : bool
        Passed to each partition learner (see :class:`Engine`).
    max_records : int, optional
        Stop after this many input messages (over all partitions).
    instance : str, optional
        Name of this instance (default ``<host name>-<pid>``): its status file is
        ``<status stem>.<instance><suffix>``; its group consumer's client id and the key of
        its heartbeat on the status topic carry it (:mod:`stream_dp.engine.heartbeat`).

    With ``[metrics] prometheus_port`` the instance serves ``/metrics`` for all the partition
    learners it holds (:mod:`stream_dp.engine.prometheus`), from before it joins the group
    until :meth:`run` returns; instances on one machine need one port each.

    Examples
    --------
    >>> ScaleOut(config, master_secret=load_master_secret(path, env)).run()  # doctest: +SKIP
    """

    def __init__(
        self,
        config: EngineConfig,
        *,
        master_secret: int,
        fresh: bool = False,
        max_records: int | None = None,
        instance: str | None = None,
    ) -> None:
        if config.scale.mode != "per-partition":
            raise ValueError('ScaleOut needs scale.mode = "per-partition"')
        self.config = config
        self.master_secret = check_master_secret(master_secret)
        self.fresh = fresh
        self.max_records = max_records
        self.engines: dict[int, Engine] = {}
        #: Held around the partition sources' calls to the shared consumer (parallel starts).
        self._consumer_lock = threading.Lock()
        #: Input messages this instance has handed to its partition learners.
        self.records = 0
        self._consumer: Any = None
        self._error: BaseException | None = None
        self._gained: list[Any] = []
        #: ``time.time()`` since which the group consumer has not reached Kafka (None: it has).
        self.unreachable_since: float | None = None
        self._backoff = Backoff(maximum=10.0, logger=log, what="Kafka group consume")
        self._no_offset_polls = 0  # polls in a row that met a partition without a position
        self.stopping = StopRequest()
        #: This instance's name in the status (owner of its partitions).
        self.instance = instance or f"{socket.gethostname()}-{os.getpid()}"
        #: Per partition held: (wall time taken, wall time last driven by the loop).
        self._held: dict[int, list[float]] = {}
        status_file = config.status.file
        if status_file is not None and instance is not None:
            if not instance.replace("-", "").replace("_", "").isalnum():
                raise ValueError(f"instance name {instance!r}: letters, digits, - and _ only")
            path = Path(status_file)
            status_file = str(path.with_name(f"{path.stem}.{instance}{path.suffix}"))
        self.status_writer = StatusWriter(status_file, None)
        self._status_clock = time.monotonic()
        #: Publishes the status to the status topic (:mod:`stream_dp.engine.heartbeat`).
        self._heartbeat: StatusPublisher | None = None
        #: The Prometheus endpoint of this instance (None without a configured port).
        self.metrics: MetricsServer | None = metrics_server(config)

    # -- partitions come and go ------------------------------------------------------------
    def _engine(self, partition: int) -> Engine:
        from connectors.partition import PartitionSource

        cfg = partition_config(self.config, partition)
        source = PartitionSource(
            self._consumer,
            cfg.source.topic,
            partition,
            cfg.source.group_id,
            lock=self._consumer_lock,
        )
        return Engine(
            cfg,
            fresh=self.fresh,
            source=source,
            secret=partition_secret(self.master_secret, cfg.model.model_id),
        )

    def _take(self, assigned: list[Any]) -> None:
        """Start the learners of the gained partitions, in parallel.

        A learner's start is a dozen Kafka round trips (checks, fencing, its first
        transaction), ~0.6 s, most of it waiting: started side by side, four partitions take
        over in about the time of one. Their sources share the consumer under one lock.
        """
        pending: list[tuple[int, Engine]] = []
        try:
            for tp in sorted(assigned, key=lambda tp: tp.partition):
                if tp.topic != self.config.source.topic or tp.partition in self.engines:
                    continue
                engine = self._engine(tp.partition)
                pending.append((tp.partition, engine))
                self._lock_state(engine)
        except BaseException:
            for _, engine in pending:
                engine.close()
            raise
        if not pending:
            return
        with ThreadPoolExecutor(len(pending), thread_name_prefix="stream-dp-take") as pool:
            started = [(k, engine, pool.submit(engine.start)) for k, engine in pending]
        errors = []
        for k, engine, done in started:
            err = done.exception()
            if err is not None:
                errors.append(err)
                engine.close()
                continue
            self.engines[k] = engine
            now = time.time()
            self._held[k] = [now, now]
            log.info("partition %d: learner %s at step %d", k,
                     engine.config.model.model_id, engine.learner.step)  # fmt: skip
        self._retract_claims([k for k, _ in pending if k in self.engines])
        for err in errors[1:]:  # the first is raised; the others must not vanish
            log.error("another gained partition failed to start too: %s", err)
        if errors:
            raise errors[0]

    def _lock_state(self, engine: Engine) -> None:
        """Lock the partition's state directory, waiting for its previous owner to let go.

        The previous owner unlocks a partition's state when it hands it over; one that was
        killed unlocks it by dying. Wait a session timeout for a slow hand-over.
        """
        deadline = time.monotonic() + 2 * self.config.scale.session_timeout_ms / 1000
        while True:
            try:
                engine.state.acquire()
                return
            except StateLocked as err:
                if time.monotonic() >= deadline:
                    raise StateError(str(err)) from None
                time.sleep(0.2)  # a bounded wait for the lock, re-checked

    def _release(self, revoked: list[Any]) -> None:
        for tp in sorted(revoked, key=lambda tp: tp.partition):
            engine = self.engines.pop(tp.partition, None)
            self._held.pop(tp.partition, None)
            if engine is None:
                continue
            try:
                engine.finish(probe=False)  # inside the rebalance callback: no lag
                log.info("partition %d: handed over at step %d", tp.partition, engine.learner.step)
            finally:
                engine.close()

    def _drop(self, lost: list[Any]) -> None:
        for tp in lost:
            engine = self.engines.pop(tp.partition, None)
            self._held.pop(tp.partition, None)
            if engine is not None:
                log.warning("partition %d: lost (evicted from the group); not publishing "
                            "its open cycle", tp.partition)  # fmt: skip
                engine.close()

    def _listener(self) -> Any:
        from kafka import ConsumerRebalanceListener

        owner = self

        # Either client runs these inside the consumer's poll(), while run() waits in it:
        # no blocking consumer call is made there. Ending a lost partition's cycle needs
        # only the checkpoint and the partition's own producer, so it happens here, before
        # the rebalance completes; a gained partition is paused and taken up by run() after
        # the poll (resuming needs the group's committed offsets).
        class Listener(ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked):
                owner._guarded(owner._release, list(revoked))

            def on_partitions_lost(self, lost):
                # Evicted (session expired): another instance may own them already. Publish
                # nothing more; its new owner resumes from the last checkpoint and fences us.
                owner._guarded(owner._drop, list(lost))

            def on_partitions_assigned(self, assigned):
                owner._consumer.pause(*assigned)
                owner._gained.extend(assigned)

        return Listener()

    def _guarded(self, fn, tps: list[Any]) -> None:
        if self._error is not None:
            return
        try:
            fn(tps)
        except BaseException as err:  # noqa: BLE001 - re-raised by run() after the poll
            self._error = err

    # -- loop ----------------------------------------------------------------------------
    def stop(self) -> None:
        """End the cycles of every partition, leave the group and return (thread-safe)."""
        self.stopping.request()

    def _check_kafka(self) -> None:
        """The single engine's start-up checks, before joining the group: every cluster
        reached, the input topic present (subscribing to a missing one would have the broker
        create it), the output topics created or checked."""
        from connectors.admin import KafkaProblem
        from stream_dp.engine.errors import KafkaUnavailable
        from stream_dp.engine.preflight import check_kafka, release_size

        release_bytes, _ = release_size(self.config)
        try:
            check_kafka(self.config, release_bytes)
        except KafkaProblem as err:
            raise KafkaUnavailable(str(err)) from None

    def _ensure_topics(self) -> None:
        """Create the compacted checkpoint topic (if configured) and the status topic if
        missing. The status is not worth stopping for: a status topic that cannot be created
        is a warning, and no heartbeat is published."""
        from connectors.admin import KafkaProblem, connect, ensure_topic
        from stream_dp.engine.errors import KafkaUnavailable
        from stream_dp.engine.outputs import CHECKPOINT_MESSAGE_BYTES

        checkpoints, rel = self.config.scale.checkpoint_topic, self.config.releases
        status = status_topic(self.config)
        try:
            admin = connect(
                rel.bootstrap_servers,
                timeout_s=self.config.kafka.startup_timeout_seconds,
                what="releases.bootstrap_servers",
                client=self.config.kafka.client,
                **rel.security,
            )
            try:
                if checkpoints is not None and ensure_topic(
                    admin,
                    checkpoints,
                    configs={
                        "cleanup.policy": "compact",
                        "max.message.bytes": str(CHECKPOINT_MESSAGE_BYTES),
                    },
                ):
                    log.info("created compacted checkpoint topic %s", checkpoints)
                try:
                    if ensure_topic(admin, status, configs=status_topic_configs()):
                        log.info("created compacted status topic %s", status)
                except KafkaProblem as err:
                    log.warning("no heartbeat on a status topic: %s", err)
                    return
            finally:
                admin.close()
        except KafkaProblem as err:
            raise KafkaUnavailable(str(err)) from None
        self._heartbeat = StatusPublisher(self.config, self.instance)

    def _open_consumer(self) -> None:
        from connectors.clients import client

        src, scale = self.config.source, self.config.scale
        self._consumer = client(self.config.kafka.client).consumer(
            bootstrap_servers=src.bootstrap_servers,
            group_id=src.group_id,
            # Names this instance to the group: `stream-dp status` maps members to instances.
            client_id=member_client_id(self.config.model.model_id, self.instance),
            enable_auto_commit=False,
            # Every partition is sought to its learner's position before it is read; a position
            # that left the log is reported (_skip_out_of_range), never reset silently.
            auto_offset_reset="none",
            isolation_level="read_committed",
            session_timeout_ms=scale.session_timeout_ms,
            heartbeat_interval_ms=max(300, scale.session_timeout_ms // 4),
            max_poll_records=500,
            allow_auto_create_topics=False,  # checked at start (_check_kafka), never created
            **src.security,
        )
        self._consumer.subscribe(topics=[src.topic], listener=self._listener())

    def run(self) -> dict[str, Any]:
        """Learn until the input has been idle ``source.max_idle_seconds``, or :meth:`stop`.

        In the main thread, SIGTERM and SIGINT stop it as they stop an
        :class:`~stream_dp.engine.runner.Engine` (:mod:`stream_dp.engine.stopping`).
        """
        if self.metrics is not None:
            self.metrics.start()
            log.info("serving metrics on %s", self.metrics.url)
        self.stopping.install()
        try:
            try:
                self._check_kafka()
                self._ensure_topics()
                # Before joining: compiled in the group's poll loop (the first start after an
                # install or upgrade), the kernels could hold a poll past max.poll.interval.ms.
                log.debug("compiled kernels loaded in %.2f s", load_kernels(self.config))
                freeze_start_up()  # out of the full GC passes: the imports and the kernels
                self._open_consumer()
                self._publish_metrics({}, up=True)
                self._loop()
                parts = self._statuses()
                final = self._summary(parts)
                self._publish_metrics(parts, up=False)
                self._release_all()
                self._write_status(stopped=True)  # holding nothing now
            finally:
                self.stopping.disarm()
            return final
        except Abandoned:
            log.warning("stopped without a last checkpoint of partitions %s (the stop was not "
                        "done within %g s): their next owners resume from their last "
                        "checkpoints", sorted(self.engines), self.stopping.grace)  # fmt: skip
            return self.status()
        finally:
            self.stopping.restore()
            if self.metrics is not None:
                self.metrics.close()
            if self._heartbeat is not None:
                self._heartbeat.close()
            for engine in self.engines.values():
                engine.close()
            self.engines.clear()
            if self._consumer is not None:
                try:
                    self._consumer.close(autocommit=False)
                except Exception:  # noqa: BLE001 - closing must not mask the real error
                    log.exception("error while closing the consumer")

    def _release_all(self) -> None:
        from kafka import TopicPartition

        topic = self.config.source.topic
        self._release([TopicPartition(topic, k) for k in list(self.engines)])

    def _raise_listener_error(self) -> None:
        err, self._error = self._error, None
        if err is not None:
            raise err

    def _poll(self, want: int) -> dict:
        """One poll of the group consumer; outages are waited out, skipped records reported."""
        from kafka.errors import NoOffsetForPartitionError, OffsetOutOfRangeError

        from connectors._retry import is_retriable

        # Holding no partition, a poll waits for the group's assignment, which confluent-kafka
        # serves inside it without ending it: a short poll takes the partitions up sooner.
        timeout_ms = 500 if self.engines else 50
        try:
            polled = self._consumer.poll(timeout_ms=timeout_ms, max_records=want)
        except OffsetOutOfRangeError as err:
            self._skip_out_of_range(err.args[0] if err.args else {})
            return {}
        except NoOffsetForPartitionError as err:
            # A partition gained in this poll: run() seeks it to its learner's position. Poll
            # after poll, it would be a partition nobody seeks, read by no one: said, once.
            self._no_offset_polls += 1
            if self._no_offset_polls == NO_OFFSET_WARN_POLLS:
                log.warning(
                    "%d polls in a row found a partition without a position (%s): it is "
                    "not being read", self._no_offset_polls, err,
                )  # fmt: skip
            return {}
        except Exception as err:
            if not is_retriable(err):
                raise
            if self.unreachable_since is None:
                self.unreachable_since = time.time()
                log.warning("Kafka unreachable: %s; riding it out", err)
            self._backoff.failed(err, max_sleep=2.0)
            return {}
        self._no_offset_polls = 0
        if self.unreachable_since is not None and polled:
            log.warning("Kafka reachable again after %.0f s", time.time() - self.unreachable_since)
            self.unreachable_since = None
            self._backoff.succeeded()
        return polled

    def _skip_out_of_range(self, positions: dict) -> None:
        """Continue at the earliest offset where a learner's position has left the log."""
        consumer = self._consumer
        tps = list(positions)
        if not tps:
            return
        begin = consumer.beginning_offsets(tps)
        for tp in tps:
            offset, first = int(positions[tp]), int(begin[tp])
            engine = self.engines.get(tp.partition)
            if offset < first and engine is not None:
                engine.source.skipped_records += first - offset
            log.warning(
                "topic %s partition %d: position %d is no longer in the log (it starts at %d): "
                "%d record(s) skipped, continuing at %d",
                tp.topic, tp.partition, offset, first, max(first - offset, 0), first,
            )  # fmt: skip
            if engine is not None:
                engine.source.seek({engine.source.key: first})
            else:
                consumer.seek(tp, first)

    def _loop(self) -> None:
        idle_limit = self.config.source.max_idle_seconds
        last_record = time.monotonic()
        while not self.stopping.requested:
            # One poll feeds every partition learner: none may take a batch past its cycle. A
            # learner that has not measured its cost yet assumes its siblings' highest: held to
            # one record, it would hold the whole poll there while its partition stays empty of
            # what the client hands out (librdkafka fills a one-record poll from one partition).
            costs = [e.cycle.per_record for e in self.engines.values()]
            assumed = max((c for c in costs if c is not None), default=None)
            want = min([MAX_BATCH, *(e.cycle.batch_limit(assumed) for e in self.engines.values())])
            if self.max_records is not None:
                want = min(want, self.max_records - self.records)
                if want <= 0:
                    break
            polled = self._poll(want)
            self._raise_listener_error()
            if self._gained:
                gained, self._gained = self._gained, []
                mine = set(self._consumer.assignment())
                self._take([tp for tp in gained if tp in mine])
                self._consumer.resume(*[tp for tp in gained if tp in mine])
                last_record = time.monotonic()
            got = set()
            for tp, records in polled.items():
                engine = self.engines.get(tp.partition)
                if engine is None:
                    continue  # revoked during this poll: its new owner reads them
                batch = engine.source.messages(records)
                self.records += len(batch)
                engine.process(batch)
                got.add(tp.partition)
            for k, engine in self.engines.items():
                if k not in got:
                    engine.process([], idle=not polled)
            beat = time.time()
            for k in self.engines:
                self._held[k][1] = beat
            now = time.monotonic()
            if polled:
                last_record = now
            elif idle_limit is not None and now - last_record >= idle_limit and self.engines:
                log.info("no input for %.0f s: stopping", idle_limit)
                break
            if now - self._status_clock >= self.config.status.interval_seconds:
                self._write_status()

    # -- status ------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """This instance's partition learners and what a person's guarantee is over them."""
        return self._summary(self._statuses())

    def _statuses(self) -> dict[int, dict[str, Any]]:
        """Each held partition learner's status (lag not measured)."""
        return {k: e.status(probe=False) for k, e in sorted(self.engines.items())}

    def _summary(self, parts: dict[int, dict[str, Any]]) -> dict[str, Any]:
        from stream_dp.privacy.conversions import epsilon_from_rho

        rho = {k: s["rho_spent"] for k, s in parts.items()}
        keyed = self.config.scale.privacy_unit_key or self.config.units_from_key
        comp = composition(rho, keyed)
        delta = self.config.model.delta
        conv = getattr(self.config.model, "conversion", "tight")
        now = time.time()
        return {
            "time": now,
            "model_id": self.config.model.model_id,
            "mode": "per-partition",
            "instance": self.instance,
            "heartbeat": now,
            "partitions": sorted(parts),
            "records": self.records,
            "skipped_records": sum(e.source.skipped_records for e in self.engines.values()),
            "broker_unreachable_since": self.unreachable_since,
            "privacy_unit_key": keyed,
            **comp,
            # zCDP composes in ρ; the (ε, δ) of the composition is converted once.
            "epsilon_spent": epsilon_from_rho(comp["rho"], delta, conv) if comp["rho"] else 0.0,
            "delta": delta,
            "by_partition": {
                str(p): {
                    key: s[key]
                    for key in (
                        "model_id",
                        "run_id",
                        "step",
                        "rho_spent",
                        "epsilon_spent",
                        "exhausted",
                        "records",
                        "learned",
                        "releases",
                        "dead_letters",
                        "last_published_cycle",
                        "pending_messages",
                    )
                }
                | {
                    "owner": self.instance,
                    "taken_at": self._held[p][0],
                    "heartbeat": self._held[p][1],
                }
                for p, s in parts.items()
            },
        }

    def _lags(self) -> dict[int, int]:
        """Each held partition's lag: its end offset minus its learner's position (one request
        for all of them; partitions not measured are left out)."""
        from kafka import TopicPartition

        positions = {k: e.source.next for k, e in self.engines.items() if e.source.next is not None}
        if not positions or self._consumer is None:
            return {}
        topic = self.config.source.topic
        tps = [TopicPartition(topic, k) for k in positions]
        try:
            with self._consumer_lock:
                ends = self._consumer.end_offsets(tps, timeout_ms=2000)
        except Exception:  # noqa: BLE001 - status only: the broker may be away
            return {}
        return {
            tp.partition: max(int(end) - positions[tp.partition], 0)
            for tp, end in ends.items()
            if end is not None
        }

    def _publish_metrics(self, parts: dict[int, dict[str, Any]], *, up: bool) -> None:
        """Hand the metrics endpoint (if any) the snapshot of the learners' statuses."""
        if self.metrics is None:
            return
        lags = self._lags() if parts else {}
        learners = []
        for k, status in parts.items():
            lag = lags.get(k)
            measured = {"consumer_lag": lag, "consumer_lag_by_partition": {k: lag}}
            learners.append(LearnerSnapshot.from_status(
                {**status, **(measured if lag is not None else {})}, partition=k))  # fmt: skip
        self.metrics.update(
            EngineSnapshot(
                model_id=self.config.model.model_id,
                up=up,
                mode="per-partition",
                learners=tuple(learners),
                partitions_held=len(self.engines),
                broker_unreachable=self.unreachable_since is not None,
            )
        )

    def _retract_claims(self, taken: list[int]) -> None:
        """Remove ``taken`` from the other instances' status files beside this one's.

        A killed instance's status file would otherwise go on naming the partitions it held;
        the instance that takes them over says so in that file (``taken_over``). A live
        instance that handed them over in a rebalance writes its own status without them
        anyway.
        """
        mine = self.status_writer.path
        if mine is None or not taken:
            return
        base = Path(self.config.status.file)
        pattern = f"{base.stem}.*{base.suffix}"
        for path in [base, *base.parent.glob(pattern)]:
            if path == mine or not path.is_file():
                continue
            try:
                other = json.loads(path.read_text())
                held = set(other.get("partitions") or ())
            except (OSError, ValueError, TypeError):
                continue
            gone = sorted(held & set(taken))
            if not gone or other.get("model_id") != self.config.model.model_id:
                continue
            now = time.time()
            other["partitions"] = sorted(held - set(gone))
            by = other.get("by_partition") or {}
            for k in gone:
                by.pop(str(k), None)
                other.setdefault("taken_over", {})[str(k)] = {"by": self.instance, "at": now}
            try:
                StatusWriter(str(path)).write(other)
            except OSError as err:
                log.warning("cannot update status file %s: %s", path, err)

    def _write_status(self, stopped: bool = False) -> None:
        self._status_clock = time.monotonic()
        parts = self._statuses()
        s = self._summary(parts)
        if self._heartbeat is not None:
            self._heartbeat.publish({**s, "stopped": stopped})
        log.info("partitions=%s records=%d steps=%s %s ρ=%.4g", s["partitions"], s["records"],
                 {p: v["step"] for p, v in s["by_partition"].items()}, s["composition"],
                 s["rho"])  # fmt: skip
        try:
            self.status_writer.write(s)
        except OSError as err:
            log.warning("cannot write status: %s", err)
        self._publish_metrics(parts, up=True)

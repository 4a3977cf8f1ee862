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

The engine owns its parts, each with its own lifecycle, the way Quix Streams' ``Application``
owns its ``Checkpoint``:

=====================  ==================================================  ====================
part                   does                                                module
=====================  ==================================================  ====================
``learning``           a message in, an explicit outcome out; the          :mod:`~.learning`
                       learner's checkpoint state
``source``             the input and its positions                         :mod:`connectors`
``outputs``            sinks, the transactional publisher, the             :mod:`~.outputs`
                       publication record
``cycle``              the commit cycle: checkpoint, then publish          :mod:`~.commit`
``reporter``           ``status.json``, the log's status line and the      :mod:`~.status`
                       metrics endpoint's snapshot
``metrics``            ``/metrics`` (with ``[metrics] prometheus_port``)   :mod:`~.prometheus`
``outage``             broker outages: logged once, deadline               :mod:`~.outage`
``stopping``           stop requests (signals), their grace                :mod:`~.stopping`
:class:`Startup`       resume, start new, or refuse (once per run)         :mod:`~.startup`
=====================  ==================================================  ====================

The engine itself only runs the loop -- poll, hand each message to ``learning``, route what it
produced into the cycle's outbox, end the cycle when it is due -- and turns stops, deadlines and
refusals into its exceptions.

Exit codes of ``stream-dp run`` follow the exceptions: :class:`StateError` 3,
:class:`KafkaUnavailable` 4, :class:`Fenced` 5 (see :mod:`stream_dp.engine.cli`).
"""

from __future__ import annotations

import logging
import time

from stream_dp.engine.builders import build_source
from stream_dp.engine.commit import CommitCycle, CyclePolicy, Outbox, RunRefused
from stream_dp.engine.config import EngineConfig, SinkConfig, SourceConfig
from stream_dp.engine.errors import EngineError, Interrupted, KafkaUnavailable, StateError
from stream_dp.engine.heap import freeze_start_up
from stream_dp.engine.learning import Learning, Outcome
from stream_dp.engine.outage import OutageWatch
from stream_dp.engine.outputs import DEAD_LETTERS, RELEASES, Outputs
from stream_dp.engine.prometheus import MetricsServer, metrics_server
from stream_dp.engine.startup import Startup
from stream_dp.engine.state import StateDir, StateLocked
from stream_dp.engine.status import EngineStats, StatusReporter, StatusWriter
from stream_dp.engine.stopping import Abandoned, StopRequest

__all__ = ["Engine"]

log = logging.getLogger("stream_dp.engine")


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
    secret
        The learner's noise secret, derived from a master secret by the caller
        (:mod:`stream_dp.engine.master_secret`). The checkpoints are then sealed under a key
        derived from it and never hold the secret; a checkpoint sealed under another secret is
        refused. Default: the learner draws its own and keeps it in the checkpoint.

    Examples
    --------
    >>> import json, tempfile, pathlib
    >>> from stream_dp.engine.config import EngineConfig
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> lines = [json.dumps({"x": {"a": i % 5 / 5, "b": i % 3 / 3}, "y": i % 2}) for i in range(50)]
    >>> _ = (d / "in.jsonl").write_text("\\n".join(lines + ["not json"]) + "\\n")
    >>> cfg = EngineConfig.model_validate({
    ...     "model": {"alpha": 1.0, "buffer": 16, "release_every": 1, "features": ["a", "b"]},
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
        secret: int | None = None,
    ) -> None:
        self.config = config
        self.fresh = fresh
        self.max_records = max_records
        self.learning = Learning(config, secret)
        self.learner = self.learning.learner
        self.state = StateDir(config.checkpoint.path)
        self.stats = EngineStats()
        #: The Prometheus endpoint, served by :meth:`run` (None without a configured port).
        self.metrics: MetricsServer | None = metrics_server(config)
        self.reporter = StatusReporter(config, self.learner, self.stats, metrics=self.metrics)
        self.outage = OutageWatch(config.kafka.outage_deadline_seconds)
        self._source = source
        self._given_sinks = {RELEASES: releases, DEAD_LETTERS: dead_letters}
        self.outputs: Outputs | None = None
        self.cycle: CommitCycle | None = None
        self.stopping = StopRequest()
        self._idle_since: float | None = None

    # -- the parts -----------------------------------------------------------------------------
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

    @property
    def dead_counts(self) -> dict[str, int]:
        """Dead letters by reason (``budget_exhausted`` included)."""
        return self.stats.reasons

    @property
    def status_writer(self) -> StatusWriter:
        return self.reporter.writer

    @property
    def broker_unreachable_since(self) -> float | None:
        """Wall time since which Kafka has not answered (source or publisher), or None."""
        return self.outage.since()

    def _open(self) -> None:
        """Open the source, the outputs and the commit cycle (nothing is read or written)."""
        cfg = self.config
        if self._source is None:
            self._source = build_source(cfg.source, client=cfg.kafka.client)
        self.outputs = Outputs.open(cfg, self._source, self.state, self._given_sinks)
        ck = cfg.checkpoint
        self.cycle = CommitCycle(
            self.state,
            self.outputs,
            self._source,
            cfg.model.model_id,
            CyclePolicy(ck.every_records, ck.every_seconds, ck.max_pending_bytes),
            self._snapshot,
            seal_key=self.learning.seal_key(),
            portable=self._portable_snapshot,
        )
        self.outage.follow(self._source, self.outputs.publisher)

    def _snapshot(self) -> tuple[dict, dict]:
        """What a checkpoint holds besides the cycle: the learner, the engine's counters."""
        meta = {**self.stats.to_meta(), **self.learning.meta()}
        return self.learning.checkpoint_state(self.state.journal), meta

    def _portable_snapshot(self) -> tuple[dict, dict] | None:
        """The snapshot of a checkpoint that carries its ledger journal, or None without one."""
        if self.learner.accountant.storage.journal is None:
            return None
        meta = {**self.stats.to_meta(), **self.learning.meta()}
        return self.learning.checkpoint_state(self.state.journal, portable=True), meta

    def _kafka_parts(self) -> dict[str, bool]:
        """Which configured parts are Kafka ones the engine opens itself (not overridden)."""
        cfg = self.config
        return {
            "source": self._source is None and cfg.source.kind == "kafka",
            RELEASES: self._given_sinks[RELEASES] is None and cfg.releases.kind == "kafka",
            DEAD_LETTERS: self._given_sinks[DEAD_LETTERS] is None
            and cfg.dead_letters.kind == "kafka",
        }

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

    # -- the commit cycle --------------------------------------------------------------------
    def commit(self, *, publish: bool = True, background: bool = False) -> None:
        """End the cycle: checkpoint (learner, ledger, positions, outbox), then publish it.

        With ``background`` (and Kafka topics to publish to), the publication runs beside the
        learning of the next cycle, whose checkpoint waits for it.
        """
        try:
            self.cycle.end(publish=publish, background=background, **self._hooks())
        finally:
            self.outage.watch()

    def _hooks(self) -> dict:
        return {"on_retry": self._on_retry, "on_wait": self._on_wait}

    def _on_wait(self) -> None:
        """Called while waiting for Kafka: outages, status, stop requests, the deadline."""
        self.outage.watch()
        now = time.monotonic()
        if self.reporter.due(now):
            self._report_status(now, probe=False)
        if self.stopping.overdue(now):
            raise Interrupted()
        self.outage.check()

    def _on_retry(self, err: BaseException) -> None:
        self._on_wait()

    # -- lifecycle -----------------------------------------------------------------------------
    def stop(self) -> None:
        """Finish the current batch, commit and return from :meth:`run` (thread-safe)."""
        self.stopping.request()

    def run(self) -> EngineStats:
        """Process the source until it ends, ``max_records`` is reached or :meth:`stop`.

        In the main thread, SIGTERM and SIGINT (Ctrl-C) stop the run: gracefully, or where it
        is once :data:`~stream_dp.engine.stopping.SIGNAL_GRACE_SECONDS` have passed
        (:mod:`stream_dp.engine.stopping`). With ``[metrics] prometheus_port`` it serves
        ``/metrics`` from before its start-up (``stream_dp_up 0``) until it returns;
        :class:`~stream_dp.engine.prometheus.MetricsUnavailable` if it cannot.
        """
        self._serve_metrics()
        try:
            self._acquire()
        except BaseException:
            self._stop_metrics()
            raise
        self.stopping.install()
        try:
            try:
                self._start()
                freeze_start_up()  # the start-up's objects out of the full GC passes
                if self.metrics is not None:
                    # Up from the end of start-up, not from the first status report. The private
                    # metrics are left to that report: releasing them charges their mechanism.
                    self.reporter.publish(self.status(dp=False), up=True)
                self._loop()
                self.finish()
            finally:
                self.stopping.disarm()
        except Interrupted:
            self._report_interrupted()
        except Abandoned:
            self._report_abandoned()
        except KafkaUnavailable:
            self._give_up_outage()
            raise
        except RunRefused as err:
            raise StateError(str(err)) from None
        finally:
            self.stopping.restore()
            self.close()
        return self.stats

    def _serve_metrics(self) -> None:
        if self.metrics is not None:
            self.metrics.start()
            log.info("serving metrics on %s", self.metrics.url)

    def _stop_metrics(self) -> None:
        if self.metrics is not None:
            self.metrics.close()

    def _acquire(self) -> None:
        try:
            self.state.acquire()
        except StateLocked as err:
            raise StateError(str(err)) from None
        except OSError as err:
            raise StateError(f"cannot use state directory {self.state.dir}: {err}") from None

    def start(self) -> None:
        """Lock the state directory and start up; pair with :meth:`close`.

        For drivers that feed the engine themselves (:meth:`process`), such as the
        per-partition scale-out; :meth:`run` does all of it.
        """
        self._acquire()
        try:
            self._start()
        except RunRefused as err:
            raise StateError(str(err)) from None

    def _start(self) -> None:
        from connectors.admin import KafkaProblem
        from stream_dp.engine.preflight import check_kafka, release_size

        self.state.remove_temporaries()
        release_bytes, _ = release_size(self.config)
        kafka = self._kafka_parts()
        if any(kafka.values()):
            try:
                check_kafka(self._checked_config(kafka), release_bytes)
            except KafkaProblem as err:
                raise KafkaUnavailable(str(err)) from None
        self._open()
        startup = Startup(
            self.config,
            self.state,
            self.learning,
            self._source,
            self.outputs,
            self.cycle,
            fresh=self.fresh,
            hooks=self._hooks(),
        )
        positions = startup.restore()
        self.stats.restore(startup.meta)
        self.learning.run_id = self.cycle.run_id
        self._source.seek(positions)
        try:
            startup.recover()
        finally:
            self.outage.watch()

    def process(self, batch: list, *, idle: bool = False) -> None:
        """Learn one polled batch and end the cycle when it is due (background publication).

        ``idle``: the input has nothing more for now, so the cycle ends (its releases become
        visible) even before ``checkpoint.every_records`` or ``every_seconds``.
        """
        began = self.cycle.clock()
        outbox, count = self.cycle.outbox, self.stats.count
        for done in self.learning.handle_batch(batch):
            count(done)
            if done.value is not None:
                stream = RELEASES if done.outcome is Outcome.RELEASED else DEAD_LETTERS
                outbox.add(stream, done.key, done.value)
        self.cycle.consumed(len(batch), self.cycle.clock() - began)
        if batch:
            self._idle_since = None
        elif self._idle_since is None:
            self._idle_since = time.time()
        if self.cycle.due(idle=idle):
            self.commit(background=True)
            return
        try:
            self.cycle.settle_if_done()
        finally:
            self.outage.watch()

    def finish(self, *, probe: bool = True) -> None:
        """End the last cycle (checkpoint and publish, waiting for it) and report the status.

        ``probe=False`` leaves the consumer lag out of that status: inside a rebalance
        callback the consumer cannot answer an offsets request (librdkafka holds it until
        the callback returns, so each one would wait out its timeout).
        """
        try:
            self.commit()
        except Interrupted:
            self._report_interrupted()
        self._report_status(time.monotonic(), probe=probe, up=False)

    def close(self) -> None:
        """Close the ledger, outputs and source, stop serving metrics and unlock the state
        directory; never raises."""
        try:
            self._stop_metrics()
        except Exception:  # noqa: BLE001 - closing must not mask the real error
            log.exception("error while closing the metrics endpoint")
        try:
            self.learner.accountant.storage.close()  # flushes and unlocks a journal
        except Exception:  # noqa: BLE001 - closing must not mask the real error
            log.exception("error while closing the ledger")
        if self.cycle is not None:
            self.cycle.abandon()
        if self.outputs is not None:
            self.outputs.close()
        if self._source is not None:
            try:
                self._source.close()
            except Exception:  # noqa: BLE001 - closing must not mask the real error
                log.exception("error while closing the source")
        self.state.release()

    def _give_up_outage(self) -> None:
        """At the outage deadline: keep what was learned (checkpoint only) for the restart."""
        cycle = self.cycle
        if cycle is None or cycle.committed_positions is None or cycle.unpublished:
            return
        try:
            self.commit(publish=False)
        except EngineError as err:
            log.error("could not checkpoint before stopping: %s", err)

    def _report_abandoned(self) -> None:
        log.warning(
            "stopped without a last checkpoint (the stop was not done within %g s): the next "
            "start resumes at cycle %d and learns again, identically, what came after it",
            self.stopping.grace,
            self.seq,
        )

    def _report_interrupted(self) -> None:
        log.warning(
            "stopped while waiting for Kafka: the %d message(s) of cycle %d are checkpointed and "
            "published at the next start",
            len(self.outbox),
            self.seq,
        )

    def _loop(self) -> None:
        source = self._source
        while not self.stopping.requested:
            want = self.cycle.batch_limit()
            if self.max_records is not None:
                want = min(want, self.max_records - self.stats.records)
                if want <= 0:
                    break
            batch = source.poll(max_records=want, timeout_s=0.5)
            if batch is None:
                break
            self.process(batch, idle=not batch)
            now = time.monotonic()
            if self.reporter.due(now):
                self._report_status(now)
            self.outage.watch()
            self.outage.check()

    # -- status ----------------------------------------------------------------------------
    def status(self, now: float | None = None, *, probe: bool = True, dp: bool = True) -> dict:
        """Operator status: counters, budget, lag, idleness, outages (no raw statistics).

        ``dp=False`` leaves out the private operator metrics (see :meth:`StatusReporter.status`).
        """
        return self.reporter.status(
            now,
            probe=probe,
            dp=dp,
            source=self._source,
            cycle=self.cycle,
            idle_since=self._idle_since,
            unreachable_since=self.outage.since(),
        )

    def _report_status(self, now: float, *, probe: bool = True, up: bool = True) -> None:
        self.reporter.report(self.status(now, probe=probe), now, up=up)

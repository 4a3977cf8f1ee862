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

Start-up (resume, start new, or refuse) is :mod:`stream_dp.engine.startup`; ``status.json``
and the log's status lines are :mod:`stream_dp.engine.status`.

Exit codes of ``stream-dp run`` follow the exceptions: :class:`StateError` 3,
:class:`KafkaUnavailable` 4, :class:`Fenced` 5 (see :mod:`stream_dp.engine.cli`).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any

from connectors.schema import (
    DeadLetter,
    RecordError,
    ReleaseEncoder,
    parse_conformed,
)
from stream_dp.engine.builders import build_learner
from stream_dp.engine.commit import (
    DEAD_LETTERS,
    RELEASES,
    CommitCycle,
    Outbox,
    Outputs,
    RunRefused,
)
from stream_dp.engine.config import EngineConfig, SinkConfig, SourceConfig
from stream_dp.engine.errors import EngineError, Interrupted, KafkaUnavailable, StateError
from stream_dp.engine.startup import RunStart
from stream_dp.engine.state import StateDir, StateLocked
from stream_dp.engine.status import (
    EngineStats,
    StatusReports,
    StatusWriter,
    note_unknown_features,
)
from stream_dp.records import InvalidRecord

__all__ = ["Engine"]

log = logging.getLogger("stream_dp.engine")

#: Seconds a stop request (SIGTERM) waits for a publication in progress before leaving it to
#: the next start (the checkpoint holds it).
STOP_GRACE_SECONDS = 10.0


class Engine(RunStart, StatusReports):
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
        if config.model.features is None:
            raise ValueError("the engine needs a declared schema (model.features)")
        self.config = config
        self.fresh = fresh
        self.max_records = max_records
        self.learner = build_learner(config)
        self._secret = secret
        if secret is not None:
            self._use_secret(secret)
        self.state = StateDir(config.checkpoint.path)
        self._features = tuple(config.model.features)
        self._known = frozenset(self._features)
        self._encoder = ReleaseEncoder()
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

    def _use_secret(self, secret: int) -> None:
        """Hand the learner its secret through its public checkpoint surface.

        A learner refuses an explicit ``seed`` unless the run is declared non-private (a
        guessable integer); a secret derived from a 128-bit master is not guessable, and
        restoring a state with it is how a resumed learner gets its secret anyway.
        """
        state = self.learner.state_dict()
        state["secret"] = int(secret)
        self.learner.load_state_dict(state)

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

    # -- the commit cycle --------------------------------------------------------------------
    def _learner_state(self) -> dict:
        state = self.learner.state_dict()
        if self._secret is not None:
            state["secret"] = None  # derived from the master secret; never at rest
        acc = self.learner.ledger_state(state)
        if "journal" in acc:  # named relative to the checkpoint, so the directory can move
            acc["journal"] = {**acc["journal"], "path": self.state.journal.name}
        return state

    def _meta(self) -> dict:
        meta = {"stats": self.stats.to_dict(), "dead_counts": dict(self.dead_counts)}
        if self._secret is not None:
            from stream_dp.engine.master_secret import secret_fingerprint

            meta["secret_fingerprint"] = secret_fingerprint(self._secret)
        return meta

    def _save(self, positions: dict) -> None:
        try:
            self.cycle.save(self._learner_state(), positions, self._meta())
        except OSError as err:
            raise StateError(f"cannot write checkpoint {self.state.checkpoint}: {err}") from None

    def commit(self, *, publish: bool = True, background: bool = False) -> None:
        """End the cycle: checkpoint (learner, ledger, positions, outbox), then publish it.

        With ``background`` (and Kafka topics to publish to), the publication runs beside the
        learning of the next cycle, whose checkpoint waits for it (``CommitCycle.settle``).
        """
        self._fenced_as_engine_error(self.cycle.settle, **self._hooks())
        positions = self._source.positions()
        if not self.cycle.pending(positions):
            return
        self._since_commit = 0
        self._commit_clock = time.monotonic()
        try:
            self.cycle.checkpoint(self._learner_state(), positions, self._meta())
        except OSError as err:
            raise StateError(f"cannot write checkpoint {self.state.checkpoint}: {err}") from None
        if not publish:
            return
        if background and self.outputs.publisher is not None:
            self.cycle.publish_in_background(positions)
        else:
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
            raise Interrupted()
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
        self._acquire()
        handlers = self._install_signals()
        try:
            self._start()
            self._loop()
            self.finish()
        except Interrupted:
            self._report_interrupted()
        except KafkaUnavailable:
            self._give_up_outage()
            raise
        except RunRefused as err:
            raise StateError(str(err)) from None
        finally:
            self._restore_signals(handlers)
            self.close()
        return self.stats

    def _acquire(self) -> None:
        try:
            self.state.acquire()
        except StateLocked as err:
            raise StateError(str(err)) from None
        except OSError as err:
            raise StateError(f"cannot use state directory {self.state.dir}: {err}") from None

    def start(self) -> None:
        """Lock the state directory and start up (steps 1-4 above); pair with :meth:`close`.

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
        positions = self._restore()
        self._source.seek(positions)
        self._recover()

    def process(self, batch: list, *, idle: bool = False) -> None:
        """Learn one polled batch and end the cycle when it is due (background publication).

        ``idle``: the input has nothing more for now, so the cycle ends (its releases become
        visible) even before ``checkpoint.every_records`` or ``every_seconds``.
        """
        for msg in batch:
            self._handle(msg)
        self._since_commit += len(batch)
        if batch:
            self._idle_since = None
        elif self._idle_since is None:
            self._idle_since = time.time()
        if self._cycle_due(idle=idle):
            self.commit(background=True)
        else:
            self._fenced_as_engine_error(self.cycle.settle_if_done)

    def finish(self) -> None:
        """End the last cycle (checkpoint and publish, waiting for it) and report the status."""
        try:
            self.commit()
        except Interrupted:
            self._report_interrupted()
        self._report_status(time.monotonic())

    def close(self) -> None:
        """Close the ledger, outputs and source and unlock the state directory; never raises."""
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
            self.process(batch, idle=not batch)
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
            x, y, n_unknown = parse_conformed(
                msg.value, self._features, self._known, max_bytes=self.config.max_message_bytes
            )
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
            learner.learn_one(x, y)
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
            value = self._encoder.encode(fields, run_id=self.run_id, time=time.time())
            self.outbox.add(RELEASES, fields["model_id"], value)
            self.stats.releases += 1

    # -- status ----------------------------------------------------------------------------
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

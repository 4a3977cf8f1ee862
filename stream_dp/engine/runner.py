"""The streaming engine: source → validate → clip → learner → release → sink, with checkpoints.

Exactly-once learning, at-least-once delivery of identical releases
-------------------------------------------------------------------
The loop reads a record, validates it (bad input goes to the dead-letter sink with its reason,
never to the learner), learns it, and on a release step publishes the private model. Every
``checkpoint.every_records`` records or ``every_seconds`` seconds, and on SIGTERM/SIGINT, it

1. flushes the release and dead-letter sinks (everything produced so far is durable),
2. writes the checkpoint atomically — learner, buffer, ledger, noise secret and the source
   positions of the *next* record to read —
3. commits the positions to the source (Kafka consumer group), for visibility only.

After a crash the engine resumes from the checkpoint: the records read since are replayed, and
because the learner is deterministic given its state and the noise of step t is a pure function
of (secret, model id, t), each replayed step re-publishes the *identical* release and re-makes
the identical ledger charge. Consumers may see a release twice; never two different releases of
one step, never a gap, and the ledger never double-charges. No record is lost (positions are
saved only after the releases derived from them were delivered) and none is learned twice
(the learner state and the positions are saved together, atomically).

With ``checkpoint.ledger_journal`` the ledger's sealed chunks live in an append-only journal
beside the checkpoint (``<checkpoint>.ledger``, :mod:`stream_dp.privacy.journal`) and the
checkpoint stores the journal's length and SHA-256 plus the open chunk. A journal longer than its
checkpoint (chunks sealed before a crash) is truncated to it, the replay re-charging them; a
shorter, altered or missing one is refused.

A fresh start resets the ledger, so the engine never starts fresh by itself: if the checkpoint
is missing but this model was started before (a marker file beside the checkpoint says so), or
the checkpoint is unreadable, it refuses to run unless ``fresh=True`` (``--fresh``).

"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from connectors.schema import RecordError, ReleaseMessage, parse_record
from connectors.sinks import DeadLetterSink, publish_release
from stream_dp.checkpoint import load_checkpoint, save_checkpoint
from stream_dp.engine.config import EngineConfig, SinkConfig, SourceConfig
from stream_dp.records import InvalidRecord

__all__ = ["Engine", "EngineError", "EngineStats", "build_learner", "build_source", "build_sink"]

log = logging.getLogger("stream_dp.engine")


class EngineError(RuntimeError):
    """The engine refuses to run (e.g. it would silently reset the privacy ledger)."""


def build_learner(config: EngineConfig):
    """The private learner described by ``config.model``."""
    from stream_dp.online import OnPairC, OnPairStrC

    cls = {"OnPairStrC": OnPairStrC, "OnPairC": OnPairC}[config.model.algorithm]
    return cls(**config.model.learner_kwargs())


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


def build_sink(cfg: SinkConfig):
    from connectors.sinks import JsonlSink, KafkaSink, StdoutSink

    if cfg.kind == "kafka":
        return KafkaSink(cfg.topic, cfg.bootstrap_servers, **cfg.security)
    if cfg.kind == "jsonl":
        return JsonlSink(cfg.path)
    return StdoutSink()


@dataclass
class EngineStats:
    """Counters of one engine process (restored from the checkpoint on restart)."""

    records: int = 0
    learned: int = 0
    releases: int = 0
    dead_letters: int = 0
    exhausted_skipped: int = 0
    started: float = field(default_factory=time.time)

    def to_dict(self) -> dict:
        return {
            "records": self.records,
            "learned": self.learned,
            "releases": self.releases,
            "dead_letters": self.dead_letters,
            "exhausted_skipped": self.exhausted_skipped,
        }


class Engine:
    """Runs one private learner over one source.

    Parameters
    ----------
    config
        A validated :class:`stream_dp.engine.config.EngineConfig`.
    fresh
        Start a new model with a new budget even though state exists (the old checkpoint is
        kept aside, renamed). Without it, the engine never discards a ledger.
    source, releases, dead_letters
        Override the configured source and sinks (tests, embedding).
    max_records
        Stop after this many input messages (then checkpoint and return).

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
    ...     "checkpoint": {"path": str(d / "model.ckpt")}})
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
        self.config = config
        self.fresh = fresh
        self.max_records = max_records
        self.learner = build_learner(config)
        self._source = source
        self._releases = releases
        self._dead_inner = dead_letters
        self.stats = EngineStats()
        self._stop = threading.Event()
        self._last_ckpt_time = time.monotonic()
        self._since_ckpt = 0
        self._last_status = time.monotonic()
        self._status_records = 0
        self.ckpt_path = Path(config.checkpoint.path)
        self.marker_path = self.ckpt_path.with_name(self.ckpt_path.name + ".created")
        self.journal_path = self.ckpt_path.with_name(self.ckpt_path.name + ".ledger")

    # -- state ---------------------------------------------------------------------------
    def _restore(self) -> dict:
        """Load the checkpoint, or start fresh only when that cannot lose a ledger."""
        ckpt, marker = self.ckpt_path, self.marker_path
        ckpt.parent.mkdir(parents=True, exist_ok=True)
        if self.fresh:
            stamp = int(time.time())
            if ckpt.exists():
                aside = ckpt.with_name(f"{ckpt.name}.abandoned-{stamp}")
                os.replace(ckpt, aside)
                log.warning("--fresh: previous checkpoint kept as %s; its ledger is closed", aside)
            if self.journal_path.exists():
                aside = self.journal_path.with_name(f"{self.journal_path.name}.abandoned-{stamp}")
                os.replace(self.journal_path, aside)
                log.warning("--fresh: previous ledger journal kept as %s", aside)
            marker.unlink(missing_ok=True)
        if ckpt.exists():
            c = load_checkpoint(
                ckpt,
                model_id=self.config.model.model_id,
                learner_class=type(self.learner).__name__,
                params=self.learner._get_params(),
            )
            acc_state = c.learner_state["accountant"]
            if "journal" in acc_state:  # it lives beside the checkpoint, wherever that moved
                acc_state["journal"] = {**acc_state["journal"], "path": str(self.journal_path)}
            self.learner.load_state_dict(c.learner_state)
            if self.config.checkpoint.ledger_journal and self.learner.accountant.journal is None:
                self._open_journal()
            for k, v in c.meta.get("stats", {}).items():
                setattr(self.stats, k, v)
            log.info(
                "resumed %s at step %d (ε spent %.4g) from %s",
                self.config.model.model_id,
                self.learner.step,
                self.learner.accountant.spent()[0],
                ckpt,
            )
            return dict(c.positions)
        if marker.exists():
            raise EngineError(
                f"checkpoint {ckpt} is missing but model {self.config.model.model_id!r} was "
                f"started before ({marker} exists). Starting fresh would reset its privacy "
                "ledger; restore the checkpoint, or pass --fresh to start a new model with a "
                "new budget"
            )
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"model_id": self.config.model.model_id, "created": time.time()}, f)
        if self.config.checkpoint.ledger_journal:
            self._open_journal()
        # An initial checkpoint fixes the noise secret before anything is released.
        save_checkpoint(ckpt, self._learner_state(), {}, {"stats": self.stats.to_dict()})
        log.info("started model %s: %s", self.config.model.model_id, self.learner.describe())
        return {}

    def _open_journal(self) -> None:
        """Start journaling the ledger; a journal no checkpoint refers to is moved aside.

        Such a file was written after the last checkpoint by a process that died (that
        checkpoint holds the whole ledger), or belongs to a model whose checkpoint and marker
        were removed; either way nothing refers to it, and it is kept, not overwritten.
        """
        path = self.journal_path
        if path.exists():
            aside = path.with_name(f"{path.name}.orphaned-{int(time.time())}")
            os.replace(path, aside)
            log.warning("ledger journal %s is not referred to by the checkpoint: kept as %s",
                        path, aside)  # fmt: skip
        self.learner.accountant.open_journal(path)

    def _learner_state(self) -> dict:
        state = self.learner.state_dict()
        acc = state["accountant"]
        if "journal" in acc:  # named relative to the checkpoint, so the directory can move
            acc["journal"] = {**acc["journal"], "path": self.journal_path.name}
        return state

    def checkpoint(self) -> None:
        """Flush sinks, then write the checkpoint, then commit source positions."""
        self.releases.flush()
        self.dead.flush()
        positions = self.source.positions()
        save_checkpoint(
            self.ckpt_path,
            self._learner_state(),
            positions,
            {"stats": self.stats.to_dict()},
        )
        self.source.commit(positions)
        self._since_ckpt = 0
        self._last_ckpt_time = time.monotonic()

    # -- loop ----------------------------------------------------------------------------
    def stop(self) -> None:
        """Finish the current record, checkpoint and return from :meth:`run` (thread-safe)."""
        self._stop.set()
        stop = getattr(self._source, "stop", None)
        if stop is not None:
            stop()

    def _open(self) -> None:
        cfg = self.config
        if self._source is None:
            self._source = build_source(cfg.source)
        if self._releases is None:
            self._releases = build_sink(cfg.releases)
        if self._dead_inner is None:
            self._dead_inner = build_sink(cfg.dead_letters)
        self.dead = DeadLetterSink(self._dead_inner)

    @property
    def source(self):
        return self._source

    @property
    def releases(self):
        return self._releases

    def run(self) -> EngineStats:
        """Process the source until it ends, ``max_records`` is reached or :meth:`stop`."""
        positions = self._restore()
        self._open()
        if positions:
            self.source.seek(positions)
        handlers = self._install_signals()
        try:
            for msg in self.source:
                self._handle(msg)
                self._since_ckpt += 1
                now = time.monotonic()
                ck = self.config.checkpoint
                if (
                    self._since_ckpt >= ck.every_records
                    or now - self._last_ckpt_time >= ck.every_seconds
                ):
                    self.checkpoint()
                if now - self._last_status >= self.config.status.interval_seconds:
                    self._report_status(now)
                if self._stop.is_set() or (
                    self.max_records is not None and self.stats.records >= self.max_records
                ):
                    break
            self.checkpoint()
            self._report_status(time.monotonic())
        finally:
            self._restore_signals(handlers)
            self.learner.accountant.close()  # flushes and unlocks a journal; reads still work
            for part in (self._releases, self._dead_inner, self._source):
                try:
                    part.close()
                except Exception:  # noqa: BLE001 - closing must not mask the real error
                    log.exception("error while closing %r", part)
        return self.stats

    def _handle(self, msg) -> None:
        self.stats.records += 1
        try:
            record = parse_record(msg.value, max_bytes=self.config.max_message_bytes)
        except RecordError as err:
            self.dead.send_error(err, msg.value, msg.position)
            self.stats.dead_letters += 1
            return
        learner = self.learner
        step_before = learner.step
        try:
            learner.learn_one(record.x, record.y)
        except InvalidRecord as err:
            self.dead.send_dead(err.reason, str(err), msg.value, msg.position)
            self.stats.dead_letters += 1
            return
        if learner.step == step_before:
            # The budget is spent: the record is valid but can no longer be learned from.
            self.dead.send_dead(
                "budget_exhausted",
                "the model's privacy budget is spent; it serves its last release",
                msg.value,
                msg.position,
            )
            self.stats.exhausted_skipped += 1
            return
        self.stats.learned += 1
        if learner.release_step == learner.step:
            fields = learner.release_message()
            publish_release(self.releases, ReleaseMessage(**fields, time=time.time()))
            self.stats.releases += 1

    # -- status ----------------------------------------------------------------------------
    def status(self, now: float | None = None) -> dict:
        """Operator status: throughput, step, budget, dead letters, lag, regret (operator-only)."""
        now = time.monotonic() if now is None else now
        elapsed = max(now - self._last_status, 1e-9)
        rate = (self.stats.records - self._status_records) / elapsed
        eps, delta = self.learner.accountant.spent()
        lag_fn = getattr(self._source, "lag", None)
        lag = None
        if lag_fn is not None:
            try:
                lag = lag_fn()
            except Exception:  # noqa: BLE001 - status must never stop the engine
                lag = None
        return {
            "time": time.time(),
            "model_id": self.config.model.model_id,
            "records_per_s": round(rate, 1),
            "step": self.learner.step,
            "epsilon_spent": eps,
            "epsilon_budget": self.learner.epsilon,
            "delta": delta,
            "rho_spent": self.learner.accountant.rho_spent(),
            "rho_budget": self.learner.accountant.rho_budget,
            "exhausted": self.learner.exhausted,
            "dead_letter_reasons": dict(self.dead.counts) if hasattr(self, "dead") else {},
            "consumer_lag": lag,
            **self.stats.to_dict(),
            # Computed from raw records: for the trusted operator only, never released.
            "operator_only": {"average_penalty": self.learner.regret.average_penalty},
        }

    def _report_status(self, now: float) -> None:
        s = self.status(now)
        log.info(
            "step=%d rec/s=%.0f ε=%.4g/%.4g dead=%d lag=%s releases=%d avg_penalty=%.4g",
            s["step"],
            s["records_per_s"],
            s["epsilon_spent"],
            s["epsilon_budget"],
            self.stats.dead_letters,
            s["consumer_lag"],
            self.stats.releases,
            s["operator_only"]["average_penalty"],
        )
        path = self.config.status.file
        if path:
            tmp = f"{path}.tmp"
            with open(tmp, "w") as f:
                json.dump(s, f, default=str)
            os.replace(tmp, path)
        self._last_status = now
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

"""How a run starts: resumed from its checkpoint, started new, or refused.

:class:`Startup` runs once per engine run, after the state directory is locked and Kafka is
reached: it resumes from the checkpoint -- refusing one of another run, of other learner
parameters, or older than what was published -- or starts a new run, refusing when the model
existed before (run marker, orphaned journal, consumer-group commits, releases of this model id
on the release topic) unless ``fresh``. A new run becomes the writer, writes its first
checkpoint, then its marker, so a kill at any point leaves nothing of it or a checkpoint to
resume (``docs/privacy.md``, *The engine: one release per step*). Then :meth:`Startup.recover`
publishes what the checkpoint's cycle still owes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from connectors.schema import ReleaseMessage
from stream_dp.checkpoint import Checkpoint, CheckpointMismatch, params_fingerprint
from stream_dp.engine.commit import CommitCycle
from stream_dp.engine.errors import Fenced, KafkaUnavailable, StateError
from stream_dp.engine.learning import Learning
from stream_dp.engine.master_secret import open_checkpoint
from stream_dp.engine.outputs import RELEASES, Outputs, PublicationRecord
from stream_dp.engine.state import StateDir

__all__ = ["Startup", "load_resumable"]

log = logging.getLogger("stream_dp.engine")

#: Messages per partition read back for a fenced run's releases: ten times the start-up
#: check's, so other models sharing the topic would have to publish 20,000 messages to one
#: partition between the fencing and the reading (milliseconds) to hide them.
FENCED_TAIL = 20_000


def load_resumable(
    path: Path, learning: Learning, model_id: str, *, from_topic: bool = False
) -> Checkpoint:
    """Read and verify the checkpoint ``learning``'s learner (of model ``model_id``) would
    resume from: sealed under its key when its secret comes from a master
    (:func:`stream_dp.engine.master_secret.open_checkpoint`; ``from_topic``: it must be).

    Raises
    ------
    stream_dp.checkpoint.CheckpointError
        Damaged, unsealed or sealed under another master, of another format version, model or
        learner class -- or written with other learner parameters, which the error names
        (resuming would change the privacy analysis mid-stream).
    """
    learner = learning.learner
    c = open_checkpoint(
        path,
        learning.secret,
        model_id=model_id,
        learner_class=type(learner).__name__,
        from_topic=from_topic,
    )
    params = learner._get_params()
    if c.header.get("params_sha256") != params_fingerprint(params):
        raise CheckpointMismatch(
            f"{path} was written with other learner parameters ({_changes(c, params)}); "
            "resuming would change the privacy analysis mid-stream. Use the original "
            "configuration, or pass --fresh to start a new run with a new budget"
        )
    return c


def _changes(c: Checkpoint, params: dict) -> str:
    """The parameters that differ between a checkpoint's learner and ``params``, named."""
    saved = c.learner_state.get("params") or {}
    changed = []
    for name in sorted(set(saved) | set(params)):
        old, new = saved.get(name), params.get(name)
        if params_fingerprint({name: old}) == params_fingerprint({name: new}):
            continue
        if name == "seed":  # never quoted: a reproducible run's seed is its noise
            changed.append("seed")
        else:
            changed.append(f"{name}: {old!r} -> {new!r}")
    return "; ".join(changed) or "they cannot be compared"


class Startup:
    """The start of one engine run (see the module docstring).

    Parameters
    ----------
    config : EngineConfig
    state : StateDir
        Locked by the caller.
    learning : Learning
        The engine's learner, restored from the checkpoint by :meth:`restore`.
    source
        The engine's source: a new run starts where it says the input starts.
    outputs : Outputs
    cycle : CommitCycle
    fresh : bool
        Start a new run although the model existed (its files are kept aside).
    hooks : dict
        ``on_retry`` and ``on_wait``, called while waiting for Kafka (they may raise to give up).
    """

    def __init__(
        self,
        config: Any,
        state: StateDir,
        learning: Learning,
        source: Any,
        outputs: Outputs,
        cycle: CommitCycle,
        *,
        fresh: bool,
        hooks: dict[str, Callable],
    ) -> None:
        self.config, self.state, self.learning = config, state, learning
        self.source, self.outputs, self.cycle = source, outputs, cycle
        self.fresh, self.hooks = fresh, hooks
        self.learner = learning.learner
        #: The checkpoint's meta (engine counters) when the run was resumed, else empty.
        self.meta: dict = {}
        if outputs.to_topic(RELEASES):
            cycle.released_by = self._released_by

    def restore(self) -> dict:
        """Resume the checkpoint's run, or start a new run when that cannot fork a ledger;
        the source positions to continue from."""
        state = self.state
        if self.fresh:
            for aside in state.set_aside():
                log.warning("--fresh: %s kept aside; its run is closed", aside)
        if not self.fresh and self.config.scale.checkpoint_topic:
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

    def recover(self) -> None:
        """Become the writer, re-check the record, publish what the checkpoint holds."""
        self.become_writer()
        self.cycle.recover(self.source.positions(), self._read_record(), **self.hooks)

    def become_writer(self) -> None:
        """Take the model's transactional id (fencing an older writer); idempotent."""
        from connectors.transactions import ProducerFenced, is_authorization_error

        try:
            self.outputs.start(**self.hooks)
        except ProducerFenced as err:
            raise Fenced(str(err)) from None
        except Exception as err:
            if not is_authorization_error(err):
                raise
            # The writer's id is needed whatever the sinks (a Kafka source's offsets commit in
            # its transactions): say which permission, in one line, not "unexpected error".
            raise KafkaUnavailable(
                f"cannot become the writer of model {self.config.model.model_id!r}: "
                f"{type(err).__name__}; the principal needs Write and Describe on the "
                f"transactional id {self.config.transactional_id!r}"
            ) from None

    # -- a checkpoint from the checkpoint topic -------------------------------------------------
    def _checkpoint_from_topic(self) -> None:
        """Put the learner's latest published checkpoint from the checkpoint topic in place,
        unless the local checkpoint is newer.

        The topic is the source of truth and the state directory its cache: a partition that
        moved away and back finds its local checkpoint older than the topic's, which then
        replaces it (at the same cycle too: the published copy is the truth). A local
        checkpoint of the same run and a later cycle (written, not yet published, when its
        process died) is kept and resumed; one of another run is kept too and refused by the
        checks that follow, as is a damaged one.

        The topic's checkpoint must be sealed under the learner's key (derived from the
        master secret), for its model id (``<model>/p<k>``: model and partition); its
        checksums are checked before it is used. A damaged, unsealed or foreign one is
        refused.
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
                client=cfg.kafka.client,
                **rel.security,
            )
        except Exception as err:  # noqa: BLE001 - a diagnosis, not a traceback
            raise KafkaUnavailable(f"cannot read checkpoint topic {topic!r}: {err}") from None
        if value is None:
            return
        candidate = state.checkpoint.with_name(state.checkpoint.name + ".from-topic")
        try:
            write_private(candidate, value)
            published = load_resumable(candidate, self.learning, model_id, from_topic=True)
        except CheckpointError as err:
            candidate.unlink(missing_ok=True)
            raise StateError(
                f"the checkpoint of {model_id!r} in topic {topic!r} is refused: {err}"
            ) from None
        except OSError as err:
            raise StateError(f"cannot write checkpoint {state.checkpoint}: {err}") from None
        if state.checkpoint.exists():
            try:
                local = load_resumable(state.checkpoint, self.learning, model_id).meta
            except CheckpointError:
                candidate.unlink()
                raise
            run, seq = published.meta.get("run_id"), int(published.meta.get("seq", -1))
            if local.get("run_id") != run or int(local.get("seq", -1)) > seq:
                candidate.unlink()
                return
            # At the same cycle the published copy wins: a process that died before publishing
            # its cycle may have ended it at other records than the one that published it.
            log.info("local checkpoint of %s (cycle %s) is older than the one in topic %s "
                     "(cycle %d) or as old: replaced by it", model_id, local.get("seq"), topic,
                     seq)  # fmt: skip
        candidate.replace(state.checkpoint)
        log.info("checkpoint of %s taken from topic %s", model_id, topic)

    # -- a new run -----------------------------------------------------------------------------
    def _evidence_of_a_previous_run(self) -> list[str]:
        state, cfg = self.state, self.config
        found = []
        try:
            marker = state.read_marker()
        except (OSError, ValueError) as err:
            raise StateError(f"cannot read the run marker {state.marker}: {err}") from None
        if marker is not None:
            found.append(f"its run marker {state.marker.name} exists")
        if state.journal.exists() and not self._interrupted_first_checkpoint(marker):
            found.append(f"a ledger journal {state.journal.name} exists")
        # Both Kafka readings are read-only and each costs a coordinator or fetch round trip:
        # the release topic's tail is read beside the group's record.
        tail = None
        if self.outputs.to_topic(RELEASES):
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

    def _interrupted_first_checkpoint(self, marker: dict | None) -> bool:
        """Whether the journal is what a kill before a run's first checkpoint left.

        A new run opens its journal before its first checkpoint and writes its marker after
        it; nothing is learned before that checkpoint. A journal holding no charge, without a
        checkpoint or marker, therefore records nothing: :meth:`_open_journal` keeps it aside.
        """
        from stream_dp.privacy.journal import Journal

        state = self.state
        if marker is not None or state.checkpoint.exists():
            return False
        try:
            return Journal.holds_no_charges(state.journal)
        except OSError as err:
            raise StateError(f"cannot read the ledger journal {state.journal}: {err}") from None

    def _latest_release(self, *, committed: bool = True, tail: int = 2000) -> bytes | None:
        """The latest (committed) message keyed by the model among the last ``tail`` of each
        partition of the release topic, or None."""
        from connectors.admin import latest_with_key

        cfg = self.config
        rel = cfg.releases
        try:
            return latest_with_key(
                rel.bootstrap_servers,
                rel.topic,
                cfg.model.model_id.encode(),
                timeout_s=cfg.kafka.startup_timeout_seconds,
                client=cfg.kafka.client,
                committed=committed,
                tail=tail,
                **rel.security,
            )
        except Exception as err:  # noqa: BLE001 - a diagnosis, not a traceback
            raise KafkaUnavailable(
                f"cannot read release topic {rel.topic!r} to check for earlier releases of "
                f"model {cfg.model.model_id!r}: {err}"
            ) from None

    def _released_by(self, run_id: str) -> bool:
        """Whether the newest message keyed by the model on the release topic, aborted ones
        included, is of run ``run_id`` (a message that does not parse counts as one).

        Asked right after fencing that run, whose last messages are then the key's newest; the
        tail is long (:data:`FENCED_TAIL`) so that other models' releases written in between,
        on a topic they share, cannot hide them."""
        value = self._latest_release(committed=False, tail=FENCED_TAIL)
        if value is None:
            return False
        try:
            return ReleaseMessage.from_json(value).run_id == run_id
        except ValueError:
            return True

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
        cfg, cycle = self.config, self.cycle
        cycle.new_run()
        # Writer first: that settles any transaction a previous run left open (its offsets are
        # unreadable until then), and a run that is fenced now has written nothing.
        self.become_writer()
        cycle.verify(self._read_record(), before_start=False)
        if cfg.checkpoint.ledger_journal:
            self._open_journal()
        try:
            start = getattr(self.source, "start", None)
            positions = start() if start is not None else self.source.positions()
        except Exception as err:  # noqa: BLE001 - a diagnosis, not a traceback
            raise KafkaUnavailable(f"cannot resolve where the input starts: {err}") from None
        # The first checkpoint fixes the noise secret and the run id before anything is
        # published; the marker follows it, so a kill in between leaves no marker without a
        # checkpoint.
        cycle.save(positions)
        cycle.mark()
        log.info(
            "started model %s, run %s: %s",
            cfg.model.model_id,
            cycle.run_id,
            self.learner.describe(),
        )
        return positions

    # -- a resumed run -------------------------------------------------------------------------
    def _resume(self) -> dict:
        cfg, state = self.config, self.state
        c = load_resumable(state.checkpoint, self.learning, cfg.model.model_id)
        self.cycle.resume(c.meta)
        self.learning.restore(c.learner_state, state.journal)
        if cfg.checkpoint.ledger_journal and self.learner.accountant.storage.journal is None:
            self._open_journal()
        self.meta = c.meta
        record = self._record_before_start()
        if record is not None:
            self.cycle.verify(record, before_start=True)
        log.info(
            "resumed model %s, run %s, at step %d (ε spent %.4g; cycle %d)",
            cfg.model.model_id,
            self.cycle.run_id,
            self.learner.step,
            self.learner.accountant.spent()[0],
            self.cycle.seq,
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

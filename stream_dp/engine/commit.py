"""The commit cycle: nothing derived from input is visible before a checkpoint covers it.

The engine learns records and collects what they produce -- release messages and dead letters
-- in an :class:`Outbox`. :meth:`CommitCycle.end` then, in this order and only here,

1. waits for the previous cycle's publication (at most one is ever in flight);
2. writes the checkpoint: learner, ledger, source positions, run id, cycle number and the
   outbox, atomically (the *state*);
3. publishes the outbox with :class:`~stream_dp.engine.outputs.Outputs`: to Kafka in one
   transaction that also commits the source offsets tagged ``"<run id> <cycle>"`` (when source
   and sinks share a cluster), otherwise to each sink and then records the cycle
   (consumer-group commit or ``<checkpoint>.published``) (the *sinks*, then the *offsets*).

The state comes first, unlike in engines that may replay what they published (Quix Streams'
checkpoint flushes its sinks before its state): a release may become visible only once a
durable checkpoint holds it. A crash before step 2 leaves nothing visible: the replay may learn
the records in another order (several partitions interleave by timing) and that is harmless,
because no release of those steps was ever published. A crash after step 2 leaves a checkpoint
whose outbox is either published or not; the publication record tells which, and the restart
publishes the very same bytes if needed (:meth:`CommitCycle.recover`). Hence every release
that anyone can read is one a durable checkpoint holds, and for every (model, run, step) one
content is ever published (``docs/privacy.md``, "The engine: one release per step").
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from connectors.transactions import ProducerFenced
from stream_dp.checkpoint import checkpoint_bytes, save_checkpoint
from stream_dp.engine.errors import Fenced, StateError
from stream_dp.engine.outputs import CHECKPOINTS, Outputs, PublicationRecord
from stream_dp.engine.state import Published, StateDir

__all__ = ["CommitCycle", "CyclePolicy", "Outbox", "RunRefused"]

log = logging.getLogger("stream_dp.engine")

#: Most records one poll may hand the engine (a batch never crosses a cycle's end).
MAX_BATCH = 500

#: The share of a cycle's remaining ``every_seconds`` one batch is sized to take, at the
#: learner's measured cost per record: the other half absorbs records slower than the measure
#: (a release step, a slower machine) before the cycle's time is up.
BATCH_TIME_SHARE = 0.5


@dataclass
class Outbox:
    """Messages produced since the last commit cycle, in order: ``(stream, key, value)``.

    Examples
    --------
    >>> box = Outbox()
    >>> box.add("releases", "m", b'{"step": 1}')
    >>> box.add("dead_letters", "invalid_json", b'{"reason": "invalid_json"}')
    >>> Outbox.from_state(box.to_state()).messages == box.messages, box.nbytes
    (True, 37)
    """

    messages: list[tuple[str, str | None, bytes]] = field(default_factory=list)
    nbytes: int = 0

    def add(self, stream: str, key: str | None, value: bytes) -> None:
        self.messages.append((stream, key, value))
        self.nbytes += len(value)

    def clear(self) -> None:
        self.messages = []
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self.messages)

    def count(self, stream: str) -> int:
        return sum(1 for s, _, _ in self.messages if s == stream)

    def to_state(self) -> dict:
        """Checkpoint form: the values as one byte array and their ends (no JSON escaping)."""
        values = [v for _, _, v in self.messages]
        return {
            "streams": [s for s, _, _ in self.messages],
            "keys": [k for _, k, _ in self.messages],
            "data": np.frombuffer(b"".join(values), dtype=np.uint8).copy(),
            "ends": np.cumsum([len(v) for v in values], dtype=np.int64),
        }

    @classmethod
    def from_state(cls, state: dict) -> Outbox:
        data = np.asarray(state["data"], dtype=np.uint8).tobytes()
        ends = [int(e) for e in np.asarray(state["ends"], dtype=np.int64)]
        box = cls()
        start = 0
        for stream, key, end in zip(state["streams"], state["keys"], ends, strict=True):
            box.add(stream, key, data[start:end])
            start = end
        return box


class RunRefused(RuntimeError):
    """This run must not publish: the record shows another writer, or a newer past."""


@dataclass(frozen=True)
class CyclePolicy:
    """When a cycle ends: after ``every_records`` input messages, ``every_seconds``, or
    ``max_pending_bytes`` of waiting messages, whichever comes first (or when the input is
    idle). The engine's ``[checkpoint]`` section."""

    every_records: int
    every_seconds: float
    max_pending_bytes: int


class CommitCycle:
    """One run's commit cycles: who the run is, what waits in its outbox, what was published.

    Start-up calls :meth:`new_run` (then :meth:`save` and :meth:`mark`) or :meth:`resume`;
    :meth:`verify` before and after becoming the writer; :meth:`recover` once. Then the engine
    counts what it hands the learner (:meth:`consumed`) and calls :meth:`end` whenever
    :meth:`due` says so: checkpoint, then publication, in the background when it can.

    Errors: :class:`RunRefused` (start-up), :class:`~stream_dp.engine.errors.StateError` (the
    checkpoint cannot be written), :class:`~stream_dp.engine.errors.Fenced` (another instance
    took over the model's transactional id), and whatever the hooks raise.

    Parameters
    ----------
    state : StateDir
    outputs : Outputs
    source
        The engine's source: its :meth:`positions` are what a checkpoint resumes from.
    model_id : str
    policy : CyclePolicy
    snapshot : callable
        ``snapshot() -> (learner_state, meta)``: what the checkpoint holds besides the cycle.
    seal_key : bytes, optional
        Seal every checkpoint under this key (a learner whose secret comes from a master).
    portable : callable, optional
        ``portable() -> (learner_state, meta)`` or None: the state of a checkpoint that resumes
        without the state directory (a journaled ledger carries its journal), for the
        checkpoint topic; None (or a call that returns None) when the file is that already.
    clock : callable, default time.monotonic
    """

    def __init__(
        self,
        state: StateDir,
        outputs: Outputs,
        source: Any,
        model_id: str,
        policy: CyclePolicy,
        snapshot: Callable[[], tuple[dict, dict]],
        *,
        seal_key: bytes | None = None,
        portable: Callable[[], tuple[dict, dict] | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.state, self.outputs, self.source, self.model_id = state, outputs, source, model_id
        self.policy, self.snapshot, self.seal_key, self.clock = policy, snapshot, seal_key, clock
        self.portable = portable
        #: Input messages handed to the learner since the cycle began.
        self.since = 0
        #: Seconds of learning per message, as measured (None before the first batch).
        self.per_record: float | None = None
        self.began = clock()
        self.run_id: str | None = None
        self.run_created: float | None = None
        self.seq = 0
        self.outbox = Outbox()
        #: Source positions of the last published cycle (None before :meth:`recover`).
        self.committed_positions: dict | None = None
        #: (cycle, wall time) of the last publication made by this process.
        self.last_published: tuple[int, float | None] = (0, None)
        #: What the record showed when a new run began (a run ``--fresh`` closed), if anything.
        self.prior: Published | None = None
        #: True between a cycle's checkpoint and the end of its publication.
        self.unpublished = False
        self._inflight: _Publication | None = None
        #: Whether a run published anything, aborted messages included (None: cannot tell,
        #: the releases go to a file).
        self.released_by: Callable[[str], bool] | None = None

    # -- identity --------------------------------------------------------------------------
    def new_run(self) -> None:
        """A new run: fresh id (random, independent of the data and of the noise secret)."""
        self.run_id = secrets.token_hex(16)
        self.run_created = time.time()
        self.seq = 0
        self.outbox = Outbox()

    def mark(self) -> None:
        """Write the run marker: only after the run's first checkpoint is durable."""
        self.state.write_marker(self.model_id, self.run_id, self.run_created)

    def resume(self, meta: dict) -> None:
        """Take the run, cycle and outbox of a checkpoint; refuse one of another run.

        Raises
        ------
        RunRefused
            The checkpoint has no run id, or this directory's marker names another run.
        """
        if "run_id" not in meta or "seq" not in meta:
            raise RunRefused(
                f"{self.state.checkpoint} has no run id (written by an earlier stream-dp): "
                "resume it with that version, or pass --fresh to start a new run"
            )
        self.run_id, self.seq = str(meta["run_id"]), int(meta["seq"])
        self.run_created = float(meta.get("run_created") or 0.0)
        self.outbox = Outbox.from_state(meta["outbox"])
        try:
            marker = self.state.read_marker()
        except (OSError, ValueError) as err:
            raise RunRefused(f"cannot read the run marker {self.state.marker}: {err}") from None
        if marker is None:
            self.mark()  # killed between the first checkpoint and the marker
        elif marker.get("run_id") != self.run_id:
            raise RunRefused(
                f"{self.state.checkpoint} belongs to run {self.run_id} but this state directory "
                f"was created by run {marker.get('run_id')} of model {self.model_id!r}: the "
                "checkpoint comes from another run of the model. Put back this directory's own "
                "checkpoint, or pass --fresh"
            )

    def meta(self) -> dict:
        """What a checkpoint must hold of the cycle."""
        return {
            "run_id": self.run_id,
            "run_created": self.run_created,
            "seq": self.seq,
            "outbox": self.outbox.to_state(),
        }

    # -- the record ------------------------------------------------------------------------
    def verify(self, record: PublicationRecord, *, before_start: bool) -> None:
        """Refuse to continue when the record shows another writer, or a newer past.

        Checked before becoming the writer (so a refused start never fences the instance that
        runs) and again after (an instance that published in between is caught).

        Raises
        ------
        RunRefused
        """
        if record.foreign:
            raise RunRefused(
                f"{record.foreign}: refusing to publish releases of model {self.model_id!r} "
                "beside them (pass --fresh to start a new run that continues after those offsets)"
            )
        p = record.published
        if p is None:
            return
        if p.run_id != self.run_id:
            if self.seq == 0 and p == self.prior:
                return  # the run that --fresh closed
            if self.seq == 0 and p.seq == 0 and not before_start:
                # Another new instance registered between this one's check and its becoming the
                # writer, which fenced it. Its releases, if it had begun publishing, are in the
                # log though aborted: a consumer reading uncommitted (Kafka's default) has seen
                # them, and this run's releases of the same steps carry other noise. Releases
                # to a file were written before the transaction, where this one cannot look.
                unseen = self.released_by is None
                if unseen or self.released_by(p.run_id):
                    why = (
                        "its releases go to a file this one cannot read, so it may have begun "
                        "publishing"
                        if unseen
                        else "it had begun publishing: its releases, aborted, are on the release "
                        "topic"
                    )
                    raise RunRefused(
                        f"run {p.run_id} of model {self.model_id!r} started at the same moment "
                        f"and was fenced by this instance; {why}, and this run would publish "
                        "other noise for the same steps. Restart that instance from its state "
                        "directory (it publishes its checkpointed releases again); remove this "
                        "one's"
                    )
                log.warning("run %s of model %s was registered at the same moment and has been "
                            "fenced; it published nothing", p.run_id, self.model_id)  # fmt: skip
                return
            raise RunRefused(
                f"run {p.run_id} of model {self.model_id!r} has published (cycle {p.seq}); this "
                f"state directory holds run {self.run_id}. Two runs of one model would publish "
                "two histories: stop the other instance, or use its state directory"
            )
        if p.seq > self.seq:
            raise RunRefused(
                f"{self.state.checkpoint} is cycle {self.seq} of run {p.run_id} but cycle {p.seq} "
                "was already published: the checkpoint is older than what consumers have seen "
                "(restored from a backup?). Resuming would publish other releases for steps "
                "already released; use the latest checkpoint"
            )

    # -- cycles ----------------------------------------------------------------------------
    def consumed(self, n: int, seconds: float | None = None) -> None:
        """``n`` more input messages were handed to the learner in this cycle, which took
        ``seconds`` to learn them (if measured)."""
        self.since += n
        if n and seconds is not None:
            cost = max(seconds, 0.0) / n
            # Up at once (a slower learner must not overrun the cycle), down by half a batch at
            # most (one fast batch after a slow one, say a kernel's first compilation, is not
            # yet a trend).
            old = self.per_record
            self.per_record = cost if old is None or cost >= old else max(cost, old / 2)

    def batch_limit(self, assumed_per_record: float | None = None) -> int:
        """How many messages the next poll may take.

        A batch never crosses a cycle's end: a source counts a polled batch as consumed, so a
        cycle can only end between batches. Hence the limit is also one of time: the batch is
        sized to take :data:`BATCH_TIME_SHARE` of what is left of ``every_seconds`` at the
        measured cost per record, so that a slow learner (a metric model of many features, a
        busy machine) still checkpoints about every ``every_seconds`` instead of once per
        :data:`MAX_BATCH` records. Before any measurement the batch is one record, unless
        ``assumed_per_record`` gives a cost to assume meanwhile (a scale-out instance passes its
        partition learners' highest measured cost: they run one model's configuration, and a
        partition learner that has never had a record must not hold the instance's shared poll
        to one record).

        Examples
        --------
        >>> from connectors import IterableSource
        >>> now = [0.0]
        >>> cycle = CommitCycle(None, None, IterableSource([]), "m",
        ...                     CyclePolicy(5000, 5.0, 1 << 20), dict, clock=lambda: now[0])
        >>> cycle.batch_limit()
        1
        >>> cycle.consumed(1, seconds=1e-4)
        >>> cycle.batch_limit()
        500
        >>> cycle.consumed(500, seconds=250.0)  # half a second per record
        >>> now[0] = 1.0
        >>> cycle.batch_limit()  # 4 s left: 2 s of learning
        4
        >>> fresh = CommitCycle(None, None, IterableSource([]), "m",
        ...                     CyclePolicy(5000, 5.0, 1 << 20), dict, clock=lambda: now[0])
        >>> fresh.batch_limit(), fresh.batch_limit(assumed_per_record=0.5)
        (1, 5)
        """
        limit = min(MAX_BATCH, self.policy.every_records - self.since)
        per_record = self.per_record if self.per_record is not None else assumed_per_record
        if per_record is None:
            return 1
        if per_record > 0:
            # A cycle with nothing in it has all of every_seconds ahead, however long ago the
            # last one ended: an idle partition learner must not shrink the polls of the others
            # of its scale-out instance to one record each.
            empty = self.since == 0 and not len(self.outbox)
            left = self.policy.every_seconds - (0.0 if empty else self.clock() - self.began)
            limit = min(limit, int(BATCH_TIME_SHARE * left / per_record))
        return max(1, limit)

    def due(self, idle: bool) -> bool:
        """Whether the cycle should end now (``idle``: the input has nothing more for now)."""
        if not len(self.outbox) and self.since == 0:
            return False
        policy = self.policy
        return (
            idle
            or self.since >= policy.every_records
            or self.outbox.nbytes >= policy.max_pending_bytes
            or self.clock() - self.began >= policy.every_seconds
        )

    def end(
        self,
        *,
        publish: bool = True,
        background: bool = False,
        on_retry: Callable[[BaseException], None] | None = None,
        on_wait: Callable[[], None] | None = None,
    ) -> bool:
        """End the cycle: checkpoint (learner, ledger, positions, outbox), then publish it.

        Nothing happens (False) when nothing did since the last published cycle. Without
        ``publish`` the cycle is only checkpointed: the next start publishes it. With
        ``background`` (and Kafka topics to publish to) the publication runs beside the
        learning of the next cycle, whose own end waits for it.
        """
        with self._fenced():
            self.settle(on_retry, on_wait)
            positions = self.source.positions()
            if not self.pending(positions):
                return False
            self.since, self.began = 0, self.clock()
            self.checkpoint(positions)
            if publish:
                if background and self.outputs.publisher is not None:
                    self.publish_in_background(positions)
                else:
                    self.publish(positions, on_retry=on_retry, on_wait=on_wait)
        return True

    @contextmanager
    def _fenced(self) -> Iterator[None]:
        """Another instance took over the model's transactional id: say what stays unpublished
        (the checkpoint holds it; that instance publishes it)."""
        try:
            yield
        except ProducerFenced as err:
            raise Fenced(
                f"{err}; the {len(self.outbox)} message(s) of cycle {self.seq} were not committed"
            ) from None

    def pending(self, positions: dict) -> bool:
        """Whether anything happened since the last published cycle."""
        return bool(len(self.outbox)) or positions != self.committed_positions

    def save(self, positions: dict) -> None:
        """Write the checkpoint of the current cycle (atomic, 0600)."""
        learner_state, meta = self.snapshot()
        try:
            save_checkpoint(
                self.state.checkpoint,
                learner_state,
                positions,
                {**meta, **self.meta()},
                seal_key=self.seal_key,
            )
        except OSError as err:
            raise StateError(f"cannot write checkpoint {self.state.checkpoint}: {err}") from None

    def checkpoint(self, positions: dict) -> None:
        """End a cycle: the next cycle number, and the checkpoint that holds the cycle."""
        self.settle()
        self.seq += 1
        self.save(positions)
        self.unpublished = True

    def _with_checkpoint(self, messages: list, positions: dict) -> list:
        """The cycle's messages, and its checkpoint if the outputs take checkpoints.

        Published in the cycle's transaction, the checkpoint in the topic is always the one of
        the last published cycle, so a resume from it needs to publish nothing again. It must
        resume on another machine: with a ledger journal it is the portable form of the
        cycle's checkpoint (same learner, positions and cycle; the journal inside).
        """
        if CHECKPOINTS not in self.outputs.sinks:
            return messages
        state = None if self.portable is None else self.portable()
        if state is None:
            blob = self.state.checkpoint.read_bytes()
        else:
            learner_state, meta = state
            blob = checkpoint_bytes(
                learner_state, positions, {**meta, **self.meta()}, seal_key=self.seal_key
            )
        return [*messages, (CHECKPOINTS, self.model_id, blob)]

    def publish(self, positions: dict, **hooks: Callable) -> None:
        """Publish the current cycle's outbox and record it; the outbox is then empty."""
        self.settle(**hooks)
        self.outputs.publish(
            self._with_checkpoint(self.outbox.messages, positions),
            positions,
            Published(self.run_id, self.seq),
            **hooks,
        )
        self.outbox.clear()
        self._published(positions)

    def _published(self, positions: dict) -> None:
        self.committed_positions = positions
        self.last_published = (self.seq, time.time())
        self.unpublished = False

    def publish_in_background(self, positions: dict) -> None:
        """Start publishing the checkpointed cycle; learning goes on into a new outbox.

        At most one cycle is ever in flight: :meth:`settle` (called by the next
        :meth:`checkpoint` and :meth:`publish`) waits for it, so a checkpoint is never written
        while the previous cycle's publication is unsettled -- after a crash, the record shows
        the checkpoint's cycle or the one before, as :meth:`recover` expects.
        """
        self.settle()
        messages = self._with_checkpoint(self.outbox.messages, positions)
        self.outbox = Outbox()
        self._inflight = _Publication(
            self.outputs, messages, positions, Published(self.run_id, self.seq)
        )
        self._inflight.start()

    @property
    def in_flight(self) -> int:
        """Messages of the cycle being published in the background (0: none)."""
        job = self._inflight
        return 0 if job is None else len(job.messages)

    def settle_if_done(self) -> None:
        """Settle the background publication if it has finished (never waits)."""
        job = self._inflight
        if job is not None and not job.is_alive():
            with self._fenced():
                self.settle()

    def settle(
        self,
        on_retry: Callable[[BaseException], None] | None = None,
        on_wait: Callable[[], None] | None = None,
    ) -> None:
        """Wait for the publication in flight (if any); raise its error.

        ``on_wait`` is called about twice a second meanwhile and may raise to give up: the
        publication is then abandoned (its transaction aborted by the next writer; the
        checkpoint holds its messages).
        """
        job = self._inflight
        if job is None:
            return
        try:
            while job.is_alive():
                job.join(timeout=0.5)
                if job.is_alive() and on_wait is not None:
                    on_wait()
        except BaseException:
            self.abandon()
            raise
        self._inflight = None
        if job.error is not None:
            raise job.error
        self._published(job.positions)

    def abandon(self) -> None:
        """Give up the publication in flight (stop, deadline, shutdown); never raises."""
        job, self._inflight = self._inflight, None
        if job is not None:
            job.cancel.set()
            job.join(timeout=2.0)

    def recover(self, positions: dict, record: PublicationRecord, **hooks: Callable) -> None:
        """After becoming the writer: publish the checkpoint's cycle unless the record has it."""
        self.verify(record, before_start=False)
        p = record.published
        if p == Published(self.run_id, self.seq):
            self.outbox.clear()
            self.committed_positions = positions
            return
        if self.seq > 0 and (p is None or p.seq != self.seq - 1):
            log.warning(
                "no record that cycle %d of run %s was published (the record shows %s): "
                "publishing its %d message(s) again; consumers may see them twice, identically",
                self.seq - 1, self.run_id, p.tag if p else "nothing", len(self.outbox),
            )  # fmt: skip
        elif len(self.outbox):
            log.info("publishing the %d message(s) of cycle %d left by the previous process",
                     len(self.outbox), self.seq)  # fmt: skip
        with self._fenced():
            self.publish(positions, **hooks)


class _Cancelled(Exception):
    """The engine gave up a background publication (stop, deadline, shutdown)."""


class _Publication(threading.Thread):
    """One cycle's publication, run beside the learning of the next cycle."""

    def __init__(
        self,
        outputs: Outputs,
        messages: list[tuple[str, str | None, bytes]],
        positions: dict,
        published: Published,
    ) -> None:
        super().__init__(name=f"stream-dp-publish-{published.seq}", daemon=True)
        self.outputs, self.messages = outputs, messages
        self.positions, self.published = positions, published
        self.cancel = threading.Event()
        self.error: BaseException | None = None

    def _check(self, *_: object) -> None:
        if self.cancel.is_set():
            raise _Cancelled()

    def run(self) -> None:
        try:
            self.outputs.publish(
                self.messages,
                self.positions,
                self.published,
                on_retry=self._check,
                on_wait=self._check,
            )
        except BaseException as err:  # noqa: BLE001 - handed to settle() in the engine thread
            self.error = err

"""The engine's learner: one input message in, one explicit :class:`Outcome` out.

A message is parsed and conformed to the declared schema (:func:`connectors.schema.
parse_conformed`), then learned (``learn_one``). What became of it is one of four outcomes,
each with what the commit cycle must publish for it:

==============  ======================================================  =====================
``LEARNED``     the record was learned; its step made no release         nothing
``RELEASED``    the record was learned and its step made a release       the release message
``REJECTED``    bad input: never learned from                            a dead letter (reason)
``EXHAUSTED``   valid, but the budget is spent: no longer learned        a dead letter
                                                                         (``budget_exhausted``)
``DROPPED``     valid, but its privacy unit's contribution bound is     nothing (committed and
                reached (``model.unit_key``): never learned from        counted)
==============  ======================================================  =====================

A unit-level model (``model.unit_key``) reads each record's unit from the record's top-level
field of that name, or from the Kafka message key (``[units] source = "message_key"``).

Both stages raise the one record-error type, :class:`connectors.schema.RecordError`, with its
reason code. The learner's checkpoint state goes through :class:`Learning` too: the noise secret
derived from a master secret never reaches a checkpoint, and the ledger journal is named
relative to the checkpoint so that the state directory can move.
"""

from __future__ import annotations

import enum
import json
import math
import operator
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from connectors.schema import DeadLetter, RecordError, ReleaseEncoder, parse_conformed
from stream_dp.engine.builders import build_learner
from stream_dp.privacy.accountant import ZCDPAccountant
from stream_dp.privacy.conversions import epsilons_from_rhos

__all__ = ["BUDGET_EXHAUSTED", "Handled", "Learning", "Outcome"]

#: The dead-letter reason of a valid record that arrives after the budget is spent.
BUDGET_EXHAUSTED = "budget_exhausted"


class Outcome(enum.Enum):
    """What became of one input message."""

    LEARNED = "learned"
    RELEASED = "released"
    REJECTED = "rejected"
    EXHAUSTED = "exhausted"
    DROPPED = "dropped"


class Handled(NamedTuple):
    """One message's outcome and what it produced.

    ``key`` and ``value`` are the message to publish: a release (keyed by the model id) or a
    dead letter (keyed by its reason); None for a record learned without a release.
    ``unknown`` counts the features outside the schema that were dropped.
    """

    outcome: Outcome
    key: str | None = None
    value: bytes | None = None
    unknown: int = 0


_LEARNED = Handled(Outcome.LEARNED)
_DROPPED = Handled(Outcome.DROPPED)


class Learning:
    """The learner as the engine runs it.

    Parameters
    ----------
    config : EngineConfig
        With a declared schema (``model.features``); ``config.model`` is the learner.
    secret : int, optional
        The learner's noise secret, derived from a master secret by the caller
        (:mod:`stream_dp.engine.master_secret`). Checkpoints then never hold it and are
        sealed under a key derived from it (:meth:`seal_key`).

    Examples
    --------
    >>> from stream_dp.engine.config import EngineConfig
    >>> cfg = EngineConfig.model_validate({
    ...     "model": {"alpha": 1.0, "buffer": 4, "release_every": 1, "features": ["a"]},
    ...     "source": {"kind": "jsonl", "path": "-"}, "releases": {"kind": "stdout"},
    ...     "dead_letters": {"kind": "stdout"}, "checkpoint": {"path": "m.ckpt"}})
    >>> learning = Learning(cfg)
    >>> [learning.handle(v).outcome.value for v in (b'{"x": {"a": 0.5}, "y": 1}', b"{")]
    ['released', 'rejected']
    >>> learning.handle(b"{").key
    'invalid_json'
    """

    def __init__(self, config: Any, secret: int | None = None) -> None:
        if config.model.features is None:
            raise ValueError("the engine needs a declared schema (model.features)")
        self.config = config
        self.learner = learner = build_learner(config)
        self.secret = secret
        self.features = tuple(config.model.features)
        self.known = frozenset(self.features)
        self.max_bytes = config.max_message_bytes
        self.private = not config.model.reproducible
        #: The run the releases belong to (set when the run starts).
        self.run_id: str | None = None
        self._encoder = ReleaseEncoder()
        #: The record field naming the privacy unit (None: event-level), and whether the unit
        #: is the Kafka message key instead.
        self.unit_key = getattr(config.model, "unit_key", None)
        units = getattr(config, "units", None)
        self.unit_from_message_key = units is not None and units.source == "message_key"
        # handle_batch's batches: an event-level AUC model with a zCDP ledger that can keep
        # every release of a batch (the rest is decided per batch by learn_many_kept).
        self._batched = (
            self.unit_key is None
            and getattr(learner, "task", None) == "auc"
            and hasattr(learner, "learn_many_kept")
            and type(getattr(learner, "accountant", None)) is ZCDPAccountant
        )
        names = self.features
        self._row = operator.itemgetter(*names) if len(names) > 1 else (lambda x: (x[names[0]],))
        if secret is not None:
            # A learner refuses an explicit ``seed`` unless the run is declared non-private (a
            # guessable integer); a secret derived from a 128-bit master is not guessable, and
            # restoring a state with it is how a resumed learner gets its secret anyway.
            state = learner.state_dict()
            state["secret"] = int(secret)
            learner.load_state_dict(state)

    # -- records ---------------------------------------------------------------------------
    def handle(self, value: Any, position: Any = None, key: bytes | None = None) -> Handled:
        """Learn one message (its raw ``value``; ``position`` goes into a dead letter; ``key``:
        the Kafka message key, the unit when ``[units] source = "message_key"``)."""
        try:
            x, y, unknown = parse_conformed(
                value, self.features, self.known, max_bytes=self.max_bytes
            )
        except RecordError as err:
            return _dead(Outcome.REJECTED, err.reason, err.message, value, position)
        return self._learn(x, y, unknown, value, position, key)

    def handle_batch(self, messages: Sequence[Any]) -> list[Handled]:
        """:meth:`handle` of each message (with ``value``, ``position`` and ``key``), in order.

        The same outcomes and messages (a release's ``time`` aside), and the learner left the
        same, but the records the learner can take as a batch are learned by one call:
        consecutive plain records (every feature present, a boolean or 0/1 label) of an
        event-level AUC model past its warm-up (``learn_many_kept``), with the ledger total and
        the ε of each release computed together. Any other record takes :meth:`handle`'s path
        in its place in the order. ``tests/test_engine_batch.py`` holds the two equal.
        """
        if not self._batched:
            return [self.handle(m.value, m.position, m.key) for m in messages]
        out: list[Any] = [None] * len(messages)
        run: list[tuple[int, dict, Any, int]] = []
        width, features, known = len(self.features), self.features, self.known
        for i, msg in enumerate(messages):
            value = msg.value
            try:
                x, y, unknown = parse_conformed(value, features, known, max_bytes=self.max_bytes)
            except RecordError as err:  # never learned from: the run goes on around it
                out[i] = _dead(Outcome.REJECTED, err.reason, err.message, value, msg.position)
                continue
            if (
                type(x) is dict
                and len(x) == width
                and (y is True or y is False or (type(y) is int and 0 <= y <= 1))
            ):
                run.append((i, x, y, unknown))
                continue
            self._learn_run(run, messages, out)
            run = []
            out[i] = self._learn(x, y, unknown, value, msg.position, msg.key)
        self._learn_run(run, messages, out)
        return out

    def _learn_run(self, run: list, messages: Sequence[Any], out: list) -> None:
        """Learn a run of plain records (:meth:`handle_batch`) and put each one's outcome in
        ``out``; one at a time when the learner cannot take them as a batch."""
        if not run:
            return
        learner = self.learner
        acc = learner.accountant
        get = self._row
        X = np.array([get(x) for _, x, _, _ in run], dtype=np.float64)  # rows: tuples
        mark = acc.mark()
        kept = learner.learn_many_kept(X, [y for _, _, y, _ in run])
        if kept is None:
            for i, x, y, unknown in run:
                msg = messages[i]
                out[i] = self._learn(x, y, unknown, msg.value, msg.position, msg.key)
            return
        learned, t0 = kept.learned, learner.step - kept.learned
        released = {}
        if len(kept.steps):
            # ρ spent after each release: the total after the last charge made up to its step.
            steps, totals = acc.totals_since(mark)
            rhos, j, rho = [], 0, math.fsum(mark[1])
            for t in kept.steps.tolist():
                while j < len(steps) and steps[j] <= t:
                    rho, j = totals[j], j + 1
                rhos.append(rho)
            epsilons = epsilons_from_rhos(rhos, acc.delta, acc.conversion)
            # Every release here is one after which the learner could still step, so none is
            # exhausted (learn_one marks a learner exhausted only at a step it cannot take).
            fields = learner.release_message()
            fields.setdefault("private", self.private)
            messages_out = self._encoder.encode_many(
                fields, kept.steps.tolist(), kept.indices.tolist(), kept.weights, rhos, epsilons,
                run_id=self.run_id, time=time.time(),
            )  # fmt: skip
            released = dict(zip((kept.steps - (t0 + 1)).tolist(), messages_out, strict=True))
        model_id = learner.model_id
        for k, (i, _, _, unknown) in enumerate(run):
            if k >= learned:  # the budget ran out at this record
                msg = messages[i]
                out[i] = _exhausted(msg.value, msg.position, unknown)
                continue
            if unknown:
                note_unknown_features(learner)
            release = released.get(k)
            if release is not None:
                out[i] = Handled(Outcome.RELEASED, model_id, release, unknown)
            else:
                out[i] = _LEARNED if not unknown else Handled(Outcome.LEARNED, unknown=unknown)

    def _learn(self, x, y, unknown: int, value: Any, position: Any, key: bytes | None) -> Handled:
        """Learn a parsed record (:meth:`handle` after its parse)."""
        learner = self.learner
        step = learner.step
        try:
            if self.unit_key is not None:
                x = self._with_unit(x, value, key)
            learner.learn_one(x, y)
        except RecordError as err:  # from the learner: the one record-error type
            return _dead(Outcome.REJECTED, err.reason, err.message, value, position, unknown)
        # ``step`` counts the records the learner has learned and ``release_step`` is the
        # step of its latest release: learn_one's effect, as the learner documents it.
        if learner.step == step and not learner.exhausted:
            return _DROPPED  # the unit's bound: counted by the learner, nothing published
        if learner.step == step:
            return _exhausted(value, position, unknown)
        if unknown:
            note_unknown_features(learner)
        if learner.release_step != learner.step:
            return _LEARNED if not unknown else Handled(Outcome.LEARNED, unknown=unknown)
        fields = learner.release_message()
        fields.setdefault("private", self.private)
        release = self._encoder.encode(fields, run_id=self.run_id, time=time.time())
        return Handled(Outcome.RELEASED, fields["model_id"], release, unknown)

    def _with_unit(self, x, value: Any, key: bytes | None) -> dict:
        """``x`` with the record's unit in the field the learner reads it from."""
        if not isinstance(x, dict):
            x = dict(zip(self.features, x, strict=True))
        if self.unit_from_message_key:
            unit = key
        else:  # a top-level field of the record (valid JSON: parse_conformed accepted it)
            data = json.loads(bytes(value) if isinstance(value, memoryview | bytearray) else value)
            unit = data.get(self.unit_key) if isinstance(data, dict) else None
        return {**x, self.unit_key: unit}

    # -- checkpoints -----------------------------------------------------------------------
    def checkpoint_state(self, journal: Path, *, portable: bool = False) -> dict:
        """The learner's state for a checkpoint beside the ledger journal ``journal``.

        ``portable``: for a checkpoint that leaves the machine (the checkpoint topic), so it
        must resume without this directory: a journaled ledger carries the journal's bytes
        up to its reference (``journal_bytes``; :meth:`restore` puts them back in place, and
        the journal's SHA-256 in the reference checks them).
        """
        state = self.learner.state_dict()
        if self.secret is not None:
            state["secret"] = None  # derived from the master secret; never at rest
        acc = self.learner.ledger_state(state)
        if "journal" in acc:  # named relative to the checkpoint, so the directory can move
            ref = acc["journal"]
            acc["journal"] = {**ref, "path": journal.name}
            if portable:
                with open(ref["path"], "rb") as f:
                    blob = f.read(int(ref["bytes"]))
                acc["journal_bytes"] = np.frombuffer(blob, dtype=np.uint8).copy()
        return state

    def seal_key(self) -> bytes | None:
        """The key the learner's checkpoints are sealed under: derived from its secret when
        that comes from a master secret (None: the learner keeps its own secret)."""
        if self.secret is None:
            return None
        from stream_dp.engine.master_secret import checkpoint_key

        return checkpoint_key(self.secret, self.config.model.model_id)

    def meta(self) -> dict:
        """What a checkpoint must hold of the secret: its fingerprint (or nothing)."""
        if self.secret is None:
            return {}
        from stream_dp.engine.master_secret import secret_fingerprint

        return {"secret_fingerprint": secret_fingerprint(self.secret)}

    def restore(self, learner_state: dict, journal: Path) -> None:
        """Load a checkpoint's learner state (the secret put back, the journal found beside the
        checkpoint, wherever the state directory now is)."""
        if self.secret is not None:
            learner_state["secret"] = self.secret
        acc = self.learner.ledger_state(learner_state)
        if "journal" in acc:
            acc["journal"] = {**acc["journal"], "path": str(journal)}
        carried = acc.pop("journal_bytes", None)
        if carried is not None:  # a portable checkpoint: its journal replaces the local one
            from stream_dp.checkpoint import write_private

            write_private(journal, np.asarray(carried, dtype=np.uint8).tobytes())
        self.learner.load_state_dict(learner_state)


def note_unknown_features(learner: Any) -> None:
    """Count a learned record whose unknown features the engine dropped before ``learn_one``
    (the learner's private metrics count it; a learner without them ignores this)."""
    note = getattr(learner, "note_unknown_features", None)
    if note is not None:
        note()


def _exhausted(value: Any, position: Any, unknown: int) -> Handled:
    return _dead(
        Outcome.EXHAUSTED,
        BUDGET_EXHAUSTED,
        "the model's privacy budget is spent; it serves its last release",
        value,
        position,
        unknown,
    )


def _dead(
    outcome: Outcome,
    reason: str,
    message: str,
    value: Any,
    position: Any,
    unknown: int = 0,
) -> Handled:
    letter = DeadLetter.from_raw(reason, message, value, position)
    return Handled(outcome, letter.reason, letter.to_json(), unknown)

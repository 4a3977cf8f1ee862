"""The commit cycle alone (stream_dp/engine/commit.py), without a learner or an engine.

A cycle's order is what makes every published release one a durable checkpoint holds: state
(the checkpoint) first, then the sinks, then the record of the publication (the offsets). These
tests watch that order from inside the sinks, and what a restart finds after a crash at each
point. The engine's runs over the same cycle are tests/test_engine.py; the Kafka transaction
that publishes sinks and offsets at once is tests/integration/test_engine_kafka.py.
"""

from __future__ import annotations

import pytest

from connectors import IterableSource
from stream_dp.checkpoint import load_checkpoint
from stream_dp.engine.commit import CommitCycle, CyclePolicy
from stream_dp.engine.errors import StateError
from stream_dp.engine.outputs import DEAD_LETTERS, RELEASES, Outputs
from stream_dp.engine.state import Published, StateDir

POLICY = CyclePolicy(every_records=3, every_seconds=10.0, max_pending_bytes=100)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Sink:
    """Takes messages and, for each, what the state directory held when it arrived."""

    def __init__(self, state: StateDir, crash_at: int | None = None) -> None:
        self.state, self.crash_at = state, crash_at
        self.got: list[tuple[str | None, bytes]] = []
        self.seen: list[tuple[int, Published | None]] = []

    def send(self, key: str | None, value: bytes) -> None:
        if self.crash_at is not None and len(self.got) + 1 == self.crash_at:
            raise RuntimeError("simulated crash while publishing")
        checkpoint = load_checkpoint(self.state.checkpoint)
        self.seen.append((checkpoint.meta["seq"], self.state.read_published()))
        self.got.append((key, value))

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def cycle_over(tmp_path, sink: Sink, source=None, clock=None) -> CommitCycle:
    state = sink.state
    outputs = Outputs({RELEASES: sink, DEAD_LETTERS: sink}, state=state)
    source = source if source is not None else IterableSource(range(10))

    def snapshot() -> tuple[dict, dict]:
        return {"class": "Learner", "params": {"model_id": "m"}, "t": 0}, {"stats": {}}

    return CommitCycle(state, outputs, source, "m", POLICY, snapshot, clock=clock or Clock())


@pytest.fixture
def state(tmp_path) -> StateDir:
    d = StateDir(tmp_path / "state" / "m.ckpt")
    d.acquire()
    yield d
    d.release()


def started(cycle: CommitCycle) -> CommitCycle:
    """A new run, as start-up leaves it: first checkpoint, marker, recovered."""
    cycle.new_run()
    cycle.save(cycle.source.positions())
    cycle.mark()
    cycle.recover(cycle.source.positions(), cycle.outputs.record())
    return cycle


def test_the_checkpoint_comes_before_the_sinks_and_the_record_after_them(state, tmp_path):
    sink = Sink(state)
    cycle = started(cycle_over(tmp_path, sink))
    batch = cycle.source.poll(max_records=2)
    cycle.outbox.add(RELEASES, "m", b"release 1")
    cycle.outbox.add(DEAD_LETTERS, "invalid_json", b"letter 2")
    cycle.consumed(len(batch))
    assert cycle.end() is True
    # Each message arrived when the checkpoint of its cycle (1) was durable, and while the
    # record still said cycle 0 (the run's start) was the last one published.
    before = Published(cycle.run_id, 0)
    assert sink.seen == [(1, before), (1, before)]
    assert sink.got == [("m", b"release 1"), ("invalid_json", b"letter 2")]
    assert state.read_published() == Published(cycle.run_id, 1)
    assert len(cycle.outbox) == 0 and cycle.committed_positions == {"line": 2}
    held = load_checkpoint(state.checkpoint)
    assert held.positions == {"line": 2} and held.meta["seq"] == 1


def test_a_cycle_with_nothing_new_is_not_ended(state, tmp_path):
    sink = Sink(state)
    cycle = started(cycle_over(tmp_path, sink))
    written = state.checkpoint.stat().st_mtime_ns
    assert cycle.end() is False
    assert cycle.seq == 0 and sink.got == []
    assert state.checkpoint.stat().st_mtime_ns == written
    cycle.source.poll(max_records=1)  # input consumed, nothing produced: still a cycle
    cycle.consumed(1)
    assert cycle.end() is True and cycle.seq == 1 and sink.got == []


def test_due_follows_the_policy_and_a_batch_never_crosses_a_cycle(state, tmp_path):
    clock = Clock()
    cycle = started(cycle_over(tmp_path, Sink(state), clock=clock))
    assert not cycle.due(idle=True), "nothing happened: nothing to end"
    assert cycle.batch_limit() == 1, "before the learner's cost is measured: one record"
    cycle.consumed(1, seconds=0.001)
    assert not cycle.due(idle=False) and cycle.due(idle=True)
    assert cycle.batch_limit() == 2, "every_records - 1: time allows 5,000"
    cycle.consumed(2)
    assert cycle.due(idle=False), "every_records"
    assert cycle.batch_limit() == 1, "at least one record, never a batch into the next cycle"
    cycle.source.poll(max_records=3)
    cycle.end()
    cycle.outbox.add(RELEASES, "m", b"x" * 99)
    assert not cycle.due(idle=False)
    cycle.outbox.add(RELEASES, "m", b"x")
    assert cycle.due(idle=False), "max_pending_bytes"
    cycle.end()
    cycle.consumed(1)
    clock.now += 9.9
    assert not cycle.due(idle=False)
    clock.now += 0.1
    assert cycle.due(idle=False), "every_seconds since the cycle began"
    cycle.source.poll(max_records=1)
    assert cycle.end() is True
    cycle.consumed(1, seconds=4.0)  # a slow learner: 4 s a record
    assert cycle.batch_limit() == 1, "half the 10 s left is 1.25 records (every_records: 2)"
    cycle.consumed(1, seconds=0.5)  # faster again: the estimate halves, to 2 s a record
    assert cycle.per_record == 2.0 and cycle.batch_limit() == 1, "every_records: 1 left"


def test_a_crash_while_publishing_is_recovered_with_the_same_bytes(state, tmp_path):
    sink = Sink(state, crash_at=2)
    cycle = started(cycle_over(tmp_path, sink))
    cycle.source.poll(max_records=2)
    cycle.outbox.add(RELEASES, "m", b"release 1")
    cycle.outbox.add(RELEASES, "m", b"release 2")
    cycle.consumed(2)
    with pytest.raises(RuntimeError, match="simulated crash"):
        cycle.end()
    assert state.read_published() == Published(cycle.run_id, 0), "cycle 1 is not recorded"
    # The next process: the checkpoint holds cycle 1's outbox; the record shows cycle 0.
    again = Sink(state)
    after = cycle_over(tmp_path, again)
    checkpoint = load_checkpoint(state.checkpoint)
    after.resume(checkpoint.meta)
    after.source.seek(checkpoint.positions)
    after.recover(after.source.positions(), after.outputs.record())
    assert sink.got == [("m", b"release 1")]
    assert again.got == [("m", b"release 1"), ("m", b"release 2")], "the very same bytes"
    assert state.read_published() == Published(cycle.run_id, 1)


def test_a_checkpoint_that_cannot_be_written_publishes_nothing(state, tmp_path, monkeypatch):
    sink = Sink(state)
    cycle = started(cycle_over(tmp_path, sink))
    cycle.source.poll(max_records=1)
    cycle.outbox.add(RELEASES, "m", b"release 1")
    cycle.consumed(1)

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("stream_dp.engine.commit.save_checkpoint", full)
    with pytest.raises(StateError, match="cannot write checkpoint .*No space left"):
        cycle.end()
    assert sink.got == [] and state.read_published() == Published(cycle.run_id, 0)


def test_an_idle_cycle_does_not_shrink_the_next_batch(state, tmp_path):
    # A scale-out instance polls for all its partition learners at once, at the smallest of
    # their limits: a learner idle since long ago must offer a whole cycle, not one record.
    clock = Clock()
    cycle = started(cycle_over(tmp_path, Sink(state), clock=clock))
    cycle.source.poll(max_records=1)
    cycle.consumed(1, seconds=1.0)  # 1 s a record: half of every_seconds is 5 records
    assert cycle.end() is True
    clock.now += 1000.0  # idle ever since: nothing consumed, nothing produced
    assert cycle.batch_limit() == 3, "every_records (3), not one record"
    cycle.source.poll(max_records=1)
    cycle.consumed(1, seconds=1.0)
    clock.now += 8.0  # a cycle with a record in it, 2 s left: one record (1 s of learning)
    assert cycle.batch_limit() == 1


def test_a_run_registered_at_the_same_moment_is_taken_over_only_if_it_released_nothing(
    state, tmp_path
):
    """Two new instances of one model: the one that became the writer second finds the other's
    registration (cycle 0) after fencing it. It continues only when the release topic holds
    nothing of that run, aborted messages included: a consumer reading uncommitted (Kafka's
    default) would otherwise hold two releases of the same steps under independent noise."""
    from stream_dp.engine.commit import RunRefused
    from stream_dp.engine.outputs import PublicationRecord

    cycle = cycle_over(tmp_path, Sink(state))
    cycle.new_run()
    other = PublicationRecord(Published("0" * 32, 0))
    # Releases to a file: the other run's may exist where this one cannot look.
    with pytest.raises(RunRefused, match="cannot read.*Restart that instance"):
        cycle.verify(other, before_start=False)
    asked: list[str] = []

    def released_by(run_id: str) -> bool:
        asked.append(run_id)
        return run_id in released

    released: set[str] = set()
    cycle.released_by = released_by
    cycle.verify(other, before_start=False)  # fenced before it published: continue
    released.add("0" * 32)
    with pytest.raises(RunRefused, match="begun publishing.*Restart that instance"):
        cycle.verify(other, before_start=False)
    assert asked == ["0" * 32, "0" * 32]
    # Seen before becoming the writer, the registration refuses the start outright (nothing
    # fenced, nothing read).
    with pytest.raises(RunRefused, match="has published"):
        cycle.verify(other, before_start=True)
    assert len(asked) == 2


def test_releases_to_a_file_beside_dead_letters_on_another_cluster_are_refused(state, tmp_path):
    """A Kafka source, releases to a file and dead letters to a Kafka cluster other than the
    source's: the model's transactions would be on the dead letters' cluster and the record
    (the group's offsets) outside them, so a second instance started at the same moment is
    neither fenced before it writes releases nor seen by the first (tested against Kafka:
    both released every step under independent noise). Refused before anything is opened; on
    the source's cluster the offsets go in the transactions and the broker fences."""
    from stream_dp.engine.config import ConfigError, EngineConfig

    def config(dead_servers: str) -> EngineConfig:
        src, dead = {"bootstrap_servers": "src:9092"}, {"bootstrap_servers": dead_servers}
        return EngineConfig.model_validate(
            {
                "model": {"algorithm": "OnPairStrC", "features": ["a"], "model_id": "m"},
                "source": {"kind": "kafka", "topic": "in", "group_id": "g", **src},
                "releases": {"kind": "jsonl", "path": str(tmp_path / "rel.jsonl")},
                "dead_letters": {"kind": "kafka", "topic": "dead", **dead},
                "checkpoint": {"path": str(state.checkpoint)},
            }
        )

    with pytest.raises(ConfigError, match="dead_letters.*source's cluster"):
        Outputs.open(config("other:9092"), _kafka_source(), state, {})
    assert not (tmp_path / "rel.jsonl").exists()
    for given in ({}, {RELEASES: Sink(state)}):
        outputs = Outputs.open(config("src:9092"), _kafka_source(), state, given)
        try:
            assert outputs.offsets_in_transaction and not outputs.to_topic(RELEASES)
        finally:
            outputs.close()
    with pytest.raises(ConfigError, match="dead_letters"):  # a release sink passed by the caller
        Outputs.open(config("other:9092"), _kafka_source(), state, {RELEASES: Sink(state)})


def _kafka_source():
    from connectors.sources import KafkaSource

    return KafkaSource("in", "src:9092", "g")


def test_a_writer_id_without_permission_is_one_clear_line() -> None:
    """Without Write on the model's transactional id (needed whatever the sinks), the start
    ends with exit code 4 naming the id, not an "unexpected error"."""
    from types import SimpleNamespace

    from stream_dp.engine.errors import KafkaUnavailable
    from stream_dp.engine.startup import Startup

    class TransactionalIdAuthorizationFailedError(Exception):
        pass

    class Outputs:
        def start(self, **hooks) -> None:
            raise TransactionalIdAuthorizationFailedError("denied")

    config = SimpleNamespace(
        model=SimpleNamespace(model_id="bank"), transactional_id="stream-dp.bank"
    )
    startup = SimpleNamespace(outputs=Outputs(), hooks={}, config=config)
    with pytest.raises(KafkaUnavailable, match="Write and Describe.*'stream-dp.bank'") as err:
        Startup.become_writer(startup)
    assert err.value.exit_code == 4

    class Broken(Outputs):
        def start(self, **hooks) -> None:
            raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):  # anything else is not hidden
        Startup.become_writer(SimpleNamespace(outputs=Broken(), hooks={}, config=config))

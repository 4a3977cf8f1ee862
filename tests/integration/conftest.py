"""Fixtures for the Kafka integration tests: one real broker per test session."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator

import pytest

from .kafka_broker import BrokerError, KafkaBroker

__all__ = ["kafka_broker", "unique_name"]


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """A running single-node Kafka broker, stopped at the end of the session.

    Tests that stop it (outage tests) must start it again before returning. If the broker
    cannot start, the test fails when ``CI`` is set (CI must exercise Kafka) and is skipped
    otherwise (a developer machine may lack Java or Maven).
    """
    broker = KafkaBroker(tmp_path_factory.mktemp("kafka"))
    try:
        broker.start()
    except BrokerError as err:
        message = f"could not start the Kafka test broker: {err}"
        _stop_quietly(broker)
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    try:
        yield broker
    finally:
        broker.stop()


def _stop_quietly(broker: KafkaBroker) -> None:
    """Stop a half-started broker without masking the original start error."""
    try:
        broker.stop()
    except BrokerError:
        pass


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """Make topic/group names unique per test, so tests sharing the broker never interfere."""
    base = request.node.name.replace("[", "-").replace("]", "").replace("_", "-")[:40]

    def make(kind: str) -> str:
        return f"{kind}-{base}-{uuid.uuid4().hex[:8]}"

    return make

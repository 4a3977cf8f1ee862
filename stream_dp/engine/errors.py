"""The engine's exceptions; ``exit_code`` is what ``stream-dp run`` returns for each."""

from __future__ import annotations

__all__ = ["EngineError", "Fenced", "Interrupted", "KafkaUnavailable", "StateError"]


class EngineError(RuntimeError):
    """The engine cannot run or continue; ``exit_code`` is what ``stream-dp run`` returns."""

    exit_code = 1


class StateError(EngineError):
    """The state directory forbids running: it would reset, fork or roll back a ledger."""

    exit_code = 3


class KafkaUnavailable(EngineError):
    """Kafka is unreachable or misconfigured (at start), or stayed away past the deadline."""

    exit_code = 4


class Fenced(EngineError):
    """Another instance of this model took over its Kafka transactional id."""

    exit_code = 5


class Interrupted(Exception):
    """A stop request arrived while the engine waited for Kafka."""

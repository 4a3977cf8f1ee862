"""The streaming engine: sources and sinks around one private learner, with commit cycles.

See :mod:`stream_dp.engine.runner` for the loop and its start-up, :mod:`stream_dp.engine.commit`
for the commit cycle that keeps one release content per step, :mod:`stream_dp.engine.state` for
the state directory and its lock.
"""

from __future__ import annotations

from stream_dp.engine.config import ConfigError, EngineConfig, load_config
from stream_dp.engine.runner import (
    Engine,
    EngineError,
    EngineStats,
    Fenced,
    KafkaUnavailable,
    StateError,
)

__all__ = [
    "ConfigError",
    "Engine",
    "EngineConfig",
    "EngineError",
    "EngineStats",
    "Fenced",
    "KafkaUnavailable",
    "StateError",
    "load_config",
]

"""The streaming engine: sources and sinks around one private learner, with commit cycles.

See :mod:`stream_dp.engine.runner` for the loop, :mod:`stream_dp.engine.startup` for how a run
starts, :mod:`stream_dp.engine.commit`
for the commit cycle that keeps one release content per step, :mod:`stream_dp.engine.state` for
the state directory and its lock, :mod:`stream_dp.engine.scaleout` for one learner per input
partition on a consumer group.
"""

from __future__ import annotations

from stream_dp.engine.config import ConfigError, EngineConfig, load_config
from stream_dp.engine.errors import EngineError, Fenced, KafkaUnavailable, StateError
from stream_dp.engine.runner import Engine
from stream_dp.engine.scaleout import ScaleOut
from stream_dp.engine.status import EngineStats

__all__ = [
    "ConfigError",
    "Engine",
    "EngineConfig",
    "EngineError",
    "EngineStats",
    "Fenced",
    "KafkaUnavailable",
    "ScaleOut",
    "StateError",
    "load_config",
]

"""The streaming engine: sources and sinks around one private learner, with checkpoints."""

from __future__ import annotations

from stream_dp.engine.config import ConfigError, EngineConfig, load_config
from stream_dp.engine.runner import Engine, EngineError, EngineStats

__all__ = ["ConfigError", "Engine", "EngineConfig", "EngineError", "EngineStats", "load_config"]

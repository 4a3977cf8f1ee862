"""The streaming engine: sources and sinks around one private learner, with commit cycles.

See :mod:`stream_dp.engine.runner` for the engine and the parts it owns,
:mod:`stream_dp.engine.startup` for how a run starts, :mod:`stream_dp.engine.commit` for the
commit cycle that keeps one release content per step, :mod:`stream_dp.engine.state` for the
state directory and its lock, :mod:`stream_dp.engine.scaleout` for one learner per input
partition on a consumer group.

The names below are imported on first use, so that ``stream-dp --help`` and the command-line
modules load neither pydantic nor the learners.
"""

from __future__ import annotations

import importlib
from typing import Any

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

_HOMES = {
    "ConfigError": "config",
    "EngineConfig": "config",
    "load_config": "config",
    "EngineError": "errors",
    "Fenced": "errors",
    "KafkaUnavailable": "errors",
    "StateError": "errors",
    "Engine": "runner",
    "ScaleOut": "scaleout",
    "EngineStats": "status",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])

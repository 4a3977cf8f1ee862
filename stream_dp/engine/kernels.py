"""Load a model's compiled kernels before an instance joins its consumer group.

numba compiles a learner's step at its first compiled step, or loads it from its on-disk cache
(``docs/performance.md``, *First start*). In a scale-out instance that first step comes inside
the group's poll loop, and the first start after an install or upgrade compiles for about a
minute of CPU: several minutes on a busy host, enough to hold a poll past the group's
``max.poll.interval.ms`` and have the instance removed from its group (librdkafka then fails
the next poll). :func:`load_kernels` takes that step first, on a throwaway copy of the model
and made-up records, before the instance subscribes; its learners then find the kernels loaded.

Nothing of the throwaway learner is kept or published: it has a secret of its own, its releases
go nowhere, and it writes no checkpoint or ledger journal.
"""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np

from connectors.sources import SourceMessage
from stream_dp.engine.learning import Learning

__all__ = ["load_kernels"]

#: Records past the model's warm-up, so that compiled steps (one at a time, as the engine
#: learns) and their release messages run.
COMPILED_STEPS = 3


def load_kernels(config: Any) -> float:
    """Step a throwaway copy of ``config.model`` through the engine's per-record path (parse,
    ``learn_one``, the release message) past its warm-up, then through a batch
    (:meth:`Learning.handle_batch`); the seconds it took.

    Examples
    --------
    >>> from stream_dp.engine.config import EngineConfig
    >>> cfg = EngineConfig.model_validate({
    ...     "model": {"alpha": 1.0, "buffer": 4, "release_every": 1, "features": ["a", "b"]},
    ...     "source": {"kind": "jsonl", "path": "-"}, "releases": {"kind": "stdout"},
    ...     "dead_letters": {"kind": "stdout"}, "checkpoint": {"path": "m.ckpt"}})
    >>> load_kernels(cfg) >= 0.0
    True
    """
    start = time.monotonic()
    learning = Learning(config)
    learning.run_id = "load-kernels"
    learner = learning.learner
    features = learning.features
    # Records well inside the radius, so none is clipped (the learner would warn about it).
    radius = float(learner.data_radius_)
    rng = np.random.default_rng(0)
    steps = int(getattr(learner, "T1", 0) or 0) + COMPILED_STEPS
    auc = learner.task == "auc"
    messages = []
    for i in range(steps + COMPILED_STEPS):
        x = 0.5 * radius * rng.normal(size=len(features)) / np.sqrt(len(features))
        record: dict[str, Any] = {"x": dict(zip(features, x.tolist(), strict=True))}
        record["y"] = i % 2 if auc else i % 3
        unit = f"unit-{i}"
        if learning.unit_key is not None and not learning.unit_from_message_key:
            record[learning.unit_key] = unit
        messages.append(SourceMessage(json.dumps(record).encode(), {}, unit.encode()))
    for msg in messages[:steps]:
        learning.handle(msg.value, key=msg.key)
    learning.handle_batch(messages[steps:])  # and a batch, as the engine learns a poll
    return time.monotonic() - start

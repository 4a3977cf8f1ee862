"""stream-dp merge: one model for consumers from the releases of K partition learners.

A per-partition model (:mod:`stream_dp.engine.scaleout`) publishes K release streams,
``<model>/p0`` ... ``<model>/p<K-1>``. ``merge`` reads the release topic ``read_committed``
(only releases whose checkpoint is durable), keeps the latest release of every partition
learner, and publishes their average as ``<model>/merged`` with the partitions, runs and steps
it used. Averaging published releases is post-processing: it costs no privacy budget.

The cost is accuracy: each partition learner adds its own noise calibrated to its own
sensitivity, so the average of K models carries about ``1/√K`` of one learner's noise while a
single central learner over all the data would, at the same step count, carry about ``1/K`` of
it -- the merged model has about √K times the noise of a central learner. The design that
removes this cost is a central aggregator: workers send clipped gradient sums (never noised
models) to one coordinator, which adds the noise once (``docs/privacy.md``, "Scale-out").

A merged model is published only when every partition learner (``--partitions``, else p0 to
the highest seen) has a release, and only once the history the topic held at the start has
been read: a replay never publishes averages of partitions taken at different moments. Each
merged model names every partition's step; at the end ``merge`` says which releases it saw.
``--wait`` waits that long for the model (the first complete set of releases) before the idle
timeout applies, so ``merge`` can start beside the instances.

Exit codes: 0 done (the release topic was idle for --idle-seconds, after at least one merged
model); 3 nothing merged (no release of the model, or not every partition learner has one;
one line naming what was seen); 4 Kafka unreachable or misconfigured, or the release topic
does not exist (within 20 s).
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from stream_dp.apps.kafka_tools import (
    BadArgument,
    add_bootstrap_argument,
    probe,
    release_consumer,
    run_app,
)
from stream_dp.engine.cli import add_common_arguments

__all__ = ["MERGED_SCHEMA", "MergedModel", "add_arguments", "main", "merged_message"]

MERGED_SCHEMA = "stream-dp/merged/1"


class MergedModel:
    """A merged model read back from its message (what ``stream-dp watch`` shows).

    Examples
    --------
    >>> from connectors import ReleaseMessage
    >>> r = ReleaseMessage(model_id="m/p0", algorithm="a", task="auc", step=3, release_index=3,
    ...     weights=[1.0], feature_names=["a"], rho_spent=0.1, rho_budget=1.0,
    ...     epsilon_spent=1.0, delta=1e-5, exhausted=False, time=0.0)
    >>> m = MergedModel.from_json(merged_message("m", {"m/p0": r}))
    >>> m.step, m.weights_array(), m.epsilon_spent
    (3, array([1.]), 1.0)
    """

    def __init__(self, data: dict) -> None:
        if data.get("schema") != MERGED_SCHEMA:
            raise ValueError("not a merged model message")
        self.data = data
        self.model_id, self.task = data["model_id"], data["task"]
        self.feature_names = list(data["feature_names"])
        self.step = int(data["steps"])
        self.release_index = len(data["partitions"])
        #: The largest partition learner's ε: a person's ε when records are keyed by the person.
        self.epsilon_spent = max(data["epsilon_spent_by_partition"])
        self.exhausted = False

    @classmethod
    def from_json(cls, value: bytes) -> MergedModel:
        try:
            data = json.loads(value)
        except ValueError:
            raise ValueError("not JSON") from None
        if not isinstance(data, dict):
            raise ValueError("not a merged model message")
        return cls(data)

    def weights_array(self) -> np.ndarray:
        raw = np.frombuffer(base64.b64decode(self.data["weights"]), dtype="<f8")
        return raw.reshape(self.data["shape"]).copy()


def merged_message(model: str, latest: Mapping[str, Any]) -> bytes:
    """The merged model of the latest releases ``{partition model id: ReleaseMessage}``.

    Examples
    --------
    >>> from connectors import ReleaseMessage
    >>> def rel(p, w, step):
    ...     return ReleaseMessage(model_id=f"m/p{p}", algorithm="OnPairStrC", task="auc",
    ...         step=step, release_index=step, weights=w, feature_names=["a", "b"],
    ...         rho_spent=0.1, rho_budget=1.0, epsilon_spent=1.0, delta=1e-5,
    ...         exhausted=False, time=0.0)
    >>> out = json.loads(merged_message("m", {"m/p0": rel(0, [1.0, 0.0], 5),
    ...                                       "m/p1": rel(1, [0.0, 1.0], 7)}))
    >>> out["model_id"], out["steps"], out["partitions"]
    ('m/merged', 12, {'0': {'run_id': None, 'step': 5, 'release_index': 5}, '1': {'run_id': None, 'step': 7, 'release_index': 7}})
    >>> np.frombuffer(base64.b64decode(out["weights"]), "<f8")
    array([0.5, 0.5])
    """  # noqa: E501 - a doctest's output line
    rels = sorted(latest.values(), key=lambda r: int(r.model_id.rsplit("/p", 1)[1]))
    if not rels:
        raise ValueError("no releases to merge")
    first = rels[0]
    for r in rels[1:]:
        if (r.task, r.shape, r.feature_names) != (first.task, first.shape, first.feature_names):
            raise ValueError(
                f"{r.model_id} has another task, shape or schema than {first.model_id}"
            )
    mean = np.mean([r.weights_array() for r in rels], axis=0)
    return json.dumps(
        {
            "schema": MERGED_SCHEMA,
            "model_id": f"{model}/merged",
            "algorithm": first.algorithm,
            "task": first.task,
            "weights": base64.b64encode(mean.astype("<f8").tobytes()).decode(),
            "dtype": "<f8",
            "shape": list(first.shape),
            "feature_names": list(first.feature_names),
            "steps": sum(r.step for r in rels),
            "partitions": {
                r.model_id.rsplit("/p", 1)[1]: {
                    "run_id": r.run_id,
                    "step": r.step,
                    "release_index": r.release_index,
                }
                for r in rels
            },
            "rho_spent_by_partition": [r.rho_spent for r in rels],
            "epsilon_spent_by_partition": [r.epsilon_spent for r in rels],
            "private": all(r.private for r in rels),
            "time": time.time(),
        },
        separators=(",", ":"),
    ).encode()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_bootstrap_argument(parser)
    parser.add_argument(
        "--topic", default="releases", help="release topic to read (default: %(default)s)"
    )
    parser.add_argument("--model", required=True, help="the per-partition model's model_id")
    parser.add_argument(
        "--to", default=None, help="topic of the merged model (default: <topic>.merged)"
    )
    parser.add_argument(
        "--every-seconds",
        type=float,
        default=1.0,
        help="publish at most this often (default: %(default)s)",
    )
    parser.add_argument(
        "--partitions",
        type=int,
        default=None,
        help="number of partition learners (the input topic's partitions; default: p0 to the "
        "highest seen)",
    )
    parser.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait up to this long for a release of every partition learner (default: %(default)s)",
    )
    parser.add_argument(
        "--idle-seconds",
        type=float,
        default=10.0,
        help="stop after this long without releases (default: %(default)s)",
    )
    add_common_arguments(parser)
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Entry point of ``stream-dp merge`` (``args`` from :func:`add_arguments`)."""
    return run_app("merge", args, lambda: _merge(args))


def _seen(latest: Mapping[str, Any], prefix: str) -> str:
    """The releases seen, one per partition learner: ``p0 step 12, p1 step 9``."""
    parts = sorted(latest, key=lambda key: int(key[len(prefix) :]))
    return ", ".join(f"p{key[len(prefix) :]} step {latest[key].step}" for key in parts) or "none"


def _missing(latest: Mapping[str, Any], prefix: str, partitions: int | None) -> list[int]:
    """The partition learners without a release yet (``partitions`` None: p0 to the highest)."""
    have = {int(key[len(prefix) :]) for key in latest}
    if partitions is None:
        partitions = max(have) + 1 if have else 1
    return [k for k in range(partitions) if k not in have]


def _merge(args: argparse.Namespace) -> int:
    from connectors import KafkaSink, ReleaseMessage

    if args.partitions is not None and args.partitions < 1:
        raise BadArgument("--partitions must be at least 1")
    probe(args.bootstrap, [args.topic], args.client)
    out_topic = args.to or f"{args.topic}.merged"
    prefix = f"{args.model}/p"
    consumer = release_consumer(args.bootstrap, args.topic, args.idle_seconds, args.client)
    latest: dict[str, Any] = {}
    published = 0
    last, dirty = -float("inf"), False
    waiting_until = time.monotonic() + args.wait
    history = _history_end(consumer, args.topic)
    try:
        with KafkaSink(out_topic, args.bootstrap, client=args.client) as sink:

            def publish() -> None:
                nonlocal published, last, dirty
                value = merged_message(args.model, latest)
                sink.send(f"{args.model}/merged", value)
                sink.flush()
                published, last, dirty = published + 1, time.monotonic(), False
                print(f"merged {len(latest)} partition(s): {_seen(latest, prefix)}")
                sys.stdout.flush()

            def ready() -> bool:
                return not _missing(latest, prefix, args.partitions) and _read_up_to(
                    consumer, history
                )

            while True:
                for msg in consumer:
                    key = (msg.key or b"").decode("utf-8", "replace")
                    if not key.startswith(prefix) or not key[len(prefix) :].isdigit():
                        continue
                    try:
                        rel = ReleaseMessage.from_json(msg.value)
                    except ValueError:
                        continue
                    latest[key] = rel
                    dirty = True
                    if time.monotonic() - last >= args.every_seconds and ready():
                        publish()
                if dirty and ready():
                    publish()
                if published or time.monotonic() >= waiting_until:
                    break
    finally:
        consumer.close()
    if not published:
        missing = _missing(latest, prefix, args.partitions)
        why = (
            f"no release of model {args.model!r} on {args.topic!r}"
            if not latest
            else f"no release yet of p{', p'.join(map(str, missing))}"
        )
        print(f"stream-dp merge: nothing merged: {why} (seen: {_seen(latest, prefix)}); "
              "start merge with --wait to wait for the model", file=sys.stderr)  # fmt: skip
        return 3
    print(f"{published} merged model(s) published to {out_topic}; last releases seen: "
          f"{_seen(latest, prefix)}")  # fmt: skip
    return 0


def _history_end(consumer: Any, topic: str) -> dict:
    """The release topic's end offsets at the start: the history a replay reads first."""
    from kafka import TopicPartition

    tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
    return consumer.end_offsets(tps) if tps else {}


def _read_up_to(consumer: Any, ends: Mapping[Any, int]) -> bool:
    """Whether the consumer has read the topic up to ``ends`` (the history at the start)."""
    assigned = consumer.assignment()
    return all(
        end == 0 or (tp in assigned and consumer.position(tp) >= end) for tp, end in ends.items()
    )

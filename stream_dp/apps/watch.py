"""stream-dp watch: read a release topic as a partner would; rebuild and score each release.

Every model is rebuilt from its release message alone (its weights, its feature names) and,
with --dataset, scored on that dataset's held-out split: records that were never streamed. The
topic is read ``read_committed``, as every consumer of releases must: only releases whose
checkpoint is durable, each step once (``docs/privacy.md``, "The engine: one release per step").
It also shows the merged models of ``stream-dp merge``. Averaging the last K releases
(--smooth) is post-processing: it costs no privacy.

Exit codes: 0 done (the topic was idle for --idle-seconds); 2 a bad argument; 4 Kafka
unreachable or misconfigured, or the topic does not exist (within 20 s).
"""

from __future__ import annotations

import argparse
import collections
import sys

from stream_dp.apps.kafka_tools import (
    BadArgument,
    add_bootstrap_argument,
    probe,
    release_consumer,
    run_app,
)
from stream_dp.engine.cli import add_common_arguments

__all__ = ["add_arguments", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_bootstrap_argument(parser)
    parser.add_argument("--topic", default="releases", help="release topic (default: %(default)s)")
    parser.add_argument(
        "--dataset",
        default=None,
        help="score each release on this bundled dataset's held-out split, e.g. bank (default: "
        "no scoring)",
    )
    parser.add_argument(
        "--every", type=int, default=1, help="print every N-th release (default: %(default)s)"
    )
    parser.add_argument(
        "--smooth",
        type=int,
        default=1,
        help="also score the mean of the last K releases (post-processing: costs no privacy; "
        "default: %(default)s, off)",
    )
    parser.add_argument(
        "--idle-seconds",
        type=float,
        default=10.0,
        help="stop after this long without messages (default: %(default)s)",
    )
    add_common_arguments(parser)
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Entry point of ``stream-dp watch`` (``args`` from :func:`add_arguments`)."""
    return run_app("watch", args, lambda: _watch(args))


def _watch(args: argparse.Namespace) -> int:
    import numpy as np

    from connectors import ReleaseMessage
    from stream_dp.apps.merge import MergedModel
    from stream_dp.metrics import roc_auc
    from stream_dp.records import clip_rows

    test = None
    if args.dataset:
        from stream_dp.datasets import prepare

        try:
            test = prepare(args.dataset)
        except ValueError as err:
            raise BadArgument(f"--dataset: {err}") from None
    probe(args.bootstrap, [args.topic], args.client)
    consumer = release_consumer(args.bootstrap, args.topic, args.idle_seconds, args.client)
    head = f"{'step':>8} {'release':>8} {'ε spent':>9} {'‖w‖':>7}"
    if test is not None:
        head += " test AUC" + (f" AUC(mean of {args.smooth})" if args.smooth > 1 else "")
    print(head)
    recent: collections.deque = collections.deque(maxlen=max(args.smooth, 1))
    # The held-out records in a release's feature order, clipped to R = 1 as the example
    # config's learner does; built once per feature order, not once per message.
    test_rows: dict[tuple[str, ...], np.ndarray] = {}
    n = skipped = 0
    try:
        for msg in consumer:
            try:
                rel = ReleaseMessage.from_json(msg.value)
            except ValueError:
                try:
                    rel = MergedModel.from_json(msg.value)  # stream-dp merge's output
                except (ValueError, KeyError, TypeError):
                    skipped += 1  # not a release message: another producer shares the topic
                    continue
            n += 1
            w = rel.weights_array()
            recent.append(w)
            if n % max(args.every, 1):
                continue
            line = f"{rel.step:>8} {rel.release_index:>8} {rel.epsilon_spent:>9.4f} "
            line += f"{float(np.linalg.norm(w)):>7.3f}"
            if test is not None and rel.task == "auc":
                key = tuple(rel.feature_names)
                if key not in test_rows and set(key) <= set(test.feature_names):
                    order = [list(test.feature_names).index(f) for f in key]
                    test_rows[key] = clip_rows(test.X_test[:, order], 1.0)
                X = test_rows.get(key)
                if X is not None:
                    line += f" {roc_auc(X @ w, test.y_test):8.3f}"
                    if args.smooth > 1:
                        line += f" {roc_auc(X @ np.mean(recent, axis=0), test.y_test):8.3f}"
            print(line + (" (exhausted)" if rel.exhausted else ""))
            sys.stdout.flush()
    finally:
        consumer.close()
    extra = f" ({skipped} other messages skipped)" if skipped else ""
    print(f"{n} release messages read from {args.topic}{extra}")
    return 0

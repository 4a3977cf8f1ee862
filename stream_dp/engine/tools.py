"""Kafka helpers for trying the engine: feed a shipped dataset in, watch the releases come out.

``stream-dp produce`` writes the records of a bundled UCI dataset (scaled as in the demo) to a
topic as the engine's JSON input format; ``stream-dp watch`` reads a release topic and, like any
partner would, rebuilds each model from its message alone and scores it on the dataset's
held-out split (records that were never streamed). ``watch`` reads ``read_committed``, as every
consumer of releases must (``docs/privacy.md``, "The engine: one release per step").

Both fail fast: an unreachable or misconfigured broker is one line on stderr and exit code 4
within 20 s, a bad argument exit code 2.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys

from stream_dp.engine.cli import add_common_arguments, configure_logging, one_line_errors

__all__ = ["add_produce_arguments", "add_watch_arguments", "produce_main", "watch_main"]


def add_produce_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers host:port")
    parser.add_argument("--topic", default="records", help="input topic (default: records)")
    parser.add_argument("--dataset", default="bank", help="bundled dataset (bank, pima, ...)")
    parser.add_argument("--max-records", type=int, default=None)
    parser.add_argument(
        "--bad-every",
        type=int,
        default=0,
        help="also send one malformed message every N records (to see the dead-letter topic)",
    )
    add_common_arguments(parser)
    parser.set_defaults(func=produce_main)


class _BadArgument(ValueError):
    """A command-line argument the tool cannot use (exit code 2)."""


_CODES: dict[type[BaseException], int] = {_BadArgument: 2}


def _kafka_codes() -> dict[type[BaseException], int]:
    from connectors.admin import KafkaProblem

    return {**_CODES, KafkaProblem: 4}


def _probe(bootstrap: str) -> None:
    from connectors.admin import connect

    connect(bootstrap, timeout_s=20.0, what="--bootstrap").close()


def produce_main(args: argparse.Namespace) -> int:
    configure_logging("WARNING", args.verbose)
    return one_line_errors("produce", args.debug, _kafka_codes(), lambda: _produce(args))


def _produce(args: argparse.Namespace) -> int:
    from connectors import KafkaSink
    from stream_dp.datasets import prepare

    try:
        data = prepare(args.dataset, max_records=args.max_records)
    except ValueError as err:
        raise _BadArgument(f"--dataset: {err}") from None
    _probe(args.bootstrap)
    names = data.feature_names
    sent = bad = 0
    with KafkaSink(args.topic, args.bootstrap) as sink:
        for i, (x, y) in enumerate(zip(data.X_stream, data.y_stream, strict=True)):
            rec = {"x": dict(zip(names, (float(v) for v in x), strict=True)), "y": bool(y)}
            sink.send(None, json.dumps(rec).encode())
            sent += 1
            if args.bad_every and (i + 1) % args.bad_every == 0:
                sink.send(None, b'{"x": {"oops": "not a number"}, "y": 1}')
                bad += 1
        sink.flush()
    print(f"sent {sent} records ({bad} malformed) of {args.dataset} to {args.topic}")
    return 0


def add_watch_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers host:port")
    parser.add_argument("--topic", default="releases", help="release topic (default: releases)")
    parser.add_argument(
        "--dataset", default=None, help="score each release on this dataset's held-out split"
    )
    parser.add_argument("--every", type=int, default=1, help="print every N-th release")
    parser.add_argument(
        "--smooth",
        type=int,
        default=1,
        help="also score the mean of the last K releases (post-processing: costs no privacy)",
    )
    parser.add_argument(
        "--idle-seconds", type=float, default=10.0, help="stop after this long without messages"
    )
    add_common_arguments(parser)
    parser.set_defaults(func=watch_main)


def watch_main(args: argparse.Namespace) -> int:
    configure_logging("WARNING", args.verbose)
    return one_line_errors("watch", args.debug, _kafka_codes(), lambda: _watch(args))


def _watch(args: argparse.Namespace) -> int:
    import numpy as np
    from kafka import KafkaConsumer

    from connectors import ReleaseMessage
    from stream_dp.metrics import roc_auc
    from stream_dp.records import clip_rows

    test = None
    if args.dataset:
        from stream_dp.datasets import prepare

        try:
            test = prepare(args.dataset)
        except ValueError as err:
            raise _BadArgument(f"--dataset: {err}") from None
    _probe(args.bootstrap)
    consumer = KafkaConsumer(
        args.topic,
        bootstrap_servers=args.bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        # Only releases whose checkpoint is durable: aborted transactions are never shown.
        isolation_level="read_committed",
        consumer_timeout_ms=int(args.idle_seconds * 1000),
        max_partition_fetch_bytes=8 * 1024 * 1024,
    )
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

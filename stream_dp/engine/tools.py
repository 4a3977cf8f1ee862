"""Kafka helpers for trying the engine: feed a shipped dataset in, watch the releases come out.

``stream-dp produce`` writes the records of a bundled UCI dataset (scaled as in the demo) to a
topic as the engine's JSON input format; ``stream-dp watch`` reads a release topic and, like any
partner would, rebuilds each model from its message alone and scores it on the dataset's
held-out split (records that were never streamed).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys

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
    parser.set_defaults(func=produce_main)


def produce_main(args: argparse.Namespace) -> int:
    from connectors import KafkaSink
    from stream_dp.datasets import prepare

    data = prepare(args.dataset, max_records=args.max_records)
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
    parser.set_defaults(func=watch_main)


def watch_main(args: argparse.Namespace) -> int:
    import numpy as np
    from kafka import KafkaConsumer

    from connectors import ReleaseMessage
    from stream_dp.demo import roc_auc
    from stream_dp.records import clip_rows

    test = None
    if args.dataset:
        from stream_dp.datasets import prepare

        test = prepare(args.dataset)
    consumer = KafkaConsumer(
        args.topic,
        bootstrap_servers=args.bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=int(args.idle_seconds * 1000),
    )
    head = f"{'step':>8} {'release':>8} {'ε spent':>9} {'‖w‖':>7}"
    if test is not None:
        head += " test AUC" + (f" AUC(mean of {args.smooth})" if args.smooth > 1 else "")
    print(head)
    recent: collections.deque = collections.deque(maxlen=max(args.smooth, 1))
    # The held-out records in a release's feature order, clipped to R = 1 as the example
    # config's learner does; built once per feature order, not once per message.
    test_rows: dict[tuple[str, ...], np.ndarray] = {}
    n = 0
    try:
        for msg in consumer:
            rel = ReleaseMessage.from_json(msg.value)
            n += 1
            w = rel.weights_array()
            recent.append(w)
            if n % max(args.every, 1):
                continue
            line = f"{rel.step:>8} {rel.release_index:>8} {rel.epsilon_spent:>9.4f} "
            line += f"{float(np.linalg.norm(w)):>7.3f}"
            if test is not None and rel.task == "auc":
                key = tuple(rel.feature_names)
                if key not in test_rows:
                    order = [list(test.feature_names).index(f) for f in key]
                    test_rows[key] = clip_rows(test.X_test[:, order], 1.0)
                X = test_rows[key]
                line += f" {roc_auc(X @ w, test.y_test):8.3f}"
                if args.smooth > 1:
                    line += f" {roc_auc(X @ np.mean(recent, axis=0), test.y_test):8.3f}"
            print(line + (" (exhausted)" if rel.exhausted else ""))
            sys.stdout.flush()
    finally:
        consumer.close()
    print(f"{n} release messages read from {args.topic}")
    return 0

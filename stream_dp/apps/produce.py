"""stream-dp produce: send a bundled dataset to a Kafka topic, in the engine's input format.

Writes the records of a UCI dataset shipped with the package (scaled as in the demo) to a topic
as JSON objects ``{"x": {feature: value, ...}, "y": label}`` — the input of ``stream-dp run``.
With --partitions it creates the topic with that many partitions and keys each record by its
record id, so records spread over them (per-partition scale-out); with --bad-every it also sends
malformed messages, to see the dead-letter topic fill.

Exit codes: 0 done; 2 a bad argument; 4 Kafka unreachable or misconfigured (within 20 s).
"""

from __future__ import annotations

import argparse
import json

from stream_dp.apps.kafka_tools import BadArgument, add_bootstrap_argument, probe, run_app
from stream_dp.engine.cli import add_common_arguments

__all__ = ["add_arguments", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_bootstrap_argument(parser)
    parser.add_argument("--topic", default="records", help="input topic (default: %(default)s)")
    parser.add_argument(
        "--dataset",
        default="bank",
        help="bundled dataset: bank or pima (default: %(default)s)",
    )
    parser.add_argument(
        "--max-records",
        type=int,
        default=None,
        help="send at most this many records (default: the whole stream split)",
    )
    parser.add_argument(
        "--partitions",
        type=int,
        default=None,
        help="create the topic with this many partitions (if missing) and key each record by "
        "its record id, so records spread over them (default: unkeyed records, topic as it is)",
    )
    parser.add_argument(
        "--bad-every",
        type=int,
        default=0,
        help="also send one malformed message every N records, to see the dead-letter topic "
        "(default: %(default)s, none)",
    )
    add_common_arguments(parser)
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Entry point of ``stream-dp produce`` (``args`` from :func:`add_arguments`)."""
    return run_app("produce", args, lambda: _produce(args))


def _produce(args: argparse.Namespace) -> int:
    from connectors import KafkaSink
    from stream_dp.datasets import prepare

    try:
        data = prepare(args.dataset, max_records=args.max_records)
    except ValueError as err:
        raise BadArgument(f"--dataset: {err}") from None
    if args.partitions is not None and args.partitions < 1:
        raise BadArgument("--partitions must be at least 1")
    probe(args.bootstrap, client=args.client)
    if args.partitions is not None:
        from connectors.admin import connect, ensure_topic

        admin = connect(args.bootstrap, timeout_s=20.0, what="--bootstrap", client=args.client)
        try:
            ensure_topic(admin, args.topic, partitions=args.partitions)
        finally:
            admin.close()
    names = data.feature_names
    sent = bad = 0
    with KafkaSink(args.topic, args.bootstrap, client=args.client) as sink:
        for i, (x, y) in enumerate(zip(data.X_stream, data.y_stream, strict=True)):
            rec = {"x": dict(zip(names, (float(v) for v in x), strict=True)), "y": bool(y)}
            key = None if args.partitions is None else f"record-{i}"
            sink.send(key, json.dumps(rec).encode())
            sent += 1
            if args.bad_every and (i + 1) % args.bad_every == 0:
                sink.send(None, b'{"x": {"oops": "not a number"}, "y": 1}')
                bad += 1
        sink.flush()
    print(f"sent {sent} records ({bad} malformed) of {args.dataset} to {args.topic}")
    return 0

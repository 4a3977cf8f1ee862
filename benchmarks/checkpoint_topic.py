"""How long a gaining instance takes to find a partition learner's checkpoint in the topic.

Starts a private broker (deploy/kafka/kafka.sh) in a temporary directory and fills a
checkpoint topic as per-partition instances do: K partition learners, each publishing one
checkpoint of ``--size`` bytes per commit cycle, interleaved, ``--cycles`` cycles each. Then
times, in the same run, :func:`connectors.admin.latest_with_key` for one learner's key:

* **reference**: the whole tail read at once (the first window set to the tail, 512 messages);
* **windows**: the backward search in growing windows (8, 64, 512 offsets from the end).

Prints the median seconds of each (``--repeats``) and the ratio reference / windows.

    python benchmarks/checkpoint_topic.py [--learners 4] [--cycles 100] [--size 1000000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from connectors import admin
from connectors.transactions import TransactionalPublisher

ROOT = Path(__file__).resolve().parents[1]
KAFKA = ROOT / "deploy" / "kafka" / "kafka.sh"
TAIL = 512  # what the engine searches (stream_dp.engine.startup)


def fill(bootstrap: str, topic: str, learners: int, cycles: int, size: int) -> None:
    """One transaction per learner and cycle, as the engine publishes its checkpoints."""
    publisher = TransactionalPublisher(bootstrap, f"bench-{uuid.uuid4().hex[:8]}")
    publisher.start()
    try:
        for _ in range(cycles):
            for k in range(learners):
                publisher.publish([(topic, f"m/p{k}".encode(), os.urandom(size))])
    finally:
        publisher.close()


def timed(bootstrap: str, topic: str, first_window: int) -> float:
    admin._FIRST_WINDOW = first_window
    start = time.perf_counter()
    value = admin.latest_with_key(bootstrap, topic, b"m/p0", tail=TAIL, timeout_s=120)
    took = time.perf_counter() - start
    assert value is not None
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--learners", type=int, default=4)
    ap.add_argument("--cycles", type=int, default=100)
    ap.add_argument("--size", type=int, default=1_000_000, help="bytes per checkpoint")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    rundir = Path(tempfile.mkdtemp(prefix="kafka-bench-"))
    bootstrap = subprocess.run(
        ["bash", str(KAFKA), "start", "--dir", str(rundir)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    try:
        topic = f"ckpt-{uuid.uuid4().hex[:8]}"
        conn = admin.connect(bootstrap, timeout_s=30, what="bench")
        try:
            configs = {"cleanup.policy": "compact", "max.message.bytes": str(8 << 20)}
            admin.ensure_topic(conn, topic, configs=configs)
        finally:
            conn.close()
        fill(bootstrap, topic, args.learners, args.cycles, args.size)
        default = admin._FIRST_WINDOW
        ref, new = [], []
        for _ in range(args.repeats):
            ref.append(timed(bootstrap, topic, TAIL))
            new.append(timed(bootstrap, topic, default))
        r, n = statistics.median(ref), statistics.median(new)
        print(f"{args.learners} learners x {args.cycles} checkpoints of {args.size:,} bytes; "
              f"tail {TAIL}: whole tail {r:.2f} s, growing windows {n:.2f} s, "
              f"ratio {r / n:.1f}")  # fmt: skip
    finally:
        subprocess.run(["bash", str(KAFKA), "stop", "--dir", str(rundir)], check=False)


if __name__ == "__main__":
    main()

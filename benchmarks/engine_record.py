"""Microseconds per record of the engine's own per-record work, without Kafka.

``stream_dp.engine.learning.Learning.handle`` is what the engine does with each message on
either Kafka client: parse and validate the record, one private OnPairStrC step (d = 8,
FIFO(64) by default), and with one release per record the release's fields (its ledger, the
exact ε of the spend) and its JSON message. The client's own cost per record comes on top, so
this figure, H, bounds what the end-to-end ratios of ``benchmarks/kafka_e2e.py`` can reach:
with K the rest of an engine record on a client (its time per record in ``kafka_e2e.py`` minus
H), engine confluent-kafka / engine kafka-python is ``(H + K_kp) / (H + K_cf)``
(docs/performance.md, *What the single-engine targets need*).

Reported: H (median of ``--repeats`` passes over ``--records`` records, after a warm-up that
fills the buffer and loads the compiled kernels), and, timed the same way on their own, the
record parse (``connectors.schema.parse_conformed``) and the step with its release message on
already-parsed records (``learn_one`` + ``release_message``, the learner's JSON encoding
included).

The engine hands each poll to ``Learning.handle_batch``, which learns its plain records as one
batch (``learn_many_kept``) and writes their releases together; its time per record, timed on
polls of ``--batch`` records, is reported beside H.

    python benchmarks/engine_record.py [--records 20000] [--repeats 5] [--dim 8] [--buffer 64]
                                       [--batch 500]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from connectors.schema import ReleaseEncoder, parse_conformed  # noqa: E402
from connectors.sources import SourceMessage  # noqa: E402
from stream_dp.engine.learning import Learning  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

# The same model as the end-to-end benchmark's engines (a release at every record).
from kafka_e2e import local_config  # noqa: E402

__all__ = ["main"]

WARM = 500


def messages(n: int, dim: int, seed: int = 0) -> list[bytes]:
    """n JSON records as kafka_e2e.py produces them (‖x‖ ≈ 1, the learner's radius)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        x = rng.normal(size=dim) / np.sqrt(dim)
        record = {"id": i, "x": {f"f{j}": float(v) for j, v in enumerate(x)}, "y": int(x[0] > 0)}
        out.append(json.dumps(record).encode())
    return out


def per_record(run, n: int) -> float:
    t0 = time.perf_counter()
    run()
    return (time.perf_counter() - t0) / n * 1e6


def measure(dim: int, buffer: int, n: int, batch: int) -> dict[str, float]:
    """One pass of each measurement on fresh learners: µs per record."""
    cfg = local_config(buffer, dim)
    values = messages(WARM + n, dim)
    features = tuple(cfg.model.features)
    known = frozenset(features)

    learning = Learning(cfg)
    learning.run_id = "bench"
    for v in values[:WARM]:
        learning.handle(v)

    def handle() -> None:
        for v in values[WARM:]:
            learning.handle(v)

    polled = Learning(cfg)
    polled.run_id = "bench"
    polls = [SourceMessage(v, {}) for v in values]
    # Two polls: the first binds the learner (one at a time), the second loads learn_many's kernel.
    polled.handle_batch(polls[: WARM // 2])
    polled.handle_batch(polls[WARM // 2 : WARM])

    def handle_batch() -> None:
        for i in range(WARM, WARM + n, batch):
            polled.handle_batch(polls[i : min(i + batch, WARM + n)])

    def parse() -> None:
        for v in values[WARM:]:
            parse_conformed(v, features, known)

    parsed = [parse_conformed(v, features, known)[:2] for v in values]
    learner = local_config(buffer, dim).model.build()
    encoder = ReleaseEncoder()
    for x, y in parsed[:WARM]:
        learner.learn_one(x, y)

    def step() -> None:
        for x, y in parsed[WARM:]:
            learner.learn_one(x, y)
            encoder.encode(learner.release_message(), run_id="bench", time=0.0)

    return {"handle": per_record(handle, n), "batch": per_record(handle_batch, n),
            "parse": per_record(parse, n), "step": per_record(step, n)}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dim", type=int, default=8)
    ap.add_argument("--buffer", type=int, default=64)
    ap.add_argument("--batch", type=int, default=500, help="records per poll (the engine's)")
    args = ap.parse_args(argv)
    runs = [measure(args.dim, args.buffer, args.records, args.batch) for _ in range(args.repeats)]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print(f"d = {args.dim}, fifo:{args.buffer}, one release per record, {args.records} records, "
          f"median of {args.repeats}")  # fmt: skip
    print(f"engine record (Learning.handle), H      : {med['handle']:.1f} µs")
    print(f"engine record in polls of {args.batch} (handle_batch) : {med['batch']:.1f} µs")
    print(f"  parse and validate the message alone  : {med['parse']:.1f} µs")
    print(f"  learn_one + release message alone     : {med['step']:.1f} µs")


if __name__ == "__main__":
    main()

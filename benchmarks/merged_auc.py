"""Test AUC of the merged per-partition model against one learner, at the same ε (bank data).

The per-partition scale-out (``scale.mode = "per-partition"``) trains K learners, one per input
partition, and ``stream-dp merge`` publishes the average of their latest releases. This script
measures what that costs in accuracy, without Kafka: the bank stream is split over K partitions
by a hash of each record's id (as the Kafka producer's key partitioner does with
``stream-dp produce --partitions K``), each partition is learned by its own OnPairStrC with the
same (ε, δ) and its own horizon, and the average of the K final releases is scored on the
held-out split beside one OnPairStrC that learns the whole stream with the same (ε, δ).
Each configuration is repeated with fresh secrets; mean and standard deviation are printed.

    python benchmarks/merged_auc.py [--partitions 4] [--repeats 5] [--epsilon 4.0]
"""

from __future__ import annotations

import argparse
import hashlib
import statistics

import numpy as np

from stream_dp.datasets import prepare
from stream_dp.metrics import roc_auc
from stream_dp.online import OnPairStrC
from stream_dp.records import clip_rows


def partition_of(i: int, k: int) -> int:
    """A record id's partition: a uniform hash, like Kafka's key partitioner."""
    digest = hashlib.blake2b(f"record-{i}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % k


def final_release(X: np.ndarray, y: np.ndarray, names: tuple, epsilon: float) -> np.ndarray:
    learner = OnPairStrC(
        epsilon=epsilon,
        delta=1e-5,
        horizon=len(y),
        alpha=1.0,
        buffer=256,
        release_every=50,
        features=names,
    )
    learner.learn_many(X, y)
    return np.asarray(learner.release_message()["weights"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--epsilon", type=float, default=4.0)
    args = ap.parse_args()

    data = prepare("bank")
    names = tuple(data.feature_names)
    X, y = data.X_stream, np.asarray(data.y_stream)
    X_test = clip_rows(data.X_test, 1.0)
    k = args.partitions
    part = np.array([partition_of(i, k) for i in range(len(y))])
    single, merged, each = [], [], []
    for _ in range(args.repeats):
        w = final_release(X, y, names, args.epsilon)
        single.append(roc_auc(X_test @ w, data.y_test))
        ws = [final_release(X[part == p], y[part == p], names, args.epsilon) for p in range(k)]
        each.append(statistics.mean(roc_auc(X_test @ v, data.y_test) for v in ws))
        merged.append(roc_auc(X_test @ np.mean(ws, axis=0), data.y_test))

    def show(values: list[float]) -> str:
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        return f"{statistics.mean(values):.3f} ± {sd:.3f}"

    print(
        f"bank: {len(y)} stream records, {len(data.y_test)} test; OnPairStrC ε={args.epsilon}, "
        f"δ=1e-5, α=1, buffer 256, release every 50; {args.repeats} repeats (fresh secrets)"
    )
    print(f"partition sizes: {np.bincount(part, minlength=k).tolist()}")
    print(f"one learner over the whole stream     test AUC {show(single)}")
    print(f"one partition learner (mean of {k})     test AUC {show(each)}")
    print(f"merged: average of {k} partition models  test AUC {show(merged)}")


if __name__ == "__main__":
    main()

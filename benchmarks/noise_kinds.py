"""OnPairMF's per-record cost for each kind of correlated noise, in one run.

``OnPairMF(task="auc", noise=...)`` with ``"blt"`` (the default), ``"tree"`` and
``"independent"``, ``learn_one`` on array records of dimension ``--dim``; reported: CPU µs per
record after a warm-up (``time.process_time``: the time this process ran, not the time it waited
for a core), the median of ``--repeats`` runs, and each kind's ratio to BLT measured in the same
run. The tree draws its node rows a chunk of steps at a time (one keyed block per chunk, not per
node): docs/performance.md, *What was done, and what each change bought*.

    python benchmarks/noise_kinds.py               # ~1 min on a quiet machine
    python benchmarks/noise_kinds.py --dim 48 --records 2000
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from stream_dp.online import OnPairMF

KINDS = ("blt", "tree", "independent")


def per_record_us(noise: str, X: np.ndarray, y: np.ndarray, warm: int) -> float:
    model = OnPairMF(task="auc", epsilon=1.0, horizon=100_000, noise=noise, seed=1,
                     reproducible=True, features=[f"x{i}" for i in range(X.shape[1])])  # fmt: skip
    for i in range(warm):  # kernels loaded, buffer full, first noise block drawn
        model.learn_one(X[i], bool(y[i]))
    t0 = time.process_time()
    for i in range(warm, len(X)):
        model.learn_one(X[i], bool(y[i]))
    return (time.process_time() - t0) / (len(X) - warm) * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dim", type=int, default=16, help="features per record")
    parser.add_argument("--records", type=int, default=4000, help="records per run")
    parser.add_argument("--warm", type=int, default=500, help="records before the timing")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each kind (median)")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(args.records, args.dim)) / np.sqrt(args.dim)
    y = rng.random(args.records) < 0.5
    times = {kind: [] for kind in KINDS}
    for _ in range(args.repeats):  # kinds interleaved: a change of machine load hits all
        for kind in KINDS:
            times[kind].append(per_record_us(kind, X, y, args.warm))
    blt = statistics.median(times["blt"])
    print(f"OnPairMF AUC learn_one, d = {args.dim}, {args.records - args.warm} records timed "
          f"after {args.warm}, median of {args.repeats} (CPU µs per record):")  # fmt: skip
    for kind in KINDS:
        us = statistics.median(times[kind])
        print(f"  {kind:12s} {us:9.1f} µs   ratio to blt: {us / blt:5.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

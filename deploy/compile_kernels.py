"""Compile stream-dp's numba kernels into numba's on-disk cache, then exit.

Run at image build time (deploy/Dockerfile) so that the engine's first start loads the kernels
instead of compiling them for about 70 s of CPU (docs/performance.md, "First start"). It steps
each kind of learner the engine runs past its warm-up, through ``learn_one`` (the engine's path)
and ``learn_many``, on synthetic records: nothing is kept but the compiled code.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from stream_dp._jit import numba_active
from stream_dp.online import OnPairMF, OnPairStrC, PairwiseGIGA
from stream_dp.privacy.contribution import ContributionBound


def main() -> int:
    if not numba_active():
        print("compile_kernels: numba is not active (the `fast` extra?)", file=sys.stderr)
        return 1
    start = time.monotonic()
    rng = np.random.default_rng(0)
    features = ["a", "b", "c"]
    learners = [
        OnPairStrC(task="auc", horizon=2_000, features=features, release_every=1),
        OnPairStrC(task="metric", horizon=2_000, features=features, release_every=5),
        OnPairMF(task="auc", horizon=2_000, features=features),
        # The non-private baseline (its struct holds no noise: kernels of their own).
        PairwiseGIGA(task="auc", features=features),
        PairwiseGIGA(task="metric", features=features),
    ]
    for learner in learners:
        steps = getattr(learner, "T1", 0) + 20
        X = 0.3 * rng.normal(size=(2 * steps, len(features)))
        y = [bool(i % 2) if learner.task == "auc" else i % 3 for i in range(2 * steps)]
        for x, label in zip(X[:steps], y[:steps], strict=True):
            learner.learn_one(dict(zip(features, x.tolist(), strict=True)), label)
        learner.learn_many(X[steps:], y[steps:])
        if learner.accountant is not None:  # (PairwiseGIGA spends no privacy)
            learner.accountant.spent()
    # A unit-level learner's admission: the keyed hash, probe and update in one compiled call.
    ContributionBound(1, secret=0).admit("unit", 1)
    print(f"compile_kernels: done in {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

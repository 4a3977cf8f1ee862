"""diffprivlib's LogisticRegression on the project's own bank splits (issue 20's comparison).

Issue 20 compares OnPairMF with diffprivlib's medians measured on *its author's* splits of bank.
This measures diffprivlib on the splits ``benchmarks/accuracy.py`` uses (split k is
``prepare("bank", seed=2020 + k)``, k = 0 … 4), so the two can be compared on the same records:
the stream split clipped to ‖x‖ ≤ 1 (``data_norm=1``), pure ε-DP, two noise seeds per split,
test AUC of ``decision_function``; scikit-learn's non-private LogisticRegression beside it.

diffprivlib 0.6.6 does not import with scikit-learn ≥ 1.6, so it runs in an environment of its
own, which need not have stream_dp; the splits go through a file::

    python benchmarks/diffprivlib_bank.py --export /tmp/bank_splits.npz      # this project's env
    python -m venv /tmp/dpl && /tmp/dpl/bin/pip install "diffprivlib==0.6.6" "scikit-learn<1.6"
    /tmp/dpl/bin/python benchmarks/diffprivlib_bank.py --run /tmp/bank_splits.npz
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np

__all__ = ["main"]

SPLITS = 5
SEEDS = 2
EPSILONS = (0.5, 1.0, 2.0, 4.0, 8.0)


def export(path: str) -> None:
    from stream_dp.datasets import prepare

    arrays = {}
    for k in range(SPLITS):
        p = prepare("bank", seed=2020 + k)
        arrays |= {f"Xs{k}": p.X_stream, f"ys{k}": p.y_stream, f"Xt{k}": p.X_test,
                   f"yt{k}": p.y_test}  # fmt: skip
    np.savez(path, **arrays)
    print(f"wrote {SPLITS} bank splits to {path}")


def run(path: str) -> None:
    from diffprivlib.models import LogisticRegression
    from sklearn.linear_model import LogisticRegression as Plain
    from sklearn.metrics import roc_auc_score

    warnings.simplefilter("ignore")  # diffprivlib's PrivacyLeakWarning on clipped norms etc.
    data = np.load(path)

    def clip(X: np.ndarray) -> np.ndarray:
        norms = np.linalg.norm(X, axis=1)
        return X * np.minimum(1.0, 1.0 / np.maximum(norms, 1e-300))[:, None]

    plain, private = [], {eps: [] for eps in EPSILONS}
    for k in range(SPLITS):
        Xs, ys, Xt, yt = clip(data[f"Xs{k}"]), data[f"ys{k}"], data[f"Xt{k}"], data[f"yt{k}"]
        model = Plain(max_iter=1000).fit(Xs, ys)
        plain.append(roc_auc_score(yt, model.decision_function(Xt)))
        for eps in EPSILONS:
            for s in range(SEEDS):
                m = LogisticRegression(epsilon=eps, data_norm=1.0, random_state=1000 * k + s)
                private[eps].append(roc_auc_score(yt, m.fit(Xs, ys).decision_function(Xt)))
    print(f"bank, {SPLITS} splits × {SEEDS} seeds, test AUC median (minimum)")
    print(f"  scikit-learn LogisticRegression (not private): {np.median(plain):.4f}")
    for eps, v in private.items():
        print(f"  diffprivlib ε = {eps:g}: {np.median(v):.4f} ({min(v):.4f})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--export", metavar="FILE", help="write the splits (this project's env)")
    group.add_argument("--run", metavar="FILE", help="measure diffprivlib on the written splits")
    args = parser.parse_args(argv)
    if args.export:
        export(args.export)
    else:
        run(args.run)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

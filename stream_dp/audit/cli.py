"""Empirical differential-privacy audit of a learner configuration (``stream-dp audit``).

Trains the real learner hundreds of thousands of times on two neighbouring streams — one with a
canary record, one with a benign record in its place — each run with fresh noise, and tests from
the released models which stream a run saw. The error counts of those tests, bounded with
Clopper–Pearson, give a lower bound on ε (at the ledger's δ) and one on the Gaussian-DP μ,
printed next to what the ledger claims, with the audit's power. A bound above the claim proves
the implementation leaks more than its ledger says (exit code 1).

Example (1–3 minutes on 2 cores, ``docs/privacy.md``, *Empirical audit*)::

    stream-dp audit --algorithm onpairstrc --epsilon 1 --delta 1e-5

``--noise-multiplier`` is for testing the audit itself: it shrinks the release noise while the
ledger keeps charging the nominal σ, i.e. it deliberately BREAKS the guarantee.

Exit codes: 0 consistent with the claim, 1 violation found, 2 invalid arguments, 130
interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["add_arguments", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``audit`` options on ``parser`` (called by :mod:`stream_dp.cli`).

    Examples
    --------
    >>> import argparse
    >>> p = argparse.ArgumentParser()
    >>> add_arguments(p)
    >>> p.parse_args(["--trials", "100", "--json"]).trials
    100

    """
    parser.add_argument(
        "--algorithm",
        default="onpairstrc",
        help="onpairstrc (default), onpairc, onpairmf, onpairmf-units (OnPairMF per unit: k = "
        "2 events of one unit), or an offline algorithm of "
        "stream_dp.offline (offpairstrc, offpairc, ...)",
    )
    parser.add_argument("--task", choices=("auc", "metric"), default="auc")
    parser.add_argument("--epsilon", type=float, default=1.0, help="ε budget (default 1)")
    parser.add_argument("--delta", type=float, default=1e-5, help="δ (default 1e-5)")
    parser.add_argument(
        "--trials",
        type=int,
        default=None,
        help="trials per neighbouring stream; a tenth plan the tests, the rest are counted "
        "(default 100000; onpairmf 40000; onpairmf-units 20000)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the trials' noise secrets")
    parser.add_argument(
        "--stream-length",
        type=int,
        default=None,
        help="records per stream (default 3; onpairmf 33)",
    )
    parser.add_argument(
        "--dim", type=int, default=None, help="number of features (default: 10 auc, 5 metric)"
    )
    parser.add_argument(
        "--confidence",
        type=float,
        default=0.99,
        help="joint confidence of the lower bounds (default 0.99)",
    )
    parser.add_argument(
        "--jobs", type=int, default=None, help="worker processes (default: all available CPUs)"
    )
    parser.add_argument(
        "--noise-multiplier",
        type=float,
        default=1.0,
        help="TEST ONLY, BREAKS THE GUARANTEE: multiply the release noise by this factor while "
        "the ledger keeps charging the nominal noise (checks that the audit has power)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Run the audit described by ``args``; return the exit code."""
    from stream_dp.audit.core import audit

    def progress(done: int, total: int) -> None:
        print(f"\raudit: {done}/{total} runs", end="", file=sys.stderr, flush=True)

    try:
        result = audit(
            args.algorithm,
            task=args.task,
            epsilon=args.epsilon,
            delta=args.delta,
            trials=args.trials,
            seed=args.seed,
            stream_length=args.stream_length,
            dim=args.dim,
            confidence=args.confidence,
            noise_multiplier=args.noise_multiplier,
            jobs=args.jobs,
            progress=None if args.quiet else progress,
        )
    except ValueError as exc:
        print(f"stream-dp audit: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nstream-dp audit: interrupted, no result", file=sys.stderr)
        return 130
    if not args.quiet:
        print(file=sys.stderr)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, ensure_ascii=False))
    else:
        print(result.summary())
    return 1 if result.violated else 0

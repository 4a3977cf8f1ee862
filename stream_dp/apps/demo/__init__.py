"""stream-dp demo: stream real data through PairwiseGIGA, OnPairStrC, OnPairC and OnPairMF (AUC).

Each dataset shipped with the package (UCI Bank Marketing, 45,211 records; Pima Indians
Diabetes, 768 records) is split once, by a fixed seed, into a calibration block (fits the
scaler; never streamed), a stream (learned one record at a time) and a held-out test split
(never streamed). Every learner sees the stream through its river interface (``learn_one``);
the private learners publish noisy models, and the demo measures the test AUC of the smoothed
private release and the privacy spent. The average regret of each learner — computed from raw
records, for the trusted operator only — is shown only with --operator-metrics, marked raw.
The learners are independent and run in --jobs worker processes (default: 2).

Outputs (in --out DIR, about 15 MB): results.md (settings, table, honest verdicts),
releases.jsonl (release_message() lines tagged with dataset and model: every release of
OnPairStrC and OnPairC, OnPairMF's every-step releases at their period and the last; all of them
with --all-releases, ~235 MB), demo.png (AUC of the release against t, and with
--operator-metrics the raw average penalty; needs matplotlib).
"""

from __future__ import annotations

import argparse
import math
import os
import time
import warnings
from pathlib import Path

from stream_dp.apps.demo.plan import DemoSettings, ModelResult, choose_alpha, release_every_for
from stream_dp.apps.demo.report import format_table
from stream_dp.apps.demo.run import DemoError, run_demo

__all__ = [
    "DemoError",
    "DemoSettings",
    "ModelResult",
    "add_arguments",
    "choose_alpha",
    "format_table",
    "main",
    "release_every_for",
    "run_demo",
]


def _parse_epsilons(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of numbers: {text!r}"
        ) from None
    if not values or any(not (math.isfinite(v) and v > 0) for v in values):
        raise argparse.ArgumentTypeError(f"epsilons must be positive and finite: {text!r}")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``demo`` options on ``parser`` and set ``func`` to :func:`main`."""
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output folder (default: ./stream-dp-demo-YYYYmmdd-HHMMSS)",
    )
    parser.add_argument(
        "--dataset", choices=("bank", "pima", "both"), default="both", help="default: both"
    )
    parser.add_argument(
        "--epsilons",
        type=_parse_epsilons,
        default=(1.0, 4.0, 16.0),
        help="comma-separated ε targets (default: 1,4,16); δ = 1e-5",
    )
    parser.add_argument(
        "--max-records",
        type=int,
        default=None,
        metavar="N",
        help="stream at most N records per dataset (the test split is unchanged)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="make the run reproducible with this noise seed; such a run is NOT private and its "
        "releases say so (default: a fresh secret from the OS, a private run)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="worker processes; learners are independent (default: min(2, CPUs))",
    )
    parser.add_argument("--no-plot", action="store_true", help="do not write demo.png")
    parser.add_argument(
        "--all-releases",
        action="store_true",
        help="write every release into releases.jsonl, OnPairMF's one per step too (both datasets: "
        "~235 MB; default: OnPairMF's at the other learners' release period and the last, ~15 MB)",
    )
    parser.add_argument(
        "--operator-metrics",
        action="store_true",
        help="also compute and show each learner's RAW average regret (not private: for the "
        "trusted operator only; marked raw in the table, results.md and demo.png)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar or plan")
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of an error (for bug reports)"
    )
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Entry point of ``stream-dp demo`` (``args`` from :func:`add_arguments`)."""
    out = args.out
    if out is None:
        out = Path.cwd() / time.strftime("stream-dp-demo-%Y%m%d-%H%M%S")
    datasets = ("bank", "pima") if args.dataset == "both" else (args.dataset,)
    settings = DemoSettings(
        out=out,
        datasets=datasets,
        epsilons=tuple(args.epsilons),
        max_records=args.max_records,
        seed=args.seed,
        plot=not args.no_plot,
        operator_metrics=args.operator_metrics,
        quiet=args.quiet,
        jobs=args.jobs,
        all_releases=args.all_releases,
    )
    from stream_dp.engine.cli import one_line_errors  # the CLI's one error convention

    def run() -> int:
        with warnings.catch_warnings():
            # The demo chooses α with T1 <= n/4 on purpose (choose_alpha) and tabulates T1;
            # the learners' advice about a warm-up above a tenth of the horizon would repeat it.
            warnings.filterwarnings("ignore", message=".*the warm-up T1", category=UserWarning)
            run_demo(settings)
        return 0

    return one_line_errors("demo", args.debug, {DemoError: 2}, run)

"""The ``stream-dp`` console script.

Sub-commands are thin: each parses its arguments and calls one module's ``main``, imported
lazily so that ``stream-dp --help`` stays fast and the Kafka client is loaded only by ``run``.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stream-dp",
        description=(
            "Differentially private online pairwise learning (AUC ranking, metric learning) on "
            "live streams. Every released model carries Gaussian noise composed in zCDP."
        ),
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    from stream_dp.apps import demo

    demo.add_arguments(
        sub.add_parser(
            "demo",
            help="the embedded main job: stream real data through GIGA, OnPairStrC, OnPairC",
            description=demo.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )
    _register_optional(sub, "stream_dp.engine.cli", "run", "run the streaming engine (Kafka)")
    _register_optional(sub, "stream_dp.audit.cli", "audit", "empirical DP audit of a learner")
    from stream_dp.engine import tools

    tools.add_produce_arguments(
        sub.add_parser("produce", help="send a bundled dataset to a Kafka topic (for trying run)")
    )
    tools.add_watch_arguments(
        sub.add_parser("watch", help="read a release topic; rebuild and score each release")
    )
    return parser


def _register_optional(sub, module: str, name: str, help_text: str) -> None:
    import importlib

    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and module.startswith(exc.name):
            return  # that part of the product is not installed in this build
        raise
    mod.add_arguments(
        sub.add_parser(
            name,
            help=help_text,
            description=mod.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

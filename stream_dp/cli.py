"""The ``stream-dp`` console script.

Sub-commands are thin: each is one module with ``add_arguments(parser)`` (which sets the
``func`` the command runs) and a docstring that is its ``--help`` description. Only the module
of the command being run is imported, so ``stream-dp --help`` loads none of them (no NumPy,
pydantic, numba or Kafka client) and the Kafka client is loaded only by the commands that talk
to a broker.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

__all__ = ["COMMANDS", "build_parser", "console", "main"]

#: ``name: (module, one-line help)``, in the order ``stream-dp --help`` lists them.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": (
        "stream_dp.apps.demo",
        "the embedded main job: stream real data through GIGA, OnPairStrC, OnPairC",
    ),
    "run": ("stream_dp.engine.cli", "run the streaming engine (Kafka)"),
    "audit": ("stream_dp.audit.cli", "empirical DP audit of a learner"),
    "produce": (
        "stream_dp.apps.produce",
        "send a bundled dataset to a Kafka topic (for trying run)",
    ),
    "watch": ("stream_dp.apps.watch", "read a release topic; rebuild and score each release"),
    "merge": (
        "stream_dp.apps.merge",
        "publish the average of a per-partition model's latest releases (no budget)",
    ),
    "status": (
        "stream_dp.apps.status",
        "a per-partition model across machines: each partition's owner, heartbeat, step, ε",
    ),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of ``stream-dp``, with the arguments of ``command`` (None: of every command).

    Examples
    --------
    >>> build_parser("produce").parse_args(["produce", "--bootstrap", "b:9092"]).topic
    'records'
    """
    parser = argparse.ArgumentParser(
        prog="stream-dp",
        description=(
            "Differentially private online pairwise learning (AUC ranking, metric learning) on "
            "live streams. Every released model carries Gaussian noise composed in zCDP."
        ),
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        if command is not None and name != command:
            sub.add_parser(name, help=help_text)
            continue
        mod = importlib.import_module(module)
        mod.add_arguments(
            sub.add_parser(
                name,
                help=help_text,
                description=mod.__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter,
            )
        )
    return parser


def _command(argv: list[str]) -> str:
    """The command ``argv`` names ("" when none: the top-level help or a usage error)."""
    first = next((a for a in argv if not a.startswith("-")), "")
    return first if first in COMMANDS else ""


def main(argv: list[str] | None = None) -> int:
    """Run the command ``argv`` names (default: the process's arguments); its exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(_command(argv)).parse_args(argv)
    return int(args.func(args) or 0)


#: The thread-pool sizes of the BLAS/LAPACK libraries NumPy and SciPy may load.
_BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _one_blas_thread() -> None:
    """One BLAS thread for the engine, unless the environment chose otherwise.

    The engine's matrices are small (a d × d metric model, its eigendecomposition) and it learns
    one record at a time: a BLAS thread pool only spins against the other processes of the
    machine. With it, a metric step at d = 240 cost 0.2-0.9 s of CPU at load 10 on 2 cores,
    without it 0.013 s (docs/performance.md). It must be set before NumPy is first imported.
    """
    for name in _BLAS_THREADS:
        os.environ.setdefault(name, "1")


def console() -> None:  # pragma: no cover - ends the process
    """The ``stream-dp`` console script: :func:`main`, then the process ends at once.

    Every command has closed what it opened when it returns (the engine its checkpoint, state
    directory, producer and consumer), so the interpreter's teardown of numba, SciPy and the
    Kafka client -- seconds of CPU on a loaded machine, after Ctrl-C too -- is skipped. An
    exception or ``SystemExit`` (``--help``, a usage error) ends the process as usual.
    """
    if _command(sys.argv[1:]) == "run":
        _one_blas_thread()
    code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    console()

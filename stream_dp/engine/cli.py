"""Run the streaming engine on a TOML config (``stream-dp run --config FILE``).

The engine reads records from the configured source (Kafka, JSONL or CSV), learns them with a
private learner on the declared schema, publishes every release to the release sink with its
privacy ledger, sends bad input to the dead-letter sink with its reason, and checkpoints so that
a crash loses nothing and never publishes two different releases of one step. SIGTERM or
Ctrl-C commits and exits cleanly; a stop that is not done within 3 s (a learner busy compiling
its kernels, Kafka away), or a second Ctrl-C, ends the run where it is, as a crash would: the
next start resumes from the last checkpoint.

Exit codes:

* 0 -- done (input ended, --max-records reached, or stopped by SIGTERM/Ctrl-C);
* 1 -- unexpected error (the traceback only with --debug);
* 2 -- invalid configuration: a field, no declared schema (``model.features``), model
  settings, releases too large for the release sink, (per-partition scale-out) no master
  secret, or a metrics port (``[metrics] prometheus_port``) without the ``metrics`` extra or
  that cannot be bound;
* 3 -- refused because of the model's state: the state directory is in use by another engine,
  the checkpoint is missing, damaged, older than what was published or of another run, or
  another run of the model has published;
* 4 -- Kafka unreachable or misconfigured at start (address, TLS/SASL, missing input topic or
  partition), or unreachable for longer than ``kafka.outage_deadline_seconds``;
* 5 -- fenced: another instance of this model took over.

Every error is one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable

__all__ = [
    "add_arguments",
    "configure_logging",
    "dry_run",
    "main",
    "one_line_errors",
    "with_metrics_port",
]

log = logging.getLogger("stream_dp.engine")


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """``--verbose`` and ``--debug``, shared by run, produce and watch."""
    parser.add_argument(
        "--verbose", action="store_true", help="also show the Kafka client's INFO messages"
    )
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of an error (for bug reports)"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="engine TOML file")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="validate the config, print T1, the noise (σ) schedule, the budget plan, the "
        "release size and where /metrics is served, and exit without touching Kafka",
    )
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="start a NEW run of the model with a new budget although it existed (its files are "
        "kept aside; it continues after the input consumed so far); without it the engine never "
        "resets a ledger",
    )
    parser.add_argument(
        "--max-records", type=int, default=None, help="stop after this many input messages"
    )
    parser.add_argument(
        "--instance",
        default=None,
        help="per-partition scale-out: this instance's name, inserted in its status file name "
        "(status.<name>.json) so instances on one machine do not share one",
    )
    parser.add_argument(
        "--metrics-port",
        type=_port,
        default=None,
        metavar="PORT",
        help="serve Prometheus /metrics on this port (0: an ephemeral one, logged), overriding "
        "[metrics] prometheus_port: per-partition instances on one machine need one port each "
        '(needs the metrics extra: pip install "stream-dp[metrics]"; default: the config\'s, '
        "none if it has none)",
    )
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    add_common_arguments(parser)
    parser.set_defaults(func=main)


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (0 to 65535)")
    return port


def with_metrics_port(config, port: int | None):
    """``config`` with ``[metrics] prometheus_port`` replaced by ``port`` (unless None), after
    checking that the endpoint it asks for can be served (the ``metrics`` extra)."""
    from stream_dp.engine.prometheus import require_client

    if port is not None:
        metrics = config.metrics.model_copy(update={"prometheus_port": port})
        config = config.model_copy(update={"metrics": metrics})
    if config.metrics.prometheus_port is not None:
        require_client()
    return config


class _KafkaChatter(logging.Filter):
    """At most one kafka-python line per logger and minute (unless ``--verbose``).

    Through an outage kafka-python logs every failed reconnect, several a second; the engine
    says itself, once, since when the broker is unreachable and when it is back.
    """

    def __init__(self, every: float = 60.0) -> None:
        super().__init__()
        self.every = every
        self._last: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("kafka"):
            return True
        if "ProducerFenced" in record.getMessage():
            return False  # the engine reports being fenced itself, in one line
        last = self._last.get(record.name)
        if last is not None and record.created - last < self.every:
            return False
        self._last[record.name] = record.created
        return True


def configure_logging(level: str = "INFO", verbose: bool = False) -> None:
    """The engine's log format; the Kafka client from WARNING, rate-limited, unless ``verbose``."""
    logging.basicConfig(
        level=getattr(logging, str(level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("kafka").setLevel(logging.DEBUG if verbose else logging.WARNING)
    if not verbose:
        for handler in logging.getLogger().handlers:
            if not any(isinstance(f, _KafkaChatter) for f in handler.filters):
                handler.addFilter(_KafkaChatter())


def one_line_errors(
    command: str, debug: bool, codes: dict[type[BaseException], int], fn: Callable[[], int]
) -> int:
    """Run ``fn``; turn an exception into one stderr line and an exit code.

    ``codes`` maps exception types (checked in order) to exit codes; anything else is 1. With
    ``debug`` the exception propagates (its traceback is the point).
    """
    try:
        return fn()
    except KeyboardInterrupt:
        print(f"stream-dp {command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if debug:
            raise
        code = next((c for t, c in codes.items() if isinstance(exc, t)), 1)
        text = " ".join(str(exc).split()) or type(exc).__name__
        if code == 1:
            text = f"unexpected {type(exc).__name__}: {text} (run with --debug for the traceback)"
        print(f"stream-dp {command}: {text}", file=sys.stderr)
        return code


def dry_run(config) -> str:
    """The plan an operator should read before the first record: the learner's charges and the
    noise its releases carry, computed without any data."""
    from stream_dp.engine.builders import build_learner
    from stream_dp.engine.preflight import release_size

    size, limit = release_size(config)
    learner = build_learner(config)
    # The first release follows the warm-up (T1 steps) of the learners that have one.
    first = getattr(learner, "T1", 0) + getattr(learner, "release_every", 1)
    if learner.horizon is not None:
        first = min(first, learner.horizon)
    steps = sorted({first, 2 * first, 10 * first, 100 * first})
    if learner.horizon is not None:
        steps = sorted({s for s in steps if s <= learner.horizon} | {learner.horizon})
    m = config.model
    where = (
        f"the release topic accepts {limit:,} (releases.max_request_size)"
        if limit is not None
        else f"the {config.releases.kind} sink has no size limit"
    )
    schedule = getattr(learner.mechanism, "schedule", None)
    lines = [
        f"model {m.model_id}: {m.algorithm} task={m.task}, {len(m.features)} declared features"
        + ("" if not m.reproducible else " — NOT PRIVATE (reproducible seed)"),
        learner.describe(),
        _relation(config, learner),
        f"ρ budget {learner.budget.limit:.6g} for (ε={learner.epsilon}, "
        f"δ={learner.delta}) with the {learner.conversion} conversion",
        *([f"schedule: {schedule!r}"] if schedule is not None else []),
        f"release every {getattr(learner, 'release_every', 1)} step(s)",
        f"release message: at most {size:,} bytes; {where}",
        "",
        *_table(learner.noise_plan(steps)),
    ]
    if config.scale.mode == "per-partition":
        lines += ["", *_scale_plan(config, learner.budget.limit)]
    metrics = config.metrics
    if metrics.prometheus_port is not None:
        lines += ["", f"metrics: /metrics on {metrics.host}:{metrics.prometheus_port}"]
    return "\n".join(lines)


def _relation(config, learner) -> str:
    """The neighbouring relation the run's guarantee is for, and where the unit comes from."""
    rel = learner.neighbouring()
    if rel["level"] == "event":
        return f"guarantee: {rel['relation']}"
    where = (
        "the Kafka message key"
        if config.units_from_key
        else f"the record field {rel['unit_key']!r}"
    )
    plan = learner.noise_plan()[0]
    from stream_dp.online.units import event_epsilon

    rho = plan.get("event_rho", 0.0)
    if "event_sensitivity" in plan and plan.get("rho"):
        rho = learner.budget.limit * plan["event_rho"] / plan["rho"]
    eps_event = event_epsilon(rho, learner.delta, learner.conversion)
    return (
        f"guarantee: unit-level (ε={learner.epsilon}, δ={learner.delta}) per unit "
        f"{rel['unit_key']!r} (read from {where}): {rel['relation']}; the same noise is "
        f"event-level ε≈{eps_event:.4g}"
    )


def _scale_plan(config, rho: float) -> list[str]:
    """A person's guarantee over K partition learners: both compositions, and which holds."""
    from stream_dp.privacy.conversions import epsilon_from_rho

    # A unit read from the message key is the key Kafka partitions by: parallel by construction.
    m, keyed = config.model, config.scale.privacy_unit_key or config.units_from_key
    conversion = getattr(m, "conversion", "tight")
    lines = [
        f"per-partition: one learner per input partition ({m.model_id}/p<k>), each within "
        f"ε={m.epsilon}, δ={m.delta} (ρ={rho:.6g})",
        f"  parallel composition (records keyed by the person): ε={m.epsilon:.4g} for any K"
        + ("   <- holds (scale.privacy_unit_key = true)" if keyed else ""),
        "  sum over K partitions (a person may be in all of them):"
        + ("" if keyed else "   <- holds (scale.privacy_unit_key = false)"),
    ]
    for k in (2, 4, 8, 16):
        lines.append(f"    K={k:<3} ε={epsilon_from_rho(k * rho, m.delta, conversion):.4g}")
    return lines


_LABELS = {
    "sigma": "σ per coord",
    "rho": "ρ this release",
    "prefix_std": "noise std of iterate t",
    "covers": "covers steps",
}


def _table(rows: list[dict]) -> list[str]:
    """``rows`` as aligned columns (the union of their keys, in first-seen order)."""
    columns = list(dict.fromkeys(k for row in rows for k in row))
    label = {c: _LABELS.get(c, c) for c in columns}
    width = {c: max(12, len(label[c])) for c in columns}

    def cell(v) -> str:
        if v is None:
            return ""
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    out = [" ".join(f"{label[c]:>{width[c]}}" for c in columns)]
    for row in rows:
        out.append(" ".join(f"{cell(row.get(c)):>{width[c]}}" for c in columns))
    return out


def _codes() -> dict[type[BaseException], int]:
    from stream_dp.checkpoint import CheckpointError
    from stream_dp.engine.config import ConfigError
    from stream_dp.engine.errors import EngineError
    from stream_dp.engine.master_secret import MasterSecretError
    from stream_dp.engine.preflight import ReleaseTooLarge
    from stream_dp.engine.prometheus import MetricsUnavailable
    from stream_dp.privacy.accountant import JournalError

    return {
        ConfigError: 2,
        MasterSecretError: 2,
        MetricsUnavailable: 2,
        ReleaseTooLarge: 2,
        EngineError: 3,  # refined by exit_code below
        CheckpointError: 3,
        JournalError: 3,
        OSError: 3,
    }


def _engine_failure(exc: Exception, args: argparse.Namespace) -> int:
    """One stderr line and the error's exit code (the traceback with ``--debug``)."""
    if getattr(args, "debug", False):
        raise exc
    print(f"stream-dp run: {' '.join(str(exc).split())}", file=sys.stderr)
    return exc.exit_code


def _run_scaleout(config, args: argparse.Namespace) -> int:
    """One instance of a per-partition model; refuses to start without the master secret."""
    from stream_dp.engine.config import ConfigError
    from stream_dp.engine.errors import EngineError
    from stream_dp.engine.master_secret import load_master_secret
    from stream_dp.engine.scaleout import ScaleOut

    scale = config.scale
    secret = load_master_secret(scale.master_secret_file, scale.master_secret_env)
    try:
        instance = ScaleOut(
            config,
            master_secret=secret,
            fresh=args.fresh,
            max_records=args.max_records,
            instance=getattr(args, "instance", None),
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    try:
        status = instance.run()
    except EngineError as exc:
        return _engine_failure(exc, args)
    print(json.dumps({k: status[k] for k in ("records", "composition", "rho", "epsilon_spent")}))
    return 0


def main(args: argparse.Namespace) -> int:
    configure_logging(args.log_level, getattr(args, "verbose", False))
    codes = _codes()

    def run() -> int:
        from stream_dp.engine.config import ConfigError, load_config
        from stream_dp.engine.errors import EngineError
        from stream_dp.engine.preflight import ReleaseTooLarge
        from stream_dp.engine.runner import Engine

        config = with_metrics_port(load_config(args.config), getattr(args, "metrics_port", None))
        if config.scale.mode == "per-partition" and not args.dry_run:
            return _run_scaleout(config, args)
        try:
            if args.dry_run:
                print(dry_run(config))
                return 0
            engine = Engine(config, fresh=args.fresh, max_records=args.max_records)
        except ReleaseTooLarge:
            raise
        except ValueError as exc:  # settings the learner refuses
            raise ConfigError(f"invalid model settings: {exc}") from None
        try:
            stats = engine.run()
        except EngineError as exc:
            return _engine_failure(exc, args)
        eps, delta = engine.learner.accountant.spent()
        print(json.dumps({**stats.to_dict(), "epsilon_spent": eps, "delta": delta}))
        return 0

    return one_line_errors("run", getattr(args, "debug", False), codes, run)
